//! fern-kv: the narrow storage interface that the fernfs file-system core is written against.
//!
//! This crate owns the [`KvStore`] / [`KvTxn`] traits, the write-batch and upsert vocabulary,
//! the bounded retry helper for optimistic transactions, the in-memory reference backend
//! ([`mem::MemStore`], the test oracle) and the [`conformance`] suite every backend must pass.
//!
//! It also owns key guards ([`KeyGuard`]), the delegation protocol of a shared store
//! ([`Delegations`], docs/design.md §7) and write-back under a delegation of the whole store
//! ([`WriteBack`], §7.3), written against the traits only.
//!
//! It must never depend on a backend (fern-tree, etcd, ...): backends depend on it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod batch;
pub mod conformance;
mod deleg;
mod error;
mod extent;
pub mod faults;
mod guard;
pub mod mem;
pub mod occ;
mod retry;
mod store;
mod types;
mod writeback;

pub use batch::{Op, WriteBatch};
pub use deleg::{Delegations, Grant};
pub use error::{KvError, KvResult};
pub use extent::{ExtentRef, EXTENT_REF_LEN};
pub use guard::KeyGuard;
pub use retry::{transact, transact_opts, Backoff, RetryPolicy, Retryable};
pub use store::{KvRead, KvSession, KvStore, KvTxn, ReadAhead};
pub use types::{
    prefix_successor, Direction, KeyRange, Limits, MergeFn, StoreSpace, TreeId, UpdateFn,
    UpdateFnId, UpdateRegistry, WriteOptions,
};
pub use writeback::{
    TakePolicy, WriteBack, WriteBackConfig, AUTO_WRITES, COOL_DOWN, REVOKE_TIMEOUT,
};
