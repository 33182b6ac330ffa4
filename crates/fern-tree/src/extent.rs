//! Data extents (docs/format.md, "Data extents", invariants X1–X10): large values written once
//! to space from the block allocator, named in the log only by offset, length and crc32c.
//!
//! Owns: the extent reference and its encoding, the extent table's run-time rules (bind, free,
//! the checks that refuse a double free), the write side of a batch's extents (space, data
//! `pwrite` before the record, X2), reads (verified before anything is returned, X8) and the
//! recovery pass that cuts a torn extent's record and reserves replayed extents' space (X6,
//! X7). Never: interprets tree values (the caller keeps references in its rows, X9), reuses
//! freed space before the free is checkpointed (blockfile's deferred list, X5), or returns a
//! byte whose crc has not verified.

use std::collections::{BTreeMap, HashSet};

use parking_lot::Mutex;

use crate::blockfile::{BlockFile, BlockLoc, ALIGN, DATA_START};
use crate::catalog::State;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::ids::{Lsn, NodeId};
use crate::wal::{self, ExtentOp, LogRecord, Region};

/// Largest data extent, in bytes.
pub const MAX_EXTENT_LEN: usize = 8 << 20;
/// Bytes of an encoded [`ExtentRef`].
pub const EXTENT_REF_LEN: usize = 16;

/// Where a data extent is and what it holds: the 16 bytes a caller keeps in its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtentRef {
    /// Byte offset of the extent in the block file (a multiple of 4096).
    pub offset: u64,
    /// Bytes of data.
    pub len: u32,
    /// crc32c of the data.
    pub crc: u32,
}

impl ExtentRef {
    /// The on-disk encoding: offset u64, len u32, crc u32, little-endian (format.md).
    pub fn encode(&self) -> [u8; EXTENT_REF_LEN] {
        let mut b = [0u8; EXTENT_REF_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Decodes exactly [`EXTENT_REF_LEN`] untrusted bytes; the error says what is wrong.
    pub fn decode(b: &[u8]) -> std::result::Result<ExtentRef, String> {
        let b: &[u8; EXTENT_REF_LEN] = b
            .try_into()
            .map_err(|_| format!("an extent reference is 16 bytes, not {}", b.len()))?;
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[0..8]);
        let mut l = [0u8; 4];
        l.copy_from_slice(&b[8..12]);
        let mut c = [0u8; 4];
        c.copy_from_slice(&b[12..16]);
        let r = ExtentRef {
            offset: u64::from_le_bytes(o),
            len: u32::from_le_bytes(l),
            crc: u32::from_le_bytes(c),
        };
        if r.offset < DATA_START || !r.offset.is_multiple_of(ALIGN) || r.offset >= 1 << 62 {
            return Err(format!("extent offset {} is not a block offset", r.offset));
        }
        if r.len == 0 || r.len as usize > MAX_EXTENT_LEN {
            return Err(format!("extent length {} out of range", r.len));
        }
        Ok(r)
    }

    fn loc(&self) -> BlockLoc {
        BlockLoc {
            offset: self.offset,
            len: self.len,
        }
    }

    /// One past the last byte of the space it occupies.
    fn space_end(&self) -> u64 {
        self.offset + self.loc().extent_len()
    }

    fn name(&self) -> String {
        format!("data extent at offset {} ({} bytes)", self.offset, self.len)
    }
}

/// A live extent in the table (catalog version 4): its BTT id, length and crc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExtentEntry {
    pub(crate) id: NodeId,
    pub(crate) len: u32,
    pub(crate) crc: u32,
}

/// The live extents by offset (X3).
pub(crate) type ExtentTable = BTreeMap<u64, ExtentEntry>;

/// Checks the table a checkpoint's catalog holds against its BTT (X3): every entry names an id
/// mapped to exactly its place, no id twice, no overlap.
pub(crate) fn check_table(table: &ExtentTable, bf: &BlockFile) -> Result<()> {
    let mut ids = HashSet::new();
    let mut prev_end = 0u64;
    for (&offset, e) in table {
        let loc = BlockLoc { offset, len: e.len };
        if bf.loc(e.id) != Some(loc) || !ids.insert(e.id) || offset < prev_end {
            return Err(Error::corrupt(
                "catalog",
                format!(
                    "extent table entry at offset {offset} (id {}, {} bytes) does not match the \
                     translation table",
                    e.id, e.len
                ),
            ));
        }
        prev_end = offset + loc.extent_len();
    }
    Ok(())
}

