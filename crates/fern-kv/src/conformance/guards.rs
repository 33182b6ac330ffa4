//! Scenarios for key guards (store.rs contract, "Guards").

use super::reads::{keys, put};
use crate::batch::WriteBatch;
use crate::error::KvError;
use crate::guard::KeyGuard;
use crate::retry::{transact, RetryPolicy};
use crate::store::KvStore;
use crate::types::{Direction, KeyRange, WriteOptions};

fn guard_failed<T: std::fmt::Debug>(r: Result<T, KvError>, key: &[u8]) -> bool {
    match r {
        Err(KvError::GuardFailed { key: k, .. }) => {
            assert_eq!(k, key, "GuardFailed names the guarded key");
            true
        }
        Ok(_) => false,
        Err(e) => panic!("expected GuardFailed or success, got {e}"),
    }
}

pub(super) fn guarded_reads(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let g = s.tree("g").expect("tree");
    put(s, t, b"a", b"1");
    put(s, t, b"b", b"2");
    let absent = [KeyGuard::absent(g, b"d")];
    assert_eq!(
        s.get_guarded(&absent, t, b"a")
            .expect("guard holds")
            .as_deref(),
        Some(&b"1"[..])
    );
    let all = KeyRange::all();
    let pairs = s
        .scan_guarded(&absent, t, &all, Direction::Forward, 10)
        .expect("guard holds");
    assert_eq!(keys(&pairs), vec![b"a".to_vec(), b"b".to_vec()]);
    // No guards: a plain read.
    assert_eq!(s.get_guarded(&[], t, b"z").expect("no guards"), None);

    put(s, g, b"d", b"holder-1");
    assert!(
        guard_failed(s.get_guarded(&absent, t, b"a"), b"d"),
        "absent guard on a present key fails the read"
    );
    assert!(
        guard_failed(
            s.scan_guarded(&absent, t, &all, Direction::Forward, 10),
            b"d"
        ),
        "absent guard fails the scan"
    );
    let mine = [KeyGuard::holds(g, b"d", b"holder-1")];
    assert_eq!(
        s.get_guarded(&mine, t, b"b")
            .expect("value guard holds")
            .as_deref(),
        Some(&b"2"[..])
    );
    let theirs = [KeyGuard::holds(g, b"d", b"holder-2")];
    assert!(
        guard_failed(s.get_guarded(&theirs, t, b"b"), b"d"),
        "another value fails the guard"
    );
    // Every guard must hold: one failing among several fails the read.
    let both = [mine[0].clone(), KeyGuard::absent(g, b"e")];
    assert!(s.get_guarded(&both, t, b"a").is_ok(), "both hold");
    put(s, g, b"e", b"x");
    assert!(guard_failed(s.get_guarded(&both, t, b"a"), b"e"));
}

/// `get_many` answers as one `get` per key, in order, across trees, absent keys included and
/// beyond one round trip's worth (etcd: 128 ops); guarded, a failing guard fails it.
pub(super) fn many_keys_at_once(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let u = s.tree("u").expect("tree");
    let g = s.tree("g").expect("tree");
    let mut b = WriteBatch::new();
    for i in 0..300u32 {
        if i % 3 != 0 {
            b.put(t, format!("k{i:03}").into_bytes(), i.to_be_bytes().to_vec());
        }
        if i % 5 == 0 {
            b.put(u, format!("k{i:03}").into_bytes(), b"u".to_vec());
        }
        if b.len() >= 100 {
            s.write(std::mem::take(&mut b), WriteOptions::NO_SYNC)
                .expect("write");
        }
    }
    s.write(b, WriteOptions::NO_SYNC).expect("write");
    // Reverse order, both trees interleaved: the answers follow the keys' order.
    let keys: Vec<(crate::types::TreeId, Vec<u8>)> = (0..300u32)
        .rev()
        .flat_map(|i| {
            [
                (t, format!("k{i:03}").into_bytes()),
                (u, format!("k{i:03}").into_bytes()),
            ]
        })
        .collect();
    let want: Vec<Option<Vec<u8>>> = keys
        .iter()
        .map(|(tree, k)| s.get(*tree, k).expect("get"))
        .collect();
    assert!(want.iter().any(Option::is_none) && want.iter().any(Option::is_some));
    assert_eq!(s.get_many(&keys).expect("get_many"), want);
    assert_eq!(
        s.get_many(&[]).expect("none"),
        Vec::<Option<Vec<u8>>>::new()
    );
    let absent = [KeyGuard::absent(g, b"d")];
    assert_eq!(
        s.get_many_guarded(&absent, &keys).expect("guard holds"),
        want
    );
    put(s, g, b"d", b"holder");
    assert!(
        guard_failed(s.get_many_guarded(&absent, &keys[..3]), b"d"),
        "a failing guard fails the read"
    );
}

