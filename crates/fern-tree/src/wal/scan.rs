//! The log region and the recovery scan: reads and writes inside the circular region, and the
//! scan that finds the last whole record at open (W1, W4, W6), looking past a bad frame for
//! proof that it had been durable. docs/format.md, "Write-ahead log", Recovery.

use std::sync::Arc;

use super::record::*;
use crate::blockfile::BlockLoc;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::Lsn;

/// Reads and writes inside the log region, wrapping at its end.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    pub dev: Arc<dyn BlockDevice>,
    pub loc: BlockLoc,
}

impl Region {
    pub(super) fn cap(&self) -> u64 {
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

    /// The first LSN at or after `lsn`, and at most `limit`, whose byte the device may hold as
    /// other than zero: the region's holes (punched log, W9) and the bytes past the device's
    /// end read as zeros and are skipped, up to the region's end at most (it continues at its
    /// start). No frame starts in zeros (the magic's first byte is not zero).
    fn skip_zeros(&self, lsn: u64, limit: u64) -> Result<u64> {
        let cap = self.cap();
        let at = lsn % cap;
        let off = self.loc.offset + at;
        let end = self.loc.offset + cap;
        let data = self
            .dev
            .next_data(off)
            .map_err(|e| Error::io(format!("looking for data in the log at LSN {lsn}"), e))?;
        let next = match data {
            Some(d) if d < end => lsn + (d.max(off) - off),
            _ => lsn + (cap - at), // only zeros up to the region's end: go round
        };
        Ok(next.min(limit))
    }

    pub(super) fn write(&self, buf: &[u8], lsn: u64) -> Result<()> {
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

// `Region::skip_zeros` skips zeros while searching for a frame: no frame may start with one.
const _: () = assert!(RECORD_MAGIC[0] != 0);

/// A forward search for the record magic that reads each byte of the region once: it keeps
/// the last chunk it read, so the searches W4 makes one after another — each resuming just
/// past a candidate whose header did not verify, often a few KiB on — look in that chunk
/// instead of reading a fresh 1 MiB for every candidate (an open spent most of its time
/// there on a log region full of earlier laps' frames).
struct MagicSearch {
    buf: Vec<u8>,
    /// Region offset of `buf[0]`, and how many bytes of `buf` hold region bytes.
    at: u64,
    len: usize,
}

impl MagicSearch {
    fn new() -> Self {
        MagicSearch {
            buf: Vec::new(),
            at: 0,
            len: 0,
        }
    }

    /// LSN of the next occurrence of the record magic at or after `from` and before `limit`.
    fn next(&mut self, region: &Region, from: u64, limit: u64) -> Result<Option<u64>> {
        let m = RECORD_MAGIC.len() as u64;
        let mut pos = from;
        while pos + m <= limit {
            let held = self.at + self.len as u64;
            if pos < self.at || pos + m > held || held > limit {
                pos = region.skip_zeros(pos, limit)?;
                if pos + m > limit {
                    break;
                }
                let n = ((limit - pos) as usize).min(SEARCH_CHUNK);
                self.buf.resize(SEARCH_CHUNK.max(self.buf.len()), 0);
                region.read(&mut self.buf[..n], pos)?;
                (self.at, self.len) = (pos, n);
            }
            let start = (pos - self.at) as usize;
            if let Some(k) = memchr::memmem::find(&self.buf[start..self.len], &RECORD_MAGIC) {
                return Ok(Some(pos + k as u64));
            }
            let end = self.at + self.len as u64;
            if end >= limit {
                break;
            }
            // Overlap by the magic's length less one so a magic across chunks is found.
            pos = end - (m - 1);
        }
        Ok(None)
    }
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
    let mut search = MagicSearch::new();
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
            None => match search.next(region, pos + 1, limit)? {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{BlockDevice, FileDevice, MemDevice};

    /// The search skips what a file holds as holes or does not hold at all (past its end),
    /// going round the region, and finds the same frames as reading every byte: the magic
    /// after a 40 MiB hole, then, past the file's end, the ones of the next lap.
    #[test]
    fn magic_search_skips_holes_and_the_end_of_a_file() {
        const CAP: u64 = 64 << 20;
        const BASE: u64 = 4096;
        let dir = tempfile::tempdir().expect("tempdir");
        let file: Arc<dyn BlockDevice> =
            Arc::new(FileDevice::create(dir.path().join("img")).expect("create"));
        let block: Vec<u8> = (0..8192).map(|i| (i % 200 + 1) as u8).collect();
        let mut first = block.clone();
        first[100..104].copy_from_slice(&RECORD_MAGIC);
        let mut second = block.clone();
        second[10..14].copy_from_slice(&RECORD_MAGIC);
        file.write_at(&first, BASE).expect("write");
        file.write_at(&second, BASE + (40 << 20)).expect("write"); // a hole before it
        assert_ne!(
            file.next_data(BASE + 8192).expect("next_data"),
            Some(BASE + 8192),
            "the temporary directory's file system reports no holes (SEEK_DATA)"
        );
        let (dev, counters) = crate::stats::counted(file);
        let region = Region {
            dev,
            loc: BlockLoc {
                offset: BASE,
                len: CAP as u32,
            },
        };
        let mut s = MagicSearch::new();
        assert_eq!(
            s.next(&region, 200, 2 * CAP).unwrap(),
            Some((40 << 20) + 10)
        );
        assert_eq!(
            s.next(&region, (40 << 20) + 11, 2 * CAP).unwrap(),
            Some(CAP + 100),
            "past the file's end, the search goes round to the region's start"
        );
        let lap = CAP + (40 << 20) + 10;
        assert_eq!(s.next(&region, CAP + 101, 2 * CAP).unwrap(), Some(lap));
        assert_eq!(s.next(&region, lap + 1, 2 * CAP).unwrap(), None);
        let read = counters.device().bytes_read;
        assert!(
            read <= 4 * SEARCH_CHUNK as u64,
            "{read} bytes read to search a 64 MiB region holding 16 KiB"
        );
    }

    /// The windowed search finds what a byte-by-byte search finds, from every kind of start:
    /// magics inside a chunk, straddling a chunk's end, at the region's end, and none.
    #[test]
    fn magic_search_matches_a_naive_search() {
        let len = 3 * SEARCH_CHUNK + 5000;
        let mut bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut at = vec![
            10,
            4093,
            SEARCH_CHUNK - 2,
            SEARCH_CHUNK + 3,
            2 * SEARCH_CHUNK - 3,
            2 * SEARCH_CHUNK + 700_000,
        ];
        // Half-magics that must not match.
        bytes[20..23].copy_from_slice(&RECORD_MAGIC[..3]);
        for &p in &at {
            bytes[p..p + RECORD_MAGIC.len()].copy_from_slice(&RECORD_MAGIC);
        }
        let last = len - RECORD_MAGIC.len();
        bytes[last..].copy_from_slice(&RECORD_MAGIC);
        at.push(last);
        let dev = Arc::new(MemDevice::new());
        dev.write_at(&bytes, 0).expect("write");
        let region = Region {
            dev,
            loc: BlockLoc {
                offset: 0,
                len: len as u32,
            },
        };
        let naive = |from: usize, limit: usize| {
            (from..limit.saturating_sub(RECORD_MAGIC.len() - 1))
                .find(|&i| bytes[i..i + RECORD_MAGIC.len()] == RECORD_MAGIC)
                .map(|i| i as u64)
        };
        // One search object across calls, as W4 uses it: resuming past each find.
        let mut s = MagicSearch::new();
        let mut from = 0usize;
        let mut found = Vec::new();
        while let Some(p) = s.next(&region, from as u64, len as u64).expect("search") {
            assert_eq!(Some(p), naive(from, len));
            found.push(p as usize);
            from = p as usize + 1;
        }
        assert_eq!(found, at);
        // Fresh and reused searches from scattered starts, with limits that cut a magic.
        for from in [
            0,
            11,
            4094,
            SEARCH_CHUNK - 5,
            SEARCH_CHUNK,
            2 * SEARCH_CHUNK + 1,
        ] {
            for limit in [len, SEARCH_CHUNK + 3, SEARCH_CHUNK + 4, 2 * SEARCH_CHUNK] {
                let want = naive(from, limit);
                assert_eq!(
                    MagicSearch::new()
                        .next(&region, from as u64, limit as u64)
                        .unwrap(),
                    want
                );
                assert_eq!(s.next(&region, from as u64, limit as u64).unwrap(), want);
            }
        }
    }
}
