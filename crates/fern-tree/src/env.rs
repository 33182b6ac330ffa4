//! The environment: named trees sharing one block file, one node cache, one MSN sequence and
//! one write-ahead log; atomic, logged write batches across trees; group commit; checkpoints;
//! recovery on open (read-write, read-only: W11, or cutting a damaged log: W4); close.
//!
//! Owns the catalog (tree names → root node ids, next MSN, compression, log region, log epoch),
//! which is stored as the block file's meta blob in every checkpoint, the rule that a failed
//! write or sync poisons the environment (invariant E2), and the admission of write batches on
//! a fixed-size image (B11–B13: refuse new data before the reserve, make room with checkpoints
//! and reclamation steps; the arithmetic is space.rs's). Never: touches node internals (tree.rs),
//! block placement (blockfile.rs) or log framing (wal.rs); never acknowledges a `Sync` commit
//! before its log record is durable (W3); never applies a batch it has not logged first (W2).

use std::collections::HashMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::blockfile::{BlockFile, ALIGN, DATA_START};
use crate::buffer::MsgBuffer;
use crate::cache::Cache;
use crate::codec::Compression;
use crate::cursor::Cursor;
use crate::device::{BlockDevice, FileDevice};
use crate::error::{Error, Result};
use crate::ids::{Lsn, Msn, NodeId, UpsertId};
use crate::msg::{Op, UpsertFn, UpsertRegistry};
use crate::node::Node;
use crate::space::{self, Admission, Space};
use crate::stats::{self, Counters, Stats};
use crate::tree::{self, Ctx, Shape};
use crate::varint::{put_varint, Reader};
use crate::wal::{self, LogRecord, Region, Wal};

/// How durable a committed write batch is when [`Env::write_with`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Returns after the batch's log record is on stable storage (an fsync, shared with
    /// concurrent `Sync` commits: group commit).
    Sync,
    /// Returns once the batch is logged and applied in memory; it becomes durable with the next
    /// [`Env::sync`], `Sync` commit, periodic flush ([`Options::sync_interval`]) or checkpoint.
    /// A crash can lose it, and then every later batch too (the log is a prefix), never part of it.
    #[default]
    Buffered,
}

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
    /// Bytes of the write-ahead log region, reserved when the image is created (a multiple of
    /// 4096, at least 16 KiB). A checkpoint starts when a quarter of it has been written since
    /// the last one; a batch may not exceed half of it.
    pub log_bytes: u64,
    /// How often a background thread syncs `Buffered` commits; `None` disables it (they are then
    /// durable only by [`Env::sync`], a `Sync` commit or a checkpoint).
    pub sync_interval: Option<Duration>,
    /// Durability of [`Env::write`] and of the [`Tree`] convenience methods.
    pub durability: Durability,
    /// Whether checkpoints the log asks for run on a background thread (default). Without it
    /// the writer that notices runs them, which keeps a single-threaded run deterministic (the
    /// crash test relies on that).
    pub checkpoint_thread: bool,
    /// Open without ever writing the image (W11): recover into memory only (replayed nodes stay
    /// dirty in the cache, never written, so a large unreplayed log needs memory for every node
    /// it changes), no checkpoint, no epoch bump, no punch, no background thread; every write
    /// returns [`Error::ReadOnly`]. For checkers and exporters (`fernfs fsck`, `stat`, `export`).
    pub read_only: bool,
    /// Repair: when recovery finds a damaged log record that later records prove durable, cut
    /// the log there (keeping everything before it, dropping it and everything after) instead
    /// of failing with [`Error::Checksum`]. Never the default; what was dropped is in
    /// [`Env::recovery`]. (W4)
    pub cut_damaged_log: bool,
    /// Fixed size of a new image in bytes, kept in its catalog: nothing is allocated past it,
    /// new data is refused with [`Error::NoSpace`] before the reserve is touched, and the file
    /// keeps this length (format.md, "Space and the reserve"). `None`: the image grows as its
    /// device allows. A device with a capacity of its own (a disk) is limited by that anyway.
    pub capacity: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: 64 << 20,
            node_bytes: 1 << 20,
            basement_bytes: 16 << 10,
            fanout: 16,
            compression: Compression::Lz4,
            upserts: UpsertRegistry::default(),
            log_bytes: 256 << 20,
            sync_interval: Some(Duration::from_millis(100)),
            durability: Durability::Buffered,
            checkpoint_thread: true,
            read_only: false,
            cut_damaged_log: false,
            capacity: None,
        }
    }
}

