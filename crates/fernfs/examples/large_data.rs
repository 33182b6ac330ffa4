//! Profiling driver for the large-data path (docs/workloads.md F7 and F8) through the library, with
//! the engine's own counters printed after each phase, so `perf record` sees only fernfs and
//! the figures say where the bytes went (log vs. block file, compression, checkpoints).
//!
//! `cargo run --release -p fernfs --example large_data -- f7|f7w|f8 IMAGE [MiB]` (f7w: the
//! write phase alone, for profiling it)
//!
//! F7: one file written in 1 MiB writes + fsync, closed, reopened (drop the page cache in
//! between with `echo 3 > /proc/sys/vm/drop_caches` if wanted: the tool does it when root),
//! read back in 1 MiB reads and checked. F8: the benchmark's text corpus written as files
//! (128 per directory) + sync, closed; the image's allocated bytes are the figure. The image
//! is left in place for `fernfs stat`. `FERN_ZSTD=LEVEL` creates the image with zstd.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use fern_bench::fs::workloads::{corpus_file, corpus_files};
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, MkfsOptions};
use fern_kv::KvStore;
use fern_kv_tree::TreeStore;

const CACHE: usize = 128 << 20;

/// The `fernfs` binary's allocator tuning (src/main.rs), so the profile is the benchmark's.
#[allow(unsafe_code)]
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    fix_mmap_threshold();
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: large_data f7|f8 IMAGE [MiB]".into());
    }
    let image = Path::new(&args[2]);
    let _ = std::fs::remove_file(image);
    match args[1].as_str() {
        "f7" => f7(image, args.get(3).map_or(Ok(256), |s| s.parse())?, true),
        "f7w" => f7(image, args.get(3).map_or(Ok(256), |s| s.parse())?, false),
        "f8" => f8(image, args.get(3).map_or(Ok(64), |s| s.parse())?),
        m => Err(format!("unknown mode {m}").into()),
    }
}

fn mount(store: &Arc<TreeStore>) -> Result<PathFs, Box<dyn std::error::Error>> {
    let kv: Arc<dyn KvStore> = store.clone();
    Ok(PathFs::new(Arc::new(Fs::mount(kv)?), Cred::root()))
}

/// `FERN_ZSTD=LEVEL` makes the image with zstd at that level instead of the default lz4 (to
/// see what F8's tree part would take).
fn create(image: &Path) -> Result<(Arc<TreeStore>, PathFs), Box<dyn std::error::Error>> {
    let mut opts = fern_tree::Options {
        cache_bytes: CACHE,
        ..fern_tree::Options::default()
    };
    if let Ok(level) = std::env::var("FERN_ZSTD") {
        opts.compression = fern_tree::Compression::Zstd {
            level: level.parse()?,
        };
    }
    let store = TreeStore::create_with(image, opts, fern_fs::registry())?;
    Fs::mkfs(&store, MkfsOptions::default())?;
    let store = Arc::new(store);
    let pfs = mount(&store)?;
    Ok((store, pfs))
}

