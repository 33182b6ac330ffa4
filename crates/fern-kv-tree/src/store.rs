//! [`TreeStore`]: the fern-kv [`KvStore`] over one fern-tree environment.
//!
//! Owns the mapping from [`TreeId`] to engine tree handles, the translation of fern-kv batches
//! into engine batches, the conflict tracker of optimistic transactions and the apply gate that
//! makes batches atomic to multi-leaf scans. It must never emulate what the engine does
//! natively (upserts and range deletes are engine messages) and never read data the engine
//! does not hand it (no private access to nodes).
//!
//! # Locking
//!
//! `gate` is a reader-writer lock. Applying a batch (plain write or transaction commit) holds it
//! exclusively: conflict validation, `Env::write` and `ConflictTracker::record` happen together,
//! so no commit slips between validation and application, and the tracker's sequence advances
//! only after the batch is visible to readers (a transaction that begins in between sees an
//! old sequence, which can only cause a spurious conflict, never a missed one). Scans hold it
//! shared: the engine materializes one leaf at a time and releases its own lock between
//! leaves, so without the gate a scan spanning several leaves could see half of a batch. Point
//! reads do not take it: `Env::write` holds the engine's state lock for the whole batch and a
//! point read holds it shared, so a get is already atomic against a batch.

use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fern_kv::occ::{ConflictTracker, OccBackend, OccTxn};
use fern_kv::{
    Direction, ExtentRef, KeyRange, KvError, KvRead, KvResult, KvStore, KvTxn, Limits, Op,
    StoreSpace, TreeId, UpdateRegistry, WriteBatch, WriteOptions,
};
use fern_tree::device::BlockDevice;
use fern_tree::{Env, Options, UpsertId};
use parking_lot::RwLock;

use crate::error::map_error;

/// What one atomic batch may hold on fern-tree: no bound on ops or bytes (a batch is one set
/// of messages in memory), and the engine's own key and value bounds.
pub const ENGINE_LIMITS: Limits = Limits {
    max_ops: None,
    max_bytes: None,
    max_key_len: fern_tree::MAX_KEY_LEN,
    max_value_len: fern_tree::MAX_VALUE_LEN,
    extents: Some(fern_tree::MAX_EXTENT_LEN),
};

#[derive(Default)]
struct Trees {
    by_name: HashMap<String, TreeId>,
    handles: Vec<fern_tree::Tree>,
}

/// A [`KvStore`] on a fern-tree [`Env`]: each fern-kv tree is a named tree of the environment,
/// each batch one atomic engine batch, each upsert function registered with the engine under
/// the same `u32` id.
pub struct TreeStore {
    env: Env,
    trees: RwLock<Trees>,
    registry: UpdateRegistry,
    tracker: ConflictTracker,
    /// Exclusive while a batch is applied; shared while a scan collects (see module docs).
    gate: RwLock<()>,
    limits: Limits,
}

impl std::fmt::Debug for TreeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeStore")
            .field("env", &self.env)
            .field("registry", &self.registry)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Engine options with the default shape, a cache of `cache_bytes` and every function of
/// `registry` registered under its id.
/// The engine options of a store: the file system's codec (a store holds a file system's
/// trees; docs/design.md §6, "Compression"), everything else the engine's defaults.
fn options(cache_bytes: usize) -> Options {
    Options {
        cache_bytes,
        compression: fern_tree::Compression::FILE_SYSTEM,
        ..Options::default()
    }
}

fn with_registry(mut opts: Options, registry: &UpdateRegistry) -> Options {
    for id in registry.ids() {
        if let Some(f) = registry.get(id) {
            // fern-kv's UpdateFn and fern-tree's UpsertFn are the same type.
            opts.register_upsert(UpsertId(id.0), Arc::clone(f));
        }
        if let Some(m) = registry.merge_fn(id) {
            opts.register_merge(UpsertId(id.0), Arc::clone(m));
        }
    }
    opts
}

impl TreeStore {
    /// Creates a new environment in the file at `path` (absent or empty) with a node cache of
    /// `cache_bytes` (at least 4 MiB with the default 1 MiB nodes).
    pub fn create(
        path: impl AsRef<Path>,
        cache_bytes: usize,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        Self::create_with(path, options(cache_bytes), registry)
    }

