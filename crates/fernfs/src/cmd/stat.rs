//! `fernfs stat TARGET|MOUNTPOINT [--json]`: what an image holds and what it costs — files,
//! directories, logical bytes against the image's allocated bytes — and the engine's figures:
//! message backlog and node counts always; cache hit rate and write amplification for a
//! mounted image, where they describe the running mount (counters start at the mount).
//!
//! An unmounted image is opened through the library API. A mounted one is locked by its
//! daemon, so the namespace is walked through the mount and the engine figures come from the
//! daemon, as the value of the root's virtual xattr `fernfs.stats` (JSON, made by
//! [`engine_figures`] inside the daemon on each read; see docs/fuse.md). It must never write
//! to the image beyond what mounting the core does (freeing orphans). An etcd file system
//! (`etcd://…`) is walked read-only through the library API.

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Args;
use fern_fs::{FileType, InodeId};
use fern_kv_tree::TreeStore;
use serde_json::{json, Value};

use super::image::{Access, CmdError, Image, DEFAULT_CACHE};
use super::mount::mounted_image;
use super::target::Target;

/// Options of `fernfs stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Image file, the mount point of a mounted image, or `etcd://HOST:PORT[,...]/PREFIX`.
    pub target: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default)]
struct Counts {
    dirs: u64,
    files: u64,
    symlinks: u64,
    other: u64,
    logical_bytes: u64,
}

