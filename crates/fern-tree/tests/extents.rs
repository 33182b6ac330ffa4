//! Directed tests of data extents (docs/format.md, "Data extents", X1–X10): the API, frees
//! and their refusals, when freed space is reused, damage, upgrades of older images, and the
//! device bytes a large write costs (write amplification).

use std::sync::Arc;

use fern_tree::device::{BlockDevice, MemDevice};
use fern_tree::{Durability, Env, Error, ExtentRef, Options, Tree, WriteBatch};

fn opts() -> Options {
    Options {
        cache_bytes: 4 << 20,
        node_bytes: 64 << 10,
        basement_bytes: 4 << 10,
        fanout: 8,
        log_bytes: 1 << 20,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

/// Incompressible bytes (compression would hide what the device receives).
fn pattern(n: usize, salt: u8) -> Vec<u8> {
    let mut r = fern_testkit::SplitMix64::from_state(salt as u64);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

/// The reference a row holds (the tests store it with no prefix).
fn ref_of(t: &Tree, key: &[u8]) -> ExtentRef {
    ExtentRef::decode(&t.get(key).unwrap().unwrap()).unwrap()
}

fn read(env: &Env, r: &ExtentRef) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; r.len as usize];
    env.read_extent(r, &mut buf).map(|()| buf)
}

fn put(env: &Env, t: &Tree, key: &[u8], data: Vec<u8>) -> ExtentRef {
    let mut b = WriteBatch::new();
    b.insert_extent(t, key, &[], data);
    env.write(b).unwrap();
    ref_of(t, key)
}

#[test]
fn extents_round_trip_across_reopen() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), opts()).unwrap();
    let t = env.tree("data").unwrap();
    let mut want = Vec::new();
    for i in 0..20u8 {
        let data = pattern(1 + i as usize * 9000, i);
        let key = [i];
        let mut b = WriteBatch::new();
        // An extent and an ordinary row in one atomic batch.
        b.insert_extent(&t, &key, &[], data.clone());
        b.insert(&t, &[100 + i], b"small");
        env.write_with(b, Durability::Sync).unwrap();
        want.push((key, data));
    }
    let live = env.extents();
    assert_eq!(live.len(), 20);
    for (key, data) in &want {
        let r = ref_of(&t, key);
        assert!(live.contains(&r));
        assert_eq!(r.offset % 4096, 0, "extents are block aligned");
        assert_eq!(&read(&env, &r).unwrap(), data);
    }
    // A crash right after the last Sync commit (replay binds them), then a clean reopen
    // (the checkpoint's extent table holds them).
    let crashed = dev.snapshot();
    drop(t);
    drop(env);
    for img in [crashed, dev.snapshot()] {
        let env = Env::open_on(Arc::new(MemDevice::from_bytes(img)), opts()).unwrap();
        let t = env.tree("data").unwrap();
        assert_eq!(env.extents(), live);
        for (key, data) in &want {
            assert_eq!(&read(&env, &ref_of(&t, key)).unwrap(), data);
        }
    }
}

#[test]
fn frees_are_checked_and_stale_references_never_read() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("data").unwrap();
    let a = put(&env, &t, b"a", pattern(10_000, 1));
    let b = put(&env, &t, b"b", pattern(5_000, 2));

    // X5: a double free in one batch is refused, nothing is written, nothing is poisoned.
    let mut batch = WriteBatch::new();
    batch.delete(&t, b"a");
    batch.free_extent(a);
    batch.free_extent(a);
    let e = env.write(batch).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(t.get(b"a").unwrap().map(|v| v.len()), Some(16));

    // A free without a row change is refused (it could not be replayed by MSN).
    let mut batch = WriteBatch::new();
    batch.free_extent(b);
    assert!(matches!(env.write(batch), Err(Error::InvalidArgument(_))));

    // Out-of-range extents are refused before anything is written.
    let mut batch = WriteBatch::new();
    batch.insert_extent(&t, b"z", &[], Vec::new());
    assert!(matches!(env.write(batch), Err(Error::InvalidArgument(_))));

    let mut batch = WriteBatch::new();
    batch.delete(&t, b"a");
    batch.free_extent(a);
    env.write(batch).unwrap();
    // X8: a reference to a freed extent is an error, never the bytes there.
    let e = read(&env, &a).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // Freeing it again (a stale reference) is refused.
    let mut batch = WriteBatch::new();
    batch.insert(&t, b"x", b"1");
    batch.free_extent(a);
    assert!(matches!(env.write(batch), Err(Error::InvalidArgument(_))));
    // The environment still works.
    assert_eq!(read(&env, &b).unwrap(), pattern(5_000, 2));
    assert_eq!(env.extents(), vec![b]);
}

