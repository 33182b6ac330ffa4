//! redb (copy-on-write B-tree) as a key-value engine: one `&[u8] -> &[u8]` table.
//!
//! Budget: the caches' share of it (`EngineConfig::cache_bytes`) is redb's page cache
//! (`Builder::set_cache_size`). Deferred durability commits each batch with `Durability::None` and
//! makes it durable with one `Durability::Immediate` commit at `sync`, as redb recommends for bulk
//! loads. Upserts are read-modify-write in the batch's write transaction (reads see its own
//! writes). Range delete is redb's `retain_in(lo..hi, |_, _| false)` in one transaction. E9: every
//! thread commits through a shared `Arc<Database>` with `Durability::Immediate`; redb runs one
//! write transaction at a time, so concurrent commits serialize (each pays its own fsync).

use std::path::Path;
use std::sync::Arc;

use redb::{
    Database, Durability as RedbDurability, ReadableDatabase, ReadableTable, TableDefinition,
};

use super::mib;
use crate::engine::{
    decode_counter, Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode,
    System,
};
use crate::{BenchError, Result};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

fn err(e: impl Into<redb::Error>) -> BenchError {
    BenchError::engine("redb", e.into())
}

/// redb engine under test.
pub struct RedbEngine {
    db: Arc<Database>,
    cfg: EngineConfig,
    // A read transaction kept across point lookups; dropped by every write.
    reader: Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>,
}

impl RedbEngine {
    /// Opens `dir/kv.redb`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        let path = dir.join("kv.redb");
        if mode == OpenMode::Create && path.exists() {
            return Err(BenchError::Usage(format!("{} exists", path.display())));
        }
        let db = Database::builder()
            .set_cache_size(cfg.cache_bytes() as usize)
            .create(&path)
            .map_err(err)?;
        let w = db.begin_write().map_err(err)?;
        w.open_table(TABLE).map_err(err)?;
        w.commit().map_err(err)?;
        Ok(RedbEngine {
            db: Arc::new(db),
            cfg: cfg.clone(),
            reader: None,
        })
    }

    fn write_txn(&mut self) -> Result<redb::WriteTransaction> {
        self.reader = None;
        let mut w = self.db.begin_write().map_err(err)?;
        let d = match self.cfg.durability {
            Durability::Deferred => RedbDurability::None,
            Durability::PerBatch => RedbDurability::Immediate,
        };
        w.set_durability(d).map_err(err)?;
        Ok(w)
    }

    fn reader(&mut self) -> Result<&redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
        if self.reader.is_none() {
            let r = self.db.begin_read().map_err(err)?;
            self.reader = Some(r.open_table(TABLE).map_err(err)?);
        }
        Ok(self.reader.as_ref().expect("just set"))
    }
}

/// E9: a shared handle; each commit is its own `Durability::Immediate` write transaction.
#[derive(Clone)]
struct RedbCommitter(Arc<Database>);

impl Committers for RedbCommitter {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        Ok(Box::new(self.clone()))
    }
}

impl Committer for RedbCommitter {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let mut w = self.0.begin_write().map_err(err)?;
        w.set_durability(RedbDurability::Immediate).map_err(err)?;
        {
            let mut t = w.open_table(TABLE).map_err(err)?;
            for (k, v) in batch.iter() {
                t.insert(k, v).map_err(err)?;
            }
        }
        w.commit().map_err(err)
    }
}

impl Engine for RedbEngine {
    fn name(&self) -> &'static str {
        System::Redb.name()
    }

    fn describe(&self) -> String {
        format!(
            "cache {} MiB, batches committed with Durability::{}",
            mib(self.cfg.cache_bytes()),
            if self.cfg.durability == Durability::Deferred {
                "None (Immediate at sync)"
            } else {
                "Immediate"
            }
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let w = self.write_txn()?;
        {
            let mut t = w.open_table(TABLE).map_err(err)?;
            for (k, v) in batch.iter() {
                t.insert(k, v).map_err(err)?;
            }
        }
        w.commit().map_err(err)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let t = self.reader()?;
        Ok(t.get(key).map_err(err)?.map(|g| g.value().to_vec()))
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let t = self.reader()?;
        for item in t.iter().map_err(err)? {
            let (k, v) = item.map_err(err)?;
            if !visit(k.value(), v.value()) {
                break;
            }
        }
        Ok(())
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let w = self.write_txn()?;
        {
            let mut t = w.open_table(TABLE).map_err(err)?;
            for (k, delta) in batch.iter() {
                let old = decode_counter(t.get(k).map_err(err)?.as_ref().map(|g| g.value()));
                let new = old.wrapping_add(decode_counter(Some(delta)));
                t.insert(k, &new.to_le_bytes()[..]).map_err(err)?;
            }
        }
        w.commit().map_err(err)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        let w = self.write_txn()?;
        {
            let mut t = w.open_table(TABLE).map_err(err)?;
            t.retain_in::<&[u8], _>(lo..hi, |_, _| false).map_err(err)?;
        }
        w.commit().map_err(err)
    }

    fn sync(&mut self) -> Result<()> {
        let mut w = self.db.begin_write().map_err(err)?;
        self.reader = None;
        w.set_durability(RedbDurability::Immediate).map_err(err)?;
        w.commit().map_err(err)
    }

    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        self.reader = None;
        Some(Arc::new(RedbCommitter(self.db.clone())))
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.sync()?;
        self.reader = None;
        drop(self.db);
        Ok(())
    }
}
