//! One request taken from a ring entry, decoded and handed to the [`Handler`]: the op's fixed
//! argument struct is in the header's `op_in` area, its other arguments (names, data) in the
//! payload (the kernel puts a request's first argument in `op_in` and the rest in the
//! payload; ops without a fixed struct have an empty first argument). Owns decoding only;
//! replies are encoded by `reply.rs`, the entry is committed by `queue.rs`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use fuser::{
    AccessFlags, Errno, FileHandle, INodeNo, LockOwner, OpenFlags, RenameFlags, TimeOrNow,
    WriteFlags,
};

use super::abi::{self, Fields, InHeader};
use crate::handler::{Handler, Request};
use crate::reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Slot, Via,
};

/// The NUL-terminated strings at the start of a payload, in order.
struct Names<'a>(&'a [u8]);

impl<'a> Names<'a> {
    fn next(&mut self) -> Option<&'a OsStr> {
        let end = self.0.iter().position(|&b| b == 0)?;
        let (name, rest) = self.0.split_at(end);
        self.0 = &rest[1..];
        Some(OsStr::from_bytes(name))
    }
}

/// Decodes the request in `head`/`payload` and runs it on `h`, replying into `slot`.
/// A request too short for its op is answered EIO (the kernel never sends one; a reply is
/// owed all the same). DESTROY is answered here: the session's end is fuser's to handle.
pub(crate) fn dispatch<H: Handler>(
    h: &H,
    req: &InHeader,
    op: &[u8],
    payload: &[u8],
    slot: Slot<'_>,
) {
    let r = Request::new(req.uid, req.gid, req.pid);
    let ino = INodeNo(req.nodeid);
    // A malformed request has been answered EIO inside `run`.
    let _ = run(h, &r, ino, req.opcode, Fields(op), payload, slot);
}

struct Malformed;

macro_rules! need {
    ($e:expr, $slot:expr) => {
        match $e {
            Some(v) => v,
            None => {
                ReplyEmpty(Via::Ring($slot)).error(Errno::EIO);
                return Err(Malformed);
            }
        }
    };
}

fn fh(f: &Fields<'_>, off: usize) -> Option<FileHandle> {
    f.u64(off).map(FileHandle)
}

/// `struct fuse_read_in` / `fuse_write_in`, which share a layout: fh, offset, size, the
/// op's own flags, lock_owner, open flags.
fn io_in(f: &Fields<'_>) -> Option<(FileHandle, u64, u32, u32, u64, u32)> {
    Some((
        fh(f, 0)?,
        f.u64(8)?,
        f.u32(16)?,
        f.u32(20)?,
        f.u64(24)?,
        f.u32(32)?,
    ))
}

