//! Detached flushes (design.md §2.5, "Flushes beside the writer"): the background drain moves a
//! root's fullest child buffer into the child *without* holding the environment's write lock,
//! on copies, and installs the result in one short step under the lock. Writers keep appending
//! to the root meanwhile, readers keep reading the old tree, and the two cores work at once
//! instead of taking turns.
//!
//! Invariants (kept here and where each is cited):
//! * **DF1** The flush works on copies: the root keeps the flushed messages in its buffer and
//!   the cache keeps the child's subtree as it was until the install, so readers, checkpoints
//!   and eviction see the old, consistent tree throughout; what the flush changes, creates or
//!   frees stays in its [`Overlay`] until then, and a discarded flush leaves no trace.
//! * **DF2** While it runs, nothing else changes the busy child or anything below it: writers'
//!   inline flushes, hot-key cooling, merges and reclamation skip it (`Ctx::busy`), no range
//!   delete drops a subtree anywhere in the tree (it is buffered like any message), and
//!   optimize waits. So the subtree it copied is the subtree it replaces, and every node it
//!   reads keeps its block until the install.
//! * **DF3** The flushed messages are frozen in the root's buffer (`MsgBuffer::freeze`): no
//!   newer message coalesces into them and the buffer is not compacted, so the install removes
//!   exactly the messages that went down; newer ones stay above (N4 holds: all newer than the
//!   child's).
//! * **DF4** The install runs under the write lock in one step: the frozen messages leave the
//!   root, the overlay's nodes enter the cache dirty, its freed nodes are freed, and the child's
//!   entry becomes the pieces it split into (newer messages routed to them by the new pivots).
//!   A root that no longer holds the child directly (it split meanwhile), or whose buffer lost
//!   its mark (evicted and read back: the mark lives in memory only), discards the flush —
//!   always safe, since the flushed messages never left the root.
//!
//! Never: decides when the drain runs (drain.rs) or what a flush does below the child
//! (flush.rs, apply.rs).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::apply::push_down;
use super::flush::{finish_root, flush_if_needed};
use super::reshape::split_if_needed;
use super::{intersects, range_of, Ctx};
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::error::Result;
use crate::ids::NodeId;
use crate::msg::Kind;
use crate::node::{child_for, Body, Node, Part, SharedNode};

/// A detached flush's private nodes (DF1).
#[derive(Default)]
pub(crate) struct Overlay {
    inner: Mutex<OverlayState>,
}

#[derive(Default)]
struct OverlayState {
    nodes: HashMap<NodeId, Node>,
    changed: HashSet<NodeId>,
    freed: Vec<NodeId>,
    /// Nodes the flight has taken out to change (copies of cached nodes, nodes read from the
    /// device, or its own nodes taken back), with the bytes each is charged until it is put
    /// or freed: a flush cascade holds the child and a node per level below it at once.
    held: HashMap<NodeId, usize>,
    /// Bytes charged to the cache for the flight: `nodes` (their `mem_now` when put), `held`,
    /// and the frozen messages, so that eviction makes room for the copies while the
    /// originals stay cached (C1 holds during a flight).
    charged: usize,
}

impl OverlayState {
    fn uncharge(&mut self, node: &Node, cache: &Cache) {
        self.uncharge_bytes(node.mem.load(Ordering::Relaxed), cache);
    }

    fn uncharge_bytes(&mut self, bytes: usize, cache: &Cache) {
        let m = bytes.min(self.charged);
        self.charged -= m;
        cache.charge(-(m as isize));
    }

    /// Ends the charge of a node the flight held out (put back or freed).
    fn unhold(&mut self, id: NodeId, cache: &Cache) {
        if let Some(b) = self.held.remove(&id) {
            self.uncharge_bytes(b, cache);
        }
    }
}

impl Overlay {
    pub(super) fn shared(&self, id: NodeId) -> Option<SharedNode> {
        self.inner
            .lock()
            .nodes
            .get(&id)
            .map(|n| Arc::new(n.clone()))
    }

