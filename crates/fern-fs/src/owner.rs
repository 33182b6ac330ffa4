//! Ownership rules that depend on who acts and where: the group and set-group-id bit of a new
//! node in a set-group-id directory, and the clearing of set-user-id / set-group-id when a
//! non-privileged caller writes or truncates a file (Linux's `inode_init_owner`,
//! `mode_strip_sgid` and `should_remove_suid`). It owns the small per-mount table of directory
//! set-group-id state that lets a create decide without reading its parent; it must never be
//! the only record of anything (a miss reads the parent's stat).

use foldhash::HashMap;

use parking_lot::Mutex;

use crate::attr::{FileType, Stat};
use crate::error::FsResult;
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::perm::Cred;

/// Set-group-id bit.
pub const S_ISGID: u32 = 0o2000;
/// Group-execute bit.
const S_IXGRP: u32 = 0o010;

/// Most directories remembered; a miss costs one read of the parent's stat, never correctness.
const MAX_DIRS: usize = 65_536;

/// For each directory this mount has seen: `Some(gid)` when it has S_ISGID set (new nodes in
/// it take `gid`), `None` when it has not. Exact under the single-writer rule: a directory's
/// mode and group change only through [`Fs::setattr`], which updates the entry under the
/// directory's inode lock, the same lock a create in that directory holds. Ids are never
/// reused, so entries of removed directories are merely dead weight until evicted.
#[derive(Default)]
pub struct DirGroups {
    map: Mutex<HashMap<InodeId, Option<u32>>>,
}

impl DirGroups {
    /// What is known about `dir`: `None` when not remembered.
    pub fn get(&self, dir: InodeId) -> Option<Option<u32>> {
        self.map.lock().get(&dir).copied()
    }

    /// Records `dir`'s current stat.
    pub fn note(&self, dir: InodeId, stat: &Stat) {
        let v = (stat.mode & S_ISGID != 0).then_some(stat.gid);
        let mut m = self.map.lock();
        if m.len() >= MAX_DIRS && !m.contains_key(&dir) {
            // Forgetting an arbitrary directory only costs its next create one read.
            if let Some(victim) = m.keys().next().copied() {
                m.remove(&victim);
            }
        }
        m.insert(dir, v);
    }
}

impl Fs {
    /// The group and mode of a new node of `mode` created by `cred` in directory `parent`.
    /// The caller holds `parent`'s inode lock (so the parent's mode cannot change meanwhile).
    ///
    /// In a set-group-id directory the node takes the directory's group, and a new directory
    /// also gets S_ISGID. A new non-directory that is set-group-id and group-executable loses
    /// S_ISGID when its creator is neither root nor a member of the group it would carry (it
    /// could otherwise make a set-group-id program for a group it is not in).
    pub(crate) fn new_owner(
        &self,
        cred: &Cred,
        parent: InodeId,
        mut mode: u32,
    ) -> FsResult<(u32, u32)> {
        let inherited = match self.dir_groups.get(parent) {
            Some(v) => v,
            None => {
                let stat = self.read_inode(parent)?.stat;
                self.dir_groups.note(parent, &stat);
                (stat.mode & S_ISGID != 0).then_some(stat.gid)
            }
        };
        let Some(gid) = inherited else {
            return Ok((cred.gid, mode));
        };
        if FileType::from_mode(mode) == Some(FileType::Directory) {
            mode |= S_ISGID;
        } else if mode & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP)
            && cred.uid != 0
            && !cred.in_group(gid)
        {
            mode &= !S_ISGID;
        }
        Ok((gid, mode))
    }
}

/// Whether a write or truncate by `cred` must clear the file's set-id bits: every caller but
/// root (CAP_FSETID), the owner included, as Linux does. The clearing itself is part of the
/// blind stat upsert (`StatDelta::kill_suid`), so the write still reads nothing.
pub(crate) fn kills_suid(cred: &Cred) -> bool {
    cred.uid != 0
}
