//! The writer's entry points (a batch at the root, optimize, a reclamation step) and the flush
//! policy: when an internal node's buffers move down (over the node size, a hot key's run,
//! everything for optimize, the most deletes for reclamation) and what a flush does to the
//! child it fills (invariant N4: a child's whole buffer moves at once).
//! Never: encodes messages into nodes (apply.rs) or chooses split points (reshape.rs).

use super::apply::push_down;
use super::delta;
use super::reshape::{
    is_empty_leaf, is_small, merge_small_child, split_if_needed, split_pieces, Split,
};
use super::{Ctx, Shape};
use crate::buffer::MsgBuffer;
use crate::error::{Error, Result};
use crate::ids::NodeId;
use crate::msg::Kind;
use crate::node::{child_for, Body, Node, Part};

/// How far a root's buffers may run past `node_bytes` (in multiples of it) while a background
/// flusher drains them; a writer that finds the root beyond it flushes inline (backpressure).
pub(crate) const DEFERRED_ROOT_FACTOR: usize = 2;

/// Applies `msgs` (one tree's messages of a batch, in MSN order, sealed or not) to the tree at
/// `root`. Only a leaf root needs them sorted: an internal root's child buffers sort their own
/// share of a batch, which for a large batch costs less than sorting all of it first (sixteen
/// sorts of a sixteenth; E1's writer spent a tenth of its time sorting its batches of 1,000).
/// Returns the root's id afterwards (it changes when the root splits or collapses), whether
/// the root's buffers are over the node size, so a background flusher should drain them, and
/// whether they are jammed: over [`DEFERRED_ROOT_FACTOR`] + 1 times it while a detached flush
/// fills the child that holds most of them (DF2 forbids flushing it here), so the writer
/// must wait for the install before writing more (backpressure).
///
/// `deferred`: a background flusher runs [`flush_step`]; the writer then flushes only what is
/// over [`DEFERRED_ROOT_FACTOR`] times the node size. Without one, it flushes down to the node
/// size itself.
pub(crate) fn write(
    ctx: &Ctx<'_>,
    root: NodeId,
    msgs: &mut MsgBuffer,
    deferred: bool,
) -> Result<(NodeId, bool, bool)> {
    let mut node = ctx.take(root)?;
    if node.is_leaf() {
        msgs.seal();
    }
    push_down(ctx, &mut node, msgs)?;
    if !node.is_leaf() {
        cool_hot_keys(ctx, &mut node, msgs)?;
        let factor = if deferred { DEFERRED_ROOT_FACTOR } else { 1 };
        flush_over(ctx, &mut node, ctx.shape.node_bytes * factor, Room::Keep)?;
    }
    let over = !node.is_leaf() && node.payload_bytes() > ctx.shape.node_bytes;
    let jammed = ctx.busy.is_some()
        && node.payload_bytes() > ctx.shape.node_bytes * (DEFERRED_ROOT_FACTOR + 1);
    Ok((finish_root(ctx, node)?, over, jammed))
}

/// One piece of a background root drain: if the root's buffers are over the node size, its
/// fullest child buffer is flushed (with what that child's own size then needs below it).
/// Returns the root's id afterwards and whether the root is still over.
pub(crate) fn flush_step(ctx: &Ctx<'_>, root: NodeId) -> Result<(NodeId, bool)> {
    let mut node = ctx.take(root)?;
    if node.is_leaf() || node.payload_bytes() <= ctx.shape.node_bytes {
        ctx.put_unchanged(node);
        return Ok((root, false));
    }
    flush_fullest(ctx, &mut node, Room::Keep)?;
    let over = !node.is_leaf() && node.payload_bytes() > ctx.shape.node_bytes;
    Ok((finish_root(ctx, node)?, over))
}

