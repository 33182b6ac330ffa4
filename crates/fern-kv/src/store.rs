//! The store traits. This module owns the contract every backend implements and every caller
//! relies on; it must never contain an implementation.
//!
//! # Contract
//!
//! * **Keys and order.** Keys are byte strings compared lexicographically (so callers encode
//!   integers big-endian). Each [`TreeId`] is an independent keyspace; a [`WriteBatch`] may
//!   span trees and is atomic across them.
//! * **Reads** ([`KvRead`]) see the latest committed state. A `scan` returns at most `limit`
//!   pairs in the requested direction; the caller pages by narrowing the bound it started from
//!   to `Excluded(last key)`. `limit == 0` returns nothing. Backends may return fewer than
//!   `limit` pairs only when the range holds no more.
//! * **Writes** ([`KvStore::write`]) apply a batch atomically and in order: all ops or none,
//!   and a later op sees the earlier ops' effects on the same key (an upsert after a put
//!   receives the put's value as `old`). Unknown trees or update functions fail the whole
//!   batch before anything is applied.
//! * **Upserts** call the registered function lazily or eagerly, the caller cannot tell: the
//!   function is deterministic, so both give the same value. A backend without native upserts
//!   (etcd, TiKV, FoundationDB) emulates one inside its transaction: read the key, apply the
//!   function, write the result, guarded by compare-on-revision of that key.
//! * **Range delete** removes `[lo, hi)`; `lo >= hi` removes nothing. etcd's `DeleteRange`,
//!   TiKV's `delete_range` and FoundationDB's `clear_range` are each one operation.
//! * **Transactions** ([`KvStore::begin`]) are optimistic. Reads through the transaction are
//!   recorded (point keys with the version seen, scans with the key range they covered);
//!   writes are buffered in the transaction's batch and are **not** visible to its own reads
//!   (as in an etcd `Txn`: read first, then decide what to write). `commit` applies the batch
//!   atomically if and only if nothing the transaction read was written by another commit
//!   after the transaction began; otherwise it returns [`crate::KvError::Conflict`] and applies
//!   nothing. A read through the transaction may return `Conflict` too, when the backend
//!   already knows the commit would (a write-back store whose mode changed since the begin:
//!   its reads must not mix two modes); the caller reruns as after a failed commit.
//!   [`crate::transact`] retries either with bounded, jittered backoff.
//! * **Durability.** A write or commit with [`WriteOptions::sync`] is durable when it returns.
//!   Without it, it is atomic but may be lost, whole, at a crash; [`KvStore::sync`] makes every
//!   earlier write durable. Writes are durable in order: a crash never keeps a later batch and
//!   loses an earlier one.
//! * **Guards** ([`KeyGuard`]: "this key holds exactly this value", or "is absent").
//!   [`KvStore::get_guarded`] and [`KvStore::scan_guarded`] return what a plain read would, but
//!   only if every guard holds at the same instant as the read; otherwise
//!   [`crate::KvError::GuardFailed`] and nothing. [`KvTxn::guard`] makes the commit conditional
//!   on the guard holding at commit: a commit whose guard does not hold applies nothing and
//!   fails with `GuardFailed` or `Conflict` (then a rerun of the transaction, as
//!   [`crate::transact`] does, fails with `GuardFailed` at its `guard` call, or commits if the
//!   key changed back). A backend that can evaluate a compare with a read (etcd) does it in
//!   the same round trip; the default methods read the key through a transaction, which is
//!   correct on every backend that implements the transaction contract.
//!
//! # Big operations: resumable steps
//!
//! [`KvStore::limits`] reports how much one atomic step may hold; etcd v3 allows 128 ops and
//! 1.5 MiB. Callers must therefore never need an unbounded atomic batch. The rule fern-fs
//! follows, and any caller should: an operation that may exceed the limit is split into steps
//! that are each atomic, each **idempotent** (running a step twice equals running it once) and
//! **resumable from durable state** (after a crash between steps, state in the store says which
//! step to run next). The pattern is a *intent record*: step 1 atomically makes the change
//! visible to users and writes a record of the remaining work (e.g. unlink of a 1 TiB file:
//! remove the directory entry and put an orphan record); later steps do the work in bounded
//! chunks (a range delete per chunk of blocks, each one op); the last step removes the record.
//! At mount, records left behind are found by one scan and their remaining steps rerun.
//! A range delete counts as one op whatever it covers, which is what keeps truncate and unlink
//! O(1) in ops.

