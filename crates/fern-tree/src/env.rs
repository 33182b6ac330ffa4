//! The environment: named trees sharing one block file, one node cache, one MSN sequence and
//! one write-ahead log; atomic, logged write batches across trees; group commit; checkpoints;
//! recovery on open (read-write, read-only: W11, or cutting a damaged log: W4); close.
//!
//! Creating, opening and recovering an environment is `env/open.rs`; this file is the running
//! environment (writes, sync, close, handles).
//!
//! Owns the catalog's contents at run time (its encoding is catalog.rs's; it is stored as the
//! block file's meta blob in every checkpoint), the rule that a failed write or sync poisons
//! the environment (invariant E2), and the admission of write batches on a fixed-size image
//! (B11–B13: refuse new data before the reserve, make room with checkpoints and reclamation
//! steps; the arithmetic is space.rs's). Never: touches node internals (betree/), block
//! placement (blockfile.rs) or log framing (wal.rs); never acknowledges a `Sync` commit before
//! its log record is durable (W3); never applies a batch it has not logged first (W2).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::admission::reclaim_before_close;
use crate::betree::{self, Ctx, Shape};
use crate::blockfile::BlockFile;
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::catalog::{State, TreeEntry};
use crate::checkpoint::Wakeup;
use crate::codec::Compression;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, NodeId};
use crate::msg::{Op, UpsertRegistry};
use crate::node::Node;
use crate::options::{Durability, RecoveryReport};
use crate::space::Admission;
use crate::stats::{Counters, Stats};
use crate::tree::{Tree, WriteBatch};
use crate::wal::{self, Wal};

mod open;

pub(crate) struct Inner {
    pub(crate) state: RwLock<State>,
    pub(crate) cache: Cache,
    pub(crate) bf: Mutex<BlockFile>,
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) shape: Shape,
    pub(crate) upserts: UpsertRegistry,
    pub(crate) poisoned: Mutex<Option<String>>,
    pub(crate) closed: AtomicBool,
    pub(crate) wal: Wal,
    pub(crate) durability: Durability,
    /// One checkpoint at a time (held for its whole duration; never taken under `state`).
    pub(crate) ckpt_lock: Mutex<()>,
    /// Wakes the checkpoint thread, if there is one.
    pub(crate) ckpt_signal: Option<Arc<Wakeup>>,
    /// Wakes the writeback thread (writeback.rs), if there is one (with the checkpoint thread).
    pub(crate) writeback_signal: Option<Arc<Wakeup>>,
    /// Message bytes applied (`Counters::message_bytes`) when writers last woke the writeback
    /// thread: the next wake waits for [`WRITEBACK_EVERY`] more (writeback.rs).
    pub(crate) writeback_woken_at: std::sync::atomic::AtomicU64,
    /// Wakes the root-drain thread (drain.rs), if there is one (with the checkpoint thread);
    /// without it writers flush their roots inline.
    pub(crate) drain_signal: Option<Arc<Wakeup>>,
    /// `Options::flush_beside_writer`, decided at open.
    pub(crate) flush_beside_writer: bool,
    /// LSN below which this open has returned the log region's bytes to the host (W9).
    pub(crate) log_released: Mutex<u64>,
    /// Opened with `Options::read_only` (W11).
    pub(crate) read_only: bool,
    /// What recovery found (set once by the open).
    pub(crate) recovery: Mutex<RecoveryReport>,
    /// The size nothing is allocated past (B11): the catalog's capacity or the device's,
    /// whichever is smaller; `None` for an image that grows.
    pub(crate) limit: Option<u64>,
    /// Data bytes that releasing batches said they delete since the last reclamation pass.
    pub(crate) freed_hint: std::sync::atomic::AtomicU64,
    /// Set when enough was deleted that the checkpoint thread should push the deletes down.
    pub(crate) reclaim_wanted: AtomicBool,
    /// No background reclamation pass starts before this instant (B13's pacing), unless a
    /// fixed-size image runs short of room.
    pub(crate) reclaim_paced_until: Mutex<Option<std::time::Instant>>,
    /// A background pass's steps wait for two checkpoints to release what they freed (B13):
    /// the generation after which those two come, and when the checkpoint thread runs them
    /// itself if the writers' checkpoints have not.
    pub(crate) release_due: Mutex<Option<(std::time::Instant, u64)>>,
    /// Data extent bytes bound since the last checkpoint snapshot (X10).
    pub(crate) extent_bytes: std::sync::atomic::AtomicU64,
    /// Data buffers of written extents, for the next writers (extent.rs `BufferPool`).
    pub(crate) extent_buffers: crate::extent::BufferPool,
}

