//! The run plan of `fernfs bench fs` and its execution: repetitions × scenarios × systems
//! with the systems innermost (A B A B ...), each task in a fresh child process pinned to
//! CPU 0 with `taskset -c 0` when available, leftovers (mounts, loop devices) cleaned after
//! every task, medians over repetitions. A failed task is reported; the run goes on.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::limits::LIMITS_SYSTEM;
use super::posix;
use super::target::FsSystem;
use super::workloads::{self, FsScenario, FsTaskOutput, FsTaskSpec};
use super::{FsSizes, FsWorkload};
use crate::runner::{run_tasks, Finished, Isolation, Planner, Progress, RunOutput, Task};
use crate::{BenchError, Result};

/// A whole `bench fs` run.
#[derive(Clone, Debug)]
pub struct FsBenchConfig {
    /// Systems, in report order.
    pub systems: Vec<FsSystem>,
    /// Workloads to report.
    pub workloads: Vec<FsWorkload>,
    /// Sizes.
    pub sizes: FsSizes,
    /// Repetitions.
    pub reps: u32,
    /// Scratch directory (images, mountpoints); each task gets a fresh subdirectory.
    pub dir: PathBuf,
    /// Seed of all generated data.
    pub seed: u64,
    /// Drop the page cache before cold phases (root only).
    pub drop_caches: bool,
    /// Where tasks run.
    pub isolation: Isolation,
    /// Pin each child process to CPU 0 with `taskset -c 0` (when taskset exists).
    pub pin: bool,
    /// Memory cap of every task, bytes: a cgroup v1 memory limit holding the task process and
    /// everything it starts (FUSE daemon, postmark, tar, ...). Needs subprocess isolation.
    pub mem_cap: Option<u64>,
    /// Measure the device's physical limits with fio at the start of every repetition.
    pub limits: bool,
}

/// Environment variable naming the cgroup a task child joins before anything else.
pub const CGROUP_ENV: &str = "FERNFS_BENCH_CGROUP";
/// Where the cgroup v1 memory controller is mounted.
const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";

/// A cgroup v1 memory cgroup made for one run, removed when dropped.
pub struct MemCap {
    path: PathBuf,
}

/// The memory cgroup of process `pid` ("self" for this one), relative to the v1 memory
/// controller's mount (e.g. "/fernfs-bench-123"), from /proc/PID/cgroup.
pub fn memcg_of(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ctrl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
}

/// What one task used of its cgroup, read back after it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemUse {
    /// memory.max_usage_in_bytes: the peak charged (anonymous memory and page cache of every
    /// process inside).
    pub peak: u64,
    /// memory.limit_in_bytes.
    pub limit: u64,
    /// memory.failcnt: how often a charge hit the limit (and reclaim had to run).
    pub failcnt: u64,
    /// `oom_kill` of memory.oom_control: processes the OOM killer ended inside.
    pub oom_kills: u64,
}

impl MemCap {
    /// Makes a cgroup `fernfs-bench-PID` limited to `bytes` (memory.limit_in_bytes; page cache
    /// is charged too, so a cold read really reads), as a child of this process's own memory
    /// cgroup: whatever limits and accounting already hold this process keep holding the
    /// tasks. Removes the cgroups of runs that died first.
    pub fn create(bytes: u64) -> Result<MemCap> {
        if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
            return Err(BenchError::Usage(format!(
                "--mem-cap needs the cgroup v1 memory controller at {MEMCG_ROOT}"
            )));
        }
        let own = memcg_of("self").unwrap_or_else(|| "/".into());
        let root = Path::new(MEMCG_ROOT).join(own.trim_start_matches('/'));
        let root = root.as_path();
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let dead = name
                    .strip_prefix("fernfs-bench-")
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if dead {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let path = root.join(format!("fernfs-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| {
            BenchError::Usage(format!(
                "cannot make {} (--mem-cap needs root): {e}",
                path.display()
            ))
        })?;
        let cap = MemCap { path };
        std::fs::write(cap.path.join("memory.limit_in_bytes"), bytes.to_string())?;
        Ok(cap)
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self, file: &str) -> Result<String> {
        std::fs::read_to_string(self.path.join(file))
            .map_err(|e| BenchError::Usage(format!("{}: {e}", self.path.join(file).display())))
    }

