//! Held-mode reads and commits (docs/design.md §7.3, W2): the store as the holder of the
//! delegation sees it — the overlay over the fenced store — and the local commit that
//! validates, resolves and buffers a batch. It is an [`OccBackend`], so held-mode transactions
//! are the embedded backends' [`crate::occ::OccTxn`]. It must never change modes (the
//! `WriteBack` does) and never send a write to the store (flushes are the `WriteBack`'s).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::batch::WriteBatch;
use crate::error::{KvError, KvResult};
use crate::guard::KeyGuard;
use crate::occ::{covered, ConflictTracker, OccBackend};
use crate::store::{KvRead, KvStore};
use crate::types::{Direction, KeyRange, TreeId, UpdateRegistry, WriteOptions};

use super::overlay::{beyond, Overlay};

/// The store, the overlay and the local conflict tracker of one `WriteBack`.
pub(crate) struct Core {
    pub(crate) store: Arc<dyn KvStore>,
    pub(crate) registry: UpdateRegistry,
    pub(crate) overlay: Mutex<Overlay>,
    pub(crate) tracker: ConflictTracker,
    /// `fence(grant)` while held; `None` otherwise (held-mode calls then fail).
    pub(crate) fence: Mutex<Option<KeyGuard>>,
}

impl Core {
    fn fence(&self) -> KvResult<KeyGuard> {
        self.fence
            .lock()
            .clone()
            .ok_or_else(|| KvError::Unavailable("write-back: the delegation is not held".into()))
    }
}

impl Core {
    /// [`KvStore::get_many`] as the holder sees the store: the overlay's answers, the misses
    /// read fenced in few round trips and filled in.
    pub(crate) fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> KvResult<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Option<Vec<u8>>>> = {
            let ov = self.overlay.lock();
            keys.iter().map(|(t, k)| ov.known(*t, k)).collect()
        };
        let misses: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        if !misses.is_empty() {
            let want: Vec<(TreeId, Vec<u8>)> = misses.iter().map(|&i| keys[i].clone()).collect();
            let read = self.store.get_many_guarded(&[self.fence()?], &want)?;
            let mut ov = self.overlay.lock();
            for (&i, v) in misses.iter().zip(read) {
                let (t, k) = &keys[i];
                ov.fill(*t, k, v.as_deref());
                // A local commit may have written the key since the store was read: its
                // value wins.
                out[i] = Some(ov.known(*t, k).unwrap_or(v));
            }
            ov.trim(super::CACHE_BYTES);
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }
}

impl KvRead for Core {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        if let Some(v) = self.overlay.lock().known(tree, key) {
            return Ok(v);
        }
        let v = self.store.get_guarded(&[self.fence()?], tree, key)?;
        let mut ov = self.overlay.lock();
        ov.fill(tree, key, v.as_deref());
        // A local commit may have written the key since the store was read: its value wins.
        let v = ov.known(tree, key).unwrap_or(v);
        ov.trim(super::CACHE_BYTES);
        Ok(v)
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit == 0 || range.is_empty() {
            return Ok(out);
        }
        let fence = self.fence()?;
        let mut cursor = range.clone();
        loop {
            let page =
                self.store
                    .scan_guarded(std::slice::from_ref(&fence), tree, &cursor, dir, limit)?;
            let full = page.len() == limit;
            let last = page.last().map(|(k, _)| k.clone());
            let region = covered(&cursor, dir, limit, &page);
            let merged = {
                let mut ov = self.overlay.lock();
                let merged = ov.merge_page(tree, &region, dir, page);
                ov.trim(super::CACHE_BYTES);
                merged
            };
            out.extend(merged);
            if out.len() >= limit {
                out.truncate(limit);
                return Ok(out);
            }
            match last {
                Some(last) if full => cursor = beyond(&cursor, dir, &last),
                _ => return Ok(out),
            }
        }
    }

    fn read_extent(&self, r: &crate::ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.store.read_extent(r, buf)
    }
}

impl OccBackend for Core {
    fn tracker(&self) -> &ConflictTracker {
        &self.tracker
    }

    /// Resolves and buffers `batch`; never durable here (the `WriteBack` flushes after a
    /// commit with `sync`).
    fn apply_validated(
        &self,
        batch: &WriteBatch,
        _opts: WriteOptions,
        validate: &dyn Fn() -> KvResult<()>,
    ) -> KvResult<()> {
        if batch.has_extents() {
            return Err(KvError::Unsupported {
                what: "data extents",
            });
        }
        // Old values of upserts come from the store first (no lock held across the read);
        // nothing drops overlay entries while a held-mode call runs, so they stay known.
        let unknown = self.overlay.lock().unknown_upsert_keys(batch);
        for (tree, key) in unknown {
            self.get(tree, &key)?;
        }
        let mut ov = self.overlay.lock();
        validate()?;
        let resolved = ov.resolve(batch, &self.registry)?;
        resolved.check(&self.store.limits())?;
        self.tracker.record(batch);
        ov.commit(resolved);
        Ok(())
    }
}
