//! Scenarios for upserts, range deletes, batch order and atomicity, limits.

use super::reads::{keys, put};
use super::{ADD_U64, APPEND, ECHO_KEY, REMOVE, UNREGISTERED};
use crate::batch::WriteBatch;
use crate::error::KvError;
use crate::store::KvStore;
use crate::types::{Direction, KeyRange, WriteOptions};

pub(super) fn upsert_semantics(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let get = |k: &[u8]| s.get(t, k).expect("get");
    // Absent key: the function sees None and may create it.
    let mut b = WriteBatch::new();
    b.upsert(t, b"k".to_vec(), APPEND, b"1".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"k").as_deref(), Some(&b"1"[..]));
    // Several upserts to one key in one batch apply in order.
    let mut b = WriteBatch::new();
    for x in [b"2", b"3", b"4"] {
        b.upsert(t, b"k".to_vec(), APPEND, x.to_vec());
    }
    s.write(b, WriteOptions::NO_SYNC).expect("upserts");
    assert_eq!(
        get(b"k").as_deref(),
        Some(&b"1234"[..]),
        "upserts apply in batch order"
    );
    // ... and across batches.
    let mut b = WriteBatch::new();
    b.upsert(t, b"k".to_vec(), APPEND, b"5".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"k").as_deref(), Some(&b"12345"[..]));
    // None deletes; a later upsert in the same batch sees the deletion.
    let mut b = WriteBatch::new();
    b.upsert(t, b"k".to_vec(), REMOVE, Vec::new());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"k"), None, "an update function returning None deletes");
    let mut b = WriteBatch::new();
    b.put(t, b"k".to_vec(), b"x".to_vec());
    b.upsert(t, b"k".to_vec(), REMOVE, Vec::new());
    b.upsert(t, b"k".to_vec(), APPEND, b"y".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("batch");
    assert_eq!(
        get(b"k").as_deref(),
        Some(&b"y"[..]),
        "put, remove, append in order"
    );
    // Upsert after put and after delete in one batch.
    let mut b = WriteBatch::new();
    b.put(t, b"n".to_vec(), 40u64.to_be_bytes().to_vec());
    b.upsert(t, b"n".to_vec(), ADD_U64, 2u64.to_be_bytes().to_vec());
    b.delete(t, b"m".to_vec());
    b.upsert(t, b"m".to_vec(), ADD_U64, 7u64.to_be_bytes().to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("batch");
    assert_eq!(get(b"n"), Some(42u64.to_be_bytes().to_vec()));
    assert_eq!(get(b"m"), Some(7u64.to_be_bytes().to_vec()));
    // The function receives the key.
    let mut b = WriteBatch::new();
    b.upsert(t, b"key!".to_vec(), ECHO_KEY, b"+arg".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"key!").as_deref(), Some(&b"key!+arg"[..]));
    // A function leaving a malformed value alone keeps it.
    put(s, t, b"bad", b"not a u64");
    let mut b = WriteBatch::new();
    b.upsert(t, b"bad".to_vec(), ADD_U64, 1u64.to_be_bytes().to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"bad").as_deref(), Some(&b"not a u64"[..]));
    // REMOVE on an absent key leaves it absent.
    let mut b = WriteBatch::new();
    b.upsert(t, b"ghost".to_vec(), REMOVE, Vec::new());
    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
    assert_eq!(get(b"ghost"), None);
}

pub(super) fn upsert_unknown_fn_applies_nothing(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put(t, b"a".to_vec(), b"1".to_vec());
    b.upsert(t, b"b".to_vec(), UNREGISTERED, Vec::new());
    match s.write(b, WriteOptions::NO_SYNC) {
        Err(KvError::UnknownUpdateFn(id)) => assert_eq!(id, UNREGISTERED),
        other => panic!("unregistered upsert function must fail the batch, got {other:?}"),
    }
    assert_eq!(
        s.get(t, b"a").expect("get"),
        None,
        "a failed batch applies nothing"
    );
}

