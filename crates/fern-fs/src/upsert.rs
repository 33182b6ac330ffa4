//! The update functions fern-fs registers with its store, and the argument encodings callers
//! build. They make small writes blind: "write these bytes at this offset of the block" and
//! "raise size to at least N, set mtime" never read the old value at write time.
//!
//! It owns the two function ids (persistent: an engine stores them in buffered messages) and
//! their semantics; the functions must never panic and never invent data: a malformed argument
//! or old value leaves the old value unchanged (so a later read reports the corruption), and a
//! stat update of an absent key stays absent.

use std::sync::Arc;

use fern_kv::{UpdateFnId, UpdateRegistry};

use crate::attr::{Stat, Timespec};
use crate::codec::{Reader, Writer};
use crate::overlay;
use crate::owner::setid_bits_to_clear;
use crate::record::stat_offset;

/// Update function on data blocks; argument is a [`BlockOp`].
pub const FN_BLOCK: UpdateFnId = UpdateFnId(0x4653_0001);
/// Update function on the stat inside a dentry or inode record; argument is a [`StatDelta`].
pub const FN_STAT: UpdateFnId = UpdateFnId(0x4653_0002);

/// The functions a store must be opened with before fern-fs can use it.
pub fn registry() -> UpdateRegistry {
    let mut r = UpdateRegistry::new();
    r.register(
        FN_BLOCK,
        Arc::new(|_k: &[u8], old: Option<&[u8]>, arg: &[u8]| apply_block(old, arg)),
    );
    r.register(
        FN_STAT,
        Arc::new(|_k: &[u8], old: Option<&[u8]>, arg: &[u8]| apply_stat(old, arg)),
    );
    // Argument merges: an engine that buffers upserts keeps one pending stat delta per inode
    // (a directory's mtime/ctime on every create in it, a file's size/mtime on every write)
    // and one write per block for contiguous small writes, instead of a run every read folds.
    r.register_merge(FN_STAT, Arc::new(merge_stat));
    r.register_merge(FN_BLOCK, Arc::new(merge_block));
    r
}

/// Two block writes as one, when they are of one kind (Write or Overlay, for one block size)
/// and their byte ranges overlap or touch (the newer wins where they overlap). Other pairs
/// (trims, zeroing, writes with a gap between) are not merged: a gap would have to be filled
/// with the block's old bytes, which the merge cannot see.
fn merge_block(older: &[u8], newer: &[u8]) -> Option<Vec<u8>> {
    let (a, b) = (BlockArg::decode(older)?, BlockArg::decode(newer)?);
    let overlay = match (&a.op, &b.op) {
        (BlockOp::Write { .. }, BlockOp::Write { .. }) => false,
        (BlockOp::Overlay { .. }, BlockOp::Overlay { .. }) => true,
        _ => return None,
    };
    if a.block_size != b.block_size {
        return None;
    }
    let ((o1, b1), (o2, b2)) = (a.op.written()?, b.op.written()?);
    let (s1, e1) = (o1 as usize, o1 as usize + b1.len());
    let (s2, e2) = (o2 as usize, o2 as usize + b2.len());
    if s2 > e1 || s1 > e2 {
        return None;
    }
    let lo = s1.min(s2);
    let mut bytes = vec![0u8; e1.max(e2) - lo];
    bytes[s1 - lo..e1 - lo].copy_from_slice(b1);
    bytes[s2 - lo..e2 - lo].copy_from_slice(b2);
    let offset = lo as u32;
    let op = if overlay {
        BlockOp::Overlay {
            offset,
            bytes: &bytes,
        }
    } else {
        BlockOp::Write {
            offset,
            bytes: &bytes,
        }
    };
    Some(
        BlockArg {
            block_size: a.block_size,
            op,
        }
        .encode(),
    )
}

/// Two stat deltas as one (`StatDelta::then`), re-encoded.
fn merge_stat(older: &[u8], newer: &[u8]) -> Option<Vec<u8>> {
    let a = StatDelta::decode(older)?;
    let b = StatDelta::decode(newer)?;
    Some(a.then(&b)?.encode())
}

