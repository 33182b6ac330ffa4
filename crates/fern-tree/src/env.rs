//! The environment: named trees sharing one block file, one node cache, one MSN sequence and
//! one write-ahead log; atomic, logged write batches across trees; group commit; checkpoints;
//! recovery on open (read-write, read-only: W11, or cutting a damaged log: W4); close.
//!
//! Owns the catalog's contents at run time (its encoding is catalog.rs's; it is stored as the
//! block file's meta blob in every checkpoint), the rule that a failed write or sync poisons
//! the environment (invariant E2), and the admission of write batches on a fixed-size image
//! (B11–B13: refuse new data before the reserve, make room with checkpoints and reclamation
//! steps; the arithmetic is space.rs's). Never: touches node internals (betree/), block
//! placement (blockfile.rs) or log framing (wal.rs); never acknowledges a `Sync` commit before
//! its log record is durable (W3); never applies a batch it has not logged first (W2).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::admission::reclaim_before_close;
use crate::betree::{self, Ctx, Shape};
use crate::blockfile::{BlockFile, DATA_START};
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::catalog::{decode_meta, encode_meta, State, TreeEntry, NO_LOG};
use crate::checkpoint::{spawn_checkpointer, Wakeup};
use crate::device::{BlockDevice, FileDevice};
use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, NodeId};
use crate::msg::{Op, UpsertRegistry};
use crate::node::Node;
use crate::options::{Durability, Options, RecoveryReport};
use crate::space::Admission;
use crate::stats::{self, Counters, Stats};
use crate::tree::{Tree, WriteBatch};
use crate::wal::{self, LogRecord, Region, Wal};
use crate::writeback::spawn_writeback;

pub(crate) struct Inner {
    pub(crate) state: RwLock<State>,
    pub(crate) cache: Cache,
    pub(crate) bf: Mutex<BlockFile>,
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) shape: Shape,
    pub(crate) upserts: UpsertRegistry,
    pub(crate) poisoned: Mutex<Option<String>>,
    pub(crate) closed: AtomicBool,
    pub(crate) wal: Wal,
    pub(crate) durability: Durability,
    /// One checkpoint at a time (held for its whole duration; never taken under `state`).
    pub(crate) ckpt_lock: Mutex<()>,
    /// Wakes the checkpoint thread, if there is one.
    pub(crate) ckpt_signal: Option<Arc<Wakeup>>,
    /// Wakes the writeback thread (writeback.rs), if there is one (with the checkpoint thread).
    pub(crate) writeback_signal: Option<Arc<Wakeup>>,
    /// LSN below which this open has returned the log region's bytes to the host (W9).
    pub(crate) log_released: Mutex<u64>,
    /// Opened with `Options::read_only` (W11).
    pub(crate) read_only: bool,
    /// What recovery found (set once by the open).
    pub(crate) recovery: Mutex<RecoveryReport>,
    /// The size nothing is allocated past (B11): the catalog's capacity or the device's,
    /// whichever is smaller; `None` for an image that grows.
    pub(crate) limit: Option<u64>,
    /// Data bytes that releasing batches said they delete since the last reclamation pass.
    pub(crate) freed_hint: std::sync::atomic::AtomicU64,
    /// Set when enough was deleted that the checkpoint thread should push the deletes down.
    pub(crate) reclaim_wanted: AtomicBool,
    /// Data extent bytes bound since the last checkpoint snapshot (X10).
    pub(crate) extent_bytes: std::sync::atomic::AtomicU64,
}

/// Data bytes deleted (as releasing batches report them) after which the deletes are pushed
/// down in the background so that their space is really returned (format.md, B13): this, or
/// a 32nd of a fixed-size image if that is less.
pub(crate) const RECLAIM_AFTER: u64 = 8 << 20;

/// Most rounds (reclaim steps, then two checkpoints) one attempt to make room runs, and the
/// pass at close.
pub(crate) const ROOM_ROUNDS: usize = 64;

/// Most rounds of one background pass (B13): it runs beside writers, so it stops after a
/// bounded amount of work (8 rounds of at most 16 nodes); the next deletes ask again, and
/// close finishes the rest.
pub(crate) const BACKGROUND_ROUNDS: usize = 8;

