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
use crate::report::{Record, Series};
use crate::{BenchError, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
    /// F7.
    Seq,
    /// F8.
    Space,
    /// F11 with this many concurrent postmark instances.
    Postmark {
        /// Instances.
        threads: u32,
    },
    /// F12.
    Apps,
    /// F1 (`fsync` false) or F11 (`fsync` true, `-S 1`) through fs_mark with this many `-d`
    /// directories (threads) per invocation.
    FsMark {
        /// `-d` directories per invocation.
        threads: u32,
        /// `-S 1` (fsync every file before closing it) instead of `-S 0`.
        fsync: bool,
    },
    /// The device's physical limits by fio (sequential bandwidth, fsync rate), on the disk
    /// holding the images; no file system under test.
    Limits,
}

impl FsScenario {
    /// The workloads this scenario can report.
    pub fn workloads(self) -> &'static [FsWorkload] {
        match self {
            FsScenario::Tree { threads: 1 } => &[
                FsWorkload::F1,
                FsWorkload::F10,
                FsWorkload::F2,
                FsWorkload::F3,
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
            FsScenario::Seq => &[FsWorkload::F7],
            FsScenario::Space => &[FsWorkload::F8],
            FsScenario::Postmark { .. } => &[FsWorkload::F11],
            FsScenario::Apps => &[FsWorkload::F12],
            FsScenario::FsMark { fsync: false, .. } => &[FsWorkload::F1],
            FsScenario::FsMark { fsync: true, .. } => &[FsWorkload::F11],
            FsScenario::Limits => &[],
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
            FsScenario::Seq => "seq".into(),
            FsScenario::Space => "space".into(),
            FsScenario::Postmark { threads } => format!("postmark-{threads}t"),
            FsScenario::Apps => "apps".into(),
            FsScenario::FsMark {
                threads,
                fsync: false,
            } => format!("fsmark-{threads}t"),
            FsScenario::FsMark {
                threads,
                fsync: true,
            } => format!("fsmark-sync-{threads}t"),
            FsScenario::Limits => "limits".into(),
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
    /// Progress over time (F1, F5).
    #[serde(default)]
    pub series: Vec<Series>,
}

/// Samples a shared progress counter every 10 ms on its own thread (a wake-up costs a few
/// microseconds, well under 0.1 % of the CPU, and it happens for every system alike).
struct Sampler {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(f64, f64)>>,
}

impl Sampler {
    fn start() -> Sampler {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let (d, s) = (done.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut pts = vec![(0.0, 0.0)];
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(10));
                pts.push((
                    start.elapsed().as_secs_f64(),
                    d.load(Ordering::Relaxed) as f64,
                ));
            }
            pts
        });
        Sampler { done, stop, handle }
    }

    /// Stops sampling; the last point is (`secs`, `total`): the end of the timed region.
    fn finish(self, secs: f64, total: f64, scale: f64) -> Vec<(f64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut pts = self.handle.join().unwrap_or_default();
        pts.retain(|p| p.0 < secs);
        pts.push((secs, total));
        for p in &mut pts {
            p.1 *= scale;
        }
        pts
    }
}

/// Size of a kernel file system's image: room for the largest file twice over and for the
/// most files at 32 KiB each (default mkfs.ext4 makes one inode per 16 KiB), at least 8 GiB.
/// The image is sparse: only what the file system writes takes space.
pub fn image_bytes(s: &FsSizes) -> u64 {
    let need = 2 * s.largest_file() + s.most_files() * (32 << 10);
    need.max(8 << 30).div_ceil(1 << 30) << 30
}

/// The FUSE daemon's memory cgroup, checked to be this task's when the run has a memory cap:
/// a daemon outside would leave the file system's memory uncapped.
fn daemon_memcg(m: &FuseMount) -> Result<String> {
    use super::runner::{memcg_of, CGROUP_ENV};
    let own = memcg_of("self");
    let daemon = m.daemon_pid().and_then(|p| memcg_of(&p.to_string()));
    if std::env::var_os(CGROUP_ENV).is_some() && (daemon.is_none() || daemon != own) {
        return Err(BenchError::Usage(format!(
            "the FUSE daemon is in memory cgroup {daemon:?}, the task in {own:?}: the memory \
             cap would not hold it"
        )));
    }
    Ok(format!(
        "daemon memory cgroup {}",
        daemon.unwrap_or_else(|| "?".into())
    ))
}

