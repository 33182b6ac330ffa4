//! The narrow interface every engine under test is driven through, and the list of systems.
//!
//! The trait holds only what the workloads need, so that an adapter stays a thin translation
//! onto the engine's own recommended API. What an engine lacks natively (upserts, range delete)
//! the adapter emulates the way an application would, and its module comment says how.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::{BenchError, Result};

/// A batch of key/value pairs in one flat buffer, reused across batches so that generating the
/// workload costs every engine the same and allocates nothing per key.
#[derive(Default, Debug, Clone)]
pub struct Batch {
    buf: Vec<u8>,
    // (offset of the key in `buf`, key length, value length); the value follows the key.
    entries: Vec<(usize, u32, u32)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the batch, keeping its memory.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.entries.clear();
    }

    /// Appends one pair.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        let off = self.buf.len();
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(value);
        self.entries
            .push((off, key.len() as u32, value.len() as u32));
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the batch holds no pair.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The pairs in the order they were pushed.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.entries.iter().map(move |&(off, kl, vl)| {
            let k_end = off + kl as usize;
            (&self.buf[off..k_end], &self.buf[k_end..k_end + vl as usize])
        })
    }
}

/// When a write becomes durable. Workloads E1–E7 use [`Durability::Deferred`] (no fsync per
/// batch; [`Engine::sync`] at the end); E9 uses [`Durability::PerBatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Each batch is written but not synced; `sync` makes everything durable.
    Deferred,
    /// Each batch is durable when `insert_batch` returns.
    PerBatch,
}

/// How every engine is configured: the same memory budget for all.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// Memory budget in bytes: the whole task process's (docs/workloads.md rule 4); the
    /// engine's caches and write buffers take [`EngineConfig::cache_bytes`] of it.
    pub budget_bytes: u64,
    /// When writes become durable.
    pub durability: Durability,
}

impl EngineConfig {
    /// What an engine's own caches and write buffers (node, page or block cache, memtables)
    /// may take of the budget: the rest is for what no engine counts — allocator slack, the
    /// page cache, the program — so that a process fits a cgroup limit equal to its budget.
    /// One rule for every engine, fern-tree's (`fern_tree::cache_within_memory`: three
    /// quarters, at least 12 MiB left).
    pub fn cache_bytes(&self) -> u64 {
        fern_tree::cache_within_memory(self.budget_bytes)
    }
}

/// Whether to make a fresh database or open the one a previous engine closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// A new, empty database in an empty directory.
    Create,
    /// The database previously created in the same directory.
    Reopen,
}

/// A key-value engine under test. One instance is used by one thread.
///
/// Counters for [`Engine::upsert_add_batch`] are 8-byte little-endian `u64`; an absent key
/// counts as 0.
pub trait Engine {
    /// The system name used in reports (`fern-tree`, `redb`, ...).
    fn name(&self) -> &'static str;
    /// One line naming the options that matter (cache sizes, compression, sync mode).
    fn describe(&self) -> String;
    /// Inserts (or overwrites) every pair of the batch in one write transaction.
    fn insert_batch(&mut self, batch: &Batch) -> Result<()>;
    /// Point lookup.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Visits every row in ascending key order until `visit` returns false.
    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()>;
    /// For every pair (key, 8-byte LE delta): counter[key] += delta, in order, as one
    /// transaction. Engines without native upserts read-modify-write.
    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()>;
    /// Deletes every key in `[lo, hi)`.
    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()>;
    /// Makes everything written so far durable (checkpoint, flush, fsync).
    fn sync(&mut self) -> Result<()>;
    /// Syncs and releases the database.
    fn close(self: Box<Self>) -> Result<()>;
    /// A handle through which many threads commit to this database at once (E9), or `None`
    /// when the engine cannot (E9 then skips it with a note). The engine is opened with
    /// [`Durability::PerBatch`] for E9; every handle must be dropped before [`Engine::close`].
    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        None
    }
}

/// The concurrent side of an engine (E9): each thread takes its own [`Committer`] (a clone of
/// the engine's handle, or its own connection where the engine wants one per thread).
pub trait Committers: Send + Sync {
    /// A committer for the calling thread.
    fn committer(&self) -> Result<Box<dyn Committer>>;
}

/// Commits small batches durably from one thread.
pub trait Committer: Send {
    /// Inserts every pair of the batch in one transaction that is durable (on stable storage)
    /// when this returns. Concurrent commits may share an fsync (group commit).
    fn commit(&mut self, batch: &Batch) -> Result<()>;
}

/// The systems the harness knows, whether or not this build includes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum System {
    /// fern-tree, the engine of this project.
    FernTree,
    /// redb, a copy-on-write B-tree.
    Redb,
    /// LMDB through heed, an mmap B+tree.
    Lmdb,
    /// SQLite in WAL mode (rusqlite, bundled).
    Sqlite,
    /// fjall, an LSM-tree in Rust.
    Fjall,
    /// RocksDB, the reference LSM-tree.
    Rocksdb,
}

impl System {
    /// Every system, in report order.
    pub const ALL: [System; 6] = [
        System::FernTree,
        System::Rocksdb,
        System::Redb,
        System::Lmdb,
        System::Sqlite,
        System::Fjall,
    ];

    /// Name used on the command line and in reports (docs/workloads.md "Reporting").
    pub fn name(self) -> &'static str {
        match self {
            System::FernTree => "fern-tree",
            System::Redb => "redb",
            System::Lmdb => "lmdb",
            System::Sqlite => "sqlite",
            System::Fjall => "fjall",
            System::Rocksdb => "rocksdb",
        }
    }

    /// The cargo feature of fern-bench (and of fernfs) that builds this system's adapter.
    pub fn feature(self) -> Option<&'static str> {
        match self {
            System::FernTree => None,
            other => Some(other.name()),
        }
    }

    /// Whether this build includes the adapter.
    pub fn is_compiled(self) -> bool {
        match self {
            System::FernTree => true,
            System::Redb => cfg!(feature = "redb"),
            System::Lmdb => cfg!(feature = "lmdb"),
            System::Sqlite => cfg!(feature = "sqlite"),
            System::Fjall => cfg!(feature = "fjall"),
            System::Rocksdb => cfg!(feature = "rocksdb"),
        }
    }

    /// The systems this build includes, in report order.
    pub fn compiled() -> Vec<System> {
        Self::ALL.into_iter().filter(|s| s.is_compiled()).collect()
    }

    /// Parses a system name; an error says which feature a missing adapter needs.
    pub fn parse(name: &str) -> Result<System> {
        let sys = Self::ALL
            .into_iter()
            .find(|s| s.name() == name.trim())
            .ok_or_else(|| {
                let known: Vec<_> = Self::ALL.iter().map(|s| s.name()).collect();
                BenchError::Usage(format!(
                    "unknown system {name:?}; known: {}",
                    known.join(", ")
                ))
            })?;
        if !sys.is_compiled() {
            return Err(BenchError::Usage(format!(
                "{} is not in this build: build with `--features {}`",
                sys.name(),
                sys.feature().unwrap_or("")
            )));
        }
        Ok(sys)
    }

    /// Opens this system's engine in `dir` (one directory per database).
    pub fn open(self, dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Box<dyn Engine>> {
        crate::adapters::open(self, dir, cfg, mode)
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes an 8-byte little-endian counter; anything else (absent, wrong length) counts as 0.
pub(crate) fn decode_counter(v: Option<&[u8]>) -> u64 {
    match v {
        Some(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        _ => 0,
    }
}
