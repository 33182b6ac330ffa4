//! Admission of write batches on a fixed-size image and the return of deleted space
//! (format.md "Space and the reserve", B11–B13): how much room a batch may use, refusing new
//! data with `NoSpace` before the reserve is touched, making room (checkpoints, pushing deletes
//! down) and the background reclamation that deletes ask for. The arithmetic is space.rs's.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::betree;
use crate::blockfile::{BlockFile, ALIGN};
use crate::env::{
    Env, Inner, BACKGROUND_ROUNDS, RECLAIM_AFTER, RECLAIM_GRACE, RECLAIM_PACE, RELEASE_WAIT,
    ROOM_ROUNDS,
};
use crate::error::{Error, Result};
use crate::space::{self, Admission, Space};

impl Env {
    /// The space figures statfs reports (format.md, "Space and the reserve").
    pub fn space(&self) -> Space {
        let i = &self.inner;
        let reserve = self.reserve_of(&i.bf.lock());
        let (capacity, used) = match i.limit {
            Some(l) => (l, l.saturating_sub(self.room(false))),
            None => {
                let (allocated, end) = {
                    let bf = i.bf.lock();
                    (bf.allocator().allocated_bytes(), bf.allocator().end())
                };
                let used = allocated + i.cache.dirty_bytes();
                let host = i.dev.host_available().ok().flatten().unwrap_or(0);
                (end.max(used).saturating_add(host), used)
            }
        };
        Space {
            capacity,
            used: used.min(capacity),
            available: capacity.saturating_sub(used + reserve),
            reserve,
            fixed: i.limit.is_some(),
        }
    }

    pub(crate) fn reserve_of(&self, bf: &BlockFile) -> u64 {
        let (btt, meta) = self.table_sizes(bf);
        space::reserve(btt, meta, self.inner.shape.node_bytes as u64)
    }

    pub(crate) fn checkpoint_room_of(&self, bf: &BlockFile) -> u64 {
        let (btt, meta) = self.table_sizes(bf);
        space::checkpoint_room(btt, meta, self.inner.shape.node_bytes as u64)
    }

    /// Sizes of the next block table and catalog (the catalog grows only with tree names).
    pub(crate) fn table_sizes(&self, bf: &BlockFile) -> (u64, u64) {
        let btt = (bf.table_entries() + 64) * crate::blockfile::BTT_ENTRY_LEN as u64;
        (btt, 4096)
    }

    /// Space new extents can count on (B12), for a fixed-size image: free space below the
    /// limit in pieces a whole node (or block table) fits in, minus what the dirty nodes will
    /// take when written. `quick` counts only the free tail and takes the whole cache's memory
    /// as the dirty part: no scan, and never more than the precise figure.
    pub(crate) fn room(&self, quick: bool) -> u64 {
        let i = &self.inner;
        let free = {
            let bf = i.bf.lock();
            let unit = space::unit(self.table_sizes(&bf).0, i.shape.node_bytes as u64);
            match (quick, bf.limit()) {
                (_, None) => return u64::MAX,
                (true, Some(l)) => l.saturating_sub(bf.allocator().end()),
                (false, Some(_)) => bf.usable_free(unit).unwrap_or(0),
            }
        };
        let dirty = if quick {
            i.cache.used_bytes() + 2 * ALIGN * i.cache.stats().nodes as u64
        } else {
            i.cache.dirty_bytes()
        };
        free.saturating_sub(dirty)
    }

    /// Admits a batch of `payload` log bytes, or refuses it with [`Error::NoSpace`] before
    /// anything is written (B12). New data must leave the whole reserve untouched; a releasing
    /// batch only the room the checkpoints need. When the batch does not fit, room is made
    /// first: checkpoints release blocks only older checkpoints referenced, and buffered
    /// deletes are pushed down to where they remove rows.
    pub(crate) fn admit(&self, admission: Admission, payload: u64) -> Result<()> {
        let Some(limit) = self.inner.limit else {
            return Ok(());
        };
        let keep = || {
            let bf = self.inner.bf.lock();
            match admission {
                Admission::Grows => self.reserve_of(&bf),
                Admission::Frees => self.checkpoint_room_of(&bf),
            }
        };
        let fits = |quick: bool| payload.saturating_add(keep()) <= self.room(quick);
        if fits(true) || fits(false) {
            return Ok(());
        }
        for _ in 0..ROOM_ROUNDS {
            if !self.make_room()? {
                break;
            }
            if fits(false) {
                return Ok(());
            }
        }
        Err(Error::NoSpace {
            context: format!(
                "writing new data: the image is full ({limit} bytes; the rest is kept for \
                 checkpoints and deletes, which still work)"
            ),
        })
    }

