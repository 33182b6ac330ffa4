//! Space accounting of an environment: how large the reserve is, how much space a write may
//! count on, and the figures statfs reports (docs/format.md, "Space and the reserve",
//! invariants B11–B13).
//!
//! Owns the arithmetic only. The environment (env.rs) applies it: it admits or refuses write
//! batches, reclaims space (checkpoints, buffered deletes pushed down) and reports [`Space`].
//! Never: allocates, or decides which bytes are free (blockfile.rs and alloc.rs do).

use crate::blockfile::ALIGN;

/// What a write batch does to space, which decides whether it may use the reserve (B12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Admission {
    /// New data: refused with `Error::NoSpace` unless it fits without touching the reserve.
    #[default]
    Grows,
    /// A delete, unlink, truncate or rmdir: it makes space once applied, so it may use the
    /// reserve (all of it but what the checkpoints that release the space need).
    Frees,
}

/// The space of an environment, as statfs should report it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    /// Bytes the image may occupy: its fixed size, or (a growing image file) its current end
    /// plus what the host file system can still give it.
    pub capacity: u64,
    /// Bytes in use: allocated extents (tree, checkpoint copies not yet released, the log
    /// region) plus an upper bound on what the dirty cached nodes take once written.
    pub used: u64,
    /// Bytes new data can still use: capacity − used − reserve (never negative).
    pub available: u64,
    /// Bytes kept back for checkpoints and deletes (B11).
    pub reserve: u64,
    /// Whether the image has a fixed size (a block device, or an image made with a size).
    pub fixed: bool,
}

/// Nodes' worth of room a batch may make dirty between two admission checks (the flushes one
/// batch can set off: one per level, each child up to a node, split pieces included), beyond
/// its own payload.
const BATCH_NODES: u64 = 4;

/// Nodes' worth of room kept for deletes and for one reclamation step (one root-to-leaf path
/// made dirty, with its split pieces) on a device that is otherwise full.
const DELETE_NODES: u64 = 8;

fn units(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Room the next two checkpoints need beyond the dirty nodes (which are counted as used): two
/// block tables and two catalogs, plus the slack of one batch's flushes (B11). Two, because
/// the blocks a checkpoint replaces are released only when the one after it commits (B4).
pub(crate) fn checkpoint_room(btt_bytes: u64, meta_bytes: u64, node_bytes: u64) -> u64 {
    2 * (units(btt_bytes) + units(meta_bytes)) + BATCH_NODES * node_bytes
}

/// The whole reserve: [`checkpoint_room`] plus room for deletes (B11). New data may not use it.
pub(crate) fn reserve(btt_bytes: u64, meta_bytes: u64, node_bytes: u64) -> u64 {
    checkpoint_room(btt_bytes, meta_bytes, node_bytes) + DELETE_NODES * node_bytes
}

/// The piece size free space is counted in (B12): the largest extent a write may need — a
/// node (which splits past `node_bytes`, so allow a quarter more) or a block table. A hole
/// smaller than this may be useless to the next node write, so it is not counted as free.
pub(crate) fn unit(btt_bytes: u64, node_bytes: u64) -> u64 {
    units((node_bytes + node_bytes / 4).max(btt_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_covers_checkpoints_and_deletes() {
        let node = 1 << 20;
        let room = checkpoint_room(12 * 1000, 300, node);
        assert_eq!(room, 2 * (3 * 4096 + 4096) + 4 * node);
        assert_eq!(reserve(12 * 1000, 300, node), room + 8 * node);
    }

    #[test]
    fn unit_is_the_largest_extent_rounded() {
        assert_eq!(unit(100, 64 << 10), 80 << 10);
        assert_eq!(unit(3 << 20, 1 << 20), 3 << 20);
        assert_eq!(unit(0, 5000), 8192);
    }
}
