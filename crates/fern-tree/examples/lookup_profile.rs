//! E2-like: build a 1M-row image with a given basement size, reopen cold, time random lookups.
use std::time::Instant;

use fern_tree::{Env, Options, WriteBatch};

fn keys() -> impl Iterator<Item = Vec<u8>> {
    let mut x: u64 = 0x9E3779B97F4A7C15;
    std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some([x.to_be_bytes(), x.rotate_left(17).to_be_bytes()].concat())
    })
}

fn main() {
    let basement: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
        << 10;
    let path = std::env::temp_dir().join(format!("fern-lookup-{basement}.img"));
    let _ = std::fs::remove_file(&path);
    let opts = Options {
        cache_bytes: 32 << 20,
        basement_bytes: basement,
        ..Options::default()
    };
    let env = Env::create(&path, opts.clone()).unwrap();
    let t = env.tree("t").unwrap();
    let mut ks = keys();
    let t0 = Instant::now();
    for _ in 0..1000 {
        let mut b = WriteBatch::new();
        for _ in 0..1000 {
            let k = ks.next().unwrap();
            b.insert(&t, &k, &[7u8; 100]);
        }
        env.write(b).unwrap();
    }
    env.close().unwrap();
    let ins = t0.elapsed().as_secs_f64();
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg("sync; echo 3 > /proc/sys/vm/drop_caches")
        .status();
    let env = Env::open(&path, opts).unwrap();
    let t = env.tree("t").unwrap();
    let all: Vec<Vec<u8>> = keys().take(1_000_000).collect();
    let mut x: u64 = 42;
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let k = &all[(x >> 33) as usize % all.len()];
        let s = Instant::now();
        assert!(t.get(k).unwrap().is_some());
        lat.push(s.elapsed().as_micros() as u64);
    }
    let el = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    println!(
        "basement {} KiB: insert {:.0}/s, lookups {:.0}/s p50 {}us p99 {}us",
        basement >> 10,
        1e6 / ins,
        200_000.0 / el,
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
}
