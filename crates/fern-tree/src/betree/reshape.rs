//! Node shape: splitting a leaf over the node size (at basement boundaries) or an internal node
//! over the fanout, and merging a small child with a neighbour (after pushing the parent's
//! pending messages for both into them, to keep N4).
//! Never: decides when to flush (flush.rs).

use std::sync::Arc;

use super::apply::{normalize_basements, push_down};
use super::{delta, Ctx, Shape};
use crate::basement::Basement;
use crate::buffer::MsgBuffer;
use crate::error::{Error, Result};
use crate::ids::NodeId;
use crate::node::{Body, DeltaRef, Node, Part};

/// Merges the small child `at` with a neighbour of the same kind when the result stays well
/// under the limits (so it does not split again at once). Messages pending in this node for the
/// two children are pushed into them first, so afterwards nothing is buffered above the merged
/// node for its range but messages newer than everything in it (invariant N4), which keeps the
/// per-basement MSN floors of the merged leaves valid. Leaves' deltas are folded in with those
/// messages (D5: reshaping a leaf merges first).
pub(super) fn merge_small_child(
    ctx: &Ctx<'_>,
    pivots: &mut Vec<Vec<u8>>,
    children: &mut Vec<NodeId>,
    bufs: &mut Vec<Part<MsgBuffer>>,
    deltas: &mut Vec<Vec<DeltaRef>>,
    at: usize,
) -> Result<Option<(usize, bool)>> {
    let byte_limit = ctx.shape.node_bytes * 3 / 4;
    let child_limit = (ctx.shape.fanout / 2).max(2);
    let candidates = [(at, at + 1), (at.wrapping_sub(1), at)];
    for (l, r) in candidates {
        if r >= children.len() || l >= children.len() {
            continue;
        }
        if ctx
            .busy
            .is_some_and(|b| b == children[l] || b == children[r])
        {
            continue; // a detached flush is filling one of them (DF2)
        }
        let mut left = ctx.take(children[l])?;
        let mut right = ctx.take(children[r])?;
        let held = |k: usize| deltas[k].iter().map(|d| d.bytes as usize).sum::<usize>();
        let pending =
            bufs[l].get_mut().growth_bound() + bufs[r].get_mut().growth_bound() + held(l) + held(r);
        let fits = match (&left.body, &right.body) {
            (Body::Leaf { .. }, Body::Leaf { .. }) => {
                left.payload_bytes() + right.payload_bytes() + pending <= byte_limit
            }
            (Body::Internal { children: a, .. }, Body::Internal { children: b, .. }) => {
                a.len() + b.len() <= child_limit
                    && left.payload_bytes() + right.payload_bytes() + pending <= byte_limit
            }
            _ => false,
        };
        if !fits {
            ctx.put_unchanged(left);
            ctx.put_unchanged(right);
            continue;
        }
        for (node, k) in [(&mut left, l), (&mut right, r)] {
            let msgs = std::mem::take(bufs[k].get_mut());
            let msgs = delta::fold(ctx, &mut deltas[k], msgs)?;
            push_down(ctx, node, &msgs)?;
        }
        let Node {
            id: lid,
            height,
            body: lbody,
            ..
        } = left;
        let Node {
            id: rid,
            body: rbody,
            ..
        } = right;
        let body = match (lbody, rbody) {
            (
                Body::Leaf {
                    pivots: mut lp,
                    parts: mut lparts,
                },
                Body::Leaf {
                    pivots: rp,
                    parts: rparts,
                },
            ) => {
                lp.push(pivots[l].clone());
                lp.extend(rp);
                lparts.extend(rparts);
                normalize_basements(&mut lp, &mut lparts, ctx.shape.basement_bytes);
                Body::Leaf {
                    pivots: lp,
                    parts: lparts,
                }
            }
            (
                Body::Internal {
                    pivots: mut lp,
                    children: mut lc,
                    bufs: mut lb,
                    deltas: mut ld,
                },
                Body::Internal {
                    pivots: rp,
                    children: rc,
                    bufs: rb,
                    deltas: rd,
                },
            ) => {
                lp.push(pivots[l].clone());
                lp.extend(rp);
                lc.extend(rc);
                lb.extend(rb);
                ld.extend(rd);
                Body::Internal {
                    pivots: lp,
                    children: lc,
                    bufs: lb,
                    deltas: ld,
                }
            }
            _ => return Err(Error::corrupt("tree", "merging nodes of different kinds")),
        };
        let merged = Node {
            id: lid,
            height,
            body,
            block: None,
            dirty: Default::default(),
            mem: Default::default(),
        };
        ctx.free(rid);
        children.remove(r);
        bufs.remove(r);
        deltas.remove(r);
        pivots.remove(l);
        let still_small = is_small(ctx.shape, &merged);
        ctx.put(merged);
        return Ok(Some((l, still_small)));
    }
    Ok(None)
}

