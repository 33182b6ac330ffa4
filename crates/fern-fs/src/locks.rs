//! Striped per-inode locks. They serialize, within this mount, everything that reads or moves
//! an inode's stat location against blind stat upserts to that location (a write's size update
//! must not land on an entry that a rename just moved away). It owns only mutexes; it must
//! never be held across anything but a short store commit, and multiple stripes are always
//! taken in ascending stripe order, so two operations never deadlock.
//!
//! Every release of a lock set also bumps a counter ([`Stripes::releases`]): a reader that
//! fills a cache without holding an inode's lock (a lookup seeding the stat mirror) compares
//! it before and after to learn that no lock holder finished meanwhile (cache.rs).
//!
//! Each stripe also counts the releases of sets that held it to change something
//! ([`Stripes::changes`]; a set taken with [`Stripes::lock_reading`] changes nothing and is
//! not counted there). The count is bumped while the stripe is still held, so a reader that
//! holds the stripe and finds the count it saw before reading knows that no change under that
//! stripe finished since (lookahead.rs: one busy file does not spoil another's rows, as the
//! global count would).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::ids::InodeId;

const STRIPES: usize = 256;

/// Lock sets of up to this many ids (every operation's but a caller's unusual one: rename
/// takes 4, link 3, the rest 1 or 2) are sorted and held without a heap allocation; every
/// FUSE request that touches an inode takes one (docs/fs-design.md §8, "per-request
/// allocations").
const INLINE: usize = 4;

/// A fixed array of mutexes indexed by a hash of the inode id.
pub struct Stripes {
    locks: Vec<Mutex<()>>,
    released: AtomicU64,
    /// Per stripe: releases of sets that held it to change something.
    changed: Vec<AtomicU64>,
}