/// Puts a changed root back: splits it (growing the tree) or collapses single-child roots.
pub(super) fn finish_root(ctx: &Ctx<'_>, node: Node) -> Result<NodeId> {
    let mut node = match split_pieces(ctx, node) {
        Split::Whole(whole) => whole,
        Split::Pieces(mut pieces) if pieces.len() < 2 => {
            pieces
                .pop()
                .ok_or_else(|| Error::corrupt("tree", "split lost the root"))?
                .1
        }
        Split::Pieces(pieces) => {
            // The root split: a new root above the pieces (the tree grows at the top).
            let height = pieces[0].1.height + 1;
            let mut pivots = Vec::new();
            let mut children = Vec::new();
            let mut bufs = Vec::new();
            let mut deltas = Vec::new();
            for (pivot, n) in pieces {
                if let Some(p) = pivot {
                    pivots.push(p);
                }
                children.push(n.id);
                bufs.push(Part::loaded(MsgBuffer::new()));
                deltas.push(Vec::new());
                ctx.put(n);
            }
            let root = Node {
                id: ctx.new_id(),
                height,
                body: Body::Internal {
                    pivots,
                    children,
                    bufs,
                    deltas,
                },
                block: None,
                dirty: Default::default(),
                mem: Default::default(),
            };
            let id = root.id;
            ctx.put(root);
            return Ok(id);
        }
    };
    // Collapse a root that has one child and nothing buffered for it, in its buffer or as
    // deltas (the tree shrinks at the top).
    loop {
        let only_child = match &mut node.body {
            Body::Internal {
                children,
                bufs,
                deltas,
                ..
            } if children.len() == 1
                && deltas[0].is_empty()
                && bufs[0].get().is_some_and(MsgBuffer::is_empty) =>
            {
                children[0]
            }
            _ => break,
        };
        ctx.free(node.id);
        node = ctx.take(only_child)?;
    }
    let id = node.id;
    ctx.put(node);
    Ok(id)
}

/// What a flush does below the child it filled.
#[derive(Clone, Copy)]
enum Below<'k> {
    /// Flush further only where a node is over its size (the normal case).
    IfNeeded,
    /// Flush everything down to the leaves (optimize).
    All,
    /// Carry the messages for this key all the way to its leaf (a hot key).
    Path(&'k [u8]),
    /// Carry buffered deletes on, one path at a time, to where they free space (`reclaim_step`).
    Reclaim,
}

/// A key with at least this many messages waiting in one buffer is "hot": its messages are
/// pushed to the leaf at once, so a read of it never folds more than about this many pending
/// messages per level. Without it, a key upserted by every operation (a directory's mtime on
/// every create) costs each read O(pending upserts) until the buffer flushes on its own.
/// Scaled down for tiny test nodes so the model tests exercise it.
fn hot_key_messages(shape: &Shape) -> usize {
    (shape.node_bytes / 1024).clamp(8, 64)
}

/// Flushes the fullest child buffer until the node's buffered bytes fit the node size.
pub(super) fn flush_if_needed(ctx: &Ctx<'_>, node: &mut Node) -> Result<()> {
    flush_over(ctx, node, ctx.shape.node_bytes, Room::Share)
}

/// What a flush does with the allocation of the buffer it empties.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Room {
    /// The emptied buffer keeps it: a root's buffers refill one write at a time, and growing
    /// from nothing again moved every byte once more (each doubling copies the buffer to a
    /// new allocation and faults its pages in: a fifth of a FUSE write's time in postmark).
    /// Only roots: one node per tree, hot anyway, so the memory kept is bounded and used.
    Keep,
    /// Below the root: the emptied buffer keeps it up to twice its share of the node size
    /// (`node_bytes` over the children), so a node's kept room is bounded by its size.
    Share,
    /// It goes with the messages (flushes that empty a whole subtree or one path).
    Free,
}

/// Flushes the fullest child buffer until the node's buffered bytes fit `limit`.
fn flush_over(ctx: &Ctx<'_>, node: &mut Node, limit: usize, room: Room) -> Result<()> {
    while node.payload_bytes() > limit && !node.is_leaf() {
        if !flush_fullest(ctx, node, room)? {
            break;
        }
    }
    Ok(())
}

/// Flushes the child buffer of an internal node that holds the most bytes.
/// Never the child a detached flush is filling (DF2); returns whether it flushed one.
fn flush_fullest(ctx: &Ctx<'_>, node: &mut Node, room: Room) -> Result<bool> {
    let Body::Internal { bufs, children, .. } = &mut node.body else {
        return Ok(false);
    };
    let Some((i, _)) = bufs
        .iter_mut()
        .map(|b| b.get_mut().bytes())
        .enumerate()
        .filter(|&(i, b)| b > 0 && ctx.busy != Some(children[i]))
        .max_by_key(|&(_, b)| b)
    else {
        return Ok(false);
    };
    flush_child(ctx, node, i, Below::IfNeeded, room)?;
    Ok(true)
}

/// Flushes the buffers on `key`'s path, from this node down to its leaf.
fn flush_key_path(ctx: &Ctx<'_>, node: &mut Node, key: &[u8]) -> Result<()> {
    let Body::Internal {
        pivots, children, ..
    } = &node.body
    else {
        return Ok(());
    };
    let i = child_for(pivots, key);
    if ctx.busy == Some(children[i]) {
        return Ok(()); // a detached flush is filling it (DF2); its reads stay bounded
    }
    flush_child(ctx, node, i, Below::Path(key), Room::Free)?;
    Ok(())
}

