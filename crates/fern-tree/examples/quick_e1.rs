//! Rough E1/E2/E3 smoke measurement for engine development (the real harness is fern-bench).
//! Prints the load-insensitive figures too: CPU time per insert (getrusage, every thread of
//! the process) and write amplification by cause (the engine's counters).
//!
//! `cargo run --release -p fern-tree --example quick_e1 -- ROWS CACHE_MIB NODE_KIB LOG_MIB`
//!
//! `QUICK_E1_DELTAS=K` sets `Options::leaf_deltas` (0: leaf deltas off); `QUICK_E1_LOOKUPS=N`
//! adds an E2 pass after the inserts: N point reads of inserted keys on the same environment
//! (its cache as the inserts left it), with CPU time and device reads per lookup; with
//! `QUICK_E1_COLD=1` the environment is closed, the page cache dropped (as root) and the image
//! reopened first, as E2 does, and the pass runs twice (cold, then with the cache it warmed).
//! `QUICK_E1_MEMWATCH=1` samples the process's anonymous resident memory beside the cache's
//! count during the inserts. It runs on the `fernfs` binary's allocator (jemalloc, same options;
//! `_RJEM_MALLOC_CONF` overrides them).
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
    let log: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(256) << 20;
    let path = std::env::temp_dir().join("fern-quick-e1.img");
    let _ = std::fs::remove_file(&path);
    let opts = Options {
        cache_bytes: cache,
        node_bytes: node,
        log_bytes: log,
        leaf_deltas: std::env::var("QUICK_E1_DELTAS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(Options::default().leaf_deltas),
        ..Options::default()
    };
    println!("leaf_deltas {}", opts.leaf_deltas);
    let env = Env::create(&path, opts.clone()).unwrap();
    let t = env.tree("e1").unwrap();
    // QUICK_E1_THREADS=k: k writer threads insert n/k rows each (writers overlapping).
    let threads: u64 = std::env::var("QUICK_E1_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let watch = std::env::var_os("QUICK_E1_MEMWATCH").map(|_| {
        let env = env.clone();
        std::thread::spawn(move || mem_watch(&env))
    });
    let start = Instant::now();
    let writers: Vec<_> = (0..threads)
        .map(|w| {
            let (env, t) = (env.clone(), t.clone());
            std::thread::spawn(move || {
                insert_rows(&env, &t, n / threads, 0x9E3779B97F4A7C15 ^ w);
                let (u, s) = cpu_seconds(libc::RUSAGE_THREAD);
                u + s
            })
        })
        .collect();
    let writer_cpu: f64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    let el = start.elapsed().as_secs_f64();
    println!("E1 {n} inserts: {:.0}/s ({el:.1}s)", n as f64 / el);
    let (user, sys) = cpu_seconds(libc::RUSAGE_SELF);
    println!(
        "E1 cpu: user {user:.1}s sys {sys:.1}s = {:.2} us/insert; the writers' threads {:.2} us/insert ({threads} writers)",
        (user + sys) * 1e6 / n as f64,
        writer_cpu * 1e6 / n as f64
    );
    print_work(&env.stats());
    if let Some(w) = watch {
        STOP.store(true, std::sync::atomic::Ordering::Relaxed);
        w.join().unwrap();
    }
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
    let lookups: u64 = std::env::var("QUICK_E1_LOOKUPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if lookups > 0 && threads == 1 && std::env::var_os("QUICK_E1_COLD").is_some() {
        // E2's conditions: closed, the page cache dropped (root only), opened again.
        drop(t);
        env.close().unwrap();
        let dropped = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
        println!("cold: reopened, page cache dropped: {dropped}");
        let env = Env::open(&path, opts).unwrap();
        let t = env.tree("e1").unwrap();
        point_reads(&env, &t, n, lookups);
        point_reads(&env, &t, n, lookups);
        return;
    }
    if lookups > 0 && threads == 1 {
        point_reads(&env, &t, n, lookups);
    }
    if std::env::var_os("QUICK_E1_ONLY").is_some() {
        return;
    }
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

