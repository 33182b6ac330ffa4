//! The read-only open (W11): recovery replays the log into memory only and nothing reaches the
//! device — not the replay's nodes (kept dirty and pinned even beyond the cache bound), not a
//! checkpoint, not the epoch, not a punch — and every write is refused with `Error::ReadOnly`.

use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Durability, Env, Error, Options, WriteBatch};

mod common;
use common::small_options;

fn options() -> Options {
    // A quarter of the log is more than the workload logs: no checkpoint.
    small_options(4 << 20)
}

/// An image whose log holds far more than the cache: 2,000 rows of 200 bytes, synced, never
/// checkpointed (the process is lost).
fn killed_image() -> Vec<u8> {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    for i in 0..2000u32 {
        let mut b = WriteBatch::new();
        b.insert(&t, format!("k{i:05}").as_bytes(), &[i as u8; 200]);
        env.write_with(b, Durability::Buffered).expect("write");
    }
    env.sync().expect("sync");
    let image = mem.snapshot();
    std::mem::forget(t);
    std::mem::forget(env);
    image
}

#[test]
fn read_only_open_replays_in_memory_and_never_writes() {
    let image = killed_image();
    let mem = Arc::new(MemDevice::from_bytes(image.clone()));
    let env = Env::open_on(
        mem.clone(),
        Options {
            read_only: true,
            ..options()
        },
    )
    .expect("read-only open");
    assert!(env.is_read_only());
    assert_eq!(
        env.recovery().records_replayed,
        2001,
        "tree creation + 2000 batches"
    );
    let t = env.tree("t").expect("tree");
    let rows = t
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan");
    assert_eq!(rows.len(), 2000);
    assert_eq!(rows[1234], (b"k01234".to_vec(), vec![1234u32 as u8; 200]));
    t.verify().expect("verify");
    // Writes of every kind are refused, and say why.
    assert!(matches!(t.insert(b"x", b"y"), Err(Error::ReadOnly(_))));
    assert!(matches!(env.sync(), Err(Error::ReadOnly(_))));
    assert!(matches!(env.checkpoint(), Err(Error::ReadOnly(_))));
    assert!(matches!(env.tree("new"), Err(Error::ReadOnly(_))));
    drop(t);
    env.close().expect("close");
    assert!(
        mem.snapshot() == image,
        "the image is byte for byte unchanged"
    );
    // A read-write open then recovers the same state (the read-only one changed nothing).
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(
        env.tree("t")
            .expect("tree")
            .range_vec(Bound::Unbounded, Bound::Unbounded)
            .expect("scan")
            .len(),
        2000
    );
}
