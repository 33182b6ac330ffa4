//! Big-endian byte encoding helpers for keys and values. It owns bounds-checked decoding:
//! every read from a store value goes through [`Reader`], which turns short or malformed input
//! into [`FsError::Corrupt`]; it must never panic on any input.

use crate::error::{FsError, FsResult};

/// Appends big-endian integers and byte strings to a buffer.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buf: Vec::with_capacity(cap),
        }
    }
    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Appends a big-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a big-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a big-endian i64.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Appends a u32 length then the bytes.
    pub fn len_bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32).bytes(v)
    }
    /// The encoded bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads big-endian integers and byte strings, failing with `Corrupt` on short input.
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`; `what` names the record in error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }
    fn take(&mut self, n: usize) -> FsResult<&'a [u8]> {
        if self.buf.len() < n {
            return Err(FsError::corrupt(format!(
                "{}: truncated (needed {n} more bytes, have {})",
                self.what,
                self.buf.len()
            )));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> FsResult<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    /// Reads one byte.
    pub fn u8(&mut self) -> FsResult<u8> {
        Ok(self.take(1)?[0])
    }
    /// Reads a big-endian u32.
    pub fn u32(&mut self) -> FsResult<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian u64.
    pub fn u64(&mut self) -> FsResult<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian i64.
    pub fn i64(&mut self) -> FsResult<i64> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    /// Reads `n` raw bytes.
    pub fn bytes(&mut self, n: usize) -> FsResult<&'a [u8]> {
        self.take(n)
    }
    /// Reads a u32 length then that many bytes.
    pub fn len_bytes(&mut self) -> FsResult<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// The bytes not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    /// Fails unless every byte was consumed (trailing garbage is corruption too).
    pub fn end(&self) -> FsResult<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FsError::corrupt(format!(
                "{}: {} trailing bytes",
                self.what,
                self.buf.len()
            )))
        }
    }
}
