//! The write-ahead log: a circular region inside the block file holding every write batch (and
//! tree creation) since the older durable checkpoint, plus group commit.
//! Format, protocol and invariants: docs/format.md, "Write-ahead log".
//!
//! Owns: record framing (LSN, length, epoch, crc32c), appending records at consecutive LSNs,
//! the durable-LSN watermark and the leader/follower fsync protocol, and the recovery scan that
//! finds the last whole record. Never: applies records to trees (env.rs replays them), decides
//! when to checkpoint, or overwrites a record at or after the oldest checkpoint's LSN (W5).
//!
//! Invariants (numbered as in docs/format.md; tests cite them):
//! - W1 a record is accepted only if its header crc, payload crc, magic and stored LSN all match
//!   the position it is read at, so a record left from an earlier lap never validates.
//! - W2 LSN order is MSN order: records are appended under the environment's write lock, in the
//!   order their batches get MSNs, and applied in that order.
//! - W3 a `Sync` commit returns only after a device sync that started after its record was
//!   written completed successfully; a failed sync fails every waiter and poisons the log.
//! - W4 the scan stops at the first record `L` that does not validate; if any later frame (up to
//!   a lap past the checkpoint, found by following the chain and searching for the magic where
//!   it breaks) has a verifying header at its own LSN, an acceptable epoch and `synced > L`, `L`
//!   had been durable: the scan is an error naming it (or, asked to, cuts there and reports
//!   what it dropped); otherwise `L` is a torn tail.
//! - W5 an append never overwrites bytes at or after the older checkpoint's LSN; when there is no
//!   room the append fails with [`Error::NoSpace`] and the caller checkpoints first.
//! - W6 records carry the epoch of the open that wrote them; epochs never decrease along the
//!   log, so a stale record after a cut tail (written before a crash, never acknowledged) does
//!   not validate once the tail is overwritten by a later open.
//! - W7 recovery replays only records whose MSNs the checkpoint does not hold (first MSN at or
//!   above the catalog's next MSN), so replaying twice gives the same state.
//! - W8 (env.rs) a checkpoint holds the write lock only to snapshot (log end, catalog, `Arc`s of
//!   the dirty nodes) and to adopt the blocks of nodes unchanged since; it encodes, writes and
//!   syncs without it, so writers keep writing (blockfile B10 keeps the two tables apart).
//! - W10 after a sync that made a record other than a sync mark durable, a sync mark carrying
//!   the new durable LSN is appended and written before any waiter of that sync returns; a sync
//!   that covered only marks appends none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::blockfile::BlockLoc;
use crate::device::BlockDevice;
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
const TAG_SYNC_MARK: u8 = 3;
/// Payload tag of a write batch with data extent ops (format.md, "Log record tag 4").
const TAG_EXTENT_BATCH: u8 = 4;
/// A sync mark's second frame starts on a multiple of this many LSNs (= bytes of the device:
/// the region is 4096-aligned), so it never shares a sector with the records it proves.
const MARK_SECTOR: u64 = 512;

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
pub(crate) fn encode_batch<'a>(ops: impl ExactSizeIterator<Item = (u32, &'a Op)>) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(TAG_BATCH);
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (i, (tree, op)) in ops.enumerate() {
        out.extend_from_slice(&tree.to_le_bytes());
        op.encode(Msn(i as u64), &mut out);
    }
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

/// Reads and writes inside the log region, wrapping at its end.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    pub dev: Arc<dyn BlockDevice>,
    pub loc: BlockLoc,
}

impl Region {
    fn cap(&self) -> u64 {
        self.loc.len as u64
    }

