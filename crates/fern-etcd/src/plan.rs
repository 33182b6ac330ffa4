//! Planning one etcd Txn from one [`WriteBatch`] (docs/distributed.md §3). It owns the fold of
//! a batch into its final effect — upserts evaluated on the values the batch or the store gives
//! them, at most one op per key, range deletes split around the keys the batch puts inside
//! them — and the count of what the Txn will cost against etcd's limits. It must never talk to
//! etcd: the store reads the values [`needed_reads`] names and sends what [`plan`] returns.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fern_kv::{KvError, KvResult, Limits, Op, UpdateRegistry, WriteBatch};

use crate::keys::{EtcdRange, Keyspace};

/// One operation of the planned Txn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdOp {
    /// Put a key.
    Put(Vec<u8>, Vec<u8>),
    /// Delete one key.
    Delete(Vec<u8>),
    /// Delete `[lo, hi)`.
    DeleteRange(EtcdRange),
}

/// One compare of a Txn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `mod_revision(key) == mod_revision` (0: the key is absent).
    Key {
        /// etcd key.
        key: Vec<u8>,
        /// The revision seen.
        mod_revision: i64,
    },
    /// The key holds exactly `value` (`None`: absent) — a [`fern_kv::KeyGuard`].
    Value {
        /// etcd key.
        key: Vec<u8>,
        /// The value it must hold.
        value: Option<Vec<u8>>,
    },
    /// Every key of `range` has `mod_revision < below` (no key created or changed since).
    Range {
        /// etcd range.
        range: EtcdRange,
        /// One past the revision the range was read at.
        below: i64,
    },
}

/// A stored value and its `mod_revision` (0 and `None` when absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// The value.
    pub value: Option<Vec<u8>>,
    /// Its etcd `mod_revision`.
    pub mod_revision: i64,
}

/// A planned Txn: its ops and the compares that make its upserts correct.
#[derive(Debug, Default)]
pub struct Plan {
    /// Ops, in the order sent (no two touch one key, no put lies in a deleted range).
    pub ops: Vec<EtcdOp>,
    /// One compare per stored value an upsert used.
    pub guards: Vec<Guard>,
}

/// Protobuf framing and fields per op or compare, rounded up (tag, lengths, revision fields).
const PER_ITEM: usize = 24;

impl Plan {
    /// An upper estimate of the encoded Txn request with `extra` compares added and the
    /// stored values of `reads` read back on failure.
    pub fn wire_bytes(&self, extra: &[Guard], reads: &[Vec<u8>]) -> usize {
        let op = |o: &EtcdOp| match o {
            EtcdOp::Put(k, v) => k.len() + v.len(),
            EtcdOp::Delete(k) => k.len(),
            EtcdOp::DeleteRange(r) => r.lo.len() + r.hi.len(),
        };
        let guard = |g: &Guard| match g {
            Guard::Key { key, .. } => key.len(),
            Guard::Value { key, value } => key.len() + value.as_ref().map_or(0, Vec::len),
            Guard::Range { range, .. } => range.lo.len() + range.hi.len(),
        };
        64 + self.ops.iter().map(|o| op(o) + PER_ITEM).sum::<usize>()
            + self
                .guards
                .iter()
                .chain(extra)
                .map(|g| guard(g) + PER_ITEM)
                .sum::<usize>()
            + reads.iter().map(|k| k.len() + PER_ITEM).sum::<usize>()
    }
}

