//! Write-back of a whole shared store under one delegation (docs/design.md §7.3): a store
//! wrapper that, while its session holds the delegation, answers reads from what it knows and
//! buffers commits, and sends them as fenced Txns at `sync`, at a revocation, when its buffer
//! is full or after a second; while another session holds it, guards every read and commit
//! with "nobody holds it" and revokes when that fails. It owns the modes (free, held, lost)
//! and their changes; the overlay (`overlay.rs`) owns what is known and buffered, `core.rs`
//! the held-mode reads and commits. It must never let one operation see two modes (W5).

mod core;
mod groups;
mod overlay;
mod ranges;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::batch::WriteBatch;
use crate::deleg::{Delegations, Grant};
use crate::error::{KvError, KvResult};
use crate::extent::ExtentRef;
use crate::guard::KeyGuard;
use crate::occ::{ConflictTracker, OccTxn};
use crate::store::{KvRead, KvSession, KvStore, KvTxn};
use crate::types::{Direction, KeyRange, Limits, TreeId, UpdateRegistry, WriteOptions};

use self::core::Core;
use self::overlay::Overlay;

/// When a [`WriteBack`] takes the delegation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakePolicy {
    /// Never: every operation is guarded and revokes a holder, nothing is buffered (a mount
    /// with `delegations=off`, and the tools — fsck, stat, export — beside busy mounts).
    Never,
    /// At open, and again after every cool-down while nobody holds it.
    Always,
    /// After [`AUTO_WRITES`] writes within a second in free mode, outside a cool-down.
    Auto,
}

/// What a [`WriteBack`] delegates and how.
#[derive(Clone, Debug)]
pub struct WriteBackConfig {
    /// Tree of the delegation keys (fern-fs: `fs.deleg`).
    pub deleg_tree: String,
    /// Tree of the revocation requests (fern-fs: `fs.revoke`).
    pub revoke_tree: String,
    /// The delegated part's key: one part, the whole store.
    pub part: Vec<u8>,
    /// When to take it.
    pub policy: TakePolicy,
    /// How long the store stays free after a revocation or a refused take ([`COOL_DOWN`];
    /// tests use zero to trade the part at every switch).
    pub cool_down: Duration,
}

/// Writes in free mode within one second that make an [`TakePolicy::Auto`] store take the
/// delegation.
pub const AUTO_WRITES: u32 = 32;
/// After a revocation (or a take that found the part held) the store stays free this long,
/// so two busy sessions fall back to per-operation Txns instead of trading the grant.
pub const COOL_DOWN: Duration = Duration::from_secs(2);
/// How long a free-mode operation waits for the holder to give the part back: the session
/// time to live (10 s on etcd) after which a dead holder's grant vanishes, plus a margin.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Dirty ops or bytes that make a commit flush the buffer.
const FLUSH_OPS: usize = 4096;
const FLUSH_BYTES: usize = 4 << 20;
/// Cached bytes (values and known-absent ranges) above which the cache is dropped once
/// nothing is dirty (overlay.rs `trim`: after a flush, and after every fill).
const CACHE_BYTES: usize = 64 << 20;
/// How often the background flusher sends what is buffered.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// A holder answers from its overlay only while its session is known alive for at least this
/// long more (W6): a holder cut off from the store stops answering (`Unavailable`) well before
/// its lease can expire and another session take the part.
const SESSION_MARGIN: Duration = Duration::from_secs(3);
/// Free-mode reads and writes that find the part held revoke and rerun at most this often.
const FREE_ATTEMPTS: u32 = 4;

#[derive(Debug)]
enum Mode {
    Free,
    Held(Grant),
    Lost(String),
}

struct State {
    mode: Mode,
    /// Bumped at every mode change (W5).
    epoch: u64,
    /// No take before this instant.
    quiet_until: Instant,
}

/// Free-mode writes counted toward an automatic take.
struct Burst {
    since: Instant,
    writes: u32,
}

