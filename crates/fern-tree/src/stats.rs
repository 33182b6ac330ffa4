//! Engine figures for tools and operators: the [`Stats`] snapshot of [`Env::stats`] (cheap
//! counters: cache hits, device traffic, message bytes) and the message backlog of
//! [`Env::backlog`] (a walk of the internal nodes).
//!
//! Owns the counting device wrapper every environment's device goes through, so "bytes
//! written to the device" counts everything — nodes, block-table and header writes, log
//! records — whichever layer wrote it. Never: changes what is written or read, or keeps state
//! that affects the tree.
//!
//! Counters start at zero when the environment is opened; they describe this open, not the
//! image's lifetime. Recovery's replay counts as applied messages (its node writes happen in
//! this open).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::blockfile::BlockFileStats;
use crate::cache::CacheStats;
use crate::device::BlockDevice;
use crate::env::Env;
use crate::error::Result;
use crate::ids::Lsn;
use crate::msg::Op;
use crate::node::Body;

/// Statistics of an open environment (since it was opened).
#[derive(Debug, Clone)]
pub struct Stats {
    /// Node cache counters.
    pub cache: CacheStats,
    /// Block file counters.
    pub file: BlockFileStats,
    /// Traffic on the device (every layer: nodes, tables, headers, log).
    pub device: DeviceStats,
    /// Messages accepted since open.
    pub messages: u64,
    /// Bytes of those messages as users wrote them: keys, values, upsert arguments and range
    /// bounds (the denominator of write amplification).
    pub message_bytes: u64,
    /// Device syncs issued by group commit since open.
    pub log_syncs: u64,
    /// LSN past the last log record.
    pub log_end: Lsn,
    /// The log is durable below this LSN (the last completed sync's watermark).
    pub log_durable: Lsn,
    /// Where the tree's work and node writes went (write amplification by cause).
    pub work: WorkStats,
}

/// The write path's work since open, by cause: which writes of node blocks the checkpoints
/// and the evictions made, and what the flushes moved. The device's total
/// ([`DeviceStats::bytes_written`]) is these node bytes plus the log, block tables and headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkStats {
    /// Node blocks written by checkpoints.
    pub checkpoint_nodes: u64,
    /// Their bytes.
    pub checkpoint_bytes: u64,
    /// Node blocks written by eviction (a dirty node leaving the cache).
    pub evicted_nodes: u64,
    /// Their bytes.
    pub evicted_bytes: u64,
    /// Node blocks written by background writeback (a dirty leaf eviction would write next).
    pub writeback_nodes: u64,
    /// Their bytes.
    pub writeback_bytes: u64,
    /// Rounds the writeback thread ran (each looks for dirty leaves to write, and may find
    /// none).
    pub writeback_rounds: u64,
    /// Background reclamation passes the checkpoint thread ran (format.md B13).
    pub reclaim_passes: u64,
    /// Flushes of a child buffer into a leaf.
    pub leaf_flushes: u64,
    /// Flushes of a child buffer into an internal node.
    pub internal_flushes: u64,
    /// Message bytes those flushes moved.
    pub flushed_bytes: u64,
    /// Of those, the bytes moved into leaves (with `leaf_flushes`: how much a leaf flush
    /// changes, against the leaf it rewrites).
    pub leaf_flushed_bytes: u64,
    /// Nodes a writer had to read from the device (not in the cache).
    pub writer_reads: u64,
    /// Of the flushes above, those the background root drain ran (drain.rs) rather than a
    /// writer inside its batch.
    pub drained_flushes: u64,
    /// Of the drained flushes, those run beside the writers and installed (design.md §2.5,
    /// "Flushes beside the writer"; each counts once in `drained_flushes`, with what it
    /// flushed below the child).
    pub detached_installs: u64,
    /// Flushes run beside the writers and then discarded (their root changed meanwhile, or
    /// the environment closed).
    pub detached_discards: u64,
    /// Of the leaf flushes, those that wrote their messages as a leaf delta (format.md "Leaf
    /// deltas") instead of rewriting the leaf.
    pub delta_appends: u64,
    /// Leaf flushes (or merges of small leaves) that folded a leaf's deltas into it.
    pub delta_merges: u64,
    /// Leaf deltas point reads did not read because their key filter ruled the key out
    /// (format.md "Key filters of leaf deltas").
    pub delta_skips: u64,
}

