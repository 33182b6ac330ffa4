//! The memory cap of a benchmark run (docs/workloads.md: every system inside the same cgroup
//! memory limit as its budget): a cgroup v1 memory cgroup each task's child process joins
//! before anything else, read back after every task. Shared by the engine and the file-system
//! benchmarks.

use std::path::{Path, PathBuf};

use crate::runner::{Isolation, Progress, RunOutput};
use crate::{BenchError, Result};

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

    /// The run's cap, if `bytes` asks for one; tasks must then run in child processes.
    pub fn for_run(bytes: Option<u64>, isolation: &Isolation) -> Result<Option<MemCap>> {
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        if matches!(isolation, Isolation::InProcess) {
            return Err(BenchError::Usage(
                "a memory cap needs tasks in child processes".into(),
            ));
        }
        MemCap::create(bytes).map(Some)
    }

    /// Runs one task (`run`) under the run's cap, if there is one: its accounting starts afresh
    /// and what it used is noted for the report under `name`. Both benchmarks' task loops.
    pub(crate) fn around<R>(
        cap: Option<&MemCap>,
        name: &str,
        out: &mut RunOutput,
        progress: &mut dyn Progress,
        run: impl FnOnce() -> R,
    ) -> Result<R> {
        let Some(c) = cap else {
            return Ok(run());
        };
        let before = c.begin_task()?;
        let result = run();
        // The cap is only real if the peak stayed under the limit while the task (a FUSE
        // daemon included) ran; reclaim or the OOM killer show whether it did not fit.
        out.note(progress, c.task_note(name, before)?);
        Ok(result)
    }

    /// Whether this machine can hold a run in a cap: root and the cgroup v1 memory controller
    /// (the reason when not; tests skip on it).
    pub fn usable() -> std::result::Result<(), &'static str> {
        if !crate::procinfo::is_root() {
            Err("needs root")
        } else if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
            Err("needs the cgroup v1 memory controller")
        } else {
            Ok(())
        }
    }

    /// Starts a task: its accounting afresh; returns the OOM kills so far (for
    /// [`MemCap::task_note`]).
    pub fn begin_task(&self) -> Result<u64> {
        self.reset()?;
        Ok(self.usage()?.oom_kills)
    }

    /// What task `name` used of the cap since [`MemCap::begin_task`] returned `kills_before`,
    /// as a note for the report.
    pub fn task_note(&self, name: &str, kills_before: u64) -> Result<String> {
        let u = self.usage()?;
        Ok(format!(
            "{name}: memory cgroup peak {:.1} MiB of the {:.0} MiB cap, limit reached {} \
             times, {} processes OOM-killed",
            u.peak as f64 / (1 << 20) as f64,
            u.limit as f64 / (1 << 20) as f64,
            u.failcnt,
            u.oom_kills.saturating_sub(kills_before)
        ))
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self, file: &str) -> Result<String> {
        read(&self.path, file)
    }

    fn read_u64(&self, file: &str) -> Result<u64> {
        read_u64(&self.path, file)
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

/// A cgroup control file's text.
fn read(cgroup: &Path, file: &str) -> Result<String> {
    std::fs::read_to_string(cgroup.join(file))
        .map_err(|e| BenchError::Usage(format!("{}: {e}", cgroup.join(file).display())))
}

/// A cgroup control file holding one number.
fn read_u64(cgroup: &Path, file: &str) -> Result<u64> {
    let t = read(cgroup, file)?;
    t.trim()
        .parse()
        .map_err(|_| BenchError::Usage(format!("{file}: not a number: {t:?}")))
}

/// Moves this process into the cgroup named by [`CGROUP_ENV`], if set: everything it starts
/// afterwards is inside too. Returns the cgroup's memory limit (the task's budget) when it
/// joined one.
pub fn join_cgroup_from_env() -> Result<Option<u64>> {
    let Some(cg) = std::env::var_os(CGROUP_ENV) else {
        return Ok(None);
    };
    let procs = Path::new(&cg).join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(|e| BenchError::Usage(format!("cannot join cgroup {}: {e}", procs.display())))?;
    read_u64(Path::new(&cg), "memory.limit_in_bytes").map(Some)
}

/// What the binary does to keep a task process inside its memory budget: its allocator's
/// policy (fernfs's `memory::govern`), which this crate does not know. Set once, by the binary.
static MEMORY_GOVERNOR: std::sync::OnceLock<fn(u64)> = std::sync::OnceLock::new();

/// Registers the binary's memory governor, started in every task process with its budget.
pub fn set_memory_governor(govern: fn(u64)) {
    let _ = MEMORY_GOVERNOR.set(govern);
}

/// Starts the registered governor (if any) for a task process whose budget is `bytes`.
pub(crate) fn govern_memory(bytes: u64) {
    if let Some(govern) = MEMORY_GOVERNOR.get() {
        govern(bytes);
    }
}