/// A shared store with write-back under one delegation of the whole store (module docs).
pub struct WriteBack {
    core: Core,
    deleg: Delegations,
    part: Vec<u8>,
    policy: TakePolicy,
    cool_down: Duration,
    state: RwLock<State>,
    burst: Mutex<Burst>,
}

impl WriteBack {
    /// Wraps `store` (a shared store: it must have a session), registering `registry`'s
    /// update functions for resolving upserts, and starts listening for revocations and the
    /// background flusher. With [`TakePolicy::Always`] the delegation is taken now if free.
    pub fn open(
        store: Arc<dyn KvStore>,
        registry: UpdateRegistry,
        cfg: WriteBackConfig,
    ) -> KvResult<Arc<Self>> {
        let session = store.session()?.ok_or_else(|| {
            KvError::Unavailable("write-back needs a shared store with sessions".into())
        })?;
        let deleg = Delegations::open(&*store, session, &cfg.deleg_tree, &cfg.revoke_tree)?;
        let wb = Arc::new(Self {
            core: Core {
                store: store.clone(),
                registry,
                overlay: Mutex::new(Overlay::default()),
                tracker: ConflictTracker::new(),
                fence: Mutex::new(None),
            },
            deleg,
            part: cfg.part,
            policy: cfg.policy,
            cool_down: cfg.cool_down,
            state: RwLock::new(State {
                mode: Mode::Free,
                epoch: 0,
                quiet_until: Instant::now(),
            }),
            burst: Mutex::new(Burst {
                since: Instant::now(),
                writes: 0,
            }),
        });
        let weak = Arc::downgrade(&wb);
        wb.deleg.watch(
            session,
            Box::new(move |part| {
                if let Some(wb) = weak.upgrade() {
                    if part == wb.part {
                        // Errors are the holder's own to report (at its next sync); the
                        // requester waits for the release or its timeout either way.
                        let _ = wb.give_back();
                    }
                }
            }),
        )?;
        spawn_flusher(Arc::downgrade(&wb));
        if cfg.policy == TakePolicy::Always {
            wb.try_take();
        }
        Ok(wb)
    }

    /// True while this store holds the delegation.
    pub fn holds(&self) -> bool {
        matches!(self.state.read().mode, Mode::Held(_))
    }

    /// Flushes and gives the delegation back (unmount). Later operations run in free mode
    /// (with [`TakePolicy::Always`] the part may be taken again after a cool-down).
    pub fn release(&self) -> KvResult<()> {
        self.give_back()
    }

    /// The part, for the log.
    fn part_name(&self) -> String {
        String::from_utf8_lossy(&self.part).into_owned()
    }

    fn free_guard(&self) -> KeyGuard {
        self.deleg.free(&self.part)
    }

    /// True when `e` says the part is held (the free guard, or the fence: same key).
    fn is_part_guard(&self, e: &KvError) -> bool {
        let g = self.free_guard();
        matches!(e, KvError::GuardFailed { tree, key } if *tree == g.tree && *key == g.key)
    }

    fn lost_error(why: &str) -> KvError {
        KvError::Unavailable(format!("write-back delegation lost: {why}"))
    }

    /// `Ok` while this session is known alive for [`SESSION_MARGIN`] more (W6). When the last
    /// renewal is too old, renews once now before refusing: after a leader election the
    /// periodic renewals can lag seconds behind a cluster that already answers, and refusing
    /// then turned a healthy mount's reads into EIO (fernfs `etcd_faults`).
    fn check_session(&self) -> KvResult<()> {
        let Some(session) = self.core.store.session()? else {
            return Ok(());
        };
        let fresh =
            |until: Option<Instant>| until.is_none_or(|t| Instant::now() + SESSION_MARGIN <= t);
        if fresh(session.valid_until()) {
            return Ok(());
        }
        let renewed = session.renew();
        let until = session.valid_until();
        match until {
            Some(t) if !fresh(until) => {
                log::warn!(
                    "write-back: refusing to answer from the cache, the session is known \
                     alive only {:?} more (W6; renewing now: {renewed:?})",
                    t.saturating_duration_since(Instant::now())
                );
                Err(KvError::Unavailable(
                    "write-back: the session has not been renewed lately (store unreachable?); \
                 answering from the cache could be stale"
                        .into(),
                ))
            }
            _ => {
                log::info!("write-back: renewed the session itself (its periodic renewals lag)");
                Ok(())
            }
        }
    }

