//! The environment: named trees sharing one block file, one node cache and one MSN sequence;
//! atomic write batches across trees; checkpoints; open and close.
//!
//! Owns the catalog (tree names → root node ids, next MSN, compression), which is stored as the
//! block file's meta blob in every checkpoint, and the rule that a failed write poisons the
//! environment (invariant E2). Never: touches node internals (tree.rs) or block placement
//! (blockfile.rs).

use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::blockfile::{BlockFile, BlockFileStats};
use crate::buffer::MsgBuffer;
use crate::cache::{Cache, CacheStats};
use crate::codec::Compression;
use crate::cursor::Cursor;
use crate::device::{BlockDevice, FileDevice};
use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, NodeId, UpsertId};
use crate::msg::{Op, UpsertFn, UpsertRegistry};
use crate::node::Node;
use crate::tree::{self, Ctx, Shape};
use crate::varint::{put_varint, Reader};

/// Options of an environment. Shape options apply when it is created; compression is
/// remembered in the image.
#[derive(Clone, Debug)]
pub struct Options {
    /// Hard bound on the memory the node cache uses, in bytes.
    pub cache_bytes: usize,
    /// Target size of a node: leaves split above it; internal nodes flush above it.
    pub node_bytes: usize,
    /// Target size of a leaf partition (the unit a point read decompresses).
    pub basement_bytes: usize,
    /// Most children an internal node has before it splits.
    pub fanout: usize,
    /// Compression for new images.
    pub compression: Compression,
    /// Registered upsert functions.
    pub upserts: UpsertRegistry,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            node_bytes: 1 << 20,
            basement_bytes: 64 << 10,
            fanout: 16,
            compression: Compression::Lz4,
            upserts: UpsertRegistry::default(),
        }
    }
}

impl Options {
    /// Registers an upsert function under a stable id.
    pub fn register_upsert(&mut self, id: UpsertId, f: UpsertFn) {
        self.upserts.register(id, f);
    }

    fn validate(&self) -> Result<()> {
        if self.node_bytes < 4096 || self.basement_bytes < 512 || self.fanout < 3 {
            return Err(Error::InvalidArgument(format!(
                "node_bytes must be >= 4096, basement_bytes >= 512, fanout >= 3 (got {}, {}, {})",
                self.node_bytes, self.basement_bytes, self.fanout
            )));
        }
        if self.cache_bytes < 4 * self.node_bytes {
            return Err(Error::InvalidArgument(format!(
                "cache_bytes ({}) must hold at least 4 nodes of {} bytes",
                self.cache_bytes, self.node_bytes
            )));
        }
        Ok(())
    }
}

/// Statistics of an open environment.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Node cache counters.
    pub cache: CacheStats,
    /// Block file counters.
    pub file: BlockFileStats,
    /// Messages accepted since open.
    pub messages: u64,
}

struct TreeEntry {
    name: String,
    root: NodeId,
}

struct State {
    trees: Vec<TreeEntry>,
    by_name: HashMap<String, usize>,
    next_msn: u64,
    messages: u64,
}

pub(crate) struct Inner {
    state: RwLock<State>,
    cache: Cache,
    bf: Mutex<BlockFile>,
    dev: Arc<dyn BlockDevice>,
    shape: Shape,
    upserts: UpsertRegistry,
    poisoned: Mutex<Option<String>>,
    closed: AtomicBool,
}

/// An open environment. Cheap to clone; all clones share the same state.
#[derive(Clone)]
pub struct Env {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("shape", &self.inner.shape)
            .finish()
    }
}

const META_MAGIC: &[u8; 4] = b"FCAT";
const META_VERSION: u32 = 1;

fn encode_meta(state: &State, shape: &Shape) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(META_MAGIC);
    out.extend_from_slice(&META_VERSION.to_le_bytes());
    out.push(shape.compression.to_byte());
    let level = match shape.compression {
        Compression::Zstd { level } => level,
        _ => 0,
    };
    out.extend_from_slice(&level.to_le_bytes());
    out.extend_from_slice(&(shape.node_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(shape.basement_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(shape.fanout as u32).to_le_bytes());
    out.extend_from_slice(&state.next_msn.to_le_bytes());
    out.extend_from_slice(&(state.trees.len() as u32).to_le_bytes());
    for t in &state.trees {
        put_varint(&mut out, t.name.len() as u64);
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&t.root.0.to_le_bytes());
    }
    out
}

