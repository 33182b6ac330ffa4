//! The block-device trait: every byte the engine reads or writes goes through it.
//!
//! Owns: positioned reads and writes, length changes, durability barriers, hole punching, and
//! the implementations: [`FileDevice`] (a file), [`MemDevice`] (memory), and two test devices,
//! [`FaultyDevice`] (fails the Nth mutating call) and [`CrashDevice`] (keeps written and durable
//! bytes apart and produces what a power cut could leave).
//! Never: caching, buffering or reordering — an implementation does exactly what it is asked.
//! Errors stay `io::Error` here; the block file adds context when it wraps them.

use std::io;

/// A random-access byte device (a file, memory, or a test device that injects faults).
///
/// `write_at` makes bytes visible to later reads but not durable; only `sync` promises
/// durability of every write that returned before it started.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the device is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; reading past the end is an `UnexpectedEof` error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, growing the device if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates or extends (with zeros) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Returns the space of `[offset, offset+len)` to the host; reads of it return zeros.
    /// Devices that cannot do it may leave the bytes in place.
    fn punch_hole(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Implementations. All of them are thin: a device never retries, caches or reorders.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// A regular file. `sync` is `fdatasync`: the engine only needs data and the file length to be
/// durable, not timestamps.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
}

impl FileDevice {
    /// Opens `path` for reading and writing, creating it (empty) if it does not exist. An existing
    /// file is never truncated: `BlockFile::create` refuses a non-empty device, so formatting can
    /// never destroy an image, and an empty file left by a crash during creation can be formatted
    /// again.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(FileDevice { file })
    }

    /// Opens an existing file for reading and writing.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(FileDevice { file })
    }
}

impl BlockDevice for FileDevice {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "hole beyond off_t range",
            ));
        };
        // SAFETY: fallocate only reads its integer arguments; the descriptor is owned by
        // `self.file`, which stays open for the duration of the call.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        // The trait allows a device to keep the bytes; a file system without hole support
        // (tmpfs on old kernels, some network file systems) just costs space.
        if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// An in-memory device for tests and for images built in memory. `punch_hole` zero-fills.
#[derive(Debug, Default)]
pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
}

impl MemDevice {
    /// An empty device.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device holding `bytes` (e.g. a snapshot taken earlier).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        MemDevice {
            bytes: Mutex::new(bytes),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.lock().clone()
    }
}

fn end_of(offset: u64, len: usize) -> io::Result<usize> {
    usize::try_from(offset)
        .ok()
        .and_then(|o| o.checked_add(len))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))
}

fn mem_read(v: &[u8], buf: &mut [u8], offset: u64) -> io::Result<()> {
    let end = end_of(offset, buf.len())?;
    if end > v.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read of [{offset}, {end}) past end {}", v.len()),
        ));
    }
    buf.copy_from_slice(&v[end - buf.len()..end]);
    Ok(())
}

fn mem_write(v: &mut Vec<u8>, buf: &[u8], offset: u64) -> io::Result<()> {
    let end = end_of(offset, buf.len())?;
    if end > v.len() {
        v.resize(end, 0);
    }
    v[end - buf.len()..end].copy_from_slice(buf);
    Ok(())
}

fn mem_punch(v: &mut [u8], offset: u64, len: u64) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
    let end = usize::try_from(offset.saturating_add(len))
        .unwrap_or(usize::MAX)
        .min(v.len());
    v[start..end].fill(0);
}

impl BlockDevice for MemDevice {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().len() as u64)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        mem_read(&self.bytes.lock(), buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        mem_write(&mut self.bytes.lock(), buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = end_of(len, 0)?;
        self.bytes.lock().resize(len, 0);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        mem_punch(&mut self.bytes.lock(), offset, len);
        Ok(())
    }
}

/// Wraps a device and fails its `n`-th mutating call (write, set_len, sync, punch_hole; counted
/// from 0) and every mutating call after it, like a disk that died. Reads pass through.
#[derive(Debug)]
pub struct FaultyDevice {
    inner: std::sync::Arc<dyn BlockDevice>,
    fail_at: u64,
    calls: AtomicU64,
}

impl FaultyDevice {
    /// Fails mutating call number `fail_at` and all later ones.
    pub fn new(inner: std::sync::Arc<dyn BlockDevice>, fail_at: u64) -> Self {
        FaultyDevice {
            inner,
            fail_at,
            calls: AtomicU64::new(0),
        }
    }

    /// Mutating calls attempted so far (failed ones included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn gate(&self) -> io::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.fail_at {
            Err(io::Error::other("injected I/O fault"))
        } else {
            Ok(())
        }
    }
}

impl BlockDevice for FaultyDevice {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.gate()?;
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.gate()?;
        self.inner.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.gate()?;
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate()?;
        self.inner.punch_hole(offset, len)
    }
}

/// An in-memory device that keeps written and durable bytes apart (SQLite's test6.c idea).
/// `sync` makes everything durable; [`CrashDevice::crash_image`] returns what a power cut could
/// leave: the durable bytes plus a seeded random subset of the unsynced operations, each applied
/// whole, not at all, or torn after a random number of 512-byte sectors.
#[derive(Debug, Default)]
pub struct CrashDevice {
    state: Mutex<CrashState>,
}

#[derive(Debug, Default)]
struct CrashState {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<PendingOp>,
}

#[derive(Debug)]
enum PendingOp {
    Write(u64, Vec<u8>),
    SetLen(u64),
    Punch(u64, u64),
}

impl CrashDevice {
    /// An empty device.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of operations not yet made durable.
    pub fn pending_ops(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// The bytes a power cut now could leave on the medium, chosen by `seed`.
    pub fn crash_image(&self, seed: u64) -> Vec<u8> {
        let st = self.state.lock();
        let mut img = st.durable.clone();
        let mut rng = seed ^ 0xD1B5_4A32_D192_ED03;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for op in &st.pending {
            match next() % 4 {
                0 => continue, // lost
                1 => {
                    if let PendingOp::Write(off, data) = op {
                        // torn: only some whole sectors reached the medium
                        let sectors = data.len().div_ceil(512) as u64;
                        let keep = (next() % sectors.max(1)) as usize * 512;
                        let _ = mem_write(&mut img, &data[..keep.min(data.len())], *off);
                        continue;
                    }
                }
                _ => {}
            }
            match op {
                PendingOp::Write(off, data) => {
                    let _ = mem_write(&mut img, data, *off);
                }
                PendingOp::SetLen(len) => img.resize(*len as usize, 0),
                PendingOp::Punch(off, len) => mem_punch(&mut img, *off, *len),
            }
        }
        img
    }
}

impl BlockDevice for CrashDevice {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().current.len() as u64)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        mem_read(&self.state.lock().current, buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        mem_write(&mut st.current, buf, offset)?;
        st.pending.push(PendingOp::Write(offset, buf.to_vec()));
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let n = end_of(len, 0)?;
        let mut st = self.state.lock();
        st.current.resize(n, 0);
        st.pending.push(PendingOp::SetLen(len));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        st.durable = st.current.clone();
        st.pending.clear();
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        mem_punch(&mut st.current, offset, len);
        st.pending.push(PendingOp::Punch(offset, len));
        Ok(())
    }
}
