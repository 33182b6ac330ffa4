//! LEB128 variable-length integers and a bounds-checked byte reader for decoding
//! structures that came from disk. Every read returns an error instead of panicking.

use crate::error::{Error, Result};

/// Appends `v` as an unsigned LEB128 varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes `put_varint` writes for `v`.
pub(crate) fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Decodes a varint at `pos` of `buf` without bounds errors for trusted in-memory data
/// (data the engine encoded itself and has not re-read from disk). Returns (value, next pos).
#[inline]
pub(crate) fn get_varint_trusted(buf: &[u8], mut pos: usize) -> (u64, usize) {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[pos];
        pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return (v, pos);
        }
        shift += 7;
    }
}

/// A cursor over untrusted bytes: every accessor checks bounds and reports what was being read.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'a dyn Fn() -> String,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'a dyn Fn() -> String) -> Self {
        Reader { buf, pos: 0, what }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn err(&self, detail: impl Into<String>) -> Error {
        Error::corrupt((self.what)(), detail)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.err(format!(
                "needs {n} bytes at offset {} but only {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    /// A varint length followed by that many bytes, with the length capped at `max`.
    pub(crate) fn len_prefixed(&mut self, max: usize) -> Result<&'a [u8]> {
        let n = self.varint()?;
        if n > max as u64 {
            return Err(self.err(format!("length {n} exceeds limit {max}")));
        }
        self.bytes(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v));
            assert_eq!(get_varint_trusted(&b, 0), (v, b.len()));
            let what = || "test".to_string();
            let mut r = Reader::new(&b, &what);
            assert_eq!(r.varint().unwrap(), v);
        }
    }

    #[test]
    fn reader_reports_truncation() {
        let what = || "thing".to_string();
        let mut r = Reader::new(&[0x80, 0x80], &what);
        assert!(r.varint().is_err());
        let mut r = Reader::new(&[5, 1, 2], &what);
        assert!(r.len_prefixed(100).is_err());
    }
}
