//! The workloads that are other programs (postmark, git, tar, fs_mark, fio) and the memory
//! cap, on a plain directory standing in for a mount.

use super::*;

/// A plain directory as a "mount" (remount does nothing), so the program-running workloads
/// can be tested without root or FUSE.
struct DirGuard(std::path::PathBuf);

/// A target on the plain directory `mp`.
fn dir_target(mp: &std::path::Path, keeps_data: bool) -> fern_bench::fs::posix::PosixTarget {
    fern_bench::fs::posix::PosixTarget::on_mount(
        "ext4",
        Box::new(DirGuard(mp.to_path_buf())),
        "a directory".into(),
        fern_bench::fs::posix::SyncBy::Syncfs,
        keeps_data,
    )
}

/// A task of `scenario` on a fresh plain directory under `root` (names tagged with `tag`):
/// the target, the spec (its scratch directory made) and the "mount".
fn dir_task(
    root: &std::path::Path,
    scenario: FsScenario,
    tag: &str,
    keeps_data: bool,
) -> (
    fern_bench::fs::posix::PosixTarget,
    FsTaskSpec,
    std::path::PathBuf,
) {
    let mp = root.join(format!("mnt-{}-{tag}", scenario.label()));
    std::fs::create_dir_all(&mp).unwrap();
    let spec = FsTaskSpec {
        system: "ext4".into(),
        scenario,
        workloads: scenario.workloads().to_vec(),
        sizes: tiny(),
        dir: root.join(format!("task-{}-{tag}", scenario.label())),
        seed: 5,
        drop_caches: false,
        rep: 0,
    };
    std::fs::create_dir_all(&spec.dir).unwrap();
    (dir_target(&mp, keeps_data), spec, mp)
}

impl fern_bench::fs::posix::MountGuard for DirGuard {
    fn mountpoint(&self) -> &std::path::Path {
        &self.0
    }
    fn remount(&mut self) -> fern_bench::Result<()> {
        Ok(())
    }
    fn teardown(&mut self) -> fern_bench::Result<()> {
        Ok(())
    }
    fn space_used(&self) -> fern_bench::Result<Option<u64>> {
        Ok(None)
    }
}

#[test]
fn postmark_and_applications_run_on_a_mount_and_are_checked() {
    let tools = fern_testkit::programs(&["git", "tar", "cp"]).and_then(|()| {
        // postmark has no --version; it reads commands from stdin and exits at its end.
        if fern_testkit::program_available("postmark", &[]) {
            Ok(())
        } else {
            Err("missing: postmark".to_string())
        }
    });
    if skipped(Need::Tools, tools) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |scenario: FsScenario, keeps_data: bool| {
        let (t, spec, _) = dir_task(dir.path(), scenario, &keeps_data.to_string(), keeps_data);
        workloads::run_task_on(&spec, Box::new(t)).unwrap()
    };
    let out = run(FsScenario::Postmark { threads: 2 }, true);
    assert_eq!(out.records.len(), 1, "{out:?}");
    let r = &out.records[0];
    assert_eq!(
        (r.workload.as_str(), r.threads, r.errors),
        ("F11", Some(2), 0)
    );
    assert!(r.value > 0.0 && r.unit == "tx/s", "{r:?}");
    let out = run(FsScenario::Apps, true);
    let metrics: Vec<(String, u64)> = out
        .records
        .iter()
        .map(|r| (r.metric.clone().unwrap(), r.errors))
        .collect();
    assert_eq!(
        metrics,
        [
            ("40 files: untar + sync".to_string(), 0),
            ("40 files: git status, cold".to_string(), 0),
            ("40 files: cp -r + sync".to_string(), 0)
        ]
    );
}

#[test]
fn fs_mark_plan_keeps_directories_small_and_the_total_exact() {
    use fern_bench::fs::fsmark::FsMarkPlan;
    // Quick F1: 20,000 files; one thread needs two invocations (16,384 per -d at most).
    let p = FsMarkPlan::new(20_000, 1, 128).unwrap();
    assert_eq!(p.per_dir, vec![10_000, 10_000]);
    assert_eq!(p.dirs(1), vec!["t1".to_string()]);
    let p = FsMarkPlan::new(20_000, 4, 128).unwrap();
    assert_eq!((p.per_dir.clone(), p.files()), (vec![5_000], 20_000));
    // Full F1: 1,000,000 files exactly, never more than 128 × 128 per -d directory.
    for threads in [1, 4] {
        let p = FsMarkPlan::new(1_000_000, threads, 128).unwrap();
        assert_eq!(p.files(), 1_000_000);
        assert!(p.per_dir.iter().all(|&n| n <= 128 * 128), "{p:?}");
    }
    assert_eq!(
        FsMarkPlan::new(1_000_000, 1, 128).unwrap().per_dir.len(),
        62
    );
    assert_eq!(
        FsMarkPlan::new(1_000_000, 4, 128).unwrap().per_dir,
        vec![15_625; 16]
    );
    // Invocation 2 of a 4-thread plan gets the next four top directories, with docs/workloads.md's
    // arguments.
    let p = FsMarkPlan::new(200_000, 4, 128).unwrap();
    let args = p.args(2, 200, false, std::path::Path::new("/l"));
    assert_eq!(
        args.join(" "),
        format!(
            "-d t8 -d t9 -d t10 -d t11 -D 128 -N 128 -n {} -s 200 -S 0 -L 1 -k -l /l",
            p.per_dir[2]
        )
    );
    // More than 64 -d directories, no thread, or fewer files than threads: refused.
    for (files, threads) in [(1000, 65), (1000, 0), (3, 4)] {
        assert!(FsMarkPlan::new(files, threads, 128).is_err());
    }
}