    /// One round of making room on a fixed-size image: a checkpoint pair (releases the blocks
    /// that only older checkpoints referenced, B4), then reclamation steps within what the
    /// checkpoints leave free, then another pair to release what the steps replaced. Returns
    /// whether anything changed (room grew, or deletes moved).
    pub(crate) fn make_room(&self) -> Result<bool> {
        let before = self.room(false);
        {
            let _one = self.inner.ckpt_lock.lock();
            self.checkpoint_fuzzy()?;
            self.checkpoint_fuzzy()?;
        }
        let moved = match self.reclaim_budget() {
            Some(budget) => self.reclaim(budget)?,
            None => false,
        };
        if moved {
            let _one = self.inner.ckpt_lock.lock();
            self.checkpoint_fuzzy()?;
            self.checkpoint_fuzzy()?;
        }
        Ok(moved || self.room(false) > before)
    }

    /// How many bytes of nodes one round of reclamation steps may make dirty: at most 16
    /// nodes, and on a fixed-size image no more than the room the checkpoints leave; `None`
    /// when that is less than a step needs (one path with a split).
    pub(crate) fn reclaim_budget(&self) -> Option<u64> {
        let node = self.inner.shape.node_bytes as u64;
        let mut budget = 16 * node;
        if self.inner.limit.is_some() {
            let room = self.checkpoint_room_of(&self.inner.bf.lock());
            budget = budget.min(self.room(false).saturating_sub(room));
        }
        (budget >= 2 * node).then_some(budget)
    }

