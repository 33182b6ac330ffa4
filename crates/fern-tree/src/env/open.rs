//! Opening an environment: creating one on an empty device, opening an existing one (the
//! catalog from the newer valid header, the log scan, the replay of every record the
//! checkpoint does not hold: W4, W7, W11), and assembling the running `Env` with its
//! background threads. docs/format.md, "Recovery".

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{spawn_flusher, Env, Inner, UserHandle};
use crate::betree::Shape;
use crate::blockfile::{BlockFile, DATA_START};
use crate::cache::Cache;
use crate::catalog::{decode_meta, encode_meta, State, NO_LOG};
use crate::checkpoint::{spawn_checkpointer, Wakeup};
use crate::device::{BlockDevice, FileDevice};
use crate::drain::spawn_drain;
use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, NodeId};
use crate::msg::Op;
use crate::options::{Options, RecoveryReport};
use crate::stats::{self, Counters};
use crate::wal::{self, LogRecord, Region, Wal};
use crate::writeback::spawn_writeback;

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
            leaf_deltas: opts.leaf_deltas,
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
            in_flight: None,
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
        let (mut shape, mut state) = decode_meta(&opened.meta)?;
        if let Some(c) = opts.change_compression {
            shape.compression = c;
        }
        shape.leaf_deltas = opts.leaf_deltas;
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
            reclaim_paced_until: Mutex::new(None),
            release_due: Mutex::new(None),
            extent_bytes: Default::default(),
            extent_buffers: Default::default(),
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
            writeback_woken_at: Default::default(),
            drain_signal: (opts.checkpoint_thread && !read_only)
                .then(|| Arc::new(Wakeup::default())),
            flush_beside_writer: opts
                .flush_beside_writer
                .unwrap_or_else(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)),
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
        if let Some(sig) = &env.inner.drain_signal {
            spawn_drain(Arc::downgrade(&env.inner), sig.clone());
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
            .and_then(|_| crate::extent::apply(st, &mut self.inner.bf.lock(), extents, owned));
        self.poison(r)?;
        Ok(())
    }
}
