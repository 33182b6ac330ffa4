//! RocksDB (the reference LSM-tree) as a key-value engine: the default column family.
//!
//! NOT compiled in the session that wrote it (its C++ build takes ~10 minutes on 2 cores): written
//! against the `rocksdb` 0.25 crate API; build with `--features rocksdb`.
//!
//! Budget: of the caches' share (`EngineConfig::cache_bytes`), half to the LRU block cache (index
//! and filter blocks charged to it too), half to all memtables together (`db_write_buffer_size`, a
//! write buffer manager), with `write_buffer_size` a quarter of that so a flush can run while the
//! next memtable fills. Options recommended for bulk random inserts: `increase_parallelism`,
//! dynamic level bytes, 10-bit bloom filters, LZ4 (as fern-tree). Deferred durability writes the
//! WAL without sync and `sync` flushes the memtables and syncs the WAL. Upserts are native: an
//! associative merge operator adding u64 counters. Range delete is native: `DeleteRange` in a write
//! batch.

use std::path::Path;

use rocksdb::{
    BlockBasedOptions, Cache, DBCompressionType, MergeOperands, Options, WriteBatch, WriteOptions,
    DB,
};

use super::mib;
use crate::engine::{decode_counter, Batch, Durability, Engine, EngineConfig, OpenMode, System};
use crate::{BenchError, Result};

fn err(e: rocksdb::Error) -> BenchError {
    BenchError::engine("rocksdb", e)
}

fn add_u64(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut sum = decode_counter(existing);
    for op in operands.iter() {
        sum = sum.wrapping_add(decode_counter(Some(op)));
    }
    Some(sum.to_le_bytes().to_vec())
}

/// RocksDB engine under test.
pub struct RocksdbEngine {
    db: DB,
    write_opts: WriteOptions,
    cfg: EngineConfig,
    // Keeps the block cache alive as long as the database.
    _cache: Cache,
}

impl RocksdbEngine {
    /// Opens the database directory `dir/rocksdb`.
    pub fn open(dir: &Path, cfg: &EngineConfig, mode: OpenMode) -> Result<Self> {
        let path = dir.join("rocksdb");
        let budget = cfg.cache_bytes() as usize;
        let cache = Cache::new_lru_cache(budget / 2);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_bloom_filter(10.0, false);
        let mut opts = Options::default();
        opts.create_if_missing(mode == OpenMode::Create);
        opts.set_error_if_exists(mode == OpenMode::Create);
        opts.increase_parallelism(2);
        opts.set_max_background_jobs(2);
        opts.set_level_compaction_dynamic_level_bytes(true);
        opts.set_compression_type(DBCompressionType::Lz4);
        opts.set_db_write_buffer_size(budget / 2);
        opts.set_write_buffer_size(budget / 8);
        opts.set_bytes_per_sync(1 << 20);
        opts.set_merge_operator_associative("add_u64", add_u64);
        opts.set_block_based_table_factory(&table);
        let db = DB::open(&opts, &path).map_err(err)?;
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(cfg.durability == Durability::PerBatch);
        Ok(RocksdbEngine {
            db,
            write_opts,
            cfg: cfg.clone(),
            _cache: cache,
        })
    }

    fn write(&self, b: WriteBatch) -> Result<()> {
        self.db.write_opt(b, &self.write_opts).map_err(err)
    }
}

impl Engine for RocksdbEngine {
    fn name(&self) -> &'static str {
        System::Rocksdb.name()
    }

    fn describe(&self) -> String {
        format!(
            "block cache {} MiB + memtables {} MiB (write buffer manager), lz4, bloom 10 bits, \
             merge operator for upserts, DeleteRange, WAL {}",
            mib(self.cfg.cache_bytes() / 2),
            mib(self.cfg.cache_bytes() / 2),
            if self.cfg.durability == Durability::Deferred {
                "not synced per batch"
            } else {
                "synced per batch"
            }
        )
    }

    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut b = WriteBatch::default();
        for (k, v) in batch.iter() {
            b.put(k, v);
        }
        self.write(b)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_pinned(key).map_err(err)?.map(|v| v.to_vec()))
    }

    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let mut it = self.db.raw_iterator();
        it.seek_to_first();
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !visit(k, v) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(err)
    }

    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut b = WriteBatch::default();
        for (k, delta) in batch.iter() {
            b.merge(k, delta);
        }
        self.write(b)
    }

    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        let mut b = WriteBatch::default();
        b.delete_range(lo, hi);
        self.write(b)
    }

    fn sync(&mut self) -> Result<()> {
        self.db.flush().map_err(err)?;
        self.db.flush_wal(true).map_err(err)
    }

    fn close(mut self: Box<Self>) -> Result<()> {
        self.sync()?;
        Ok(())
    }
}
