//! Readers: point lookups and the leaf windows cursors iterate, each with every pending message
//! on the path applied. They run under the environment's read lock and share cached nodes.
//! Never: changes a node.

use std::sync::Arc;

use super::{delta, intersects, range_of, Ctx};
use crate::basement::Basement;
use crate::buffer::MsgBuffer;
use crate::error::{Error, Result};
use crate::ids::{Msn, NodeId};
use crate::msg::{self, MsgRef, UpsertRegistry};
use crate::node::{child_before, child_for, Body, SharedNode};

/// The leaf deltas between the last node of `path` and the leaf below it (D1: only a height-1
/// node names deltas), oldest first. With `key`, only those whose key filter may hold it (D6:
/// the others have no message for it; a delta with a range delete has no filter); the skipped
/// ones are counted.
fn leaf_deltas(
    ctx: &Ctx<'_>,
    path: &[(SharedNode, usize)],
    key: Option<&[u8]>,
) -> Result<Vec<SharedNode>> {
    let Some((Body::Internal { deltas, .. }, i)) = path.last().map(|(n, i)| (&n.body, *i)) else {
        return Ok(Vec::new());
    };
    let Some(key) = key else {
        return delta::fetch(ctx, &deltas[i]);
    };
    let may = deltas[i].iter().filter(|d| d.may_hold(key));
    let fetched = delta::fetch(ctx, may)?;
    ctx.counters
        .delta_skips((deltas[i].len() - fetched.len()) as u64);
    Ok(fetched)
}

/// Point lookup: the leaf's row with every pending message on the path applied, oldest first:
/// the leaf's deltas (format.md "Leaf deltas", D2), then each ancestor's buffer from the
/// leaf's parent up. A cold read reads one partition per level plus the leaf's deltas
/// (at most `Shape::leaf_deltas` small blocks).
///
/// The messages are searched newest first — the buffers from the root down, then the deltas
/// newest first — and the first one found for `key` decides when it is an insert, a delete
/// or a range delete covering it: by N4 everything below it is older, so neither the older
/// messages nor the leaf's row can change the answer, and the leaf's basement, a cold
/// lookup's one device read, is not read. A key still buffered above its leaf or sitting in
/// a delta is answered from what the path already holds. Only an upsert needs what lies
/// below it, and then the whole path is folded oldest first.
pub(crate) fn get(ctx: &Ctx<'_>, root: NodeId, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut path: Vec<(SharedNode, usize)> = Vec::new();
    let mut upsert_seen = false;
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
                if !upsert_seen {
                    // Before the child is even fetched: a decided key costs no read below.
                    match newest_for_key(ctx.buffer(&n, i)?, key, ctx.upserts)? {
                        Newest::Decides(value) => return Ok(value),
                        Newest::Upsert => upsert_seen = true,
                        Newest::Nothing => {}
                    }
                }
                path.push((n.clone(), i));
            }
            Body::Delta { .. } => {
                return Err(Error::corrupt(
                    format!("node {id}"),
                    "a leaf delta named as a child (invariant D1)",
                ))
            }
        }
    };
    let deltas = leaf_deltas(ctx, &path, Some(key))?;
    if !upsert_seen {
        for d in deltas.iter().rev() {
            let buf = ctx.delta_msgs(d, child_for(d.pivots(), key))?;
            match newest_for_key(buf, key, ctx.upserts)? {
                Newest::Decides(value) => return Ok(value),
                Newest::Upsert => {
                    upsert_seen = true;
                    break;
                }
                Newest::Nothing => {}
            }
        }
    }
    let b = ctx.basement(&leaf, child_for(leaf.pivots(), key))?;
    if !upsert_seen {
        // No message for `key` anywhere on the path: the row is the answer.
        return Ok(b.get(key).map(<[u8]>::to_vec));
    }
    let floor = b.max_msn;
    let mut value = b.get(key).map(<[u8]>::to_vec);
    let mut points = Vec::new();
    for d in &deltas {
        let buf = ctx.delta_msgs(d, child_for(d.pivots(), key))?;
        value = fold_key(buf, key, floor, value, &mut points, ctx.upserts)?;
    }
    for (n, i) in path.iter().rev() {
        let buf = ctx.buffer(n, *i)?;
        value = fold_key(buf, key, floor, value, &mut points, ctx.upserts)?;
    }
    Ok(value)
}

/// What the newest message for a key in one buffer says.
enum Newest {
    /// No message for the key here.
    Nothing,
    /// An insert, delete or covering range delete: the key's value whatever lies below.
    Decides(Option<Vec<u8>>),
    /// An upsert: the value depends on what lies below.
    Upsert,
}

/// The newest of `buf`'s point messages for `key` and its range deletes covering `key`.
fn newest_for_key(buf: &MsgBuffer, key: &[u8], upserts: &UpsertRegistry) -> Result<Newest> {
    let mut points = Vec::new(); // allocates only when the key has messages here
    buf.for_key(key, &mut points);
    let point = points.last();
    let range = buf.ranges().filter(|r| r.covers(key)).max_by_key(|r| r.msn);
    let newest = match (point, range.as_ref()) {
        (Some(p), Some(r)) if r.msn > p.msn => r,
        (Some(p), _) => p,
        (None, Some(r)) => r,
        (None, None) => return Ok(Newest::Nothing),
    };
    Ok(match newest.kind {
        msg::Kind::Upsert => Newest::Upsert,
        _ => Newest::Decides(msg::apply(newest, key, None, upserts)?),
    })
}