    /// Reads `buf.len()` bytes of the log at `lsn`, wrapping; bytes past the device's end (a
    /// region never written that far) read as zeros.
    fn read(&self, buf: &mut [u8], lsn: u64) -> Result<()> {
        let cap = self.cap();
        let dev_len = self
            .dev
            .len()
            .map_err(|e| Error::io("reading the log region", e))?;
        let mut done = 0usize;
        while done < buf.len() {
            let at = (lsn + done as u64) % cap;
            let n = ((cap - at) as usize).min(buf.len() - done);
            let off = self.loc.offset + at;
            let part = &mut buf[done..done + n];
            let avail = dev_len.saturating_sub(off).min(n as u64) as usize;
            part[avail..].fill(0);
            if avail > 0 {
                self.dev
                    .read_at(&mut part[..avail], off)
                    .map_err(|e| Error::io(format!("reading the log at LSN {lsn}"), e))?;
            }
            done += n;
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], lsn: u64) -> Result<()> {
        let cap = self.cap();
        let mut done = 0usize;
        while done < buf.len() {
            let at = (lsn + done as u64) % cap;
            let n = ((cap - at) as usize).min(buf.len() - done);
            self.dev
                .write_at(&buf[done..done + n], self.loc.offset + at)
                .map_err(|e| Error::io(format!("writing the log at LSN {lsn}"), e))?;
            done += n;
        }
        Ok(())
    }
}

/// What [`scan`] found after a checkpoint.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// Positions of the whole records, in LSN order. Only positions: recovery reads each
    /// record again when it applies it ([`read_record`]), so the memory it needs is bounded
    /// by the node cache, not by the log region (up to 256 MiB of records).
    pub records: Vec<Lsn>,
    /// LSN just past the last whole record: where appends continue.
    pub end: Lsn,
    /// The highest `synced` field of an accepted frame: every record below it was covered by
    /// a completed sync (X7).
    pub synced: Lsn,
    /// The damage the log was cut at, when the caller allowed a cut (repair).
    pub cut: Option<LogCut>,
}

/// A damaged log record that recovery cut at instead of failing (only when asked to:
/// `Options::cut_damaged_log`), and what that dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogCut {
    /// LSN of the damaged record: the log now ends here.
    pub at: Lsn,
    /// End of the last later frame found: the records in `at..to` were dropped.
    pub to: Lsn,
    /// Later records (frames with a verifying header at their own LSN) dropped with it.
    pub records_dropped: u64,
    /// Why the record at `at` was rejected, as the refusing open would have said it.
    pub why: String,
}

/// What the frames after a rejected record at `bad` say (W4).
struct Later {
    /// Frames with a verifying header at their own LSN and an acceptable epoch.
    frames: u64,
    /// Of those, frames whose `synced` field is past `bad`, and the first of them.
    proofs: u64,
    first_proof: Option<Lsn>,
    /// End of the last such frame.
    end: u64,
}

/// Bytes read at a time while searching for the magic.
const SEARCH_CHUNK: usize = 1 << 20;

/// LSN of the next occurrence of the record magic at or after `from` and before `limit`.
fn next_magic(region: &Region, from: u64, limit: u64) -> Result<Option<u64>> {
    let mut buf = vec![0u8; SEARCH_CHUNK];
    let mut at = from;
    while at + RECORD_MAGIC.len() as u64 <= limit {
        let n = ((limit - at) as usize).min(SEARCH_CHUNK);
        region.read(&mut buf[..n], at)?;
        let chunk = &buf[..n];
        let mut i = 0;
        while let Some(j) = chunk[i..].iter().position(|&b| b == RECORD_MAGIC[0]) {
            let k = i + j;
            if k + RECORD_MAGIC.len() > n {
                break; // may straddle the chunk: the next chunk starts here
            }
            if chunk[k..k + RECORD_MAGIC.len()] == RECORD_MAGIC {
                return Ok(Some(at + k as u64));
            }
            i = k + 1;
        }
        if n < RECORD_MAGIC.len() {
            break;
        }
        // Overlap by the magic's length less one so a magic across chunks is found.
        at += (n - (RECORD_MAGIC.len() - 1)) as u64;
    }
    Ok(None)
}

/// Looks at every frame after the rejected record at `bad` up to `limit` (one lap past the
/// checkpoint): follows the chain from `from`, and where it breaks searches for the magic (W4).
fn later_frames(region: &Region, bad: u64, from: u64, limit: u64, epoch: u32) -> Result<Later> {
    let mut later = Later {
        frames: 0,
        proofs: 0,
        first_proof: None,
        end: bad,
    };
    let mut pos = from;
    let mut hb = [0u8; FRAME_HEADER_LEN];
    while pos + FRAME_HEADER_LEN as u64 <= limit {
        region.read(&mut hb, pos)?;
        let candidate = decode_frame_header(&hb, Lsn(pos))
            .filter(|h| h.epoch >= epoch && pos + FRAME_HEADER_LEN as u64 + h.len as u64 <= limit);
        match candidate {
            Some(h) => {
                later.frames += 1;
                if h.synced.0 > bad {
                    later.proofs += 1;
                    later.first_proof.get_or_insert(Lsn(pos));
                }
                pos += FRAME_HEADER_LEN as u64 + h.len as u64;
                later.end = pos;
            }
            None => match next_magic(region, pos + 1, limit)? {
                Some(p) => pos = p,
                None => break,
            },
        }
    }
    Ok(later)
}

