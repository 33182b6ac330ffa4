//! Operations on one inode by number: getattr, setattr (including truncate), open, create,
//! release (freeing orphans at the last close), statfs and the sync family. It owns the POSIX
//! timestamp rules of setattr (chmod/chown/utimens touch ctime; a size change touches mtime and
//! ctime) and the open-count bookkeeping; it must never move a name.

use std::sync::atomic::Ordering;

use fern_kv::{WriteBatch, WriteOptions};

use crate::attr::{Attr, FileType, SetAttr, TimeSet, Timespec};
use crate::cache::Loc;
use crate::error::{FsError, FsResult};
use crate::fs::{Fs, Handle, InodeRows, MAX_FILE_SIZE, NAME_MAX};
use crate::ids::{Fh, InodeId};
use crate::perm::Cred;
use crate::stored::Shape;
use crate::upsert::StatDelta;

/// How a file is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Opened for writing (O_WRONLY or O_RDWR).
    pub write: bool,
    /// Every write goes to the end (O_APPEND).
    pub append: bool,
    /// Truncate to zero on open (O_TRUNC, with write).
    pub truncate: bool,
    /// With create: fail if the name exists (O_EXCL).
    pub exclusive: bool,
}

/// File-system statistics, in statvfs(3)'s terms: used = total - free for both blocks and
/// inodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Block size.
    pub bsize: u32,
    /// Total blocks: the store's capacity ([`fern_kv::KvStore::space`]: a fixed-size image's
    /// size, or a growing one's extent plus its host's free space); nominal
    /// ([`NOMINAL_BYTES`]) for a store that cannot tell.
    pub blocks: u64,
    /// Free blocks: total minus the bytes the store uses.
    pub bfree: u64,
    /// Blocks new data can use: free minus the store's reserve for checkpoints and deletes
    /// (for everyone alike, root included).
    pub bavail: u64,
    /// Total inodes: the id space ([`ID_SPACE`]).
    pub files: u64,
    /// Free inodes: ids never handed out. Ids are never reused, so `files - ffree` counts
    /// every inode ever created (deleted ones included), an upper bound on the live ones.
    pub ffree: u64,
    /// Longest name.
    pub namelen: u32,
}

/// The nominal size statfs reports (1 PiB).
pub const NOMINAL_BYTES: u64 = 1 << 50;
/// The inode count statfs reports: ids are 64-bit, but 2^48 keeps `df -i` readable and
/// is more than any store will hold.
pub const ID_SPACE: u64 = 1 << 48;

impl Fs {
    /// Attributes of `ino`.
    pub fn getattr(&self, ino: InodeId) -> FsResult<Attr> {
        let _g = self.locks.lock(&[ino]);
        self.attr_of_stat(ino, self.stat_locked(ino)?)
    }

    /// access(2): whether `cred` may access `ino` with `mask` (`perm::MAY_*`), by its mode and
    /// access ACL ([`crate::perm::check_access_acl`]). The ACL is read only when it can
    /// matter (the caller is neither root nor the owner).
    pub fn access(&self, cred: &Cred, ino: InodeId, mask: u32) -> FsResult<()> {
        let attr = self.getattr(ino)?;
        let acl = if cred.uid == 0 || cred.uid == attr.uid {
            None
        } else {
            self.access_acl(ino)?
        };
        crate::perm::check_access_acl(&attr, acl.as_ref(), cred, mask)
    }

    /// Changes attributes of `ino`; returns the new attributes. Applies no rule that depends
    /// on the caller (for trusted callers, or callers that apply them); see [`Fs::setattr_as`].
    pub fn setattr(&self, ino: InodeId, sa: &SetAttr) -> FsResult<Attr> {
        self.setattr_with(ino, sa, false)
    }

