//! Lookups read ahead on a shared store (docs/distributed.md §7, "Lookups read ahead").
//!
//! On a shared store a lookup reads the entry's row, then the inode row it names: two round
//! trips, one after the other (etcd: ~1 ms), and a program that walks paths — `git status`
//! lstat()ing every file of its index, a build stat()ing its sources — pays them per name.
//! Such programs take a directory's names one after another, so when a second cold lookup
//! comes in a directory soon after a first, this mount reads the whole directory (if small)
//! in one scan and the inode rows of its entries in one multi-get (etcd: one Txn per 64
//! entries), and answers that lookup and the next ones in the directory from those rows.
//!
//! The rows are a cache of another mount's state and so are allowed to be stale by as much
//! as the kernel's own caches are: the adapter enables this with the age it allows
//! ([`Fs::set_lookup_ahead`], at most the entry and attribute TTLs, and never more than
//! [`MAX_AGE`]); the library default is off, where a lookup reads the store every time. Within
//! that age a row is used only if:
//! * no change of *this* mount finished since it was read under the directory's lock stripe
//!   (every create, unlink, rename or link in it holds that stripe across its commit) or under
//!   the entry's inode's stripe (every stat change of the inode holds that one), counted per
//!   stripe (`Stripes::changes`), and none is in flight (the lookup holds the directory's
//!   stripe and takes the inode's if free) — this mount always reads its own writes;
//! * it names something: a name missing from the rows is looked up in the store (a name
//!   another mount created must be found by the next lookup, docs/distributed.md §7), except
//!   by the lookup that read the rows just now.
//!
//! A read that finds an inode gone (`ESTALE`: another mount removed it; fs.rs `read_record`,
//! as an open or a getattr of a name looked up here does) drops every row, so the kernel's
//! retry of that lookup reads the store.
//!
//! Walks read ahead too (docs/distributed.md §7, "Walks read ahead"): a program that lists a
//! directory with attributes (readdirplus) and then lists its subdirectories — `find`, `ls
//! -lR`, `du`, `git status`'s untracked scan — pays a name scan per subdirectory. So the
//! readdirplus that fetches the inode rows of a directory's entries also reads, in the same
//! round trip ([`fern_kv::KvStore::get_many_reading_ahead`]), the first [`WALK_ROWS`] names
//! of up to [`WALK_DIRS`] of the subdirectories among them; a listing of one of those from the
//! start within the same age uses them instead of its scan, once, if no change of this mount
//! finished under the subdirectory's stripe since (then its inode rows are fetched as after
//! any scan).
//!
//! It owns only these caches and their rules; it never writes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use std::ops::Bound;

use fern_kv::{Direction, KeyRange};
use parking_lot::Mutex;

use crate::error::FsResult;
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::record::Dentry;
use crate::schema;

/// The most a lookup answer read ahead may be older than its read, whatever the adapter asks:
/// the rows serve a walk through one directory, which takes milliseconds.
pub(crate) const MAX_AGE: Duration = Duration::from_millis(100);

/// Directories of more entries are not read ahead (one scan of them would cost more than the
/// lookups it saves when a program wants only a few names).
const MAX_ENTRIES: usize = 256;

/// How long a directory found too large is not scanned again.
const LARGE_FOR: Duration = Duration::from_secs(1);

/// Directories whose state is kept at once (the oldest goes first).
const MAX_DIRS: usize = 64;

/// Subdirectories whose listings one readdirplus fetch reads ahead.
pub(crate) const WALK_DIRS: usize = 16;

/// Names of each such listing read ahead; a longer listing goes on with scans of its own.
pub(crate) const WALK_ROWS: usize = 256;

