//! The run plan and its execution: repetitions × scenarios × systems with the systems
//! innermost (A B A B ...: a slow period of the shared machine hits every system alike), each
//! task in its own child process (peak RSS and page cache state are per engine), medians.
//!
//! A task that fails is reported and the run goes on: benchmarks report, they do not abort.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::data::ValueKind;
use crate::engine::System;
use crate::memcap::{join_cgroup_from_env, MemCap, CGROUP_ENV};
use crate::report::{self, Record};
use crate::workloads::{self, Scenario, Sizes, TaskOutput, TaskSpec, Workload};
use crate::{BenchError, Result};

/// Where tasks run.
#[derive(Clone, Debug)]
pub enum Isolation {
    /// In this process (tests; peak RSS is then the whole process's).
    InProcess,
    /// `program args... --spec JSON --out FILE` runs one task and writes its [`TaskOutput`]
    /// to FILE (the `fernfs` binary re-executes itself with a hidden subcommand).
    Subprocess {
        /// Executable.
        program: PathBuf,
        /// Arguments before `--spec`.
        args: Vec<OsString>,
    },
}

/// A whole benchmark run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Systems, in report order.
    pub systems: Vec<System>,
    /// Workloads to report.
    pub workloads: Vec<Workload>,
    /// Value kinds of the random-insert scenario.
    pub variants: Vec<ValueKind>,
    /// Sizes.
    pub sizes: Sizes,
    /// Repetitions.
    pub reps: u32,
    /// Scratch directory; each task gets a fresh subdirectory, removed afterwards.
    pub dir: PathBuf,
    /// Seed of all generated data (the same for every system and repetition).
    pub seed: u64,
    /// Drop the page cache before cold reads (only effective as root).
    pub drop_caches: bool,
    /// Where tasks run.
    pub isolation: Isolation,
    /// Memory cap of every task, bytes: a cgroup v1 memory limit holding the task's child
    /// process (docs/workloads.md: the same as the budget, so that engines reading through
    /// mmap or the page cache count those pages too). Needs subprocess isolation.
    pub mem_cap: Option<u64>,
}

/// Hooks for progress output (the harness itself prints nothing).
pub trait Progress {
    /// The run has `total` tasks.
    fn start(&mut self, _total: usize) {}
    /// Task `index` (0-based) starts.
    fn task(&mut self, _index: usize, _label: &str) {}
    /// A remark (a failed task, a page cache that could not be dropped).
    fn note(&mut self, _text: &str) {}
    /// The run is over.
    fn finish(&mut self) {}
}

/// Progress that prints nothing.
pub struct Silent;
impl Progress for Silent {}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    /// One record per figure and repetition.
    pub samples: Vec<Record>,
    /// Medians over repetitions, with `reps`.
    pub medians: Vec<Record>,
    /// Distinct notes of the tasks (engine options, warnings) and failures.
    pub notes: Vec<String>,
    /// Tasks that failed.
    pub failures: Vec<String>,
    /// Progress over time recorded during some workloads (file-system F1 and F5), every
    /// repetition.
    pub series: Vec<report::Series>,
}

impl RunOutput {
    /// Says `n` on the progress display and keeps it among the notes.
    pub(crate) fn note(&mut self, progress: &mut dyn Progress, n: String) {
        progress.note(&n);
        self.notes.push(n);
    }
}

