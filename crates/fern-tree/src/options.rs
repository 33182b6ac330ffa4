//! What a user chooses when opening an environment ([`Options`], [`Durability`]) and what an
//! open reports back ([`RecoveryReport`]). Plain data: the environment (env.rs) acts on it.

use std::time::Duration;

use crate::codec::Compression;
use crate::error::{Error, Result};
use crate::ids::UpsertId;
use crate::msg::{UpsertFn, UpsertRegistry};
use crate::wal;

/// How durable a committed write batch is when [`Env::write_with`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Returns after the batch's log record is on stable storage (an fsync, shared with
    /// concurrent `Sync` commits: group commit).
    Sync,
    /// Returns once the batch is logged and applied in memory; it becomes durable with the next
    /// [`Env::sync`], `Sync` commit, periodic flush ([`Options::sync_interval`]) or checkpoint.
    /// A crash can lose it, and then every later batch too (the log is a prefix), never part of it.
    #[default]
    Buffered,
}

/// Options of an environment. Shape options apply when it is created; compression is
/// remembered in the image.
#[derive(Clone, Debug)]
pub struct Options {
    /// Hard bound on the memory the node cache uses, in bytes.
    pub cache_bytes: usize,
    /// Target size of a node: leaves split above it; internal nodes flush above it.
    pub node_bytes: usize,
    /// Target size of a leaf partition (the unit a point read decompresses).
    pub basement_bytes: usize,
    /// Most children an internal node has before it splits.
    pub fanout: usize,
    /// Compression of a new image (an existing image remembers its own; see
    /// [`Options::change_compression`]).
    pub compression: Compression,
    /// On open of an existing image: write new partitions with this codec from now on, and
    /// remember it in the image (its catalog, from the next checkpoint). Partitions already
    /// written keep their codec until their node is rewritten — every frame names its own
    /// (format.md, "Partition frame") — so the image holds both meanwhile. `None` (default):
    /// keep the image's choice. Not used by create.
    pub change_compression: Option<Compression>,
    /// Registered upsert functions.
    pub upserts: UpsertRegistry,
    /// Bytes of the write-ahead log region, reserved when the image is created (a multiple of
    /// 4096, at least 16 KiB). A checkpoint starts when a quarter of it has been written since
    /// the last one; a batch may not exceed half of it.
    pub log_bytes: u64,
    /// How often a background thread syncs `Buffered` commits; `None` disables it (they are then
    /// durable only by [`Env::sync`], a `Sync` commit or a checkpoint).
    pub sync_interval: Option<Duration>,
    /// Durability of [`Env::write`] and of the [`Tree`] convenience methods.
    pub durability: Durability,
    /// Whether checkpoints the log asks for run on a background thread (default). Without it
    /// the writer that notices runs them, which keeps a single-threaded run deterministic (the
    /// crash test relies on that).
    pub checkpoint_thread: bool,
    /// Open without ever writing the image (W11): recover into memory only (replayed nodes stay
    /// dirty in the cache, never written, so a large unreplayed log needs memory for every node
    /// it changes), no checkpoint, no epoch bump, no punch, no background thread; every write
    /// returns [`Error::ReadOnly`]. For checkers and exporters (`fernfs fsck`, `stat`, `export`).
    pub read_only: bool,
    /// Repair: when recovery finds a damaged log record that later records prove durable, cut
    /// the log there (keeping everything before it, dropping it and everything after) instead
    /// of failing with [`Error::Checksum`]. Never the default; what was dropped is in
    /// [`Env::recovery`]. (W4)
    pub cut_damaged_log: bool,
    /// Fixed size of a new image in bytes, kept in its catalog: nothing is allocated past it,
    /// new data is refused with [`Error::NoSpace`] before the reserve is touched, and the file
    /// keeps this length (format.md, "Space and the reserve"). `None`: the image grows as its
    /// device allows. A device with a capacity of its own (a disk) is limited by that anyway.
    pub capacity: Option<u64>,
    /// Most leaf deltas a leaf may have before a flush into it rewrites it (format.md "Leaf
    /// deltas"): a flush into a leaf writes only the messages it moves, as a delta named by the
    /// parent, and the leaf is rewritten once per this many flushes plus one. 0 turns deltas
    /// off (every flush rewrites its leaf). A point read of a cold leaf reads up to this many
    /// small delta blocks besides the leaf's basement. At most 16.
    pub leaf_deltas: usize,
    /// Whether the background drain flushes a root's child beside the writers, on copies,
    /// holding the write lock only to start and to install (design.md §2.5, "Flushes beside
    /// the writer"), instead of holding it for the whole flush. `None` (the default): when the
    /// process may run on more than one CPU — on one, the two cannot run at once and the
    /// copies only cost (postmark pinned to one CPU: +0.3 s of the drain's CPU).
    pub flush_beside_writer: Option<bool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            node_bytes: 1 << 20,
            basement_bytes: 16 << 10,
            fanout: 16,
            compression: Compression::DEFAULT,
            change_compression: None,
            upserts: UpsertRegistry::default(),
            log_bytes: 256 << 20,
            sync_interval: Some(Duration::from_millis(100)),
            durability: Durability::Buffered,
            checkpoint_thread: true,
            read_only: false,
            cut_damaged_log: false,
            capacity: None,
            leaf_deltas: 3,
            flush_beside_writer: None,
        }
    }
}

