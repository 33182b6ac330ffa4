//! The skip rule of `shared_for_tests`: on a machine without etcd, *every* test that asks for a
//! server is recorded as skipped (so `scripts/test` never counts it as passed), and under
//! `FERN_REQUIRE_ETCD=1` the same test fails. Checked by running this test binary again with
//! `PATH` emptied, so the child sees a machine without an `etcd` binary.

use std::process::Command;

const CHILD: &str = "FERN_SKIP_RULE_CHILD";

/// Runs only inside the child (the parent test below starts it); asks for a server twice, as
/// two tests of one binary would, from two threads named like tests.
#[test]
fn child_asks_for_a_server() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    for name in ["first_test", "second_test"] {
        let got = std::thread::Builder::new()
            .name(name.into())
            .spawn(|| fern_etcd::local::shared_for_tests().is_some())
            .unwrap()
            .join();
        // Under FERN_REQUIRE_ETCD=1 the call panics, which `join` reports as an error.
        assert_eq!(got.ok(), Some(false).filter(|_| !required()), "{name}");
    }
}

fn required() -> bool {
    std::env::var("FERN_REQUIRE_ETCD").is_ok_and(|v| v == "1")
}

fn run_child(require: bool, log: &std::path::Path) -> bool {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_asks_for_a_server", "--test-threads", "1"])
        .env(CHILD, "1")
        .env("PATH", "")
        .env("FERN_SKIP_LOG", log)
        .env("FERN_REQUIRE_ETCD", if require { "1" } else { "0" });
    cmd.output()
        .expect("run the test binary again")
        .status
        .success()
}

#[test]
fn without_etcd_each_caller_is_a_recorded_skip_or_a_required_failure() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("skips");
    assert!(
        run_child(false, &log),
        "the child passes when etcd is optional"
    );
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let callers: Vec<&str> = lines
        .lines()
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(
        callers,
        ["first_test", "second_test"],
        "one skip line per caller, not one per binary: {lines:?}"
    );

    let log = dir.path().join("skips-required");
    assert!(
        run_child(true, &log),
        "the child's callers panic, as it checks"
    );
    assert!(
        std::fs::read_to_string(&log).unwrap_or_default().is_empty(),
        "a required etcd that is missing is a failure, not a skip"
    );
}
