//! The Bε-tree algorithms: injecting messages, flushing buffers, splitting and shrinking nodes
//! (writers), and point and leaf-range queries that apply pending messages (readers).
//!
//! Writers run under the environment's write lock and own the nodes they change (taken out of
//! the cache, fully loaded — invariant N6). Readers run under the read lock and share nodes.
//! Never: does I/O other than through the context, or decides durability.
//!
//! This module owns the context the algorithms run in (`Ctx`: node fetch, take, put, write)
//! and the key-range arithmetic they share; each concept lives in its own file:
//! - `apply.rs`: applying a message batch to one node (a leaf's basements, an internal
//!   node's child buffers);
//! - `flush.rs`: the writer's entry points and the flush policy (when and which buffer moves
//!   down: size, hot keys, optimize, space reclamation);
//! - `delta.rs`: leaf deltas (a flush into a leaf written beside it; the merge that folds
//!   them in; the deltas a reader applies);
//! - `reshape.rs`: splitting nodes over their limits and merging small ones;
//! - `read.rs`: point lookups and leaf windows for cursors;
//! - `verify.rs`: the invariant walk (`Tree::verify`, fsck) and backlog diagnostics.

mod apply;
mod delta;
mod detached;
mod flush;
mod read;
mod reshape;
mod verify;

pub(crate) use detached::{detach, Overlay};
pub(crate) use flush::{flush_step, optimize, reclaim_step, write};
pub(crate) use read::{get, leaf_rows, LeafRows, Seek};
pub use verify::{DamagedNode, TreeReport};

use std::sync::Arc;

use parking_lot::Mutex;

use crate::basement::Basement;
use crate::blockfile::BlockFile;
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::codec::Compression;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::NodeId;
use crate::msg::UpsertRegistry;
use crate::node::{Node, SharedNode};
use crate::stats::{Counters, WriteCause};

/// Shape parameters of trees, fixed for an open environment.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub node_bytes: usize,
    pub basement_bytes: usize,
    pub fanout: usize,
    pub compression: Compression,
    /// Most leaf deltas per child (format.md "Leaf deltas", D5); 0: every flush into a leaf
    /// rewrites it. Not stored in the image: an environment opened with deltas off reads the
    /// deltas it finds and merges them on their leaf's next flush.
    pub leaf_deltas: usize,
}

/// Everything the algorithms need from the environment.
pub(crate) struct Ctx<'a> {
    pub cache: &'a Cache,
    pub bf: &'a Mutex<BlockFile>,
    pub dev: &'a Arc<dyn BlockDevice>,
    pub shape: &'a Shape,
    pub upserts: &'a UpsertRegistry,
    pub counters: &'a Counters,
    /// The child of this tree's root that a detached flush is moving messages into (DF2):
    /// nothing else flushes into it, merges it, or drops its subtree meanwhile.
    pub busy: Option<NodeId>,
    /// Set for a detached flush's own work: nodes are copied out of the cache instead of
    /// taken, and what it changes, creates and frees stays here until the install (DF1).
    pub overlay: Option<&'a Overlay>,
}

