//! What a new node inherits from where it is created, and the set-id rules that depend on who
//! acts: the group and set-group-id bit of a new node in a set-group-id directory, its mode
//! and ACLs under a directory's default ACL, and the clearing of set-user-id / set-group-id
//! when a non-privileged caller writes, truncates or chowns a file (Linux's
//! `inode_init_owner`, `mode_strip_sgid`, `posix_acl_create` and `should_remove_suid`). It
//! owns the small per-mount table of directory state (set-group-id, default ACL) that lets a
//! create decide without reading its parent; it must never be the only record of anything (a
//! miss reads the parent's stat and default ACL).

use std::sync::Arc;

use foldhash::HashMap;

use parking_lot::Mutex;

use crate::acl::{self, Acl};
use crate::attr::{FileType, Stat};
use crate::error::{FsError, FsResult};
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::perm::Cred;
use crate::schema;

/// Set-group-id bit.
pub const S_ISGID: u32 = 0o2000;
/// Group-execute bit.
const S_IXGRP: u32 = 0o010;

/// Most directories remembered; a miss costs one read of the parent's stat and one of its
/// default ACL, never correctness.
const MAX_DIRS: usize = 65_536;

/// What a directory passes on to the nodes created in it.
#[derive(Clone, Debug, Default)]
pub struct DirInherit {
    /// `Some(gid)` when the directory has S_ISGID (new nodes take `gid`).
    pub sgid: Option<u32>,
    /// The directory's default ACL.
    pub default_acl: Option<Arc<Acl>>,
}

/// For each directory this mount has seen, what it passes on ([`DirInherit`]). Exact under
/// the single-writer rule: a directory's mode, group and default ACL change only through
/// [`Fs::setattr`] and the ACL setters, which update the entry under the directory's inode
/// lock, the same lock a create in that directory holds. Ids are never reused, so entries of
/// removed directories are merely dead weight until evicted.
#[derive(Default)]
pub struct DirTable {
    map: Mutex<HashMap<InodeId, DirInherit>>,
}

impl DirTable {
    /// What is known about `dir`: `None` when not remembered.
    pub fn get(&self, dir: InodeId) -> Option<DirInherit> {
        self.map.lock().get(&dir).cloned()
    }

    /// Records everything about `dir`.
    pub fn put(&self, dir: InodeId, v: DirInherit) {
        let mut m = self.map.lock();
        if m.len() >= MAX_DIRS && !m.contains_key(&dir) {
            // Forgetting an arbitrary directory only costs its next create two reads.
            if let Some(victim) = m.keys().next().copied() {
                m.remove(&victim);
            }
        }
        m.insert(dir, v);
    }

    /// `dir`'s stat changed (mode or group): keeps a remembered entry in step.
    pub fn note_stat(&self, dir: InodeId, stat: &Stat) {
        if let Some(e) = self.map.lock().get_mut(&dir) {
            e.sgid = (stat.mode & S_ISGID != 0).then_some(stat.gid);
        }
    }

    /// `dir`'s default ACL changed: keeps a remembered entry in step.
    pub fn note_default_acl(&self, dir: InodeId, acl: Option<&Acl>) {
        if let Some(e) = self.map.lock().get_mut(&dir) {
            e.default_acl = acl.map(|a| Arc::new(a.clone()));
        }
    }
}

impl Fs {
    /// What directory `dir` passes on; the caller holds `dir`'s inode lock.
    pub(crate) fn dir_inherit(&self, dir: InodeId) -> FsResult<DirInherit> {
        if let Some(v) = self.dir_table.get(dir) {
            return Ok(v);
        }
        let stat = self.read_inode(dir)?.stat;
        let key = schema::named_key(dir, acl::ACL_DEFAULT);
        let default_acl = match self.kv.get(self.t.xattr, &key)? {
            // A stored value this format did not write is corruption, not the caller's EINVAL.
            Some(v) => Acl::decode(&v)
                .map_err(|_| FsError::corrupt(format!("default ACL of directory {}", dir.0)))?
                .map(Arc::new),
            None => None,
        };
        let v = DirInherit {
            sgid: (stat.mode & S_ISGID != 0).then_some(stat.gid),
            default_acl,
        };
        self.dir_table.put(dir, v.clone());
        Ok(v)
    }
}

/// The group, mode and ACLs of a new node of `mode` created by `cred` in a directory that
/// passes on `from`.
///
/// In a set-group-id directory the node takes the directory's group, and a new directory
/// also gets S_ISGID. A new non-directory that is set-group-id and group-executable loses
/// S_ISGID when its creator is neither root nor a member of the group it would carry (it
/// could otherwise make a set-group-id program for a group it is not in). Permission bits
/// and ACLs follow the directory's default ACL, or the creator's umask without one
/// ([`acl::inherit`]).
pub(crate) fn new_owner(cred: &Cred, from: &DirInherit, mode: u32) -> (u32, acl::Inherited) {
    let is_dir = FileType::from_mode(mode) == Some(FileType::Directory);
    let mut got = acl::inherit(from.default_acl.as_deref(), mode, cred.umask, is_dir);
    let Some(gid) = from.sgid else {
        return (cred.gid, got);
    };
    if is_dir {
        got.mode |= S_ISGID;
    } else if got.mode & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP)
        && cred.uid != 0
        && !cred.in_group(gid)
    {
        got.mode &= !S_ISGID;
    }
    (gid, got)
}

/// Set-user-id bit.
pub const S_ISUID: u32 = 0o4000;

/// The set-id bits that a change by an unprivileged caller (a write or truncate without
/// CAP_FSETID, any chown of a non-directory) removes from `mode`, as Linux does
/// (`should_remove_suid`, `setattr_should_drop_sgid`): set-user-id always; set-group-id only
/// when group-executable, because without group-execute it marks mandatory locking, not a
/// privilege. The one statement of this rule: the blind stat upsert (`StatDelta`), its merge,
/// and fern-fuse's KILLPRIV handling all call it.
pub fn setid_bits_to_clear(mode: u32) -> u32 {
    let mut kill = mode & S_ISUID;
    if mode & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP) {
        kill |= S_ISGID;
    }
    kill
}

/// Whether a write or truncate by `cred` must clear the file's set-id bits: every caller but
/// root (CAP_FSETID), the owner included, as Linux does. The clearing itself is part of the
/// blind stat upsert (`StatDelta::kill_suid`), so the write still reads nothing.
pub(crate) fn kills_suid(cred: &Cred) -> bool {
    cred.uid != 0
}

#[cfg(test)]
mod tests {
    use super::setid_bits_to_clear;

    #[test]
    fn setgid_goes_only_when_group_executable() {
        assert_eq!(setid_bits_to_clear(0o4755), 0o4000);
        assert_eq!(setid_bits_to_clear(0o6755), 0o6000);
        assert_eq!(
            setid_bits_to_clear(0o2745),
            0,
            "sgid without g+x is mandatory locking"
        );
        assert_eq!(setid_bits_to_clear(0o6745), 0o4000);
        assert_eq!(setid_bits_to_clear(0o0777), 0);
        // The file type bits do not matter.
        assert_eq!(setid_bits_to_clear(0o016555), 0o6000);
    }
}
