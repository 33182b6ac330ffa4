//! Applying a batch of messages to one node: a leaf merges them into its basements (and keeps
//! its basements within their size), an internal node queues them in its child buffers (a
//! range delete that covers a child's whole range drops that subtree instead).
//! Never: decides when messages move down (flush.rs) or changes the node's shape beyond its
//! basements and emptied children (reshape.rs).

use std::sync::Arc;

use super::{covers_all, delta, intersects, range_of, Ctx};
use crate::basement::Basement;
use crate::buffer::{KeyOrder, MsgBuffer};
use crate::error::Result;
use crate::ids::NodeId;
use crate::msg::{Kind, MsgRef};
use crate::node::{child_for, Body, Node, Part};

/// Moves messages into a node: applied to a leaf's basements, or queued in an internal node's
/// child buffers.
pub(super) fn push_down(ctx: &Ctx<'_>, node: &mut Node, msgs: &MsgBuffer) -> Result<()> {
    if msgs.is_empty() {
        return Ok(());
    }
    match &mut node.body {
        Body::Leaf { pivots, parts } => {
            let mut points = Vec::new();
            let ranges: Vec<MsgRef<'_>> = msgs.ranges().collect();
            if ranges.is_empty() {
                // Point messages only: walk them once in key order and apply each partition's
                // run, touching only the partitions that receive something (a leaf root takes
                // one or two messages per write and holds dozens of partitions).
                msgs.points_in(&[], None, &mut points);
                let mut rest = &points[..];
                let mut out_of_bounds = false;
                while let Some(first) = rest.first() {
                    let i = child_for(pivots, first.key);
                    let hi = pivots.get(i).map(Vec::as_slice);
                    let n = hi.map_or(rest.len(), |h| rest.partition_point(|m| m.key < h));
                    let b = Arc::make_mut(parts[i].get_mut());
                    b.apply(&rest[..n], &[], ctx.upserts)?;
                    out_of_bounds |= basement_out_of_bounds(b, ctx.shape.basement_bytes);
                    rest = &rest[n..];
                }
                // Only the partitions just changed can have left their bounds.
                if out_of_bounds {
                    normalize_basements(pivots, parts, ctx.shape.basement_bytes);
                }
                return Ok(());
            }
            for (i, part) in parts.iter_mut().enumerate() {
                let (lo, hi) = range_of(pivots, i);
                points.clear();
                msgs.points_in(lo.unwrap_or(&[]), hi, &mut points);
                let rs: Vec<MsgRef<'_>> = ranges
                    .iter()
                    .filter(|r| intersects(r.key, r.payload, lo, hi))
                    .copied()
                    .collect();
                if !points.is_empty() || !rs.is_empty() {
                    Arc::make_mut(part.get_mut()).apply(&points, &rs, ctx.upserts)?;
                }
            }
            normalize_basements(pivots, parts, ctx.shape.basement_bytes);
        }
        Body::Delta { .. } => {
            return Err(crate::error::Error::corrupt(
                format!("node {}", node.id),
                "messages pushed into a leaf delta (invariant D4)",
            ))
        }
        Body::Internal {
            pivots,
            children,
            bufs,
            deltas,
        } => {
            let mut fresh = Vec::new();
            // A sealed source (a flushed buffer; a batch for a leaf root) already knows its
            // key order: each child's round is sorted by reading it off (KeyOrder).
            let mut order = msgs.is_sealed().then(|| KeyOrder::new(children.len()));
            for (m, raw) in msgs.in_msn_order() {
                if m.kind != Kind::RangeDelete {
                    let i = child_for(pivots, m.key);
                    bufs[i].get_mut().push_raw(raw);
                    if let Some(o) = &mut order {
                        o.note(raw, i);
                    }
                    continue;
                }
                for i in 0..children.len() {
                    let (lo, hi) = range_of(pivots, i);
                    if !intersects(m.key, m.payload, lo, hi) {
                        continue;
                    }
                    // Not while a detached flush runs in this tree (DF2): buffered instead.
                    if covers_all(m.key, m.payload, lo, hi) && ctx.busy.is_none() {
                        // Everything below child i is older than this message and deleted by
                        // it: drop the subtree instead of carrying the delete down.
                        let old = children[i];
                        let leaf = Node::new_leaf(ctx.new_id());
                        children[i] = leaf.id;
                        fresh.push(leaf.id);
                        ctx.put(leaf);
                        *bufs[i].get_mut() = MsgBuffer::new();
                        delta::free(ctx, &mut deltas[i]);
                        drop_subtree(ctx, old)?;
                    } else {
                        bufs[i].get_mut().push_raw(raw);
                    }
                }
            }
            let hints = order.map(|o| o.hints(&[msgs])).unwrap_or_default();
            for (i, b) in bufs.iter_mut().enumerate() {
                let hint = hints.get(i).filter(|h| !h.is_empty()).map(Vec::as_slice);
                b.get_mut().seal_coalescing(ctx.upserts, hint);
            }
            // Children replaced by empty leaves that received nothing since: remove them; a
            // neighbour takes the (now empty) key range.
            for id in fresh {
                if children.len() < 2 {
                    break;
                }
                if let Some(at) = children.iter().position(|&c| c == id) {
                    if bufs[at].get_mut().is_empty() && deltas[at].is_empty() {
                        ctx.free(id);
                        children.remove(at);
                        bufs.remove(at);
                        deltas.remove(at);
                        pivots.remove(at.saturating_sub(1));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Frees every node of a subtree, with the leaf deltas its nodes name, reading only internal
/// nodes' headers.
fn drop_subtree(ctx: &Ctx<'_>, id: NodeId) -> Result<()> {
    let mut stack = vec![id];
    while let Some(id) = stack.pop() {
        let node = ctx.fetch(id)?;
        if let Body::Internal {
            children, deltas, ..
        } = &node.body
        {
            stack.extend(children.iter().copied());
            for d in deltas.iter().flatten() {
                ctx.free(d.id);
            }
        }
        drop(node);
        ctx.free(id);
    }
    Ok(())
}

/// Whether a basement must be merged away (empty) or split (over `limit` with rows to split).
fn basement_out_of_bounds(b: &Basement, limit: usize) -> bool {
    b.is_empty() || (b.bytes() > limit && b.len() > 1)
}

/// Splits basements over the size limit and removes empty ones (a leaf keeps at least one).
pub(super) fn normalize_basements(
    pivots: &mut Vec<Vec<u8>>,
    parts: &mut Vec<Part<Arc<Basement>>>,
    limit: usize,
) {
    // Most pushes leave every basement within bounds: then nothing moves (and no basement is
    // unshared, which would copy it when a reader or a checkpoint still holds it).
    let out_of_bounds = |b: &Basement| basement_out_of_bounds(b, limit);
    if !parts
        .iter()
        .any(|p| p.get().is_some_and(|b| out_of_bounds(b)))
    {
        return;
    }
    let mut new_parts: Vec<Part<Arc<Basement>>> = Vec::with_capacity(parts.len());
    let mut new_pivots: Vec<Vec<u8>> = Vec::with_capacity(pivots.len());
    for (i, part) in std::mem::take(parts).into_iter().enumerate() {
        // The lower bound of this basement, if it is not the leaf's first.
        let mut lower = if i == 0 {
            None
        } else {
            Some(pivots[i - 1].clone())
        };
        let shared = part.into_inner();
        if shared.is_empty() {
            continue; // its range is absorbed by the previous basement (or the next, if first)
        }
        if !out_of_bounds(&shared) {
            if !new_parts.is_empty() {
                new_pivots.push(lower.take().unwrap_or_else(|| shared.key(0).to_vec()));
            }
            new_parts.push(Part::loaded(shared));
            continue;
        }
        let mut b = Arc::unwrap_or_clone(shared);
        loop {
            let right = if b.bytes() > limit && b.len() > 1 {
                let at = b.middle();
                Some(b.split_off(at))
            } else {
                None
            };
            if !new_parts.is_empty() {
                new_pivots.push(lower.take().unwrap_or_else(|| b.key(0).to_vec()));
            }
            let next_lower = right.as_ref().map(|r| r.key(0).to_vec());
            new_parts.push(Part::loaded(Arc::new(b)));
            match right {
                Some(r) => {
                    b = r;
                    lower = next_lower;
                }
                None => break,
            }
        }
    }
    if new_parts.is_empty() {
        new_parts.push(Part::loaded(Arc::new(Basement::new())));
        new_pivots.clear();
    }
    *parts = new_parts;
    *pivots = new_pivots;
}