    /// Asks the holder to give the part back and waits (W1).
    fn revoke_holder(&self) -> KvResult<()> {
        let session = self.core.store.session()?.ok_or_else(|| {
            KvError::Unavailable("write-back needs a shared store with sessions".into())
        })?;
        if self
            .deleg
            .revoke(&*self.core.store, session, &self.part, REVOKE_TIMEOUT)?
        {
            Ok(())
        } else {
            Err(KvError::Unavailable(format!(
                "the holder of the write-back delegation did not give it back within {REVOKE_TIMEOUT:?}"
            )))
        }
    }

    /// Takes the part if the policy and the cool-down allow and nobody holds it.
    fn try_take(&self) {
        let mut st = self.state.write();
        if !matches!(st.mode, Mode::Free) || Instant::now() < st.quiet_until {
            return;
        }
        match self.deleg.take(&*self.core.store, &self.part) {
            Ok(Some(grant)) => {
                *self.core.fence.lock() = Some(self.deleg.fence(&grant));
                log::info!(
                    "write-back: took the delegation of part {:?}",
                    self.part_name()
                );
                st.mode = Mode::Held(grant);
                st.epoch += 1;
            }
            Ok(None) | Err(_) => st.quiet_until = Instant::now() + self.cool_down,
        }
    }

    /// Whether a free-mode operation should first try to take the part.
    fn wants_take(&self) -> bool {
        let st = self.state.read();
        if !matches!(st.mode, Mode::Free) || Instant::now() < st.quiet_until {
            return false;
        }
        match self.policy {
            TakePolicy::Never => false,
            TakePolicy::Always => true,
            TakePolicy::Auto => {
                // A burst counts only while it is recent: writes long ago are no reason now.
                let b = self.burst.lock();
                b.writes >= AUTO_WRITES && b.since.elapsed() <= Duration::from_secs(1)
            }
        }
    }

    /// Counts a free-mode write toward an automatic take.
    fn note_free_write(&self) {
        let mut b = self.burst.lock();
        let now = Instant::now();
        if now.duration_since(b.since) > Duration::from_secs(1) {
            b.since = now;
            b.writes = 0;
        }
        b.writes += 1;
    }

    /// Moves to lost (W4) if the mode is still the one of `epoch`.
    fn lose(&self, epoch: u64, why: &str) {
        let mut st = self.state.write();
        if st.epoch == epoch {
            self.lose_locked(&mut st, why);
        }
    }

    fn lose_locked(&self, st: &mut State, why: &str) {
        log::error!(
            "write-back: delegation of part {:?} lost ({why}); unsynced writes dropped, \
             every operation now fails until the file system is mounted again",
            self.part_name()
        );
        self.core.overlay.lock().drop_all();
        *self.core.fence.lock() = None;
        st.mode = Mode::Lost(why.to_string());
        st.epoch += 1;
    }

