//! Inode attributes: the persisted [`Stat`], the public [`Attr`] view, file types, timestamps
//! and the [`SetAttr`] request. It owns the stat byte layout (68 bytes, big-endian, see
//! docs/fs-design.md); it must never touch the store.

use crate::codec::{Reader, Writer};
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;

/// Bits of `mode` that hold the file type.
pub const S_IFMT: u32 = 0o170000;
/// Encoded length of a [`Stat`].
pub const STAT_LEN: usize = 4 * 4 + 8 + 3 * 12 + 8;

/// The type of a file, as `mode & S_IFMT` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix-domain socket.
    Socket,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
}

impl FileType {
    /// The `S_IF*` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
            FileType::CharDevice => 0o020000,
            FileType::BlockDevice => 0o060000,
        }
    }

    /// The type encoded in `mode`, if it is one.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & S_IFMT {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            0o010000 => FileType::Fifo,
            0o140000 => FileType::Socket,
            0o020000 => FileType::CharDevice,
            0o060000 => FileType::BlockDevice,
            _ => return None,
        })
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds (may be negative).
    pub sec: i64,
    /// Nanoseconds, `< 1_000_000_000`.
    pub nsec: u32,
}

impl Timespec {
    /// The current wall-clock time.
    pub fn now() -> Timespec {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Timespec::default(),
        }
    }
    fn write(&self, w: &mut Writer) {
        w.i64(self.sec).u32(self.nsec);
    }
    fn read(r: &mut Reader<'_>) -> FsResult<Timespec> {
        let sec = r.i64()?;
        let nsec = r.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(FsError::corrupt("stat: nanoseconds out of range"));
        }
        Ok(Timespec { sec, nsec })
    }
}

/// The persisted attributes of an inode (everything but its id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Size in bytes (symlinks: target length).
    pub size: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Device number of a character or block device. For a regular file the same 8 bytes hold
    /// its stored data blocks + 1, 0 meaning "not counted" (images written before the count
    /// existed): see [`Stat::stored_blocks`]. A regular file has no device number, so the
    /// field was always 0 there, and old images decode unchanged.
    pub rdev: u64,
}

impl Stat {
    /// Data blocks stored for a regular file (holes excluded), or `None` when not counted
    /// (other types, and files written before the count existed).
    pub fn stored_blocks(&self) -> Option<u64> {
        let regular = self.mode & S_IFMT == FileType::Regular.mode_bits();
        (regular && self.rdev != 0).then(|| self.rdev - 1)
    }

    /// Records `n` stored data blocks (regular files only; other types keep their rdev).
    pub fn set_stored_blocks(&mut self, n: u64) {
        if self.mode & S_IFMT == FileType::Regular.mode_bits() {
            self.rdev = n.saturating_add(1);
        }
    }

    /// A fresh inode's stat: all three times `now`.
    pub fn new(mode: u32, uid: u32, gid: u32, nlink: u32, now: Timespec) -> Stat {
        Stat {
            mode,
            uid,
            gid,
            nlink,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
        }
    }

    /// The file type, or `Corrupt` if the mode holds none.
    pub fn kind(&self) -> FsResult<FileType> {
        FileType::from_mode(self.mode).ok_or_else(|| FsError::corrupt("stat: bad file type"))
    }

    /// Appends the 68-byte encoding.
    pub fn write(&self, w: &mut Writer) {
        w.u32(self.mode)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.nlink)
            .u64(self.size);
        self.atime.write(w);
        self.mtime.write(w);
        self.ctime.write(w);
        w.u64(self.rdev);
    }

    /// Decodes the 68-byte encoding.
    pub fn read(r: &mut Reader<'_>) -> FsResult<Stat> {
        let stat = Stat {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u32()?,
            size: r.u64()?,
            atime: Timespec::read(r)?,
            mtime: Timespec::read(r)?,
            ctime: Timespec::read(r)?,
            rdev: r.u64()?,
        };
        stat.kind()?;
        Ok(stat)
    }

    /// The public view of this stat for inode `ino`.
    pub fn to_attr(&self, ino: InodeId, blksize: u32) -> FsResult<Attr> {
        let kind = self.kind()?;
        // Stored blocks in 512-byte units (a short last block counts whole, as a block file
        // system allocates it); uncounted files report the upper bound their size implies.
        let blocks = match self.stored_blocks() {
            Some(n) => n.saturating_mul(u64::from(blksize) / 512),
            None => self.size.div_ceil(512),
        };
        let rdev = if kind == FileType::Regular {
            0
        } else {
            self.rdev
        };
        Ok(Attr {
            ino,
            kind,
            perm: self.mode & 0o7777,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            blocks,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            rdev,
            blksize,
        })
    }
}

/// What `getattr` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: InodeId,
    /// File type.
    pub kind: FileType,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks stored (regular files: data blocks really stored, holes excluded).
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Device number.
    pub rdev: u64,
    /// Preferred I/O size: the file system's block size.
    pub blksize: u32,
}

/// A timestamp to set: an explicit value or "now" (`UTIME_NOW`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time.
    Now,
    /// This time.
    At(Timespec),
}

/// The fields `setattr` changes; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (the type bits are kept).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// New change time (only FUSE passes it explicitly; otherwise it is set to now).
    pub ctime: Option<Timespec>,
}