fn decode_meta(b: &[u8]) -> Result<(Shape, State)> {
    let what = || "catalog".to_string();
    let mut r = Reader::new(b, &what);
    if r.bytes(4)? != META_MAGIC {
        return Err(r.err("bad magic"));
    }
    let v = r.u32()?;
    if v != META_VERSION {
        return Err(Error::UnsupportedVersion {
            found: v,
            supported: META_VERSION,
        });
    }
    let c = r.u8()?;
    let level = r.u32()? as i32;
    let compression = Compression::from_byte(c, level)
        .ok_or_else(|| r.err(format!("unknown compression {c}")))?;
    let node_bytes = r.u64()? as usize;
    let basement_bytes = r.u64()? as usize;
    let fanout = r.u32()? as usize;
    if node_bytes < 4096 || basement_bytes < 512 || !(3..=1 << 16).contains(&fanout) {
        return Err(r.err("implausible tree shape"));
    }
    let next_msn = r.u64()?;
    let n = r.u32()? as usize;
    let mut trees = Vec::with_capacity(n.min(1024));
    let mut by_name = HashMap::new();
    for i in 0..n {
        let name = std::str::from_utf8(r.len_prefixed(4096)?)
            .map_err(|_| r.err("tree name is not UTF-8"))?
            .to_string();
        let root = NodeId(r.u64()?);
        if by_name.insert(name.clone(), i).is_some() {
            return Err(r.err(format!("tree {name:?} listed twice")));
        }
        trees.push(TreeEntry { name, root });
    }
    Ok((
        Shape {
            node_bytes,
            basement_bytes,
            fanout,
            compression,
        },
        State {
            trees,
            by_name,
            next_msn,
            messages: 0,
        },
    ))
}

impl Env {
    /// Creates a new environment in a file, which must not exist or be empty.
    pub fn create(path: impl AsRef<Path>, opts: Options) -> Result<Env> {
        let path = path.as_ref();
        let dev = FileDevice::create(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Env::create_on(Arc::new(dev), opts)
    }

    /// Opens an existing environment in a file.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Env> {
        let path = path.as_ref();
        let dev = FileDevice::open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Env::open_on(Arc::new(dev), opts)
    }

    /// Creates a new environment on an empty device.
    pub fn create_on(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Env> {
        opts.validate()?;
        let shape = Shape {
            node_bytes: opts.node_bytes,
            basement_bytes: opts.basement_bytes,
            fanout: opts.fanout,
            compression: opts.compression,
        };
        let state = State {
            trees: Vec::new(),
            by_name: HashMap::new(),
            next_msn: 1,
            messages: 0,
        };
        let bf = BlockFile::create(dev.clone(), &encode_meta(&state, &shape))?;
        Ok(Env::assemble(dev, bf, shape, state, opts))
    }

    /// Opens an existing environment on a device.
    pub fn open_on(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Env> {
        let opened = BlockFile::open(dev.clone())?;
        let (shape, state) = decode_meta(&opened.meta)?;
        if opts.cache_bytes < 4 * shape.node_bytes {
            return Err(Error::InvalidArgument(format!(
                "cache_bytes ({}) must hold at least 4 nodes of {} bytes",
                opts.cache_bytes, shape.node_bytes
            )));
        }
        for t in &state.trees {
            if opened.file.loc(t.root).is_none() {
                return Err(Error::corrupt(
                    "catalog",
                    format!(
                        "root node {} of tree {:?} is not in the translation table",
                        t.root, t.name
                    ),
                ));
            }
        }
        Ok(Env::assemble(dev, opened.file, shape, state, opts))
    }

    fn assemble(
        dev: Arc<dyn BlockDevice>,
        bf: BlockFile,
        shape: Shape,
        state: State,
        opts: Options,
    ) -> Env {
        Env {
            inner: Arc::new(Inner {
                state: RwLock::new(state),
                cache: Cache::new(opts.cache_bytes),
                bf: Mutex::new(bf),
                dev,
                shape,
                upserts: opts.upserts,
                poisoned: Mutex::new(None),
                closed: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn ctx(&self) -> Ctx<'_> {
        let i = &self.inner;
        Ctx {
            cache: &i.cache,
            bf: &i.bf,
            dev: &i.dev,
            shape: &i.shape,
            upserts: &i.upserts,
        }
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(why) = self.inner.poisoned.lock().clone() {
            return Err(Error::Poisoned(why));
        }
        if self.inner.closed.load(Ordering::Relaxed) {
            return Err(Error::InvalidArgument("environment is closed".into()));
        }
        Ok(())
    }

    /// Marks the environment unusable for writes after a failure that may have left memory and
    /// disk out of step (invariant E2).
    fn poison<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            let mut p = self.inner.poisoned.lock();
            if p.is_none() {
                *p = Some(e.to_string());
            }
        }
        r
    }

    /// Opens the tree named `name`, creating it if it does not exist.
    pub fn tree(&self, name: &str) -> Result<Tree> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(format!(
                "tree names are 1 to 255 bytes (got {})",
                name.len()
            )));
        }
        if let Some(&i) = self.inner.state.read().by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        self.check_writable()?;
        let mut st = self.inner.state.write();
        if let Some(&i) = st.by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        let ctx = self.ctx();
        let leaf = Node::new_leaf(ctx.new_id());
        let root = leaf.id;
        ctx.put(leaf);
        let i = st.trees.len();
        st.trees.push(TreeEntry {
            name: name.to_string(),
            root,
        });
        st.by_name.insert(name.to_string(), i);
        Ok(self.handle(i, name))
    }