/// A change to one data block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockOp<'a> {
    /// Write `bytes` at `offset`; an absent block is created zero-filled up to `offset`, and the
    /// block grows to `offset + bytes.len()` if shorter. Never shrinks a block. On an overlay
    /// row (overlay.rs), the bytes are written into the overlay.
    Write {
        /// Offset inside the block.
        offset: u32,
        /// Bytes to write.
        bytes: &'a [u8],
    },
    /// Cut the block to `len` bytes (0 deletes it); absent stays absent. An overlay row
    /// becomes the raw block of its bytes over zeros, cut.
    Trim {
        /// New length at most.
        len: u32,
    },
    /// Zero `[offset, offset + len)` within the block's current length; absent stays absent.
    /// On an overlay row, the range (within the block) becomes written zeros.
    Zero {
        /// Start inside the block.
        offset: u32,
        /// Bytes to zero.
        len: u32,
    },
    /// Write `bytes` at `offset` over whatever lies beneath the block (its slot's extent): an
    /// absent block becomes an overlay row recording which bytes were written (overlay.rs
    /// O3); a raw block is written as by `Write`. Needs the block size.
    Overlay {
        /// Offset inside the block.
        offset: u32,
        /// Bytes to write.
        bytes: &'a [u8],
    },
}

impl<'a> BlockOp<'a> {
    /// The range a write or overlay sets, as (offset, bytes).
    fn written(&self) -> Option<(u32, &'a [u8])> {
        match *self {
            BlockOp::Write { offset, bytes } | BlockOp::Overlay { offset, bytes } => {
                Some((offset, bytes))
            }
            _ => None,
        }
    }
}

/// The argument of [`FN_BLOCK`]: an op and the file system's block size, which tells an
/// overlay row from a raw block (overlay.rs O1). Arguments written before overlays existed
/// (version 1) carry no block size; they never meet an overlay (a mount upgrades the format
/// version before it writes one, schema.rs), so they treat every row as raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockArg<'a> {
    /// Block size; 0 in a version-1 argument.
    pub block_size: u32,
    /// The change.
    pub op: BlockOp<'a>,
}

/// Version-2 tags: the version-1 tag (1 Write, 2 Trim, 3 Zero; 4 Overlay) plus this.
const TAG_V2: u8 = 0x10;

impl<'a> BlockArg<'a> {
    /// Encodes: tag u8 (`0x10 | kind`) · block_size u32 · fields; version 1 (block size 0):
    /// tag u8 (`kind`) · fields (Write and Overlay: offset u32
    /// | bytes to the end; Trim: len u32; Zero: offset u32 · len u32).
    pub fn encode(&self) -> Vec<u8> {
        // Sized up front: a block's bytes are copied once, not through the doublings of a
        // growing vector.
        let extra = self.op.written().map_or(8, |(_, b)| b.len() + 4);
        let mut w = Writer::with_capacity(5 + extra);
        let kind = match self.op {
            BlockOp::Write { .. } => 1,
            BlockOp::Trim { .. } => 2,
            BlockOp::Zero { .. } => 3,
            BlockOp::Overlay { .. } => 4,
        };
        if self.block_size == 0 {
            // A version-1 argument stays one (a merge of two from an old log).
            w.u8(kind);
        } else {
            w.u8(TAG_V2 | kind).u32(self.block_size);
        }
        match self.op {
            BlockOp::Write { offset, bytes } | BlockOp::Overlay { offset, bytes } => {
                w.u32(offset).bytes(bytes)
            }
            BlockOp::Trim { len } => w.u32(len),
            BlockOp::Zero { offset, len } => w.u32(offset).u32(len),
        };
        w.finish()
    }

