//! Scenarios for data extents (crate `extent` docs): round trip, refused double free, stale
//! reference, atomicity with the row, and refusal by a backend without extents.

use crate::batch::WriteBatch;
use crate::error::KvError;
use crate::extent::{ExtentRef, EXTENT_REF_LEN};
use crate::store::KvStore;
use crate::types::WriteOptions;

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// The reference the row `key` of `t` ends with, checked to carry `prefix` before it.
fn row_ref(s: &dyn KvStore, t: crate::TreeId, key: &[u8], prefix: &[u8]) -> ExtentRef {
    let v = s
        .get(t, key)
        .expect("get")
        .expect("the extent's row exists");
    assert_eq!(
        v.len(),
        prefix.len() + EXTENT_REF_LEN,
        "row = prefix | reference"
    );
    assert_eq!(&v[..prefix.len()], prefix, "the prefix is kept");
    ExtentRef::from_value_tail(&v).expect("reference")
}

fn read(s: &dyn KvStore, r: &ExtentRef) -> Result<Vec<u8>, KvError> {
    let mut buf = vec![0u8; r.len() as usize];
    s.read_extent(r, &mut buf).map(|()| buf)
}

/// A backend without extents refuses a batch with one and applies nothing of it.
pub(super) fn refused_without_extents(s: &dyn KvStore) {
    if s.limits().extents.is_some() {
        return;
    }
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put(t, b"plain".to_vec(), b"v".to_vec());
    b.put_extent(t, b"x".to_vec(), b"P", data(4096, 1));
    match s.write(b, WriteOptions::NO_SYNC) {
        Err(KvError::Unsupported { .. }) => {}
        other => panic!("a backend without extents must refuse them, got {other:?}"),
    }
    assert_eq!(s.get(t, b"plain").expect("get"), None, "nothing applied");
    assert!(s.extents().expect("extents").is_empty());
}

/// Put, read back, list, overwrite with free of the old one, delete with free.
pub(super) fn round_trip(s: &dyn KvStore) {
    let Some(max) = s.limits().extents else {
        return;
    };
    let t = s.tree("t").expect("tree");
    let a = data((1 << 20).min(max), 7);
    let mut b = WriteBatch::new();
    b.put_extent(t, b"a".to_vec(), b"X", a.clone());
    b.put(t, b"beside".to_vec(), b"row".to_vec());
    s.write(b, WriteOptions::SYNC).expect("write extent");
    let ra = row_ref(s, t, b"a", b"X");
    assert_eq!(
        ra.len() as usize,
        a.len(),
        "the reference carries the length"
    );
    assert_eq!(read(s, &ra).expect("read"), a, "extent round trip");
    assert_eq!(s.extents().expect("extents"), vec![ra], "one live extent");
    // An odd length, not a multiple of any block.
    let odd = data(12_345, 9);
    let mut b = WriteBatch::new();
    b.put_extent(t, b"a".to_vec(), b"X", odd.clone());
    b.free_extent(ra);
    s.write(b, WriteOptions::NO_SYNC).expect("replace extent");
    let rb = row_ref(s, t, b"a", b"X");
    assert_ne!(ra, rb, "a new extent has a new reference");
    assert_eq!(read(s, &rb).expect("read"), odd);
    assert_eq!(
        s.extents().expect("extents"),
        vec![rb],
        "the old one was freed"
    );
    // A buffer of the wrong length is refused, not filled in part.
    let mut short = vec![0u8; 10];
    assert!(
        s.read_extent(&rb, &mut short).is_err(),
        "wrong buffer length"
    );
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.free_extent(rb);
    s.write(b, WriteOptions::SYNC).expect("delete");
    assert!(s.extents().expect("extents").is_empty(), "nothing leaked");
    assert_eq!(
        s.get(t, b"beside").expect("get").as_deref(),
        Some(&b"row"[..])
    );
}

