//! The request handlers' interface, independent of the transport: [`Handler`] has the
//! callbacks and argument types of `fuser::Filesystem`, with fern-fuse's [`Request`] and reply
//! types (`reply.rs`), so one implementation serves both the `/dev/fuse` loop (through
//! [`Classic`], which fuser's session runs) and the io_uring queues (`uring::dispatch`).
//! Owns that interface and the bridge from fuser; it must not hold file-system logic.
//!
//! Why not `fuser::Filesystem` itself: fuser's request and reply types can only be made by
//! fuser's own loop, which reads `/dev/fuse`; a request taken from a ring could not be
//! handed to it (docs/fuse.md, "Transports").
#![allow(clippy::too_many_arguments)]

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, FopenFlags, INodeNo, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};

use crate::reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use crate::uring::{Transport, TransportStatus};

/// Who asked: the caller's ids, as the kernel passes them in every request header.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Request {
    pub(crate) fn new(uid: u32, gid: u32, pid: u32) -> Request {
        Request { uid, gid, pid }
    }

    /// The caller's (filesystem) user id.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The caller's (filesystem) group id.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The caller's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl From<&fuser::Request> for Request {
    fn from(r: &fuser::Request) -> Self {
        Request::new(r.uid(), r.gid(), r.pid())
    }
}

