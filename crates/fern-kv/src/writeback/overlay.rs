//! The holder's view of the store (docs/design.md §7.3, W2, W3): exact values of the keys it
//! read or wrote, known-absent ranges, and the dirty log of committed batches not yet in the
//! store. It owns upsert resolution (a buffered batch becomes puts, deletes and range deletes
//! only) and the merge of a store page with what it knows; it must never talk to the store.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;

use crate::batch::{Op, WriteBatch};
use crate::error::{KvError, KvResult};
use crate::types::{Direction, KeyRange, TreeId, UpdateRegistry};

use super::ranges::AbsentRanges;

/// What the overlay knows of one tree.
#[derive(Debug, Default)]
struct TreeView {
    /// Key → its exact current value (`None`: absent).
    entries: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Where the store holds nothing the entries do not say.
    absent: AbsentRanges,
}

impl TreeView {
    /// `Some(value)` when the overlay knows the key's value.
    fn known(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        match self.entries.get(key) {
            Some(v) => Some(v.as_deref()),
            None if self.absent.contains(key) => Some(None),
            None => None,
        }
    }
}

/// The overlay of a held delegation.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    trees: HashMap<TreeId, TreeView>,
    /// Bytes of keys and values in `entries`, and of the known-absent ranges added (each
    /// counted once when added, merged or not: an upper bound), for the cache bound.
    bytes: usize,
    /// Committed batches not yet in the store, oldest first (resolved: no upserts).
    log: VecDeque<WriteBatch>,
    log_ops: usize,
    log_bytes: usize,
}

impl Overlay {
    /// The value of `key` if the overlay knows it (an entry, or a known-absent range).
    pub(crate) fn known(&self, tree: TreeId, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let t = self.trees.get(&tree)?;
        t.known(key).map(|v| v.map(<[u8]>::to_vec))
    }

    /// Remembers what the store said of `key`, unless the overlay already knows better (a
    /// local commit or range delete since the store was read).
    pub(crate) fn fill(&mut self, tree: TreeId, key: &[u8], value: Option<&[u8]>) {
        let t = self.trees.entry(tree).or_default();
        if t.entries.contains_key(key) || t.absent.contains(key) {
            return;
        }
        self.bytes += key.len() + value.map_or(0, <[u8]>::len);
        t.entries.insert(key.to_vec(), value.map(<[u8]>::to_vec));
    }

    /// Records the caller's promise that the store holds nothing in `range`.
    pub(crate) fn assume_absent(&mut self, tree: TreeId, range: &KeyRange) {
        self.add_absent(tree, range);
    }

    /// Adds a known-absent range, counted in the cache's bytes.
    fn add_absent(&mut self, tree: TreeId, range: &KeyRange) {
        self.trees.entry(tree).or_default().absent.insert(range);
        self.bytes += range_cost(range);
    }

