//! Tree nodes: their in-memory form, their block encoding, and partial loading.
//!
//! A node is a header (kind, height, pivots, child ids, and where each partition's frame lies in
//! the block) plus partitions: basements for a leaf, one message buffer per child for an internal
//! node. A reader loads the header and then only the partitions it needs (invariant N5: a point
//! read decompresses one partition per level). A writer loads every partition before it changes a
//! node (invariant N6), so a node that is written is always complete.
//!
//! Block layout (all integers little-endian; see docs/format.md "Node block" and "Leaf deltas"):
//! `magic "FNOD" | version u8 | kind u8 | height u16 | header_len u32 | header_crc u32`
//! then the header (`node id u64 | nparts u32 | per part: [child id u64 if internal]
//! [version 2, internal: ndeltas u8, then per delta: id u64 | bytes u32]
//! [pivot: varint len + bytes, for parts after the first] | frame offset u32 | frame len u32`)
//! then the partition frames (codec.rs), each compressed and checksummed on its own.
//! Kind 0 is a leaf, 1 an internal node, 2 a leaf delta (a leaf's layout, with message
//! partitions instead of basements; height 0).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::basement::Basement;
use crate::blockfile::BlockLoc;
use crate::buffer::MsgBuffer;
use crate::codec::{self, Compression};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::filter::KeyFilter;
use crate::ids::NodeId;
use crate::varint::{put_varint, Reader};
use crate::MAX_KEY_LEN;

const MAGIC: &[u8; 4] = b"FNOD";
/// Node version 1: no delta lists. Version 2 (format.md "Leaf deltas"): an internal node's
/// header names each child's deltas; delta blocks (kind 2) are version 2. A writer writes
/// version 1 for every node that names no delta, so an environment with deltas off writes the
/// blocks it always wrote.
const NODE_VERSION_1: u8 = 1;
const NODE_VERSION_2: u8 = 2;
/// Internal nodes whose delta entries carry key filters (format.md "Key filters of leaf deltas").
const NODE_VERSION_3: u8 = 3;
/// Most deltas a child may have (D5); the header stores the count in one byte.
pub(crate) const MAX_DELTAS_LIMIT: usize = 16;
const KIND_LEAF: u8 = 0;
const KIND_INTERNAL: u8 = 1;
const KIND_DELTA: u8 = 2;
/// Fixed prefix before the header.
pub(crate) const PREFIX_LEN: usize = 16;
/// Bytes read speculatively for a header; most headers fit.
const HEADER_GUESS: usize = 8192;

/// A partition that is loaded on first use.
#[derive(Debug)]
pub(crate) struct Part<T> {
    cell: OnceLock<T>,
    /// Where the frame lies in the node's block when it was read: (offset, len).
    frame: Option<(u32, u32)>,
}

impl<T: Clone> Clone for Part<T> {
    fn clone(&self) -> Self {
        Part {
            cell: self.cell.clone(),
            frame: self.frame,
        }
    }
}

impl<T> Part<T> {
    pub(crate) fn loaded(t: T) -> Self {
        let cell = OnceLock::new();
        let _ = cell.set(t);
        Part { cell, frame: None }
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.cell.get()
    }

    /// Mutable access for writers, which load every partition first (invariant N6).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.cell
            .get_mut()
            .expect("writer touched a partition it did not load (invariant N6)")
    }

    pub(crate) fn into_inner(self) -> T {
        self.cell
            .into_inner()
            .expect("writer touched a partition it did not load (invariant N6)")
    }
}

/// A leaf delta named by its parent (format.md "Leaf deltas"): its node id and the packed
/// bytes of its messages, so the parent decides between appending and merging (D5) without
/// reading its deltas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeltaRef {
    pub id: NodeId,
    pub bytes: u32,
    /// Which keys the delta may hold (D6); `None`: any (it holds a range delete, or it was
    /// written before filters).
    pub filter: Option<Arc<KeyFilter>>,
}

impl DeltaRef {
    /// Whether the delta may hold a message for `key` (D6): a point read skips it otherwise.
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        self.filter.as_ref().is_none_or(|f| f.may_contain(key))
    }
}

