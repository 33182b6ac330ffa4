//! A 3-member cluster on loopback with its leader killed by SIGKILL (issue 14's fault proof,
//! one round): every write acknowledged before the kill is still there, writes during the
//! election fail with `Unavailable` (never wrong data), and the same store writes again once
//! a new leader is elected.

use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, LocalEtcd};
use fern_etcd::EtcdStore;
use fern_kv::conformance::registry;
use fern_kv::{
    Direction, KeyRange, KvError, KvRead, KvResult, KvStore, TreeId, WriteBatch, WriteOptions,
};

/// Writes row `i` (big-endian key, little-endian value) with a synchronous commit.
fn put_row(s: &EtcdStore, t: TreeId, i: u32) -> KvResult<()> {
    let mut b = WriteBatch::new();
    b.put(t, i.to_be_bytes().to_vec(), i.to_le_bytes().to_vec());
    s.write(b, WriteOptions::SYNC)
}

#[test]
fn leader_killed_nothing_acknowledged_lost_and_the_store_goes_on() {
    if shared_for_tests().is_none() {
        return;
    }
    let etcd = LocalEtcd::start_cluster(3).expect("start a 3-member cluster");
    let mut cfg = etcd.config("cluster");
    cfg.timeout = Duration::from_secs(2);
    let s = EtcdStore::connect(&cfg, registry()).expect("connect");
    let t = s.tree("t").expect("tree");
    let put = |i: u32| put_row(&s, t, i);
    for i in 0..50 {
        put(i).expect("write before the kill");
    }
    etcd.kill_member(etcd.leader().expect("a leader"))
        .expect("kill -9 the leader");
    let start = Instant::now();
    let mut failures = Vec::new();
    let mut i = 50;
    while i < 60 {
        match put(i) {
            Ok(()) => i += 1,
            Err(KvError::Unavailable(msg)) => failures.push(msg),
            Err(e) => panic!("a write during the election failed with {e}, not Unavailable"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no write succeeded 30 s after the leader died: {failures:?}"
        );
    }
    eprintln!(
        "10 writes after the kill took {:?}, {} failed on the way: {failures:?}",
        start.elapsed(),
        failures.len()
    );
    let all = s
        .scan(t, &KeyRange::all(), Direction::Forward, 1000)
        .expect("scan after the election");
    // Every acknowledged write is there; a failed (timed-out) one may be too, whole.
    for i in 0..60u32 {
        assert!(
            all.iter()
                .any(|(k, v)| *k == i.to_be_bytes() && *v == i.to_le_bytes()),
            "acknowledged write {i} lost"
        );
    }
}

/// A write that etcd refuses before proposing it (a member without a leader drops the
/// proposal: "raft proposal dropped"; "no leader", "leader changed" likewise) is sent again
/// within the deadline (docs/distributed.md §5), so a cluster that regains its quorum while the
/// write waits serves it: the caller sees a slow write, not an error.
#[test]
fn a_write_refused_for_want_of_a_leader_is_resent_until_one_is_elected() {
    if shared_for_tests().is_none() {
        return;
    }
    let mut etcd = LocalEtcd::start_cluster(3).expect("start a 3-member cluster");
    let mut cfg = etcd.config("noleader");
    // Only the survivor: every request reaches a live member, which has no leader.
    cfg.endpoints.truncate(1);
    cfg.timeout = Duration::from_secs(15);
    let s = EtcdStore::connect(&cfg, registry()).expect("connect");
    let t = s.tree("t").expect("tree");
    let put = |i: u32| put_row(&s, t, i);
    put(0).expect("write with a quorum");
    etcd.kill_member(1).expect("kill -9 member 1");
    etcd.kill_member(2).expect("kill -9 member 2");
    // Wait until member 0 knows it has no leader (the old leader steps down after its
    // election timeout without a quorum, under etcd's check-quorum).
    let start = Instant::now();
    while etcd.leader().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "member 0 kept a leader"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| put(1));
        std::thread::sleep(Duration::from_secs(1));
        etcd.restart_member(1).expect("restart member 1");
        let r = writer.join().expect("writer");
        assert!(
            r.is_ok(),
            "a write refused for want of a leader must be resent until the deadline: {r:?}"
        );
    });
    let got = s.get(t, &1u32.to_be_bytes()).expect("read");
    assert_eq!(got.as_deref(), Some(&1u32.to_le_bytes()[..]));
}
