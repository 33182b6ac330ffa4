//! Rough E1/E2/E3 smoke measurement for engine development (the real harness is fern-bench).
use std::ops::Bound;
use std::time::Instant;

use fern_tree::{Env, Options, WriteBatch};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let cache: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32) << 20;
    let node: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024) << 10;
    let path = std::env::temp_dir().join("fern-quick-e1.img");
    let _ = std::fs::remove_file(&path);
    let opts = Options {
        cache_bytes: cache,
        node_bytes: node,
        ..Options::default()
    };
    let env = Env::create(&path, opts.clone()).unwrap();
    let t = env.tree("e1").unwrap();
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let start = Instant::now();
    let mut last = Instant::now();
    let mut v = vec![0u8; 100];
    for b in 0..n / 1000 {
        let mut batch = WriteBatch::new();
        for _ in 0..1000 {
            let k = [rnd().to_be_bytes(), rnd().to_be_bytes()].concat();
            for c in v.chunks_mut(8) {
                let r = rnd().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            batch.insert(&t, &k, &v);
        }
        env.write(batch).unwrap();
        if (b + 1) % 100 == 0 && (b + 1) * 1000 >= n - n / 10 && last.elapsed().as_secs() > 0 {
            last = Instant::now();
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!("E1 {n} inserts: {:.0}/s ({el:.1}s)", n as f64 / el);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in status.lines().filter(|l| l.starts_with("VmHWM")) {
        println!("after inserts: {l}");
    }
    let s = env.stats();
    println!(
        "cache used {} MiB nodes {} evictions {} dirty_ev {}",
        s.cache.used_bytes >> 20,
        s.cache.nodes,
        s.cache.evictions,
        s.cache.dirty_evictions
    );
    let c0 = Instant::now();
    env.checkpoint().unwrap();
    println!("checkpoint {:.2}s", c0.elapsed().as_secs_f64());
    let s = env.stats();
    println!("{:?}", s.file);
    let t0 = Instant::now();
    let mut rows = 0u64;
    t.scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
        rows += 1;
        true
    })
    .unwrap();
    let el = t0.elapsed().as_secs_f64();
    println!("E3 scan {rows} rows: {:.0} rows/s", rows as f64 / el);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in status
        .lines()
        .filter(|l| l.starts_with("VmHWM") || l.starts_with("VmRSS"))
    {
        println!("{l}");
    }
    env.close().unwrap();
    println!(
        "file size {} MiB, raw {} MiB",
        std::fs::metadata(&path).unwrap().len() >> 20,
        (n * 116) >> 20
    );
}