pub(super) fn range_delete_edges(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let all = || {
        keys(
            &s.scan(t, &KeyRange::all(), Direction::Forward, 1000)
                .expect("scan"),
        )
    };
    let fill = || {
        let mut b = WriteBatch::new();
        for k in [&b"a"[..], b"b", b"b\x00", b"b\xff", b"c", b"c\x00", b"d"] {
            b.put(t, k.to_vec(), b"v".to_vec());
        }
        s.write(b, WriteOptions::NO_SYNC).expect("fill");
    };
    let del = |lo: &[u8], hi: &[u8]| {
        let mut b = WriteBatch::new();
        b.delete_range(t, lo.to_vec(), hi.to_vec());
        s.write(b, WriteOptions::NO_SYNC).expect("range delete");
    };
    fill();
    del(b"b", b"c");
    assert_eq!(
        all(),
        vec![
            b"a".to_vec(),
            b"c".to_vec(),
            b"c\x00".to_vec(),
            b"d".to_vec()
        ],
        "[lo, hi): lo removed, hi kept"
    );
    fill();
    del(b"c", b"c");
    assert_eq!(all().len(), 7, "empty range removes nothing");
    del(b"d", b"a");
    assert_eq!(all().len(), 7, "inverted range removes nothing");
    del(b"b\x00", b"b\xff");
    assert_eq!(
        all(),
        vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"b\xff".to_vec(),
            b"c".to_vec(),
            b"c\x00".to_vec(),
            b"d".to_vec()
        ]
    );
    del(b"", b"\xff\xff");
    assert!(all().is_empty(), "whole-tree range delete");
    del(b"x", b"z");
    // Range delete and later ops in one batch.
    fill();
    let mut b = WriteBatch::new();
    b.delete_range(t, b"a".to_vec(), b"z".to_vec());
    b.put(t, b"b".to_vec(), b"new".to_vec());
    b.upsert(t, b"c".to_vec(), APPEND, b"!".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("batch");
    assert_eq!(all(), vec![b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        s.get(t, b"c").expect("get").as_deref(),
        Some(&b"!"[..]),
        "upsert after range delete sees None"
    );
    // Range delete after an upsert in one batch removes the upserted key.
    let mut b = WriteBatch::new();
    b.upsert(t, b"q".to_vec(), APPEND, b"1".to_vec());
    b.delete_range(t, b"p".to_vec(), b"r".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("batch");
    assert_eq!(s.get(t, b"q").expect("get"), None);
}

pub(super) fn batch_order_and_atomicity(s: &dyn KvStore) {
    let a = s.tree("a").expect("tree");
    let z = s.tree("z").expect("tree");
    let mut b = WriteBatch::new();
    b.put(a, b"k".to_vec(), b"1".to_vec());
    b.put(z, b"k".to_vec(), b"2".to_vec());
    b.delete(a, b"k".to_vec());
    b.put(a, b"j".to_vec(), b"3".to_vec());
    assert_eq!(b.len(), 4);
    s.write(b, WriteOptions::SYNC).expect("cross-tree batch");
    assert_eq!(s.get(a, b"k").expect("get"), None, "delete after put wins");
    assert_eq!(s.get(z, b"k").expect("get").as_deref(), Some(&b"2"[..]));
    assert_eq!(s.get(a, b"j").expect("get").as_deref(), Some(&b"3"[..]));
    s.write(WriteBatch::new(), WriteOptions::NO_SYNC)
        .expect("empty batch is fine");
    // Concurrent readers see all of a batch or none of it.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0u64..200 {
                let mut b = WriteBatch::new();
                b.put(a, b"x".to_vec(), i.to_be_bytes().to_vec());
                b.put(z, b"x".to_vec(), i.to_be_bytes().to_vec());
                s.write(b, WriteOptions::NO_SYNC).expect("write");
            }
        });
        scope.spawn(|| {
            for _ in 0..200 {
                let mut t = s.begin().expect("begin");
                // A read may already know the commit would conflict (contract: Transactions).
                let (x, y) = match t.get(a, b"x").and_then(|x| Ok((x, t.get(z, b"x")?))) {
                    Ok(xy) => xy,
                    Err(KvError::Conflict) => continue,
                    Err(e) => panic!("get: {e}"),
                };
                t.batch().put(a, b"probe".to_vec(), Vec::new());
                // A consistent snapshot commits; a torn one must be caught as a conflict.
                if t.commit(WriteOptions::NO_SYNC).is_ok() {
                    assert_eq!(x, y, "committed transaction saw half a batch");
                }
            }
        });
    });
}

pub(super) fn limits_are_enforced(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let limits = s.limits();
    if let Some(max) = limits.max_ops {
        let mut b = WriteBatch::new();
        for i in 0..=max as u64 {
            b.put(t, i.to_be_bytes().to_vec(), Vec::new());
        }
        assert!(matches!(
            s.write(b, WriteOptions::NO_SYNC),
            Err(KvError::TooLarge { .. })
        ));
        assert!(s
            .scan(t, &KeyRange::all(), Direction::Forward, 1)
            .expect("scan")
            .is_empty());
    }
    let mut b = WriteBatch::new();
    b.put(t, vec![0u8; limits.max_key_len + 1], Vec::new());
    assert!(
        matches!(
            s.write(b, WriteOptions::NO_SYNC),
            Err(KvError::TooLarge { .. })
        ),
        "oversized key"
    );
}

pub(super) fn concurrent_upserts(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..250 {
                    let mut b = WriteBatch::new();
                    b.upsert(t, b"ctr".to_vec(), ADD_U64, 1u64.to_be_bytes().to_vec());
                    s.write(b, WriteOptions::NO_SYNC).expect("upsert");
                }
            });
        }
    });
    assert_eq!(
        s.get(t, b"ctr").expect("get"),
        Some(1000u64.to_be_bytes().to_vec()),
        "no upsert lost"
    );
}