impl Options {
    /// Registers an upsert function under a stable id.
    pub fn register_upsert(&mut self, id: UpsertId, f: UpsertFn) {
        self.upserts.register(id, f);
    }

    /// Registers the argument merge of upsert function `id` (see [`crate::MergeFn`]).
    pub fn register_merge(&mut self, id: UpsertId, f: crate::MergeFn) {
        self.upserts.register_merge(id, f);
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
        if self.log_bytes < 16 << 10
            || self.log_bytes > u32::MAX as u64
            || !self.log_bytes.is_multiple_of(crate::blockfile::ALIGN)
        {
            return Err(Error::InvalidArgument(format!(
                "log_bytes must be a multiple of 4096 from 16 KiB to 4 GiB (got {})",
                self.log_bytes
            )));
        }
        Ok(())
    }
}

/// What an open found and worked around (damage it did not refuse).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Header slots that are damaged or unusable while the other one serves (B6).
    pub header_notes: Vec<String>,
    /// Log records replayed after the checkpoint (sync marks not counted).
    pub records_replayed: u64,
    /// The damaged log record the log was cut at, with [`Options::cut_damaged_log`] only.
    pub log_cut: Option<wal::LogCut>,
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
    /// BTT id of the log region (a fixed extent, never rewritten).
    log_id: NodeId,
    /// Epoch of this open's log records (W6); bumped and checkpointed by every open.
    epoch: u32,
    /// The image's fixed size from its catalog (0: none; B11).
    capacity: u64,
}

pub(crate) struct Inner {
    state: RwLock<State>,
    cache: Cache,
    bf: Mutex<BlockFile>,
    dev: Arc<dyn BlockDevice>,
    counters: Arc<Counters>,
    shape: Shape,
    upserts: UpsertRegistry,
    poisoned: Mutex<Option<String>>,
    closed: AtomicBool,
    wal: Wal,
    durability: Durability,
    /// One checkpoint at a time (held for its whole duration; never taken under `state`).
    ckpt_lock: Mutex<()>,
    /// Wakes the checkpoint thread, if there is one.
    ckpt_signal: Option<Arc<CkptSignal>>,
    /// LSN below which this open has returned the log region's bytes to the host (W9).
    log_released: Mutex<u64>,
    /// Opened with `Options::read_only` (W11).
    read_only: bool,
    /// What recovery found (set once by the open).
    recovery: Mutex<RecoveryReport>,
    /// The size nothing is allocated past (B11): the catalog's capacity or the device's,
    /// whichever is smaller; `None` for an image that grows.
    limit: Option<u64>,
    /// Data bytes that releasing batches said they delete since the last reclamation pass.
    freed_hint: std::sync::atomic::AtomicU64,
    /// Set when enough was deleted that the checkpoint thread should push the deletes down.
    reclaim_wanted: AtomicBool,
}

/// Data bytes deleted (as releasing batches report them) after which the deletes are pushed
/// down in the background so that their space is really returned (format.md, B13): this, or
/// a 32nd of a fixed-size image if that is less.
const RECLAIM_AFTER: u64 = 8 << 20;

/// Most rounds (reclaim steps, then two checkpoints) one attempt to make room runs, and the
/// pass at close.
const ROOM_ROUNDS: usize = 64;

/// Most rounds of one background pass (B13): it runs beside writers, so it stops after a
/// bounded amount of work (8 rounds of at most 16 nodes); the next deletes ask again, and
/// close finishes the rest.
const BACKGROUND_ROUNDS: usize = 8;

/// Most log bytes one [`Inner::release_log_step`] punches: writers wait for one step (a few
/// milliseconds of `fallocate` at most), not for the whole release.
const LOG_RELEASE_STEP: u64 = 4 << 20;

