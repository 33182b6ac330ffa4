//! fern-tree: the write-optimized Bε-tree engine under fernfs.
//!
//! Layers, bottom up: [`device`] (all I/O), `alloc` (free space), `codec` (partition
//! compression and checksums), `blockfile` (headers, block translation table, copy-on-write
//! block writes, checkpoints), [`wal`] (the write-ahead log inside the image: record framing,
//! group commit, the recovery scan), then the tree itself; `env` ties them together (logged
//! write batches, durability, recovery, non-stalling checkpoints); [`extent`] stores large
//! values once, outside the tree, as data extents the log names by place and checksum.
//! The on-disk format and the numbered invariants are specified in `docs/design.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod admission;
pub mod alloc;
mod basement;
mod betree;
pub mod blockfile;
mod buffer;
mod cache;
mod catalog;
mod checkpoint;
pub mod codec;
mod cursor;
pub mod device;
mod drain;
mod env;
mod error;
pub mod extent;
mod filter;
#[doc(hidden)]
pub mod fuzz;
mod ids;
mod keycmp;
mod msg;
mod node;
mod options;
mod space;
mod stats;
mod tree;
mod varint;
pub mod wal;
mod writeback;

pub use betree::{DamagedNode, TreeReport};
pub use cache::CacheStats;
pub use codec::Compression;
pub use cursor::Cursor;
pub use env::Env;
pub use error::{Error, Result};
pub use extent::{ExtentRef, EXTENT_REF_LEN, MAX_EXTENT_LEN};
pub use ids::{Lsn, Msn, NodeId, UpsertId};
pub use msg::{MergeFn, Op, UpsertFn, UpsertRegistry};
pub use options::{cache_within_memory, Durability, Options, RecoveryReport};
pub use space::{Admission, Space};
pub use stats::{Backlog, DeviceStats, Stats, WorkStats};
pub use tree::{Tree, WriteBatch};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 16 * 1024;
/// Longest value accepted, in bytes.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
