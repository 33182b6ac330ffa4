//! Directory listing. A listing is one range scan of the `dentry` keys `(dir id, *)`, resumed
//! after the last name returned: the cookie is the entry key itself, so entries deleted or
//! added during a listing never make it skip or repeat the others. The FUSE flavour maps its
//! u64 offsets to those names inside the directory handle. It owns listing and dir handles;
//! it must never read data blocks, and it reads an inode record only for hard-linked entries.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use fern_kv::{Direction, KeyRange, KvRead};

use crate::attr::{Attr, FileType};
use crate::error::{FsError, FsResult};
use crate::fs::{Fs, Handle};
use crate::ids::{Fh, InodeId};
use crate::lookahead::{WALK_DIRS, WALK_ROWS};
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
/// to ~1000 (readdir, 32 KiB) entries, and once more at the end to learn that nothing is
/// left. One scan per this many entries answers all of those; it also bounds the names a
/// handle keeps ahead.
pub const READ_AHEAD: usize = 1024;

/// Where a FUSE-style listing of one directory handle stands: the entries returned so far
/// (indexed by FUSE offset - 1; the cookie of offset `k` is the name of `returned[k - 1]`)
/// and the entries scanned after them but not returned yet. `returned` followed by `ahead`
/// is always a contiguous run of the directory in name order, as the scans saw it. A handle
/// holds it behind its own lock ([`DirHandle`]): one listing request at a time per handle,
/// while other handles (and the handle table) stay free.
#[derive(Debug, Default)]
pub(crate) struct DirCursor {
    returned: Returned,
    ahead: VecDeque<Listed>,
    /// The last scan reached the end of the directory: nothing follows `ahead`.
    at_end: bool,
}

/// A directory handle's listing state, shared by the handle table and the request serving it.
pub(crate) type DirHandle = Arc<Mutex<DirCursor>>;

/// (name, entry) rows of a directory scan, as the store returned them.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// What one step of a listing read: rows of the `dentry` tree in name order.
struct Listing {
    rows: Rows,
    /// The lock-release count taken just before the read (after the listing's own atime
    /// update, which may take and release the directory's lock).
    since: u64,
    /// When the rows were read (a walk may have read them ahead, lookahead.rs).
    at: Instant,
    /// Whether entries may follow the rows.
    more: bool,
}

/// One listed name as a handle keeps it: a scanned row, moved out of the scan's result (no
/// copy of its name, no decoding of its inode: a plain readdir returns only the name, id and
/// type, and a cold 20,000-name listing spent a third of its time copying and decoding what
/// it then did not use).
#[derive(Debug)]
struct Listed {
    /// The row's key, `(dir id, name)`.
    key: Vec<u8>,
    ino: InodeId,
    kind: FileType,
    /// The row's encoded entry as the read-ahead scan read it, and the lock-release count
    /// taken before that scan (`Stripes::releases`). While the count is unchanged no change of
    /// any name or stat has finished since the scan (every one holds a stripe lock across its
    /// commit), so a readdirplus may answer from it instead of reading the entry again — the
    /// point read per listed file that F3's `os.walk` paid (docs/fs-design.md §8). Only on a
    /// sole-writer store: another mount's changes do not move this count. Dropped when the
    /// entry is returned (the handle keeps every returned name, and only names): an entry
    /// served again after a seek back reads its attributes afresh.
    scanned: Option<(Vec<u8>, u64)>,
    /// On a shared store, the entry's row as the read-ahead scan read it, when: a readdirplus
    /// soon after the scan fetches only the inode row ([`Fs::prefetch_rows`]).
    shared_scan: Option<(Vec<u8>, u64, Instant)>,
    /// On a shared store, the entry's row and its inode row fetched for readdirplus with
    /// those of the entries after it ([`Fs::prefetch_rows`]).
    fetched: Option<Fetched>,
}

/// An entry's rows as one multi-key read fetched them for readdirplus on a shared store.
#[derive(Debug)]
struct Fetched {
    /// The entry's row (`None`: gone) and the inode row of the id it names.
    entry: Option<Vec<u8>>,
    inode: Option<Vec<u8>>,
    /// The lock-release count taken before the read, as for `Listed::scanned`.
    since: u64,
    at: Instant,
}

