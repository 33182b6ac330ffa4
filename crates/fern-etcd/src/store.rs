//! [`EtcdStore`]: the fern-kv [`KvStore`] over one file system's prefix of one etcd cluster.
//!
//! It owns the etcd client and the tokio runtime that drives it (the trait is synchronous; every
//! call is `block_on` under the store's deadline), the reads (point, and paged scans pinned to
//! one revision), and the application of a batch as one Txn with bounded retries of upsert
//! races. It must never send a Txn that [`crate::plan`] did not check against etcd's limits,
//! and never retry without bound.
//!
//! Durability: an etcd Txn is durable (raft majority, fsynced) when it returns, so every write
//! is synchronous and [`KvStore::sync`] has nothing left to do.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KvClient,
    SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use fern_kv::occ::covered;
use fern_kv::{
    Backoff, Direction, KeyGuard, KeyRange, KvError, KvRead, KvResult, KvSession, KvStore, KvTxn,
    Limits, RetryPolicy, TreeId, UpdateRegistry, WriteBatch, WriteOptions,
};
use parking_lot::{Mutex, RwLock};

use crate::config::EtcdConfig;
use crate::error::{classify, timed_out, Failure};
use crate::keys::{EtcdRange, Keyspace};
use crate::plan::{self, EtcdOp, Guard, Stored};
use crate::session::Lease;
use crate::txn::EtcdTxn;

/// What one batch may hold on etcd (docs/distributed.md §3): etcd's 128 ops, and 1 MiB of the
/// 1.5 MiB request so that key prefixes, compares and framing fit beside the batch's bytes.
pub const ETCD_LIMITS: Limits = Limits {
    max_ops: Some(MAX_TXN_OPS),
    max_bytes: Some(1 << 20),
    max_key_len: 4096,
    max_value_len: 1 << 20,
    // Data stays in rows here (fs-design.md §9): etcd has no place to put bytes outside a key.
    extents: None,
};

/// etcd's `--max-txn-ops` default: most ops in each list (compare, success) of one Txn.
pub const MAX_TXN_OPS: usize = 128;
/// etcd's `--max-request-bytes` default.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Pairs per scan page: bounds one response (512 × a 4 KiB block ≈ 2 MiB).
const PAGE: usize = 512;
/// Largest response the client accepts (a page of the largest values).
const MAX_RESPONSE_BYTES: usize = 1 << 30;
/// Retries of upsert races (docs/distributed.md §5).
const UPSERT_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 64,
    base_backoff: Duration::from_micros(100),
    max_backoff: Duration::from_millis(20),
};
/// Attempts after which an upsert reads its keys again after the backoff instead of using what
/// the failed Txn read back: the first backoffs are shorter than a round trip.
const FRESH_AFTER_ATTEMPTS: u32 = 3;
/// Pause before sending a call again (see [`EtcdStore::call`]).
const RESEND_PAUSE: Duration = Duration::from_millis(50);
/// Which failures allow sending a call again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Reads and read-only Txns: any failure to reach the cluster.
    Always,
    /// Writes: only a failure before the request left this machine.
    IfNotSent,
}
/// Restarts of a plain scan whose pinned revision was compacted under it.
const SCAN_RESTARTS: u32 = 5;
/// Most keys whose last known state [`EtcdStore`] keeps for upserts (then it starts over).
const KNOWN_KEYS: usize = 4096;
/// Largest put value remembered for a later upsert: metadata rows (directory entries with
/// their inline stat, inodes), not data blocks, unless the key itself was upserted.
const KNOWN_PUT_BYTES: usize = 1024;

/// A point read: value, `mod_revision` (0 if absent) and the revision it was read at.
pub(crate) struct Point {
    pub value: Option<Vec<u8>>,
    pub mod_revision: i64,
    pub revision: i64,
}

/// A scan's pairs (tree keys), their `mod_revision`s and the revision they were read at.
pub(crate) struct Scanned {
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    pub mod_revisions: Vec<i64>,
    pub revision: Option<i64>,
}

