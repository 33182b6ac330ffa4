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
//! One file per workload family: `tree` (F1, F2, F3, F9b, F10), `onedir` (F4), `bigfile` (F5,
//! F6, F9c), `rename` (F9a), `seq` (F7), `space` (F8), `programs` (F11, F12 through external
//! programs; `super::fsmark` is F1/F11 through fs_mark). This module holds what they share: the
//! scenarios, the task spec and output, opening a target, and the dispatch.
//!
//! Durable results: every timed region that changes the file system ends with `sync`
//! (syncfs) or `fsync`, for every system. Every answer is checked after the timed region
//! (file contents, listing counts, the renamed tree, deletions); wrong answers are counted in
//! the records' `errors` and never hidden.

use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::etcd_mount::{etcd_unavailable, EtcdMount};
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

/// Everything a child process needs to run one file-system task.
pub type FsTaskSpec = crate::runner::Spec<FsScenario, FsWorkload, FsSizes>;

impl crate::runner::PlannedScenario for FsScenario {
    type Workload = FsWorkload;
    fn label(self) -> String {
        FsScenario::label(self)
    }
    fn workloads(self) -> &'static [FsWorkload] {
        FsScenario::workloads(self)
    }
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
        sys @ (FsSystem::FernfsFuse
        | FsSystem::FernfsFuseUring
        | FsSystem::NullFuse
        | FsSystem::NullFuseUring) => {
            if let Some(why) = fuse_unavailable(sys.name()) {
                return Err(BenchError::Usage(why));
            }
            let exe = std::env::current_exe()?;
            let mnt = spec.dir.join("mnt");
            let (transport, cache) = (sys.transport(), spec.sizes.fern_cache_bytes);
            let fernfs = matches!(sys, FsSystem::FernfsFuse | FsSystem::FernfsFuseUring);
            let (m, daemon, sync_tail) = if fernfs {
                let m =
                    FuseMount::fernfs(&exe, &spec.dir.join("fern.img"), &mnt, cache, transport)?;
                let daemon = format!(
                    "`fernfs mkfs` + `fernfs mount -f -o cache_size={cache},transport={}` \
                     (default mount options) by {}",
                    transport.name(),
                    exe.display()
                );
                let tail = " (FUSE_FSYNCDIR: the whole store durable), syscalls via std::fs/libc";
                (m, daemon, tail)
            } else {
                let m = FuseMount::null(&exe, &spec.dir.join("null.state"), &mnt, transport)?;
                let daemon = format!(
                    "`fernfs bench null-fuse --transport {}` (namespace and attributes in \
                     memory, no data, nothing durable; fern-fuse's mount options, TTLs, \
                     capabilities and open flags)",
                    transport.name()
                );
                (m, daemon, "; content checks skipped")
            };
            let about = format!(
                "{}: {daemon}, daemon on CPUs {}, {}; sync = fsync of the root directory\
                 {sync_tail}",
                sys.name(),
                m.daemon_cpus,
                daemon_memcg(&m)?
            );
            Box::new(PosixTarget::on_mount(
                sys.name(),
                Box::new(m),
                about,
                SyncBy::FsyncRoot,
                fernfs,
            ))
        }
        sys @ (FsSystem::FernfsEtcd | FsSystem::JuicefsEtcd) => {
            if let Some(why) = fuse_unavailable(sys.name()).or_else(|| etcd_unavailable(sys.name()))
            {
                return Err(BenchError::Usage(why));
            }
            let (m, about) = if sys == FsSystem::FernfsEtcd {
                EtcdMount::fernfs(&std::env::current_exe()?, &spec.dir)?
            } else {
                EtcdMount::juicefs(&spec.dir)?
            };
            Box::new(PosixTarget::on_mount(
                sys.name(),
                Box::new(m),
                about,
                SyncBy::FsyncRoot,
                true,
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

mod bigfile;
mod onedir;
mod programs;
mod rename;
mod seq;
mod space;
mod tree;

pub use bigfile::*;
use onedir::*;
pub(in crate::fs) use programs::*;
use rename::*;
use seq::*;
pub use space::*;
pub use tree::*;
