//! Write-back of a whole store under one delegation (docs/design.md §7.3, fern-kv
//! `writeback`), on a real etcd: the conformance suite through the wrapper with each take
//! policy, and between two sessions of one prefix the invariants W1 (another session sees
//! every acknowledged write at its next read, by revoking), W3 (a flush is a few fenced Txns)
//! and W4 (a holder whose lease ended loses its buffer, says so, and applies nothing).

use std::sync::Arc;
use std::time::{Duration, Instant};

mod fs_common;
use fs_common::Owned;

use fern_etcd::local::{revoke_lease, shared_for_tests, unique_prefix};
use fern_etcd::{EtcdConfig, EtcdStore};
use fern_kv::{
    Direction, KeyRange, KvError, KvRead, KvStore, TakePolicy, UpdateRegistry, WriteBack,
    WriteBackConfig, WriteBatch, WriteOptions,
};

fn config(policy: TakePolicy) -> WriteBackConfig {
    WriteBackConfig {
        deleg_tree: "t.deleg".into(),
        revoke_tree: "t.revoke".into(),
        part: b"/".to_vec(),
        policy,
        cool_down: fern_kv::COOL_DOWN,
    }
}

fn wrap(cfg: &EtcdConfig, registry: UpdateRegistry, policy: TakePolicy) -> Arc<WriteBack> {
    let store = EtcdStore::connect(cfg, registry.clone()).expect("connect");
    WriteBack::open(Arc::new(store), registry, config(policy)).expect("write-back")
}

#[test]
fn conforms_through_write_back_holding_from_the_start() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    fern_kv::conformance::run_all(|r| {
        let wb = wrap(
            &etcd.config(&unique_prefix("wb-always")),
            r,
            TakePolicy::Always,
        );
        assert!(wb.holds(), "nobody else holds the part: taken at open");
        Owned(wb)
    });
}

/// Automatic takes: scenarios start free and take the part mid-way once they write enough.
#[test]
fn conforms_through_write_back_taking_when_busy() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    fern_kv::conformance::run_all(|r| {
        Owned(wrap(
            &etcd.config(&unique_prefix("wb-auto")),
            r,
            TakePolicy::Auto,
        ))
    });
}

/// What [`trio`] makes: the prefix's config, `a`'s inner store, `a`, `b`, `raw`.
type Trio = (
    EtcdConfig,
    Arc<EtcdStore>,
    Arc<WriteBack>,
    Arc<WriteBack>,
    EtcdStore,
);

/// A holder `a` (write-back), a second session `b` (write-back, free while `a` holds), and a
/// plain store `raw` of the same prefix that sees only what is in etcd.
fn trio(what: &str) -> Option<Trio> {
    let etcd = shared_for_tests()?;
    let cfg = etcd.config(&unique_prefix(what));
    let inner = Arc::new(EtcdStore::connect(&cfg, UpdateRegistry::new()).expect("connect a"));
    let a = WriteBack::open(
        inner.clone(),
        UpdateRegistry::new(),
        config(TakePolicy::Always),
    )
    .expect("a");
    assert!(a.holds());
    let b = wrap(&cfg, UpdateRegistry::new(), TakePolicy::Auto);
    assert!(!b.holds());
    let raw = EtcdStore::connect(&cfg, UpdateRegistry::new()).expect("connect raw");
    Some((cfg, inner, a, b, raw))
}

#[test]
fn another_session_sees_every_acknowledged_write_at_its_next_read() {
    let Some((_, inner, a, b, raw)) = trio("wb-w1") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let before = inner.requests();
    for i in 0..50u32 {
        let mut w = WriteBatch::new();
        w.put(t, format!("k{i:03}").into_bytes(), i.to_be_bytes().to_vec());
        a.write(w, WriteOptions::NO_SYNC).expect("buffered write");
    }
    let spent = inner.requests() - before;
    assert!(spent <= 2, "50 buffered writes cost {spent} round trips");
    let tr = raw.tree("t").expect("tree");
    // The background flusher may have run (once a second); if it has not, nothing is there.
    let there = raw
        .scan(tr, &KeyRange::all(), Direction::Forward, 100)
        .expect("raw scan")
        .len();
    assert!(
        there == 0 || there == 50,
        "a flush sends whole batches: {there}"
    );
    // W1: B's next read revokes; A flushes first, then releases.
    let started = Instant::now();
    let tb = b.tree("t").expect("tree");
    let seen = b
        .scan(tb, &KeyRange::all(), Direction::Forward, 100)
        .expect("b scan");
    assert_eq!(seen.len(), 50, "B sees all of A's acknowledged writes");
    assert_eq!(seen[7].1, 7u32.to_be_bytes().to_vec());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "revoked by request, not by a TTL"
    );
    assert!(!a.holds(), "A gave the part back");
    // And A, free now, sees B's write at once (B is free too: Auto needs a burst).
    let mut w = WriteBatch::new();
    w.put(tb, b"from-b".to_vec(), b"1".to_vec());
    b.write(w, WriteOptions::NO_SYNC).expect("b write");
    assert_eq!(
        a.get(t, b"from-b").expect("a get").as_deref(),
        Some(&b"1"[..])
    );
}