/// A [`KvStore`] on etcd v3.
pub struct EtcdStore {
    rt: tokio::runtime::Runtime,
    /// Replaced by a fresh connection when etcd says the auth token expired.
    client: RwLock<Client>,
    /// What [`EtcdStore::reconnect`] connects with (the password stays in memory only).
    cfg: EtcdConfig,
    ks: Keyspace,
    registry: UpdateRegistry,
    limits: Limits,
    timeout: Duration,
    /// For error messages.
    endpoints: String,
    /// etcd requests sent (round trips), for cost accounting.
    requests: AtomicU64,
    /// Last known state of keys this store wrote (docs/distributed.md §3.1): the first attempt
    /// of an upsert uses it instead of a read. Never trusted: the Txn compares the
    /// `mod_revision`, so a stale entry costs one failed attempt, whose failure branch reads
    /// the key — the same two round trips as a miss.
    known: Mutex<BTreeMap<Vec<u8>, Stored>>,
    /// This store's session (its etcd lease), granted on the first `session` call.
    lease: Mutex<Option<Arc<Lease>>>,
    /// Tags of the trees whose puts are held by the lease (`KvSession::hold_tree`).
    held: RwLock<Vec<Vec<u8>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("keys", &self.ks)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The client options of `cfg`: deadlines, keep-alive, and its TLS files and user (a file
/// that cannot be read fails here, naming it).
fn connect_options(cfg: &EtcdConfig) -> KvResult<ConnectOptions> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.timeout)
        .with_timeout(cfg.timeout)
        .with_keep_alive(Duration::from_secs(5), cfg.timeout);
    if let Some((user, password)) = &cfg.user {
        opts = opts.with_user(user.clone(), password.0.clone());
    }
    if let Some(tls) = &cfg.tls {
        let read = |what: &str, p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| KvError::Unavailable(format!("etcd TLS {what} {}: {e}", p.display())))
        };
        let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read("CA", &tls.ca)?));
        if let Some((cert, key)) = &tls.client {
            t = t.identity(Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        opts = opts.with_tls(t);
    }
    Ok(opts)
}

/// A client of the cluster of `cfg`, connected (and authenticated) within its deadline.
fn new_client(
    rt: &tokio::runtime::Runtime,
    cfg: &EtcdConfig,
    opts: ConnectOptions,
    endpoints: &str,
) -> Result<Client, Failure> {
    rt.block_on(async {
        tokio::time::timeout(cfg.timeout, Client::connect(&cfg.endpoints, Some(opts))).await
    })
    .map_err(|_| timed_out(endpoints, cfg.timeout))
    .and_then(|r| r.map_err(|e| classify(e, endpoints)))
}

impl EtcdStore {
    /// A scan (its first page under `guards`, later pages at the first page's revision),
    /// started over when that revision was compacted before a later page was read.
    fn scan_restarting(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
        guards: &[KeyGuard],
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut restarts = 0;
        loop {
            match self.scan_at(tree, range, dir, limit, None, guards) {
                Ok(s) => return Ok(s.pairs),
                // The revision pinned by page 1 was compacted before a later page: start over.
                Err(Failure::Compacted) if restarts < SCAN_RESTARTS => restarts += 1,
                Err(f) => return Err(f.into()),
            }
        }
    }

