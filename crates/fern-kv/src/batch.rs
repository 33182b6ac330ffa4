//! Write batches: an ordered list of writes that a backend applies atomically (all or none)
//! and in order (a later op in the batch sees the effect of an earlier one on the same key).
//! This module owns the batch format and the limit check; it must never apply writes itself.

use crate::error::{KvError, KvResult};
use crate::extent::{ExtentRef, EXTENT_REF_LEN};
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

/// An ordered, atomic group of writes, possibly across several trees, and the data extents
/// bound and freed with them (crate `extent` docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<Op>,
    bytes: usize,
    /// `(index of the row's Put in ops, data)`: the Put's value ends in a zero placeholder
    /// that the backend replaces by the extent's reference.
    extents: Vec<(usize, Vec<u8>)>,
    frees: Vec<ExtentRef>,
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

    /// Appends a data extent holding `data` and a put of `key` → `prefix | reference` (the
    /// reference is filled in by the backend when the batch is applied).
    pub fn put_extent(
        &mut self,
        tree: TreeId,
        key: impl Into<Vec<u8>>,
        prefix: &[u8],
        data: Vec<u8>,
    ) {
        let mut value = Vec::with_capacity(prefix.len() + EXTENT_REF_LEN);
        value.extend_from_slice(prefix);
        value.extend_from_slice(&[0; EXTENT_REF_LEN]);
        self.extents.push((self.ops.len(), data));
        self.push(Op::Put {
            tree,
            key: key.into(),
            value,
        });
    }

    /// Frees the live extent `r` after the batch's ops (crate `extent` docs).
    pub fn free_extent(&mut self, r: ExtentRef) {
        self.frees.push(r);
    }

    /// The extents to bind: `(index of the row's Put in [`ops`](Self::ops), data)`.
    pub fn extent_puts(&self) -> &[(usize, Vec<u8>)] {
        &self.extents
    }

    /// Moves the extents' data out (each entry's data is left empty), for a backend that owns
    /// the batch and hands the bytes on without copying them. Call [`check`](Self::check)
    /// first: an emptied batch no longer passes it.
    pub fn take_extent_data(&mut self) -> Vec<(usize, Vec<u8>)> {
        self.extents
            .iter_mut()
            .map(|(at, data)| (*at, std::mem::take(data)))
            .collect()
    }

    /// The extents to free, in order.
    pub fn extent_frees(&self) -> &[ExtentRef] {
        &self.frees
    }

    /// True when the batch binds or frees an extent.
    pub fn has_extents(&self) -> bool {
        !self.extents.is_empty() || !self.frees.is_empty()
    }

    /// Appends any op.
    pub fn push(&mut self, op: Op) {
        self.bytes += op.size();
        self.ops.push(op);
    }

    /// Appends every op of `other`, in order.
    pub fn extend(&mut self, other: WriteBatch) {
        let base = self.ops.len();
        self.bytes += other.bytes;
        self.ops.extend(other.ops);
        self.extents
            .extend(other.extents.into_iter().map(|(i, d)| (base + i, d)));
        self.frees.extend(other.frees);
    }

    /// The ops, in application order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Consumes the batch into its ops (the extents' data and frees are dropped: a backend
    /// with extents reads them first).
    pub fn into_ops(self) -> Vec<Op> {
        self.ops
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds no op and no extent free.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.frees.is_empty()
    }

    /// Bytes counted toward [`Limits::max_bytes`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Fails with [`KvError::TooLarge`] when the batch does not fit the backend in one atomic
    /// step. Backends call it before applying anything, so an oversized batch changes nothing.
    pub fn check(&self, limits: &Limits) -> KvResult<()> {
        if self.has_extents() {
            let Some(max) = limits.extents else {
                return Err(KvError::Unsupported {
                    what: "data extents",
                });
            };
            for (_, data) in &self.extents {
                if data.is_empty() {
                    return Err(KvError::InvalidExtent("an extent of no bytes".into()));
                }
                if data.len() > max {
                    return Err(KvError::TooLarge {
                        what: "extent",
                        actual: data.len(),
                        limit: max,
                    });
                }
            }
            let mut seen = std::collections::HashSet::new();
            for r in &self.frees {
                if !seen.insert(*r) {
                    return Err(KvError::InvalidExtent(format!(
                        "{r:?} is freed twice in one batch"
                    )));
                }
            }
        }
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