/// Most log bytes one [`Inner::release_log_step`] punches: writers wait for one step (a few
/// milliseconds of `fallocate` at most), not for the whole release.
pub(crate) const LOG_RELEASE_STEP: u64 = 4 << 20;

impl Inner {
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cache: &self.cache,
            bf: &self.bf,
            dev: &self.dev,
            shape: &self.shape,
            upserts: &self.upserts,
            counters: &self.counters,
        }
    }

    /// Closes: waits for a running checkpoint, stops the background threads, and (unless
    /// poisoned or already closed) commits a final checkpoint. Nothing writes to the image after
    /// this returns.
    pub(crate) fn shutdown(&self) -> Result<()> {
        let _one = self.ckpt_lock.lock();
        if self.closed.swap(true, Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        if let Some(sig) = &self.ckpt_signal {
            sig.nudge();
        }
        if self.poisoned.lock().is_some() {
            return Ok(());
        }
        let st = self.state.write();
        self.checkpoint_locked(&st)?;
        // A second checkpoint (nothing is dirty now: a table, a meta blob, two syncs) makes
        // both header slots name the final state, so an unmounted image keeps no log records
        // and no node versions only the older checkpoint referenced (W9, B4).
        if self.bf.lock().oldest_checkpoint_lsn() < self.wal.end() {
            self.checkpoint_locked(&st)?;
        }
        Ok(())
    }

    /// One round of the periodic flusher: syncs the log if anything in it, records or a sync
    /// mark, is not durable yet (a pending mark alone is synced too, W10).
    pub(crate) fn periodic_flush(&self) -> Result<()> {
        if self.wal.has_unsynced() {
            self.wal.sync_to_end()?;
        }
        Ok(())
    }

    /// Records the first failure (E2) and fails every waiter of the log (W3).
    pub(crate) fn set_poison(&self, why: String) {
        self.wal.fail(&why);
        let mut p = self.poisoned.lock();
        if p.is_none() {
            *p = Some(why);
        }
    }
}

/// An open environment. Cheap to clone; all clones share the same state. When the last clone
/// (and the last [`Tree`] and cursor, which hold one) is dropped without [`Env::close`], the
/// environment is closed with a final checkpoint before the drop returns, so the image can be
/// reopened at once.
#[derive(Clone)]
pub struct Env {
    pub(crate) inner: Arc<Inner>,
    /// Present in every handle a user holds; `None` in the background threads' handles, which
    /// therefore never keep an environment open.
    pub(crate) _user: Option<Arc<UserHandle>>,
}

/// Dropped with the last user handle: closes the environment.
pub(crate) struct UserHandle(pub(crate) Arc<Inner>);

impl Drop for UserHandle {
    fn drop(&mut self) {
        // A handle dropped without close() still gets a checkpoint, so an embedded user who
        // forgets close() loses nothing; errors have nowhere to go.
        let _ = reclaim_before_close(&self.0);
        let _ = self.0.shutdown();
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("shape", &self.inner.shape)
            .finish()
    }
}

