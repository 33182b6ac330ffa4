//! The in-memory reference backend: one `BTreeMap` per tree behind one lock. It is the test
//! oracle for every other backend, so it favours obviousness over speed. It owns its maps and
//! its conflict tracker; it must never persist anything (`sync` is a no-op, a dropped store is
//! gone).

use std::collections::{BTreeMap, HashMap};

use parking_lot::RwLock;

use crate::batch::{Op, WriteBatch};
use crate::error::{KvError, KvResult};
use crate::extent::{ExtentRef, EXTENT_REF_LEN};
use crate::occ::{ConflictTracker, OccBackend, OccTxn};
use crate::store::{KvRead, KvStore, KvTxn};
use crate::types::{Direction, KeyRange, Limits, TreeId, UpdateRegistry, WriteOptions};

type Tree = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
struct State {
    names: HashMap<String, TreeId>,
    trees: Vec<Tree>,
    /// Live extents by id (bytes 0..8 of the reference); ids are never reused, so a stale
    /// reference is always told apart from a live one.
    extents: BTreeMap<u64, Vec<u8>>,
    next_extent: u64,
}

/// The oracle's reference: id u64 LE | len u32 LE | a 32-bit FNV-1a of the data (a check
/// that the caller handed back the reference it was given, not a media checksum).
fn reference(id: u64, data: &[u8]) -> ExtentRef {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    let mut r = [0u8; EXTENT_REF_LEN];
    r[0..8].copy_from_slice(&id.to_le_bytes());
    r[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
    r[12..16].copy_from_slice(&h.to_le_bytes());
    ExtentRef(r)
}

fn extent_id(r: &ExtentRef) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&r.0[0..8]);
    u64::from_le_bytes(id)
}

impl State {
    /// The live extent `r` names, or why not.
    fn live(&self, r: &ExtentRef) -> KvResult<&Vec<u8>> {
        match self.extents.get(&extent_id(r)) {
            Some(data) if reference(extent_id(r), data) == *r => Ok(data),
            _ => Err(KvError::InvalidExtent(format!(
                "{r:?} is not a live extent"
            ))),
        }
    }
}

/// Thread-safe in-memory [`KvStore`].
pub struct MemStore {
    state: RwLock<State>,
    registry: UpdateRegistry,
    tracker: ConflictTracker,
    limits: Limits,
}

impl MemStore {
    /// An empty store using `registry` for upserts, with embedded-engine limits.
    pub fn new(registry: UpdateRegistry) -> Self {
        Self::with_limits(registry, Limits::EMBEDDED)
    }

    /// An empty store that enforces `limits`, so callers can be tested against, say, etcd's
    /// 128-op transactions without an etcd.
    pub fn with_limits(registry: UpdateRegistry, limits: Limits) -> Self {
        Self {
            state: RwLock::new(State::default()),
            registry,
            tracker: ConflictTracker::new(),
            limits,
        }
    }

    /// Number of keys in all trees (for tests that check nothing leaked).
    pub fn key_count(&self) -> usize {
        self.state.read().trees.iter().map(BTreeMap::len).sum()
    }

