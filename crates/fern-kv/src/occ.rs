//! Optimistic-concurrency validation for embedded backends (the memory oracle and fern-tree),
//! which keep no per-key versions. It owns the record of which keys recent commits wrote; it
//! must never hold store data, and it keeps a write only as long as some transaction that
//! began before it is still open.
//!
//! Rule (validation by write sets, backward-oriented): a transaction that began at commit
//! sequence `s` may commit iff no commit with sequence `> s` wrote a key it read or a key inside
//! a range it scanned. Reads see the latest committed state, so if nothing it read changed after
//! `s`, every read equals the state at `s` and the transaction serializes at its commit point.
//! Backends call [`ConflictTracker::validate`] and [`ConflictTracker::record`] under the same
//! lock that makes their batch application atomic, so no commit slips between the two.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::Mutex;

use crate::batch::WriteBatch;
use crate::types::{KeyRange, TreeId};

/// What a transaction read: point keys and scanned ranges, per tree.
#[derive(Debug, Default)]
pub struct ReadSet {
    keys: Vec<(TreeId, Vec<u8>)>,
    ranges: Vec<(TreeId, KeyRange)>,
}

impl ReadSet {
    /// Records a point read.
    pub fn read_key(&mut self, tree: TreeId, key: &[u8]) {
        self.keys.push((tree, key.to_vec()));
    }

    /// Records a scan that covered `range`.
    pub fn read_range(&mut self, tree: TreeId, range: KeyRange) {
        self.ranges.push((tree, range));
    }

    fn touched_by(&self, tree: TreeId, written: &KeyRange) -> bool {
        self.keys
            .iter()
            .any(|(t, k)| *t == tree && written.contains(k))
            || self
                .ranges
                .iter()
                .any(|(t, r)| *t == tree && r.overlaps(written))
    }
}

#[derive(Default)]
struct State {
    /// Sequence number of the newest commit.
    seq: u64,
    /// Start sequences of open transactions, with multiplicity.
    active: BTreeMap<u64, usize>,
    /// Writes of commits newer than the oldest open transaction, oldest first.
    log: VecDeque<(u64, Vec<(TreeId, KeyRange)>)>,
}

/// Per-store record of recent writes, shared by all transactions of one store.
#[derive(Default)]
pub struct ConflictTracker {
    state: Mutex<State>,
}

/// A started transaction's place in the tracker; hand it back to [`ConflictTracker::end`].
#[derive(Debug, Clone, Copy)]
pub struct TxnStart(u64);

impl ConflictTracker {
    /// A tracker with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a transaction starting now.
    pub fn begin(&self) -> TxnStart {
        let mut s = self.state.lock();
        let seq = s.seq;
        *s.active.entry(seq).or_insert(0) += 1;
        TxnStart(seq)
    }

    /// Unregisters a transaction (committed or aborted) and forgets writes no open
    /// transaction can conflict with any more.
    pub fn end(&self, start: TxnStart) {
        let mut s = self.state.lock();
        if let Some(n) = s.active.get_mut(&start.0) {
            *n -= 1;
            if *n == 0 {
                s.active.remove(&start.0);
            }
        }
        let oldest = s.active.keys().next().copied();
        match oldest {
            None => s.log.clear(),
            Some(oldest) => {
                while s.log.front().is_some_and(|(seq, _)| *seq <= oldest) {
                    s.log.pop_front();
                }
            }
        }
    }

    /// True when a commit after `start` wrote something `reads` covers.
    pub fn conflicts(&self, start: TxnStart, reads: &ReadSet) -> bool {
        let s = self.state.lock();
        s.log
            .iter()
            .filter(|(seq, _)| *seq > start.0)
            .any(|(_, writes)| {
                writes
                    .iter()
                    .any(|(tree, range)| reads.touched_by(*tree, range))
            })
    }

    /// Records a commit of `batch` (transactional or plain write). Must be called under the
    /// backend's apply lock, right after validation, for every applied batch.
    pub fn record(&self, batch: &WriteBatch) {
        let mut s = self.state.lock();
        s.seq += 1;
        if s.active.is_empty() {
            // No open transaction began before this commit, so none can conflict with it.
            return;
        }
        let seq = s.seq;
        let writes = batch
            .ops()
            .iter()
            .map(|op| (op.tree(), op.written_range()))
            .collect();
        s.log.push_back((seq, writes));
    }
}
