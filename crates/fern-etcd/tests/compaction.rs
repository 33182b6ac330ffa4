//! Compaction of old revisions under running transactions (docs/distributed.md §2, §6): a
//! transaction whose snapshot revision was compacted fails with `Conflict` (it never reads a
//! newer state as if it were its snapshot), `transact` reruns it on a fresh snapshot, and plain
//! reads are unaffected. Its own binary, so compacting its server disturbs no other test.

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::EtcdStore;
use fern_kv::conformance::registry;
use fern_kv::{
    transact, Direction, KeyRange, KvError, KvRead, KvStore, RetryPolicy, WriteBatch, WriteOptions,
};

/// Compacts the server's whole history up to its current revision.
fn compact_all(endpoint: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("client");
        let rev = c
            .get("x", None)
            .await
            .expect("get")
            .header()
            .expect("header")
            .revision();
        c.compact(
            rev,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .expect("compact");
    });
}

fn put(s: &EtcdStore, k: &[u8], v: &[u8]) {
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put(t, k.to_vec(), v.to_vec());
    s.write(b, WriteOptions::SYNC).expect("put");
}

#[test]
fn a_transaction_behind_compaction_conflicts_and_reruns() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let s =
        EtcdStore::connect(&etcd.config(&unique_prefix("compact")), registry()).expect("connect");
    let t = s.tree("t").expect("tree");
    put(&s, b"a", b"1");
    put(&s, b"b", b"1");

    let txn = s.begin().expect("begin");
    assert!(txn
        .get(t, b"a")
        .expect("first read pins the snapshot")
        .is_some());
    put(&s, b"b", b"2");
    compact_all(etcd.endpoint());
    match txn.get(t, b"b") {
        Err(KvError::Conflict) => {}
        other => panic!("a read at a compacted snapshot must conflict, got {other:?}"),
    }
    drop(txn);

    // transact reruns the body on a fresh snapshot.
    let mut runs = 0u32;
    let policy = RetryPolicy::default();
    let r: Result<(), KvError> = transact(&s, &policy, WriteOptions::SYNC, |txn| {
        runs += 1;
        let a = txn.get(t, b"a")?.unwrap_or_default();
        if runs == 1 {
            put(&s, b"b", b"3");
            compact_all(etcd.endpoint());
        }
        let b = txn.get(t, b"b")?.unwrap_or_default();
        txn.batch().put(t, b"sum".to_vec(), [a, b].concat());
        Ok(())
    });
    r.expect("converges after the compaction");
    assert_eq!(runs, 2);
    assert_eq!(s.get(t, b"sum").expect("get").as_deref(), Some(&b"13"[..]));
    // Plain reads and scans read the latest revision, which compaction keeps.
    let all = s
        .scan(t, &KeyRange::all(), Direction::Forward, 10)
        .expect("scan");
    assert_eq!(all.len(), 3);
}
