//! CPU per commit and per message of small write batches, the file system's pattern (every
//! request a batch of one to three messages): a tree of PRE rows (2,000: a leaf root, like the
//! file system's small trees; 300,000: an internal root), then 200,000 inserts of random keys
//! of that range in batches of BATCH, timed by wall clock and by the writer thread's CPU.
//!
//! `cargo run --release -p fern-tree --example commit_cost -- [PRE [BATCH]]` (default: both
//! tree sizes, batches of 1, 2, 8 and 64). Under `valgrind --tool=cachegrind` it gives
//! instruction counts, which this machine's noise does not move.
use std::time::Instant;

use fern_tree::{Env, Options, WriteBatch};

/// CPU seconds of the calling thread so far.
fn thread_cpu() -> f64 {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is a valid value.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(r.ru_utime) + s(r.ru_stime)
}

/// Key `i` of the tree: spread over the key space, 8 bytes.
fn key(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9E3779B97F4A7C15).to_be_bytes()
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("PRE and BATCH are numbers"))
        .collect();
    let pres = args.first().map_or(vec![2_000, 300_000], |&p| vec![p]);
    let batches = args.get(1).map_or(vec![1, 2, 8, 64], |&b| vec![b as usize]);
    let path = std::env::temp_dir().join("fern-commit-cost.img");
    for &pre in &pres {
        for &batch in &batches {
            let _ = std::fs::remove_file(&path);
            let opts = Options {
                cache_bytes: 128 << 20,
                node_bytes: 512 << 10,
                ..Options::default()
            };
            let env = Env::create(&path, opts).unwrap();
            let t = env.tree("t").unwrap();
            for chunk in 0..pre.div_ceil(1000) {
                let mut b = WriteBatch::new();
                for i in chunk * 1000..((chunk + 1) * 1000).min(pre) {
                    b.insert(&t, &key(i), &[7u8; 100]);
                }
                env.write(b).unwrap();
            }
            let mut x = 0x9E3779B97F4A7C15u64;
            let mut rnd = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let n = 200_000usize;
            let (t0, c0) = (Instant::now(), thread_cpu());
            let mut done = 0;
            while done < n {
                let mut b = WriteBatch::new();
                for _ in 0..batch {
                    b.insert(&t, &key(rnd() % (pre * 2)), &[9u8; 100]);
                }
                env.write(b).unwrap();
                done += batch;
            }
            let (wall, cpu) = (t0.elapsed().as_secs_f64(), thread_cpu() - c0);
            println!(
                "{pre} rows, batches of {batch}: {:.0} ns/message wall, {:.0} ns/message and {:.0} ns/commit of the writer's CPU",
                wall * 1e9 / done as f64,
                cpu * 1e9 / done as f64,
                cpu * 1e9 * batch as f64 / done as f64
            );
            env.close().unwrap();
        }
    }
    let _ = std::fs::remove_file(&path);
}
