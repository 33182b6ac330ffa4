//! `fernfs bench engine` end to end on a tiny size: child processes, table, JSON.
#![cfg(feature = "bench")]

use std::process::Command;

fn fernfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fernfs"))
}

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