    /// Connects to the cluster of `cfg` and checks it answers (one read, under the deadline),
    /// so a wrong or dead endpoint fails here with [`KvError::Unavailable`].
    pub fn connect(cfg: &EtcdConfig, registry: UpdateRegistry) -> KvResult<Self> {
        if cfg.prefix.contains(&0) {
            return Err(KvError::Unavailable(
                "etcd prefix must not contain NUL".into(),
            ));
        }
        let endpoints = cfg.endpoints.join(",");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fern-etcd")
            .enable_all()
            .build()
            .map_err(KvError::Io)?;
        let opts = connect_options(cfg)?;
        let client = new_client(&rt, cfg, opts, &endpoints).map_err(KvError::from)?;
        let store = Self {
            rt,
            client: RwLock::new(client),
            cfg: cfg.clone(),
            ks: Keyspace::new(&cfg.prefix),
            registry,
            limits: ETCD_LIMITS,
            timeout: cfg.timeout,
            endpoints,
            requests: AtomicU64::new(0),
            known: Mutex::new(BTreeMap::new()),
            lease: Mutex::new(None),
            held: RwLock::new(Vec::new()),
        };
        let probe = store.ks.all();
        store.call(Resend::Always, |mut kv| {
            let (lo, hi) = (probe.lo.clone(), probe.hi.clone());
            async move {
                kv.get(lo, Some(GetOptions::new().with_range(hi).with_count_only()))
                    .await
            }
        })?;
        Ok(store)
    }

