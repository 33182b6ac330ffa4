//! rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE. It owns the rules of moving names:
//! one entry is deleted and one written (two for an exchange) whatever the size of the moved
//! subtree, because children are keyed by their directory's id, which never changes. It must
//! never copy or rewrite anything under a moved directory.

use fern_kv::{transact, KvRead, WriteOptions};

use crate::attr::{FileType, Stat, Timespec};
use crate::cache::Loc;
use crate::error::{FsError, FsResult};
use crate::fs::{validate_name, Fs};
use crate::ids::InodeId;
use crate::perm::Cred;
use crate::record::{Dentry, Inode};
use crate::schema;
use crate::upsert::StatDelta;

/// Fail if the target exists (`RENAME_NOREPLACE`).
pub const RENAME_NOREPLACE: u32 = 1;
/// Swap source and target atomically (`RENAME_EXCHANGE`).
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a character device 0/0) at the source name (`RENAME_WHITEOUT`, for
/// overlayfs).
pub const RENAME_WHITEOUT: u32 = 4;

impl Fs {
    /// Renames `parent/name` to `newparent/newname`; `flags` is 0 or one of
    /// [`RENAME_NOREPLACE`], [`RENAME_EXCHANGE`], optionally with [`RENAME_WHITEOUT`] (whose
    /// whiteout root owns; see [`Fs::rename_as`]).
    pub fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        newparent: InodeId,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.rename_as(&Cred::root(), parent, name, newparent, newname, flags)
    }

    /// [`Fs::rename`] on behalf of `cred`, who owns the whiteout that [`RENAME_WHITEOUT`]
    /// leaves at the source name (a character device 0/0, mode 0, as Linux file systems make
    /// it; its group follows a set-group-id parent). The whiteout appears in the same atomic
    /// step as the move. Not with RENAME_EXCHANGE (EINVAL), as in Linux.
    pub fn rename_as(
        &self,
        cred: &Cred,
        parent: InodeId,
        name: &[u8],
        newparent: InodeId,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        validate_name(name)?;
        validate_name(newname)?;
        let noreplace = flags & RENAME_NOREPLACE != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        let whiteout = flags & RENAME_WHITEOUT != 0;
        let known = RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT;
        if flags & !known != 0 || (noreplace && exchange) || (whiteout && exchange) {
            return Err(FsError::Invalid);
        }
        // The whiteout's id is reserved outside the transaction (a retry reuses it; an id
        // that ends up unused is skipped, as after a crash).
        let whiteout_id = if whiteout {
            Some(self.ids.alloc(&*self.kv, &self.t, &self.policy)?)
        } else {
            None
        };
        self.require_dir(parent)?;
        self.require_dir(newparent)?;
        let src_key = schema::named_key(parent, name);
        let dst_key = schema::named_key(newparent, newname);
        let now = Timespec::now();
        // One read of each entry, inside the transaction; the locks (named by the ids read)
        // are taken after it. A change between the reads and the commit fails the commit (the
        // reads are validated) and the body runs again — the same guarantee the old "peek, lock,
        // read again, compare" loop gave, with half the reads.
        let mut attempt = 0;
        let outcome = transact(&*self.kv, &self.policy, WriteOptions::NO_SYNC, |txn| {
            attempt += 1;
            let cur_src = match txn.get(self.t.dentry, &src_key)? {
                Some(v) => Dentry::decode(&v)?,
                None => return Err(FsError::NotFound),
            };
            let cur_dst = txn
                .get(self.t.dentry, &dst_key)?
                .map(|v| Dentry::decode(&v))
                .transpose()?;
            if let Some(d) = &cur_dst {
                // Same entry, or two links of one inode: POSIX says do nothing.
                if src_key == dst_key || d.id() == cur_src.id() {
                    return if noreplace {
                        Err(FsError::Exists)
                    } else {
                        Ok(None)
                    };
                }
            }
            let src = cur_src.clone();
            let dst = cur_dst.clone();
            let mut lockset = vec![parent, newparent, src.id()];
            lockset.extend(dst.as_ref().map(Dentry::id));
            let guard = self.locks.lock(&lockset);
            let (ploc, _) = self.loc(parent)?;
            let nploc = self.live_dir(newparent)?;
            if newparent != parent {
                // The source's parent is alive: it held the source entry just read.
                self.dir_alive(&*txn, newparent, &nploc)?;
            }
            let src_dir = cur_src.kind()? == FileType::Directory;
            let dst_dir = match &cur_dst {
                Some(d) => d.kind()? == FileType::Directory,
                None => false,
            };
            if src_dir && parent != newparent && self.is_ancestor(&*txn, src.id(), newparent)? {
                return Err(FsError::Invalid);
            }
            let mut p_nlink = 0i32;
            let mut q_nlink = 0i32;
            let mut dst_fate = None;
            if exchange {
                let Some(cur_dst) = cur_dst else {
                    return Err(FsError::NotFound);
                };
                if dst_dir
                    && parent != newparent
                    && self.is_ancestor(&*txn, cur_dst.id(), parent)?
                {
                    return Err(FsError::Invalid);
                }
                self.move_entry(txn.batch(), &cur_dst, &src_key, now)?;
                if dst_dir {
                    txn.batch().put(
                        self.t.dirparent,
                        schema::id_key(cur_dst.id()),
                        parent.0.to_be_bytes().to_vec(),
                    );
                }
                p_nlink += i32::from(dst_dir) - i32::from(src_dir);
                q_nlink += i32::from(src_dir) - i32::from(dst_dir);
            } else {
                if let Some(cur_dst) = cur_dst {
                    if noreplace {
                        return Err(FsError::Exists);
                    }
                    match (src_dir, dst_dir) {
                        (true, false) => return Err(FsError::NotDir),
                        (false, true) => return Err(FsError::IsDir),
                        _ => {}
                    }
                    if dst_dir {
                        self.remove_dir_keys(txn, cur_dst.id())?;
                        q_nlink -= 1;
                    }
                    let id = cur_dst.id();
                    dst_fate = Some((id, self.drop_link(txn, attempt, cur_dst, now)?.0, dst_dir));
                }
                if let Some(wid) = whiteout_id {
                    let from = self.dir_inherit(parent)?;
                    let mode = FileType::CharDevice.mode_bits();
                    let (gid, got) = crate::owner::new_owner(cred, &from, mode);
                    let inode = Inode {
                        stat: Stat::new(got.mode, cred.uid, gid, 1, now),
                        payload: Vec::new(),
                    };
                    let entry = Dentry::Inline { id: wid, inode };
                    txn.batch()
                        .put(self.t.dentry, src_key.clone(), entry.encode());
                } else {
                    txn.batch().delete(self.t.dentry, src_key.clone());
                }
                if src_dir {
                    p_nlink -= 1;
                    q_nlink += 1;
                }
            }
            self.move_entry(txn.batch(), &cur_src, &dst_key, now)?;
            if src_dir {
                txn.batch().put(
                    self.t.dirparent,
                    schema::id_key(src.id()),
                    newparent.0.to_be_bytes().to_vec(),
                );
            }
            let delta = |n: i32| StatDelta {
                mtime: Some(now),
                ctime: Some(now),
                nlink_add: (n != 0).then_some(n),
                ..StatDelta::default()
            };
            // Each parent's changed stat, with its mirrored value before (read under its
            // lock, which `guard` holds): kept current across the commit, as creates do.
            let parents = if parent == newparent {
                vec![(parent, &ploc, delta(p_nlink + q_nlink))]
            } else {
                vec![
                    (parent, &ploc, delta(p_nlink)),
                    (newparent, &nploc, delta(q_nlink)),
                ]
            };
            let mut stats = Vec::with_capacity(parents.len());
            for (dir, loc, d) in parents {
                let before = self.upsert_stat(txn.batch(), dir, loc, &d)?;
                stats.push((dir, before, d));
            }
            Ok(Some((cur_src, dst, dst_fate, guard, stats)))
        })?;
        let Some((moved, dst, dst_fate, _guard, stats)) = outcome else {
            return Ok(());
        };
        for (dir, before, d) in stats {
            self.stat_applied(dir, before, &d);
        }
        // Both names now lead elsewhere (or nowhere); still under both parents' locks.
        self.dirents.forget(parent, name);
        self.dirents.forget(newparent, newname);
        self.inodes
            .relocate(moved.id(), loc_after(&moved, newparent, newname));
        if exchange {
            if let Some(d) = &dst {
                self.inodes.relocate(d.id(), loc_after(d, parent, name));
            }
        } else {
            if whiteout_id.is_none() {
                self.names.remove(parent, name);
            }
            self.names.insert(newparent, newname);
            if let Some((id, fate, was_dir)) = dst_fate {
                if was_dir {
                    self.names.drop_dir(id);
                }
                self.settle(id, fate);
            }
        }
        Ok(())
    }

    /// Writes entry `d` under `key`, with the moved inode's ctime set to `now`.
    fn move_entry(
        &self,
        b: &mut fern_kv::WriteBatch,
        d: &Dentry,
        key: &[u8],
        now: Timespec,
    ) -> FsResult<()> {
        // Its ctime changes; the caller holds the moved inode's lock.
        self.inodes.drop_stat(d.id());
        match d {
            Dentry::Inline { id, inode } => {
                let mut inode = inode.clone();
                inode.stat.ctime = now;
                b.put(
                    self.t.dentry,
                    key.to_vec(),
                    Dentry::Inline { id: *id, inode }.encode(),
                );
            }
            Dentry::Linked { id, .. } => {
                b.put(self.t.dentry, key.to_vec(), d.encode());
                let delta = StatDelta {
                    ctime: Some(now),
                    ..StatDelta::default()
                };
                self.upsert_stat(b, *id, &Loc::Inode, &delta)?;
            }
        }
        Ok(())
    }

    /// True when directory `anc` is `dir` or one of its ancestors (walks `dirparent`).
    pub(crate) fn is_ancestor(
        &self,
        r: &dyn KvRead,
        anc: InodeId,
        mut dir: InodeId,
    ) -> FsResult<bool> {
        // Depth is bounded by the number of directories; this bound only stops a corrupt cycle.
        for _ in 0..(1u32 << 20) {
            if dir == anc {
                return Ok(true);
            }
            if dir == InodeId::ROOT {
                return Ok(false);
            }
            dir = match r.get(self.t.dirparent, &schema::id_key(dir))? {
                Some(v) => {
                    InodeId(u64::from_be_bytes(v.as_slice().try_into().map_err(
                        |_| FsError::corrupt("dirparent value is not 8 bytes"),
                    )?))
                }
                None => {
                    return Err(FsError::corrupt(format!(
                        "directory {} has no parent record",
                        dir.0
                    )))
                }
            };
        }
        Err(FsError::corrupt("dirparent chain does not reach the root"))
    }

    /// The parent of directory `dir` ("..").
    pub fn parent_of(&self, dir: InodeId) -> FsResult<InodeId> {
        match self.kv.get(self.t.dirparent, &schema::id_key(dir))? {
            Some(v) => Ok(InodeId(u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| FsError::corrupt("dirparent value is not 8 bytes"))?,
            ))),
            None => Err(FsError::NotFound),
        }
    }
}

fn loc_after(d: &Dentry, parent: InodeId, name: &[u8]) -> Loc {
    match d {
        Dentry::Inline { .. } => Loc::Entry {
            parent,
            name: name.to_vec(),
        },
        Dentry::Linked { .. } => Loc::Inode,
    }
}