    /// [`Fs::setattr`] on behalf of `cred`: a size change (truncate) by a caller without root
    /// privilege also clears the file's set-user-id bit, and its set-group-id bit when it is
    /// group-executable.
    pub fn setattr_as(&self, cred: &Cred, ino: InodeId, sa: &SetAttr) -> FsResult<Attr> {
        self.setattr_with(ino, sa, crate::owner::kills_suid(cred))
    }

    fn setattr_with(&self, ino: InodeId, sa: &SetAttr, kill_suid: bool) -> FsResult<Attr> {
        let _g = self.locks.lock(&[ino]);
        let kind = self.set_attributes_locked(ino, sa, kill_suid)?;
        // The reply's attributes: the mirror with the change applied, or one read.
        let stat = self.stat_locked(ino)?;
        if kind == FileType::Directory {
            // Under this directory's lock, like every create in it (owner.rs).
            self.dir_table.note_stat(ino, &stat);
        }
        self.attr_of_stat(ino, stat)
    }

    /// [`Fs::setattr_as`] without reading the attributes back: the change is one blind write,
    /// which is all chmod(2), chown(2), truncate(2) and utimensat(2) need.
    pub fn set_attributes_as(&self, cred: &Cred, ino: InodeId, sa: &SetAttr) -> FsResult<()> {
        let kill_suid = crate::owner::kills_suid(cred);
        let _g = self.locks.lock(&[ino]);
        let kind = self.set_attributes_locked(ino, sa, kill_suid)?;
        if kind == FileType::Directory {
            // The set-gid table follows a directory's mode and group (owner.rs).
            let stat = self.stat_locked(ino)?;
            self.dir_table.note_stat(ino, &stat);
        }
        Ok(())
    }

