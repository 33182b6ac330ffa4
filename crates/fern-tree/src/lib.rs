//! fern-tree: the write-optimized Bε-tree engine under fernfs.
//!
//! Layers, bottom up: [`device`] (all I/O), `alloc` (free space), `codec` (partition
//! compression and checksums), `blockfile` (headers, block translation table, copy-on-write
//! block writes, checkpoints), then the tree itself.
//! The on-disk format and the numbered invariants are specified in `docs/design.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod alloc;
pub mod blockfile;
pub mod codec;
pub mod device;
mod error;
mod ids;

pub use error::{Error, Result};
pub use ids::{Lsn, Msn, NodeId, UpsertId};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 16 * 1024;
/// Longest value accepted, in bytes.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
