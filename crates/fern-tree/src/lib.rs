//! fern-tree: the write-optimized Bε-tree engine under fernfs.
//!
//! Layers, bottom up: [`device`] (all I/O), `alloc` (free space), `codec` (partition
//! compression and checksums), `blockfile` (headers, block translation table, copy-on-write
//! block writes, checkpoints), [`wal`] (the write-ahead log inside the image: record framing,
//! group commit, the recovery scan), then the tree itself; `env` ties them together (logged
//! write batches, durability, recovery, non-stalling checkpoints).
//! The on-disk format and the numbered invariants are specified in `docs/design.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod alloc;
mod basement;
pub mod blockfile;
mod buffer;
mod cache;
pub mod codec;
mod cursor;
pub mod device;
mod env;
mod error;
#[doc(hidden)]
pub mod fuzz;
mod ids;
mod msg;
mod node;
mod space;
mod stats;
mod tree;
mod varint;
pub mod wal;

pub use cache::CacheStats;
pub use codec::Compression;
pub use cursor::Cursor;
pub use env::{Durability, Env, Options, RecoveryReport, Tree, WriteBatch};
pub use error::{Error, Result};
pub use ids::{Lsn, Msn, NodeId, UpsertId};
pub use msg::{MergeFn, Op, UpsertFn, UpsertRegistry};
pub use space::{Admission, Space};
pub use stats::{Backlog, DeviceStats, Stats};
pub use tree::{DamagedNode, TreeReport};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 16 * 1024;
/// Longest value accepted, in bytes.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
