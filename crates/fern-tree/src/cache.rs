//! The node cache: one per environment, shared by all its trees, with a hard memory bound.
//!
//! Owns which nodes are in memory and how much memory they use (every loaded partition counts,
//! buffers included — invariant C1). Eviction picks the least recently used leaves that nobody
//! is using — first the basements of clean leaves unchanged since they were read, which keep
//! their headers (invariant C3), then whole leaves — and internal nodes only after the leaves;
//! a dirty victim is written (copy-on-write) before it is dropped, so eviction never loses
//! a change (invariant C2). In a read-only open (W11) dirty nodes cannot be written, so they are
//! never evicted: the bound then holds for clean nodes only. Never: decides tree structure, or
//! frees blocks.

use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::Result;
use crate::ids::NodeId;
use crate::node::{Node, SharedNode};

struct Slot {
    node: SharedNode,
    last_use: AtomicU64,
}

/// Counters for `stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheStats {
    /// Memory in use by cached nodes, in bytes.
    pub used_bytes: usize,
    /// The configured bound.
    pub limit_bytes: usize,
    /// Nodes in the cache.
    pub nodes: usize,
    /// Node lookups answered from memory.
    pub hits: u64,
    /// Node lookups that read the device.
    pub misses: u64,
    /// Nodes evicted.
    pub evictions: u64,
    /// Dirty nodes written by eviction.
    pub dirty_evictions: u64,
    /// Leaves that left only their partitions, keeping their headers cached (C3).
    pub partial_evictions: u64,
}

/// Most encoding buffers the cache keeps between node writes: one per thread that writes
/// nodes (a writer evicting, writeback, the checkpoint).
const SPARE_BUFFERS: usize = 3;
/// Largest encoding buffer kept.
const SPARE_BUFFER_MAX: usize = 4 << 20;

/// A node's encoding on its way to the device (`Cache::encode`), counted against the bound
/// while it lives; dropped, its buffer goes back to the cache's spares (still counted).
pub(crate) struct Encoded<'a> {
    bytes: Vec<u8>,
    cache: &'a Cache,
}

