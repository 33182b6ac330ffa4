//! Directed tests of the log's edge cases: a damaged tail is cut (W4), damage followed by records
//! that prove it was durable is an error naming the record (W4), an unregistered upsert in the
//! log fails the open, a batch larger than half the log is refused, and a log that fills keeps
//! checkpointing instead of overwriting needed records (W5).

use std::ops::Bound;
use std::sync::Arc;

use fern_tree::blockfile::{BlockFile, BlockLoc};
use fern_tree::device::MemDevice;
use fern_tree::{Durability, Env, Error, Options, UpsertId, WriteBatch};

fn options() -> Options {
    Options {
        log_bytes: 64 << 10,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

/// The log region of an image (its largest extent).
fn log_region(image: &[u8]) -> BlockLoc {
    BlockFile::open(Arc::new(MemDevice::from_bytes(image.to_vec())))
        .expect("block file")
        .file
        .live_blocks()
        .map(|(_, l)| l)
        .max_by_key(|l| l.len)
        .expect("log region")
}

/// An image whose log holds, after the checkpoint at LSN 0: the creation of tree "t" (a 7-byte
/// payload at LSN 0, so the first batch is at LSN 43) and `n` Sync inserts of `k<i>`.
fn image_with_log(n: u32) -> Vec<u8> {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    for i in 0..n {
        let mut b = WriteBatch::new();
        b.insert(&t, format!("k{i}").as_bytes(), &[i as u8; 10]);
        env.write_with(b, Durability::Sync).expect("commit");
    }
    let image = mem.snapshot();
    // A crash: no close, no checkpoint; the log holds everything.
    std::mem::forget(t);
    std::mem::forget(env);
    image
}

fn keys(env: &Env) -> Vec<Vec<u8>> {
    env.tree("t")
        .expect("tree")
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan")
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn intact_log_replays_everything() {
    let env = Env::open_on(
        Arc::new(MemDevice::from_bytes(image_with_log(5))),
        options(),
    )
    .expect("open");
    assert_eq!(keys(&env).len(), 5);
}

/// W4: a damaged last record is a torn tail: cut, the rest replayed.
#[test]
fn damaged_tail_is_cut() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image.clone())), options())
        .expect("open intact");
    let end = env.stats().log_end.0;
    drop(env);
    // The last byte of the last record's payload.
    image[(log.offset + end - 1) as usize] ^= 0x40;
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    let k = keys(&env);
    assert_eq!(
        k.len(),
        4,
        "the damaged last batch is cut, the others replayed"
    );
    assert!(!k.contains(&b"k4".to_vec()));
}

/// W4: damage followed by records whose `synced` field shows it was durable is an error that
/// names the record, not a silent cut.
#[test]
fn damage_before_durable_records_is_an_error() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    // The first batch (LSN 43): its payload starts at 43 + 36.
    image[(log.offset + 43 + 36 + 20) as usize] ^= 0x01;
    match Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()) {
        Err(Error::Checksum { what, .. }) => {
            assert!(what.contains("log record at LSN 43"), "{what}")
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
}

/// Recovery runs upserts through the registered functions; a log naming an unregistered one
/// fails the open instead of dropping the update.
#[test]
fn replay_needs_the_upsert_functions() {
    let mut o = options();
    o.register_upsert(
        UpsertId(9),
        Arc::new(|_, old, arg| {
            let mut v = old.unwrap_or_default().to_vec();
            v.extend_from_slice(arg);
            Some(v)
        }),
    );
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), o.clone()).expect("create");
    let t = env.tree("t").expect("tree");
    t.upsert(b"c", UpsertId(9), b"ab").expect("upsert");
    t.upsert(b"c", UpsertId(9), b"cd").expect("upsert");
    env.sync().expect("sync");
    let image = mem.snapshot();
    std::mem::forget(t);
    std::mem::forget(env);
    let err = Env::open_on(Arc::new(MemDevice::from_bytes(image.clone())), options());
    assert!(matches!(err, Err(Error::UnknownUpsert(9))), "{err:?}");
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), o).expect("open");
    assert_eq!(
        env.tree("t").expect("tree").get(b"c").expect("get"),
        Some(b"abcd".to_vec())
    );
}

/// A batch larger than half the log region is refused without poisoning; a log that fills
/// up makes writers checkpoint (W5) and nothing needed is overwritten.
#[test]
fn oversized_batches_and_full_logs() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    let big = vec![1u8; 40 << 10];
    assert!(matches!(
        t.insert(b"big", &big),
        Err(Error::InvalidArgument(_))
    ));
    // Many times the log's size, each batch a tenth of it.
    let v = vec![2u8; 6 << 10];
    for i in 0..100u32 {
        t.insert(format!("v{i:03}").as_bytes(), &v).expect("insert");
    }
    env.sync().expect("sync");
    assert!(
        env.stats().log_end.0 > 8 * (64 << 10),
        "the log wrapped several times"
    );
    let image = mem.snapshot();
    std::mem::forget(t);
    std::mem::forget(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(keys(&env).len(), 100);
}
