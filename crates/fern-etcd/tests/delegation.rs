//! The delegation protocol of docs/design.md §7 (fern-kv `deleg.rs`, invariants D1–D4) and
//! the key guards it stands on, between two sessions (two `EtcdStore`s, as two mounts) of one
//! prefix on a real etcd; and a holder killed with SIGKILL with a batch buffered: what it
//! flushed under the fence is there, what it had not flushed is not, and its delegation ends
//! with its lease.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fern_etcd::local::{revoke_lease, shared_for_tests, unique_prefix};
use fern_etcd::{EtcdConfig, EtcdStore, LEASE_TTL};
use fern_kv::{Delegations, Grant, KvError, KvRead, KvSession, KvStore, WriteBatch, WriteOptions};

const DELEG: &str = "t.deleg";
const REVOKE: &str = "t.revoke";
/// The child process of `a_killed_holder...`: its store's URL prefix.
const CHILD_ENV: &str = "FERN_DELEG_TEST_CHILD";
/// What the child prints once its flushes returned (not a word of the test's name, which the
/// harness prints too).
const FLUSHED: &str = "HOLDER-FLUSHED-100";

fn pair(what: &str) -> Option<(EtcdConfig, Arc<EtcdStore>, Arc<EtcdStore>)> {
    let etcd = shared_for_tests()?;
    let cfg = etcd.config(&unique_prefix(what));
    let a = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect a");
    let b = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect b");
    Some((cfg, Arc::new(a), Arc::new(b)))
}

fn deleg(s: &EtcdStore) -> Delegations {
    let session = s.session().expect("session").expect("shared");
    Delegations::open(s, session, DELEG, REVOKE).expect("open")
}

fn session(s: &EtcdStore) -> &dyn KvSession {
    s.session().expect("session").expect("shared")
}

/// Writes `batch` under the fence of `grant`, as a holder's flush does.
fn flush(
    s: &EtcdStore,
    d: &Delegations,
    grant: &Grant,
    batch: &WriteBatch,
) -> fern_kv::KvResult<()> {
    let mut txn = s.begin()?;
    txn.guard(&d.fence(grant))?;
    *txn.batch() = batch.clone();
    txn.commit(WriteOptions::SYNC)
}