fn report(what: &str, store: &TreeStore, image: &Path) {
    let s = store.env().stats();
    let blocks = std::fs::metadata(image)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0);
    println!(
        "{what}: device written {:.1} MiB in {} writes, read {:.1} MiB in {} reads, {} syncs; \
         log end {:.1} MiB; message bytes {:.1} MiB; block file: written {:.1} MiB, allocated \
         {:.1} MiB, free {:.1} MiB, pending free {:.1} MiB, file len {:.1} MiB, generation {}; \
         cache: {} evictions ({} dirty), hits {} misses {}; image allocated {:.1} MiB",
        mib(s.device.bytes_written),
        s.device.writes,
        mib(s.device.bytes_read),
        s.device.reads,
        s.device.syncs,
        mib(s.log_end.0),
        mib(s.message_bytes),
        mib(s.file.bytes_written),
        mib(s.file.allocated_bytes),
        mib(s.file.free_bytes),
        mib(s.file.pending_free_bytes),
        mib(s.file.file_len),
        s.file.generation,
        s.cache.evictions,
        s.cache.dirty_evictions,
        s.cache.hits,
        s.cache.misses,
        mib(blocks),
    );
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn chunk(k: u64, buf: &mut [u8]) {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn f7(image: &Path, mib_total: u64, read: bool) -> Result<(), Box<dyn std::error::Error>> {
    const CHUNK: usize = 1 << 20;
    let (store, pfs) = create(image)?;
    let opts = OpenOptions::create_write(0o644);
    let f = pfs.open(b"/big", opts)?;
    let mut buf = vec![0u8; CHUNK];
    let mut timed = std::time::Duration::ZERO;
    for k in 0..mib_total {
        chunk(k, &mut buf);
        let t = Instant::now();
        pfs.write_at(&f, k * CHUNK as u64, &buf)?;
        timed += t.elapsed();
    }
    let t = Instant::now();
    pfs.fsync(&f)?;
    timed += t.elapsed();
    pfs.close(f)?;
    let bytes = mib_total * CHUNK as u64;
    println!(
        "F7 write: {:.0} MB/s ({:.2} s)",
        bytes as f64 / 1e6 / timed.as_secs_f64(),
        timed.as_secs_f64()
    );
    report("after write+fsync", &store, image);
    drop(pfs);
    let t = Instant::now();
    Arc::try_unwrap(store)
        .map_err(|_| "store still shared")?
        .close()?;
    println!("close: {:.2} s", t.elapsed().as_secs_f64());
    if !read {
        return Ok(());
    }
    drop_caches();
    let store = Arc::new(TreeStore::open(image, CACHE, fern_fs::registry())?);
    let pfs = mount(&store)?;
    let f = pfs.open(b"/big", OpenOptions::default())?;
    let mut timed = std::time::Duration::ZERO;
    let mut bad = 0;
    for k in 0..mib_total {
        let t = Instant::now();
        let got = pfs.read_at(&f, k * CHUNK as u64, CHUNK as u32)?;
        timed += t.elapsed();
        chunk(k, &mut buf);
        bad += u32::from(got != buf);
    }
    pfs.close(f)?;
    println!(
        "F7 cold read: {:.0} MB/s ({:.2} s), {bad} bad chunks",
        bytes as f64 / 1e6 / timed.as_secs_f64(),
        timed.as_secs_f64()
    );
    report("after read", &store, image);
    drop(pfs);
    Arc::try_unwrap(store)
        .map_err(|_| "store still shared")?
        .close()?;
    if bad > 0 {
        return Err(format!("{bad} chunks read back wrong").into());
    }
    Ok(())
}

fn f8(image: &Path, mib_total: u64) -> Result<(), Box<dyn std::error::Error>> {
    let seed = 42;
    let (store, pfs) = create(image)?;
    let before = std::fs::metadata(image)?.blocks() * 512;
    let (files, logical) = corpus_files(seed, mib_total << 20);
    pfs.mkdir(b"/c", 0o755)?;
    let t = Instant::now();
    for i in 0..files {
        if i % 128 == 0 {
            pfs.mkdir(format!("/c/d{}", i / 128).as_bytes(), 0o755)?;
        }
        let opts = OpenOptions::create_new(0o644);
        let f = pfs.open(format!("/c/d{}/f{}", i / 128, i % 128).as_bytes(), opts)?;
        pfs.write_at(&f, 0, &corpus_file(seed, i))?;
        pfs.close(f)?;
    }
    pfs.fs().syncfs()?;
    println!(
        "F8: {files} files, {:.1} MiB logical, written in {:.2} s",
        mib(logical),
        t.elapsed().as_secs_f64()
    );
    report("after write+sync", &store, image);
    drop(pfs);
    Arc::try_unwrap(store)
        .map_err(|_| "store still shared")?
        .close()?;
    let after = std::fs::metadata(image)?.blocks() * 512;
    println!(
        "F8 space: {:.1} MiB used ({:.2}x logical); file length {:.1} MiB",
        mib(after - before),
        (after - before) as f64 / logical as f64,
        mib(std::fs::metadata(image)?.len())
    );
    Ok(())
}