/// The kind-specific part of a node.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Leaf {
        /// `pivots[i]` is the smallest key basement `i+1` may hold.
        pivots: Vec<Vec<u8>>,
        parts: Vec<Part<Arc<Basement>>>,
    },
    Internal {
        /// `pivots[i]` separates child `i` (keys below) from child `i+1` (keys at or above).
        pivots: Vec<Vec<u8>>,
        children: Vec<NodeId>,
        bufs: Vec<Part<MsgBuffer>>,
        /// Per child, its leaf deltas oldest first (empty above height 1: invariant D1).
        deltas: Vec<Vec<DeltaRef>>,
    },
    /// A leaf delta: messages flushed into a leaf, written beside it (format.md "Leaf
    /// deltas"), in partitions split by key like a leaf's basements, so a point read loads one
    /// (N5). Never changed once created (D4).
    Delta {
        /// `pivots[i]` is the smallest key partition `i+1` may hold.
        pivots: Vec<Vec<u8>>,
        parts: Vec<Part<MsgBuffer>>,
    },
}

/// A node as the cache holds it.
#[derive(Debug)]
pub(crate) struct Node {
    pub id: NodeId,
    /// 0 for leaves.
    pub height: u16,
    pub body: Body,
    /// The block this node was read from, while it is unchanged since: its partitions' frames
    /// lie there. None for a node never written, and for one a writer took to change
    /// (`Ctx::take`: every partition is loaded then, N6, and the frames describe an old block
    /// that a checkpoint may free and reuse).
    pub block: Option<BlockLoc>,
    /// Changed since it was last written.
    pub dirty: AtomicBool,
    /// Memory the cache has accounted for this node.
    pub mem: AtomicUsize,
}

impl Clone for Node {
    fn clone(&self) -> Self {
        Node {
            id: self.id,
            height: self.height,
            body: self.body.clone(),
            block: self.block,
            dirty: AtomicBool::new(self.dirty.load(Ordering::Relaxed)),
            mem: AtomicUsize::new(self.mem.load(Ordering::Relaxed)),
        }
    }
}

/// Index of the partition or child that holds `key`, given the pivots.
#[inline]
pub(crate) fn child_for(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| crate::keycmp::le(p, key))
}

/// Index of the partition or child holding the greatest keys below `key`.
#[inline]
pub(crate) fn child_before(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| crate::keycmp::lt(p, key))
}

impl Node {
    pub(crate) fn new_leaf(id: NodeId) -> Node {
        Node {
            id,
            height: 0,
            body: Body::Leaf {
                pivots: Vec::new(),
                parts: vec![Part::loaded(Arc::new(Basement::new()))],
            },
            block: None,
            dirty: AtomicBool::new(true),
            mem: AtomicUsize::new(0),
        }
    }

    pub(crate) fn is_leaf(&self) -> bool {
        matches!(self.body, Body::Leaf { .. })
    }

    /// A leaf or a leaf delta (height 0): what the cache evicts and writes back first.
    pub(crate) fn is_leaf_level(&self) -> bool {
        self.height == 0
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }

    pub(crate) fn set_dirty(&self, d: bool) {
        self.dirty.store(d, Ordering::Relaxed)
    }

    pub(crate) fn pivots(&self) -> &[Vec<u8>] {
        match &self.body {
            Body::Leaf { pivots, .. }
            | Body::Internal { pivots, .. }
            | Body::Delta { pivots, .. } => pivots,
        }
    }

    /// A new leaf delta holding `parts` (split at `pivots`).
    pub(crate) fn new_delta(id: NodeId, pivots: Vec<Vec<u8>>, parts: Vec<MsgBuffer>) -> Node {
        Node {
            id,
            height: 0,
            body: Body::Delta {
                pivots,
                parts: parts.into_iter().map(Part::loaded).collect(),
            },
            block: None,
            dirty: AtomicBool::new(true),
            mem: AtomicUsize::new(0),
        }
    }

    /// Whether any child entry names a delta (decides the node version written).
    /// Whether some delta entry carries a key filter (node version 3).
    fn filters_deltas(&self) -> bool {
        matches!(&self.body, Body::Internal { deltas, .. } if deltas.iter().flatten().any(|d| d.filter.is_some()))
    }

