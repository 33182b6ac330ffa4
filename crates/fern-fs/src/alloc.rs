//! The inode-id allocator. It owns the persistent high-water mark (`meta/next_id`) and this
//! mount's in-memory reservation. A mount reserves ids in batches with one small transaction,
//! so creates never touch a shared counter key (TiFS's hot key); ids reserved and not used
//! before a crash are skipped, never reused. It must never hand out an id twice.

use fern_kv::{transact, KeyRange, KvStore, RetryPolicy, WriteOptions};
use parking_lot::Mutex;

use crate::error::{FsError, FsResult};
use crate::ids::InodeId;
use crate::schema::{id_prefix_range, Trees, ALLOC_KEY};

/// Ids reserved per trip to the store.
pub const ID_BATCH: u64 = 1024;

/// This mount's reserved id range `[next, end)`.
pub struct IdAllocator {
    range: Mutex<(u64, u64)>,
}

impl IdAllocator {
    /// An allocator with nothing reserved yet.
    pub fn new() -> Self {
        Self {
            range: Mutex::new((0, 0)),
        }
    }

    /// A fresh id, reserving a new batch when this mount's range is used up.
    pub fn alloc(
        &self,
        kv: &dyn KvStore,
        trees: &Trees,
        policy: &RetryPolicy,
    ) -> FsResult<InodeId> {
        let mut range = self.range.lock();
        if range.0 >= range.1 {
            // Holding the mutex across the reservation keeps one reservation in flight per
            // mount; a second mount would conflict on the key and retry, never overlap.
            let start = transact(kv, policy, WriteOptions::NO_SYNC, |txn| {
                let start = match txn.get(trees.meta, ALLOC_KEY)? {
                    Some(v) => decode_u64(&v)?,
                    None => return Err(FsError::corrupt("allocator: next_id missing")),
                };
                let end = start.checked_add(ID_BATCH).ok_or(FsError::NoSpace)?;
                txn.batch()
                    .put(trees.meta, ALLOC_KEY.to_vec(), end.to_be_bytes().to_vec());
                Ok(start)
            })?;
            *range = (start, start + ID_BATCH);
        }
        let id = InodeId(range.0);
        range.0 += 1;
        drop(range);
        // Nobody ever wrote a key under a fresh id: a store that caches may know its rows
        // absent without asking (design.md §7.3 "Hints": existence checks in a new directory
        // cost no round trip). Not `fs.open`: registrations are put past any cache.
        let (lo, hi) = id_prefix_range(id);
        let fresh = KeyRange::half_open(&lo, &hi);
        for tree in [
            trees.dentry,
            trees.inode,
            trees.data,
            trees.xattr,
            trees.dirparent,
            trees.orphan,
        ] {
            kv.assume_absent(tree, &fresh);
        }
        Ok(id)
    }

    /// Ids of this mount's reservation not handed out yet, for statfs.
    pub fn unused(&self) -> u64 {
        let range = self.range.lock();
        range.1.saturating_sub(range.0)
    }

    /// The persistent high-water mark (ids ever reserved), for statfs.
    pub fn high_water(kv: &dyn KvStore, trees: &Trees) -> FsResult<u64> {
        match kv.get(trees.meta, ALLOC_KEY)? {
            Some(v) => decode_u64(&v),
            None => Err(FsError::corrupt("allocator: next_id missing")),
        }
    }
}

impl Default for IdAllocator {
    fn default() -> Self {
        Self::new()
    }
}

fn decode_u64(v: &[u8]) -> FsResult<u64> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_be_bytes)
        .map_err(|_| FsError::corrupt("allocator: next_id is not 8 bytes"))
}