    fn read_u64(&self, file: &str) -> Result<u64> {
        let t = self.read(file)?;
        t.trim()
            .parse()
            .map_err(|_| BenchError::Usage(format!("{file}: not a number: {t:?}")))
    }

    /// Starts a task's accounting afresh: the peak and the fail count (the cgroup is shared by
    /// the run's tasks, one after the other).
    pub fn reset(&self) -> Result<()> {
        std::fs::write(self.path.join("memory.max_usage_in_bytes"), "0")?;
        std::fs::write(self.path.join("memory.failcnt"), "0")?;
        Ok(())
    }

    /// What the cgroup used since the last [`MemCap::reset`].
    pub fn usage(&self) -> Result<MemUse> {
        let oom_kills = self
            .read("memory.oom_control")?
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0);
        Ok(MemUse {
            peak: self.read_u64("memory.max_usage_in_bytes")?,
            limit: self.read_u64("memory.limit_in_bytes")?,
            failcnt: self.read_u64("memory.failcnt")?,
            oom_kills,
        })
    }
}

impl Drop for MemCap {
    fn drop(&mut self) {
        // Every task has exited by now; an empty cgroup can be removed.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Moves this process into the cgroup named by [`CGROUP_ENV`], if set: everything it starts
/// afterwards is inside too.
pub fn join_cgroup_from_env() -> Result<()> {
    let Some(cg) = std::env::var_os(CGROUP_ENV) else {
        return Ok(());
    };
    let procs = Path::new(&cg).join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(|e| BenchError::Usage(format!("cannot join cgroup {}: {e}", procs.display())))
}

/// Whether `taskset` can be used to pin tasks.
pub fn taskset_available() -> bool {
    Command::new("taskset")
        .args(["-c", "0", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl FsBenchConfig {
    /// The scenarios the requested workloads need, in run order.
    pub fn scenarios(&self) -> Vec<FsScenario> {
        let want = |ws: &[FsWorkload]| ws.iter().any(|w| self.workloads.contains(w));
        let mut out = Vec::new();
        let tree1 = FsScenario::Tree { threads: 1 };
        if want(tree1.workloads()) {
            out.push(tree1);
        }
        if self.workloads.contains(&FsWorkload::F1) {
            for &t in &self.sizes.tree_threads {
                if t > 1 {
                    out.push(FsScenario::Tree { threads: t });
                }
            }
            for &t in &self.sizes.tree_threads {
                out.push(FsScenario::FsMark {
                    threads: t.max(1),
                    fsync: false,
                });
            }
        }
        for s in [
            FsScenario::OneDir,
            FsScenario::Micro {
                workload: FsWorkload::F5,
            },
            FsScenario::Micro {
                workload: FsWorkload::F6,
            },
            FsScenario::Seq,
            FsScenario::Rename,
            FsScenario::Unlink,
            FsScenario::Space,
        ] {
            if want(s.workloads()) {
                out.push(s);
            }
        }
        if self.workloads.contains(&FsWorkload::F11) {
            for &t in &self.sizes.postmark_threads {
                out.push(FsScenario::Postmark { threads: t.max(1) });
            }
            for &t in &self.sizes.postmark_threads {
                out.push(FsScenario::FsMark {
                    threads: t.max(1),
                    fsync: true,
                });
            }
        }
        if self.workloads.contains(&FsWorkload::F12) {
            out.push(FsScenario::Apps);
        }
        out
    }

    /// Every task, in run order: repetition, scenario, then system (interleaved).
    pub fn plan(&self) -> Vec<FsTaskSpec> {
        let planner = Planner {
            asked: &self.workloads,
            sizes: &self.sizes,
            seed: self.seed,
            drop_caches: self.drop_caches,
        };
        let mut tasks = Vec::new();
        for rep in 0..self.reps {
            if self.limits {
                tasks.push(FsTaskSpec {
                    system: LIMITS_SYSTEM.to_string(),
                    scenario: FsScenario::Limits,
                    workloads: Vec::new(),
                    sizes: self.sizes.clone(),
                    dir: self.dir.join(format!("{rep}-limits-device")),
                    seed: self.seed,
                    drop_caches: self.drop_caches,
                    rep,
                });
            }
            for scenario in self.scenarios() {
                for sys in &self.systems {
                    let dir = self
                        .dir
                        .join(format!("{}-{}-{}", rep, scenario.label(), sys.name()));
                    tasks.push(planner.task(rep, sys.name(), scenario, dir));
                }
            }
        }
        tasks
    }
}

/// Runs every task of `cfg`, then takes medians.
pub fn run(cfg: &FsBenchConfig, progress: &mut dyn Progress) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    if let Some(parent) = cfg.dir.parent() {
        for what in posix::sweep_stale_runs(parent) {
            out.note(progress, format!("before the run: {what}"));
        }
    }
    std::fs::create_dir_all(&cfg.dir)?;
    let cap = match cfg.mem_cap {
        Some(bytes) => {
            if matches!(cfg.isolation, Isolation::InProcess) {
                return Err(BenchError::Usage(
                    "a memory cap needs tasks in child processes".into(),
                ));
            }
            Some(MemCap::create(bytes)?)
        }
        None => None,
    };
    let pin = cfg.pin && taskset_available();
    let names: Vec<String> = cfg.systems.iter().map(|s| s.name().to_string()).collect();
    run_tasks(
        &cfg.plan(),
        &names,
        out,
        progress,
        |task, name, out, progress| {
            let before = match &cap {
                Some(c) => {
                    c.reset()?;
                    Some(c.usage()?.oom_kills)
                }
                None => None,
            };
            let result = match &cfg.isolation {
                Isolation::InProcess => workloads::run_task(task),
                Isolation::Subprocess { program, args } => {
                    run_child(program, args, pin, cap.as_ref(), task, &cfg.dir)
                }
            };
            if let (Some(c), Some(kills_before)) = (&cap, before) {
                // Read back after every task: the cap is only real if the peak stayed under the
                // limit while the task (daemon included) ran, and reclaim or the OOM killer show
                // whether the data did not fit.
                let u = c.usage()?;
                let n = format!(
                    "{name}: memory cgroup peak {:.1} MiB of the {:.0} MiB cap, limit reached {} \
                 times, {} processes OOM-killed",
                    u.peak as f64 / (1 << 20) as f64,
                    u.limit as f64 / (1 << 20) as f64,
                    u.failcnt,
                    u.oom_kills.saturating_sub(kills_before)
                );
                out.note(progress, n);
            }
            for what in posix::cleanup_leftovers(&task.dir) {
                out.note(
                    progress,
                    format!("{name}: cleaned up after the task: {what}"),
                );
            }
            Ok(result.map(|t| Finished {
                records: t.records,
                notes: t.notes,
                series: t.series,
            }))
        },
    )
}

fn run_child(
    program: &Path,
    args: &[OsString],
    pin: bool,
    cap: Option<&MemCap>,
    task: &FsTaskSpec,
    scratch: &Path,
) -> Result<FsTaskOutput> {
    let mut cmd = if pin {
        let mut c = Command::new("taskset");
        c.arg("-c").arg("0").arg(program);
        c
    } else {
        Command::new(program)
    };
    if let Some(c) = cap {
        cmd.env(CGROUP_ENV, c.path());
    }
    cmd.args(args);
    crate::runner::run_task_process(cmd, task, &task.dir, task.label(), scratch)
}

/// The child side: runs the task described by `spec_json` and writes its output to `out`.
pub fn child_main(spec_json: &str, out: &Path) -> Result<()> {
    posix::ignore_interrupts();
    join_cgroup_from_env()?;
    let spec: FsTaskSpec = serde_json::from_str(spec_json)?;
    let output = workloads::run_task(&spec)?;
    std::fs::write(out, serde_json::to_string(&output)?)?;
    Ok(())
}
