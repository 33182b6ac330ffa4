//! Checkpoints (format.md "Checkpoint (non-stalling, W8)"): the snapshot under the write lock,
//! the node writes and the commit without it, the adoption of what was written, the return of
//! log space no durable checkpoint needs (W9), and the background thread that runs them when
//! the log asks (and the `Wakeup` it and writeback.rs's thread wait on). Never: decides what a batch may write (admission.rs) or replays the log.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::blockfile::ALIGN;
use crate::catalog::{encode_meta, State};
use crate::env::{Env, Inner, LOG_RELEASE_STEP};
use crate::error::{Error, Result};
use crate::stats::WriteCause;

impl Inner {
    /// The sharp checkpoint: everything under the write lock the caller holds (`st`).
    pub(crate) fn checkpoint_locked(&self, st: &State) -> Result<()> {
        let ctx = self.ctx();
        let lsn = self.wal.end();
        self.extent_bytes.store(0, Ordering::Relaxed); // X10: counted from this snapshot
        let result = (|| {
            // The checkpoint's syncs must cover the log records before it (W5: recovery from
            // the older checkpoint replays them).
            self.wal.flush()?;
            for n in ctx.cache.dirty() {
                ctx.write_node(&n, WriteCause::Checkpoint)?;
                n.set_dirty(false);
            }
            let meta = encode_meta(st, &self.shape);
            self.bf.lock().checkpoint(lsn, &meta)
        })();
        match &result {
            // The checkpoint's syncs covered every log record written before it.
            Ok(()) => {
                self.wal.mark_durable(lsn);
                self.wal.set_oldest(self.bf.lock().oldest_checkpoint_lsn());
            }
            Err(e) => self.set_poison(e.to_string()),
        }
        result?;
        // The write lock is held: no append can race the punches (W9).
        loop {
            match self.release_log_step(st) {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) => {
                    self.set_poison(e.to_string());
                    return Err(e);
                }
            }
        }
    }

    /// Returns the next piece (at most `LOG_RELEASE_STEP` bytes) of log space that no durable
    /// checkpoint needs any more to the host, and says whether more remains (W9).
    ///
    /// Records below the older checkpoint's LSN are never read again: recovery starts at the
    /// newest checkpoint's LSN, or at the older one's if the newest header is damaged (W5).
    /// Without this, every byte ever logged stays allocated in the sparse region until the
    /// region wraps (F8: 64 MiB of logged file data kept beside the tree after an unmount).
    ///
    /// The caller holds the environment's lock (read or write), so no record is appended
    /// meanwhile. A record at LSN `x` shares its bytes with LSN `x - capacity`; records up to
    /// `end` exist, so nothing below `end - capacity` is punched, and appends after the lock
    /// is released land at or past `end`, outside what was punched. Punches are not synced: a
    /// crash leaves the old bytes or zeros, and recovery reads neither (both lie below the
    /// checkpoint's LSN).
    pub(crate) fn release_log_step(&self, st: &State) -> Result<bool> {
        let (oldest, region) = {
            let bf = self.bf.lock();
            match bf.loc(st.log_id) {
                Some(r) => (bf.oldest_checkpoint_lsn().0, r),
                None => return Ok(false),
            }
        };
        let cap = u64::from(region.len);
        // Sync marks are appended without the environment's lock (W10); the log's tail lock
        // keeps them out while this step computes its range from `end` and punches it.
        self.wal.with_appends_excluded(|end| {
            let end = end.0;
            let mut released = self.log_released.lock();
            let lo = (*released)
                .max(end.saturating_sub(cap))
                .next_multiple_of(ALIGN);
            // The page holding `oldest` keeps live records after it, unless there are none
            // (both checkpoints at the log's end): then its bytes past `end` belong to no
            // record yet.
            let target = if oldest >= end {
                end.next_multiple_of(ALIGN)
            } else {
                oldest / ALIGN * ALIGN
            };
            let hi = target.min(lo.saturating_add(LOG_RELEASE_STEP));
            if lo >= hi {
                return Ok(false);
            }
            let mut at = lo;
            while at < hi {
                // The region is ALIGN-aligned and a multiple of ALIGN long, so an aligned LSN
                // maps to an aligned offset; a piece stops at the region's end (the log wraps
                // there).
                let pos = at % cap;
                let n = (hi - at).min(cap - pos);
                self.dev
                    .punch_hole(region.offset + pos, n)
                    .map_err(|e| Error::io(format!("returning log space below LSN {hi}"), e))?;
                at += n;
            }
            *released = hi;
            Ok(hi < target)
        })
    }
}

