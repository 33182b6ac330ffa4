//! The FUSE request handlers: [`FernFuse`] implements the transport-neutral
//! [`Handler`] over a shared [`fern_fs::Fs`]. Each callback is one call into fern-fs and one `match` onto the reply;
//! failures become errnos only through `FsError::errno` (see `convert::errno`). It owns the
//! kernel-facing choices (capabilities, TTLs, open flags) and must never implement file-system
//! semantics itself: anything more than translating arguments belongs in fern-fs.
//!
//! Kernel semantics relied on:
//! * **Lookup counts.** Every reply that carries an entry (lookup, create, mknod, mkdir,
//!   symlink, link, and each non-`.`/`..` entry of readdirplus) makes the kernel count one
//!   lookup of that inode; fern-fs pins the inode in those same calls, and `forget` /
//!   `batch_forget` drop the count. An inode the kernel still knows (or that is open) therefore
//!   always resolves, even after its last name is gone (then it is an orphan, freed at the
//!   last release). Entries that fern-fs pinned but that did not fit into a readdirplus reply
//!   are forgotten at once, so counts stay exact.
//! * **TTLs.** Entries and attributes are cached for `entry_ttl` and `attr_ttl` (1 h each
//!   by default on a local store). The kernel invalidates what its own requests change and
//!   this mount is the only writer of its store, so names never change behind it; the one
//!   attribute change it cannot see — set-id bits cleared by an unprivileged write or
//!   fallocate (KILLPRIV_V2) — is followed by an attribute invalidation (`Notifier`). A missing name is answered as a negative entry
//!   (inode 0) cached for `negative_ttl` (1 h; 0, i.e. plain ENOENT, on shared stores).
//! * **ENOSYS is permanent.** Callbacks left unimplemented (`lseek`, `copy_file_range`,
//!   `getlk`/`setlk`, `ioctl`, `poll`, `bmap`) answer ENOSYS once and the kernel then uses its
//!   generic fallbacks for the life of the mount: SEEK_DATA/SEEK_HOLE treat the whole file as
//!   data, copies go through read/write, and POSIX/flock locks are kept by the kernel, local
//!   to this mount (correct, as there is one mount per store).
//! * **Generation 0.** Inode numbers are never reused while a store lives, so the generation
//!   never needs to distinguish incarnations.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fern_fs::perm::Cred;
use fern_fs::{Attr, Fh, Fs, FsError, FsResult, InodeId, SetAttr};
use fuser::{
    AccessFlags, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};

use crate::convert::{dot_attr, errno, file_attr, kind, open_flags, time_set, timespec};
use crate::handler::{Handler, Request};
use crate::killpriv::{self, KillPriv};
use crate::options::{MountOptions, StatsSource, STATS_XATTR};
use crate::reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};

/// Generation of every inode (ids are never reused).
const GEN: Generation = Generation(0);

/// The FUSE file system of one mount.
pub struct FernFuse {
    fs: Arc<Fs>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    negative_ttl: Duration,
    writeback: bool,
    /// FOPEN flags of every open and create reply ([`OPEN_FLAGS`] unless `keep_cache` is off).
    open_flags: FopenFlags,
    max_write: u32,
    stats: StatsSource,
    killpriv: KillPriv,
    /// Ask for FUSE_POSIX_ACL (only with `default_permissions`: the kernel then enforces ACLs).
    posix_acl: bool,
    /// Invalidates the kernel's cached attributes where we change them behind its back.
    notifier: crate::Notifier,
    /// Asks the kernel to forget inodes while fern-fs's inode table is past its bound
    /// (started with the notifier when the table has a bound).
    releaser: Option<crate::release::Releaser>,
    /// Writes what fern-fs keeps to write lazily (shared stores' access times).
    _ticker: Option<crate::ticker::Ticker>,
}

impl FernFuse {
    /// An adapter serving `fs` with the kernel-facing choices of `opts`.
    pub fn new(fs: Arc<Fs>, opts: &MountOptions) -> Self {
        // atime is the file system's business under FUSE; the mount options say how.
        fs.set_atime_policy(opts.atime);
        // The kernel keeps entries and attributes this long anyway: lookups on a shared store
        // may answer from rows read ahead that recently (fern-fs lookahead.rs).
        fs.set_lookup_ahead(opts.entry_ttl.min(opts.attr_ttl));
        Self {
            _ticker: crate::ticker::Ticker::start(&fs),
            fs,
            entry_ttl: opts.entry_ttl,
            attr_ttl: opts.attr_ttl,
            negative_ttl: opts.negative_ttl,
            writeback: opts.writeback_cache,
            open_flags: if opts.keep_cache {
                OPEN_FLAGS
            } else {
                OPEN_FLAGS.difference(FopenFlags::FOPEN_KEEP_CACHE)
            },
            max_write: opts.max_write,
            stats: opts.stats.clone(),
            killpriv: KillPriv::default(),
            posix_acl: opts.default_permissions,
            notifier: crate::Notifier::default(),
            releaser: None,
        }
    }