/// Rows one readdirplus fetch reads in one go on a shared store: one etcd Txn holds 128
/// reads, one or two per entry. Each entry used to cost two round trips (its row, then its
/// inode row): a cold `find -ls` of 1,000 files ran at 511 entries/s on etcd.
const PREFETCH_KEYS: usize = 126;

/// How long fetched rows may wait in a handle for a later readdirplus request before they
/// are read again: another mount's change must not reach the kernel later than the attribute
/// timeout allows, so only rows read for the request serving them, or the one right after
/// it (the kernel's next `getdents` of the same listing), are used.
const FETCHED_FOR: Duration = Duration::from_millis(100);

impl Listed {
    fn name(&self) -> &[u8] {
        schema::name_of(&self.key).unwrap_or_default() // checked when scanned
    }
}

/// The entries a handle returned, in order: what a FUSE offset names. Packed (names back to
/// back, ids and types beside them) rather than a list of [`Listed`]: a handle keeps every
/// name it returned, and one allocation per name plus a list grown by copying was a sixth of
/// a 20,000-name listing's time and ~80 bytes per name held.
#[derive(Debug, Default)]
struct Returned {
    names: Vec<u8>,
    /// Where each name ends in `names`.
    ends: Vec<usize>,
    ids: Vec<(InodeId, FileType)>,
}

impl Returned {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    fn last_name(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.name(i))
    }

    fn push(&mut self, l: &Listed) {
        self.names.extend_from_slice(l.name());
        self.ends.push(self.names.len());
        self.ids.push((l.ino, l.kind));
    }

    /// Removes the entries from index `k` on, as [`Listed`] entries of directory `dir` in
    /// order (without scanned rows: they are read afresh if listed with attributes).
    fn split_off(&mut self, dir: InodeId, k: usize) -> Vec<Listed> {
        let out = (k..self.len())
            .map(|i| Listed {
                key: schema::named_key(dir, self.name(i)),
                ino: self.ids[i].0,
                kind: self.ids[i].1,
                scanned: None,
                shared_scan: None,
                fetched: None,
            })
            .collect();
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        self.names.truncate(start);
        self.ends.truncate(k);
        self.ids.truncate(k);
        out
    }
}