/// Guards held for one operation; dropping releases them.
pub struct Held<'a> {
    /// The guards of a set of at most [`INLINE`] stripes, with their stripe numbers.
    inline: [Option<(usize, MutexGuard<'a, ()>)>; INLINE],
    /// The guards of a larger set (empty, unallocated, otherwise).
    more: Vec<(usize, MutexGuard<'a, ()>)>,
    stripes: &'a Stripes,
    /// Taken by [`Stripes::lock_reading`]: its release is no change.
    reading: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.reading {
            // Counted while still held: whoever takes a stripe next sees its count moved.
            for (i, _) in self.inline.iter().flatten().chain(self.more.iter()) {
                self.stripes.changed[*i].fetch_add(1, Ordering::AcqRel);
            }
        }
        // Unlock first, then count: a reader that sees the count unchanged and then gets the
        // lock knows no holder finished (or committed anything) since it looked.
        self.inline.iter_mut().for_each(|g| drop(g.take()));
        self.more.clear();
        self.stripes.released.fetch_add(1, Ordering::AcqRel);
    }
}

impl Stripes {
    /// 256 unlocked stripes.
    pub fn new() -> Self {
        Self {
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            released: AtomicU64::new(0),
            changed: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn stripe(id: InodeId) -> usize {
        // Fibonacci hashing spreads consecutive ids (one allocation batch) over stripes.
        (id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % STRIPES
    }

    /// Locks the stripes of all `ids` in ascending stripe order.
    pub fn lock(&self, ids: &[InodeId]) -> Held<'_> {
        self.lock_set(ids, false)
    }

    /// [`Stripes::lock`] for an operation that changes nothing in the store (a lookup): its
    /// release does not move the stripes' [`Stripes::changes`].
    pub fn lock_reading(&self, ids: &[InodeId]) -> Held<'_> {
        self.lock_set(ids, true)
    }

    fn lock_set(&self, ids: &[InodeId], reading: bool) -> Held<'_> {
        let mut held = Held {
            inline: [None, None, None, None],
            more: Vec::new(),
            stripes: self,
            reading,
        };
        if ids.len() > INLINE {
            let mut idx: Vec<usize> = ids.iter().map(|id| Self::stripe(*id)).collect();
            idx.sort_unstable();
            idx.dedup();
            held.more = idx.into_iter().map(|i| (i, self.locks[i].lock())).collect();
            return held;
        }
        let mut idx = [0usize; INLINE];
        for (slot, id) in idx.iter_mut().zip(ids) {
            *slot = Self::stripe(*id);
        }
        let idx = &mut idx[..ids.len()];
        idx.sort_unstable();
        let mut last = None;
        for (slot, &i) in held.inline.iter_mut().zip(idx.iter()) {
            if last != Some(i) {
                *slot = Some((i, self.locks[i].lock()));
                last = Some(i);
            }
        }
        held
    }

    /// How many lock sets have been released so far.
    pub fn releases(&self) -> u64 {
        self.released.load(Ordering::Acquire)
    }

    /// How many sets that held `id`'s stripe to change something have been released so far.
    /// Exact while the caller holds that stripe; otherwise a lower bound of what a later
    /// holder will see.
    pub fn changes(&self, id: InodeId) -> u64 {
        self.changed[Self::stripe(id)].load(Ordering::Acquire)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An id of `a`'s stripe, and `n` ids of other stripes.
    fn twin_and_others(a: InodeId, n: usize) -> (InodeId, Vec<InodeId>) {
        let twin = (a.0 + 1..)
            .map(InodeId)
            .find(|i| Stripes::stripe(*i) == Stripes::stripe(a))
            .unwrap();
        let others = (100..)
            .map(InodeId)
            .filter(|i| Stripes::stripe(*i) != Stripes::stripe(a))
            .take(n)
            .collect();
        (twin, others)
    }

    fn held_stripes(s: &Stripes) -> Vec<usize> {
        (0..STRIPES).filter(|&i| s.locks[i].is_locked()).collect()
    }

    /// Two ids of one stripe, and an id given twice, lock that stripe once (a second lock of
    /// it would deadlock); sets of every size, inline or not, hold exactly their stripes until
    /// dropped, and each release is counted once.
    #[test]
    fn lock_sets_hold_each_stripe_once_until_dropped() {
        let s = Stripes::new();
        let a = InodeId(7);
        let (twin, others) = twin_and_others(a, 6);
        let sets: Vec<Vec<InodeId>> = vec![
            vec![a],
            vec![a, a],
            vec![twin, a],
            vec![others[0], a, twin, others[0]],
            vec![
                others[3], others[2], a, others[1], twin, others[0], others[1],
            ],
        ];
        for (n, set) in sets.iter().enumerate() {
            let mut want: Vec<usize> = set.iter().map(|i| Stripes::stripe(*i)).collect();
            want.sort_unstable();
            want.dedup();
            let g = s.lock(set);
            assert_eq!(held_stripes(&s), want, "set {set:?}");
            drop(g);
            assert!(held_stripes(&s).is_empty());
            assert_eq!(s.releases(), n as u64 + 1);
        }
    }

    /// A changing set moves the change count of each stripe it held, once, and only those; a
    /// reading set moves none (but is a release like any other).
    #[test]
    fn only_changing_sets_count_as_changes_of_their_stripes() {
        let s = Stripes::new();
        let a = InodeId(7);
        let (twin, others) = twin_and_others(a, 5);
        drop(s.lock_reading(&[a, others[0]]));
        assert_eq!((s.changes(a), s.changes(others[0])), (0, 0));
        assert_eq!(s.releases(), 1);
        drop(s.lock(&[a, twin]));
        assert_eq!((s.changes(a), s.changes(twin)), (1, 1), "one stripe, once");
        assert_eq!(s.changes(others[0]), 0);
        drop(s.lock(&others)); // a heap set
        assert!(others.iter().all(|o| s.changes(*o) >= 1));
        assert_eq!(s.changes(a), 1);
        assert_eq!(s.releases(), 3);
    }

    /// Sets taken in opposite orders by two threads never deadlock (ascending stripe order).
    #[test]
    fn overlapping_sets_in_any_order_do_not_deadlock() {
        let s = std::sync::Arc::new(Stripes::new());
        let ids: Vec<InodeId> = (1..=5).map(InodeId).collect();
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let s = s.clone();
                let mut ids = ids.clone();
                if t == 1 {
                    ids.reverse();
                }
                std::thread::spawn(move || {
                    for k in 0..2000 {
                        let n = 2 + k % 4; // 2..=5 ids: inline and heap sets
                        let _g = s.lock(&ids[..n]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.releases(), 4000);
    }
}
