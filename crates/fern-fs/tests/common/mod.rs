//! Shared test fixtures: a file system on the memory backend, and a store wrapper that counts
//! reads so tests can assert "no read before write".
//!
//! Backend hook: stores come from `crate::open_store`. Each test root here says
//! `use common::mem_store as open_store;`; a test crate of another backend includes a root with
//! `#[path]` and defines its own `open_store` at its crate root (fern-kv-tree does this).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fern_fs::path::PathFs;
use fern_fs::{Cred, Fs, MkfsOptions};
use fern_kv::mem::MemStore;
use fern_kv::{
    Direction, KeyRange, KvRead, KvResult, KvStore, KvTxn, Limits, TreeId, UpdateRegistry,
    WriteBatch, WriteOptions,
};

/// Proptest cases per property: FERN_PROPTEST_CASES, default 96.
pub fn proptest_cases() -> u32 {
    std::env::var("FERN_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

pub struct Env {
    pub store: Arc<CountingStore>,
    pub fs: Arc<Fs>,
    pub p: PathFs,
}

pub fn env() -> Env {
    env_with(MkfsOptions::default())
}

pub fn env_with(opts: MkfsOptions) -> Env {
    env_limited(opts, Limits::EMBEDDED)
}

/// A file system on a memory store that enforces `limits` (e.g. etcd's 128 ops per batch).
pub fn env_limited(opts: MkfsOptions, limits: Limits) -> Env {
    let store = Arc::new(CountingStore::new(crate::open_store(
        fern_fs::registry(),
        limits,
    )));
    Fs::mkfs(&*store, opts).expect("mkfs");
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    let p = PathFs::new(fs.clone(), Cred::root());
    Env { store, fs, p }
}

impl Env {
    /// Drops this mount (open handles are abandoned, as at a crash) and mounts again.
    pub fn remount(self) -> Env {
        let store = self.store.clone();
        drop(self);
        let fs = Arc::new(Fs::mount(store.clone()).expect("remount"));
        let p = PathFs::new(fs.clone(), Cred::root());
        Env { store, fs, p }
    }

    /// Whether this mount is its store's only writer (no session: the embedded backends), so
    /// fern-fs trusts its single-writer caches and the "reads nothing" assertions apply. On a
    /// shared store (etcd) every such answer is a read (docs/distributed.md §7).
    pub fn sole(&self) -> bool {
        KvStore::session(&*self.store).expect("session").is_none()
    }

    /// Number of keys in a tree.
    pub fn keys_in(&self, tree: &str) -> usize {
        let t = self.store.tree(tree).expect("tree");
        self.store
            .inner
            .scan(t, &KeyRange::all(), Direction::Forward, usize::MAX)
            .expect("scan")
            .len()
    }
}

/// The memory backend, enforcing `limits`.
pub fn mem_store(registry: UpdateRegistry, limits: Limits) -> Box<dyn KvStore> {
    Box::new(MemStore::with_limits(registry, limits))
}

/// Delegates to a store, counting reads (store-level and inside transactions); range scans
/// are also counted apart.
pub struct CountingStore {
    pub inner: Box<dyn KvStore>,
    counts: Counts,
    /// Claim expensive point reads, as a remote store (etcd) does.
    pub remote: std::sync::atomic::AtomicBool,
    /// Microseconds each point read outside a transaction waits before returning its answer:
    /// widens the window between a read and its use, for race tests.
    pub read_delay_us: std::sync::atomic::AtomicU64,
}

/// The read counters of a [`CountingStore`], shared with its transactions: every read through
/// either goes through [`Counts::get`] or [`Counts::scan`].
#[derive(Default)]
struct Counts {
    reads: AtomicUsize,
    scans: AtomicUsize,
    extent_reads: AtomicUsize,
    /// Of those, extents read by fern-fs's read-ahead threads (named `fernfs-readahead`).
    extent_reads_ahead: AtomicUsize,
    /// Range deletes in batches written or committed.
    range_deletes: AtomicUsize,
    /// Trees written, summed over batches written or committed (each tree a batch touches
    /// costs the engine a root update).
    trees_written: AtomicUsize,
}

impl Counts {
    fn get(
        &self,
        r: &(impl KvRead + ?Sized),
        tree: TreeId,
        key: &[u8],
    ) -> KvResult<Option<Vec<u8>>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        r.get(tree, key)
    }

    fn scan(
        &self,
        r: &(impl KvRead + ?Sized),
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.scans.fetch_add(1, Ordering::SeqCst);
        r.scan(tree, range, dir, limit)
    }

    fn written(&self, batch: &WriteBatch) {
        let n = batch
            .ops()
            .iter()
            .filter(|op| matches!(op, fern_kv::Op::DeleteRange { .. }))
            .count();
        self.range_deletes.fetch_add(n, Ordering::SeqCst);
        let mut trees: Vec<_> = batch.ops().iter().map(|op| op.tree()).collect();
        trees.sort_unstable();
        trees.dedup();
        self.trees_written.fetch_add(trees.len(), Ordering::SeqCst);
    }

    fn read_extent(
        &self,
        r: &(impl KvRead + ?Sized),
        x: &fern_kv::ExtentRef,
        buf: &mut [u8],
    ) -> KvResult<()> {
        self.extent_reads.fetch_add(1, Ordering::SeqCst);
        if std::thread::current().name() == Some("fernfs-readahead") {
            self.extent_reads_ahead.fetch_add(1, Ordering::SeqCst);
        }
        r.read_extent(x, buf)
    }
}

impl CountingStore {
    pub fn new(inner: Box<dyn KvStore>) -> Self {
        Self {
            inner,
            counts: Counts::default(),
            remote: std::sync::atomic::AtomicBool::new(false),
            read_delay_us: std::sync::atomic::AtomicU64::new(0),
        }
    }
    pub fn reads(&self) -> usize {
        self.counts.reads.load(Ordering::SeqCst)
    }
    pub fn scans(&self) -> usize {
        self.counts.scans.load(Ordering::SeqCst)
    }
    /// Extents read (counted apart from `reads`: rows and extents are different costs).
    pub fn extent_reads(&self) -> usize {
        self.counts.extent_reads.load(Ordering::SeqCst)
    }
    /// Extents read by fern-fs's read-ahead threads (counted in `extent_reads` too).
    pub fn extent_reads_ahead(&self) -> usize {
        self.counts.extent_reads_ahead.load(Ordering::SeqCst)
    }
    /// Range deletes written (each stays in the engine's buffers until flushed to the leaves).
    pub fn range_deletes(&self) -> usize {
        self.counts.range_deletes.load(Ordering::SeqCst)
    }
    /// Trees written, summed over the batches written and committed.
    pub fn trees_written(&self) -> usize {
        self.counts.trees_written.load(Ordering::SeqCst)
    }
}

impl KvRead for CountingStore {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        let got = self.counts.get(&*self.inner, tree, key);
        let delay = self.read_delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            // The answer is as of before the wait: a write may commit before the reader uses it.
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        got
    }
    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.counts.scan(&*self.inner, tree, range, dir, limit)
    }
    fn read_extent(&self, r: &fern_kv::ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.counts.read_extent(&*self.inner, r, buf)
    }
}

