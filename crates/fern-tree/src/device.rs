//! The block-device trait: every byte the engine reads or writes goes through it.
//!
//! Owns: positioned reads and writes, length changes, durability barriers, hole punching, and
//! the implementations: [`FileDevice`] (a file), [`MemDevice`] (memory), [`ReadOnlyDevice`]
//! (refuses every mutating call: the read-only open, W11), and the test devices:
//! [`GatedDevice`] (every call passes a [`Gate`] first), [`FaultyDevice`] (a gated device that
//! fails the Nth mutating call) and [`CrashDevice`] (keeps written and durable bytes apart and
//! produces what a power cut could leave).
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
    /// Asks the device to start reading `[offset, offset+len)` now, for a read that will
    /// follow (a scan's next leaves); advice only, nothing waits for it.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Fills `buf` from `offset` as [`read_at`](Self::read_at) does — the same bytes, those
    /// written and not yet synced included — for one large read the caller keeps the result of
    /// (a data extent): a device may read it past the host's cache, into `buf` itself, so the
    /// bytes are not cached twice (the file system's page cache above holds them) and do not
    /// land first in freshly allocated cache pages. The default is `read_at`.
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
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
    /// The fixed size of a device that cannot grow (a disk or partition, a [`LimitedDevice`]);
    /// `None` for one that grows as it is written (a file, [`MemDevice`]). The engine never
    /// allocates past it (format.md, "Space and the reserve").
    fn capacity(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// For a growing device: bytes its host can still give it (a file's file system's free
    /// space), if known. Only reported (statfs), never relied on.
    fn host_available(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// The first offset at or after `offset` where the device may hold a byte other than
    /// zero, or `None` if it holds none there: a file's holes and everything past its end read
    /// as zeros, and a reader looking for something that does not start with a zero may skip
    /// them. A device that does not know answers `offset` itself (the default).
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        Ok(Some(offset))
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
///
/// Every [`WRITEBACK_EVERY`] bytes written, it asks the kernel to start writing back what is
/// dirty (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait). Dirty page cache is
/// charged to the writer's memory cgroup and cannot be reclaimed until it is written: left to
/// the kernel's own flusher (seconds), node writes piled up 9–11 MiB of it on E1 quick inside a
/// 32 MiB limit equal to the engine's budget — a third of the budget — and 2–3 MiB with it
/// (BENCHMARKS.md, "The engines inside a memory cap equal to their budget"). It also spreads
/// the device's work out, so a checkpoint's `sync` has less left to wait for.
///
/// [`read_direct`](BlockDevice::read_direct) is [`DirectReads`].
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// Bytes written since writeback was last started.
    unflushed: AtomicU64,
    /// Its `O_DIRECT` reads.
    direct: DirectReads,
}

/// The alignment of buffer address, offset and length that [`FileDevice`] needs to read with
/// `O_DIRECT` (a page: enough for every logical block size a host uses).
pub const DIRECT_ALIGN: usize = 4096;

/// [`BlockDevice::read_direct`] for a device on a file or a disk: reads with `O_DIRECT`
/// through a second descriptor of the same file, opened at the first such read, when the
/// buffer, offset and length are aligned to [`DIRECT_ALIGN`] and none of the range is in the
/// page cache (`cachestat(2)`: bytes written recently, or read buffered, are copied from there
/// instead; an `O_DIRECT` read of a range with dirty pages would first wait for their
/// writeback). Otherwise, or where the host refuses `O_DIRECT`, it reads buffered.
#[derive(Debug, Default)]
pub struct DirectReads {
    /// The `O_DIRECT` descriptor: unset until the first direct read, `None` if it cannot be had.
    file: std::sync::OnceLock<Option<File>>,
}

impl DirectReads {
    /// Fills `buf` from `offset` of `file` (see the type's comment).
    pub fn read(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let aligned = (buf.as_ptr() as usize | buf.len()).is_multiple_of(DIRECT_ALIGN)
            && offset.is_multiple_of(DIRECT_ALIGN as u64)
            && !buf.is_empty();
        if !aligned || any_cached(file, offset, buf.len() as u64) {
            return file.read_exact_at(buf, offset);
        }
        match self.direct_file(file) {
            Some(f) => match f.read_exact_at(buf, offset) {
                // A host that takes the open but not the read (alignment it wants larger).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => file.read_exact_at(buf, offset),
                r => r,
            },
            None => file.read_exact_at(buf, offset),
        }
    }

    /// Whether an `O_DIRECT` descriptor was opened (a direct read was tried).
    pub fn opened(&self) -> bool {
        matches!(self.file.get(), Some(Some(_)))
    }

    /// The `O_DIRECT` descriptor, opened on first use by reopening `file` through
    /// `/proc/self/fd` (no path needed; the same file even if renamed since).
    fn direct_file(&self, file: &File) -> Option<&File> {
        self.file
            .get_or_init(|| {
                use std::os::fd::AsRawFd;
                use std::os::unix::fs::OpenOptionsExt;
                let path = format!("/proc/self/fd/{}", file.as_raw_fd());
                // A host file system without O_DIRECT refuses the open: buffered reads then.
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .ok()
            })
            .as_ref()
    }
}

/// Whether any page of `[offset, offset + len)` of `file` is in the page cache; `true` when
/// the kernel cannot say (`cachestat(2)` is Linux 6.5+), so that reads stay buffered there.
#[allow(unsafe_code)]
fn any_cached(file: &File, offset: u64, len: u64) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Cachestat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        /// The system call's number, the same on every Linux architecture.
        const SYS_CACHESTAT: libc::c_long = 451;
        let range = Range { off: offset, len };
        let mut cs = Cachestat::default();
        // SAFETY: the kernel reads `range` and writes `cs`, both live, correctly laid out
        // (`struct cachestat_range`, `struct cachestat`) for the call; the descriptor is
        // open for the call (`file` is borrowed); flags are 0.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const Range,
                &mut cs as *mut Cachestat,
                0u32,
            )
        };
        r != 0 || cs.nr_cache > 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, offset, len);
        true
    }
}

