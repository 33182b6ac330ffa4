//! Striped per-inode locks. They serialize, within this mount, everything that reads or moves
//! an inode's stat location against blind stat upserts to that location (a write's size update
//! must not land on an entry that a rename just moved away). It owns only mutexes; it must
//! never be held across anything but a short store commit, and multiple stripes are always
//! taken in ascending stripe order, so two operations never deadlock.

use parking_lot::{Mutex, MutexGuard};

use crate::ids::InodeId;

const STRIPES: usize = 256;

/// A fixed array of mutexes indexed by a hash of the inode id.
pub struct Stripes {
    locks: Vec<Mutex<()>>,
}

/// Guards held for one operation; dropping releases them.
pub struct Held<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl Stripes {
    /// 256 unlocked stripes.
    pub fn new() -> Self {
        Self {
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
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
            _guards: idx.into_iter().map(|i| self.locks[i].lock()).collect(),
        }
    }
}

impl Default for Stripes {
    fn default() -> Self {
        Self::new()
    }
}