/// Checks `batch` (limits, trees, update functions) and returns the etcd keys whose stored
/// values its upserts need: those not decided by an earlier op of the batch. Nothing is read
/// or sent when this fails, so a bad batch applies nothing.
pub fn needed_reads(
    batch: &WriteBatch,
    ks: &Keyspace,
    registry: &UpdateRegistry,
    limits: &Limits,
) -> KvResult<Vec<Vec<u8>>> {
    batch.check(limits)?;
    let mut decided = BTreeSet::new();
    let mut ranges: Vec<EtcdRange> = Vec::new();
    let mut reads = BTreeSet::new();
    for op in batch.ops() {
        match op {
            Op::Put { tree, key, .. } | Op::Delete { tree, key } => {
                decided.insert(ks.key(*tree, key)?);
            }
            Op::Upsert {
                tree, key, func, ..
            } => {
                if registry.get(*func).is_none() {
                    return Err(KvError::UnknownUpdateFn(*func));
                }
                let k = ks.key(*tree, key)?;
                if !decided.contains(&k) && !ranges.iter().any(|r| r.contains(&k)) {
                    reads.insert(k.clone());
                }
                decided.insert(k);
            }
            Op::DeleteRange { tree, lo, hi } => {
                let r = ks.half_open(*tree, lo, hi)?;
                if !r.is_empty() {
                    ranges.push(r);
                }
            }
        }
    }
    Ok(reads.into_iter().collect())
}