impl std::ops::Deref for Encoded<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Encoded<'_> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.bytes);
        let cap = buf.capacity();
        let mut spares = self.cache.spares.lock();
        if spares.len() < SPARE_BUFFERS && cap <= SPARE_BUFFER_MAX {
            spares.push(buf); // stays counted
        } else {
            drop(spares);
            self.cache.used.fetch_sub(cap, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Cache {
    map: Mutex<HashMap<NodeId, Slot>>,
    /// Every byte counted against the bound (C1): cached nodes, nodes a writer has taken out
    /// (`taken`), old versions someone still holds (`orphans`), and charges (`charge`).
    used: AtomicUsize,
    /// Nodes a writer took out to change, with the bytes each is charged: they are still in
    /// memory, and a flush cascade holds the root and a node per level below it at once.
    taken: Mutex<HashMap<NodeId, usize>>,
    /// Old versions of nodes a writer replaced while another holder (a checkpoint's
    /// snapshot, a reader, writeback) still had them, with their bytes: charged until the
    /// last holder drops them (swept by `sweep_orphans`).
    orphans: Mutex<Vec<(Weak<Node>, usize)>>,
    /// Encoding buffers kept between node writes (`encode`), counted in `used`.
    spares: Mutex<Vec<Vec<u8>>>,
    limit: usize,
    clock: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    dirty_evictions: AtomicU64,
    partial_evictions: AtomicU64,
    /// One evictor at a time, so a dirty node is never written twice concurrently.
    evicting: Mutex<()>,
    /// Dirty nodes are never evicted (a read-only open, W11: they cannot be written, and
    /// dropping them would lose the replayed log); only clean ones count against the bound.
    keep_dirty: bool,
}

impl Cache {
    pub(crate) fn new(limit: usize, keep_dirty: bool) -> Cache {
        Cache {
            map: Mutex::new(HashMap::new()),
            used: AtomicUsize::new(0),
            taken: Mutex::new(HashMap::new()),
            orphans: Mutex::new(Vec::new()),
            spares: Mutex::new(Vec::new()),
            limit,
            clock: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            dirty_evictions: AtomicU64::new(0),
            partial_evictions: AtomicU64::new(0),
            evicting: Mutex::new(()),
            keep_dirty,
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// A cached node, marking it used.
    pub(crate) fn get(&self, id: NodeId) -> Option<SharedNode> {
        let map = self.map.lock();
        match map.get(&id) {
            Some(s) => {
                s.last_use.store(self.tick(), Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(s.node.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Adds a node read from disk; if another thread added it first, returns that one.
    pub(crate) fn insert(&self, node: Node) -> SharedNode {
        let mut map = self.map.lock();
        if let Some(s) = map.get(&node.id) {
            return s.node.clone();
        }
        let m = node.mem_now();
        node.mem.store(m, Ordering::Relaxed);
        self.used.fetch_add(m, Ordering::Relaxed);
        let id = node.id;
        let node = Arc::new(node);
        map.insert(
            id,
            Slot {
                node: node.clone(),
                last_use: AtomicU64::new(self.tick()),
            },
        );
        node
    }

    /// Counts (or, negative, stops counting) memory that is not a cached node but competes
    /// with them: a detached flush's private copies (betree/detached.rs), so that eviction
    /// makes room for them and the bound holds while old and new versions coexist.
    pub(crate) fn charge(&self, bytes: isize) {
        if bytes >= 0 {
            self.used.fetch_add(bytes as usize, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(bytes.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Encodes `node` for a write, into a spare buffer when there is one. Every node write
    /// encodes into a node-sized buffer: freed after each write, near the memory budget the
    /// binary's allocator returned it to the kernel and faulted the next one in zeroed (E1
    /// quick with freed pages returned at once: sys time 2.1–2.6 s → 1.6–1.8 s; design.md
    /// §2.5 "One memory budget"). Kept, the spares are counted like any cached memory.
    pub(crate) fn encode(&self, node: &Node, comp: crate::codec::Compression) -> Encoded<'_> {
        let spare = self.spares.lock().pop().unwrap_or_default();
        let before = spare.capacity(); // counted while it was a spare
        let bytes = node.encode_into(comp, spare);
        self.charge(bytes.capacity() as isize - before as isize);
        Encoded { bytes, cache: self }
    }

    /// Records memory added to a cached node by a lazy partition load.
    pub(crate) fn grew(&self, node: &Node, bytes: usize) {
        if bytes > 0 {
            node.mem.fetch_add(bytes, Ordering::Relaxed);
            self.used.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Removes a node for a writer to change. The caller holds the environment's write lock, so
    /// no reader can get it from the cache any more; if nobody else holds it, it is moved out
    /// without copying. Otherwise the holder (a checkpoint writing its snapshot, a reader,
    /// writeback) keeps the old version alive: it stays charged as an orphan until dropped.
    /// The node taken stays charged (see `pin`) until it is put back or removed.
    pub(crate) fn take(&self, id: NodeId) -> Option<Node> {
        let slot = self.map.lock().remove(&id)?;
        let mem = slot.node.mem.load(Ordering::Relaxed);
        let node = match Arc::try_unwrap(slot.node) {
            Ok(node) => node,
            Err(shared) => {
                self.used.fetch_add(mem, Ordering::Relaxed);
                self.orphans.lock().push((Arc::downgrade(&shared), mem));
                (*shared).clone()
            }
        };
        // The slot's charge moves to the taken node (a node is never taken twice).
        if let Some(stale) = self.taken.lock().insert(id, mem) {
            debug_assert!(false, "node {id} taken twice");
            self.used.fetch_sub(stale, Ordering::Relaxed);
        }
        Some(node)
    }

    /// Charges a node a writer holds out of the cache at `bytes` (its memory once every
    /// partition is loaded), replacing what it was charged so far.
    pub(crate) fn pin(&self, id: NodeId, bytes: usize) {
        self.replace_taken(id, Some(bytes));
    }

    /// Sets (or, `None`, ends) the charge of a taken node.
    fn replace_taken(&self, id: NodeId, bytes: Option<usize>) {
        let mut taken = self.taken.lock();
        let old = match bytes {
            Some(b) => taken.insert(id, b),
            None => taken.remove(&id),
        };
        self.used.fetch_add(bytes.unwrap_or(0), Ordering::Relaxed);
        self.used.fetch_sub(old.unwrap_or(0), Ordering::Relaxed);
    }

    /// Stops charging the old versions nobody holds any more.
    fn sweep_orphans(&self) {
        let mut orphans = self.orphans.lock();
        if orphans.is_empty() {
            return;
        }
        orphans.retain(|(w, mem)| {
            let alive = w.strong_count() > 0;
            if !alive {
                self.used.fetch_sub(*mem, Ordering::Relaxed);
            }
            alive
        });
    }

    /// Returns a node a writer changed (or created).
    pub(crate) fn put(&self, node: Node) {
        self.replace_taken(node.id, None);
        let m = node.mem_now();
        node.mem.store(m, Ordering::Relaxed);
        self.used.fetch_add(m, Ordering::Relaxed);
        let id = node.id;
        let old = self.map.lock().insert(
            id,
            Slot {
                node: Arc::new(node),
                last_use: AtomicU64::new(self.tick()),
            },
        );
        if let Some(o) = old {
            self.used
                .fetch_sub(o.node.mem.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Drops a node that is no longer part of any tree.
    pub(crate) fn remove(&self, id: NodeId) {
        self.replace_taken(id, None);
        if let Some(o) = self.map.lock().remove(&id) {
            self.used
                .fetch_sub(o.node.mem.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The configured bound.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Excludes evictions (and other writebacks) while a writeback writes one node.
    pub(crate) fn writeback_lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.evicting.lock()
    }

    /// The dirty leaves (and leaf deltas) among the least recently used leaves nobody else holds that together
    /// use `bytes` of memory, least recently used first: what eviction will write next if the
    /// cache has to shed `bytes` (writeback.rs writes them ahead of it). Clean leaves count
    /// toward `bytes` (eviction drops them first) but are not returned.
    pub(crate) fn dirty_leaves(&self, bytes: usize) -> Vec<SharedNode> {
        if self.keep_dirty {
            return Vec::new();
        }
        let map = self.map.lock();
        let mut v: Vec<(u64, &SharedNode)> = map
            .values()
            .filter(|s| s.node.is_leaf_level() && Arc::strong_count(&s.node) == 1)
            .map(|s| (s.last_use.load(Ordering::Relaxed), &s.node))
            .collect();
        v.sort_unstable_by_key(|e| e.0);
        let mut seen = 0;
        let mut out = Vec::new();
        for (_, n) in v {
            if seen >= bytes {
                break;
            }
            seen += n.mem.load(Ordering::Relaxed);
            if n.is_dirty() {
                out.push(n.clone());
            }
        }
        out
    }

    pub(crate) fn over_limit(&self) -> bool {
        self.used.load(Ordering::Relaxed) > self.limit
    }

    /// Whether `node` is the very node the cache holds for its id (not a copy of it).
    pub(crate) fn holds(&self, node: &Node) -> bool {
        self.map
            .lock()
            .get(&node.id)
            .is_some_and(|s| std::ptr::eq(&*s.node, node))
    }

    /// Whether `node` is the version the cache holds for its id (not replaced by a writer since
    /// it was handed out: a writer's `take` always leaves a different `Arc` behind).
    pub(crate) fn is_current(&self, node: &SharedNode) -> bool {
        self.map
            .lock()
            .get(&node.id)
            .is_some_and(|s| Arc::ptr_eq(&s.node, node))
    }

    /// The cached node for `id` if it is still `version` (kept as a weak reference: while one
    /// exists, no other node can be allocated at its address).
    pub(crate) fn current_version(&self, id: NodeId, version: &Weak<Node>) -> Option<SharedNode> {
        self.map
            .lock()
            .get(&id)
            .filter(|s| std::ptr::eq(Arc::as_ptr(&s.node), version.as_ptr()))
            .map(|s| s.node.clone())
    }

    /// Every dirty node (for a checkpoint), in node-id order: the map's order depends on a hash
    /// seed drawn per map, and a checkpoint that wrote in that order would place nodes, and cut
    /// a crash test's power, differently on every run of the same seed (testing.md: a seed
    /// replays exactly).
    pub(crate) fn dirty(&self) -> Vec<SharedNode> {
        let map = self.map.lock();
        let mut dirty: Vec<SharedNode> = map
            .values()
            .filter(|s| s.node.is_dirty())
            .map(|s| s.node.clone())
            .collect();
        drop(map);
        dirty.sort_unstable_by_key(|n| n.id);
        dirty
    }

    /// An upper bound on the bytes the dirty nodes take once written: each one's memory (a
    /// dirty node is fully loaded, N6, and its encoding is never larger than its partitions'
    /// bytes plus a header and one frame header each, B9) plus an allocation unit for its header
    /// and rounding. The space accounting counts it as used (format.md, B12).
    pub(crate) fn dirty_bytes(&self) -> u64 {
        let map = self.map.lock();
        map.values()
            .filter(|s| s.node.is_dirty())
            .map(|s| s.node.mem.load(Ordering::Relaxed) as u64 + 2 * crate::blockfile::ALIGN)
            .sum()
    }

    /// Memory of every cached node (dirty or not): a cheap upper bound on
    /// [`dirty_bytes`](Self::dirty_bytes) minus the per-node allowance.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed) as u64
    }

    /// Evicts least recently used nodes until memory is below 90% of the bound.
    /// `write` makes a dirty node durable-on-checkpoint (copy-on-write) before it is dropped.
    pub(crate) fn evict(&self, write: &dyn Fn(&Node) -> Result<()>) -> Result<()> {
        self.sweep_orphans();
        if !self.over_limit() {
            return Ok(());
        }
        // Over the bound, wait for whoever holds the eviction lock (another evictor, a
        // writeback writing one node) and look again: returning at once let a writer go on
        // adding while a descheduled holder sat on the lock, and on a loaded machine the
        // accounted bytes ran past the bound by more than the nodes in use (C1).
        let _guard = self.evicting.lock();
        if !self.over_limit() {
            return Ok(());
        }
        let target = self.limit / 10 * 9;
        // A pass may leave leaves' headers behind (partial eviction, C3); a second pass then
        // ranks them as what they have become.
        for _ in 0..2 {
            if !self.evict_pass(target, write)? {
                break;
            }
        }
        Ok(())
    }

    /// One eviction pass over the nodes nobody holds, least valuable first, down to `target`
    /// bytes. Returns whether it is still above `target` after shedding some leaves'
    /// partitions (their headers are then worth ranking again).
    ///
    /// The order: partitions of leaves (and leaf deltas), least recently used first; then
    /// leaves' headers; internal nodes only when no leaf is left. An internal node's buffers
    /// are where the tree batches writes: evicted, the next flush into it reads and rewrites
    /// all of it, and the smaller the buffers the cache keeps, the fewer bytes each leaf flush
    /// moves (a leaf is rewritten whole per flush). A leaf is rarely hit twice by random
    /// writes before it would be evicted, and a reader's cold lookup costs one basement, not a
    /// node (N5). A clean leaf unchanged since it was read sheds only its partitions: its
    /// header (a pivot and a frame position per basement, ~1/200 of its rows) stays, so a
    /// cold lookup reads one basement rather than the header and then a basement. Leaf deltas
    /// go with the leaves: they are read back only by a read of their leaf's range or its
    /// merge.
    fn evict_pass(&self, target: usize, write: &dyn Fn(&Node) -> Result<()>) -> Result<bool> {
        let mut victims: Vec<(u8, u64, NodeId)> = {
            let map = self.map.lock();
            map.iter()
                .filter(|(_, s)| Arc::strong_count(&s.node) == 1)
                .map(|(id, s)| {
                    let rank = match (s.node.is_leaf_level(), s.node.has_sheddable_parts()) {
                        (true, true) => 0,
                        (true, false) => 1,
                        (false, _) => 2,
                    };
                    (rank, s.last_use.load(Ordering::Relaxed), *id)
                })
                .collect()
        };
        victims.sort_unstable();
        let mut shed = false;
        for (rank, _, id) in victims {
            if self.used.load(Ordering::Relaxed) <= target {
                return Ok(false);
            }
            let node = {
                let map = self.map.lock();
                match map.get(&id) {
                    Some(s) if Arc::strong_count(&s.node) == 1 => s.node.clone(),
                    _ => continue,
                }
            };
            if node.is_dirty() && self.keep_dirty {
                continue;
            }
            if node.is_dirty() {
                // Written while still cached: a reader that misses later finds the new block.
                write(&node)?;
                node.set_dirty(false);
                self.dirty_evictions.fetch_add(1, Ordering::Relaxed);
            }
            drop(node);
            let mut map = self.map.lock();
            let Some(s) = map.get_mut(&id) else { continue };
            if Arc::strong_count(&s.node) != 1 || s.node.is_dirty() {
                continue;
            }
            if rank == 0 {
                // No other holder (strong count 1, and no weak one: `get_mut`), so no reader
                // sees the partitions go.
                if let Some(n) = Arc::get_mut(&mut s.node) {
                    let freed = n.unload_parts();
                    if freed > 0 {
                        self.used.fetch_sub(freed, Ordering::Relaxed);
                        self.partial_evictions.fetch_add(1, Ordering::Relaxed);
                        shed = true;
                        continue;
                    }
                }
            }
            let s = map.remove(&id).expect("present");
            self.used
                .fetch_sub(s.node.mem.load(Ordering::Relaxed), Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(shed && self.used.load(Ordering::Relaxed) > target)
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            used_bytes: self.used.load(Ordering::Relaxed),
            limit_bytes: self.limit,
            nodes: self.map.lock().len(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            dirty_evictions: self.dirty_evictions.load(Ordering::Relaxed),
            partial_evictions: self.partial_evictions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with_leaf(id: u64) -> (Cache, usize) {
        let cache = Cache::new(64 << 20, false);
        cache.put(Node::new_leaf(NodeId(id)));
        let m = cache.used_bytes() as usize;
        assert!(m > 0);
        (cache, m)
    }

    fn no_write(_: &Node) -> Result<()> {
        Ok(())
    }

    #[test]
    fn a_taken_node_stays_charged_until_it_is_put_back_or_removed() {
        let (cache, m) = cache_with_leaf(1);
        let node = cache.take(NodeId(1)).expect("cached");
        assert_eq!(cache.used_bytes() as usize, m, "taken, still in memory");
        cache.pin(NodeId(1), m + 4096);
        assert_eq!(
            cache.used_bytes() as usize,
            m + 4096,
            "pinned at its loaded size"
        );
        cache.put(node);
        assert_eq!(
            cache.used_bytes() as usize,
            m,
            "back: charged once, at its size"
        );
        let _node = cache.take(NodeId(1)).expect("cached");
        cache.remove(NodeId(1));
        assert_eq!(cache.used_bytes(), 0, "freed: no charge left");
    }

    #[test]
    fn an_old_version_someone_holds_is_charged_until_dropped() {
        let (cache, m) = cache_with_leaf(1);
        let held = cache.get(NodeId(1)).expect("cached"); // a checkpoint's snapshot, say
        let node = cache.take(NodeId(1)).expect("cached");
        assert_eq!(
            cache.used_bytes() as usize,
            2 * m,
            "the copy and the held original"
        );
        cache.put(node);
        assert_eq!(cache.used_bytes() as usize, 2 * m);
        cache.evict(&no_write).unwrap();
        assert_eq!(cache.used_bytes() as usize, 2 * m, "still held");
        drop(held);
        cache.evict(&no_write).unwrap();
        assert_eq!(cache.used_bytes() as usize, m, "dropped: no longer charged");
    }

    #[test]
    fn an_eviction_over_the_bound_waits_for_the_lock_instead_of_giving_up() {
        let (probe, m) = cache_with_leaf(1);
        drop(probe);
        let cache = Cache::new(2 * m, false);
        for id in 1..=4 {
            cache.put(Node::new_leaf(NodeId(id)));
        }
        assert!(cache.over_limit());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                // A writeback writing one node holds the lock for a while.
                let _one = cache.writeback_lock();
                held_tx.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(100));
            });
            held_rx.recv().unwrap();
            cache.evict(&no_write).unwrap();
            assert!(
                !cache.over_limit(),
                "{} bytes cached for a bound of {}: the evictor left while the lock was held",
                cache.used_bytes(),
                2 * m
            );
        });
    }

    #[test]
    fn an_encoding_is_counted_and_its_buffer_kept_counted_as_a_spare() {
        let (cache, m) = cache_with_leaf(1);
        let node = cache.get(NodeId(1)).expect("cached");
        let enc = cache.encode(&node, crate::codec::Compression::DEFAULT);
        let cap = cache.used_bytes() as usize - m;
        assert!(
            cap >= enc.len() && !enc.is_empty(),
            "{cap} for {} bytes",
            enc.len()
        );
        drop(enc);
        assert_eq!(
            cache.used_bytes() as usize,
            m + cap,
            "kept as a spare, still counted"
        );
        let again = cache.encode(&node, crate::codec::Compression::DEFAULT);
        assert_eq!(
            cache.used_bytes() as usize,
            m + cap,
            "the spare reused, not a second one"
        );
        drop(again);
    }
}