    /// The same store enforcing `limits` where they are stricter than etcd's.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = self.limits.tightened(limits);
        self
    }

    /// Removes every key of this file system (one etcd range delete).
    pub fn destroy(&self) -> KvResult<()> {
        let all = self.ks.all();
        self.call(Resend::IfNotSent, |mut kv| {
            let (lo, hi) = (all.lo.clone(), all.hi.clone());
            async move {
                kv.delete(lo, Some(etcd_client::DeleteOptions::new().with_range(hi)))
                    .await
            }
        })?;
        Ok(())
    }

    /// etcd requests (round trips) this store has sent, the connection probe included: what
    /// an operation costs on the network (docs/distributed.md §8).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.ks
    }

    /// The current connection (a clone: cheap, and no lock held while it is used).
    pub(crate) fn client(&self) -> Client {
        self.client.read().clone()
    }

    /// The runtime the store's calls and tasks run on.
    pub(crate) fn rt(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// Runs one etcd call under the deadline. Within the deadline the call is sent again
    /// after a failure that `resend` allows: a read after any failure to reach the cluster (a
    /// member that died is still in the client's endpoint list), a write only when it never
    /// left this machine (resending one that may have reached etcd could apply it twice).
    pub(crate) fn call<T, F, Fut>(&self, resend: Resend, f: F) -> Result<T, Failure>
    where
        F: Fn(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut reconnected = false;
        loop {
            let kv = self
                .client
                .read()
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES)
                .max_encoding_message_size(MAX_RESPONSE_BYTES);
            let left = deadline.saturating_duration_since(Instant::now());
            let fut = f(kv);
            self.requests.fetch_add(1, Ordering::Relaxed);
            let failure = match self
                .rt
                .block_on(async { tokio::time::timeout(left, fut).await })
            {
                Err(_) => return Err(timed_out(&self.endpoints, self.timeout)),
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => classify(e, &self.endpoints),
            };
            if let Failure::TokenExpired(_) = failure {
                if reconnected {
                    return Err(failure);
                }
                // A fresh connection authenticates again; the refused request is resent.
                let opts = connect_options(&self.cfg).map_err(Failure::Kv)?;
                *self.client.write() = new_client(&self.rt, &self.cfg, opts, &self.endpoints)?;
                reconnected = true;
                continue;
            }
            let again = matches!(
                (&failure, resend),
                (Failure::NotSent(_), _) | (Failure::Kv(KvError::Unavailable(_)), Resend::Always)
            );
            if !again || Instant::now() + RESEND_PAUSE >= deadline {
                return Err(failure);
            }
            std::thread::sleep(RESEND_PAUSE);
        }
    }

    /// Reads `key` of `tree` at `revision` (latest when `None`), if every guard holds then
    /// (`guards` only with `revision == None`).
    pub(crate) fn get_at(
        &self,
        tree: TreeId,
        key: &[u8],
        revision: Option<i64>,
        guards: &[KeyGuard],
    ) -> Result<Point, Failure> {
        let k = self.ks.key(tree, key).map_err(Failure::Kv)?;
        let mut opts = GetOptions::new();
        if let Some(rev) = revision {
            opts = opts.with_revision(rev);
        }
        let (resp, revision) = self.range(guards, &k, &opts)?;
        Ok(match resp.kvs().first() {
            Some(kv) => Point {
                value: Some(kv.value().to_vec()),
                mod_revision: kv.mod_revision(),
                revision,
            },
            None => Point {
                value: None,
                mod_revision: 0,
                revision,
            },
        })
    }

    /// Up to `limit` pairs of `range`, in pages, every page at the first page's revision (or
    /// at `revision` when given); the first page only if every guard holds when it is read
    /// (`guards` only with `revision == None`).
    pub(crate) fn scan_at(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
        revision: Option<i64>,
        guards: &[KeyGuard],
    ) -> Result<Scanned, Failure> {
        let tag_len = self.ks.tag(tree).map_err(Failure::Kv)?.len();
        let mut out = Scanned {
            pairs: Vec::new(),
            mod_revisions: Vec::new(),
            revision,
        };
        let r = self.ks.range(tree, range).map_err(Failure::Kv)?;
        if limit == 0 || range.is_empty() || r.is_empty() {
            // No page is read, so no page checks the guards: a read of a guarded key does.
            if let Some(g) = guards.first() {
                self.get_at(g.tree, &g.key, None, guards)?;
            }
            return Ok(out);
        }
        let (mut lo, mut hi) = (r.lo, r.hi);
        loop {
            let want = (limit - out.pairs.len()).min(PAGE);
            let mut opts = GetOptions::new()
                .with_range(hi.clone())
                .with_limit(want as i64);
            if let Some(rev) = out.revision {
                opts = opts.with_revision(rev);
            }
            if dir == Direction::Reverse {
                opts = opts.with_sort(SortTarget::Key, SortOrder::Descend);
            }
            // Later pages are at the first page's revision: the guards held for them too.
            let page_guards = if out.revision.is_none() { guards } else { &[] };
            let (resp, rev) = self.range(page_guards, &lo, &opts)?;
            out.revision.get_or_insert(rev);
            let kvs = resp.kvs();
            let mut last = None;
            for kv in kvs {
                let key = kv.key();
                let Some(user_key) = key.get(tag_len..) else {
                    return Err(Failure::Kv(KvError::Backend(
                        format!("etcd returned key {key:?} outside the scanned tree").into(),
                    )));
                };
                out.pairs.push((user_key.to_vec(), kv.value().to_vec()));
                out.mod_revisions.push(kv.mod_revision());
                last = Some(key.to_vec());
            }
            let Some(last) = last else { break };
            if kvs.len() < want || !resp.more() || out.pairs.len() >= limit {
                break;
            }
            match dir {
                Direction::Forward => {
                    lo = last;
                    lo.push(0);
                }
                Direction::Reverse => hi = last,
            }
        }
        Ok(out)
    }

    /// The stored values and revisions of `keys`, all at one revision (one read-only Txn).
    pub(crate) fn read_keys(&self, keys: &[Vec<u8>]) -> KvResult<HashMap<Vec<u8>, Stored>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
        let resp = self.call(Resend::Always, |mut kv| {
            let ops = ops.clone();
            async move { kv.txn(Txn::new().and_then(ops)).await }
        })?;
        stored_from(keys, &resp.op_responses())
    }

    /// The states of `keys` for planning: the last known ones, the others read (one Txn).
    fn known_or_read(&self, keys: &[Vec<u8>]) -> KvResult<HashMap<Vec<u8>, Stored>> {
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let known = self.known.lock();
            for k in keys {
                match known.get(k) {
                    Some(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    None => missing.push(k.clone()),
                }
            }
        }
        let read = self.read_keys(&missing)?;
        self.remember(read.iter().map(|(k, s)| (k.clone(), s.clone())));
        out.extend(read);
        Ok(out)
    }

    fn remember(&self, states: impl IntoIterator<Item = (Vec<u8>, Stored)>) {
        let mut known = self.known.lock();
        for (k, s) in states {
            if known.len() >= KNOWN_KEYS {
                known.clear();
            }
            known.insert(k, s);
        }
    }

    /// Records what a successful Txn at revision `rev` wrote (every key it writes gets `rev`).
    fn remember_writes(&self, ops: &[EtcdOp], upserted: &[Guard], rev: i64) {
        let is_upserted = |k: &[u8]| {
            upserted
                .iter()
                .any(|g| matches!(g, Guard::Key { key, .. } if key == k))
        };
        let mut states = Vec::new();
        {
            let mut known = self.known.lock();
            for op in ops {
                match op {
                    EtcdOp::Put(k, v) if v.len() <= KNOWN_PUT_BYTES || is_upserted(k) => {
                        states.push((
                            k.clone(),
                            Stored {
                                value: Some(v.clone()),
                                mod_revision: rev,
                            },
                        ));
                    }
                    EtcdOp::Put(k, _) => {
                        known.remove(k);
                    }
                    EtcdOp::Delete(k) => states.push((k.clone(), Stored::default())),
                    EtcdOp::DeleteRange(r) => {
                        let doomed: Vec<Vec<u8>> = known
                            .range(r.lo.clone()..r.hi.clone())
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in doomed {
                            known.remove(&k);
                        }
                    }
                }
            }
        }
        self.remember(states);
    }

    /// True when every guard holds now (a read-only Txn of the compares alone).
    fn guards_hold(&self, guards: &[Guard]) -> KvResult<bool> {
        let compares: Vec<Compare> = guards.iter().map(compare).collect();
        let resp = self.call(Resend::Always, |mut kv| {
            let compares = compares.clone();
            async move { kv.txn(Txn::new().when(compares)).await }
        })?;
        Ok(resp.succeeded())
    }

    /// Applies `batch` as one Txn guarded by `reads` (a transaction's read set; empty for a
    /// plain write). Upsert races are retried here; a failed read guard is
    /// [`KvError::Conflict`]. Nothing is sent for a batch that does not fit.
    /// `keys`: the transaction's key guards; one that does not hold is
    /// [`KvError::GuardFailed`].
    pub(crate) fn apply(
        &self,
        batch: &WriteBatch,
        reads: &[Guard],
        keys: &[KeyGuard],
    ) -> KvResult<()> {
        let needed = plan::needed_reads(batch, &self.ks, &self.registry, &self.limits)?;
        if batch.is_empty() && reads.is_empty() && keys.is_empty() {
            return Ok(());
        }
        let mut reads = reads.to_vec();
        reads.extend(self.value_guards(keys)?);
        let reads = &reads[..];
        let mut backoff = Backoff::new(UPSERT_RETRY);
        let mut stored = self.known_or_read(&needed)?;
        loop {
            let plan = plan::plan(batch, &self.ks, &self.registry, &stored)?;
            fits(&plan, reads, &needed)?;
            let compares: Vec<Compare> = reads.iter().chain(&plan.guards).map(compare).collect();
            let lease = self.lease_of(&plan.ops)?;
            let held = lease.as_ref().map(|(tags, id)| (tags.as_slice(), *id));
            let ops: Vec<TxnOp> = plan.ops.iter().map(|op| txn_op(op, held)).collect();
            // On failure, read back what the upserts need for the next attempt.
            let reread: Vec<TxnOp> = needed.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let txn = Txn::new().when(compares).and_then(ops).or_else(reread);
            let resp = self.call(Resend::IfNotSent, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })?;
            if resp.succeeded() {
                // Every key a Txn writes gets the Txn's revision.
                let rev = resp.header().map_or(0, |h| h.revision());
                self.remember_writes(&plan.ops, &plan.guards, rev);
                return Ok(());
            }
            stored = stored_from(&needed, &resp.op_responses())?;
            self.remember(stored.iter().map(|(k, s)| (k.clone(), s.clone())));
            if !reads.is_empty() && !self.guards_hold(reads)? {
                // A failed key guard is named (the caller revokes); else the read set moved.
                if !keys.is_empty() {
                    return Err(self.guard_failure(keys)?);
                }
                return Err(KvError::Conflict);
            }
            if !backoff.retry() {
                return Err(KvError::RetriesExhausted {
                    attempts: backoff.attempts(),
                });
            }
            if backoff.attempts() > FRESH_AFTER_ATTEMPTS {
                // The states the failed Txn read back are now a backoff old: under steady
                // contention other writers have committed since, and an attempt on them
                // cannot succeed — each later backoff is longer, so none would (the
                // conformance suite's upserting threads ran out of attempts that way).
                stored = self.read_keys(&needed)?;
                self.remember(stored.iter().map(|(k, s)| (k.clone(), s.clone())));
            }
        }
    }
}

