//! fjall (LSM-tree in Rust) as a key-value engine: one keyspace.
//!
//! Budget: of the caches' share (`EngineConfig::cache_bytes`), three quarters to the block cache
//! (`Database::builder().cache_size`), one quarter to the memtable (`max_memtable_size`); LZ4 data blocks (fjall's default). Deferred durability
//! commits batches without persisting (the journal is buffered) and `sync` persists with
//! `PersistMode::SyncAll`. Upserts are read-modify-write per batch: each key is read once
//! (pending deltas of the same batch are folded in memory, which is what a transaction that
//! reads its own writes would see) and the new values are written in one batch. Range delete:
//! fjall has none, so the keys of the range are removed in batches of 1000 while iterating.
//! E9: every thread commits batches through clones of the database and keyspace handles, each
//! batch persisted with `PersistMode::SyncAll` before the commit returns.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use super::mib;
use crate::engine::{
    decode_counter, Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode,
    System,
};
use crate::{BenchError, Result};

fn err(e: fjall::Error) -> BenchError {
    BenchError::engine("fjall", e)
}

/// fjall engine under test.
pub struct FjallEngine {
    db: Database,
    ks: Keyspace,
    cfg: EngineConfig,
}

impl FjallEngine {
    /// Opens the database directory `dir/fjall`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        let path = dir.join("fjall");
        if mode == OpenMode::Create && path.exists() {
            return Err(BenchError::Usage(format!("{} exists", path.display())));
        }
        let db = Database::builder(&path)
            .cache_size(cfg.cache_bytes() / 4 * 3)
            .open()
            .map_err(err)?;
        let memtable = (cfg.cache_bytes() / 4).max(1 << 20);
        let ks = db
            .keyspace("kv", || {
                KeyspaceCreateOptions::default().max_memtable_size(memtable)
            })
            .map_err(err)?;
        Ok(FjallEngine {
            db,
            ks,
            cfg: cfg.clone(),
        })
    }

    fn commit(&self, b: fjall::OwnedWriteBatch) -> Result<()> {
        let mode = match self.cfg.durability {
            Durability::Deferred => None,
            Durability::PerBatch => Some(PersistMode::SyncAll),
        };
        b.durability(mode).commit().map_err(err)
    }
}

/// E9: clones of the database and keyspace handles.
#[derive(Clone)]
struct FjallCommitter {
    db: Database,
    ks: Keyspace,
}

impl Committers for FjallCommitter {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        Ok(Box::new(self.clone()))
    }
}

impl Committer for FjallCommitter {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let mut b = self.db.batch();
        for (k, v) in batch.iter() {
            b.insert(&self.ks, k, v);
        }
        b.durability(Some(PersistMode::SyncAll))
            .commit()
            .map_err(err)
    }
}

impl Engine for FjallEngine {
    fn name(&self) -> &'static str {
        System::Fjall.name()
    }

    fn describe(&self) -> String {
        format!(
            "block cache {} MiB + memtable {} MiB, lz4, {}",
            mib(self.cfg.cache_bytes() / 4 * 3),
            mib(self.cfg.cache_bytes() / 4),
            if self.cfg.durability == Durability::Deferred {
                "batches not persisted, SyncAll at sync"
            } else {
                "SyncAll per batch"
            }
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut b = self.db.batch();
        for (k, v) in batch.iter() {
            b.insert(&self.ks, k, v);
        }
        self.commit(b)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.ks.get(key).map_err(err)?.map(|v| v.to_vec()))
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        for guard in self.ks.iter() {
            let (k, v) = guard.into_inner().map_err(err)?;
            if !visit(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut pending: HashMap<&[u8], u64> = HashMap::with_capacity(batch.len());
        for (k, delta) in batch.iter() {
            let old = match pending.get(k) {
                Some(v) => *v,
                None => decode_counter(self.ks.get(k).map_err(err)?.as_deref()),
            };
            pending.insert(k, old.wrapping_add(decode_counter(Some(delta))));
        }
        let mut b = self.db.batch();
        for (k, v) in pending {
            b.insert(&self.ks, k, v.to_le_bytes());
        }
        self.commit(b)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        let mut b = self.db.batch();
        for guard in self.ks.range(lo..hi) {
            let k = guard.key().map_err(err)?;
            b.remove(&self.ks, k);
            if b.len() >= 1000 {
                let full = std::mem::replace(&mut b, self.db.batch());
                self.commit(full)?;
            }
        }
        self.commit(b)
    }

    fn sync(&mut self) -> Result<()> {
        self.db.persist(PersistMode::SyncAll).map_err(err)
    }

    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        Some(Arc::new(FjallCommitter {
            db: self.db.clone(),
            ks: self.ks.clone(),
        }))
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.sync()?;
        Ok(())
    }
}