    /// Writes the change of a setattr; the caller holds `ino`'s lock. Returns the inode's
    /// kind. The stat mirror, if it held the inode, holds the changed stat after it.
    fn set_attributes_locked(
        &self,
        ino: InodeId,
        sa: &SetAttr,
        kill_suid: bool,
    ) -> FsResult<FileType> {
        let (loc, kind) = self.loc(ino)?;
        let now = Timespec::now();
        let mut b = WriteBatch::new();
        let mut d = StatDelta::default();
        let mut changed = false;
        let mut new_shape = None;
        if let Some(size) = sa.size {
            match kind {
                FileType::Regular => {}
                FileType::Directory => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
            if size > MAX_FILE_SIZE {
                return Err(FsError::FileTooBig);
            }
            let old_size = self.inodes.shape(ino).map(|s| s.size);
            self.truncate_extents(&mut b, ino, size, old_size)?;
            self.truncate_blocks(&mut b, ino, size);
            // Truncating to zero needs no knowledge of the file (O_TRUNC reads nothing).
            let after = if size == 0 {
                Shape::EMPTY
            } else {
                let now_shape = self.shape(ino, &loc)?;
                self.shape_after_truncate(ino, &now_shape, size)?
            };
            d.stored_blocks = Some(after.stored);
            new_shape = Some(after);
            d.size = Some(size);
            d.mtime = Some(now);
            d.kill_suid = kill_suid;
            changed = true;
        }
        if let Some(mode) = sa.mode {
            d.perm = Some(mode & 0o7777);
            changed = true;
            // An access ACL follows chmod (`posix_acl_chmod`); one point read, in the xattr
            // tree, and none for a node this mount made without ACLs (`Known::xattr_free`).
            if kind != FileType::Symlink {
                if let Some(mut acl) = self.access_acl(ino)? {
                    acl.chmod(mode);
                    b.put(
                        self.t.xattr,
                        crate::schema::named_key(ino, crate::acl::ACL_ACCESS),
                        acl.encode(),
                    );
                }
            }
        }
        if sa.uid.is_some() || sa.gid.is_some() {
            d.uid = sa.uid;
            d.gid = sa.gid;
            // chown of any non-directory (fifos, devices and sockets included) drops set-id
            // bits, as Linux's chown_common asks (ATTR_KILL_SUID | setattr_should_drop_sgid).
            d.kill_suid |= kind != FileType::Directory;
            changed = true;
        }
        let time = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = sa.atime {
            d.atime = Some(time(t));
            changed = true;
        }
        if let Some(t) = sa.mtime {
            d.mtime = Some(time(t));
            changed = true;
        }
        if changed {
            d.ctime = Some(now);
        }
        if let Some(t) = sa.ctime {
            d.ctime = Some(t);
        }
        let before = self.upsert_stat(&mut b, ino, &loc, &d)?;
        // A truncate frees space, so a full store admits it (format.md, B12).
        let opts = match sa.size {
            Some(_) => WriteOptions::NO_SYNC.freeing(0),
            None => WriteOptions::NO_SYNC,
        };
        self.kv.write(b, opts)?;
        self.stat_applied(ino, before, &d);
        if sa.atime.is_some() {
            // A lazily written access must not overwrite the time set here (atime.rs).
            self.drop_pending_atime(ino);
        }
        if let Some(s) = new_shape {
            self.set_shape(ino, s);
        }
        Ok(kind)
    }

    /// Opens `ino`; the handle keeps the inode (and its data, if it is unlinked) alive until
    /// [`Fs::release`]. Without credentials, writes through the handle keep set-id bits
    /// (for trusted callers); see [`Fs::open_as`].
    pub fn open(&self, ino: InodeId, flags: OpenFlags) -> FsResult<Fh> {
        self.open_with(ino, flags, None, false)
    }

    /// [`Fs::open`] on behalf of `cred`: when `cred` is not root, writes and O_TRUNC through
    /// the handle clear the file's set-user-id bit (and set-group-id when group-executable).
    pub fn open_as(&self, cred: &Cred, ino: InodeId, flags: OpenFlags) -> FsResult<Fh> {
        self.open_with(ino, flags, Some(cred), false)
    }

    /// `registered`: the file was created with this mount's open registration already in the
    /// creating transaction (shared.rs), so the first open puts none.
    fn open_with(
        &self,
        ino: InodeId,
        flags: OpenFlags,
        cred: Option<&Cred>,
        registered: bool,
    ) -> FsResult<Fh> {
        let kill_suid = cred.is_some_and(crate::owner::kills_suid);
        let kind = {
            let _g = self.locks.lock(&[ino]);
            let (_, kind) = self.loc(ino)?;
            if kind == FileType::Directory && flags.write {
                return Err(FsError::IsDir);
            }
            let first = self
                .inodes
                .update(ino, |k| {
                    k.opens += 1;
                    k.opens == 1
                })
                .unwrap_or(false);
            if first && kind == FileType::Regular && self.is_shared() && !registered {
                // Under the lock, so a concurrent last close here cannot drop it meanwhile.
                if let Err(e) = self.register_open(ino) {
                    self.inodes.update(ino, |k| k.opens -= 1);
                    self.inodes.drop_if_unused(ino);
                    return Err(e);
                }
            }
            kind
        };
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        let handle = Handle {
            ino,
            append: flags.append,
            write: flags.write,
            kill_suid,
            dir_names: None,
        };
        self.handles.lock().insert(fh, handle);
        if flags.truncate && flags.write && kind == FileType::Regular {
            if let Err(e) = self.setattr_with(
                ino,
                &SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                },
                kill_suid,
            ) {
                self.release(fh)?;
                return Err(e);
            }
        }
        Ok(fh)
    }

    /// Creates (or opens, unless exclusive) regular file `name` in `parent` and opens it.
    pub fn create(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        flags: OpenFlags,
    ) -> FsResult<(Attr, Fh)> {
        let (attr, created) = self.create_node(cred, parent, name, perm, flags.exclusive)?;
        let flags = OpenFlags {
            truncate: flags.truncate && !created,
            ..flags
        };
        let fh = self.open_with(attr.ino, flags, Some(cred), created)?;
        Ok((attr, fh))
    }

