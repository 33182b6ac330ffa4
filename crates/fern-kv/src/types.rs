//! Small value types shared by the trait, the backends and the callers: tree handles, upsert
//! function ids and registry, key ranges, scan direction, write options and backend limits.
//! This module owns no state and must never know about a particular backend.

use std::collections::HashMap;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

/// Handle of a named keyspace ("tree"), handed out by [`crate::KvStore::tree`].
///
/// On fern-tree it names one tree of the environment; on a single-keyspace backend (etcd) it
/// selects a key prefix. It is only meaningful for the store that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeId(pub u32);

/// Stable identifier of a registered upsert function. The number is part of the persistent
/// format: an engine that buffers upsert messages on disk names the function by this id, so an
/// id must never be reused for a different function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpdateFnId(pub u32);

/// An upsert function: `(key, old value, argument) -> new value`, where `None` as the result
/// deletes the key. It must be deterministic and must not panic on any input (a corrupt old
/// value is returned unchanged so that the next read reports it), because an engine may apply
/// it lazily, long after the write, possibly again during recovery. Identical to fern-tree's.
pub type UpdateFn = Arc<dyn Fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// The upsert functions a store is opened with. Callers (fern-fs) build it and hand it to the
/// backend's constructor, because an engine replaying its log needs the functions before the
/// first write arrives.
#[derive(Clone, Default)]
pub struct UpdateRegistry {
    fns: HashMap<UpdateFnId, UpdateFn>,
    merges: HashMap<UpdateFnId, MergeFn>,
}

/// An argument merge for an upsert function `f`: `merge(older, newer)` returns an argument `m`
/// with `f(k, f(k, v, older), newer) == f(k, v, m)` for every key and value (absent included),
/// or `None` for a pair it cannot merge. Optional: an engine that buffers upserts (fern-tree)
/// uses it to keep one pending message per key instead of a run every read must fold; a
/// backend that applies upserts at once ignores it. Identical to fern-tree's `MergeFn`.
pub type MergeFn = Arc<dyn Fn(&[u8], &[u8]) -> Option<Vec<u8>> + Send + Sync>;

impl UpdateRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `f` under `id`, replacing any earlier function with that id.
    pub fn register(&mut self, id: UpdateFnId, f: UpdateFn) -> &mut Self {
        self.fns.insert(id, f);
        self
    }

    /// Registers the argument merge of function `id` (see [`MergeFn`]).
    pub fn register_merge(&mut self, id: UpdateFnId, f: MergeFn) -> &mut Self {
        self.merges.insert(id, f);
        self
    }

    /// The argument merge of function `id`, if one is registered.
    pub fn merge_fn(&self, id: UpdateFnId) -> Option<&MergeFn> {
        self.merges.get(&id)
    }

    /// Adds every function (and argument merge) of `other` (ids of `other` win on collision).
    pub fn merge(&mut self, other: &UpdateRegistry) -> &mut Self {
        for (id, f) in &other.fns {
            self.fns.insert(*id, Arc::clone(f));
        }
        for (id, f) in &other.merges {
            self.merges.insert(*id, Arc::clone(f));
        }
        self
    }

    /// The function registered under `id`.
    pub fn get(&self, id: UpdateFnId) -> Option<&UpdateFn> {
        self.fns.get(&id)
    }

    /// All registered ids, for backends that register them with an engine one by one.
    pub fn ids(&self) -> impl Iterator<Item = UpdateFnId> + '_ {
        self.fns.keys().copied()
    }
}

impl fmt::Debug for UpdateRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<_> = self.fns.keys().map(|id| id.0).collect();
        ids.sort_unstable();
        f.debug_struct("UpdateRegistry").field("ids", &ids).finish()
    }
}

/// Order of a range scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Ascending key order, starting at the low bound.
    Forward,
    /// Descending key order, starting at the high bound.
    Reverse,
}

/// A range of keys with explicit bounds. Paging is done by narrowing the bound on the side the
/// scan started from to `Excluded(last key returned)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// Low bound.
    pub lo: Bound<Vec<u8>>,
    /// High bound.
    pub hi: Bound<Vec<u8>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        Self {
            lo: Bound::Unbounded,
            hi: Bound::Unbounded,
        }
    }

    /// The half-open range `[lo, hi)`, the shape of a range delete.
    pub fn half_open(lo: &[u8], hi: &[u8]) -> Self {
        Self {
            lo: Bound::Included(lo.to_vec()),
            hi: Bound::Excluded(hi.to_vec()),
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        let hi = match prefix_successor(prefix) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        };
        Self {
            lo: Bound::Included(prefix.to_vec()),
            hi,
        }
    }

    /// True when `key` lies inside the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        let above_lo = match &self.lo {
            Bound::Included(l) => key >= l.as_slice(),
            Bound::Excluded(l) => key > l.as_slice(),
            Bound::Unbounded => true,
        };
        let below_hi = match &self.hi {
            Bound::Included(h) => key <= h.as_slice(),
            Bound::Excluded(h) => key < h.as_slice(),
            Bound::Unbounded => true,
        };
        above_lo && below_hi
    }

    /// True when the range holds no key at all (so a scan returns nothing).
    pub fn is_empty(&self) -> bool {
        match (&self.lo, &self.hi) {
            (Bound::Included(l), Bound::Included(h)) => l > h,
            (Bound::Included(l), Bound::Excluded(h))
            | (Bound::Excluded(l), Bound::Included(h))
            | (Bound::Excluded(l), Bound::Excluded(h)) => l >= h,
            _ => false,
        }
    }

    /// True when some key lies in both ranges.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        let lo = max_lo(&self.lo, &other.lo);
        let hi = min_hi(&self.hi, &other.hi);
        !KeyRange { lo, hi }.is_empty()
    }

    /// Borrowed bounds, the shape `BTreeMap::range` takes.
    pub fn as_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (as_ref(&self.lo), as_ref(&self.hi))
    }
}

