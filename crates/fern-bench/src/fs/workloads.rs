//! The file-system workloads, grouped into scenarios: the work one child process does on one
//! fresh file system.
//!
//! - `tree` (1 thread): F1 create the TokuBench tree + sync → check a sample of files →
//!   F10 chmod + utime of every file + sync → cold → F2 recursive readdir + lstat → F9b rm -r
//!   + sync. With more threads only F1 is measured (each thread fills its own top directory).
//! - `onedir`: F4 N empty files in one directory + sync, cold, one listing.
//! - `micro` (F5 or F6): a file written sequentially and synced, cold, then writes of a few
//!   bytes at random non-overlapping offsets + one fsync.
//! - `rename`: F9a a directory of N empty files renamed into another directory + sync.
//! - `unlink`: F9c a big file written and synced, then unlinked + sync.
//!
//! Durable results: every timed region that changes the file system ends with `sync`
//! (syncfs) or `fsync`, for every system. Every answer is checked after the timed region
//! (file contents, listing counts, the renamed tree, deletions); wrong answers are counted in
//! the records' `errors` and never hidden.

use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::fuse_mount::{fuse_unavailable, FuseMount};
use super::lib_target::LibTarget;
use super::posix::{PosixTarget, SyncBy};
use super::target::{FsSystem, FsTarget};
use super::{FsSizes, FsWorkload};
use crate::data::Rng;
use crate::report::Record;
use crate::{BenchError, Result};

/// The work one child process does on one fresh file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FsScenario {
    /// F1 (and with one thread F10, F2, F9b on its tree).
    Tree {
        /// Threads creating the tree.
        threads: u32,
    },
    /// F4.
    OneDir,
    /// F5 or F6.
    Micro {
        /// Which of the two.
        workload: FsWorkload,
    },
    /// F9a.
    Rename,
    /// F9c.
    Unlink,
}

impl FsScenario {
    /// The workloads this scenario can report.
    pub fn workloads(self) -> &'static [FsWorkload] {
        match self {
            FsScenario::Tree { threads: 1 } => &[
                FsWorkload::F1,
                FsWorkload::F10,
                FsWorkload::F2,
                FsWorkload::F9b,
            ],
            FsScenario::Tree { .. } => &[FsWorkload::F1],
            FsScenario::OneDir => &[FsWorkload::F4],
            FsScenario::Micro {
                workload: FsWorkload::F5,
            } => &[FsWorkload::F5],
            FsScenario::Micro { .. } => &[FsWorkload::F6],
            FsScenario::Rename => &[FsWorkload::F9a],
            FsScenario::Unlink => &[FsWorkload::F9c],
        }
    }

    /// Short label for progress and directory names.
    pub fn label(self) -> String {
        match self {
            FsScenario::Tree { threads } => format!("tree-{threads}t"),
            FsScenario::OneDir => "onedir".into(),
            FsScenario::Micro { workload } => format!("micro-{}", workload.name()),
            FsScenario::Rename => "rename".into(),
            FsScenario::Unlink => "unlink".into(),
        }
    }
}

/// Everything a child process needs to run one task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsTaskSpec {
    /// System name.
    pub system: String,
    /// What to run.
    pub scenario: FsScenario,
    /// Which of the scenario's workloads to report (F1 always runs when the tree is needed).
    pub workloads: Vec<FsWorkload>,
    /// Sizes.
    pub sizes: FsSizes,
    /// An empty directory for the image(s) and mountpoint (created if missing).
    pub dir: PathBuf,
    /// Seed of all generated data.
    pub seed: u64,
    /// Drop the OS page cache before cold phases (needs root).
    pub drop_caches: bool,
    /// Repetition number.
    pub rep: u32,
}

/// What one task measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FsTaskOutput {
    /// One record per figure.
    pub records: Vec<Record>,
    /// Remarks (target description, page cache state).
    pub notes: Vec<String>,
}

