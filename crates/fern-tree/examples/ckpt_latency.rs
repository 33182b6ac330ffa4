//! Write latency while checkpoints run: the non-stalling checkpoint (`Env::checkpoint`) against
//! the old sharp one (`Env::checkpoint_sharp`, which holds the write lock while it writes every
//! dirty node). Writers insert random 16-byte keys with 100-byte values (`Buffered`); a
//! checkpoint starts every second. Reports, per mode, the worst and p99 latency of writes that
//! overlapped a checkpoint, the same for writes outside checkpoints, and checkpoint durations.
//!
//! `cargo run -p fern-tree --release --example ckpt_latency -- [seconds] [writers] [dir]`
//! (defaults: 8 seconds per mode, 2 writers, `$TMPDIR`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fern_tree::{Durability, Env, Options, WriteBatch};

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn run(mode: &str, secs: f64, writers: usize, dir: &std::path::Path) {
    let tmp = tempfile::tempdir_in(dir).expect("temp dir");
    let opts = Options {
        cache_bytes: 1 << 30,
        sync_interval: None,
        checkpoint_thread: false,
        log_bytes: 1 << 30,
        ..Options::default()
    };
    let env = Env::create(tmp.path().join("img"), opts).expect("create");
    let tree = env.tree("t").expect("tree");
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (env, tree, stop) = (env.clone(), tree.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lat: Vec<(u64, u64)> = Vec::with_capacity(1 << 22);
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let mut b = WriteBatch::new();
                    let mut key = x.to_be_bytes().to_vec();
                    key.extend_from_slice(&(!x).to_be_bytes());
                    b.insert(&tree, &key, &[x as u8; 100]);
                    let s = Instant::now();
                    env.write_with(b, Durability::Buffered).expect("write");
                    let start = s.duration_since(t0).as_nanos() as u64;
                    lat.push((start, s.elapsed().as_nanos() as u64));
                }
                lat
            })
        })
        .collect();
    let mut ckpts: Vec<(u64, u64)> = Vec::new();
    while t0.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(1000));
        let s = Instant::now();
        if mode == "sharp" {
            env.checkpoint_sharp().expect("checkpoint");
        } else {
            env.checkpoint().expect("checkpoint");
        }
        ckpts.push((
            s.duration_since(t0).as_nanos() as u64,
            s.elapsed().as_nanos() as u64,
        ));
    }
    stop.store(true, Ordering::Relaxed);
    let lats: Vec<(u64, u64)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("writer"))
        .collect();
    let overlaps = |&(s, l): &(u64, u64)| ckpts.iter().any(|&(cs, cl)| s < cs + cl && s + l > cs);
    let (mut during, mut outside): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    for x in &lats {
        if overlaps(x) {
            during.push(x.1);
        } else {
            outside.push(x.1);
        }
    }
    let mut cdur: Vec<u64> = ckpts.iter().map(|c| c.1).collect();
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "{{\"mode\":\"{mode}\",\"writers\":{writers},\"writes\":{},\"writes_per_s\":{:.0},\
         \"checkpoints\":{},\"checkpoint_ms_max\":{:.1},\
         \"during_ckpt_max_ms\":{:.3},\"during_ckpt_p99_ms\":{:.3},\"during_ckpt_writes\":{},\
         \"outside_max_ms\":{:.3},\"outside_p99_ms\":{:.3}}}",
        lats.len(),
        lats.len() as f64 / t0.elapsed().as_secs_f64(),
        ckpts.len(),
        ms(pct(&mut cdur, 1.0)),
        ms(pct(&mut during, 1.0)),
        ms(pct(&mut during, 0.99)),
        during.len(),
        ms(pct(&mut outside, 1.0)),
        ms(pct(&mut outside, 0.99)),
    );
    drop(tree);
    env.close().expect("close");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8.0);
    let writers: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let dir = args
        .get(3)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for mode in ["sharp", "fuzzy"] {
        run(mode, secs, writers, &dir);
    }
}
