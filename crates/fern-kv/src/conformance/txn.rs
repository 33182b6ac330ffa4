//! Scenarios for optimistic transactions and the retry helper.

use std::ops::Bound;
use std::sync::atomic::{AtomicU32, Ordering};

use super::reads::put;
use crate::error::KvError;
use crate::retry::{transact, RetryPolicy};
use crate::store::KvStore;
use crate::types::{Direction, KeyRange, WriteOptions};

fn is_conflict<T: std::fmt::Debug>(r: Result<T, KvError>) -> bool {
    match r {
        Err(KvError::Conflict) => true,
        Ok(_) => false,
        Err(e) => panic!("expected a conflict or success, got {e}"),
    }
}

pub(super) fn commit_and_isolation(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    put(s, t, b"a", b"1");
    let mut txn = s.begin().expect("begin");
    assert_eq!(txn.get(t, b"a").expect("get").as_deref(), Some(&b"1"[..]));
    txn.batch().put(t, b"a".to_vec(), b"2".to_vec());
    txn.batch().put(t, b"b".to_vec(), b"3".to_vec());
    assert_eq!(
        txn.get(t, b"b").expect("get"),
        None,
        "own buffered writes are not visible"
    );
    assert_eq!(
        s.get(t, b"b").expect("get"),
        None,
        "uncommitted writes are not visible"
    );
    txn.commit(WriteOptions::SYNC).expect("commit");
    assert_eq!(s.get(t, b"a").expect("get").as_deref(), Some(&b"2"[..]));
    assert_eq!(s.get(t, b"b").expect("get").as_deref(), Some(&b"3"[..]));
    // A write-only transaction never conflicts.
    let mut txn = s.begin().expect("begin");
    txn.batch().put(t, b"a".to_vec(), b"w".to_vec());
    put(s, t, b"a", b"other");
    txn.commit(WriteOptions::NO_SYNC)
        .expect("blind transaction commits");
    assert_eq!(s.get(t, b"a").expect("get").as_deref(), Some(&b"w"[..]));
}

pub(super) fn point_conflict(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    put(s, t, b"a", b"1");
    let mut txn = s.begin().expect("begin");
    txn.get(t, b"a").expect("get");
    txn.batch().put(t, b"out".to_vec(), b"x".to_vec());
    put(s, t, b"a", b"changed");
    assert!(
        is_conflict(txn.commit(WriteOptions::NO_SYNC)),
        "read key changed: conflict"
    );
    assert_eq!(
        s.get(t, b"out").expect("get"),
        None,
        "a conflicting commit applies nothing"
    );
    // Upserts and deletes of a read key conflict too. The key exists each time (kind 1
    // deletes it): a delete or range delete that finds nothing changes nothing a reader can
    // observe, and a versioned backend (etcd) rightly sees no write there.
    for kind in 0..3 {
        put(s, t, b"a", b"1");
        let mut txn = s.begin().expect("begin");
        txn.get(t, b"a").expect("get");
        txn.batch().put(t, b"out".to_vec(), b"x".to_vec());
        let mut b = crate::WriteBatch::new();
        match kind {
            0 => b.upsert(t, b"a".to_vec(), super::APPEND, b"+".to_vec()),
            1 => b.delete(t, b"a".to_vec()),
            _ => b.delete_range(t, b"0".to_vec(), b"b".to_vec()),
        }
        s.write(b, WriteOptions::NO_SYNC)
            .expect("interfering write");
        assert!(
            is_conflict(txn.commit(WriteOptions::NO_SYNC)),
            "write kind {kind}"
        );
    }
}

/// A transaction's commit conflicts every transaction still open that read what it wrote —
/// also when the committer was, until its own validation, one of only two open ones (an
/// embedded backend's committer leaves the open set before its batch is recorded), and in
/// either order of beginning.
pub(super) fn commit_conflicts_open_transactions(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    for committer_first in [true, false] {
        put(s, t, b"a", b"1");
        let (mut writer, mut reader) = if committer_first {
            let w = s.begin().expect("begin");
            (w, s.begin().expect("begin"))
        } else {
            let r = s.begin().expect("begin");
            (s.begin().expect("begin"), r)
        };
        reader.get(t, b"a").expect("get");
        reader.batch().put(t, b"out".to_vec(), b"x".to_vec());
        writer.batch().put(t, b"a".to_vec(), b"2".to_vec());
        writer
            .commit(WriteOptions::NO_SYNC)
            .expect("writer commits");
        assert!(
            is_conflict(reader.commit(WriteOptions::NO_SYNC)),
            "committer began first: {committer_first}"
        );
        // A transaction begun after the commit sees it and commits.
        let mut later = s.begin().expect("begin");
        assert_eq!(later.get(t, b"a").expect("get"), Some(b"2".to_vec()));
        later.batch().put(t, b"a".to_vec(), b"3".to_vec());
        later.commit(WriteOptions::NO_SYNC).expect("later commits");
    }
}

pub(super) fn absent_key_conflict(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let mut txn = s.begin().expect("begin");
    assert_eq!(txn.get(t, b"name").expect("get"), None);
    txn.batch().put(t, b"name".to_vec(), b"mine".to_vec());
    put(s, t, b"name", b"theirs");
    assert!(
        is_conflict(txn.commit(WriteOptions::NO_SYNC)),
        "create-if-absent race"
    );
    assert_eq!(
        s.get(t, b"name").expect("get").as_deref(),
        Some(&b"theirs"[..])
    );
}

