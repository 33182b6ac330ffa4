//! The stored-block count of regular files (what `st_blocks` reports): how many data blocks a
//! file really has, holes excluded. It owns the per-mount mirror of each open file's size and
//! count ([`Shape`], kept in the inode table) and the rules that derive a new count from an
//! operation on that mirror; it must never be the only record of a count (the stat holds it,
//! written by the same batch as the data change) and never read blocks where the mirror knows.
//!
//! Why a mirror: a write is a blind upsert, and whether it adds blocks depends on what is
//! stored. Under the single-writer rule every change of a file's size or blocks happens in
//! this mount under the file's inode lock, so a mirror loaded once (one stat read, or none for
//! a file this mount created or truncated to zero) stays exact. Then:
//! * a file whose blocks below its size are all stored (dense, the common case) needs no
//!   read: a write adds exactly the blocks at or past the old end (D1: nothing is stored
//!   there);
//! * a sparse file (a hole somewhere) costs one range scan of the blocks an operation touches
//!   below its size (a write's blocks, a truncation's or punch's removed range).

use fern_kv::{Direction, KeyRange};

use crate::attr::Stat;
use crate::cache::Loc;
use crate::error::FsResult;
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::schema;

/// A regular file's size and stored data blocks, as this mount knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Size in bytes.
    pub size: u64,
    /// Data blocks stored.
    pub stored: u64,
}

impl Shape {
    /// A new, empty file.
    pub const EMPTY: Shape = Shape { size: 0, stored: 0 };

    /// The shape a stat records (an uncounted file, from an image older than the count, is
    /// taken as dense: the size's upper bound, what st_blocks said before).
    pub fn of(stat: &Stat, bs: u64) -> Shape {
        Shape {
            size: stat.size,
            stored: stat.stored_blocks().unwrap_or(stat.size.div_ceil(bs)),
        }
    }

    /// Block slots below the size: `ceil(size / bs)`.
    fn slots(&self, bs: u64) -> u64 {
        self.size.div_ceil(bs)
    }

    /// Every slot below the size is stored.
    pub fn dense(&self, bs: u64) -> bool {
        self.stored >= self.slots(bs)
    }
}

impl Fs {
    /// The shape of regular file `ino` at `loc`; the caller holds `ino`'s lock. Known from a
    /// lookup, a create or an earlier change; otherwise loaded from the stat (one read).
    pub(crate) fn shape(&self, ino: InodeId, loc: &Loc) -> FsResult<Shape> {
        if let Some(s) = self.inodes.shape(ino) {
            return Ok(s);
        }
        let stat = self.read_inode_at(&*self.kv, ino, loc)?.stat;
        let shape = Shape::of(&stat, u64::from(self.sb.block_size));
        self.inodes.update(ino, |k| k.shape = Some(shape));
        Ok(shape)
    }

    /// Records `ino`'s shape after a committed change (caller holds the lock).
    pub(crate) fn set_shape(&self, ino: InodeId, shape: Shape) {
        self.inodes.set_shape(ino, shape);
    }

    /// Stored blocks of `ino` among block numbers `[lo, hi)`, given its shape: arithmetic for
    /// a dense file, one range scan for a sparse one.
    pub(crate) fn stored_between(
        &self,
        ino: InodeId,
        s: &Shape,
        lo: u64,
        hi: u64,
    ) -> FsResult<u64> {
        let bs = u64::from(self.sb.block_size);
        let hi = hi.min(s.slots(bs));
        if lo >= hi {
            return Ok(0);
        }
        if s.dense(bs) {
            return Ok(hi - lo);
        }
        let range = KeyRange::half_open(&schema::block_key(ino, lo), &schema::block_key(ino, hi));
        let found = self
            .kv
            .scan(self.t.data, &range, Direction::Forward, (hi - lo) as usize)?;
        // An extent slot counts all its blocks; rows inside it shadow, not add (extent.rs E2).
        let extents = self.extent_blocks_between(ino, lo, hi)?;
        let mut rows = 0;
        for (k, _) in &found {
            let n = schema::parse_block_key(ino, k)?;
            if !extents.iter().any(|(a, z)| (*a..*z).contains(&n)) {
                rows += 1;
            }
        }
        Ok(rows + extents.iter().map(|(a, z)| z - a).sum::<u64>())
    }

    /// The shape after writing `[pos, end)`: blocks touched at or past the old end are new;
    /// those below it are new only where they were holes.
    pub(crate) fn shape_after_write(
        &self,
        ino: InodeId,
        s: &Shape,
        pos: u64,
        end: u64,
    ) -> FsResult<Shape> {
        let bs = u64::from(self.sb.block_size);
        let (first, last) = (pos / bs, (end - 1) / bs + 1);
        let touched = last - first;
        let present = self.stored_between(ino, s, first, last)?;
        Ok(Shape {
            size: s.size.max(end),
            stored: s.stored + touched - present,
        })
    }

    /// The shape after truncating to `size` (blocks from `ceil(size / bs)` on are removed).
    pub(crate) fn shape_after_truncate(
        &self,
        ino: InodeId,
        s: &Shape,
        size: u64,
    ) -> FsResult<Shape> {
        let bs = u64::from(self.sb.block_size);
        let gone = if size == 0 {
            s.stored
        } else {
            self.stored_between(ino, s, size.div_ceil(bs), u64::MAX)?
        };
        Ok(Shape {
            size,
            stored: s.stored - gone,
        })
    }

    /// The shape after deleting whole blocks `[lo, hi)` (hole punch, zero range); `size` is
    /// the new size.
    pub(crate) fn shape_after_punch(
        &self,
        ino: InodeId,
        s: &Shape,
        lo: u64,
        hi: u64,
        size: u64,
    ) -> FsResult<Shape> {
        let gone = self.stored_between(ino, s, lo, hi)?;
        Ok(Shape {
            size,
            stored: s.stored - gone,
        })
    }
}
