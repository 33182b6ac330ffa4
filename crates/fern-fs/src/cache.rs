//! In-memory state of one mount: where each known inode's stat lives, how often the kernel
//! (or the path API) holds it, how often it is open; and the name cache that answers existence
//! checks without a read. It owns no persistent data and must never be the only record of
//! anything: dropping it (a crash) loses nothing the store does not also know, except which
//! files were open (the orphan records cover that).
//!
//! Several of these answer from memory what only holds while this mount is the only writer
//! of its store (name sets, directory entries, file shapes). On a shared store
//! (`KvStore::session` is `Some`, read once at `Fs::mount`) each is built switched off
//! ([`Inodes::new`], [`NameCache::new`], [`DirEntries::new`]) and every question goes to the
//! store (docs/distributed.md §7).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use foldhash::{HashMap, HashSet, HashSetExt};

use parking_lot::Mutex;

use crate::attr::FileType;
use crate::ids::InodeId;

/// Where an inode's stat is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Inline in the directory entry (parent, name).
    Entry {
        /// Parent directory.
        parent: InodeId,
        /// Name in the parent.
        name: Vec<u8>,
    },
    /// In the `inode` tree under its id.
    Inode,
    /// Removed: unlinked and not open.
    Gone,
}

/// What this mount knows about an inode it has handed out.
#[derive(Clone, Debug)]
pub struct Known {
    /// Stat location.
    pub loc: Loc,
    /// File type (never changes).
    pub kind: FileType,
    /// Outstanding lookups (FUSE's lookup count).
    pub lookups: u64,
    /// Open handles.
    pub opens: u32,
    /// Unlinked while open: freed at the last release.
    pub orphan: bool,
    /// A regular file's size and stored blocks, once an operation needed them (stored.rs).
    pub(crate) shape: Option<crate::stored::Shape>,
    /// Known to have no extended attribute (ACLs included): made by this mount without
    /// inherited ACLs and given none since. Then getxattr (the kernel asks for
    /// `security.capability` before the first write of every new file), listxattr and
    /// chmod's ACL check read nothing. Cleared before any attribute is stored; exact under
    /// the single-writer rule, like `shape`, and never trusted on a shared store (another
    /// mount may set an attribute).
    pub(crate) xattr_free: bool,
    /// The stat mirror: the inode's stat as the store holds it, so getattr, setattr's reply
    /// and read's size check need no read (docs/fs-design.md §4, "stat mirror"). Exact under
    /// the single-writer rule: every stat write of the inode holds its stripe lock and drops
    /// this before committing ([`Inodes::drop_stat`], called by `Fs::upsert_stat` and by every
    /// put of a stat); only a holder of that lock sets it ([`Inodes::set_stat`]), or a reader
    /// that proves no lock holder finished during its read ([`Inodes::seed_stat`]). Never
    /// kept on a shared store. Bounded by the table: one stat per inode the kernel holds.
    pub(crate) stat: Option<crate::attr::Stat>,
    /// Looked up again since the clock's hand last passed ([`Inodes::release_candidates`]).
    referenced: bool,
    /// Named for the kernel to forget, and neither forgotten nor passed by the hand since.
    asked: bool,
}

/// The inode table.
///
/// **Bounded in memory** when a budget gives it a share ([`Inodes::set_max_bytes`]): the
/// kernel decides how many inodes it holds (one entry per inode it was handed and has not
/// forgotten), so the table cannot simply drop entries — an inode the kernel holds must
/// always resolve. Past its bound the table instead names inodes the kernel could let go
/// ([`Inodes::release_candidates`], a clock over the entries: least recently looked up first,
/// never an open or orphaned one or the root); the FUSE adapter asks the kernel to drop them,
/// and its FORGETs then remove the entries (docs/fs-design.md §4, "A bounded inode table").
#[derive(Default)]
pub struct Inodes {
    table: Mutex<Table>,
    /// Hash of (parent, name) → the inode last pinned or moved there with its stat inline in
    /// that entry: a hint that lets unlink skip reading the entry the kernel's lookup just
    /// read. Never trusted alone (a stale or colliding hint names another inode):
    /// [`Inodes::inline_file_at`] checks the inode's own location (exact for every inode in
    /// the table) under the locks. Cleared when it holds more hints than the table may hold
    /// entries.
    by_name: Mutex<HashMap<u64, InodeId>>,
    /// Bumped by every committed change of a file's shape: a lookup that read a stat seeds
    /// the shape from it only if no change committed since it started (stored.rs).
    shape_epoch: AtomicU64,
    /// Another mount may change a file's size and blocks: no shape is ever answered from
    /// memory (stored.rs reads the stat each time).
    shared: bool,
    /// Bound on the table's memory in bytes ([`Inodes::set_max_bytes`]); 0: none.
    max_bytes: AtomicUsize,
    /// The table holds more than its bound allows: read without the lock after every reply
    /// that pins an inode, to wake whoever asks the kernel to forget.
    over: AtomicBool,
    /// Inodes [`Inodes::release_candidates`] has named since the mount.
    released: AtomicU64,
}