/// How many written bytes [`FileDevice`] lets pile up before it starts their writeback.
pub const WRITEBACK_EVERY: u64 = 2 << 20;

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
        Ok(FileDevice::of(file))
    }

    fn of(file: File) -> Self {
        FileDevice {
            file,
            unflushed: AtomicU64::new(0),
            direct: DirectReads::default(),
        }
    }

    /// Starts writeback of the file's dirty pages once [`WRITEBACK_EVERY`] bytes were written
    /// since the last start. Advice only: a failure here surfaces, if it matters, at `sync`.
    #[allow(unsafe_code)]
    fn written(&self, bytes: u64) {
        use std::os::fd::AsRawFd;
        if self.unflushed.fetch_add(bytes, Ordering::Relaxed) + bytes < WRITEBACK_EVERY {
            return;
        }
        self.unflushed.store(0, Ordering::Relaxed);
        #[cfg(target_os = "linux")]
        // SAFETY: sync_file_range only reads its integer arguments; the descriptor is owned by
        // `self.file`, which stays open for the call. Offset 0 and length 0 mean the whole file.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    /// Opens an existing file for reading and writing.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(FileDevice::of(file))
    }

    /// Opens an existing file for reading only (the read-only open, W11): the kernel then
    /// refuses any write, whatever the engine does.
    pub fn open_read_only(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(FileDevice::of(file))
    }
}

/// Passes reads through and fails every mutating call (write, length change, sync, punch) with
/// `PermissionDenied`: an environment opened read-only (W11) sits on it, so a write that slipped
/// past the engine's own checks fails instead of changing the image.
#[derive(Debug)]
pub struct ReadOnlyDevice(pub std::sync::Arc<dyn BlockDevice>);

impl ReadOnlyDevice {
    fn refuse(what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{what} on an image opened read-only"),
        )
    }
}

impl BlockDevice for ReadOnlyDevice {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_direct(buf, offset)
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.0.prefetch(offset, len)
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.0.next_data(offset)
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(Self::refuse("write"))
    }
    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(Self::refuse("length change"))
    }
    fn sync(&self) -> io::Result<()> {
        Err(Self::refuse("sync"))
    }
    fn punch_hole(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(Self::refuse("hole punch"))
    }
}

