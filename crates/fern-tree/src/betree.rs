//! The Bε-tree algorithms: injecting messages, flushing buffers, splitting and shrinking nodes
//! (writers), and point and leaf-range queries that apply pending messages (readers).
//!
//! Writers run under the environment's write lock and own the nodes they change (taken out of
//! the cache, fully loaded — invariant N6). Readers run under the read lock and share nodes.
//! Never: does I/O other than through the context, or decides durability.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::basement::Basement;
use crate::blockfile::BlockFile;
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::codec::Compression;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::NodeId;
use crate::msg::{self, Kind, MsgRef, UpsertRegistry};
use crate::node::{child_before, child_for, Body, Node, Part, SharedNode};
use crate::stats::{Counters, WriteCause};

/// Shape parameters of trees, fixed for an open environment.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub node_bytes: usize,
    pub basement_bytes: usize,
    pub fanout: usize,
    pub compression: Compression,
}

/// Everything the algorithms need from the environment.
pub(crate) struct Ctx<'a> {
    pub cache: &'a Cache,
    pub bf: &'a Mutex<BlockFile>,
    pub dev: &'a Arc<dyn BlockDevice>,
    pub shape: &'a Shape,
    pub upserts: &'a UpsertRegistry,
    pub counters: &'a Counters,
}

impl Ctx<'_> {
    /// A node for reading: from the cache, or its header from disk.
    pub(crate) fn fetch(&self, id: NodeId) -> Result<SharedNode> {
        if let Some(n) = self.cache.get(id) {
            return Ok(n);
        }
        let loc = self.bf.lock().loc(id).ok_or(Error::MissingNode(id))?;
        let node = Node::read(self.dev.as_ref(), id, loc, false)?;
        Ok(self.cache.insert(node))
    }

    /// A node for changing: out of the cache, every partition loaded.
    pub(crate) fn take(&self, id: NodeId) -> Result<Node> {
        let mut node = match self.cache.take(id) {
            Some(n) => n,
            None => {
                self.counters.writer_read();
                let loc = self.bf.lock().loc(id).ok_or(Error::MissingNode(id))?;
                Node::read(self.dev.as_ref(), id, loc, true)?
            }
        };
        node.load_all(self.dev.as_ref())?;
        Ok(node)
    }

    /// Puts back a node that was taken but not changed.
    pub(crate) fn put_unchanged(&self, node: Node) {
        self.cache.put(node);
    }

    /// Puts a changed node back, dirty.
    pub(crate) fn put(&self, node: Node) {
        node.set_dirty(true);
        self.cache.put(node);
    }

    pub(crate) fn new_id(&self) -> NodeId {
        self.bf.lock().alloc_node_id()
    }

    /// A node that left the tree: its id and block are released at the next checkpoint.
    pub(crate) fn free(&self, id: NodeId) {
        self.cache.remove(id);
        self.bf.lock().free_node(id);
    }

    /// Evicts down to the cache's bound, writing the dirty nodes it drops (the cache keeps C1).
    pub(crate) fn evict(&self) -> Result<()> {
        self.cache
            .evict(&|n| self.write_node(n, WriteCause::Eviction))
    }

    /// Writes a node to a fresh block (copy-on-write); it stays cached, now clean.
    pub(crate) fn write_node(&self, node: &Node, cause: WriteCause) -> Result<()> {
        let bytes = node.encode(self.shape.compression);
        self.write_encoded(node, &bytes, cause)
    }

    /// Writes `bytes`, the encoding of `node`, to a fresh block (copy-on-write).
    pub(crate) fn write_encoded(&self, node: &Node, bytes: &[u8], cause: WriteCause) -> Result<()> {
        self.counters.node_written(cause, bytes.len());
        let loc = self.bf.lock().reserve(node.id, bytes.len() as u32)?;
        self.dev
            .write_at(bytes, loc.offset)
            .map_err(|e| Error::io(format!("writing node {}", node.id), e))
    }

    fn basement<'n>(&self, node: &'n Node, i: usize) -> Result<&'n Arc<Basement>> {
        let (b, added) = node.basement(self.dev.as_ref(), i)?;
        self.cache.grew(node, added);
        Ok(b)
    }

    fn buffer<'n>(&self, node: &'n Node, i: usize) -> Result<&'n MsgBuffer> {
        let (b, added) = node.buffer(self.dev.as_ref(), i)?;
        self.cache.grew(node, added);
        Ok(b)
    }
}

