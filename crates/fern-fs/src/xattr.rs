//! Extended attributes, keyed (inode id, name) in the `xattr` tree, so listing is one prefix
//! scan and deleting an inode's attributes is one range delete. It owns the CREATE/REPLACE
//! rules and size limits, and routes the two POSIX ACL attributes through their rules (an
//! access ACL is validated, sets the mode, and is stored only when the mode cannot say it
//! all; a default ACL exists only on directories; see `acl.rs`). It must never store an
//! attribute for an inode this mount does not know.

use fern_kv::{transact, Direction, KeyRange, WriteBatch, WriteOptions};

use crate::acl::{Acl, ACL_ACCESS, ACL_DEFAULT};
use crate::attr::{FileType, Timespec};
use crate::error::{FsError, FsResult};
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::schema;
use crate::upsert::StatDelta;

/// setxattr: fail if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// setxattr: fail if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;
/// Longest attribute name (Linux XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest attribute value (Linux XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;

impl Fs {
    /// The value of attribute `name` of `ino`.
    pub fn getxattr(&self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>> {
        check_name(name)?;
        self.loc(ino)?;
        if self.inodes.xattr_free(ino) {
            return Err(FsError::NoData);
        }
        self.kv
            .get(self.t.xattr, &schema::named_key(ino, name))?
            .ok_or(FsError::NoData)
    }

    /// Sets attribute `name` of `ino`; `flags` is 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        check_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(FsError::TooBig);
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(FsError::Invalid);
        }
        if name == ACL_ACCESS || name == ACL_DEFAULT {
            return self.set_acl(ino, name, value, flags);
        }
        let _g = self.locks.lock(&[ino]);
        let (loc, _) = self.loc(ino)?;
        let key = schema::named_key(ino, name);
        let now = Timespec::now();
        self.inodes.update(ino, |k| k.xattr_free = false);
        transact(&*self.kv, &self.policy, WriteOptions::NO_SYNC, |txn| {
            if flags != 0 {
                let exists = txn.get(self.t.xattr, &key)?.is_some();
                if flags == XATTR_CREATE && exists {
                    return Err(FsError::Exists);
                }
                if flags == XATTR_REPLACE && !exists {
                    return Err(FsError::NoData);
                }
            }
            txn.batch().put(self.t.xattr, key.clone(), value.to_vec());
            self.upsert_stat(
                txn.batch(),
                ino,
                &loc,
                &StatDelta {
                    ctime: Some(now),
                    ..StatDelta::default()
                },
            )?;
            Ok(())
        })
    }

    /// Sets an ACL attribute (`system.posix_acl_access` or `_default`), as Linux file systems
    /// do (`posix_acl_update_mode`): the value must be a valid ACL (else EINVAL); an access
    /// ACL sets the permission bits it implies and is stored only when it has named entries;
    /// a default ACL is for directories only (EACCES elsewhere); an empty ACL (header only)
    /// removes the attribute. Symlinks carry no ACLs (EOPNOTSUPP).
    fn set_acl(&self, ino: InodeId, name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        let acl = Acl::decode(value)?;
        let _g = self.locks.lock(&[ino]);
        let (loc, kind) = self.loc(ino)?;
        let access = name == ACL_ACCESS;
        match kind {
            FileType::Symlink => return Err(FsError::NotSupported),
            FileType::Directory => {}
            _ if !access && acl.is_some() => return Err(FsError::Access),
            _ if !access => return Ok(()),
            _ => {}
        }
        let key = schema::named_key(ino, name);
        let exists = self.kv.get(self.t.xattr, &key)?.is_some();
        if flags == XATTR_CREATE && exists {
            return Err(FsError::Exists);
        }
        if flags == XATTR_REPLACE && !exists {
            return Err(FsError::NoData);
        }
        let now = Timespec::now();
        let mut b = WriteBatch::new();
        let mut d = StatDelta {
            ctime: Some(now),
            ..StatDelta::default()
        };
        if let (true, Some(a)) = (access, &acl) {
            let mode = self.read_inode_at(&*self.kv, ino, &loc)?.stat.mode;
            d.perm = Some((mode & 0o7000) | a.mode_bits());
        }
        match &acl {
            Some(a) if !(access && a.is_mode_only()) => b.put(self.t.xattr, key, a.encode()),
            _ => b.delete(self.t.xattr, key),
        }
        self.upsert_stat(&mut b, ino, &loc, &d)?;
        self.inodes.update(ino, |k| k.xattr_free = false);
        self.kv.write(b, WriteOptions::NO_SYNC)?;
        if !access {
            self.dir_table.note_default_acl(ino, acl.as_ref());
        }
        Ok(())
    }

    /// The access ACL of `ino`, if it has one (for permission checks and chmod).
    pub(crate) fn access_acl(&self, ino: InodeId) -> FsResult<Option<Acl>> {
        if self.inodes.xattr_free(ino) {
            return Ok(None);
        }
        match self
            .kv
            .get(self.t.xattr, &schema::named_key(ino, ACL_ACCESS))?
        {
            Some(v) => Acl::decode(&v)
                .map_err(|_| FsError::corrupt(format!("access ACL of inode {}", ino.0))),
            None => Ok(None),
        }
    }

    /// Names of all attributes of `ino`, in byte order.
    pub fn listxattr(&self, ino: InodeId) -> FsResult<Vec<Vec<u8>>> {
        self.loc(ino)?;
        let mut names = Vec::new();
        if self.inodes.xattr_free(ino) {
            return Ok(names);
        }
        let (lo, hi) = schema::id_prefix_range(ino);
        let mut range = KeyRange::half_open(&lo, &hi);
        loop {
            let page = self
                .kv
                .scan(self.t.xattr, &range, Direction::Forward, 256)?;
            let Some((last, _)) = page.last() else { break };
            range.lo = std::ops::Bound::Excluded(last.clone());
            let full = page.len() == 256;
            for (k, _) in &page {
                names.push(schema::name_of(k)?.to_vec());
            }
            if !full {
                break;
            }
        }
        Ok(names)
    }

    /// Removes attribute `name` of `ino`.
    pub fn removexattr(&self, ino: InodeId, name: &[u8]) -> FsResult<()> {
        check_name(name)?;
        let _g = self.locks.lock(&[ino]);
        let (loc, _) = self.loc(ino)?;
        let key = schema::named_key(ino, name);
        if self.inodes.xattr_free(ino) || self.kv.get(self.t.xattr, &key)?.is_none() {
            return Err(FsError::NoData);
        }
        let mut b = WriteBatch::new();
        b.delete(self.t.xattr, key);
        self.upsert_stat(
            &mut b,
            ino,
            &loc,
            &StatDelta {
                ctime: Some(Timespec::now()),
                ..StatDelta::default()
            },
        )?;
        self.kv.write(b, WriteOptions::NO_SYNC)?;
        if name == ACL_DEFAULT {
            self.dir_table.note_default_acl(ino, None);
        }
        Ok(())
    }
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(FsError::Range);
    }
    Ok(())
}