#[test]
fn one_session_holds_a_part_and_the_others_guarded_reads_fail() {
    let Some((_, a, b)) = pair("deleg1") else {
        return;
    };
    let (da, db) = (deleg(&a), deleg(&b));
    // Tree ids are each store's own (distributed.md §1): B reads with B's.
    let (ta, t) = (a.tree("t").expect("tree"), b.tree("t").expect("tree"));
    let mut w = WriteBatch::new();
    w.put(ta, b"d/x", b"1");
    a.write(w, WriteOptions::SYNC).expect("put");
    // Free: B's guarded read answers in one round trip.
    let before = b.requests();
    assert_eq!(
        b.get_guarded(&[db.free(b"d")], t, b"d/x")
            .expect("free")
            .as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(b.requests() - before, 1, "a guarded read is one round trip");
    // D1. Taking and releasing are one Txn each.
    let before = a.requests();
    let g = da.take(&*a, b"d").expect("take").expect("nobody held it");
    assert_eq!(a.requests() - before, 1, "take is one round trip");
    assert_eq!(
        db.take(&*b, b"d").expect("take"),
        None,
        "D1: B cannot take it too"
    );
    assert_eq!(da.take(&*a, b"d").expect("take"), None, "nor A twice");
    match b.get_guarded(&[db.free(b"d")], t, b"d/x") {
        Err(KvError::GuardFailed { key, .. }) => assert_eq!(key, b"d"),
        other => panic!("B's read of a delegated part must fail its guard, got {other:?}"),
    }
    // B's guarded transaction too (its guard is a compare of the commit, not a read).
    let mut txn = b.begin().expect("begin");
    txn.guard(&db.free(b"d")).expect("a compare, no read");
    txn.batch().put(t, b"d/y".to_vec(), b"B".to_vec());
    assert!(matches!(
        txn.commit(WriteOptions::SYNC),
        Err(KvError::GuardFailed { .. })
    ));
    assert_eq!(a.get(ta, b"d/y").expect("get"), None, "nothing applied");
    // Another part is not affected.
    assert!(db.take(&*b, b"e").expect("take").is_some());
    // Released: free again, B may take it.
    let before = a.requests();
    assert!(da.release(&*a, &g).expect("release"));
    assert_eq!(a.requests() - before, 1, "release is one round trip");
    assert!(b.get_guarded(&[db.free(b"d")], t, b"d/x").is_ok());
    assert!(db.take(&*b, b"d").expect("take").is_some());
}

#[test]
fn a_revocation_makes_the_holder_flush_before_it_releases() {
    let Some((_, a, b)) = pair("deleg2") else {
        return;
    };
    let (da, db) = (Arc::new(deleg(&a)), deleg(&b));
    let (ta, t) = (a.tree("t").expect("tree"), b.tree("t").expect("tree"));
    let g = da.take(&*a, b"d").expect("take").expect("free");
    // A's buffer: a create B must see once it has revoked.
    let mut buffered = WriteBatch::new();
    buffered.put(ta, b"d/new", b"A's");
    let state = Arc::new(Mutex::new(Some((g, buffered))));
    let heard = Arc::new(Mutex::new(Vec::new()));
    {
        let (a, da, state, heard) = (a.clone(), da.clone(), state.clone(), heard.clone());
        da.clone()
            .watch(
                session(&a.clone()),
                Box::new(move |part| {
                    heard.lock().unwrap().push(part.clone());
                    let mut st = state.lock().unwrap();
                    let Some((g, batch)) = st.take_if(|(g, _)| g.key == part) else {
                        return; // not held here
                    };
                    flush(&a, &da, &g, &batch).expect("flush under the fence");
                    assert!(da.release(&*a, &g).expect("release"));
                }),
            )
            .expect("watch");
    }
    assert_eq!(
        b.get(t, b"d/new").expect("get"),
        None,
        "buffered: not in the store"
    );
    let start = Instant::now();
    assert!(db
        .revoke(&*b, session(&b), b"d", Duration::from_secs(5))
        .expect("revoke"));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "answered by the holder, not a TTL"
    );
    assert_eq!(
        b.get_guarded(&[db.free(b"d")], t, b"d/new")
            .expect("free now")
            .as_deref(),
        Some(&b"A's"[..]),
        "D3: the holder flushed before it released"
    );
    assert!(state.lock().unwrap().is_none());
    assert_eq!(heard.lock().unwrap().as_slice(), [b"d".to_vec()]);
    // The request is gone, and revoking a free part costs no wait.
    let r = b.tree(REVOKE).expect("tree");
    let reqs = b
        .scan(
            r,
            &fern_kv::KeyRange::all(),
            fern_kv::Direction::Forward,
            10,
        )
        .expect("scan");
    assert!(reqs.is_empty(), "requests left: {reqs:?}");
    let before = b.requests();
    assert!(db
        .revoke(&*b, session(&b), b"d", Duration::ZERO)
        .expect("revoke"));
    assert_eq!(b.requests() - before, 1, "revoking a free part is one read");
}