/// The size nothing is allocated past (B11): the catalog's (0: none) or the device's own
/// capacity, whichever is smaller.
fn effective_limit(catalog: u64, dev: &dyn BlockDevice) -> Result<Option<u64>> {
    let device = dev
        .capacity()
        .map_err(|e| Error::io("reading the device's capacity", e))?;
    let catalog = (catalog != 0).then_some(catalog);
    Ok(match (catalog, device) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

impl Env {
    /// Creates a new environment in a file, which must not exist or be empty.
    pub fn create(path: impl AsRef<Path>, opts: Options) -> Result<Env> {
        let path = path.as_ref();
        let dev = FileDevice::create(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        Env::create_on(Arc::new(dev), opts)
    }

    /// Opens an existing environment in a file (for reading only if `opts.read_only`).
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Env> {
        let path = path.as_ref();
        let dev = if opts.read_only {
            FileDevice::open_read_only(path)
        } else {
            FileDevice::open(path)
        }
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Env::open_on(Arc::new(dev), opts)
    }

    /// Creates a new environment on an empty device.
    pub fn create_on(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Env> {
        opts.validate()?;
        let (dev, counters) = stats::counted(dev);
        let shape = Shape {
            node_bytes: opts.node_bytes,
            basement_bytes: opts.basement_bytes,
            fanout: opts.fanout,
            compression: opts.compression,
        };
        let mut state = State {
            trees: Vec::new(),
            by_name: HashMap::new(),
            next_msn: 1,
            messages: 0,
            log_id: NodeId(NO_LOG),
            epoch: 1,
            capacity: opts.capacity.unwrap_or(0),
            extents: Default::default(),
        };
        let limit = effective_limit(state.capacity, &*dev)?;
        if let Some(l) = limit {
            // Room for the headers, the log, a few nodes and the reserve, or nothing works.
            let least = DATA_START + opts.log_bytes + 16 * opts.node_bytes as u64;
            if l < least {
                return Err(Error::InvalidArgument(format!(
                    "an image of {l} bytes is too small for a {} byte log and {} byte nodes \
                     (at least {least} bytes)",
                    opts.log_bytes, opts.node_bytes
                )));
            }
        }
        let mut bf = BlockFile::create(dev.clone(), &encode_meta(&state, &shape))?;
        bf.set_limit(limit);
        // Both header slots get a checkpoint that names the log region, so either one alone
        // opens the image with its log (B4 then protects the region for good).
        let (log_id, loc) = bf.reserve_region(opts.log_bytes as u32)?;
        state.log_id = log_id;
        if let (Some(size), None) = (opts.capacity, dev.capacity().ok().flatten()) {
            // A sized image file has its size from the start (sparse): it is what users see.
            if dev
                .len()
                .map_err(|e| Error::io("reading device length", e))?
                < size
            {
                dev.set_len(size)
                    .map_err(|e| Error::io("giving the image its size", e))?;
            }
        }
        for _ in 0..2 {
            bf.checkpoint(Lsn(0), &encode_meta(&state, &shape))?;
        }
        let wal = Wal::new(
            Region {
                dev: dev.clone(),
                loc,
            },
            Lsn(0),
            state.epoch,
            Lsn(0),
        );
        Ok(Env::assemble((dev, counters), bf, shape, state, wal, opts))
    }

    /// Opens an existing environment on a device and recovers it: the newest valid checkpoint,
    /// then every log record after it replayed through the write path (upserts through the
    /// registered functions), then a checkpoint so the replay and the new log epoch are durable
    /// before any new record is appended (W6, W7).
    ///
    /// With `opts.read_only` nothing is written (W11): the replay stays in memory and the
    /// environment refuses writes. A damaged log record that later records prove durable fails
    /// the open with [`Error::Checksum`] naming it (W4) unless `opts.cut_damaged_log`.
    pub fn open_on(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Env> {
        let dev: Arc<dyn BlockDevice> = if opts.read_only {
            Arc::new(crate::device::ReadOnlyDevice(dev))
        } else {
            dev
        };
        let (dev, counters) = stats::counted(dev);
        let mut opened = BlockFile::open(dev.clone())?;
        let (shape, mut state) = decode_meta(&opened.meta)?;
        opened
            .file
            .set_limit(effective_limit(state.capacity, &*dev)?);
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
        if state.log_id.0 == NO_LOG {
            return Err(Error::corrupt(
                "catalog",
                "the image has no log region (its creation did not finish)",
            ));
        }
        let loc = opened.file.loc(state.log_id).ok_or_else(|| {
            Error::corrupt(
                "catalog",
                format!(
                    "log region {} is not in the translation table",
                    state.log_id
                ),
            )
        })?;
        let region = Region {
            dev: dev.clone(),
            loc,
        };
        let scanned = wal::scan(
            &region,
            opened.checkpoint_lsn,
            state.epoch,
            opts.cut_damaged_log,
        )?;
        crate::extent::check_table(&state.extents, &opened.file)?;
        let prepared = crate::extent::prepare_recovery(
            &region,
            &mut opened.file,
            &state,
            scanned.records,
            scanned.synced.max(opened.checkpoint_lsn),
        )?;
        let log_end = prepared.cut.unwrap_or(scanned.end);
        if !opts.read_only {
            state.epoch = state
                .epoch
                .checked_add(1)
                .ok_or_else(|| Error::corrupt("catalog", "log epoch overflow"))?;
        }
        let oldest = opened.file.oldest_checkpoint_lsn();
        let wal = Wal::new(region.clone(), log_end, state.epoch, oldest);
        let report = RecoveryReport {
            header_notes: opened.header_notes,
            records_replayed: 0,
            log_cut: scanned.cut,
            torn_extent_cut: prepared.cut,
        };
        let read_only = opts.read_only;
        let env = Env::assemble((dev, counters), opened.file, shape, state, wal, opts);
        *env.inner.recovery.lock() = report;
        let replayed = env
            .replay(&region, prepared.records.clone(), &|o| prepared.owns(o))
            .inspect(|_| {
                let st = env.inner.state.read();
                crate::extent::release_reserved(&st, &mut env.inner.bf.lock(), &prepared.reserved);
            });
        if let Ok(n) = &replayed {
            env.inner.recovery.lock().records_replayed = *n;
        }
        if let Err(e) = replayed.and_then(|_| if read_only { Ok(()) } else { env.checkpoint() }) {
            // Never checkpoint a half-replayed state on the way out: the log still holds it.
            env.inner.closed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(env)
    }

    pub(crate) fn assemble(
        (dev, counters): (Arc<dyn BlockDevice>, Arc<Counters>),
        bf: BlockFile,
        shape: Shape,
        state: State,
        wal: Wal,
        opts: Options,
    ) -> Env {
        let read_only = opts.read_only;
        let limit = bf.limit();
        let inner = Arc::new(Inner {
            limit,
            freed_hint: Default::default(),
            reclaim_wanted: AtomicBool::new(false),
            extent_bytes: Default::default(),
            state: RwLock::new(state),
            cache: Cache::new(opts.cache_bytes, read_only),
            bf: Mutex::new(bf),
            dev,
            counters,
            shape,
            upserts: opts.upserts,
            poisoned: Mutex::new(None),
            closed: AtomicBool::new(false),
            wal,
            durability: opts.durability,
            ckpt_lock: Mutex::new(()),
            log_released: Mutex::new(0),
            read_only,
            recovery: Mutex::new(RecoveryReport::default()),
            ckpt_signal: (opts.checkpoint_thread && !read_only)
                .then(|| Arc::new(Wakeup::default())),
            writeback_signal: (opts.checkpoint_thread && !read_only)
                .then(|| Arc::new(Wakeup::default())),
        });
        let env = Env {
            inner: inner.clone(),
            _user: Some(Arc::new(UserHandle(inner))),
        };
        if let Some(every) = opts.sync_interval.filter(|_| !read_only) {
            spawn_flusher(Arc::downgrade(&env.inner), every);
        }
        if let Some(sig) = &env.inner.ckpt_signal {
            spawn_checkpointer(Arc::downgrade(&env.inner), sig.clone());
        }
        if let Some(sig) = &env.inner.writeback_signal {
            spawn_writeback(Arc::downgrade(&env.inner), sig.clone());
        }
        env
    }

    /// Re-applies recovered log records the checkpoint does not hold (W7); returns how many
    /// records (not counting sync marks) the log held.
    pub(crate) fn replay(
        &self,
        region: &Region,
        records: Vec<Lsn>,
        owned: &dyn Fn(u64) -> bool,
    ) -> Result<u64> {
        let mut st = self.inner.state.write();
        let mut n = 0u64;
        for lsn in records {
            let rec = wal::read_record(region, lsn)?;
            let what = || format!("log record at LSN {lsn}");
            if rec != LogRecord::SyncMark {
                n += 1;
            }
            match rec {
                LogRecord::SyncMark => {}
                LogRecord::CreateTree { idx, name } => {
                    let idx = idx as usize;
                    match st.trees.get(idx) {
                        Some(t) if t.name == name => {}
                        Some(t) => {
                            return Err(Error::corrupt(
                                what(),
                                format!(
                                    "creates tree {name:?} at index {idx}, held by {:?}",
                                    t.name
                                ),
                            ))
                        }
                        None if idx == st.trees.len() => {
                            self.create_tree_locked(&mut st, &name);
                        }
                        None => {
                            return Err(Error::corrupt(
                                what(),
                                format!("creates tree {idx} but only {} exist", st.trees.len()),
                            ))
                        }
                    }
                }
                LogRecord::Batch { first_msn, ops } => {
                    self.replay_batch(&mut st, first_msn, ops, &[], owned, &what)?
                }
                LogRecord::ExtentBatch {
                    first_msn,
                    ops,
                    extents,
                } => self.replay_batch(&mut st, first_msn, ops, &extents, owned, &what)?,
            }
        }
        Ok(n)
    }

    /// Replays one batch record unless the checkpoint holds it (W7); its extent ops follow
    /// its ops (X4). `owned` is recovery's reserved space (X6).
    fn replay_batch(
        &self,
        st: &mut State,
        first_msn: Msn,
        ops: Vec<(u32, Op)>,
        extents: &[wal::ExtentOp],
        owned: &dyn Fn(u64) -> bool,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let n = ops.len() as u64;
        if first_msn.0 + n <= st.next_msn {
            return Ok(()); // the checkpoint holds it already
        }
        if first_msn.0 != st.next_msn {
            return Err(Error::corrupt(
                what(),
                format!("batch starts at MSN {first_msn}, expected {}", st.next_msn),
            ));
        }
        for (t, op) in &ops {
            if *t as usize >= st.trees.len() {
                return Err(Error::corrupt(what(), format!("names tree {t}")));
            }
            op.validate(&self.inner.upserts)?;
        }
        let r = self
            .apply_locked(st, ops.iter().map(|(t, op)| (*t as usize, op)))
            .and_then(|()| crate::extent::apply(st, &mut self.inner.bf.lock(), extents, owned));
        self.poison(r)?;
        Ok(())
    }

    pub(crate) fn ctx(&self) -> Ctx<'_> {
        self.inner.ctx()
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(Error::ReadOnly("a write, sync or checkpoint"));
        }
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
    pub(crate) fn poison<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.inner.set_poison(e.to_string());
        }
        r
    }

    /// Takes the write lock once the log has room for a record of `payload_len` bytes,
    /// checkpointing (without the lock) as often as needed to make room (W5). A batch larger
    /// than half the region is refused; if room cannot be made the write fails with
    /// [`Error::NoSpace`] and nothing is written.
    pub(crate) fn lock_with_log_room(
        &self,
        payload_len: usize,
    ) -> Result<parking_lot::RwLockWriteGuard<'_, State>> {
        let w = &self.inner.wal;
        if Wal::framed_len(payload_len) > w.capacity() / 2 {
            return Err(Error::InvalidArgument(format!(
                "a write batch of {payload_len} log bytes exceeds half the log region ({} bytes)",
                w.capacity()
            )));
        }
        for attempt in 0..4 {
            let st = self.inner.state.write();
            let oldest = self.inner.bf.lock().oldest_checkpoint_lsn();
            if w.fits(payload_len, oldest) {
                return Ok(st);
            }
            drop(st);
            if attempt < 3 {
                // Each checkpoint moves the oldest needed LSN up to where the previous one was.
                self.checkpoint()?;
            }
        }
        Err(Error::NoSpace {
            context: "appending to the write-ahead log: every record in it is still needed".into(),
        })
    }

    /// Appends a record under the write lock (W2: LSN order is MSN order).
    pub(crate) fn append_locked(&self, payload: &[u8]) -> Result<Lsn> {
        let oldest = self.inner.bf.lock().oldest_checkpoint_lsn();
        self.poison(self.inner.wal.append(payload, oldest))
    }

    /// Applies ops (already logged or being replayed) under the write lock, giving each the
    /// next MSN in order.
    pub(crate) fn apply_locked<'a>(
        &self,
        st: &mut State,
        ops: impl Iterator<Item = (usize, &'a Op)>,
    ) -> Result<()> {
        // Group by tree, keeping order; each gets consecutive MSNs in batch order.
        let mut per_tree: Vec<(usize, MsgBuffer)> = Vec::new();
        let mut n = 0u64;
        for (idx, op) in ops {
            let msn = Msn(st.next_msn);
            st.next_msn += 1;
            n += 1;
            self.inner.counters.applied(op);
            match per_tree.iter_mut().find(|(i, _)| *i == idx) {
                Some((_, b)) => b.push(op, msn),
                None => {
                    let mut b = MsgBuffer::new();
                    b.push(op, msn);
                    per_tree.push((idx, b));
                }
            }
        }
        for (_, b) in per_tree.iter_mut() {
            b.seal();
        }
        st.messages += n;
        let ctx = self.ctx();
        for (idx, msgs) in &per_tree {
            let root = st.trees[*idx].root;
            st.trees[*idx].root = betree::write(&ctx, root, msgs)?;
        }
        if let Some(sig) = &self.inner.writeback_signal {
            if self.inner.wants_writeback() {
                sig.wake();
            }
        }
        ctx.evict()
    }

    pub(crate) fn create_tree_locked(&self, st: &mut State, name: &str) -> usize {
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
        i
    }

    /// Whether enough log has been written since the newest checkpoint that one should start.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        let w = &self.inner.wal;
        let newest = self.inner.bf.lock().checkpoint_lsn();
        w.end().0.saturating_sub(newest.0) > w.capacity() / 4
            || self.inner.extent_bytes.load(Ordering::Relaxed) > w.capacity() / 4
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
        let st = self.inner.state.write();
        if let Some(&i) = st.by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        let payload = wal::encode_create_tree(st.trees.len() as u32, name);
        drop(st);
        let mut st = self.lock_with_log_room(payload.len())?;
        if let Some(&i) = st.by_name.get(name) {
            return Ok(self.handle(i, name));
        }
        let payload = wal::encode_create_tree(st.trees.len() as u32, name);
        self.append_locked(&payload)?;
        let i = self.create_tree_locked(&mut st, name);
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

    pub(crate) fn handle(&self, idx: usize, name: &str) -> Tree {
        Tree {
            env: self.clone(),
            idx,
            name: Arc::from(name),
        }
    }

    /// Applies a batch atomically with the environment's default durability
    /// ([`Options::durability`], `Buffered` unless configured).
    pub fn write(&self, batch: WriteBatch) -> Result<()> {
        self.write_with(batch, self.inner.durability)
    }

    /// Applies a batch atomically: every operation, in order, across any trees of this
    /// environment. The batch is logged as one record before it is applied (W2); with
    /// [`Durability::Sync`] this returns after the record is durable, sharing the fsync with
    /// concurrent `Sync` commits (W3). After a crash the batch is recovered whole or not at all.
    pub fn write_with(&self, batch: WriteBatch, durability: Durability) -> Result<()> {
        self.write_as(batch, durability, Admission::Grows, 0)
    }

    /// [`write`](Self::write) for a batch that frees space (a delete, unlink, truncate): on a
    /// full image it may use the reserve (B12). `freed` is how many data bytes it deletes, as
    /// far as the caller knows (a hint: enough of them make the engine push the deletes down
    /// in the background so that the space really returns, B13).
    pub fn write_releasing(&self, batch: WriteBatch, freed: u64) -> Result<()> {
        self.write_as(batch, self.inner.durability, Admission::Frees, freed)
    }

    pub(crate) fn write_as(
        &self,
        batch: WriteBatch,
        durability: Durability,
        admission: Admission,
        freed: u64,
    ) -> Result<()> {
        if batch.ops.is_empty() {
            if batch.frees.is_empty() {
                return Ok(());
            }
            // A free-only record would replay by MSN like an empty batch (W7): refuse it.
            return Err(Error::InvalidArgument(
                "a batch that frees data extents must also change a row (X9)".into(),
            ));
        }
        for (t, op) in &batch.ops {
            if !Arc::ptr_eq(&t.env.inner, &self.inner) {
                return Err(Error::UnknownTree(t.name.to_string()));
            }
            op.validate(&self.inner.upserts)?;
        }
        crate::extent::check_lengths(&batch.extents)?;
        self.check_writable()?;
        let extent_bytes: u64 = batch.extents.iter().map(|(_, d)| d.len() as u64).sum();
        // The payload's length is final before the extents are written (their references
        // are placeholders of the same size), so admission refuses before any data is written.
        let payload_len = wal::encode_batch(batch.ops.iter().map(|(t, op)| (t.idx as u32, op)))
            .len()
            + crate::extent::ops_len(batch.extents.len(), batch.frees.len());
        self.admit(admission, payload_len as u64 + extent_bytes)?;
        let mut batch = batch;
        let written = self.write_extents(&batch.extents)?;
        let ext_ops = crate::extent::fill_refs(&mut batch, &written.refs);
        let mut payload = wal::encode_batch(batch.ops.iter().map(|(t, op)| (t.idx as u32, op)));
        if !ext_ops.is_empty() {
            wal::add_extent_ops(&mut payload, &ext_ops);
        }
        let mut st = self.lock_with_log_room(payload.len())?;
        crate::extent::check_frees(&st.extents, &batch.frees)?;
        wal::set_first_msn(&mut payload, Msn(st.next_msn));
        let end = self.append_locked(&payload)?;
        written.disarm();
        let r = self
            .apply_locked(&mut st, batch.ops.iter().map(|(t, op)| (t.idx, op)))
            .and_then(|()| {
                crate::extent::apply(&mut st, &mut self.inner.bf.lock(), &ext_ops, &|_| false)
            });
        self.poison(r)?;
        drop(st);
        if extent_bytes > 0 {
            self.inner
                .extent_bytes
                .fetch_add(extent_bytes, Ordering::Relaxed);
        }
        if admission == Admission::Frees {
            self.note_freed(freed)?;
        }
        if self.wants_checkpoint() {
            self.request_checkpoint()?;
        }
        if durability == Durability::Sync {
            self.poison(self.inner.wal.wait_durable(end))?;
        }
        Ok(())
    }

    /// Makes every batch written so far durable (one fsync, shared with concurrent commits).
    pub fn sync(&self) -> Result<()> {
        self.check_writable()?;
        self.poison(self.inner.wal.sync_all())
    }

    /// Does what one round of the periodic flusher does (for deterministic tests that run
    /// without it, `sync_interval: None`): syncs the log if a record or a sync mark is not yet
    /// durable.
    #[doc(hidden)]
    pub fn periodic_flush(&self) -> Result<()> {
        self.check_writable()?;
        self.poison(self.inner.periodic_flush())
    }

    /// Checkpoints and closes. Other clones of this handle can no longer write.
    pub fn close(self) -> Result<()> {
        reclaim_before_close(&self.inner)?;
        self.inner.shutdown()
    }

    /// What the open found and worked around: damaged header slots, the number of log records
    /// replayed, and (with [`Options::cut_damaged_log`]) where a damaged log was cut.
    pub fn recovery(&self) -> RecoveryReport {
        self.inner.recovery.lock().clone()
    }

    /// Whether this environment was opened with [`Options::read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let st = self.inner.state.read();
        Stats {
            cache: self.inner.cache.stats(),
            file: self.inner.bf.lock().stats(),
            device: self.inner.counters.device(),
            messages: st.messages,
            message_bytes: self.inner.counters.message_bytes(),
            log_syncs: self.inner.wal.syncs.load(Ordering::Relaxed),
            log_end: self.inner.wal.end(),
            log_durable: self.inner.wal.durable(),
            work: self.inner.counters.work(),
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
        let root = root_of(&st, t)?;
        let ctx = self.ctx();
        let r = f(&ctx, root).and_then(|new_root| {
            st.trees[t.idx].root = new_root;
            ctx.evict()
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
        let root = root_of(&st, t)?;
        let ctx = self.ctx();
        let r = f(&ctx, root);
        drop(st);
        // Readers evict clean (and, if they must, dirty) nodes so the bound holds for them too.
        if ctx.cache.over_limit() {
            let ev = ctx.evict();
            self.poison(ev)?;
        }
        r
    }
}

/// Syncs `Buffered` commits every `every` until the environment is dropped, closed or poisoned.
pub(crate) fn spawn_flusher(inner: Weak<Inner>, every: Duration) {
    let _ = std::thread::Builder::new()
        .name("fern-log-flush".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(inner) = inner.upgrade() else { return };
            if inner.closed.load(Ordering::Relaxed) || inner.poisoned.lock().is_some() {
                return;
            }
            if let Err(e) = inner.periodic_flush() {
                inner.set_poison(e.to_string());
                return;
            }
        });
}

/// The root of tree `t` in the catalog `st`.
fn root_of(st: &State, t: &Tree) -> Result<NodeId> {
    st.trees
        .get(t.idx)
        .map(|e| e.root)
        .ok_or_else(|| Error::UnknownTree(t.name.to_string()))
}
