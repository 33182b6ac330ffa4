//! Data extents of regular files (docs/fs-design.md §9): which part of a write becomes an
//! extent, reading extent bytes, and freeing or dissolving extents when a truncate, punch or
//! unlink removes their slot. It owns the `fs.extent` rows and the small cache of verified
//! extents; it must never leave an extent without exactly one row naming it (format.md X9),
//! nor a row naming a freed extent.
//!
//! Rules (E1–E4, cited in the code and by fsck):
//! * **E1** An extent holds one whole slot ([`schema::SLOT_BYTES`]) and lies entirely below
//!   the file's size: it is written only for a slot a write covers whole (the size grows in
//!   the same batch), and a truncate below a slot's end frees or dissolves it first.
//! * **E2** A block row inside an extent slot is either a whole block that shadows the
//!   extent's bytes for that block, or an overlay row (overlay.rs) whose written bytes go on
//!   top of them ("messages on top"). A partial-block write there is a blind overlay upsert:
//!   extents add no read before a write.
//! * **E3** A slot that an operation cuts in the middle (punch, truncate) is *dissolved*
//!   first, in the same batch: the blocks without a row become rows of the extent's bytes,
//!   overlay rows become whole blocks of the extent's bytes with theirs on top, and the
//!   extent is freed, so the block-row rules (D1) apply unchanged after it.
//! * **E4** Every batch that deletes an `fs.extent` row (or replaces it) frees its extent.

use std::sync::Arc;

use fern_kv::{Direction, ExtentRef, KeyRange, KvError, TreeId, WriteBatch};

use crate::error::{FsError, FsResult};
use crate::extent_cache::{ExtentBuf, EXTENT_ALIGN};
use crate::fs::{Fs, InodeRows};
use crate::ids::InodeId;
use crate::overlay;
use crate::schema::{self, SLOT_BYTES};

/// Whether `buf` can take an extent read past the host's cache (extent_cache.rs).
fn direct_ready(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(EXTENT_ALIGN)
}

/// How many times a read retries when an extent it found was freed under it by a concurrent
/// write (the row it read is then already replaced).
const STALE_RETRIES: usize = 3;

impl Fs {
    /// The extent tree, when large writes should use it.
    pub(crate) fn extent_tree(&self) -> Option<TreeId> {
        self.t.extent
    }

    /// Whether the slot holding byte `at` may have an extent in a file of `size` bytes: the
    /// store has extents and the slot lies wholly below the size (E1).
    pub(crate) fn slot_may_hold_extent(&self, at: u64, size: u64) -> bool {
        self.t.extent.is_some() && (at / SLOT_BYTES + 1) * SLOT_BYTES <= size
    }

    /// Blocks per slot.
    pub(crate) fn slot_blocks(&self) -> u64 {
        SLOT_BYTES / u64::from(self.sb.block_size)
    }

    /// The extents of `ino` in slots `[lo, hi)`, as (slot, reference), ascending.
    pub(crate) fn extents_in(
        &self,
        ino: InodeId,
        lo: u64,
        hi: u64,
    ) -> FsResult<Vec<(u64, ExtentRef)>> {
        let Some(xt) = self.t.extent else {
            return Ok(Vec::new());
        };
        if lo >= hi {
            return Ok(Vec::new());
        }
        if hi - lo <= 2 {
            let mut out = Vec::new();
            for s in lo..hi {
                if let Some(v) = self.kv.get(xt, &schema::extent_key(ino, s))? {
                    out.push((s, schema::parse_extent_row(&v)?));
                }
            }
            return Ok(out);
        }
        let hi_key = match hi {
            u64::MAX => schema::id_prefix_range(ino).1,
            h => schema::extent_key(ino, h),
        };
        let mut range = KeyRange::half_open(&schema::extent_key(ino, lo), &hi_key);
        let mut out = Vec::new();
        loop {
            let page = self.kv.scan(xt, &range, Direction::Forward, 1024)?;
            let Some((last, _)) = page.last() else {
                return Ok(out);
            };
            range.lo = std::ops::Bound::Excluded(last.clone());
            for (k, v) in &page {
                out.push((
                    schema::parse_block_key(ino, k)?,
                    schema::parse_extent_row(v)?,
                ));
            }
        }
    }

    /// Reads extent `r` whole into `buf` (exactly its length).
    fn read_extent_into(&self, r: &ExtentRef, buf: &mut [u8]) -> FsResult<()> {
        if buf.len() != r.len() as usize {
            return Err(FsError::corrupt(format!(
                "extent of {} bytes where a slot of {} was expected",
                r.len(),
                buf.len()
            )));
        }
        Ok(self.kv.read_extent(r, buf)?)
    }

    /// Extent `r` whole, from the cache (waiting for it if it is being read ahead) or read
    /// and cached.
    fn extent_bytes(&self, r: &ExtentRef) -> FsResult<Arc<ExtentBuf>> {
        if let Some(d) = self.extent_cache.get(r) {
            return Ok(d);
        }
        let mut buf = self.extent_cache.buffer(r.len() as usize);
        self.kv.read_extent(r, &mut buf)?;
        let d = Arc::new(buf);
        self.extent_cache.put(*r, Arc::clone(&d));
        Ok(d)
    }

