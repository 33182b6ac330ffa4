//! A full device (format.md, "Space and the reserve", B11–B13): on a device with a fixed
//! capacity that fails with ENOSPC past it, new data is refused with `Error::NoSpace` before
//! anything is written and the environment stays usable (no poisoning); every row written
//! before stays readable; deletes are admitted and give their space back, so later writes
//! succeed; and the full image always reopens (the recovery checkpoint has its reserve), also
//! from a state taken as a kill -9 would leave it. Three rounds of fill, delete half, reopen.

use std::sync::Arc;

use fern_tree::device::{BlockDevice, LimitedDevice, MemDevice};
use fern_tree::{Durability, Env, Error, Options, WriteBatch};

const CAPACITY: u64 = 24 << 20;

fn options() -> Options {
    Options {
        cache_bytes: 2 << 20,
        node_bytes: 64 << 10,
        basement_bytes: 4 << 10,
        fanout: 8,
        log_bytes: 2 << 20,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    // Incompressible enough that lz4 does not hide the volume: a counter mixed per byte.
    fern_testkit::noise(&mut (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1), 3000)
}

fn key(i: u64) -> Vec<u8> {
    format!("file{i:08}").into_bytes()
}

/// Inserts rows from `next` on until the engine refuses one; returns the first refused index.
fn fill(env: &Env, next: u64) -> u64 {
    let t = env.tree("t").expect("tree");
    let mut i = next;
    loop {
        let mut b = WriteBatch::new();
        b.insert(&t, &key(i), &value(i));
        match env.write_with(b, Durability::Buffered) {
            Ok(()) => i += 1,
            Err(Error::NoSpace { context }) => {
                assert!(
                    context.contains("full"),
                    "refusal should say the image is full: {context}"
                );
                return i;
            }
            Err(e) => panic!("row {i}: expected NoSpace, got {e}"),
        }
        assert!(
            i - next < 100_000,
            "never refused: the limit is not enforced"
        );
    }
}

fn check(env: &Env, live: &[u64]) {
    let t = env.tree("t").expect("tree");
    for &i in live {
        assert_eq!(
            t.get(&key(i)).expect("read").as_deref(),
            Some(&value(i)[..]),
            "row {i}"
        );
    }
}

#[test]
fn full_device_refuses_new_data_keeps_old_frees_on_delete_and_reopens() {
    let mem = Arc::new(MemDevice::new());
    let dev: Arc<dyn BlockDevice> = Arc::new(LimitedDevice::new(mem.clone(), CAPACITY));
    let mut env = Env::create_on(dev.clone(), options()).expect("create");
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0;
    let mut firsts = Vec::new();
    for round in 0..3 {
        let end = fill(&env, next);
        let added = end - next;
        firsts.push(added);
        live.extend(next..end);
        next = end;
        // Refused, not poisoned: reads work, a sync works, the refusal repeats.
        check(&env, &live);
        env.sync().expect("sync after a refusal");
        assert_eq!(fill(&env, next), next, "round {round}: refusal is stable");
        let space = env.space();
        assert!(space.fixed && space.capacity == CAPACITY, "{space:?}");
        assert!(
            space.used + space.reserve + (1 << 20) >= CAPACITY,
            "round {round}: refused while {space:?}"
        );
        // Delete every other live row; deletes are admitted on the full device.
        let t = env.tree("t").expect("tree");
        let (gone, kept): (Vec<u64>, Vec<u64>) = live.iter().partition(|&&i| i % 2 == round % 2);
        for chunk in gone.chunks(64) {
            let mut b = WriteBatch::new();
            for &i in chunk {
                b.delete(&t, &key(i));
            }
            env.write_releasing(b, chunk.len() as u64 * 3000)
                .expect("a delete on a full device is admitted");
        }
        live = kept;
        // The space comes back: writes succeed again.
        let again = fill(&env, next);
        assert!(
            again - next >= added / 4,
            "round {round}: after deleting half of {added} rows only {} fit again",
            again - next
        );
        live.extend(next..again);
        next = again;
        check(&env, &live);
        // A kill -9 now (what the process wrote is on the device, nothing more): reopens.
        let killed = Arc::new(MemDevice::from_bytes(mem.snapshot()));
        let kdev: Arc<dyn BlockDevice> = Arc::new(LimitedDevice::new(killed, CAPACITY));
        let reopened = Env::open_on(kdev, options()).expect("a full image opens after a kill");
        reopened.tree("t").expect("tree").verify().expect("verify");
        drop(reopened);
        // A clean close and reopen of the full image.
        env.close().expect("close a full image");
        env = Env::open_on(dev.clone(), options()).expect("reopen a full image");
        check(&env, &live);
        env.tree("t").expect("tree").verify().expect("verify");
        assert!(mem.snapshot().len() as u64 <= CAPACITY);
    }
    env.close().expect("close");
    assert!(
        firsts[0] > 1000,
        "too little fit on an empty device: {firsts:?}"
    );
}

#[test]
fn sized_image_reports_its_capacity_and_gives_space_back() {
    let mem = Arc::new(MemDevice::new());
    let opts = Options {
        capacity: Some(CAPACITY),
        ..options()
    };
    let env = Env::create_on(mem.clone(), opts).expect("create");
    // The image has its size from the start; space is reported against it.
    assert_eq!(mem.len().expect("len"), CAPACITY);
    let empty = env.space();
    assert_eq!(empty.capacity, CAPACITY);
    let t = env.tree("t").expect("tree");
    for i in 0..2000 {
        t.insert(&key(i), &value(i)).expect("insert");
    }
    env.checkpoint().expect("checkpoint");
    let full = env.space();
    assert!(
        full.used >= empty.used + 2000 * 3000 * 9 / 10,
        "6 MB written, used {} -> {}",
        empty.used,
        full.used
    );
    let mut b = WriteBatch::new();
    for i in 0..2000 {
        b.delete(&t, &key(i));
    }
    env.write_releasing(b, 2000 * 3000).expect("delete");
    env.checkpoint().expect("checkpoint");
    env.checkpoint().expect("checkpoint");
    let after = env.space();
    assert!(
        after.used < empty.used + (full.used - empty.used) / 4,
        "deleting everything gave space back: used {} -> {} -> {}",
        empty.used,
        full.used,
        after.used
    );
    env.close().expect("close");
    // The file keeps its size; the catalog keeps the limit.
    assert_eq!(mem.len().expect("len"), CAPACITY);
    let env = Env::open_on(mem.clone(), options()).expect("reopen");
    assert_eq!(env.space().capacity, CAPACITY);
}