impl Env {
    /// Starts a checkpoint because the log passed its threshold: wakes the checkpoint thread,
    /// or (without one) runs it here unless one is already running.
    pub(crate) fn request_checkpoint(&self) -> Result<()> {
        if let Some(sig) = &self.inner.ckpt_signal {
            sig.wake();
            return Ok(());
        }
        let Some(_one) = self.inner.ckpt_lock.try_lock() else {
            return Ok(());
        };
        if self.wants_checkpoint() {
            self.checkpoint_fuzzy()?;
        }
        Ok(())
    }

    /// Commits a checkpoint of everything written before the call, at the log's end; log space
    /// before the older checkpoint becomes reusable. Writers keep writing while the nodes are
    /// encoded and written (see `checkpoint_fuzzy`). When it returns Ok, everything written
    /// before the call survives a crash.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let _one = self.inner.ckpt_lock.lock();
        self.checkpoint_fuzzy()
    }

    /// The old "sharp" checkpoint, which holds the write lock while it writes every dirty node.
    /// Kept for comparison benchmarks (docs/BENCHMARKS.md); [`Env::checkpoint`] is what to use.
    #[doc(hidden)]
    pub fn checkpoint_sharp(&self) -> Result<()> {
        self.check_writable()?;
        let _one = self.inner.ckpt_lock.lock();
        let st = self.inner.state.write();
        self.checkpoint_locked(&st)
    }

    /// A checkpoint that stops writers only twice, briefly (invariant W8):
    /// 1. under the write lock: note the log's end (the checkpoint LSN), encode the catalog,
    ///    take `Arc`s of every dirty cached node (a writer that changes one later gets a copy:
    ///    `Cache::take` copies a node someone else holds) and begin an in-progress BTT (B10);
    /// 2. without it: encode and write each snapshot node to a fresh extent of the in-progress
    ///    BTT, then commit (B3);
    /// 3. under the write lock: nodes the cache still holds in the snapshot's version are clean
    ///    now and the current BTT adopts their new blocks; changed ones stay dirty.
    ///
    /// The caller holds `ckpt_lock`.
    pub(crate) fn checkpoint_fuzzy(&self) -> Result<()> {
        let i = &self.inner;
        let (lsn, meta, snapshot) = {
            let st = i.state.write();
            let lsn = i.wal.end();
            i.extent_bytes.store(0, Ordering::Relaxed); // X10: counted from this snapshot
                                                        // The checkpoint's syncs must cover the log records before it (W5: recovery from
                                                        // the older checkpoint replays them).
            self.poison(i.wal.flush())?;
            let meta = encode_meta(&st, &i.shape);
            let snapshot = i.cache.dirty();
            let r = i.bf.lock().begin_checkpoint();
            self.poison(r)?;
            (lsn, meta, snapshot)
        };
        // Each node is let go once written (kept only as a weak reference, for the adoption
        // below): a writer that takes it meanwhile copies it, and until dropped here the old
        // version stays in memory, charged as an orphan.
        let mut written_nodes = Vec::with_capacity(snapshot.len());
        let written = (|| {
            let mut locs = Vec::with_capacity(snapshot.len());
            for n in snapshot {
                let bytes = i.cache.encode(&n, i.shape.compression);
                i.counters.node_written(WriteCause::Checkpoint, bytes.len());
                let len = u32::try_from(bytes.len()).map_err(|_| {
                    Error::InvalidArgument(format!("node {} block over 4 GiB", n.id))
                })?;
                let loc = i.bf.lock().reserve_for_checkpoint(n.id, len)?;
                i.dev
                    .write_at(&bytes, loc.offset)
                    .map_err(|e| Error::io(format!("writing node {} for a checkpoint", n.id), e))?;
                locs.push(loc);
                written_nodes.push((n.id, Arc::downgrade(&n)));
            }
            i.bf.lock().commit_checkpoint(lsn, &meta)?;
            Ok(locs)
        })();
        let locs = self.poison(written)?;
        // The checkpoint's syncs covered every log record written before the snapshot.
        i.wal.mark_durable(lsn);
        i.wal.set_oldest(i.bf.lock().oldest_checkpoint_lsn());
        {
            let _st = i.state.write();
            let mut bf = i.bf.lock();
            for ((id, version), loc) in written_nodes.iter().zip(locs) {
                match i.cache.current_version(*id, version) {
                    Some(n) => {
                        bf.adopt(*id, loc);
                        n.set_dirty(false);
                    }
                    None => bf.not_adopted(*id, loc),
                }
            }
        }
        // Log space is returned piece by piece under the read lock: appends wait for one
        // piece at a time (W8, W9), readers not at all. A failed punch is a failed device
        // write: it poisons (E2), though the committed checkpoint stands.
        loop {
            let st = i.state.read();
            if !self.poison(i.release_log_step(&st))? {
                return Ok(());
            }
        }
    }

    /// The sharp checkpoint: everything under the write lock.
    pub(crate) fn checkpoint_locked(&self, st: &State) -> Result<()> {
        self.inner.checkpoint_locked(st)
    }
}