/// Size of a kernel file system's image: room for the largest file twice over and for the
/// most files at 32 KiB each (default mkfs.ext4 makes one inode per 16 KiB), at least 8 GiB.
/// The image is sparse: only what the file system writes takes space.
pub fn image_bytes(s: &FsSizes) -> u64 {
    let need = 2 * s.largest_file() + s.most_files() * (32 << 10);
    need.max(8 << 30).div_ceil(1 << 30) << 30
}

/// Opens a fresh file system of `system` in `spec.dir`.
pub fn open_target(spec: &FsTaskSpec) -> Result<Box<dyn FsTarget>> {
    std::fs::create_dir_all(&spec.dir)?;
    Ok(match FsSystem::parse(&spec.system)? {
        FsSystem::FernfsLib => Box::new(LibTarget::create(
            &spec.dir.join("fern.img"),
            spec.sizes.fern_cache_bytes,
        )?),
        FsSystem::FernfsFuse => {
            if let Some(why) = fuse_unavailable("fernfs-fuse") {
                return Err(BenchError::Usage(why));
            }
            let exe = std::env::current_exe()?;
            let m = FuseMount::fernfs(
                &exe,
                &spec.dir.join("fern.img"),
                &spec.dir.join("mnt"),
                spec.sizes.fern_cache_bytes,
            )?;
            let about = format!(
                "fernfs-fuse: `fernfs mkfs` + `fernfs mount -f -o cache_size={}` (default mount \
                 options) by {}, daemon on CPUs {}; sync = fsync of the root directory \
                 (FUSE_FSYNCDIR: the whole store durable), syscalls via std::fs/libc",
                spec.sizes.fern_cache_bytes,
                exe.display(),
                m.daemon_cpus
            );
            Box::new(PosixTarget::on_mount(
                "fernfs-fuse",
                Box::new(m),
                about,
                SyncBy::FsyncRoot,
                true,
            ))
        }
        FsSystem::NullFuse => {
            if let Some(why) = fuse_unavailable("null-fuse") {
                return Err(BenchError::Usage(why));
            }
            let exe = std::env::current_exe()?;
            let m = FuseMount::null(&exe, &spec.dir.join("null.state"), &spec.dir.join("mnt"))?;
            let about = format!(
                "null-fuse: `fernfs bench null-fuse` (namespace and attributes in memory, no \
                 data, nothing durable; fern-fuse's mount options, TTLs, capabilities and open \
                 flags), daemon on CPUs {}; sync = fsync of the root directory; content checks \
                 skipped",
                m.daemon_cpus
            );
            Box::new(PosixTarget::on_mount(
                "null-fuse",
                Box::new(m),
                about,
                SyncBy::FsyncRoot,
                false,
            ))
        }
        sys @ (FsSystem::Ext4 | FsSystem::Xfs | FsSystem::Btrfs) => {
            Box::new(PosixTarget::loop_mounted(
                sys.name(),
                sys.mkfs_type().unwrap_or("ext4"),
                &spec.dir,
                image_bytes(&spec.sizes),
            )?)
        }
    })
}

/// Runs one task in this process.
pub fn run_task(spec: &FsTaskSpec) -> Result<FsTaskOutput> {
    let target = open_target(spec)?;
    run_task_on(spec, target)
}

/// Runs one task on an already opened target (tests pass their own).
pub fn run_task_on(spec: &FsTaskSpec, mut target: Box<dyn FsTarget>) -> Result<FsTaskOutput> {
    let mut out = FsTaskOutput::default();
    out.notes.push(target.describe());
    let res = match spec.scenario {
        FsScenario::Tree { threads } => tree(spec, &mut *target, threads, &mut out),
        FsScenario::OneDir => onedir(spec, &mut *target, &mut out),
        FsScenario::Micro { workload } => micro(spec, &mut *target, workload, &mut out),
        FsScenario::Rename => rename(spec, &mut *target, &mut out),
        FsScenario::Unlink => unlink(spec, &mut *target, &mut out),
    };
    let fin = target.finish();
    res?;
    fin?;
    Ok(out)
}