/// The entries and what the bound needs to know about them.
#[derive(Default)]
struct Table {
    /// Boxed: a listing of 20,000 new names pins 20,000 inodes, and growing a table of
    /// ~170-byte entries by rehashing (moving every entry to a new table twice its size) was
    /// a sixth of F2's cold walk; boxed, a rehash moves 16 bytes per entry.
    map: HashMap<InodeId, Box<Known>>,
    /// What the entries' names cost besides the entries themselves ([`name_cost`]).
    name_bytes: usize,
    /// Entries named for the kernel to forget whose FORGET has not come yet (`Known::asked`):
    /// the next round names only what these will not already free.
    asked: usize,
    /// The clock of [`Inodes::release_candidates`]: ids in the order they entered the table,
    /// each pushed to the back again as the hand passes it. Ids no longer in the table are
    /// dropped when the hand reaches them, or all at once when they outnumber the entries.
    clock: VecDeque<InodeId>,
}

/// What one hash-table bucket of the table costs: the entry and its control byte, a name
/// hint's, and the clock's slots (up to two per entry before it is compacted).
const BUCKET_BYTES: usize = std::mem::size_of::<(InodeId, Box<Known>)>()
    + 1
    + std::mem::size_of::<(u64, InodeId)>()
    + 1
    + 2 * std::mem::size_of::<InodeId>();

/// What one entry's box costs the allocator (its size class: jemalloc's classes between 128
/// and 256 bytes are 32 bytes apart).
const KNOWN_BYTES: usize = std::mem::size_of::<Known>().next_multiple_of(32);

/// Fewest entries a bounded table may hold before it asks the kernel to forget: the capacity
/// of 1,024 buckets.
const MIN_ENTRIES: usize = 1024 / 8 * 7;

/// What `loc`'s name costs the allocator: its capacity in 16-byte steps (jemalloc's small
/// size classes), nothing for a location without a name.
fn name_cost(loc: &Loc) -> usize {
    match loc {
        Loc::Entry { name, .. } if name.capacity() > 0 => name.capacity().next_multiple_of(16),
        _ => 0,
    }
}

/// Most entries a table may hold in `bytes` when each name costs `name` bytes: the capacity
/// of the largest power-of-two bucket count that fits with the names of that many entries (a
/// hash table grows by doubling, so one entry more than that capacity would double the
/// allocation), at least [`MIN_ENTRIES`].
fn entries_within(bytes: usize, name: usize) -> usize {
    let buckets = bytes / (BUCKET_BYTES + (KNOWN_BYTES + name) * 7 / 8);
    let pow = if buckets == 0 {
        0
    } else {
        1usize << (usize::BITS - 1 - buckets.leading_zeros())
    };
    (pow / 8 * 7).max(MIN_ENTRIES)
}

/// The key of the (parent, name) hint.
fn hint_key(parent: InodeId, name: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x6e61_6d65).hash_one((parent.0, name))
}

/// An inode the kernel may be asked to forget. A kernel that cannot prune by inode is asked
/// to drop its name instead (`Fs::inode_entry` finds it then: a name is copied only there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Releasable {
    /// The inode.
    pub id: InodeId,
    /// A directory: only the kernel's prune may be used (dropping its name would make the
    /// working directory of a process in it unreachable by name: `getcwd` fails).
    pub is_dir: bool,
}

/// Figures of the inode table (`fernfs stat` of a mount).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeTableFigures {
    /// Inodes known (the kernel holds them, or they are open).
    pub entries: u64,
    /// Memory the table is counted at: its buckets and names.
    pub bytes: u64,
    /// Its bound; 0: none.
    pub max_bytes: u64,
    /// Inodes named to the kernel to forget since the mount.
    pub released: u64,
}