pub(super) fn range_conflict(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    put(s, t, b"d/a", b"");
    put(s, t, b"d/c", b"");
    let dir = KeyRange::prefix(b"d/");
    // A phantom inserted into a scanned range conflicts.
    let mut txn = s.begin().expect("begin");
    assert_eq!(
        txn.scan(t, &dir, Direction::Forward, 10)
            .expect("scan")
            .len(),
        2
    );
    txn.batch().put(t, b"x".to_vec(), Vec::new());
    put(s, t, b"d/b", b"");
    assert!(
        is_conflict(txn.commit(WriteOptions::NO_SYNC)),
        "phantom in scanned range"
    );
    // Outside the part of the range a limited scan looked at: no conflict.
    let mut txn = s.begin().expect("begin");
    let page = txn.scan(t, &dir, Direction::Forward, 1).expect("scan");
    assert_eq!(page.len(), 1);
    txn.batch().put(t, b"x".to_vec(), Vec::new());
    put(s, t, b"d/z", b"");
    txn.commit(WriteOptions::NO_SYNC)
        .expect("write beyond the scanned page does not conflict");
    // Reverse scans record their range too.
    let mut txn = s.begin().expect("begin");
    let r = KeyRange {
        lo: Bound::Included(b"d/".to_vec()),
        hi: Bound::Unbounded,
    };
    txn.scan(t, &r, Direction::Reverse, 100).expect("scan");
    txn.batch().put(t, b"x".to_vec(), Vec::new());
    put(s, t, b"zzz", b"");
    assert!(
        is_conflict(txn.commit(WriteOptions::NO_SYNC)),
        "reverse-scanned range"
    );
}

pub(super) fn disjoint_writes_do_not_conflict(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let u = s.tree("u").expect("tree");
    let mut txn = s.begin().expect("begin");
    txn.get(t, b"a").expect("get");
    txn.scan(t, &KeyRange::prefix(b"p/"), Direction::Forward, 10)
        .expect("scan");
    txn.batch().put(t, b"a".to_vec(), b"1".to_vec());
    put(s, t, b"b", b"");
    put(s, t, b"q/1", b"");
    put(s, u, b"a", b"same key, other tree");
    txn.commit(WriteOptions::NO_SYNC)
        .expect("disjoint writes must not conflict");
}

pub(super) fn abort_applies_nothing(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    {
        let mut txn = s.begin().expect("begin");
        txn.batch().put(t, b"k".to_vec(), b"v".to_vec());
    }
    assert_eq!(
        s.get(t, b"k").expect("get"),
        None,
        "dropped transaction applies nothing"
    );
    put(s, t, b"k", b"after");
    assert!(
        s.get(t, b"k").expect("get").is_some(),
        "store usable after an abort"
    );
}

pub(super) fn retry_helper(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    put(s, t, b"n", &0u64.to_be_bytes());
    let runs = AtomicU32::new(0);
    let policy = RetryPolicy::default();
    let r: Result<u64, KvError> = transact(s, &policy, WriteOptions::NO_SYNC, |txn| {
        let v = txn.get(t, b"n")?.unwrap_or_default();
        let n = u64::from_be_bytes(v.as_slice().try_into().unwrap_or([0; 8]));
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            put(s, t, b"n", &100u64.to_be_bytes()); // an interfering writer, first run only
        }
        txn.batch()
            .put(t, b"n".to_vec(), (n + 1).to_be_bytes().to_vec());
        Ok(n + 1)
    });
    assert_eq!(r.expect("retried to success"), 101);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one conflict, one retry");
    // Always conflicting: bounded.
    let policy = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    let runs = AtomicU32::new(0);
    let r: Result<(), KvError> = transact(s, &policy, WriteOptions::NO_SYNC, |txn| {
        runs.fetch_add(1, Ordering::SeqCst);
        txn.get(t, b"n")?;
        put(s, t, b"n", b"again");
        Ok(())
    });
    assert!(
        matches!(r, Err(KvError::RetriesExhausted { attempts: 3 })),
        "got {r:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Other errors are returned at once.
    let runs = AtomicU32::new(0);
    let r: Result<(), KvError> = transact(s, &policy, WriteOptions::NO_SYNC, |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        Err(KvError::Unavailable("body failed".into()))
    });
    assert!(matches!(r, Err(KvError::Unavailable(_))));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "non-conflict errors are not retried"
    );
}

pub(super) fn concurrent_increments(s: &dyn KvStore) {
    let t = s.tree("t").expect("tree");
    let policy = RetryPolicy {
        max_attempts: 1000,
        ..RetryPolicy::default()
    };
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..50 {
                    let r: Result<(), KvError> =
                        transact(s, &policy, WriteOptions::NO_SYNC, |txn| {
                            let v = txn.get(t, b"ctr")?.unwrap_or_else(|| vec![0; 8]);
                            let n = u64::from_be_bytes(v.as_slice().try_into().unwrap_or([0; 8]));
                            txn.batch()
                                .put(t, b"ctr".to_vec(), (n + 1).to_be_bytes().to_vec());
                            Ok(())
                        });
                    r.expect("increment");
                }
            });
        }
    });
    assert_eq!(
        s.get(t, b"ctr").expect("get"),
        Some(200u64.to_be_bytes().to_vec()),
        "lost update"
    );
}
