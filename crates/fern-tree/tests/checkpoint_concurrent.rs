//! The non-stalling checkpoint under concurrency (W8, B10): writer threads insert, overwrite and
//! delete while another thread checkpoints in a loop and a small cache forces evictions of
//! dirty nodes during checkpoints. A syncer thread publishes how many writes of each writer are
//! durable; at random moments the test takes a power-cut image of the [`CrashDevice`] and checks
//! that it recovers with every durable write, each writer's writes as a prefix (W2), and trees
//! that verify. `FERN_CKPT_ROUNDS` sets the number of rounds (default 3).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fern_tree::device::{CrashDevice, MemDevice};
use fern_tree::{Durability, Env, Options, WriteBatch};

const WRITERS: u64 = 3;
const MAX_WRITES: u64 = 3000;

fn options() -> Options {
    Options {
        cache_bytes: 256 << 10,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        fanout: 4,
        log_bytes: 512 << 10,
        sync_interval: None,
        checkpoint_thread: true,
        ..Options::default()
    }
}

fn key(w: u64, i: u64) -> Vec<u8> {
    // Spread each writer's keys over the whole key space so writers share nodes.
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    format!("{h:06x}-{w}-{i:07}").into_bytes()
}

fn value(w: u64, i: u64) -> Vec<u8> {
    vec![(w * 31 + i) as u8; 20 + (i % 90) as usize]
}

/// Whether write `i` of a writer leaves the key present: every seventh write is followed in the
/// same batch by a delete of the key written six writes earlier.
fn deleted(i: u64) -> bool {
    (i + 6).is_multiple_of(7)
}

fn all_rows(t: &fern_tree::Tree) -> HashMap<Vec<u8>, Vec<u8>> {
    t.range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan")
        .into_iter()
        .collect()
}

#[test]
fn checkpoints_during_writes_lose_nothing() {
    let rounds: u64 = std::env::var("FERN_CKPT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let dev = Arc::new(CrashDevice::new());
        let env = Env::create_on(dev.clone(), options()).expect("create");
        let tree = env.tree("t").expect("tree");
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
        let durable: Arc<Vec<AtomicU64>> =
            Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
        let mut threads = Vec::new();
        for w in 0..WRITERS {
            let (env, tree, stop, done) = (env.clone(), tree.clone(), stop.clone(), done.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < MAX_WRITES {
                    let mut b = WriteBatch::new();
                    b.insert(&tree, &key(w, i), &value(w, i));
                    if i >= 6 && deleted(i - 6) {
                        b.delete(&tree, &key(w, i - 6));
                    }
                    env.write_with(b, Durability::Buffered).expect("write");
                    i += 1;
                    done[w as usize].store(i, Ordering::SeqCst);
                }
            }));
        }
        {
            let (env, stop) = (env.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    env.checkpoint().expect("checkpoint");
                    std::thread::sleep(Duration::from_millis(3));
                }
            }));
        }
        {
            let (env, stop, done, durable) =
                (env.clone(), stop.clone(), done.clone(), durable.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let before: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
                    env.sync().expect("sync");
                    for (d, b) in durable.iter().zip(before) {
                        d.store(b, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }));
        }
        let mut checked = 0;
        for cut in 0..4u64 {
            std::thread::sleep(Duration::from_millis(30 + 17 * ((round + cut) % 4)));
            let acked: Vec<u64> = durable.iter().map(|d| d.load(Ordering::SeqCst)).collect();
            let image = dev.crash_image(round * 10 + cut);
            let rec = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options())
                .unwrap_or_else(|e| panic!("round {round} cut {cut}: recovery failed: {e}"));
            let t = rec.tree("t").expect("tree");
            t.verify().expect("tree verifies");
            let rows = all_rows(&t);
            for w in 0..WRITERS {
                let n = acked[w as usize];
                for i in 0..n {
                    if deleted(i) && i + 6 >= n {
                        continue; // deleted by a later write, which may or may not have survived
                    }
                    let want = (!deleted(i)).then(|| value(w, i));
                    assert_eq!(
                        rows.get(&key(w, i)).cloned(),
                        want,
                        "round {round} cut {cut}: writer {w} write {i} of {n} durable"
                    );
                }
                checked += n;
            }
            drop(t);
            drop(rec);
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("thread");
        }
        assert!(
            checked > 100,
            "round {round}: only {checked} writes checked"
        );
        // Everything, after a final sync, survives a crash too.
        env.sync().expect("sync");
        let total: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
        let rec = Env::open_on(
            Arc::new(MemDevice::from_bytes(dev.crash_image(round))),
            options(),
        )
        .expect("recover");
        let t = rec.tree("t").expect("tree");
        t.verify().expect("tree verifies");
        let rows = all_rows(&t);
        let mut expected = 0;
        for w in 0..WRITERS {
            let n = total[w as usize];
            for i in 0..n {
                let want = (!(deleted(i) && i + 6 < n)).then(|| value(w, i));
                expected += want.is_some() as usize;
                assert_eq!(rows.get(&key(w, i)).cloned(), want, "final: {w}/{i}");
            }
        }
        assert_eq!(rows.len(), expected, "final: rows nobody wrote");
    }
}
