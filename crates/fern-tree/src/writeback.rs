//! Background writeback: a thread that writes dirty leaves the cache will soon evict, so that
//! the writer's own eviction (at the bound, on the write path) finds them clean and only drops
//! them. On a 2-core machine this moves the encoding and the block writes of evicted leaves —
//! the largest node-write cost of random inserts beyond the memory bound — off the writer's
//! core.
//!
//! Owns when to clean and which nodes: the dirty leaves nobody holds among the least recently
//! used ones that hold the cache above [`CLEAN_FROM`] of its bound. Never: removes a node from the
//! cache (eviction does, and keeps C1), writes a node a writer has replaced since (the version
//! written must be the cached one, or the block table would point at an older version), or
//! writes after the environment closed.
//!
//! Why the order of locks is safe: the node is encoded with no lock (it is immutable: a writer
//! that changes it takes a copy, `Cache::take`); the block is then reserved and written under
//! the environment's read lock and the cache's eviction lock. The read lock excludes writers
//! (who replace nodes and evict) and the checkpoint's snapshot and adoption (W8 steps 1 and 4,
//! which change the current block table); the eviction lock excludes readers' evictions. So
//! between the check that the node is still the cached version and the end of its write, no
//! one else writes that id or frees the extent being written.

use crate::checkpoint::{spawn_poisoning_worker, Wakeup};
use crate::env::Inner;
use crate::error::Result;
use crate::stats::WriteCause;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// The thread cleans while the cache holds more than this share of its bound (in tenths):
/// below the 9/10 the writer's eviction leaves behind, so its victims are mostly clean.
pub(crate) const CLEAN_FROM: usize = 8;

/// Writers wake the thread at most once per this share of a node of messages applied (in
/// quarters of `node_bytes`). A round costs a sort of every cached leaf under the cache's lock
/// and, on a shared core, two context switches; it can only find new work once writes have
/// dirtied or touched more leaves. Woken on every write, postmark through the mount ran
/// 17,373 rounds that wrote nothing (0.6 s of its 12.5 s with everything pinned to one CPU).
pub(crate) const WRITEBACK_EVERY: u64 = 4;

impl Inner {
    /// Whether the cache is full enough that writeback should run.
    pub(crate) fn wants_writeback(&self) -> bool {
        self.cache.used_bytes() as usize > self.cache.limit() / 10 * CLEAN_FROM
    }

    /// Wakes the writeback thread, if there is one, the cache is full enough, and a quarter
    /// node of messages was applied since the last wake ([`WRITEBACK_EVERY`]).
    pub(crate) fn wake_writeback(&self) {
        let Some(sig) = &self.writeback_signal else {
            return;
        };
        let applied = self.counters.message_bytes();
        let last = self.writeback_woken_at.load(Ordering::Relaxed);
        if applied.saturating_sub(last) < self.shape.node_bytes as u64 / WRITEBACK_EVERY
            || !self.wants_writeback()
        {
            return;
        }
        // One writer of those racing here wakes it.
        if self
            .writeback_woken_at
            .compare_exchange(last, applied, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            sig.wake();
        }
    }

    /// Writes the dirty leaves eviction would write next: those among the least recently used
    /// unheld leaves that hold the cache's memory above [`CLEAN_FROM`]. Only those: a leaf
    /// cleaned too early is often dirtied again by a flush before it is evicted, and then
    /// written twice. See the module comment for the locking.
    pub(crate) fn write_back(&self) -> Result<()> {
        let over =
            (self.cache.used_bytes() as usize).saturating_sub(self.cache.limit() / 10 * CLEAN_FROM);
        self.counters.writeback_round();
        for n in self.cache.dirty_leaves(over) {
            let bytes = self.cache.encode(&n, self.shape.compression);
            let _st = self.state.read();
            let _one = self.cache.writeback_lock();
            if self.closed.load(Ordering::SeqCst) || self.poisoned.lock().is_some() {
                return Ok(());
            }
            if !n.is_dirty() || !self.cache.is_current(&n) {
                continue; // changed or written since it was picked
            }
            self.ctx()
                .write_encoded(&n, &bytes, WriteCause::Writeback)?;
            n.set_dirty(false);
        }
        Ok(())
    }
}

/// Runs writeback rounds when writers ask, until the environment is dropped, closed or
/// poisoned (a failed write poisons it: E2).
pub(crate) fn spawn_writeback(inner: Weak<Inner>, sig: Arc<Wakeup>) {
    spawn_poisoning_worker("fern-writeback", inner, sig, Inner::write_back);
}
