//! Directory listing. A listing is one range scan of the `dentry` keys `(dir id, *)`, resumed
//! after the last name returned: the cookie is the entry key itself, so entries deleted or
//! added during a listing never make it skip or repeat the others. The FUSE flavour maps its
//! u64 offsets to those names inside the directory handle. It owns listing and dir handles;
//! it must never read data blocks, and it reads an inode record only for hard-linked entries.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::atomic::Ordering;

use fern_kv::{Direction, KeyRange};

use crate::attr::{Attr, FileType};
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

/// Entries one range scan of a FUSE-style listing reads ahead. A scan costs far more than
/// the entries it returns (the engine materializes whole leaves with their pending messages:
/// 1-2 ms per scan measured through FUSE on a freshly written tree, against a few µs per
/// point read), while the kernel asks for a listing in requests of a few dozen (readdirplus)
/// to ~100 (readdir) entries, and once more at the end to learn that nothing is left. One
/// scan per this many entries answers all of those; it also bounds the names a handle keeps
/// ahead.
pub const READ_AHEAD: usize = 1024;

/// Entries [`Fs::readdir_fill`] takes from the handle at a time: names only, so a chunk that
/// does not fit costs nothing but a copy.
const FILL_CHUNK: usize = 256;
/// The same with attributes: each costs a point read and a pin, undone if it does not fit.
const FILL_CHUNK_PLUS: usize = 16;

/// Where a FUSE-style listing of one directory handle stands: the entries returned so far
/// (indexed by FUSE offset - 1; the cookie of offset `k` is the name of `returned[k - 1]`)
/// and the entries scanned after them but not returned yet. `returned` followed by `ahead`
/// is always a contiguous run of the directory in name order, as the scans saw it.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirCursor {
    returned: Vec<Listed>,
    ahead: VecDeque<Listed>,
    /// The last scan reached the end of the directory: nothing follows `ahead`.
    at_end: bool,
}

/// A row of a read-ahead scan and the lock-release count taken before that scan. Boxed where
/// it is kept: an inline entry holds a whole inode (~170 bytes), and a handle's lists of
/// ~200-byte entries were fresh mappings of the allocator (above glibc's fixed 64 KiB mmap
/// threshold, which the binary then used) whose pages faulted in on every scan — a quarter
/// of a cold 20,000-name listing.
type Scanned = (Dentry, u64);

/// (name, entry) rows of a directory scan, as the store returned them.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// One listed name as a handle keeps it: what a plain readdir returns. Not a [`DirEntry`],
/// whose room for attributes would more than double the memory of a handle that lists a
/// large directory (the handle keeps every returned name: they are the FUSE offsets).
#[derive(Clone, Debug)]
struct Listed {
    name: Vec<u8>,
    ino: InodeId,
    kind: FileType,
    /// The entry as the read-ahead scan read it, and the lock-release count taken before that
    /// scan (`Stripes::releases`). While the count is unchanged no change of any name or stat
    /// has finished since the scan (every one holds a stripe lock across its commit), so a
    /// readdirplus may answer from it instead of reading the entry again — the point read per
    /// listed file that F3's `os.walk` paid (docs/fs-design.md §8). Only on a sole-writer
    /// store: another mount's changes do not move this count. Taken when the entry is
    /// served: an entry served again after a seek back reads its attributes afresh.
    scanned: Option<Box<Scanned>>,
}

impl DirCursor {
    /// Positions the cursor at FUSE offset `offset`. `Ok(None)`: entries can be served from
    /// memory now; `Ok(Some(after))`: a scan after the name `after` (`None`: from the
    /// start) must fill `ahead` first. Entries returned at or after `offset` were not taken
    /// by the kernel (a full reply, or a seek back) and go back in front of `ahead`.
    fn rewind(&mut self, offset: u64) -> FsResult<Option<Option<Vec<u8>>>> {
        if offset == 0 {
            *self = DirCursor::default();
            return Ok(Some(None));
        }
        let k = usize::try_from(offset).map_err(|_| FsError::Invalid)?;
        if k > self.returned.len() {
            return Err(FsError::Invalid);
        }
        for e in self.returned.drain(k..).rev() {
            self.ahead.push_front(e);
        }
        if self.ahead.is_empty() && !self.at_end {
            return Ok(Some(self.returned.last().map(|e| e.name.clone())));
        }
        Ok(None)
    }

    /// Returns up to `limit` entries from `ahead` with their FUSE offsets.
    fn serve(&mut self, limit: usize) -> Vec<(u64, DirEntry, Option<Box<Scanned>>)> {
        let n = limit.min(self.ahead.len());
        let mut out = Vec::with_capacity(n);
        for mut l in self.ahead.drain(..n) {
            let e = DirEntry {
                name: l.name.clone(),
                ino: l.ino,
                kind: l.kind,
                attr: None,
            };
            let scanned = l.scanned.take();
            self.returned.push(l);
            out.push((self.returned.len() as u64, e, scanned));
        }
        out
    }
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
        let (rows, _) = self.list_rows(dir, after, limit)?;
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            let (name, d) = (schema::name_of(&k)?.to_vec(), Dentry::decode(&v)?);
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