    /// Keys of `batch`'s upserts whose old value the overlay does not know (the holder
    /// reads them from the store before committing).
    pub(crate) fn unknown_upsert_keys(&self, batch: &WriteBatch) -> Vec<(TreeId, Vec<u8>)> {
        batch
            .ops()
            .iter()
            .filter_map(|op| match op {
                Op::Upsert { tree, key, .. } if self.known(*tree, key).is_none() => {
                    Some((*tree, key.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// `batch` with every upsert replaced by the put or delete of its result, computed on
    /// the overlay's values and the batch's own earlier ops. `Err` when an upsert's old value
    /// is unknown (the caller reads it first) or its function is not registered.
    pub(crate) fn resolve(
        &self,
        batch: &WriteBatch,
        registry: &UpdateRegistry,
    ) -> KvResult<WriteBatch> {
        // Values this batch has set so far, and its range deletes, for later upserts.
        let mut set: HashMap<(TreeId, &[u8]), Option<Vec<u8>>> = HashMap::new();
        let mut deleted: Vec<(TreeId, KeyRange)> = Vec::new();
        let mut out = WriteBatch::new();
        for op in batch.ops() {
            match op {
                Op::Put { tree, key, value } => {
                    set.insert((*tree, key), Some(value.clone()));
                    out.push(op.clone());
                }
                Op::Delete { tree, key } => {
                    set.insert((*tree, key), None);
                    out.push(op.clone());
                }
                Op::DeleteRange { tree, lo, hi } => {
                    let r = KeyRange::half_open(lo, hi);
                    set.retain(|(t, k), _| !(*t == *tree && r.contains(k)));
                    deleted.push((*tree, r));
                    out.push(op.clone());
                }
                Op::Upsert {
                    tree,
                    key,
                    func,
                    arg,
                } => {
                    let f = registry.get(*func).ok_or(KvError::UnknownUpdateFn(*func))?;
                    let old = match set.get(&(*tree, key.as_slice())) {
                        Some(v) => v.clone(),
                        None if deleted.iter().any(|(t, r)| t == tree && r.contains(key)) => None,
                        None => self.known(*tree, key).ok_or_else(|| {
                            KvError::Backend("write-back: an upsert's old value is unknown".into())
                        })?,
                    };
                    let new = f(key, old.as_deref(), arg);
                    match &new {
                        Some(v) => out.put(*tree, key.clone(), v.clone()),
                        None => out.delete(*tree, key.clone()),
                    }
                    set.insert((*tree, key), new);
                }
            }
        }
        Ok(out)
    }

    /// Applies a resolved batch to the view and appends it to the dirty log.
    pub(crate) fn commit(&mut self, batch: WriteBatch) {
        for op in batch.ops() {
            match op {
                Op::Put { tree, key, value } => self.set(*tree, key, Some(value)),
                Op::Delete { tree, key } => self.set(*tree, key, None),
                Op::DeleteRange { tree, lo, hi } => {
                    let r = KeyRange::half_open(lo, hi);
                    let t = self.trees.entry(*tree).or_default();
                    let mut freed = 0;
                    t.entries.retain(|k, v| {
                        let keep = !r.contains(k);
                        if !keep {
                            freed += k.len() + v.as_ref().map_or(0, Vec::len);
                        }
                        keep
                    });
                    t.absent.insert(&r);
                    self.bytes = self.bytes - freed + range_cost(&r);
                }
                Op::Upsert { .. } => unreachable!("resolve() leaves no upsert"),
            }
        }
        self.log_ops += batch.len();
        self.log_bytes += batch.bytes();
        self.log.push_back(batch);
    }

    fn set(&mut self, tree: TreeId, key: &[u8], value: Option<&[u8]>) {
        let t = self.trees.entry(tree).or_default();
        let add = key.len() + value.map_or(0, <[u8]>::len);
        match t.entries.get_mut(key) {
            Some(v) => {
                let old = v.as_ref().map_or(0, Vec::len);
                *v = value.map(<[u8]>::to_vec);
                self.bytes = self.bytes + add - key.len() - old;
            }
            None => {
                t.entries.insert(key.to_vec(), value.map(<[u8]>::to_vec));
                self.bytes += add;
            }
        }
    }

    /// The answer of a scan of `region` — the part of the scanned range a store page
    /// covered — from the page and what the overlay knows, in `dir` order. Store pairs the
    /// overlay knows better are replaced; the page's unknown pairs are remembered, and so is
    /// the region itself: every key in it is then an entry or absent, so a later read there
    /// (a lookup of a name not in a directory just listed) asks the store nothing.
    pub(crate) fn merge_page(
        &mut self,
        tree: TreeId,
        region: &KeyRange,
        dir: Direction,
        page: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for (k, v) in page {
            if self.known(tree, &k).is_none() {
                self.fill(tree, &k, Some(&v));
                merged.insert(k, v);
            }
        }
        // Each key of the page is an entry now (filled, or known better), so what the region
        // holds beyond the entries is nothing: the holder is the only writer (W2).
        self.add_absent(tree, region);
        if let Some(t) = self.trees.get(&tree) {
            for (k, v) in t.entries.range::<[u8], _>(region.as_bounds()) {
                match v {
                    Some(v) => {
                        merged.insert(k.clone(), v.clone());
                    }
                    None => {
                        merged.remove(k);
                    }
                }
            }
        }
        match dir {
            Direction::Forward => merged.into_iter().collect(),
            Direction::Reverse => merged.into_iter().rev().collect(),
        }
    }

    /// Dirty ops and bytes not yet flushed.
    pub(crate) fn dirty(&self) -> (usize, usize) {
        (self.log_ops, self.log_bytes)
    }

    /// Bytes counted against the cache bound.
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> usize {
        self.bytes
    }

    /// Takes the dirty log's batches, oldest first, cut into Txn-sized runs of whole
    /// batches (`groups.rs`, W3).
    pub(crate) fn take_groups(&mut self, max_ops: usize, max_bytes: usize) -> Vec<WriteBatch> {
        self.log_ops = 0;
        self.log_bytes = 0;
        super::groups::cut(self.log.drain(..), max_ops, max_bytes)
    }

    /// Puts groups that could not be sent back at the front of the log (a failed flush
    /// leaves them to the next one).
    pub(crate) fn requeue(&mut self, groups: Vec<WriteBatch>) {
        for g in groups.into_iter().rev() {
            self.log_ops += g.len();
            self.log_bytes += g.bytes();
            self.log.push_front(g);
        }
    }

    /// Drops the cache when it holds more than `limit` bytes and nothing is dirty: the
    /// entries then say only what the store says. (Reads and commits run under the
    /// write-back's mode read lock, a flush under its write lock, so an empty log also means
    /// no flush is in flight.) A holder that only reads fills the cache without ever
    /// flushing, so every fill checks this, not only a flush.
    pub(crate) fn trim(&mut self, limit: usize) {
        if self.bytes > limit && self.log.is_empty() {
            self.clear_cache();
        }
    }

    /// Forgets every cached value and range; only allowed with an empty dirty log.
    pub(crate) fn clear_cache(&mut self) {
        debug_assert!(self.log.is_empty());
        self.trees.clear();
        self.bytes = 0;
    }

    /// Forgets everything, dirty log included (the grant was lost, W4).
    pub(crate) fn drop_all(&mut self) {
        self.log.clear();
        self.log_ops = 0;
        self.log_bytes = 0;
        self.clear_cache();
    }
}

/// What a known-absent range is counted as in the cache's bytes: its bounds and the map
/// node that keeps them.
fn range_cost(range: &KeyRange) -> usize {
    const NODE: usize = 64;
    let len = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) | Bound::Excluded(k) => k.len(),
        Bound::Unbounded => 0,
    };
    len(&range.lo) + len(&range.hi) + NODE
}

/// Bounds of the part of `range` beyond `last` in `dir` (the next page's range).
pub(crate) fn beyond(range: &KeyRange, dir: Direction, last: &[u8]) -> KeyRange {
    let mut r = range.clone();
    match dir {
        Direction::Forward => r.lo = Bound::Excluded(last.to_vec()),
        Direction::Reverse => r.hi = Bound::Excluded(last.to_vec()),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TreeId = TreeId(1);

    fn prefix(i: u64) -> KeyRange {
        KeyRange::half_open(&i.to_be_bytes(), &(i + 1).to_be_bytes())
    }

    /// A holder that only lists (scans of empty directories) adds known-absent ranges and
    /// nothing else: they must count toward the bound, or its cache grows without one.
    #[test]
    fn known_absent_ranges_count_toward_the_cache_bound() {
        let mut ov = Overlay::default();
        for i in (0..1000).step_by(2) {
            ov.merge_page(T, &prefix(i), Direction::Forward, Vec::new());
        }
        assert!(ov.cached_bytes() >= 500 * 64, "{} bytes", ov.cached_bytes());
        ov.trim(1024);
        assert_eq!(
            ov.cached_bytes(),
            0,
            "a clean cache over the bound is dropped"
        );
        assert_eq!(
            ov.known(T, &2u64.to_be_bytes()),
            None,
            "nothing known any more"
        );
    }

    /// A dirty overlay keeps everything whatever its size: its entries are the only copy of
    /// what is not flushed yet.
    #[test]
    fn a_dirty_cache_is_never_trimmed() {
        let mut ov = Overlay::default();
        ov.fill(T, b"read", Some(b"v"));
        let mut b = WriteBatch::new();
        b.put(T, b"mine".to_vec(), b"new".to_vec());
        ov.commit(b);
        ov.trim(0);
        assert_eq!(ov.known(T, b"mine"), Some(Some(b"new".to_vec())));
        assert_eq!(ov.known(T, b"read"), Some(Some(b"v".to_vec())));
        let sent = ov.take_groups(128, 1 << 20);
        assert_eq!(sent.len(), 1);
        ov.trim(0);
        assert_eq!(ov.known(T, b"mine"), None, "clean once flushed: dropped");
    }
}
