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

use std::sync::atomic::{AtomicU64, Ordering};

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
}

/// The inode table.
#[derive(Default)]
pub struct Inodes {
    map: Mutex<HashMap<InodeId, Known>>,
    /// (parent, name) → the inode last pinned or moved there with its stat inline in that
    /// entry: a hint that lets unlink skip reading the entry the kernel's lookup just read.
    /// Never trusted alone: [`Inodes::inline_file_at`] checks the inode's own location
    /// (exact for every inode in the table) under the locks. Cleared when full.
    by_name: Mutex<HashMap<(InodeId, Vec<u8>), InodeId>>,
    /// Bumped by every committed change of a file's shape: a lookup that read a stat seeds
    /// the shape from it only if no change committed since it started (stored.rs).
    shape_epoch: AtomicU64,
    /// Another mount may change a file's size and blocks: no shape is ever answered from
    /// memory (stored.rs reads the stat each time).
    shared: bool,
}

impl Inodes {
    /// An empty table; `shared`: the store has other writers (shapes are never trusted).
    pub fn new(shared: bool) -> Self {
        Self {
            shared,
            ..Self::default()
        }
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
        self.map.lock().get(&id).and_then(|k| k.shape)
    }

    /// Records a committed shape change of `id`.
    pub(crate) fn set_shape(&self, id: InodeId, shape: crate::stored::Shape) {
        let mut m = self.map.lock();
        self.shape_epoch.fetch_add(1, Ordering::AcqRel);
        if let Some(k) = m.get_mut(&id) {
            k.shape = Some(shape);
        }
    }

    /// Gives `id` the shape a stat read since `epoch` showed, unless it has one or a shape
    /// changed meanwhile (then the read may be stale, and the first operation that needs the
    /// shape reads it under the inode's lock).
    pub(crate) fn seed_shape(&self, id: InodeId, shape: crate::stored::Shape, epoch: u64) {
        let mut m = self.map.lock();
        if self.shape_epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        if let Some(k) = m.get_mut(&id) {
            k.shape.get_or_insert(shape);
        }
    }

    /// The mirrored stat of `id`, if this mount has one (never on a shared store). The caller
    /// holds `id`'s lock, or accepts an answer that was exact when it was given.
    pub(crate) fn stat(&self, id: InodeId) -> Option<crate::attr::Stat> {
        if self.shared {
            return None;
        }
        self.map.lock().get(&id).and_then(|k| k.stat)
    }

    /// Forgets the mirrored stat of `id`: a stat write of it is about to commit. The caller
    /// holds `id`'s lock, so no one sets it again before the write has committed.
    pub(crate) fn drop_stat(&self, id: InodeId) {
        if let Some(k) = self.map.lock().get_mut(&id) {
            k.stat = None;
        }
    }

    /// Mirrors `stat` for `id`, which the caller read or computed from the store's value while
    /// holding `id`'s lock (no stat write of `id` in flight).
    pub(crate) fn set_stat(&self, id: InodeId, stat: crate::attr::Stat) {
        if self.shared {
            return;
        }
        if let Some(k) = self.map.lock().get_mut(&id) {
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
            let mut h = self.by_name.lock();
            if h.len() >= MAX_NAME_HINTS {
                // Forgetting costs a read later, never correctness.
                h.clear();
            }
            h.insert((*parent, name.clone()), id);
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
        let m = self.map.lock();
        let k = m.get(&id)?;
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
        self.by_name.lock().get(&(parent, name.to_vec())).copied()
    }

    /// Records a lookup of `id` (pin count + 1) at `loc`.
    pub fn pin(&self, id: InodeId, loc: Loc, kind: FileType) {
        self.hint(id, &loc, kind);
        let mut m = self.map.lock();
        let e = m.entry(id).or_insert(Known {
            loc: loc.clone(),
            kind,
            lookups: 0,
            opens: 0,
            orphan: false,
            shape: None,
            xattr_free: false,
            stat: None,
        });
        e.loc = loc;
        e.lookups = e.lookups.saturating_add(1);
    }

    /// Drops `n` lookups; forgets the inode when nothing holds it.
    pub fn forget(&self, id: InodeId, n: u64) {
        let mut m = self.map.lock();
        if let Some(e) = m.get_mut(&id) {
            e.lookups = e.lookups.saturating_sub(n);
            if e.lookups == 0 && e.opens == 0 && id != InodeId::ROOT {
                m.remove(&id);
            }
        }
    }

    /// Runs `f` on what is known about `id`, if anything, without copying it (a `Known` carries a
    /// name and a stat: cloning one per request was 1.6 % of postmark's request threads).
    pub fn with<T>(&self, id: InodeId, f: impl FnOnce(&Known) -> T) -> Option<T> {
        self.map.lock().get(&id).map(f)
    }

    /// Whether `id` is known to have no extended attribute (see [`Known::xattr_free`]).
    pub(crate) fn xattr_free(&self, id: InodeId) -> bool {
        !self.shared && self.map.lock().get(&id).is_some_and(|k| k.xattr_free)
    }

    /// Runs `f` on the entry of `id`, if known.
    pub fn update<T>(&self, id: InodeId, f: impl FnOnce(&mut Known) -> T) -> Option<T> {
        self.map.lock().get_mut(&id).map(f)
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
        let mut m = self.map.lock();
        if m.get(&id)
            .is_some_and(|e| e.lookups == 0 && e.opens == 0 && id != InodeId::ROOT)
        {
            m.remove(&id);
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
}

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
        let mut m = self.map.lock();
        if m.len() >= MAX_DIR_ENTRIES {
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
}