    /// Opens the environment in the file at `path`.
    pub fn open(
        path: impl AsRef<Path>,
        cache_bytes: usize,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        Self::open_with(path, options(cache_bytes), registry)
    }

    /// Opens the environment at `path`, creating it first if the file is absent or empty.
    pub fn open_or_create(
        path: impl AsRef<Path>,
        cache_bytes: usize,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        let path = path.as_ref();
        let fresh = match std::fs::metadata(path) {
            Ok(m) => m.len() == 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(KvError::Io(e)),
        };
        if fresh {
            Self::create(path, cache_bytes, registry)
        } else {
            Self::open(path, cache_bytes, registry)
        }
    }

    /// Creates a new environment on an empty device (e.g. `MemDevice`, `CrashDevice`).
    pub fn create_on(
        dev: Arc<dyn BlockDevice>,
        cache_bytes: usize,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        Self::create_on_with(dev, options(cache_bytes), registry)
    }

    /// Opens the environment on a device.
    pub fn open_on(
        dev: Arc<dyn BlockDevice>,
        cache_bytes: usize,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        Self::open_on_with(dev, options(cache_bytes), registry)
    }

    /// [`TreeStore::create`] with full engine options (node shape, compression); the
    /// functions of `registry` are added to `opts.upserts`.
    pub fn create_with(
        path: impl AsRef<Path>,
        opts: Options,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        let env = Env::create(path, with_registry(opts, &registry)).map_err(map_error)?;
        Ok(Self::assemble(env, registry))
    }

    /// [`TreeStore::open`] with full engine options.
    pub fn open_with(
        path: impl AsRef<Path>,
        opts: Options,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        let env = Env::open(path, with_registry(opts, &registry)).map_err(map_error)?;
        Ok(Self::assemble(env, registry))
    }

    /// [`TreeStore::create_on`] with full engine options.
    pub fn create_on_with(
        dev: Arc<dyn BlockDevice>,
        opts: Options,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        let env = Env::create_on(dev, with_registry(opts, &registry)).map_err(map_error)?;
        Ok(Self::assemble(env, registry))
    }

    /// [`TreeStore::open_on`] with full engine options.
    pub fn open_on_with(
        dev: Arc<dyn BlockDevice>,
        opts: Options,
        registry: UpdateRegistry,
    ) -> KvResult<Self> {
        let env = Env::open_on(dev, with_registry(opts, &registry)).map_err(map_error)?;
        Ok(Self::assemble(env, registry))
    }

    fn assemble(env: Env, registry: UpdateRegistry) -> Self {
        TreeStore {
            env,
            trees: RwLock::new(Trees::default()),
            registry,
            tracker: ConflictTracker::new(),
            gate: RwLock::new(()),
            limits: ENGINE_LIMITS,
        }
    }