impl BenchConfig {
    /// The scenarios the requested workloads need, in run order.
    pub fn scenarios(&self) -> Vec<Scenario> {
        let mut out = Vec::new();
        let wants = |s: Scenario| s.workloads().iter().any(|w| self.workloads.contains(w));
        for &values in &self.variants {
            let s = Scenario::Random { values };
            if wants(s) {
                out.push(s);
            }
        }
        for s in [Scenario::Sequential, Scenario::Upsert] {
            if wants(s) {
                out.push(s);
            }
        }
        for &threads in &self.sizes.commit_threads {
            let s = Scenario::Commits { threads };
            if wants(s) && !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }

    /// Every task of the run, in run order: rep, scenario, then system (interleaved).
    pub fn plan(&self) -> Vec<TaskSpec> {
        let planner = Planner {
            asked: &self.workloads,
            sizes: &self.sizes,
            seed: self.seed,
            drop_caches: self.drop_caches,
        };
        let mut tasks = Vec::new();
        for rep in 0..self.reps {
            for scenario in self.scenarios() {
                for sys in &self.systems {
                    let dir_name = format!(
                        "{}-{}-{}",
                        rep,
                        scenario.label().replace('/', "-"),
                        sys.name()
                    );
                    tasks.push(planner.task(rep, sys.name(), scenario, self.dir.join(dir_name)));
                }
            }
        }
        tasks
    }
}

/// Runs every task of `cfg`, then takes medians.
pub fn run(cfg: &BenchConfig, progress: &mut dyn Progress) -> Result<RunOutput> {
    std::fs::create_dir_all(&cfg.dir)?;
    let names: Vec<String> = cfg.systems.iter().map(|s| s.name().to_string()).collect();
    let out = RunOutput::default();
    let cap = MemCap::for_run(cfg.mem_cap, &cfg.isolation)?;
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
                        run_child(program, args, cap.as_ref(), task, &cfg.dir)
                    }
                })?;
            Ok(result.map(|t| Finished {
                records: t.records,
                notes: t.notes,
                series: Vec::new(),
            }))
        },
    )
}

/// "rep 1 E1/incompressible fern-tree": a task as progress and failures name it.
pub(crate) fn task_label(rep: u32, scenario: &str, system: &str) -> String {
    format!("rep {} {scenario} {system}", rep + 1)
}

/// A benchmark's scenario, as planning and the task loop see it (the engine's [`Scenario`] and
/// the file system's `FsScenario`).
pub trait PlannedScenario: Copy {
    /// The workload names of this benchmark.
    type Workload: Copy + PartialEq + 'static;
    /// Short label for progress and directory names.
    fn label(self) -> String;
    /// The workloads this scenario measures.
    fn workloads(self) -> &'static [Self::Workload];
}

/// Everything a child process needs to run one task of either benchmark: `Sc` its scenario, `W`
/// its workload names, `Z` its sizes (sent to the child as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec<Sc, W, Z> {
    /// System name.
    pub system: String,
    /// What to run.
    pub scenario: Sc,
    /// Which of the scenario's workloads to report (the others run only as set-up).
    pub workloads: Vec<W>,
    /// Sizes.
    pub sizes: Z,
    /// An empty directory for the database, image(s) and mountpoint (created if missing).
    pub dir: PathBuf,
    /// Seed of all generated data.
    pub seed: u64,
    /// Drop the OS page cache before cold phases (needs root).
    pub drop_caches: bool,
    /// Repetition number, for the records.
    pub rep: u32,
}

/// What every task of one run shares: the workloads asked for, the sizes, the seed.
pub(crate) struct Planner<'a, W, Z> {
    pub asked: &'a [W],
    pub sizes: &'a Z,
    pub seed: u64,
    pub drop_caches: bool,
}

impl<W: Copy + PartialEq + 'static, Z: Clone> Planner<'_, W, Z> {
    /// The task of `system` running `scenario` in repetition `rep`, in `dir`: it reports the
    /// asked-for workloads the scenario has.
    pub(crate) fn task<Sc: PlannedScenario<Workload = W>>(
        &self,
        rep: u32,
        system: &str,
        scenario: Sc,
        dir: PathBuf,
    ) -> Spec<Sc, W, Z> {
        Spec {
            system: system.to_string(),
            scenario,
            workloads: self
                .asked
                .iter()
                .copied()
                .filter(|w| scenario.workloads().contains(w))
                .collect(),
            sizes: self.sizes.clone(),
            dir,
            seed: self.seed,
            drop_caches: self.drop_caches,
            rep,
        }
    }
}

