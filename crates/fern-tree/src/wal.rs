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
//! - W4 the scan stops at the first record that does not validate (torn tail); if a later record
//!   proves the bad one was durable (its `synced` field is past it), the scan is an error.
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
    let rec = match r.u8()? {
        TAG_BATCH => {
            let first_msn = r.u64()?;
            let n = r.u32()? as usize;
            if n == 0 {
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
            LogRecord::Batch {
                first_msn: Msn(first_msn),
                ops,
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
}

/// What was found at a log position.
enum Frame {
    /// A whole record: header and payload verify (W1).
    Whole(FrameHeader, Vec<u8>),
    /// The header verifies but the payload does not.
    BadPayload(FrameHeader),
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
    if crc32c::crc32c(&payload) != h.payload_crc {
        return Ok(Frame::BadPayload(h));
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

/// Scans the log from `start` (a checkpoint's LSN), records of epoch at least `min_epoch`
/// (W6), up to the last whole record (W4).
pub(crate) fn scan(region: &Region, start: Lsn, min_epoch: u32) -> Result<Scanned> {
    let mut pos = start.0;
    let mut epoch = min_epoch;
    let mut records = Vec::new();
    loop {
        if pos - start.0 >= region.cap() {
            break; // a full lap: nothing more can be newer
        }
        let bad = match read_frame(region, pos)? {
            Frame::Whole(h, payload) if h.epoch >= epoch => {
                let what = format!("log record at LSN {pos}");
                // Decoded to validate it (a record that does not decode fails the open here,
                // before anything is applied), then dropped.
                decode_record(&payload, &what)?;
                records.push(Lsn(pos));
                epoch = h.epoch;
                pos += FRAME_HEADER_LEN as u64 + h.len as u64;
                continue;
            }
            Frame::Whole(..) => None, // an older epoch: stale bytes of a cut tail (W6)
            Frame::BadPayload(h) => Some(h),
            Frame::Nothing => None,
        };
        // The end of the log, unless a later record proves this one was durable (W4).
        if let Some(h) = bad {
            let next = pos + FRAME_HEADER_LEN as u64 + h.len as u64;
            if next - start.0 < region.cap() {
                if let Frame::Whole(nh, _) = read_frame(region, next)? {
                    if nh.epoch >= epoch && nh.synced.0 > pos {
                        return Err(Error::Checksum {
                            what: format!(
                                "log record at LSN {pos} (the record at LSN {next} shows it was \
                                 durable)"
                            ),
                            expected: h.payload_crc,
                            actual: {
                                let mut p = vec![0u8; h.len as usize];
                                region.read(&mut p, pos + FRAME_HEADER_LEN as u64)?;
                                crc32c::crc32c(&p)
                            },
                        });
                    }
                }
            }
        }
        break;
    }
    Ok(Scanned {
        records,
        end: Lsn(pos),
    })
}

struct SyncState {
    /// Everything below this LSN is durable.
    durable: u64,
    /// A leader is syncing now.
    syncing: bool,
    /// A sync failed: nothing more is ever reported durable (W3).
    failed: Option<String>,
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
    /// A log whose records end at `end`, everything below it durable, appending with `epoch`.
    pub(crate) fn new(region: Region, end: Lsn, epoch: u32) -> Wal {
        Wal {
            region,
            epoch,
            end: Mutex::new(Tail {
                end: end.0,
                bytes: Vec::new(),
            }),
            written: AtomicU64::new(end.0),
            sync: Mutex::new(SyncState {
                durable: end.0,
                syncing: false,
                failed: None,
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
        if tail.bytes.len() >= TAIL_BYTES {
            self.write_tail(&mut tail)?;
        }
        Ok(Lsn(tail.end))
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
            drop(g);
            // Write out what is still in memory, then sync: every write that completed before
            // the load of `written` is covered by the sync.
            let r = self.flush().and_then(|()| {
                let target = self.written.load(Ordering::Acquire);
                self.syncs.fetch_add(1, Ordering::Relaxed);
                self.region
                    .dev
                    .sync()
                    .map(|()| target)
                    .map_err(|e| Error::io("syncing the log", e))
            });
            g = self.sync.lock();
            g.syncing = false;
            match r {
                Ok(target) => g.durable = g.durable.max(target),
                Err(e) => {
                    g.failed = Some(e.to_string());
                    self.cv.notify_all();
                    return Err(e);
                }
            }
            self.cv.notify_all();
        }
    }

    /// Makes everything written so far durable.
    pub(crate) fn sync_all(&self) -> Result<()> {
        self.wait_durable(self.end())
    }

    /// Whether records were appended that are not yet durable.
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