    /// After a reply that handed the kernel an inode: if the inode table is now past its
    /// bound, wake the thread that asks the kernel to forget some (one atomic load otherwise).
    fn keep_table_bounded(&self) {
        if let Some(r) = &self.releaser {
            if self.fs.inodes_over_bound() {
                r.wake();
            }
        }
    }
}

fn ino(i: INodeNo) -> InodeId {
    InodeId(i.0)
}

fn fh(f: FileHandle) -> Fh {
    Fh(f.0)
}

fn cred(req: &Request) -> Cred {
    // FUSE passes the caller's fsuid/fsgid but not its supplementary groups; with
    // default_permissions the kernel has already done every check that needs them.
    Cred::user(req.uid(), req.gid())
}

/// The caller of a create-type request with its umask: fern-fs applies it unless the parent
/// directory has a default ACL (the kernel sends it unapplied under FUSE_DONT_MASK).
fn creator(req: &Request, umask: u32) -> Cred {
    Cred { umask, ..cred(req) }
}

fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

/// Open flags of every file handle:
/// * KEEP_CACHE: page cache kept across opens (a local store has this mount as its only
///   writer, and every write goes through this kernel, so the cache is never stale); left
///   out when `MountOptions::keep_cache` is off (a shared store: close-to-open);
/// * NOFLUSH: no FLUSH request at close(2) — FLUSH has nothing to do here (fern-fs buffers
///   nothing per handle, and locks are the kernel's), so this saves a round trip per close.
///   Under the writeback cache the kernel ignores NOFLUSH (it writes the dirty pages at
///   close, then sends FLUSH); `Handler::flush` is left unimplemented, and the ENOSYS of the
///   first FLUSH stops the kernel sending any more for the life of the mount.
pub const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// The capabilities asked for in INIT, each only if the kernel offers it (see `init`);
/// null-fuse asks for the same ([`negotiate`]), which adds POSIX_ACL + DONT_MASK (with
/// `default_permissions`) and WRITEBACK_CACHE (when asked for) per mount.
pub const INIT_FLAGS: InitFlags = InitFlags::FUSE_PARALLEL_DIROPS
    .union(InitFlags::FUSE_DO_READDIRPLUS)
    .union(InitFlags::FUSE_READDIRPLUS_AUTO)
    .union(InitFlags::FUSE_CACHE_SYMLINKS)
    .union(InitFlags::FUSE_HANDLE_KILLPRIV_V2);