/// Folds `batch` into one Txn, reading stored values from `stored` (which must hold every key
/// [`needed_reads`] named). The result applied at once equals the batch applied op by op.
pub fn plan(
    batch: &WriteBatch,
    ks: &Keyspace,
    registry: &UpdateRegistry,
    stored: &HashMap<Vec<u8>, Stored>,
) -> KvResult<Plan> {
    // Final state of every key the batch decides: Some(value) or None (deleted).
    let mut overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let mut ranges: Vec<EtcdRange> = Vec::new();
    let mut guards = Vec::new();
    let mut guarded = BTreeSet::new();
    for op in batch.ops() {
        match op {
            Op::Put { tree, key, value } => {
                overlay.insert(ks.key(*tree, key)?, Some(value.clone()));
            }
            Op::Delete { tree, key } => {
                overlay.insert(ks.key(*tree, key)?, None);
            }
            Op::Upsert {
                tree,
                key,
                func,
                arg,
            } => {
                let f = registry.get(*func).ok_or(KvError::UnknownUpdateFn(*func))?;
                let k = ks.key(*tree, key)?;
                let old = if let Some(decided) = overlay.get(&k) {
                    decided.clone()
                } else if ranges.iter().any(|r| r.contains(&k)) {
                    None
                } else {
                    let s = stored.get(&k).ok_or_else(|| {
                        KvError::Backend("etcd plan: an upsert's stored value was not read".into())
                    })?;
                    if guarded.insert(k.clone()) {
                        guards.push(Guard::Key {
                            key: k.clone(),
                            mod_revision: s.mod_revision,
                        });
                    }
                    s.value.clone()
                };
                let new = f(key, old.as_deref(), arg);
                overlay.insert(k, new);
            }
            Op::DeleteRange { tree, lo, hi } => {
                let r = ks.half_open(*tree, lo, hi)?;
                if r.is_empty() {
                    continue;
                }
                // Earlier decisions inside the range are overridden by it.
                let inside: Vec<Vec<u8>> = overlay
                    .range(r.lo.clone()..r.hi.clone())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in inside {
                    overlay.remove(&k);
                }
                ranges.push(r);
            }
        }
    }
    let mut ops = Vec::new();
    for r in &ranges {
        // etcd refuses a put inside a range the same Txn deletes: delete around it.
        let mut lo = r.lo.clone();
        for (k, v) in overlay.range(r.lo.clone()..r.hi.clone()) {
            if v.is_none() {
                continue;
            }
            if lo < *k {
                ops.push(EtcdOp::DeleteRange(EtcdRange { lo, hi: k.clone() }));
            }
            lo = k.clone();
            lo.push(0);
        }
        if lo < r.hi {
            ops.push(EtcdOp::DeleteRange(EtcdRange {
                lo,
                hi: r.hi.clone(),
            }));
        }
    }
    for (k, v) in overlay {
        match v {
            Some(v) => ops.push(EtcdOp::Put(k, v)),
            None if ranges.iter().any(|r| r.contains(&k)) => {}
            None => ops.push(EtcdOp::Delete(k)),
        }
    }
    Ok(Plan { ops, guards })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fern_kv::mem::MemStore;
    use fern_kv::{Direction, KeyRange, KvRead, KvStore, TreeId, WriteOptions};
    use proptest::prelude::*;

    /// Applies a plan to a map the way etcd applies a Txn, checking etcd's own rules on the way
    /// (no key put twice, no put inside a deleted range).
    fn apply(map: &mut BTreeMap<Vec<u8>, Vec<u8>>, plan: &Plan) {
        let mut puts = BTreeSet::new();
        let dels: Vec<&EtcdRange> = plan
            .ops
            .iter()
            .filter_map(|o| match o {
                EtcdOp::DeleteRange(r) => Some(r),
                _ => None,
            })
            .collect();
        for o in &plan.ops {
            match o {
                EtcdOp::Put(k, v) => {
                    assert!(puts.insert(k.clone()), "key put twice");
                    assert!(
                        !dels.iter().any(|r| r.contains(k)),
                        "put in a deleted range"
                    );
                    map.insert(k.clone(), v.clone());
                }
                EtcdOp::Delete(k) => {
                    map.remove(k);
                }
                EtcdOp::DeleteRange(r) => map.retain(|k, _| !r.contains(k)),
            }
        }
    }

    fn op_strategy() -> impl Strategy<Value = (u8, u8, u8, u8)> {
        (0u8..5, 0u8..6, 0u8..6, any::<u8>())
    }

    proptest! {
        /// The plan of a random batch on a random store equals the batch applied op by op
        /// (the memory oracle), and obeys etcd's one-op-per-key rules.
        #[test]
        fn plan_equals_oracle(
            init in proptest::collection::vec((0u8..6, any::<u8>()), 0..6),
            ops in proptest::collection::vec(op_strategy(), 0..12),
        ) {
            let registry = fern_kv::conformance::registry();
            let oracle = MemStore::new(registry.clone());
            let t = oracle.tree("t").expect("tree");
            let ks = Keyspace::new(b"p");
            assert_eq!(ks.tree("t").expect("tree"), TreeId(0));
            let mut map = BTreeMap::new();
            let mut b = WriteBatch::new();
            for (k, v) in &init {
                b.put(t, vec![*k], vec![*v]);
                map.insert(ks.key(t, &[*k]).expect("key"), vec![*v]);
            }
            oracle.write(b, WriteOptions::NO_SYNC).expect("init");
            let mut batch = WriteBatch::new();
            for (kind, a, z, v) in ops {
                match kind {
                    0 => batch.put(t, vec![a], vec![v]),
                    1 => batch.delete(t, vec![a]),
                    2 => batch.upsert(t, vec![a], fern_kv::conformance::APPEND, vec![v]),
                    3 => batch.upsert(t, vec![a], fern_kv::conformance::REMOVE, Vec::new()),
                    _ => batch.delete_range(t, vec![a], vec![z]),
                }
            }
            let reads = needed_reads(&batch, &ks, &registry, &Limits::EMBEDDED).expect("check");
            let stored: HashMap<Vec<u8>, Stored> = reads
                .into_iter()
                .map(|k| {
                    let value = map.get(&k).cloned();
                    let mod_revision = i64::from(value.is_some());
                    (k, Stored { value, mod_revision })
                })
                .collect();
            let p = plan(&batch, &ks, &registry, &stored).expect("plan");
            apply(&mut map, &p);
            oracle.write(batch, WriteOptions::NO_SYNC).expect("oracle");
            let want: Vec<(Vec<u8>, Vec<u8>)> = oracle
                .scan(t, &KeyRange::all(), Direction::Forward, 100)
                .expect("scan")
                .into_iter()
                .map(|(k, v)| (ks.key(t, &k).expect("key"), v))
                .collect();
            let got: Vec<(Vec<u8>, Vec<u8>)> = map.into_iter().collect();
            prop_assert_eq!(got, want);
        }
    }
}