impl Table {
    /// Buckets the map has allocated (hash tables keep 1/8 free).
    fn bytes(&self) -> usize {
        let cap = self.map.capacity();
        let buckets = if cap == 0 {
            0
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * BUCKET_BYTES + self.map.len() * KNOWN_BYTES + self.name_bytes
    }

    /// Most entries `max_bytes` allows with names as long as the table's now are on average
    /// (`None`: unbounded).
    fn max_entries(&self, max_bytes: usize) -> Option<usize> {
        let name = match self.map.len() {
            0 => 16,
            n => self.name_bytes.div_ceil(n),
        };
        (max_bytes > 0).then(|| entries_within(max_bytes, name))
    }

    fn remove(&mut self, id: InodeId) {
        if let Some(k) = self.map.remove(&id) {
            self.name_bytes -= name_cost(&k.loc);
            self.asked -= usize::from(k.asked);
        }
    }
}

impl Inodes {
    /// An empty table; `shared`: the store has other writers (shapes are never trusted).
    pub fn new(shared: bool) -> Self {
        Self {
            shared,
            ..Self::default()
        }
    }

    /// Bounds the table's memory to `bytes` (0: no bound): past it, the table names inodes
    /// for the kernel to forget ([`Inodes::release_candidates`]).
    pub fn set_max_bytes(&self, bytes: usize) {
        self.max_bytes.store(bytes, Ordering::Relaxed);
        let mut t = self.table.lock();
        self.note_size(&mut t);
    }