    pub(super) fn take(&self, id: NodeId, cache: &Cache) -> Option<Node> {
        let mut st = self.inner.lock();
        let node = st.nodes.remove(&id)?;
        st.uncharge(&node, cache);
        Some(node)
    }

    /// Charges a node the flight took out to change at `bytes` (its memory with every
    /// partition loaded) until it is put back or freed.
    pub(super) fn hold(&self, id: NodeId, bytes: usize, cache: &Cache) {
        let mut st = self.inner.lock();
        st.unhold(id, cache);
        st.held.insert(id, bytes);
        st.charged += bytes;
        cache.charge(bytes as isize);
    }

    pub(super) fn put(&self, node: Node, changed: bool, cache: &Cache) {
        let mut st = self.inner.lock();
        st.unhold(node.id, cache);
        if changed {
            st.changed.insert(node.id);
        }
        let m = node.mem_now();
        node.mem.store(m, Ordering::Relaxed);
        st.charged += m;
        cache.charge(m as isize);
        if let Some(old) = st.nodes.insert(node.id, node) {
            st.uncharge(&old, cache);
        }
    }

    /// Charges other memory the flight holds until it ends (its frozen copy of the messages).
    fn count(&self, bytes: usize, cache: &Cache) {
        self.inner.lock().charged += bytes;
        cache.charge(bytes as isize);
    }

    pub(super) fn free(&self, id: NodeId, cache: &Cache) {
        let mut st = self.inner.lock();
        st.unhold(id, cache);
        if let Some(old) = st.nodes.remove(&id) {
            st.uncharge(&old, cache);
        }
        st.changed.remove(&id);
        st.freed.push(id);
    }

    /// Stops charging whatever is left (a discarded flush, or the install, whose `put`s
    /// count the nodes anew).
    fn release(&self, cache: &Cache) {
        let mut st = self.inner.lock();
        cache.charge(-(st.charged as isize));
        st.charged = 0;
        st.held.clear();
    }

    /// The install's part (DF4): changed nodes into the cache (dirty), freed ones freed.
    fn commit(self, ctx: &Ctx<'_>) {
        self.release(ctx.cache);
        let st = self.inner.into_inner();
        for (id, node) in st.nodes {
            if st.changed.contains(&id) {
                ctx.put(node);
            }
        }
        for id in st.freed {
            ctx.free(id);
        }
    }
}

/// A flush taken out of a root, run beside the writers, then installed or discarded.
pub(crate) struct Detached {
    /// The root's child that receives the messages.
    pub(crate) child: NodeId,
    /// A copy of the frozen messages (DF3).
    msgs: MsgBuffer,
    /// The pieces the child became (pivot before each but the first), once run.
    pieces: Vec<(Option<Vec<u8>>, NodeId)>,
    overlay: Overlay,
}

/// Under the write lock: if `root` is an internal node above internal nodes and its buffers
/// are over the node size, freezes its fullest child buffer and returns the flush to run
/// (flushes into leaves stay under the lock: a leaf delta is a cheap append).
pub(crate) fn detach(ctx: &Ctx<'_>, root: NodeId) -> Result<Option<Detached>> {
    let mut node = ctx.take(root)?;
    let over = node.payload_bytes() > ctx.shape.node_bytes;
    let plan = match &mut node.body {
        Body::Internal { children, bufs, .. } if over && node.height >= 2 => bufs
            .iter_mut()
            .map(|b| b.get_mut().bytes())
            .enumerate()
            .max_by_key(|&(_, b)| b)
            .filter(|&(_, b)| b > 0)
            .map(|(i, _)| Detached {
                child: children[i],
                msgs: bufs[i].get_mut().freeze(),
                pieces: Vec::new(),
                overlay: Overlay::default(),
            }),
        _ => None,
    };
    if let Some(flight) = &plan {
        // The frozen copy is charged with the overlay until the install or discard.
        flight.overlay.count(flight.msgs.mem(), ctx.cache);
    }
    // Freezing changes no row: the root is not made dirty by it.
    ctx.put_unchanged(node);
    Ok(plan)
}