    /// Sends the dirty log as fenced Txns of whole batches (W3).
    fn flush_locked(&self, st: &mut State) -> KvResult<()> {
        let grant = match &st.mode {
            Mode::Held(g) => g.clone(),
            Mode::Free => return Ok(()),
            Mode::Lost(why) => return Err(Self::lost_error(why)),
        };
        let fence = self.deleg.fence(&grant);
        let limits = self.core.store.limits();
        let mut groups = self.core.overlay.lock().take_groups(
            limits.max_ops.unwrap_or(usize::MAX),
            limits.max_bytes.unwrap_or(usize::MAX),
        );
        for sent in 0..groups.len() {
            // A group is idempotent (exact values and range deletes) and nothing after it was
            // sent, so one that may or may not have applied is simply sent again later.
            let group = groups[sent].clone();
            let r = (|| {
                let mut txn = self.core.store.begin()?;
                txn.guard(&fence)?;
                *txn.batch() = group;
                txn.commit(WriteOptions::SYNC)
            })();
            match r {
                Ok(()) => {}
                Err(e) if self.is_part_guard(&e) => {
                    self.lose_locked(st, "a flush found the grant gone (session expired)");
                    return Err(Self::lost_error("the flush was fenced off"));
                }
                Err(e) => {
                    self.core.overlay.lock().requeue(groups.split_off(sent));
                    return Err(e);
                }
            }
        }
        self.core.overlay.lock().trim(CACHE_BYTES);
        Ok(())
    }

    /// Flushes the dirty log (sync, a full buffer, the timer).
    fn flush(&self) -> KvResult<()> {
        let mut st = self.state.write();
        self.flush_locked(&mut st)
    }

    /// Flushes, releases and drops the cache (a revocation, unmount).
    fn give_back(&self) -> KvResult<()> {
        let mut st = self.state.write();
        let Mode::Held(grant) = &st.mode else {
            return Ok(());
        };
        let grant = grant.clone();
        self.flush_locked(&mut st)?;
        match self.deleg.release(&*self.core.store, &grant) {
            Ok(true) => {
                self.core.overlay.lock().clear_cache();
                *self.core.fence.lock() = None;
                st.mode = Mode::Free;
                st.epoch += 1;
                st.quiet_until = Instant::now() + self.cool_down;
                log::info!(
                    "write-back: gave back the delegation of part {:?}",
                    self.part_name()
                );
                Ok(())
            }
            Ok(false) => {
                self.lose_locked(&mut st, "the grant was gone at release");
                Err(Self::lost_error("the grant was gone at release"))
            }
            Err(e) => Err(e),
        }
    }

    /// Flushes when the dirty log is over its bound.
    fn flush_if_full(&self) -> KvResult<()> {
        let (ops, bytes) = self.core.overlay.lock().dirty();
        if ops >= FLUSH_OPS || bytes >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Runs a read in the current mode: free mode guarded by `free(D)` (revoking and
    /// rerunning when the part is held), held mode through the overlay, lost mode refused.
    fn read<T>(
        &self,
        free: impl Fn(&KeyGuard) -> KvResult<T>,
        held: impl Fn() -> KvResult<T>,
    ) -> KvResult<T> {
        let guard = self.free_guard();
        for _ in 0..FREE_ATTEMPTS {
            let st = self.state.read();
            let epoch = st.epoch;
            let r = match &st.mode {
                Mode::Free => free(&guard),
                Mode::Held(_) => match self.check_session().and_then(|()| held()) {
                    Err(e) if self.is_part_guard(&e) => {
                        drop(st);
                        self.lose(epoch, "a fenced read found the grant gone");
                        return Err(Self::lost_error("a read was fenced off"));
                    }
                    r => return r,
                },
                Mode::Lost(why) => return Err(Self::lost_error(why)),
            };
            drop(st);
            match r {
                Err(e) if self.is_part_guard(&e) => self.revoke_holder()?,
                r => return r,
            }
        }
        Err(KvError::RetriesExhausted {
            attempts: FREE_ATTEMPTS,
        })
    }
}

/// Sends what is buffered every [`FLUSH_INTERVAL`] until the store is dropped.
fn spawn_flusher(weak: Weak<WriteBack>) {
    let _ = std::thread::Builder::new()
        .name("fern-writeback".into())
        .spawn(move || loop {
            std::thread::sleep(FLUSH_INTERVAL);
            let Some(wb) = weak.upgrade() else { return };
            if wb.core.overlay.lock().dirty().0 > 0 {
                // A failure is reported at the next sync (lost mode) or retried next time.
                if let Err(e) = wb.flush() {
                    log::warn!("write-back: background flush failed (retried): {e}");
                }
            }
        });
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        let _ = self.give_back();
    }
}

impl KvRead for WriteBack {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.read(
            |g| {
                self.core
                    .store
                    .get_guarded(std::slice::from_ref(g), tree, key)
            },
            || self.core.get(tree, key),
        )
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.read(
            |g| {
                self.core
                    .store
                    .scan_guarded(std::slice::from_ref(g), tree, range, dir, limit)
            },
            || self.core.scan(tree, range, dir, limit),
        )
    }

    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.core.store.read_extent(r, buf)
    }
}