use crate::batch::WriteBatch;
use crate::error::{KvError, KvResult};
use crate::extent::ExtentRef;
use crate::guard::KeyGuard;
use crate::retry::{Backoff, RetryPolicy};
use crate::types::{Direction, KeyRange, Limits, TreeId, WriteOptions};

/// Point and range reads, shared by the store and its transactions.
pub trait KvRead {
    /// The value of `key` in `tree`, if present.
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>>;

    /// Up to `limit` pairs of `range`, ascending for [`Direction::Forward`] and descending for
    /// [`Direction::Reverse`].
    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Fills `buf`, exactly the extent's length, with the bytes of the live extent `r`
    /// (crate `extent` docs). Not recorded as a transaction read: the row that held `r` was.
    /// A wrapper store that forwards [`KvStore::limits`] must forward this (and
    /// [`KvStore::extents`]) too: its callers take `limits().extents` as a promise.
    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        let _ = (r, buf);
        Err(KvError::Unsupported {
            what: "data extents",
        })
    }
}

/// An ordered, transactional key-value store. Implementations are shared between threads.
pub trait KvStore: KvRead + Send + Sync {
    /// The handle of the tree called `name`, creating the tree if the backend can. The same
    /// name always yields the same handle for the lifetime of the store.
    fn tree(&self, name: &str) -> KvResult<TreeId>;

    /// Applies `batch` atomically and in order; durable on return if `opts.sync`.
    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()>;

    /// Starts an optimistic transaction.
    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>>;

    /// Makes every write that returned before this call durable.
    fn sync(&self) -> KvResult<()>;

    /// What one atomic batch or commit may hold.
    fn limits(&self) -> Limits;

    /// An empty buffer with room for `len` bytes, to fill with the data of an extent
    /// ([`WriteBatch::put_extent`](crate::WriteBatch::put_extent)). A backend that keeps the
    /// buffers of extents it has written hands one back, so that filling it touches pages
    /// already resident; any `Vec` is accepted as extent data.
    fn extent_buffer(&self, len: usize) -> Vec<u8> {
        Vec::with_capacity(len)
    }

    /// Bytes the store occupies on its media, when the backend can tell without scanning
    /// (fern-fs reports it as used blocks in statfs). `None`: unknown.
    fn space_used(&self) -> Option<u64> {
        None
    }

    /// Capacity, use and what new data can still use, when the backend can tell without
    /// scanning (fern-fs reports it in statfs). `None`: unknown.
    fn space(&self) -> Option<crate::StoreSpace> {
        None
    }

    /// This handle's session when other handles (other processes, other machines) may write
    /// the store at the same time; `Ok(None)` when this handle is its only writer (the
    /// embedded backends), which lets a caller trust what it remembers of the store between
    /// reads. Asked once, when the caller starts using the store (fern-fs: `Fs::mount`); a
    /// shared store may start its session on that first call (etcd: grants the lease).
    fn session(&self) -> KvResult<Option<&dyn KvSession>> {
        Ok(None)
    }

    /// Whether a point read costs no more than the part of a short range scan it replaces: an
    /// embedded store answers a read without a round trip, so a caller wanting a few known
    /// keys asks for them one by one (fern-fs: a read of a few blocks); a remote store (etcd:
    /// one round trip per read, whatever it returns) keeps the default, and gets one scan.
    fn point_reads_cheap(&self) -> bool {
        false
    }

    /// [`KvRead::get`] of `key`, only if every guard holds when the key is read (contract:
    /// "Guards").
    fn get_guarded(
        &self,
        guards: &[KeyGuard],
        tree: TreeId,
        key: &[u8],
    ) -> KvResult<Option<Vec<u8>>> {
        guarded_read(self, guards, |txn| txn.get(tree, key))
    }

    /// [`KvRead::scan`], only if every guard holds when the range is read (contract:
    /// "Guards").
    fn scan_guarded(
        &self,
        guards: &[KeyGuard],
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        guarded_read(self, guards, |txn| txn.scan(tree, range, dir, limit))
    }