    /// Closes a handle. The last close of an unlinked file deletes its data and inode.
    pub fn release(&self, fh: Fh) -> FsResult<()> {
        let handle = self.handles.lock().remove(&fh).ok_or(FsError::BadHandle)?;
        let ino = handle.ino;
        let _g = self.locks.lock(&[ino]);
        let (free, last_file) = self
            .inodes
            .update(ino, |k| {
                k.opens = k.opens.saturating_sub(1);
                (
                    k.opens == 0 && k.orphan,
                    k.opens == 0 && k.kind == FileType::Regular,
                )
            })
            .unwrap_or((false, false));
        if last_file && self.is_shared() {
            // Another mount may hold it too (or have orphaned it): the store decides.
            if self.unregister_open(ino)? {
                self.inodes.update(ino, |k| {
                    k.orphan = false;
                    k.loc = Loc::Gone;
                });
            }
        } else if free {
            let mut b = WriteBatch::new();
            let size = self.inodes.shape(ino).map(|s| s.size);
            self.free_file(&mut b, ino, size, InodeRows::ALL)?;
            self.kv.write(b, WriteOptions::NO_SYNC.freeing(0))?;
            self.inodes.update(ino, |k| {
                k.orphan = false;
                k.loc = Loc::Gone;
            });
        }
        self.inodes.drop_if_unused(ino);
        Ok(())
    }

    /// The inode a handle refers to.
    pub fn handle_ino(&self, fh: Fh) -> FsResult<InodeId> {
        self.handles
            .lock()
            .get(&fh)
            .map(|h| h.ino)
            .ok_or(FsError::BadHandle)
    }

    /// File-system statistics. Costs one point read (the id high-water mark) and the store's
    /// own space figure; nothing is scanned.
    pub fn statfs(&self) -> FsResult<StatFs> {
        let reserved = crate::alloc::IdAllocator::high_water(&*self.kv, &self.t)?;
        // The root plus every id handed out from FIRST_FREE on; this mount's unused
        // reservation is not counted (a crash skips it forever, the next statfs counts it).
        let used_ids = reserved
            .saturating_sub(self.ids.unused())
            .saturating_sub(crate::ids::InodeId::FIRST_FREE)
            + 1;
        let bs = u64::from(self.sb.block_size);
        // The store's own figures (fern-kv-tree: the image's fixed size, or for a growing
        // image its extent plus what the host can still give it; used counts what a
        // checkpoint still holds; available excludes the engine's reserve). Only a store that
        // cannot tell gets the nominal total.
        let (blocks, bfree, bavail) = match self.kv.space() {
            Some(s) => (
                s.capacity / bs,
                s.capacity.saturating_sub(s.used) / bs,
                s.available / bs,
            ),
            None => {
                let blocks = NOMINAL_BYTES / bs;
                let used_blocks = self.kv.space_used().map_or(0, |b| b.div_ceil(bs));
                let bfree = blocks.saturating_sub(used_blocks);
                (blocks, bfree, bfree)
            }
        };
        Ok(StatFs {
            bsize: self.sb.block_size,
            blocks,
            bfree,
            bavail,
            files: ID_SPACE,
            ffree: ID_SPACE.saturating_sub(used_ids),
            namelen: NAME_MAX as u32,
        })
    }

    /// fsync / fdatasync of one file. Every write is in the store's single ordered log, so
    /// making the file durable makes the whole store durable; `datasync` changes nothing.
    pub fn fsync(&self, ino: InodeId, _datasync: bool) -> FsResult<()> {
        self.loc(ino)?;
        self.flush_atimes()?;
        self.kv.sync()?;
        Ok(())
    }

    /// syncfs: everything written so far becomes durable.
    pub fn syncfs(&self) -> FsResult<()> {
        self.flush_atimes()?;
        self.kv.sync()?;
        Ok(())
    }
}
