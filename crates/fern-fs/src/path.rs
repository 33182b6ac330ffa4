//! The path-based library API, TokuFS-style: applications and benchmarks use the file system
//! without FUSE. Each call resolves its path with `lookup`s (following symlinks, at most 40),
//! holds those lookups for the duration of the call and forgets them after, exactly as the
//! kernel would. It owns path resolution and nothing else: every effect goes through [`Fs`].
//! Permission checks are not applied here (the caller is trusted, as with TokuFS's library);
//! [`PathFs::access`] (mode and POSIX ACLs) and [`crate::perm`] provide them for callers that
//! want them. New nodes follow the directory's default ACL, or the credentials' umask.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::attr::{Attr, FileType, SetAttr, TimeSet};
use crate::dir::DirEntry;
use crate::error::{FsError, FsResult};
use crate::fs::Fs;
use crate::ids::{Fh, InodeId};
use crate::inode_ops::OpenFlags;
use crate::perm::Cred;

/// Symlinks followed in one resolution before ELOOP (Linux's MAXSYMLINKS).
const MAX_SYMLINKS: u32 = 40;

/// A thread-safe path-based handle on a mounted [`Fs`].
#[derive(Clone)]
pub struct PathFs {
    fs: Arc<Fs>,
    cred: Cred,
}

/// An open file of the library API. Close it with [`PathFs::close`] (dropping it leaks the
/// handle, which keeps an unlinked file's data until unmount).
#[derive(Debug)]
pub struct File {
    fh: Fh,
    ino: InodeId,
}

impl File {
    /// The file's inode number.
    pub fn ino(&self) -> InodeId {
        self.ino
    }
}

/// Options for [`PathFs::open`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Read, write, append, truncate, exclusive.
    pub flags: OpenFlags,
    /// Create the file if missing (O_CREAT).
    pub create: bool,
    /// Permission bits of a created file.
    pub perm: u32,
}

impl OpenOptions {
    /// Write-only (`O_WRONLY`, with `O_CREAT` when `create`), with `perm` if created.
    pub fn write_only(create: bool, perm: u32) -> Self {
        OpenOptions {
            flags: OpenFlags {
                write: true,
                ..OpenFlags::default()
            },
            create,
            perm,
        }
    }

    /// Write-only, created if missing (`O_WRONLY | O_CREAT`), with `perm` if created.
    pub fn create_write(perm: u32) -> Self {
        Self::write_only(true, perm)
    }

    /// Write-only, a new file that must not exist yet (`O_WRONLY | O_CREAT | O_EXCL`).
    pub fn create_new(perm: u32) -> Self {
        let mut o = Self::create_write(perm);
        o.flags.exclusive = true;
        o
    }
}

/// Lookups held for one call, forgotten on drop.
struct Pins<'a> {
    fs: &'a Fs,
    held: Vec<InodeId>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        for ino in self.held.drain(..) {
            self.fs.forget(ino, 1);
        }
    }
}

impl PathFs {
    /// A path API acting as `cred` (owner of what it creates).
    pub fn new(fs: Arc<Fs>, cred: Cred) -> Self {
        Self { fs, cred }
    }