/// Asks the kernel for [`INIT_FLAGS`], plus WRITEBACK_CACHE when `writeback` and
/// POSIX_ACL + DONT_MASK when `posix_acl`, each only if offered, and for `max_write` (or the
/// nearest the kernel takes). Returns whether the writeback cache is on. fernfs and the
/// benchmarks' null file system both negotiate through here, so the kernel treats them alike.
pub fn negotiate(
    config: &mut KernelConfig,
    writeback: bool,
    posix_acl: bool,
    max_write: u32,
) -> bool {
    let mut wanted = INIT_FLAGS;
    if writeback {
        wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    if posix_acl {
        wanted |= InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
    }
    let _ = config.add_capabilities(wanted & config.capabilities());
    if let Err(nearest) = config.set_max_write(max_write) {
        let _ = config.set_max_write(nearest);
    }
    writeback
        && config
            .capabilities()
            .contains(InitFlags::FUSE_WRITEBACK_CACHE)
}

impl FernFuse {
    /// Answers with the entry fern-fs returned (pinned there: one kernel lookup).
    fn entry(&self, reply: ReplyEntry<'_>, r: FsResult<Attr>) {
        match r {
            Ok(a) => reply.entry(&self.entry_ttl, &file_attr(&a), GEN),
            Err(e) => reply.error(errno(&e)),
        }
        self.keep_table_bounded();
    }

    /// Answers with the attributes fern-fs returned.
    fn attr(&self, reply: ReplyAttr<'_>, r: FsResult<Attr>) {
        match r {
            Ok(a) => reply.attr(&self.attr_ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// Answers an operation that returns nothing but success or its error.
fn done(reply: ReplyEmpty<'_>, r: FsResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answers with the bytes fern-fs returned.
fn data(reply: ReplyData<'_>, r: FsResult<Vec<u8>>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(errno(&e)),
    }
}

impl Handler for FernFuse {
    /// Capabilities, each requested only if the kernel offers it:
    /// * PARALLEL_DIROPS: lookups and readdirs in one directory run concurrently (fern-fs
    ///   serializes on its own stripe locks where it must).
    /// * DO_READDIRPLUS + READDIRPLUS_AUTO: a listing returns attributes too, saving one lookup
    ///   per entry for `ls -l`-style scans; the kernel switches it off for plain listings.
    /// * Not ATOMIC_O_TRUNC: with it the kernel forwards O_TRUNC in OPEN and we truncate at
    ///   once, but for open(O_RDONLY|O_TRUNC) it checks for a running executable (ETXTBSY)
    ///   only *after* our reply: the executable was already truncated, its process died of
    ///   SIGBUS, and open then succeeded or failed at random (pjdfstest's `open::etxtbsy`
    ///   flake). Without it the kernel checks first and truncates with a SETATTR: one more
    ///   request for opening an existing file with O_TRUNC.
    /// * CACHE_SYMLINKS: symlink targets never change, so the kernel may cache them.
    /// * HANDLE_KILLPRIV_V2: we drop set-id bits and file capabilities on write, truncate and
    ///   chown (`killpriv`). The kernel then sets SB_NOSEC, so once it has seen that a file
    ///   has neither set-id bits nor capabilities (S_NOSEC), its writes no longer ask us for
    ///   `security.capability` first (one round trip per write saved).
    /// * POSIX_ACL + DONT_MASK, with `default_permissions` (the default): the kernel enforces
    ///   the ACLs it reads from `system.posix_acl_access` (cached per inode, dropped when we
    ///   are sent a setattr or an ACL change) and leaves the umask to us, since it must not
    ///   apply under a directory with a default ACL (fern-fs's `acl::inherit`). fern-fs keeps
    ///   mode and ACL in step, as the kernel expects of a FUSE file system with this flag.
    ///   The kernel turns default_permissions on with it, so with `nodefault_permissions` it
    ///   is not requested and `access` checks ACLs here.
    /// * WRITEBACK_CACHE only with `-o writeback_cache` (see `MountOptions` for why not by
    ///   default).
    /// * max_write 1 MiB (with MAX_PAGES, which fuser requests when offered).
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // If the kernel refuses the writeback cache, O_APPEND is fern-fs's to honour again.
        self.writeback = negotiate(config, self.writeback, self.posix_acl, self.max_write);
        Ok(())
    }

    fn set_notifier(&mut self, notifier: crate::Notifier) {
        if self.fs.inode_table_figures().max_bytes > 0 {
            let fs = Arc::downgrade(&self.fs);
            match crate::release::Releaser::start(fs, notifier.clone()) {
                Ok(r) => self.releaser = Some(r),
                Err(e) => log::error!("cannot start the inode release thread: {e}"),
            }
        }
        self.notifier = notifier;
    }

    /// Unmount: make everything acknowledged durable before the session ends.
    fn destroy(&self) {
        if let Err(e) = self.fs.syncfs() {
            log::error!("sync at unmount failed: {e}");
        }
    }

    /// A missing name is cached by the kernel for `negative_ttl` (this mount being the only
    /// writer of its store; 0 on shared stores: plain ENOENT).
    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry<'_>) {
        match self.fs.lookup(ino(parent), name(n)) {
            Ok(a) => reply.entry(&self.entry_ttl, &file_attr(&a), GEN),
            Err(FsError::NotFound) if !self.negative_ttl.is_zero() => {
                reply.negative(&self.negative_ttl)
            }
            Err(e) => reply.error(errno(&e)),
        }
        self.keep_table_bounded();
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.fs.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr<'_>) {
        self.attr(reply, self.fs.getattr(ino(i)))
    }

    /// A truncate by a non-root caller and every chown of a non-directory also drop set-id
    /// bits (fern-fs, blindly) and file capabilities (`killpriv`), as KILLPRIV_V2 asks.
    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr<'_>,
    ) {
        let sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(timespec),
        };
        let chown = uid.is_some() || gid.is_some();
        let kills = chown || (size.is_some() && req.uid() != 0);
        let r = self.fs.setattr_as(&cred(req), ino(i), &sa);
        if matches!(&r, Ok(a) if kills && a.kind != fern_fs::FileType::Directory) {
            killpriv::drop_caps(&self.fs, ino(i));
        }
        self.attr(reply, r)
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData<'_>) {
        data(reply, self.fs.readlink(ino(i)))
    }

    /// `mode` arrives without the umask under FUSE_DONT_MASK; fern-fs applies `umask` unless
    /// the directory has a default ACL (applying it twice, when the kernel did, is harmless).
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry<'_>,
    ) {
        let who = creator(req, umask);
        self.entry(
            reply,
            self.fs
                .mknod(&who, ino(parent), name(n), mode, u64::from(rdev)),
        )
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry<'_>,
    ) {
        self.entry(
            reply,
            self.fs
                .mkdir(&creator(req, umask), ino(parent), name(n), mode & 0o7777),
        )
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty<'_>) {
        done(reply, self.fs.unlink(ino(parent), name(n)))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty<'_>) {
        done(reply, self.fs.rmdir(ino(parent), name(n)))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry<'_>,
    ) {
        let target = target.as_os_str().as_bytes();
        self.entry(
            reply,
            self.fs
                .symlink(&cred(req), ino(parent), name(link_name), target),
        )
    }

    /// RENAME_WHITEOUT (overlayfs) is passed on by the kernel (which has checked CAP_MKNOD)
    /// and done by fern-fs, the whiteout owned by the caller.
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty<'_>,
    ) {
        done(
            reply,
            self.fs.rename_as(
                &cred(req),
                ino(parent),
                name(n),
                ino(newparent),
                name(newname),
                flags.bits(),
            ),
        )
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry<'_>,
    ) {
        self.entry(reply, self.fs.link(ino(i), ino(newparent), name(newname)))
    }

    /// Opened on behalf of the caller: writes and O_TRUNC through a handle a non-root caller
    /// opened clear set-id bits inside fern-fs's blind stat upsert (KILLPRIV_V2).
    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen<'_>) {
        let of = open_flags(flags.0, self.writeback);
        match self.fs.open_as(&cred(req), ino(i), of) {
            Ok(h) => {
                if of.truncate && of.write && req.uid() != 0 {
                    killpriv::drop_caps(&self.fs, ino(i));
                }
                reply.opened(FileHandle(h.0), self.open_flags)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData<'_>,
    ) {
        // Straight into the ring entry's payload buffer; over /dev/fuse into one buffer per
        // request thread, reused: a fresh one per request would be a fresh mapping to fault in
        // and zero (fern-fs `read_into`).
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUF.with_borrow_mut(|spare| {
            reply.fill(size as usize, spare, |out| {
                self.fs
                    .read_to(ino(i), offset, size, out)
                    .map_err(|e| errno(&e))
            })
        })
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        f: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite<'_>,
    ) {
        // max_write (<= 16 MiB) bounds `data`, so the count fits in u32.
        match self.fs.write(fh(f), offset, data) {
            Ok(n) => {
                if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                    self.killpriv.after_write(&self.fs, ino(i), fh(f));
                    // The kernel flags a write only when its cached mode has set-id bits,
                    // and after the write it refreshes size and times but not the mode:
                    // until the attributes expire it would still honour the set-user-id
                    // bit just cleared (execve). Drop its copy.
                    self.notifier.inval_attrs(i.0);
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        f: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty<'_>,
    ) {
        self.killpriv.forget(fh(f));
        match self.fs.release(fh(f)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty<'_>,
    ) {
        done(reply, self.fs.fsync(ino(i), datasync))
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen<'_>) {
        match self.fs.opendir(ino(i)) {
            Ok(h) => reply.opened(FileHandle(h.0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Offsets 1 and 2 are `.` and `..`; fern-fs's handle offsets follow, shifted by 2. The
    /// reply is filled until the kernel's buffer is full (one scan serves many requests; see
    /// `Fs::readdir_fill`).
    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        f: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory<'_>,
    ) {
        let parent = || self.fs.parent_of(ino(i)).map(|p| INodeNo(p.0));
        match reply.add_dots(offset, i, || parent().map_err(|e| errno(&e))) {
            Ok(false) => {}
            full_or_failed => return reply.end(full_or_failed),
        }
        let filled = self
            .fs
            .readdir_fill(fh(f), offset.saturating_sub(2), false, |off, e| {
                let n = OsStr::from_bytes(&e.name);
                reply.add(INodeNo(e.ino.0), off + 2, kind(e.kind), n)
            });
        reply.end(filled.map_err(|e| errno(&e)))
    }

    /// As `readdir`, with attributes, filled until the kernel's buffer is full. The kernel
    /// counts a lookup for every entry it accepts except `.` and `..`; fern-fs pins exactly
    /// the entries `add` took (the one that did not fit is unpinned there).
    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        f: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus<'_>,
    ) {
        let dir = ino(i);
        // The kernel takes only the inode numbers of `.` and `..` from a readdirplus reply
        // (fs/fuse/readdir.c `fuse_direntplus_link` returns before it looks at their
        // attributes), so those are not read: on a shared store that was two stat reads,
        // round trips, per listing.
        let dot = |off| {
            let target = if off == 1 {
                Ok(dir)
            } else {
                self.fs.listed_parent_of(dir)
            };
            target.map(dot_attr).map_err(|e| errno(&e))
        };
        match reply.add_dots(offset, &self.entry_ttl, dot) {
            Ok(false) => {}
            full_or_failed => return reply.end(full_or_failed),
        }
        let filled = self
            .fs
            .readdir_fill(fh(f), offset.saturating_sub(2), true, |off, e| {
                let Some(a) = &e.attr else {
                    // fern-fs attaches attributes to every plus entry; should one lack them,
                    // it is skipped and its pin dropped, so lookup counts stay exact.
                    self.fs.forget(e.ino, 1);
                    return false;
                };
                let n = OsStr::from_bytes(&e.name);
                let fa = file_attr(a);
                reply.add(INodeNo(e.ino.0), off + 2, n, &self.entry_ttl, &fa, GEN)
            });
        reply.end(filled.map_err(|e| errno(&e)));
        self.keep_table_bounded();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        f: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty<'_>,
    ) {
        done(reply, self.fs.releasedir(fh(f)))
    }

    /// The whole store is made durable by either (one ordered log), as for `fsync`.
    fn fsyncdir(
        &self,
        req: &Request,
        i: INodeNo,
        f: FileHandle,
        datasync: bool,
        reply: ReplyEmpty<'_>,
    ) {
        self.fsync(req, i, f, datasync, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs<'_>) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty<'_>,
    ) {
        if is_stats_xattr(i, n) {
            return reply.error(libc_eperm());
        }
        done(
            reply,
            self.fs.setxattr(ino(i), name(n), value, flags as u32),
        )
    }

    /// `size == 0` asks for the length only; a value longer than `size` is ERANGE. The root's
    /// virtual `fernfs.stats` is answered here, from the daemon's engine (see docs/fuse.md);
    /// it is computed afresh for each request, so a reader asks with a large buffer at once
    /// rather than size-then-value (the two answers could differ in length).
    fn getxattr(&self, _req: &Request, i: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr<'_>) {
        if is_stats_xattr(i, n) {
            return match self.stats.get() {
                Some(v) => xattr_reply(reply, &v, size),
                None => reply.error(errno(&FsError::NoData)),
            };
        }
        match self.fs.getxattr(ino(i), name(n)) {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr<'_>) {
        match self.fs.listxattr(ino(i)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                xattr_reply(reply, &buf, size)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, n: &OsStr, reply: ReplyEmpty<'_>) {
        if is_stats_xattr(i, n) {
            return reply.error(libc_eperm());
        }
        match self.fs.removexattr(ino(i), name(n)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Only sent without default_permissions (access(2), and execve's checks): mode and ACL.
    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty<'_>) {
        done(
            reply,
            self.fs.access(&cred(req), ino(i), mask.bits() as u32 & 7),
        )
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate<'_>,
    ) {
        let of = open_flags(flags, self.writeback);
        let who = creator(req, umask);
        match self
            .fs
            .create(&who, ino(parent), name(n), mode & 0o7777, of)
        {
            Ok((a, h)) => reply.created(
                &self.entry_ttl,
                &file_attr(&a),
                GEN,
                FileHandle(h.0),
                self.open_flags,
            ),
            Err(e) => reply.error(errno(&e)),
        }
        self.keep_table_bounded();
    }

    /// Changing a file's contents or size by a non-root caller drops its privileges (the
    /// kernel leaves that to us under KILLPRIV_V2); pure preallocation changes neither.
    fn fallocate(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty<'_>,
    ) {
        match self.fs.fallocate(ino(i), mode as u32, offset, length) {
            Ok(()) => {
                if req.uid() != 0 && mode as u32 != fern_fs::FALLOC_FL_KEEP_SIZE {
                    killpriv::drop_privs(&self.fs, ino(i));
                    // As for a killing write: the kernel refreshes size and times only.
                    self.notifier.inval_attrs(i.0);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn is_stats_xattr(i: INodeNo, n: &OsStr) -> bool {
    ino(i) == InodeId::ROOT && name(n) == STATS_XATTR
}

/// The virtual stats xattr is read-only.
fn libc_eperm() -> fuser::Errno {
    errno(&FsError::Perm)
}

fn xattr_reply(reply: ReplyXattr<'_>, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(errno(&FsError::Range));
    } else {
        reply.data(v);
    }
}