    /// Whether the table holds more entries than its bound allows.
    pub fn over_bound(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// The table's figures.
    pub fn figures(&self) -> InodeTableFigures {
        let t = self.table.lock();
        InodeTableFigures {
            entries: t.map.len() as u64,
            bytes: t.bytes() as u64,
            max_bytes: self.max_bytes.load(Ordering::Relaxed) as u64,
            released: self.released.load(Ordering::Relaxed),
        }
    }

    /// Sets `over` from the table's size: past 7/8 of the most entries the bound allows, not
    /// at it, since the kernel forgets asynchronously and one entry past the most would double
    /// the table's allocation. A table that grew past the most (a burst outran the kernel's
    /// forgetting) gives the larger allocation back once it is below that point again.
    fn note_size(&self, t: &mut Table) {
        let max = t.max_entries(self.max_bytes.load(Ordering::Relaxed));
        if let Some(max) = max {
            if t.map.capacity() > max && t.map.len() <= max - max / 8 {
                t.map.shrink_to(max);
            }
        }
        let over = max.is_some_and(|max| t.map.len() > max - max / 8);
        if over != self.over.load(Ordering::Relaxed) {
            self.over.store(over, Ordering::Relaxed);
        }
    }

    /// Up to `n` inodes for the kernel to forget so that the table gets back to 3/4 of what
    /// its bound allows; none when it is within the bound. A clock: the hand passes each entry
    /// in the order they came, an entry looked up since the hand last passed is spared once,
    /// and the root, open files, orphans and inodes stored outside an entry (several links)
    /// are never named. A named inode stays in the table until the kernel's FORGET; if the
    /// kernel keeps it, the hand names it again a revolution later.
    pub fn release_candidates(&self, n: usize) -> Vec<Releasable> {
        let mut t = self.table.lock();
        let Some(max) = t.max_entries(self.max_bytes.load(Ordering::Relaxed)) else {
            return Vec::new();
        };
        let target = max / 4 * 3;
        let want = t.map.len().saturating_sub(target + t.asked).min(n);
        let mut out = Vec::with_capacity(want);
        let Table {
            map, clock, asked, ..
        } = &mut *t;
        let mut steps = clock.len();
        while out.len() < want && steps > 0 {
            steps -= 1;
            let Some(id) = clock.pop_front() else {
                break;
            };
            let Some(k) = map.get_mut(&id) else {
                continue; // forgotten since it entered the clock
            };
            clock.push_back(id);
            if std::mem::take(&mut k.asked) {
                // Named a revolution ago and still here: the kernel kept it (in use).
                *asked -= 1;
            }
            if std::mem::take(&mut k.referenced) {
                continue;
            }
            if id == InodeId::ROOT || k.opens > 0 || k.orphan || k.lookups == 0 {
                continue;
            }
            if let Loc::Entry { .. } = &k.loc {
                k.asked = true;
                *asked += 1;
                out.push(Releasable {
                    id,
                    is_dir: k.kind == FileType::Directory,
                });
            }
        }
        if clock.len() > 2 * map.len() + MIN_ENTRIES {
            let mut seen = HashSet::with_capacity(map.len());
            clock.retain(|id| map.contains_key(id) && seen.insert(*id));
            clock.shrink_to(2 * map.len() + MIN_ENTRIES);
        }
        self.released.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// The current shape epoch; read before reading a stat that may seed a shape.
    pub(crate) fn shape_epoch(&self) -> u64 {
        self.shape_epoch.load(Ordering::Acquire)
    }

    /// The shape of `id`, if known (without cloning the rest of its entry: every write asks).
    pub(crate) fn shape(&self, id: InodeId) -> Option<crate::stored::Shape> {
        if self.shared {
            return None;
        }
        self.table.lock().map.get(&id).and_then(|k| k.shape)
    }

    /// Records a committed shape change of `id`.
    pub(crate) fn set_shape(&self, id: InodeId, shape: crate::stored::Shape) {
        let mut t = self.table.lock();
        self.shape_epoch.fetch_add(1, Ordering::AcqRel);
        if let Some(k) = t.map.get_mut(&id) {
            k.shape = Some(shape);
        }
    }

    /// Gives `id` the shape a stat read since `epoch` showed, unless it has one or a shape
    /// changed meanwhile (then the read may be stale, and the first operation that needs the
    /// shape reads it under the inode's lock).
    pub(crate) fn seed_shape(&self, id: InodeId, shape: crate::stored::Shape, epoch: u64) {
        let mut t = self.table.lock();
        if self.shape_epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        if let Some(k) = t.map.get_mut(&id) {
            k.shape.get_or_insert(shape);
        }
    }

    /// The mirrored stat of `id`, if this mount has one (never on a shared store). The caller
    /// holds `id`'s lock, or accepts an answer that was exact when it was given.
    pub(crate) fn stat(&self, id: InodeId) -> Option<crate::attr::Stat> {
        if self.shared {
            return None;
        }
        self.table.lock().map.get(&id).and_then(|k| k.stat)
    }

    /// Forgets the mirrored stat of `id`: a stat write of it is about to commit. The caller
    /// holds `id`'s lock, so no one sets it again before the write has committed. Returns what
    /// was mirrored: the value before that write.
    pub(crate) fn drop_stat(&self, id: InodeId) -> Option<crate::attr::Stat> {
        self.table
            .lock()
            .map
            .get_mut(&id)
            .and_then(|k| k.stat.take())
    }

    /// Mirrors `stat` for `id`, which the caller read or computed from the store's value while
    /// holding `id`'s lock (no stat write of `id` in flight).
    pub(crate) fn set_stat(&self, id: InodeId, stat: crate::attr::Stat) {
        if self.shared {
            return;
        }
        if let Some(k) = self.table.lock().map.get_mut(&id) {
            k.stat = Some(stat);
        }
    }

    /// Remembers that `id` is at `loc` for [`Inodes::inline_file_at`] (regular files inline in
    /// an entry only: the only ones whose removal it can answer).
    fn hint(&self, id: InodeId, loc: &Loc, kind: FileType) {
        if self.shared || kind != FileType::Regular {
            return;
        }
        if let Loc::Entry { parent, name } = loc {
            let max = match self.max_bytes.load(Ordering::Relaxed) {
                0 => MAX_NAME_HINTS,
                b => entries_within(b, 16).min(MAX_NAME_HINTS),
            };
            let mut h = self.by_name.lock();
            if h.len() >= max {
                // Forgetting costs a read later, never correctness.
                h.clear();
            }
            h.insert(hint_key(*parent, name), id);
        }
    }

    /// The regular file whose stat is inline in entry `name` of `parent`, with that stat
    /// (from the mirror), when this mount knows it exactly; the caller holds the locks of
    /// `parent` and of the returned inode's id, which it must check with
    /// [`Inodes::name_hint`] first. Exact because every inode's location in the table is
    /// (the single-writer rule, above), and the mirror is.
    pub(crate) fn inline_file_at(
        &self,
        id: InodeId,
        parent: InodeId,
        name: &[u8],
    ) -> Option<crate::attr::Stat> {
        if self.shared {
            return None;
        }
        let t = self.table.lock();
        let k = t.map.get(&id)?;
        let here = matches!(&k.loc, Loc::Entry { parent: p, name: n } if *p == parent && n == name);
        (here && !k.orphan && k.kind == FileType::Regular)
            .then_some(k.stat)
            .flatten()
    }

    /// The inode last known at (parent, name) with an inline stat; only a hint.
    pub(crate) fn name_hint(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        if self.shared {
            return None;
        }
        self.by_name.lock().get(&hint_key(parent, name)).copied()
    }

    /// Records a lookup of `id` (pin count + 1) at `loc`.
    pub fn pin(&self, id: InodeId, loc: Loc, kind: FileType) {
        self.hint(id, &loc, kind);
        let mut t = self.table.lock();
        let added = name_cost(&loc);
        let Table {
            map,
            name_bytes,
            clock,
            ..
        } = &mut *t;
        let mut new = false;
        let e = map.entry(id).or_insert_with(|| {
            new = true;
            Box::new(Known {
                loc: Loc::Gone,
                kind,
                lookups: 0,
                opens: 0,
                orphan: false,
                shape: None,
                xattr_free: false,
                stat: None,
                referenced: false,
                asked: false,
            })
        });
        *name_bytes = *name_bytes + added - name_cost(&e.loc);
        e.loc = loc;
        e.lookups = e.lookups.saturating_add(1);
        e.referenced = !new;
        if new {
            clock.push_back(id);
            self.note_size(&mut t);
        }
    }

    /// Drops `n` lookups; forgets the inode when nothing holds it.
    pub fn forget(&self, id: InodeId, n: u64) {
        let mut t = self.table.lock();
        if let Some(e) = t.map.get_mut(&id) {
            e.lookups = e.lookups.saturating_sub(n);
            if e.lookups == 0 && e.opens == 0 && id != InodeId::ROOT {
                t.remove(id);
                self.note_size(&mut t);
            }
        }
    }

    /// Runs `f` on what is known about `id`, if anything, without copying it (a `Known` carries a
    /// name and a stat: cloning one per request was 1.6 % of postmark's request threads).
    pub fn with<T>(&self, id: InodeId, f: impl FnOnce(&Known) -> T) -> Option<T> {
        self.table.lock().map.get(&id).map(|k| f(k))
    }

    /// Whether `id` is known to have no extended attribute (see [`Known::xattr_free`]).
    pub(crate) fn xattr_free(&self, id: InodeId) -> bool {
        !self.shared && self.table.lock().map.get(&id).is_some_and(|k| k.xattr_free)
    }

    /// Runs `f` on the entry of `id`, if known.
    pub fn update<T>(&self, id: InodeId, f: impl FnOnce(&mut Known) -> T) -> Option<T> {
        let mut t = self.table.lock();
        let k = t.map.get_mut(&id)?;
        let before = name_cost(&k.loc);
        let out = f(k);
        let after = name_cost(&k.loc);
        t.name_bytes = t.name_bytes + after - before;
        Some(out)
    }

    /// Moves `id` to `loc` if it is known (an unknown inode needs no bookkeeping).
    pub fn relocate(&self, id: InodeId, loc: Loc) {
        if let Some(kind) = self.update(id, |k| {
            k.loc = loc.clone();
            k.kind
        }) {
            self.hint(id, &loc, kind);
        }
    }

    /// Removes the entry when nothing holds it any more.
    pub fn drop_if_unused(&self, id: InodeId) {
        let mut t = self.table.lock();
        if t.map
            .get(&id)
            .is_some_and(|e| e.lookups == 0 && e.opens == 0 && id != InodeId::ROOT)
        {
            t.remove(id);
            self.note_size(&mut t);
        }
    }
}

/// Most (parent, name) hints [`Inodes`] keeps before it starts over.
const MAX_NAME_HINTS: usize = 1 << 16;

/// Most names remembered for one directory; a bigger directory falls back to reads.
const MAX_NAMES_PER_DIR: usize = 100_000;
/// Most directories tracked at once.
const MAX_DIRS: usize = 4096;
/// Memory a remembered name is counted at besides its bytes: its `Vec` (24), its slot in the
/// set's table with the table's slack (~16) and the allocation's rounding (~8).
const NAME_OVERHEAD: usize = 48;
/// Default bound on the name sets' memory ([`NameCache::set_max_bytes`]): 32 MiB, about
/// 400,000 names of 32 bytes.
pub const DEFAULT_NAME_BYTES: usize = 32 << 20;

/// Complete name sets of directories this mount created (so it has seen every name in them).
/// A name absent from a complete set does not exist; that answers the kernel's lookup before a
/// create and the create's own existence check without a read. Sound only because one mount is
/// the only writer of its store (docs/fs-design.md, "single writer"): off on a shared store,
/// where another mount may add a name to a directory this one created.
///
/// Bounded in memory as well as in count: past `max_bytes` the largest set is forgotten
/// (forgetting a set only costs reads later, never correctness), so a mount inside a memory
/// budget (`-o memory=`) does not grow with the files it creates.
#[derive(Default)]
pub struct NameCache {
    dirs: Mutex<NameSets>,
    /// Never complete: every existence question is read from the store.
    off: bool,
}

#[derive(Default)]
struct NameSets {
    /// Each tracked directory's names and the bytes they are counted at.
    sets: HashMap<InodeId, (HashSet<Vec<u8>>, usize)>,
    /// Sum of the sets' bytes.
    bytes: usize,
    /// Bound on `bytes`; 0: [`DEFAULT_NAME_BYTES`].
    max_bytes: usize,
}

impl NameSets {
    fn forget(&mut self, dir: InodeId) {
        if let Some((_, b)) = self.sets.remove(&dir) {
            self.bytes -= b;
        }
    }

    /// Forgets the largest sets until the bound holds.
    fn shrink(&mut self) {
        let max = match self.max_bytes {
            0 => DEFAULT_NAME_BYTES,
            m => m,
        };
        while self.bytes > max {
            let Some(victim) = self
                .sets
                .iter()
                .max_by_key(|(_, (_, b))| *b)
                .map(|(d, _)| *d)
            else {
                break;
            };
            self.forget(victim);
        }
    }
}

impl NameCache {
    /// An empty cache; `shared`: the store has other writers, and the cache stays empty.
    pub fn new(shared: bool) -> Self {
        Self {
            off: shared,
            ..Self::default()
        }
    }

    /// Bounds the memory of the name sets (default [`DEFAULT_NAME_BYTES`]); forgets the
    /// largest sets at once if they are over it.
    pub fn set_max_bytes(&self, bytes: usize) {
        let mut d = self.dirs.lock();
        d.max_bytes = bytes.max(1);
        d.shrink();
    }

    /// Memory the name sets are counted at.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.dirs.lock().bytes
    }

    /// `dir` was just created: it is complete and empty.
    pub fn new_dir(&self, dir: InodeId) {
        if self.off {
            return;
        }
        let mut d = self.dirs.lock();
        if d.sets.len() >= MAX_DIRS {
            // Forgetting a directory only costs reads later, never correctness.
            if let Some(victim) = d.sets.keys().next().copied() {
                d.forget(victim);
            }
        }
        d.forget(dir);
        d.sets.insert(dir, (HashSet::new(), 0));
    }

    /// `Some(exists)` when `dir` is complete, `None` when unknown.
    pub fn contains(&self, dir: InodeId, name: &[u8]) -> Option<bool> {
        self.dirs
            .lock()
            .sets
            .get(&dir)
            .map(|(names, _)| names.contains(name))
    }

    /// `Some(true)` when `dir` is complete and holds no name, `None` when unknown.
    pub fn is_empty(&self, dir: InodeId) -> Option<bool> {
        self.dirs
            .lock()
            .sets
            .get(&dir)
            .map(|(names, _)| names.is_empty())
    }

    /// `name` now exists in `dir`.
    pub fn insert(&self, dir: InodeId, name: &[u8]) {
        let mut d = self.dirs.lock();
        let Some((names, bytes)) = d.sets.get_mut(&dir) else {
            return;
        };
        if names.len() >= MAX_NAMES_PER_DIR {
            d.forget(dir);
            return;
        }
        if names.insert(name.to_vec()) {
            let b = name.len() + NAME_OVERHEAD;
            *bytes += b;
            d.bytes += b;
            d.shrink();
        }
    }

    /// `name` no longer exists in `dir`.
    pub fn remove(&self, dir: InodeId, name: &[u8]) {
        let mut d = self.dirs.lock();
        let Some((names, bytes)) = d.sets.get_mut(&dir) else {
            return;
        };
        if names.remove(name) {
            let b = name.len() + NAME_OVERHEAD;
            *bytes -= b;
            d.bytes -= b;
        }
    }

    /// `dir` was removed.
    pub fn drop_dir(&self, dir: InodeId) {
        self.dirs.lock().forget(dir);
    }
}

/// Most directory entries [`DirEntries`] remembers before it starts over.
const MAX_DIR_ENTRIES: usize = 1 << 16;

/// Where the subdirectories this mount has looked up or made are: (parent, name) → (id, stat
/// location). Path walks (the library API's every call) resolve their directory components
/// from it without a read. Only directories are kept: their entry never changes while it
/// exists except by rename or rmdir, which forget it under the parent's lock — the same lock
/// every fill and every hit takes, so a hit is exactly what the store would answer. Sound only
/// under the single-writer rule, like [`NameCache`]: off on a shared store, where another
/// mount may rename or remove the directory.
#[derive(Default)]
pub struct DirEntries {
    map: Mutex<HashMap<DirKey, (InodeId, Loc)>>,
    /// Remembers nothing: every path component is looked up in the store.
    off: bool,
    /// Most entries before it starts over ([`DirEntries::set_max_bytes`]); 0: [`MAX_DIR_ENTRIES`].
    max: AtomicUsize,
}

/// What a remembered directory entry is counted at: its slot (key, id and location) with the
/// table's slack, and its two copies of the name.
const DIR_ENTRY_BYTES: usize = std::mem::size_of::<(DirKey, (InodeId, Loc))>() * 8 / 7 + 2 * 32;

/// (parent, name) of a directory entry.
type DirKey = (InodeId, Vec<u8>);

impl DirEntries {
    /// An empty table; `shared`: the store has other writers, and the table stays empty.
    pub fn new(shared: bool) -> Self {
        Self {
            off: shared,
            ..Self::default()
        }
    }

