//! Scenarios for get, put, delete, trees and scans.

use std::ops::Bound;

use crate::batch::WriteBatch;
use crate::store::KvStore;
use crate::types::{Direction, KeyRange, WriteOptions};

pub(super) fn put(s: &dyn KvStore, tree: crate::TreeId, k: &[u8], v: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(tree, k, v);
    s.write(b, WriteOptions::NO_SYNC).expect("put");
}

pub(super) fn keys(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<Vec<u8>> {
    pairs.iter().map(|(k, _)| k.clone()).collect()
}

pub(super) fn get_put_delete(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    assert_eq!(
        s.get(t, b"a").expect("get"),
        None,
        "fresh store must be empty"
    );
    put(s, t, b"a", b"1");
    assert_eq!(s.get(t, b"a").expect("get").as_deref(), Some(&b"1"[..]));
    put(s, t, b"a", b"2");
    assert_eq!(
        s.get(t, b"a").expect("get").as_deref(),
        Some(&b"2"[..]),
        "put overwrites"
    );
    put(s, t, b"", b"empty key");
    assert_eq!(
        s.get(t, b"").expect("get").as_deref(),
        Some(&b"empty key"[..])
    );
    put(s, t, b"e", b"");
    assert_eq!(
        s.get(t, b"e").expect("get"),
        Some(Vec::new()),
        "empty value is a value"
    );
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.delete(t, b"never-there".to_vec());
    s.write(b, WriteOptions::SYNC)
        .expect("delete of absent key is fine");
    assert_eq!(s.get(t, b"a").expect("get"), None);
    s.sync().expect("sync");
}

pub(super) fn trees_are_independent(s: &dyn KvStore) {
    let a = s.tree("alpha").expect("tree");
    let b = s.tree("beta").expect("tree");
    assert_ne!(a, b);
    assert_eq!(s.tree("alpha").expect("tree"), a, "same name, same handle");
    put(s, a, b"k", b"in a");
    assert_eq!(
        s.get(b, b"k").expect("get"),
        None,
        "trees do not share keys"
    );
    let mut batch = WriteBatch::new();
    batch.delete_range(b, Vec::new(), vec![0xff; 4]);
    s.write(batch, WriteOptions::NO_SYNC).expect("range delete");
    assert!(
        s.get(a, b"k").expect("get").is_some(),
        "range delete stays in its tree"
    );
    let all = s
        .scan(b, &KeyRange::all(), Direction::Forward, 10)
        .expect("scan");
    assert!(all.is_empty());
}

pub(super) fn scan_bounds_and_directions(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let other = s.tree("other").expect("tree");
    for k in [&b"a"[..], b"b", b"b\x00", b"c", b"d"] {
        put(s, t, k, k);
    }
    put(s, other, b"bb", b"x");
    let fwd = s
        .scan(t, &KeyRange::all(), Direction::Forward, 100)
        .expect("scan");
    assert_eq!(
        keys(&fwd),
        vec![
            b"a".to_vec(),
            b"b".to_vec(),
            b"b\x00".to_vec(),
            b"c".to_vec(),
            b"d".to_vec()
        ]
    );
    assert!(
        fwd.iter().all(|(k, v)| k == v),
        "values come with their keys"
    );
    let rev = s
        .scan(t, &KeyRange::all(), Direction::Reverse, 100)
        .expect("scan");
    let mut expect = keys(&fwd);
    expect.reverse();
    assert_eq!(keys(&rev), expect, "reverse scan is descending");
    let r = KeyRange {
        lo: Bound::Excluded(b"a".to_vec()),
        hi: Bound::Included(b"c".to_vec()),
    };
    assert_eq!(
        keys(&s.scan(t, &r, Direction::Forward, 100).expect("scan")),
        vec![b"b".to_vec(), b"b\x00".to_vec(), b"c".to_vec()]
    );
    assert_eq!(
        keys(&s.scan(t, &r, Direction::Reverse, 2).expect("scan")),
        vec![b"c".to_vec(), b"b\x00".to_vec()],
        "reverse limit takes from the high end"
    );
    let half = KeyRange::half_open(b"b", b"c");
    assert_eq!(
        keys(&s.scan(t, &half, Direction::Forward, 100).expect("scan")),
        vec![b"b".to_vec(), b"b\x00".to_vec()]
    );
    let pre = KeyRange::prefix(b"b");
    assert_eq!(
        keys(&s.scan(t, &pre, Direction::Reverse, 100).expect("scan")),
        vec![b"b\x00".to_vec(), b"b".to_vec()]
    );
    assert!(
        s.scan(t, &KeyRange::all(), Direction::Forward, 0)
            .expect("scan")
            .is_empty(),
        "limit 0"
    );
    let inverted = KeyRange::half_open(b"d", b"a");
    assert!(s
        .scan(t, &inverted, Direction::Forward, 10)
        .expect("scan")
        .is_empty());
    assert!(s
        .scan(t, &inverted, Direction::Reverse, 10)
        .expect("scan")
        .is_empty());
    let point = KeyRange {
        lo: Bound::Included(b"c".to_vec()),
        hi: Bound::Included(b"c".to_vec()),
    };
    assert_eq!(
        keys(&s.scan(t, &point, Direction::Reverse, 10).expect("scan")),
        vec![b"c".to_vec()]
    );
    let empty_excl = KeyRange {
        lo: Bound::Excluded(b"c".to_vec()),
        hi: Bound::Excluded(b"c".to_vec()),
    };
    assert!(s
        .scan(t, &empty_excl, Direction::Forward, 10)
        .expect("scan")
        .is_empty());
}

pub(super) fn scan_paging(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    // Filled in batches of 64 so that a backend with etcd's 128-op limit can run it.
    for chunk in (0u32..257).collect::<Vec<_>>().chunks(64) {
        let mut b = WriteBatch::new();
        for i in chunk {
            b.put(t, i.to_be_bytes().to_vec(), vec![1]);
        }
        s.write(b, WriteOptions::NO_SYNC).expect("fill");
    }
    for dir in [Direction::Forward, Direction::Reverse] {
        for page in [1usize, 7, 256, 257, 1000] {
            let mut range = KeyRange::half_open(&5u32.to_be_bytes(), &250u32.to_be_bytes());
            let mut seen = Vec::new();
            loop {
                let got = s.scan(t, &range, dir, page).expect("scan page");
                assert!(got.len() <= page, "a page never exceeds its limit");
                let Some((last, _)) = got.last() else { break };
                match dir {
                    Direction::Forward => range.lo = Bound::Excluded(last.clone()),
                    Direction::Reverse => range.hi = Bound::Excluded(last.clone()),
                }
                let short = got.len() < page;
                seen.extend(keys(&got));
                if short {
                    break;
                }
            }
            let mut expect: Vec<Vec<u8>> = (5u32..250).map(|i| i.to_be_bytes().to_vec()).collect();
            if dir == Direction::Reverse {
                expect.reverse();
            }
            assert_eq!(
                seen, expect,
                "paging {dir:?} by {page} must see every key once"
            );
        }
    }
}