    /// Names of the trees in this environment.
    pub fn tree_names(&self) -> Vec<String> {
        self.inner
            .state
            .read()
            .trees
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    fn handle(&self, idx: usize, name: &str) -> Tree {
        Tree {
            env: self.clone(),
            idx,
            name: Arc::from(name),
        }
    }

    /// Applies a batch atomically: every operation, in order, across any trees of this
    /// environment.
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        if batch.ops.is_empty() {
            return Ok(());
        }
        for (t, op) in &batch.ops {
            if !Arc::ptr_eq(&t.env.inner, &self.inner) {
                return Err(Error::UnknownTree(t.name.to_string()));
            }
            op.validate(&self.inner.upserts)?;
        }
        self.check_writable()?;
        let mut st = self.inner.state.write();
        // Group by tree, keeping order; each gets consecutive MSNs in batch order.
        let mut per_tree: Vec<(usize, MsgBuffer)> = Vec::new();
        for (t, op) in &batch.ops {
            let msn = Msn(st.next_msn);
            st.next_msn += 1;
            match per_tree.iter_mut().find(|(i, _)| *i == t.idx) {
                Some((_, b)) => b.push(op, msn),
                None => {
                    let mut b = MsgBuffer::new();
                    b.push(op, msn);
                    per_tree.push((t.idx, b));
                }
            }
        }
        for (_, b) in per_tree.iter_mut() {
            b.seal();
        }
        st.messages += batch.ops.len() as u64;
        let ctx = self.ctx();
        let result = (|| {
            for (idx, msgs) in &per_tree {
                let root = st.trees[*idx].root;
                st.trees[*idx].root = tree::write(&ctx, root, msgs)?;
            }
            ctx.cache.evict(&|n| ctx.write_node(n))
        })();
        self.poison(result)
    }

    /// Writes every dirty node and commits a new checkpoint. When it returns Ok, everything
    /// written before the call survives a crash.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let st = self.inner.state.write();
        let ctx = self.ctx();
        let result = (|| {
            for n in ctx.cache.dirty() {
                ctx.write_node(&n)?;
                n.set_dirty(false);
            }
            let meta = encode_meta(&st, &self.inner.shape);
            self.inner.bf.lock().checkpoint(Lsn(st.next_msn), &meta)
        })();
        self.poison(result)
    }

    /// Checkpoints and closes. Other clones of this handle can no longer write.
    pub fn close(self) -> Result<()> {
        let r = if self.inner.poisoned.lock().is_some() {
            Ok(())
        } else {
            self.checkpoint()
        };
        self.inner.closed.store(true, Ordering::Relaxed);
        r
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let st = self.inner.state.read();
        Stats {
            cache: self.inner.cache.stats(),
            file: self.inner.bf.lock().stats(),
            messages: st.messages,
        }
    }

    /// Runs a structural change `f` (no logical change to the rows) on a tree's root under the
    /// write lock; `f` returns the new root. A failure poisons the environment.
    pub(crate) fn restructure(
        &self,
        t: &Tree,
        f: impl FnOnce(&Ctx<'_>, NodeId) -> Result<NodeId>,
    ) -> Result<()> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        let root = st
            .trees
            .get(t.idx)
            .ok_or_else(|| Error::UnknownTree(t.name.to_string()))?
            .root;
        let ctx = self.ctx();
        let r = f(&ctx, root).and_then(|new_root| {
            st.trees[t.idx].root = new_root;
            ctx.cache.evict(&|n| ctx.write_node(n))
        });
        self.poison(r)
    }

    /// Runs `f` with the tree's root under the read lock.
    pub(crate) fn read<T>(
        &self,
        t: &Tree,
        f: impl FnOnce(&Ctx<'_>, NodeId) -> Result<T>,
    ) -> Result<T> {
        let st = self.inner.state.read();
        let root = st
            .trees
            .get(t.idx)
            .ok_or_else(|| Error::UnknownTree(t.name.to_string()))?
            .root;
        let ctx = self.ctx();
        let r = f(&ctx, root);
        drop(st);
        // Readers evict clean (and, if they must, dirty) nodes so the bound holds for them too.
        if ctx.cache.over_limit() {
            let ev = ctx.cache.evict(&|n| ctx.write_node(n));
            self.poison(ev)?;
        }
        r
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A handle dropped without close() still gets a best-effort checkpoint, so an embedded
        // user who forgets close() does not lose everything since the last checkpoint.
        if self.closed.load(Ordering::Relaxed) || self.poisoned.lock().is_some() {
            return;
        }
        let st = self.state.get_mut();
        let ctx = Ctx {
            cache: &self.cache,
            bf: &self.bf,
            dev: &self.dev,
            shape: &self.shape,
            upserts: &self.upserts,
        };
        let _ = (|| -> Result<()> {
            for n in ctx.cache.dirty() {
                ctx.write_node(&n)?;
                n.set_dirty(false);
            }
            let meta = encode_meta(st, &self.shape);
            self.bf.lock().checkpoint(Lsn(st.next_msn), &meta)
        })();
    }
}

/// A handle to one named tree. Cheap to clone; usable from many threads.
#[derive(Clone)]
pub struct Tree {
    pub(crate) env: Env,
    pub(crate) idx: usize,
    name: Arc<str>,
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
        self.env.read(self, |ctx, root| tree::get(ctx, root, key))
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
        self.env.restructure(self, tree::optimize)
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
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
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