/// Applies `buf`'s messages for `key` newer than `floor` to `value`, in MSN order.
fn fold_key<'b>(
    buf: &'b MsgBuffer,
    key: &[u8],
    floor: Msn,
    mut value: Option<Vec<u8>>,
    points: &mut Vec<MsgRef<'b>>,
    upserts: &UpsertRegistry,
) -> Result<Option<Vec<u8>>> {
    points.clear();
    buf.for_key(key, points);
    let mut ranges = buf.ranges().filter(|r| r.covers(key)).peekable();
    for m in points.iter().filter(|m| m.msn > floor) {
        while let Some(r) = ranges.next_if(|r| r.msn < m.msn) {
            if r.msn > floor {
                value = None;
            }
        }
        value = msg::apply(m, key, value, upserts)?;
    }
    if ranges.any(|r| r.msn > floor) {
        value = None;
    }
    Ok(value)
}

/// Leaves a forward scan asks the device to read ahead of the one it is in.
const SCAN_AHEAD: usize = 4;

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

/// Materializes a window of one leaf for a scan or cursor. `upper` (exclusive) is where a
/// forward scan stops: the window ends there at the latest, so neither the messages nor the
/// rows beyond it are touched.
pub(crate) fn leaf_rows(
    ctx: &Ctx<'_>,
    root: NodeId,
    seek: Seek<'_>,
    upper: Option<&[u8]>,
) -> Result<LeafRows> {
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
    // A forward scan that goes past this leaf's end reads the next leaves too: the first
    // window of a leaf asks the device to start reading the next ones its parent names, so
    // their reads overlap this leaf's merge.
    if let (Seek::AtOrAfter(k), Some((parent, i))) = (seek, path.last()) {
        let through = match (upper, hi.as_deref()) {
            (None, _) => true,
            (Some(u), Some(h)) => u >= h,
            (Some(_), None) => false,
        };
        if through && child_for(leaf.pivots(), k) == 0 {
            if let Body::Internal { children, .. } = &parent.body {
                for next in children.iter().skip(i + 1).take(SCAN_AHEAD) {
                    if let Some(loc) = ctx.bf.lock().loc(*next) {
                        ctx.dev.prefetch(loc.offset, loc.len as u64);
                    }
                }
            }
        }
    }
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
    // A forward scan's end inside the window ends the window. Without it a scan of a few
    // rows paid for every message pending over the whole window: in a young tree the leaves
    // are nearly empty, so the window spans the whole leaf and listing one small directory
    // applied the messages of all of them (F2's cold walk: 160 listings of 125 names, each
    // sorting and merging the tree's ~20,000 pending creates).
    let clamp = match (seek, upper) {
        (Seek::AtOrAfter(k), Some(u)) if k < u && hi.as_deref().is_none_or(|h| u < h) => Some(u),
        _ => None,
    };
    if let Some(u) = clamp {
        last = last.min(child_before(pivots, u)).max(first);
        hi = Some(u.to_vec());
    }
    // Likewise the seek key starts a forward window: the rows below it, and the messages
    // for them, are not what the scan asked for (listing the hundredth directory of a young
    // tree merged the creates of the ninety-nine before it).
    let start_at = match seek {
        Seek::AtOrAfter(k) if !k.is_empty() && lo.as_deref().is_none_or(|l| l < k) => Some(k),
        _ => None,
    };
    if let Some(k) = start_at {
        lo = Some(k.to_vec());
    }
    // Pending messages for the window, from every ancestor and the leaf's deltas, in (key,
    // MSN) order.
    let deltas = leaf_deltas(ctx, &path, None)?;
    let mut points: Vec<MsgRef<'_>> = Vec::new();
    let mut ranges: Vec<MsgRef<'_>> = Vec::new();
    let mut bufs = Vec::with_capacity(path.len() + deltas.len());
    for (n, i) in &path {
        bufs.push(ctx.buffer(n, *i)?);
    }
    for d in &deltas {
        // The delta's partitions that overlap the window.
        let dp = d.pivots();
        let from = lo.as_deref().map_or(0, |l| child_for(dp, l));
        let to = hi.as_deref().map_or(dp.len(), |h| child_before(dp, h));
        for j in from..=to.max(from) {
            bufs.push(ctx.delta_msgs(d, j)?);
        }
    }
    for buf in bufs {
        buf.points_in(lo.as_deref().unwrap_or(&[]), hi.as_deref(), &mut points);
        ranges.extend(buf.ranges());
    }
    points.sort_by(|a, b| (a.key, a.msn).cmp(&(b.key, b.msn)));
    ranges.sort_by_key(|r| r.msn);
    // A range delete a delta stores in several partitions is one message.
    ranges.dedup_by_key(|r| r.msn);
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
        // The window holds exactly the keys in [lo, hi): rows of a clamped window's last
        // basement at or past its end, and of its first below its start, go (the messages
        // for them were not applied).
        let cut = clamp.filter(|&u| j == last && b.lower_bound(u) < b.len());
        let skip = start_at.filter(|&k| j == first && b.lower_bound(k) > 0);
        if start < end || !scratch.is_empty() || cut.is_some() || skip.is_some() {
            let mut b = Basement::clone(b);
            if let Some(k) = skip {
                b.drop_before(k);
            }
            b.apply(&points[start..end], &scratch, ctx.upserts)?;
            if let Some(u) = cut {
                b.truncate_at(u);
            }
            rows.push(Arc::new(b));
        } else {
            rows.push(b.clone()); // shared with the cache: no copy
        }
    }
    Ok(LeafRows { rows, lo, hi })
}
