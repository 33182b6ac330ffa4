//! Namespace operations that add or remove one name: lookup, create, mknod, mkdir, symlink,
//! link, unlink, rmdir, readlink, forget. Each is one optimistic transaction over the entry
//! key(s) it reads, run under the stripe locks of every inode whose stat location it reads or
//! changes. It owns the rules for link counts and for what happens to an inode when its last
//! name goes (freed at once, or kept as an orphan while open). It must never read data blocks.

use fern_kv::{transact, transact_opts, KeyRange, KvRead, KvTxn, WriteOptions};

use crate::acl::{ACL_ACCESS, ACL_DEFAULT};
use crate::attr::{Attr, FileType, Stat, Timespec};
use crate::cache::Loc;
use crate::error::{FsError, FsResult};
use crate::fs::{validate_name, Fs, InodeRows, PATH_MAX};
use crate::ids::InodeId;
use crate::lookahead::Answer;
use crate::perm::Cred;
use crate::record::{Dentry, Inode};
use crate::schema;
use crate::upsert::StatDelta;

/// Attempts of a transaction removing a file's last name that read the file's open
/// registrations on a shared store (and free it at once when there are none); later attempts
/// orphan it without the read (see `Fs::drop_link`).
const READ_REGISTRATIONS_ATTEMPTS: u32 = 3;

/// What became of an inode whose name was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Other hard links remain.
    StillLinked,
    /// No name left but open: kept as an orphan until the last release. `unchecked`: made an
    /// orphan on a shared store without reading who holds it (`settle` then checks).
    Orphaned { unchecked: bool },
    /// No name left and not open: every key deleted.
    Freed,
}

impl Fs {
    /// Finds `name` in `parent` and pins the child (FUSE lookup count + 1).
    pub fn lookup(&self, parent: InodeId, name: &[u8]) -> FsResult<Attr> {
        validate_name(name)?;
        self.require_dir(parent)?;
        // A lookup changes nothing: its release does not spoil rows read ahead (lookahead.rs).
        let _g = self.locks.lock_reading(&[parent]);
        if self.names.contains(parent, name) == Some(false) {
            return Err(FsError::NotFound);
        }
        let epoch = self.inodes.shape_epoch();
        let since = self.locks.releases();
        let ahead = if self.is_shared() {
            self.look_ahead(parent, name)?
        } else {
            Answer::Unknown
        };
        let (d, (loc, inode)) = match ahead {
            Answer::Found(entry, inode) => {
                let d = Dentry::decode(&entry)?;
                let rows = self.with_inode_row(d.id(), Some(inode));
                (d.clone(), self.resolve(&rows, parent, name, d)?)
            }
            Answer::Absent => return Err(FsError::NotFound),
            Answer::Unknown => {
                let d = self.peek(parent, name)?.ok_or(FsError::NotFound)?;
                (d.clone(), self.resolve(&*self.kv, parent, name, d)?)
            }
        };
        let kind = inode.stat.kind()?;
        if kind == FileType::Directory {
            self.dirents.put(parent, name, d.id(), loc.clone());
        }
        self.inodes.pin(d.id(), loc, kind);
        // The kernel's getattr, setattr reply and read of this inode then read nothing.
        self.seed_stat(d.id(), Some(parent), inode.stat, since);
        if kind == FileType::Regular {
            // The stat is at hand: a later write of this file then reads nothing (stored.rs).
            let shape = crate::stored::Shape::of(&inode.stat, u64::from(self.sb.block_size));
            self.inodes.seed_shape(d.id(), shape, epoch);
        }
        self.attr_of(d.id(), &inode)
    }

    /// For path walks: like [`Fs::lookup`] of a directory this mount has already looked up or
    /// made, answered from memory (pinned like a lookup, no attributes). `None`: not known to
    /// be a directory here; do a real lookup.
    pub fn lookup_known_dir(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        let _g = self.locks.lock_reading(&[parent]);
        let (id, loc) = self.dirents.get(parent, name)?;
        self.inodes.pin(id, loc, FileType::Directory);
        Some(id)
    }