/// A request put before the holder watches is heard: the watch starts with a listing.
#[test]
fn a_request_made_before_the_holder_watches_is_heard() {
    let Some((_, a, b)) = pair("deleg5") else {
        return;
    };
    let (da, db) = (Arc::new(deleg(&a)), deleg(&b));
    let g = da.take(&*a, b"d").expect("take").expect("free");
    let revoker = {
        let b = b.clone();
        std::thread::spawn(move || {
            db.revoke(&*b, session(&b), b"d", Duration::from_secs(8))
                .expect("revoke")
        })
    };
    // Let B's request land before A watches.
    let r = a.tree(REVOKE).expect("tree");
    let start = Instant::now();
    while a
        .scan(r, &fern_kv::KeyRange::all(), fern_kv::Direction::Forward, 1)
        .expect("scan")
        .is_empty()
    {
        assert!(start.elapsed() < Duration::from_secs(5), "no request");
        std::thread::sleep(Duration::from_millis(10));
    }
    let held = Arc::new(Mutex::new(Some(g)));
    {
        let (a2, da2, held) = (a.clone(), da.clone(), held.clone());
        da.watch(
            session(&a),
            Box::new(move |part| {
                if let Some(g) = held.lock().unwrap().take_if(|g| g.key == part) {
                    assert!(da2.release(&*a2, &g).expect("release"));
                }
            }),
        )
        .expect("watch");
    }
    assert!(
        revoker.join().expect("revoker"),
        "released after the listing"
    );
    assert!(held.lock().unwrap().is_none());
}

#[test]
fn a_holder_whose_lease_ended_is_fenced_and_cannot_release_anothers_grant() {
    let Some((cfg, a, b)) = pair("deleg3") else {
        return;
    };
    let (da, db) = (deleg(&a), deleg(&b));
    let (ta, t) = (a.tree("t").expect("tree"), b.tree("t").expect("tree"));
    let g = da.take(&*a, b"d").expect("take").expect("free");
    let mut early = WriteBatch::new();
    early.put(ta, b"d/early", b"1");
    flush(&a, &da, &g, &early).expect("fenced flush while held");
    // A partition longer than the TTL, as etcd sees it: A's lease ends.
    revoke_lease(&cfg, session(&a).id());
    assert!(
        db.take(&*b, b"d").expect("take").is_some(),
        "the key went with A's lease"
    );
    let mut late = WriteBatch::new();
    late.put(ta, b"d/late", b"stale");
    match flush(&a, &da, &g, &late) {
        Err(KvError::GuardFailed { key, .. }) => assert_eq!(key, b"d"),
        other => panic!("D2: a late flush must be fenced, got {other:?}"),
    }
    assert_eq!(
        b.get(t, b"d/late").expect("get"),
        None,
        "nothing of it applied"
    );
    assert_eq!(
        b.get(t, b"d/early").expect("get").as_deref(),
        Some(&b"1"[..])
    );
    assert!(
        !da.release(&*a, &g).expect("release"),
        "D4: not A's any more"
    );
    assert!(
        !db.revoke(&*b, session(&b), b"d", Duration::ZERO)
            .expect("revoke"),
        "B still holds it"
    );
}

#[test]
fn a_killed_holders_flushed_batch_stays_its_buffer_is_lost_and_its_grant_expires() {
    if let Ok(prefix) = std::env::var(CHILD_ENV) {
        return child_holder(&prefix);
    }
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let prefix = unique_prefix("deleg4");
    let cfg = etcd.config(&prefix);
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "a_killed_holders_flushed_batch_stays_its_buffer_is_lost_and_its_grant_expires",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{}|{prefix}", etcd.endpoints().join(",")),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the holder");
    // The child prints FLUSHED once its fsync-like flushes returned.
    let mut out = child.stdout.take().expect("stdout");
    let mut child = KillOnDrop(child);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains(FLUSHED) {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut out, &mut buf).expect("read child");
        assert!(n > 0 && Instant::now() < deadline, "child ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // SIGKILL mid-batch: the child is writing its second batch into its buffer.
    child.0.kill().expect("kill -9");
    child.0.wait().expect("reap");
    let b = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect");
    let db = deleg(&b);
    let t = b.tree("t").expect("tree");
    let start = Instant::now();
    assert!(
        db.revoke(&b, session(&b), b"d", LEASE_TTL + Duration::from_secs(5))
            .expect("revoke"),
        "a dead holder's delegation ends with its lease"
    );
    assert!(start.elapsed() <= LEASE_TTL + Duration::from_secs(5));
    for i in 0..100u32 {
        let k = format!("d/acked{i}");
        assert_eq!(
            b.get_guarded(&[db.free(b"d")], t, k.as_bytes())
                .expect("read")
                .as_deref(),
            Some(&b"1"[..]),
            "{k}, flushed before the kill, was lost"
        );
    }
    let unflushed = b
        .scan(
            t,
            &fern_kv::KeyRange::prefix(b"d/buffered"),
            fern_kv::Direction::Forward,
            10,
        )
        .expect("scan");
    assert!(
        unflushed.is_empty(),
        "an unflushed buffer reached the store: {unflushed:?}"
    );
}

