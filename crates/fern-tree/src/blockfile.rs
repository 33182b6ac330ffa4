//! The block file: two header slots, the block translation table (BTT), copy-on-write block
//! writes and the checkpoint commit. Format and protocol: docs/format.md, "Block file format".
//!
//! Owns: where every node's bytes live, which extents are free, which header is current.
//! This file opens and formats images and allocates: node ids, copy-on-write extents, data
//! extent space. The byte layouts of header and BTT and the verified loading of a checkpoint
//! are in `ondisk.rs`; the checkpoint commit protocol (B3, B10) is in `commit.rs`.
//! Never: overwrites a byte that either header slot's checkpoint references (B4) — the newest
//! checkpoint is what recovery opens, the previous one is the fallback if the newest header is
//! damaged, so both must stay intact; never trusts a byte read from disk before its crc32c
//! verifies (B6); never panics on a damaged image.
//!
//! Invariants (numbered as in docs/format.md; tests cite them):
//! - B1 all on-disk integers are little-endian; every extent starts at a multiple of [`ALIGN`].
//! - B2 a header is valid iff its magic matches and its crc32c verifies; open uses the valid one
//!   with the highest generation.
//! - B3 a checkpoint's BTT and meta blob are durable (synced) before its header is written, and
//!   the header is durable before anything only older checkpoints referenced is released.
//! - B4 no extent referenced by the checkpoint in either header slot is ever allocated to anything
//!   else, so rewriting a node always goes to a fresh extent (copy-on-write).
//! - B5 the allocator holds exactly the extents referenced by the current BTT, the two durable
//!   checkpoints, and the pending-free list; everything else below `end` is a hole.
//! - B7 a node id released by `free_node` is handed out again only after the next checkpoint
//!   that began after the release.
//! - B10 while a checkpoint is in progress (`begin_checkpoint` .. `commit_checkpoint`) its BTT is
//!   separate from the current one; extents it references are protected like B4's, and extents
//!   it wrote enter the current BTT only through `adopt`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::alloc::Allocator;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::{Lsn, NodeId};

mod commit;
mod ondisk;

use ondisk::{decode_header, encode_header, load_ckpt, validate_extents, Header, SlotState};
pub(crate) use ondisk::{fuzz_btt, fuzz_header};

/// Allocation unit and alignment of every extent in the file.
pub const ALIGN: u64 = 4096;
/// Magic bytes at the start of each header slot.
pub const MAGIC: [u8; 8] = *b"FERNTREE";
/// Format version written by this build (and the newest it reads).
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of a version-1 header, crc included (the rest of the 4096-byte slot is zero).
pub const HEADER_LEN: usize = 76;
/// Bytes per BTT entry: offset u64 + length u32.
pub const BTT_ENTRY_LEN: usize = 12;
/// First byte available to extents: the two header slots come before it.
pub const DATA_START: u64 = 2 * ALIGN;
/// Freed holes at least this large are punched out of the file after a checkpoint.
pub const PUNCH_MIN: u64 = 1 << 20;

/// Where a block lives: `len` bytes of data at `offset` (the extent is `len` rounded up to
/// [`ALIGN`], at least one unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLoc {
    /// Byte offset in the file, a multiple of [`ALIGN`].
    pub offset: u64,
    /// Bytes of data.
    pub len: u32,
}

impl BlockLoc {
    const NONE: BlockLoc = BlockLoc { offset: 0, len: 0 };

    /// Bytes the extent occupies: `len` rounded up to whole [`ALIGN`] units, at least one.
    pub fn extent_len(self) -> u64 {
        (self.len as u64).max(1).div_ceil(ALIGN) * ALIGN
    }
}

/// One BTT entry in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Unused id (on disk: offset `u64::MAX`, length 0).
    Free,
    /// Id handed out by `alloc_node_id` but never written (on disk: offset 0, length 0).
    Reserved,
    At(BlockLoc),
}

/// A durable checkpoint: what one header slot references.
#[derive(Clone, Debug)]
struct Ckpt {
    generation: u64,
    /// Log position this checkpoint holds everything before (the write-ahead log keeps every
    /// record from the older checkpoint's LSN on, W5).
    lsn: Lsn,
    btt: Vec<Slot>,
    btt_ext: BlockLoc,
    meta_ext: BlockLoc,
}

