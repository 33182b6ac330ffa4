//! The write-ahead log: a circular region inside the block file holding every write batch (and
//! tree creation) since the older durable checkpoint, plus group commit.
//! Format, protocol and invariants: docs/format.md, "Write-ahead log".
//!
//! Files: `wal/record.rs` is the record and frame codec, `wal/scan.rs` the region and the
//! recovery scan; this file is the writer (appends, group commit, sync marks).
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

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::ids::Lsn;

mod record;
mod scan;

pub use record::*;
pub use scan::LogCut;
pub(crate) use scan::*;

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
