//! Cursors: ordered iteration in both directions over one tree.
//!
//! A cursor materializes one leaf at a time (rows with every pending message applied) under the
//! read lock, then releases the lock; moving past the leaf re-descends from the root using the
//! leaf's key bounds, so tree changes between steps never make it skip or repeat a key that
//! existed throughout. Never: holds a lock or a node between calls.

use std::ops::Bound;

use crate::betree::{self, LeafRows, Seek};
use crate::error::Result;
use crate::tree::Tree;

/// A position in a tree's key order.
pub struct Cursor {
    tree: Tree,
    leaf: Option<LeafRows>,
    /// (basement, row) inside `leaf`, valid when `valid`.
    pos: (usize, usize),
    valid: bool,
    upper: Bound<Vec<u8>>,
    /// `upper` as an exclusive key, where a window ends at the latest: what follows an
    /// included key is that key with a zero byte appended (the least key above it).
    window_end: Option<Vec<u8>>,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("tree", &self.tree.name())
            .field("key", &self.key())
            .finish()
    }
}

impl Cursor {
    pub(crate) fn new(tree: Tree) -> Cursor {
        Cursor {
            tree,
            leaf: None,
            pos: (0, 0),
            valid: false,
            upper: Bound::Unbounded,
            window_end: None,
        }
    }

    /// Limits forward iteration of [`Cursor::for_each_forward`] to keys below this bound.
    pub fn set_upper(&mut self, hi: Bound<&[u8]>) {
        self.upper = match hi {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(k) => Bound::Included(k.to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        };
        self.window_end = match hi {
            Bound::Unbounded => None,
            Bound::Excluded(k) => Some(k.to_vec()),
            Bound::Included(k) => Some([k, &[0]].concat()),
        };
    }

    fn load(&mut self, seek: Seek<'_>) -> Result<()> {
        let t = self.tree.clone();
        let end = self.window_end.as_deref();
        let rows = t
            .env
            .read(&t, |ctx, root| betree::leaf_rows(ctx, root, seek, end))?;
        self.leaf = Some(rows);
        Ok(())
    }

    /// Positions at the first row with key >= `key` (`strict`: > `key`), moving right over
    /// leaves that have no such row.
    fn forward_from(&mut self, key: &[u8], strict: bool) -> Result<()> {
        self.load(Seek::AtOrAfter(key))?;
        loop {
            let leaf = self.leaf.as_ref().expect("loaded");
            for (b, rows) in leaf.rows.iter().enumerate() {
                let mut r = rows.lower_bound(key);
                if strict && r < rows.len() && rows.key(r) == key {
                    r += 1;
                }
                if r < rows.len() {
                    self.pos = (b, r);
                    self.valid = true;
                    return Ok(());
                }
            }
            match leaf.hi.clone() {
                Some(hi) if self.below_upper(&hi) => self.load(Seek::AtOrAfter(&hi))?,
                _ => {
                    self.valid = false;
                    return Ok(());
                }
            }
        }
    }

    /// Positions at the last row with key < `key` (`inclusive`: <= `key`; `key = None`: the
    /// last row), moving left over leaves that have no such row.
    fn backward_from(&mut self, key: Option<&[u8]>, inclusive: bool) -> Result<()> {
        match key {
            // The leaf holding `key` may contain it (inclusive) or keys below it.
            Some(k) if inclusive => self.load(Seek::AtOrAfter(k))?,
            Some(k) => self.load(Seek::Before(k))?,
            None => self.load(Seek::Last)?,
        }
        loop {
            let leaf = self.leaf.as_ref().expect("loaded");
            for (b, rows) in leaf.rows.iter().enumerate().rev() {
                let n = match key {
                    None => rows.len(),
                    Some(k) => match rows.search(k) {
                        Ok(i) if inclusive => i + 1,
                        Ok(i) | Err(i) => i,
                    },
                };
                if n > 0 {
                    self.pos = (b, n - 1);
                    self.valid = true;
                    return Ok(());
                }
            }
            match leaf.lo.clone() {
                Some(lo) => self.load(Seek::Before(&lo))?,
                None => {
                    self.valid = false;
                    return Ok(());
                }
            }
        }
    }

    /// Positions at the first row.
    pub fn seek_first(&mut self) -> Result<()> {
        self.forward_from(&[], false)
    }

    /// Positions at the last row.
    pub fn seek_last(&mut self) -> Result<()> {
        self.backward_from(None, false)
    }

    /// Positions at the first row with key >= `key`.
    pub fn seek(&mut self, key: &[u8]) -> Result<()> {
        self.forward_from(key, false)
    }

    /// Positions at the first row with key > `key`.
    pub fn seek_after(&mut self, key: &[u8]) -> Result<()> {
        self.forward_from(key, true)
    }

    /// Positions at the last row with key < `key`.
    pub fn seek_before(&mut self, key: &[u8]) -> Result<()> {
        self.backward_from(Some(key), false)
    }

    /// Positions at the last row with key <= `key`.
    pub fn seek_for_prev(&mut self, key: &[u8]) -> Result<()> {
        self.backward_from(Some(key), true)
    }

    /// Whether the cursor is on a row.
    pub fn valid(&self) -> bool {
        self.valid
    }

    /// The current row's key.
    pub fn key(&self) -> Option<&[u8]> {
        self.current().map(|(k, _)| k)
    }

    /// The current row's value.
    pub fn value(&self) -> Option<&[u8]> {
        self.current().map(|(_, v)| v)
    }

    /// The current row.
    pub fn current(&self) -> Option<(&[u8], &[u8])> {
        if !self.valid {
            return None;
        }
        let leaf = self.leaf.as_ref()?;
        Some(leaf.rows[self.pos.0].row(self.pos.1))
    }

    /// The current row, owned.
    pub fn entry(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.current().map(|(k, v)| (k.to_vec(), v.to_vec()))
    }

    /// Moves to the next row; returns whether the cursor is on a row.
    // Not `Iterator::next`: moving can fail (I/O), and the row is borrowed from the cursor.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<bool> {
        if !self.valid {
            return Ok(false);
        }
        let leaf = self.leaf.as_ref().expect("valid cursor has a leaf");
        let (mut b, mut r) = self.pos;
        r += 1;
        while b < leaf.rows.len() && r >= leaf.rows[b].len() {
            b += 1;
            r = 0;
        }
        if b < leaf.rows.len() {
            self.pos = (b, r);
            return Ok(true);
        }
        let key = leaf.rows[self.pos.0].key(self.pos.1).to_vec();
        self.forward_from(&key, true)?;
        Ok(self.valid)
    }