/// Scans the log from `start` (a checkpoint's LSN), records of epoch at least `min_epoch`
/// (W6), up to the last whole record; a rejected record that later frames prove durable is an
/// error, or with `cut_damage` the end of the log (W4).
pub(crate) fn scan(
    region: &Region,
    start: Lsn,
    min_epoch: u32,
    cut_damage: bool,
) -> Result<Scanned> {
    let mut pos = start.0;
    let mut epoch = min_epoch;
    let mut records = Vec::new();
    let mut synced = start;
    let limit = start.0 + region.cap(); // a full lap: nothing beyond it can be newer
                                        // Why the record at `pos` was rejected, and where the frames after it start.
    let (why, resume, expected, actual) = loop {
        if pos >= limit {
            return Ok(Scanned {
                records,
                end: Lsn(pos),
                synced,
                cut: None,
            });
        }
        let what = format!("log record at LSN {pos}");
        match read_frame(region, pos)? {
            Frame::Whole(h, payload) if h.epoch >= epoch => {
                // Decoded to validate it, then dropped. A record whose crc verifies but which
                // does not decode was written so (a bug, or a newer format): never a torn
                // tail, so the open fails here, before anything is applied.
                decode_record(&payload, &what)?;
                records.push(Lsn(pos));
                synced = synced.max(h.synced);
                epoch = h.epoch;
                pos += FRAME_HEADER_LEN as u64 + h.len as u64;
            }
            // An older epoch: stale bytes of a cut tail (W6), or damage to a newer record's
            // epoch field that its header crc did not catch (impossible short of a crc
            // collision); either way the frames after it decide.
            Frame::Whole(h, _) => {
                let next = pos + FRAME_HEADER_LEN as u64 + h.len as u64;
                break (format!("epoch {} below {epoch}", h.epoch), next, 0, 0);
            }
            Frame::BadPayload(h, actual) => {
                let next = pos + FRAME_HEADER_LEN as u64 + h.len as u64;
                break (
                    "payload checksum mismatch".to_string(),
                    next,
                    h.payload_crc,
                    actual,
                );
            }
            Frame::Nothing => break ("no valid frame header".to_string(), pos + 1, 0, 0),
        }
    };
    let later = later_frames(region, pos, resume.min(limit), limit, epoch)?;
    if later.proofs == 0 {
        // A torn or never-completed tail: the log ends here.
        return Ok(Scanned {
            records,
            end: Lsn(pos),
            synced,
            cut: None,
        });
    }
    if cut_damage {
        return Ok(Scanned {
            records,
            end: Lsn(pos),
            synced,
            cut: Some(LogCut {
                at: Lsn(pos),
                to: Lsn(later.end),
                records_dropped: later.frames,
                why,
            }),
        });
    }
    Err(Error::Checksum {
        what: format!(
            "log record at LSN {pos} ({why}; it had been made durable: {} later records up to              LSN {} follow it, {} of them written after a sync that covered it, the first at              LSN {}); `fernfs fsck --repair` (or Options::cut_damaged_log) cuts the log there",
            later.frames,
            later.end,
            later.proofs,
            later.first_proof.map_or(0, |l| l.0),
        ),
        expected,
        actual,
    })
}

/// What was found at a log position.
enum Frame {
    /// A whole record: header and payload verify (W1).
    Whole(FrameHeader, Vec<u8>),
    /// The header verifies but the payload does not (its actual crc).
    BadPayload(FrameHeader, u32),
    /// No valid header for this position.
    Nothing,
}