impl BlockDevice for FileDevice {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.direct.read(&self.file, buf, offset)
    }

    #[allow(unsafe_code)]
    fn prefetch(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is owned by
        // `self.file`, open for the call.
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED);
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        self.written(buf.len() as u64);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.unflushed.store(0, Ordering::Relaxed);
        self.file.sync_data()
    }

    /// `lseek(SEEK_DATA)`. Positioned reads and writes do not use the file offset it moves.
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        use std::os::fd::AsRawFd;
        let Ok(off) = libc::off_t::try_from(offset) else {
            return Ok(Some(offset));
        };
        // SAFETY: lseek only reads its integer arguments; the descriptor is owned by
        // `self.file`, which stays open for the duration of the call.
        let at = unsafe { libc::lseek(self.file.as_raw_fd(), off, libc::SEEK_DATA) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENXIO) => Ok(None), // at or past the end, or only a hole after it
            // A file system that cannot tell: everything may be data.
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some(offset)),
            _ => Err(err),
        }
    }

    #[allow(unsafe_code)]
    fn host_available(&self) -> io::Result<Option<u64>> {
        use std::os::fd::AsRawFd;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: fstatvfs writes one `statvfs` into the pointer it is given, which points at
        // a zero-initialised value of that type; the descriptor stays open for the call.
        let rc = unsafe { libc::fstatvfs(self.file.as_raw_fd(), st.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatvfs returned 0, so it filled the value (and it was zeroed before).
        let st = unsafe { st.assume_init() };
        Ok(Some(st.f_bavail.saturating_mul(st.f_frsize)))
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
/// Storage is sparse (64 KiB chunks, absent chunks read as zeros), so an image with a large
/// preallocated log region costs only what was written.
#[derive(Debug, Default)]
pub struct MemDevice {
    bytes: Mutex<Sparse>,
}

const CHUNK: usize = 64 << 10;

#[derive(Debug, Default)]
struct Sparse {
    len: u64,
    chunks: std::collections::BTreeMap<u64, Box<[u8]>>,
}

impl Sparse {
    fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = end_of(offset, buf.len())? as u64;
        if end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of [{offset}, {end}) past end {}", self.len),
            ));
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (ci, within) = (pos / CHUNK as u64, (pos % CHUNK as u64) as usize);
            let n = (CHUNK - within).min(buf.len() - done);
            match self.chunks.get(&ci) {
                Some(c) => buf[done..done + n].copy_from_slice(&c[within..within + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    fn write(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = end_of(offset, buf.len())? as u64;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (ci, within) = (pos / CHUNK as u64, (pos % CHUNK as u64) as usize);
            let n = (CHUNK - within).min(buf.len() - done);
            let c = self
                .chunks
                .entry(ci)
                .or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            c[within..within + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        self.len = self.len.max(end);
        Ok(())
    }

    /// Zeroes `[offset, end)` (clamped to the length), dropping whole chunks.
    fn zero(&mut self, offset: u64, end: u64) {
        let end = end.min(self.len);
        let mut pos = offset;
        while pos < end {
            let (ci, within) = (pos / CHUNK as u64, (pos % CHUNK as u64) as usize);
            let n = ((CHUNK - within) as u64).min(end - pos) as usize;
            if within == 0 && n == CHUNK {
                self.chunks.remove(&ci);
            } else if let Some(c) = self.chunks.get_mut(&ci) {
                c[within..within + n].fill(0);
            }
            pos += n as u64;
        }
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            self.zero(len, self.len);
            let first_dead = len.div_ceil(CHUNK as u64);
            self.chunks.retain(|&ci, _| ci < first_dead);
        }
        self.len = len;
    }
}

impl MemDevice {
    /// An empty device.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device holding `bytes` (e.g. a snapshot taken earlier).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        let mut s = Sparse::default();
        for (i, c) in bytes.chunks(CHUNK).enumerate() {
            if c.iter().any(|&b| b != 0) {
                let _ = s.write(c, (i * CHUNK) as u64);
            }
        }
        s.len = bytes.len() as u64;
        MemDevice {
            bytes: Mutex::new(s),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        let s = self.bytes.lock();
        let mut v = vec![0u8; s.len as usize];
        let _ = s.read(&mut v, 0);
        v
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
        Ok(self.bytes.lock().len)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.bytes.lock().read(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.bytes.lock().write(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        end_of(len, 0)?;
        self.bytes.lock().set_len(len);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.bytes.lock().zero(offset, offset.saturating_add(len));
        Ok(())
    }
}

/// Decides, call by call, whether a [`GatedDevice`] lets a call reach the device it wraps: the
/// one place a test device says "fail from here on" (a dead disk, a power cut, a killed
/// process). An error returned here is the call's result; the wrapped device never sees it.
pub trait Gate: Send + Sync + std::fmt::Debug {
    /// Before each mutating call (write, set_len, sync, punch_hole).
    fn mutating(&self) -> io::Result<()>;
    /// Before each read.
    fn read(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A device whose calls pass through a [`Gate`] first; everything else is forwarded unchanged.
/// [`FaultyDevice`] is one; the crash tests gate a [`CrashDevice`] the same way.
#[derive(Debug)]
pub struct GatedDevice<G: Gate> {
    inner: std::sync::Arc<dyn BlockDevice>,
    gate: G,
}

impl<G: Gate> GatedDevice<G> {
    /// `inner` behind `gate`.
    pub fn new(inner: std::sync::Arc<dyn BlockDevice>, gate: G) -> Self {
        GatedDevice { inner, gate }
    }

    /// The gate (to read its counters or change its state).
    pub fn gate(&self) -> &G {
        &self.gate
    }
}

impl<G: Gate> BlockDevice for GatedDevice<G> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.gate.read()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.gate.mutating()?;
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.gate.mutating()?;
        self.inner.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.gate.mutating()?;
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate.mutating()?;
        self.inner.punch_hole(offset, len)
    }
    fn capacity(&self) -> io::Result<Option<u64>> {
        self.inner.capacity()
    }
}

/// Wraps a device and fails its `n`-th mutating call (write, set_len, sync, punch_hole; counted
/// from 0) and every mutating call after it, like a disk that died. Reads pass through unless
/// [`FaultyDevice::failing_reads`] built it. The error is EIO-like, or ENOSPC for
/// [`FaultyDevice::no_space`].
pub type FaultyDevice = GatedDevice<Faults>;

/// The gate of a [`FaultyDevice`]: counts calls and fails them from a given one on.
#[derive(Debug)]
pub struct Faults {
    fail_at: u64,
    calls: AtomicU64,
    enospc: bool,
    fail_reads_at: u64,
    reads: AtomicU64,
}

impl Gate for Faults {
    fn mutating(&self) -> io::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.fail_at {
            if self.enospc {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            } else {
                Err(io::Error::other("injected I/O fault"))
            }
        } else {
            Ok(())
        }
    }
    fn read(&self) -> io::Result<()> {
        if self.reads.fetch_add(1, Ordering::SeqCst) >= self.fail_reads_at {
            return Err(io::Error::other("injected read fault"));
        }
        Ok(())
    }
}

impl GatedDevice<Faults> {
    /// Fails mutating call number `fail_at` and all later ones.
    pub fn failing(inner: std::sync::Arc<dyn BlockDevice>, fail_at: u64) -> Self {
        Self::faults(inner, fail_at, false, u64::MAX)
    }

    /// Like [`failing`](Self::failing), but the failures are ENOSPC (a full disk).
    pub fn no_space(inner: std::sync::Arc<dyn BlockDevice>, fail_at: u64) -> Self {
        Self::faults(inner, fail_at, true, u64::MAX)
    }

    /// Fails read number `fail_at` (counted from 0) and all later reads; writes pass through.
    pub fn failing_reads(inner: std::sync::Arc<dyn BlockDevice>, fail_at: u64) -> Self {
        Self::faults(inner, u64::MAX, false, fail_at)
    }

    fn faults(
        inner: std::sync::Arc<dyn BlockDevice>,
        fail_at: u64,
        enospc: bool,
        fail_reads_at: u64,
    ) -> Self {
        let gate = Faults {
            fail_at,
            calls: AtomicU64::new(0),
            enospc,
            fail_reads_at,
            reads: AtomicU64::new(0),
        };
        GatedDevice::new(inner, gate)
    }

    /// Mutating calls attempted so far (failed ones included).
    pub fn calls(&self) -> u64 {
        self.gate.calls.load(Ordering::SeqCst)
    }

    /// Reads attempted so far (failed ones included).
    pub fn reads(&self) -> u64 {
        self.gate.reads.load(Ordering::SeqCst)
    }
}

/// Wraps a device and gives it a fixed capacity, like a disk partition: a write or length
/// change past `capacity` bytes fails with ENOSPC and changes nothing. Tests of a full device
/// run on it (tests/full.rs); the file system's block-device wrapper behaves the same way.
#[derive(Debug)]
pub struct LimitedDevice {
    inner: std::sync::Arc<dyn BlockDevice>,
    capacity: u64,
}

impl LimitedDevice {
    /// `inner` limited to `capacity` bytes.
    pub fn new(inner: std::sync::Arc<dyn BlockDevice>, capacity: u64) -> Self {
        LimitedDevice { inner, capacity }
    }

    fn check(&self, end: u64) -> io::Result<()> {
        if end > self.capacity {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        } else {
            Ok(())
        }
    }
}

impl BlockDevice for LimitedDevice {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_direct(buf, offset)
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.inner.prefetch(offset, len)
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.inner.next_data(offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset.saturating_add(buf.len() as u64))?;
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check(len)?;
        self.inner.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
    fn capacity(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.capacity))
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

    /// A device whose durable (and current) contents are `bytes`, e.g. a crash image to recover
    /// from (and crash again).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        CrashDevice {
            state: Mutex::new(CrashState {
                durable: bytes.clone(),
                current: bytes,
                pending: Vec::new(),
            }),
        }
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
        // Replaying the pending operations onto the durable bytes costs what was written since
        // the last sync, not the size of the image.
        let mut st = self.state.lock();
        let st = &mut *st;
        for op in st.pending.drain(..) {
            match op {
                PendingOp::Write(off, data) => mem_write(&mut st.durable, &data, off)?,
                PendingOp::SetLen(len) => st.durable.resize(len as usize, 0),
                PendingOp::Punch(off, len) => mem_punch(&mut st.durable, off, len),
            }
        }
        debug_assert!(st.durable == st.current);
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        mem_punch(&mut st.current, offset, len);
        st.pending.push(PendingOp::Punch(offset, len));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes at an address aligned to [`DIRECT_ALIGN`], inside `mem`.
    fn aligned(mem: &mut Vec<u8>, len: usize) -> &mut [u8] {
        mem.resize(len + DIRECT_ALIGN, 0);
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        &mut mem[start..start + len]
    }

    #[allow(unsafe_code)]
    fn drop_cached_pages(d: &FileDevice) {
        use std::os::fd::AsRawFd;
        // SAFETY: integer arguments only; the descriptor is open for the call.
        unsafe {
            libc::posix_fadvise(d.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }

    #[test]
    fn a_direct_read_returns_what_a_buffered_one_does_cached_or_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = FileDevice::create(dir.path().join("img")).expect("create");
        let bytes: Vec<u8> = (0..256 * 1024u32)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        d.write_at(&bytes, 0).expect("write");
        let (mut mem, mut other) = (Vec::new(), Vec::new());
        // Written, not synced: dirty pages, read from the cache.
        let buf = aligned(&mut mem, 128 * 1024);
        d.read_direct(buf, 64 * 1024).expect("read dirty");
        assert!(buf == &bytes[64 * 1024..192 * 1024]);
        // Synced and dropped from the cache: read past it.
        d.sync().expect("sync");
        drop_cached_pages(&d);
        assert!(!any_cached(&d.file, 0, bytes.len() as u64), "pages dropped");
        d.read_direct(buf, 64 * 1024).expect("read direct");
        assert!(buf == &bytes[64 * 1024..192 * 1024]);
        assert!(
            d.direct.opened(),
            "the O_DIRECT descriptor was opened and used"
        );
        // Unaligned buffer, offset or length: buffered, the same bytes.
        let odd = &mut aligned(&mut other, 8193)[1..];
        d.read_direct(odd, 4096).expect("read unaligned");
        assert!(odd == &bytes[4096..4096 + 8192]);
        d.read_direct(&mut buf[..4096], 100)
            .expect("read at odd offset");
        assert!(buf[..4096] == bytes[100..4196]);
        // Rewritten after the direct read: the new bytes, never stale ones.
        d.write_at(&[0xEE; 4096], 64 * 1024).expect("rewrite");
        d.read_direct(&mut buf[..8192], 64 * 1024)
            .expect("read rewritten");
        assert!(buf[..4096].iter().all(|&b| b == 0xEE));
        assert!(buf[4096..8192] == bytes[68 * 1024..72 * 1024]);
        // Past the end: an error, as `read_at` gives.
        drop_cached_pages(&d);
        let err = d.read_direct(buf, 192 * 1024).expect_err("past the end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