    /// Drops `n` lookups of `ino` (FUSE forget).
    pub fn forget(&self, ino: InodeId, n: u64) {
        let _g = self.locks.lock_reading(&[ino]);
        self.inodes.forget(ino, n);
    }

    /// Creates a device node, FIFO, socket or regular file (`mode` carries the type).
    pub fn mknod(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> FsResult<Attr> {
        match FileType::from_mode(mode) {
            Some(FileType::Directory | FileType::Symlink) | None => Err(FsError::Invalid),
            Some(_) => Ok(self
                .make_node(cred, parent, name, mode, rdev, Vec::new(), true, false)?
                .0),
        }
    }

    /// Creates a directory with permission bits `perm`.
    pub fn mkdir(&self, cred: &Cred, parent: InodeId, name: &[u8], perm: u32) -> FsResult<Attr> {
        let mode = FileType::Directory.mode_bits() | (perm & 0o7777);
        Ok(self
            .make_node(cred, parent, name, mode, 0, Vec::new(), true, false)?
            .0)
    }

    /// Creates a symbolic link to `target`.
    pub fn symlink(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound);
        }
        if target.len() > PATH_MAX {
            return Err(FsError::NameTooLong);
        }
        let mode = FileType::Symlink.mode_bits() | 0o777;
        Ok(self
            .make_node(cred, parent, name, mode, 0, target.to_vec(), true, false)?
            .0)
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: InodeId) -> FsResult<Vec<u8>> {
        let inode = self.read_inode(ino)?;
        if inode.stat.kind()? != FileType::Symlink {
            return Err(FsError::Invalid);
        }
        Ok(inode.payload)
    }

    /// Creates (or with `exclusive == false`, finds) a regular file; returns its attributes
    /// and whether it was created. Pins the inode either way.
    pub(crate) fn create_node(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        exclusive: bool,
    ) -> FsResult<(Attr, bool)> {
        let mode = FileType::Regular.mode_bits() | (perm & 0o7777);
        self.make_node(cred, parent, name, mode, 0, Vec::new(), exclusive, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        rdev: u64,
        payload: Vec<u8>,
        exclusive: bool,
        opening: bool,
    ) -> FsResult<(Attr, bool)> {
        validate_name(name)?;
        self.require_dir(parent)?;
        let kind = FileType::from_mode(mode).ok_or(FsError::Invalid)?;
        let _g = self.locks.lock(&[parent]);
        let ploc = self.live_dir(parent)?;
        // A complete name set answers "does it exist" without reading the entry.
        let known_absent = self.names.contains(parent, name) == Some(false);
        let from = self.dir_inherit(parent)?;
        let (gid, got) = crate::owner::new_owner(cred, &from, mode);
        let mode = got.mode;
        let inherits_acl = got.access.is_some() || got.default.is_some();
        let id = self.ids.alloc(&*self.kv, &self.t, &self.policy)?;
        let now = Timespec::now();
        let is_dir = kind == FileType::Directory;
        let mut stat = Stat::new(mode, cred.uid, gid, if is_dir { 2 } else { 1 }, now);
        stat.rdev = rdev;
        // A regular file starts counted, with no blocks (its "rdev" is the count; attr.rs).
        stat.set_stored_blocks(0);
        stat.size = payload.len() as u64;
        let inode = Inode { stat, payload };
        let key = schema::named_key(parent, name);
        let linked = self.is_shared();
        let new_loc = || {
            if linked {
                Loc::Inode
            } else {
                Loc::Entry {
                    parent,
                    name: name.to_vec(),
                }
            }
        };
        let delta = StatDelta {
            mtime: Some(now),
            ctime: Some(now),
            nlink_add: is_dir.then_some(1),
            ..StatDelta::default()
        };
        // The parent's mirrored stat, kept current across the commit below (the kernel asks
        // for the parent's attributes after every create: they changed).
        let mut parent_before = None;
        let existing = transact(&*self.kv, &self.policy, WriteOptions::NO_SYNC, |txn| {
            self.dir_alive(&*txn, parent, &ploc)?;
            if !known_absent {
                if let Some(v) = txn.get(self.t.dentry, &key)? {
                    return Ok(Some(Dentry::decode(&v)?));
                }
            }
            let entry = if linked {
                // Shared store: the stat goes where no other mount's rename or link moves it.
                txn.batch()
                    .put(self.t.inode, schema::id_key(id), inode.encode_record());
                Dentry::Linked {
                    id,
                    mode: inode.stat.mode,
                }
            } else {
                Dentry::Inline {
                    id,
                    inode: inode.clone(),
                }
            };
            txn.batch().put(self.t.dentry, key.clone(), entry.encode());
            if opening {
                // The caller opens it next: its registration commits with the name, so no
                // unlink elsewhere can come between (no separate put and re-read).
                self.register_with_create(txn.batch(), id);
            }
            parent_before = self.upsert_stat(txn.batch(), parent, &ploc, &delta)?;
            if is_dir {
                txn.batch().put(
                    self.t.dirparent,
                    schema::id_key(id),
                    parent.0.to_be_bytes().to_vec(),
                );
            }
            // Inherited ACLs are written with the entry: a node never exists without them.
            for (name, acl) in [(ACL_ACCESS, &got.access), (ACL_DEFAULT, &got.default)] {
                if let Some(acl) = acl {
                    txn.batch()
                        .put(self.t.xattr, schema::named_key(id, name), acl.encode());
                }
            }
            Ok::<_, FsError>(None)
        })?;
        if let Some(d) = existing {
            if exclusive {
                return Err(FsError::Exists);
            }
            let (loc, found) = self.resolve(&*self.kv, parent, name, d.clone())?;
            let found_kind = found.stat.kind()?;
            if found_kind == FileType::Directory {
                return Err(FsError::IsDir);
            }
            self.inodes.pin(d.id(), loc, found_kind);
            return Ok((self.attr_of(d.id(), &found)?, false));
        }
        self.stat_applied(parent, parent_before, &delta);
        self.names.insert(parent, name);
        if is_dir {
            self.dirents.put(parent, name, id, new_loc());
            self.names.new_dir(id);
            self.dir_table.put(
                id,
                crate::owner::DirInherit {
                    sgid: (inode.stat.mode & crate::owner::S_ISGID != 0).then_some(gid),
                    default_acl: got.default.map(std::sync::Arc::new),
                },
            );
        }
        self.inodes.pin(id, new_loc(), kind);
        // Nobody can have written it yet: its name became visible under the parent's lock,
        // which every lookup takes and this call still holds.
        let xattr_free = !inherits_acl;
        self.inodes.update(id, |k| {
            if kind == FileType::Regular {
                k.shape.get_or_insert(crate::stored::Shape::EMPTY);
            }
            k.xattr_free = xattr_free;
            // Exact for the same reason: the stat just committed is the only one it had.
            if !linked {
                k.stat = Some(inode.stat);
            }
        });
        Ok((self.attr_of(id, &inode)?, true))
    }

    /// Adds the name `newname` in `newparent` for `ino` (not a directory).
    pub fn link(&self, ino: InodeId, newparent: InodeId, newname: &[u8]) -> FsResult<Attr> {
        validate_name(newname)?;
        self.require_dir(newparent)?;
        let (loc, kind) = self.loc(ino)?;
        if kind == FileType::Directory {
            return Err(FsError::Perm);
        }
        let mut lockset = vec![ino, newparent];
        if let Loc::Entry { parent, .. } = &loc {
            lockset.push(*parent);
        }
        let _g = self.locks.lock(&lockset);
        let (moved, orphan) = self
            .inodes
            .with(ino, |k| (k.loc != loc, k.orphan))
            .ok_or(FsError::Stale)?;
        if moved {
            // Moved between our look and our lock: the caller sees a transient failure.
            return Err(FsError::Kv(fern_kv::KvError::Conflict));
        }
        if orphan {
            return Err(FsError::NotFound);
        }
        let nploc = self.live_dir(newparent)?;
        let newkey = schema::named_key(newparent, newname);
        let now = Timespec::now();
        let inode = transact(&*self.kv, &self.policy, WriteOptions::NO_SYNC, |txn| {
            self.dir_alive(&*txn, newparent, &nploc)?;
            if txn.get(self.t.dentry, &newkey)?.is_some() {
                return Err(FsError::Exists);
            }
            let mut inode = self.read_inode_at(&*txn, ino, &loc)?;
            // The stat is rewritten (moved, or its count raised) under `ino`'s lock.
            self.inodes.drop_stat(ino);
            if inode.stat.nlink == 0 {
                return Err(FsError::NotFound);
            }
            inode.stat.nlink += 1;
            inode.stat.ctime = now;
            // Both names (the old one when the stat moves, and the new one) point at the inode.
            let linked = Dentry::Linked {
                id: ino,
                mode: inode.stat.mode,
            }
            .encode();
            let b = txn.batch();
            if let Loc::Entry { parent, name } = &loc {
                // First extra link: the stat moves out of the entry into the inode tree.
                b.put(self.t.inode, schema::id_key(ino), inode.encode_record());
                b.put(
                    self.t.dentry,
                    schema::named_key(*parent, name),
                    linked.clone(),
                );
            } else {
                let d = StatDelta {
                    nlink_add: Some(1),
                    ctime: Some(now),
                    ..StatDelta::default()
                };
                self.upsert_stat(b, ino, &Loc::Inode, &d)?;
            }
            b.put(self.t.dentry, newkey.clone(), linked);
            let pd = StatDelta {
                mtime: Some(now),
                ctime: Some(now),
                ..StatDelta::default()
            };
            self.upsert_stat(txn.batch(), newparent, &nploc, &pd)?;
            Ok(inode)
        })?;
        self.names.insert(newparent, newname);
        self.inodes.pin(ino, Loc::Inode, kind);
        self.attr_of(ino, &inode)
    }

    /// Removes the name `name` (not a directory) from `parent`.
    pub fn unlink(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        self.remove_name(parent, name, false)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        self.remove_name(parent, name, true)
    }

    fn remove_name(&self, parent: InodeId, name: &[u8], dir: bool) -> FsResult<()> {
        validate_name(name)?;
        self.require_dir(parent)?;
        let key = schema::named_key(parent, name);
        let now = Timespec::now();
        // One read of the entry: the victim's id (which names the lock to take) comes from the
        // transaction's own read, and the lock is taken after it. A change to the entry between
        // the read and the commit fails the commit (the read is validated) and the body runs
        // again, so the read cannot be stale when it counts.
        // A removal frees space, so a full store admits it (format.md, B12).
        let mut attempt = 0;
        let (id, fate, _g, parent_before, pd) = transact_opts(&*self.kv, &self.policy, |txn| {
            attempt += 1;
            let (d, g) = match self.known_inline_file(parent, name, dir) {
                Some(known) => known,
                None => {
                    let Some(v) = txn.get(self.t.dentry, &key)? else {
                        return Err(FsError::NotFound);
                    };
                    let d = Dentry::decode(&v)?;
                    check_kind(&d, dir)?;
                    let g = self.locks.lock(&[parent, d.id()]);
                    (d, g)
                }
            };
            let id = d.id();
            let (ploc, _) = self.loc(parent)?;
            txn.batch().delete(self.t.dentry, key.clone());
            let mut pd = StatDelta {
                mtime: Some(now),
                ctime: Some(now),
                ..StatDelta::default()
            };
            if dir {
                pd.nlink_add = Some(-1);
                self.remove_dir_keys(txn, id)?;
            }
            // Under the parent's lock: kept current across the commit, as `make_node` does.
            let parent_before = self.upsert_stat(txn.batch(), parent, &ploc, &pd)?;
            let (fate, freed) = self.drop_link(txn, attempt, d, now)?;
            Ok((
                (id, fate, g, parent_before, pd),
                WriteOptions::NO_SYNC.freeing(freed),
            ))
        })?;
        self.stat_applied(parent, parent_before, &pd);
        self.names.remove(parent, name);
        self.dirents.forget(parent, name);
        if dir {
            self.names.drop_dir(id);
        }
        self.settle(id, fate);
        Ok(())
    }

    /// For unlink of a file the kernel has just looked up (rm -r, F9b): the entry `name` in
    /// `parent` as this mount knows it exactly — a regular file whose stat is inline there and
    /// mirrored — with the locks of `parent` and the file taken, so the removal need not read
    /// the entry again. `None` (no lock held): read it. Never on a shared store, where another
    /// mount may have changed the entry.
    fn known_inline_file(
        &self,
        parent: InodeId,
        name: &[u8],
        dir: bool,
    ) -> Option<(Dentry, crate::locks::Held<'_>)> {
        if dir {
            return None;
        }
        let id = self.inodes.name_hint(parent, name)?;
        let g = self.locks.lock(&[parent, id]);
        // Checked under both locks: every move of `id`'s entry holds them.
        let stat = self.inodes.inline_file_at(id, parent, name)?;
        let inode = Inode {
            stat,
            // A regular file keeps no payload in its record (its data is in `fs.data`).
            payload: Vec::new(),
        };
        Some((Dentry::Inline { id, inode }, g))
    }

    /// Appends the removal of empty directory `id`'s own keys; fails if it has entries. The
    /// caller holds `id`'s lock, which every change of a name in `id` also holds, so a
    /// complete name set in the cache answers the emptiness check without the scan (a scan
    /// costs the engine a leaf's worth of rows; docs/fs-design.md, "CPU cost per request").
    pub(crate) fn remove_dir_keys(&self, txn: &mut dyn KvTxn, id: InodeId) -> FsResult<()> {
        let (lo, hi) = schema::id_prefix_range(id);
        match self.names.is_empty(id) {
            Some(true) => {}
            Some(false) => return Err(FsError::NotEmpty),
            None => {
                let children = txn.scan(
                    self.t.dentry,
                    &KeyRange::half_open(&lo, &hi),
                    fern_kv::Direction::Forward,
                    1,
                )?;
                if !children.is_empty() {
                    return Err(FsError::NotEmpty);
                }
            }
        }
        txn.batch().delete(self.t.dirparent, schema::id_key(id));
        if !self.inodes.xattr_free(id) {
            txn.batch().delete_range(self.t.xattr, lo, hi);
        }
        Ok(())
    }

    /// Appends what losing the name `d` means for its inode (the entry deletion itself is the
    /// caller's; for a directory, so is [`Fs::remove_dir_keys`]), and how many data bytes that
    /// frees. The caller holds the inode's stripe, so its open count cannot change. A file or
    /// directory that is still open (an `open` or `opendir` handle) becomes an orphan with no
    /// links: its handles keep working (fstat gives nlink 0; an emptied directory lists
    /// nothing) until the last close frees it.
    pub(crate) fn drop_link(
        &self,
        txn: &mut dyn KvTxn,
        attempt: u32,
        d: Dentry,
        now: Timespec,
    ) -> FsResult<(Fate, u64)> {
        let id = d.id();
        // Its stat changes (count, ctime) or goes; the caller holds `id`'s lock.
        self.inodes.drop_stat(id);
        let linked = matches!(d, Dentry::Linked { .. });
        let rows = InodeRows {
            xattrs: !self.inodes.xattr_free(id),
            records: linked,
        };
        // On a shared store another mount may hold the file open: its registration, read in
        // this transaction, counts as an open here (shared.rs). That read makes the
        // transaction conflict with every open and close of the file elsewhere, and a rename
        // over a file other mounts kept opening starved (EAGAIN). So from attempt
        // `READ_REGISTRATIONS_ATTEMPTS + 1` on, the file becomes an orphan without the read,
        // and `settle` frees it right after the commit when no session holds it
        // (shared.rs `free_if_unheld`).
        let open_here = self.inodes.with(id, |k| k.opens > 0).unwrap_or(false);
        let unchecked = !open_here
            && d.kind()? != FileType::Directory
            && self.is_shared()
            && attempt > READ_REGISTRATIONS_ATTEMPTS;
        let open = open_here
            || unchecked
            || (d.kind()? != FileType::Directory && self.held_open(&*txn, id, None)?);
        let mut inode = match d {
            Dentry::Inline { inode, .. } => inode,
            Dentry::Linked { .. } => self.read_record(&*txn, id)?,
        };
        let b = txn.batch();
        // A directory's count is 2 + subdirectories, never other names: it has only one.
        if inode.stat.nlink > 1 && inode.stat.kind()? != FileType::Directory {
            let delta = StatDelta {
                nlink_add: Some(-1),
                ctime: Some(now),
                ..StatDelta::default()
            };
            self.upsert_stat(b, id, &Loc::Inode, &delta)?;
            return Ok((Fate::StillLinked, 0));
        }
        if open {
            inode.stat.nlink = 0;
            inode.stat.ctime = now;
            b.put(self.t.inode, schema::id_key(id), inode.encode_record());
            b.put(self.t.orphan, schema::id_key(id), Vec::new());
            return Ok((Fate::Orphaned { unchecked }, 0));
        }
        // A directory's own keys (dirparent, xattrs) went with `remove_dir_keys`, and its stat
        // with its entry; a file still has data and perhaps an inode record.
        if inode.stat.kind()? != FileType::Directory {
            self.free_file(b, id, Some(inode.stat.size), rows)?;
            return Ok((Fate::Freed, inode.stat.size));
        }
        if linked {
            // A directory made on a shared store keeps its stat in the inode tree.
            b.delete(self.t.inode, schema::id_key(id));
        }
        Ok((Fate::Freed, 0))
    }

    /// Updates the inode table after a committed removal; on a shared store, frees an orphan
    /// that no mount holds open (the caller still holds the inode's lock).
    pub(crate) fn settle(&self, id: InodeId, fate: Fate) {
        match fate {
            Fate::StillLinked => {}
            Fate::Orphaned { unchecked } => {
                self.inodes.update(id, |k| {
                    k.loc = Loc::Inode;
                    k.orphan = true;
                });
                if unchecked && self.free_if_unheld(id) {
                    self.inodes.relocate(id, Loc::Gone);
                    self.inodes.drop_if_unused(id);
                }
            }
            Fate::Freed => {
                self.inodes.relocate(id, Loc::Gone);
                self.inodes.drop_if_unused(id);
            }
        }
    }

    /// The entry `name` in `parent`, straight from the store.
    pub(crate) fn peek(&self, parent: InodeId, name: &[u8]) -> FsResult<Option<Dentry>> {
        match self
            .kv
            .get(self.t.dentry, &schema::named_key(parent, name))?
        {
            Some(v) => Ok(Some(Dentry::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Where the inode of entry `d` (at parent/name) lives, and the inode itself.
    pub(crate) fn resolve(
        &self,
        r: &dyn KvRead,
        parent: InodeId,
        name: &[u8],
        d: Dentry,
    ) -> FsResult<(Loc, Inode)> {
        match d {
            Dentry::Inline { inode, .. } => Ok((
                Loc::Entry {
                    parent,
                    name: name.to_vec(),
                },
                inode,
            )),
            Dentry::Linked { id, .. } => Ok((Loc::Inode, self.read_record(r, id)?)),
        }
    }

    /// Where directory `dir` (already checked to be one) keeps its stat, unless it has been
    /// removed while open: nothing may be created in a removed directory (ENOENT, as the
    /// kernel's `IS_DEADDIR` check answers). The caller holds `dir`'s lock.
    pub(crate) fn live_dir(&self, dir: InodeId) -> FsResult<Loc> {
        if self.inodes.with(dir, |k| k.orphan) == Some(true) {
            return Err(FsError::NotFound);
        }
        Ok(self.loc(dir)?.0)
    }

    /// Fails unless `ino` is a directory this mount knows.
    pub(crate) fn require_dir(&self, ino: InodeId) -> FsResult<()> {
        match self.loc(ino)? {
            (_, FileType::Directory) => Ok(()),
            _ => Err(FsError::NotDir),
        }
    }
}

fn check_kind(d: &Dentry, want_dir: bool) -> FsResult<()> {
    match (d.kind()? == FileType::Directory, want_dir) {
        (true, false) => Err(FsError::IsDir),
        (false, true) => Err(FsError::NotDir),
        _ => Ok(()),
    }
}