/// Reads the frame at `lsn`.
fn read_frame(region: &Region, lsn: u64) -> Result<Frame> {
    let mut hb = [0u8; FRAME_HEADER_LEN];
    region.read(&mut hb, lsn)?;
    let Some(h) = decode_frame_header(&hb, Lsn(lsn)) else {
        return Ok(Frame::Nothing);
    };
    if FRAME_HEADER_LEN as u64 + h.len as u64 > region.cap() {
        return Ok(Frame::Nothing);
    }
    let mut payload = vec![0u8; h.len as usize];
    region.read(&mut payload, lsn + FRAME_HEADER_LEN as u64)?;
    let crc = crc32c::crc32c(&payload);
    if crc != h.payload_crc {
        return Ok(Frame::BadPayload(h, crc));
    }
    Ok(Frame::Whole(h, payload))
}

/// Reads and decodes the record [`scan`] found whole at `lsn`.
pub(crate) fn read_record(region: &Region, lsn: Lsn) -> Result<LogRecord> {
    let what = format!("log record at LSN {lsn}");
    match read_frame(region, lsn.0)? {
        Frame::Whole(_, payload) => decode_record(&payload, &what),
        // Nothing writes the log between the scan and the replay of an open.
        _ => Err(Error::corrupt(
            what,
            "changed between the scan and the replay",
        )),
    }
}

struct SyncState {
    /// Everything below this LSN is durable.
    durable: u64,
    /// A leader is syncing now.
    syncing: bool,
    /// A sync failed: nothing more is ever reported durable (W3).
    failed: Option<String>,
    /// The last sync mark appended: its LSN and the LSN past it. A sync that made only
    /// `mark_at..mark_end` durable appends no further mark (W10).
    mark_at: u64,
    mark_end: u64,
}

/// Appended records not yet written to the device: one `pwrite` per this many bytes (or per
/// sync, whichever comes first) instead of one per record. A record in it is not durable and is
/// lost with the process, exactly like a written but unsynced one is lost with the machine; a
/// `Sync` commit, `Env::sync`, the periodic flusher and every checkpoint write it out first.
const TAIL_BYTES: usize = 256 << 10;

/// The append position and the records appended but not yet written.
struct Tail {
    /// Next LSN to append.
    end: u64,
    /// Framed records from LSN `end - bytes.len()` to `end`.
    bytes: Vec<u8>,
    /// LSN past the last record that is not a sync mark: what `Env::sync` must make durable.
    records_end: u64,
}

/// The open log: append position, durable watermark, group commit.
pub(crate) struct Wal {
    region: Region,
    epoch: u32,
    /// Append position and unwritten records; appends hold this lock (and the env's write
    /// lock, W2).
    end: Mutex<Tail>,
    /// Every record below this LSN has been written to the device (not necessarily synced).
    written: AtomicU64,
    /// The older durable checkpoint's LSN as last published by the environment (W5 for sync
    /// marks, which are appended without the environment's lock); it only grows, so a stale
    /// value only makes a mark less likely to fit.
    oldest: AtomicU64,
    sync: Mutex<SyncState>,
    cv: Condvar,
    /// Device syncs issued by group commit (for stats and the E9 benchmark).
    pub syncs: AtomicU64,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("region", &self.region.loc)
            .field("end", &self.end.lock().end)
            .finish()
    }
}

impl Wal {
    /// A log whose records end at `end`, everything below it durable, appending with `epoch`;
    /// the log must keep everything from `oldest` on (W5).
    pub(crate) fn new(region: Region, end: Lsn, epoch: u32, oldest: Lsn) -> Wal {
        Wal {
            region,
            epoch,
            end: Mutex::new(Tail {
                end: end.0,
                bytes: Vec::new(),
                records_end: end.0,
            }),
            written: AtomicU64::new(end.0),
            oldest: AtomicU64::new(oldest.0),
            sync: Mutex::new(SyncState {
                durable: end.0,
                syncing: false,
                failed: None,
                mark_at: 0,
                mark_end: 0,
            }),
            cv: Condvar::new(),
            syncs: AtomicU64::new(0),
        }
    }

    /// Bytes of the region.
    pub(crate) fn capacity(&self) -> u64 {
        self.region.cap()
    }

    /// LSN past the last appended record.
    pub(crate) fn end(&self) -> Lsn {
        Lsn(self.end.lock().end)
    }

