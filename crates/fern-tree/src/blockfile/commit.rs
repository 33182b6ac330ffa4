//! The checkpoint commit (docs/format.md, "Checkpoint protocol"): BTT and meta blob to fresh
//! extents, sync, header into the older slot, sync (B3); the checkpoint written while writers
//! continue, with its own BTT and the adoption of what it wrote (B10); and, once the header is
//! durable, the release of what only the dropped checkpoint referenced and the return of space
//! to the host.
//!
//! Owns: the order of writes and syncs that makes a checkpoint durable. Never: chooses where an
//! extent goes (blockfile.rs allocates) or how a header or BTT is laid out (ondisk.rs).

use std::collections::BTreeSet;

use super::ondisk::{encode_btt, encode_header, Header};
use super::{BlockFile, BlockLoc, Ckpt, InProgress, Slot, ALIGN, PUNCH_MIN};
use crate::error::{Error, Result};
use crate::ids::{Lsn, NodeId};

impl BlockFile {
    /// Starts a checkpoint that is written while writers continue (B10): its BTT begins as a copy
    /// of the current one. Until [`commit_checkpoint`](Self::commit_checkpoint), extents it
    /// references are protected like a durable checkpoint's (B4).
    pub fn begin_checkpoint(&mut self) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        if self.in_progress.is_some() {
            return Err(Error::InvalidArgument(
                "a checkpoint is already in progress".into(),
            ));
        }
        self.in_progress = Some(InProgress {
            btt: self.cur.clone(),
            written: Vec::new(),
            freed_ids: Vec::new(),
            deferred: Vec::new(),
        });
        Ok(())
    }

    /// Allocates a fresh extent for node `id`'s snapshot and places it in the in-progress BTT
    /// only; the current BTT (used by readers and eviction) is untouched. The caller writes
    /// `len` bytes at the returned offset through [`device`](Self::device) before committing.
    pub fn reserve_for_checkpoint(&mut self, id: NodeId, len: u32) -> Result<BlockLoc> {
        let i = id.0 as usize;
        match &self.in_progress {
            None => return Err(Error::InvalidArgument("no checkpoint in progress".into())),
            Some(ip) if !matches!(ip.btt.get(i), Some(Slot::Reserved | Slot::At(_))) => {
                return Err(Error::InvalidArgument(format!(
                    "node {id} was not allocated when the checkpoint began"
                )))
            }
            Some(_) => {}
        }
        let loc = BlockLoc {
            offset: self.alloc_extent(len, || format!("writing node {id} for a checkpoint"))?,
            len,
        };
        let Some(ip) = &mut self.in_progress else {
            return Err(Error::InvalidArgument("no checkpoint in progress".into()));
        };
        ip.btt[i] = Slot::At(loc);
        ip.written.push((i, loc));
        self.file_len = self.file_len.max(loc.offset + len as u64);
        Ok(loc)
    }

    /// Commits the in-progress BTT and `meta` with the same protocol as
    /// [`checkpoint`](Self::checkpoint) (B3). The caller then settles every extent it wrote for
    /// the checkpoint with [`adopt`](Self::adopt) or [`not_adopted`](Self::not_adopted); until
    /// then only the new checkpoint references them (B10).
    pub fn commit_checkpoint(&mut self, lsn: Lsn, meta: &[u8]) -> Result<()> {
        let Some(ip) = self.in_progress.take() else {
            return Err(Error::InvalidArgument("no checkpoint in progress".into()));
        };
        let r = self.commit_table(ip.btt, lsn, meta);
        // Ids freed while it was written are still in its table: reusable after the next (B7).
        self.pending_ids.extend(ip.freed_ids);
        // Extents freed while it was written: its snapshot predates the free (X5).
        self.deferred.extend(ip.deferred);
        if r.is_err() {
            // Poisoned: nothing durable references them; keep the allocator accounting whole.
            self.pending_free.extend(ip.written);
        }
        r
    }

    /// Points node `id` of the current BTT at `loc`, an extent the last committed checkpoint
    /// wrote for it, because the cached node is unchanged since that checkpoint's snapshot.
    pub fn adopt(&mut self, id: NodeId, loc: BlockLoc) {
        let i = id.0 as usize;
        if !matches!(self.cur.get(i), Some(Slot::Reserved | Slot::At(_))) {
            self.not_adopted(id, loc);
            return;
        }
        let old = std::mem::replace(&mut self.cur[i], Slot::At(loc));
        self.release(i, old);
    }

    /// Node `id` changed after the snapshot, so the current BTT keeps its own block; `loc`,
    /// written for the last checkpoint, is released when no durable checkpoint references it.
    pub fn not_adopted(&mut self, id: NodeId, loc: BlockLoc) {
        self.pending_free.push((id.0 as usize, loc));
    }

    /// Commits the current BTT and `meta` as checkpoint `generation + 1` (protocol in
    /// docs/format.md): BTT and meta to fresh extents, sync, header into the older slot, sync
    /// (B3). Only then are extents and ids that only the dropped checkpoint referenced released;
    /// a free tail is truncated and freed holes of [`PUNCH_MIN`] bytes or more are punched.
    ///
    /// An error before the header is durable poisons this handle (the device state is unknown;
    /// reopening yields the previous checkpoint). An error while truncating or punching comes
    /// after the commit: the checkpoint holds and the handle stays usable.
    pub fn checkpoint(&mut self, lsn: Lsn, meta: &[u8]) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        if self.in_progress.is_some() {
            return Err(Error::InvalidArgument(
                "a checkpoint is already in progress".into(),
            ));
        }
        self.commit_table(self.cur.clone(), lsn, meta)
    }

    /// Commits `table` as the next checkpoint (see [`checkpoint`](Self::checkpoint)).
    fn commit_table(&mut self, table: Vec<Slot>, lsn: Lsn, meta: &[u8]) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        let meta_len = u32::try_from(meta.len())
            .map_err(|_| Error::InvalidArgument("meta blob over 4 GiB".into()))?;
        let btt = encode_btt(&table);
        let btt_len = u32::try_from(btt.len())
            .map_err(|_| Error::InvalidArgument("translation table over 4 GiB".into()))?;
        let mut blob = |len: u32| -> Result<BlockLoc> {
            Ok(match len {
                0 => BlockLoc::NONE,
                len => BlockLoc {
                    offset: self.alloc_extent(len, || "writing a checkpoint".into())?,
                    len,
                },
            })
        };
        let btt_ext = blob(btt_len);
        let meta_ext = blob(meta_len);
        let (btt_ext, meta_ext) = match (btt_ext, meta_ext) {
            (Ok(b), Ok(m)) => (b, m),
            (b, m) => {
                // Nothing written yet; give back what was allocated. The reserve (B11) exists
                // so that this never happens; if it does, the handle stays as it was.
                for ext in [&b, &m].into_iter().flatten() {
                    if ext.len > 0 {
                        self.alloc.free(ext.offset, ext.extent_len());
                    }
                }
                return Err(b.and(m).err().unwrap_or_else(|| Error::NoSpace {
                    context: "writing a checkpoint".into(),
                }));
            }
        };
        let generation = self.newest.generation + 1;
        let header = Header {
            generation,
            lsn,
            btt: btt_ext,
            btt_crc: crc32c::crc32c(&btt),
            meta: meta_ext,
            meta_crc: crc32c::crc32c(meta),
        };
        let durable = self
            .write_at(&btt, btt_ext.offset, "writing the translation table")
            .and_then(|_| self.write_at(meta, meta_ext.offset, "writing the meta blob"))
            .and_then(|_| self.sync("syncing before the checkpoint header"))
            .and_then(|_| {
                let slot = generation % 2;
                self.write_at(&encode_header(&header), slot * ALIGN, "writing a header")
            })
            .and_then(|_| self.sync("syncing the checkpoint header"));
        if let Err(e) = durable {
            // Nothing durable references the new blobs unless the header made it, and then it
            // is only found by reopening; this handle must not be used either way.
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        // Commit in memory: the new checkpoint replaces the one whose slot was overwritten.
        let ck = Ckpt {
            generation,
            lsn,
            btt: table,
            btt_ext,
            meta_ext,
        };
        let dropped = self
            .previous
            .replace(std::mem::replace(&mut self.newest, ck));
        self.lsn = lsn;
        let mut freed = Vec::new();
        if let Some(d) = dropped {
            for ext in [d.btt_ext, d.meta_ext] {
                if ext.len > 0 && !self.blob_referenced(ext) {
                    freed.push(ext);
                }
            }
        }
        // Extents freed before this checkpoint began: the free is in it and durable (X5).
        self.pending_free.append(&mut self.deferred);
        let (newest, previous) = (&self.newest, &self.previous);
        self.pending_free.retain(|&(id, loc)| {
            let keep = newest.has(id, loc) || previous.as_ref().is_some_and(|p| p.has(id, loc));
            if !keep {
                freed.push(loc);
            }
            keep
        });
        for ext in &freed {
            self.alloc.free(ext.offset, ext.extent_len());
        }
        self.free_ids.extend(self.pending_ids.drain(..));
        self.give_back_space(&freed)
    }

    fn blob_referenced(&self, ext: BlockLoc) -> bool {
        self.newest.owns_blob(ext) || self.previous.as_ref().is_some_and(|p| p.owns_blob(ext))
    }

    /// Returns space to the host after a commit: the free tail by truncation, large holes that
    /// now contain freed extents by punching.
    fn give_back_space(&mut self, freed: &[BlockLoc]) -> Result<()> {
        let end = self.alloc.end();
        if self.limit.is_some() {
            // A sized image keeps its length (it is the capacity users see): the free tail is
            // punched instead, once per stretch that held extents.
            if self.tail_high > end {
                self.dev
                    .punch_hole(end, self.tail_high - end)
                    .map_err(|e| Error::io("punching the free tail", e))?;
            }
            self.tail_high = end;
        } else if self.file_len > end {
            self.dev
                .set_len(end)
                .map_err(|e| Error::io("truncating the free tail", e))?;
            self.file_len = end;
        }
        let holes: BTreeSet<(u64, u64)> = freed
            .iter()
            .filter_map(|ext| self.alloc.hole_containing(ext.offset))
            .filter(|&(_, len)| len >= PUNCH_MIN)
            .collect();
        for (off, len) in holes {
            self.dev
                .punch_hole(off, len)
                .map_err(|e| Error::io("punching a hole", e))?;
        }
        Ok(())
    }
}