impl Stats {
    /// Node lookups answered from memory over all node lookups; `None` before any lookup.
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let all = self.cache.hits + self.cache.misses;
        (all > 0).then(|| self.cache.hits as f64 / all as f64)
    }

    /// Bytes written to the device over bytes of messages users wrote; `None` before any
    /// message.
    pub fn write_amplification(&self) -> Option<f64> {
        (self.message_bytes > 0)
            .then(|| self.device.bytes_written as f64 / self.message_bytes as f64)
    }
}

/// Traffic on an environment's device since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Bytes written.
    pub bytes_written: u64,
    /// Write calls.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Read calls.
    pub reads: u64,
    /// Syncs (fsync / fdatasync).
    pub syncs: u64,
}

/// Counters of one environment that the write path and the device wrapper update.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    message_bytes: AtomicU64,
    bytes_written: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    reads: AtomicU64,
    syncs: AtomicU64,
    checkpoint_nodes: AtomicU64,
    checkpoint_bytes: AtomicU64,
    evicted_nodes: AtomicU64,
    evicted_bytes: AtomicU64,
    writeback_nodes: AtomicU64,
    writeback_bytes: AtomicU64,
    writeback_rounds: AtomicU64,
    reclaim_passes: AtomicU64,
    leaf_flushes: AtomicU64,
    internal_flushes: AtomicU64,
    flushed_bytes: AtomicU64,
    leaf_flushed_bytes: AtomicU64,
    writer_reads: AtomicU64,
    drained_flushes: AtomicU64,
    detached_installs: AtomicU64,
    detached_discards: AtomicU64,
    delta_appends: AtomicU64,
    delta_merges: AtomicU64,
    delta_skips: AtomicU64,
}

/// Why a node block is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteCause {
    Checkpoint,
    Eviction,
    Writeback,
}