    fn decode(arg: &'a [u8]) -> Option<BlockArg<'a>> {
        let mut r = Reader::new(arg, "block op");
        let tag = r.u8().ok()?;
        let block_size = if tag & TAG_V2 != 0 {
            r.u32()
                .ok()
                .filter(|bs| crate::schema::valid_block_size(*bs))?
        } else {
            0
        };
        let op = match tag & !TAG_V2 {
            1 => BlockOp::Write {
                offset: r.u32().ok()?,
                bytes: r.rest(),
            },
            2 => BlockOp::Trim { len: r.u32().ok()? },
            3 => BlockOp::Zero {
                offset: r.u32().ok()?,
                len: r.u32().ok()?,
            },
            4 if block_size != 0 => BlockOp::Overlay {
                offset: r.u32().ok()?,
                bytes: r.rest(),
            },
            _ => return None,
        };
        r.end().ok()?;
        Some(BlockArg { block_size, op })
    }
}

fn apply_block(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let Some(BlockArg { block_size, op }) = BlockArg::decode(arg) else {
        return old.map(<[u8]>::to_vec);
    };
    let bs = block_size as usize;
    if let Some(row) = old.filter(|o| bs != 0 && overlay::is_overlay(o, bs)) {
        return apply_to_overlay(row, bs, &op);
    }
    match op {
        BlockOp::Write { offset, bytes } | BlockOp::Overlay { offset, bytes } => {
            let start = offset as usize;
            let end = start + bytes.len();
            if bs != 0 && end > bs {
                // Past the block: malformed, so the old value stays.
                return old.map(<[u8]>::to_vec);
            }
            let Some(old) = old else {
                if matches!(op, BlockOp::Overlay { .. }) {
                    let mut row = overlay::empty(bs);
                    overlay::write(&mut row, bs, start, bytes);
                    return overlay::settle(row, bs);
                }
                let mut block = vec![0; end];
                block[start..].copy_from_slice(bytes);
                return Some(block);
            };
            let mut block = old.to_vec();
            if block.len() < end {
                block.resize(end, 0);
            }
            block[start..end].copy_from_slice(bytes);
            Some(block)
        }
        BlockOp::Trim { len } => {
            let old = old?;
            let keep = (len as usize).min(old.len());
            (keep > 0).then(|| old[..keep].to_vec())
        }
        BlockOp::Zero { offset, len } => {
            let mut block = old?.to_vec();
            let start = (offset as usize).min(block.len());
            let end = (offset as usize)
                .saturating_add(len as usize)
                .min(block.len());
            block[start..end].fill(0);
            Some(block)
        }
    }
}

/// `op` applied to overlay row `row` (overlay.rs): writes and zeroing mark their bytes
/// written; a trim makes it a raw block.
fn apply_to_overlay(row: &[u8], bs: usize, op: &BlockOp<'_>) -> Option<Vec<u8>> {
    let mut row = row.to_vec();
    match *op {
        BlockOp::Write { offset, bytes } | BlockOp::Overlay { offset, bytes } => {
            let start = offset as usize;
            if start + bytes.len() > bs {
                return Some(row);
            }
            overlay::write(&mut row, bs, start, bytes);
        }
        // A trim meets an overlay only where nothing lies beneath it (a truncate dissolves
        // the slot it cuts first, extent.rs E3), so the overlay is the block its bytes make
        // over zeros; cut as a raw block is (present stays present, so D2's count holds).
        BlockOp::Trim { len } => {
            let keep = (len as usize).min(bs);
            row.truncate(keep);
            return (keep > 0).then_some(row);
        }
        BlockOp::Zero { offset, len } => {
            let start = (offset as usize).min(bs);
            let end = (offset as usize).saturating_add(len as usize).min(bs);
            overlay::zero(&mut row, bs, start, end);
        }
    }
    overlay::settle(row, bs)
}

/// A change to a stat, applied by [`FN_STAT`] wherever the stat lives (inline in an entry or
/// in an inode record). Fields are applied in declaration order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatDelta {
    /// size = max(size, v): a write that may extend the file.
    pub size_at_least: Option<u64>,
    /// size = v: truncate.
    pub size: Option<u64>,
    /// Permission bits (type bits kept).
    pub perm: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Clear the set-id bits [`setid_bits_to_clear`] names (chown and write rules).
    pub kill_suid: bool,
    /// nlink += v.
    pub nlink_add: Option<i32>,
    /// Access time.
    pub atime: Option<Timespec>,
    /// Modification time.
    pub mtime: Option<Timespec>,
    /// Change time.
    pub ctime: Option<Timespec>,
    /// Data blocks stored (regular files only: [`Stat::set_stored_blocks`]; ignored for other
    /// types). Absolute, computed by the writer under the inode's lock (data.rs).
    pub stored_blocks: Option<u64>,
}