impl DirCursor {
    /// Positions the cursor of directory `dir` at FUSE offset `offset`. Entries returned at
    /// or after `offset` were not taken by the kernel (a full reply, or a seek back) and go
    /// back in front of `ahead`; offset 0 starts over (the next entry needs a fresh scan).
    fn rewind(&mut self, dir: InodeId, offset: u64) -> FsResult<()> {
        if offset == 0 {
            *self = DirCursor::default();
            return Ok(());
        }
        let k = usize::try_from(offset).map_err(|_| FsError::Invalid)?;
        if k > self.returned.len() {
            return Err(FsError::Invalid);
        }
        for e in self.returned.split_off(dir, k).into_iter().rev() {
            self.ahead.push_front(e);
        }
        Ok(())
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
        let mut rows = self.list_rows(dir, after, limit)?.rows;
        rows.truncate(limit);
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

    /// The entries of `dir` after `after` (at most `limit`, or those a walk read ahead) as
    /// (key, value) rows of the `dentry` tree (the callers decode them into what they keep).
    fn list_rows(&self, dir: InodeId, after: Option<&[u8]>, limit: usize) -> FsResult<Listing> {
        self.require_dir(dir)?;
        if after.is_none() && !self.read_only && self.is_shared() {
            // A listing from the start reads the directory (POSIX: readdir marks atime). On a
            // shared store the access is written lazily, its stat read then (atime.rs): here
            // neither costs a round trip.
            self.note_access(dir, true);
        } else if after.is_none() && !self.read_only && self.atime_policy().may_update(true) {
            // Under the same relatime rule as a file read: a write only when atime is stale.
            // Under noatime or nodiratime the stat is not read for it.
            let dir_inode = self.read_inode(dir)?;
            self.touch_atime(dir, &dir_inode.stat)?;
        }
        if after.is_none() && self.is_shared() {
            if let Some(w) = self.take_walked(dir) {
                // As current for this mount's own changes as a scan now (lookahead.rs).
                return Ok(Listing {
                    since: self.locks.releases(),
                    at: w.at,
                    more: !w.complete,
                    rows: w.rows,
                });
            }
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
        let at = Instant::now();
        let rows = self
            .kv
            .scan(self.t.dentry, &range, Direction::Forward, limit)?;
        Ok(Listing {
            more: rows.len() >= limit,
            rows,
            since,
            at,
        })
    }

    /// Opens directory `dir` for a FUSE-style listing with u64 offsets. Like a file handle,
    /// the handle keeps the directory alive if it is removed meanwhile (see
    /// [`Fs::releasedir`]).
    pub fn opendir(&self, dir: InodeId) -> FsResult<Fh> {
        {
            // A reading lock: an open changes nothing stored, so the directory's listing
            // read ahead by a walk stays usable (lookahead.rs).
            let _g = self.locks.lock_reading(&[dir]);
            self.require_dir(dir)?;
            self.inodes.update(dir, |k| k.opens += 1);
        }
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        let h = Handle {
            ino: dir,
            append: false,
            write: false,
            kill_suid: false,
            dir_names: Some(DirHandle::default()),
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
    /// the read-ahead unless provably current (`attr_from_scan`).
    pub fn readdir(
        &self,
        fh: Fh,
        offset: u64,
        limit: usize,
        plus: bool,
    ) -> FsResult<Vec<(u64, DirEntry)>> {
        let mut out = Vec::new();
        let listed = self.list_into(fh, offset, limit, plus, &mut |off, e| {
            out.push((off, e.clone()));
            false
        });
        match listed {
            Ok(()) => Ok(out),
            Err(err) => {
                if plus {
                    for (_, e) in &out {
                        self.forget(e.ino, 1);
                    }
                }
                Err(err)
            }
        }
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
        let mut added = false;
        let listed = self.list_into(fh, offset, usize::MAX, plus, &mut |off, e| {
            let full = add(off, e);
            added |= !full;
            full
        });
        match listed {
            // What is in the buffer (and, with plus, pinned) stays valid: end the reply
            // there, and the kernel's next request, from the last entry, meets the error.
            Err(_) if added => Ok(()),
            listed => listed,
        }
    }

    /// Both listings: from FUSE offset `offset` of handle `fh`, passes up to `limit` entries
    /// in order to `add(offset, entry)`, which returns `true` when it did not take the entry
    /// (that ends the listing; the entry stays ahead). With `plus`, every entry passed is
    /// pinned with its attributes, and unpinned again if not taken; an entry gone since its
    /// scan is skipped. On an error, what `add` took stays taken.
    fn list_into(
        &self,
        fh: Fh,
        offset: u64,
        limit: usize,
        plus: bool,
        add: &mut dyn FnMut(u64, &DirEntry) -> bool,
    ) -> FsResult<()> {
        let (dir, cursor) = {
            let handles = self.handles.lock();
            let h = handles.get(&fh).ok_or(FsError::BadHandle)?;
            (h.ino, h.dir_names.clone().ok_or(FsError::BadHandle)?)
        };
        let mut c = cursor.lock();
        c.rewind(dir, offset)?;
        // A plain entry is passed in this one buffer: no allocation per name.
        let mut plain = DirEntry {
            name: Vec::new(),
            ino: dir,
            kind: FileType::Directory,
            attr: None,
        };
        let mut taken = 0;
        while taken < limit {
            let Some(mut l) = c.ahead.pop_front() else {
                if c.at_end {
                    break;
                }
                let after = c.returned.last_name().map(<[u8]>::to_vec);
                self.read_ahead(dir, after.as_deref(), &mut c)?;
                continue;
            };
            let off = c.returned.len() as u64 + 1;
            let full = if plus {
                if self.is_shared()
                    && l.fetched
                        .as_ref()
                        .is_none_or(|f| f.at.elapsed() > FETCHED_FOR)
                {
                    c.ahead.push_front(l);
                    self.prefetch_rows(dir, &mut c.ahead)?;
                    l = c.ahead.pop_front().expect("pushed back just now");
                }
                let e = DirEntry {
                    name: l.name().to_vec(),
                    ino: l.ino,
                    kind: l.kind,
                    attr: None,
                };
                let known = match l.fetched.take() {
                    Some(f) if f.at.elapsed() <= FETCHED_FOR => {
                        self.attr_from_fetched(dir, &e, f)?
                    }
                    _ => None,
                };
                let fresh = match known {
                    Some(attr) => Ok(Some(DirEntry {
                        kind: attr.kind,
                        attr: Some(attr),
                        ..e
                    })),
                    None => self.fresh_plus(dir, e, l.scanned.take()),
                };
                match fresh {
                    Ok(Some(e)) => {
                        let full = add(off, &e);
                        if full {
                            self.forget(e.ino, 1);
                        }
                        full
                    }
                    Ok(None) => false, // gone since the scan: not listed
                    Err(err) => {
                        c.ahead.push_front(l);
                        return Err(err);
                    }
                }
            } else {
                plain.name.clear();
                plain.name.extend_from_slice(l.name());
                (plain.ino, plain.kind) = (l.ino, l.kind);
                add(off, &plain)
            };
            if full {
                c.ahead.push_front(l);
                break;
            }
            c.returned.push(&l);
            taken += 1;
        }
        Ok(())
    }

    /// One read-ahead scan of `dir` after the name `after` (`None`: from the start) into
    /// cursor `c`'s `ahead`.
    fn read_ahead(&self, dir: InodeId, after: Option<&[u8]>, c: &mut DirCursor) -> FsResult<()> {
        let Listing {
            rows,
            since,
            at,
            more,
        } = self.list_rows(dir, after, READ_AHEAD)?;
        c.at_end = !more;
        let shared = self.is_shared();
        for (key, v) in rows {
            schema::name_of(&key)?;
            let (ino, kind) = Dentry::head(&v)?;
            let (scanned, shared_scan) = if shared {
                (None, Some((v, since, at)))
            } else {
                (Some((v, since)), None)
            };
            c.ahead.push_back(Listed {
                key,
                ino,
                kind,
                scanned,
                shared_scan,
                fetched: None,
            });
        }
        Ok(())
    }

    /// Reads, in one multi-key read (etcd: one Txn of [`PREFETCH_KEYS`] reads), the inode
    /// rows of the ids the first entries of `ahead` named when listed and, for an entry
    /// scanned more than [`FETCHED_FOR`] ago, its row again, into their `fetched` (an entry
    /// scanned since keeps the scan's row and time: the listing right after its scan needs one
    /// read per entry, not two). Shared stores only: there every entry is `Linked`, so
    /// readdirplus needs both rows of every entry.
    ///
    /// With reading ahead on (the adapter's [`Fs::set_lookup_ahead`]), the same round trip
    /// reads the first names of up to [`WALK_DIRS`] subdirectories among those entries
    /// (lookahead.rs, "Walks read ahead"): a walk lists them next.
    fn prefetch_rows(&self, dir: InodeId, ahead: &mut VecDeque<Listed>) -> FsResult<()> {
        let since = self.locks.releases();
        let walk = !self.lookahead.max_age().is_zero();
        let mut keys: Vec<(fern_kv::TreeId, Vec<u8>)> = Vec::with_capacity(PREFETCH_KEYS);
        // Subdirectories read ahead: their ranges and (id, stripe change count before).
        let mut ranges = Vec::new();
        let mut walked = Vec::new();
        let mut n = 0;
        for l in ahead.iter_mut() {
            if l.shared_scan
                .as_ref()
                .is_some_and(|(_, _, at)| at.elapsed() > FETCHED_FOR)
            {
                l.shared_scan = None;
            }
            let walk_it = walk && l.kind == FileType::Directory && ranges.len() < WALK_DIRS;
            let want = usize::from(l.shared_scan.is_none()) + 1 + usize::from(walk_it);
            if keys.len() + ranges.len() + want > PREFETCH_KEYS {
                break;
            }
            if l.shared_scan.is_none() {
                keys.push((self.t.dentry, l.key.clone()));
            }
            keys.push((self.t.inode, schema::id_key(l.ino)));
            if walk_it {
                let (lo, hi) = schema::id_prefix_range(l.ino);
                ranges.push(KeyRange {
                    lo: Bound::Included(lo),
                    hi: Bound::Excluded(hi),
                });
                walked.push((l.ino, self.locks.changes(l.ino)));
            }
            n += 1;
        }
        let walk_at = Instant::now();
        let (got, listings) = if ranges.is_empty() {
            (self.kv.get_many(&keys)?, Vec::new())
        } else {
            self.kv
                .get_many_reading_ahead(&keys, self.t.dentry, &ranges, WALK_ROWS)?
        };
        for ((sub, changes), rows) in walked.into_iter().zip(listings) {
            if let Some(rows) = rows {
                self.remember_walked(sub, dir, walk_at, changes, rows);
            }
        }
        let mut rows = got.into_iter();
        let at = Instant::now();
        for l in ahead.iter_mut().take(n) {
            l.fetched = Some(match l.shared_scan.take() {
                Some((entry, scan_since, scan_at)) => Fetched {
                    entry: Some(entry),
                    inode: rows.next().flatten(),
                    since: scan_since,
                    at: scan_at,
                },
                None => Fetched {
                    entry: rows.next().flatten(),
                    inode: rows.next().flatten(),
                    since,
                    at,
                },
            });
        }
        Ok(())
    }

    /// The attributes of listed entry `e` from its fetched rows, pinned and seeded as
    /// `fresh_plus` does, when the rows say the entry still names `e`'s inode and no change
    /// of this mount finished since they were read (`attr_from_scan`'s rule). `None`: the
    /// caller reads the entry itself.
    fn attr_from_fetched(&self, dir: InodeId, e: &DirEntry, f: Fetched) -> FsResult<Option<Attr>> {
        let Some(v) = f.entry else {
            return Ok(None);
        };
        let d = Dentry::decode(&v)?;
        if let (Dentry::Linked { .. }, None) = (&d, &f.inode) {
            return Ok(None);
        }
        self.attr_from_rows(&self.with_inode_row(e.ino, f.inode), dir, e, d, f.since)
    }

    /// Entry `e` of `dir` with its attributes as they are now, pinned; `None` if the name is
    /// gone or names another inode since it was listed. They are the read-ahead scan's
    /// (`scanned`) when that is provably current (`attr_from_scan`), else read now.
    fn fresh_plus(
        &self,
        dir: InodeId,
        mut e: DirEntry,
        scanned: Option<(Vec<u8>, u64)>,
    ) -> FsResult<Option<DirEntry>> {
        if let Some((v, since)) = scanned {
            if let Some(attr) = self.attr_from_scan(dir, &e, Dentry::decode(&v)?, since)? {
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
        self.attr_from_rows(&*self.kv, dir, e, d, since)
    }

    /// [`Fs::attr_from_scan`] with the inode row, if `d` links to one, read through `r`.
    fn attr_from_rows(
        &self,
        r: &dyn KvRead,
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
            let (loc, inode) = self.resolve(r, dir, &e.name, d)?;
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

/// A reader that answers one key from a value read earlier and every other read from `rest`:
/// how `attr_from_fetched` and a lookup read ahead (lookahead.rs) hand an entry's fetched
/// inode row to `resolve`.
pub(crate) struct OneRow<'a> {
    tree: fern_kv::TreeId,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    rest: &'a dyn KvRead,
}

impl Fs {
    /// The store as seen with `ino`'s inode row already read as `row` (`None`: absent).
    pub(crate) fn with_inode_row(&self, ino: InodeId, row: Option<Vec<u8>>) -> OneRow<'_> {
        OneRow {
            tree: self.t.inode,
            key: schema::id_key(ino),
            value: row,
            rest: &*self.kv,
        }
    }
}

impl KvRead for OneRow<'_> {
    fn get(&self, tree: fern_kv::TreeId, key: &[u8]) -> fern_kv::KvResult<Option<Vec<u8>>> {
        if tree == self.tree && key == self.key {
            return Ok(self.value.clone());
        }
        self.rest.get(tree, key)
    }

    fn scan(
        &self,
        tree: fern_kv::TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> fern_kv::KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.rest.scan(tree, range, dir, limit)
    }
}