/// Data bytes deleted (as releasing batches report them) after which the deletes are pushed
/// down in the background so that their space is really returned (format.md, B13): this, or
/// a 32nd of a fixed-size image if that is less.
pub(crate) const RECLAIM_AFTER: u64 = 8 << 20;

/// Most rounds (reclaim steps, then two checkpoints) one attempt to make room runs, and the
/// pass at close.
pub(crate) const ROOM_ROUNDS: usize = 64;

/// Most rounds of one background pass (B13) where room is short (a fixed-size image with less
/// than a quarter left): it runs beside writers, so it stops after a bounded amount of work
/// (8 rounds of at most 16 nodes, each followed by a checkpoint); the next deletes ask again,
/// and close finishes the rest. Elsewhere a pass is one round with no checkpoint of its own
/// ([`RELEASE_WAIT`]).
pub(crate) const BACKGROUND_ROUNDS: usize = 8;

/// How long the checkpoints that release what a background pass's steps freed may be left to
/// the writers (B13): the checkpoint thread runs the missing ones itself after this. A
/// checkpoint writes every dirty node, and a pass that ran its own (a pair, and one per round)
/// cost postmark through the mount, pinned to one CPU, nine of its twelve checkpoints and
/// ~2 s of its ~12 s; writers that keep writing fill the log and checkpoint anyway.
pub(crate) const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// After a background reclamation pass that took `d`, the next one waits `RECLAIM_PACE × d`
/// (B13): reclamation takes at most a fifth of the checkpoint thread's time. Unpaced, a
/// stream of creates and deletes (postmark) ran a pass, eight rounds and ten checkpoints,
/// after every 8 MiB deleted: 184 checkpoints in 14 s, 5× write amplification.
pub(crate) const RECLAIM_PACE: u32 = 4;

/// How long a background reclamation pass asked for after a quiet spell waits before it runs
/// (B13), so the syncs that usually follow a delete (`rm big; sync`) do not queue behind its
/// checkpoints: each pass syncs the device at least four times, and an `fsync` right after
/// unlinking a 256 MiB file waited 35–45 ms for them (F9c), against 0.2 ms without.
pub(crate) const RECLAIM_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Most log bytes one [`Inner::release_log_step`] punches: writers wait for one step (a few
/// milliseconds of `fallocate` at most), not for the whole release.
pub(crate) const LOG_RELEASE_STEP: u64 = 4 << 20;

impl Inner {
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cache: &self.cache,
            bf: &self.bf,
            dev: &self.dev,
            shape: &self.shape,
            upserts: &self.upserts,
            counters: &self.counters,
            busy: None,
            overlay: None,
        }
    }

    /// Closes: waits for a running checkpoint, stops the background threads, and (unless
    /// poisoned or already closed) commits a final checkpoint. Nothing writes to the image after
    /// this returns.
    pub(crate) fn shutdown(&self) -> Result<()> {
        let _one = self.ckpt_lock.lock();
        if self.closed.swap(true, Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        if let Some(sig) = &self.ckpt_signal {
            sig.nudge();
        }
        if self.poisoned.lock().is_some() {
            return Ok(());
        }
        let st = self.state.write();
        self.checkpoint_locked(&st)?;
        // A second checkpoint (nothing is dirty now: a table, a meta blob, two syncs) makes
        // both header slots name the final state, so an unmounted image keeps no log records
        // and no node versions only the older checkpoint referenced (W9, B4).
        if self.bf.lock().oldest_checkpoint_lsn() < self.wal.end() {
            self.checkpoint_locked(&st)?;
        }
        Ok(())
    }

    /// One round of the periodic flusher: syncs the log if anything in it, records or a sync
    /// mark, is not durable yet (a pending mark alone is synced too, W10).
    pub(crate) fn periodic_flush(&self) -> Result<()> {
        if self.wal.has_unsynced() {
            self.wal.sync_to_end()?;
        }
        Ok(())
    }

    /// Records the first failure (E2) and fails every waiter of the log (W3).
    pub(crate) fn set_poison(&self, why: String) {
        self.wal.fail(&why);
        let mut p = self.poisoned.lock();
        if p.is_none() {
            *p = Some(why);
        }
    }
}