/// Wakes a background thread (the checkpoint thread, writeback.rs's thread) when there is work,
/// now or at a deadline.
#[derive(Default)]
pub(crate) struct Wakeup {
    want: Mutex<Want>,
    cv: Condvar,
}

#[derive(Default)]
struct Want {
    /// A round is asked for now.
    now: bool,
    /// A round is asked for at this instant (work deferred by the thread itself: B13's pacing).
    at: Option<Instant>,
}

/// Longest a background thread sleeps without a request: it then notices that its
/// environment was dropped.
const IDLE_WAIT: Duration = Duration::from_millis(200);

impl Wakeup {
    /// Asks for a round of work (cheap when one is already asked for).
    pub(crate) fn wake(&self) {
        let mut want = self.want.lock();
        if !want.now {
            want.now = true;
            self.cv.notify_one();
        }
    }

    /// Asks for a round of work at `at` (the earliest of several such requests wins).
    pub(crate) fn wake_at(&self, at: Instant) {
        let mut want = self.want.lock();
        if want.at.is_none_or(|a| at < a) {
            want.at = Some(at);
            self.cv.notify_one();
        }
    }

    /// Wakes the thread without asking for work (it then notices a close).
    pub(crate) fn nudge(&self) {
        self.cv.notify_one();
    }

    /// Waits for a request, at most until the deadline asked for by `wake_at` or for
    /// `IDLE_WAIT`; takes it and says whether there was one.
    pub(crate) fn wait(&self) -> bool {
        let mut want = self.want.lock();
        if !want.now {
            let timeout = want.at.map_or(IDLE_WAIT, |at| {
                at.saturating_duration_since(Instant::now()).min(IDLE_WAIT)
            });
            self.cv.wait_for(&mut want, timeout);
        }
        if want.at.is_some_and(|at| at <= Instant::now()) {
            want.at = None;
            want.now = true;
        }
        std::mem::take(&mut want.now)
    }
}

/// Runs `round` on its own thread each time the thread is woken with work, until the
/// environment is dropped, closed or poisoned, or `round` says stop (`false`). One loop for the
/// checkpoint thread and writeback.rs's thread, so both notice a drop and a close the same way.
pub(crate) fn spawn_worker(
    name: &str,
    inner: Weak<Inner>,
    sig: Arc<Wakeup>,
    mut round: impl FnMut(Arc<Inner>) -> bool + Send + 'static,
) {
    let _ = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            if !sig.wait() {
                if inner.strong_count() == 0 {
                    return;
                }
                continue;
            }
            let Some(inner) = inner.upgrade() else { return };
            if inner.closed.load(Ordering::Relaxed) || inner.poisoned.lock().is_some() {
                return;
            }
            if !round(inner) {
                return;
            }
        });
}

/// [`spawn_worker`] for a round that either succeeds or fails for good: a failure poisons the
/// environment (E2) and ends the thread.
pub(crate) fn spawn_poisoning_worker(
    name: &str,
    inner: Weak<Inner>,
    sig: Arc<Wakeup>,
    round: fn(&Inner) -> Result<()>,
) {
    spawn_worker(name, inner, sig, move |inner| match round(&inner) {
        Ok(()) => true,
        Err(e) => {
            inner.set_poison(e.to_string());
            false
        }
    });
}

/// Runs the checkpoints writers ask for until the environment is dropped, closed or poisoned.
pub(crate) fn spawn_checkpointer(inner: Weak<Inner>, sig: Arc<Wakeup>) {
    let own = sig.clone();
    spawn_worker("fern-checkpoint", inner, sig, move |inner| {
        let env = Env { inner, _user: None };
        let Some(_one) = env.inner.ckpt_lock.try_lock() else {
            return true; // a checkpoint is running; it covers this request
        };
        if env.inner.closed.load(Ordering::SeqCst) {
            return false; // closed while this thread waited for the lock
        }
        if env.wants_checkpoint() && env.checkpoint_fuzzy().is_err() {
            return false; // poisoned
        }
        if env.inner.reclaim_wanted.load(Ordering::Relaxed) {
            match env.reclaim_paced_until() {
                Some(at) => own.wake_at(at), // B13's pacing: later, and once, for all asks
                None if env.background_reclaim_pass().is_err() => return false, // poisoned
                None => {}
            }
        }
        match env.release_freed() {
            Ok(Some(at)) => own.wake_at(at), // B13: the writers' checkpoints may do it first
            Ok(None) => {}
            Err(_) => return false, // poisoned
        }
        true
    });
}
