//! fernfs on a block device: the engine's device trait over a raw disk or partition, and the
//! signature probe that keeps `mkfs` from overwriting a file system by accident.
//!
//! The engine treats its device like a file that grows as it writes and shrinks when it gives
//! the free tail back. A block device has a fixed capacity, so [`Partition`] keeps a logical
//! length in memory: 0 for a device being formatted (the engine formats only empty devices),
//! the capacity for one being opened (every extent a checkpoint references lies below it);
//! growing past the capacity is ENOSPC, shrinking just lowers the logical length. Bytes the
//! engine has never written are whatever the disk held before, which is why [`zero_prefix`]
//! clears the headers and log region before formatting: the log scan must not find records
//! of an earlier image there. Nothing else is read unless a checkpoint points at it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use fern_tree::device::{BlockDevice, DirectReads};

use super::image::CmdError;

/// True when `path` is a block device.
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// A block device as an engine device (see the module comment).
#[derive(Debug)]
pub struct Partition {
    file: File,
    capacity: u64,
    len: AtomicU64,
    /// Data extents are read past the device's page cache, as from an image file.
    direct: DirectReads,
}

impl Partition {
    /// Opens the device at `path` for reading and writing. `fresh`: it is about to be
    /// formatted, so its logical length starts at 0; otherwise at its capacity.
    pub fn open(path: &Path, fresh: bool) -> io::Result<Partition> {
        Self::open_file(path, fresh, false)
    }

    /// Opens a device holding an image, for reading only if `read_only` (the kernel then
    /// refuses every write through it).
    pub fn open_existing(path: &Path, read_only: bool) -> io::Result<Partition> {
        Self::open_file(path, false, read_only)
    }

    fn open_file(path: &Path, fresh: bool, read_only: bool) -> io::Result<Partition> {
        let mut file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        // A block device's metadata length is 0; its size is where seeking to the end lands.
        let capacity = file.seek(SeekFrom::End(0))?;
        Ok(Partition {
            file,
            capacity,
            len: AtomicU64::new(if fresh { 0 } else { capacity }),
            direct: DirectReads::default(),
        })
    }

    /// Size of the device in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// A read must lie below the logical length: past it the disk holds whatever was there.
    fn within(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if offset.saturating_add(buf.len() as u64) > self.len.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the image",
            ));
        }
        Ok(())
    }

    fn no_space(&self, end: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the block device is full: {end} bytes needed, {} available",
                self.capacity
            ),
        )
    }
}

impl BlockDevice for Partition {
    fn len(&self) -> io::Result<u64> {
        Ok(self.len.load(Ordering::SeqCst))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.within(buf, offset)?;
        self.file.read_exact_at(buf, offset)
    }

    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.within(buf, offset)?;
        self.direct.read(&self.file, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        if end > self.capacity {
            return Err(self.no_space(end));
        }
        self.file.write_all_at(buf, offset)?;
        self.len.fetch_max(end, Ordering::SeqCst);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.capacity {
            return Err(self.no_space(len));
        }
        self.len.store(len, Ordering::SeqCst);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // fsync of a block device flushes its page cache and the disk's write cache.
        self.file.sync_all()
    }

    fn capacity(&self) -> io::Result<Option<u64>> {
        // The engine never allocates past it (format.md, B11), so writes never reach the
        // ENOSPC above except through a bug.
        Ok(Some(self.capacity))
    }
    // punch_hole: the default (keep the bytes). Discarding freed extents would be correct but
    // slow on some disks; the space is the device's anyway.
}

/// Zeroes `[0, len)` of the device: by asking the kernel to zero the range (cheap on loop
/// devices and disks with write-zeroes), else by writing zeros.
pub fn zero_prefix(p: &Partition, len: u64) -> io::Result<()> {
    let len = len.min(p.capacity);
    let zeroed = rustix::fs::fallocate(
        &p.file,
        rustix::fs::FallocateFlags::ZERO_RANGE | rustix::fs::FallocateFlags::KEEP_SIZE,
        0,
        len,
    )
    .or_else(|_| {
        rustix::fs::fallocate(
            &p.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            0,
            len,
        )
    });
    if zeroed.is_err() {
        let zeros = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(zeros.len() as u64) as usize;
            p.file.write_all_at(&zeros[..n], off)?;
            off += n as u64;
        }
    }
    p.file.sync_all()
}

