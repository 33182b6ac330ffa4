//! Real process crash test: a child process (this test binary re-invoked with
//! `FERN_KILL9_CHILD=<image path>`) commits batches with `Durability::Sync` from four threads and
//! prints `ack <thread> <i>` after each acknowledged commit; the parent SIGKILLs it at a random
//! moment, reopens the image and checks every acknowledged commit (W3), that each thread's
//! commits survive as a prefix (the log is replayed in order, W2) and that each two-tree batch is
//! whole. Every other commit puts its tree-b row as a data extent (format.md X1–X10): after
//! the kill each acknowledged extent reads back verified, the live extents are exactly those
//! the rows name, and recovery never had to cut a torn extent (a kill keeps every completed
//! write, X2/X7). `FERN_KILL9_ROUNDS` sets the number of rounds (default 20); the random delays come
//! from `FERN_KILL9_SEED` (default: the clock), printed so a run can be repeated.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use fern_tree::{Durability, Env, ExtentRef, Options, WriteBatch};

const CHILD_ENV: &str = "FERN_KILL9_CHILD";
const THREADS: u64 = 4;

fn options() -> Options {
    Options {
        log_bytes: 256 << 10, // small, so the log wraps and checkpoints run during the test
        sync_interval: None,
        cache_bytes: 1 << 20,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        ..Options::default()
    }
}

fn key(t: u64, i: u64) -> Vec<u8> {
    format!("t{t}-{i:08}").into_bytes()
}

fn value(t: u64, i: u64) -> Vec<u8> {
    format!("value of {t}/{i} {}", "x".repeat((i % 50) as usize)).into_bytes()
}

/// The tree-b row of commit `t`/`i`: even commits hold a data extent (tag `E`, 1 B to 70 KiB),
/// odd ones the commit number inline (tag `S`).
fn b_data(t: u64, i: u64) -> (bool, Vec<u8>) {
    if i.is_multiple_of(2) {
        let len = 1 + ((t * 7919 + i * 104_729) % (70 << 10)) as usize;
        (true, (0..len).map(|j| (j as u64 ^ t ^ i) as u8).collect())
    } else {
        (false, i.to_le_bytes().to_vec())
    }
}

/// What a tree-b row holds: its data (an extent read back and verified) and its reference.
fn b_row(env: &Env, v: &[u8]) -> (Vec<u8>, Option<ExtentRef>) {
    match v.split_first() {
        Some((b'E', r)) => {
            let r = ExtentRef::decode(r).expect("extent reference");
            let mut buf = vec![0u8; r.len as usize];
            env.read_extent(&r, &mut buf)
                .expect("acknowledged extent reads");
            (buf, Some(r))
        }
        Some((b'S', rest)) => (rest.to_vec(), None),
        _ => panic!("tree b row of unknown kind"),
    }
}

fn child(path: &str) {
    let env = Env::create(path, options()).expect("child: create");
    let a = env.tree("a").expect("tree a");
    let b = env.tree("b").expect("tree b");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (env, a, b) = (env.clone(), a.clone(), b.clone());
            std::thread::spawn(move || {
                for i in 0.. {
                    let mut batch = WriteBatch::new();
                    batch.insert(&a, &key(t, i), &value(t, i));
                    match b_data(t, i) {
                        (true, data) => batch.insert_extent(&b, &key(t, i), b"E", data),
                        (false, data) => batch.insert(&b, &key(t, i), &[b"S", &data[..]].concat()),
                    }
                    env.write_with(batch, Durability::Sync)
                        .expect("child: commit");
                    println!("ack {t} {i}");
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
}

#[test]
fn kill9_rounds() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
        return;
    }
    let rounds: u64 = std::env::var("FERN_KILL9_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("FERN_KILL9_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("kill9: {rounds} rounds, FERN_KILL9_SEED={seed}");
    let exe = std::env::current_exe().expect("test binary path");
    let mut rng = seed | 1;
    let mut total_acked = 0u64;
    for round in 0..rounds {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_millis(30 + rng % 400);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("image");
        let mut child = Command::new(&exe)
            .args(["--exact", "kill9_rounds", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().expect("child stdout");
        let reader = std::thread::spawn(move || {
            let mut acked: HashMap<u64, u64> = HashMap::new(); // thread -> acked count
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut w = line.split_whitespace();
                if w.next() != Some("ack") {
                    continue;
                }
                let (Some(t), Some(i)) = (w.next(), w.next()) else {
                    continue; // a line cut by the kill
                };
                let (Ok(t), Ok(i)) = (t.parse::<u64>(), i.parse::<u64>()) else {
                    continue;
                };
                let e = acked.entry(t).or_default();
                *e = (*e).max(i + 1);
            }
            acked
        });
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL the child");
        let _ = child.wait();
        let acked = reader.join().expect("reader thread");
        if !path.exists() || std::fs::metadata(&path).map_or(0, |m| m.len()) == 0 {
            assert!(acked.is_empty(), "round {round}: acks but no image");
            continue;
        }
        let env = match Env::open(&path, options()) {
            Ok(env) => env,
            // Killed while the image was being created: nothing was acknowledged yet.
            Err(e) if acked.is_empty() => {
                eprintln!("round {round}: killed during creation ({e})");
                continue;
            }
            Err(e) => panic!("round {round} (seed {seed}): reopen failed: {e}"),
        };
        assert_eq!(
            env.recovery().torn_extent_cut,
            None,
            "round {round}: a kill -9 cut a torn extent"
        );
        let a = env.tree("a").expect("tree a");
        let b = env.tree("b").expect("tree b");
        let mut refs: Vec<ExtentRef> = b
            .range_vec(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)
            .expect("scan b")
            .iter()
            .filter_map(|(_, v)| b_row(&env, v).1)
            .collect();
        refs.sort();
        assert_eq!(
            env.extents(),
            refs,
            "round {round}: live extents differ from the rows'"
        );
        for t in 0..THREADS {
            let n = acked.get(&t).copied().unwrap_or(0);
            total_acked += n;
            // Every acknowledged commit is present, whole.
            for i in 0..n {
                assert_eq!(
                    a.get(&key(t, i)).expect("get"),
                    Some(value(t, i)),
                    "round {round} (seed {seed}): acknowledged commit {t}/{i} lost"
                );
                let v = b.get(&key(t, i)).expect("get").expect("tree b row");
                assert_eq!(b_row(&env, &v).0, b_data(t, i).1, "round {round}: {t}/{i}");
            }
            // Unacknowledged commits may survive, but only as a whole prefix.
            let mut i = n;
            while a.get(&key(t, i)).expect("get").is_some() {
                assert!(b.get(&key(t, i)).expect("get").is_some(), "half a batch");
                i += 1;
            }
            assert!(
                b.get(&key(t, i)).expect("get").is_none(),
                "round {round}: half a batch {t}/{i}"
            );
            for j in i + 1..i + 20 {
                assert!(
                    a.get(&key(t, j)).expect("get").is_none(),
                    "round {round}: commit {t}/{j} survived but {t}/{i} did not"
                );
            }
        }
        a.verify().expect("tree a verifies");
        b.verify().expect("tree b verifies");
        drop((a, b));
        env.close().expect("close");
    }
    eprintln!("kill9: {rounds} rounds, {total_acked} acknowledged commits checked");
}