    /// Bytes a record with `payload_len` bytes of payload takes.
    pub(crate) fn framed_len(payload_len: usize) -> u64 {
        FRAME_HEADER_LEN as u64 + payload_len as u64
    }

    /// Whether a record of `payload_len` bytes fits without touching anything at or after
    /// `oldest` (the older checkpoint's LSN, W5).
    pub(crate) fn fits(&self, payload_len: usize, oldest: Lsn) -> bool {
        let end = self.end.lock().end;
        end + Self::framed_len(payload_len) - oldest.0.min(end) <= self.capacity()
    }

    /// Appends one record and returns the LSN just past it. The caller holds the environment's
    /// write lock (W2) and has checked [`fits`](Self::fits).
    pub(crate) fn append(&self, payload: &[u8], oldest: Lsn) -> Result<Lsn> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&l| l as usize <= MAX_PAYLOAD && l > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("log record of {} bytes", payload.len()))
            })?;
        let mut tail = self.end.lock();
        let end = tail.end;
        let framed = Self::framed_len(payload.len());
        if end + framed - oldest.0.min(end) > self.capacity() {
            return Err(Error::NoSpace {
                context: format!(
                    "appending a {framed}-byte log record: the log region ({} bytes) still \
                     holds records since checkpoint LSN {oldest}",
                    self.capacity()
                ),
            });
        }
        let synced = self.sync.lock().durable;
        let h = FrameHeader {
            len,
            lsn: Lsn(end),
            synced: Lsn(synced),
            epoch: self.epoch,
            payload_crc: crc32c::crc32c(payload),
        };
        tail.bytes.extend_from_slice(&encode_frame_header(&h));
        tail.bytes.extend_from_slice(payload);
        tail.end += framed;
        tail.records_end = tail.end;
        if tail.bytes.len() >= TAIL_BYTES {
            self.write_tail(&mut tail)?;
        }
        Ok(Lsn(tail.end))
    }

    /// Publishes the older durable checkpoint's LSN after a checkpoint commits (W5).
    pub(crate) fn set_oldest(&self, oldest: Lsn) {
        self.oldest.fetch_max(oldest.0, Ordering::Release);
    }

    /// Appends a sync mark saying the log is durable below `durable` and writes it to the
    /// device (not synced), W10. Returns its LSN and the LSN past it, or `None` if it does not
    /// fit without touching what the older checkpoint needs (W5): then the next append must
    /// checkpoint first, which covers these records anyway.
    ///
    /// The mark is two frames: a first one padded so that the second starts on a
    /// [`MARK_SECTOR`] boundary. Media damage comes in sectors; a lost or garbled sector holding
    /// the end of the records this sync covered then cannot also take the second mark's header,
    /// so the proof survives the damage it is needed for.
    fn append_mark(&self, durable: u64) -> Result<Option<(u64, u64)>> {
        let mut tail = self.end.lock();
        let at = tail.end;
        let min = Self::framed_len(1);
        // First frame: at least the tag, padded so the second one starts on a sector.
        let mut second = (at + min).next_multiple_of(MARK_SECTOR);
        if second - at < min {
            second += MARK_SECTOR;
        }
        let end = second + min;
        let oldest = self.oldest.load(Ordering::Acquire);
        if end - oldest.min(at) > self.capacity() {
            return Ok(None);
        }
        for (lsn, len) in [(at, second - at), (second, min)] {
            let mut payload = vec![0u8; (len - FRAME_HEADER_LEN as u64) as usize];
            payload[0] = TAG_SYNC_MARK;
            let h = FrameHeader {
                len: payload.len() as u32,
                lsn: Lsn(lsn),
                synced: Lsn(durable),
                epoch: self.epoch,
                payload_crc: crc32c::crc32c(&payload),
            };
            tail.bytes.extend_from_slice(&encode_frame_header(&h));
            tail.bytes.extend_from_slice(&payload);
        }
        tail.end = end;
        self.write_tail(&mut tail)?;
        Ok(Some((at, end)))
    }

    /// Runs `f` with the log's end while no record or mark can be appended (log-space release,
    /// W9: the punched range is computed from this end and must not meet a new record).
    pub(crate) fn with_appends_excluded<R>(&self, f: impl FnOnce(Lsn) -> R) -> R {
        let tail = self.end.lock();
        f(Lsn(tail.end))
    }

    /// Writes the appended records still held in memory to the device (not synced).
    pub(crate) fn flush(&self) -> Result<()> {
        let mut tail = self.end.lock();
        self.write_tail(&mut tail)
    }

    fn write_tail(&self, tail: &mut Tail) -> Result<()> {
        if tail.bytes.is_empty() {
            return Ok(());
        }
        let start = tail.end - tail.bytes.len() as u64;
        self.region.write(&tail.bytes, start)?;
        tail.bytes.clear();
        if tail.bytes.capacity() > 4 * TAIL_BYTES {
            tail.bytes.shrink_to(TAIL_BYTES);
        }
        self.written.store(tail.end, Ordering::Release);
        Ok(())
    }

    /// Returns once everything below `lsn` is durable: the first waiter to find no sync in
    /// flight becomes the leader and syncs for everyone written so far; the others wait and
    /// are covered by it or by the next one (group commit, W3).
    pub(crate) fn wait_durable(&self, lsn: Lsn) -> Result<()> {
        let mut g = self.sync.lock();
        loop {
            if let Some(f) = &g.failed {
                return Err(Error::Poisoned(f.clone()));
            }
            if g.durable >= lsn.0 {
                return Ok(());
            }
            if g.syncing {
                self.cv.wait(&mut g);
                continue;
            }
            g.syncing = true;
            let (before, mark_at, mark_end) = (g.durable, g.mark_at, g.mark_end);
            drop(g);
            // Write out what is still in memory, then sync: every write that completed before
            // the load of `written` is covered by the sync.
            let r = self.flush().and_then(|()| {
                let target = self.written.load(Ordering::Acquire);
                self.syncs.fetch_add(1, Ordering::Relaxed);
                self.region
                    .dev
                    .sync()
                    .map_err(|e| Error::io("syncing the log", e))?;
                // W10: the proof that this sync completed goes to the device before anyone
                // is told. A sync that made only the last mark durable appends none.
                let only_mark = before >= mark_at && target <= mark_end;
                let mark = if target > before && !only_mark {
                    self.append_mark(target)?
                } else {
                    None
                };
                Ok((target, mark))
            });
            g = self.sync.lock();
            g.syncing = false;
            match r {
                Ok((target, mark)) => {
                    g.durable = g.durable.max(target);
                    if let Some((at, end)) = mark {
                        (g.mark_at, g.mark_end) = (at, end);
                    }
                }
                Err(e) => {
                    g.failed = Some(e.to_string());
                    self.cv.notify_all();
                    return Err(e);
                }
            }
            self.cv.notify_all();
        }
    }

    /// Makes every record appended so far durable (a pending sync mark alone needs no sync
    /// here: the periodic flusher takes care of it, so `fsync` of a file and then of its
    /// directory costs one device sync, not two).
    pub(crate) fn sync_all(&self) -> Result<()> {
        let records_end = self.end.lock().records_end;
        self.wait_durable(Lsn(records_end))
    }

    /// Makes everything appended so far durable, sync marks included (the periodic flusher:
    /// a mark reaches the medium within one interval, W10).
    pub(crate) fn sync_to_end(&self) -> Result<()> {
        self.wait_durable(self.end())
    }

    /// The log is durable below this LSN.
    pub(crate) fn durable(&self) -> Lsn {
        Lsn(self.sync.lock().durable)
    }

    /// Whether anything was appended (records or a sync mark) that is not yet durable.
    pub(crate) fn has_unsynced(&self) -> bool {
        let end = self.end().0;
        self.sync.lock().durable < end
    }

    /// Records that a device sync which started after everything below `lsn` was written has
    /// completed (a checkpoint's sync covers the log too).
    pub(crate) fn mark_durable(&self, lsn: Lsn) {
        let mut g = self.sync.lock();
        g.durable = g.durable.max(lsn.0);
        self.cv.notify_all();
    }

    /// Fails every later wait: the device is in an unknown state (W3).
    pub(crate) fn fail(&self, why: &str) {
        let mut g = self.sync.lock();
        if g.failed.is_none() {
            g.failed = Some(why.to_string());
        }
        self.cv.notify_all();
    }
}