    /// The values of `keys` — (tree, key) pairs — in their order, as [`KvRead::get`] of each
    /// would return them. A remote store reads them in few round trips (etcd: one Txn per
    /// [`Limits::max_ops`] keys); the keys of one round trip are read at one instant, not
    /// necessarily all of them. For callers that want many known, small rows at once
    /// (fern-fs: the rows of a listed directory's entries for readdirplus).
    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> KvResult<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }

    /// [`KvStore::get_many`], each round trip only if every guard holds when it reads
    /// (contract: "Guards").
    fn get_many_guarded(
        &self,
        guards: &[KeyGuard],
        keys: &[(TreeId, Vec<u8>)],
    ) -> KvResult<Vec<Option<Vec<u8>>>> {
        if guards.is_empty() {
            return self.get_many(keys);
        }
        keys.iter()
            .map(|(t, k)| self.get_guarded(guards, *t, k))
            .collect()
    }

    /// [`KvStore::get_many`] that also reads ahead: with the values of `keys`, the first
    /// `limit` rows (forward) of each of `ranges` in `tree`, in the same round trips where the
    /// store can (etcd: Range ops in the first Txn; callers keep `ranges` to a few). A range
    /// the store does not read that way is `None` — on every store by default, and on a
    /// write-back holder, whose scans merge with its buffer. For reading ahead only (fern-fs:
    /// the listings of the subdirectories a walk lists next): the caller must do without.
    fn get_many_reading_ahead(
        &self,
        keys: &[(TreeId, Vec<u8>)],
        tree: TreeId,
        ranges: &[KeyRange],
        limit: usize,
    ) -> KvResult<ReadAhead> {
        let _ = (tree, limit);
        Ok((self.get_many(keys)?, vec![None; ranges.len()]))
    }

    /// [`KvStore::get_many_reading_ahead`], each round trip only if every guard holds when
    /// it reads (contract: "Guards").
    fn get_many_reading_ahead_guarded(
        &self,
        guards: &[KeyGuard],
        keys: &[(TreeId, Vec<u8>)],
        tree: TreeId,
        ranges: &[KeyRange],
        limit: usize,
    ) -> KvResult<ReadAhead> {
        let _ = (tree, limit);
        Ok((
            self.get_many_guarded(guards, keys)?,
            vec![None; ranges.len()],
        ))
    }

    /// A hint: the caller knows the store holds nothing in `range` of `tree` (fern-fs: the
    /// keys under an inode id it has just allocated, never used before). A store that caches
    /// what it read may answer reads there without asking its backend
    /// (`crate::WriteBack` while it holds its delegation, docs/design.md §7.3); every other
    /// store ignores it. Wrong hints make wrong answers: give only what is certain.
    fn assume_absent(&self, tree: TreeId, range: &KeyRange) {
        let _ = (tree, range);
    }

    /// Every live data extent, for a checker comparing them with the rows that name them
    /// (format.md X9). Empty on a backend without extents.
    fn extents(&self) -> KvResult<Vec<ExtentRef>> {
        Ok(Vec::new())
    }
}

/// What [`KvStore::get_many_reading_ahead`] returns: the values of the keys, in order, and per
/// range its first rows (`None`: not read ahead).
pub type ReadAhead = (Vec<Option<Vec<u8>>>, Vec<Option<Vec<(Vec<u8>, Vec<u8>)>>>);

/// A live handle's presence on a shared store (etcd: a lease kept alive by the handle). What
/// it holds disappears when the handle goes away — dropped, its process killed, or cut off
/// from the store for longer than the session's time to live — so other handles can tell
/// live holders from dead ones.
pub trait KvSession: Send + Sync {
    /// Unique among the sessions ever started on the store.
    fn id(&self) -> u64;

    /// From now on every put into `tree` through this handle — in a `write` batch or a
    /// transaction's commit — is held by this session: removed by the store when the session
    /// ends (removing it earlier is an ordinary delete), and refused once the session is
    /// lost. Held keys are written like any other, so they can be atomic with other keys
    /// (fern-fs: a file's open registration in the transaction that creates it) and stay
    /// ordered with the handle's other writes — there is deliberately no put beside the
    /// write path, which a write-back store (`WriteBack`) would reorder against what it
    /// buffered. Fails when the session is lost.
    fn hold_tree(&self, tree: TreeId) -> KvResult<()>;

