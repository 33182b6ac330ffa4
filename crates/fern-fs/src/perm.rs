//! Permission checks as pure functions of attributes (and an access ACL, when the file has one)
//! and a caller's credentials, for the adapter (FUSE without `default_permissions`) or the
//! library API to call before an operation ([`crate::Fs::access`] reads the ACL and calls
//! [`check_access_acl`]). It owns the POSIX rules (owner/group/other classes, ACL entries, root,
//! sticky directories, who may chmod/chown/utime); it must never read the store or change
//! anything.

use crate::acl::Acl;
use crate::attr::{Attr, FileType, SetAttr, TimeSet};
use crate::error::{FsError, FsResult};

/// Read permission.
pub const MAY_READ: u32 = 4;
/// Write permission.
pub const MAY_WRITE: u32 = 2;
/// Execute / search permission.
pub const MAY_EXEC: u32 = 1;

/// Who is asking.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// The caller's umask: removed from the permission bits of what it creates, unless the
    /// directory has a default ACL (then the ACL decides, as POSIX.1e says). 0 when the caller
    /// has already applied it.
    pub umask: u32,
}

impl Cred {
    /// The superuser.
    pub fn root() -> Cred {
        Cred::default()
    }

    /// A user with one group.
    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
            umask: 0,
        }
    }

    /// True when the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Checks that `cred` may access `attr` with `mask` (a combination of `MAY_*`), by the mode
/// bits alone (a file without an access ACL).
pub fn check_access(attr: &Attr, cred: &Cred, mask: u32) -> FsResult<()> {
    check_access_acl(attr, None, cred, mask)
}

/// Checks that `cred` may access `attr`, whose access ACL is `acl`, with `mask`: root as in
/// [`check_access`], the owner by the owner bits, everyone else by the ACL's entries (the
/// kernel's `posix_acl_permission`) when there is one, by the mode's classes otherwise.
pub fn check_access_acl(attr: &Attr, acl: Option<&Acl>, cred: &Cred, mask: u32) -> FsResult<()> {
    if cred.uid == 0 {
        // Root bypasses everything but execute of a file nobody may execute.
        let exec_denied =
            mask & MAY_EXEC != 0 && attr.kind != FileType::Directory && attr.perm & 0o111 == 0;
        return if exec_denied {
            Err(FsError::Access)
        } else {
            Ok(())
        };
    }
    if let Some(acl) = acl.filter(|_| cred.uid != attr.uid) {
        return if acl.permits(attr.uid, attr.gid, cred, mask) {
            Ok(())
        } else {
            Err(FsError::Access)
        };
    }
    let class = if cred.uid == attr.uid {
        attr.perm >> 6
    } else if cred.in_group(attr.gid) {
        attr.perm >> 3
    } else {
        attr.perm
    } & 7;
    if class & mask == mask {
        Ok(())
    } else {
        Err(FsError::Access)
    }
}

/// Checks that `cred` may remove or rename away `victim` from directory `dir`: write and
/// search on the directory, and in a sticky directory ownership of the directory or the victim.
pub fn check_delete(dir: &Attr, victim: &Attr, cred: &Cred) -> FsResult<()> {
    check_access(dir, cred, MAY_WRITE | MAY_EXEC)?;
    let sticky = dir.perm & 0o1000 != 0;
    if sticky && cred.uid != 0 && cred.uid != dir.uid && cred.uid != victim.uid {
        return Err(FsError::Perm);
    }
    Ok(())
}

/// Checks that `cred` may apply `sa` to `attr`.
pub fn check_setattr(attr: &Attr, cred: &Cred, sa: &SetAttr) -> FsResult<()> {
    let root = cred.uid == 0;
    let owner = root || cred.uid == attr.uid;
    if sa.mode.is_some() && !owner {
        return Err(FsError::Perm);
    }
    if let Some(uid) = sa.uid {
        if !root && uid != attr.uid {
            return Err(FsError::Perm);
        }
    }
    if let Some(gid) = sa.gid {
        if !root && (cred.uid != attr.uid || !cred.in_group(gid)) && gid != attr.gid {
            return Err(FsError::Perm);
        }
    }
    let explicit_time =
        matches!(sa.atime, Some(TimeSet::At(_))) || matches!(sa.mtime, Some(TimeSet::At(_)));
    if explicit_time && !owner {
        return Err(FsError::Perm);
    }
    let now_time = matches!(sa.atime, Some(TimeSet::Now)) || matches!(sa.mtime, Some(TimeSet::Now));
    if now_time && !owner {
        check_access(attr, cred, MAY_WRITE)?;
    }
    if sa.size.is_some() {
        check_access(attr, cred, MAY_WRITE)?;
    }
    Ok(())
}
