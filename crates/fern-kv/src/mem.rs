//! The in-memory reference backend: one `BTreeMap` per tree behind one lock. It is the test
//! oracle for every other backend, so it favours obviousness over speed. It owns its maps and
//! its conflict tracker; it must never persist anything (`sync` is a no-op, a dropped store is
//! gone).

use std::collections::{BTreeMap, HashMap};

use parking_lot::RwLock;

use crate::batch::{Op, WriteBatch};
use crate::error::{KvError, KvResult};
use crate::occ::{ConflictTracker, OccBackend, OccTxn};
use crate::store::{KvRead, KvStore, KvTxn};
use crate::types::{Direction, KeyRange, Limits, TreeId, UpdateRegistry, WriteOptions};

type Tree = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
struct State {
    names: HashMap<String, TreeId>,
    trees: Vec<Tree>,
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
        // Nothing below can fail, so either every op is applied or (above) none is.
        for op in batch.ops() {
            let tree = &mut state.trees[op.tree().0 as usize];
            match op {
                Op::Put { key, value, .. } => {
                    tree.insert(key.clone(), value.clone());
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
