//! File data: read, write (with O_APPEND), truncation of blocks, fallocate. It owns the block
//! mapping: block `n` of file `id` holds bytes `[n * bs, (n + 1) * bs)`, stored at most `bs`
//! long; bytes missing from a short or absent block read as zeros.
//!
//! Invariant D1: no stored byte lies at or beyond the file's size. Writes extend the size in
//! the same batch as their data; truncation trims and range-deletes in the same batch as the
//! size change; so extending a file later never uncovers stale bytes.
//!
//! Invariant D3: a read writes every byte it returns — the extents' bytes and zeros between
//! them, or zeros, then the block rows on top — so a reused buffer (the FUSE ring's payload)
//! never shows an earlier read's bytes and is not cleared first.
//!
//! Writes are blind (a put per whole block, an upsert per partly written block, and an upsert
//! of the stat) and must never read before they write, except O_APPEND, which must learn the
//! size.

use fern_kv::{Direction, KeyRange, WriteBatch, WriteOptions};

use crate::attr::{FileType, Timespec};
use crate::error::{FsError, FsResult};
use crate::fs::{Fs, MAX_FILE_SIZE};
use crate::ids::{Fh, InodeId};
use crate::overlay;
use crate::schema;
use crate::upsert::{BlockArg, BlockOp, StatDelta, FN_BLOCK};

/// fallocate: do not change the size.
pub const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
/// fallocate: deallocate the range (with KEEP_SIZE).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// fallocate: make the range read as zeros (extending the size unless KEEP_SIZE).
pub const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// What a read returns: its length and the stat it was computed from.
struct ReadLen {
    stat: crate::attr::Stat,
    bytes: usize,
}

/// Reads of fewer blocks than this are point reads per block, longer ones one range scan.
const POINT_READ_BLOCKS: u64 = 8;

impl Fs {
    /// Reads up to `size` bytes of `ino` at `offset`; short at end of file.
    pub fn read(&self, ino: InodeId, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(ino, offset, size, &mut out)?;
        Ok(out)
    }

    /// [`read`](Self::read) into `out` (made exactly as long as the bytes read), so that a
    /// caller serving many reads reuses one allocation: a fresh 128 KiB-1 MiB buffer per
    /// request is a fresh mapping whose pages fault and are zeroed on first touch (a fifth of
    /// the daemon's CPU in a cold F7 read, fs-design.md §9). Every byte of `out` is written
    /// (D3), so nothing of an earlier read shows through.
    pub fn read_into(
        &self,
        ino: InodeId,
        offset: u64,
        size: u32,
        out: &mut Vec<u8>,
    ) -> FsResult<()> {
        let len = match self.read_len(ino, offset, size) {
            Ok(len) => len,
            Err(e) => {
                out.clear();
                return Err(e);
            }
        };
        if out.len() < len.bytes {
            out.resize(len.bytes, 0);
        } else {
            out.truncate(len.bytes);
        }
        self.read_fill(ino, offset, &len, out)
    }

    /// [`read`](Self::read) into the start of `out`, which must hold `size` bytes or as many as
    /// the file has from `offset` on (a FUSE reply buffer: the ring transport's payload, so a
    /// read lands where the kernel takes it from). Returns how many bytes it wrote.
    pub fn read_to(&self, ino: InodeId, offset: u64, size: u32, out: &mut [u8]) -> FsResult<usize> {
        let len = self.read_len(ino, offset, size)?;
        let Some(out) = out.get_mut(..len.bytes) else {
            return Err(FsError::Invalid);
        };
        self.read_fill(ino, offset, &len, out)?;
        Ok(len.bytes)
    }