const F_SIZE_MIN: u32 = 1;
const F_SIZE: u32 = 1 << 1;
const F_PERM: u32 = 1 << 2;
const F_UID: u32 = 1 << 3;
const F_GID: u32 = 1 << 4;
const F_KILL_SUID: u32 = 1 << 5;
const F_NLINK: u32 = 1 << 6;
const F_ATIME: u32 = 1 << 7;
const F_MTIME: u32 = 1 << 8;
const F_CTIME: u32 = 1 << 9;
const F_BLOCKS: u32 = 1 << 10;

impl StatDelta {
    /// Encodes: flags u32, then each present field in flag order (times as i64 sec, u32 nsec).
    pub fn encode(&self) -> Vec<u8> {
        let mut flags = 0;
        let mut w = Writer::with_capacity(64);
        w.u32(0);
        let put_time = |w: &mut Writer, t: Timespec| {
            w.i64(t.sec).u32(t.nsec);
        };
        if let Some(v) = self.size_at_least {
            flags |= F_SIZE_MIN;
            w.u64(v);
        }
        if let Some(v) = self.size {
            flags |= F_SIZE;
            w.u64(v);
        }
        if let Some(v) = self.perm {
            flags |= F_PERM;
            w.u32(v);
        }
        if let Some(v) = self.uid {
            flags |= F_UID;
            w.u32(v);
        }
        if let Some(v) = self.gid {
            flags |= F_GID;
            w.u32(v);
        }
        if self.kill_suid {
            flags |= F_KILL_SUID;
        }
        if let Some(v) = self.nlink_add {
            flags |= F_NLINK;
            w.u32(v as u32);
        }
        for (flag, t) in [
            (F_ATIME, self.atime),
            (F_MTIME, self.mtime),
            (F_CTIME, self.ctime),
        ] {
            if let Some(t) = t {
                flags |= flag;
                put_time(&mut w, t);
            }
        }
        if let Some(v) = self.stored_blocks {
            flags |= F_BLOCKS;
            w.u64(v);
        }
        let mut out = w.finish();
        out[..4].copy_from_slice(&flags.to_be_bytes());
        out
    }

