//! Striped per-inode locks. They serialize, within this mount, everything that reads or moves
//! an inode's stat location against blind stat upserts to that location (a write's size update
//! must not land on an entry that a rename just moved away). It owns only mutexes; it must
//! never be held across anything but a short store commit, and multiple stripes are always
//! taken in ascending stripe order, so two operations never deadlock.
//!
//! Every release of a lock set also bumps a counter ([`Stripes::releases`]): a reader that
//! fills a cache without holding an inode's lock (a lookup seeding the stat mirror) compares
//! it before and after to learn that no lock holder finished meanwhile (cache.rs).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::ids::InodeId;

const STRIPES: usize = 256;

/// A fixed array of mutexes indexed by a hash of the inode id.
pub struct Stripes {
    locks: Vec<Mutex<()>>,
    released: AtomicU64,
}

/// Guards held for one operation; dropping releases them.
pub struct Held<'a> {
    guards: Vec<MutexGuard<'a, ()>>,
    released: &'a AtomicU64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Unlock first, then count: a reader that sees the count unchanged and then gets the
        // lock knows no holder finished (or committed anything) since it looked.
        self.guards.clear();
        self.released.fetch_add(1, Ordering::AcqRel);
    }
}

impl Stripes {
    /// 256 unlocked stripes.
    pub fn new() -> Self {
        Self {
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            released: AtomicU64::new(0),
        }
    }

    fn stripe(id: InodeId) -> usize {
        // Fibonacci hashing spreads consecutive ids (one allocation batch) over stripes.
        (id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % STRIPES
    }

    /// Locks the stripes of all `ids` in ascending stripe order.
    pub fn lock(&self, ids: &[InodeId]) -> Held<'_> {
        let mut idx: Vec<usize> = ids.iter().map(|id| Self::stripe(*id)).collect();
        idx.sort_unstable();
        idx.dedup();
        Held {
            guards: idx.into_iter().map(|i| self.locks[i].lock()).collect(),
            released: &self.released,
        }
    }

    /// How many lock sets have been released so far.
    pub fn releases(&self) -> u64 {
        self.released.load(Ordering::Acquire)
    }

    /// Runs `f` holding `id`'s stripe if it is free now, or if `held` (an id whose stripe the
    /// caller already holds) is in the same stripe; `None` without running it otherwise. Never
    /// waits, so it may be called while holding any other stripe.
    pub fn with_free<T>(
        &self,
        id: InodeId,
        held: Option<InodeId>,
        f: impl FnOnce() -> T,
    ) -> Option<T> {
        let i = Self::stripe(id);
        if held.is_some_and(|h| Self::stripe(h) == i) {
            return Some(f());
        }
        let g = self.locks[i].try_lock()?;
        let out = f();
        drop(g);
        Some(out)
    }
}

impl Default for Stripes {
    fn default() -> Self {
        Self::new()
    }
}