impl Counters {
    /// Counts a node block written for `cause`.
    pub(crate) fn node_written(&self, cause: WriteCause, bytes: usize) {
        let (n, b) = match cause {
            WriteCause::Checkpoint => (&self.checkpoint_nodes, &self.checkpoint_bytes),
            WriteCause::Eviction => (&self.evicted_nodes, &self.evicted_bytes),
            WriteCause::Writeback => (&self.writeback_nodes, &self.writeback_bytes),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a flush of `bytes` message bytes into a leaf or an internal node.
    pub(crate) fn flushed(&self, into_leaf: bool, bytes: usize) {
        let n = if into_leaf {
            &self.leaf_flushes
        } else {
            &self.internal_flushes
        };
        n.fetch_add(1, Ordering::Relaxed);
        self.flushed_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if into_leaf {
            self.leaf_flushed_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    /// Counts a leaf flush written as a delta (`merge` false) or a fold of a leaf's deltas
    /// into it (`merge` true).
    pub(crate) fn delta(&self, merge: bool) {
        let c = if merge {
            &self.delta_merges
        } else {
            &self.delta_appends
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts leaf deltas a point read skipped by their key filters.
    pub(crate) fn delta_skips(&self, n: u64) {
        if n > 0 {
            self.delta_skips.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a node a writer read from the device.
    pub(crate) fn writer_read(&self) {
        self.writer_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a round of the writeback thread.
    pub(crate) fn writeback_round(&self) {
        self.writeback_rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a background reclamation pass.
    pub(crate) fn reclaim_pass(&self) {
        self.reclaim_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts flushes the background root drain ran.
    pub(crate) fn drained(&self, flushes: u64) {
        self.drained_flushes.fetch_add(flushes, Ordering::Relaxed);
    }

    /// A detached flush ended: installed, or discarded.
    pub(crate) fn detached(&self, installed: bool) {
        if installed {
            self.detached_installs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.detached_discards.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Flushes of any kind so far (leaf and internal).
    pub(crate) fn flushes(&self) -> u64 {
        self.leaf_flushes.load(Ordering::Relaxed) + self.internal_flushes.load(Ordering::Relaxed)
    }

    pub(crate) fn work(&self) -> WorkStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkStats {
            checkpoint_nodes: l(&self.checkpoint_nodes),
            checkpoint_bytes: l(&self.checkpoint_bytes),
            evicted_nodes: l(&self.evicted_nodes),
            evicted_bytes: l(&self.evicted_bytes),
            writeback_nodes: l(&self.writeback_nodes),
            writeback_bytes: l(&self.writeback_bytes),
            writeback_rounds: l(&self.writeback_rounds),
            reclaim_passes: l(&self.reclaim_passes),
            leaf_flushes: l(&self.leaf_flushes),
            internal_flushes: l(&self.internal_flushes),
            flushed_bytes: l(&self.flushed_bytes),
            leaf_flushed_bytes: l(&self.leaf_flushed_bytes),
            writer_reads: l(&self.writer_reads),
            drained_flushes: l(&self.drained_flushes),
            detached_installs: l(&self.detached_installs),
            detached_discards: l(&self.detached_discards),
            delta_appends: l(&self.delta_appends),
            delta_merges: l(&self.delta_merges),
            delta_skips: l(&self.delta_skips),
        }
    }

    /// Counts the user bytes of `op`, applied once.
    pub(crate) fn applied(&self, op: &Op) {
        let n = match op {
            Op::Insert { key, value } => key.len() + value.len(),
            Op::Delete { key } => key.len(),
            Op::Upsert { key, arg, .. } => key.len() + arg.len(),
            Op::DeleteRange { lo, hi } => lo.len() + hi.len(),
        };
        self.message_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn message_bytes(&self) -> u64 {
        self.message_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn device(&self) -> DeviceStats {
        DeviceStats {
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }
}

/// Wraps `dev` so its traffic is counted in the returned counters.
pub(crate) fn counted(dev: Arc<dyn BlockDevice>) -> (Arc<dyn BlockDevice>, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let wrapped = CountingDevice {
        inner: dev,
        c: counters.clone(),
    };
    (Arc::new(wrapped), counters)
}

#[derive(Debug)]
struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    c: Arc<Counters>,
}

impl CountingDevice {
    fn count_read(&self, bytes: usize) {
        self.c.reads.fetch_add(1, Ordering::Relaxed);
        self.c.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl BlockDevice for CountingDevice {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn next_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.inner.next_data(offset)
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.inner.prefetch(offset, len)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.count_read(buf.len());
        self.inner.read_at(buf, offset)
    }
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.count_read(buf.len());
        self.inner.read_direct(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.c.writes.fetch_add(1, Ordering::Relaxed);
        self.c
            .bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.c.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
    fn capacity(&self) -> io::Result<Option<u64>> {
        self.inner.capacity()
    }
    fn host_available(&self) -> io::Result<Option<u64>> {
        self.inner.host_available()
    }
}

/// Messages waiting in internal nodes' buffers: written, not yet applied to leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Buffered messages.
    pub messages: u64,
    /// Their encoded bytes.
    pub bytes: u64,
    /// Internal nodes visited (every internal node of every tree).
    pub internal_nodes: u64,
    /// Trees visited.
    pub trees: u64,
}

impl Env {
    /// The message backlog of every tree. Reads every internal node (through the cache; leaves
    /// are never read), so it costs about one node in `fanout` of the tree — fine on request,
    /// too much for a per-operation counter.
    pub fn backlog(&self) -> Result<Backlog> {
        let mut total = Backlog::default();
        for name in self.tree_names() {
            let tree = self.tree(&name)?;
            let b = self.read(&tree, |ctx, root| {
                let mut b = Backlog::default();
                let mut stack = vec![root];
                while let Some(id) = stack.pop() {
                    let node = ctx.fetch(id)?;
                    let Body::Internal { children, .. } = &node.body else {
                        continue;
                    };
                    b.internal_nodes += 1;
                    for i in 0..children.len() {
                        let (buf, added) = node.buffer(ctx.dev.as_ref(), i)?;
                        ctx.cache.grew(&node, added);
                        b.messages += buf.count() as u64;
                        b.bytes += buf.bytes() as u64;
                    }
                    // Children of the lowest internal level are leaves: not read.
                    if node.height > 1 {
                        stack.extend(children.iter().copied());
                    }
                }
                Ok(b)
            })?;
            total.messages += b.messages;
            total.bytes += b.bytes;
            total.internal_nodes += b.internal_nodes;
            total.trees += 1;
        }
        Ok(total)
    }
}