/// A subdirectory's listing read ahead: its first rows, as the store's dentry scan gives them.
struct Walked {
    /// The directory whose listing named it.
    parent: InodeId,
    at: Instant,
    /// The subdirectory's stripe change count before the read.
    changes: u64,
    rows: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A listing read ahead, handed to the listing it was read for.
pub(crate) struct WalkedRows {
    /// When it was read.
    pub(crate) at: Instant,
    pub(crate) rows: Vec<(Vec<u8>, Vec<u8>)>,
    /// Whether the rows are the whole directory.
    pub(crate) complete: bool,
}

/// What this mount knows of one directory's recent lookups.
enum Ahead {
    /// One cold lookup at this time; a second one soon after reads the directory ahead.
    Seen(Instant),
    /// Found with more than [`MAX_ENTRIES`] entries at this time.
    Large(Instant),
    /// Its rows, read at `at`.
    Read(DirRows),
}

impl Ahead {
    fn at(&self) -> Instant {
        match self {
            Ahead::Seen(at) | Ahead::Large(at) => *at,
            Ahead::Read(r) => r.at,
        }
    }
}

struct DirRows {
    at: Instant,
    /// The directory's stripe change count when its entries were scanned.
    dir_changes: u64,
    /// By name.
    rows: HashMap<Vec<u8>, Row>,
}

struct Row {
    /// The encoded entry.
    entry: Vec<u8>,
    /// The inode row of the id it names (`None`: none was there).
    inode: Option<Vec<u8>>,
    ino: InodeId,
    /// The inode's stripe change count before its row was read.
    changes: u64,
}

/// The read-ahead state of one mount.
#[derive(Default)]
pub(crate) struct LookAhead {
    /// How old a row may be when used; zero: off.
    max_age: Mutex<Duration>,
    dirs: Mutex<HashMap<InodeId, Ahead>>,
    /// Listings of subdirectories read ahead by a readdirplus.
    walked: Mutex<HashMap<InodeId, Walked>>,
}

/// What the read-ahead rows say of one lookup.
pub(crate) enum Answer {
    /// The entry's row and the inode row it names, proven current for this mount.
    Found(Vec<u8>, Vec<u8>),
    /// The rows read for this very lookup have no such name.
    Absent,
    /// Nothing usable: read the store.
    Unknown,
}

impl LookAhead {
    /// Drops every row (an open found a looked-up inode gone).
    pub(crate) fn forget_all(&self) {
        self.dirs.lock().clear();
        self.walked.lock().clear();
    }

    /// How old a row may be when used; zero: reading ahead is off.
    pub(crate) fn max_age(&self) -> Duration {
        *self.max_age.lock()
    }
}

impl Fs {
    /// Lets lookups on a shared store answer from rows read ahead up to `max_age` earlier
    /// (capped at [`MAX_AGE`]; zero, the default, turns it off). The FUSE adapter passes the
    /// kernel's entry and attribute TTLs, which already let answers be that stale.
    pub fn set_lookup_ahead(&self, max_age: Duration) {
        *self.lookahead.max_age.lock() = max_age.min(MAX_AGE);
        if max_age.is_zero() {
            self.lookahead.forget_all();
        }
    }

    /// The answer to a lookup of `name` in `dir` from the rows read ahead, reading the
    /// directory ahead now if this is its second cold lookup within the allowed age. The
    /// caller holds `dir`'s stripe (a reading lock) and is on a shared store.
    pub(crate) fn look_ahead(&self, dir: InodeId, name: &[u8]) -> FsResult<Answer> {
        let max_age = self.lookahead.max_age();
        if max_age.is_zero() {
            return Ok(Answer::Unknown);
        }
        let now = Instant::now();
        let read_now = {
            let mut dirs = self.lookahead.dirs.lock();
            match dirs.get(&dir) {
                Some(Ahead::Read(r)) if now.duration_since(r.at) <= max_age => {
                    return Ok(self.answer_from(dir, r, name));
                }
                Some(Ahead::Large(at)) if now.duration_since(*at) <= LARGE_FOR => {
                    return Ok(Answer::Unknown);
                }
                Some(Ahead::Seen(at)) if now.duration_since(*at) <= max_age => true,
                _ => {
                    remember(&mut dirs, dir, Ahead::Seen(now));
                    false
                }
            }
        };
        if !read_now {
            return Ok(Answer::Unknown);
        }
        let Some(rows) = self.read_dir_ahead(dir)? else {
            remember(&mut self.lookahead.dirs.lock(), dir, Ahead::Large(now));
            return Ok(Answer::Unknown);
        };
        let answer = match self.answer_from(dir, &rows, name) {
            Answer::Unknown if !rows.rows.contains_key(name) => Answer::Absent,
            a => a,
        };
        remember(&mut self.lookahead.dirs.lock(), dir, Ahead::Read(rows));
        Ok(answer)
    }

    /// `name`'s row from `r`, if `r` proves it current for this mount (module comment).
    fn answer_from(&self, dir: InodeId, r: &DirRows, name: &[u8]) -> Answer {
        if self.locks.changes(dir) != r.dir_changes {
            return Answer::Unknown;
        }
        let Some(row) = r.rows.get(name) else {
            return Answer::Unknown;
        };
        let current = self.locks.with_free(row.ino, Some(dir), || {
            self.locks.changes(row.ino) == row.changes
        });
        if current != Some(true) {
            return Answer::Unknown;
        }
        match &row.inode {
            Some(inode) => Answer::Found(row.entry.clone(), inode.clone()),
            None => Answer::Unknown,
        }
    }

