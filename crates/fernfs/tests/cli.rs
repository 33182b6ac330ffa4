//! `fernfs bench engine` end to end on a tiny size: child processes, table, JSON.
#![cfg(feature = "bench")]

mod common;
use common::{fernfs, interrupt};

#[test]
fn bench_engine_tiny_run_prints_a_table_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = fernfs()
        .args([
            "bench",
            "engine",
            "--keys",
            "2000",
            "--lookups",
            "500",
            "--budget-mib",
            "4",
        ])
        .args(["--reps", "1", "--no-drop-caches", "--variants", "text"])
        .args(["--commit-seconds", "0.1", "--commit-threads", "1,4"])
        .arg("--json")
        .arg(&json)
        .arg("--dir")
        .arg(dir.path().join("scratch"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("- machine: "), "{stdout}");
    assert!(stdout.contains("- command: `"), "{stdout}");
    assert!(stdout.contains("| workload | figure | unit |"), "{stdout}");
    assert!(!stdout.contains("Failed tasks"), "{stdout}");
    let records: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let records = records.as_array().unwrap();
    for w in ["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E9"] {
        assert!(records.iter().any(|r| r["workload"] == w), "no {w} record");
    }
    // E9: one record per thread count, carrying `threads`.
    for t in [1, 4] {
        assert!(
            records
                .iter()
                .any(|r| r["workload"] == "E9" && r["threads"] == t && r["unit"] == "commits/s"),
            "no E9 record for {t} threads: {records:?}"
        );
    }
    // Peak RSS comes from the child process of each task: positive and far below the
    // parent's whole-run figure would be for every engine at once.
    let rss: Vec<f64> = records
        .iter()
        .filter(|r| r["metric"] == "peak RSS")
        .map(|r| r["value"].as_f64().unwrap())
        .collect();
    assert!(!rss.is_empty() && rss.iter().all(|&m| m > 0.0), "{rss:?}");
    assert!(records.iter().all(|r| r["errors"] == 0), "{records:?}");
    // The scratch directory is cleaned up.
    assert!(!dir.path().join("scratch").exists());
}

#[test]
fn unknown_system_and_workload_are_usage_errors() {
    let out = fernfs()
        .args(["bench", "engine", "--systems", "nosuchdb"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown system"));
    let out = fernfs()
        .args(["bench", "engine", "--workloads", "E8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not implemented yet"));
}

/// A file that is not a fernfs image is named as such by every command that opens one (not
/// an "I/O error"); mount reports it before mounting anything.
#[test]
fn a_file_that_is_not_an_image_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, b"hello, this is not a file system").unwrap();
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let out_dir = dir.path().join("out");
    for img in [&junk, &empty] {
        let i = img.to_str().unwrap();
        let export_src = format!("{i}:/");
        for args in [
            vec!["fsck", i],
            vec!["stat", i],
            vec!["export", &export_src, out_dir.to_str().unwrap()],
            vec!["mount", i, dir.path().to_str().unwrap()],
        ] {
            let out = fernfs().args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?}");
            assert!(
                err.contains("not a fernfs image (no fernfs signature at offset 0)"),
                "{args:?}: {err}"
            );
            assert!(!err.contains("I/O error"), "{args:?}: {err}");
        }
    }
    assert!(
        !out_dir.exists(),
        "a failed export must not create its destination"
    );
}

/// An unknown `-o` option is refused by name before any mount is attempted (no FUSE needed:
/// the image does not even have to exist).
#[test]
fn an_unknown_mount_option_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = fernfs()
        .args(["mount", "absent.img", dir.path().to_str().unwrap()])
        .args(["-o", "rw,x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown mount option 'x'"), "{err}");
    assert!(!err.contains("mount(2)"), "{err}");
}