    /// From now until the handle goes away, calls `on_put(key)` for every put into `tree` by
    /// any handle of the store, and once at the start for every key already in `tree` (so a
    /// put made just before the call is not missed). Called in the order of the puts, on a
    /// thread of its own (it may call the store). A put is seen at least once; a watch that
    /// had to reconnect may repeat one.
    fn watch_puts(&self, tree: TreeId, on_put: Box<dyn Fn(Vec<u8>) + Send>) -> KvResult<()>;

    /// An instant before which this session cannot have ended, when the backend can bound
    /// it (etcd: the moment the last renewal that succeeded was sent, plus the time to live
    /// it was granted — the server counts from when it received it, which is later).
    /// `None`: unknown. A holder of a delegation answers from what it cached only well
    /// before this instant (docs/design.md §7.3, W6): after it, another session may hold.
    fn valid_until(&self) -> Option<std::time::Instant> {
        None
    }

    /// Renews the session now, so that [`KvSession::valid_until`] reflects this moment
    /// (etcd: one lease renewal, bounded by the store's timeout). For a holder whose last
    /// periodic renewal is too old to answer from its cache (W6). Nothing to do where the
    /// backend cannot bound the session.
    fn renew(&self) -> KvResult<()> {
        Ok(())
    }

    /// Returns `true` once `key` of `tree` is absent (at once if it is), `false` if it is
    /// still present after `timeout`.
    fn wait_absent(&self, tree: TreeId, key: &[u8], timeout: std::time::Duration)
        -> KvResult<bool>;
}

/// An optimistic transaction: recorded reads plus a buffered batch. Dropping it without
/// committing aborts it (nothing to undo: no write reached the store).
pub trait KvTxn: KvRead {
    /// The buffered writes; add to it with [`WriteBatch::put`] and friends.
    fn batch(&mut self) -> &mut WriteBatch;

    /// Makes the commit conditional on `guard` holding at commit (contract: "Guards"). May
    /// fail at once with [`crate::KvError::GuardFailed`] when the backend has read the key to
    /// check it (the default: one recorded read); etcd only adds a compare to the commit.
    fn guard(&mut self, guard: &KeyGuard) -> KvResult<()> {
        let found = self.get(guard.tree, &guard.key)?;
        guard.check(found.as_deref())
    }

    /// Makes every read of this transaction conditional on `guard` holding at the
    /// transaction's snapshot, and its commit on `guard` holding at commit; call it before the
    /// first read. A read whose guard does not hold fails with
    /// [`crate::KvError::GuardFailed`]. The default checks the guard once, now, as a recorded
    /// read (which the commit validates): right on a backend whose reads all see one state
    /// between commits; etcd evaluates it in the Txn of the read that pins the snapshot, so it
    /// costs no round trip (docs/design.md §7.3, W1).
    fn guard_reads(&mut self, guard: &KeyGuard) -> KvResult<()> {
        self.guard(guard)
    }

    /// Applies the buffered batch atomically if nothing read was changed since `begin`;
    /// fails with [`crate::KvError::Conflict`] otherwise, applying nothing.
    fn commit(self: Box<Self>, opts: WriteOptions) -> KvResult<()>;
}

/// The default guarded read: the guards and the read in one read-only transaction, so they
/// are seen at one instant; reruns (bounded) when another commit changed them in between.
fn guarded_read<S, T>(
    store: &S,
    guards: &[KeyGuard],
    read: impl Fn(&dyn KvTxn) -> KvResult<T>,
) -> KvResult<T>
where
    S: KvStore + ?Sized,
{
    let mut backoff = Backoff::new(RetryPolicy::default());
    loop {
        let mut txn = store.begin()?;
        for g in guards {
            txn.guard(g)?;
        }
        let out = read(&*txn)?;
        match txn.commit(WriteOptions::NO_SYNC) {
            Ok(()) => return Ok(out),
            Err(e) if e.is_conflict() && backoff.retry() => {}
            Err(e) if e.is_conflict() => {
                return Err(crate::KvError::RetriesExhausted {
                    attempts: backoff.attempts(),
                })
            }
            Err(e) => return Err(e),
        }
    }
}