    /// Runs reclamation steps (`betree::reclaim_step`) over every tree until no buffered delete
    /// is left or the dirty nodes grew by `budget` bytes. A step changes no row, only where
    /// messages wait, so it needs no log record (like a flush). Returns whether any step ran.
    pub(crate) fn reclaim(&self, budget: u64) -> Result<bool> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        while st.in_flight.is_some() {
            // DF2: reclamation flushes where deletes wait, perhaps into the busy child.
            drop(st);
            self.wait_for_install();
            st = self.inner.state.write();
        }
        let ctx = self.ctx();
        let start = ctx.cache.dirty_bytes();
        let mut moved = false;
        let r = (|| {
            for t in 0..st.trees.len() {
                loop {
                    let (root, step) = betree::reclaim_step(&ctx, st.trees[t].root)?;
                    st.trees[t].root = root;
                    if !step {
                        break;
                    }
                    moved = true;
                    if ctx.cache.dirty_bytes().saturating_sub(start) >= budget {
                        return ctx.evict();
                    }
                }
            }
            ctx.evict()
        })();
        self.poison(r)?;
        Ok(moved)
    }

    /// Counts data deleted by releasing batches; past the threshold, asks for a background
    /// reclamation pass (B13), or runs it here without a checkpoint thread.
    pub(crate) fn note_freed(&self, freed: u64) -> Result<()> {
        let i = &self.inner;
        let total = i.freed_hint.fetch_add(freed.max(1), Ordering::Relaxed) + freed.max(1);
        let threshold = i.limit.map_or(RECLAIM_AFTER, |l| RECLAIM_AFTER.min(l / 32));
        if total < threshold {
            return Ok(());
        }
        i.freed_hint.store(0, Ordering::Relaxed);
        i.reclaim_wanted.store(true, Ordering::Relaxed);
        if let Some(sig) = &i.ckpt_signal {
            // A first ask after a quiet spell waits out the grace; asks while a grace or a
            // pacing pause is pending do not push it further (no starvation under a stream of
            // deletes).
            let now = std::time::Instant::now();
            let mut at = i.reclaim_paced_until.lock();
            if at.is_none_or(|t| t <= now) {
                *at = Some(now + RECLAIM_GRACE);
            }
            drop(at);
            sig.wake();
            return Ok(());
        }
        let Some(_one) = i.ckpt_lock.try_lock() else {
            return Ok(());
        };
        self.reclaim_pass(BACKGROUND_ROUNDS)
    }

    /// Whether a fixed-size image has less than a quarter of its capacity left: room then
    /// matters more than what reclamation costs (B13: neither graced, paced nor deferred).
    fn room_is_short(&self) -> bool {
        self.inner
            .limit
            .is_some_and(|limit| self.room(true) < limit / 4)
    }

    /// Until when the next background reclamation pass must wait (B13's grace and pacing), or
    /// `None` when it may run now: the wait has passed, or room is short.
    pub(crate) fn reclaim_paced_until(&self) -> Option<std::time::Instant> {
        let at = (*self.inner.reclaim_paced_until.lock())?;
        if at <= std::time::Instant::now() || self.room_is_short() {
            return None;
        }
        Some(at)
    }

    /// The checkpoint thread's reclamation pass (B13), which then paces the next one. Where
    /// room is short, rounds each followed by a checkpoint and a closing pair, as at close;
    /// elsewhere one round of steps, whose release waits for the writers' checkpoints (or
    /// [`Env::release_freed`]'s, [`RELEASE_WAIT`] later). The caller holds `ckpt_lock`.
    pub(crate) fn background_reclaim_pass(&self) -> Result<()> {
        let start = std::time::Instant::now();
        self.inner.counters.reclaim_pass();
        if self.room_is_short() {
            self.reclaim_pass(BACKGROUND_ROUNDS)?;
        } else if self.inner.reclaim_wanted.swap(false, Ordering::Relaxed) {
            if let Some(budget) = self.reclaim_budget() {
                self.reclaim(budget)?;
            }
            // Two checkpoints after this one release what the steps and the deletes that
            // asked for them freed; the earliest due time stands (asks while one waits do
            // not postpone it).
            let after = self.inner.bf.lock().generation();
            let mut due = self.inner.release_due.lock();
            let at = due.map_or(start + RELEASE_WAIT, |(at, _)| at);
            *due = Some((at, after));
        }
        let end = std::time::Instant::now();
        *self.inner.reclaim_paced_until.lock() = Some(end + (end - start) * RECLAIM_PACE);
        Ok(())
    }

    /// Runs the checkpoints a background pass's steps still wait for once their due time has
    /// come (B13). Returns when to look again if they are not due yet. The caller holds
    /// `ckpt_lock`.
    pub(crate) fn release_freed(&self) -> Result<Option<std::time::Instant>> {
        let Some((at, after)) = *self.inner.release_due.lock() else {
            return Ok(None);
        };
        let done = || self.inner.bf.lock().generation() >= after + 2;
        if !done() && at > std::time::Instant::now() {
            return Ok(Some(at));
        }
        while !done() {
            self.checkpoint_fuzzy()?;
        }
        let mut due = self.inner.release_due.lock();
        if due.is_some_and(|(_, a)| a == after) {
            *due = None;
        }
        Ok(None)
    }

    /// A background reclamation pass (B13): push every buffered delete down, in rounds that
    /// each end with a checkpoint pair, so the rows' old blocks are released. The caller holds
    /// `ckpt_lock`.
    pub(crate) fn reclaim_pass(&self, rounds: usize) -> Result<()> {
        if !self.inner.reclaim_wanted.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        for _ in 0..rounds {
            let Some(budget) = self.reclaim_budget() else {
                break;
            };
            if !self.reclaim(budget)? {
                break;
            }
            self.checkpoint_fuzzy()?;
        }
        // The pair's second checkpoint releases what the last round's steps replaced.
        self.checkpoint_fuzzy()?;
        self.checkpoint_fuzzy()
    }
}

/// Pushes down the deletes written since the last reclamation pass, so that a closed image
/// keeps no rows its deletes removed (B13: F8-style "deleted but still allocated").
pub(crate) fn reclaim_before_close(inner: &Arc<Inner>) -> Result<()> {
    if inner.closed.load(Ordering::SeqCst) || inner.poisoned.lock().is_some() {
        return Ok(());
    }
    if inner.freed_hint.load(Ordering::Relaxed) > 0 {
        inner.reclaim_wanted.store(true, Ordering::Relaxed);
    }
    let env = Env {
        inner: inner.clone(),
        _user: None,
    };
    let _one = inner.ckpt_lock.lock();
    if inner.closed.load(Ordering::SeqCst) {
        return Ok(());
    }
    env.reclaim_pass(ROOM_ROUNDS)
}