    /// Validates then applies `batch`; the caller holds the write lock, so the batch is atomic.
    fn apply(&self, state: &mut State, batch: &WriteBatch) -> KvResult<()> {
        batch.check(&self.limits)?;
        for op in batch.ops() {
            if op.tree().0 as usize >= state.trees.len() {
                return Err(KvError::InvalidTree(op.tree()));
            }
            if let Op::Upsert { func, .. } = op {
                if self.registry.get(*func).is_none() {
                    return Err(KvError::UnknownUpdateFn(*func));
                }
            }
        }
        for r in batch.extent_frees() {
            state.live(r)?;
        }
        // Bind the new extents first: their references complete their rows' values.
        let mut bound: HashMap<usize, ExtentRef> = HashMap::new();
        for (at, data) in batch.extent_puts() {
            state.next_extent += 1;
            let id = state.next_extent;
            state.extents.insert(id, data.clone());
            bound.insert(*at, reference(id, data));
        }
        // Nothing below can fail, so either every op is applied or (above) none is.
        for (i, op) in batch.ops().iter().enumerate() {
            let tree = &mut state.trees[op.tree().0 as usize];
            match op {
                Op::Put { key, value, .. } => {
                    let mut value = value.clone();
                    if let Some(r) = bound.get(&i) {
                        let at = value.len() - EXTENT_REF_LEN;
                        value[at..].copy_from_slice(&r.0);
                    }
                    tree.insert(key.clone(), value);
                }
                Op::Delete { key, .. } => {
                    tree.remove(key);
                }
                Op::Upsert { key, func, arg, .. } => {
                    let Some(f) = self.registry.get(*func) else {
                        continue;
                    };
                    match f(key, tree.get(key).map(Vec::as_slice), arg) {
                        Some(v) => {
                            tree.insert(key.clone(), v);
                        }
                        None => {
                            tree.remove(key);
                        }
                    }
                }
                Op::DeleteRange { lo, hi, .. } => {
                    if lo < hi {
                        let doomed: Vec<Vec<u8>> = tree
                            .range::<[u8], _>((
                                std::ops::Bound::Included(lo.as_slice()),
                                std::ops::Bound::Excluded(hi.as_slice()),
                            ))
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in doomed {
                            tree.remove(&k);
                        }
                    }
                }
            }
        }
        for r in batch.extent_frees() {
            state.extents.remove(&extent_id(r));
        }
        self.tracker.record(batch);
        Ok(())
    }

    fn read_scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let state = self.state.read();
        let t = state
            .trees
            .get(tree.0 as usize)
            .ok_or(KvError::InvalidTree(tree))?;
        if limit == 0 || range.is_empty() {
            return Ok(Vec::new());
        }
        let iter = t.range::<[u8], _>(range.as_bounds());
        let pairs = match dir {
            Direction::Forward => iter
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            Direction::Reverse => iter
                .rev()
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        Ok(pairs)
    }
}

impl KvRead for MemStore {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        let state = self.state.read();
        let t = state
            .trees
            .get(tree.0 as usize)
            .ok_or(KvError::InvalidTree(tree))?;
        Ok(t.get(key).cloned())
    }

    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        let state = self.state.read();
        let data = state.live(r)?;
        if buf.len() != data.len() {
            return Err(KvError::InvalidExtent(format!(
                "reading {r:?} into a buffer of {} bytes",
                buf.len()
            )));
        }
        buf.copy_from_slice(data);
        Ok(())
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.read_scan(tree, range, dir, limit)
    }
}

impl KvStore for MemStore {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        let mut state = self.state.write();
        if let Some(id) = state.names.get(name) {
            return Ok(*id);
        }
        let id = TreeId(state.trees.len() as u32);
        state.trees.push(Tree::new());
        state.names.insert(name.to_owned(), id);
        Ok(id)
    }

    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        self.apply_validated(&batch, opts, &|| Ok(()))
    }

    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        Ok(Box::new(OccTxn::begin(self)))
    }

    fn sync(&self) -> KvResult<()> {
        Ok(())
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn point_reads_cheap(&self) -> bool {
        true
    }

    fn extents(&self) -> KvResult<Vec<ExtentRef>> {
        let state = self.state.read();
        Ok(state
            .extents
            .iter()
            .map(|(id, data)| reference(*id, data))
            .collect())
    }
}

impl OccBackend for MemStore {
    fn tracker(&self) -> &ConflictTracker {
        &self.tracker
    }

    fn apply_validated(
        &self,
        batch: &WriteBatch,
        _opts: WriteOptions,
        validate: &dyn Fn() -> KvResult<()>,
    ) -> KvResult<()> {
        let mut state = self.state.write();
        validate()?;
        self.apply(&mut state, batch)
    }
}