impl KvStore for CountingStore {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        self.inner.tree(name)
    }
    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        self.counts.written(&batch);
        self.inner.write(batch, opts)
    }
    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        Ok(Box::new(CountingTxn {
            inner: self.inner.begin()?,
            counts: &self.counts,
        }))
    }
    fn sync(&self) -> KvResult<()> {
        self.inner.sync()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn space_used(&self) -> Option<u64> {
        self.inner.space_used()
    }

    fn space(&self) -> Option<fern_kv::StoreSpace> {
        self.inner.space()
    }

    fn session(&self) -> KvResult<Option<&dyn fern_kv::KvSession>> {
        self.inner.session()
    }

    fn point_reads_cheap(&self) -> bool {
        !self.remote.load(Ordering::SeqCst) && self.inner.point_reads_cheap()
    }

    fn extents(&self) -> KvResult<Vec<fern_kv::ExtentRef>> {
        self.inner.extents()
    }
}

struct CountingTxn<'a> {
    inner: Box<dyn KvTxn + 'a>,
    counts: &'a Counts,
}

impl KvRead for CountingTxn<'_> {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.counts.get(&*self.inner, tree, key)
    }
    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.counts.scan(&*self.inner, tree, range, dir, limit)
    }
    fn read_extent(&self, r: &fern_kv::ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.counts.read_extent(&*self.inner, r, buf)
    }
}

impl KvTxn for CountingTxn<'_> {
    fn batch(&mut self) -> &mut WriteBatch {
        self.inner.batch()
    }
    fn commit(mut self: Box<Self>, opts: WriteOptions) -> KvResult<()> {
        self.counts.written(self.inner.batch());
        self.inner.commit(opts)
    }
}