/// A free of a freed extent, or the same extent twice in one batch, is refused whole.
pub(super) fn double_free_refused(s: &dyn KvStore) {
    if s.limits().extents.is_none() {
        return;
    }
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put_extent(t, b"a".to_vec(), b"", data(8192, 3));
    b.put_extent(t, b"b".to_vec(), b"", data(8192, 4));
    s.write(b, WriteOptions::NO_SYNC).expect("write");
    let ra = row_ref(s, t, b"a", b"");
    let rb = row_ref(s, t, b"b", b"");
    // Twice in one batch.
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.free_extent(ra);
    b.free_extent(ra);
    assert!(
        s.write(b, WriteOptions::NO_SYNC).is_err(),
        "double free in a batch"
    );
    assert!(s.get(t, b"a").expect("get").is_some(), "nothing applied");
    assert_eq!(read(s, &ra).expect("still live"), data(8192, 3));
    // Once, then again in a later batch.
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.free_extent(ra);
    s.write(b, WriteOptions::NO_SYNC).expect("free");
    let mut b = WriteBatch::new();
    b.delete(t, b"b".to_vec());
    b.put(t, b"c".to_vec(), b"v".to_vec());
    b.free_extent(rb);
    b.free_extent(ra);
    assert!(
        s.write(b, WriteOptions::NO_SYNC).is_err(),
        "free of a freed extent"
    );
    assert!(
        s.get(t, b"b").expect("get").is_some(),
        "nothing applied: the row stays"
    );
    assert_eq!(
        s.get(t, b"c").expect("get"),
        None,
        "nothing applied: no put"
    );
    assert_eq!(read(s, &rb).expect("b still live"), data(8192, 4));
    assert_eq!(s.extents().expect("extents"), vec![rb]);
}

/// A reference to a freed extent reads as an error, never as bytes — even after its space
/// may have gone to a new extent.
pub(super) fn stale_reference(s: &dyn KvStore) {
    if s.limits().extents.is_none() {
        return;
    }
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put_extent(t, b"a".to_vec(), b"", data(4096, 5));
    s.write(b, WriteOptions::SYNC).expect("write");
    let ra = row_ref(s, t, b"a", b"");
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.free_extent(ra);
    s.write(b, WriteOptions::SYNC).expect("free");
    s.sync().expect("sync");
    for round in 0..3u8 {
        let mut b = WriteBatch::new();
        b.put_extent(t, vec![b'n', round], b"", data(4096, 100 + round));
        s.write(b, WriteOptions::SYNC).expect("write");
    }
    assert!(read(s, &ra).is_err(), "a stale reference must not read");
    // A reference never handed out, with a plausible length.
    let mut forged = ra;
    forged.0[0] ^= 0x5a;
    forged.0[1] ^= 0x10;
    assert!(
        read(s, &forged).is_err(),
        "a forged reference must not read"
    );
}

/// The extent and its row are one atomic batch: a batch refused for another reason (an
/// unknown update function) binds no extent and leaves no row.
pub(super) fn atomic_with_row(s: &dyn KvStore) {
    if s.limits().extents.is_none() {
        return;
    }
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put_extent(t, b"a".to_vec(), b"", data(4096, 6));
    b.upsert(t, b"u".to_vec(), super::UNREGISTERED, Vec::new());
    assert!(
        s.write(b, WriteOptions::SYNC).is_err(),
        "unknown update function"
    );
    assert_eq!(s.get(t, b"a").expect("get"), None, "no row");
    assert!(s.extents().expect("extents").is_empty(), "no extent bound");
    // In order with the batch: a delete before the put does not remove it, one after does.
    let mut b = WriteBatch::new();
    b.delete(t, b"a".to_vec());
    b.put_extent(t, b"a".to_vec(), b"", data(4096, 6));
    b.put_extent(t, b"b".to_vec(), b"", data(4096, 8));
    b.delete_range(t, b"b".to_vec(), b"c".to_vec());
    s.write(b, WriteOptions::SYNC).expect("write");
    let ra = row_ref(s, t, b"a", b"");
    assert_eq!(
        s.get(t, b"b").expect("get"),
        None,
        "a later range delete removes the row"
    );
    // The caller left "b"'s extent without a row: it is still live (X9 is the caller's), and
    // a free of it is accepted.
    let live = s.extents().expect("extents");
    assert_eq!(live.len(), 2, "both bound");
    let rb = *live.iter().find(|r| **r != ra).expect("b's extent");
    assert_eq!(read(s, &rb).expect("read"), data(4096, 8));
    let mut b = WriteBatch::new();
    b.free_extent(rb);
    b.delete(t, b"b".to_vec());
    s.write(b, WriteOptions::NO_SYNC).expect("free");
    assert_eq!(s.extents().expect("extents"), vec![ra]);
}