    /// The entries of `dir` after `after` (at most `limit`) as (key, value) rows of the
    /// `dentry` tree (the callers decode them into what they keep), and the lock-release count
    /// taken just before the scan (after the listing's own atime update, which takes and
    /// releases `dir`'s lock).
    fn list_rows(&self, dir: InodeId, after: Option<&[u8]>, limit: usize) -> FsResult<(Rows, u64)> {
        self.require_dir(dir)?;
        if after.is_none() {
            // A listing from the start reads the directory (POSIX: readdir marks atime), under
            // the same relatime rule as a file read: a write only when atime is stale.
            let dir_inode = self.read_inode(dir)?;
            self.touch_atime(dir, &dir_inode.stat)?;
        }
        let since = self.locks.releases();
        let (lo, hi) = schema::id_prefix_range(dir);
        let lo = match after {
            Some(name) => Bound::Excluded(schema::named_key(dir, name)),
            None => Bound::Included(lo),
        };
        let range = KeyRange {
            lo,
            hi: Bound::Excluded(hi),
        };
        let rows = self
            .kv
            .scan(self.t.dentry, &range, Direction::Forward, limit)?;
        Ok((rows, since))
    }

    /// Opens directory `dir` for a FUSE-style listing with u64 offsets. Like a file handle,
    /// the handle keeps the directory alive if it is removed meanwhile (see
    /// [`Fs::releasedir`]).
    pub fn opendir(&self, dir: InodeId) -> FsResult<Fh> {
        {
            let _g = self.locks.lock(&[dir]);
            self.require_dir(dir)?;
            self.inodes.update(dir, |k| k.opens += 1);
        }
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        let h = Handle {
            ino: dir,
            append: false,
            write: false,
            kill_suid: false,
            dir_names: Some(DirCursor::default()),
        };
        self.handles.lock().insert(fh, h);
        Ok(fh)
    }

    /// Lists from FUSE offset `offset` (0 = start; otherwise the offset of an entry returned
    /// earlier through this handle), at most `limit` entries. Returns (offset of the entry,
    /// entry). With `plus` each returned entry carries attributes read by this call and is
    /// pinned, as FUSE readdirplus counts a lookup per entry.
    ///
    /// Names come from one range scan per [`READ_AHEAD`] entries, kept in the handle; a
    /// listing from offset 0 always scans afresh (`rewinddir` sees the directory as it is
    /// now). Entries are therefore as of the scan that read them, which POSIX allows for
    /// names added or removed after `opendir`/`rewinddir`; attributes are never served from
    /// the read-ahead.
    pub fn readdir(
        &self,
        fh: Fh,
        offset: u64,
        limit: usize,
        plus: bool,
    ) -> FsResult<Vec<(u64, DirEntry)>> {
        let (dir, served) = loop {
            let (dir, scan_after) = {
                let mut handles = self.handles.lock();
                let h = handles.get_mut(&fh).ok_or(FsError::BadHandle)?;
                let dir = h.ino;
                let c = h.dir_names.as_mut().ok_or(FsError::BadHandle)?;
                match c.rewind(offset)? {
                    None => break (dir, c.serve(limit)),
                    Some(after) => (dir, after),
                }
            };
            // The scan runs without the handle table's lock; its result is installed only if
            // the cursor is still where it was (the kernel serializes requests of one open
            // directory, so a retry means a misbehaving caller, not contention).
            let (rows, since) =
                self.list_rows(dir, scan_after.as_deref(), READ_AHEAD.max(limit))?;
            let at_end = rows.len() < READ_AHEAD.max(limit);
            let sole = !self.is_shared();
            let mut entries = Vec::with_capacity(rows.len());
            for (k, v) in rows {
                let d = Dentry::decode(&v)?;
                entries.push(Listed {
                    name: schema::name_of(&k)?.to_vec(),
                    ino: d.id(),
                    kind: d.kind()?,
                    scanned: sole.then(|| Box::new((d, since))),
                });
            }
            let mut handles = self.handles.lock();
            let c = handles
                .get_mut(&fh)
                .and_then(|h| h.dir_names.as_mut())
                .ok_or(FsError::BadHandle)?;
            if c.returned.len() == offset as usize && c.ahead.is_empty() && !c.at_end {
                c.ahead.extend(entries.drain(..));
                c.at_end = at_end;
                break (dir, c.serve(limit));
            }
        };
        if !plus {
            return Ok(served.into_iter().map(|(off, e, _)| (off, e)).collect());
        }
        let mut out = Vec::with_capacity(served.len());
        for (off, e, scanned) in served {
            match self.fresh_plus(dir, e, scanned) {
                Ok(Some(e)) => out.push((off, e)),
                Ok(None) => {} // gone since the scan: not listed
                Err(err) => {
                    for (_, e) in &out {
                        self.forget(e.ino, 1);
                    }
                    return Err(err);
                }
            }
        }
        Ok(out)
    }

