//! Leaf deltas (docs/format.md "Leaf deltas"): a flush into a leaf that writes its messages as
//! a small node of their own, named by the parent, instead of rewriting the leaf; the fold of a
//! leaf's deltas back into it (the merge); and the deltas a reader applies between a leaf and
//! its parent's buffer.
//! Never: decides which buffer flushes (flush.rs) or reshapes nodes (reshape.rs).

use super::{Ctx, Shape};
use crate::buffer::MsgBuffer;
use crate::error::Result;
use crate::node::{DeltaRef, Node, SharedNode};

/// Whether a flush of `msgs` into a leaf whose parent entry names `deltas` may be written as one
/// more delta (D5): fewer than `Shape::leaf_deltas` deltas, and all of them together with the
/// new one within half a node, which bounds both the space a chain holds and what a read of
/// the leaf's key range adds.
pub(super) fn may_append(shape: &Shape, deltas: &[DeltaRef], msgs: &MsgBuffer) -> bool {
    let held: usize = deltas.iter().map(|d| d.bytes as usize).sum();
    !msgs.is_empty()
        && deltas.len() < shape.leaf_deltas
        && held + msgs.bytes() <= shape.node_bytes / 2
}

/// Writes `msgs` (a child's whole buffer, N4) as a new delta at the end of `deltas`. The leaf
/// is neither read nor changed. The delta is a dirty node in the cache, written by writeback,
/// eviction or the next checkpoint like any node (C1, W8).
pub(super) fn append(ctx: &Ctx<'_>, deltas: &mut Vec<DeltaRef>, msgs: MsgBuffer) {
    let id = ctx.new_id();
    // D5 bounds a chain to half a node, far below 4 GiB.
    let bytes = msgs.bytes() as u32;
    ctx.put(Node::new_delta(id, msgs));
    deltas.push(DeltaRef { id, bytes });
    ctx.counters.delta(false);
}

/// The merge: the messages of `deltas` (oldest first) followed by `newer` as one buffer in MSN
/// order (D2: every delta message is older than the parent's buffer), ready to be pushed into
/// the leaf; the deltas are freed (D4: a merge frees them; their blocks are released at the next
/// checkpoint, B7) and the list is emptied. Without deltas, `newer` itself.
pub(super) fn fold(
    ctx: &Ctx<'_>,
    deltas: &mut Vec<DeltaRef>,
    newer: MsgBuffer,
) -> Result<MsgBuffer> {
    if deltas.is_empty() {
        return Ok(newer);
    }
    let nodes = fetch(ctx, deltas)?;
    let mut all = MsgBuffer::new();
    for n in &nodes {
        for (_, raw) in ctx.delta_msgs(n)?.in_msn_order() {
            all.push_raw(raw);
        }
    }
    for (_, raw) in newer.in_msn_order() {
        all.push_raw(raw);
    }
    all.seal();
    drop(nodes);
    free(ctx, deltas);
    ctx.counters.delta(true);
    Ok(all)
}

/// Frees every delta of a list (its leaf was merged into them, or left the tree).
pub(super) fn free(ctx: &Ctx<'_>, deltas: &mut Vec<DeltaRef>) {
    for d in deltas.drain(..) {
        ctx.free(d.id);
    }
}

/// The delta nodes of a list, oldest first, for reading (from the cache, or read whole: a
/// delta is small).
pub(super) fn fetch(ctx: &Ctx<'_>, deltas: &[DeltaRef]) -> Result<Vec<SharedNode>> {
    deltas.iter().map(|d| ctx.fetch(d.id)).collect()
}
