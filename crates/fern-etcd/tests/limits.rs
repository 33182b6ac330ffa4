//! What etcd imposes beyond the fern-kv contract (docs/distributed.md §3–§5): oversized batches
//! fail whole before anything is sent, range deletes split around keys put inside them,
//! conflicting transactions retry and converge, and a dead server is an error in bounded time.

use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, unique_prefix, LocalEtcd};
use fern_etcd::{EtcdConfig, EtcdStore};
use fern_kv::conformance::{registry, ADD_U64, APPEND};
use fern_kv::{
    transact, Direction, KeyRange, KvError, KvRead, KvStore, RetryPolicy, WriteBatch, WriteOptions,
};

fn fresh(what: &str) -> Option<EtcdStore> {
    let etcd = shared_for_tests()?;
    Some(EtcdStore::connect(&etcd.config(&unique_prefix(what)), registry()).expect("connect"))
}

fn count(s: &EtcdStore, tree: &str) -> usize {
    let t = s.tree(tree).expect("tree");
    s.scan(t, &KeyRange::all(), Direction::Forward, usize::MAX)
        .expect("scan")
        .len()
}

fn too_large(r: Result<(), KvError>) -> &'static str {
    match r {
        Err(KvError::TooLarge { what, .. }) => what,
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn batches_over_etcd_limits_fail_whole() {
    let Some(s) = fresh("limits") else { return };
    let t = s.tree("t").expect("tree");
    // 200 ops (> 128), about 1.6 MiB (> 1.5 MiB): refused before anything is sent.
    let mut b = WriteBatch::new();
    for i in 0..200u32 {
        b.put(t, i.to_be_bytes().to_vec(), vec![7u8; 8 << 10]);
    }
    assert!(b.bytes() > 1536 * 1024);
    too_large(s.write(b, WriteOptions::SYNC));
    // Within the op count but over the bytes.
    let mut b = WriteBatch::new();
    for i in 0..100u32 {
        b.put(t, i.to_be_bytes().to_vec(), vec![7u8; 16 << 10]);
    }
    too_large(s.write(b, WriteOptions::SYNC));
    assert_eq!(count(&s, "t"), 0, "a refused batch applies nothing");

    // Within every limit of the batch itself, but its upserts' results add up to over etcd's
    // 1.5 MiB request: caught after emulation, still before anything is sent.
    for chunk in 0..4u32 {
        let mut b = WriteBatch::new();
        for i in chunk * 25..(chunk + 1) * 25 {
            b.put(t, i.to_be_bytes().to_vec(), vec![1u8; 16 << 10]);
        }
        s.write(b, WriteOptions::SYNC).expect("fill");
    }
    let mut b = WriteBatch::new();
    for i in 0..100u32 {
        b.upsert(t, i.to_be_bytes().to_vec(), APPEND, b"!".to_vec());
    }
    let what = too_large(s.write(b, WriteOptions::SYNC));
    assert!(what.contains("after upsert emulation"), "{what}");
    let pairs = s
        .scan(t, &KeyRange::all(), Direction::Forward, 1000)
        .expect("scan");
    assert_eq!(pairs.len(), 100);
    assert!(
        pairs.iter().all(|(_, v)| v.len() == 16 << 10),
        "no upsert of the refused batch applied"
    );
    // The same upserts in resumable steps of 25 all land.
    for chunk in 0..4u32 {
        let mut b = WriteBatch::new();
        for i in chunk * 25..(chunk + 1) * 25 {
            b.upsert(t, i.to_be_bytes().to_vec(), APPEND, b"!".to_vec());
        }
        s.write(b, WriteOptions::SYNC).expect("step");
    }
    let pairs = s
        .scan(t, &KeyRange::all(), Direction::Forward, 1000)
        .expect("scan");
    assert!(pairs.iter().all(|(_, v)| v.len() == (16 << 10) + 1));
}

#[test]
fn range_deletes_split_around_keys_put_inside() {
    let Some(s) = fresh("split") else { return };
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    for i in 0..100u8 {
        b.put(t, vec![b'k', i], b"old".to_vec());
    }
    s.write(b, WriteOptions::SYNC).expect("fill");
    // A range delete and 60 puts inside it: 61 range pieces + 60 puts = 121 etcd ops.
    let mut b = WriteBatch::new();
    b.delete_range(t, b"k".to_vec(), b"l".to_vec());
    for i in (0..120u8).step_by(2) {
        b.put(t, vec![b'k', i], b"new".to_vec());
    }
    s.write(b, WriteOptions::SYNC).expect("split batch");
    let pairs = s
        .scan(t, &KeyRange::all(), Direction::Forward, 1000)
        .expect("scan");
    assert_eq!(pairs.len(), 60);
    assert!(pairs.iter().all(|(k, v)| k[1] % 2 == 0 && v == b"new"));
    // 100 puts inside: 101 pieces + 100 puts > 128 etcd ops although the batch has 101 ops.
    let mut b = WriteBatch::new();
    b.delete_range(t, b"k".to_vec(), b"l".to_vec());
    for i in 0..100u8 {
        b.put(t, vec![b'k', i], b"newer".to_vec());
    }
    let what = too_large(s.write(b, WriteOptions::SYNC));
    assert!(what.contains("operations"), "{what}");
    assert_eq!(count(&s, "t"), 60, "refused whole");
}

#[test]
fn conflicting_transactions_retry_and_converge() {
    let Some(s) = fresh("bank") else { return };
    let t = s.tree("t").expect("tree");
    const ACCOUNTS: u8 = 6;
    let mut b = WriteBatch::new();
    for a in 0..ACCOUNTS {
        b.put(t, vec![b'a', a], 100u64.to_be_bytes().to_vec());
    }
    s.write(b, WriteOptions::SYNC).expect("open accounts");
    let policy = RetryPolicy {
        max_attempts: 200,
        ..RetryPolicy::default()
    };
    let amount = |v: Option<Vec<u8>>| -> u64 {
        u64::from_be_bytes(v.expect("account").as_slice().try_into().expect("8 bytes"))
    };
    std::thread::scope(|scope| {
        for th in 0..4u8 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..25u8 {
                    let from = (th + i) % ACCOUNTS;
                    let to = (th * 3 + i + 1) % ACCOUNTS;
                    if from == to {
                        continue;
                    }
                    let r: Result<(), KvError> = transact(s, &policy, WriteOptions::SYNC, |txn| {
                        // Read every account through a scan (a range guard) and two
                        // points (key guards), then move 1 from one to the other.
                        let all = txn.scan(t, &KeyRange::prefix(b"a"), Direction::Forward, 64)?;
                        assert_eq!(all.len(), ACCOUNTS as usize, "torn snapshot");
                        let f = amount(txn.get(t, &[b'a', from])?);
                        let g = amount(txn.get(t, &[b'a', to])?);
                        txn.batch()
                            .put(t, vec![b'a', from], (f - 1).to_be_bytes().to_vec());
                        txn.batch()
                            .put(t, vec![b'a', to], (g + 1).to_be_bytes().to_vec());
                        Ok(())
                    });
                    r.expect("transfer converges within the retry bound");
                }
            });
        }
    });
    let total: u64 = s
        .scan(t, &KeyRange::prefix(b"a"), Direction::Forward, 64)
        .expect("scan")
        .into_iter()
        .map(|(_, v)| amount(Some(v)))
        .sum();
    assert_eq!(total, 100 * u64::from(ACCOUNTS), "money created or lost");
}

