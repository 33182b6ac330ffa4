//! Builds a 1M-row image once, then times cold-process scans of it (for profiling E3).
use std::ops::Bound;
use std::time::Instant;

use fern_tree::{Env, Options, WriteBatch};

fn main() {
    let path = std::env::temp_dir().join("fern-scan-profile.img");
    let opts = Options {
        cache_bytes: 32 << 20,
        ..Options::default()
    };
    if !path.exists() {
        let env = Env::create(&path, opts.clone()).unwrap();
        let t = env.tree("t").unwrap();
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..1000 {
            let mut b = WriteBatch::new();
            for _ in 0..1000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = [x.to_be_bytes(), x.rotate_left(17).to_be_bytes()].concat();
                let v: Vec<u8> = (0..100).map(|i| (x >> (i % 56)) as u8).collect();
                b.insert(&t, &k, &v);
            }
            env.write(b).unwrap();
        }
        env.close().unwrap();
    }
    let env = Env::open(&path, opts).unwrap();
    let t = env.tree("t").unwrap();
    for round in 0..3 {
        let t0 = Instant::now();
        let mut n = 0u64;
        t.scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
            n += 1;
            true
        })
        .unwrap();
        println!(
            "round {round}: {n} rows, {:.0} rows/s",
            n as f64 / t0.elapsed().as_secs_f64()
        );
    }
    println!("{:?}", t.verify().unwrap());
}
