//! The public handle to one named tree ([`Tree`]: point reads, cursors, single-op writes) and
//! the batch of operations applied atomically across trees ([`WriteBatch`]). Both are thin:
//! every read and write goes through the environment (env.rs), which owns locking, logging and
//! durability; the algorithms are betree/'s.

use std::ops::Bound;
use std::sync::Arc;

use crate::betree;
use crate::cursor::Cursor;
use crate::env::Env;
use crate::error::Result;
use crate::extent::{ExtentRef, EXTENT_REF_LEN};
use crate::ids::UpsertId;
use crate::msg::Op;

/// A handle to one named tree. Cheap to clone; usable from many threads.
#[derive(Clone)]
pub struct Tree {
    pub(crate) env: Env,
    pub(crate) idx: usize,
    pub(crate) name: Arc<str>,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree").field("name", &self.name).finish()
    }
}

impl Tree {
    /// The tree's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The environment this tree belongs to.
    pub fn env(&self) -> &Env {
        &self.env
    }

    fn write1(&self, op: Op) -> Result<()> {
        let mut b = WriteBatch::new();
        b.ops.push((self.clone(), op));
        self.env.write(b)
    }

    /// Sets `key` to `value`.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write1(Op::Insert {
            key: key.to_vec(),
            value: value.to_vec(),
        })
    }

    /// Removes `key` (a blind delete: no read).
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.write1(Op::Delete { key: key.to_vec() })
    }

    /// Queues upsert function `id` with `arg` for `key`; applied lazily, never read here.
    pub fn upsert(&self, key: &[u8], id: UpsertId, arg: &[u8]) -> Result<()> {
        self.write1(Op::Upsert {
            key: key.to_vec(),
            id,
            arg: arg.to_vec(),
        })
    }

    /// Removes every key in `[lo, hi)` with one message.
    pub fn delete_range(&self, lo: &[u8], hi: &[u8]) -> Result<()> {
        self.write1(Op::DeleteRange {
            lo: lo.to_vec(),
            hi: hi.to_vec(),
        })
    }

    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.env.read(self, |ctx, root| betree::get(ctx, root, key))
    }

    /// Calls `f` for every row in the range, in key order, until it returns false.
    ///
    /// Rows are produced one leaf at a time and no lock is held while `f` runs, so `f` may
    /// write to the environment (it may or may not see its own writes in later leaves).
    pub fn scan(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let mut cur = self.cursor();
        cur.set_upper(hi);
        match lo {
            Bound::Unbounded => cur.seek_first()?,
            Bound::Included(k) => cur.seek(k)?,
            Bound::Excluded(k) => cur.seek_after(k)?,
        }
        cur.for_each_forward(&mut f)
    }

    /// Pushes every buffered message of this tree down to the leaves and merges what became
    /// small (PerconaFT's "optimize"). Queries never need it; it makes later scans cheaper and
    /// returns the space of deleted rows sooner.
    pub fn optimize(&self) -> Result<()> {
        self.env.restructure(self, betree::optimize)
    }

    /// A cursor positioned nowhere; seek it first.
    pub fn cursor(&self) -> Cursor {
        Cursor::new(self.clone())
    }

    /// All rows in `[lo, hi)`, collected (convenience for tests and small ranges).
    pub fn range_vec(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        self.scan(lo, hi, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })?;
        Ok(out)
    }

    /// The first row with key greater than `key`.
    pub fn successor(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut c = self.cursor();
        c.seek_after(key)?;
        Ok(c.entry())
    }

    /// The last row with key less than `key`.
    pub fn predecessor(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut c = self.cursor();
        c.seek_before(key)?;
        Ok(c.entry())
    }
}

/// Operations applied together by [`Env::write`].
#[derive(Default, Debug)]
pub struct WriteBatch {
    pub(crate) ops: Vec<(Tree, Op)>,
    /// Data of the extents `insert_extent` added: (index of its insert in `ops`, bytes).
    pub(crate) extents: Vec<(usize, Vec<u8>)>,
    /// Extents this batch frees (X5).
    pub(crate) frees: Vec<ExtentRef>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `ops` operations (a translated batch knows its count).
    pub fn with_capacity(ops: usize) -> Self {
        WriteBatch {
            ops: Vec::with_capacity(ops),
            ..Self::default()
        }
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.frees.is_empty()
    }

    /// Adds a data extent (docs/format.md, "Data extents"): `data` (1 ..= 8 MiB) is written
    /// once, to fresh space of the block file, before the batch's log record, which holds only
    /// where it is; the row `key` of `t` gets the value `prefix` followed by the 16-byte
    /// [`ExtentRef`]. The caller owns the reference: it frees the extent (with
    /// [`free_extent`](Self::free_extent)) in the batch that deletes or replaces the row (X9).
    pub fn insert_extent(&mut self, t: &Tree, key: &[u8], prefix: &[u8], data: Vec<u8>) {
        let mut value = Vec::with_capacity(prefix.len() + EXTENT_REF_LEN);
        value.extend_from_slice(prefix);
        value.extend_from_slice(&[0; EXTENT_REF_LEN]);
        self.extents.push((self.ops.len(), data));
        self.ops.push((
            t.clone(),
            Op::Insert {
                key: key.to_vec(),
                value,
            },
        ));
    }

    /// Frees a live data extent (X5): the batch fails with `InvalidArgument`, writing
    /// nothing, if it is not live or named twice. A batch that frees must also change a row.
    /// The space is reused only after a checkpoint that begins after this batch.
    pub fn free_extent(&mut self, r: ExtentRef) {
        self.frees.push(r);
    }

    /// Adds an insert.
    pub fn insert(&mut self, t: &Tree, key: &[u8], value: &[u8]) {
        self.ops.push((
            t.clone(),
            Op::Insert {
                key: key.to_vec(),
                value: value.to_vec(),
            },
        ));
    }

    /// Adds a delete.
    pub fn delete(&mut self, t: &Tree, key: &[u8]) {
        self.ops.push((t.clone(), Op::Delete { key: key.to_vec() }));
    }

    /// Adds an upsert.
    pub fn upsert(&mut self, t: &Tree, key: &[u8], id: UpsertId, arg: &[u8]) {
        self.ops.push((
            t.clone(),
            Op::Upsert {
                key: key.to_vec(),
                id,
                arg: arg.to_vec(),
            },
        ));
    }

    /// Adds a range delete of `[lo, hi)`.
    pub fn delete_range(&mut self, t: &Tree, lo: &[u8], hi: &[u8]) {
        self.ops.push((
            t.clone(),
            Op::DeleteRange {
                lo: lo.to_vec(),
                hi: hi.to_vec(),
            },
        ));
    }
}