/// Walks a real directory: (files, files whose size is not `size`, most entries in one
/// directory, directories).
fn real_tree(dir: &std::path::Path, size: u64) -> (u64, u64, u64, u64) {
    let (mut files, mut bad, mut dirs) = (0, 0, 0);
    let entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let mut widest = entries.len() as u64;
    for e in entries {
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        if md.is_dir() {
            let (f, b, w, d) = real_tree(&e.path(), size);
            files += f;
            bad += b;
            widest = widest.max(w);
            dirs += d + 1;
        } else {
            files += 1;
            bad += u64::from(md.len() != size);
        }
    }
    (files, bad, widest, dirs)
}

fn fs_mark_installed() -> bool {
    let check = if fern_bench::fs::fsmark::fs_mark_available() {
        Ok(())
    } else {
        Err("fs_mark missing (apt-get install fsmark; CI installs it)")
    };
    !skipped(Need::Tools, check)
}

/// Runs one fs_mark task on a plain directory posing as a mount; returns the output and the
/// directory.
fn fs_mark_task(
    root: &std::path::Path,
    threads: u32,
    fsync: bool,
    size_lies: bool,
) -> (fern_bench::fs::workloads::FsTaskOutput, std::path::PathBuf) {
    let scenario = FsScenario::FsMark { threads, fsync };
    let (t, spec, mp) = dir_task(root, scenario, &size_lies.to_string(), true);
    let out = if size_lies {
        let mut f = Faulty::new(t);
        f.size_lies = Some(Default::default());
        workloads::run_task_on(&spec, Box::new(f)).unwrap()
    } else {
        workloads::run_task_on(&spec, Box::new(t)).unwrap()
    };
    (out, mp)
}