    /// Bounds the table to about `bytes` (at most [`MAX_DIR_ENTRIES`] entries, at least 64).
    pub fn set_max_bytes(&self, bytes: usize) {
        let n = (bytes / DIR_ENTRY_BYTES).clamp(64, MAX_DIR_ENTRIES);
        self.max.store(n, Ordering::Relaxed);
    }

    /// The directory `name` in `parent`, if remembered.
    pub fn get(&self, parent: InodeId, name: &[u8]) -> Option<(InodeId, Loc)> {
        // The key is built only to probe; directory names are short.
        self.map.lock().get(&(parent, name.to_vec())).cloned()
    }

    /// Directory `id` is `name` in `parent`, its stat at `loc`.
    pub fn put(&self, parent: InodeId, name: &[u8], id: InodeId, loc: Loc) {
        if self.off {
            return;
        }
        let max = match self.max.load(Ordering::Relaxed) {
            0 => MAX_DIR_ENTRIES,
            n => n,
        };
        let mut m = self.map.lock();
        if m.len() >= max {
            // Forgetting costs reads later, never correctness.
            m.clear();
        }
        m.insert((parent, name.to_vec()), (id, loc));
    }

    /// `name` in `parent` was removed or now names something else.
    pub fn forget(&self, parent: InodeId, name: &[u8]) {
        self.map.lock().remove(&(parent, name.to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("file-{i:010}").into_bytes())
            .collect()
    }

    #[test]
    fn name_sets_stay_inside_their_byte_bound_by_forgetting_the_largest() {
        let c = NameCache::new(false);
        let (small, big) = (InodeId(10), InodeId(11));
        c.new_dir(small);
        c.new_dir(big);
        for n in names(10) {
            c.insert(small, &n);
        }
        for n in names(1000) {
            c.insert(big, &n);
        }
        let per = 15 + NAME_OVERHEAD;
        assert_eq!(c.bytes(), 1010 * per);
        // A bound below both: the largest set goes, the small one stays complete.
        c.set_max_bytes(500 * per);
        assert_eq!(
            c.contains(big, b"file-0000000001"),
            None,
            "forgotten: ask the store"
        );
        assert_eq!(c.contains(small, b"file-0000000001"), Some(true));
        assert_eq!(c.contains(small, b"absent"), Some(false));
        assert_eq!(c.bytes(), 10 * per);
        // Inserts past the bound forget again; removals and dropped directories give back.
        c.new_dir(big);
        for n in names(600) {
            c.insert(big, &n);
            assert!(c.bytes() <= 500 * per, "{}", c.bytes());
        }
        c.remove(small, b"file-0000000001");
        assert_eq!(c.contains(small, b"file-0000000001"), Some(false));
        c.drop_dir(small);
        assert_eq!(c.contains(small, b"file-0000000002"), None);
        assert_eq!(
            c.bytes(),
            c.dirs.lock().sets.values().map(|(_, b)| b).sum::<usize>()
        );
    }

    fn entry(parent: u64, name: &str) -> Loc {
        Loc::Entry {
            parent: InodeId(parent),
            name: name.as_bytes().to_vec(),
        }
    }

    /// Issue 16, "one memory budget": the kernel decides which inodes it holds, so a bounded
    /// table names inodes for it to forget — past 7/8 of what its bound allows, down to 3/4,
    /// oldest first, sparing an inode looked up again once, and never the root, an open file,
    /// an orphan or an inode stored outside an entry — and the FORGETs bring it back inside.
    #[test]
    fn a_bounded_inode_table_names_what_the_kernel_may_forget() {
        let t = Inodes::new(false);
        t.pin(InodeId::ROOT, Loc::Inode, FileType::Directory);
        for i in 2..5000u64 {
            t.pin(InodeId(i), entry(1, &format!("f{i}")), FileType::Regular);
        }
        assert!(!t.over_bound(), "unbounded by default");
        assert!(t.release_candidates(usize::MAX).is_empty());

        let bound = entries_within(1 << 20, 16);
        assert!(bound > MIN_ENTRIES && bound < 4000, "{bound}");
        t.set_max_bytes(1 << 20);
        assert!(t.over_bound());
        // Never named: open (2), orphaned (3), stored in the inode tree (4); 5 was looked up
        // again, so the hand spares it once.
        t.update(InodeId(2), |k| k.opens = 1);
        t.update(InodeId(3), |k| k.orphan = true);
        t.relocate(InodeId(4), Loc::Inode);
        t.pin(InodeId(5), entry(1, "f5"), FileType::Regular);

        let max = t.table.lock().max_entries(1 << 20).unwrap();
        let first = t.release_candidates(100);
        assert_eq!(first.len(), 100, "at most what was asked for");
        let ids: Vec<u64> = first.iter().map(|r| r.id.0).collect();
        assert_eq!(
            ids,
            (6..106).collect::<Vec<_>>(),
            "oldest first, 1-5 passed over"
        );
        assert_eq!(
            first[0],
            Releasable {
                id: InodeId(6),
                is_dir: false,
            }
        );
        let rest = t.release_candidates(usize::MAX);
        let len = t.table.lock().map.len();
        assert_eq!(
            rest.len(),
            len - max / 4 * 3 - 100,
            "down to 3/4 of the bound"
        );
        assert!(rest.iter().all(|r| r.id.0 > 105 && r.id.0 != 5));
        // The kernel forgets all but the first round's (it keeps those, as for a file in
        // use); the table is back inside its bound.
        for r in &rest {
            t.forget(r.id, 1);
        }
        assert!(!t.over_bound());
        assert!(t.release_candidates(usize::MAX).is_empty());
        let f = t.figures();
        assert_eq!(f.entries as usize, len - rest.len());
        assert_eq!(f.released as usize, first.len() + rest.len());
        assert!(f.bytes <= f.max_bytes, "{f:?}");

        // An entry looked up again is spared for one revolution of the hand, then named.
        let u = Inodes::new(false);
        for i in 10..1110u64 {
            u.pin(InodeId(i), entry(1, &format!("g{i}")), FileType::Regular);
            u.pin(InodeId(i), entry(1, &format!("g{i}")), FileType::Regular);
        }
        u.set_max_bytes(1);
        assert!(u.over_bound());
        assert!(
            u.release_candidates(usize::MAX).is_empty(),
            "all spared once"
        );
        let named = u.release_candidates(usize::MAX);
        let want = 1100 - MIN_ENTRIES / 4 * 3;
        assert_eq!(named.len(), want);
        assert_eq!(named[0].id, InodeId(10));
    }

    /// The names the table counts follow every change of a location, so its bytes are the
    /// names it holds (a rename to a long name is counted, a forget gives it back).
    #[test]
    fn the_inode_table_counts_the_names_it_holds() {
        let t = Inodes::new(false);
        t.pin(InodeId(7), entry(1, "a"), FileType::Regular);
        assert_eq!(t.table.lock().name_bytes, 16);
        t.relocate(InodeId(7), entry(1, &"x".repeat(100)));
        assert_eq!(t.table.lock().name_bytes, 112);
        t.update(InodeId(7), |k| k.loc = Loc::Gone);
        assert_eq!(t.table.lock().name_bytes, 0);
        t.pin(InodeId(7), entry(2, "bb"), FileType::Regular);
        t.pin(InodeId(8), entry(2, "cc"), FileType::Directory);
        assert_eq!(t.table.lock().name_bytes, 32);
        t.forget(InodeId(7), 2);
        t.forget(InodeId(8), 1);
        assert_eq!(t.table.lock().name_bytes, 0);
        assert_eq!(t.figures().entries, 0);
    }

    /// A budget's share bounds the directory entries of path walks too (they used to be
    /// bounded only by count, 65,536 entries of ~150 bytes whatever the budget).
    #[test]
    fn directory_entries_stay_inside_their_share() {
        let d = DirEntries::new(false);
        d.set_max_bytes(100 * DIR_ENTRY_BYTES);
        for i in 0..1000u64 {
            let name = format!("dir-{i}");
            d.put(
                InodeId(1),
                name.as_bytes(),
                InodeId(i + 10),
                entry(1, &name),
            );
            assert!(d.map.lock().len() <= 100);
        }
        assert!(
            d.get(InodeId(1), b"dir-999").is_some(),
            "the newest is kept"
        );
        d.set_max_bytes(0);
        assert_eq!(d.max.load(Ordering::Relaxed), 64, "never fewer than 64");
    }
}