/// The states of `keys` from the Range responses of a Txn, one per key in order.
fn stored_from(keys: &[Vec<u8>], resps: &[TxnOpResponse]) -> KvResult<HashMap<Vec<u8>, Stored>> {
    let found = read_answers(keys.len(), resps)?;
    Ok(keys
        .iter()
        .zip(found)
        .map(|(k, kv)| {
            let stored = kv.map_or_else(Stored::default, |kv| Stored {
                value: Some(kv.value().to_vec()),
                mod_revision: kv.mod_revision(),
            });
            (k.clone(), stored)
        })
        .collect())
}

/// What each of a Txn's `n` point reads (`TxnOp::get`, its only ops) found: the key's
/// current version, or `None` if absent. A response of another count or kind is a backend
/// error, never a silent gap.
pub(crate) fn read_answers(
    n: usize,
    resps: &[TxnOpResponse],
) -> KvResult<Vec<Option<&etcd_client::KeyValue>>> {
    if resps.len() != n {
        return Err(KvError::Backend(
            format!("etcd answered {n} reads with {} responses", resps.len()).into(),
        ));
    }
    resps
        .iter()
        .map(|r| match r {
            TxnOpResponse::Get(g) => Ok(g.kvs().first()),
            _ => Err(KvError::Backend(
                "etcd answered a read with another op".into(),
            )),
        })
        .collect()
}

