//! F1 and F11 through fs_mark (Debian package `fsmark`): a second, independent implementation
//! of TokuBench beside the harness's own F1, and the fs_mark half of F11 (`-S 1`: fsync of
//! every file before its close).
//!
//! docs/workloads.md gives the command
//! `fs_mark -d $M/t0 .. -d $M/t3 -D 128 -N 128 -n 16384 -s 200 -S 0 -L 1 -k`, run in a loop
//! over top directories. fs_mark's `-n` counts files per `-d` directory (one thread each) and
//! per iteration; with `-D 128 -N 128` it fills 128 subdirectories with 128 files each and
//! then wraps around to the first subdirectory, so more than 16,384 files in one directory per
//! invocation would break the "≤ 128 entries per directory" rule. Hence the mapping
//! ([`FsMarkPlan`]): T threads = T `-d` directories per invocation (never more than 64, the
//! limit docs/workloads.md sets), `-L 1`, and as many invocations with fresh top directories
//! (`t0..t{T-1}`, then `tT..`, ...) as it takes for each thread to create its share of the
//! files with at most fanout² files per invocation; the shares differ by at most one file
//! between invocations so the total is exact.
//!
//! Timed: the whole loop of invocations plus the harness's sync, because fs_mark's own
//! files/s is per thread and wrong with several threads, and `-S 0` leaves everything in the
//! page cache. Checked after the clock stops: the tree holds exactly the files the plan asked
//! for, each of `-s` bytes (a wrong count or size is a wrong answer).
//!
//! This module never runs on a library-only target (fs_mark needs a mount); it says so in a
//! note instead.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::target::FsTarget;
use super::workloads::{join, mount_of, record, run_prog, FsTaskOutput, FsTaskSpec};
use super::FsWorkload;
use crate::{BenchError, Result};

/// Most `-d` directories one fs_mark invocation may get (docs/workloads.md).
pub const MAX_DIRS: u32 = 64;

/// The fs_mark invocations of one F1/F11 run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsMarkPlan {
    /// `-d` directories (threads) per invocation.
    pub threads: u32,
    /// `-D` and `-N`: subdirectories per `-d` directory and files per subdirectory.
    pub fanout: u64,
    /// `-n` of each invocation (files per `-d` directory).
    pub per_dir: Vec<u64>,
}

impl FsMarkPlan {
    /// The plan for `files` files over `threads` threads, at most `fanout` entries per
    /// directory. Files that do not divide by the thread count are left out (the plan's
    /// [`FsMarkPlan::files`] is what runs and what the figure counts).
    pub fn new(files: u64, threads: u32, fanout: u64) -> Result<FsMarkPlan> {
        if threads == 0 || threads > MAX_DIRS {
            return Err(BenchError::Usage(format!(
                "fs_mark takes 1 to {MAX_DIRS} -d directories (threads), not {threads}"
            )));
        }
        let fanout = fanout.max(2);
        let per_thread = files / u64::from(threads);
        if per_thread == 0 {
            return Err(BenchError::Usage(format!(
                "{files} files are fewer than one per fs_mark thread ({threads} threads)"
            )));
        }
        // One invocation fills each -d directory's fanout subdirectories at most once.
        let cap = fanout * fanout;
        let runs = per_thread.div_ceil(cap);
        let per_dir = (0..runs)
            .map(|i| per_thread * (i + 1) / runs - per_thread * i / runs)
            .collect();
        Ok(FsMarkPlan {
            threads,
            fanout,
            per_dir,
        })
    }

    /// Files the whole plan creates.
    pub fn files(&self) -> u64 {
        self.per_dir.iter().sum::<u64>() * u64::from(self.threads)
    }

    /// Top directories (relative to the mount) of invocation `i`.
    pub fn dirs(&self, i: usize) -> Vec<String> {
        let t = self.threads as usize;
        (i * t..(i + 1) * t).map(|k| format!("t{k}")).collect()
    }