/// Kills the child if the test panics before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The holder: takes `d`, flushes 100 entries (as fsync would), says so, then buffers more
/// forever without flushing until it is killed.
fn child_holder(arg: &str) {
    let (endpoints, prefix) = arg.split_once('|').expect("endpoints|prefix");
    let cfg = EtcdConfig::new(endpoints.split(',').map(String::from).collect(), prefix);
    let a = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect");
    let da = deleg(&a);
    let t = a.tree("t").expect("tree");
    let g = da.take(&a, b"d").expect("take").expect("free");
    // Two Txns: batches of at most 127 ops, as a holder's flush chain is.
    for chunk in (0..100u32).collect::<Vec<_>>().chunks(50) {
        let mut batch = WriteBatch::new();
        for i in chunk {
            batch.put(t, format!("d/acked{i}").into_bytes(), b"1".to_vec());
        }
        flush(&a, &da, &g, &batch).expect("flush");
    }
    println!("{FLUSHED}");
    let mut buffer = WriteBatch::new();
    // Bounded, so a child whose parent died before killing it still ends.
    for i in 0u64..60_000 {
        buffer.put(t, format!("d/buffered{i}").into_bytes(), b"x".to_vec());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The holder's watch of revocation requests outlives the members it talks to: each member
/// of a 3-member cluster in turn is killed with SIGKILL and restarted, so whichever carries
/// the watch stream dies at least once; a put made while it is down and one made after each
/// restart are both heard (the stream resumes after its last event: docs/design.md §7.2).
#[test]
fn a_watch_resumes_across_member_kills_without_missing_a_put() {
    if shared_for_tests().is_none() {
        return;
    }
    let mut etcd = fern_etcd::local::LocalEtcd::start_cluster(3).expect("3 members");
    let mut cfg = etcd.config("watchkill");
    cfg.timeout = Duration::from_secs(3);
    let a = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect a");
    let b = EtcdStore::connect(&cfg, fern_kv::UpdateRegistry::new()).expect("connect b");
    let (ra, rb) = (a.tree("r").expect("tree"), b.tree("r").expect("tree"));
    let heard = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    {
        let heard = heard.clone();
        session(&a)
            .watch_puts(ra, Box::new(move |k| heard.lock().unwrap().push(k)))
            .expect("watch");
    }
    let put = |k: String| {
        let start = Instant::now();
        loop {
            let mut w = WriteBatch::new();
            w.put(rb, k.clone().into_bytes(), Vec::new());
            match b.write(w, WriteOptions::SYNC) {
                Ok(()) => return,
                Err(e) => assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "no write of {k} in 30 s: {e}"
                ),
            }
        }
    };
    let wait_heard = |k: &str| {
        let start = Instant::now();
        while !heard.lock().unwrap().iter().any(|h| h == k.as_bytes()) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{k} not heard 20 s after it was put; heard {:?}",
                heard.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    put("before".into());
    wait_heard("before");
    for i in 0..3 {
        etcd.kill_member(i).expect("kill -9");
        put(format!("down{i}"));
        etcd.restart_member(i).expect("restart");
        put(format!("up{i}"));
        wait_heard(&format!("down{i}"));
        wait_heard(&format!("up{i}"));
    }
}