    /// Moves to the previous row; returns whether the cursor is on a row.
    pub fn prev(&mut self) -> Result<bool> {
        if !self.valid {
            return Ok(false);
        }
        let leaf = self.leaf.as_ref().expect("valid cursor has a leaf");
        let (mut b, r) = self.pos;
        if r > 0 {
            self.pos = (b, r - 1);
            return Ok(true);
        }
        while b > 0 {
            b -= 1;
            if !leaf.rows[b].is_empty() {
                self.pos = (b, leaf.rows[b].len() - 1);
                return Ok(true);
            }
        }
        let key = leaf.rows[self.pos.0].key(self.pos.1).to_vec();
        self.backward_from(Some(&key), false)?;
        Ok(self.valid)
    }

    fn below_upper(&self, key: &[u8]) -> bool {
        match &self.upper {
            Bound::Unbounded => true,
            Bound::Included(h) => key <= h.as_slice(),
            Bound::Excluded(h) => key < h.as_slice(),
        }
    }

    /// Calls `f` on the current row and every following row below the upper bound, until `f`
    /// returns false. Walks each materialized leaf directly (the fast path for scans).
    pub fn for_each_forward(&mut self, f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        while self.valid {
            let leaf = self.leaf.as_ref().expect("valid cursor has a leaf");
            let (b0, r0) = self.pos;
            let mut last: Option<&[u8]> = None;
            for (b, rows) in leaf.rows.iter().enumerate().skip(b0) {
                let start = if b == b0 { r0 } else { 0 };
                for r in start..rows.len() {
                    let (k, v) = rows.row(r);
                    if !self.below_upper(k) || !f(k, v) {
                        self.valid = false;
                        return Ok(());
                    }
                    last = Some(k);
                }
            }
            match (last, leaf.hi.clone()) {
                (_, None) => self.valid = false,
                (_, Some(hi)) => {
                    if !self.below_upper(&hi) {
                        self.valid = false;
                    } else {
                        self.forward_from(&hi, false)?;
                    }
                }
            }
        }
        Ok(())
    }
}