    /// The argument list of invocation `i`, to run with the mount as the current directory:
    /// fs_mark 3.3 keeps each file's path in a fixed buffer of about 80 bytes and aborts
    /// ("buffer overflow detected") on longer ones, and its names alone take 40 bytes, so the
    /// `-d` directories are given relative to the mount. Its log goes to `log`, not onto the
    /// file system under test.
    pub fn args(&self, i: usize, file_bytes: usize, fsync: bool, log: &Path) -> Vec<String> {
        let mut a = Vec::new();
        for d in self.dirs(i) {
            a.push("-d".into());
            a.push(d);
        }
        let n = self.per_dir[i];
        for (k, v) in [
            ("-D", self.fanout.to_string()),
            ("-N", self.fanout.to_string()),
            ("-n", n.to_string()),
            ("-s", file_bytes.to_string()),
            ("-S", if fsync { "1" } else { "0" }.to_string()),
            ("-L", "1".to_string()),
        ] {
            a.push(k.into());
            a.push(v);
        }
        a.push("-k".into());
        a.push("-l".into());
        a.push(log.display().to_string());
        a
    }
}

/// Whether fs_mark can be run here.
pub fn fs_mark_available() -> bool {
    // fs_mark without arguments prints its usage and exits non-zero; only a missing binary
    // fails to spawn.
    Command::new("fs_mark").output().is_ok()
}

/// What a tree made by fs_mark holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeCount {
    /// Regular files.
    pub files: u64,
    /// Files whose size is not the expected one.
    pub wrong_size: u64,
    /// Most entries seen in one directory.
    pub widest: u64,
}

/// Counts the files below `dir` (readdir + lstat), their sizes against `file_bytes`.
pub fn count_tree(t: &dyn FsTarget, dir: &str, file_bytes: u64) -> Result<TreeCount> {
    let mut c = TreeCount::default();
    let entries = t.list(dir)?;
    c.widest = entries.len() as u64;
    for e in entries {
        let path = join(dir, &e.name);
        if e.is_dir {
            let sub = count_tree(t, &path, file_bytes)?;
            c.files += sub.files;
            c.wrong_size += sub.wrong_size;
            c.widest = c.widest.max(sub.widest);
        } else {
            c.files += 1;
            if t.lstat(&path)?.size != file_bytes {
                c.wrong_size += 1;
            }
        }
    }
    Ok(c)
}

/// F1 (`fsync` false) or F11 (`fsync` true) through fs_mark with `threads` `-d` directories
/// per invocation.
pub fn run(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    threads: u32,
    fsync: bool,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let (w, what) = if fsync {
        (FsWorkload::F11, "F11 through fs_mark -S 1")
    } else {
        (FsWorkload::F1, "F1 through fs_mark")
    };
    let Some(mp) = mount_of(spec, t, what, out) else {
        return Ok(());
    };
    if !fs_mark_available() {
        return Err(BenchError::Usage(
            "cannot run fs_mark (apt-get install fsmark)".into(),
        ));
    }
    let s = &spec.sizes;
    let files = if fsync {
        s.fsmark_sync_files
    } else {
        s.tree_files
    };
    let plan = FsMarkPlan::new(files, threads, s.fanout)?;
    std::fs::create_dir_all(&spec.dir)?;
    let log = spec.dir.join("fs_mark.log");
    let start = Instant::now();
    for i in 0..plan.per_dir.len() {
        run_prog(
            Command::new("fs_mark")
                .args(plan.args(i, s.file_bytes, fsync, &log))
                .current_dir(&mp),
            "fs_mark",
        )?;
    }
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let mut found = TreeCount::default();
    for i in 0..plan.per_dir.len() {
        for d in plan.dirs(i) {
            let c = count_tree(t, &d, s.file_bytes as u64)?;
            found.files += c.files;
            found.wrong_size += c.wrong_size;
        }
    }
    let want = plan.files();
    let mut r = record(spec, w, want as f64 / secs, "files/s");
    r.metric = Some(if fsync {
        format!("fs_mark -S 1, {want} files × {} B", s.file_bytes)
    } else {
        "fs_mark".to_string()
    });
    r.threads = Some(threads);
    r.keys = Some(want);
    r.errors = found.files.abs_diff(want) + found.wrong_size;
    out.records.push(r);
    let _ = std::fs::remove_file(&log);
    Ok(())
}