impl Ckpt {
    fn has(&self, id: usize, loc: BlockLoc) -> bool {
        self.btt.get(id) == Some(&Slot::At(loc))
    }

    fn owns_blob(&self, ext: BlockLoc) -> bool {
        ext.len > 0 && (ext == self.btt_ext || ext == self.meta_ext)
    }

    /// All extents this checkpoint references, with a name for error messages.
    fn extents(&self) -> Vec<(BlockLoc, String)> {
        let mut v = Vec::new();
        for (ext, name) in [
            (self.btt_ext, "translation table"),
            (self.meta_ext, "meta blob"),
        ] {
            if ext.len > 0 {
                v.push((ext, name.to_string()));
            }
        }
        for (i, s) in self.btt.iter().enumerate() {
            if let Slot::At(loc) = s {
                v.push((*loc, format!("node {i}")));
            }
        }
        v
    }
}

/// A checkpoint being written concurrently with writers: its own BTT, started as a copy of the
/// current one, into which the snapshot's dirty nodes are placed (B10).
#[derive(Debug)]
struct InProgress {
    btt: Vec<Slot>,
    /// Extents written for this checkpoint.
    written: Vec<(usize, BlockLoc)>,
    /// Ids freed since it began: the checkpoint still references them (B7).
    freed_ids: Vec<u64>,
    /// Data extents freed since it began: their space waits for the checkpoint after (X5).
    deferred: Vec<(usize, BlockLoc)>,
}

/// Counters for tests, tools and the environment's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockFileStats {
    /// Length of the file as this handle last wrote or truncated it.
    pub file_len: u64,
    /// Bytes in allocated extents (nodes, BTTs, meta blobs, extents awaiting release).
    pub allocated_bytes: u64,
    /// Bytes in holes below the allocator's end.
    pub free_bytes: u64,
    /// Ids mapped to a block or reserved in the current BTT.
    pub live_nodes: u64,
    /// Bytes of extents replaced or freed but still referenced by a durable checkpoint.
    pub pending_free_bytes: u64,
    /// Bytes of the extents the current BTT references (nodes and the log region).
    pub referenced_bytes: u64,
    /// Bytes written to the device by this handle since open (blocks written by callers
    /// through [`BlockFile::reserve`] are not counted).
    pub bytes_written: u64,
    /// Device syncs issued since open.
    pub syncs: u64,
    /// Generation of the newest durable checkpoint.
    pub generation: u64,
}

/// The result of [`BlockFile::open`].
pub struct Opened {
    /// The block file, positioned at the newest valid checkpoint.
    pub file: BlockFile,
    /// LSN recorded by that checkpoint; log replay starts after it.
    pub checkpoint_lsn: Lsn,
    /// The meta blob recorded by that checkpoint.
    pub meta: Vec<u8>,
    /// Damage open worked around (B6): a header slot that has the magic but does not verify
    /// while the other one does, or a verified older slot whose checkpoint is unreadable.
    /// Empty for a healthy image. Slots are named A (offset 0) and B (offset 4096).
    pub header_notes: Vec<String>,
}

/// Headers, BTT, allocator and copy-on-write bookkeeping of one image. See the module comment.
pub struct BlockFile {
    dev: Arc<dyn BlockDevice>,
    alloc: Allocator,
    /// The current (in-memory) BTT, indexed by node id.
    cur: Vec<Slot>,
    /// Newest durable checkpoint (B4 protects its extents).
    newest: Ckpt,
    /// The checkpoint in the other header slot, if it is readable (B4 protects it as well).
    previous: Option<Ckpt>,
    /// Extents dropped from `cur` that a durable checkpoint still references.
    pending_free: Vec<(usize, BlockLoc)>,
    /// Ids freed since the last checkpoint (B7) and ids free for reuse now.
    pending_ids: Vec<u64>,
    /// Data extents freed since the last checkpoint began (X5): they join `pending_free` when
    /// the next checkpoint commits, so their space is reused only once the free is durable.
    deferred: Vec<(usize, BlockLoc)>,
    /// The checkpoint being written while writers continue (B10), if any.
    in_progress: Option<InProgress>,
    free_ids: BTreeSet<u64>,
    lsn: Lsn,
    file_len: u64,
    bytes_written: u64,
    syncs: u64,
    /// Set when a checkpoint failed before its header was durable: the device state is unknown.
    poisoned: Option<String>,
    /// The image's fixed size, if it has one (B11): no extent is allocated past it, and the
    /// free tail is punched rather than truncated, so the file keeps its size.
    limit: Option<u64>,
    /// Highest extent end allocated since the free tail was last punched.
    tail_high: u64,
}