    /// How many bytes a read of `ino` at `offset` for `size` returns (short at the end of the
    /// file), after the kind checks, with the stat that said so.
    fn read_len(&self, ino: InodeId, offset: u64, size: u32) -> FsResult<ReadLen> {
        let stat = {
            let _g = self.locks.lock(&[ino]);
            self.stat_locked(ino)?
        };
        match stat.kind()? {
            FileType::Regular => {}
            FileType::Directory => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid),
        }
        let bytes = if offset >= stat.size || size == 0 {
            0
        } else {
            (stat.size.min(offset.saturating_add(u64::from(size))) - offset) as usize
        };
        Ok(ReadLen { stat, bytes })
    }

    /// Fills `out` (exactly `len.bytes` long) with the bytes of `ino` from `offset`. D3: every
    /// byte is written — the extents' bytes and zeros around them (extent.rs), or zeros, then
    /// the block rows on top — so a reused buffer needs no clearing first.
    fn read_fill(&self, ino: InodeId, offset: u64, len: &ReadLen, out: &mut [u8]) -> FsResult<()> {
        if out.is_empty() {
            return Ok(());
        }
        let (stat, file_size) = (&len.stat, len.stat.size);
        let end = offset + out.len() as u64;
        let bs = u64::from(self.sb.block_size);
        let (first, last) = (offset / bs, (end - 1) / bs);
        let blocks = self.read_blocks(ino, first, last)?;
        // Extents first (zeros between them), block rows on top (extent.rs E2); no extent
        // below a slot's end (E1).
        if self.extent_tree().is_some() && file_size >= schema::SLOT_BYTES {
            self.read_extents(ino, offset, out)?;
        } else {
            out.fill(0);
        }
        for (k, v) in blocks {
            let n = schema::parse_block_key(ino, &k)?;
            let block_start = n * bs;
            let from = offset.max(block_start);
            if overlay::is_overlay(&v, bs as usize) {
                // Its written bytes over the extent's (or the hole's zeros), overlay.rs O3.
                let to = end.min(block_start + bs);
                if from < to {
                    overlay::lay_over(
                        &v,
                        bs as usize,
                        (from - block_start) as usize,
                        (to - block_start) as usize,
                        &mut out[(from - offset) as usize..(to - offset) as usize],
                    );
                }
                continue;
            }
            if v.len() as u64 > bs {
                return Err(FsError::corrupt(format!(
                    "data block {n} of inode {}: {} bytes",
                    ino.0,
                    v.len()
                )));
            }
            let to = end.min(block_start + v.len() as u64);
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                    &v[(from - block_start) as usize..(to - block_start) as usize],
                );
            }
        }
        self.touch_atime(ino, stat)?;
        Ok(())
    }

    /// The stored blocks `first..=last` of `ino` as (key, bytes), in order; absent blocks
    /// (holes, or past what is stored) are left out. On a store where point reads are cheap
    /// (embedded), a read of a few blocks (every small read: postmark, `cat`, `git status`)
    /// is one point read per block: a range scan costs fern-tree a leaf window's worth of
    /// materialized rows with their pending messages (docs/fs-design.md, "CPU cost per
    /// request"), a point read only the path to the key. Longer reads, and every read on a
    /// remote store (one round trip per read), scan.
    fn read_blocks(
        &self,
        ino: InodeId,
        first: u64,
        last: u64,
    ) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
        if last - first < POINT_READ_BLOCKS && self.kv.point_reads_cheap() {
            let mut out = Vec::with_capacity((last - first + 1) as usize);
            for n in first..=last {
                let key = schema::block_key(ino, n);
                if let Some(v) = self.kv.get(self.t.data, &key)? {
                    out.push((key, v));
                }
            }
            return Ok(out);
        }
        let range = KeyRange::half_open(
            &schema::block_key(ino, first),
            &schema::block_key(ino, last + 1),
        );
        Ok(self.kv.scan(
            self.t.data,
            &range,
            Direction::Forward,
            (last - first + 1) as usize,
        )?)
    }

    /// Writes `data` through handle `fh` at `offset` (at the end of file for O_APPEND
    /// handles); returns the bytes written.
    pub fn write(&self, fh: Fh, offset: u64, data: &[u8]) -> FsResult<usize> {
        let (ino, append, writable, kill_suid) = {
            let h = self.handles.lock();
            let h = h.get(&fh).ok_or(FsError::BadHandle)?;
            (h.ino, h.append, h.write, h.kill_suid)
        };
        if !writable {
            return Err(FsError::BadHandle);
        }
        let _g = self.locks.lock(&[ino]);
        let (loc, kind) = self.loc(ino)?;
        if kind != FileType::Regular {
            return Err(if kind == FileType::Directory {
                FsError::IsDir
            } else {
                FsError::Invalid
            });
        }
        if data.is_empty() {
            return Ok(0);
        }
        // The file's size and stored blocks (one stat read the first time this mount writes
        // an existing file it did not create or truncate; exact from then on, stored.rs).
        let mut shape = self.shape(ino, &loc)?;
        let offset = if append { shape.size } else { offset };
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(FsError::FileTooBig);
        }
        let bs = u64::from(self.sb.block_size);
        let now = Timespec::now();
        let limits = self.kv.limits();
        // Split so each batch fits the backend (one block op per block plus one stat op).
        let max_blocks = limits
            .max_ops
            .map_or(256, |m| m.saturating_sub(1).clamp(1, 256)) as u64;
        let max_bytes = limits
            .max_bytes
            .map_or(usize::MAX, |m| m.saturating_sub(4096).max(bs as usize));
        let chunk_len = (max_blocks * bs).min(max_bytes as u64 / bs * bs).max(bs);
        let slot = schema::SLOT_BYTES;
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            // End chunks on block boundaries so no block is split across batches.
            let room = chunk_len - pos % bs;
            let mut n = (data.len() - done).min(room as usize);
            let mut b = WriteBatch::new();
            if let Some(xt) = self.extent_tree() {
                if pos.is_multiple_of(slot) && (data.len() - done) as u64 >= slot {
                    // A whole slot: one extent, written once (fs-design.md §9).
                    n = slot as usize;
                    self.write_extent(&mut b, xt, ino, pos / slot, &data[done..done + n])?;
                    let after = self.shape_after_write(ino, &shape, pos, pos + n as u64)?;
                    let (d, before) = self.write_stat_after(
                        &mut b,
                        ino,
                        &loc,
                        pos + n as u64,
                        now,
                        kill_suid,
                        after,
                    )?;
                    self.kv.write(b, WriteOptions::NO_SYNC)?;
                    self.stat_applied(ino, before, &d);
                    shape = after;
                    self.set_shape(ino, shape);
                    done += n;
                    continue;
                }
                // End at the slot's end, so that the next slot may be whole.
                n = n.min((slot - pos % slot) as usize);
            }
            let mut p = 0usize;
            while p < n {
                let at = pos + p as u64;
                let in_block = (at % bs) as usize;
                let take = (n - p).min(bs as usize - in_block);
                let bytes = &data[done + p..done + p + take];
                let key = schema::block_key(ino, at / bs);
                if take == bs as usize {
                    // A whole block replaces whatever was there (a stored block is never
                    // longer than `bs`), so it is a plain put: the same result as the Write
                    // upsert on any old value, without an update function to run where it
                    // meets the row (large sequential writes, F7).
                    b.put(self.t.data, key, bytes);
                } else {
                    // A slot wholly below the size may hold an extent (E1): the bytes go on
                    // top of it as an overlay, blind (E2, overlay.rs O3). Elsewhere the
                    // zero-filling write.
                    let op = if self.slot_may_hold_extent(at, shape.size) {
                        BlockOp::Overlay {
                            offset: in_block as u32,
                            bytes,
                        }
                    } else {
                        BlockOp::Write {
                            offset: in_block as u32,
                            bytes,
                        }
                    };
                    b.upsert(self.t.data, key, FN_BLOCK, self.block_arg(op));
                }
                p += take;
            }
            let after = self.shape_after_write(ino, &shape, pos, pos + n as u64)?;
            let (d, before) =
                self.write_stat_after(&mut b, ino, &loc, pos + n as u64, now, kill_suid, after)?;
            self.kv.write(b, WriteOptions::NO_SYNC)?;
            self.stat_applied(ino, before, &d);
            shape = after;
            self.set_shape(ino, shape);
            done += n;
        }
        Ok(data.len())
    }

    /// Appends the stat change of a write ending at `end`, and returns it with the mirrored
    /// stat before it (for [`Fs::stat_applied`] after the commit).
    #[allow(clippy::too_many_arguments)]
    fn write_stat_after(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        loc: &crate::cache::Loc,
        end: u64,
        now: Timespec,
        kill_suid: bool,
        after: crate::stored::Shape,
    ) -> FsResult<(StatDelta, Option<crate::attr::Stat>)> {
        let d = StatDelta {
            size_at_least: Some(end),
            mtime: Some(now),
            ctime: Some(now),
            // Blind: the update function clears the bits only if they are set.
            kill_suid,
            stored_blocks: Some(after.stored),
            ..StatDelta::default()
        };
        let before = self.upsert_stat(b, ino, loc, &d)?;
        Ok((d, before))
    }

    /// The encoded [`FN_BLOCK`] argument of `op`, with this file system's block size (so the
    /// update function tells overlay rows from raw blocks, overlay.rs O1).
    pub(crate) fn block_arg(&self, op: BlockOp<'_>) -> Vec<u8> {
        BlockArg {
            block_size: self.sb.block_size,
            op,
        }
        .encode()
    }

    /// Appends the data changes of truncating `ino` to `size` (D1: nothing stays at or past
    /// `size`). Blind: it needs neither the old size nor the blocks.
    pub(crate) fn truncate_blocks(&self, b: &mut WriteBatch, ino: InodeId, size: u64) {
        let bs = u64::from(self.sb.block_size);
        let (full, rem) = (size / bs, size % bs);
        let first_gone = if rem == 0 {
            full
        } else {
            b.upsert(
                self.t.data,
                schema::block_key(ino, full),
                FN_BLOCK,
                self.block_arg(BlockOp::Trim { len: rem as u32 }),
            );
            full + 1
        };
        let (lo, hi) = schema::blocks_from(ino, first_gone);
        b.delete_range(self.t.data, lo, hi);
    }

    /// fallocate: mode 0 (extend size), KEEP_SIZE (nothing to reserve: space is not
    /// preallocated), PUNCH_HOLE|KEEP_SIZE (zero the range, dropping whole blocks), and
    /// ZERO_RANGE (the same range delete plus zeroed partial edges, extending the size unless
    /// KEEP_SIZE: a zeroed range reads as zeros whether it is stored or a hole). COLLAPSE_RANGE
    /// and INSERT_RANGE are EOPNOTSUPP: blocks are keyed by their number, so shifting the
    /// tail of a file rewrites every block after the range (docs/fuse.md).
    pub fn fallocate(&self, ino: InodeId, mode: u32, offset: u64, len: u64) -> FsResult<()> {
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(FsError::NotSupported);
        }
        let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & FALLOC_FL_ZERO_RANGE != 0;
        // Linux: a hole punch must keep the size, and punch and zero exclude each other.
        if punch && (zero || mode & FALLOC_FL_KEEP_SIZE == 0) {
            return Err(FsError::NotSupported);
        }
        if len == 0 {
            return Err(FsError::Invalid);
        }
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(FsError::FileTooBig)?;
        let _g = self.locks.lock(&[ino]);
        let (loc, kind) = self.loc(ino)?;
        match kind {
            FileType::Regular => {}
            FileType::Directory => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid),
        }
        let now = Timespec::now();
        let mut b = WriteBatch::new();
        let mut d = StatDelta::default();
        let shape = self.shape(ino, &loc)?;
        let mut after = shape;
        if !punch && mode & FALLOC_FL_KEEP_SIZE == 0 {
            d.size_at_least = Some(end);
            d.mtime = Some(now);
            d.ctime = Some(now);
            after.size = after.size.max(end);
        }
        if punch || zero {
            self.punch_extents(&mut b, ino, offset, end, shape.size)?;
            let (lo, hi) = self.punch_blocks(&mut b, ino, offset, end);
            after = self.shape_after_punch(ino, &shape, lo, hi, after.size)?;
            d.mtime = Some(now);
            d.ctime = Some(now);
            d.stored_blocks = Some(after.stored);
        }
        if d == StatDelta::default() {
            return Ok(());
        }
        self.upsert_stat(&mut b, ino, &loc, &d)?;
        let opts = if punch {
            WriteOptions::NO_SYNC.freeing(len)
        } else {
            WriteOptions::NO_SYNC
        };
        self.kv.write(b, opts)?;
        self.set_shape(ino, after);
        Ok(())
    }

    /// Appends the zeroing of `[start, end)`: a range delete of the whole blocks in it and
    /// zeroed edges. Returns the range of block numbers deleted.
    fn punch_blocks(&self, b: &mut WriteBatch, ino: InodeId, start: u64, end: u64) -> (u64, u64) {
        let bs = u64::from(self.sb.block_size);
        let first_full = start.div_ceil(bs);
        let end_full = end / bs;
        if first_full < end_full {
            b.delete_range(
                self.t.data,
                schema::block_key(ino, first_full),
                schema::block_key(ino, end_full),
            );
        }
        if !start.is_multiple_of(bs) {
            let block_end = (start / bs + 1) * bs;
            let zero = BlockOp::Zero {
                offset: (start % bs) as u32,
                len: (end.min(block_end) - start) as u32,
            };
            b.upsert(
                self.t.data,
                schema::block_key(ino, start / bs),
                FN_BLOCK,
                self.block_arg(zero),
            );
        }
        if !end.is_multiple_of(bs) && (start.is_multiple_of(bs) || end / bs != start / bs) {
            let zero = BlockOp::Zero {
                offset: 0,
                len: (end % bs) as u32,
            };
            b.upsert(
                self.t.data,
                schema::block_key(ino, end / bs),
                FN_BLOCK,
                self.block_arg(zero),
            );
        }
        (first_full, end_full.max(first_full))
    }
}