// ---------------------------------------------------------------------------------------------
// Writers

/// Applies `msgs` (one tree's messages of a batch, in MSN order) to the tree at `root`.
/// Returns the root's id afterwards (it changes when the root splits or collapses).
pub(crate) fn write(ctx: &Ctx<'_>, root: NodeId, msgs: &MsgBuffer) -> Result<NodeId> {
    let mut node = ctx.take(root)?;
    push_down(ctx, &mut node, msgs)?;
    if !node.is_leaf() {
        cool_hot_keys(ctx, &mut node, msgs)?;
        flush_if_needed(ctx, &mut node)?;
    }
    finish_root(ctx, node)
}

/// Puts a changed root back: splits it (growing the tree) or collapses single-child roots.
fn finish_root(ctx: &Ctx<'_>, node: Node) -> Result<NodeId> {
    let mut pieces = split_if_needed(ctx, node);
    if pieces.len() > 1 {
        // The root split: a new root above the pieces (the tree grows at the top).
        let height = pieces[0].1.height + 1;
        let mut pivots = Vec::new();
        let mut children = Vec::new();
        let mut bufs = Vec::new();
        for (pivot, n) in pieces {
            if let Some(p) = pivot {
                pivots.push(p);
            }
            children.push(n.id);
            bufs.push(Part::loaded(MsgBuffer::new()));
            ctx.put(n);
        }
        let root = Node {
            id: ctx.new_id(),
            height,
            body: Body::Internal {
                pivots,
                children,
                bufs,
            },
            block: None,
            dirty: Default::default(),
            mem: Default::default(),
        };
        let id = root.id;
        ctx.put(root);
        return Ok(id);
    }
    let (_, mut node) = pieces
        .pop()
        .ok_or_else(|| Error::corrupt("tree", "split lost the root"))?;
    // Collapse a root that has one child and nothing buffered for it (the tree shrinks at the top).
    loop {
        let only_child = match &mut node.body {
            Body::Internal { children, bufs, .. }
                if children.len() == 1 && bufs[0].get().is_some_and(MsgBuffer::is_empty) =>
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

/// Key range `[lo, hi)` of child/partition `i` given pivots (None = unbounded).
fn range_of(pivots: &[Vec<u8>], i: usize) -> (Option<&[u8]>, Option<&[u8]>) {
    let lo = if i == 0 {
        None
    } else {
        Some(pivots[i - 1].as_slice())
    };
    let hi = pivots.get(i).map(Vec::as_slice);
    (lo, hi)
}

/// Whether range delete `[rlo, rhi)` intersects `[lo, hi)`.
fn intersects(rlo: &[u8], rhi: &[u8], lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    rlo < rhi && hi.is_none_or(|h| rlo < h) && lo.is_none_or(|l| rhi > l)
}

/// Whether range delete `[rlo, rhi)` covers all of `[lo, hi)`.
fn covers_all(rlo: &[u8], rhi: &[u8], lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    let lo_ok = match lo {
        Some(l) => rlo <= l,
        None => rlo.is_empty(),
    };
    lo_ok && hi.is_some_and(|h| h <= rhi)
}

/// Moves messages into a node: applied to a leaf's basements, or queued in an internal node's
/// child buffers.
fn push_down(ctx: &Ctx<'_>, node: &mut Node, msgs: &MsgBuffer) -> Result<()> {
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
                while let Some(first) = rest.first() {
                    let i = child_for(pivots, first.key);
                    let hi = pivots.get(i).map(Vec::as_slice);
                    let n = hi.map_or(rest.len(), |h| rest.partition_point(|m| m.key < h));
                    Arc::make_mut(parts[i].get_mut()).apply(&rest[..n], &[], ctx.upserts)?;
                    rest = &rest[n..];
                }
                normalize_basements(pivots, parts, ctx.shape.basement_bytes);
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
        Body::Internal {
            pivots,
            children,
            bufs,
        } => {
            let mut fresh = Vec::new();
            for (m, raw) in msgs.in_msn_order() {
                if m.kind != Kind::RangeDelete {
                    bufs[child_for(pivots, m.key)].get_mut().push_raw(raw);
                    continue;
                }
                for i in 0..children.len() {
                    let (lo, hi) = range_of(pivots, i);
                    if !intersects(m.key, m.payload, lo, hi) {
                        continue;
                    }
                    if covers_all(m.key, m.payload, lo, hi) {
                        // Everything below child i is older than this message and deleted by
                        // it: drop the subtree instead of carrying the delete down.
                        let old = children[i];
                        let leaf = Node::new_leaf(ctx.new_id());
                        children[i] = leaf.id;
                        fresh.push(leaf.id);
                        ctx.put(leaf);
                        *bufs[i].get_mut() = MsgBuffer::new();
                        drop_subtree(ctx, old)?;
                    } else {
                        bufs[i].get_mut().push_raw(raw);
                    }
                }
            }
            for b in bufs.iter_mut() {
                b.get_mut().seal_coalescing(ctx.upserts);
            }
            // Children replaced by empty leaves that received nothing since: remove them; a
            // neighbour takes the (now empty) key range.
            for id in fresh {
                if children.len() < 2 {
                    break;
                }
                if let Some(at) = children.iter().position(|&c| c == id) {
                    if bufs[at].get_mut().is_empty() {
                        ctx.free(id);
                        children.remove(at);
                        bufs.remove(at);
                        pivots.remove(at.saturating_sub(1));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Frees every node of a subtree, reading only internal nodes' headers.
fn drop_subtree(ctx: &Ctx<'_>, id: NodeId) -> Result<()> {
    let mut stack = vec![id];
    while let Some(id) = stack.pop() {
        let node = ctx.fetch(id)?;
        if let Body::Internal { children, .. } = &node.body {
            stack.extend(children.iter().copied());
        }
        drop(node);
        ctx.free(id);
    }
    Ok(())
}

/// Splits basements over the size limit and removes empty ones (a leaf keeps at least one).
fn normalize_basements(
    pivots: &mut Vec<Vec<u8>>,
    parts: &mut Vec<Part<Arc<Basement>>>,
    limit: usize,
) {
    // Most pushes leave every basement within bounds: then nothing moves (and no basement is
    // unshared, which would copy it when a reader or a checkpoint still holds it).
    let out_of_bounds = |b: &Basement| b.is_empty() || (b.bytes() > limit && b.len() > 1);
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
fn flush_if_needed(ctx: &Ctx<'_>, node: &mut Node) -> Result<()> {
    while node.payload_bytes() > ctx.shape.node_bytes {
        let Body::Internal { bufs, .. } = &mut node.body else {
            return Ok(());
        };
        let (i, _) = bufs
            .iter_mut()
            .map(|b| b.get_mut().bytes())
            .enumerate()
            .max_by_key(|&(_, b)| b)
            .unwrap_or((0, 0));
        flush_child(ctx, node, i, Below::IfNeeded)?;
    }
    Ok(())
}

/// Flushes the buffers on `key`'s path, from this node down to its leaf.
fn flush_key_path(ctx: &Ctx<'_>, node: &mut Node, key: &[u8]) -> Result<()> {
    let Body::Internal { pivots, .. } = &node.body else {
        return Ok(());
    };
    let i = child_for(pivots, key);
    flush_child(ctx, node, i, Below::Path(key))?;
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
        if bufs[i]
            .get_mut()
            .has_at_least_for_key(m.key, hot_key_messages(ctx.shape))
        {
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
        let (pieces, merged) = flush_child(ctx, node, i, Below::All)?;
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
        .max_by_key(|&(_, d)| d)
        .filter(|&(_, d)| d > 0)
        .map(|(i, _)| i);
    let pick = match best {
        Some(i) => Some(i),
        None if node.height > 1 => {
            let mut found = None;
            for (i, &c) in children.iter().enumerate() {
                if deletes_below(ctx, c)? {
                    found = Some(i);
                    break;
                }
            }
            found
        }
        None => None,
    };
    if let Some(i) = pick {
        flush_child(ctx, node, i, Below::Reclaim)?;
    }
    Ok(())
}

/// Moves child `i`'s whole buffer into the child (invariant N4: a flush moves every message
/// for the child, so messages above are always newer than messages below), then fixes the
/// child's shape.
///
/// Returns the ids of the pieces the child became and, if a merge followed, the merged node's
/// id (which `flush_all` must visit again: the merge may have pushed messages into it).
fn flush_child(
    ctx: &Ctx<'_>,
    node: &mut Node,
    i: usize,
    below: Below<'_>,
) -> Result<(Vec<NodeId>, Option<NodeId>)> {
    let Body::Internal {
        pivots,
        children,
        bufs,
    } = &mut node.body
    else {
        return Ok((Vec::new(), None));
    };
    let msgs = std::mem::take(bufs[i].get_mut());
    let mut child = ctx.take(children[i])?;
    ctx.counters.flushed(child.is_leaf(), msgs.bytes());
    push_down(ctx, &mut child, &msgs)?;
    drop(msgs);
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
        if children.len() > 1 && bufs[at].get_mut().is_empty() {
            ctx.free(children[at]);
            children.remove(at);
            bufs.remove(at);
            pivots.remove(at.saturating_sub(1));
        }
    }
    // Keep merging while the merged node is still small (a run of emptied leaves collapses).
    let mut at = i;
    let mut merged = None;
    while small && children.len() > 1 {
        match merge_small_child(ctx, pivots, children, bufs, at)? {
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

/// Merges the small child `at` with a neighbour of the same kind when the result stays well
/// under the limits (so it does not split again at once). Messages pending in this node for the
/// two children are pushed into them first, so afterwards nothing is buffered above the merged
/// node for its range but messages newer than everything in it (invariant N4), which keeps the
/// per-basement MSN floors of the merged leaves valid.
fn merge_small_child(
    ctx: &Ctx<'_>,
    pivots: &mut Vec<Vec<u8>>,
    children: &mut Vec<NodeId>,
    bufs: &mut Vec<Part<MsgBuffer>>,
    at: usize,
) -> Result<Option<(usize, bool)>> {
    let byte_limit = ctx.shape.node_bytes * 3 / 4;
    let child_limit = (ctx.shape.fanout / 2).max(2);
    let candidates = [(at, at + 1), (at.wrapping_sub(1), at)];
    for (l, r) in candidates {
        if r >= children.len() || l >= children.len() {
            continue;
        }
        let mut left = ctx.take(children[l])?;
        let mut right = ctx.take(children[r])?;
        let pending = bufs[l].get_mut().growth_bound() + bufs[r].get_mut().growth_bound();
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
                },
                Body::Internal {
                    pivots: rp,
                    children: rc,
                    bufs: rb,
                },
            ) => {
                lp.push(pivots[l].clone());
                lp.extend(rp);
                lc.extend(rc);
                lb.extend(rb);
                Body::Internal {
                    pivots: lp,
                    children: lc,
                    bufs: lb,
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
        pivots.remove(l);
        let still_small = is_small(ctx.shape, &merged);
        ctx.put(merged);
        return Ok(Some((l, still_small)));
    }
    Ok(None)
}

/// Whether a node is small enough that merging it with a neighbour is worth a read.
fn is_small(shape: &Shape, node: &Node) -> bool {
    match &node.body {
        Body::Leaf { .. } => node.payload_bytes() < shape.node_bytes / 4,
        Body::Internal { children, .. } => children.len() <= (shape.fanout / 4).max(1),
    }
}

fn is_empty_leaf(node: &Node) -> bool {
    matches!(&node.body, Body::Leaf { parts, .. }
        if parts.len() == 1 && parts[0].get().is_some_and(|b| b.is_empty()))
}

/// Splits a node that is over its size (leaf) or fanout (internal) into pieces.
/// Returns (lower pivot, node) pairs; the first piece keeps the original id.
fn split_if_needed(ctx: &Ctx<'_>, node: Node) -> Vec<(Option<Vec<u8>>, Node)> {
    let shape = ctx.shape;
    // The [start, end) ranges of parts (leaf) or children (internal) each piece takes.
    let groups: Vec<(usize, usize)> = match &node.body {
        Body::Leaf { parts, .. } => {
            let sizes: Vec<usize> = parts
                .iter()
                .map(|p| p.get().map_or(0, |b| b.bytes()))
                .collect();
            let total: usize = sizes.iter().sum();
            if total <= shape.node_bytes || parts.len() < 2 {
                return vec![(None, node)];
            }
            let k = total
                .div_ceil(shape.node_bytes * 3 / 4)
                .clamp(2, parts.len());
            group_by_size(&sizes, k)
        }
        Body::Internal { children, .. } => {
            if children.len() <= shape.fanout {
                return vec![(None, node)];
            }
            let n = children.len();
            let k = n.div_ceil(shape.fanout).max(2);
            (0..k).map(|g| (g * n / k, (g + 1) * n / k)).collect()
        }
    };
    let lowers: Vec<Option<Vec<u8>>> = {
        let (Body::Leaf { pivots, .. } | Body::Internal { pivots, .. }) = &node.body;
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
        } => {
            let mut bufs = bufs.into_iter();
            groups
                .iter()
                .map(|&(start, end)| Body::Internal {
                    pivots: pivots[start..end - 1].to_vec(),
                    children: children[start..end].to_vec(),
                    bufs: bufs.by_ref().take(end - start).collect(),
                })
                .collect()
        }
    };
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
        .collect()
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

// ---------------------------------------------------------------------------------------------
// Readers

/// Point lookup: the leaf's row with every pending message on the path applied, oldest first.
pub(crate) fn get(ctx: &Ctx<'_>, root: NodeId, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut path: Vec<(SharedNode, usize)> = Vec::new();
    let mut id = root;
    let leaf = loop {
        let n = ctx.fetch(id)?;
        match &n.body {
            Body::Leaf { .. } => break n,
            Body::Internal {
                pivots, children, ..
            } => {
                let i = child_for(pivots, key);
                id = children[i];
                path.push((n.clone(), i));
            }
        }
    };
    let b = ctx.basement(&leaf, child_for(leaf.pivots(), key))?;
    let floor = b.max_msn;
    let mut value = b.get(key).map(<[u8]>::to_vec);
    let mut points = Vec::new();
    for (n, i) in path.iter().rev() {
        let buf = ctx.buffer(n, *i)?;
        points.clear();
        buf.for_key(key, &mut points);
        let mut ranges = buf.ranges().filter(|r| r.covers(key)).peekable();
        for m in points.iter().filter(|m| m.msn > floor) {
            while let Some(r) = ranges.next_if(|r| r.msn < m.msn) {
                if r.msn > floor {
                    value = None;
                }
            }
            value = msg::apply(m, key, value, ctx.upserts)?;
        }
        if ranges.any(|r| r.msn > floor) {
            value = None;
        }
    }
    Ok(value)
}

/// Which leaf a range query wants.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Seek<'k> {
    /// The leaf holding `key` (the first leaf for the empty key).
    AtOrAfter(&'k [u8]),
    /// The leaf holding the greatest keys below `key`.
    Before(&'k [u8]),
    /// The last leaf.
    Last,
}

/// Consecutive basements of a leaf with every pending message applied, and the key range they
/// cover (a part of the leaf's range: see `leaf_rows`).
pub(crate) struct LeafRows {
    pub rows: Vec<Arc<Basement>>,
    /// Inclusive lower bound of the leaf's range (None: unbounded).
    pub lo: Option<Vec<u8>>,
    /// Exclusive upper bound (None: unbounded).
    pub hi: Option<Vec<u8>>,
}

/// Materializes a window of one leaf for a scan or cursor.
pub(crate) fn leaf_rows(ctx: &Ctx<'_>, root: NodeId, seek: Seek<'_>) -> Result<LeafRows> {
    let mut path: Vec<(SharedNode, usize)> = Vec::new();
    let (mut lo, mut hi): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
    let mut id = root;
    let leaf = loop {
        let n = ctx.fetch(id)?;
        let Body::Internal {
            pivots, children, ..
        } = &n.body
        else {
            break n;
        };
        let i = match seek {
            Seek::AtOrAfter(k) => child_for(pivots, k),
            Seek::Before(k) => child_before(pivots, k),
            Seek::Last => children.len() - 1,
        };
        let (clo, chi) = range_of(pivots, i);
        if let Some(l) = clo {
            lo = Some(l.to_vec());
        }
        if let Some(h) = chi {
            hi = Some(h.to_vec());
        }
        id = children[i];
        path.push((n.clone(), i));
    };
    // Only a window of the leaf's basements is materialized — the one the seek lands in, and
    // neighbours in the direction of travel up to two basements' worth of rows (32 KiB by
    // default; small test shapes get small windows, so tests cross windows) — with the window's
    // bounds as `lo`/`hi`, so the cursor continues with the next window. A scan that wants a
    // few rows (a directory's first entry, a readdir page) pays for one basement and the
    // messages for it, not for the whole leaf and every message pending above it.
    let pivots = leaf.pivots();
    let nparts = pivots.len() + 1;
    let (mut first, mut last) = match seek {
        Seek::AtOrAfter(k) => {
            let j = child_for(pivots, k);
            (j, j)
        }
        Seek::Before(k) => {
            let j = child_before(pivots, k);
            (j, j)
        }
        Seek::Last => (nparts - 1, nparts - 1),
    };
    let window_bytes = 2 * ctx.shape.basement_bytes;
    let mut bytes = ctx.basement(&leaf, first)?.bytes();
    while bytes < window_bytes {
        let next = match seek {
            Seek::AtOrAfter(_) if last + 1 < nparts => last + 1,
            Seek::Before(_) | Seek::Last if first > 0 => first - 1,
            _ => break,
        };
        bytes += ctx.basement(&leaf, next)?.bytes();
        first = first.min(next);
        last = last.max(next);
    }
    if first > 0 {
        lo = Some(pivots[first - 1].clone());
    }
    if last + 1 < nparts {
        hi = Some(pivots[last].clone());
    }
    // Pending messages for the window, from every ancestor, in (key, MSN) order.
    let mut points: Vec<MsgRef<'_>> = Vec::new();
    let mut ranges: Vec<MsgRef<'_>> = Vec::new();
    for (n, i) in &path {
        let buf = ctx.buffer(n, *i)?;
        buf.points_in(lo.as_deref().unwrap_or(&[]), hi.as_deref(), &mut points);
        ranges.extend(buf.ranges());
    }
    points.sort_by(|a, b| (a.key, a.msn).cmp(&(b.key, b.msn)));
    ranges.sort_by_key(|r| r.msn);
    let mut rows = Vec::with_capacity(last - first + 1);
    let mut scratch = Vec::new();
    for j in first..=last {
        let (blo, bhi) = range_of(pivots, j);
        let b = ctx.basement(&leaf, j)?;
        let start = blo.map_or(0, |l| points.partition_point(|m| m.key < l));
        let end = bhi.map_or(points.len(), |h| points.partition_point(|m| m.key < h));
        scratch.clear();
        scratch.extend(
            ranges
                .iter()
                .filter(|r| intersects(r.key, r.payload, blo, bhi))
                .copied(),
        );
        if start < end || !scratch.is_empty() {
            let mut b = Basement::clone(b);
            b.apply(&points[start..end], &scratch, ctx.upserts)?;
            rows.push(Arc::new(b));
        } else {
            rows.push(b.clone()); // shared with the cache: no copy
        }
    }
    Ok(LeafRows { rows, lo, hi })
}

// ---------------------------------------------------------------------------------------------
// Verification

/// What a full walk of a tree found (see [`crate::Tree::verify`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeReport {
    /// Leaf nodes.
    pub leaves: u64,
    /// Internal nodes.
    pub internal: u64,
    /// Levels from the root to the deepest leaf (1 = the root is a leaf).
    pub height: u32,
    /// Rows stored in leaves (before pending messages are applied).
    pub rows: u64,
    /// Bytes of packed rows in leaves.
    pub row_bytes: u64,
    /// Messages waiting in internal nodes' buffers (the message backlog).
    pub pending_messages: u64,
    /// Bytes of those messages.
    pub pending_bytes: u64,
}

/// Walks the whole tree, reading every node, and checks the structural invariants: pivots
/// ascend and lie inside the parent's range (N1), rows ascend and lie inside their basement's
/// range (N2), buffered messages belong to their child's range, and every message buffered for
/// a child is newer than everything below it (N4).
pub(crate) fn verify(ctx: &Ctx<'_>, root: NodeId) -> Result<TreeReport> {
    let mut report = TreeReport::default();
    walk(ctx, root, None, None, 1, &mut report, &mut |_, _, _, e| {
        Err(e)
    })?;
    Ok(report)
}

/// A node [`Tree::verify_all`](crate::Tree::verify_all) could not read or that breaks an
/// invariant, with the key range its subtree covers (`None`: unbounded).
#[derive(Debug)]
pub struct DamagedNode {
    /// The node (for an unreadable partition of a leaf: the leaf).
    pub node: NodeId,
    /// Smallest key the damaged part may hold.
    pub lo: Option<Vec<u8>>,
    /// Keys below this.
    pub hi: Option<Vec<u8>>,
    /// What is wrong.
    pub error: Error,
}

/// Like [`verify`], but goes on past damage: every unreadable or inconsistent subtree is
/// recorded (and not descended into) and the walk continues with its siblings.
pub(crate) fn verify_all(ctx: &Ctx<'_>, root: NodeId) -> Result<(TreeReport, Vec<DamagedNode>)> {
    let mut report = TreeReport::default();
    let mut damaged = Vec::new();
    let mut sink = |node: NodeId, lo: Option<&[u8]>, hi: Option<&[u8]>, error: Error| {
        damaged.push(DamagedNode {
            node,
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
            error,
        });
        Ok(())
    };
    if let Err(e) = walk(ctx, root, None, None, 1, &mut report, &mut sink) {
        sink(root, None, None, e)?;
    }
    Ok((report, damaged))
}

/// Where [`walk`] sends the damage it finds in a subtree: `Err` stops the walk (verify),
/// `Ok` records it and goes on (verify_all).
type DamageSink<'s> = dyn FnMut(NodeId, Option<&[u8]>, Option<&[u8]>, Error) -> Result<()> + 's;

/// Returns the highest MSN found in the subtree.
fn walk(
    ctx: &Ctx<'_>,
    id: NodeId,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    depth: u32,
    report: &mut TreeReport,
    sink: &mut DamageSink<'_>,
) -> Result<crate::Msn> {
    let bad = |detail: String| Error::corrupt(format!("node {id}"), detail);
    let node = ctx.fetch(id)?;
    report.height = report.height.max(depth);
    let pivots = node.pivots();
    for p in pivots {
        if lo.is_some_and(|l| p.as_slice() <= l) || hi.is_some_and(|h| p.as_slice() >= h) {
            return Err(bad(
                "pivot outside the node's key range (invariant N1)".into()
            ));
        }
    }
    if pivots.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("pivots out of order (invariant N1)".into()));
    }
    let bound = |i: usize| {
        let (a, b) = range_of(pivots, i);
        (a.or(lo), b.or(hi))
    };
    let mut max = crate::Msn(0);
    match &node.body {
        Body::Leaf { .. } => {
            report.leaves += 1;
            for i in 0..=pivots.len() {
                let (blo, bhi) = bound(i);
                let b = match ctx.basement(&node, i) {
                    Ok(b) => b,
                    Err(e) => {
                        sink(id, blo, bhi, e)?;
                        continue;
                    }
                };
                report.rows += b.len() as u64;
                report.row_bytes += b.bytes() as u64;
                max = max.max(b.max_msn);
                for r in 0..b.len() {
                    let k = b.key(r);
                    if blo.is_some_and(|l| k < l) || bhi.is_some_and(|h| k >= h) {
                        return Err(bad(format!(
                            "row outside basement {i}'s range (invariant N2)"
                        )));
                    }
                }
            }
        }
        Body::Internal { children, .. } => {
            report.internal += 1;
            for (i, &child) in children.iter().enumerate() {
                let (clo, chi) = bound(i);
                let below = match walk(ctx, child, clo, chi, depth + 1, report, sink) {
                    Ok(b) => b,
                    Err(e) => {
                        sink(child, clo, chi, e)?;
                        continue;
                    }
                };
                let buf = ctx.buffer(&node, i)?;
                report.pending_messages += buf.count() as u64;
                report.pending_bytes += buf.bytes() as u64;
                for (m, _) in buf.in_msn_order() {
                    if m.msn <= below {
                        return Err(bad(format!(
                            "message {} buffered for child {child} is not newer than its subtree's {} (invariant N4)",
                            m.msn, below
                        )));
                    }
                    if m.kind != Kind::RangeDelete
                        && (clo.is_some_and(|l| m.key < l) || chi.is_some_and(|h| m.key >= h))
                    {
                        return Err(bad(format!("message buffered for the wrong child {i}")));
                    }
                    max = max.max(m.msn);
                }
                max = max.max(below);
            }
        }
    }
    Ok(max)
}

/// How many messages for `key` wait in buffers on its root-to-leaf path.
pub(crate) fn pending_for(ctx: &Ctx<'_>, root: NodeId, key: &[u8]) -> Result<usize> {
    let mut id = root;
    let mut n = 0;
    loop {
        let node = ctx.fetch(id)?;
        let Body::Internal {
            pivots, children, ..
        } = &node.body
        else {
            return Ok(n);
        };
        let i = child_for(pivots, key);
        n += ctx.buffer(&node, i)?.count_for_key(key);
        id = children[i];
    }
}

impl crate::tree::Tree {
    /// How many messages for `key` are still buffered above its leaf (a read of the key
    /// applies each of them); a diagnostic for message backlog.
    pub fn pending_messages_for(&self, key: &[u8]) -> Result<usize> {
        self.env.read(self, |ctx, root| pending_for(ctx, root, key))
    }

    /// Reads every node of this tree and checks its structural invariants; returns what it saw.
    /// An error names the node that breaks an invariant.
    pub fn verify(&self) -> Result<TreeReport> {
        self.env.read(self, verify)
    }

    /// Like [`verify`](Self::verify), but does not stop at the first damaged node: returns
    /// every damaged or inconsistent subtree it found (not descended into), with the key range
    /// each covers, beside the figures of the part it could read (fsck).
    pub fn verify_all(&self) -> Result<(TreeReport, Vec<DamagedNode>)> {
        self.env.read(self, verify_all)
    }
}