impl std::fmt::Debug for BlockFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockFile")
            .field("dev", &self.dev)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl BlockFile {
    /// Formats an empty device: an empty BTT, `meta`, and both header slots (generations 0 and 1,
    /// same content, so either header alone opens the image), synced.
    pub fn create(dev: Arc<dyn BlockDevice>, meta: &[u8]) -> Result<BlockFile> {
        let len = dev
            .len()
            .map_err(|e| Error::io("reading device length", e))?;
        if len != 0 {
            return Err(Error::InvalidArgument(format!(
                "cannot format a device that is not empty ({len} bytes)"
            )));
        }
        let meta_len = u32::try_from(meta.len())
            .map_err(|_| Error::InvalidArgument("meta blob over 4 GiB".into()))?;
        let mut alloc = Allocator::new(DATA_START);
        let meta_ext = if meta.is_empty() {
            BlockLoc::NONE
        } else {
            BlockLoc {
                offset: alloc.alloc(meta_len as u64),
                len: meta_len,
            }
        };
        let empty = Ckpt {
            generation: 1,
            lsn: Lsn(0),
            btt: Vec::new(),
            btt_ext: BlockLoc::NONE,
            meta_ext,
        };
        let mut f = BlockFile {
            dev,
            alloc,
            cur: Vec::new(),
            previous: Some(Ckpt {
                generation: 0,
                ..empty.clone()
            }),
            newest: empty,
            pending_free: Vec::new(),
            pending_ids: Vec::new(),
            deferred: Vec::new(),
            in_progress: None,
            free_ids: BTreeSet::new(),
            lsn: Lsn(0),
            file_len: 0,
            bytes_written: 0,
            syncs: 0,
            poisoned: None,
            limit: None,
            tail_high: 0,
        };
        f.write_at(meta, meta_ext.offset, "writing the meta blob")?;
        f.sync("syncing the meta blob")?;
        for generation in 0..2 {
            let h = Header {
                generation,
                lsn: Lsn(0),
                btt: BlockLoc::NONE,
                btt_crc: crc32c::crc32c(&[]),
                meta: meta_ext,
                meta_crc: crc32c::crc32c(meta),
            };
            f.write_at(&encode_header(&h), generation * ALIGN, "writing a header")?;
        }
        f.sync("syncing the headers")?;
        Ok(f)
    }

    /// Opens an image at its newest valid checkpoint (B2) and rebuilds the allocator from the
    /// BTTs of both header slots (B5).
    ///
    /// Errors: [`Error::NotAnImage`] if no slot has our magic; [`Error::UnsupportedVersion`] if a
    /// verified slot has another format version; [`Error::Checksum`]/[`Error::Corrupt`] naming
    /// the header, translation table or meta blob; [`Error::Corrupt`] ("truncated") if the file
    /// ends before an extent the checkpoint references.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Opened> {
        let file_len = dev
            .len()
            .map_err(|e| Error::io("reading device length", e))?;
        let mut hdr = vec![0u8; file_len.min(DATA_START) as usize];
        dev.read_at(&mut hdr, 0)
            .map_err(|e| Error::io("reading the headers", e))?;
        let slots: Vec<SlotState> = (0..2)
            .map(|i| {
                let start = (i * ALIGN as usize).min(hdr.len());
                let end = (start + ALIGN as usize).min(hdr.len());
                decode_header(i, &hdr[start..end])
            })
            .collect();
        let mut valid: Vec<Header> = Vec::new();
        let mut errors: Vec<Error> = Vec::new();
        let mut invalid_slots = Vec::new();
        for (i, s) in slots.into_iter().enumerate() {
            match s {
                SlotState::Absent => invalid_slots.push((i, "holds no header".to_string())),
                SlotState::Invalid(e) => {
                    invalid_slots.push((i, e.to_string()));
                    errors.push(e)
                }
                // A newer writer touched the image: even the other slot may no longer describe
                // it, so refuse rather than fall back.
                SlotState::Unsupported(found) => {
                    return Err(Error::UnsupportedVersion {
                        found,
                        supported: FORMAT_VERSION,
                    })
                }
                SlotState::Valid(h) => valid.push(h),
            }
        }
        valid.sort_by_key(|h| std::cmp::Reverse(h.generation));
        let Some(&top) = valid.first() else {
            return Err(match errors.len() {
                0 => Error::NotAnImage,
                1 => errors.remove(0),
                _ => Error::corrupt(
                    "headers",
                    format!("neither header slot is valid: {}; {}", errors[0], errors[1]),
                ),
            });
        };
        let (newest, meta) = load_ckpt(&*dev, &top, file_len)?;
        validate_extents(&newest.extents(), file_len)?;
        let slot_name = |g: u64| if g.is_multiple_of(2) { 'A' } else { 'B' };
        let using = slot_name(top.generation);
        let mut header_notes: Vec<String> = invalid_slots
            .iter()
            .map(|(i, why)| {
                format!(
                    "header slot {} unreadable ({why}), using {using}",
                    if *i == 0 { 'A' } else { 'B' }
                )
            })
            .collect();
        // The older checkpoint only matters as a fallback; if it is unreadable it simply stops
        // being one (its slot is the next one overwritten).
        let previous = valid.get(1).and_then(|h| {
            let loaded = load_ckpt(&*dev, h, file_len).and_then(|(ck, _)| {
                let mut all = newest.extents();
                all.extend(ck.extents());
                validate_extents(&all, file_len)?;
                Ok(ck)
            });
            match loaded {
                Ok(ck) => Some(ck),
                Err(e) => {
                    header_notes.push(format!(
                        "header slot {}: older checkpoint {} unreadable ({e}), using {using}",
                        slot_name(h.generation),
                        h.generation
                    ));
                    None
                }
            }
        });
        let mut used: BTreeMap<u64, u64> = BTreeMap::new();
        for ck in std::iter::once(&newest).chain(previous.iter()) {
            for (loc, _) in ck.extents() {
                used.insert(loc.offset, loc.extent_len());
            }
        }
        let mut alloc = Allocator::new(DATA_START);
        for (off, len) in used {
            alloc.mark_used(off, len);
        }
        let mut pending_free = Vec::new();
        if let Some(p) = &previous {
            for (i, s) in p.btt.iter().enumerate() {
                if let Slot::At(loc) = s {
                    if !newest.has(i, *loc) {
                        pending_free.push((i, *loc));
                    }
                }
            }
        }
        let cur = newest.btt.clone();
        let free_ids = (0..cur.len() as u64)
            .filter(|&i| cur[i as usize] == Slot::Free)
            .collect();
        let file = BlockFile {
            dev,
            alloc,
            cur,
            newest,
            previous,
            pending_free,
            pending_ids: Vec::new(),
            deferred: Vec::new(),
            in_progress: None,
            free_ids,
            lsn: top.lsn,
            file_len,
            bytes_written: 0,
            syncs: 0,
            poisoned: None,
            limit: None,
            tail_high: file_len,
        };
        Ok(Opened {
            file,
            checkpoint_lsn: top.lsn,
            meta,
            header_notes,
        })
    }

    /// The device under this file (callers that [`reserve`](Self::reserve) write through it).
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// LSN of the newest durable checkpoint.
    pub fn checkpoint_lsn(&self) -> Lsn {
        self.lsn
    }

    /// LSN of the older durable checkpoint (the fallback if the newest header is damaged), or of
    /// the newest if the older one is unreadable. The write-ahead log must keep every record
    /// from here on (W5).
    pub fn oldest_checkpoint_lsn(&self) -> Lsn {
        match &self.previous {
            Some(p) => p.lsn.min(self.newest.lsn),
            None => self.newest.lsn,
        }
    }

    /// Reserves a fixed region of `len` bytes (the write-ahead log) as a BTT entry under a fresh
    /// id, and extends the device to cover it (sparse where the device allows). The entry is never
    /// rewritten, so after the next checkpoint B4 protects the region for good; the caller
    /// records the id and writes inside the region through [`device`](Self::device).
    pub fn reserve_region(&mut self, len: u32) -> Result<(NodeId, BlockLoc)> {
        let id = self.alloc_node_id();
        let loc = self.reserve(id, len)?;
        let end = loc.offset + loc.extent_len();
        let dev_len = self
            .dev
            .len()
            .map_err(|e| Error::io("reading device length", e))?;
        if dev_len < end {
            self.dev
                .set_len(end)
                .map_err(|e| Error::io("extending the file for the log region", e))?;
        }
        self.file_len = self.file_len.max(end);
        Ok((id, loc))
    }

    /// A fresh node id: the lowest id free since before the last checkpoint (B7), else a new one.
    pub fn alloc_node_id(&mut self) -> NodeId {
        let id = match self.free_ids.pop_first() {
            Some(id) => id,
            None => {
                self.cur.push(Slot::Free);
                self.cur.len() as u64 - 1
            }
        };
        self.cur[id as usize] = Slot::Reserved;
        NodeId(id)
    }

    /// Where node `id`'s current block is, if it has one.
    pub fn loc(&self, id: NodeId) -> Option<BlockLoc> {
        match self.cur.get(id.0 as usize) {
            Some(Slot::At(loc)) => Some(*loc),
            _ => None,
        }
    }

    /// Every node that has a block in the current BTT, in id order (for checks and tools).
    pub fn live_blocks(&self) -> impl Iterator<Item = (NodeId, BlockLoc)> + '_ {
        self.cur.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::At(loc) => Some((NodeId(i as u64), *loc)),
            _ => None,
        })
    }

    /// Reads `len` bytes at `offset_in_block` of node `id`'s current block.
    pub fn read(&self, id: NodeId, offset_in_block: u32, len: u32) -> Result<Vec<u8>> {
        let loc = self.loc(id).ok_or(Error::MissingNode(id))?;
        let end = offset_in_block as u64 + len as u64;
        if end > loc.len as u64 {
            return Err(Error::corrupt(
                format!("node {id}"),
                format!(
                    "read of bytes {offset_in_block}..{end} of a {}-byte block",
                    loc.len
                ),
            ));
        }
        if len == 0 {
            // Nothing to read; an empty node's extent may lie past the file's last byte.
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len as usize];
        self.dev
            .read_at(&mut buf, loc.offset + offset_in_block as u64)
            .map_err(|e| Error::io(format!("reading node {id}"), e))?;
        Ok(buf)
    }

    /// Copy-on-write: writes `bytes` to a fresh extent (never one a durable checkpoint
    /// references, B4) and points `id` at it. On an I/O error the BTT still points at the old
    /// block and the fresh extent is released.
    pub fn write_node(&mut self, id: NodeId, bytes: &[u8]) -> Result<BlockLoc> {
        self.check_writable(id)?;
        let len = u32::try_from(bytes.len())
            .map_err(|_| Error::InvalidArgument(format!("node {id} block over 4 GiB")))?;
        let loc = BlockLoc {
            offset: self.alloc_extent(len, || format!("writing node {id}"))?,
            len,
        };
        if let Err(e) = self.write_at(bytes, loc.offset, &format!("writing node {id}")) {
            self.alloc.free(loc.offset, loc.extent_len());
            return Err(e);
        }
        self.place(id, loc);
        Ok(loc)
    }

    /// Same bookkeeping as [`write_node`](Self::write_node) without the I/O: the caller writes
    /// `len` bytes at the returned offset through [`device`](Self::device), and must finish
    /// before the next [`checkpoint`](Self::checkpoint) starts (its sync covers the write).
    pub fn reserve(&mut self, id: NodeId, len: u32) -> Result<BlockLoc> {
        self.check_writable(id)?;
        let loc = BlockLoc {
            offset: self.alloc_extent(len, || format!("writing node {id}"))?,
            len,
        };
        self.file_len = self.file_len.max(loc.offset + len as u64);
        self.place(id, loc);
        Ok(loc)
    }

    /// Node `id` left the tree: its extent is released at once if no durable checkpoint
    /// references it, else after the next checkpoint; the id is reusable after it (B7).
    pub fn free_node(&mut self, id: NodeId) {
        let i = id.0 as usize;
        let Some(old) = self.cur.get(i).copied() else {
            debug_assert!(false, "free_node of unknown node {id}");
            return;
        };
        debug_assert!(old != Slot::Free, "double free of node {id}");
        if old == Slot::Free {
            return;
        }
        self.cur[i] = Slot::Free;
        self.release(i, old);
        match &mut self.in_progress {
            Some(ip) => ip.freed_ids.push(id.0),
            None => self.pending_ids.push(id.0),
        }
    }

    /// Space for a data extent of `len` bytes (X1): allocated, in no table yet (so no
    /// checkpoint can reference it), to be written by the caller through
    /// [`device`](Self::device) and then [`bind_extent`](Self::bind_extent)ed, or given back
    /// with [`unalloc_space`](Self::unalloc_space).
    pub fn alloc_space(&mut self, len: u32) -> Result<BlockLoc> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        let loc = BlockLoc {
            offset: self.alloc_extent(len, || "writing a data extent".into())?,
            len,
        };
        self.file_len = self.file_len.max(loc.offset + len as u64);
        Ok(loc)
    }

    /// Gives back space from [`alloc_space`](Self::alloc_space) that was never bound, or
    /// space recovery reserved that no live extent holds (X6).
    pub fn unalloc_space(&mut self, offset: u64, len: u64) {
        if len > 0 {
            self.alloc.free(offset, len.div_ceil(ALIGN) * ALIGN);
        }
    }

    /// Whether `[offset, offset + len)` (rounded up to whole units) is free in the allocator:
    /// recovery checks that a replayed extent names no space a checkpoint uses (X6).
    pub fn space_is_free(&self, offset: u64, len: u64) -> bool {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        if offset < DATA_START || !offset.is_multiple_of(ALIGN) || offset >= 1 << 62 {
            return false;
        }
        if offset >= self.alloc.end() {
            return true;
        }
        self.alloc
            .hole_containing(offset)
            .is_some_and(|(h, hl)| h + hl >= offset + len)
    }

    /// Marks free space used (recovery reserves replayed extents' space, X6); the caller
    /// checked [`space_is_free`](Self::space_is_free).
    pub fn reserve_space(&mut self, offset: u64, len: u64) {
        self.alloc.mark_used(offset, len);
        self.file_len = self.file_len.max(offset + len);
    }

    /// Enters a written data extent at `loc` into the current BTT under a fresh id (X4).
    pub fn bind_extent(&mut self, loc: BlockLoc) -> NodeId {
        let id = self.alloc_node_id();
        self.cur[id.0 as usize] = Slot::At(loc);
        id
    }

    /// Removes data extent `id` from the current BTT (X5). With `defer`, its space returns
    /// after the next checkpoint that begins from now on commits (and no durable checkpoint
    /// references it); without, the caller owns the space (recovery's reserved ranges, X6).
    pub fn unbind_extent(&mut self, id: NodeId, defer: bool) {
        let i = id.0 as usize;
        let Some(Slot::At(loc)) = self.cur.get(i).copied() else {
            debug_assert!(false, "unbind of extent {id}, which is not bound");
            return;
        };
        self.cur[i] = Slot::Free;
        match &mut self.in_progress {
            Some(ip) => {
                ip.freed_ids.push(id.0);
                if defer {
                    ip.deferred.push((i, loc));
                }
            }
            None => {
                self.pending_ids.push(id.0);
                if defer {
                    self.deferred.push((i, loc));
                }
            }
        }
    }

    /// Generation of the newest durable checkpoint.
    pub(crate) fn generation(&self) -> u64 {
        self.newest.generation
    }

    /// Counters; see [`BlockFileStats`].
    pub fn stats(&self) -> BlockFileStats {
        BlockFileStats {
            file_len: self.file_len,
            allocated_bytes: self.alloc.allocated_bytes(),
            free_bytes: self.alloc.free_bytes(),
            live_nodes: self.cur.iter().filter(|s| **s != Slot::Free).count() as u64,
            pending_free_bytes: self
                .pending_free
                .iter()
                .chain(&self.deferred)
                .chain(self.in_progress.iter().flat_map(|ip| &ip.deferred))
                .map(|(_, l)| l.extent_len())
                .sum(),
            referenced_bytes: self.live_blocks().map(|(_, l)| l.extent_len()).sum(),
            bytes_written: self.bytes_written,
            syncs: self.syncs,
            generation: self.newest.generation,
        }
    }

    /// The allocator, for inspection (tests, tools).
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    /// Gives the image a fixed size (B11): nothing is allocated past `limit`, and the file's
    /// free tail is punched rather than truncated. `None`: the file grows as needed.
    pub fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    /// Free bytes below the limit that extents of up to `unit` bytes can use (B12): the tail
    /// past the allocator's end plus the holes counted in whole units. `None` without a limit.
    pub fn usable_free(&self, unit: u64) -> Option<u64> {
        let limit = self.limit?;
        Some(limit.saturating_sub(self.alloc.end()) + self.alloc.free_in_units(unit))
    }

    /// Entries of the current BTT (used or not): the size of the next table, in entries, at
    /// most. O(1), unlike [`stats`](Self::stats).
    pub fn table_entries(&self) -> u64 {
        self.cur.len() as u64
    }

    /// The fixed size set by [`set_limit`](Self::set_limit).
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Allocates an extent for `len` bytes, or fails with [`Error::NoSpace`] (changing nothing)
    /// if it would end past the limit (B11).
    fn alloc_extent(&mut self, len: u32, context: impl FnOnce() -> String) -> Result<u64> {
        let off = self.alloc.alloc(len as u64);
        let end = off + (len as u64).max(1).div_ceil(ALIGN) * ALIGN;
        if self.limit.is_some_and(|l| end > l) {
            self.alloc.free(off, end - off);
            return Err(Error::NoSpace {
                context: format!(
                    "{}: the image is full ({} bytes)",
                    context(),
                    self.limit.unwrap_or_default()
                ),
            });
        }
        self.tail_high = self.tail_high.max(end);
        Ok(off)
    }

    // ---- internals ----

    fn check_writable(&self, id: NodeId) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        match self.cur.get(id.0 as usize) {
            Some(Slot::Reserved | Slot::At(_)) => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "node {id} was not allocated with alloc_node_id"
            ))),
        }
    }

    fn place(&mut self, id: NodeId, loc: BlockLoc) {
        let i = id.0 as usize;
        let old = std::mem::replace(&mut self.cur[i], Slot::At(loc));
        self.release(i, old);
    }

    /// Drops `old` (the previous slot of id `i`) from the current BTT: freed now unless a durable
    /// checkpoint references it (B4), in which case it waits in `pending_free`.
    fn release(&mut self, i: usize, old: Slot) {
        if let Slot::At(loc) = old {
            let durable = self.newest.has(i, loc)
                || self.previous.as_ref().is_some_and(|p| p.has(i, loc))
                || self
                    .in_progress
                    .as_ref()
                    .is_some_and(|ip| ip.btt.get(i) == Some(&Slot::At(loc)));
            if durable {
                self.pending_free.push((i, loc));
            } else {
                self.alloc.free(loc.offset, loc.extent_len());
            }
        }
    }

    fn write_at(&mut self, buf: &[u8], offset: u64, context: &str) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.dev
            .write_at(buf, offset)
            .map_err(|e| Error::io(context, e))?;
        self.bytes_written += buf.len() as u64;
        self.file_len = self.file_len.max(offset + buf.len() as u64);
        Ok(())
    }

    fn sync(&mut self, context: &str) -> Result<()> {
        self.syncs += 1;
        self.dev.sync().map_err(|e| Error::io(context, e))
    }
}