struct CkptSignal {
    want: Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl Inner {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cache: &self.cache,
            bf: &self.bf,
            dev: &self.dev,
            shape: &self.shape,
            upserts: &self.upserts,
        }
    }

    /// The sharp checkpoint: everything under the write lock the caller holds (`st`).
    fn checkpoint_locked(&self, st: &State) -> Result<()> {
        let ctx = self.ctx();
        let lsn = self.wal.end();
        let result = (|| {
            // The checkpoint's syncs must cover the log records before it (W5: recovery from
            // the older checkpoint replays them).
            self.wal.flush()?;
            for n in ctx.cache.dirty() {
                ctx.write_node(&n)?;
                n.set_dirty(false);
            }
            let meta = encode_meta(st, &self.shape);
            self.bf.lock().checkpoint(lsn, &meta)
        })();
        match &result {
            // The checkpoint's syncs covered every log record written before it.
            Ok(()) => {
                self.wal.mark_durable(lsn);
                self.wal.set_oldest(self.bf.lock().oldest_checkpoint_lsn());
            }
            Err(e) => self.set_poison(e.to_string()),
        }
        result?;
        // The write lock is held: no append can race the punches (W9).
        loop {
            match self.release_log_step(st) {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) => {
                    self.set_poison(e.to_string());
                    return Err(e);
                }
            }
        }
    }

    /// Returns the next piece (at most `LOG_RELEASE_STEP` bytes) of log space that no durable
    /// checkpoint needs any more to the host, and says whether more remains (W9).
    ///
    /// Records below the older checkpoint's LSN are never read again: recovery starts at the
    /// newest checkpoint's LSN, or at the older one's if the newest header is damaged (W5).
    /// Without this, every byte ever logged stays allocated in the sparse region until the
    /// region wraps (F8: 64 MiB of logged file data kept beside the tree after an unmount).
    ///
    /// The caller holds the environment's lock (read or write), so no record is appended
    /// meanwhile. A record at LSN `x` shares its bytes with LSN `x - capacity`; records up to
    /// `end` exist, so nothing below `end - capacity` is punched, and appends after the lock
    /// is released land at or past `end`, outside what was punched. Punches are not synced: a
    /// crash leaves the old bytes or zeros, and recovery reads neither (both lie below the
    /// checkpoint's LSN).
    fn release_log_step(&self, st: &State) -> Result<bool> {
        let (oldest, region) = {
            let bf = self.bf.lock();
            match bf.loc(st.log_id) {
                Some(r) => (bf.oldest_checkpoint_lsn().0, r),
                None => return Ok(false),
            }
        };
        let cap = u64::from(region.len);
        // Sync marks are appended without the environment's lock (W10); the log's tail lock
        // keeps them out while this step computes its range from `end` and punches it.
        self.wal.with_appends_excluded(|end| {
            let end = end.0;
            let mut released = self.log_released.lock();
            let lo = (*released)
                .max(end.saturating_sub(cap))
                .next_multiple_of(ALIGN);
            // The page holding `oldest` keeps live records after it, unless there are none
            // (both checkpoints at the log's end): then its bytes past `end` belong to no
            // record yet.
            let target = if oldest >= end {
                end.next_multiple_of(ALIGN)
            } else {
                oldest / ALIGN * ALIGN
            };
            let hi = target.min(lo.saturating_add(LOG_RELEASE_STEP));
            if lo >= hi {
                return Ok(false);
            }
            let mut at = lo;
            while at < hi {
                // The region is ALIGN-aligned and a multiple of ALIGN long, so an aligned LSN
                // maps to an aligned offset; a piece stops at the region's end (the log wraps
                // there).
                let pos = at % cap;
                let n = (hi - at).min(cap - pos);
                self.dev
                    .punch_hole(region.offset + pos, n)
                    .map_err(|e| Error::io(format!("returning log space below LSN {hi}"), e))?;
                at += n;
            }
            *released = hi;
            Ok(hi < target)
        })
    }

    /// Closes: waits for a running checkpoint, stops the background threads, and (unless
    /// poisoned or already closed) commits a final checkpoint. Nothing writes to the image after
    /// this returns.
    fn shutdown(&self) -> Result<()> {
        let _one = self.ckpt_lock.lock();
        if self.closed.swap(true, Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        if let Some(sig) = &self.ckpt_signal {
            sig.cv.notify_one();
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
    fn periodic_flush(&self) -> Result<()> {
        if self.wal.has_unsynced() {
            self.wal.sync_to_end()?;
        }
        Ok(())
    }

    /// Records the first failure (E2) and fails every waiter of the log (W3).
    fn set_poison(&self, why: String) {
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
    _user: Option<Arc<UserHandle>>,
}

/// Dropped with the last user handle: closes the environment.
struct UserHandle(Arc<Inner>);

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

const META_MAGIC: &[u8; 4] = b"FCAT";
/// Catalog version written by this build: 3 = the log may hold sync marks (W10), and the
/// catalog ends with the image's fixed size (0: the image grows; B11).
const META_VERSION: u32 = 3;
/// Oldest catalog version read: 2 (no size field, a log without sync marks).
const META_VERSION_OLDEST: u32 = 2;
/// Catalog value of `log_id` while an image is being created (no log yet).
const NO_LOG: u64 = u64::MAX;

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
    out.extend_from_slice(&state.log_id.0.to_le_bytes());
    out.extend_from_slice(&state.epoch.to_le_bytes());
    out.extend_from_slice(&state.capacity.to_le_bytes());
    out
}

fn decode_meta(b: &[u8]) -> Result<(Shape, State)> {
    let what = || "catalog".to_string();
    let mut r = Reader::new(b, &what);
    if r.bytes(4)? != META_MAGIC {
        return Err(r.err("bad magic"));
    }
    let v = r.u32()?;
    if !(META_VERSION_OLDEST..=META_VERSION).contains(&v) {
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
    let log_id = NodeId(r.u64()?);
    let epoch = r.u32()?;
    let capacity = if v >= 3 { r.u64()? } else { 0 };
    if r.remaining() != 0 {
        return Err(r.err("trailing bytes"));
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
            log_id,
            epoch,
            capacity,
        },
    ))
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

/// Fuzzing entry point: decodes a catalog.
pub(crate) fn fuzz_catalog(b: &[u8]) -> bool {
    decode_meta(b).is_ok()
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
        if !opts.read_only {
            state.epoch = state
                .epoch
                .checked_add(1)
                .ok_or_else(|| Error::corrupt("catalog", "log epoch overflow"))?;
        }
        let oldest = opened.file.oldest_checkpoint_lsn();
        let wal = Wal::new(region.clone(), scanned.end, state.epoch, oldest);
        let report = RecoveryReport {
            header_notes: opened.header_notes,
            records_replayed: 0,
            log_cut: scanned.cut,
        };
        let read_only = opts.read_only;
        let env = Env::assemble((dev, counters), opened.file, shape, state, wal, opts);
        *env.inner.recovery.lock() = report;
        let replayed = env.replay(&region, scanned.records);
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

    fn assemble(
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
            ckpt_signal: (opts.checkpoint_thread && !read_only).then(|| {
                Arc::new(CkptSignal {
                    want: Mutex::new(false),
                    cv: parking_lot::Condvar::new(),
                })
            }),
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
        env
    }

    /// Re-applies recovered log records the checkpoint does not hold (W7); returns how many
    /// records (not counting sync marks) the log held.
    fn replay(&self, region: &Region, records: Vec<Lsn>) -> Result<u64> {
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
                    let n = ops.len() as u64;
                    if first_msn.0 + n <= st.next_msn {
                        continue; // the checkpoint holds it already
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
                    let r = self.apply_locked(&mut st, ops.iter().map(|(t, op)| (*t as usize, op)));
                    self.poison(r)?;
                }
            }
        }
        Ok(n)
    }

    pub(crate) fn ctx(&self) -> Ctx<'_> {
        self.inner.ctx()
    }

    fn check_writable(&self) -> Result<()> {
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
    fn poison<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.inner.set_poison(e.to_string());
        }
        r
    }

    /// Takes the write lock once the log has room for a record of `payload_len` bytes,
    /// checkpointing (without the lock) as often as needed to make room (W5). A batch larger
    /// than half the region is refused; if room cannot be made the write fails with
    /// [`Error::NoSpace`] and nothing is written.
    fn lock_with_log_room(
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
    fn append_locked(&self, payload: &[u8]) -> Result<Lsn> {
        let oldest = self.inner.bf.lock().oldest_checkpoint_lsn();
        self.poison(self.inner.wal.append(payload, oldest))
    }

    /// Applies ops (already logged or being replayed) under the write lock, giving each the
    /// next MSN in order.
    fn apply_locked<'a>(
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
            st.trees[*idx].root = tree::write(&ctx, root, msgs)?;
        }
        ctx.cache.evict(&|n| ctx.write_node(n))
    }

    fn create_tree_locked(&self, st: &mut State, name: &str) -> usize {
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
    fn wants_checkpoint(&self) -> bool {
        let w = &self.inner.wal;
        let newest = self.inner.bf.lock().checkpoint_lsn();
        w.end().0.saturating_sub(newest.0) > w.capacity() / 4
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

    fn handle(&self, idx: usize, name: &str) -> Tree {
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

    fn write_as(
        &self,
        batch: WriteBatch,
        durability: Durability,
        admission: Admission,
        freed: u64,
    ) -> Result<()> {
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
        let mut payload = wal::encode_batch(batch.ops.iter().map(|(t, op)| (t.idx as u32, op)));
        self.admit(admission, payload.len() as u64)?;
        let mut st = self.lock_with_log_room(payload.len())?;
        wal::set_first_msn(&mut payload, Msn(st.next_msn));
        let end = self.append_locked(&payload)?;
        let r = self.apply_locked(&mut st, batch.ops.iter().map(|(t, op)| (t.idx, op)));
        self.poison(r)?;
        drop(st);
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

    /// Starts a checkpoint because the log passed its threshold: wakes the checkpoint thread,
    /// or (without one) runs it here unless one is already running.
    fn request_checkpoint(&self) -> Result<()> {
        if let Some(sig) = &self.inner.ckpt_signal {
            *sig.want.lock() = true;
            sig.cv.notify_one();
            return Ok(());
        }
        let Some(_one) = self.inner.ckpt_lock.try_lock() else {
            return Ok(());
        };
        if self.wants_checkpoint() {
            self.checkpoint_fuzzy()?;
        }
        Ok(())
    }

    /// Commits a checkpoint of everything written before the call, at the log's end; log space
    /// before the older checkpoint becomes reusable. Writers keep writing while the nodes are
    /// encoded and written (see `checkpoint_fuzzy`). When it returns Ok, everything written
    /// before the call survives a crash.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let _one = self.inner.ckpt_lock.lock();
        self.checkpoint_fuzzy()
    }

    /// The old "sharp" checkpoint, which holds the write lock while it writes every dirty node.
    /// Kept for comparison benchmarks (docs/BENCHMARKS.md); [`Env::checkpoint`] is what to use.
    #[doc(hidden)]
    pub fn checkpoint_sharp(&self) -> Result<()> {
        self.check_writable()?;
        let _one = self.inner.ckpt_lock.lock();
        let st = self.inner.state.write();
        self.checkpoint_locked(&st)
    }

    /// A checkpoint that stops writers only twice, briefly (invariant W8):
    /// 1. under the write lock: note the log's end (the checkpoint LSN), encode the catalog,
    ///    take `Arc`s of every dirty cached node (a writer that changes one later gets a copy:
    ///    `Cache::take` copies a node someone else holds) and begin an in-progress BTT (B10);
    /// 2. without it: encode and write each snapshot node to a fresh extent of the in-progress
    ///    BTT, then commit (B3);
    /// 3. under the write lock: nodes the cache still holds in the snapshot's version are clean
    ///    now and the current BTT adopts their new blocks; changed ones stay dirty.
    ///
    /// The caller holds `ckpt_lock`.
    fn checkpoint_fuzzy(&self) -> Result<()> {
        let i = &self.inner;
        let (lsn, meta, snapshot) = {
            let st = i.state.write();
            let lsn = i.wal.end();
            // The checkpoint's syncs must cover the log records before it (W5: recovery from
            // the older checkpoint replays them).
            self.poison(i.wal.flush())?;
            let meta = encode_meta(&st, &i.shape);
            let snapshot = i.cache.dirty();
            let r = i.bf.lock().begin_checkpoint();
            self.poison(r)?;
            (lsn, meta, snapshot)
        };
        let written = (|| {
            let mut locs = Vec::with_capacity(snapshot.len());
            for n in &snapshot {
                let bytes = n.encode(i.shape.compression);
                let len = u32::try_from(bytes.len()).map_err(|_| {
                    Error::InvalidArgument(format!("node {} block over 4 GiB", n.id))
                })?;
                let loc = i.bf.lock().reserve_for_checkpoint(n.id, len)?;
                i.dev
                    .write_at(&bytes, loc.offset)
                    .map_err(|e| Error::io(format!("writing node {} for a checkpoint", n.id), e))?;
                locs.push(loc);
            }
            i.bf.lock().commit_checkpoint(lsn, &meta)?;
            Ok(locs)
        })();
        let locs = self.poison(written)?;
        // The checkpoint's syncs covered every log record written before the snapshot.
        i.wal.mark_durable(lsn);
        i.wal.set_oldest(i.bf.lock().oldest_checkpoint_lsn());
        {
            let _st = i.state.write();
            let mut bf = i.bf.lock();
            for (n, loc) in snapshot.iter().zip(locs) {
                if i.cache.is_current(n) {
                    bf.adopt(n.id, loc);
                    n.set_dirty(false);
                } else {
                    bf.not_adopted(n.id, loc);
                }
            }
        }
        // Log space is returned piece by piece under the read lock: appends wait for one
        // piece at a time (W8, W9), readers not at all. A failed punch is a failed device
        // write: it poisons (E2), though the committed checkpoint stands.
        loop {
            let st = i.state.read();
            if !self.poison(i.release_log_step(&st))? {
                return Ok(());
            }
        }
    }

    /// The sharp checkpoint: everything under the write lock.
    fn checkpoint_locked(&self, st: &State) -> Result<()> {
        self.inner.checkpoint_locked(st)
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
        }
    }

    /// The space figures statfs reports (format.md, "Space and the reserve").
    pub fn space(&self) -> Space {
        let i = &self.inner;
        let reserve = self.reserve_of(&i.bf.lock());
        let (capacity, used) = match i.limit {
            Some(l) => (l, l.saturating_sub(self.room(false))),
            None => {
                let (allocated, end) = {
                    let bf = i.bf.lock();
                    (bf.allocator().allocated_bytes(), bf.allocator().end())
                };
                let used = allocated + i.cache.dirty_bytes();
                let host = i.dev.host_available().ok().flatten().unwrap_or(0);
                (end.max(used).saturating_add(host), used)
            }
        };
        Space {
            capacity,
            used: used.min(capacity),
            available: capacity.saturating_sub(used + reserve),
            reserve,
            fixed: i.limit.is_some(),
        }
    }

    fn reserve_of(&self, bf: &BlockFile) -> u64 {
        let (btt, meta) = self.table_sizes(bf);
        space::reserve(btt, meta, self.inner.shape.node_bytes as u64)
    }

    fn checkpoint_room_of(&self, bf: &BlockFile) -> u64 {
        let (btt, meta) = self.table_sizes(bf);
        space::checkpoint_room(btt, meta, self.inner.shape.node_bytes as u64)
    }

    /// Sizes of the next block table and catalog (the catalog grows only with tree names).
    fn table_sizes(&self, bf: &BlockFile) -> (u64, u64) {
        let btt = (bf.table_entries() + 64) * crate::blockfile::BTT_ENTRY_LEN as u64;
        (btt, 4096)
    }

    /// Space new extents can count on (B12), for a fixed-size image: free space below the
    /// limit in pieces a whole node (or block table) fits in, minus what the dirty nodes will
    /// take when written. `quick` counts only the free tail and takes the whole cache's memory
    /// as the dirty part: no scan, and never more than the precise figure.
    fn room(&self, quick: bool) -> u64 {
        let i = &self.inner;
        let free = {
            let bf = i.bf.lock();
            let unit = space::unit(self.table_sizes(&bf).0, i.shape.node_bytes as u64);
            match (quick, bf.limit()) {
                (_, None) => return u64::MAX,
                (true, Some(l)) => l.saturating_sub(bf.allocator().end()),
                (false, Some(_)) => bf.usable_free(unit).unwrap_or(0),
            }
        };
        let dirty = if quick {
            i.cache.used_bytes() + 2 * ALIGN * i.cache.stats().nodes as u64
        } else {
            i.cache.dirty_bytes()
        };
        free.saturating_sub(dirty)
    }

    /// Admits a batch of `payload` log bytes, or refuses it with [`Error::NoSpace`] before
    /// anything is written (B12). New data must leave the whole reserve untouched; a releasing
    /// batch only the room the checkpoints need. When the batch does not fit, room is made
    /// first: checkpoints release blocks only older checkpoints referenced, and buffered
    /// deletes are pushed down to where they remove rows.
    fn admit(&self, admission: Admission, payload: u64) -> Result<()> {
        let Some(limit) = self.inner.limit else {
            return Ok(());
        };
        let keep = || {
            let bf = self.inner.bf.lock();
            match admission {
                Admission::Grows => self.reserve_of(&bf),
                Admission::Frees => self.checkpoint_room_of(&bf),
            }
        };
        let fits = |quick: bool| payload.saturating_add(keep()) <= self.room(quick);
        if fits(true) || fits(false) {
            return Ok(());
        }
        for _ in 0..ROOM_ROUNDS {
            if !self.make_room()? {
                break;
            }
            if fits(false) {
                return Ok(());
            }
        }
        Err(Error::NoSpace {
            context: format!(
                "writing new data: the image is full ({limit} bytes; the rest is kept for \
                 checkpoints and deletes, which still work)"
            ),
        })
    }

    /// One round of making room on a fixed-size image: a checkpoint pair (releases the blocks
    /// that only older checkpoints referenced, B4), then reclamation steps within what the
    /// checkpoints leave free, then another pair to release what the steps replaced. Returns
    /// whether anything changed (room grew, or deletes moved).
    fn make_room(&self) -> Result<bool> {
        let before = self.room(false);
        {
            let _one = self.inner.ckpt_lock.lock();
            self.checkpoint_fuzzy()?;
            self.checkpoint_fuzzy()?;
        }
        let moved = match self.reclaim_budget() {
            Some(budget) => self.reclaim(budget)?,
            None => false,
        };
        if moved {
            let _one = self.inner.ckpt_lock.lock();
            self.checkpoint_fuzzy()?;
            self.checkpoint_fuzzy()?;
        }
        Ok(moved || self.room(false) > before)
    }

    /// How many bytes of nodes one round of reclamation steps may make dirty: at most 16
    /// nodes, and on a fixed-size image no more than the room the checkpoints leave; `None`
    /// when that is less than a step needs (one path with a split).
    fn reclaim_budget(&self) -> Option<u64> {
        let node = self.inner.shape.node_bytes as u64;
        let mut budget = 16 * node;
        if self.inner.limit.is_some() {
            let room = self.checkpoint_room_of(&self.inner.bf.lock());
            budget = budget.min(self.room(false).saturating_sub(room));
        }
        (budget >= 2 * node).then_some(budget)
    }

    /// Runs reclamation steps (`tree::reclaim_step`) over every tree until no buffered delete
    /// is left or the dirty nodes grew by `budget` bytes. A step changes no row, only where
    /// messages wait, so it needs no log record (like a flush). Returns whether any step ran.
    fn reclaim(&self, budget: u64) -> Result<bool> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        let ctx = self.ctx();
        let start = ctx.cache.dirty_bytes();
        let mut moved = false;
        let r = (|| {
            for t in 0..st.trees.len() {
                loop {
                    let (root, step) = tree::reclaim_step(&ctx, st.trees[t].root)?;
                    st.trees[t].root = root;
                    if !step {
                        break;
                    }
                    moved = true;
                    if ctx.cache.dirty_bytes().saturating_sub(start) >= budget {
                        return ctx.cache.evict(&|n| ctx.write_node(n));
                    }
                }
            }
            ctx.cache.evict(&|n| ctx.write_node(n))
        })();
        self.poison(r)?;
        Ok(moved)
    }

    /// Counts data deleted by releasing batches; past the threshold, asks for a background
    /// reclamation pass (B13), or runs it here without a checkpoint thread.
    fn note_freed(&self, freed: u64) -> Result<()> {
        let i = &self.inner;
        let total = i.freed_hint.fetch_add(freed.max(1), Ordering::Relaxed) + freed.max(1);
        let threshold = i.limit.map_or(RECLAIM_AFTER, |l| RECLAIM_AFTER.min(l / 32));
        if total < threshold {
            return Ok(());
        }
        i.freed_hint.store(0, Ordering::Relaxed);
        i.reclaim_wanted.store(true, Ordering::Relaxed);
        if let Some(sig) = &i.ckpt_signal {
            *sig.want.lock() = true;
            sig.cv.notify_one();
            return Ok(());
        }
        let Some(_one) = i.ckpt_lock.try_lock() else {
            return Ok(());
        };
        self.reclaim_pass(BACKGROUND_ROUNDS)
    }

    /// A background reclamation pass (B13): push every buffered delete down, in rounds that
    /// each end with a checkpoint pair, so the rows' old blocks are released. The caller holds
    /// `ckpt_lock`.
    fn reclaim_pass(&self, rounds: usize) -> Result<()> {
        if !self.inner.reclaim_wanted.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        for _ in 0..rounds {
            let Some(budget) = self.reclaim_budget() else {
                break;
            };
            if !self.reclaim(budget)? {
                break;
            }
            self.checkpoint_fuzzy()?;
        }
        // The pair's second checkpoint releases what the last round's steps replaced.
        self.checkpoint_fuzzy()?;
        self.checkpoint_fuzzy()
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

/// Pushes down the deletes written since the last reclamation pass, so that a closed image
/// keeps no rows its deletes removed (B13: F8-style "deleted but still allocated").
fn reclaim_before_close(inner: &Arc<Inner>) -> Result<()> {
    if inner.closed.load(Ordering::SeqCst) || inner.poisoned.lock().is_some() {
        return Ok(());
    }
    if inner.freed_hint.load(Ordering::Relaxed) > 0 {
        inner.reclaim_wanted.store(true, Ordering::Relaxed);
    }
    let env = Env {
        inner: inner.clone(),
        _user: None,
    };
    let _one = inner.ckpt_lock.lock();
    if inner.closed.load(Ordering::SeqCst) {
        return Ok(());
    }
    env.reclaim_pass(ROOM_ROUNDS)
}

/// Runs the checkpoints writers ask for until the environment is dropped, closed or poisoned.
fn spawn_checkpointer(inner: Weak<Inner>, sig: Arc<CkptSignal>) {
    let _ = std::thread::Builder::new()
        .name("fern-checkpoint".into())
        .spawn(move || loop {
            {
                let mut want = sig.want.lock();
                if !*want {
                    sig.cv.wait_for(&mut want, Duration::from_millis(200));
                }
                if !std::mem::take(&mut *want) {
                    if inner.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            }
            let Some(inner) = inner.upgrade() else { return };
            if inner.closed.load(Ordering::Relaxed) || inner.poisoned.lock().is_some() {
                return;
            }
            let env = Env { inner, _user: None };
            let Some(_one) = env.inner.ckpt_lock.try_lock() else {
                continue; // a checkpoint is running; it covers this request
            };
            if env.inner.closed.load(Ordering::SeqCst) {
                return; // closed while this thread waited for the lock
            }
            if env.wants_checkpoint() && env.checkpoint_fuzzy().is_err() {
                return; // poisoned
            }
            if env.inner.reclaim_wanted.load(Ordering::Relaxed)
                && env.reclaim_pass(BACKGROUND_ROUNDS).is_err()
            {
                return; // poisoned
            }
        });
}

/// Syncs `Buffered` commits every `every` until the environment is dropped, closed or poisoned.
fn spawn_flusher(inner: Weak<Inner>, every: Duration) {
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