impl Detached {
    /// With no lock: the flush itself on copies (DF1). `ctx` is the environment's context;
    /// the overlay is added here.
    pub(crate) fn run(&mut self, ctx: &Ctx<'_>) -> Result<()> {
        let ctx = Ctx {
            overlay: Some(&self.overlay),
            busy: None,
            ..*ctx
        };
        let mut child = ctx.take(self.child)?;
        ctx.counters.flushed(child.is_leaf(), self.msgs.bytes());
        push_down(&ctx, &mut child, &self.msgs)?;
        if !child.is_leaf() {
            flush_if_needed(&ctx, &mut child)?;
        }
        for (pivot, piece) in split_if_needed(&ctx, child) {
            self.pieces.push((pivot, piece.id));
            ctx.put(piece);
        }
        Ok(())
    }

    /// Under the write lock: the install (DF4). Returns the root's id afterwards and whether
    /// it is still over the node size, or `None` when the flush was discarded (the root no
    /// longer holds the child directly); either way the freeze has ended.
    pub(crate) fn install(self, ctx: &Ctx<'_>, root: NodeId) -> Result<Option<(NodeId, bool)>> {
        let mut node = ctx.take(root)?;
        let Body::Internal {
            pivots,
            children,
            bufs,
            deltas,
        } = &mut node.body
        else {
            ctx.put_unchanged(node);
            self.discard(ctx, root)?;
            return Ok(None);
        };
        let Some(i) = children.iter().position(|&c| c == self.child) else {
            ctx.put_unchanged(node);
            self.discard(ctx, root)?;
            return Ok(None);
        };
        if !bufs[i].get_mut().is_frozen() {
            // The root was evicted and read back meanwhile: the mark is gone, newer messages
            // may have coalesced into the flushed ones (DF3 no longer holds), so nothing of
            // the flush may be kept. The messages are all still in the buffer.
            ctx.put_unchanged(node);
            self.overlay.release(ctx.cache);
            return Ok(None);
        }
        bufs[i].get_mut().drop_frozen();
        self.overlay.commit(ctx);
        // The child's entry becomes its pieces; messages that arrived meanwhile follow the new
        // pivots (they are newer than everything below: N4).
        let newer = std::mem::take(bufs[i].get_mut());
        let mut piece_pivots: Vec<Vec<u8>> = Vec::new();
        for (k, (pivot, id)) in self.pieces.iter().enumerate() {
            if k == 0 {
                children[i] = *id;
                continue;
            }
            let pivot = pivot.clone().unwrap_or_default();
            piece_pivots.push(pivot.clone());
            pivots.insert(i + k - 1, pivot);
            children.insert(i + k, *id);
            bufs.insert(i + k, Part::loaded(MsgBuffer::new()));
            deltas.insert(i + k, Vec::new());
        }
        if piece_pivots.is_empty() {
            *bufs[i].get_mut() = newer;
        } else {
            for (m, raw) in newer.in_msn_order() {
                if m.kind != Kind::RangeDelete {
                    bufs[i + child_for(&piece_pivots, m.key)]
                        .get_mut()
                        .push_raw(raw);
                    continue;
                }
                for k in 0..=piece_pivots.len() {
                    let (lo, hi) = range_of(&piece_pivots, k);
                    if intersects(m.key, m.payload, lo, hi) {
                        bufs[i + k].get_mut().push_raw(raw);
                    }
                }
            }
            for b in &mut bufs[i..=i + piece_pivots.len()] {
                b.get_mut().seal();
            }
        }
        let over = node.payload_bytes() > ctx.shape.node_bytes;
        Ok(Some((finish_root(ctx, node)?, over)))
    }