/// An open environment. Cheap to clone; all clones share the same state. When the last clone
/// (and the last [`Tree`] and cursor, which hold one) is dropped without [`Env::close`], the
/// environment is closed with a final checkpoint before the drop returns, so the image can be
/// reopened at once.
#[derive(Clone)]
pub struct Env {
    pub(crate) inner: Arc<Inner>,
    /// Present in every handle a user holds; `None` in the background threads' handles, which
    /// therefore never keep an environment open.
    pub(crate) _user: Option<Arc<UserHandle>>,
}

/// Dropped with the last user handle: closes the environment.
pub(crate) struct UserHandle(pub(crate) Arc<Inner>);

impl Drop for UserHandle {
    fn drop(&mut self) {
        // A handle dropped without close() still gets a checkpoint, so an embedded user who
        // forgets close() loses nothing; errors have nowhere to go.
        let _ = reclaim_before_close(&self.0);
        let _ = self.0.shutdown();
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("shape", &self.inner.shape)
            .finish()
    }
}

impl Env {
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        self.inner.ctx()
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(Error::ReadOnly("a write, sync or checkpoint"));
        }
        if let Some(why) = self.inner.poisoned.lock().clone() {
            return Err(Error::Poisoned(why));
        }
        if self.inner.closed.load(Ordering::Relaxed) {
            return Err(Error::InvalidArgument("environment is closed".into()));
        }
        Ok(())
    }

    /// Marks the environment unusable for writes after a failure that may have left memory and
    /// disk out of step (invariant E2).
    pub(crate) fn poison<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.inner.set_poison(e.to_string());
        }
        r
    }

    /// Takes the write lock once the log has room for a record of `payload_len` bytes,
    /// checkpointing (without the lock) as often as needed to make room (W5). A batch larger
    /// than half the region is refused; if room cannot be made the write fails with
    /// [`Error::NoSpace`] and nothing is written.
    pub(crate) fn lock_with_log_room(
        &self,
        payload_len: usize,
    ) -> Result<parking_lot::RwLockWriteGuard<'_, State>> {
        let w = &self.inner.wal;
        if Wal::framed_len(payload_len) > w.capacity() / 2 {
            return Err(Error::InvalidArgument(format!(
                "a write batch of {payload_len} log bytes exceeds half the log region ({} bytes)",
                w.capacity()
            )));
        }
        for attempt in 0..4 {
            let st = self.inner.state.write();
            let oldest = self.inner.bf.lock().oldest_checkpoint_lsn();
            if w.fits(payload_len, oldest) {
                return Ok(st);
            }
            drop(st);
            if attempt < 3 {
                // Each checkpoint moves the oldest needed LSN up to where the previous one was.
                self.checkpoint()?;
            }
        }
        Err(Error::NoSpace {
            context: "appending to the write-ahead log: every record in it is still needed".into(),
        })
    }

    /// Appends a record under the write lock (W2: LSN order is MSN order).
    pub(crate) fn append_locked(&self, payload: &[u8]) -> Result<Lsn> {
        let oldest = self.inner.bf.lock().oldest_checkpoint_lsn();
        self.poison(self.inner.wal.append(payload, oldest))
    }

    /// Applies ops (already logged or being replayed) under the write lock, giving each the
    /// next MSN in order. Returns whether a root is jammed behind a detached flush
    /// (`betree::write`): the caller waits for the install once it has released the lock.
    pub(crate) fn apply_locked<'a>(
        &self,
        st: &mut State,
        ops: impl Iterator<Item = (usize, &'a Op)>,
    ) -> Result<bool> {
        // Group by tree, keeping order; each gets consecutive MSNs in batch order. Each tree's
        // buffer is sized first (growing it op by op was 4 % of an unlink's request thread).
        let ops: Vec<(usize, &Op)> = ops.collect();
        let mut per_tree: Vec<(usize, MsgBuffer)> = Vec::new();
        for &(idx, _) in &ops {
            if per_tree.iter().all(|(i, _)| *i != idx) {
                let mine = ops.iter().filter(|(i, _)| *i == idx);
                let bytes = mine.clone().map(|(_, op)| op.encoded_len_bound()).sum();
                per_tree.push((idx, MsgBuffer::with_capacity(bytes, mine.count())));
            }
        }
        let n = ops.len() as u64;
        for (idx, op) in ops {
            let msn = Msn(st.next_msn);
            st.next_msn += 1;
            self.inner.counters.applied(op);
            if let Some((_, b)) = per_tree.iter_mut().find(|(i, _)| *i == idx) {
                b.push(op, msn);
            }
        }
        st.messages += n;
        let ctx = self.ctx();
        let drain = self.inner.drain_signal.as_ref();
        let mut over = false;
        let mut jammed = false;
        for (idx, msgs) in &mut per_tree {
            let root = st.trees[*idx].root;
            let ctx = Ctx {
                busy: st.in_flight.filter(|(t, _)| t == idx).map(|(_, c)| c),
                ..ctx
            };
            let (root, o, j) = betree::write(&ctx, root, msgs, drain.is_some())?;
            st.trees[*idx].root = root;
            over |= o;
            jammed |= j;
        }
        if let Some(sig) = drain.filter(|_| over) {
            sig.wake();
        }
        self.inner.wake_writeback();
        ctx.evict()?;
        Ok(jammed)
    }

    /// Waits until no detached flush is in flight (its install or discard takes a short hold
    /// of the write lock). For a jammed writer, and for restructuring that DF2 excludes.
    pub(crate) fn wait_for_install(&self) {
        // A drain that failed clears its flight before it poisons the environment; the checks
        // only make sure nothing waits on a closed one.
        while self.inner.state.read().in_flight.is_some()
            && !self.inner.closed.load(Ordering::SeqCst)
            && self.inner.poisoned.lock().is_none()
        {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    pub(crate) fn create_tree_locked(&self, st: &mut State, name: &str) -> usize {
        let ctx = self.ctx();
        let leaf = Node::new_leaf(ctx.new_id());
        let root = leaf.id;
        ctx.put(leaf);
        let i = st.trees.len();
        st.trees.push(TreeEntry {
            name: name.to_string(),
            root,
        });
        st.by_name.insert(name.to_string(), i);
        i
    }

    /// Whether enough log has been written since the newest checkpoint that one should start.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        let w = &self.inner.wal;
        let newest = self.inner.bf.lock().checkpoint_lsn();
        w.end().0.saturating_sub(newest.0) > w.capacity() / 4
            || self.inner.extent_bytes.load(Ordering::Relaxed) > w.capacity() / 4
    }

    /// Opens the tree named `name`, creating it if it does not exist.
    pub fn tree(&self, name: &str) -> Result<Tree> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(format!(
                "tree names are 1 to 255 bytes (got {})",
                name.len()
            )));
        }
        if let Some(&i) = self.inner.state.read().by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        self.check_writable()?;
        let st = self.inner.state.write();
        if let Some(&i) = st.by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        let payload = wal::encode_create_tree(st.trees.len() as u32, name);
        drop(st);
        let mut st = self.lock_with_log_room(payload.len())?;
        if let Some(&i) = st.by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        let payload = wal::encode_create_tree(st.trees.len() as u32, name);
        self.append_locked(&payload)?;
        let i = self.create_tree_locked(&mut st, name);
        Ok(self.handle(i, name))
    }

    /// Names of the trees in this environment.
    pub fn tree_names(&self) -> Vec<String> {
        self.inner
            .state
            .read()
            .trees
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    pub(crate) fn handle(&self, idx: usize, name: &str) -> Tree {
        Tree {
            env: self.clone(),
            idx,
            name: Arc::from(name),
        }
    }

    /// Applies a batch atomically with the environment's default durability
    /// ([`Options::durability`], `Buffered` unless configured).
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        self.write_with(batch, self.inner.durability)
    }

    /// Applies a batch atomically: every operation, in order, across any trees of this
    /// environment. The batch is logged as one record before it is applied (W2); with
    /// [`Durability::Sync`] this returns after the record is durable, sharing the fsync with
    /// concurrent `Sync` commits (W3). After a crash the batch is recovered whole or not at all.
    pub fn write_with(&self, batch: WriteBatch, durability: Durability) -> Result<()> {
        self.write_as(batch, durability, Admission::Grows, 0)
    }

    /// [`write`](Self::write) for a batch that frees space (a delete, unlink, truncate): on a
    /// full image it may use the reserve (B12). `freed` is how many data bytes it deletes, as
    /// far as the caller knows (a hint: enough of them make the engine push the deletes down
    /// in the background so that the space really returns, B13).
    pub fn write_releasing(&self, batch: WriteBatch, freed: u64) -> Result<()> {
        self.write_as(batch, self.inner.durability, Admission::Frees, freed)
    }

    pub(crate) fn write_as(
        &self,
        batch: WriteBatch,
        durability: Durability,
        admission: Admission,
        freed: u64,
    ) -> Result<()> {
        if batch.ops.is_empty() {
            if batch.frees.is_empty() {
                return Ok(());
            }
            // A free-only record would replay by MSN like an empty batch (W7): refuse it.
            return Err(Error::InvalidArgument(
                "a batch that frees data extents must also change a row (X9)".into(),
            ));
        }
        for (t, op) in &batch.ops {
            if !Arc::ptr_eq(&t.env.inner, &self.inner) {
                return Err(Error::UnknownTree(t.name.to_string()));
            }
            op.validate(&self.inner.upserts)?;
        }
        crate::extent::check_lengths(&batch.extents)?;
        self.check_writable()?;
        let extent_bytes: u64 = batch.extents.iter().map(|(_, d)| d.len() as u64).sum();
        // The payload's length is final before the extents are written (their references
        // are placeholders of the same size), so admission refuses before any data is written.
        let encode =
            |b: &WriteBatch| wal::encode_batch(b.ops.iter().map(|(t, op)| (t.idx as u32, op)));
        let mut payload = encode(&batch);
        let payload_len =
            payload.len() + crate::extent::ops_len(batch.extents.len(), batch.frees.len());
        self.admit(admission, payload_len as u64 + extent_bytes)?;
        let mut batch = batch;
        let written = self.write_extents(&batch.extents)?;
        let ext_ops = crate::extent::fill_refs(&mut batch, &written.refs);
        if !batch.extents.is_empty() {
            // The references were placeholders of the same size: encoded again, filled in.
            payload = encode(&batch);
        }
        // The data is on the device (or the batch fails below and frees its space): the
        // buffers serve the next writers.
        self.recycle_extent_buffers(&mut batch.extents);
        if !ext_ops.is_empty() {
            wal::add_extent_ops(&mut payload, &ext_ops);
        }
        let mut st = self.lock_with_log_room(payload.len())?;
        crate::extent::check_frees(&st.extents, &batch.frees)?;
        wal::set_first_msn(&mut payload, Msn(st.next_msn));
        let end = self.append_locked(&payload)?;
        written.disarm();
        let r = self
            .apply_locked(&mut st, batch.ops.iter().map(|(t, op)| (t.idx, op)))
            .and_then(|jammed| {
                crate::extent::apply(&mut st, &mut self.inner.bf.lock(), &ext_ops, &|_| false)
                    .map(|()| jammed)
            });
        let jammed = self.poison(r)?;
        drop(st);
        if jammed {
            self.wait_for_install();
        }
        if extent_bytes > 0 {
            self.inner
                .extent_bytes
                .fetch_add(extent_bytes, Ordering::Relaxed);
        }
        // Asked before `note_freed` may wake the checkpoint thread: `wants_checkpoint` takes
        // the block file's mutex, which a checkpoint holds across its device syncs and hole
        // punches. Asked after the wake, a writer that freed much (an unlink of 256 MiB of
        // extents) raced the reclamation it had just started and waited for its first
        // checkpoint's commit: 130-360 ms of an unlink through FUSE (fs-design.md §9, F9c).
        let want = self.wants_checkpoint();
        if admission == Admission::Frees {
            self.note_freed(freed)?;
        }
        if want {
            self.request_checkpoint()?;
        }
        if durability == Durability::Sync {
            self.poison(self.inner.wal.wait_durable(end))?;
        }
        Ok(())
    }

    /// Makes every batch written so far durable (one fsync, shared with concurrent commits).
    pub fn sync(&self) -> Result<()> {
        self.check_writable()?;
        self.poison(self.inner.wal.sync_all())
    }

    /// Does what one round of the periodic flusher does (for deterministic tests that run
    /// without it, `sync_interval: None`): syncs the log if a record or a sync mark is not yet
    /// durable.
    #[doc(hidden)]
    pub fn periodic_flush(&self) -> Result<()> {
        self.check_writable()?;
        self.poison(self.inner.periodic_flush())
    }

    /// Checkpoints and closes. Other clones of this handle can no longer write.
    pub fn close(self) -> Result<()> {
        reclaim_before_close(&self.inner)?;
        self.inner.shutdown()
    }

    /// What the open found and worked around: damaged header slots, the number of log records
    /// replayed, and (with [`Options::cut_damaged_log`]) where a damaged log was cut.
    pub fn recovery(&self) -> RecoveryReport {
        self.inner.recovery.lock().clone()
    }

    /// The codec new partitions are written with (the image's remembered choice, or
    /// [`Options::change_compression`]).
    pub fn compression(&self) -> Compression {
        self.inner.shape.compression
    }

    /// Whether this environment was opened with [`Options::read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let st = self.inner.state.read();
        Stats {
            cache: self.inner.cache.stats(),
            file: self.inner.bf.lock().stats(),
            device: self.inner.counters.device(),
            messages: st.messages,
            message_bytes: self.inner.counters.message_bytes(),
            log_syncs: self.inner.wal.syncs.load(Ordering::Relaxed),
            log_end: self.inner.wal.end(),
            log_durable: self.inner.wal.durable(),
            work: self.inner.counters.work(),
        }
    }

    /// Runs a structural change `f` (no logical change to the rows) on a tree's root under the
    /// write lock; `f` returns the new root. A failure poisons the environment.
    pub(crate) fn restructure(
        &self,
        t: &Tree,
        f: impl FnOnce(&Ctx<'_>, NodeId) -> Result<NodeId>,
    ) -> Result<()> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        while st.in_flight.is_some() {
            // Optimize and its kin change every child (DF2): after the detached flush.
            drop(st);
            self.wait_for_install();
            st = self.inner.state.write();
        }
        let root = root_of(&st, t)?;
        let ctx = self.ctx();
        let r = f(&ctx, root).and_then(|new_root| {
            st.trees[t.idx].root = new_root;
            ctx.evict()
        });
        self.poison(r)
    }

    /// Runs `f` with the tree's root under the read lock.
    pub(crate) fn read<T>(
        &self,
        t: &Tree,
        f: impl FnOnce(&Ctx<'_>, NodeId) -> Result<T>,
    ) -> Result<T> {
        let st = self.inner.state.read();
        let root = root_of(&st, t)?;
        let ctx = self.ctx();
        let r = f(&ctx, root);
        drop(st);
        // Readers evict clean (and, if they must, dirty) nodes so the bound holds for them too.
        if ctx.cache.over_limit() {
            let ev = ctx.evict();
            self.poison(ev)?;
        }
        r
    }
}

/// Syncs `Buffered` commits every `every` until the environment is dropped, closed or poisoned.
pub(crate) fn spawn_flusher(inner: Weak<Inner>, every: Duration) {
    let _ = std::thread::Builder::new()
        .name("fern-log-flush".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(inner) = inner.upgrade() else { return };
            if inner.closed.load(Ordering::Relaxed) || inner.poisoned.lock().is_some() {
                return;
            }
            if let Err(e) = inner.periodic_flush() {
                inner.set_poison(e.to_string());
                return;
            }
        });
}

/// The root of tree `t` in the catalog `st`.
fn root_of(st: &State, t: &Tree) -> Result<NodeId> {
    st.trees
        .get(t.idx)
        .map(|e| e.root)
        .ok_or_else(|| Error::UnknownTree(t.name.to_string()))
}