/// A blind write of a free session while another holds the part revokes the holder and
/// then applies: it is never refused as a conflict (fern-fs writes file data with plain
/// writes, which nobody reruns: two busy mounts trading the delegation gave `fs_mark`
/// "write failed: Resource temporarily unavailable").
#[test]
fn a_free_sessions_blind_write_under_a_holder_applies_after_the_revocation() {
    let Some((_, _, a, b, raw)) = trio("wb-blind") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"a".to_vec(), b"1".to_vec());
    a.write(w, WriteOptions::NO_SYNC).expect("buffered write");
    let tb = b.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(tb, b"b".to_vec(), b"2".to_vec());
    b.write(w, WriteOptions::NO_SYNC)
        .expect("a blind write under a holder");
    assert!(!a.holds(), "A gave the part back");
    let tr = raw.tree("t").expect("tree");
    let all = raw
        .scan(tr, &KeyRange::all(), Direction::Forward, 10)
        .expect("raw scan");
    assert_eq!(
        all,
        vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec())
        ],
        "A's buffered write went first, then B's"
    );
}

/// A holder remembers what a scan covered: a read of a key the scan found absent asks the
/// store nothing (a create's lookup of a new name in a directory just listed), while a key
/// outside the scanned range is still read from the store.
#[test]
fn a_holder_answers_reads_inside_a_range_it_scanned_without_the_store() {
    let Some((_, inner, a, _b, _raw)) = trio("wb-scanned") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"d/1".to_vec(), b"1".to_vec());
    w.put(t, b"d/3".to_vec(), b"3".to_vec());
    a.write(w, WriteOptions::SYNC).expect("write + flush");
    a.sync().expect("sync");
    let rows = a
        .scan(t, &KeyRange::prefix(b"d/"), Direction::Forward, 100)
        .expect("scan");
    assert_eq!(rows.len(), 2);
    let before = inner.requests();
    assert_eq!(a.get(t, b"d/2").expect("get"), None);
    assert_eq!(a.get(t, b"d/3").expect("get").as_deref(), Some(&b"3"[..]));
    assert_eq!(
        inner.requests() - before,
        0,
        "answered from the scanned range"
    );
    assert_eq!(a.get(t, b"e/1").expect("get"), None);
    assert_eq!(
        inner.requests() - before,
        1,
        "outside it, the store is read"
    );
}

#[test]
fn a_sync_sends_the_buffer_in_a_few_fenced_txns() {
    let Some((_, inner, a, _b, raw)) = trio("wb-w3") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let add = |i: u32| {
        let mut txn = a.begin().expect("begin");
        // A read-modify-write: reads its key (absent) and a counter, writes both.
        let old = txn
            .get(t, b"count")
            .expect("get")
            .map_or(0, |v| u32::from_be_bytes(v.try_into().expect("u32")));
        txn.batch()
            .put(t, b"count".to_vec(), (old + 1).to_be_bytes().to_vec());
        txn.batch()
            .put(t, format!("f{i:04}").into_bytes(), vec![7; 100]);
        txn.commit(WriteOptions::NO_SYNC).expect("commit");
    };
    for i in 0..300 {
        add(i);
    }
    let before = inner.requests();
    a.sync().expect("sync");
    let spent = inner.requests() - before;
    // 600 ops, 127 per Txn at most (the fence is a compare): 5 Txns, if no timer flush ran.
    assert!(spent <= 6, "the flush took {spent} round trips");
    let tr = raw.tree("t").expect("tree");
    assert_eq!(
        raw.get(tr, b"count").expect("count"),
        Some(300u32.to_be_bytes().to_vec())
    );
    let all = raw
        .scan(tr, &KeyRange::prefix(b"f"), Direction::Forward, 1000)
        .expect("scan");
    assert_eq!(all.len(), 300);
    assert!(a.holds(), "a sync keeps the delegation");
}

#[test]
fn a_holder_whose_lease_ended_loses_its_buffer_and_says_so() {
    let Some((cfg, inner, a, _b, raw)) = trio("wb-w4") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"synced".to_vec(), b"1".to_vec());
    a.write(w, WriteOptions::SYNC).expect("synced write");
    let mut w = WriteBatch::new();
    w.put(t, b"buffered".to_vec(), b"2".to_vec());
    a.write(w, WriteOptions::NO_SYNC).expect("buffered write");
    // A partition longer than the TTL, as etcd sees it.
    let id = inner.session().expect("session").expect("shared").id();
    revoke_lease(&cfg, id);
    match a.sync() {
        Err(KvError::Unavailable(why)) => assert!(why.contains("lost"), "{why}"),
        other => panic!("W4: a fenced-off flush must fail, got {other:?}"),
    }
    let tr = raw.tree("t").expect("tree");
    assert_eq!(
        raw.get(tr, b"synced").expect("get").as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        raw.get(tr, b"buffered").expect("get"),
        None,
        "nothing applied"
    );
    assert!(
        matches!(a.get(t, b"synced"), Err(KvError::Unavailable(_))),
        "every later operation fails"
    );
}