    /// Under the write lock: ends a flush without installing it (DF1: nothing it made is
    /// kept). The frozen messages become ordinary ones wherever the child's entry now is —
    /// found by descending towards their keys, as a root that split may have moved it down.
    pub(crate) fn discard(self, ctx: &Ctx<'_>, root: NodeId) -> Result<()> {
        self.overlay.release(ctx.cache);
        let mut probe = Vec::new();
        self.msgs.points_in(&[], None, &mut probe);
        let key = match (probe.first(), self.msgs.ranges().next()) {
            (Some(m), _) => m.key.to_vec(),
            (None, Some(r)) => r.key.to_vec(),
            (None, None) => return Ok(()),
        };
        let mut id = root;
        loop {
            let node = ctx.fetch(id)?;
            let Body::Internal {
                pivots, children, ..
            } = &node.body
            else {
                return Ok(());
            };
            if children.contains(&self.child) {
                break;
            }
            id = children[child_for(pivots, &key)];
        }
        let mut holder = ctx.take(id)?;
        if let Body::Internal { children, bufs, .. } = &mut holder.body {
            if let Some(i) = children.iter().position(|&c| c == self.child) {
                bufs[i].get_mut().unfreeze();
            }
        }
        ctx.put_unchanged(holder);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Env, Options, WriteBatch};

    /// An environment holding one tree with some rows, and the tree's root id.
    fn env_with_rows() -> (tempfile::TempDir, Env, NodeId) {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            checkpoint_thread: false,
            ..Options::default()
        };
        let env = Env::create(dir.path().join("img"), opts).unwrap();
        let t = env.tree("t").unwrap();
        let mut b = WriteBatch::new();
        for i in 0u32..2000 {
            b.insert(&t, &i.to_be_bytes(), &[7u8; 100]);
        }
        env.write(b).unwrap();
        let root = env.inner.state.read().trees[t.idx].root;
        (dir, env, root)
    }

    /// A flight's copy of a cached node is memory beside the original, which stays cached
    /// (DF1): it is charged from the moment the flight takes it until the flight puts it back
    /// or frees it, then once more as an overlay node until the install or discard. Before,
    /// the copies a flush cascade was changing were not counted at all and E1 under a memory
    /// limit equal to its budget peaked ~10 MiB above the cache's count (BENCHMARKS.md, "The
    /// engines inside a memory cap equal to their budget").
    #[test]
    fn a_flights_copies_are_charged_while_it_holds_them() {
        let (_dir, env, root) = env_with_rows();
        let base = env.inner.ctx();
        let before = base.cache.used_bytes() as usize;
        let overlay = Overlay::default();
        let ctx = Ctx {
            overlay: Some(&overlay),
            ..base
        };
        let copy = ctx.take(root).unwrap();
        let held = copy.mem_now();
        assert!(held > 2000 * 100, "the copy holds the rows: {held}");
        assert_eq!(ctx.cache.used_bytes() as usize, before + held, "held");
        ctx.put(copy);
        let put = overlay.inner.lock().nodes[&root]
            .mem
            .load(Ordering::Relaxed);
        assert_eq!(ctx.cache.used_bytes() as usize, before + put, "put");
        let again = ctx.take(root).unwrap();
        ctx.free(again.id);
        assert_eq!(ctx.cache.used_bytes() as usize, before, "freed");
        overlay.release(ctx.cache);
        assert_eq!(ctx.cache.used_bytes() as usize, before, "released");
    }

    /// A flight makes room in the cache as it takes nodes: writers may be waiting for its
    /// install, so nobody else would (C1 during a flight).
    #[test]
    fn a_flight_evicts_when_the_cache_is_over_its_bound() {
        let (_dir, env, root) = env_with_rows();
        let base = env.inner.ctx();
        let evicted_before = base.cache.stats().evictions;
        // Everything cached is now over the bound.
        let over = base.cache.limit() as isize;
        base.cache.charge(over);
        let overlay = Overlay::default();
        let ctx = Ctx {
            overlay: Some(&overlay),
            ..base
        };
        let copy = ctx.take(root).unwrap();
        assert!(
            ctx.cache.stats().evictions > evicted_before,
            "the flight evicted nothing"
        );
        ctx.put_unchanged(copy);
        overlay.release(ctx.cache);
        ctx.cache.charge(-over);
    }
}
