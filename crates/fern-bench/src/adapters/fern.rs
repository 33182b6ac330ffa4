//! fern-tree, the engine of this project, behind the harness's [`Engine`] trait.
//!
//! Budget: the budget is the process's whole memory; the node cache (`Options::cache_bytes`, a
//! hard bound on everything node-sized the engine holds) is sized inside it by
//! `EngineConfig::cache_bytes`, the rule for every engine (three quarters of it, leaving at
//! least 12 MiB). The log
//! region is four budgets (at least the default 256 MiB): a checkpoint runs every quarter of
//! it and writes every dirty node, up to a whole cache, so a region of 256 MiB under a 256 MiB
//! cache rewrote up to four bytes of nodes per logged byte (docs/design.md §2.6). The region is
//! sparse and returned to the file system behind each checkpoint (W9): it is disk, not memory.
//! Compression: the engine's default (`Compression::DEFAULT`, lz4 — RocksDB and fjall get LZ4
//! too), named in the description. The file system's images use zstd-1 instead
//! (`Compression::FILE_SYSTEM`; docs/design.md §6).
//! Upserts are native (a registered "add u64" function; no read at write time) and range
//! delete is native (one message). `sync` is a checkpoint. Per-batch durability (E9) commits
//! with `Durability::Sync`: the batch's log record is fsynced before the call returns, and
//! concurrent commits share the fsync (group commit).

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fern_tree::{
    Compression, Durability as FernDurability, Env, Options, Tree, UpsertId, WriteBatch,
};

use super::mib;
use crate::engine::{
    decode_counter, Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode,
    System,
};
use crate::{BenchError, Result};

/// The upsert id of "add a u64 delta to an 8-byte little-endian counter".
pub const ADD_U64: UpsertId = UpsertId(1);

fn err(e: fern_tree::Error) -> BenchError {
    BenchError::engine("fern-tree", e)
}

/// fern-tree engine under test.
pub struct FernEngine {
    env: Env,
    tree: Tree,
    cfg: EngineConfig,
}

fn add_u64(_key: &[u8], old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let sum = decode_counter(old).wrapping_add(decode_counter(Some(arg)));
    Some(sum.to_le_bytes().to_vec())
}

/// The log region for a cache of `budget` bytes (see the module comment).
fn log_bytes_for(budget: u64) -> u64 {
    let default = Options::default().log_bytes;
    // The region's length is a u32 in the block table: stay well below 4 GiB.
    (budget.saturating_mul(4) >> 20 << 20).clamp(default, 2 << 30)
}

impl FernEngine {
    /// Opens the single-file image `dir/fern.img`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        let path = dir.join("fern.img");
        let mut opts = Options {
            cache_bytes: cfg.cache_bytes() as usize,
            log_bytes: log_bytes_for(cfg.budget_bytes),
            durability: match cfg.durability {
                Durability::Deferred => FernDurability::Buffered,
                Durability::PerBatch => FernDurability::Sync,
            },
            ..Options::default()
        };
        opts.register_upsert(ADD_U64, Arc::new(add_u64));
        // Counter adds merge (like RocksDB's merge operands): buffered runs of adds to one key
        // become one message.
        opts.register_merge(
            ADD_U64,
            Arc::new(|a: &[u8], b: &[u8]| {
                let sum = decode_counter(Some(a)).wrapping_add(decode_counter(Some(b)));
                Some(sum.to_le_bytes().to_vec())
            }),
        );
        let env = match mode {
            OpenMode::Create => Env::create(&path, opts),
            OpenMode::Reopen => Env::open(&path, opts),
        }
        .map_err(err)?;
        let tree = env.tree("kv").map_err(err)?;
        Ok(FernEngine {
            env,
            tree,
            cfg: cfg.clone(),
        })
    }

    fn write(&mut self, b: WriteBatch) -> Result<()> {
        // `Options::durability` (set from the config) makes this a `Sync` commit for PerBatch.
        self.env.write(b).map_err(err)
    }
}

/// E9: clones of the environment and tree handles, one per thread; every commit is
/// `write_with(batch, Durability::Sync)`.
#[derive(Clone)]
struct FernCommitter {
    env: Env,
    tree: Tree,
}

impl Committers for FernCommitter {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        Ok(Box::new(self.clone()))
    }
}

impl Committer for FernCommitter {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let mut b = WriteBatch::new();
        for (k, v) in batch.iter() {
            b.insert(&self.tree, k, v);
        }
        self.env.write_with(b, FernDurability::Sync).map_err(err)
    }
}

impl Engine for FernEngine {
    fn name(&self) -> &'static str {
        System::FernTree.name()
    }

    fn describe(&self) -> String {
        format!(
            "node cache {} MiB of the {} MiB budget, {}, native upserts and range delete{}",
            mib(self.cfg.cache_bytes()),
            mib(self.cfg.budget_bytes),
            Compression::DEFAULT,
            if self.cfg.durability == Durability::PerBatch {
                ", Durability::Sync commits (group commit)"
            } else {
                ""
            }
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut b = WriteBatch::new();
        for (k, v) in batch.iter() {
            b.insert(&self.tree, k, v);
        }
        self.write(b)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.tree.get(key).map_err(err)
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        self.tree
            .scan(Bound::Unbounded, Bound::Unbounded, |k: &[u8], v: &[u8]| {
                visit(k, v)
            })
            .map_err(err)?;
        Ok(())
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut b = WriteBatch::new();
        for (k, delta) in batch.iter() {
            b.upsert(&self.tree, k, ADD_U64, delta);
        }
        self.write(b)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        self.tree.delete_range(lo, hi).map_err(err)
    }

    fn sync(&mut self) -> Result<()> {
        self.env.checkpoint().map_err(err)
    }

    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        Some(Arc::new(FernCommitter {
            env: self.env.clone(),
            tree: self.tree.clone(),
        }))
    }

    fn close(self: Box<Self>) -> Result<()> {
        let FernEngine { env, tree, .. } = *self;
        drop(tree);
        env.close().map_err(err)
    }
}