/// Applies one record's extent ops to the table and the current BTT, in order (X4, X5).
/// `owned` says whether a freed extent's space belongs to recovery's reserved ranges (X6):
/// such space is released by [`release_reserved`], everything else waits for a checkpoint.
pub(crate) fn apply(
    st: &mut State,
    bf: &mut BlockFile,
    ops: &[ExtentOp],
    owned: &dyn Fn(u64) -> bool,
) -> Result<()> {
    for op in ops {
        match *op {
            ExtentOp::Bind(r) => {
                let id = bf.bind_extent(r.loc());
                st.extents.insert(
                    r.offset,
                    ExtentEntry {
                        id,
                        len: r.len,
                        crc: r.crc,
                    },
                );
            }
            ExtentOp::Free(offset) => {
                let e = st.extents.remove(&offset).ok_or_else(|| {
                    Error::corrupt(
                        format!("data extent at offset {offset}"),
                        "freed but not live",
                    )
                })?;
                bf.unbind_extent(e.id, !owned(offset));
            }
        }
    }
    Ok(())
}

/// Refuses a batch whose frees name an extent that is not live, or one twice (X5), before
/// anything is logged.
pub(crate) fn check_frees(table: &ExtentTable, frees: &[ExtentRef]) -> Result<()> {
    let mut seen = HashSet::new();
    for r in frees {
        let live = table
            .get(&r.offset)
            .is_some_and(|e| e.len == r.len && e.crc == r.crc);
        if !live || !seen.insert(r.offset) {
            return Err(Error::InvalidArgument(format!(
                "freeing the {}: {}",
                r.name(),
                if live {
                    "named twice"
                } else {
                    "it is not live"
                }
            )));
        }
    }
    Ok(())
}

/// Extents of a batch whose space is allocated and data written, not yet bound: given back if
/// the batch fails before its record is appended.
pub(crate) struct Written<'a> {
    env: &'a Env,
    pub(crate) refs: Vec<ExtentRef>,
    armed: bool,
}

impl Written<'_> {
    /// The record is appended: the extents are the table's business now.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

/// Bytes of written extents' data buffers kept for the next writers ([`BufferPool`]): a few
/// 1 MiB file-system slots, enough for two request threads writing at once.
const POOL_BYTES: usize = 4 << 20;

/// Buffers smaller than this are not kept: the allocator serves them from its heap, whose
/// pages are already resident.
const POOL_MIN: usize = 64 << 10;

/// Data buffers of extents already written, handed to the next writer
/// ([`Env::extent_buffer`]). Under glibc with a fixed mmap threshold (how the `fernfs` binary
/// ran before it moved to jemalloc, and how design.md §2.7 tells an embedder on glibc to run) a
/// fresh 1 MiB buffer is an `mmap` whose 256 pages fault in zeroed as the data is copied into
/// it, and its drop is a `munmap`: a third of the CPU of a 1 MiB write through the library.
/// A recycled buffer's pages are resident whatever the allocator. At most [`POOL_BYTES`] are
/// kept, outside the node cache's budget.
#[derive(Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// An empty buffer with room for `len` bytes: a kept one if one is large enough.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        match free.iter().position(|b| b.capacity() >= len) {
            Some(i) => {
                let mut b = free.swap_remove(i);
                b.clear();
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps what fits under [`POOL_BYTES`]; the rest is dropped after the lock is released.
    fn give(&self, bufs: impl Iterator<Item = Vec<u8>>) {
        let mut dropped = Vec::new();
        {
            let mut free = self.free.lock();
            let mut held: usize = free.iter().map(Vec::capacity).sum();
            for b in bufs {
                if b.capacity() >= POOL_MIN && held + b.capacity() <= POOL_BYTES {
                    held += b.capacity();
                    free.push(b);
                } else {
                    dropped.push(b);
                }
            }
        }
        drop(dropped);
    }

    /// Bytes kept now.
    fn held(&self) -> usize {
        self.free.lock().iter().map(Vec::capacity).sum()
    }
}