/// Pushes the messages of hot keys among `msgs` to their leaves (see `hot_key_messages`).
fn cool_hot_keys(ctx: &Ctx<'_>, node: &mut Node, msgs: &MsgBuffer) -> Result<()> {
    let mut last: Option<&[u8]> = None;
    for (m, _) in msgs.in_msn_order() {
        // Only upsert runs can grow: an insert or delete replaces the message before it for
        // its key (buffer coalescing), so a run of them never passes two.
        if m.kind != Kind::Upsert || last == Some(m.key) {
            continue;
        }
        last = Some(m.key);
        let Body::Internal { pivots, bufs, .. } = &mut node.body else {
            return Ok(());
        };
        let i = child_for(pivots, m.key);
        let buf = bufs[i].get_mut();
        if buf.upsert_run_grew() && buf.has_at_least_for_key(m.key, hot_key_messages(ctx.shape)) {
            flush_key_path(ctx, node, m.key)?;
        }
    }
    Ok(())
}

/// Flushes every buffer of a subtree down to its leaves. Visits each child until it has been
/// flushed deeply and not merged since; merges shrink the node, so this terminates.
fn flush_all(ctx: &Ctx<'_>, node: &mut Node) -> Result<()> {
    let mut done = std::collections::HashSet::new();
    loop {
        let Body::Internal { children, bufs, .. } = &mut node.body else {
            return Ok(());
        };
        let next = (0..children.len())
            .find(|&i| !done.contains(&children[i]) || !bufs[i].get_mut().is_empty());
        let Some(i) = next else {
            return Ok(());
        };
        let (pieces, merged) = flush_child(ctx, node, i, Below::All, Room::Free)?;
        done.extend(pieces);
        if let Some(m) = merged {
            done.remove(&m);
        }
    }
}

/// Pushes every pending message of the tree at `root` to the leaves; returns the new root.
pub(crate) fn optimize(ctx: &Ctx<'_>, root: NodeId) -> Result<NodeId> {
    let mut node = ctx.take(root)?;
    flush_all(ctx, &mut node)?;
    finish_root(ctx, node)
}

/// One step of space reclamation (format.md, "Space and the reserve"): the buffer on one
/// root-to-leaf path that holds the most deletes and range deletes is flushed, level by level,
/// down to the leaf, where the deletes remove rows (a range delete that covers a child's range
/// drops the whole subtree on the way). Deletes are otherwise applied lazily, when their
/// buffer fills; until then the rows they delete keep their space. One step changes one path
/// (a bounded amount of new blocks), so a caller on a full device can interleave steps with
/// the checkpoints that release the old blocks. Returns the new root and whether anything
/// moved; a tree with no buffered delete is left untouched (nothing made dirty).
pub(crate) fn reclaim_step(ctx: &Ctx<'_>, root: NodeId) -> Result<(NodeId, bool)> {
    if !deletes_below(ctx, root)? {
        return Ok((root, false));
    }
    let mut node = ctx.take(root)?;
    reclaim_in(ctx, &mut node)?;
    Ok((finish_root(ctx, node)?, true))
}

