//! SQLite (rusqlite, bundled) as a key-value engine: one `WITHOUT ROWID` table keyed by the key
//! blob, WAL mode, `synchronous=NORMAL` for deferred durability (FULL for per-batch).
//!
//! Budget: the caches' share of it (`EngineConfig::cache_bytes`) is the page cache (`cache_size`);
//! memory-mapped I/O stays off so the OS page cache is not used as a second, unbounded cache.
//! Upserts are read-modify-write (`INSERT ... ON CONFLICT DO UPDATE SET v = v + ?` cannot add to an
//! 8-byte LE blob, so we read, add and write inside the batch's transaction). Range delete is one
//! `DELETE ... WHERE k >= ? AND k < ?` statement. E9: one connection per thread
//! (`synchronous=FULL`, a busy timeout), each commit a `BEGIN IMMEDIATE` transaction; SQLite admits
//! one writer at a time, so the commits serialize.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::mib;
use crate::engine::{
    decode_counter, Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode,
    System,
};
use crate::{BenchError, Result};

fn err(e: rusqlite::Error) -> BenchError {
    BenchError::engine("sqlite", e)
}

/// SQLite engine under test.
pub struct SqliteEngine {
    conn: Connection,
    cfg: EngineConfig,
    path: PathBuf,
}

/// Inserts (or replaces) every row of `batch` in `tx` and commits it.
fn insert_and_commit(tx: rusqlite::Transaction<'_>, batch: &Batch) -> Result<()> {
    {
        let mut st = tx
            .prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")
            .map_err(err)?;
        for (k, v) in batch.iter() {
            st.execute(params![k, v]).map_err(err)?;
        }
    }
    tx.commit().map_err(err)
}

fn configure(conn: &Connection, cfg: &EngineConfig) -> Result<()> {
    let sync = match cfg.durability {
        Durability::Deferred => "NORMAL",
        Durability::PerBatch => "FULL",
    };
    // A negative cache_size is in KiB.
    let kib = cfg.cache_bytes() / 1024;
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA cache_size=-{kib}; \
         PRAGMA mmap_size=0; PRAGMA temp_store=MEMORY;"
    ))
    .map_err(err)
}

/// E9: opens one connection per committing thread.
struct SqliteCommitters {
    path: PathBuf,
    cfg: EngineConfig,
}

struct SqliteCommitter(Connection);

impl Committers for SqliteCommitters {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        let conn = Connection::open(&self.path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(60))
            .map_err(err)?;
        configure(&conn, &self.cfg)?;
        Ok(Box::new(SqliteCommitter(conn)))
    }
}

impl Committer for SqliteCommitter {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let tx = self
            .0
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        insert_and_commit(tx, batch)
    }
}

impl SqliteEngine {
    /// Opens `dir/kv.sqlite`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        let path = dir.join("kv.sqlite");
        if mode == OpenMode::Create && path.exists() {
            return Err(BenchError::Usage(format!("{} exists", path.display())));
        }
        let conn = Connection::open(&path).map_err(err)?;
        configure(&conn, cfg)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;",
        )
        .map_err(err)?;
        Ok(SqliteEngine {
            conn,
            cfg: cfg.clone(),
            path,
        })
    }
}

impl Engine for SqliteEngine {
    fn name(&self) -> &'static str {
        System::Sqlite.name()
    }

    fn describe(&self) -> String {
        format!(
            "WAL, synchronous={}, cache_size {} MiB, mmap off, WITHOUT ROWID table",
            if self.cfg.durability == Durability::Deferred {
                "NORMAL"
            } else {
                "FULL"
            },
            mib(self.cfg.cache_bytes())
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let tx = self.conn.transaction().map_err(err)?;
        insert_and_commit(tx, batch)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT v FROM kv WHERE k = ?1")
            .map_err(err)?;
        st.query_row(params![key], |r| r.get::<_, Vec<u8>>(0))
            .optional()
            .map_err(err)
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let mut st = self
            .conn
            .prepare_cached("SELECT k, v FROM kv ORDER BY k")
            .map_err(err)?;
        let mut rows = st.query([]).map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            let k = row
                .get_ref(0)
                .map_err(err)?
                .as_blob()
                .map_err(|e| err(e.into()))?;
            let v = row
                .get_ref(1)
                .map_err(err)?
                .as_blob()
                .map_err(|e| err(e.into()))?;
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut get = tx
                .prepare_cached("SELECT v FROM kv WHERE k = ?1")
                .map_err(err)?;
            let mut put = tx
                .prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")
                .map_err(err)?;
            for (k, delta) in batch.iter() {
                let old: Option<Vec<u8>> = get
                    .query_row(params![k], |r| r.get(0))
                    .optional()
                    .map_err(err)?;
                let new = decode_counter(old.as_deref()).wrapping_add(decode_counter(Some(delta)));
                put.execute(params![k, &new.to_le_bytes()[..]])
                    .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        self.conn
            .execute("DELETE FROM kv WHERE k >= ?1 AND k < ?2", params![lo, hi])
            .map_err(err)?;
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        // A checkpoint moves the WAL into the database file and fsyncs it: durable and
        // comparable to the other engines' checkpoints.
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(err)
    }

    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        Some(Arc::new(SqliteCommitters {
            path: self.path.clone(),
            cfg: self.cfg.clone(),
        }))
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.sync()?;
        self.conn.close().map_err(|(_, e)| err(e))
    }
}
