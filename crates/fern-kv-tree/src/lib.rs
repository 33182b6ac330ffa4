//! fern-kv-tree: the [`fern_kv::KvStore`] backend on the fern-tree Bε-tree engine.
//!
//! One [`TreeStore`] owns one fern-tree [`fern_tree::Env`]. The mapping:
//!
//! * `tree(name)` → `Env::tree(name)` (created on first use, persisted in the engine catalog);
//!   the [`fern_kv::TreeId`] is this store's index of the handle.
//! * `write(batch)` → one `fern_tree::WriteBatch` applied by `Env::write`: atomic across trees,
//!   in order. Puts, deletes, upserts and range deletes become engine messages one to one;
//!   upserts and range deletes are never emulated by reads.
//! * Upsert functions: every function of the [`fern_kv::UpdateRegistry`] is registered with the
//!   engine under the same `u32` id (the two function types are identical), before the image
//!   is opened, so buffered upsert messages on disk always find their function.
//! * Scans → engine scans (forward) and cursors (reverse), stopping at the limit.
//! * Transactions → optimistic, validated by [`fern_kv::occ::ConflictTracker`]; the engine
//!   keeps no per-key versions. See [`store`](crate::TreeStore) for the locking argument.
//! * `sync` and sync writes → engine durability (a checkpoint until the write-ahead log lands).
//! * Errors → [`map_error`]; corruption and no-space keep their class and the engine error.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod memory;
mod store;

pub use error::{engine_error, is_corrupt, is_no_space, map_error};
pub use memory::FsMemory;
pub use store::{TreeStore, ENGINE_LIMITS};