    /// The same store enforcing `limits` where they are stricter than the engine's (e.g.
    /// etcd's 128 ops per batch, to test a caller's step splitting on a real engine).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = self.limits.tightened(limits);
        self
    }

    /// The engine environment (statistics, tree names). Writing through it bypasses the
    /// store's conflict tracking, so transactions would not see those writes as conflicts.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// Makes everything durable and closes the environment. Dropping the store without closing
    /// also checkpoints, best effort, without reporting failure.
    pub fn close(self) -> KvResult<()> {
        self.env.close().map_err(map_error)
    }

    /// The engine handle behind `id`.
    fn handle(&self, id: TreeId) -> KvResult<fern_tree::Tree> {
        self.trees
            .read()
            .handles
            .get(id.0 as usize)
            .cloned()
            .ok_or(KvError::InvalidTree(id))
    }

    /// Checks `batch` and builds the engine batch, before any lock is taken. Inverted or empty
    /// range deletes remove nothing, so they are left out (the engine is never asked to
    /// interpret them).
    ///
    /// `data` is the extents' bytes, moved out of an owned batch
    /// ([`WriteBatch::take_extent_data`]); `None` copies them from `batch`.
    fn translate(
        &self,
        batch: &WriteBatch,
        data: Option<Vec<(usize, Vec<u8>)>>,
    ) -> KvResult<fern_tree::WriteBatch> {
        let data = data.unwrap_or_else(|| batch.extent_puts().to_vec());
        let trees = self.trees.read();
        let handle = |id: TreeId| {
            trees
                .handles
                .get(id.0 as usize)
                .ok_or(KvError::InvalidTree(id))
        };
        let mut out = fern_tree::WriteBatch::with_capacity(batch.ops().len());
        let mut extents = data.into_iter().peekable();
        for (i, op) in batch.ops().iter().enumerate() {
            let t = handle(op.tree())?;
            match op {
                Op::Put { key, value, .. } => match extents.next_if(|(at, _)| *at == i) {
                    // The engine appends the reference to the prefix itself.
                    Some((_, data)) => out.insert_extent(
                        t,
                        key,
                        &value[..value.len() - fern_kv::EXTENT_REF_LEN],
                        data,
                    ),
                    None => out.insert(t, key, value),
                },
                Op::Delete { key, .. } => out.delete(t, key),
                Op::Upsert { key, func, arg, .. } => {
                    if self.registry.get(*func).is_none() {
                        return Err(KvError::UnknownUpdateFn(*func));
                    }
                    out.upsert(t, key, UpsertId(func.0), arg);
                }
                Op::DeleteRange { lo, hi, .. } => {
                    if lo < hi {
                        out.delete_range(t, lo, hi);
                    }
                }
            }
        }
        for r in batch.extent_frees() {
            out.free_extent(engine_ref(r)?);
        }
        Ok(out)
    }

    /// Applies a translated batch and records it for conflict detection. The caller holds
    /// `gate` exclusively.
    fn apply_locked(
        &self,
        batch: &WriteBatch,
        engine: fern_tree::WriteBatch,
        opts: WriteOptions,
    ) -> KvResult<()> {
        let r = match opts.frees {
            // Deletes may use the engine's reserve on a full image (format.md, B12).
            Some(bytes) => self.env.write_releasing(engine, bytes),
            None => self.env.write(engine),
        }
        .map_err(|e| match e {
            // The engine refuses a free of an extent that is not live before logging (X5).
            fern_tree::Error::InvalidArgument(why) if batch.has_extents() => {
                KvError::InvalidExtent(why)
            }
            e => map_error(e),
        });
        // Recorded even on failure: a failed engine write may have applied part of the batch
        // before poisoning the environment, and an extra record costs at most a spurious
        // conflict.
        self.tracker.record(batch);
        r
    }

    /// Makes every write that returned so far durable.
    ///
    /// A sync of the engine's write-ahead log: everything written before the call is durable
    /// when it returns (concurrent callers share one fsync through group commit). Checkpoints
    /// stay the engine's business. This function is the only place that knows.
    fn make_durable(&self) -> KvResult<()> {
        self.env.sync().map_err(map_error)
    }

    fn read_scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let t = self.handle(tree)?;
        if limit == 0 || range.is_empty() {
            return Ok(Vec::new());
        }
        let _shared = self.gate.read();
        match dir {
            Direction::Forward => scan_forward(&t, range, limit),
            Direction::Reverse => scan_reverse(&t, range, limit),
        }
    }
}

/// The engine's reference behind a fern-kv one (the same 16 bytes, format.md "Extent
/// reference").
fn engine_ref(r: &ExtentRef) -> KvResult<fern_tree::ExtentRef> {
    fern_tree::ExtentRef::decode(&r.0).map_err(KvError::InvalidExtent)
}

fn scan_forward(
    t: &fern_tree::Tree,
    range: &KeyRange,
    limit: usize,
) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let (lo, hi) = range.as_bounds();
    let mut out = Vec::new();
    t.scan(lo, hi, |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        out.len() < limit
    })
    .map_err(map_error)?;
    Ok(out)
}