/// X5: freed space is reused only after a checkpoint that began after the free has committed
/// (and no durable checkpoint references it).
#[test]
fn freed_space_waits_for_checkpoints() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("data").unwrap();
    let a = put(&env, &t, b"a", pattern(64 << 10, 1));
    env.sync().unwrap();
    let mut batch = WriteBatch::new();
    batch.delete(&t, b"a");
    batch.free_extent(a);
    env.write(batch).unwrap();
    let b = put(&env, &t, b"b", pattern(64 << 10, 2));
    assert_ne!(
        a.offset, b.offset,
        "freed space reused before the free was checkpointed"
    );
    let pending = env.stats().file.pending_free_bytes;
    assert!(pending >= 64 << 10, "the freed extent waits: {pending}");
    env.checkpoint().unwrap();
    env.checkpoint().unwrap();
    assert!(env.stats().file.pending_free_bytes < 64 << 10);
    let c = put(&env, &t, b"c", pattern(64 << 10, 3));
    assert_eq!(read(&env, &b).unwrap(), pattern(64 << 10, 2));
    assert_eq!(read(&env, &c).unwrap(), pattern(64 << 10, 3));
}

/// X8, B6: a damaged extent is a checksum error naming it — after a clean close and after a
/// crash whose log proves the extent durable — never wrong data, never a panic.
#[test]
fn a_damaged_extent_is_a_checksum_error_naming_it() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), opts()).unwrap();
    let t = env.tree("data").unwrap();
    let r = put(&env, &t, b"k", pattern(100_000, 7));
    env.sync().unwrap();
    let crashed = dev.snapshot();
    drop(t);
    env.close().unwrap();
    for mut img in [crashed, dev.snapshot()] {
        img[r.offset as usize + 50_000] ^= 0x10;
        let env = Env::open_on(Arc::new(MemDevice::from_bytes(img)), opts()).unwrap();
        let t = env.tree("data").unwrap();
        let got = ref_of(&t, b"k");
        match read(&env, &got) {
            Err(Error::Checksum { what, .. }) => {
                assert!(
                    what.contains(&format!("data extent at offset {}", r.offset)),
                    "{what}"
                )
            }
            other => panic!("damaged extent read as {other:?}"),
        }
    }
}

/// Bytes the device received per byte of file data for 16 MiB written through a sync and a
/// clean close: as extents of 256 KiB (written once) and as 4 KiB rows (log + tree).
#[test]
fn extents_are_written_once() {
    const TOTAL: usize = 16 << 20;
    let mut opts = opts();
    opts.log_bytes = 64 << 20;
    opts.node_bytes = 1 << 20;
    opts.basement_bytes = 16 << 10;
    opts.fanout = 16;
    let amplification = |extents: bool| {
        let dev = Arc::new(MemDevice::new());
        let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts.clone()).unwrap();
        let t = env.tree("data").unwrap();
        let before = env.stats().device.bytes_written;
        let piece = 256 << 10;
        for i in 0..TOTAL / piece {
            let data = pattern(piece, i as u8);
            let mut b = WriteBatch::new();
            if extents {
                b.insert_extent(&t, &(i as u64).to_be_bytes(), &[], data);
            } else {
                for (j, block) in data.chunks(4096).enumerate() {
                    b.insert(&t, &((i * piece / 4096 + j) as u64).to_be_bytes(), block);
                }
            }
            env.write(b).unwrap();
        }
        env.sync().unwrap();
        env.checkpoint().unwrap();
        let written = env.stats().device.bytes_written - before;
        drop(t);
        env.close().unwrap();
        written as f64 / TOTAL as f64
    };
    let (ext, rows) = (amplification(true), amplification(false));
    eprintln!("device bytes per data byte: extents {ext:.3}, 4 KiB rows {rows:.3}");
    assert!(ext <= 1.1, "extents wrote {ext:.3}x the data");
    assert!(
        rows >= 1.5,
        "rows are logged and then written to nodes: {rows:.3}x"
    );
}

