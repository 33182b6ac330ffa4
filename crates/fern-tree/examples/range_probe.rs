//! What pending range deletes cost point reads: 40,000 one-row "files", then a range delete
//! per file for half of them (as an unlink of a file's blocks was), timing point reads of the
//! other half before and after. Every point read checks each range delete still buffered on
//! its path (`betree::read::fold_key`).
//!
//!     cargo run --release -p fern-tree --example range_probe

use std::time::{Duration, Instant};

use fern_tree::{Env, Options, Tree, WriteBatch};

fn key(i: u64) -> Vec<u8> {
    format!("{i:016}/0000").into_bytes()
}

fn probe(t: &Tree, label: &str) {
    let start = Instant::now();
    let mut n = 0u32;
    for i in (20_000..40_000u64).step_by(7) {
        if t.get(&key(i)).expect("get").is_some() {
            n += 1;
        }
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n.max(1));
    println!("{label}: {n} point reads, {us:.2} µs each");
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        cache_bytes: 128 << 20,
        ..Options::default()
    };
    let env = Env::create(dir.path().join("img"), opts).expect("create");
    let t = env.tree("data").expect("tree");
    for c in 0..400u64 {
        let mut b = WriteBatch::new();
        for i in c * 100..(c + 1) * 100 {
            b.insert(&t, &key(i), &[7u8; 200]);
        }
        env.write(b).expect("insert");
    }
    probe(&t, "before the range deletes");
    for i in 0..20_000u64 {
        let mut b = WriteBatch::new();
        b.delete_range(
            &t,
            format!("{i:016}/").as_bytes(),
            format!("{i:016}0").as_bytes(),
        );
        env.write(b).expect("range delete");
    }
    probe(&t, "after 20,000 range deletes");
    std::thread::sleep(Duration::from_secs(2));
    probe(&t, "two seconds later");
}