/// W6: with etcd frozen (every member SIGSTOPped: to the holder, an unreachable store), the
/// holder answers from its overlay only while its lease is known alive; once fewer than 3 s
/// of it can remain, its reads and commits fail instead of answering from a cache another
/// session could by then have overtaken. (Without W6 the read below answers "1".)
#[test]
fn a_holder_cut_off_from_etcd_stops_answering_before_its_lease_can_expire() {
    if shared_for_tests().is_none() {
        return;
    }
    // A server of its own: freezing the shared one would stall the other tests.
    let etcd = fern_etcd::local::LocalEtcd::start().expect("etcd");
    let mut cfg = etcd.config(&unique_prefix("wb-w6"));
    cfg.timeout = Duration::from_millis(1500);
    let a = wrap(&cfg, UpdateRegistry::new(), TakePolicy::Always);
    assert!(a.holds());
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"k".to_vec(), b"1".to_vec());
    a.write(w, WriteOptions::SYNC).expect("write");
    assert_eq!(a.get(t, b"k").expect("cached").as_deref(), Some(&b"1"[..]));
    etcd.pause().expect("SIGSTOP etcd");
    // The last answered renewal was sent at most ~2 s before the freeze; 10 s of TTL minus
    // 3 s of margin: by 7 s of silence the holder must refuse (8 s for slack).
    std::thread::sleep(Duration::from_secs(8));
    let r = a.get(t, b"k");
    let w = {
        let mut w = WriteBatch::new();
        w.put(t, b"k2".to_vec(), b"2".to_vec());
        a.write(w, WriteOptions::NO_SYNC)
    };
    etcd.resume().expect("SIGCONT etcd");
    assert!(
        matches!(r, Err(KvError::Unavailable(_))),
        "W6: a cut-off holder answered a read: {r:?}"
    );
    assert!(
        matches!(w, Err(KvError::Unavailable(_))),
        "W6: a cut-off holder took a write: {w:?}"
    );
}

/// W6 without a partition: when the periodic lease renewals lag (after a leader election the
/// renewal stream can stay silent for seconds while the cluster already answers), a holder
/// renews once itself before refusing, and answers. Before, it answered EIO until the stream
/// came back: a mount with `delegations=auto` failed reads of acknowledged files after
/// leader kills (fernfs `etcd_faults`, 1 run in 4).
#[test]
fn a_holder_whose_renewals_lag_renews_and_answers() {
    let Some((_cfg, inner, a, _b, _raw)) = trio("wb-w6-lag") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"k".to_vec(), b"1".to_vec());
    a.write(w, WriteOptions::NO_SYNC).expect("buffered write");
    let session = inner.session().expect("session").expect("shared");
    let before = session.valid_until().expect("etcd bounds its sessions");
    inner
        .stall_renewals(Duration::from_secs(30))
        .expect("stall");
    // 10 s TTL, 3 s margin: after 8 s without a renewal the periodic one is too old.
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        a.get(t, b"k").expect("W6 renews, then answers").as_deref(),
        Some(&b"1"[..])
    );
    assert!(
        session.valid_until().expect("bounded") > before + Duration::from_secs(7),
        "the holder renewed its lease itself"
    );
    assert!(a.holds(), "still the holder");
    a.sync().expect("sync");
}

/// W3 with etcd's rule that a Txn cannot put a key inside a range it deletes: buffered puts
/// under an earlier buffered range delete (a truncate, then writes) cost etcd a split piece
/// each, and a flush must cut its Txns by that count. Before, 1 range delete and 127 puts
/// under it made one Txn of 255 ops, refused by etcd at every flush: nothing buffered could
/// ever be sent.
#[test]
fn puts_under_a_buffered_range_delete_flush_within_etcds_limits() {
    let Some((_, _, a, _b, raw)) = trio("wb-pieces") else {
        return;
    };
    let t = a.tree("t").expect("tree");
    let mut w = WriteBatch::new();
    w.put(t, b"f/old".to_vec(), b"x".to_vec());
    a.write(w, WriteOptions::SYNC).expect("synced");
    let mut w = WriteBatch::new();
    w.delete_range(t, b"f/".to_vec(), b"f0".to_vec());
    a.write(w, WriteOptions::NO_SYNC).expect("range delete");
    for i in 0..200u32 {
        let mut w = WriteBatch::new();
        w.put(t, format!("f/{i:03}").into_bytes(), b"v".to_vec());
        a.write(w, WriteOptions::NO_SYNC).expect("put");
    }
    a.sync().expect("the flush fits etcd's limits");
    let tr = raw.tree("t").expect("tree");
    let got = raw
        .scan(tr, &KeyRange::prefix(b"f/"), Direction::Forward, 1000)
        .expect("scan");
    assert_eq!(got.len(), 200, "every put, and not the deleted key");
    assert!(got.iter().all(|(k, _)| k.as_slice() != b"f/old"));
}
