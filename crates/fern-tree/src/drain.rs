//! Background root drains (design.md §2.5, "Root flushes off the writer's path"): a thread
//! that flushes the buffers of roots that writers left over the node size, one piece per hold
//! of the environment's write lock, so that a writer's critical section is its log append and
//! root injection, not a cascade of flushes.
//!
//! Owns when a drain runs and how long it holds the lock (one [`betree::flush_step`] per tree,
//! then release). Never: decides what a flush moves (betree/flush.rs), writes nodes (eviction
//! and writeback do, as for any writer's changes), or runs without the checkpoint thread (the
//! deterministic mode flushes inline: `Inner::drain_signal` is `None` there).

use std::sync::{Arc, Weak};

use crate::betree;
use crate::checkpoint::{spawn_poisoning_worker, Wakeup};
use crate::env::Inner;
use crate::error::Result;
use std::sync::atomic::Ordering;

/// Most pieces one round runs before it lets the thread look at its signal again; a round
/// ends earlier when no root is over.
const PIECES_PER_ROUND: usize = 64;

impl Inner {
    /// Drains every root that is over the node size: a root above internal nodes by detached
    /// flushes (betree/detached.rs: the flush runs beside the writers, the lock is held only to
    /// freeze and to install), a root above leaves one flush per lock hold.
    pub(crate) fn drain_roots(&self) -> Result<()> {
        for _ in 0..PIECES_PER_ROUND {
            let mut more = false;
            let trees = self.state.read().trees.len();
            for t in 0..trees {
                more |= self.drain_piece(t)?;
            }
            self.wake_writeback();
            if !more {
                break;
            }
        }
        Ok(())
    }

    /// One piece of tree `t`'s drain. Returns whether its root is still over the node size.
    fn drain_piece(&self, t: usize) -> Result<bool> {
        let mut st = self.state.write();
        if self.closed.load(Ordering::SeqCst) || self.poisoned.lock().is_some() {
            return Ok(false);
        }
        let ctx = self.ctx();
        let root = st.trees[t].root;
        let detached = match self.flush_beside_writer {
            true => betree::detach(&ctx, root)?,
            false => None,
        };
        let Some(mut flush) = detached else {
            // Writers are excluded while the lock is held: every flush counted meanwhile is ours.
            let before = self.counters.flushes();
            let (root, over) = betree::flush_step(&ctx, root)?;
            st.trees[t].root = root;
            self.counters.drained(self.counters.flushes() - before);
            ctx.evict()?;
            return Ok(over);
        };
        st.in_flight = Some((t, flush.child));
        drop(st);
        let ran = flush.run(&ctx);
        let mut st = self.state.write();
        st.in_flight = None;
        let root = st.trees[t].root;
        if self.closed.load(Ordering::SeqCst) {
            // Closed meanwhile: its final checkpoint has run. Nothing may reach the device
            // now (no install, no eviction); the discard only unfreezes memory.
            flush.discard(&ctx, root)?;
            self.counters.detached(false);
            return Ok(false);
        }
        let ended = match ran {
            Ok(()) => flush.install(&ctx, root),
            Err(e) => flush.discard(&ctx, root).and(Err(e)),
        };
        let ended = ended?;
        self.counters.detached(ended.is_some());
        let over = match ended {
            Some((root, over)) => {
                st.trees[t].root = root;
                self.counters.drained(1);
                over
            }
            None => true,
        };
        ctx.evict()?;
        Ok(over)
    }
}

/// Runs root drains when writers ask, until the environment is dropped, closed or poisoned (a
/// failed flush poisons it: E2).
pub(crate) fn spawn_drain(inner: Weak<Inner>, sig: Arc<Wakeup>) {
    spawn_poisoning_worker("fern-drain", inner, sig, Inner::drain_roots);
}
