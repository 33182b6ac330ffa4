//! `null-fuse`: the FUSE-path limit of docs/workloads.md — a FUSE file system that answers every
//! request and stores no data, so whatever time a workload takes on it is the kernel's FUSE
//! path, the round trips and fuser, nothing else.
//!
//! What it keeps, and why: the namespace (names, inode numbers, kinds) and the attributes
//! (mode, size, times, owner) in one in-memory map. Without them it could not answer
//! correctly at all — `open(O_CREAT|O_EXCL)` and `mkdir` need a negative lookup for a new name
//! and a positive one afterwards, and the kernel revalidates cached entries after their TTL.
//! What it does not keep: file data (writes are acknowledged and dropped, reads return zeros
//! up to the file size), anything durable (fsync and fsyncdir answer at once), xattrs.
//!
//! Honesty: it is mounted with fern-fuse's own [`fern_fuse::MountOptions`] defaults (mount
//! options, request threads, cloned descriptors, entry/attr TTLs, max_write), asks for the same
//! init capabilities (parallel dirops, readdirplus auto, cached symlinks, HANDLE_KILLPRIV_V2,
//! the writeback cache when fern-fuse's defaults have it; not ATOMIC_O_TRUNC; not POSIX_ACL, as it keeps no ACLs), caches
//! missing names as negative entries, leaves FLUSH unimplemented and opens files with the
//! same flags (KEEP_CACHE, NOFLUSH) as the fernfs adapter, so the kernel caches and
//! round-trips exactly as much for it as for a fernfs mount. Both go through fern-fuse's own
//! code (`fern_fuse::negotiate`, `fern_fuse::OPEN_FLAGS`), so they cannot drift apart. It runs on either transport (`-o transport=` of fernfs; here the
//! `--transport` of `fernfs bench null-fuse`), through the same fern-fuse code as fernfs.
//! It is mounted the way fernfs is (fern-fuse's `KernelMount`: type `fuse.fernfs`, source
//! `null-fuse`), so it too unmounts only its own mount.
//!
//! The namespace itself (inodes, entries, the state file) is `null_fuse/state.rs`; this file is
//! the FUSE handlers and the mount.
//!
//! Between mounts (a benchmark's cold phase) the namespace is written to a state file at
//! unmount and read back at mount, outside every timed region: it plays the part of the disk.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fern_fuse::uring::{Mount, Transport};
use fern_fuse::{
    Handler, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::{BenchError, Result};

mod state;

use state::*;

/// fern-fuse's open flags, so the kernel caches exactly as for a fernfs mount.
const OPEN_FLAGS: FopenFlags = fern_fuse::OPEN_FLAGS;

/// The null FUSE file system of one mount.
pub struct NullFs {
    state: Arc<Mutex<State>>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    negative_ttl: Duration,
    writeback: bool,
    max_write: u32,
}

const GEN: Generation = Generation(0);

fn bytes(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

impl NullFs {
    /// A new file (or directory) `parent/n` owned by the caller.
    fn add(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        dir: bool,
        mode: u32,
    ) -> std::result::Result<FileAttr, Errno> {
        let node = Node::new(dir, (mode & 0o7777) as u16, parent.0, req.uid(), req.gid());
        self.state.lock().add(parent.0, bytes(n), node)
    }

    fn entry(&self, reply: ReplyEntry<'_>, r: std::result::Result<FileAttr, Errno>) {
        match r {
            Ok(a) => reply.entry(&self.entry_ttl, &a, GEN),
            Err(e) => reply.error(e),
        }
    }
}

impl Handler for NullFs {
    /// fern-fuse's capabilities and writeback choice (`fern_fuse::negotiate`; no POSIX ACLs,
    /// as it keeps none), each only if the kernel offers it. KILLPRIV_V2 matters for writes:
    /// without it the kernel asks for `security.capability` before every write.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        fern_fuse::negotiate(config, self.writeback, false, self.max_write);
        Ok(())
    }

    /// Missing names are cached as fernfs caches them (negative entries).
    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry<'_>) {
        let s = self.state.lock();
        match s.child(parent.0, bytes(n)).map(|i| s.attr(i)) {
            Ok(Some(a)) => reply.entry(&self.entry_ttl, &a, GEN),
            Ok(None) => reply.error(Errno::EIO),
            Err(e) if e == Errno::ENOENT && !self.negative_ttl.is_zero() => {
                reply.negative(&self.negative_ttl)
            }
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr<'_>) {
        match self.state.lock().attr(i.0) {
            Some(a) => reply.attr(&self.attr_ttl, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr<'_>,
    ) {
        let mut s = self.state.lock();
        let Some(n) = s.nodes.get_mut(&i.0) else {
            return reply.error(Errno::ENOENT);
        };
        let t = |x: TimeOrNow| match x {
            TimeOrNow::Now => now(),
            TimeOrNow::SpecificTime(t) => from_time(t),
        };
        if let Some(m) = mode {
            n.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = uid {
            n.uid = u;
        }
        if let Some(g) = gid {
            n.gid = g;
        }
        if let Some(sz) = size {
            n.size = sz;
        }
        if let Some(a) = atime {
            n.atime = t(a);
        }
        if let Some(m) = mtime {
            n.mtime = t(m);
        }
        n.ctime = now();
        match s.attr(i.0) {
            Some(a) => reply.attr(&self.attr_ttl, &a),
            None => reply.error(Errno::EIO),
        }
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData<'_>) {
        match self
            .state
            .lock()
            .nodes
            .get(&i.0)
            .and_then(|n| n.symlink.clone())
        {
            Some(t) => reply.data(&t),
            None => reply.error(Errno::EINVAL),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry<'_>,
    ) {
        self.entry(reply, self.add(req, parent, n, false, mode))
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry<'_>,
    ) {
        self.entry(reply, self.add(req, parent, n, true, mode))
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty<'_>) {
        match self.state.lock().remove(parent.0, bytes(n), false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty<'_>) {
        match self.state.lock().remove(parent.0, bytes(n), true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry<'_>,
    ) {
        let mut node = Node::new(false, 0o777, parent.0, req.uid(), req.gid());
        node.symlink = Some(target.as_os_str().as_bytes().to_vec());
        node.size = target.as_os_str().len() as u64;
        self.entry(
            reply,
            self.state.lock().add(parent.0, bytes(link_name), node),
        )
    }

    /// Moves the entry (replacing a file, or an empty directory, at the new name).
    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty<'_>,
    ) {
        let mut s = self.state.lock();
        let r = (|| {
            let ino = s.child(parent.0, bytes(n))?;
            let is_dir = s.nodes.get(&ino).map(|x| x.dir).unwrap_or(false);
            match s.child(newparent.0, bytes(newname)) {
                Ok(old) if old == ino => return Ok(()),
                Ok(old) => {
                    let old_dir = s.nodes.get(&old).map(|x| x.dir).unwrap_or(false);
                    s.remove(newparent.0, bytes(newname), old_dir)?;
                }
                Err(e) if e == Errno::ENOENT => {}
                Err(e) => return Err(e),
            }
            if !s.nodes.get(&newparent.0).map(|p| p.dir).unwrap_or(false) {
                return Err(Errno::ENOTDIR);
            }
            let t = now();
            if let Some(p) = s.nodes.get_mut(&parent.0) {
                p.children.remove(bytes(n));
                p.mtime = t;
                if is_dir {
                    p.nlink = p.nlink.saturating_sub(1);
                }
            }
            if let Some(p) = s.nodes.get_mut(&newparent.0) {
                p.children.insert(bytes(newname).to_vec(), ino);
                p.mtime = t;
                if is_dir {
                    p.nlink += 1;
                }
            }
            if let Some(x) = s.nodes.get_mut(&ino) {
                x.parent = newparent.0;
                x.ctime = t;
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        _i: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry<'_>,
    ) {
        // Hard links need a link count per name; no workload makes one.
        reply.error(Errno::EPERM);
    }

    /// Without ATOMIC_O_TRUNC the kernel truncates with a SETATTR of its own.
    fn open(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen<'_>) {
        match self.state.lock().nodes.get(&i.0) {
            Some(_) => reply.opened(FileHandle(0), OPEN_FLAGS),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Zeros up to the file size: no data is kept.
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
        let len = match self.state.lock().nodes.get(&i.0) {
            Some(n) => n.size.saturating_sub(offset).min(u64::from(size)) as usize,
            None => return reply.error(Errno::ENOENT),
        };
        reply.data(&vec![0u8; len]);
    }

    /// Acknowledged and dropped; only the size moves.
    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite<'_>,
    ) {
        let mut s = self.state.lock();
        match s.nodes.get_mut(&i.0) {
            Some(n) => {
                n.size = n.size.max(offset + data.len() as u64);
                n.mtime = now();
                // KILLPRIV_V2: a write drops set-id bits (the workloads never set any).
                n.perm &= !0o6000;
                reply.written(data.len() as u32)
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen<'_>) {
        match self.state.lock().nodes.get(&i.0) {
            Some(n) if n.dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Offsets as [`Node::entries_after`] numbers them.
    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory<'_>,
    ) {
        let s = self.state.lock();
        let Some(d) = s.nodes.get(&i.0) else {
            return reply.error(Errno::ENOENT);
        };
        match reply.add_dots(offset, i, || Ok(INodeNo(d.parent))) {
            Ok(false) => {}
            full_or_failed => return reply.end(full_or_failed),
        }
        // Until the kernel's buffer is full, as fern-fuse fills its replies (Fs::readdir_fill).
        for (off, ino, name) in d.entries_after(offset) {
            let kind = match s.nodes.get(&ino) {
                Some(n) if n.dir => FileType::Directory,
                Some(n) if n.symlink.is_some() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            if reply.add(INodeNo(ino), off, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus<'_>,
    ) {
        let s = self.state.lock();
        let Some(d) = s.nodes.get(&i.0) else {
            return reply.error(Errno::ENOENT);
        };
        let dot = |off| {
            s.attr(if off == 1 { i.0 } else { d.parent })
                .ok_or(Errno::EIO)
        };
        match reply.add_dots(offset, &self.entry_ttl, dot) {
            Ok(false) => {}
            full_or_failed => return reply.end(full_or_failed),
        }
        for (off, ino, name) in d.entries_after(offset) {
            let Some(a) = s.attr(ino) else { continue };
            if reply.add(INodeNo(ino), off, name, &self.entry_ttl, &a, GEN) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs<'_>) {
        let files = self.state.lock().nodes.len() as u64;
        reply.statfs(1 << 30, 1 << 30, 1 << 30, files, 1 << 30, 4096, 255, 4096);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty<'_>,
    ) {
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, _size: u32, reply: ReplyXattr<'_>) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _i: INodeNo, size: u32, reply: ReplyXattr<'_>) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn removexattr(&self, _req: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty<'_>) {
        reply.error(Errno::NO_XATTR);
    }

    fn access(&self, _req: &Request, _i: INodeNo, _mask: AccessFlags, reply: ReplyEmpty<'_>) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate<'_>,
    ) {
        match self.add(req, parent, n, false, mode) {
            Ok(a) => reply.created(&self.entry_ttl, &a, GEN, FileHandle(0), OPEN_FLAGS),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty<'_>,
    ) {
        let mut s = self.state.lock();
        match s.nodes.get_mut(&i.0) {
            Some(n) => {
                if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                    n.size = n.size.max(offset + length);
                }
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }
}

/// Mounts the null file system at `mountpoint` with `transport`, its namespace loaded from
/// `state_file` (if present).
fn mount_null(
    mountpoint: &Path,
    state_file: &Path,
    transport: Transport,
) -> Result<(Mount<NullFs>, Arc<Mutex<State>>)> {
    let state = Arc::new(Mutex::new(State::load(state_file)?));
    let opts = fern_fuse::MountOptions {
        fsname: "null-fuse".into(),
        ..Default::default()
    };
    let fs = NullFs {
        state: state.clone(),
        entry_ttl: opts.entry_ttl,
        attr_ttl: opts.attr_ttl,
        negative_ttl: opts.negative_ttl,
        writeback: opts.writeback_cache,
        max_write: opts.max_write,
    };
    let status = fern_fuse::uring::TransportStatus::new(transport);
    let mount = Mount::new(fs, mountpoint, &opts, status)
        .map_err(|e| BenchError::Usage(format!("mount {}: {e}", mountpoint.display())))?;
    Ok((mount, state))
}

/// Runs the null file system on `mountpoint` until it is unmounted: loads the namespace from
/// `state` (if present), prints `ready` on stdout once mounted (the readiness protocol of
/// `fernfs mount -f`), and saves the namespace back to `state` when the session ends.
pub fn serve(mountpoint: &Path, state_file: &Path, transport: Transport) -> Result<()> {
    let (mount, state) = mount_null(mountpoint, state_file, transport)?;
    {
        let mut out = io::stdout();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    }
    let run = mount.session.run();
    // A session that ended by an error leaves its mount attached to no one: detach it if it
    // is still ours (after an unmount it is gone and nothing is touched).
    if run.is_err() {
        let _ = mount.kernel.unmount(true);
    }
    if let Some(r) = mount.rings {
        r.join();
    }
    state.lock().save(state_file)?;
    run.map_err(|e| BenchError::Usage(format!("null-fuse session: {e}")))
}

/// A null file system served by background threads of this process (tests).
pub struct NullMount {
    session: fuser::BackgroundSession,
    rings: Option<fern_fuse::uring::Rings>,
    kernel: fern_fuse::KernelMount,
    /// The transport the mount uses.
    pub status: Arc<fern_fuse::uring::TransportStatus>,
    state: Arc<Mutex<State>>,
    state_file: std::path::PathBuf,
}

impl NullMount {
    /// Mounts it at `mountpoint` with `transport`; usable when this returns.
    pub fn spawn(mountpoint: &Path, state_file: &Path, transport: Transport) -> Result<NullMount> {
        let (mount, state) = mount_null(mountpoint, state_file, transport)?;
        Ok(NullMount {
            session: mount.session.spawn()?,
            rings: mount.rings,
            status: mount.status,
            kernel: mount.kernel,
            state,
            state_file: state_file.to_path_buf(),
        })
    }

    /// Unmounts, waits for every request thread and ring queue, saves the namespace.
    pub fn unmount(self) -> Result<()> {
        match self.kernel.unmount(false)? {
            fern_fuse::Unmounted::Done | fern_fuse::Unmounted::Gone => {}
            fern_fuse::Unmounted::Covered => {
                return Err(BenchError::Usage(format!(
                    "another file system is mounted over {}",
                    self.kernel.mountpoint().display()
                )))
            }
        }
        self.session.join()?;
        if let Some(r) = self.rings {
            r.join();
        }
        self.state.lock().save(&self.state_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Node {
        Node::new(false, 0o644, ROOT, 0, 0)
    }

    #[test]
    fn names_resolve_after_creation_and_refuse_duplicates() {
        let mut s = State::new();
        assert_eq!(s.child(ROOT, b"d"), Err(Errno::ENOENT));
        let d = s
            .add(ROOT, b"d", Node::new(true, 0o755, ROOT, 0, 0))
            .unwrap();
        let f = s.add(d.ino.0, b"f", file()).unwrap();
        assert_eq!(s.child(d.ino.0, b"f"), Ok(f.ino.0));
        assert_eq!(s.add(d.ino.0, b"f", file()).unwrap_err(), Errno::EEXIST);
        assert_eq!(s.add(f.ino.0, b"x", file()).unwrap_err(), Errno::ENOTDIR);
        assert_eq!(s.attr(ROOT).unwrap().nlink, 3);
        assert_eq!(s.remove(ROOT, b"d", true), Err(Errno::ENOTEMPTY));
        assert_eq!(s.remove(d.ino.0, b"f", true), Err(Errno::ENOTDIR));
        s.remove(d.ino.0, b"f", false).unwrap();
        s.remove(ROOT, b"d", true).unwrap();
        assert_eq!(s.child(ROOT, b"d"), Err(Errno::ENOENT));
        assert_eq!(s.nodes.len(), 1);
    }

    #[test]
    fn the_namespace_survives_save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let mut s = State::new();
        let d = s
            .add(ROOT, b"d", Node::new(true, 0o700, ROOT, 0, 0))
            .unwrap();
        let mut big = file();
        big.size = 12345;
        let f = s.add(d.ino.0, b"big", big).unwrap();
        s.save(&path).unwrap();
        let t = State::load(&path).unwrap();
        assert_eq!(t.child(ROOT, b"d"), Ok(d.ino.0));
        assert_eq!(t.child(d.ino.0, b"big"), Ok(f.ino.0));
        assert_eq!(t.attr(f.ino.0).unwrap().size, 12345);
        assert_eq!(t.attr(d.ino.0).unwrap().perm, 0o700);
        assert!(t.next > f.ino.0);
        // A missing file is an empty file system; a corrupt one is an error, not a panic.
        assert_eq!(
            State::load(&dir.path().join("none")).unwrap().nodes.len(),
            1
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert!(State::load(&path).is_err());
    }
}
