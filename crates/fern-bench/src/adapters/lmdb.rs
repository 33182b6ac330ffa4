//! LMDB through heed (mmap B+tree) as a key-value engine: one unnamed database of bytes.
//!
//! Budget: LMDB has no cache of its own; it reads and writes through the OS page cache of its
//! memory map, so `budget_bytes` cannot be applied inside the engine. Only a cgroup memory cap
//! (docs/workloads.md, rule 4 "One memory budget") bounds it like the others; without one its reads are served by
//! all the memory the machine has, and the report says so. The map size is set far above the
//! data (it is address space, not memory). Deferred durability opens the environment with
//! `NO_SYNC` (commits are written, not fsynced) and `sync` calls `mdb_env_sync(force)`.
//! Upserts are read-modify-write in the batch's write transaction. Range delete is heed's
//! `delete_range` (a cursor walk deleting every key of the range) in one transaction.
//! E9: every thread commits through a clone of the environment (opened without `NO_SYNC`, so
//! each commit is fsynced); LMDB admits one write transaction at a time, so commits serialize.
#![allow(unsafe_code)]

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, RoTxn, WithoutTls};

use crate::engine::{
    decode_counter, Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode,
    System,
};
use crate::{BenchError, Result};

/// Address space reserved for the map: 1 TiB, far above any workload here.
const MAP_SIZE: usize = 1 << 40;

fn err(e: heed::Error) -> BenchError {
    BenchError::engine("lmdb", e)
}

type Db = Database<'static, Bytes, Bytes>;

/// LMDB engine under test.
pub struct LmdbEngine {
    env: Env<WithoutTls>,
    db: Db,
    cfg: EngineConfig,
    // A read transaction kept across point lookups and scans; dropped by every write.
    reader: Option<RoTxn<'static, WithoutTls>>,
}

impl LmdbEngine {
    /// Opens the environment in `dir`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        if mode == OpenMode::Create && dir.join("data.mdb").exists() {
            return Err(BenchError::Usage(format!(
                "{}/data.mdb exists",
                dir.display()
            )));
        }
        let mut opts = EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(MAP_SIZE).max_dbs(1);
        if cfg.durability == Durability::Deferred {
            // SAFETY: NO_SYNC only weakens durability after a crash of the machine; nothing
            // here relies on it (the harness calls `force_sync` before any durability claim),
            // and no other process opens this environment.
            unsafe { opts.flags(EnvFlags::NO_SYNC) };
        }
        // SAFETY: the environment directory is private to this task and opened once in this
        // process, which is what heed requires of `open` (no double mapping of one file).
        let env = unsafe { opts.open(dir) }.map_err(err)?;
        let wtxn = env.write_txn().map_err(err)?;
        let db = env
            .create_databases_and_commit(wtxn, |opener, wtxn| {
                opener
                    .create_database::<Bytes, Bytes>(wtxn, None)
                    .map(CommitOrAbort::<_, ()>::Commit)
            })
            .map_err(err)?
            .unwrap_commit();
        Ok(LmdbEngine {
            env,
            db,
            cfg: cfg.clone(),
            reader: None,
        })
    }

    fn reader(&mut self) -> Result<&RoTxn<'static, WithoutTls>> {
        if self.reader.is_none() {
            self.reader = Some(self.env.clone().static_read_txn().map_err(err)?);
        }
        Ok(self.reader.as_ref().expect("just set"))
    }
}

/// E9: a clone of the environment and the database handle.
#[derive(Clone)]
struct LmdbCommitter {
    env: Env<WithoutTls>,
    db: Db,
}

impl Committers for LmdbCommitter {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        Ok(Box::new(self.clone()))
    }
}

impl Committer for LmdbCommitter {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let mut w = self.env.write_txn().map_err(err)?;
        for (k, v) in batch.iter() {
            self.db.put(&mut w, k, v).map_err(err)?;
        }
        w.commit().map_err(err)
    }
}

impl Engine for LmdbEngine {
    fn name(&self) -> &'static str {
        System::Lmdb.name()
    }

    fn describe(&self) -> String {
        format!(
            "mmap: no cache of its own, memory bounded only by a cgroup cap (budget {} MiB not \
             applicable); map 1 TiB; {}",
            super::mib(self.cfg.budget_bytes),
            if self.cfg.durability == Durability::Deferred {
                "NO_SYNC, force_sync at sync"
            } else {
                "sync per commit"
            }
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        self.reader = None;
        let mut w = self.env.write_txn().map_err(err)?;
        for (k, v) in batch.iter() {
            self.db.put(&mut w, k, v).map_err(err)?;
        }
        w.commit().map_err(err)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let db = self.db;
        let r = self.reader()?;
        Ok(db.get(r, key).map_err(err)?.map(|v| v.to_vec()))
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let db = self.db;
        let r = self.reader()?;
        for item in db.iter(r).map_err(err)? {
            let (k, v) = item.map_err(err)?;
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        self.reader = None;
        let mut w = self.env.write_txn().map_err(err)?;
        for (k, delta) in batch.iter() {
            let old = decode_counter(self.db.get(&w, k).map_err(err)?);
            let new = old.wrapping_add(decode_counter(Some(delta)));
            self.db.put(&mut w, k, &new.to_le_bytes()).map_err(err)?;
        }
        w.commit().map_err(err)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        self.reader = None;
        let mut w = self.env.write_txn().map_err(err)?;
        let range = (Bound::Included(lo), Bound::Excluded(hi));
        self.db.delete_range(&mut w, &range).map_err(err)?;
        w.commit().map_err(err)
    }

    fn sync(&mut self) -> Result<()> {
        self.env.force_sync().map_err(err)
    }

    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        self.reader = None;
        Some(Arc::new(LmdbCommitter {
            env: self.env.clone(),
            db: self.db,
        }))
    }

    fn close(self: Box<Self>) -> Result<()> {
        let LmdbEngine { env, reader, .. } = *self;
        // The read transaction holds a clone of the environment: drop it first, or the
        // closing event below would wait forever.
        drop(reader);
        env.force_sync().map_err(err)?;
        env.prepare_for_closing().wait();
        Ok(())
    }
}
