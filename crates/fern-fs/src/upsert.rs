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

/// Two block writes as one, when their byte ranges overlap or touch (the newer wins where they
/// overlap). Other pairs (trims, zeroing, writes with a gap between) are not merged: a gap
/// would have to be filled with the block's old bytes, which the merge cannot see.
fn merge_block(older: &[u8], newer: &[u8]) -> Option<Vec<u8>> {
    let (
        BlockOp::Write {
            offset: o1,
            bytes: b1,
        },
        BlockOp::Write {
            offset: o2,
            bytes: b2,
        },
    ) = (BlockOp::decode(older)?, BlockOp::decode(newer)?)
    else {
        return None;
    };
    let (s1, e1) = (o1 as usize, o1 as usize + b1.len());
    let (s2, e2) = (o2 as usize, o2 as usize + b2.len());
    if s2 > e1 || s1 > e2 {
        return None;
    }
    let lo = s1.min(s2);
    let mut bytes = vec![0u8; e1.max(e2) - lo];
    bytes[s1 - lo..e1 - lo].copy_from_slice(b1);
    bytes[s2 - lo..e2 - lo].copy_from_slice(b2);
    Some(
        BlockOp::Write {
            offset: lo as u32,
            bytes: &bytes,
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
    /// block grows to `offset + bytes.len()` if shorter. Never shrinks a block.
    Write {
        /// Offset inside the block.
        offset: u32,
        /// Bytes to write.
        bytes: &'a [u8],
    },
    /// Cut the block to `len` bytes (0 deletes it); absent stays absent.
    Trim {
        /// New length at most.
        len: u32,
    },
    /// Zero `[offset, offset + len)` within the block's current length; absent stays absent.
    Zero {
        /// Start inside the block.
        offset: u32,
        /// Bytes to zero.
        len: u32,
    },
}

impl BlockOp<'_> {
    /// Encodes the argument: tag u8 then fields (Write: offset u32 | bytes to the end).
    pub fn encode(&self) -> Vec<u8> {
        // Sized up front: a block's bytes are copied once, not through the doublings of a
        // growing vector.
        let extra = match self {
            BlockOp::Write { bytes, .. } => bytes.len(),
            _ => 4,
        };
        let mut w = Writer::with_capacity(5 + extra);
        match self {
            BlockOp::Write { offset, bytes } => w.u8(1).u32(*offset).bytes(bytes),
            BlockOp::Trim { len } => w.u8(2).u32(*len),
            BlockOp::Zero { offset, len } => w.u8(3).u32(*offset).u32(*len),
        };
        w.finish()
    }

    fn decode(arg: &[u8]) -> Option<BlockOp<'_>> {
        let mut r = Reader::new(arg, "block op");
        let op = match r.u8().ok()? {
            1 => BlockOp::Write {
                offset: r.u32().ok()?,
                bytes: r.rest(),
            },
            2 => BlockOp::Trim { len: r.u32().ok()? },
            3 => BlockOp::Zero {
                offset: r.u32().ok()?,
                len: r.u32().ok()?,
            },
            _ => return None,
        };
        r.end().ok()?;
        Some(op)
    }
}

fn apply_block(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let Some(op) = BlockOp::decode(arg) else {
        return old.map(<[u8]>::to_vec);
    };
    match op {
        BlockOp::Write { offset, bytes } => {
            let mut block = old.map(<[u8]>::to_vec).unwrap_or_default();
            let start = offset as usize;
            let end = start + bytes.len();
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
    let mut w = Writer::with_capacity(crate::attr::STAT_LEN);
    stat.write(&mut w);
    let mut new = old.to_vec();
    new[off..off + crate::attr::STAT_LEN].copy_from_slice(&w.finish());
    Some(new)
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
        /// blocks shorter and longer than the writes.
        #[test]
        fn block_write_merge_is_sequential_application(
            old in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
            o1 in 0u32..16, b1 in proptest::collection::vec(any::<u8>(), 0..8),
            o2 in 0u32..16, b2 in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let w1 = BlockOp::Write { offset: o1, bytes: &b1 }.encode();
            let w2 = BlockOp::Write { offset: o2, bytes: &b2 }.encode();
            let seq = apply_block(apply_block(old.as_deref(), &w1).as_deref(), &w2);
            match merge_block(&w1, &w2) {
                Some(m) => prop_assert_eq!(apply_block(old.as_deref(), &m), seq),
                // Only a gap between the two ranges refuses.
                None => prop_assert!(o2 as usize > o1 as usize + b1.len() || o1 as usize > o2 as usize + b2.len()),
            }
        }
    }

    #[test]
    fn block_write_creates_zero_filled_and_never_shrinks() {
        let w = BlockOp::Write {
            offset: 3,
            bytes: b"ab",
        }
        .encode();
        assert_eq!(apply_block(None, &w), Some(vec![0, 0, 0, b'a', b'b']));
        let w = BlockOp::Write {
            offset: 0,
            bytes: b"x",
        }
        .encode();
        assert_eq!(apply_block(Some(b"hello"), &w), Some(b"xello".to_vec()));
    }

    #[test]
    fn trim_and_zero_keep_absent_absent() {
        assert_eq!(apply_block(None, &BlockOp::Trim { len: 3 }.encode()), None);
        assert_eq!(
            apply_block(None, &BlockOp::Zero { offset: 0, len: 3 }.encode()),
            None
        );
        assert_eq!(
            apply_block(Some(b"hello"), &BlockOp::Trim { len: 2 }.encode()),
            Some(b"he".to_vec())
        );
        assert_eq!(
            apply_block(Some(b"hello"), &BlockOp::Trim { len: 0 }.encode()),
            None
        );
        let z = BlockOp::Zero {
            offset: 1,
            len: 100,
        }
        .encode();
        assert_eq!(
            apply_block(Some(b"hello"), &z),
            Some(vec![b'h', 0, 0, 0, 0])
        );
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