/// The image a crash leaves after a checkpoint, then `before` small rows, an extent, `after`
/// small rows, and a `Sync` commit: replay has to evict nodes (a cache of four nodes) around
/// the extent's binding.
fn crashed_with_extent_in_the_log(data: &[u8]) -> (Options, Vec<u8>) {
    let mut o = opts();
    o.node_bytes = 4096;
    o.basement_bytes = 1024;
    o.fanout = 4;
    o.cache_bytes = 4 * 4096;
    o.log_bytes = 8 << 20; // no checkpoint during the workload: replay covers all of it
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), o.clone()).unwrap();
    let t = env.tree("data").unwrap();
    env.checkpoint().unwrap();
    let row = |i: u32| (format!("row{i:06}").into_bytes(), vec![i as u8; 40]);
    for i in 0..1500 {
        let (k, v) = row(i);
        t.insert(&k, &v).unwrap();
    }
    let mut b = WriteBatch::new();
    b.insert_extent(&t, b"extent", &[], data.to_vec());
    env.write(b).unwrap();
    for i in 1500..3000 {
        let (k, v) = row(i);
        t.insert(&k, &v).unwrap();
    }
    env.sync().unwrap();
    let img = dev.snapshot();
    drop(t);
    drop(env);
    (o, img)
}

/// X6: recovery reserves the space of every extent the log binds before it replays, so nodes
/// that replay evicts never land in an extent bound later in the log.
#[test]
fn replay_never_writes_nodes_over_a_later_extent() {
    let data = pattern(200 << 10, 9);
    let (o, img) = crashed_with_extent_in_the_log(&data);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(img)), o).unwrap();
    assert!(env.recovery().records_replayed > 1000);
    let t = env.tree("data").unwrap();
    assert_eq!(read(&env, &ref_of(&t, b"extent")).unwrap(), data);
    assert_eq!(
        t.range_vec(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)
            .unwrap()
            .len(),
        3001
    );
    t.verify().unwrap();
}

/// W11 with extents: a read-only open replays binds in memory, reads the extent, and leaves the
/// image byte for byte unchanged.
#[test]
fn read_only_open_reads_replayed_extents_and_writes_nothing() {
    let data = pattern(50_000, 4);
    let (mut o, img) = crashed_with_extent_in_the_log(&data);
    o.read_only = true;
    o.cache_bytes = 64 << 20; // replayed nodes stay in memory (W11)
    let dev = Arc::new(MemDevice::from_bytes(img.clone()));
    let env = Env::open_on(dev.clone(), o).unwrap();
    let t = env.tree("data").unwrap();
    assert_eq!(read(&env, &ref_of(&t, b"extent")).unwrap(), data);
    drop(t);
    drop(env);
    assert!(dev.snapshot() == img, "a read-only open changed the image");
}

/// A written extent's data buffer serves the next writer (`Env::extent_buffer`): its pages
/// are resident, where a fresh 1 MiB buffer faults in 256 zeroed pages as it is filled. The
/// reuse must never reach data already written, and the pool stays bounded.
#[test]
fn written_extents_hand_their_buffers_to_the_next_writer() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("data").unwrap();
    assert_eq!(env.extent_buffers_held(), 0);

    let mut first = env.extent_buffer(1 << 20);
    assert!(first.is_empty() && first.capacity() >= 1 << 20);
    let at = first.as_ptr();
    first.extend_from_slice(&pattern(1 << 20, 1));
    let r1 = put(&env, &t, b"a", first);
    assert_eq!(env.extent_buffers_held(), 1 << 20);

    // The same memory comes back, empty, and is filled with other bytes...
    let mut second = env.extent_buffer(1 << 20);
    assert_eq!(
        second.as_ptr(),
        at,
        "the written extent's buffer is handed out again"
    );
    assert!(second.is_empty());
    assert_eq!(env.extent_buffers_held(), 0);
    second.extend_from_slice(&pattern(1 << 20, 2));
    let r2 = put(&env, &t, b"b", second);
    // ...without touching what the first extent holds.
    assert_eq!(read(&env, &r1).unwrap(), pattern(1 << 20, 1));
    assert_eq!(read(&env, &r2).unwrap(), pattern(1 << 20, 2));

    // A buffer too small for the request is not handed out for it.
    assert_eq!(env.extent_buffer(2 << 20).capacity(), 2 << 20);

    // Small buffers are not kept (the allocator's heap serves them well).
    assert_eq!(env.extent_buffers_held(), 1 << 20);
    put(&env, &t, b"small", pattern(4096, 3));
    assert_eq!(env.extent_buffers_held(), 1 << 20);

    // Eight 1 MiB extents in one batch: at most 4 MiB of buffers are kept.
    let mut b = WriteBatch::new();
    for i in 0..8u8 {
        b.insert_extent(&t, &[b'c', i], &[], pattern(1 << 20, 10 + i));
    }
    env.write(b).unwrap();
    assert_eq!(env.extent_buffers_held(), 4 << 20);
}