    fn names_deltas(&self) -> bool {
        matches!(&self.body, Body::Internal { deltas, .. } if deltas.iter().any(|d| !d.is_empty()))
    }

    /// Memory used by what is loaded now.
    pub(crate) fn mem_now(&self) -> usize {
        let piv: usize = self.pivots().iter().map(|p| p.capacity() + 24).sum();
        let parts: usize = match &self.body {
            Body::Leaf { parts, .. } => parts
                .iter()
                .map(|p| p.get().map_or(0, |b| b.mem()) + 48)
                .sum(),
            Body::Internal {
                bufs,
                children,
                deltas,
                ..
            } => {
                bufs.iter()
                    .map(|p| p.get().map_or(0, MsgBuffer::mem) + 48)
                    .sum::<usize>()
                    + children.capacity() * 8
                    + deltas
                        .iter()
                        .map(|d| {
                            d.capacity() * std::mem::size_of::<DeltaRef>()
                                + 24
                                + d.iter()
                                    .filter_map(|d| d.filter.as_ref())
                                    .map(|f| f.mem())
                                    .sum::<usize>()
                        })
                        .sum::<usize>()
            }
            Body::Delta { parts, .. } => parts
                .iter()
                .map(|p| p.get().map_or(0, MsgBuffer::mem) + 48)
                .sum(),
        };
        std::mem::size_of::<Node>() + piv + parts
    }

    /// Whether every partition is in memory.
    pub(crate) fn fully_loaded(&self) -> bool {
        match &self.body {
            Body::Leaf { parts, .. } => parts.iter().all(|p| p.get().is_some()),
            Body::Internal { bufs, .. } | Body::Delta { parts: bufs, .. } => {
                bufs.iter().all(|p| p.get().is_some())
            }
        }
    }

    /// Whether some partition of a leaf or leaf delta is in memory and could be dropped by
    /// [`unload_parts`](Self::unload_parts) (invariant C3).
    pub(crate) fn has_sheddable_parts(&self) -> bool {
        fn loaded<T>(parts: &[Part<T>]) -> bool {
            parts.iter().any(|p| p.get().is_some() && p.frame.is_some())
        }
        self.block.is_some()
            && !self.is_dirty()
            && match &self.body {
                Body::Leaf { parts, .. } => loaded(parts),
                Body::Delta { parts, .. } => loaded(parts),
                Body::Internal { .. } => false,
            }
    }