fn wants(spec: &FsTaskSpec, w: FsWorkload) -> bool {
    spec.workloads.contains(&w)
}

fn record(spec: &FsTaskSpec, w: FsWorkload, value: f64, unit: &str) -> Record {
    Record::named(w.name(), &spec.system, value, unit)
}

fn cold(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let dropped = t.cold(spec.drop_caches)?;
    let note = if dropped {
        "cold phases: unmounted + mounted again and page cache dropped".to_string()
    } else {
        "cold phases: unmounted + mounted again, page cache NOT dropped (not root, or \
         --no-drop-caches)"
            .to_string()
    };
    if !out.notes.contains(&note) {
        out.notes.push(note);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The F1 tree

/// The content of tree file number `g` (200 bytes by default): a pure function of the seed.
pub fn file_content(seed: u64, g: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ g.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The shape of one thread's part of the F1 tree: `files` files in leaf directories of at
/// most `fanout` files, the leaves `depth` levels below the top directory `top`, every
/// directory holding at most `fanout` entries.
#[derive(Clone, Debug)]
pub struct TreeShape {
    /// Top directory ("t0").
    pub top: String,
    /// Files in this part.
    pub files: u64,
    /// Entries per directory at most.
    pub fanout: u64,
    /// Directory levels between `top` and the files (at least 1).
    pub depth: u32,
    /// Global number of this part's first file (for contents).
    pub first: u64,
}

impl TreeShape {
    /// Thread `t`'s part of a tree of `total` files split over `threads` threads.
    pub fn part(total: u64, threads: u32, t: u32, fanout: u64) -> TreeShape {
        let threads = u64::from(threads.max(1));
        let lo = total * u64::from(t) / threads;
        let hi = total * (u64::from(t) + 1) / threads;
        let fanout = fanout.max(2);
        let leaves = (hi - lo).div_ceil(fanout).max(1);
        let mut depth = 1;
        let mut cap = fanout;
        while cap < leaves {
            cap = cap.saturating_mul(fanout);
            depth += 1;
        }
        TreeShape {
            top: format!("t{t}"),
            files: hi - lo,
            fanout,
            depth,
            first: lo,
        }
    }

    /// Digits of leaf `j`, most significant first.
    fn digits(&self, j: u64) -> Vec<u64> {
        let mut d = vec![0; self.depth as usize];
        let mut x = j;
        for slot in d.iter_mut().rev() {
            *slot = x % self.fanout;
            x /= self.fanout;
        }
        d
    }

    fn dir_of(&self, digits: &[u64]) -> String {
        let mut p = self.top.clone();
        for d in digits {
            p.push('/');
            p.push_str(&d.to_string());
        }
        p
    }

    /// Path of file `i` of this part.
    pub fn file_path(&self, i: u64) -> String {
        format!(
            "{}/f{}",
            self.dir_of(&self.digits(i / self.fanout)),
            i % self.fanout
        )
    }

    /// Creates this part (directories as they become needed, then the files); returns the
    /// number of directories made, `top` included.
    pub fn create(&self, t: &dyn FsTarget, seed: u64, file_bytes: usize) -> Result<u64> {
        t.mkdir(&self.top)?;
        let mut dirs = 1;
        let mut prev: Option<Vec<u64>> = None;
        for i in 0..self.files {
            if i % self.fanout == 0 {
                let digits = self.digits(i / self.fanout);
                let same = prev
                    .as_ref()
                    .map(|p| p.iter().zip(&digits).take_while(|(a, b)| a == b).count())
                    .unwrap_or(0);
                for level in same..digits.len() {
                    t.mkdir(&self.dir_of(&digits[..=level]))?;
                    dirs += 1;
                }
                prev = Some(digits);
            }
            let data = file_content(seed, self.first + i, file_bytes);
            t.write_new(&self.file_path(i), &data)?;
        }
        Ok(dirs)
    }
}

/// Indexes 0..n to check: all of them up to 2000, else an even sample of about 2000 plus the
/// last.
fn sample(n: u64) -> Vec<u64> {
    if n <= 2000 {
        return (0..n).collect();
    }
    let step = n / 2000;
    let mut v: Vec<u64> = (0..n).step_by(step as usize).collect();
    if v.last() != Some(&(n - 1)) {
        v.push(n - 1);
    }
    v
}

fn tree(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    threads: u32,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let s = &spec.sizes;
    let parts: Vec<TreeShape> = (0..threads.max(1))
        .map(|i| TreeShape::part(s.tree_files, threads, i, s.fanout))
        .collect();

    // F1: create the tree, then make it durable.
    let start = Instant::now();
    let dirs: u64 = {
        let shared: &dyn FsTarget = t;
        if parts.len() == 1 {
            parts[0].create(shared, spec.seed, s.file_bytes)?
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = parts
                    .iter()
                    .map(|p| sc.spawn(move || p.create(shared, spec.seed, s.file_bytes)))
                    .collect();
                let mut sum = 0;
                for h in handles {
                    sum += h
                        .join()
                        .map_err(|_| BenchError::Usage("an F1 thread panicked".into()))??;
                }
                Ok::<u64, BenchError>(sum)
            })?
        }
    };
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    // Check: every sampled file has its content (its size, on a target that keeps no data).
    let mut errors = 0;
    for p in &parts {
        for i in sample(p.files) {
            match t.read_file(&p.file_path(i)) {
                Ok(d) if !t.keeps_data() && d.len() == s.file_bytes => {}
                Ok(d) if d == file_content(spec.seed, p.first + i, s.file_bytes) => {}
                _ => errors += 1,
            }
        }
    }
    if wants(spec, FsWorkload::F1) {
        let mut r = record(spec, FsWorkload::F1, s.tree_files as f64 / secs, "files/s");
        r.threads = Some(threads);
        r.keys = Some(s.tree_files);
        r.errors = errors;
        out.records.push(r);
    }
    if threads != 1 {
        return Ok(());
    }
    let p = &parts[0];

    // F10: chmod + utime of every file (two operations each), then durable.
    if wants(spec, FsWorkload::F10) {
        let start = Instant::now();
        for i in 0..p.files {
            let path = p.file_path(i);
            t.chmod(&path, 0o600)?;
            t.set_times(&path, 1_000_000_000 + i as i64)?;
        }
        t.sync()?;
        let secs = start.elapsed().as_secs_f64();
        let mut errors = 0;
        for i in sample(p.files) {
            match t.lstat(&p.file_path(i)) {
                Ok(st) if st.mode & 0o7777 == 0o600 && st.mtime_s == 1_000_000_000 + i as i64 => {}
                _ => errors += 1,
            }
        }
        let mut r = record(spec, FsWorkload::F10, 2.0 * p.files as f64 / secs, "ops/s");
        r.metric = Some("chmod + utime".into());
        r.errors = errors;
        out.records.push(r);
    }

    // F2: cold recursive readdir + lstat of every entry.
    if wants(spec, FsWorkload::F2) {
        cold(spec, t, out)?;
        let start = Instant::now();
        let (entries, files) = walk(t, "")?;
        let secs = start.elapsed().as_secs_f64();
        let errors = u64::from(entries != p.files + dirs) + u64::from(files != p.files);
        let mut r = record(spec, FsWorkload::F2, entries as f64 / secs, "entries/s");
        r.metric = Some("cold".into());
        r.keys = Some(entries);
        r.errors = errors;
        out.records.push(r);
    }

    // F9b: rm -r of the tree, durable.
    if wants(spec, FsWorkload::F9b) {
        let start = Instant::now();
        remove_tree(t, &p.top)?;
        t.rmdir(&p.top)?;
        t.sync()?;
        let secs = start.elapsed().as_secs_f64();
        let left = root_entries(t)?.len() as u64;
        let mut r = record(spec, FsWorkload::F9b, secs, "seconds");
        r.metric = Some("rm -r + sync".into());
        r.keys = Some(p.files);
        r.errors = left;
        out.records.push(r);
    }
    Ok(())
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// `find -ls`: readdir of every directory and lstat of every entry. Returns (entries, files).
pub fn walk(t: &dyn FsTarget, dir: &str) -> Result<(u64, u64)> {
    let (mut entries, mut files) = (0, 0);
    for e in t.list(dir)? {
        if e.name == "lost+found" && dir.is_empty() {
            continue;
        }
        let path = join(dir, &e.name);
        let st = t.lstat(&path)?;
        entries += 1;
        if st.is_dir {
            let (a, b) = walk(t, &path)?;
            entries += a;
            files += b;
        } else {
            files += 1;
        }
    }
    Ok((entries, files))
}

/// `rm -r` of the contents of `dir`: readdir, unlink files, recurse into and rmdir
/// directories.
pub fn remove_tree(t: &dyn FsTarget, dir: &str) -> Result<()> {
    for e in t.list(dir)? {
        let path = join(dir, &e.name);
        if e.is_dir {
            remove_tree(t, &path)?;
            t.rmdir(&path)?;
        } else {
            t.unlink(&path)?;
        }
    }
    Ok(())
}

/// Entries of the root other than ext4's lost+found.
fn root_entries(t: &dyn FsTarget) -> Result<Vec<String>> {
    Ok(t.list("")?
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != "lost+found")
        .collect())
}

// ---------------------------------------------------------------------------------------------
// F4

fn onedir(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let n = spec.sizes.onedir_files;
    let start = Instant::now();
    t.mkdir("d")?;
    for i in 0..n {
        t.write_new(&format!("d/f{i}"), &[])?;
    }
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let mut r = record(spec, FsWorkload::F4, n as f64 / secs, "files/s");
    r.metric = Some("create".into());
    r.keys = Some(n);
    out.records.push(r);

    cold(spec, t, out)?;
    let start = Instant::now();
    let listed = t.list("d")?;
    let secs = start.elapsed().as_secs_f64();
    let mut r = record(spec, FsWorkload::F4, n as f64 / secs, "files/s");
    r.metric = Some("list cold".into());
    r.keys = Some(n);
    r.errors =
        (listed.len() as u64).abs_diff(n) + listed.iter().filter(|e| e.is_dir).count() as u64;
    out.records.push(r);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// F5, F6, F9c: big files

/// Writes `bytes` of pseudo-random data sequentially in 1 MiB writes, then fsyncs.
fn write_big(t: &dyn FsTarget, path: &str, bytes: u64, seed: u64) -> Result<()> {
    let f = t.open(path, true)?;
    let mut rng = Rng::new(seed ^ 0xB16_F11E);
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    let res = (|| {
        while off < bytes {
            let len = (bytes - off).min(buf.len() as u64) as usize;
            for c in buf[..len].chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            t.pwrite(f, off, &buf[..len])?;
            off += len as u64;
        }
        t.fsync(f)
    })();
    let closed = t.close(f);
    res?;
    closed
}

/// `count` distinct write offsets `slot × len` in a file of `file_bytes`, in random order.
pub fn random_offsets(seed: u64, file_bytes: u64, len: usize, count: u64) -> Vec<u64> {
    let slots = (file_bytes / len.max(1) as u64).max(1);
    let count = count.min(slots);
    let mut rng = Rng::new(seed ^ 0x000F_F5E7);
    let mut seen = std::collections::HashSet::with_capacity(count as usize);
    let mut v = Vec::with_capacity(count as usize);
    while (v.len() as u64) < count {
        let s = rng.below(slots);
        if seen.insert(s) {
            v.push(s * len as u64);
        }
    }
    v
}

fn micro(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    w: FsWorkload,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let s = &spec.sizes;
    let (file_bytes, writes, len) = match w {
        FsWorkload::F5 => (s.f5_file_bytes, s.f5_writes, s.f5_write_len),
        _ => (s.f6_file_bytes, s.f6_writes, s.f6_write_len),
    };
    write_big(t, "big", file_bytes, spec.seed)?;
    t.sync()?;
    cold(spec, t, out)?;
    let offsets = random_offsets(spec.seed, file_bytes, len, writes);
    let payloads: Vec<Vec<u8>> = (0..offsets.len() as u64)
        .map(|i| file_content(spec.seed ^ 0x5EED, i, len))
        .collect();
    let f = t.open("big", false)?;
    let start = Instant::now();
    for (off, data) in offsets.iter().zip(&payloads) {
        t.pwrite(f, *off, data)?;
    }
    t.fsync(f)?;
    let secs = start.elapsed().as_secs_f64();
    let mut errors = 0;
    let n = offsets.len() as u64;
    for i in sample(n).into_iter().take(500) {
        let i = i as usize;
        match t.pread(f, offsets[i], len) {
            Ok(d) if !t.keeps_data() && d.len() == len => {}
            Ok(d) if d == payloads[i] => {}
            _ => errors += 1,
        }
    }
    match t.lstat("big") {
        Ok(st) if st.size == file_bytes => {}
        _ => errors += 1,
    }
    t.close(f)?;
    let mut r = if w == FsWorkload::F5 {
        record(spec, w, (n * len as u64) as f64 / 1e6 / secs, "MB/s")
    } else {
        record(spec, w, secs, "seconds")
    };
    r.metric = Some(format!("{n} × {len} B + fsync, cold"));
    r.keys = Some(n);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

fn unlink(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let bytes = spec.sizes.unlink_bytes;
    write_big(t, "big", bytes, spec.seed)?;
    t.sync()?;
    let start = Instant::now();
    t.unlink("big")?;
    let op = start.elapsed().as_secs_f64();
    t.sync()?;
    let total = start.elapsed().as_secs_f64();
    let errors = u64::from(t.lstat("big").is_ok()) + root_entries(t)?.len() as u64;
    let mib = bytes >> 20;
    for (metric, v) in [
        (format!("{mib} MiB, unlink + sync"), total),
        (format!("{mib} MiB, unlink alone"), op),
    ] {
        let mut r = record(spec, FsWorkload::F9c, v, "seconds");
        r.metric = Some(metric);
        r.errors = errors;
        out.records.push(r);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// F9a

fn rename(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let n = spec.sizes.rename_files;
    t.mkdir("a")?;
    t.mkdir("b")?;
    t.mkdir("a/big")?;
    for i in 0..n {
        t.write_new(&format!("a/big/f{i}"), &[])?;
    }
    t.sync()?;
    let start = Instant::now();
    t.rename("a/big", "b/big")?;
    let op = start.elapsed().as_secs_f64();
    t.sync()?;
    let total = start.elapsed().as_secs_f64();
    let listed = t.list("b/big")?;
    let mut errors = (listed.len() as u64).abs_diff(n) + u64::from(t.lstat("a/big").is_ok());
    if t.lstat(&format!("b/big/f{}", n.saturating_sub(1))).is_err() && n > 0 {
        errors += 1;
    }
    for (metric, v) in [
        (format!("{n} files, rename + sync"), total),
        (format!("{n} files, rename alone"), op),
    ] {
        let mut r = record(spec, FsWorkload::F9a, v, "seconds");
        r.metric = Some(metric);
        r.keys = Some(n);
        r.errors = errors;
        out.records.push(r);
    }
    Ok(())
}