impl KvStore for WriteBack {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        self.core.store.tree(name)
    }

    /// A blind batch reads nothing, so when its commit finds the mode changed or the part
    /// held elsewhere (then revoked: `Conflict`), running it again is always right; it is
    /// rerun here, like a free-mode read, instead of handing callers that never rerun a plain
    /// write (fern-fs's data writes) a conflict they would report as `EAGAIN`.
    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        let mut attempt = 1;
        loop {
            let mut txn = self.begin()?;
            *txn.batch() = batch.clone();
            match txn.commit(opts) {
                Err(KvError::Conflict) if attempt < FREE_ATTEMPTS => attempt += 1,
                r => return r,
            }
        }
    }

    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        if self.wants_take() {
            self.try_take();
        }
        let st = self.state.read();
        let kind = match &st.mode {
            Mode::Free => {
                let mut inner = self.core.store.begin()?;
                inner.guard_reads(&self.free_guard())?;
                Kind::Free(inner)
            }
            Mode::Held(_) => {
                self.check_session()?;
                Kind::Held(OccTxn::begin(&self.core))
            }
            Mode::Lost(why) => return Err(Self::lost_error(why)),
        };
        Ok(Box::new(WbTxn {
            wb: self,
            epoch: st.epoch,
            kind,
        }))
    }

    fn sync(&self) -> KvResult<()> {
        let mut st = self.state.write();
        match &st.mode {
            Mode::Free => {
                drop(st);
                self.core.store.sync()
            }
            _ => self.flush_locked(&mut st),
        }
    }

    fn limits(&self) -> Limits {
        self.core.store.limits()
    }

    fn space_used(&self) -> Option<u64> {
        self.core.store.space_used()
    }

    fn space(&self) -> Option<crate::StoreSpace> {
        self.core.store.space()
    }

    fn session(&self) -> KvResult<Option<&dyn KvSession>> {
        self.core.store.session()
    }

    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> KvResult<Vec<Option<Vec<u8>>>> {
        self.read(
            |g| {
                self.core
                    .store
                    .get_many_guarded(std::slice::from_ref(g), keys)
            },
            || self.core.get_many(keys),
        )
    }

    /// Free: the store's read ahead, guarded. Held: the keys as `get_many` answers them, no
    /// range (a holder's scan merges with its buffer, page by page).
    fn get_many_reading_ahead(
        &self,
        keys: &[(TreeId, Vec<u8>)],
        tree: TreeId,
        ranges: &[KeyRange],
        limit: usize,
    ) -> KvResult<crate::ReadAhead> {
        self.read(
            |g| {
                self.core.store.get_many_reading_ahead_guarded(
                    std::slice::from_ref(g),
                    keys,
                    tree,
                    ranges,
                    limit,
                )
            },
            || Ok((self.core.get_many(keys)?, vec![None; ranges.len()])),
        )
    }

    fn assume_absent(&self, tree: TreeId, range: &KeyRange) {
        let st = self.state.read();
        if matches!(st.mode, Mode::Held(_)) {
            self.core.overlay.lock().assume_absent(tree, range);
        }
    }

    fn extents(&self) -> KvResult<Vec<ExtentRef>> {
        self.core.store.extents()
    }
}

