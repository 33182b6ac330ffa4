//! Leaf deltas (docs/format.md "Leaf deltas"): a flush into a leaf that writes its messages as
//! a small node of their own, named by the parent, instead of rewriting the leaf; the fold of a
//! leaf's deltas back into it (the merge); and the deltas a reader applies between a leaf and
//! its parent's buffer.
//! Never: decides which buffer flushes (flush.rs) or reshapes nodes (reshape.rs).

use std::sync::Arc;

use super::{intersects, range_of, Ctx, Shape};
use crate::buffer::{KeyOrder, MsgBuffer};
use crate::error::Result;
use crate::filter::KeyFilter;
use crate::msg::{Kind, MsgRef};
use crate::node::{child_for, DeltaRef, Node, SharedNode};

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
    let (pivots, parts) = partition(&msgs, ctx.shape.basement_bytes);
    // D5 bounds a chain to half a node, far below 4 GiB.
    let bytes = parts.iter().map(MsgBuffer::bytes).sum::<usize>() as u32;
    ctx.put(Node::new_delta(id, pivots, parts));
    deltas.push(DeltaRef {
        id,
        bytes,
        filter: key_filter(&msgs).map(Arc::new),
    });
    ctx.counters.delta(false);
}

/// The key filter of a delta holding `msgs` (D6, D7): none when a range delete is among them
/// (it may cover any key of its range).
fn key_filter(msgs: &MsgBuffer) -> Option<KeyFilter> {
    if msgs.ranges().next().is_some() {
        return None;
    }
    let keys = msgs.in_msn_order().map(|(m, _)| m.key);
    Some(KeyFilter::build(keys, msgs.count()))
}

/// Splits `msgs` by key into partitions of about `target` bytes (every message of one key in
/// one partition; a range delete in every partition it intersects), each in MSN order (N3),
/// so a point read of a cold delta loads one partition, as it loads one basement of the leaf.
fn partition(msgs: &MsgBuffer, target: usize) -> (Vec<Vec<u8>>, Vec<MsgBuffer>) {
    let mut sorted = Vec::new();
    msgs.points_in(&[], None, &mut sorted);
    let mut pivots: Vec<Vec<u8>> = Vec::new();
    let mut acc = 0;
    let mut prev: Option<&[u8]> = None;
    for m in &sorted {
        if acc >= target && prev.is_some_and(|p| p != m.key) {
            pivots.push(m.key.to_vec());
            acc = 0;
        }
        acc += m.key.len() + m.payload.len() + 12;
        prev = Some(m.key);
    }
    let mut parts = vec![MsgBuffer::new(); pivots.len() + 1];
    let mut order = KeyOrder::new(parts.len());
    for (m, raw) in msgs.in_msn_order() {
        if m.kind != Kind::RangeDelete {
            let i = child_for(&pivots, m.key);
            parts[i].push_raw(raw);
            order.note(raw, i);
            continue;
        }
        for (i, part) in parts.iter_mut().enumerate() {
            let (lo, hi) = range_of(&pivots, i);
            if intersects(m.key, m.payload, lo, hi) {
                part.push_raw(raw);
            }
        }
    }
    for (p, hint) in parts.iter_mut().zip(order.hints(&[msgs])) {
        p.seal_hinted(&hint);
    }
    (pivots, parts)
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
    let nodes = fetch(ctx, deltas.iter())?;
    let mut all = MsgBuffer::new();
    let mut order = KeyOrder::new(1);
    let mut sources: Vec<&MsgBuffer> = Vec::new();
    let mut msgs: Vec<(MsgRef<'_>, &[u8])> = Vec::new();
    for n in &nodes {
        // A delta's partitions back in MSN order: each is in MSN order, and a range delete
        // stored in several partitions is one message (one MSN).
        msgs.clear();
        for i in 0..=n.pivots().len() {
            let part = ctx.delta_msgs(n, i)?;
            msgs.extend(part.in_msn_order());
            sources.push(part);
        }
        msgs.sort_by_key(|(m, _)| m.msn);
        msgs.dedup_by_key(|(m, _)| m.msn);
        for (m, raw) in &msgs {
            all.push_raw(raw);
            if m.kind != Kind::RangeDelete {
                order.note(raw, 0);
            }
        }
    }
    for (m, raw) in newer.in_msn_order() {
        all.push_raw(raw);
        if m.kind != Kind::RangeDelete {
            order.note(raw, 0);
        }
    }
    // Sorted runs, one per source: a delta's partitions in key order, then the newer buffer.
    sources.push(&newer);
    let hint = order.hints(&sources).pop().unwrap_or_default();
    all.seal_hinted(&hint);
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
pub(super) fn fetch<'d>(
    ctx: &Ctx<'_>,
    deltas: impl IntoIterator<Item = &'d DeltaRef>,
) -> Result<Vec<SharedNode>> {
    deltas.into_iter().map(|d| ctx.fetch(d.id)).collect()
}
