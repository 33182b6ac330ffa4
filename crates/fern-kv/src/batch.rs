//! Write batches: an ordered list of writes that a backend applies atomically (all or none)
//! and in order (a later op in the batch sees the effect of an earlier one on the same key).
//! This module owns the batch format and the limit check; it must never apply writes itself.

use crate::error::{KvError, KvResult};
use crate::types::{KeyRange, Limits, TreeId, UpdateFnId};

/// One write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Put {
        /// Tree written.
        tree: TreeId,
        /// Key.
        key: Vec<u8>,
        /// New value.
        value: Vec<u8>,
    },
    /// Remove `key` (absent keys are fine).
    Delete {
        /// Tree written.
        tree: TreeId,
        /// Key.
        key: Vec<u8>,
    },
    /// Replace the value of `key` by `f(key, old, arg)`; `None` from `f` deletes the key.
    /// The caller never reads `old`: an engine with native upserts stores a message.
    Upsert {
        /// Tree written.
        tree: TreeId,
        /// Key.
        key: Vec<u8>,
        /// Registered function.
        func: UpdateFnId,
        /// Argument passed to the function.
        arg: Vec<u8>,
    },
    /// Remove every key in `[lo, hi)`. Empty or inverted ranges remove nothing.
    DeleteRange {
        /// Tree written.
        tree: TreeId,
        /// Inclusive low bound.
        lo: Vec<u8>,
        /// Exclusive high bound.
        hi: Vec<u8>,
    },
}

impl Op {
    /// The tree this op writes.
    pub fn tree(&self) -> TreeId {
        match self {
            Op::Put { tree, .. }
            | Op::Delete { tree, .. }
            | Op::Upsert { tree, .. }
            | Op::DeleteRange { tree, .. } => *tree,
        }
    }

    /// Bytes this op contributes toward [`Limits::max_bytes`].
    pub fn size(&self) -> usize {
        match self {
            Op::Put { key, value, .. } => key.len() + value.len(),
            Op::Delete { key, .. } => key.len(),
            Op::Upsert { key, arg, .. } => key.len() + arg.len() + 4,
            Op::DeleteRange { lo, hi, .. } => lo.len() + hi.len(),
        }
    }

    /// The keys this op may change, as a range (a single key is a one-key range).
    pub fn written_range(&self) -> KeyRange {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } | Op::Upsert { key, .. } => KeyRange {
                lo: std::ops::Bound::Included(key.clone()),
                hi: std::ops::Bound::Included(key.clone()),
            },
            Op::DeleteRange { lo, hi, .. } => KeyRange::half_open(lo, hi),
        }
    }
}

/// An ordered, atomic group of writes, possibly across several trees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<Op>,
    bytes: usize,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a put.
    pub fn put(&mut self, tree: TreeId, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.push(Op::Put {
            tree,
            key: key.into(),
            value: value.into(),
        });
    }

    /// Appends a delete.
    pub fn delete(&mut self, tree: TreeId, key: impl Into<Vec<u8>>) {
        self.push(Op::Delete {
            tree,
            key: key.into(),
        });
    }

    /// Appends an upsert.
    pub fn upsert(
        &mut self,
        tree: TreeId,
        key: impl Into<Vec<u8>>,
        func: UpdateFnId,
        arg: impl Into<Vec<u8>>,
    ) {
        self.push(Op::Upsert {
            tree,
            key: key.into(),
            func,
            arg: arg.into(),
        });
    }

    /// Appends a delete of `[lo, hi)`.
    pub fn delete_range(&mut self, tree: TreeId, lo: impl Into<Vec<u8>>, hi: impl Into<Vec<u8>>) {
        self.push(Op::DeleteRange {
            tree,
            lo: lo.into(),
            hi: hi.into(),
        });
    }

    /// Appends any op.
    pub fn push(&mut self, op: Op) {
        self.bytes += op.size();
        self.ops.push(op);
    }

    /// Appends every op of `other`, in order.
    pub fn extend(&mut self, other: WriteBatch) {
        self.bytes += other.bytes;
        self.ops.extend(other.ops);
    }

    /// The ops, in application order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Consumes the batch into its ops.
    pub fn into_ops(self) -> Vec<Op> {
        self.ops
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds no op.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes counted toward [`Limits::max_bytes`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Fails with [`KvError::TooLarge`] when the batch does not fit the backend in one atomic
    /// step. Backends call it before applying anything, so an oversized batch changes nothing.
    pub fn check(&self, limits: &Limits) -> KvResult<()> {
        if let Some(max) = limits.max_ops {
            if self.ops.len() > max {
                return Err(KvError::TooLarge {
                    what: "operations per batch",
                    actual: self.ops.len(),
                    limit: max,
                });
            }
        }
        if let Some(max) = limits.max_bytes {
            if self.bytes > max {
                return Err(KvError::TooLarge {
                    what: "bytes per batch",
                    actual: self.bytes,
                    limit: max,
                });
            }
        }
        for op in &self.ops {
            let (key_len, value_len) = match op {
                Op::Put { key, value, .. } => (key.len(), value.len()),
                Op::Delete { key, .. } => (key.len(), 0),
                Op::Upsert { key, arg, .. } => (key.len(), arg.len()),
                Op::DeleteRange { lo, hi, .. } => (lo.len().max(hi.len()), 0),
            };
            if key_len > limits.max_key_len {
                return Err(KvError::TooLarge {
                    what: "key",
                    actual: key_len,
                    limit: limits.max_key_len,
                });
            }
            if value_len > limits.max_value_len {
                return Err(KvError::TooLarge {
                    what: "value",
                    actual: value_len,
                    limit: limits.max_value_len,
                });
            }
        }
        Ok(())
    }
}