impl Options {
    /// Registers an upsert function under a stable id.
    pub fn register_upsert(&mut self, id: UpsertId, f: UpsertFn) {
        self.upserts.register(id, f);
    }

    /// Registers the argument merge of upsert function `id` (see [`crate::MergeFn`]).
    pub fn register_merge(&mut self, id: UpsertId, f: crate::MergeFn) {
        self.upserts.register_merge(id, f);
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.node_bytes < 4096 || self.basement_bytes < 512 || self.fanout < 3 {
            return Err(Error::InvalidArgument(format!(
                "node_bytes must be >= 4096, basement_bytes >= 512, fanout >= 3 (got {}, {}, {})",
                self.node_bytes, self.basement_bytes, self.fanout
            )));
        }
        if self.cache_bytes < 4 * self.node_bytes {
            return Err(Error::InvalidArgument(format!(
                "cache_bytes ({}) must hold at least 4 nodes of {} bytes",
                self.cache_bytes, self.node_bytes
            )));
        }
        if self.log_bytes < 16 << 10
            || self.log_bytes > u32::MAX as u64
            || !self.log_bytes.is_multiple_of(crate::blockfile::ALIGN)
        {
            return Err(Error::InvalidArgument(format!(
                "log_bytes must be a multiple of 4096 from 16 KiB to 4 GiB (got {})",
                self.log_bytes
            )));
        }
        if self.leaf_deltas > crate::node::MAX_DELTAS_LIMIT {
            return Err(Error::InvalidArgument(format!(
                "leaf_deltas must be at most {} (got {})",
                crate::node::MAX_DELTAS_LIMIT,
                self.leaf_deltas
            )));
        }
        Ok(())
    }
}

/// The node cache (`Options::cache_bytes`) for a process whose whole memory is `budget` bytes —
/// what a cgroup limit counts: anonymous memory and the page cache of its writes. The cache
/// bounds everything node-sized the engine holds (design.md §2.5); the rest of the budget is
/// for what it does not count (log tail, batches, thread stacks, the program's own data: ~6 MiB;
/// a writer's cascade growing the nodes it holds; read and decode buffers), the pages the
/// allocator keeps after they are freed, and the page cache: a quarter of the budget, at least
/// 12 MiB. Measured on E1 quick under a 32 MiB cgroup limit (BENCHMARKS.md, "The engines inside
/// a memory cap equal to their budget"): a 24 MiB cache was OOM-killed, 20 MiB was not — and a
/// smaller one is no safer: with 16 MiB, more evictions meant more node reads and writes, more
/// transient buffers, and 3 OOM kills in 12 runs beside other tests where 20 MiB had none in 28.
/// Never less than four nodes of the default size (`Options::validate`'s floor).
pub fn cache_within_memory(budget: u64) -> u64 {
    let reserve = (budget / 4).max(12 << 20);
    let floor = 4 * Options::default().node_bytes as u64;
    budget.saturating_sub(reserve).max(floor)
}

/// What an open found and worked around (damage it did not refuse).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Header slots that are damaged or unusable while the other one serves (B6).
    pub header_notes: Vec<String>,
    /// Log records replayed after the checkpoint (sync marks not counted).
    pub records_replayed: u64,
    /// The damaged log record the log was cut at, with [`Options::cut_damaged_log`] only.
    pub log_cut: Option<wal::LogCut>,
    /// The record the log was cut at because the data extent it binds never became durable
    /// (a torn tail after a power cut, X7), if any.
    pub torn_extent_cut: Option<crate::ids::Lsn>,
}