    /// Partial eviction (invariant C3): drops the loaded partitions of a clean leaf or leaf
    /// delta that is unchanged since it was read, keeping its header (pivots and frame
    /// positions), so the next point read of it is one partition read, not a header read and
    /// then a partition read. Only a node whose frames still describe `block` may shed
    /// them: a writer's `take` clears `block` (betree `Ctx::take`), and a node never written
    /// has none. Returns the bytes freed, as the cache counted them when each was loaded.
    pub(crate) fn unload_parts(&mut self) -> usize {
        fn unload<T>(parts: &mut [Part<T>], mem: impl Fn(&T) -> usize) -> usize {
            let mut freed = 0;
            for p in parts.iter_mut().filter(|p| p.frame.is_some()) {
                if let Some(t) = p.cell.take() {
                    freed += mem(&t);
                }
            }
            freed
        }
        if !self.has_sheddable_parts() {
            return 0;
        }
        let freed = match &mut self.body {
            Body::Leaf { parts, .. } => unload(parts, |b| b.mem()),
            Body::Delta { parts, .. } => unload(parts, MsgBuffer::mem),
            Body::Internal { .. } => 0,
        };
        self.mem.fetch_sub(
            freed.min(self.mem.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        freed
    }

    /// Bytes of rows (leaf) or of buffered messages (internal).
    pub(crate) fn payload_bytes(&self) -> usize {
        match &self.body {
            Body::Leaf { parts, .. } => {
                parts.iter().map(|p| p.get().map_or(0, |b| b.bytes())).sum()
            }
            Body::Internal { bufs, .. } | Body::Delta { parts: bufs, .. } => bufs
                .iter()
                .map(|p| p.get().map_or(0, MsgBuffer::bytes))
                .sum(),
        }
    }

    /// Encodes the whole node as a block. Every partition must be loaded (invariant N6).
    ///
    /// Encodes into `out`'s memory (its contents are replaced): the cache hands node writes a
    /// buffer it keeps between them (`Cache::encode`).
    pub(crate) fn encode_into(&self, comp: Compression, mut out: Vec<u8>) -> Vec<u8> {
        let pivots = self.pivots();
        let (kind, version) = match &self.body {
            Body::Leaf { .. } => (KIND_LEAF, NODE_VERSION_1),
            Body::Internal { .. } if self.filters_deltas() => (KIND_INTERNAL, NODE_VERSION_3),
            Body::Internal { .. } if self.names_deltas() => (KIND_INTERNAL, NODE_VERSION_2),
            Body::Internal { .. } => (KIND_INTERNAL, NODE_VERSION_1),
            Body::Delta { .. } => (KIND_DELTA, NODE_VERSION_2),
        };
        let internal = kind == KIND_INTERNAL;
        let nparts = pivots.len() + 1;
        // The header's length does not depend on the frames, so frames are compressed straight
        // into the output after a header-sized gap that is filled in at the end.
        let mut header_len = 8 + 4 + nparts * 8;
        if internal {
            header_len += nparts * 8;
        }
        if let Body::Internal { deltas, .. } = &self.body {
            header_len += match version {
                NODE_VERSION_2 => deltas.iter().map(|d| 1 + d.len() * 12).sum::<usize>(),
                NODE_VERSION_3 => {
                    deltas
                        .iter()
                        .flatten()
                        .map(|d| 14 + d.filter.as_ref().map_or(0, |f| f.encoded_len()))
                        .sum::<usize>()
                        + deltas.len()
                }
                _ => 0,
            };
        }
        for p in pivots {
            header_len += crate::varint::varint_len(p.len() as u64) + p.len();
        }
        let frames_base = PREFIX_LEN + header_len;
        out.clear();
        out.reserve(frames_base + self.payload_bytes() + nparts * 64 + 64);
        out.resize(frames_base, 0);
        let mut frames: Vec<(u32, u32)> = Vec::with_capacity(nparts);
        let mut raw = Vec::new();
        for i in 0..nparts {
            raw.clear();
            match &self.body {
                Body::Leaf { parts, .. } => parts[i]
                    .get()
                    .expect("encoding a node with unloaded partitions (invariant N6)")
                    .encode(&mut raw),
                Body::Internal { bufs, .. } | Body::Delta { parts: bufs, .. } => bufs[i]
                    .get()
                    .expect("encoding a node with unloaded partitions (invariant N6)")
                    .encode(&mut raw),
            }
            let start = out.len();
            codec::encode_partition(comp, &raw, &mut out);
            frames.push((start as u32, (out.len() - start) as u32));
        }
        let mut header = Vec::with_capacity(header_len);
        header.extend_from_slice(&self.id.0.to_le_bytes());
        header.extend_from_slice(&(nparts as u32).to_le_bytes());
        for (i, (off, len)) in frames.iter().enumerate() {
            if let Body::Internal {
                children, deltas, ..
            } = &self.body
            {
                header.extend_from_slice(&children[i].0.to_le_bytes());
                if version >= NODE_VERSION_2 {
                    // D5 bounds a list far below 255; MAX_DELTAS_LIMIT caps the option.
                    header.push(deltas[i].len() as u8);
                    for d in &deltas[i] {
                        header.extend_from_slice(&d.id.0.to_le_bytes());
                        header.extend_from_slice(&d.bytes.to_le_bytes());
                        if version == NODE_VERSION_3 {
                            // filter::MAX_BYTES keeps it far below 64 KiB.
                            let flen = d.filter.as_ref().map_or(0, |f| f.encoded_len());
                            header.extend_from_slice(&(flen as u16).to_le_bytes());
                            if let Some(f) = &d.filter {
                                f.encode(&mut header);
                            }
                        }
                    }
                }
            }
            if i > 0 {
                put_varint(&mut header, pivots[i - 1].len() as u64);
                header.extend_from_slice(&pivots[i - 1]);
            }
            header.extend_from_slice(&off.to_le_bytes());
            header.extend_from_slice(&len.to_le_bytes());
        }
        debug_assert_eq!(header.len(), header_len);
        out[0..4].copy_from_slice(MAGIC);
        out[4] = version;
        out[5] = kind;
        out[6..8].copy_from_slice(&self.height.to_le_bytes());
        out[8..12].copy_from_slice(&(header_len as u32).to_le_bytes());
        out[12..16].copy_from_slice(&crc32c::crc32c(&header).to_le_bytes());
        out[PREFIX_LEN..frames_base].copy_from_slice(&header);
        out
    }

    /// Reads a node's header from `loc`; partitions stay on disk until asked for.
    /// With `full`, reads the whole block at once and decodes every partition.
    pub(crate) fn read(
        dev: &dyn BlockDevice,
        id: NodeId,
        loc: BlockLoc,
        full: bool,
    ) -> Result<Node> {
        let what_node = || format!("node {id}");
        let len = loc.len as usize;
        if len < PREFIX_LEN {
            return Err(Error::corrupt(
                what_node(),
                format!("block of {len} bytes is too short"),
            ));
        }
        let first = if full { len } else { len.min(HEADER_GUESS) };
        let mut block = vec![0u8; first];
        dev.read_at(&mut block, loc.offset)
            .map_err(|e| Error::io(format!("reading node {id}"), e))?;
        let p = &block[..PREFIX_LEN];
        if &p[0..4] != MAGIC {
            return Err(Error::corrupt(what_node(), "bad magic"));
        }
        let version = p[4];
        if !(NODE_VERSION_1..=NODE_VERSION_3).contains(&version) {
            return Err(Error::corrupt(
                what_node(),
                format!("unknown node version {version}"),
            ));
        }
        let kind = p[5];
        if kind > KIND_DELTA
            || (kind == KIND_DELTA && version < NODE_VERSION_2)
            || (kind != KIND_INTERNAL && version == NODE_VERSION_3)
        {
            return Err(Error::corrupt(
                what_node(),
                format!("bad node kind {kind} for node version {version}"),
            ));
        }
        let internal = kind == KIND_INTERNAL;
        let height = u16::from_le_bytes([p[6], p[7]]);
        let header_len = u32::from_le_bytes([p[8], p[9], p[10], p[11]]) as usize;
        let header_crc = u32::from_le_bytes([p[12], p[13], p[14], p[15]]);
        if PREFIX_LEN + header_len > len {
            return Err(Error::corrupt(what_node(), "header longer than the block"));
        }
        if PREFIX_LEN + header_len > block.len() {
            let mut rest = vec![0u8; PREFIX_LEN + header_len - block.len()];
            dev.read_at(&mut rest, loc.offset + block.len() as u64)
                .map_err(|e| Error::io(format!("reading node {id}"), e))?;
            block.extend_from_slice(&rest);
        }
        let header = &block[PREFIX_LEN..PREFIX_LEN + header_len];
        let actual = crc32c::crc32c(header);
        if actual != header_crc {
            return Err(Error::Checksum {
                what: format!("node {id} header"),
                expected: header_crc,
                actual,
            });
        }
        if internal != (height > 0) {
            return Err(Error::corrupt(what_node(), "height does not match kind"));
        }
        let mut r = Reader::new(header, &what_node);
        let stored_id = r.u64()?;
        if stored_id != id.0 {
            return Err(Error::corrupt(
                what_node(),
                format!("block holds node {stored_id} (translation table points at a wrong block)"),
            ));
        }
        let nparts = r.u32()? as usize;
        if nparts == 0 || nparts > header_len {
            return Err(r.err(format!("bad partition count {nparts}")));
        }
        let mut pivots = Vec::with_capacity(nparts - 1);
        let mut children = Vec::new();
        let mut deltas = Vec::new();
        let mut frames = Vec::with_capacity(nparts);
        for i in 0..nparts {
            if internal {
                children.push(NodeId(r.u64()?));
                let mut list = Vec::new();
                if version >= NODE_VERSION_2 {
                    let n = r.u8()? as usize;
                    if n > MAX_DELTAS_LIMIT || (n > 0 && height != 1) {
                        return Err(r.err(format!(
                            "child {i} names {n} deltas at height {height} (invariant D1, D5)"
                        )));
                    }
                    for _ in 0..n {
                        let id = NodeId(r.u64()?);
                        let bytes = r.u32()?;
                        let mut filter = None;
                        if version == NODE_VERSION_3 {
                            let flen = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
                            if flen > 0 {
                                let raw = r.bytes(flen)?;
                                let f = KeyFilter::decode(raw)
                                    .map_err(|e| r.err(format!("child {i}'s delta {id}: {e}")))?;
                                filter = Some(Arc::new(f));
                            }
                        }
                        list.push(DeltaRef { id, bytes, filter });
                    }
                }
                deltas.push(list);
            }
            if i > 0 {
                let pv = r.len_prefixed(MAX_KEY_LEN)?.to_vec();
                if pivots.last().is_some_and(|l: &Vec<u8>| *l >= pv) {
                    return Err(r.err("pivots out of order (invariant N1)"));
                }
                pivots.push(pv);
            }
            let off = r.u32()?;
            let flen = r.u32()?;
            if (off as usize) < PREFIX_LEN + header_len || off as u64 + flen as u64 > loc.len as u64
            {
                return Err(r.err(format!(
                    "partition {i} frame {off}+{flen} outside the block"
                )));
            }
            frames.push((off, flen));
        }
        fn unloaded<T>(&f: &(u32, u32)) -> Part<T> {
            Part {
                cell: OnceLock::new(),
                frame: Some(f),
            }
        }
        let mut node = Node {
            id,
            height,
            body: if internal {
                Body::Internal {
                    pivots,
                    children,
                    bufs: frames.iter().map(unloaded).collect(),
                    deltas,
                }
            } else if kind == KIND_DELTA {
                Body::Delta {
                    pivots,
                    parts: frames.iter().map(unloaded).collect(),
                }
            } else {
                Body::Leaf {
                    pivots,
                    parts: frames.iter().map(unloaded).collect(),
                }
            },
            block: Some(loc),
            dirty: AtomicBool::new(false),
            mem: AtomicUsize::new(0),
        };
        if full {
            node.load_all_from(&block)?;
        }
        Ok(node)
    }

    fn load_all_from(&mut self, block: &[u8]) -> Result<()> {
        let id = self.id;
        match &mut self.body {
            Body::Leaf { parts, .. } => {
                for (i, p) in parts.iter_mut().enumerate() {
                    if p.get().is_none() {
                        let (off, len) = p.frame.unwrap_or((0, 0));
                        let frame = &block[off as usize..(off + len) as usize];
                        let b = decode_basement(id, i, frame)?;
                        let _ = p.cell.set(b);
                    }
                }
            }
            Body::Internal { bufs, .. } => {
                for (i, p) in bufs.iter_mut().enumerate() {
                    if p.get().is_none() {
                        let (off, len) = p.frame.unwrap_or((0, 0));
                        let frame = &block[off as usize..(off + len) as usize];
                        let b = decode_buffer(id, i, frame)?;
                        let _ = p.cell.set(b);
                    }
                }
            }
            Body::Delta { parts, .. } => {
                for (i, p) in parts.iter_mut().enumerate() {
                    if p.get().is_none() {
                        let (off, len) = p.frame.unwrap_or((0, 0));
                        let frame = &block[off as usize..(off + len) as usize];
                        let _ = p.cell.set(decode_delta(id, i, frame)?);
                    }
                }
            }
        }
        Ok(())
    }

    /// Loads every partition (for a writer). Returns the memory added.
    pub(crate) fn load_all(&mut self, dev: &dyn BlockDevice) -> Result<()> {
        if self.fully_loaded() {
            return Ok(());
        }
        let loc = self.block.ok_or_else(|| {
            Error::corrupt(
                format!("node {}", self.id),
                "unloaded partitions but no block",
            )
        })?;
        let mut block = vec![0u8; loc.len as usize];
        dev.read_at(&mut block, loc.offset)
            .map_err(|e| Error::io(format!("reading node {}", self.id), e))?;
        self.load_all_from(&block)
    }

    /// The basement `i` of a leaf, loading it if needed. Returns it and the bytes of memory the
    /// load added (0 if it was already loaded, or another thread won the race).
    pub(crate) fn basement(
        &self,
        dev: &dyn BlockDevice,
        i: usize,
    ) -> Result<(&Arc<Basement>, usize)> {
        let Body::Leaf { parts, .. } = &self.body else {
            return Err(Error::corrupt(
                format!("node {}", self.id),
                "expected a leaf",
            ));
        };
        load_part(
            dev,
            self,
            &parts[i],
            |frame| decode_basement(self.id, i, frame),
            |b| b.mem(),
        )
    }

    /// Partition `i` of a leaf delta's messages, loading it if needed.
    pub(crate) fn delta_msgs(
        &self,
        dev: &dyn BlockDevice,
        i: usize,
    ) -> Result<(&MsgBuffer, usize)> {
        let Body::Delta { parts, .. } = &self.body else {
            return Err(Error::corrupt(
                format!("node {}", self.id),
                "expected a leaf delta (the parent names a node of another kind)",
            ));
        };
        load_part(
            dev,
            self,
            &parts[i],
            |frame| decode_delta(self.id, i, frame),
            MsgBuffer::mem,
        )
    }

    /// The message buffer for child `i` of an internal node, loading it if needed.
    pub(crate) fn buffer(&self, dev: &dyn BlockDevice, i: usize) -> Result<(&MsgBuffer, usize)> {
        let Body::Internal { bufs, .. } = &self.body else {
            return Err(Error::corrupt(
                format!("node {}", self.id),
                "expected an internal node",
            ));
        };
        load_part(
            dev,
            self,
            &bufs[i],
            |frame| decode_buffer(self.id, i, frame),
            MsgBuffer::mem,
        )
    }
}

fn load_part<'a, T>(
    dev: &dyn BlockDevice,
    node: &Node,
    part: &'a Part<T>,
    decode: impl FnOnce(&[u8]) -> Result<T>,
    mem: impl Fn(&T) -> usize,
) -> Result<(&'a T, usize)> {
    if let Some(t) = part.get() {
        return Ok((t, 0));
    }
    let (Some(loc), Some((off, len))) = (node.block, part.frame) else {
        return Err(Error::corrupt(
            format!("node {}", node.id),
            "partition has no frame",
        ));
    };
    let value = with_frame_buffer(len as usize, |frame| {
        dev.read_at(frame, loc.offset + off as u64)
            .map_err(|e| Error::io(format!("reading node {}", node.id), e))?;
        decode(frame)
    })?;
    let added = mem(&value);
    let won = part.cell.set(value).is_ok();
    let t = part
        .get()
        .ok_or_else(|| Error::corrupt("cache", "partition vanished"))?;
    Ok((t, if won { added } else { 0 }))
}

/// Largest frame buffer a thread keeps between partition reads.
const FRAME_BUFFER_KEPT: usize = 64 << 10;

thread_local! {
    static FRAME_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on a `len`-byte buffer for one partition frame: the thread's own, kept between
/// reads, so a cold read does not allocate (and, near the memory budget where freed pages go
/// back to the kernel at once, fault in) a fresh frame-sized buffer per partition. Frames
/// larger than `FRAME_BUFFER_KEPT` (internal nodes' buffers) get a buffer of their own.
fn with_frame_buffer<T>(len: usize, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
    if len > FRAME_BUFFER_KEPT {
        return f(&mut vec![0u8; len]);
    }
    FRAME_BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(len, 0);
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0u8; len]), // a decode that reads again (none today)
    })
}

fn decode_basement(id: NodeId, i: usize, frame: &[u8]) -> Result<Arc<Basement>> {
    let what = || format!("node {id} partition {i}");
    let raw = codec::decode_partition_ref(frame, &what)?;
    Basement::decode(raw, &what).map(Arc::new)
}

fn decode_delta(id: NodeId, i: usize, frame: &[u8]) -> Result<MsgBuffer> {
    let what = || format!("leaf delta node {id} partition {i}");
    let raw = codec::decode_partition(frame, &what)?;
    MsgBuffer::decode(&raw, &what)
}

fn decode_buffer(id: NodeId, i: usize, frame: &[u8]) -> Result<MsgBuffer> {
    let what = || format!("node {id} buffer {i}");
    let raw = codec::decode_partition(frame, &what)?;
    let mut b = MsgBuffer::decode(&raw, &what)?;
    b.index_heads();
    Ok(b)
}

/// A node shared between the cache and readers.
pub(crate) type SharedNode = Arc<Node>;