/// Declares the [`Handler`] trait and [`Classic`]'s `fuser::Filesystem` implementation from
/// one list of operations, so the two can never disagree: each operation is a `Handler`
/// method with `fuser::Filesystem`'s arguments (fern-fuse's `Request` and reply types) and a
/// default answer, and `Classic` forwards fuser's call of the same name to it unchanged.
macro_rules! handler_ops {
    ($(fn $name:ident($($arg:ident: $ty:ty),*; $r:ident: $reply:ident) $default:block)*) => {
        /// The FUSE callbacks a file system implements; each must answer its reply exactly
        /// once. Unimplemented callbacks answer as fuser's defaults do (mostly ENOSYS, which
        /// the kernel remembers for the life of the mount). Each method is the FUSE operation
        /// of its name, with `fuser::Filesystem`'s arguments.
        #[allow(unused_variables, missing_docs)]
        pub trait Handler: Send + Sync + 'static {
            /// The INIT handshake: choose capabilities and limits.
            fn init(&mut self, req: &Request, config: &mut KernelConfig) -> io::Result<()> {
                Ok(())
            }
            /// Called once before the session starts: how to send the kernel notifications.
            fn set_notifier(&mut self, notifier: crate::Notifier) {}
            /// The session ends (after unmount).
            fn destroy(&self) {}
            fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {}
            $(fn $name(&self, req: &Request, $($arg: $ty,)* $r: $reply<'_>) $default)*
        }

        impl<H: Handler> fuser::Filesystem for Classic<H> {
            fn init(&mut self, req: &fuser::Request, config: &mut KernelConfig) -> io::Result<()> {
                let Some(h) = Arc::get_mut(&mut self.h) else {
                    return Err(io::Error::other("handler shared before INIT"));
                };
                h.init(&req.into(), config)?;
                self.status.negotiate(config);
                let _ = self.published.set(self.h.clone());
                Ok(())
            }
            fn destroy(&mut self) {
                self.h.destroy()
            }
            fn forget(&self, req: &fuser::Request, ino: INodeNo, nlookup: u64) {
                self.gather_forgets(u64::from(req.unique()));
                self.h.forget(&req.into(), ino, nlookup)
            }
            $(fn $name(&self, req: &fuser::Request, $($arg: $ty,)* $r: fuser::$reply) {
                self.h.$name(&req.into(), $($arg,)* $r.into())
            })*
        }
    };
}

// One line per operation: its arguments after the request, its reply, its default answer.
#[rustfmt::skip]
handler_ops! {
    fn lookup(parent: INodeNo, name: &OsStr; reply: ReplyEntry) { reply.error(Errno::ENOSYS) }
    fn getattr(ino: INodeNo, fh: Option<FileHandle>; reply: ReplyAttr) { reply.error(Errno::ENOSYS) }
    fn setattr(ino: INodeNo, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>,
        size: Option<u64>, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>, fh: Option<FileHandle>, crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>, bkuptime: Option<SystemTime>, flags: Option<BsdFileFlags>;
        reply: ReplyAttr) { reply.error(Errno::ENOSYS) }
    fn readlink(ino: INodeNo; reply: ReplyData) { reply.error(Errno::ENOSYS) }
    fn mknod(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32; reply: ReplyEntry) { reply.error(Errno::ENOSYS) }
    fn mkdir(parent: INodeNo, name: &OsStr, mode: u32, umask: u32; reply: ReplyEntry) { reply.error(Errno::ENOSYS) }
    fn unlink(parent: INodeNo, name: &OsStr; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn rmdir(parent: INodeNo, name: &OsStr; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn symlink(parent: INodeNo, link_name: &OsStr, target: &Path; reply: ReplyEntry) { reply.error(Errno::EPERM) }
    fn rename(parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn link(ino: INodeNo, newparent: INodeNo, newname: &OsStr; reply: ReplyEntry) { reply.error(Errno::EPERM) }
    fn open(ino: INodeNo, flags: OpenFlags; reply: ReplyOpen) { reply.opened(FileHandle(0), FopenFlags::empty()) }
    fn read(ino: INodeNo, fh: FileHandle, offset: u64, size: u32, flags: OpenFlags, lock_owner: Option<LockOwner>; reply: ReplyData) { reply.error(Errno::ENOSYS) }
    fn write(ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8], write_flags: WriteFlags, flags: OpenFlags, lock_owner: Option<LockOwner>; reply: ReplyWrite) { reply.error(Errno::ENOSYS) }
    fn flush(ino: INodeNo, fh: FileHandle, lock_owner: LockOwner; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn release(ino: INodeNo, fh: FileHandle, flags: OpenFlags, lock_owner: Option<LockOwner>, flush: bool; reply: ReplyEmpty) { reply.ok() }
    fn fsync(ino: INodeNo, fh: FileHandle, datasync: bool; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn opendir(ino: INodeNo, flags: OpenFlags; reply: ReplyOpen) { reply.opened(FileHandle(0), FopenFlags::empty()) }
    fn readdir(ino: INodeNo, fh: FileHandle, offset: u64; reply: ReplyDirectory) { reply.error(Errno::ENOSYS) }
    fn readdirplus(ino: INodeNo, fh: FileHandle, offset: u64; reply: ReplyDirectoryPlus) { reply.error(Errno::ENOSYS) }
    fn releasedir(ino: INodeNo, fh: FileHandle, flags: OpenFlags; reply: ReplyEmpty) { reply.ok() }
    fn fsyncdir(ino: INodeNo, fh: FileHandle, datasync: bool; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn statfs(ino: INodeNo; reply: ReplyStatfs) { reply.statfs(0, 0, 0, 0, 0, 512, 255, 0) }
    fn setxattr(ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, position: u32; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn getxattr(ino: INodeNo, name: &OsStr, size: u32; reply: ReplyXattr) { reply.error(Errno::ENOSYS) }
    fn listxattr(ino: INodeNo, size: u32; reply: ReplyXattr) { reply.error(Errno::ENOSYS) }
    fn removexattr(ino: INodeNo, name: &OsStr; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn access(ino: INodeNo, mask: AccessFlags; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
    fn create(parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32; reply: ReplyCreate) { reply.error(Errno::ENOSYS) }
    fn fallocate(ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32; reply: ReplyEmpty) { reply.error(Errno::ENOSYS) }
}

/// A [`Handler`] as fuser's session runs it (the `/dev/fuse` transport). It also negotiates
/// the io_uring transport in INIT when the mount asked for it (`TransportStatus`), and hands
/// the initialized handler to the ring queues (`published`).
pub struct Classic<H: Handler> {
    h: Arc<H>,
    status: Arc<TransportStatus>,
    published: Arc<OnceLock<Arc<H>>>,
    /// The request id of the last forget handled ([`Classic::gather_forgets`]).
    last_forget: AtomicU64,
}

impl<H: Handler> Classic<H> {
    /// Wraps `h`; `status` says which transport was asked for and records what happened.
    pub fn new(h: H, status: Arc<TransportStatus>) -> (Self, Arc<OnceLock<Arc<H>>>) {
        let published = Arc::new(OnceLock::new());
        let c = Classic {
            h: Arc::new(h),
            status,
            published: published.clone(),
            last_forget: AtomicU64::new(0),
        };
        (c, published)
    }

    /// Lets forgets gather, when the rings carry every other request. With io_uring the
    /// kernel still queues FORGET and INTERRUPT on `/dev/fuse`; read as soon as each arrived,
    /// an `rm -r` of 20,000 files woke a `/dev/fuse` loop 20,000 times (on a pinned CPU, a
    /// context switch each beside the ring thread's). So the first forget of each request
    /// (`unique`: a BATCH_FORGET reaches `forget` once per inode, all with its id) pauses
    /// before it is handled: meanwhile the next ones queue, and the loop's next read takes
    /// them as one BATCH_FORGET. Nothing waits on a forget; an interrupt read by this loop
    /// after one is late by at most the pause.
    fn gather_forgets(&self, unique: u64) {
        if self.last_forget.swap(unique, Ordering::Relaxed) != unique
            && self.status.active() == Transport::Uring
        {
            std::thread::sleep(FORGET_PAUSE);
        }
    }
}

/// How long a `/dev/fuse` loop pauses before a forget request when the rings are active
/// ([`Classic::gather_forgets`]).
const FORGET_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);