/// Refuses a planned Txn that etcd would refuse (docs/distributed.md §3, item 3).
fn fits(plan: &plan::Plan, reads: &[Guard], reread: &[Vec<u8>]) -> KvResult<()> {
    if plan.ops.len() > MAX_TXN_OPS {
        return Err(KvError::TooLarge {
            what: "etcd operations per Txn (after upsert emulation and range splitting)",
            actual: plan.ops.len(),
            limit: MAX_TXN_OPS,
        });
    }
    let compares = plan.guards.len() + reads.len();
    if compares > MAX_TXN_OPS {
        return Err(KvError::TooLarge {
            what: "etcd compares per Txn (keys and ranges read, plus upserted keys)",
            actual: compares,
            limit: MAX_TXN_OPS,
        });
    }
    let bytes = plan.wire_bytes(reads, reread);
    if bytes > MAX_REQUEST_BYTES {
        return Err(KvError::TooLarge {
            what: "bytes per etcd request (after upsert emulation)",
            actual: bytes,
            limit: MAX_REQUEST_BYTES,
        });
    }
    Ok(())
}

pub(crate) fn compare(g: &Guard) -> Compare {
    match g {
        Guard::Key { key, mod_revision } => {
            Compare::mod_revision(key.clone(), CompareOp::Equal, *mod_revision)
        }
        Guard::Value { key, value: None } => Compare::version(key.clone(), CompareOp::Equal, 0),
        Guard::Value {
            key,
            value: Some(v),
        } => Compare::value(key.clone(), CompareOp::Equal, v.clone()),
        Guard::Range { range, below } => {
            Compare::mod_revision(range.lo.clone(), CompareOp::Less, *below)
                .with_range(range.hi.clone())
        }
    }
}