#[test]
fn unreachable_server_is_an_error_in_bounded_time() {
    if shared_for_tests().is_none() {
        return;
    }
    // Nothing listens on a port the kernel just handed out and took back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut cfg = EtcdConfig::new(vec![format!("http://127.0.0.1:{port}")], "x");
    cfg.timeout = Duration::from_secs(1);
    let start = Instant::now();
    match EtcdStore::connect(&cfg, registry()) {
        Err(KvError::Unavailable(msg)) => assert!(msg.contains("etcd"), "{msg}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );

    // A server that dies under a connected store: every call fails within the deadline.
    let etcd = LocalEtcd::start().expect("start a second etcd");
    let mut cfg = etcd.config("dying");
    cfg.timeout = Duration::from_secs(1);
    let s = EtcdStore::connect(&cfg, registry()).expect("connect");
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put(t, b"k".to_vec(), b"v".to_vec());
    s.write(b, WriteOptions::SYNC).expect("write while up");
    drop(etcd);
    for _ in 0..3 {
        let start = Instant::now();
        match s.get(t, b"k") {
            Err(KvError::Unavailable(msg)) => assert!(msg.contains("etcd"), "{msg}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let mut b = WriteBatch::new();
        b.put(t, b"k".to_vec(), b"w".to_vec());
        assert!(matches!(
            s.write(b, WriteOptions::SYNC),
            Err(KvError::Unavailable(_))
        ));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}

#[test]
fn two_stores_upserting_one_key_lose_nothing() {
    // Each store remembers the last state it wrote and tries its next upsert on it; the other
    // store's writes make that state stale, which the mod_revision compare must catch.
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let cfg = etcd.config(&unique_prefix("two"));
    let stores = [
        EtcdStore::connect(&cfg, registry()).expect("connect"),
        EtcdStore::connect(&cfg, registry()).expect("connect"),
    ];
    std::thread::scope(|scope| {
        for s in &stores {
            for _ in 0..2 {
                scope.spawn(move || {
                    let t = s.tree("t").expect("tree");
                    for _ in 0..100 {
                        let mut b = WriteBatch::new();
                        b.upsert(t, b"ctr".to_vec(), ADD_U64, 1u64.to_be_bytes().to_vec());
                        s.write(b, WriteOptions::NO_SYNC).expect("upsert");
                    }
                });
            }
        }
    });
    for s in &stores {
        let t = s.tree("t").expect("tree");
        assert_eq!(
            s.get(t, b"ctr").expect("get"),
            Some(400u64.to_be_bytes().to_vec()),
            "no upsert lost"
        );
    }
}

#[test]
fn an_upsert_under_steady_contention_completes() {
    // Another store puts the key back to back. An upsert whose attempts keep failing sleeps
    // longer and longer between them; if it then tried again on the state its failed attempt
    // read back — now a backoff old, with the other writer's commits after it — every later
    // attempt would fail too (the conformance suite's four upserting threads ran out of their
    // 64 attempts that way in CI). It must read again after a long backoff.
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let cfg = etcd.config(&unique_prefix("steady"));
    let (a, b) = (
        EtcdStore::connect(&cfg, registry()).expect("connect"),
        EtcdStore::connect(&cfg, registry()).expect("connect"),
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (b, stop) = (&b, &stop);
        for _ in 0..3 {
            scope.spawn(move || {
                let t = b.tree("t").expect("tree");
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut w = WriteBatch::new();
                    w.put(t, b"ctr".to_vec(), 0u64.to_be_bytes().to_vec());
                    b.write(w, WriteOptions::NO_SYNC).expect("put");
                }
            });
        }
        let t = a.tree("t").expect("tree");
        let result = (0..100).try_for_each(|_| {
            let mut w = WriteBatch::new();
            w.upsert(t, b"ctr".to_vec(), ADD_U64, 1u64.to_be_bytes().to_vec());
            a.write(w, WriteOptions::NO_SYNC)
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        result.expect("every upsert completes under steady contention");
    });
}

#[test]
fn a_frozen_server_is_an_error_in_bounded_time_and_the_store_recovers() {
    if shared_for_tests().is_none() {
        return;
    }
    let etcd = LocalEtcd::start().expect("start a private etcd");
    let mut cfg = etcd.config("frozen");
    cfg.timeout = Duration::from_secs(1);
    let s = EtcdStore::connect(&cfg, registry()).expect("connect");
    let t = s.tree("t").expect("tree");
    let put = |v: &[u8]| {
        let mut b = WriteBatch::new();
        b.put(t, b"k".to_vec(), v.to_vec());
        s.write(b, WriteOptions::SYNC)
    };
    put(b"before").expect("write while up");
    etcd.pause().expect("SIGSTOP etcd");
    let start = Instant::now();
    let got = s.get(t, b"k");
    assert!(matches!(got, Err(KvError::Unavailable(_))), "{got:?}");
    let got = put(b"during");
    assert!(matches!(got, Err(KvError::Unavailable(_))), "{got:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    etcd.resume().expect("SIGCONT etcd");
    // The write that timed out may or may not have landed (docs/distributed.md §5); after
    // that, the same store works again without reconnecting by hand.
    let seen = s.get(t, b"k").expect("read after the server is back");
    assert!(
        seen.as_deref() == Some(&b"before"[..]) || seen.as_deref() == Some(&b"during"[..]),
        "{seen:?}"
    );
    put(b"after").expect("write after the server is back");
    assert_eq!(s.get(t, b"k").expect("get").as_deref(), Some(&b"after"[..]));
}
