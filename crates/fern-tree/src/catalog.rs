//! The catalog: what an environment remembers besides its nodes (tree names and roots, the next
//! MSN, the tree shape and compression, the log region and epoch, the fixed size, the data
//! extent table), stored as the
//! block file's meta blob in every checkpoint. Owns its byte layout and versions
//! (format.md, "Catalog (meta blob)"); never reads or writes the device itself.

use std::collections::HashMap;

use crate::betree::Shape;
use crate::codec::Compression;
use crate::error::{Error, Result};
use crate::extent::{ExtentEntry, ExtentTable};
use crate::ids::NodeId;
use crate::varint::{put_varint, Reader};

pub(crate) struct TreeEntry {
    pub(crate) name: String,
    pub(crate) root: NodeId,
}

pub(crate) struct State {
    pub(crate) trees: Vec<TreeEntry>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) next_msn: u64,
    pub(crate) messages: u64,
    /// BTT id of the log region (a fixed extent, never rewritten).
    pub(crate) log_id: NodeId,
    /// Epoch of this open's log records (W6); bumped and checkpointed by every open.
    pub(crate) epoch: u32,
    /// The image's fixed size from its catalog (0: none; B11).
    pub(crate) capacity: u64,
    /// The live data extents (X3; catalog version 4).
    pub(crate) extents: ExtentTable,
    /// The tree and root child a detached flush is filling (betree/detached.rs), if one runs.
    /// In memory only.
    pub(crate) in_flight: Option<(usize, NodeId)>,
}

const META_MAGIC: &[u8; 4] = b"FCAT";
/// Catalog version written by this build: 6 = internal node blocks may be of node version 3
/// (key filters of leaf deltas, format.md; no new catalog field), refused by builds before
/// them. 5 = node blocks may be of node version 2 (leaf
/// deltas, format.md "Leaf deltas"; no new catalog field), so a build without deltas refuses
/// the image at open instead of failing on the first node it cannot read. 4 = the log may hold
/// records with data extents
/// (tag 4) and the catalog ends with the extent table (X3). Version 3 added sync marks (W10)
/// and the image's fixed size (0: the image grows; B11).
const META_VERSION: u32 = 6;
/// Oldest catalog version read: 2 (no size field, a log without sync marks).
const META_VERSION_OLDEST: u32 = 2;
/// Catalog value of `log_id` while an image is being created (no log yet).
pub(crate) const NO_LOG: u64 = u64::MAX;

pub(crate) fn encode_meta(state: &State, shape: &Shape) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(META_MAGIC);
    out.extend_from_slice(&META_VERSION.to_le_bytes());
    out.push(shape.compression.to_byte());
    let level = match shape.compression {
        Compression::Zstd { level } => level,
        _ => 0,
    };
    out.extend_from_slice(&level.to_le_bytes());
    out.extend_from_slice(&(shape.node_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(shape.basement_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(shape.fanout as u32).to_le_bytes());
    out.extend_from_slice(&state.next_msn.to_le_bytes());
    out.extend_from_slice(&(state.trees.len() as u32).to_le_bytes());
    for t in &state.trees {
        put_varint(&mut out, t.name.len() as u64);
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&t.root.0.to_le_bytes());
    }
    out.extend_from_slice(&state.log_id.0.to_le_bytes());
    out.extend_from_slice(&state.epoch.to_le_bytes());
    out.extend_from_slice(&state.capacity.to_le_bytes());
    out.extend_from_slice(&(state.extents.len() as u64).to_le_bytes());
    for (offset, e) in state.extents.iter() {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&e.id.0.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
    }
    out
}

pub(crate) fn decode_meta(b: &[u8]) -> Result<(Shape, State)> {
    let what = || "catalog".to_string();
    let mut r = Reader::new(b, &what);
    if r.bytes(4)? != META_MAGIC {
        return Err(r.err("bad magic"));
    }
    let v = r.u32()?;
    if !(META_VERSION_OLDEST..=META_VERSION).contains(&v) {
        return Err(Error::UnsupportedVersion {
            found: v,
            supported: META_VERSION,
        });
    }
    let c = r.u8()?;
    let level = r.u32()? as i32;
    let compression = Compression::from_byte(c, level)
        .ok_or_else(|| r.err(format!("unknown compression {c}")))?;
    let node_bytes = r.u64()? as usize;
    let basement_bytes = r.u64()? as usize;
    let fanout = r.u32()? as usize;
    if node_bytes < 4096 || basement_bytes < 512 || !(3..=1 << 16).contains(&fanout) {
        return Err(r.err("implausible tree shape"));
    }
    let next_msn = r.u64()?;
    let n = r.u32()? as usize;
    let mut trees = Vec::with_capacity(n.min(1024));
    let mut by_name = HashMap::new();
    for i in 0..n {
        let name = std::str::from_utf8(r.len_prefixed(4096)?)
            .map_err(|_| r.err("tree name is not UTF-8"))?
            .to_string();
        let root = NodeId(r.u64()?);
        if by_name.insert(name.clone(), i).is_some() {
            return Err(r.err(format!("tree {name:?} listed twice")));
        }
        trees.push(TreeEntry { name, root });
    }
    let log_id = NodeId(r.u64()?);
    let epoch = r.u32()?;
    let capacity = if v >= 3 { r.u64()? } else { 0 };
    let mut extents = ExtentTable::default();
    if v >= 4 {
        let n = r.u64()?;
        if n > (r.remaining() / 24) as u64 {
            return Err(r.err(format!(
                "extent table of {n} entries is longer than the catalog"
            )));
        }
        let mut last = None;
        for _ in 0..n {
            let offset = r.u64()?;
            let e = ExtentEntry {
                id: NodeId(r.u64()?),
                len: r.u32()?,
                crc: r.u32()?,
            };
            if last.is_some_and(|l| l >= offset) {
                return Err(r.err("extent table offsets do not ascend"));
            }
            last = Some(offset);
            extents.insert(offset, e);
        }
    }
    if r.remaining() != 0 {
        return Err(r.err("trailing bytes"));
    }
    Ok((
        Shape {
            node_bytes,
            basement_bytes,
            fanout,
            compression,
            leaf_deltas: 0,
        },
        State {
            trees,
            by_name,
            next_msn,
            messages: 0,
            log_id,
            epoch,
            capacity,
            extents,
            in_flight: None,
        },
    ))
}

/// Fuzzing entry point: decodes a catalog.
pub(crate) fn fuzz_catalog(b: &[u8]) -> bool {
    decode_meta(b).is_ok()
}