/// The Txn op of `op`; `lease`: the puts into held trees (their key, and the lease id).
fn txn_op(op: &EtcdOp, lease: Option<(&[Vec<u8>], i64)>) -> TxnOp {
    match op {
        EtcdOp::Put(k, v) => {
            let held = lease.filter(|(tags, _)| tags.iter().any(|t| k.starts_with(t)));
            let opts = held.map(|(_, id)| etcd_client::PutOptions::new().with_lease(id));
            TxnOp::put(k.clone(), v.clone(), opts)
        }
        EtcdOp::Delete(k) => TxnOp::delete(k.clone(), None),
        EtcdOp::DeleteRange(EtcdRange { lo, hi }) => TxnOp::delete(
            lo.clone(),
            Some(etcd_client::DeleteOptions::new().with_range(hi.clone())),
        ),
    }
}

impl KvRead for EtcdStore {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        Ok(self
            .get_at(tree, key, None, &[])
            .map_err(KvError::from)?
            .value)
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan_restarting(tree, range, dir, limit, &[])
    }
}

impl KvStore for EtcdStore {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        self.ks.tree(name)
    }

    fn write(&self, batch: WriteBatch, _opts: WriteOptions) -> KvResult<()> {
        self.apply(&batch, &[], &[])
    }

    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        Ok(Box::new(EtcdTxn::new(self)))
    }

    fn sync(&self) -> KvResult<()> {
        // Every Txn was durable when it returned.
        Ok(())
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    /// One Txn: the guards' compares, then the Range.
    fn get_guarded(
        &self,
        guards: &[KeyGuard],
        tree: TreeId,
        key: &[u8],
    ) -> KvResult<Option<Vec<u8>>> {
        Ok(self.get_at(tree, key, None, guards)?.value)
    }

    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> KvResult<Vec<Option<Vec<u8>>>> {
        self.get_many_at(&[], keys)
    }

    fn get_many_guarded(
        &self,
        guards: &[KeyGuard],
        keys: &[(TreeId, Vec<u8>)],
    ) -> KvResult<Vec<Option<Vec<u8>>>> {
        self.get_many_at(guards, keys)
    }

    /// The ranges as Range ops in the first Txn of the keys.
    fn get_many_reading_ahead(
        &self,
        keys: &[(TreeId, Vec<u8>)],
        tree: TreeId,
        ranges: &[KeyRange],
        limit: usize,
    ) -> KvResult<fern_kv::ReadAhead> {
        self.read_many_at(&[], keys, Some(tree), ranges, limit)
    }

    fn get_many_reading_ahead_guarded(
        &self,
        guards: &[KeyGuard],
        keys: &[(TreeId, Vec<u8>)],
        tree: TreeId,
        ranges: &[KeyRange],
        limit: usize,
    ) -> KvResult<fern_kv::ReadAhead> {
        self.read_many_at(guards, keys, Some(tree), ranges, limit)
    }

    /// The first page in one Txn with the guards' compares; later pages at its revision.
    fn scan_guarded(
        &self,
        guards: &[KeyGuard],
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan_restarting(tree, range, dir, limit, guards)
    }

    /// Every etcd store is shared: any number of mounts may open the same prefix.
    fn session(&self) -> KvResult<Option<&dyn KvSession>> {
        self.lease()?;
        Ok(Some(self))
    }
}

