//! The cache's memory bound holds under a workload far larger than the cache (invariant C1),
//! measured both by the cache's own accounting and by the process's resident memory.
//! One test in its own binary, so no other test's allocations disturb the RSS reading.

use std::ops::Bound;

use fern_tree::{Env, Options, WriteBatch};

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn cache_bound_holds_for_data_many_times_larger() {
    let dir = tempfile::tempdir().unwrap();
    let cache = 16usize << 20;
    let opts = Options {
        cache_bytes: cache,
        node_bytes: 256 << 10,
        ..Options::default()
    };
    let env = Env::create(dir.path().join("img"), opts).unwrap();
    let t = env.tree("t").unwrap();
    let base = rss_kib("VmRSS:");
    let mut x: u64 = 88172645463325252;
    let mut value = vec![0u8; 100];
    let mut peak_accounted = 0usize;
    // 1M rows of ~116 bytes: about 7x the cache.
    for _ in 0..1000 {
        let mut b = WriteBatch::new();
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for c in value.chunks_mut(8) {
                c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
                x = x.rotate_left(7).wrapping_mul(0x9E3779B97F4A7C15);
            }
            b.insert(&t, &x.to_be_bytes(), &value);
        }
        env.write(b).unwrap();
        peak_accounted = peak_accounted.max(env.stats().cache.used_bytes);
    }
    // Reads of everything, cold for most of it.
    let mut rows = 0;
    t.scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
        rows += 1;
        true
    })
    .unwrap();
    assert_eq!(rows, 1_000_000);
    peak_accounted = peak_accounted.max(env.stats().cache.used_bytes);
    let hwm = rss_kib("VmHWM:");
    let grown_mib = hwm.saturating_sub(base) as f64 / 1024.0;
    eprintln!(
        "cache bound {} MiB: accounted peak {:.1} MiB, resident growth {:.1} MiB",
        cache >> 20,
        peak_accounted as f64 / (1 << 20) as f64,
        grown_mib
    );
    // Accounting: over the bound only by nodes in use by the current operation.
    assert!(
        peak_accounted <= cache + 4 * (256 << 10) * 2,
        "accounted {peak_accounted} bytes for a {cache}-byte cache"
    );
    // Resident memory: the allocator's own slack comes on top, so allow 2x plus 8 MiB of
    // transient buffers; an unbounded cache would grow to the data size (~110 MiB).
    assert!(
        grown_mib <= 2.0 * (cache >> 20) as f64 + 8.0,
        "resident memory grew {grown_mib:.1} MiB for a {} MiB cache",
        cache >> 20
    );
    env.close().unwrap();
}
