//! Log record and frame codec: the bytes of a record (batch, tree creation, sync mark, extent
//! batch) and of the frame around it (LSN, length, epoch, crc32c). docs/format.md, "Write-ahead
//! log". Pure functions of bytes: no I/O, no state.

use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, UpsertId};
use crate::msg::{Kind, MsgRef, Op};
use crate::varint::{put_varint, Reader};

/// Magic at the start of every record frame.
pub const RECORD_MAGIC: [u8; 4] = *b"FWAL";
/// Bytes of a record frame header (payload follows).
pub const FRAME_HEADER_LEN: usize = 36;
/// Payload tag of a write batch.
const TAG_BATCH: u8 = 1;
/// Payload tag of a tree creation.
const TAG_CREATE_TREE: u8 = 2;
/// Payload tag of a sync mark (W10): the payload is the tag followed by zero padding; the
/// frame's `synced` field is the point of the record.
pub(super) const TAG_SYNC_MARK: u8 = 3;
/// Payload tag of a write batch with data extent ops (format.md, "Log record tag 4").
const TAG_EXTENT_BATCH: u8 = 4;
/// A sync mark's second frame starts on a multiple of this many LSNs (= bytes of the device:
/// the region is 4096-aligned), so it never shares a sector with the records it proves.
pub(super) const MARK_SECTOR: u64 = 512;

/// A decoded log record payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// One write batch: ops in order with consecutive MSNs from `first_msn` (stored relative to
    /// it); each op names its tree by catalog index.
    Batch {
        /// MSN of the first op.
        first_msn: Msn,
        /// (tree index, op) in batch order.
        ops: Vec<(u32, Op)>,
    },
    /// A new tree at catalog index `idx`.
    CreateTree {
        /// Catalog index the tree gets.
        idx: u32,
        /// Its name.
        name: String,
    },
    /// A sync mark: a device sync had made the log durable below this frame's `synced` field
    /// (W10). Carries nothing to replay.
    SyncMark,
    /// A write batch that also binds and frees data extents (tag 4): the ops as in `Batch`
    /// (possibly none), then the extent ops, applied after them in order.
    ExtentBatch {
        /// MSN of the first op.
        first_msn: Msn,
        /// (tree index, op) in batch order.
        ops: Vec<(u32, Op)>,
        /// Binds and frees, in order (at least one).
        extents: Vec<ExtentOp>,
    },
}

/// A change to the data extents carried by a tag-4 record (X4, X5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentOp {
    /// A written extent enters the table.
    Bind(crate::extent::ExtentRef),
    /// The live extent at this offset leaves the table.
    Free(u64),
}

const EXTENT_BIND: u8 = 1;
const EXTENT_FREE: u8 = 2;

/// Appends the extent section of a tag-4 record to a payload built by [`encode_batch`] and
/// retags it.
pub(crate) fn add_extent_ops(payload: &mut Vec<u8>, extents: &[ExtentOp]) {
    payload[0] = TAG_EXTENT_BATCH;
    payload.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for e in extents {
        match e {
            ExtentOp::Bind(r) => {
                payload.push(EXTENT_BIND);
                payload.extend_from_slice(&r.encode());
            }
            ExtentOp::Free(offset) => {
                payload.push(EXTENT_FREE);
                payload.extend_from_slice(&offset.to_le_bytes());
            }
        }
    }
}

/// Encodes a batch record payload. Each op carries its MSN relative to the batch (0, 1, ...),
/// so the payload can be built before the write lock; [`set_first_msn`] fills in the first MSN
/// once it is known.
pub(crate) fn encode_batch<'a>(
    ops: impl ExactSizeIterator<Item = (u32, &'a Op)> + Clone,
) -> Vec<u8> {
    // One allocation: grown op by op, a batch of small ops reallocated several times, 7 % of
    // a FUSE request thread's time under chmod + utime.
    let bound = 13
        + ops
            .clone()
            .map(|(_, op)| 4 + op.encoded_len_bound())
            .sum::<usize>();
    let mut out = Vec::with_capacity(bound);
    out.push(TAG_BATCH);
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (i, (tree, op)) in ops.enumerate() {
        out.extend_from_slice(&tree.to_le_bytes());
        op.encode(Msn(i as u64), &mut out);
    }
    debug_assert!(
        out.len() <= bound,
        "Op::encoded_len_bound is below the encoding"
    );
    out
}

/// Sets the first MSN of a payload built by [`encode_batch`].
pub(crate) fn set_first_msn(payload: &mut [u8], first: Msn) {
    payload[1..9].copy_from_slice(&first.0.to_le_bytes());
}