fn run<H: Handler>(
    h: &H,
    r: &Request,
    ino: INodeNo,
    opcode: u32,
    f: Fields<'_>,
    payload: &[u8],
    slot: Slot<'_>,
) -> Result<(), Malformed> {
    let mut names = Names(payload);
    match opcode {
        abi::LOOKUP => {
            let name = need!(names.next(), slot);
            h.lookup(r, ino, name, ReplyEntry(Via::Ring(slot)))
        }
        abi::GETATTR => {
            let flags = need!(f.u32(0), slot);
            let fh = (flags & abi::GETATTR_FH != 0).then(|| fh(&f, 8)).flatten();
            h.getattr(r, ino, fh, ReplyAttr(Via::Ring(slot)))
        }
        abi::SETATTR => {
            let valid = need!(f.u32(0), slot);
            let g = |off| f.u64(off);
            let (fh_, size, atime, mtime, ctime) = (
                need!(g(8), slot),
                need!(g(16), slot),
                need!(g(32), slot),
                need!(g(40), slot),
                need!(g(48), slot),
            );
            let (atimensec, mtimensec, ctimensec, mode, uid, gid) = (
                need!(f.u32(56), slot),
                need!(f.u32(60), slot),
                need!(f.u32(64), slot),
                need!(f.u32(68), slot),
                need!(f.u32(76), slot),
                need!(f.u32(80), slot),
            );
            let has = |bit: u32| valid & bit != 0;
            let when = |now_bit, secs, nsecs| {
                if has(now_bit) {
                    TimeOrNow::Now
                } else {
                    TimeOrNow::SpecificTime(abi::system_time(secs, nsecs))
                }
            };
            h.setattr(
                r,
                ino,
                has(abi::FATTR_MODE).then_some(mode),
                has(abi::FATTR_UID).then_some(uid),
                has(abi::FATTR_GID).then_some(gid),
                has(abi::FATTR_SIZE).then_some(size),
                has(abi::FATTR_ATIME).then(|| when(abi::FATTR_ATIME_NOW, atime, atimensec)),
                has(abi::FATTR_MTIME).then(|| when(abi::FATTR_MTIME_NOW, mtime, mtimensec)),
                has(abi::FATTR_CTIME).then(|| abi::system_time(ctime, ctimensec)),
                has(abi::FATTR_FH).then_some(FileHandle(fh_)),
                None,
                None,
                None,
                None,
                ReplyAttr(Via::Ring(slot)),
            )
        }
        abi::READLINK => h.readlink(r, ino, ReplyData(Via::Ring(slot))),
        abi::SYMLINK => {
            let name = need!(names.next(), slot);
            let target = need!(names.next(), slot);
            h.symlink(r, ino, name, Path::new(target), ReplyEntry(Via::Ring(slot)))
        }
        abi::MKNOD => {
            let (mode, rdev, umask) = (
                need!(f.u32(0), slot),
                need!(f.u32(4), slot),
                need!(f.u32(8), slot),
            );
            let name = need!(names.next(), slot);
            h.mknod(r, ino, name, mode, umask, rdev, ReplyEntry(Via::Ring(slot)))
        }
        abi::MKDIR => {
            let (mode, umask) = (need!(f.u32(0), slot), need!(f.u32(4), slot));
            let name = need!(names.next(), slot);
            h.mkdir(r, ino, name, mode, umask, ReplyEntry(Via::Ring(slot)))
        }
        abi::UNLINK => {
            let name = need!(names.next(), slot);
            h.unlink(r, ino, name, ReplyEmpty(Via::Ring(slot)))
        }
        abi::RMDIR => {
            let name = need!(names.next(), slot);
            h.rmdir(r, ino, name, ReplyEmpty(Via::Ring(slot)))
        }
        abi::RENAME | abi::RENAME2 => {
            let newdir = need!(f.u64(0), slot);
            let flags = if opcode == abi::RENAME2 {
                need!(f.u32(8), slot)
            } else {
                0
            };
            let name = need!(names.next(), slot);
            let newname = need!(names.next(), slot);
            h.rename(
                r,
                ino,
                name,
                INodeNo(newdir),
                newname,
                RenameFlags::from_bits_retain(flags),
                ReplyEmpty(Via::Ring(slot)),
            )
        }
        abi::LINK => {
            let old = need!(f.u64(0), slot);
            let newname = need!(names.next(), slot);
            h.link(r, INodeNo(old), ino, newname, ReplyEntry(Via::Ring(slot)))
        }
        abi::OPEN | abi::OPENDIR => {
            let flags = OpenFlags(need!(f.u32(0), slot) as i32);
            if opcode == abi::OPEN {
                h.open(r, ino, flags, ReplyOpen(Via::Ring(slot)))
            } else {
                h.opendir(r, ino, flags, ReplyOpen(Via::Ring(slot)))
            }
        }
        abi::READ => {
            let (fh_, offset, size, rflags, owner, flags) = need!(io_in(&f), slot);
            let owner = (rflags & abi::READ_LOCKOWNER != 0).then_some(LockOwner(owner));
            let flags = OpenFlags(flags as i32);
            h.read(
                r,
                ino,
                fh_,
                offset,
                size,
                flags,
                owner,
                ReplyData(Via::Ring(slot)),
            )
        }
        abi::WRITE => {
            let (fh_, offset, size, wflags, owner, flags) = need!(io_in(&f), slot);
            let data = need!(payload.get(..size as usize), slot);
            let owner = (wflags & abi::WRITE_LOCKOWNER != 0).then_some(LockOwner(owner));
            h.write(
                r,
                ino,
                fh_,
                offset,
                data,
                WriteFlags::from_bits_retain(wflags),
                OpenFlags(flags as i32),
                owner,
                ReplyWrite(Via::Ring(slot)),
            )
        }
        abi::STATFS => h.statfs(r, ino, ReplyStatfs(Via::Ring(slot))),
        abi::RELEASE | abi::RELEASEDIR => {
            let (fh_, flags, rflags, owner) = (
                need!(fh(&f, 0), slot),
                need!(f.u32(8), slot),
                need!(f.u32(12), slot),
                need!(f.u64(16), slot),
            );
            let flags = OpenFlags(flags as i32);
            if opcode == abi::RELEASE {
                let owner = (rflags & abi::RELEASE_FLOCK_UNLOCK != 0).then_some(LockOwner(owner));
                let flush = rflags & abi::RELEASE_FLUSH != 0;
                h.release(
                    r,
                    ino,
                    fh_,
                    flags,
                    owner,
                    flush,
                    ReplyEmpty(Via::Ring(slot)),
                )
            } else {
                h.releasedir(r, ino, fh_, flags, ReplyEmpty(Via::Ring(slot)))
            }
        }
        abi::FSYNC | abi::FSYNCDIR => {
            let (fh_, fflags) = (need!(fh(&f, 0), slot), need!(f.u32(8), slot));
            let datasync = fflags & 1 != 0;
            if opcode == abi::FSYNC {
                h.fsync(r, ino, fh_, datasync, ReplyEmpty(Via::Ring(slot)))
            } else {
                h.fsyncdir(r, ino, fh_, datasync, ReplyEmpty(Via::Ring(slot)))
            }
        }
        abi::SETXATTR => {
            let (size, flags) = (need!(f.u32(0), slot), need!(f.u32(4), slot));
            let name = need!(names.next(), slot);
            let value = need!(names.0.get(..size as usize), slot);
            h.setxattr(
                r,
                ino,
                name,
                value,
                flags as i32,
                0,
                ReplyEmpty(Via::Ring(slot)),
            )
        }
        abi::GETXATTR => {
            let size = need!(f.u32(0), slot);
            let name = need!(names.next(), slot);
            h.getxattr(r, ino, name, size, ReplyXattr(Via::Ring(slot)))
        }
        abi::LISTXATTR => {
            let size = need!(f.u32(0), slot);
            h.listxattr(r, ino, size, ReplyXattr(Via::Ring(slot)))
        }
        abi::REMOVEXATTR => {
            let name = need!(names.next(), slot);
            h.removexattr(r, ino, name, ReplyEmpty(Via::Ring(slot)))
        }
        abi::FLUSH => {
            let (fh_, owner) = (need!(fh(&f, 0), slot), need!(f.u64(16), slot));
            h.flush(r, ino, fh_, LockOwner(owner), ReplyEmpty(Via::Ring(slot)))
        }
        abi::READDIR | abi::READDIRPLUS => {
            let (fh_, offset, size) = (
                need!(fh(&f, 0), slot),
                need!(f.u64(8), slot),
                need!(f.u32(16), slot),
            );
            let mut slot = slot;
            slot.limit = size as usize;
            if opcode == abi::READDIR {
                h.readdir(r, ino, fh_, offset, ReplyDirectory(Via::Ring(slot)))
            } else {
                h.readdirplus(r, ino, fh_, offset, ReplyDirectoryPlus(Via::Ring(slot)))
            }
        }
        abi::ACCESS => {
            let mask = need!(f.u32(0), slot);
            let mask = AccessFlags::from_bits_retain(mask as i32);
            h.access(r, ino, mask, ReplyEmpty(Via::Ring(slot)))
        }
        abi::CREATE => {
            let (flags, mode, umask) = (
                need!(f.u32(0), slot),
                need!(f.u32(4), slot),
                need!(f.u32(8), slot),
            );
            let name = need!(names.next(), slot);
            h.create(
                r,
                ino,
                name,
                mode,
                umask,
                flags as i32,
                ReplyCreate(Via::Ring(slot)),
            )
        }
        abi::FALLOCATE => {
            let (fh_, offset, length, mode) = (
                need!(fh(&f, 0), slot),
                need!(f.u64(8), slot),
                need!(f.u64(16), slot),
                need!(f.u32(24), slot),
            );
            h.fallocate(
                r,
                ino,
                fh_,
                offset,
                length,
                mode as i32,
                ReplyEmpty(Via::Ring(slot)),
            )
        }
        abi::DESTROY => ReplyEmpty(Via::Ring(slot)).ok(),
        _ => ReplyEmpty(Via::Ring(slot)).error(Errno::ENOSYS),
    }
    Ok(())
}