/// Inserts `n` random 16-byte keys with 100-byte values, in batches of 1000.
fn insert_rows(env: &Env, t: &fern_tree::Tree, n: u64, seed: u64) {
    let mut x: u64 = seed;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v = vec![0u8; 100];
    for _ in 0..n / 1000 {
        let mut batch = WriteBatch::new();
        for _ in 0..1000 {
            let k = [rnd().to_be_bytes(), rnd().to_be_bytes()].concat();
            for c in v.chunks_mut(8) {
                let r = rnd().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            batch.insert(t, &k, &v);
        }
        env.write(batch).unwrap();
    }
}

/// E2: `count` point reads of keys `insert_rows` inserted (replaying its generator), spread over
/// the whole insert order; prints CPU time and device reads per lookup (load-insensitive).
fn point_reads(env: &Env, t: &fern_tree::Tree, n: u64, count: u64) {
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let every = (n / count).max(1);
    let mut keys = Vec::with_capacity(count as usize);
    for i in 0..n {
        let k = [rnd().to_be_bytes(), rnd().to_be_bytes()].concat();
        for _ in 0..100usize.div_ceil(8) {
            rnd();
        }
        if i % every == 0 && (keys.len() as u64) < count {
            keys.push(k);
        }
    }
    // Random order, so consecutive lookups do not share a leaf by construction.
    let mut y: u64 = 42;
    for i in (1..keys.len()).rev() {
        y = y.wrapping_mul(6364136223846793005).wrapping_add(1);
        keys.swap(i, (y >> 33) as usize % (i + 1));
    }
    let d0 = env.stats().device;
    let (u0, s0) = cpu_seconds(libc::RUSAGE_SELF);
    let t0 = Instant::now();
    for k in &keys {
        assert!(t.get(k).unwrap().is_some(), "inserted key not found");
    }
    let el = t0.elapsed().as_secs_f64();
    let (u1, s1) = cpu_seconds(libc::RUSAGE_SELF);
    let d1 = env.stats().device;
    let m = keys.len() as f64;
    println!(
        "E2 {} lookups: {:.0}/s; cpu {:.2} us/lookup; device reads {:.2}/lookup, {:.1} KiB/lookup",
        keys.len(),
        m / el,
        ((u1 + s1) - (u0 + s0)) * 1e6 / m,
        (d1.reads - d0.reads) as f64 / m,
        (d1.bytes_read - d0.bytes_read) as f64 / m / 1024.0
    );
}

/// User and system CPU seconds so far of the process (`RUSAGE_SELF`) or the calling thread.
fn cpu_seconds(who: libc::c_int) -> (f64, f64) {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// Write amplification and where the written bytes came from.
fn print_work(s: &fern_tree::Stats) {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    let w = &s.work;
    println!(
        "write amp {:.2}: device {:.0} MiB = log {:.0} + checkpoint nodes {:.0} ({}) + evicted nodes {:.0} ({}) + writeback nodes {:.0} ({}) + other {:.0}; user {:.0} MiB",
        s.write_amplification().unwrap_or(0.0),
        mb(s.device.bytes_written),
        mb(s.log_end.0),
        mb(w.checkpoint_bytes),
        w.checkpoint_nodes,
        mb(w.evicted_bytes),
        w.evicted_nodes,
        mb(w.writeback_bytes),
        w.writeback_nodes,
        mb(s.device.bytes_written.saturating_sub(
            s.log_end.0 + w.checkpoint_bytes + w.evicted_bytes + w.writeback_bytes
        )),
        mb(s.message_bytes),
    );
    println!(
        "flushes: {} into leaves, {} into internal nodes ({} by the root drain), {:.0} MiB moved ({:.0} MiB into leaves); writer reads {}; device read {:.0} MiB",
        w.leaf_flushes,
        w.internal_flushes,
        w.drained_flushes,
        mb(w.flushed_bytes),
        mb(w.leaf_flushed_bytes),
        w.writer_reads,
        mb(s.device.bytes_read),
    );
    println!(
        "leaf deltas: {} flushes wrote a delta, {} merges",
        w.delta_appends, w.delta_merges
    );
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Samples the process's anonymous resident memory and the cache's count every 2 ms; prints
/// the maxima.
fn mem_watch(env: &Env) {
    let mib = |b: usize| b as f64 / 1048576.0;
    let (mut max_anon, mut max_used, mut max_gap) = (0, 0, 0isize);
    while !STOP.load(std::sync::atomic::Ordering::Relaxed) {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let f: Vec<usize> = statm
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let anon = (f[1] - f[2]) * 4096;
        let used = env.stats().cache.used_bytes;
        max_anon = max_anon.max(anon);
        max_used = max_used.max(used);
        max_gap = max_gap.max(anon as isize - used as isize);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    println!(
        "memwatch: max anon rss {:.1} MiB, cache count {:.1}, gap {:.1}",
        mib(max_anon),
        mib(max_used),
        max_gap as f64 / 1048576.0
    );
}

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The `fernfs` binary's jemalloc options (crates/fernfs/src/main.rs).
#[allow(unsafe_code)]
// SAFETY: a thin pointer to a NUL-terminated static string, which is what jemalloc reads.
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_CONF: &u8 = &b"narenas:1,dirty_decay_ms:1000\0"[0];