    /// Scans `dir` (the caller holds its stripe) and reads the inode rows of its entries in
    /// one multi-get; `None` if it has more than [`MAX_ENTRIES`] entries.
    fn read_dir_ahead(&self, dir: InodeId) -> FsResult<Option<DirRows>> {
        let at = Instant::now();
        let dir_changes = self.locks.changes(dir);
        let (lo, hi) = schema::id_prefix_range(dir);
        let range = KeyRange {
            lo: Bound::Included(lo),
            hi: Bound::Excluded(hi),
        };
        let scanned = self
            .kv
            .scan(self.t.dentry, &range, Direction::Forward, MAX_ENTRIES + 1)?;
        if scanned.len() > MAX_ENTRIES {
            return Ok(None);
        }
        let mut named = Vec::with_capacity(scanned.len());
        for (key, entry) in scanned {
            let name = schema::name_of(&key)?.to_vec();
            let ino = Dentry::decode(&entry)?.id();
            // Before the inode row is read: a stat change finishing after this moves it.
            let changes = self.locks.changes(ino);
            named.push((name, entry, ino, changes));
        }
        let keys: Vec<(fern_kv::TreeId, Vec<u8>)> = named
            .iter()
            .map(|(_, _, ino, _)| (self.t.inode, schema::id_key(*ino)))
            .collect();
        let inodes = self.kv.get_many(&keys)?;
        let rows = named
            .into_iter()
            .zip(inodes)
            .map(|((name, entry, ino, changes), inode)| {
                (
                    name,
                    Row {
                        entry,
                        inode,
                        ino,
                        changes,
                    },
                )
            })
            .collect();
        Ok(Some(DirRows {
            at,
            dir_changes,
            rows,
        }))
    }
}

impl Fs {
    /// Keeps the listing of subdirectory `dir` of `parent` read ahead at `at`, `changes` being
    /// its stripe's change count taken before the read.
    pub(crate) fn remember_walked(
        &self,
        dir: InodeId,
        parent: InodeId,
        at: Instant,
        changes: u64,
        rows: Vec<(Vec<u8>, Vec<u8>)>,
    ) {
        let mut w = self.lookahead.walked.lock();
        if w.len() >= MAX_DIRS && !w.contains_key(&dir) {
            // Oldest first; expired ones are gone anyway.
            w.retain(|_, v| v.at.elapsed() <= MAX_AGE);
            if w.len() >= MAX_DIRS {
                if let Some(oldest) = w.iter().min_by_key(|(_, v)| v.at).map(|(d, _)| *d) {
                    w.remove(&oldest);
                }
            }
        }
        w.insert(
            dir,
            Walked {
                parent,
                at,
                changes,
                rows,
            },
        );
    }

    /// The directory to list as `dir`'s `..`: the one whose listing read `dir`'s names ahead,
    /// under the same rules as those names (a rename of `dir` holds its stripe), else the
    /// store's answer ([`Fs::parent_of`]). Saves a listing's round trip on a shared store.
    pub fn listed_parent_of(&self, dir: InodeId) -> FsResult<InodeId> {
        if let Some(w) = self.lookahead.walked.lock().get(&dir) {
            if w.at.elapsed() <= self.lookahead.max_age() && self.locks.changes(dir) == w.changes {
                return Ok(w.parent);
            }
        }
        self.parent_of(dir)
    }

    /// The listing of `dir` read ahead, if it is recent enough and no change of this mount
    /// under `dir`'s stripe finished since its read (module comment); used once.
    pub(crate) fn take_walked(&self, dir: InodeId) -> Option<WalkedRows> {
        let w = self.lookahead.walked.lock().remove(&dir)?;
        let age = self.lookahead.max_age();
        if w.at.elapsed() > age || self.locks.changes(dir) != w.changes {
            return None;
        }
        Some(WalkedRows {
            at: w.at,
            complete: w.rows.len() < WALK_ROWS,
            rows: w.rows,
        })
    }
}

/// Records `a` for `dir`, first dropping the oldest directory when [`MAX_DIRS`] are kept.
fn remember(dirs: &mut HashMap<InodeId, Ahead>, dir: InodeId, a: Ahead) {
    if dirs.len() >= MAX_DIRS && !dirs.contains_key(&dir) {
        if let Some(oldest) = dirs.iter().min_by_key(|(_, a)| a.at()).map(|(d, _)| *d) {
            dirs.remove(&oldest);
        }
    }
    dirs.insert(dir, a);
}
