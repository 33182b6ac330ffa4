//! A 3-member cluster on loopback with its leader killed by SIGKILL (issue 14's fault proof,
//! one round): every write acknowledged before the kill is still there, writes during the
//! election fail with `Unavailable` (never wrong data), and the same store writes again once
//! a new leader is elected.

use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, LocalEtcd};
use fern_etcd::EtcdStore;
use fern_kv::conformance::registry;
use fern_kv::{Direction, KeyRange, KvError, KvRead, KvStore, WriteBatch, WriteOptions};

/// The index of the member that is the leader now.
fn leader(etcd: &LocalEtcd) -> usize {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        for (i, ep) in etcd.endpoints().iter().enumerate() {
            let mut c = etcd_client::Client::connect([ep.as_str()], None)
                .await
                .expect("client");
            let st = c.status().await.expect("status");
            let me = st.header().expect("header").member_id();
            if st.leader() == me {
                return i;
            }
        }
        panic!("no member is the leader");
    })
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
    let put = |i: u32| {
        let mut b = WriteBatch::new();
        b.put(t, i.to_be_bytes().to_vec(), i.to_le_bytes().to_vec());
        s.write(b, WriteOptions::SYNC)
    };
    for i in 0..50 {
        put(i).expect("write before the kill");
    }
    etcd.kill_member(leader(&etcd)).expect("kill -9 the leader");
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
        "10 writes after the kill took {:?}, {} failed on the way",
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
