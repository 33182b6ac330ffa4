//! Several reader threads and a writer at once: readers never see a value that was not
//! written, never miss a key that existed before they started, and nothing panics or deadlocks.

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Env, Options, WriteBatch};

fn opts() -> Options {
    Options {
        cache_bytes: 2 << 20, // small: readers and the writer evict each other's nodes
        node_bytes: 32 << 10,
        basement_bytes: 4 << 10,
        fanout: 8,
        ..Options::default()
    }
}

fn key(i: u64) -> [u8; 8] {
    (i.wrapping_mul(0x9E3779B97F4A7C15)).to_be_bytes()
}

/// Values encode their key and a version, so a reader can check what it sees.
fn value(i: u64, version: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&i.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.resize(64, b'.');
    v
}

#[test]
fn readers_and_a_writer_at_once() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("t").unwrap();
    const BASE: u64 = 20_000;
    let mut b = WriteBatch::new();
    for i in 0..BASE {
        b.insert(&t, &key(i), &value(i, 0));
    }
    env.write(b).unwrap();
    env.checkpoint().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let version = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for r in 0..3u64 {
        let t = t.clone();
        let stop = stop.clone();
        let version = version.clone();
        handles.push(std::thread::spawn(move || {
            let mut checks = 0u64;
            let mut x = r + 1;
            while !stop.load(Ordering::Relaxed) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let i = (x >> 33) % BASE;
                let v = t.get(&key(i)).unwrap().expect("a base key vanished");
                // The writer publishes a round after writing it, so a reader may see at most
                // one round beyond the published number.
                let seen_max = version.load(Ordering::Acquire);
                assert_eq!(&v[..8], &i.to_le_bytes(), "value of another key");
                let ver = u64::from_le_bytes(v[8..16].try_into().unwrap());
                assert!(ver <= seen_max + 1, "version from the future");
                checks += 1;
                if checks.is_multiple_of(200) {
                    // A range scan: ordered, and every base key in the range present.
                    let lo = key(i);
                    let rows = t.range_vec(Bound::Included(&lo), Bound::Unbounded).unwrap();
                    assert!(
                        rows.windows(2).all(|w| w[0].0 < w[1].0),
                        "scan out of order"
                    );
                }
            }
            checks
        }));
    }
    for round in 1..=30u64 {
        let mut b = WriteBatch::new();
        for i in (round % 7..BASE).step_by(7) {
            b.insert(&t, &key(i), &value(i, round));
        }
        // Keys outside the base set come and go.
        for j in 0..200 {
            b.insert(&t, &key(BASE + round * 1000 + j), &value(BASE + j, round));
        }
        if round > 1 {
            for j in 0..200 {
                b.delete(&t, &key(BASE + (round - 1) * 1000 + j));
            }
        }
        env.write(b).unwrap();
        version.store(round, Ordering::Release);
        if round % 10 == 0 {
            env.checkpoint().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(total > 100, "readers made too little progress: {total}");
    for i in 0..BASE {
        let v = t.get(&key(i)).unwrap().unwrap();
        assert_eq!(&v[..8], &i.to_le_bytes());
    }
}

/// Two writer threads with the background threads on (design.md §2.5, "Root flushes off the
/// writer's path"): the root's flushes run on the drain thread, not inside the writers'
/// batches, every row survives, the tree's invariants hold, and after a close and reopen the
/// rows are all there. In the deterministic mode (no checkpoint thread) no flush is drained.
#[test]
fn root_flushes_run_on_the_drain_thread() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), opts()).unwrap();
    let t = env.tree("t").unwrap();
    const PER_WRITER: u64 = 20_000;
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (env, t) = (env.clone(), t.clone());
            std::thread::spawn(move || {
                for chunk in (0..PER_WRITER).collect::<Vec<_>>().chunks(50) {
                    let mut b = WriteBatch::new();
                    for &i in chunk {
                        let k = w * PER_WRITER + i;
                        b.insert(&t, &key(k), &value(k, 1));
                    }
                    env.write(b).unwrap();
                }
            })
        })
        .collect();
    for h in writers {
        h.join().unwrap();
    }
    // On a loaded machine the drain thread may not have been scheduled while the writers ran
    // (a writer that finds the root over twice its size flushes inline). Keep writing, with
    // pauses the drain can use, until it has drained (bounded: the assertion below reports it).
    let mut extra = 2 * PER_WRITER;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while env.stats().work.drained_flushes == 0 && std::time::Instant::now() < deadline {
        let mut b = WriteBatch::new();
        for k in extra..extra + 50 {
            b.insert(&t, &key(k), &value(k, 1));
        }
        env.write(b).unwrap();
        extra += 50;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let work = env.stats().work;
    let flushes = work.leaf_flushes + work.internal_flushes;
    assert!(flushes > 0, "nothing was flushed");
    assert!(
        work.drained_flushes > 0,
        "every flush ran inside a writer's batch: {work:?}"
    );
    t.verify().unwrap();
    drop(t);
    env.close().unwrap();
    let env = Env::open_on(dev, opts()).unwrap();
    let t = env.tree("t").unwrap();
    for k in 0..extra {
        let v = t.get(&key(k)).unwrap().expect("a written row is missing");
        assert_eq!(&v[..8], &k.to_le_bytes());
    }
    t.verify().unwrap();

    let inline = Env::create_on(
        Arc::new(MemDevice::new()),
        Options {
            checkpoint_thread: false,
            sync_interval: None,
            ..opts()
        },
    )
    .unwrap();
    let t = inline.tree("t").unwrap();
    for chunk in (0..PER_WRITER).collect::<Vec<_>>().chunks(50) {
        let mut b = WriteBatch::new();
        for &k in chunk {
            b.insert(&t, &key(k), &value(k, 1));
        }
        inline.write(b).unwrap();
    }
    let work = inline.stats().work;
    assert!(work.leaf_flushes > 0);
    assert_eq!(
        work.drained_flushes, 0,
        "no drain thread in the deterministic mode"
    );
}
