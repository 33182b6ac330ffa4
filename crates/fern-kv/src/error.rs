//! The error type of the KV layer. It owns nothing but the vocabulary of store failures;
//! it must never carry file-system meaning (that is fern-fs's `FsError`).

use crate::types::{TreeId, UpdateFnId};

/// Result of every store operation.
pub type KvResult<T> = Result<T, KvError>;

/// Everything a [`crate::KvStore`] can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// An optimistic transaction read something that another commit changed before this one
    /// committed. Nothing of the transaction was applied; retrying it from the start is safe.
    #[error("transaction conflict: a key or range it read was written by a later commit")]
    Conflict,
    /// [`crate::transact`] gave up after its bounded number of attempts, every one a conflict.
    #[error("transaction still conflicting after {attempts} attempts")]
    RetriesExhausted {
        /// How many times the transaction body ran.
        attempts: u32,
    },
    /// A [`crate::KeyGuard`] of a guarded read or transaction did not hold: the key had
    /// another value (a delegation is held by someone else, or ours was lost). Nothing was
    /// read or applied; rerunning the same operation fails the same way until the key changes.
    #[error("guard on key {key:?} of tree {tree:?} does not hold")]
    GuardFailed {
        /// The tree of the guarded key.
        tree: TreeId,
        /// The guarded key.
        key: Vec<u8>,
    },
    /// A tree name the backend does not know and cannot create.
    #[error("unknown tree {0:?}")]
    UnknownTree(String),
    /// A tree handle that this store never handed out.
    #[error("invalid tree handle {0:?}")]
    InvalidTree(TreeId),
    /// An upsert named a function that was not registered when the store was opened.
    #[error("upsert function {0:?} is not registered with this store")]
    UnknownUpdateFn(UpdateFnId),
    /// A batch or a value is larger than the backend accepts in one atomic step
    /// (see [`crate::Limits`]); the caller must split the work into resumable steps.
    #[error("{what} exceeds backend limit: {actual} > {limit}")]
    TooLarge {
        /// What was too large ("operations per batch", "bytes per batch", "key", "value").
        what: &'static str,
        /// The size that was asked for.
        actual: usize,
        /// The backend's limit.
        limit: usize,
    },
    /// The store is closed or poisoned by an earlier failed sync; it refuses further writes
    /// rather than pretend they are durable.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend does not have what the batch asks for (data extents on etcd); nothing
    /// was applied.
    #[error("the store has no {what}")]
    Unsupported {
        /// What is missing ("data extents").
        what: &'static str,
    },
    /// An extent op or reference the store refuses: a free of an extent that is not live or
    /// named twice in one batch, empty extent data, a read of a stale reference. Nothing was
    /// applied.
    #[error("invalid data extent: {0}")]
    InvalidExtent(String),
    /// An I/O error from the backend's media.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Any other backend failure, with the backend's own error as source.
    #[error("backend error: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl KvError {
    /// True when retrying the whole transaction may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, KvError::Conflict)
    }
}
