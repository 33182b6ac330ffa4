//! Optimistic transactions for embedded backends (the memory oracle and fern-tree), which keep
//! no per-key versions, and the rule every backend shares for what a scan read. It owns the
//! record of which keys recent commits wrote and the one transaction type ([`OccTxn`]) both
//! embedded backends hand out; it must never hold store data, and it keeps a write only as long
//! as some transaction that began before it is still open. Backends with their own versions
//! (etcd's mod_revision) validate with those and use only [`covered`] from here.
//!
//! Rule (validation by write sets, backward-oriented): a transaction that began at commit
//! sequence `s` may commit iff no commit with sequence `> s` wrote a key it read or a key inside
//! a range it scanned. Reads see the latest committed state, so if nothing it read changed after
//! `s`, every read equals the state at `s` and the transaction serializes at its commit point.
//! Backends validate ([`ConflictTracker::conflicts`], through the `validate` callback of
//! [`OccBackend::apply_validated`]) and [`ConflictTracker::record`] under the same lock that
//! makes their batch application atomic, so no commit slips between the two. A committing
//! transaction leaves the open set once validated, before its batch is recorded: a commit
//! only needs recording for transactions other than itself that began before it.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

use parking_lot::Mutex;

use crate::batch::WriteBatch;
use crate::error::{KvError, KvResult};
use crate::store::{KvRead, KvTxn};
use crate::types::{Direction, KeyRange, TreeId, WriteOptions};

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

/// The part of `range` a scan's answer depends on. A scan cut short by `limit` never looked
/// past its last key, so only the range up to (forward) or down to (reverse) that key counts
/// (recording less makes paged scans conflict less often); otherwise the whole range does,
/// since an insertion anywhere in it would change the answer.
pub fn covered(
    range: &KeyRange,
    dir: Direction,
    limit: usize,
    pairs: &[(Vec<u8>, Vec<u8>)],
) -> KeyRange {
    let mut r = range.clone();
    if limit > 0 && pairs.len() == limit {
        if let Some((last, _)) = pairs.last() {
            match dir {
                Direction::Forward => r.hi = Bound::Included(last.clone()),
                Direction::Reverse => r.lo = Bound::Included(last.clone()),
            }
        }
    }
    r
}

/// What an embedded backend provides so that [`OccTxn`] can run on it: reads of the latest
/// committed state, its tracker, and atomic application with validation inside the apply lock.
pub trait OccBackend: KvRead {
    /// The store's conflict tracker.
    fn tracker(&self) -> &ConflictTracker;

    /// Applies `batch` atomically (durable on return if `opts.sync`), first calling `validate`
    /// under the lock that makes application atomic; an error from `validate` applies nothing
    /// and is returned. The backend records the applied batch with
    /// [`ConflictTracker::record`] under the same lock.
    fn apply_validated(
        &self,
        batch: &WriteBatch,
        opts: WriteOptions,
        validate: &dyn Fn() -> KvResult<()>,
    ) -> KvResult<()>;
}

/// An optimistic transaction on an embedded backend: reads go to the store and are recorded;
/// writes wait in the batch until commit, which applies them iff the tracker saw no later
/// commit touch what was read. Dropping it aborts it.
pub struct OccTxn<'a, B: OccBackend + ?Sized> {
    store: &'a B,
    /// `None` once handed back to the tracker (commit), so `Drop` does not end it twice.
    start: Option<TxnStart>,
    reads: RefCell<ReadSet>,
    batch: WriteBatch,
}

impl<'a, B: OccBackend + ?Sized> OccTxn<'a, B> {
    /// A transaction starting now on `store`.
    pub fn begin(store: &'a B) -> Self {
        Self {
            store,
            start: Some(store.tracker().begin()),
            reads: RefCell::new(ReadSet::default()),
            batch: WriteBatch::new(),
        }
    }
}

impl<B: OccBackend + ?Sized> KvRead for OccTxn<'_, B> {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.reads.borrow_mut().read_key(tree, key);
        self.store.get(tree, key)
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let pairs = self.store.scan(tree, range, dir, limit)?;
        self.reads
            .borrow_mut()
            .read_range(tree, covered(range, dir, limit, &pairs));
        Ok(pairs)
    }

    fn read_extent(&self, r: &crate::ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.store.read_extent(r, buf)
    }
}

impl<B: OccBackend + ?Sized> KvTxn for OccTxn<'_, B> {
    fn batch(&mut self) -> &mut WriteBatch {
        &mut self.batch
    }

    fn commit(mut self: Box<Self>, opts: WriteOptions) -> KvResult<()> {
        let Some(start) = self.start.take() else {
            return Err(KvError::Unavailable("transaction already finished".into()));
        };
        let store = self.store;
        let reads = &self.reads;
        let ended = std::cell::Cell::new(false);
        let result = store.apply_validated(&self.batch, opts, &|| {
            let conflict = store.tracker().conflicts(start, &reads.borrow());
            // Validated (or refused), this transaction needs the write log no more: it leaves
            // the open set here, under the apply lock, so that when it was the only open
            // transaction — one request at a time, the usual mount — the backend's `record`
            // of its own batch finds nobody to keep it for and copies no key.
            if !ended.replace(true) {
                store.tracker().end(start);
            }
            if conflict {
                Err(KvError::Conflict)
            } else {
                Ok(())
            }
        });
        if !ended.get() {
            store.tracker().end(start);
        }
        result
    }
}

impl<B: OccBackend + ?Sized> Drop for OccTxn<'_, B> {
    fn drop(&mut self) {
        if let Some(start) = self.start.take() {
            self.store.tracker().end(start);
        }
    }
}