/// File-system signatures `mkfs` recognises: (name, byte offset, magic).
const SIGNATURES: &[(&str, u64, &[u8])] = &[
    ("fernfs", 0, b"FERNTREE"),
    ("fernfs", 4096, b"FERNTREE"), // the second header slot
    ("ext2/ext3/ext4", 1080, &[0x53, 0xef]),
    ("xfs", 0, b"XFSB"),
    ("btrfs", 65600, b"_BHRfS_M"),
    ("swap", 4086, b"SWAPSPACE2"),
    ("swap", 4086, b"SWAP-SPACE"),
    ("LUKS", 0, b"LUKS\xba\xbe"),
    ("LVM2 physical volume", 536, b"LVM2 001"),
    ("GPT partition table", 512, b"EFI PART"),
    ("squashfs", 0, b"hsqs"),
    ("f2fs", 1024, &[0x10, 0x20, 0xf5, 0xf2]),
    ("iso9660", 32769, b"CD001"),
    ("NTFS", 3, b"NTFS    "),
    ("FAT", 54, b"FAT1"),
    ("FAT32", 82, b"FAT32   "),
    (
        "bcachefs",
        4120,
        &[0xc6, 0x85, 0x73, 0xf6, 0x66, 0xce, 0x90, 0xa9],
    ),
];

/// The file system or partition table `path` appears to hold, if any: the signatures above,
/// then `blkid -p` (util-linux) when it is installed, which knows many more.
pub fn probe_signature(path: &Path) -> Result<Option<String>, CmdError> {
    let mut head = Vec::with_capacity(128 << 10);
    File::open(path)
        .and_then(|f| f.take(128 << 10).read_to_end(&mut head))
        .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
    for (name, off, magic) in SIGNATURES {
        let (start, end) = (*off as usize, *off as usize + magic.len());
        if head.get(start..end) == Some(magic) {
            return Ok(Some(name.to_string()));
        }
    }
    // An MBR partition table: the boot signature plus at least one typed partition entry.
    if head.get(510..512) == Some(&[0x55, 0xaa]) && (0..4).any(|i| head[446 + 16 * i + 4] != 0) {
        return Ok(Some("DOS partition table (or a boot sector)".into()));
    }
    let blkid = std::process::Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(path)
        .output();
    if let Ok(out) = blkid {
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::to_string)
        };
        if let Some(t) = field("TYPE=").or_else(|| field("PTTYPE=")) {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fern_testkit::{skipped, LoopDevice, Need};

    /// A page-aligned slice of `len` bytes inside `mem`.
    fn aligned(mem: &mut Vec<u8>, len: usize) -> &mut [u8] {
        mem.resize(len + 4096, 0);
        let start = mem.as_ptr().align_offset(4096);
        &mut mem[start..start + len]
    }

    /// A data extent's read on a block device goes past its page cache, returns what was
    /// written, and stays inside the logical length.
    #[test]
    fn a_partition_reads_past_its_page_cache_within_its_length() {
        let usable = fern_testkit::fuse_as_root().and_then(|()| {
            std::process::Command::new("losetup")
                .arg("-V")
                .output()
                .map(drop)
                .map_err(|e| format!("losetup: {e}"))
        });
        if skipped(Need::Fuse, usable) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dev = LoopDevice::new(&tmp.path().join("backing"), 16 << 20);
        let p = Partition::open(dev.path(), true).unwrap();
        let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i * 13 + i / 4096) as u8).collect();
        p.write_at(&bytes, 4 << 20).unwrap();
        p.sync().unwrap();
        // The device's cached pages go; the next aligned read is direct.
        let out = std::process::Command::new("blockdev")
            .arg("--flushbufs")
            .arg(dev.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut mem = Vec::new();
        let buf = aligned(&mut mem, 1 << 20);
        p.read_direct(buf, 4 << 20).unwrap();
        assert!(*buf == *bytes);
        assert!(p.direct.opened(), "read with O_DIRECT");
        let err = p
            .read_direct(buf, 5 << 20)
            .expect_err("past the logical length");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