/// Whether a node is small enough that merging it with a neighbour is worth a read.
pub(super) fn is_small(shape: &Shape, node: &Node) -> bool {
    match &node.body {
        Body::Leaf { .. } => node.payload_bytes() < shape.node_bytes / 4,
        Body::Internal { children, .. } => children.len() <= (shape.fanout / 4).max(1),
        Body::Delta { .. } => false,
    }
}

pub(super) fn is_empty_leaf(node: &Node) -> bool {
    matches!(&node.body, Body::Leaf { parts, .. }
        if parts.len() == 1 && parts[0].get().is_some_and(|b| b.is_empty()))
}

/// Splits a node that is over its size (leaf) or fanout (internal) into pieces.
/// Returns (lower pivot, node) pairs; the first piece keeps the original id.
pub(super) fn split_if_needed(ctx: &Ctx<'_>, node: Node) -> Vec<Piece> {
    match split_pieces(ctx, node) {
        Split::Whole(node) => vec![(None, node)],
        Split::Pieces(pieces) => pieces,
    }
}

/// A piece of a split node: its lower pivot (none for the first) and the node.
pub(super) type Piece = (Option<Vec<u8>>, Node);

/// What [`split_pieces`] made of a node.
pub(super) enum Split {
    /// Within bounds: the node, untouched.
    Whole(Node),
    /// Two or more pieces.
    Pieces(Vec<Piece>),
}

/// [`split_if_needed`] that hands back a node within bounds as it is — without the one-piece
/// `Vec` a root written by every commit would otherwise allocate and free.
pub(super) fn split_pieces(ctx: &Ctx<'_>, node: Node) -> Split {
    let shape = ctx.shape;
    // The [start, end) ranges of parts (leaf) or children (internal) each piece takes.
    let groups: Vec<(usize, usize)> = match &node.body {
        Body::Leaf { parts, .. } => {
            let size = |p: &Part<Arc<Basement>>| p.get().map_or(0, |b| b.bytes());
            // Asked after every write into a leaf root: no allocation unless it splits.
            let total: usize = parts.iter().map(size).sum();
            if total <= shape.node_bytes || parts.len() < 2 {
                return Split::Whole(node);
            }
            let sizes: Vec<usize> = parts.iter().map(size).collect();
            let k = total
                .div_ceil(shape.node_bytes * 3 / 4)
                .clamp(2, parts.len());
            group_by_size(&sizes, k)
        }
        Body::Internal { children, .. } => {
            if children.len() <= shape.fanout {
                return Split::Whole(node);
            }
            let n = children.len();
            let k = n.div_ceil(shape.fanout).max(2);
            (0..k).map(|g| (g * n / k, (g + 1) * n / k)).collect()
        }
        Body::Delta { .. } => return Split::Whole(node),
    };
    let lowers: Vec<Option<Vec<u8>>> = {
        let pivots = node.pivots();
        groups
            .iter()
            .map(|&(start, _)| (start > 0).then(|| pivots[start - 1].clone()))
            .collect()
    };
    let Node {
        id, height, body, ..
    } = node;
    let bodies: Vec<Body> = match body {
        Body::Leaf { pivots, parts } => {
            let mut parts = parts.into_iter();
            groups
                .iter()
                .map(|&(start, end)| Body::Leaf {
                    pivots: pivots[start..end - 1].to_vec(),
                    parts: parts.by_ref().take(end - start).collect(),
                })
                .collect()
        }
        Body::Internal {
            pivots,
            children,
            bufs,
            deltas,
        } => {
            let mut bufs = bufs.into_iter();
            // Each child's delta list moves with the child (D1).
            let mut deltas = deltas.into_iter();
            groups
                .iter()
                .map(|&(start, end)| Body::Internal {
                    pivots: pivots[start..end - 1].to_vec(),
                    children: children[start..end].to_vec(),
                    bufs: bufs.by_ref().take(end - start).collect(),
                    deltas: deltas.by_ref().take(end - start).collect(),
                })
                .collect()
        }
        delta @ Body::Delta { .. } => vec![delta],
    };
    Split::Pieces(
        lowers
            .into_iter()
            .zip(bodies)
            .enumerate()
            .map(|(g, (lower, body))| {
                let nid = if g == 0 { id } else { ctx.new_id() };
                (
                    lower,
                    Node {
                        id: nid,
                        height,
                        body,
                        block: None,
                        dirty: Default::default(),
                        mem: Default::default(),
                    },
                )
            })
            .collect(),
    )
}

/// Splits `sizes` into `k` contiguous, non-empty groups of about equal total size.
fn group_by_size(sizes: &[usize], k: usize) -> Vec<(usize, usize)> {
    let total: usize = sizes.iter().sum();
    let mut out = Vec::with_capacity(k);
    let mut start = 0;
    let mut acc = 0;
    for (i, s) in sizes.iter().enumerate() {
        acc += s;
        let groups_left = k - out.len();
        let items_left = sizes.len() - (i + 1);
        let want = total * (out.len() + 1) / k;
        if groups_left > 1
            && (acc >= want || items_left < groups_left)
            && items_left >= groups_left - 1
        {
            out.push((start, i + 1));
            start = i + 1;
        }
    }
    out.push((start, sizes.len()));
    out
}
