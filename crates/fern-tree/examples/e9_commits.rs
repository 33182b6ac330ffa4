//! E9 of docs/workloads.md: durable commits per second with 1, 4 and 16 threads, each committing
//! small batches with `Durability::Sync`. Concurrent commits share fsyncs (group commit, W3),
//! so the rate should grow almost linearly with threads while one fsync is the bottleneck.
//!
//! `cargo run -p fern-tree --release --example e9_commits -- [seconds per run] [dir]`
//! (defaults: 5 seconds, `$TMPDIR`). Prints one JSON record per thread count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fern_tree::{Durability, Env, Options, WriteBatch};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let dir = args
        .get(2)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    for threads in [1usize, 4, 16] {
        let tmp = tempfile::tempdir_in(&dir).expect("temp dir");
        let opts = Options {
            sync_interval: None,
            log_bytes: 64 << 20,
            ..Options::default()
        };
        let env = Env::create(tmp.path().join("e9"), opts).expect("create");
        let tree = env.tree("e9").expect("tree");
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU64::new(0));
        let syncs_before = env.stats().log_syncs;
        let start = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (env, tree, stop, commits) =
                    (env.clone(), tree.clone(), stop.clone(), commits.clone());
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let mut b = WriteBatch::new();
                        let k = format!("t{t:02}-{i:010}");
                        b.insert(&tree, k.as_bytes(), &[i as u8; 100]);
                        b.insert(&tree, format!("idx-{k}").as_bytes(), b"");
                        env.write_with(b, Durability::Sync).expect("commit");
                        commits.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("writer thread");
        }
        let elapsed = start.elapsed().as_secs_f64();
        let n = commits.load(Ordering::Relaxed);
        let syncs = env.stats().log_syncs - syncs_before;
        println!(
            "{{\"workload\":\"E9\",\"system\":\"fern-tree\",\"threads\":{threads},\
             \"value\":{:.1},\"unit\":\"commits/s\",\"commits\":{n},\"fsyncs\":{syncs},\
             \"commits_per_fsync\":{:.2},\"seconds\":{elapsed:.2}}}",
            n as f64 / elapsed,
            n as f64 / syncs.max(1) as f64
        );
        drop(tree);
        env.close().expect("close");
    }
}