fn scan_reverse(
    t: &fern_tree::Tree,
    range: &KeyRange,
    limit: usize,
) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut c = t.cursor();
    match &range.hi {
        Bound::Unbounded => c.seek_last(),
        Bound::Included(k) => c.seek_for_prev(k),
        Bound::Excluded(k) => c.seek_before(k),
    }
    .map_err(map_error)?;
    let mut out = Vec::new();
    while let Some((k, v)) = c.current() {
        let above_lo = match &range.lo {
            Bound::Unbounded => true,
            Bound::Included(l) => k >= l.as_slice(),
            Bound::Excluded(l) => k > l.as_slice(),
        };
        if !above_lo {
            break;
        }
        out.push((k.to_vec(), v.to_vec()));
        if out.len() == limit || !c.prev().map_err(map_error)? {
            break;
        }
    }
    Ok(out)
}

impl KvRead for TreeStore {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.handle(tree)?.get(key).map_err(map_error)
    }

    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.env
            .read_extent(&engine_ref(r)?, buf)
            .map_err(|e| match e {
                fern_tree::Error::InvalidArgument(why) => KvError::InvalidExtent(why),
                e => map_error(e),
            })
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.read_scan(tree, range, dir, limit)
    }
}

impl KvStore for TreeStore {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        if let Some(id) = self.trees.read().by_name.get(name) {
            return Ok(*id);
        }
        let mut trees = self.trees.write();
        if let Some(id) = trees.by_name.get(name) {
            return Ok(*id);
        }
        let handle = self.env.tree(name).map_err(|e| match e {
            // Names the engine cannot hold (empty, over 255 bytes): unknown and uncreatable.
            fern_tree::Error::InvalidArgument(_) => KvError::UnknownTree(name.to_owned()),
            e => map_error(e),
        })?;
        let id = TreeId(
            u32::try_from(trees.handles.len())
                .map_err(|_| KvError::UnknownTree(name.to_owned()))?,
        );
        trees.handles.push(handle);
        trees.by_name.insert(name.to_owned(), id);
        Ok(id)
    }

    fn write(&self, mut batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        // Owned: the extents' bytes move to the engine instead of being copied.
        batch.check(&self.limits)?;
        let data = batch.take_extent_data();
        let engine = self.translate(&batch, Some(data))?;
        self.apply_engine(&batch, engine, opts, &|| Ok(()))
    }

    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        Ok(Box::new(OccTxn::begin(self)))
    }

    fn sync(&self) -> KvResult<()> {
        self.make_durable()
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn extent_buffer(&self, len: usize) -> Vec<u8> {
        self.env().extent_buffer(len)
    }

    fn space_used(&self) -> Option<u64> {
        // Every allocated extent (nodes, block tables, the log region), not the file length:
        // holes left by freed nodes are reused before the file grows.
        Some(self.env().stats().file.allocated_bytes)
    }

    fn point_reads_cheap(&self) -> bool {
        // A point read walks one root-to-leaf path and applies the messages for one key; a
        // scan materializes a leaf window with every pending message for its range.
        true
    }

    fn extents(&self) -> KvResult<Vec<ExtentRef>> {
        Ok(self
            .env
            .extents()
            .iter()
            .map(|r| ExtentRef(r.encode()))
            .collect())
    }

    fn space(&self) -> Option<StoreSpace> {
        let s = self.env.space();
        Some(StoreSpace {
            capacity: s.capacity,
            used: s.used,
            available: s.available,
        })
    }
}

impl OccBackend for TreeStore {
    fn tracker(&self) -> &ConflictTracker {
        &self.tracker
    }

    fn apply_validated(
        &self,
        batch: &WriteBatch,
        opts: WriteOptions,
        validate: &dyn Fn() -> KvResult<()>,
    ) -> KvResult<()> {
        batch.check(&self.limits)?;
        let engine = self.translate(batch, None)?;
        self.apply_engine(batch, engine, opts, validate)
    }
}

impl TreeStore {
    /// Applies a translated batch under the gate after `validate`, then syncs if asked.
    fn apply_engine(
        &self,
        batch: &WriteBatch,
        engine: fern_tree::WriteBatch,
        opts: WriteOptions,
        validate: &dyn Fn() -> KvResult<()>,
    ) -> KvResult<()> {
        {
            let _exclusive = self.gate.write();
            validate()?;
            self.apply_locked(batch, engine, opts)?;
        }
        if opts.sync {
            self.make_durable()?;
        }
        Ok(())
    }
}
