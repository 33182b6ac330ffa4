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
use crate::uring::TransportStatus;

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

/// The FUSE callbacks a file system implements; each must answer its reply exactly once.
/// Unimplemented callbacks answer as fuser's defaults do (mostly ENOSYS, which the kernel
/// remembers for the life of the mount). Each method is the FUSE operation of its name, with
/// `fuser::Filesystem`'s arguments.
#[allow(unused_variables, missing_docs)]
pub trait Handler: Send + Sync + 'static {
    /// The INIT handshake: choose capabilities and limits.
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        Ok(())
    }
    /// The session ends (after unmount).
    fn destroy(&self) {}
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {}
    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<BsdFileFlags>,
        reply: ReplyAttr<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry<'_>,
    ) {
        reply.error(Errno::EPERM)
    }
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry<'_>,
    ) {
        reply.error(Errno::EPERM)
    }
    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen<'_>) {
        reply.opened(FileHandle(0), FopenFlags::empty())
    }
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok()
    }
    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen<'_>) {
        reply.opened(FileHandle(0), FopenFlags::empty())
    }
    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok()
    }
    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs<'_>) {
        reply.statfs(0, 0, 0, 0, 0, 512, 255, 0)
    }
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn getxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty<'_>) {
        reply.error(Errno::ENOSYS)
    }
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty<'_>,
    ) {
        reply.error(Errno::ENOSYS)
    }
}

/// A [`Handler`] as fuser's session runs it (the `/dev/fuse` transport). It also negotiates
/// the io_uring transport in INIT when the mount asked for it (`TransportStatus`), and hands
/// the initialized handler to the ring queues (`published`).
pub struct Classic<H: Handler> {
    h: Arc<H>,
    status: Arc<TransportStatus>,
    published: Arc<OnceLock<Arc<H>>>,
}

impl<H: Handler> Classic<H> {
    /// Wraps `h`; `status` says which transport was asked for and records what happened.
    pub fn new(h: H, status: Arc<TransportStatus>) -> (Self, Arc<OnceLock<Arc<H>>>) {
        let published = Arc::new(OnceLock::new());
        let c = Classic {
            h: Arc::new(h),
            status,
            published: published.clone(),
        };
        (c, published)
    }
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
    fn lookup(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEntry,
    ) {
        self.h.lookup(&req.into(), parent, name, reply.into())
    }
    fn forget(&self, req: &fuser::Request, ino: INodeNo, nlookup: u64) {
        self.h.forget(&req.into(), ino, nlookup)
    }
    fn getattr(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: Option<FileHandle>,
        reply: fuser::ReplyAttr,
    ) {
        self.h.getattr(&req.into(), ino, fh, reply.into())
    }
    fn setattr(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<BsdFileFlags>,
        reply: fuser::ReplyAttr,
    ) {
        self.h.setattr(
            &req.into(),
            ino,
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            fh,
            crtime,
            chgtime,
            bkuptime,
            flags,
            reply.into(),
        )
    }
    fn readlink(&self, req: &fuser::Request, ino: INodeNo, reply: fuser::ReplyData) {
        self.h.readlink(&req.into(), ino, reply.into())
    }
    fn mknod(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: fuser::ReplyEntry,
    ) {
        self.h
            .mknod(&req.into(), parent, name, mode, umask, rdev, reply.into())
    }
    fn mkdir(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: fuser::ReplyEntry,
    ) {
        self.h
            .mkdir(&req.into(), parent, name, mode, umask, reply.into())
    }
    fn unlink(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.unlink(&req.into(), parent, name, reply.into())
    }
    fn rmdir(&self, req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: fuser::ReplyEmpty) {
        self.h.rmdir(&req.into(), parent, name, reply.into())
    }
    fn symlink(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: fuser::ReplyEntry,
    ) {
        self.h
            .symlink(&req.into(), parent, link_name, target, reply.into())
    }
    fn rename(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.rename(
            &req.into(),
            parent,
            name,
            newparent,
            newname,
            flags,
            reply.into(),
        )
    }
    fn link(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: fuser::ReplyEntry,
    ) {
        self.h
            .link(&req.into(), ino, newparent, newname, reply.into())
    }
    fn open(&self, req: &fuser::Request, ino: INodeNo, flags: OpenFlags, reply: fuser::ReplyOpen) {
        self.h.open(&req.into(), ino, flags, reply.into())
    }
    fn read(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: fuser::ReplyData,
    ) {
        self.h.read(
            &req.into(),
            ino,
            fh,
            offset,
            size,
            flags,
            lock_owner,
            reply.into(),
        )
    }
    fn write(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        self.h.write(
            &req.into(),
            ino,
            fh,
            offset,
            data,
            write_flags,
            flags,
            lock_owner,
            reply.into(),
        )
    }
    fn flush(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.flush(&req.into(), ino, fh, lock_owner, reply.into())
    }
    fn release(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.h
            .release(&req.into(), ino, fh, flags, lock_owner, flush, reply.into())
    }
    fn fsync(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.fsync(&req.into(), ino, fh, datasync, reply.into())
    }
    fn opendir(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        flags: OpenFlags,
        reply: fuser::ReplyOpen,
    ) {
        self.h.opendir(&req.into(), ino, flags, reply.into())
    }
    fn readdir(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: fuser::ReplyDirectory,
    ) {
        self.h.readdir(&req.into(), ino, fh, offset, reply.into())
    }
    fn readdirplus(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: fuser::ReplyDirectoryPlus,
    ) {
        self.h
            .readdirplus(&req.into(), ino, fh, offset, reply.into())
    }
    fn releasedir(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.releasedir(&req.into(), ino, fh, flags, reply.into())
    }
    fn fsyncdir(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.h
            .fsyncdir(&req.into(), ino, fh, datasync, reply.into())
    }
    fn statfs(&self, req: &fuser::Request, ino: INodeNo, reply: fuser::ReplyStatfs) {
        self.h.statfs(&req.into(), ino, reply.into())
    }
    fn setxattr(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: fuser::ReplyEmpty,
    ) {
        self.h
            .setxattr(&req.into(), ino, name, value, flags, position, reply.into())
    }
    fn getxattr(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        self.h.getxattr(&req.into(), ino, name, size, reply.into())
    }
    fn listxattr(&self, req: &fuser::Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        self.h.listxattr(&req.into(), ino, size, reply.into())
    }
    fn removexattr(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.removexattr(&req.into(), ino, name, reply.into())
    }
    fn access(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        mask: AccessFlags,
        reply: fuser::ReplyEmpty,
    ) {
        self.h.access(&req.into(), ino, mask, reply.into())
    }
    fn create(
        &self,
        req: &fuser::Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        self.h
            .create(&req.into(), parent, name, mode, umask, flags, reply.into())
    }
    fn fallocate(
        &self,
        req: &fuser::Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: fuser::ReplyEmpty,
    ) {
        self.h
            .fallocate(&req.into(), ino, fh, offset, length, mode, reply.into())
    }
}