    /// Decodes an argument; `None` if malformed.
    pub fn decode(arg: &[u8]) -> Option<StatDelta> {
        let mut r = Reader::new(arg, "stat delta");
        let flags = r.u32().ok()?;
        let mut d = StatDelta::default();
        let time = |r: &mut Reader<'_>| -> Option<Timespec> {
            let sec = r.i64().ok()?;
            let nsec = r.u32().ok()?;
            (nsec < 1_000_000_000).then_some(Timespec { sec, nsec })
        };
        if flags & F_SIZE_MIN != 0 {
            d.size_at_least = Some(r.u64().ok()?);
        }
        if flags & F_SIZE != 0 {
            d.size = Some(r.u64().ok()?);
        }
        if flags & F_PERM != 0 {
            d.perm = Some(r.u32().ok()?);
        }
        if flags & F_UID != 0 {
            d.uid = Some(r.u32().ok()?);
        }
        if flags & F_GID != 0 {
            d.gid = Some(r.u32().ok()?);
        }
        d.kill_suid = flags & F_KILL_SUID != 0;
        if flags & F_NLINK != 0 {
            d.nlink_add = Some(r.u32().ok()? as i32);
        }
        if flags & F_ATIME != 0 {
            d.atime = Some(time(&mut r)?);
        }
        if flags & F_MTIME != 0 {
            d.mtime = Some(time(&mut r)?);
        }
        if flags & F_CTIME != 0 {
            d.ctime = Some(time(&mut r)?);
        }
        if flags & F_BLOCKS != 0 {
            d.stored_blocks = Some(r.u64().ok()?);
        }
        r.end().ok()?;
        Some(d)
    }

    /// One delta with the effect of `self` followed by `next` on every stat, or `None` when
    /// there is none (link count changes of opposite signs: saturation at zero makes their
    /// order matter).
    pub fn then(&self, next: &StatDelta) -> Option<StatDelta> {
        let (a, b) = (self, next);
        // Size: `size` overrides; `size_at_least` raises.
        let (size_at_least, size) = match (b.size, b.size_at_least) {
            (Some(v), _) => (None, Some(v)),
            (None, Some(m)) => match a.size {
                Some(v) => (None, Some(v.max(m))),
                None => (Some(a.size_at_least.map_or(m, |x| x.max(m))), None),
            },
            (None, None) => (a.size_at_least, a.size),
        };
        // Mode: a later `perm` replaces every bit earlier steps set or cleared; clearing
        // set-id bits after a known `perm` can be computed now, since `perm` sets all 12 bits.
        let (perm, kill_suid) = match (b.perm, a.perm) {
            (Some(p), _) => (Some(p), b.kill_suid),
            (None, Some(p)) => {
                let mut v = p;
                for kill in [a.kill_suid, b.kill_suid] {
                    if kill {
                        v &= !setid_bits_to_clear(v);
                    }
                }
                (Some(v), false)
            }
            (None, None) => (None, a.kill_suid || b.kill_suid),
        };
        let nlink_add = match (a.nlink_add, b.nlink_add) {
            (Some(x), Some(y)) if (x >= 0) == (y >= 0) => Some(x.checked_add(y)?),
            (Some(_), Some(_)) => return None,
            (x, y) => y.or(x),
        };
        Some(StatDelta {
            size_at_least,
            size,
            perm,
            uid: b.uid.or(a.uid),
            gid: b.gid.or(a.gid),
            kill_suid,
            nlink_add,
            atime: b.atime.or(a.atime),
            mtime: b.mtime.or(a.mtime),
            ctime: b.ctime.or(a.ctime),
            stored_blocks: b.stored_blocks.or(a.stored_blocks),
        })
    }

    /// Applies the delta to a stat.
    pub fn apply(&self, s: &mut Stat) {
        if let Some(v) = self.size_at_least {
            s.size = s.size.max(v);
        }
        if let Some(v) = self.size {
            s.size = v;
        }
        if let Some(v) = self.perm {
            s.mode = (s.mode & crate::attr::S_IFMT) | (v & 0o7777);
        }
        if let Some(v) = self.uid {
            s.uid = v;
        }
        if let Some(v) = self.gid {
            s.gid = v;
        }
        if self.kill_suid {
            s.mode &= !setid_bits_to_clear(s.mode);
        }
        if let Some(v) = self.nlink_add {
            s.nlink = s.nlink.saturating_add_signed(v);
        }
        if let Some(t) = self.atime {
            s.atime = t;
        }
        if let Some(t) = self.mtime {
            s.mtime = t;
        }
        if let Some(t) = self.ctime {
            s.ctime = t;
        }
        if let Some(n) = self.stored_blocks {
            s.set_stored_blocks(n);
        }
    }
}