/// fuse3's mount.fuse runs a `fuse.fernfs` mount as `fernfs SOURCE MOUNTPOINT -o OPTIONS`:
/// that form is a mount, failing like a mount helper (exit 32), not a usage error.
#[test]
fn the_program_form_of_mount_fuse_is_a_mount() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.img");
    let out = fernfs()
        .arg(&absent)
        .arg(dir.path())
        .args(["-o", "rw,noatime,dev,suid"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.img"));
}

/// Ctrl-C on `bench engine` (SIGINT to the bench process alone, as a test can send it) kills
/// its task process and removes the scratch data, saying so; without a terminal, progress is
/// one line per task.
#[test]
fn sigint_on_bench_removes_its_scratch_data() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    let child = fernfs()
        .args([
            "bench",
            "engine",
            "--quick",
            "--workloads",
            "E1",
            "--reps",
            "1",
        ])
        .args(["--no-drop-caches", "--systems", "fern-tree"])
        .arg("--dir")
        .arg(&scratch)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    // Wait until a task is writing its scratch data.
    while std::fs::read_dir(&scratch).map_or(0, |d| d.count()) == 0 {
        assert!(start.elapsed().as_secs() < 30, "no scratch data appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = interrupt(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("fernfs bench: task 1/"), "{err}");
    assert!(err.contains("scratch data removed"), "{err}");
    // The killed task process may take a moment to be gone; its directory must not return.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        !scratch.exists(),
        "scratch data left in {}",
        scratch.display()
    );
}

/// One capped run at a time. Two beside each other on a 2-CPU machine starve each other's
/// background threads (drain, writeback, the memory governor), and a starved engine overshoots
/// its budget: run beside the other capped test, E1 at a 32 MiB cap was OOM-killed in 2 of 10
/// runs, alone in none (BENCHMARKS.md, "The engines inside a memory cap equal to their
/// budget": the gap is recorded there).
static ONE_CAPPED_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `bench engine` E1 on fern-tree alone with `keys` keys and the `variant` value kind,
/// its task inside a `cap_mib` memory cgroup; returns the report and the task's cap note. `None`
/// when cgroup v1 is not usable here (skipped as CI allows).
fn capped_e1(
    keys: &str,
    budget_mib: &str,
    cap_mib: &str,
    variant: &str,
) -> Option<(String, String)> {
    let memcg = fern_bench::memcap::MemCap::usable();
    if fern_testkit::skipped(fern_testkit::Need::Tools, memcg) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let _alone = ONE_CAPPED_RUN.lock().unwrap_or_else(|p| p.into_inner());
    let out = fernfs()
        .args(["bench", "engine", "--workloads", "E1", "--reps", "1"])
        .args(["--keys", keys, "--budget-mib", budget_mib])
        .args(["--mem-cap-mib", cap_mib, "--no-drop-caches"])
        .args(["--systems", "fern-tree", "--variants", variant, "--dir"])
        .arg(dir.path().join("scratch"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{out:?}");
    let note = report
        .lines()
        .find(|l| l.contains("fern-tree: memory cgroup peak"))
        .unwrap_or_else(|| panic!("no cap note: {report}"))
        .to_string();
    Some((report, note))
}

/// `bench engine --mem-cap-mib` runs each engine's task inside a cgroup memory limit and reports
/// what the task charged to it: the report names the cap, and each task's note shows a peak
/// under the cap (the task process joined the cgroup: its memory and page cache count) and no
/// OOM kill.
#[test]
fn bench_engine_holds_each_task_in_its_memory_cap() {
    let Some((report, note)) = capped_e1("100000", "16", "48", "text") else {
        return;
    };
    assert!(report.contains("memory cap: 48 MiB per task"), "{report}");
    let peak: f64 = note
        .split("peak ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no peak in {note:?}"));
    assert!((4.0..=48.0).contains(&peak), "{note}");
    assert!(note.contains("of the 48 MiB cap"), "{note}");
    assert!(note.ends_with("0 processes OOM-killed"), "{note}");
}

/// Issue 16, "one memory budget": a cgroup limit equal to the engine's budget must not OOM-kill
/// it. Before the cache counted taken nodes, orphans and encoded nodes, was sized inside the
/// budget (`cache_within_memory`) and the binary governed the allocator's freed pages
/// (memory.rs), fern-tree was OOM-killed at 32 MiB under a 32 MiB limit (BENCHMARKS.md).
#[test]
fn fern_tree_outlives_a_memory_cap_equal_to_its_budget() {
    let Some((report, note)) = capped_e1("600000", "32", "32", "incompressible") else {
        return;
    };
    assert!(note.ends_with("0 processes OOM-killed"), "{note}");
    assert!(report.contains("| E1 | overall"), "{report}");
}