/// Opens a fresh file system of `system` in `spec.dir`.
pub fn open_target(spec: &FsTaskSpec) -> Result<Box<dyn FsTarget>> {
    std::fs::create_dir_all(&spec.dir)?;
    Ok(match FsSystem::parse(&spec.system)? {
        FsSystem::FernfsLib => Box::new(LibTarget::create(
            &spec.dir.join("fern.img"),
            spec.sizes.fern_cache_bytes,
        )?),
        sys @ (FsSystem::FernfsFuse | FsSystem::FernfsFuseUring) => {
            if let Some(why) = fuse_unavailable(sys.name()) {
                return Err(BenchError::Usage(why));
            }
            let exe = std::env::current_exe()?;
            let m = FuseMount::fernfs(
                &exe,
                &spec.dir.join("fern.img"),
                &spec.dir.join("mnt"),
                spec.sizes.fern_cache_bytes,
                sys.transport(),
            )?;
            let about = format!(
                "{}: `fernfs mkfs` + `fernfs mount -f -o cache_size={},transport={}` (default \
                 mount options) by {}, daemon on CPUs {}, {}; sync = fsync of the root directory \
                 (FUSE_FSYNCDIR: the whole store durable), syscalls via std::fs/libc",
                sys.name(),
                spec.sizes.fern_cache_bytes,
                sys.transport().name(),
                exe.display(),
                m.daemon_cpus,
                daemon_memcg(&m)?
            );
            Box::new(PosixTarget::on_mount(
                sys.name(),
                Box::new(m),
                about,
                SyncBy::FsyncRoot,
                true,
            ))
        }
        sys @ (FsSystem::NullFuse | FsSystem::NullFuseUring) => {
            if let Some(why) = fuse_unavailable(sys.name()) {
                return Err(BenchError::Usage(why));
            }
            let exe = std::env::current_exe()?;
            let m = FuseMount::null(
                &exe,
                &spec.dir.join("null.state"),
                &spec.dir.join("mnt"),
                sys.transport(),
            )?;
            let about = format!(
                "{}: `fernfs bench null-fuse --transport {}` (namespace and attributes in memory, no \
                 data, nothing durable; fern-fuse's mount options, TTLs, capabilities and open \
                 flags), daemon on CPUs {}, {}; sync = fsync of the root directory; content \
                 checks skipped",
                sys.name(),
                sys.transport().name(),
                m.daemon_cpus,
                daemon_memcg(&m)?
            );
            Box::new(PosixTarget::on_mount(
                sys.name(),
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
    if spec.scenario == FsScenario::Limits {
        return super::limits::run(spec);
    }
    let target = open_target(spec)?;
    let mut out = run_task_on(spec, target)?;
    if std::env::var_os(super::runner::CGROUP_ENV).is_some() {
        out.notes.push(format!(
            "memory cap: each task process in memory cgroup {}",
            super::runner::memcg_of("self").unwrap_or_else(|| "?".into())
        ));
    }
    Ok(out)
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
        FsScenario::Seq => seq(spec, &mut *target, &mut out),
        FsScenario::Space => space(spec, &mut *target, &mut out),
        FsScenario::Postmark { threads } => postmark(spec, &mut *target, threads, &mut out),
        FsScenario::Apps => apps(spec, &mut *target, &mut out),
        FsScenario::FsMark { threads, fsync } => {
            super::fsmark::run(spec, &mut *target, threads, fsync, &mut out)
        }
        FsScenario::Limits => Err(BenchError::Usage(
            "the device limits are measured without a file system under test".into(),
        )),
    };
    let fin = target.finish();
    res?;
    fin?;
    Ok(out)
}

fn wants(spec: &FsTaskSpec, w: FsWorkload) -> bool {
    spec.workloads.contains(&w)
}

pub(super) fn record(spec: &FsTaskSpec, w: FsWorkload, value: f64, unit: &str) -> Record {
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
        self.create_counted(t, seed, file_bytes, &AtomicU64::new(0))
    }

    /// As [`TreeShape::create`], adding one to `done` after every file (progress sampling).
    pub fn create_counted(
        &self,
        t: &dyn FsTarget,
        seed: u64,
        file_bytes: usize,
        done: &AtomicU64,
    ) -> Result<u64> {
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
            done.fetch_add(1, Ordering::Relaxed);
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
    let sampler = Sampler::start();
    let start = Instant::now();
    let dirs: u64 = {
        let shared: &dyn FsTarget = t;
        let done: &AtomicU64 = &sampler.done;
        if parts.len() == 1 {
            parts[0].create_counted(shared, spec.seed, s.file_bytes, done)?
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = parts
                    .iter()
                    .map(|p| {
                        sc.spawn(move || p.create_counted(shared, spec.seed, s.file_bytes, done))
                    })
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
    out.series.push(Series {
        workload: "F1".into(),
        system: spec.system.clone(),
        threads: Some(threads),
        rep: spec.rep,
        unit: "files/s".into(),
        points: sampler.finish(secs, s.tree_files as f64, 1.0),
    });
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

    // F3: cold scan reading every file (readdir of every directory, open + read + close of
    // every file), like grep -r. Checked: the count, the bytes, and an order-independent sum
    // of the files' hashes against the expected contents (computed before the timed region).
    if wants(spec, FsWorkload::F3) {
        let expected = (0..p.files).fold(0u64, |acc, i| {
            acc.wrapping_add(content_hash(&file_content(
                spec.seed,
                p.first + i,
                s.file_bytes,
            )))
        });
        cold(spec, t, out)?;
        let start = Instant::now();
        let mut scan = Scan::default();
        read_all(t, &p.top, &mut scan)?;
        let secs = start.elapsed().as_secs_f64();
        let mut errors =
            scan.files.abs_diff(p.files) + scan.bytes.abs_diff(p.files * s.file_bytes as u64);
        if t.keeps_data() && scan.hash != expected {
            errors += 1;
        }
        let mut r = record(spec, FsWorkload::F3, scan.files as f64 / secs, "files/s");
        r.metric = Some("cold, read every file".into());
        r.keys = Some(scan.files);
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

pub(super) fn join(dir: &str, name: &str) -> String {
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

/// What a reading scan saw.
#[derive(Debug, Default)]
struct Scan {
    files: u64,
    bytes: u64,
    hash: u64,
}

/// FNV-1a of a file's content (summed over files, the sum is independent of listing order).
fn content_hash(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `grep -r`: readdir every directory below `dir`, read every file.
fn read_all(t: &dyn FsTarget, dir: &str, scan: &mut Scan) -> Result<()> {
    for e in t.list(dir)? {
        let path = join(dir, &e.name);
        if e.is_dir {
            read_all(t, &path, scan)?;
        } else {
            let d = t.read_file(&path)?;
            scan.files += 1;
            scan.bytes += d.len() as u64;
            scan.hash = scan.hash.wrapping_add(content_hash(&d));
        }
    }
    Ok(())
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
    let sampler = Sampler::start();
    let start = Instant::now();
    for (off, data) in offsets.iter().zip(&payloads) {
        t.pwrite(f, *off, data)?;
        sampler.done.fetch_add(1, Ordering::Relaxed);
    }
    t.fsync(f)?;
    let secs = start.elapsed().as_secs_f64();
    let done = sampler.finish(secs, offsets.len() as f64, len as f64 / 1e6);
    if w == FsWorkload::F5 {
        out.series.push(Series {
            workload: "F5".into(),
            system: spec.system.clone(),
            threads: None,
            rep: spec.rep,
            unit: "MB/s".into(),
            points: done,
        });
    }
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

// ---------------------------------------------------------------------------------------------
// F7

/// Fills `buf` with chunk `k` of F7's file (pseudo-random: no file system can compress it).
fn seq_chunk(seed: u64, k: u64, buf: &mut [u8]) {
    let mut rng = Rng::new(seed ^ 0xF7F7 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for c in buf.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

/// F7: one file written sequentially in 1 MiB writes + fsync, then (cold) read sequentially
/// in 1 MiB reads. Only the pwrite/fsync and pread calls are timed: generating and checking
/// the data runs between them, outside the clock.
fn seq(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    let bytes = spec.sizes.f7_file_bytes;
    let chunks = bytes.div_ceil(CHUNK as u64);
    let mut buf = vec![0u8; CHUNK];
    let f = t.open("big", true)?;
    let mut timed = std::time::Duration::ZERO;
    let res = (|| {
        for k in 0..chunks {
            let len = (bytes - k * CHUNK as u64).min(CHUNK as u64) as usize;
            seq_chunk(spec.seed, k, &mut buf[..len]);
            let start = Instant::now();
            t.pwrite(f, k * CHUNK as u64, &buf[..len])?;
            timed += start.elapsed();
        }
        let start = Instant::now();
        t.fsync(f)?;
        timed += start.elapsed();
        Ok::<(), BenchError>(())
    })();
    let closed = t.close(f);
    res?;
    closed?;
    let mib = bytes >> 20;
    let mut r = record(
        spec,
        FsWorkload::F7,
        bytes as f64 / 1e6 / timed.as_secs_f64(),
        "MB/s",
    );
    r.metric = Some(format!("{mib} MiB, 1 MiB writes + fsync"));
    out.records.push(r);

    cold(spec, t, out)?;
    let f = t.open("big", false)?;
    let mut timed = std::time::Duration::ZERO;
    let mut errors = 0;
    let mut want = vec![0u8; CHUNK];
    let res = (|| {
        for k in 0..chunks {
            let len = (bytes - k * CHUNK as u64).min(CHUNK as u64) as usize;
            let start = Instant::now();
            let got = t.pread(f, k * CHUNK as u64, CHUNK)?;
            timed += start.elapsed();
            if got.len() != len {
                errors += 1;
            } else if t.keeps_data() {
                seq_chunk(spec.seed, k, &mut want[..len]);
                errors += u64::from(got[..] != want[..len]);
            }
        }
        Ok::<(), BenchError>(())
    })();
    let closed = t.close(f);
    res?;
    closed?;
    let mut r = record(
        spec,
        FsWorkload::F7,
        bytes as f64 / 1e6 / timed.as_secs_f64(),
        "MB/s",
    );
    r.metric = Some(format!("{mib} MiB, cold 1 MiB reads"));
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// F8

/// File `i` of F8's corpus: 1-32 KiB of English-like text (the engine benchmarks' text
/// values: skewed common words), in lines. A pure function of the seed.
pub fn corpus_file(seed: u64, i: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0xF8F8 ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = 1024 + rng.below(31 * 1024) as usize;
    let mut v = Vec::with_capacity(len + crate::data::VALUE_LEN);
    let mut k = rng.next_u64();
    while v.len() < len {
        let line = crate::data::value(crate::data::ValueKind::Text, seed, k);
        v.extend_from_slice(&line[..line.len() - 1]);
        v.push(b'\n');
        k = k.wrapping_add(1 + rng.below(1 << 20));
    }
    v.truncate(len);
    v
}

/// Path of corpus file `i` (128 files per directory).
fn corpus_path(i: u64) -> String {
    format!("c/d{}/f{}", i / 128, i % 128)
}

/// Files of a corpus of at least `bytes` bytes.
pub fn corpus_files(seed: u64, bytes: u64) -> (u64, u64) {
    let (mut n, mut total) = (0, 0);
    while total < bytes {
        total += corpus_file(seed, n).len() as u64;
        n += 1;
    }
    (n, total)
}

/// Bytes of `gzip -5` of the whole corpus (its files concatenated, like a tarball's data).
fn gzip5_bytes(seed: u64, files: u64) -> Result<u64> {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new("gzip")
        .args(["-5", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Usage(format!("cannot run gzip: {e}")))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| BenchError::Usage("gzip: no stdin".into()))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Usage("gzip: no stdout".into()))?;
    let feeder = std::thread::spawn(move || -> std::io::Result<()> {
        for i in 0..files {
            stdin.write_all(&corpus_file(seed, i))?;
        }
        Ok(())
    });
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match stdout.read(&mut buf)? {
            0 => break,
            k => n += k as u64,
        }
    }
    let fed = feeder
        .join()
        .map_err(|_| BenchError::Usage("gzip feeder panicked".into()))?;
    let status = child.wait()?;
    fed?;
    if !status.success() {
        return Err(BenchError::Usage(format!("gzip -5 failed: {status}")));
    }
    Ok(n)
}

/// F8: the corpus written as files (128 per directory) + sync, then unmounted and mounted
/// again (everything the file system defers is then on the device); the growth of the
/// device's used bytes from the fresh file system is the figure, beside gzip -5 of the same
/// bytes.
fn space(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let Some(before) = t.space_used()? else {
        out.notes.push(format!(
            "F8 not measured on {}: it stores nothing, so it uses no space",
            spec.system
        ));
        return Ok(());
    };
    let (files, logical) = corpus_files(spec.seed, spec.sizes.f8_corpus_bytes);
    t.mkdir("c")?;
    for i in 0..files {
        if i % 128 == 0 {
            t.mkdir(&format!("c/d{}", i / 128))?;
        }
        t.write_new(&corpus_path(i), &corpus_file(spec.seed, i))?;
    }
    t.sync()?;
    cold(spec, t, out)?;
    let after = t.space_used()?.unwrap_or(before);
    let used = after.saturating_sub(before);
    let mut errors = 0;
    for i in sample(files).into_iter().take(200) {
        match t.read_file(&corpus_path(i)) {
            Ok(d) if t.keeps_data() && d == corpus_file(spec.seed, i) => {}
            Ok(d) if !t.keeps_data() && d.len() == corpus_file(spec.seed, i).len() => {}
            _ => errors += 1,
        }
    }
    let gz = gzip5_bytes(spec.seed, files)?;
    let label = format!(
        "{} MiB text in {files} files (gzip -5: {:.1} MiB)",
        logical >> 20,
        gz as f64 / (1 << 20) as f64
    );
    let mut r = record(spec, FsWorkload::F8, used as f64, "bytes");
    r.metric = Some(label.clone());
    r.keys = Some(files);
    r.errors = errors;
    out.records.push(r);
    let mut r = record(
        spec,
        FsWorkload::F8,
        used as f64 / gz.max(1) as f64,
        "x gzip -5",
    );
    r.metric = Some(label);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// F11, F12: programs run on the mount

/// The mount of a target that has one; for a library-only target, a note ("`what` not
/// measured on ...") and `None`.
pub(super) fn mount_of(
    spec: &FsTaskSpec,
    t: &dyn FsTarget,
    what: &str,
    out: &mut FsTaskOutput,
) -> Option<PathBuf> {
    let m = t.mount_path();
    if m.is_none() {
        out.notes.push(format!(
            "{what} not measured on {}: it runs programs, which need a mount",
            spec.system
        ));
    }
    m
}

/// Runs a program to completion, failing with its output's tail.
pub(super) fn run_prog(cmd: &mut std::process::Command, what: &str) -> Result<String> {
    let o = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| BenchError::Usage(format!("cannot run {what}: {e} (is it installed?)")))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(BenchError::Usage(format!(
            "{what} failed ({}): {}",
            o.status,
            tail.join(" / ")
        )));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// F11: `threads` postmark instances at once, each in its own directory of the mount with
/// WORKLOADS.md's configuration and its share of the files and transactions. Timed: from
/// starting them to the last one's exit, plus the sync (postmark itself never fsyncs, so the
/// sync is what makes the run durable). Checked: every instance ran to its end and left its
/// directory empty, as postmark does.
fn postmark(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    threads: u32,
    out: &mut FsTaskOutput,
) -> Result<()> {
    use std::io::Write;
    let Some(mp) = mount_of(spec, t, "F11", out) else {
        return Ok(());
    };
    let s = &spec.sizes;
    let n = u64::from(threads.max(1));
    let (files, tx) = (
        (s.postmark_files / n).max(1),
        (s.postmark_transactions / n).max(1),
    );
    for k in 0..n {
        t.mkdir(&format!("pm{k}"))?;
    }
    t.sync()?;
    let start = Instant::now();
    let mut children = Vec::new();
    for k in 0..n {
        let config = format!(
            "set location {}\nset number {files}\nset transactions {tx}\nset size 500 10000\n\
             set subdirectories 100\nset read 4096\nset write 4096\nset buffering false\n\
             set bias read 5\nset bias create 5\nset seed {}\nrun\nquit\n",
            mp.join(format!("pm{k}")).display(),
            spec.seed + k
        );
        let mut c = std::process::Command::new("postmark")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| {
                BenchError::Usage(format!(
                    "cannot run postmark: {e} (apt-get install postmark)"
                ))
            })?;
        if let Some(mut i) = c.stdin.take() {
            i.write_all(config.as_bytes())?;
        }
        children.push(c);
    }
    let mut errors = 0;
    let mut failed = None;
    for c in children {
        let o = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&o.stdout);
        if !o.status.success() || !text.contains("Deleting subdirectories...Done") {
            errors += 1;
            failed.get_or_insert_with(|| {
                format!(
                    "postmark ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )
            });
        }
    }
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    if let Some(f) = failed {
        out.notes.push(format!("F11 on {}: {f}", spec.system));
    }
    for k in 0..n {
        errors += t.list(&format!("pm{k}"))?.len() as u64;
    }
    let mut r = record(spec, FsWorkload::F11, (tx * n) as f64 / secs, "tx/s");
    r.metric = Some(format!(
        "postmark {} files, {} tx, whole run + sync",
        files * n,
        tx * n
    ));
    r.threads = Some(threads);
    r.keys = Some(tx * n);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

/// Makes F12's source tree in `src` on the host (not the system under test): `files` text
/// files of 0.5-12 KiB in directories of 64, committed into a git repository, then packed
/// into the tarball `tar` and removed. Untimed.
fn make_source_tarball(
    seed: u64,
    files: u64,
    src: &std::path::Path,
    tar: &std::path::Path,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(src);
    for i in 0..files {
        let d = src
            .join(format!("m{}", i / 64 / 64))
            .join(format!("d{}", i / 64));
        if i % 64 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        let mut body = corpus_file(seed, i);
        body.truncate(512 + (i.wrapping_mul(7919) % (12 << 10)) as usize);
        std::fs::write(d.join(format!("f{}.c", i % 64)), body)?;
    }
    let git = |args: &[&str]| {
        run_prog(
            std::process::Command::new("git")
                .arg("-C")
                .arg(src)
                .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
                .args(args),
            &format!("git {}", args.join(" ")),
        )
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "generated tree"])?;
    run_prog(
        std::process::Command::new("tar")
            .arg("cf")
            .arg(tar)
            .arg("-C")
            .arg(src)
            .arg("."),
        "tar cf",
    )?;
    std::fs::remove_dir_all(src)?;
    Ok(())
}

/// F12: a generated source tree (git repository included) untarred onto the mount + sync;
/// then, cold, `git status` in it (a fresh checkout's index does not match the new inodes,
/// so git re-reads every file); then `cp -r` of the tree on the mount + sync.
fn apps(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let Some(mp) = mount_of(spec, t, "F12", out) else {
        return Ok(());
    };
    let n = spec.sizes.apps_files;
    let tarball = spec.dir.join("f12.tar");
    make_source_tarball(spec.seed, n, &spec.dir.join("f12-src"), &tarball)?;
    let label = |what: &str| format!("{n} files: {what}");
    let push = |what: &str, secs: f64, errors: u64, out: &mut FsTaskOutput| {
        let mut r = record(spec, FsWorkload::F12, secs, "seconds");
        r.metric = Some(label(what));
        r.keys = Some(n);
        r.errors = errors;
        out.records.push(r);
    };

    t.mkdir("src")?;
    let start = Instant::now();
    run_prog(
        std::process::Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .arg("-C")
            .arg(mp.join("src")),
        "tar xf",
    )?;
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&tarball);
    let (entries, files) = walk(t, "src")?;
    // Every generated file plus git's own files: fewer than the generated ones is wrong.
    push("untar + sync", secs, n.saturating_sub(files), out);

    if t.keeps_data() {
        cold(spec, t, out)?;
        let start = Instant::now();
        let status = run_prog(
            std::process::Command::new("git")
                .arg("-C")
                .arg(mp.join("src"))
                .args(["status", "--porcelain"]),
            "git status",
        )?;
        let secs = start.elapsed().as_secs_f64();
        // Every file reads back as committed, so the tree is clean: any line is wrong.
        push("git status, cold", secs, status.lines().count() as u64, out);
    } else {
        out.notes.push(format!(
            "F12 git status not measured on {}: git cannot read a repository that reads back \
             as zeros",
            spec.system
        ));
    }

    let start = Instant::now();
    run_prog(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(mp.join("src"))
            .arg(mp.join("copy")),
        "cp -r",
    )?;
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let (copied, _) = walk(t, "copy")?;
    push("cp -r + sync", secs, copied.abs_diff(entries), out);
    Ok(())
}