    /// The inode-level file system underneath.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    fn pins(&self) -> Pins<'_> {
        Pins {
            fs: &self.fs,
            held: Vec::new(),
        }
    }

    fn lookup(&self, pins: &mut Pins<'_>, dir: InodeId, name: &[u8]) -> FsResult<Attr> {
        let attr = self.fs.lookup(dir, name)?;
        pins.held.push(attr.ino);
        Ok(attr)
    }

    /// Resolves `path` to an inode, following a final symlink if `follow`.
    fn walk(&self, pins: &mut Pins<'_>, path: &[u8], follow: bool) -> FsResult<InodeId> {
        Ok(self.walk_attr(pins, path, follow)?.0)
    }

    /// [`PathFs::walk`], also returning the attributes the last lookup read, if the last
    /// component was looked up in the store (not resolved from the directory cache): stat(2)
    /// then needs no second read of the same entry.
    fn walk_attr(
        &self,
        pins: &mut Pins<'_>,
        path: &[u8],
        follow: bool,
    ) -> FsResult<(InodeId, Option<Attr>)> {
        let mut todo: VecDeque<Vec<u8>> = components(path).collect();
        let mut cur = InodeId::ROOT;
        let mut last = None;
        let mut links = 0;
        while let Some(comp) = todo.pop_front() {
            last = None;
            if comp == b".." {
                cur = self.fs.parent_of(cur)?;
                // Hold ".." like any other lookup so it stays known while we use it.
                let (_, kind) = self.fs.loc(cur).or_else(|_| self.relookup(pins, cur))?;
                if kind != FileType::Directory {
                    return Err(FsError::NotDir);
                }
                continue;
            }
            if let Some(dir) = self.fs.lookup_known_dir(cur, &comp) {
                pins.held.push(dir);
                cur = dir;
                continue;
            }
            let attr = self.lookup(pins, cur, &comp)?;
            if attr.kind == FileType::Symlink && (follow || !todo.is_empty()) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(FsError::Loop);
                }
                let target = self.fs.readlink(attr.ino)?;
                if target.first() == Some(&b'/') {
                    cur = InodeId::ROOT;
                }
                for c in components(&target).rev() {
                    todo.push_front(c);
                }
                continue;
            }
            cur = attr.ino;
            last = Some(attr);
        }
        Ok((cur, last))
    }

    /// Pins a directory reached by "..", which this mount may not have looked up yet.
    fn relookup(
        &self,
        pins: &mut Pins<'_>,
        dir: InodeId,
    ) -> FsResult<(crate::cache::Loc, FileType)> {
        if dir == InodeId::ROOT {
            return self.fs.loc(dir);
        }
        let grand = self.fs.parent_of(dir)?;
        let (_, gkind) = self.fs.loc(grand).or_else(|_| self.relookup(pins, grand))?;
        if gkind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        // Find dir's name in its parent by listing: ".." into a directory this mount has not
        // seen is rare (it needs a path that first went through a symlink).
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self.fs.list(grand, after.as_deref(), 256, false)?;
            if let Some(e) = page.iter().find(|e| e.ino == dir) {
                self.lookup(pins, grand, &e.name)?;
                return self.fs.loc(dir);
            }
            match page.last() {
                Some(e) if page.len() == 256 => after = Some(e.name.clone()),
                _ => return Err(FsError::NotFound),
            }
        }
    }

    /// Resolves all but the last component; returns (parent, last name).
    fn walk_parent(&self, pins: &mut Pins<'_>, path: &[u8]) -> FsResult<(InodeId, Vec<u8>)> {
        let comps: Vec<Vec<u8>> = components(path).collect();
        let Some((last, init)) = comps.split_last() else {
            return Err(FsError::Invalid);
        };
        let parent_path = init.join(&b'/');
        let parent = self.walk(pins, &parent_path, true)?;
        // Like the kernel's parent walk: a non-directory parent fails here, before anything
        // about the last component (or a second path) is looked at.
        if self.fs.loc(parent)?.1 != FileType::Directory {
            return Err(FsError::NotDir);
        }
        Ok((parent, last.clone()))
    }

    /// stat(2): attributes, following a final symlink.
    pub fn stat(&self, path: &[u8]) -> FsResult<Attr> {
        let mut pins = self.pins();
        match self.walk_attr(&mut pins, path, true)? {
            (_, Some(attr)) => Ok(attr),
            (ino, None) => self.fs.getattr(ino),
        }
    }

    /// lstat(2): attributes of a final symlink itself.
    pub fn lstat(&self, path: &[u8]) -> FsResult<Attr> {
        let mut pins = self.pins();
        match self.walk_attr(&mut pins, path, false)? {
            (_, Some(attr)) => Ok(attr),
            (ino, None) => self.fs.getattr(ino),
        }
    }

    /// mkdir(2).
    pub fn mkdir(&self, path: &[u8], perm: u32) -> FsResult<Attr> {
        let mut pins = self.pins();
        let (dir, name) = self.walk_parent(&mut pins, path)?;
        let attr = self.fs.mkdir(&self.cred, dir, &name, perm)?;
        pins.held.push(attr.ino);
        Ok(attr)
    }

    /// mknod(2).
    pub fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> FsResult<Attr> {
        let mut pins = self.pins();
        let (dir, name) = self.walk_parent(&mut pins, path)?;
        let attr = self.fs.mknod(&self.cred, dir, &name, mode, rdev)?;
        pins.held.push(attr.ino);
        Ok(attr)
    }

    /// rmdir(2).
    pub fn rmdir(&self, path: &[u8]) -> FsResult<()> {
        let mut pins = self.pins();
        let (dir, name) = self.walk_parent(&mut pins, path)?;
        self.fs.rmdir(dir, &name)
    }

    /// unlink(2).
    pub fn unlink(&self, path: &[u8]) -> FsResult<()> {
        let mut pins = self.pins();
        let (dir, name) = self.walk_parent(&mut pins, path)?;
        self.fs.unlink(dir, &name)
    }

    /// renameat2(2) with `flags` 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
    pub fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> FsResult<()> {
        let mut pins = self.pins();
        let (src_dir, src) = self.walk_parent(&mut pins, from)?;
        let (dst_dir, dst) = self.walk_parent(&mut pins, to)?;
        self.fs.rename(src_dir, &src, dst_dir, &dst, flags)
    }

    /// link(2): a new name `to` for the file at `from` (a final symlink is not followed).
    pub fn link(&self, from: &[u8], to: &[u8]) -> FsResult<Attr> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, from, false)?;
        let (dir, name) = self.walk_parent(&mut pins, to)?;
        let attr = self.fs.link(ino, dir, &name)?;
        pins.held.push(attr.ino);
        Ok(attr)
    }

    /// symlink(2): `path` becomes a symlink to `target`.
    pub fn symlink(&self, target: &[u8], path: &[u8]) -> FsResult<Attr> {
        let mut pins = self.pins();
        let (dir, name) = self.walk_parent(&mut pins, path)?;
        let attr = self.fs.symlink(&self.cred, dir, &name, target)?;
        pins.held.push(attr.ino);
        Ok(attr)
    }

    /// readlink(2).
    pub fn readlink(&self, path: &[u8]) -> FsResult<Vec<u8>> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, false)?;
        self.fs.readlink(ino)
    }

    /// open(2), with O_CREAT when `opts.create`.
    pub fn open(&self, path: &[u8], opts: OpenOptions) -> FsResult<File> {
        let mut pins = self.pins();
        if opts.create {
            let (dir, name) = self.walk_parent(&mut pins, path)?;
            match self
                .fs
                .create(&self.cred, dir, &name, opts.perm, opts.flags)
            {
                Ok((attr, fh)) => {
                    pins.held.push(attr.ino);
                    return Ok(File { fh, ino: attr.ino });
                }
                // An existing symlink (or other node) is opened through the normal path.
                Err(FsError::Exists) if !opts.flags.exclusive => {}
                Err(e) => return Err(e),
            }
        }
        let ino = self.walk(&mut pins, path, true)?;
        let fh = self.fs.open_as(&self.cred, ino, opts.flags)?;
        Ok(File { fh, ino })
    }

    /// close(2).
    pub fn close(&self, file: File) -> FsResult<()> {
        self.fs.release(file.fh)
    }

    /// pread(2).
    pub fn read_at(&self, file: &File, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        self.fs.read(file.ino, offset, len)
    }

    /// pwrite(2) (at end of file for O_APPEND files).
    pub fn write_at(&self, file: &File, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.fs.write(file.fh, offset, data)
    }

    /// fsync(2).
    pub fn fsync(&self, file: &File) -> FsResult<()> {
        self.fs.fsync(file.ino, false)
    }

    /// ftruncate(2).
    pub fn ftruncate(&self, file: &File, size: u64) -> FsResult<Attr> {
        self.fs.setattr_as(
            &self.cred,
            file.ino,
            &SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        )
    }

    /// fallocate(2).
    pub fn fallocate(&self, file: &File, mode: u32, offset: u64, len: u64) -> FsResult<()> {
        self.fs.fallocate(file.ino, mode, offset, len)
    }

    /// truncate(2).
    pub fn truncate(&self, path: &[u8], size: u64) -> FsResult<()> {
        self.setattr(
            path,
            &SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        )
    }

    /// chmod(2).
    pub fn chmod(&self, path: &[u8], perm: u32) -> FsResult<()> {
        self.setattr(
            path,
            &SetAttr {
                mode: Some(perm),
                ..SetAttr::default()
            },
        )
    }

    /// chown(2).
    pub fn chown(&self, path: &[u8], uid: Option<u32>, gid: Option<u32>) -> FsResult<()> {
        self.setattr(
            path,
            &SetAttr {
                uid,
                gid,
                ..SetAttr::default()
            },
        )
    }

    /// utimensat(2).
    pub fn utimens(
        &self,
        path: &[u8],
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
    ) -> FsResult<()> {
        self.setattr(
            path,
            &SetAttr {
                atime,
                mtime,
                ..SetAttr::default()
            },
        )
    }

    /// Any attribute change, following a final symlink. Like the system calls, it reports
    /// success only; the change is a blind write (no read of the attributes back).
    pub fn setattr(&self, path: &[u8], sa: &SetAttr) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.set_attributes_as(&self.cred, ino, sa)
    }

    /// [`PathFs::setattr`] without following a final symlink (lchown, utimensat with
    /// AT_SYMLINK_NOFOLLOW): how a copy gives a symlink its owner and times.
    pub fn lsetattr(&self, path: &[u8], sa: &SetAttr) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, false)?;
        self.fs.set_attributes_as(&self.cred, ino, sa)
    }

    /// lsetxattr(2): [`PathFs::setxattr`] without following a final symlink.
    pub fn lsetxattr(&self, path: &[u8], name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, false)?;
        self.fs.setxattr(ino, name, value, flags)
    }

    /// llistxattr(2) and the values: every extended attribute of `path`, not following a
    /// final symlink.
    #[allow(clippy::type_complexity)] // (name, value) pairs, as listxattr + getxattr give them
    pub fn lxattrs(&self, path: &[u8]) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, false)?;
        self.fs
            .listxattr(ino)?
            .into_iter()
            .map(|n| Ok((self.fs.getxattr(ino, &n)?, n)))
            .map(|r| r.map(|(v, n)| (n, v)))
            .collect()
    }

    /// Every entry of a directory, with attributes, in name order.
    pub fn read_dir(&self, path: &[u8]) -> FsResult<Vec<DirEntry>> {
        let mut pins = self.pins();
        let dir = self.walk(&mut pins, path, true)?;
        let mut out: Vec<DirEntry> = Vec::new();
        loop {
            let after = out.last().map(|e| e.name.clone());
            let page = self.fs.list(dir, after.as_deref(), 1024, true)?;
            let done = page.len() < 1024;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// access(2): checks `mask` (`perm::MAY_*`) for this handle's credentials against the
    /// file's mode and access ACL. The other calls of this API do not check permissions
    /// themselves (the caller is trusted); this is how it asks.
    pub fn access(&self, path: &[u8], mask: u32) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.access(&self.cred, ino, mask)
    }

    /// getxattr(2).
    pub fn getxattr(&self, path: &[u8], name: &[u8]) -> FsResult<Vec<u8>> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.getxattr(ino, name)
    }

    /// setxattr(2).
    pub fn setxattr(&self, path: &[u8], name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.setxattr(ino, name, value, flags)
    }

    /// listxattr(2).
    pub fn listxattr(&self, path: &[u8]) -> FsResult<Vec<Vec<u8>>> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.listxattr(ino)
    }

    /// removexattr(2).
    pub fn removexattr(&self, path: &[u8], name: &[u8]) -> FsResult<()> {
        let mut pins = self.pins();
        let ino = self.walk(&mut pins, path, true)?;
        self.fs.removexattr(ino, name)
    }
}

/// Non-empty, non-"." components of a path.
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}