/// Whether any buffer of the subtree at `id` holds a delete or range delete (reads only).
fn deletes_below(ctx: &Ctx<'_>, id: NodeId) -> Result<bool> {
    let node = ctx.fetch(id)?;
    let Body::Internal { children, .. } = &node.body else {
        return Ok(false);
    };
    for i in 0..children.len() {
        if ctx.buffer(&node, i)?.deletes() > 0 {
            return Ok(true);
        }
    }
    if node.height > 1 {
        for &c in children {
            if deletes_below(ctx, c)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Flushes the child buffer of `node` with the most deletes (or, if none has any, the first
/// child whose subtree has some) with [`Below::Reclaim`], which continues one level down.
fn reclaim_in(ctx: &Ctx<'_>, node: &mut Node) -> Result<()> {
    let Body::Internal { children, bufs, .. } = &mut node.body else {
        return Ok(());
    };
    let best = bufs
        .iter_mut()
        .map(|b| b.get_mut().deletes())
        .enumerate()
        .filter(|&(i, _)| ctx.busy != Some(children[i]))
        .max_by_key(|&(_, d)| d)
        .filter(|&(_, d)| d > 0)
        .map(|(i, _)| i);
    let pick = match best {
        Some(i) => Some(i),
        None if node.height > 1 => {
            let mut found = None;
            for (i, &c) in children.iter().enumerate() {
                if ctx.busy != Some(c) && deletes_below(ctx, c)? {
                    found = Some(i);
                    break;
                }
            }
            found
        }
        None => None,
    };
    if let Some(i) = pick {
        flush_child(ctx, node, i, Below::Reclaim, Room::Free)?;
    }
    Ok(())
}

/// Moves child `i`'s whole buffer into the child (invariant N4: a flush moves every message
/// for the child, so messages above are always newer than messages below), then fixes the
/// child's shape. Into a leaf, a normal flush (`Below::IfNeeded`) writes the messages as a new
/// leaf delta when the child's chain has room (D5), without reading or changing the leaf; every
/// other flush into a leaf first folds the leaf's deltas into it (the merge).
///
/// Returns the ids of the pieces the child became and, if a merge followed, the merged node's
/// id (which `flush_all` must visit again: the merge may have pushed messages into it).
fn flush_child(
    ctx: &Ctx<'_>,
    node: &mut Node,
    i: usize,
    below: Below<'_>,
    room: Room,
) -> Result<(Vec<NodeId>, Option<NodeId>)> {
    let parent_of_leaves = node.height == 1;
    let Body::Internal {
        pivots,
        children,
        bufs,
        deltas,
    } = &mut node.body
    else {
        return Ok((Vec::new(), None));
    };
    let mut msgs = std::mem::take(bufs[i].get_mut());
    if parent_of_leaves {
        ctx.counters.flushed(true, msgs.bytes());
        if matches!(below, Below::IfNeeded) && delta::may_append(ctx.shape, &deltas[i], &msgs) {
            delta::append(ctx, &mut deltas[i], msgs);
            let id = children[i];
            node.set_dirty(true);
            return Ok((vec![id], None));
        }
        // Anything that changes the leaf itself merges its deltas first (D5).
        msgs = delta::fold(ctx, &mut deltas[i], msgs)?;
    }
    let mut child = ctx.take(children[i])?;
    if !parent_of_leaves {
        ctx.counters.flushed(child.is_leaf(), msgs.bytes());
    }
    push_down(ctx, &mut child, &msgs)?;
    let keep = match room {
        Room::Keep => usize::MAX,
        Room::Share => 2 * ctx.shape.node_bytes / children.len().max(1),
        Room::Free => 0,
    };
    bufs[i].get_mut().reuse_room(msgs, keep);
    match below {
        Below::All => flush_all(ctx, &mut child)?,
        Below::Path(key) if !child.is_leaf() => {
            flush_key_path(ctx, &mut child, key)?;
            flush_if_needed(ctx, &mut child)?;
        }
        Below::Reclaim if !child.is_leaf() => {
            reclaim_in(ctx, &mut child)?;
            flush_if_needed(ctx, &mut child)?;
        }
        _ if !child.is_leaf() => flush_if_needed(ctx, &mut child)?,
        _ => {}
    }
    let pieces = split_if_needed(ctx, child);
    // Replace child i by the pieces; new siblings start with empty buffers.
    let mut empties = Vec::new();
    let single = pieces.len() == 1;
    let piece_ids: Vec<NodeId> = pieces.iter().map(|(_, n)| n.id).collect();
    let mut small = false;
    for (k, (pivot, piece)) in pieces.into_iter().enumerate() {
        let at = i + k;
        if k > 0 {
            pivots.insert(at - 1, pivot.unwrap_or_default());
            children.insert(at, piece.id);
            bufs.insert(at, Part::loaded(MsgBuffer::new()));
            deltas.insert(at, Vec::new());
        }
        if is_empty_leaf(&piece) {
            empties.push(at);
        } else if single && is_small(ctx.shape, &piece) {
            small = true;
        }
        ctx.put(piece);
    }
    // An empty leaf with nothing pending leaves the tree; a neighbour takes its key range.
    for at in empties.into_iter().rev() {
        if children.len() > 1 && bufs[at].get_mut().is_empty() && deltas[at].is_empty() {
            ctx.free(children[at]);
            children.remove(at);
            bufs.remove(at);
            deltas.remove(at);
            pivots.remove(at.saturating_sub(1));
        }
    }
    // Keep merging while the merged node is still small (a run of emptied leaves collapses).
    let mut at = i;
    let mut merged = None;
    while small && children.len() > 1 {
        match merge_small_child(ctx, pivots, children, bufs, deltas, at)? {
            Some((merged_at, still_small)) => {
                at = merged_at;
                small = still_small;
                merged = Some(children[merged_at]);
            }
            None => break,
        }
    }
    node.set_dirty(true);
    Ok((piece_ids, merged))
}