impl Drop for Written<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut bf = self.env.inner.bf.lock();
            for r in &self.refs {
                bf.unalloc_space(r.offset, r.len as u64);
            }
        }
    }
}

impl Env {
    /// Writes each extent's data to fresh space (step 1 of the write path; X2: before the
    /// record is appended), returning their references in order.
    pub(crate) fn write_extents(&self, data: &[(usize, Vec<u8>)]) -> Result<Written<'_>> {
        let mut w = Written {
            env: self,
            refs: Vec::with_capacity(data.len()),
            armed: true,
        };
        for (_, bytes) in data {
            let len = bytes.len() as u32;
            let loc = self.inner.bf.lock().alloc_space(len)?;
            let r = ExtentRef {
                offset: loc.offset,
                len,
                crc: crc32c::crc32c(bytes),
            };
            w.refs.push(r);
            let wrote = self
                .inner
                .dev
                .write_at(bytes, loc.offset)
                .map_err(|e| Error::io(format!("writing the {}", r.name()), e));
            self.poison(wrote)?;
        }
        Ok(w)
    }

    /// An empty buffer with room for `len` bytes, for the data of an extent
    /// ([`WriteBatch::insert_extent`](crate::WriteBatch::insert_extent)): one whose extent
    /// was written already when there is one, so filling it touches resident pages. Any
    /// `Vec` works as extent data; this one is only cheaper.
    pub fn extent_buffer(&self, len: usize) -> Vec<u8> {
        self.inner.extent_buffers.take(len)
    }

    /// Bytes of data buffers kept for [`extent_buffer`](Self::extent_buffer) (at most 4 MiB).
    pub fn extent_buffers_held(&self) -> usize {
        self.inner.extent_buffers.held()
    }

    /// Keeps the data buffers of extents whose data is on the device.
    pub(crate) fn recycle_extent_buffers(&self, data: &mut Vec<(usize, Vec<u8>)>) {
        self.inner
            .extent_buffers
            .give(data.drain(..).map(|(_, bytes)| bytes));
    }

    /// Reads a live data extent whole into `buf` (exactly `r.len` bytes), one read (direct when
    /// `buf` is aligned to [`DIRECT_ALIGN`](crate::device::DIRECT_ALIGN), see
    /// [`BlockDevice::read_direct`](crate::device::BlockDevice::read_direct)), and verifies its
    /// crc before returning (X8). A reference to an extent that is not live is
    /// `Corrupt`; damage is `Checksum` naming the extent.
    pub fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> Result<()> {
        if buf.len() != r.len as usize {
            return Err(Error::InvalidArgument(format!(
                "reading the {} into a buffer of {} bytes",
                r.name(),
                buf.len()
            )));
        }
        match self.inner.state.read().extents.get(&r.offset) {
            Some(e) if e.len == r.len && e.crc == r.crc => {}
            Some(e) => {
                return Err(Error::corrupt(
                    r.name(),
                    format!(
                        "the live extent there has {} bytes and crc {:#010x}",
                        e.len, e.crc
                    ),
                ))
            }
            None => return Err(Error::corrupt(r.name(), "no live extent there")),
        }
        // Past the host's cache where it can (device.rs): the file system above caches it.
        self.inner
            .dev
            .read_direct(buf, r.offset)
            .map_err(|e| Error::io(format!("reading the {}", r.name()), e))?;
        let actual = crc32c::crc32c(buf);
        if actual != r.crc {
            return Err(Error::Checksum {
                what: r.name(),
                expected: r.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Every live data extent, by offset (for checkers: X9).
    pub fn extents(&self) -> Vec<ExtentRef> {
        self.inner
            .state
            .read()
            .extents
            .iter()
            .map(|(&offset, e)| ExtentRef {
                offset,
                len: e.len,
                crc: e.crc,
            })
            .collect()
    }
}

/// Whether replay applies a batch (W7): the same rule as `Env::replay`.
fn replays(first_msn: u64, n: u64, next_msn: u64) -> bool {
    first_msn + n > next_msn
}

/// What the recovery pass decided.
pub(crate) struct Prepared {
    /// Records to replay (the scan's, cut at a torn extent's record if there was one).
    pub(crate) records: Vec<Lsn>,
    /// Where the log ends if it was cut (X7).
    pub(crate) cut: Option<Lsn>,
    /// Space reserved for extents the replay binds (X6), disjoint, by offset.
    pub(crate) reserved: Vec<(u64, u64)>,
}

impl Prepared {
    /// Whether an extent at `offset` lies in reserved space (bound during the replay).
    pub(crate) fn owns(&self, offset: u64) -> bool {
        let i = self.reserved.partition_point(|&(o, _)| o <= offset);
        i > 0 && {
            let (o, l) = self.reserved[i - 1];
            offset < o + l
        }
    }
}

/// The recovery pass before replay (format.md, "Recovery with extents"): simulates the
/// records' extent ops from the checkpoint's table, verifies the live extents of unproven
/// records and cuts the log at the first torn one (X7), then reserves the space every
/// remaining bind names (X6).
pub(crate) fn prepare_recovery(
    region: &Region,
    bf: &mut BlockFile,
    st: &State,
    mut records: Vec<Lsn>,
    proven: Lsn,
) -> Result<Prepared> {
    // Each record's extent ops, for the records replay applies.
    let mut ext: Vec<(usize, Lsn, Vec<ExtentOp>)> = Vec::new();
    let mut next_msn = st.next_msn;
    for (i, &lsn) in records.iter().enumerate() {
        match wal::read_record(region, lsn)? {
            LogRecord::Batch { first_msn, ops } => {
                if replays(first_msn.0, ops.len() as u64, next_msn) {
                    next_msn = first_msn.0 + ops.len() as u64;
                }
            }
            LogRecord::ExtentBatch {
                first_msn,
                ops,
                extents,
            } => {
                if replays(first_msn.0, ops.len() as u64, next_msn) {
                    next_msn = first_msn.0 + ops.len() as u64;
                    ext.push((i, lsn, extents));
                }
            }
            LogRecord::CreateTree { .. } | LogRecord::SyncMark => {}
        }
    }
    if ext.is_empty() {
        return Ok(Prepared {
            records,
            cut: None,
            reserved: Vec::new(),
        });
    }
    let mut verified: HashSet<(Lsn, u64)> = HashSet::new();
    let mut cut = None;
    loop {
        // Simulate: offset -> (reference, LSN of the record that bound it, if replayed).
        let mut live: BTreeMap<u64, (ExtentRef, Option<Lsn>)> = st
            .extents
            .iter()
            .map(|(&offset, e)| {
                (
                    offset,
                    (
                        ExtentRef {
                            offset,
                            len: e.len,
                            crc: e.crc,
                        },
                        None,
                    ),
                )
            })
            .collect();
        for (_, lsn, ops) in &ext {
            let what = || format!("log record at LSN {lsn}");
            for op in ops {
                match *op {
                    ExtentOp::Bind(r) => {
                        let before = live.range(..=r.offset).next_back();
                        let after = live.range(r.offset..).next();
                        let overlaps = before.is_some_and(|(_, (b, _))| b.space_end() > r.offset)
                            || after.is_some_and(|(&o, _)| o < r.space_end());
                        if overlaps {
                            return Err(Error::corrupt(
                                what(),
                                format!("binds the {}, which overlaps a live one", r.name()),
                            ));
                        }
                        live.insert(r.offset, (r, Some(*lsn)));
                    }
                    ExtentOp::Free(offset) => {
                        if live.remove(&offset).is_none() {
                            return Err(Error::corrupt(
                                what(),
                                format!("frees the data extent at offset {offset}, not live"),
                            ));
                        }
                    }
                }
            }
        }
        // Unproven binds still live at the end, oldest record first (X7).
        let mut unproven: Vec<(Lsn, ExtentRef)> = live
            .values()
            .filter_map(|&(r, at)| at.filter(|&l| l >= proven).map(|l| (l, r)))
            .filter(|(l, r)| !verified.contains(&(*l, r.offset)))
            .collect();
        unproven.sort();
        let mut torn = None;
        let dev_len = region
            .dev
            .len()
            .map_err(|e| Error::io("reading device length", e))?;
        for (lsn, r) in unproven {
            // An extent past the device's end was never (wholly) written: the file growth
            // its write made was lost with it.
            let mut whole = r.offset + r.len as u64 <= dev_len;
            if whole {
                let mut buf = vec![0u8; r.len as usize];
                region
                    .dev
                    .read_at(&mut buf, r.offset)
                    .map_err(|e| Error::io(format!("reading the {}", r.name()), e))?;
                whole = crc32c::crc32c(&buf) == r.crc;
            }
            if whole {
                verified.insert((lsn, r.offset));
            } else {
                torn = Some(lsn);
                break;
            }
        }
        let Some(at) = torn else { break };
        // The record and everything after it were never acknowledged: cut there, then look
        // again (a free the cut dropped may leave an earlier unproven extent live).
        cut = Some(at);
        records.retain(|&l| l < at);
        ext.retain(|(_, l, _)| *l < at);
    }
    // Reserve the union of every replayed bind's space (X6).
    let mut ranges: Vec<(u64, u64)> = ext
        .iter()
        .flat_map(|(_, _, ops)| ops.iter())
        .filter_map(|op| match op {
            ExtentOp::Bind(r) => Some((r.offset, r.space_end())),
            ExtentOp::Free(_) => None,
        })
        .collect();
    ranges.sort();
    let mut reserved: Vec<(u64, u64)> = Vec::new();
    for (lo, hi) in ranges {
        match reserved.last_mut() {
            Some((o, l)) if lo <= *o + *l => *l = (*l).max(hi - *o),
            _ => reserved.push((lo, hi - lo)),
        }
    }
    for &(o, l) in &reserved {
        if !bf.space_is_free(o, l) {
            return Err(Error::corrupt(
                "log",
                format!(
                    "a replayed data extent in [{o}, {}) overlaps space a checkpoint uses",
                    o + l
                ),
            ));
        }
    }
    for &(o, l) in &reserved {
        bf.reserve_space(o, l);
    }
    Ok(Prepared {
        records,
        cut,
        reserved,
    })
}

/// After replay: reserved space that no live extent holds is free again (X6).
pub(crate) fn release_reserved(st: &State, bf: &mut BlockFile, reserved: &[(u64, u64)]) {
    for &(o, l) in reserved {
        let end = o + l;
        let mut at = o;
        for (&off, e) in st.extents.range(o..end) {
            if off > at {
                bf.unalloc_space(at, off - at);
            }
            at = off
                + BlockLoc {
                    offset: off,
                    len: e.len,
                }
                .extent_len();
        }
        if end > at {
            bf.unalloc_space(at, end - at);
        }
    }
}

/// Refuses extents of no bytes or over [`MAX_EXTENT_LEN`] before anything is written.
pub(crate) fn check_lengths(extents: &[(usize, Vec<u8>)]) -> Result<()> {
    for (_, d) in extents {
        if d.is_empty() || d.len() > MAX_EXTENT_LEN {
            return Err(Error::InvalidArgument(format!(
                "a data extent is 1 to {MAX_EXTENT_LEN} bytes (got {})",
                d.len()
            )));
        }
    }
    Ok(())
}

/// Bytes the extent section of a tag-4 record adds for `binds` and `frees` (format.md).
pub(crate) fn ops_len(binds: usize, frees: usize) -> usize {
    if binds + frees == 0 {
        0
    } else {
        4 + binds * (1 + EXTENT_REF_LEN) + frees * 9
    }
}

/// Puts each written extent's reference at the end of its row's value (where
/// `insert_extent` left a placeholder) and returns the record's extent ops: binds, then frees.
pub(crate) fn fill_refs(batch: &mut crate::tree::WriteBatch, refs: &[ExtentRef]) -> Vec<ExtentOp> {
    let mut ops = Vec::with_capacity(refs.len() + batch.frees.len());
    for ((i, _), r) in batch.extents.iter().zip(refs) {
        if let Some((_, crate::msg::Op::Insert { value, .. })) = batch.ops.get_mut(*i) {
            let at = value.len() - EXTENT_REF_LEN;
            value[at..].copy_from_slice(&r.encode());
        }
        ops.push(ExtentOp::Bind(*r));
    }
    ops.extend(batch.frees.iter().map(|r| ExtentOp::Free(r.offset)));
    ops
}