fn apply_stat(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    // Absent stays absent: a delta must never resurrect a deleted entry.
    let old = old?;
    let unchanged = || Some(old.to_vec());
    let Some(delta) = StatDelta::decode(arg) else {
        return unchanged();
    };
    let Some(off) = old.first().copied().and_then(stat_offset) else {
        return unchanged();
    };
    let Some(stat_bytes) = old.get(off..off + crate::attr::STAT_LEN) else {
        return unchanged();
    };
    let Ok(mut stat) = Stat::read(&mut Reader::new(stat_bytes, "stat")) else {
        return unchanged();
    };
    delta.apply(&mut stat);
    // One allocation: the bytes around the stat copied, the stat written between them.
    let mut w = Writer::with_capacity(old.len());
    w.bytes(&old[..off]);
    stat.write(&mut w);
    w.bytes(&old[off + crate::attr::STAT_LEN..]);
    Some(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn time() -> impl Strategy<Value = Option<Timespec>> {
        proptest::option::of((0i64..4, 0u32..3).prop_map(|(sec, nsec)| Timespec { sec, nsec }))
    }

    fn delta() -> impl Strategy<Value = StatDelta> {
        let small = || proptest::option::of(0u64..40);
        (
            (small(), small(), proptest::option::of(0u32..0o10000)),
            (
                proptest::option::of(0u32..3),
                proptest::option::of(0u32..3),
                any::<bool>(),
            ),
            (proptest::option::of(-2i32..3), time(), time(), time()),
            proptest::option::of(0u64..5),
        )
            .prop_map(
                |((sal, size, perm), (uid, gid, kill), (nlink, at, mt, ct), blocks)| StatDelta {
                    size_at_least: sal,
                    size,
                    perm,
                    uid,
                    gid,
                    kill_suid: kill,
                    nlink_add: nlink,
                    atime: at,
                    mtime: mt,
                    ctime: ct,
                    stored_blocks: blocks,
                },
            )
    }

    proptest! {
        /// The merge contract: applying the merged delta equals applying both in order, for
        /// every stat (set-id bits, link counts near zero and sizes included).
        #[test]
        fn stat_delta_then_is_sequential_application(
            a in delta(), b in delta(), mode in 0u32..0o10000, nlink in 0u32..3, size in 0u64..40,
        ) {
            let mut s = Stat::new(0o100000 | mode, 1, 1, nlink, Timespec { sec: 9, nsec: 9 });
            s.size = size;
            let mut seq = s;
            a.apply(&mut seq);
            b.apply(&mut seq);
            if let Some(c) = a.then(&b) {
                let mut one = s;
                c.apply(&mut one);
                prop_assert_eq!(one, seq);
                let via_bytes = merge_stat(&a.encode(), &b.encode()).expect("merges");
                prop_assert_eq!(StatDelta::decode(&via_bytes), Some(c));
            } else {
                prop_assert!(a.nlink_add.is_some() && b.nlink_add.is_some());
            }
        }

    /// Merged block writes equal the two writes applied in order, on an absent block and on
        /// blocks shorter and longer than the writes; for version-1 and version-2 Writes and
        /// for Overlays.
        #[test]
        fn block_write_merge_is_sequential_application(
            old in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
            o1 in 0u32..16, b1 in proptest::collection::vec(any::<u8>(), 0..8),
            o2 in 0u32..16, b2 in proptest::collection::vec(any::<u8>(), 0..8),
            kind in 0u8..3,
        ) {
            let enc = |offset, bytes| match kind {
                0 => legacy(BlockOp::Write { offset, bytes }),
                1 => arg(BlockOp::Write { offset, bytes }),
                _ => arg(BlockOp::Overlay { offset, bytes }),
            };
            let (w1, w2) = (enc(o1, &b1), enc(o2, &b2));
            let seq = apply_block(apply_block(old.as_deref(), &w1).as_deref(), &w2);
            match merge_block(&w1, &w2) {
                Some(m) => prop_assert_eq!(apply_block(old.as_deref(), &m), seq),
                // Only a gap between the two ranges refuses.
                None => prop_assert!(o2 as usize > o1 as usize + b1.len() || o1 as usize > o2 as usize + b2.len()),
            }
        }

        /// Any sequence of block ops from an absent block, read over a hole (zeros beneath),
        /// gives the block a byte model says: writes and overlays set bytes, a trim zeroes
        /// the bytes past it, zeroing zeroes. And the stored row is always a raw block of at
        /// most `BS` bytes or a well-formed overlay (overlay.rs O1, O2).
        #[test]
        fn block_ops_over_a_hole_match_a_byte_model(ops in proptest::collection::vec(op(), 0..12)) {
            let mut model = vec![0u8; BS];
            let mut row: Option<Vec<u8>> = None;
            for o in &ops {
                row = apply_block(row.as_deref(), &arg(o.as_op()));
                o.apply_to_model(&mut model);
                if let Some(r) = &row {
                    prop_assert!(r.len() <= BS || (overlay::is_overlay(r, BS) && overlay::well_formed(r, BS)));
                }
            }
            prop_assert_eq!(read_over(&vec![0; BS], row.as_deref()), model);
        }

        /// Overlays and whole-block puts over an extent's bytes read as the extent's bytes with
        /// every write on top in order (extent.rs E2): nothing written is lost, nothing
        /// unwritten is hidden.
        #[test]
        fn overlays_keep_the_bytes_beneath(
            base in proptest::collection::vec(any::<u8>(), BS..=BS),
            writes in proptest::collection::vec((0usize..BS, proptest::collection::vec(any::<u8>(), 1..20), any::<bool>()), 0..10),
        ) {
            let mut model = base.clone();
            let mut row: Option<Vec<u8>> = None;
            for (at, bytes, whole) in &writes {
                if *whole {
                    // A whole-block write: a put.
                    let block: Vec<u8> = (0..BS).map(|i| bytes[i % bytes.len()]).collect();
                    model.copy_from_slice(&block);
                    row = Some(block);
                    continue;
                }
                let n = bytes.len().min(BS - at);
                row = apply_block(row.as_deref(), &arg(BlockOp::Overlay { offset: *at as u32, bytes: &bytes[..n] }));
                model[*at..at + n].copy_from_slice(&bytes[..n]);
            }
            prop_assert_eq!(read_over(&base, row.as_deref()), model);
        }
    }

    // The smallest block size mkfs allows (the argument decoder refuses others).
    const BS: usize = 512;

    /// A block op for the model test, owning its bytes.
    #[derive(Clone, Debug)]
    enum Op {
        Write(u32, Vec<u8>),
        Overlay(u32, Vec<u8>),
        Trim(u32),
        Zero(u32, u32),
    }

    impl Op {
        fn as_op(&self) -> BlockOp<'_> {
            match self {
                Op::Write(o, b) => BlockOp::Write {
                    offset: *o,
                    bytes: b,
                },
                Op::Overlay(o, b) => BlockOp::Overlay {
                    offset: *o,
                    bytes: b,
                },
                Op::Trim(len) => BlockOp::Trim { len: *len },
                Op::Zero(o, len) => BlockOp::Zero {
                    offset: *o,
                    len: *len,
                },
            }
        }

        fn apply_to_model(&self, m: &mut [u8]) {
            match self {
                Op::Write(o, b) | Op::Overlay(o, b) => {
                    m[*o as usize..*o as usize + b.len()].copy_from_slice(b)
                }
                Op::Trim(len) => m[(*len as usize).min(BS)..].fill(0),
                Op::Zero(o, len) => {
                    let (a, z) = ((*o as usize).min(BS), (*o as usize + *len as usize).min(BS));
                    m[a..z].fill(0)
                }
            }
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        let write = (0usize..BS).prop_flat_map(|o| {
            (
                Just(o as u32),
                proptest::collection::vec(1u8..=255, 1..=(BS - o)),
            )
        });
        prop_oneof![
            write.clone().prop_map(|(o, b)| Op::Write(o, b)),
            write.prop_map(|(o, b)| Op::Overlay(o, b)),
            (0u32..=BS as u32 + 4).prop_map(Op::Trim),
            (0u32..BS as u32, 0u32..BS as u32).prop_map(|(o, l)| Op::Zero(o, l)),
        ]
    }

    /// A block as a read sees it: `base` (an extent's bytes, or zeros), the row on top.
    fn read_over(base: &[u8], row: Option<&[u8]>) -> Vec<u8> {
        let mut out = base.to_vec();
        match row {
            Some(r) if overlay::is_overlay(r, BS) => overlay::lay_over(r, BS, 0, BS, &mut out),
            Some(r) => out[..r.len()].copy_from_slice(r),
            None => {}
        }
        out
    }

    /// Version-2 argument for block size [`BS`].
    fn arg(op: BlockOp<'_>) -> Vec<u8> {
        BlockArg {
            block_size: BS as u32,
            op,
        }
        .encode()
    }

    /// The version-1 argument (no block size) that logs written before overlays hold.
    fn legacy(op: BlockOp<'_>) -> Vec<u8> {
        let v2 = arg(op);
        let mut v1 = vec![v2[0] & !TAG_V2];
        v1.extend_from_slice(&v2[5..]);
        v1
    }

    #[test]
    fn block_write_creates_zero_filled_and_never_shrinks() {
        for enc in [arg, legacy] {
            let w = enc(BlockOp::Write {
                offset: 3,
                bytes: b"ab",
            });
            assert_eq!(apply_block(None, &w), Some(vec![0, 0, 0, b'a', b'b']));
            let w = enc(BlockOp::Write {
                offset: 0,
                bytes: b"x",
            });
            assert_eq!(apply_block(Some(b"hello"), &w), Some(b"xello".to_vec()));
        }
    }

    #[test]
    fn an_overlay_on_a_raw_block_writes_it_and_on_nothing_records_its_bytes() {
        let o = arg(BlockOp::Overlay {
            offset: 1,
            bytes: b"yz",
        });
        assert_eq!(apply_block(Some(b"hello"), &o), Some(b"hyzlo".to_vec()));
        let row = apply_block(None, &o).expect("an overlay");
        assert!(overlay::is_overlay(&row, BS));
        assert_eq!(read_over(&[7; BS], Some(&row))[..4], [7, b'y', b'z', 7]);
        // Without a block size an overlay cannot be told from a block: refused.
        let mut v1 = legacy(BlockOp::Overlay {
            offset: 1,
            bytes: b"yz",
        });
        assert_eq!(apply_block(Some(b"v"), &v1), Some(b"v".to_vec()));
        v1[0] = 0x14;
        assert_eq!(apply_block(Some(b"v"), &v1), Some(b"v".to_vec()));
    }

    #[test]
    fn trim_and_zero_keep_absent_absent() {
        for enc in [arg, legacy] {
            assert_eq!(apply_block(None, &enc(BlockOp::Trim { len: 3 })), None);
            assert_eq!(
                apply_block(None, &enc(BlockOp::Zero { offset: 0, len: 3 })),
                None
            );
            assert_eq!(
                apply_block(Some(b"hello"), &enc(BlockOp::Trim { len: 2 })),
                Some(b"he".to_vec())
            );
            assert_eq!(
                apply_block(Some(b"hello"), &enc(BlockOp::Trim { len: 0 })),
                None
            );
            let z = enc(BlockOp::Zero {
                offset: 1,
                len: 100,
            });
            assert_eq!(
                apply_block(Some(b"hello"), &z),
                Some(vec![b'h', 0, 0, 0, 0])
            );
        }
    }

    #[test]
    fn malformed_arguments_leave_values_unchanged() {
        assert_eq!(apply_block(Some(b"v"), &[9, 9]), Some(b"v".to_vec()));
        assert_eq!(
            apply_stat(Some(b"\x01garbage"), &StatDelta::default().encode()),
            Some(b"\x01garbage".to_vec())
        );
        assert_eq!(apply_stat(None, &StatDelta::default().encode()), None);
    }

    #[test]
    fn stat_delta_round_trips() {
        let d = StatDelta {
            size_at_least: Some(5),
            perm: Some(0o755),
            nlink_add: Some(-1),
            mtime: Some(Timespec { sec: -3, nsec: 7 }),
            kill_suid: true,
            stored_blocks: Some(3),
            ..StatDelta::default()
        };
        assert_eq!(StatDelta::decode(&d.encode()), Some(d));
    }
}