#[test]
fn fs_mark_makes_the_tree_it_is_asked_for_and_is_checked() {
    if !fs_mark_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // tiny(): F1 300 files, fanout 8 (so at most 64 files per -d directory per invocation);
    // F11's fs_mark half 120 files.
    for (threads, fsync, files, workload) in [
        (1, false, 300, "F1"),
        (3, false, 300, "F1"),
        (1, true, 120, "F11"),
        (2, true, 120, "F11"),
    ] {
        let (out, mp) = fs_mark_task(dir.path(), threads, fsync, false);
        assert_eq!(out.records.len(), 1, "{out:?}");
        let r = &out.records[0];
        assert_eq!(
            (
                r.workload.as_str(),
                r.threads,
                r.keys,
                r.errors,
                r.unit.as_str()
            ),
            (workload, Some(threads), Some(files), 0, "files/s"),
            "{r:?}"
        );
        assert!(r.value.is_finite() && r.value > 0.0, "{r:?}");
        // The state itself, read with std::fs: every file there, 200 bytes each, no directory
        // wider than the fanout, top directories t0.. (one per thread and invocation), and
        // fs_mark's log not left on the file system under test.
        let (found, bad, widest, _) = real_tree(&mp, 200);
        assert_eq!((found, bad), (files, 0), "{workload} {threads} threads");
        assert!(widest <= 8, "a directory holds {widest} entries");
        let per_thread = files / u64::from(threads);
        let runs = per_thread.div_ceil(64);
        let mut tops: Vec<String> = std::fs::read_dir(&mp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        tops.sort();
        let mut want: Vec<String> = (0..runs * u64::from(threads))
            .map(|k| format!("t{k}"))
            .collect();
        want.sort();
        assert_eq!(tops, want);
    }
}

#[test]
fn fs_mark_wrong_sizes_and_missing_files_are_counted() {
    if !fs_mark_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Every 7th lstat lies about a file's size: 300 files → 42 wrong answers.
    let (out, mp) = fs_mark_task(dir.path(), 1, false, true);
    assert_eq!(out.records[0].errors, 300 / 7, "{:?}", out.records);
    // The count itself: a file removed and another truncated behind the harness's back.
    let t = dir_target(&mp, true);
    let before = fern_bench::fs::fsmark::count_tree(&t, "t0", 200).unwrap();
    let leaf = std::fs::read_dir(mp.join("t0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_dir(p).unwrap().count() >= 2)
        .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&leaf)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    std::fs::remove_file(&files[0]).unwrap();
    std::fs::write(&files[1], b"short").unwrap();
    let after = fern_bench::fs::fsmark::count_tree(&t, "t0", 200).unwrap();
    assert_eq!(
        (after.files, after.wrong_size),
        (before.files - 1, before.wrong_size + 1)
    );
}

#[test]
fn device_limits_are_measured_by_fio_or_noted() {
    use fern_bench::fs::limits::{self, LIMITS_SYSTEM, LIMITS_WORKLOAD};
    let dir = tempfile::tempdir().unwrap();
    let cfg = FsBenchConfig {
        workloads: vec![FsWorkload::F9c],
        reps: 1,
        limits: true,
        ..lib_run(&dir)
    };
    // One limits task per repetition, first, on no file system.
    let plan = cfg.plan();
    assert_eq!(plan[0].scenario, FsScenario::Limits);
    assert_eq!(plan[0].system, LIMITS_SYSTEM);
    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    let lim: Vec<_> = out
        .medians
        .iter()
        .filter(|r| r.workload == LIMITS_WORKLOAD)
        .collect();
    if !limits::fio_available() {
        assert!(lim.is_empty());
        assert!(out.notes.iter().any(|n| n.contains("fio is not installed")));
        skipped(
            Need::Tools,
            Err("fio missing (apt-get install fio; CI installs it)"),
        );
        return;
    }
    let units: Vec<&str> = lim.iter().map(|r| r.unit.as_str()).collect();
    assert_eq!(units, ["MB/s", "MB/s", "fsyncs/s"], "{lim:?}");
    for r in &lim {
        assert!(r.value.is_finite() && r.value > 0.0, "{r:?}");
        assert_eq!(r.system, LIMITS_SYSTEM);
    }
    // The sequential rows moved exactly the F7 size in 1 MiB blocks (tiny(): 3 MiB).
    assert_eq!((lim[0].keys, lim[1].keys), (Some(3), Some(3)));
    // Their own table in the report, not a file-system column; fio's files are gone.
    let table = fern_bench::fs::report::limits_table(&out.medians);
    assert!(table.contains("fsyncs/s"), "{table}");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("run")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn fio_reports_are_read_and_failures_refused() {
    use fern_bench::fs::limits::parse_fio;
    let ok = r#"fio: some warning
{"jobs":[{"error":0,"write":{"bw_bytes":1000000,"iops":250.5,"total_ios":751},
  "read":{"bw_bytes":0,"iops":0.0,"total_ios":0}}]}"#;
    let j = parse_fio(ok, "write").unwrap();
    assert_eq!((j.bw_bytes, j.iops, j.ios), (1e6, 250.5, 751));
    assert!(parse_fio(&ok.replace("\"error\":0", "\"error\":5"), "write").is_err());
    assert!(parse_fio("no json here", "write").is_err());
    assert!(parse_fio(r#"{"jobs":[]}"#, "write").is_err());
    assert!(parse_fio(r#"{"jobs":[{"error":0}]}"#, "read").is_err());
}

#[test]
fn memory_cap_holds_its_processes_and_reads_back_their_peak() {
    use fern_bench::fs::runner::{memcg_of, MemCap};
    let memcg = fern_bench::memcap::MemCap::usable();
    if skipped(Need::Tools, memcg) {
        return;
    }
    let own = memcg_of("self").unwrap();
    let cap = MemCap::create(64 << 20).unwrap();
    // Nested under this process's own cgroup, so outer limits still apply.
    assert!(
        cap.path()
            .to_string_lossy()
            .contains(own.trim_start_matches('/')),
        "{} not under {own}",
        cap.path().display()
    );
    cap.reset().unwrap();
    // A process that joins and touches 24 MiB of memory: charged to the cap, under its limit.
    let procs = cap.path().join("cgroup.procs");
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec dd if=/dev/zero of=/dev/null bs=24M count=2 status=none",
            procs.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let u = cap.usage().unwrap();
    assert_eq!(u.limit, 64 << 20);
    assert!(u.peak >= 24 << 20 && u.peak <= u.limit, "{u:?}");
    assert_eq!(u.oom_kills, 0, "{u:?}");
    // Reset starts the next task's peak afresh.
    cap.reset().unwrap();
    assert!(cap.usage().unwrap().peak < 24 << 20);
}