impl<Sc: PlannedScenario, W, Z> Task for Spec<Sc, W, Z> {
    fn label(&self) -> String {
        task_label(self.rep, &self.scenario.label(), &self.system)
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A task of either benchmark, as the task loop sees it.
pub(crate) trait Task {
    /// What progress calls it ("rep 1 E1/incompressible fern-tree").
    fn label(&self) -> String;
    /// Its scratch directory, emptied before it runs and removed after.
    fn dir(&self) -> &Path;
}

/// What a finished task hands back to the task loop.
pub(crate) struct Finished {
    pub records: Vec<Record>,
    pub notes: Vec<String>,
    pub series: Vec<report::Series>,
}

/// The task loop both benchmarks share: for each task it shows the label, empties the task's
/// directory, runs `one` (given the task, its label, and the run and progress for notes of
/// its own; its outer error ends the run, its inner one is the task's failure), removes the directory, and keeps what came back: each distinct note said once, the
/// records and series, or the error as a FAILED line and a failure. Then the medians over
/// `systems`.
pub(crate) fn run_tasks<T: Task>(
    tasks: &[T],
    systems: &[String],
    mut out: RunOutput,
    progress: &mut dyn Progress,
    mut one: impl FnMut(&T, &str, &mut RunOutput, &mut dyn Progress) -> Result<Result<Finished>>,
) -> Result<RunOutput> {
    progress.start(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        let name = task.label();
        progress.task(i, &name);
        let _ = std::fs::remove_dir_all(task.dir());
        let result = one(task, &name, &mut out, &mut *progress)?;
        let _ = std::fs::remove_dir_all(task.dir());
        match result {
            Ok(t) => {
                for n in t.notes {
                    if !out.notes.contains(&n) {
                        progress.note(&n);
                        out.notes.push(n);
                    }
                }
                out.samples.extend(t.records);
                out.series.extend(t.series);
            }
            Err(e) => {
                let msg = format!("{name}: {e}");
                progress.note(&format!("FAILED {msg}"));
                out.failures.push(msg);
            }
        }
    }
    progress.finish();
    out.medians = report::medians(&out.samples, systems);
    Ok(out)
}

fn run_child(
    program: &Path,
    args: &[OsString],
    cap: Option<&MemCap>,
    task: &TaskSpec,
    scratch: &Path,
) -> Result<TaskOutput> {
    let mut cmd = Command::new(program);
    if let Some(c) = cap {
        cmd.env(CGROUP_ENV, c.path());
    }
    cmd.args(args);
    run_task_process(cmd, task, &task.dir, task.label(), scratch)
}

/// Runs one task in a child process: `cmd` (the program and its subcommand, already set up)
/// gets `--spec JSON --out FILE`, its output and errors go to a log under `scratch` named after
/// `task_dir`, and its JSON output is read back. A failed child is an error quoting the log's
/// last lines. Shared by the engine and the file-system benchmarks.
pub(crate) fn run_task_process<T: serde::Serialize, O: serde::de::DeserializeOwned>(
    mut cmd: Command,
    task: &T,
    task_dir: &Path,
    task_label: String,
    scratch: &Path,
) -> Result<O> {
    let stem = task_dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out_file = scratch.join(format!("{stem}.out.json"));
    let log_file = scratch.join(format!("{stem}.log"));
    let log = std::fs::File::create(&log_file)?;
    let status = cmd
        .arg("--spec")
        .arg(serde_json::to_string(task)?)
        .arg("--out")
        .arg(&out_file)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()?;
    let fail = |message: String| BenchError::Task {
        task: task_label.clone(),
        message,
    };
    if !status.success() {
        let log = std::fs::read_to_string(&log_file).unwrap_or_default();
        let tail: String = log.lines().rev().take(10).collect::<Vec<_>>().join(" / ");
        return Err(fail(format!(
            "{status}; log {}: {tail}",
            log_file.display()
        )));
    }
    let text = std::fs::read_to_string(&out_file)
        .map_err(|e| fail(format!("no output {}: {e}", out_file.display())))?;
    let _ = std::fs::remove_file(&out_file);
    let _ = std::fs::remove_file(&log_file);
    Ok(serde_json::from_str(&text)?)
}

/// The child side of [`Isolation::Subprocess`]: runs the task described by `spec_json` and
/// writes its output to `out`.
pub fn child_main(spec_json: &str, out: &Path) -> Result<()> {
    join_cgroup_from_env()?;
    let spec: TaskSpec = serde_json::from_str(spec_json)?;
    crate::memcap::govern_memory(spec.sizes.budget_bytes);
    let output = workloads::run_task(&spec)?;
    std::fs::write(out, serde_json::to_string(&output)?)?;
    Ok(())
}