pub(super) fn guarded_commits(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let g = s.tree("g").expect("tree");
    // Holds at commit: applied.
    let absent = KeyGuard::absent(g, b"d");
    let mut txn = s.begin().expect("begin");
    txn.guard(&absent).expect("absent now");
    txn.batch().put(t, b"a".to_vec(), b"1".to_vec());
    txn.commit(WriteOptions::SYNC)
        .expect("guard holds at commit");
    assert_eq!(s.get(t, b"a").expect("get").as_deref(), Some(&b"1"[..]));

    // Broken between the guard and the commit: nothing applied, and a rerun through
    // `transact` ends in GuardFailed.
    let mut txn = s.begin().expect("begin");
    txn.guard(&absent).expect("absent now");
    txn.batch().put(t, b"a".to_vec(), b"2".to_vec());
    put(s, g, b"d", b"holder-1");
    match txn.commit(WriteOptions::SYNC) {
        Err(KvError::GuardFailed { key, .. }) => assert_eq!(key, b"d"),
        Err(KvError::Conflict) => {}
        other => panic!("a commit whose guard broke must fail, got {other:?}"),
    }
    assert_eq!(
        s.get(t, b"a").expect("get").as_deref(),
        Some(&b"1"[..]),
        "a failed guard applies nothing"
    );
    let r = transact(s, &RetryPolicy::default(), WriteOptions::SYNC, |txn| {
        txn.guard(&absent)?;
        txn.batch().put(t, b"a".to_vec(), b"3".to_vec());
        Ok::<_, KvError>(())
    });
    assert!(guard_failed(r, b"d"), "transact ends in GuardFailed");
    assert_eq!(s.get(t, b"a").expect("get").as_deref(), Some(&b"1"[..]));

    // A value guard (the fence of a delegation holder): applies while the key holds the
    // value, refuses once it was replaced — even by a batch that only upserts and puts.
    let fence = KeyGuard::holds(g, b"d", b"holder-1");
    let mut txn = s.begin().expect("begin");
    txn.guard(&fence).expect("holds");
    txn.batch().put(t, b"b".to_vec(), b"x".to_vec());
    txn.batch()
        .upsert(t, b"c".to_vec(), super::APPEND, b"y".to_vec());
    txn.commit(WriteOptions::SYNC).expect("fence holds");
    assert_eq!(s.get(t, b"c").expect("get").as_deref(), Some(&b"y"[..]));
    let mut txn = s.begin().expect("begin");
    txn.guard(&fence).expect("holds");
    txn.batch().put(t, b"b".to_vec(), b"late".to_vec());
    txn.batch()
        .upsert(t, b"c".to_vec(), super::APPEND, b"late".to_vec());
    let mut b = WriteBatch::new();
    b.delete(g, b"d");
    b.put(g, b"d", b"holder-2");
    s.write(b, WriteOptions::SYNC).expect("another holder");
    assert!(
        txn.commit(WriteOptions::SYNC).is_err(),
        "a fenced commit after the key changed fails"
    );
    assert_eq!(s.get(t, b"b").expect("get").as_deref(), Some(&b"x"[..]));
    assert_eq!(s.get(t, b"c").expect("get").as_deref(), Some(&b"y"[..]));
}
