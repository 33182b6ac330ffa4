//! Data extents in the store contract: the reference a backend hands back for an extent and
//! the rules every backend with extents follows. This module owns the reference type and its
//! one shared field (the length); it must never know where a backend keeps the bytes.
//!
//! # Contract
//!
//! * **Writing.** [`crate::WriteBatch::put_extent`]`(tree, key, prefix, data)` stores `data`
//!   once, outside the tree, and puts `key` → `prefix | reference` in `tree`, in the batch's
//!   order and atomically with the rest of the batch. The caller learns the reference by
//!   reading its row (the last [`EXTENT_REF_LEN`] bytes of the value).
//! * **Freeing.** [`crate::WriteBatch::free_extent`]`(reference)` frees a live extent, applied
//!   after the batch's ops. A batch that frees an extent that is not live (freed before, never
//!   bound) or names one twice is refused whole, applying nothing ([`KvError::InvalidExtent`]).
//!   The caller frees in the same batch that deletes or replaces the row holding the
//!   reference, so every live extent is named by exactly one row (format.md X9).
//! * **Reading.** [`crate::KvRead::read_extent`] fills a buffer of exactly the extent's length
//!   with its bytes, or fails; a stale reference (freed, or never bound) is an error, never
//!   another extent's bytes (X8).
//! * **Whether.** [`crate::Limits::extents`] is `Some(longest extent)` on a backend that has
//!   them and `None` otherwise; such a backend refuses every batch with an extent op
//!   ([`KvError::Unsupported`]), and callers keep their data in rows there.
//!
//! [`KvError::InvalidExtent`]: crate::KvError::InvalidExtent
//! [`KvError::Unsupported`]: crate::KvError::Unsupported

/// Bytes of an extent reference as it ends the row value.
pub const EXTENT_REF_LEN: usize = 16;

/// A backend's name for one extent: 16 bytes whose bytes 8..12 are the data length
/// (little-endian u32) on every backend; the rest locate and check the extent and belong to
/// the backend (fern-tree: offset u64 and crc32c, format.md "Extent reference").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtentRef(pub [u8; EXTENT_REF_LEN]);

impl ExtentRef {
    /// The reference at the end of a row value written by `put_extent`, or `None` when the
    /// value is too short to hold one (a damaged row).
    pub fn from_value_tail(value: &[u8]) -> Option<ExtentRef> {
        let at = value.len().checked_sub(EXTENT_REF_LEN)?;
        Some(ExtentRef(value[at..].try_into().ok()?))
    }

    /// Bytes of data in the extent.
    pub fn len(&self) -> u32 {
        u32::from_le_bytes([self.0[8], self.0[9], self.0[10], self.0[11]])
    }

    /// True for a reference to no bytes (backends never hand one out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
