//! The invariant walk behind `Tree::verify` and fsck's `Tree::verify_all` (N1, N2, N4 and
//! messages buffered for the right child), and the backlog diagnostic `pending_messages_for`.
//! Never: repairs anything.

use super::{delta, intersects, range_of, Ctx};
use crate::error::{Error, Result};
use crate::ids::NodeId;
use crate::msg::Kind;
use crate::node::{child_for, Body};

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
    /// Leaf deltas (format.md "Leaf deltas"). Their messages are not in `pending_messages`
    /// (the backlog of internal nodes' buffers, which `Env::backlog` reports without reading
    /// deltas) but here.
    pub deltas: u64,
    /// Messages held in leaf deltas.
    pub delta_messages: u64,
    /// Bytes of those messages.
    pub delta_bytes: u64,
}

/// Walks the whole tree, reading every node, and checks the structural invariants: pivots
/// ascend and lie inside the parent's range (N1), rows ascend and lie inside their basement's
/// range (N2), buffered messages belong to their child's range, and every message buffered for
/// a child is newer than everything below it (N4); a leaf's deltas hold messages of its range
/// (D3), newer than its rows and in MSN order along the chain (D2), and their names and sizes
/// match the parent's entry (D1).
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
        Body::Delta { .. } => {
            return Err(bad("a leaf delta named as a child (invariant D1)".into()));
        }
        Body::Internal {
            children, deltas, ..
        } => {
            report.internal += 1;
            for (i, &child) in children.iter().enumerate() {
                let (clo, chi) = bound(i);
                if !deltas[i].is_empty() && node.height != 1 {
                    return Err(bad(format!(
                        "child {i} above height 1 names leaf deltas (invariant D1)"
                    )));
                }
                let mut below = match walk(ctx, child, clo, chi, depth + 1, report, sink) {
                    Ok(b) => b,
                    Err(e) => {
                        sink(child, clo, chi, e)?;
                        continue;
                    }
                };
                for d in &deltas[i] {
                    match check_delta(ctx, d, clo, chi, below, report) {
                        Ok(m) => below = m,
                        Err(e) => sink(d.id, clo, chi, e)?,
                    }
                }
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

/// Checks one leaf delta against D1–D3 given the highest MSN below it (the leaf's, or the
/// previous delta's); returns its own highest MSN.
fn check_delta(
    ctx: &Ctx<'_>,
    d: &crate::node::DeltaRef,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    below: crate::Msn,
    report: &mut TreeReport,
) -> Result<crate::Msn> {
    let bad = |detail: String| Error::corrupt(format!("leaf delta node {}", d.id), detail);
    let node = ctx.fetch(d.id)?;
    let pivots = node.pivots();
    for p in pivots {
        if lo.is_some_and(|l| p.as_slice() <= l) || hi.is_some_and(|h| p.as_slice() >= h) {
            return Err(bad(
                "pivot outside its leaf's key range (invariant D3)".into()
            ));
        }
    }
    if pivots.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("pivots out of order (invariant N1)".into()));
    }
    let mut bytes = 0;
    let mut max = below;
    for i in 0..=pivots.len() {
        let buf = ctx.delta_msgs(&node, i)?;
        bytes += buf.bytes();
        report.delta_messages += buf.count() as u64;
        report.delta_bytes += buf.bytes() as u64;
        let (plo, phi) = range_of(pivots, i);
        let (plo, phi) = (plo.or(lo), phi.or(hi));
        let mut last = crate::Msn(0);
        for (m, _) in buf.in_msn_order() {
            if m.msn <= below || m.msn <= last {
                return Err(bad(format!(
                    "message {} in partition {i} is not newer than the leaf, the deltas before \
                     it ({below}) and the partition's previous message (invariant D2)",
                    m.msn
                )));
            }
            let outside = if m.kind == Kind::RangeDelete {
                !intersects(m.key, m.payload, plo, phi)
            } else {
                plo.is_some_and(|l| m.key < l) || phi.is_some_and(|h| m.key >= h)
            };
            if outside {
                return Err(bad(format!(
                    "message in partition {i} outside its key range (invariant D3)"
                )));
            }
            if let Some(f) = &d.filter {
                if m.kind == Kind::RangeDelete || !f.may_contain(m.key) {
                    return Err(bad(format!(
                        "message {} in partition {i} is not in the delta's key filter (invariant D6)",
                        m.msn
                    )));
                }
            }
            last = m.msn;
            max = max.max(m.msn);
        }
    }
    if bytes != d.bytes as usize {
        return Err(bad(format!(
            "holds {bytes} bytes of messages, its parent says {} (invariant D1)",
            d.bytes
        )));
    }
    report.deltas += 1;
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
        if let Body::Internal { deltas, .. } = &node.body {
            for d in delta::fetch(ctx, &deltas[i])? {
                n += ctx
                    .delta_msgs(&d, child_for(d.pivots(), key))?
                    .count_for_key(key);
            }
        }
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