    /// Fills `out` (the bytes `[offset, offset + out.len())` of `ino`) with the bytes of the
    /// file's extents there and zeros elsewhere, every byte written; block rows go on top
    /// afterwards (E2). An extent in the cache (or
    /// being read ahead) is copied from there; else a request covering a whole slot reads it
    /// straight into `out` when that part of `out` is aligned for a read past the host's cache,
    /// and otherwise into the cache (an unaligned read would go through the host's cache, whose
    /// read-ahead then fills it with the next extents too: cached twice). A read that continues
    /// the file's last one has the next extents read ahead (extent_cache.rs).
    pub(crate) fn read_extents(&self, ino: InodeId, offset: u64, out: &mut [u8]) -> FsResult<()> {
        let end = offset + out.len() as u64;
        let (lo, hi) = (offset / SLOT_BYTES, end.div_ceil(SLOT_BYTES));
        self.read_extents_ahead(ino, lo..hi);
        let mut tries = 0;
        loop {
            match self.read_extents_once(ino, offset, end, lo, hi, out) {
                // A concurrent write replaced the slot after its row was read: read again.
                Err(FsError::Kv(KvError::InvalidExtent(_))) if tries < STALE_RETRIES => {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// Starts the read-ahead of the extents after slots `slots` of `ino` if this read
    /// continues the file's last one. Advice: a failure to look them up is left to the reads.
    fn read_extents_ahead(&self, ino: InodeId, slots: std::ops::Range<u64>) {
        let next = self.extent_cache.follow(ino, slots);
        if next.is_empty() {
            return;
        }
        if let Ok(found) = self.extents_in(ino, next.start, next.end) {
            let refs: Vec<ExtentRef> = found.into_iter().map(|(_, r)| r).collect();
            self.extent_cache.read_ahead(&self.kv, &refs);
        }
    }

    fn read_extents_once(
        &self,
        ino: InodeId,
        offset: u64,
        end: u64,
        lo: u64,
        hi: u64,
        out: &mut [u8],
    ) -> FsResult<()> {
        // How far `out` is written: the gaps between extents get zeros (data.rs D3).
        let mut written = 0;
        for (slot, r) in self.extents_in(ino, lo, hi)? {
            let start = slot * SLOT_BYTES;
            let stop = start + u64::from(r.len());
            let (from, to) = (offset.max(start), end.min(stop));
            if from >= to {
                continue;
            }
            out[written..(from - offset) as usize].fill(0);
            written = (to - offset) as usize;
            let dst = &mut out[(from - offset) as usize..(to - offset) as usize];
            let piece = (from - start) as usize..(to - start) as usize;
            if let Some(d) = self.extent_cache.get(&r) {
                dst.copy_from_slice(&d[piece]);
            } else if from == start && to == stop && direct_ready(dst) {
                self.read_extent_into(&r, dst)?;
            } else {
                dst.copy_from_slice(&self.extent_bytes(&r)?[piece]);
            }
        }
        out[written..].fill(0);
        Ok(())
    }

    /// Appends the write of slot `slot` of `ino` as one extent: the old extent (if any) is
    /// freed and the slot's block rows deleted, in the same batch (E4).
    pub(crate) fn write_extent(
        &self,
        b: &mut WriteBatch,
        xt: TreeId,
        ino: InodeId,
        slot: u64,
        data: &[u8],
    ) -> FsResult<()> {
        for (_, old) in self.extents_in(ino, slot, slot + 1)? {
            b.free_extent(old);
        }
        let per = self.slot_blocks();
        b.delete_range(
            self.t.data,
            schema::block_key(ino, slot * per),
            schema::block_key(ino, (slot + 1) * per),
        );
        let mut buf = self.kv.extent_buffer(data.len());
        buf.extend_from_slice(data);
        b.put_extent(
            xt,
            schema::extent_key(ino, slot),
            &[schema::EXTENT_TAG],
            buf,
        );
        Ok(())
    }

    /// Appends the freeing of every extent of `ino` in slots `[lo, hi)` and the delete of
    /// their rows (E4): one scan of `fs.extent`, one row per MiB, no extent data read.
    pub(crate) fn free_extents(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        lo: u64,
        hi: u64,
    ) -> FsResult<()> {
        let Some(xt) = self.t.extent else {
            return Ok(());
        };
        let found = self.extents_in(ino, lo, hi)?;
        for (_, r) in &found {
            b.free_extent(*r);
        }
        if !found.is_empty() {
            let hi_key = match hi {
                u64::MAX => schema::id_prefix_range(ino).1,
                h => schema::extent_key(ino, h),
            };
            b.delete_range(xt, schema::extent_key(ino, lo), hi_key);
        }
        Ok(())
    }

    /// Appends the dissolving of slot `slot` of `ino` (E3): its blocks without a row become
    /// rows of the extent's bytes, the extent is freed and its row deleted. Nothing when the
    /// slot has no extent.
    pub(crate) fn dissolve_slot(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        slot: u64,
    ) -> FsResult<()> {
        let (Some(xt), Some((_, r))) = (self.t.extent, self.extents_in(ino, slot, slot + 1)?.pop())
        else {
            return Ok(());
        };
        let bs = u64::from(self.sb.block_size);
        let per = self.slot_blocks();
        let first = slot * per;
        let range = KeyRange::half_open(
            &schema::block_key(ino, first),
            &schema::block_key(ino, first + per),
        );
        let rows = self
            .kv
            .scan(self.t.data, &range, Direction::Forward, per as usize)?;
        // A raw row is a whole block already (E2); an overlay row is laid over the extent's
        // bytes into one (overlay.rs); a block without a row takes the extent's bytes.
        let mut rows_at: Vec<Option<&[u8]>> = vec![None; per as usize];
        for (k, v) in &rows {
            let n = schema::parse_block_key(ino, k)?;
            if let Some(x) = n.checked_sub(first).filter(|x| *x < per) {
                rows_at[x as usize] = Some(v);
            }
        }
        let d = self.extent_bytes(&r)?;
        let bsz = bs as usize;
        for (i, chunk) in d.chunks(bsz).enumerate() {
            let key = schema::block_key(ino, first + i as u64);
            match rows_at[i] {
                None => b.put(self.t.data, key, chunk),
                Some(v) if overlay::is_overlay(v, bsz) => {
                    let mut whole = chunk.to_vec();
                    overlay::lay_over(v, bsz, 0, chunk.len(), &mut whole);
                    b.put(self.t.data, key, whole);
                }
                Some(_) => {}
            }
        }
        b.delete(xt, schema::extent_key(ino, slot));
        b.free_extent(r);
        Ok(())
    }

    /// Appends the extent side of truncating `ino` to `size` (E1, E3): the slot the new size
    /// cuts is dissolved, the slots past it freed. `old_size` (when known) skips the look-up
    /// for a file too small to have an extent.
    pub(crate) fn truncate_extents(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        size: u64,
        old_size: Option<u64>,
    ) -> FsResult<()> {
        if self.t.extent.is_none() || old_size.is_some_and(|s| s < SLOT_BYTES || s <= size) {
            return Ok(());
        }
        if !size.is_multiple_of(SLOT_BYTES) {
            self.dissolve_slot(b, ino, size / SLOT_BYTES)?;
        }
        self.free_extents(b, ino, size.div_ceil(SLOT_BYTES), u64::MAX)
    }

    /// Appends the extent side of zeroing `[start, end)` of `ino` (E3, E4): slots cut are
    /// dissolved, slots covered whole freed. `size` is the file's size before.
    pub(crate) fn punch_extents(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        start: u64,
        end: u64,
        size: u64,
    ) -> FsResult<()> {
        if self.t.extent.is_none() || size < SLOT_BYTES {
            return Ok(());
        }
        let end = end.min(size);
        if start >= end {
            return Ok(());
        }
        let (whole_lo, whole_hi) = (start.div_ceil(SLOT_BYTES), end / SLOT_BYTES);
        let first_cut = (!start.is_multiple_of(SLOT_BYTES)).then_some(start / SLOT_BYTES);
        let last_cut = (!end.is_multiple_of(SLOT_BYTES)).then_some(end / SLOT_BYTES);
        if let Some(s) = first_cut {
            self.dissolve_slot(b, ino, s)?;
        }
        if let Some(s) = last_cut.filter(|s| Some(*s) != first_cut) {
            self.dissolve_slot(b, ino, s)?;
        }
        if whole_lo < whole_hi {
            self.free_extents(b, ino, whole_lo, whole_hi)?;
        }
        Ok(())
    }

    /// Appends the deletion of every key of file `id` that `rows` says may exist and the
    /// freeing of its extents (E4); `size` (when known) skips the look-up for a file too small
    /// to have one.
    pub(crate) fn free_file(
        &self,
        b: &mut WriteBatch,
        id: InodeId,
        size: Option<u64>,
        rows: InodeRows,
    ) -> FsResult<()> {
        if size.is_none_or(|s| s >= SLOT_BYTES) {
            self.free_extents(b, id, 0, u64::MAX)?;
        }
        self.free_inode(b, id, size, rows);
        Ok(())
    }

    /// Blocks of `ino` among `[lo, hi)` held by extents, and the extent slots there, for the
    /// stored-block count (an extent slot counts all its blocks; rows in it shadow, E2).
    pub(crate) fn extent_blocks_between(
        &self,
        ino: InodeId,
        lo: u64,
        hi: u64,
    ) -> FsResult<Vec<(u64, u64)>> {
        let per = self.slot_blocks();
        if self.t.extent.is_none() || lo >= hi {
            return Ok(Vec::new());
        }
        let slots = self.extents_in(ino, lo / per, hi.div_ceil(per).max(lo / per + 1))?;
        Ok(slots
            .into_iter()
            .map(|(s, _)| ((s * per).max(lo), ((s + 1) * per).min(hi)))
            .filter(|(a, z)| a < z)
            .collect())
    }
}