/// Encodes a tree-creation record payload.
pub(crate) fn encode_create_tree(idx: u32, name: &str) -> Vec<u8> {
    let mut out = vec![TAG_CREATE_TREE];
    out.extend_from_slice(&idx.to_le_bytes());
    put_varint(&mut out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes a record payload (untrusted bytes). `what` names the record in errors.
pub fn decode_record(b: &[u8], what: &str) -> Result<LogRecord> {
    let what_s = what.to_string();
    let what_f = || what_s.clone();
    let mut r = Reader::new(b, &what_f);
    let tag = r.u8()?;
    let rec = match tag {
        TAG_BATCH | TAG_EXTENT_BATCH => {
            let first_msn = r.u64()?;
            let n = r.u32()? as usize;
            if n == 0 && tag == TAG_BATCH {
                return Err(r.err("empty batch"));
            }
            first_msn
                .checked_add(n as u64)
                .ok_or_else(|| r.err("MSN overflow"))?;
            let mut ops = Vec::with_capacity(n.min(4096));
            for i in 0..n {
                let tree = r.u32()?;
                let (_, start) = MsgRef::validate(&mut r)?;
                let m = MsgRef::decode_trusted(b, start);
                if m.msn.0 != i as u64 {
                    return Err(r.err(format!("op {i} has relative MSN {} (expected {i})", m.msn)));
                }
                ops.push((tree, op_of(&m)));
            }
            if tag == TAG_BATCH {
                LogRecord::Batch {
                    first_msn: Msn(first_msn),
                    ops,
                }
            } else {
                let m = r.u32()? as usize;
                if m == 0 {
                    return Err(r.err("extent batch without extent ops"));
                }
                let mut extents = Vec::with_capacity(m.min(4096));
                for _ in 0..m {
                    extents.push(match r.u8()? {
                        EXTENT_BIND => ExtentOp::Bind(
                            crate::extent::ExtentRef::decode(r.bytes(16)?)
                                .map_err(|why| r.err(why))?,
                        ),
                        EXTENT_FREE => ExtentOp::Free(r.u64()?),
                        k => return Err(r.err(format!("unknown extent op {k}"))),
                    });
                }
                LogRecord::ExtentBatch {
                    first_msn: Msn(first_msn),
                    ops,
                    extents,
                }
            }
        }
        TAG_CREATE_TREE => {
            let idx = r.u32()?;
            let name = std::str::from_utf8(r.len_prefixed(255)?)
                .map_err(|_| r.err("tree name is not UTF-8"))?
                .to_string();
            if name.is_empty() {
                return Err(r.err("empty tree name"));
            }
            LogRecord::CreateTree { idx, name }
        }
        TAG_SYNC_MARK => {
            // Padding only: anything else is not a mark this build wrote.
            if r.bytes(r.remaining())?.iter().any(|&b| b != 0) {
                return Err(r.err("sync mark padding is not zero"));
            }
            LogRecord::SyncMark
        }
        t => return Err(r.err(format!("unknown record tag {t}"))),
    };
    if r.pos() != b.len() {
        return Err(Error::corrupt(what, "trailing bytes after the record"));
    }
    Ok(rec)
}

fn op_of(m: &MsgRef<'_>) -> Op {
    match m.kind {
        Kind::Insert => Op::Insert {
            key: m.key.to_vec(),
            value: m.payload.to_vec(),
        },
        Kind::Delete => Op::Delete {
            key: m.key.to_vec(),
        },
        Kind::Upsert => Op::Upsert {
            key: m.key.to_vec(),
            id: UpsertId(m.upsert.0),
            arg: m.payload.to_vec(),
        },
        Kind::RangeDelete => Op::DeleteRange {
            lo: m.key.to_vec(),
            hi: m.payload.to_vec(),
        },
    }
}

/// Largest payload a record may carry, whatever the region size (keeps lengths sane when a
/// corrupt header claims more).
pub const MAX_PAYLOAD: usize = 1 << 30;

/// The fields of a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload bytes.
    pub len: u32,
    /// LSN of the record's first byte.
    pub lsn: Lsn,
    /// The log was durable up to here when the record was appended.
    pub synced: Lsn,
    /// Epoch (open count) of the writer.
    pub epoch: u32,
    /// crc32c of the payload.
    pub payload_crc: u32,
}

/// Encodes a frame header (W1).
pub fn encode_frame_header(h: &FrameHeader) -> [u8; FRAME_HEADER_LEN] {
    let mut b = [0u8; FRAME_HEADER_LEN];
    b[0..4].copy_from_slice(&RECORD_MAGIC);
    b[4..8].copy_from_slice(&h.len.to_le_bytes());
    b[8..16].copy_from_slice(&h.lsn.0.to_le_bytes());
    b[16..24].copy_from_slice(&h.synced.0.to_le_bytes());
    b[24..28].copy_from_slice(&h.epoch.to_le_bytes());
    b[28..32].copy_from_slice(&h.payload_crc.to_le_bytes());
    let crc = crc32c::crc32c(&b[..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a frame header read at `expected` (W1). `None` if it is not a valid header for that
/// position (torn, stale, or never written).
pub fn decode_frame_header(b: &[u8], expected: Lsn) -> Option<FrameHeader> {
    if b.len() < FRAME_HEADER_LEN || b[0..4] != RECORD_MAGIC {
        return None;
    }
    let u32_at = |at: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&b[at..at + 4]);
        u32::from_le_bytes(w)
    };
    let u64_at = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    if crc32c::crc32c(&b[..32]) != u32_at(32) {
        return None;
    }
    let h = FrameHeader {
        len: u32_at(4),
        lsn: Lsn(u64_at(8)),
        synced: Lsn(u64_at(16)),
        epoch: u32_at(24),
        payload_crc: u32_at(28),
    };
    if h.lsn != expected || h.len as usize > MAX_PAYLOAD || h.len == 0 {
        return None;
    }
    Some(h)
}

/// Decodes a whole frame (header + payload) at `expected`, for fuzzing and tests: the payload
/// if the frame validates and decodes.
pub fn decode_frame(b: &[u8], expected: Lsn) -> Result<Option<LogRecord>> {
    let Some(h) = decode_frame_header(b, expected) else {
        return Ok(None);
    };
    let end = FRAME_HEADER_LEN + h.len as usize;
    if b.len() < end || crc32c::crc32c(&b[FRAME_HEADER_LEN..end]) != h.payload_crc {
        return Ok(None);
    }
    decode_record(
        &b[FRAME_HEADER_LEN..end],
        &format!("log record at LSN {expected}"),
    )
    .map(Some)
}