impl Ctx<'_> {
    /// A node for reading: from the cache, or its header from disk.
    pub(crate) fn fetch(&self, id: NodeId) -> Result<SharedNode> {
        if let Some(n) = self.overlay.and_then(|o| o.shared(id)) {
            return Ok(n);
        }
        if let Some(n) = self.cache.get(id) {
            return Ok(n);
        }
        let loc = self.bf.lock().loc(id).ok_or(Error::MissingNode(id))?;
        let node = Node::read(self.dev.as_ref(), id, loc, false)?;
        Ok(self.cache.insert(node))
    }

    /// A node for changing: out of the cache, every partition loaded.
    pub(crate) fn take(&self, id: NodeId) -> Result<Node> {
        if self.overlay.is_some() {
            // A flight's charges count against the bound while writers may be waiting for its
            // install, evicting nothing: it makes room itself before each node it copies.
            self.evict()?;
        }
        let cached = match self.overlay {
            // A detached flush copies: readers keep the cached node until the install.
            Some(o) => o
                .take(id, self.cache)
                .or_else(|| self.cache.get(id).map(|n| (*n).clone())),
            None => self.cache.take(id),
        };
        // A whole node taken from the cache is already charged at its size (Cache::take).
        let charged = cached.as_ref().is_some_and(Node::fully_loaded);
        let mut node = match cached {
            Some(n) => n,
            None => {
                self.counters.writer_read();
                let loc = self.bf.lock().loc(id).ok_or(Error::MissingNode(id))?;
                Node::read(self.dev.as_ref(), id, loc, true)?
            }
        };
        node.load_all(self.dev.as_ref())?;
        // Taken to change: its frames stop describing a block it may be read from again, so
        // the cache must never drop its partitions (C3) until it is read from disk anew.
        node.block = None;
        match self.overlay {
            // A flight's copy is memory beside the cached original: counted until the flight
            // puts or frees it (C1; without it E1 peaked ~10 MiB above the cache's count).
            Some(o) => o.hold(id, node.mem_now(), self.cache),
            // Out of the cache but in memory, with every partition loaded: still counted (C1).
            None if !charged => self.cache.pin(id, node.mem_now()),
            None => {}
        }
        Ok(node)
    }

    /// Puts back a node that was taken but not changed.
    pub(crate) fn put_unchanged(&self, node: Node) {
        match self.overlay {
            Some(o) => o.put(node, false, self.cache),
            None => self.cache.put(node),
        }
    }

    /// Puts a changed node back, dirty.
    pub(crate) fn put(&self, node: Node) {
        node.set_dirty(true);
        match self.overlay {
            Some(o) => o.put(node, true, self.cache),
            None => self.cache.put(node),
        }
    }

    pub(crate) fn new_id(&self) -> NodeId {
        self.bf.lock().alloc_node_id()
    }

    /// A node that left the tree: its id and block are released at the next checkpoint.
    pub(crate) fn free(&self, id: NodeId) {
        if let Some(o) = self.overlay {
            o.free(id, self.cache);
            return;
        }
        self.cache.remove(id);
        self.bf.lock().free_node(id);
    }

    /// Evicts cached nodes down to the cache's bound, writing the dirty nodes it drops (the
    /// cache keeps C1). Safe beside the writers, as readers do it (`Env::read`): only nodes
    /// nobody else holds are dropped, so never a flight's copies, which are not in the cache.
    pub(crate) fn evict(&self) -> Result<()> {
        self.cache
            .evict(&|n| self.write_node(n, WriteCause::Eviction))
    }

    /// Writes a node to a fresh block (copy-on-write); it stays cached, now clean.
    pub(crate) fn write_node(&self, node: &Node, cause: WriteCause) -> Result<()> {
        let bytes = self.cache.encode(node, self.shape.compression);
        self.write_encoded(node, &bytes, cause)
    }

    /// Writes `bytes`, the encoding of `node`, to a fresh block (copy-on-write).
    pub(crate) fn write_encoded(&self, node: &Node, bytes: &[u8], cause: WriteCause) -> Result<()> {
        self.counters.node_written(cause, bytes.len());
        let loc = self.bf.lock().reserve(node.id, bytes.len() as u32)?;
        self.dev
            .write_at(bytes, loc.offset)
            .map_err(|e| Error::io(format!("writing node {}", node.id), e))
    }

    fn basement<'n>(&self, node: &'n Node, i: usize) -> Result<&'n Arc<Basement>> {
        let (b, added) = node.basement(self.dev.as_ref(), i)?;
        self.grew(node, added);
        Ok(b)
    }

    fn delta_msgs<'n>(&self, node: &'n Node, i: usize) -> Result<&'n MsgBuffer> {
        let (b, added) = node.delta_msgs(self.dev.as_ref(), i)?;
        self.grew(node, added);
        Ok(b)
    }

    fn buffer<'n>(&self, node: &'n Node, i: usize) -> Result<&'n MsgBuffer> {
        let (b, added) = node.buffer(self.dev.as_ref(), i)?;
        self.grew(node, added);
        Ok(b)
    }

    /// Accounts partitions loaded into `node`: to the cache, unless the node is a detached
    /// flush's copy (the cache counts it when the install puts it). A cached node a flush
    /// only reads (a leaf delta it folds) is the cache's: counting its growth only in the
    /// node made the cache's total fall below the truth once it was evicted, and the cache
    /// then let resident memory grow past its bound.
    fn grew(&self, node: &Node, added: usize) {
        if added == 0 {
            return;
        }
        if self.overlay.is_some() && !self.cache.holds(node) {
            node.mem
                .fetch_add(added, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.cache.grew(node, added);
        }
    }
}

/// Key range `[lo, hi)` of child/partition `i` given pivots (None = unbounded).
fn range_of(pivots: &[Vec<u8>], i: usize) -> (Option<&[u8]>, Option<&[u8]>) {
    let lo = if i == 0 {
        None
    } else {
        Some(pivots[i - 1].as_slice())
    };
    let hi = pivots.get(i).map(Vec::as_slice);
    (lo, hi)
}

/// Whether range delete `[rlo, rhi)` intersects `[lo, hi)`.
fn intersects(rlo: &[u8], rhi: &[u8], lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    rlo < rhi && hi.is_none_or(|h| rlo < h) && lo.is_none_or(|l| rhi > l)
}

/// Whether range delete `[rlo, rhi)` covers all of `[lo, hi)`.
fn covers_all(rlo: &[u8], rhi: &[u8], lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    let lo_ok = match lo {
        Some(l) => rlo <= l,
        None => rlo.is_empty(),
    };
    lo_ok && hi.is_some_and(|h| h <= rhi)
}