/// The engine's figures for `store` as JSON. `live` says the counters describe a running
/// mount; otherwise they would only describe this command's own open, and the per-mount
/// figures (hit rate, write amplification, traffic) are `null`.
pub fn engine_figures(store: &TreeStore, live: bool) -> Value {
    let env = store.env();
    let s = env.stats();
    let (backlog, backlog_error) = match env.backlog() {
        Ok(b) => (Some(b), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let live_only = |v: Value| if live { v } else { Value::Null };
    json!({
        "counters_since": if live { json!("mount") } else { Value::Null },
        "cache_hit_rate": live_only(json!(s.cache_hit_rate())),
        "cache_hits": live_only(json!(s.cache.hits)),
        "cache_misses": live_only(json!(s.cache.misses)),
        "cache_evictions": live_only(json!(s.cache.evictions)),
        "cache_nodes": s.cache.nodes,
        "cache_used_bytes": s.cache.used_bytes,
        "cache_limit_bytes": s.cache.limit_bytes,
        "messages": live_only(json!(s.messages)),
        "message_bytes": live_only(json!(s.message_bytes)),
        "device_bytes_written": live_only(json!(s.device.bytes_written)),
        "device_bytes_read": live_only(json!(s.device.bytes_read)),
        "device_syncs": live_only(json!(s.device.syncs)),
        "write_amplification": live_only(json!(s.write_amplification())),
        // Where the node writes came from (write amplification by cause).
        "work": live_only(json!({
            "checkpoint_nodes": s.work.checkpoint_nodes,
            "checkpoint_bytes": s.work.checkpoint_bytes,
            "evicted_nodes": s.work.evicted_nodes,
            "evicted_bytes": s.work.evicted_bytes,
            "writeback_nodes": s.work.writeback_nodes,
            "writeback_bytes": s.work.writeback_bytes,
            "writeback_rounds": s.work.writeback_rounds,
            "reclaim_passes": s.work.reclaim_passes,
            "leaf_flushes": s.work.leaf_flushes,
            "internal_flushes": s.work.internal_flushes,
            "flushed_bytes": s.work.flushed_bytes,
            "leaf_flushed_bytes": s.work.leaf_flushed_bytes,
            "writer_reads": s.work.writer_reads,
            "drained_flushes": s.work.drained_flushes,
            "delta_appends": s.work.delta_appends,
            "delta_merges": s.work.delta_merges,
            "delta_skips": s.work.delta_skips,
        })),
        "backlog_messages": backlog.map(|b| b.messages),
        "backlog_bytes": backlog.map(|b| b.bytes),
        "internal_nodes": backlog.map(|b| b.internal_nodes),
        "backlog_error": backlog_error,
        "trees": env.tree_names().len(),
        "compression": env.compression().to_string(),
        "live_nodes": s.file.live_nodes,
        "image_allocated_bytes_engine": s.file.allocated_bytes,
        "image_free_bytes_engine": s.file.free_bytes,
    })
}

/// Reads the daemon's figures from the mount's root.
fn figures_of_mount(mp: &Path) -> Result<Value, CmdError> {
    // Each read computes a fresh value, so ask once with a buffer that is surely big enough
    // (the JSON is well under 4 KiB) instead of size-then-read.
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::getxattr(mp, fern_fuse::STATS_XATTR, &mut buf[..]).map_err(|e| {
        CmdError::new(format!(
            "{}: the daemon did not report engine figures ({e}); it may predate \
             `fernfs.stats` — remount with this fernfs",
            mp.display()
        ))
    })?;
    serde_json::from_slice(&buf[..n])
        .map_err(|e| CmdError::new(format!("{}: bad engine figures: {e}", mp.display())))
}

/// `fernfs stat etcd://…`: the namespace walked through the library API. An etcd store has no
/// image and no engine, so only the counts are reported, and the etcd round trips the walk
/// cost.
fn run_etcd(args: &StatArgs) -> Result<(), CmdError> {
    let t = Target::open(&args.target, Access::ReadOnly)?;
    let counts = walk_image(&*t.fs(Access::ReadOnly)?)?;
    let (name, requests) = (t.name(), t.etcd_requests().unwrap_or(0));
    t.close()?;
    if args.json {
        let out = json!({
            "etcd": name,
            "read_via": "etcd",
            "directories": counts.dirs,
            "files": counts.files,
            "symlinks": counts.symlinks,
            "other": counts.other,
            "logical_bytes": counts.logical_bytes,
            "etcd_requests": requests,
        });
        println!("{out}");
        return Ok(());
    }
    println!("etcd file system:   {name}");
    println!("directories:        {}", counts.dirs);
    println!("regular files:      {}", counts.files);
    println!("symlinks:           {}", counts.symlinks);
    println!("other inodes:       {}", counts.other);
    println!("logical bytes:      {}", counts.logical_bytes);
    println!("etcd requests:      {requests} (for this walk)");
    Ok(())
}

/// Runs `fernfs stat`.
pub fn run(args: StatArgs) -> Result<(), CmdError> {
    if super::etcd::url(&args.target).is_some() {
        return run_etcd(&args);
    }
    let target = args
        .target
        .canonicalize()
        .map_err(|e| CmdError::new(format!("{}: {e}", args.target.display())))?;
    let (image, counts, engine, via) = if target.is_dir() {
        let image = mounted_image(&target).ok_or_else(|| {
            CmdError::new(format!("{}: no fernfs mounted there", target.display()))
        })?;
        let engine = figures_of_mount(&target)?;
        let counts = walk_mount(&target)?;
        if let Some(src) = image.to_str().filter(|s| super::etcd::is_fsname(s)) {
            // An etcd mount: no image to measure (its source names the store).
            return report_etcd_mount(src, &counts, &engine, args.json);
        }
        (image, counts, engine, "mount")
    } else {
        let img = Image::open_as(&target, DEFAULT_CACHE, Access::ReadOnly)?;
        let fs = img.fs()?;
        let c = walk_image(&fs)?;
        drop(fs);
        let engine = engine_figures(&img.store, false);
        img.close()?;
        (target.clone(), c, engine, "image")
    };
    let meta = std::fs::metadata(&image)?;
    // A block device's own metadata says nothing about its size or use; the engine's
    // allocator does.
    let (image_bytes, on_disk) = if meta.is_file() {
        (meta.len(), meta.blocks() * 512)
    } else {
        let alloc = engine["image_allocated_bytes_engine"].as_u64().unwrap_or(0);
        (
            alloc + engine["image_free_bytes_engine"].as_u64().unwrap_or(0),
            alloc,
        )
    };
    let ratio = if on_disk > 0 {
        counts.logical_bytes as f64 / on_disk as f64
    } else {
        0.0
    };
    if args.json {
        let out = json!({
            "image": image.display().to_string(),
            "read_via": via,
            "directories": counts.dirs,
            "files": counts.files,
            "symlinks": counts.symlinks,
            "other": counts.other,
            "logical_bytes": counts.logical_bytes,
            "image_bytes": image_bytes,
            "image_allocated_bytes": on_disk,
            "logical_per_allocated": (ratio * 1e4).round() / 1e4,
            "engine": engine,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "image:              {} (read via the {via})",
        image.display()
    );
    println!("directories:        {}", counts.dirs);
    println!("regular files:      {}", counts.files);
    println!("symlinks:           {}", counts.symlinks);
    println!("other inodes:       {}", counts.other);
    println!("logical bytes:      {}", counts.logical_bytes);
    println!("image size:         {image_bytes}");
    println!("image allocated:    {on_disk}");
    println!("logical/allocated:  {ratio:.3}");
    print_transport(&engine);
    let num = |k: &str| engine[k].as_f64();
    let or_na = |v: Option<String>| v.unwrap_or_else(|| "n/a (counted by a mount's daemon)".into());
    println!(
        "cache hit rate:     {}",
        or_na(num("cache_hit_rate").map(|r| format!(
            "{:.2}% ({} hits, {} misses since mount)",
            r * 100.0,
            engine["cache_hits"],
            engine["cache_misses"]
        )))
    );
    println!(
        "write amplif.:      {}",
        or_na(num("write_amplification").map(|w| format!(
            "{w:.2} ({} device bytes written / {} message bytes)",
            engine["device_bytes_written"], engine["message_bytes"]
        )))
    );
    match (num("backlog_messages"), num("backlog_bytes")) {
        (Some(m), Some(b)) => println!(
            "message backlog:    {m} messages, {b} bytes in {} internal nodes",
            engine["internal_nodes"]
        ),
        _ => println!("message backlog:    unknown ({})", engine["backlog_error"]),
    }
    println!(
        "nodes:              {} live, {} cached ({} of {} cache bytes), {} trees",
        engine["live_nodes"],
        engine["cache_nodes"],
        engine["cache_used_bytes"],
        engine["cache_limit_bytes"],
        engine["trees"]
    );
    Ok(())
}

/// A mount's daemon reports its FUSE transport (fern_fuse::uring::TransportStatus::json).
fn print_transport(engine: &Value) {
    if let Some(t) = engine["transport"].as_object() {
        let note = t.get("note").and_then(Value::as_str);
        println!(
            "FUSE transport:     {} (asked: {}; {} requests through the rings){}",
            t.get("active").and_then(Value::as_str).unwrap_or("?"),
            t.get("requested").and_then(Value::as_str).unwrap_or("?"),
            t.get("ring_requests").and_then(Value::as_u64).unwrap_or(0),
            note.map(|n| format!("; {n}")).unwrap_or_default()
        );
        if let Some(w) = t.get("ring_wakeups").and_then(Value::as_object) {
            println!(
                "ring wake-ups:      {}{} ({} stalls turned them off)",
                w.get("mode").and_then(Value::as_str).unwrap_or("?"),
                match w.get("usable").and_then(Value::as_bool) {
                    Some(false) => ", not usable by this process",
                    _ => "",
                },
                w.get("stalls").and_then(Value::as_u64).unwrap_or(0),
            );
        }
    }
}

/// `fernfs stat MOUNTPOINT` of an etcd mount (`src`: its /proc/mounts source): what the walk
/// through the mount counted, and the daemon's transport.
fn report_etcd_mount(
    src: &str,
    counts: &Counts,
    engine: &Value,
    json: bool,
) -> Result<(), CmdError> {
    if json {
        let out = json!({
            "etcd": src,
            "read_via": "mount",
            "directories": counts.dirs,
            "files": counts.files,
            "symlinks": counts.symlinks,
            "other": counts.other,
            "logical_bytes": counts.logical_bytes,
            "engine": engine,
        });
        println!("{out}");
        return Ok(());
    }
    println!("etcd file system:   {src} (read via the mount)");
    println!("directories:        {}", counts.dirs);
    println!("regular files:      {}", counts.files);
    println!("symlinks:           {}", counts.symlinks);
    println!("other inodes:       {}", counts.other);
    println!("logical bytes:      {}", counts.logical_bytes);
    print_transport(engine);
    Ok(())
}

fn walk_image(fs: &fern_fs::Fs) -> Result<Counts, CmdError> {
    let mut c = Counts::default();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([InodeId::ROOT]);
    while let Some(dir) = queue.pop_front() {
        c.dirs += 1;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.list(dir, after.as_deref(), 256, true)?;
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                let size = e.attr.map(|a| a.size).unwrap_or(0);
                match e.kind {
                    FileType::Directory => {
                        // Pin it so it can be listed (the core lists known directories only).
                        fs.lookup(dir, &e.name)?;
                        queue.push_back(e.ino);
                    }
                    // Hard links: each inode counts once.
                    FileType::Regular if seen.insert(e.ino.0) => {
                        c.files += 1;
                        c.logical_bytes += size;
                    }
                    FileType::Regular => {}
                    FileType::Symlink => c.symlinks += 1,
                    _ => c.other += 1,
                }
            }
        }
    }
    Ok(c)
}

fn walk_mount(root: &Path) -> Result<Counts, CmdError> {
    let mut c = Counts::default();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([root.to_path_buf()]);
    while let Some(dir) = queue.pop_front() {
        c.dirs += 1;
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let m = e.metadata()?;
            let t = m.file_type();
            if t.is_dir() {
                queue.push_back(e.path());
            } else if t.is_file() {
                if seen.insert(m.ino()) {
                    c.files += 1;
                    c.logical_bytes += m.len();
                }
            } else if t.is_symlink() {
                c.symlinks += 1;
            } else {
                c.other += 1;
            }
        }
    }
    Ok(c)
}