    /// Lists from FUSE offset `offset` into a reply buffer: `add(offset, entry)` is called
    /// for each entry in order and returns `true` when the entry did not fit, which ends the
    /// listing there (the kernel resumes from the last entry it took, and the entries read
    /// but not taken are served again from the handle). With `plus` every entry passed to
    /// `add` has its attributes (read by this call) and is pinned; the one that did not fit
    /// is unpinned again, so the caller pins exactly what the kernel took.
    ///
    /// Why a callback: how many entries fit depends on the kernel's buffer (up to 32 KiB for
    /// `getdents64`'s usual buffer) and on the names; a fixed count per request either wastes
    /// round trips (too few: `ls -l` of a 128-entry directory took three readdir requests
    /// and a LOOKUP for each entry beyond the first readdirplus reply) or, with `plus`,
    /// point reads and pins of entries that are then thrown away (too many).
    pub fn readdir_fill(
        &self,
        fh: Fh,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(u64, &DirEntry) -> bool,
    ) -> FsResult<()> {
        // Attributes are read per chunk, so a full buffer wastes at most a chunk's reads.
        let chunk = if plus { FILL_CHUNK_PLUS } else { FILL_CHUNK };
        let mut offset = offset;
        let mut added = false;
        loop {
            let page = match self.readdir(fh, offset, chunk, plus) {
                Ok(page) => page,
                // What is in the buffer (and, with plus, pinned) stays valid: end the reply
                // there, and the kernel's next request, from the last entry, meets the error.
                Err(_) if added => return Ok(()),
                Err(e) => return Err(e),
            };
            if page.is_empty() {
                return Ok(());
            }
            let mut rest = page.into_iter();
            for (off, e) in rest.by_ref() {
                if add(off, &e) {
                    if plus {
                        self.forget(e.ino, 1);
                        for (_, later) in rest {
                            self.forget(later.ino, 1);
                        }
                    }
                    return Ok(());
                }
                offset = off;
                added = true;
            }
        }
    }

    /// Entry `e` of `dir` with its attributes as they are now, pinned; `None` if the name is
    /// gone or names another inode since it was listed. They are the read-ahead scan's
    /// (`scanned`) when that is provably current (`attr_from_scan`), else read now.
    fn fresh_plus(
        &self,
        dir: InodeId,
        mut e: DirEntry,
        scanned: Option<Box<Scanned>>,
    ) -> FsResult<Option<DirEntry>> {
        if let Some((d, since)) = scanned.map(|b| *b) {
            if let Some(attr) = self.attr_from_scan(dir, &e, d, since)? {
                e.kind = attr.kind;
                e.attr = Some(attr);
                return Ok(Some(e));
            }
        }
        let since = self.locks.releases();
        let Some(d) = self.peek(dir, &e.name)? else {
            return Ok(None);
        };
        if d.id() != e.ino {
            return Ok(None);
        }
        let (loc, inode) = self.resolve(&*self.kv, dir, &e.name, d)?;
        let attr = self.attr_of(e.ino, &inode)?;
        e.kind = attr.kind;
        e.attr = Some(attr);
        self.inodes.pin(e.ino, loc, e.kind);
        // As a lookup does: the kernel's open and read of a listed file (F3) then read no stat.
        self.seed_stat(e.ino, None, inode.stat, since);
        Ok(Some(e))
    }

    /// The attributes of listed entry `e` from the read-ahead scan's row `d`, pinned and
    /// seeded as `fresh_plus` does, if the row is still exactly what the store holds: with
    /// `e`'s stripe free and taken (no change of `e`'s name or stat in flight — every one,
    /// unlink, rename over it, write, setattr, holds it across its commit) and no lock set
    /// released since the scan (none finished since). `None`: not provably current (then the
    /// caller reads the entry); never waits for a lock.
    fn attr_from_scan(
        &self,
        dir: InodeId,
        e: &DirEntry,
        d: Dentry,
        since: u64,
    ) -> FsResult<Option<Attr>> {
        if d.id() != e.ino {
            return Ok(None);
        }
        let current = self.locks.with_free(e.ino, None, || {
            if self.locks.releases() != since {
                return Ok(None);
            }
            let (loc, inode) = self.resolve(&*self.kv, dir, &e.name, d)?;
            let attr = self.attr_of(e.ino, &inode)?;
            self.inodes.pin(e.ino, loc, attr.kind);
            self.seed_stat(e.ino, Some(e.ino), inode.stat, since);
            Ok(Some(attr))
        });
        current.unwrap_or(Ok(None))
    }

    /// Closes a directory handle; the last close of a removed directory frees it, as
    /// [`Fs::release`] does for files (it is the same bookkeeping).
    pub fn releasedir(&self, fh: Fh) -> FsResult<()> {
        self.release(fh)
    }
}
