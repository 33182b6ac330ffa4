//! One thin adapter per engine. fern-tree is always built; each peer is behind the cargo
//! feature of its name, so default builds (and CI) never compile a peer engine.
//!
//! Every adapter gets the same memory budget ([`EngineConfig::budget_bytes`]) and otherwise
//! the engine's own recommended options for bulk random inserts; its module comment says how
//! the budget is split and what it emulates (upserts, range delete).

use std::path::Path;

use crate::engine::{Engine, EngineConfig, OpenMode, System};
use crate::{BenchError, Result};

pub mod fern;
#[cfg(feature = "fjall")]
pub mod fjall;
#[cfg(feature = "lmdb")]
pub mod lmdb;
#[cfg(feature = "redb")]
pub mod redb;
#[cfg(feature = "rocksdb")]
pub mod rocksdb;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// Opens `system` in `dir`.
pub fn open(
    system: System,
    dir: &Path,
    cfg: &EngineConfig,
    mode: OpenMode,
) -> Result<Box<dyn Engine>> {
    std::fs::create_dir_all(dir)?;
    match system {
        System::FernTree => Ok(Box::new(fern::FernEngine::open(dir, cfg, mode)?)),
        #[cfg(feature = "redb")]
        System::Redb => Ok(Box::new(redb::RedbEngine::open(dir, cfg, mode)?)),
        #[cfg(feature = "lmdb")]
        System::Lmdb => Ok(Box::new(lmdb::LmdbEngine::open(dir, cfg, mode)?)),
        #[cfg(feature = "sqlite")]
        System::Sqlite => Ok(Box::new(sqlite::SqliteEngine::open(dir, cfg, mode)?)),
        #[cfg(feature = "fjall")]
        System::Fjall => Ok(Box::new(fjall::FjallEngine::open(dir, cfg, mode)?)),
        #[cfg(feature = "rocksdb")]
        System::Rocksdb => Ok(Box::new(rocksdb::RocksdbEngine::open(dir, cfg, mode)?)),
        #[allow(unreachable_patterns)]
        other => Err(BenchError::Usage(format!(
            "{} is not in this build: build with `--features {}`",
            other.name(),
            other.feature().unwrap_or("")
        ))),
    }
}

/// MiB, for option summaries.
pub(crate) fn mib(bytes: u64) -> u64 {
    bytes >> 20
}