enum Kind<'a> {
    /// A transaction of the store, its reads and commit guarded by `free(D)`.
    Free(Box<dyn KvTxn + 'a>),
    /// A local transaction on the overlay.
    Held(OccTxn<'a, Core>),
}

/// A transaction of a [`WriteBack`], bound to the mode of its begin (W5).
struct WbTxn<'a> {
    wb: &'a WriteBack,
    epoch: u64,
    kind: Kind<'a>,
}

impl WbTxn<'_> {
    /// Runs `f` if the mode is still that of the begin (else `Conflict`: rerun in the new
    /// mode), turning a part guard failure into a revocation (free) or loss (held).
    fn in_mode<T>(&self, f: impl FnOnce(&Kind<'_>) -> KvResult<T>) -> KvResult<T> {
        let st = self.wb.state.read();
        if st.epoch != self.epoch {
            return Err(KvError::Conflict);
        }
        if let Kind::Held(_) = self.kind {
            self.wb.check_session()?;
        }
        let r = f(&self.kind);
        drop(st);
        self.after(r)
    }

    fn after<T>(&self, r: KvResult<T>) -> KvResult<T> {
        match r {
            Err(e) if self.wb.is_part_guard(&e) => match self.kind {
                Kind::Free(_) => {
                    self.wb.revoke_holder()?;
                    Err(KvError::Conflict)
                }
                Kind::Held(_) => {
                    self.wb
                        .lose(self.epoch, "a fenced read found the grant gone");
                    Err(WriteBack::lost_error("a read was fenced off"))
                }
            },
            r => r,
        }
    }
}

impl KvRead for WbTxn<'_> {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.in_mode(|k| match k {
            Kind::Free(t) => t.get(tree, key),
            Kind::Held(t) => t.get(tree, key),
        })
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.in_mode(|k| match k {
            Kind::Free(t) => t.scan(tree, range, dir, limit),
            Kind::Held(t) => t.scan(tree, range, dir, limit),
        })
    }

    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.wb.core.store.read_extent(r, buf)
    }
}

impl KvTxn for WbTxn<'_> {
    fn batch(&mut self) -> &mut WriteBatch {
        match &mut self.kind {
            Kind::Free(t) => t.batch(),
            Kind::Held(t) => t.batch(),
        }
    }

    fn guard(&mut self, guard: &KeyGuard) -> KvResult<()> {
        match &mut self.kind {
            Kind::Free(t) => t.guard(guard),
            Kind::Held(_) => {
                let found = self.get(guard.tree, &guard.key)?;
                guard.check(found.as_deref())
            }
        }
    }

    fn commit(self: Box<Self>, opts: WriteOptions) -> KvResult<()> {
        let WbTxn {
            wb,
            epoch,
            mut kind,
        } = *self;
        let st = wb.state.read();
        if st.epoch != epoch {
            return Err(KvError::Conflict);
        }
        match kind {
            Kind::Free(ref mut t) => {
                let writes = !t.batch().is_empty();
                let Kind::Free(t) = kind else { unreachable!() };
                let r = t.commit(opts);
                drop(st);
                match r {
                    Err(e) if wb.is_part_guard(&e) => {
                        wb.revoke_holder()?;
                        Err(KvError::Conflict)
                    }
                    Ok(()) => {
                        if writes {
                            wb.note_free_write();
                        }
                        Ok(())
                    }
                    r => r,
                }
            }
            Kind::Held(t) => {
                wb.check_session()?;
                let r = Box::new(t).commit(opts);
                drop(st);
                match r {
                    Err(e) if wb.is_part_guard(&e) => {
                        wb.lose(epoch, "a fenced read found the grant gone");
                        Err(WriteBack::lost_error("a read was fenced off"))
                    }
                    Err(e) => Err(e),
                    Ok(()) if opts.sync => wb.flush(),
                    Ok(()) => wb.flush_if_full(),
                }
            }
        }
    }
}
