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
pub use crate::memcap::{join_cgroup_from_env, memcg_of, MemCap, MemUse, CGROUP_ENV};
use crate::runner::{run_tasks, Finished, Isolation, Planner, Progress, RunOutput, Task};
use crate::Result;

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
    let cap = MemCap::for_run(cfg.mem_cap, &cfg.isolation)?;
    let pin = cfg.pin && taskset_available();
    let names: Vec<String> = cfg.systems.iter().map(|s| s.name().to_string()).collect();
    run_tasks(
        &cfg.plan(),
        &names,
        out,
        progress,
        |task, name, out, progress| {
            let result =
                MemCap::around(cap.as_ref(), name, out, progress, || match &cfg.isolation {
                    Isolation::InProcess => workloads::run_task(task),
                    Isolation::Subprocess { program, args } => {
                        run_child(program, args, pin, cap.as_ref(), task, &cfg.dir)
                    }
                })?;
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
    // Under a cap the task's budget is its cgroup's limit (the library target's engine runs in
    // here).
    if let Some(cap) = join_cgroup_from_env()? {
        crate::memcap::govern_memory(cap);
    }
    let spec: FsTaskSpec = serde_json::from_str(spec_json)?;
    let output = workloads::run_task(&spec)?;
    std::fs::write(out, serde_json::to_string(&output)?)?;
    Ok(())
}