/// The smallest key greater than every key that starts with `prefix`, if there is one.
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(last) = s.pop() {
        if last < 0xff {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn max_lo(a: &Bound<Vec<u8>>, b: &Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match (a, b) {
        (Bound::Unbounded, x) | (x, Bound::Unbounded) => x.clone(),
        (Bound::Included(x), Bound::Included(y)) => Bound::Included(x.max(y).clone()),
        (Bound::Excluded(x), Bound::Excluded(y)) => Bound::Excluded(x.max(y).clone()),
        (Bound::Included(i), Bound::Excluded(e)) | (Bound::Excluded(e), Bound::Included(i)) => {
            if i > e {
                Bound::Included(i.clone())
            } else {
                Bound::Excluded(e.clone())
            }
        }
    }
}

fn min_hi(a: &Bound<Vec<u8>>, b: &Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match (a, b) {
        (Bound::Unbounded, x) | (x, Bound::Unbounded) => x.clone(),
        (Bound::Included(x), Bound::Included(y)) => Bound::Included(x.min(y).clone()),
        (Bound::Excluded(x), Bound::Excluded(y)) => Bound::Excluded(x.min(y).clone()),
        (Bound::Included(i), Bound::Excluded(e)) | (Bound::Excluded(e), Bound::Included(i)) => {
            if i < e {
                Bound::Included(i.clone())
            } else {
                Bound::Excluded(e.clone())
            }
        }
    }
}

/// Options of one write batch or transaction commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// When true the call returns only after the batch is durable (the engine's log is synced).
    /// When false the batch is atomic and ordered but may be lost, whole, at a crash; a later
    /// [`crate::KvStore::sync`] makes it and everything before it durable.
    pub sync: bool,
    /// Set for a batch that deletes data (unlink, rmdir, truncate, hole punch): a store with a
    /// fixed size admits it even when it refuses new data (it may use the store's reserve,
    /// because it gives space back); the number is about how many data bytes it deletes, a
    /// hint the store may use to return the space sooner. `None`: an ordinary batch.
    pub frees: Option<u64>,
}

impl WriteOptions {
    /// Durable on return.
    pub const SYNC: WriteOptions = WriteOptions {
        sync: true,
        frees: None,
    };
    /// Atomic, not necessarily durable on return.
    pub const NO_SYNC: WriteOptions = WriteOptions {
        sync: false,
        frees: None,
    };

    /// The same options for a batch that deletes about `bytes` bytes of data (see
    /// [`frees`](Self::frees)).
    pub const fn freeing(self, bytes: u64) -> WriteOptions {
        WriteOptions {
            frees: Some(bytes),
            ..self
        }
    }
}

/// A store's space, as statfs reports it ([`crate::KvStore::space`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSpace {
    /// Bytes the store may occupy: its media's fixed size, or for a growing store what it
    /// occupies plus what its host can still give it.
    pub capacity: u64,
    /// Bytes in use.
    pub used: u64,
    /// Bytes new data can still use (capacity minus used minus what the store keeps in reserve
    /// for itself).
    pub available: u64,
}

/// What a backend accepts in one atomic batch or transaction. `None` means no fixed limit.
/// etcd v3, for instance, is `max_ops: Some(128)`, `max_bytes: Some(1536 * 1024)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most operations in one batch.
    pub max_ops: Option<usize>,
    /// Most bytes (keys + values + upsert arguments) in one batch.
    pub max_bytes: Option<usize>,
    /// Longest key.
    pub max_key_len: usize,
    /// Longest value.
    pub max_value_len: usize,
    /// Longest data extent, or `None` when the backend has no extents (see
    /// [`crate::ExtentRef`]).
    pub extents: Option<usize>,
}

impl Limits {
    /// Limits of an unconstrained embedded store, matching fern-tree's key and value bounds.
    pub const EMBEDDED: Limits = Limits {
        max_ops: None,
        max_bytes: None,
        max_key_len: 16 * 1024,
        max_value_len: 1 << 20,
        extents: Some(8 << 20),
    };

    /// The stricter of `self` and `other` in every field: what a backend enforces when a
    /// caller imposes limits on top of its own (e.g. etcd's, to test step splitting).
    pub fn tightened(self, other: Limits) -> Limits {
        let tighter = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Limits {
            max_ops: tighter(self.max_ops, other.max_ops),
            max_bytes: tighter(self.max_bytes, other.max_bytes),
            max_key_len: self.max_key_len.min(other.max_key_len),
            max_value_len: self.max_value_len.min(other.max_value_len),
            extents: match (self.extents, other.extents) {
                (Some(a), Some(b)) => Some(a.min(b)),
                _ => None,
            },
        }
    }
}
