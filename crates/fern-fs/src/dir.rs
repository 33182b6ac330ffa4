//! Directory listing. A listing is one range scan of the `dentry` keys `(dir id, *)`, resumed
//! after the last name returned: the cookie is the entry key itself, so entries deleted or
//! added during a listing never make it skip or repeat the others. The FUSE flavour maps its
//! u64 offsets to those names inside the directory handle. It owns listing and dir handles;
//! it must never read data blocks, and it reads an inode record only for hard-linked entries.

use std::ops::Bound;
use std::sync::atomic::Ordering;

use fern_kv::{Direction, KeyRange};

use crate::attr::{Attr, FileType};
use crate::cache::Loc;
use crate::error::{FsError, FsResult};
use crate::fs::{Fs, Handle};
use crate::ids::{Fh, InodeId};
use crate::record::Dentry;
use crate::schema;

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode number.
    pub ino: InodeId,
    /// Type.
    pub kind: FileType,
    /// Attributes, when asked for (`plus`).
    pub attr: Option<Attr>,
}

impl Fs {
    /// Up to `limit` entries of directory `dir` in name order, starting after the name
    /// `after` (the cookie; `None` starts at the beginning). With `plus`, attributes come too.
    /// Pins nothing.
    pub fn list(
        &self,
        dir: InodeId,
        after: Option<&[u8]>,
        limit: usize,
        plus: bool,
    ) -> FsResult<Vec<DirEntry>> {
        self.require_dir(dir)?;
        let (lo, hi) = schema::id_prefix_range(dir);
        let lo = match after {
            Some(name) => Bound::Excluded(schema::named_key(dir, name)),
            None => Bound::Included(lo),
        };
        let range = KeyRange {
            lo,
            hi: Bound::Excluded(hi),
        };
        let pairs = self
            .kv
            .scan(self.t.dentry, &range, Direction::Forward, limit)?;
        if after.is_none() {
            // A listing from the start reads the directory (POSIX: readdir marks atime), under
            // the same relatime rule as a file read: a write only when atime is stale.
            let dir_inode = self.read_inode(dir)?;
            self.touch_atime(dir, &dir_inode.stat)?;
        }
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let name = schema::name_of(&k)?.to_vec();
            let d = Dentry::decode(&v)?;
            let attr = if plus {
                let (_, inode) = self.resolve(&*self.kv, dir, &name, d.clone())?;
                Some(self.attr_of(d.id(), &inode)?)
            } else {
                None
            };
            out.push(DirEntry {
                name,
                ino: d.id(),
                kind: d.kind()?,
                attr,
            });
        }
        Ok(out)
    }

    /// Opens directory `dir` for a FUSE-style listing with u64 offsets.
    pub fn opendir(&self, dir: InodeId) -> FsResult<Fh> {
        self.require_dir(dir)?;
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        let h = Handle {
            ino: dir,
            append: false,
            write: false,
            kill_suid: false,
            dir_names: Some(Vec::new()),
        };
        self.handles.lock().insert(fh, h);
        Ok(fh)
    }

    /// Lists from FUSE offset `offset` (0 = start; otherwise the offset of an entry returned
    /// earlier through this handle). Returns (offset of the entry, entry). With `plus` each
    /// returned entry is pinned, as FUSE readdirplus counts a lookup per entry.
    pub fn readdir(
        &self,
        fh: Fh,
        offset: u64,
        limit: usize,
        plus: bool,
    ) -> FsResult<Vec<(u64, DirEntry)>> {
        let (dir, after) = {
            let handles = self.handles.lock();
            let h = handles.get(&fh).ok_or(FsError::BadHandle)?;
            let names = h.dir_names.as_ref().ok_or(FsError::BadHandle)?;
            let after = match offset {
                0 => None,
                n => Some(names.get((n - 1) as usize).ok_or(FsError::Invalid)?.clone()),
            };
            (h.ino, after)
        };
        let entries = self.list(dir, after.as_deref(), limit, plus)?;
        let mut handles = self.handles.lock();
        let names = handles
            .get_mut(&fh)
            .and_then(|h| h.dir_names.as_mut())
            .ok_or(FsError::BadHandle)?;
        // A seek back (telldir/seekdir) forgets the offsets handed out after it.
        names.truncate(offset as usize);
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            names.push(e.name.clone());
            out.push((names.len() as u64, e));
        }
        drop(handles);
        if plus {
            for (_, e) in &out {
                let loc = match self.peek(dir, &e.name)? {
                    Some(Dentry::Inline { id, .. }) if id == e.ino => Loc::Entry {
                        parent: dir,
                        name: e.name.clone(),
                    },
                    Some(Dentry::Linked { id, .. }) if id == e.ino => Loc::Inode,
                    _ => continue, // gone since the scan: the kernel will look it up again
                };
                self.inodes.pin(e.ino, loc, e.kind);
            }
        }
        Ok(out)
    }

    /// Closes a directory handle.
    pub fn releasedir(&self, fh: Fh) -> FsResult<()> {
        self.handles
            .lock()
            .remove(&fh)
            .map(|_| ())
            .ok_or(FsError::BadHandle)
    }
}