impl EtcdStore {
    /// The session's lease, granted on first use.
    fn lease(&self) -> KvResult<Arc<Lease>> {
        let mut l = self.lease.lock();
        if let Some(l) = &*l {
            return Ok(l.clone());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        // A clone, so no lock is held while the grant waits (a reconnect takes the lock).
        let client = self.client.read().clone();
        let granted = Arc::new(Lease::grant(
            &client,
            &self.rt,
            self.timeout,
            &self.endpoints,
        )?);
        *l = Some(granted.clone());
        Ok(granted)
    }
}

impl EtcdStore {
    /// The held tags and the live lease id, when some op of `ops` puts into a held tree.
    fn lease_of(&self, ops: &[EtcdOp]) -> KvResult<Option<(Vec<Vec<u8>>, i64)>> {
        let held = self.held.read().clone();
        let any = ops
            .iter()
            .any(|op| matches!(op, EtcdOp::Put(k, _) if held.iter().any(|t| k.starts_with(t))));
        if !any {
            return Ok(None);
        }
        Ok(Some((held, self.live_lease()?.id)))
    }

    /// The session's lease, unless etcd said it expired (then nothing may be put under it).
    /// Fault injection for tests: sends no periodic lease renewal for `d` from now (the
    /// lease itself stays alive on etcd for its TTL), as when the renewal stream lags after
    /// a leader election. Grants the session first if need be.
    #[doc(hidden)]
    pub fn stall_renewals(&self, d: Duration) -> KvResult<()> {
        let lease = self.live_lease()?;
        *lease.stalled_until.lock() = Instant::now() + d;
        Ok(())
    }

    fn live_lease(&self) -> KvResult<Arc<Lease>> {
        let lease = self.lease()?;
        if lease.lost.load(Ordering::Acquire) {
            return Err(KvError::Unavailable(format!(
                "etcd at {}: this mount's lease expired (cut off for longer than {:?})",
                self.endpoints,
                crate::session::LEASE_TTL
            )));
        }
        Ok(lease)
    }
}

impl KvSession for EtcdStore {
    fn id(&self) -> u64 {
        self.lease.lock().as_ref().map_or(0, |l| l.id as u64)
    }

    fn watch_puts(&self, tree: TreeId, on_put: Box<dyn Fn(Vec<u8>) + Send>) -> KvResult<()> {
        self.watch_tree_puts(tree, on_put)
    }

    fn wait_absent(&self, tree: TreeId, key: &[u8], timeout: Duration) -> KvResult<bool> {
        self.wait_key_absent(tree, key, timeout)
    }

    fn renew(&self) -> KvResult<()> {
        let lease = self.live_lease()?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let client = self.client.read().clone();
        lease.renew_now(&client, &self.rt, self.timeout, &self.endpoints)
    }

    fn valid_until(&self) -> Option<Instant> {
        let lease = self.lease.lock();
        let l = lease.as_ref()?;
        if l.lost.load(std::sync::atomic::Ordering::Acquire) {
            // Known gone: no later than now.
            return Some(Instant::now());
        }
        let until = *l.valid_until.lock();
        Some(until)
    }

    fn hold_tree(&self, tree: TreeId) -> KvResult<()> {
        self.live_lease()?;
        let tag = self.ks.tag(tree)?;
        let mut held = self.held.write();
        if !held.contains(&tag) {
            held.push(tag);
        }
        Ok(())
    }
}

impl Drop for EtcdStore {
    /// Revokes the session's lease, so this store's held keys disappear now rather than after
    /// the lease's time to live.
    fn drop(&mut self) {
        if let Some(l) = self.lease.lock().take() {
            let client = self.client.read().clone();
            l.revoke(&client, &self.rt, Duration::from_secs(1));
        }
    }
}

/// The part of a scan a transaction depends on, as an etcd range (see `occ::covered`).
pub(crate) fn covered_range(
    ks: &Keyspace,
    tree: TreeId,
    range: &KeyRange,
    dir: Direction,
    limit: usize,
    pairs: &[(Vec<u8>, Vec<u8>)],
) -> KvResult<EtcdRange> {
    ks.range(tree, &covered(range, dir, limit, pairs))
}
