//! Conversions between fern-fs's types and fuser's: attributes, file types, times, open
//! flags, and the reply errno. It owns no policy; in particular the errno of a failure is
//! decided by [`fern_fs::FsError::errno`], the one mapping, and only carried here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fern_fs::{Attr, FileType, FsError, OpenFlags, TimeSet, Timespec};
use fuser::{Errno, FileAttr, INodeNo, TimeOrNow};

/// The errno a failure becomes: fern-fs's one mapping, wrapped for fuser.
pub fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

/// fern-fs file type to fuser's.
pub fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
    }
}

/// A stored timestamp as a `SystemTime` (before-epoch times included).
pub fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        // -1.5 s is stored as sec = -2, nsec = 500_000_000.
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nsec))
    }
}

/// A `SystemTime` from the kernel as a stored timestamp.
pub fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    }
}

/// `UTIME_NOW` or an explicit time.
pub fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timespec(t)),
    }
}

/// fern-fs attributes as the kernel wants them.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: kind(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's rdev field is 32 bits (new_encode_dev); larger numbers cannot be
        // expressed and are truncated, as they would be by any FUSE file system.
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes sent with `.` and `..` in a readdirplus reply, which the kernel does not
/// use: directory `ino`, nothing else known.
pub fn dot_attr(ino: fern_fs::InodeId) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino.0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::Directory,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// open(2)/create flags as fern-fs open flags. `append` is dropped under the writeback cache:
/// there the kernel owns the file size and sends appends with explicit offsets.
pub fn open_flags(flags: i32, writeback: bool) -> OpenFlags {
    let acc = flags & libc::O_ACCMODE;
    OpenFlags {
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        append: flags & libc::O_APPEND != 0 && !writeback,
        truncate: flags & libc::O_TRUNC != 0,
        exclusive: flags & libc::O_EXCL != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_epoch() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec {
                sec: 1_700_000_000,
                nsec: 123_456_789,
            },
            Timespec {
                sec: -2,
                nsec: 500_000_000,
            },
            Timespec { sec: -1, nsec: 0 },
        ] {
            assert_eq!(timespec(system_time(t)), t);
        }
    }

    #[test]
    fn open_flags_follow_access_mode() {
        let f = open_flags(libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC, false);
        assert!(f.write && f.append && f.truncate && !f.exclusive);
        let f = open_flags(libc::O_RDONLY, false);
        assert!(!f.write);
        assert!(!open_flags(libc::O_RDWR | libc::O_APPEND, true).append);
    }
}
