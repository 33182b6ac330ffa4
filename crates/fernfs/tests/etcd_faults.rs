//! Faults under a workload through real mounts on a real 3-member etcd cluster (issue 14,
//! docs/distributed.md §5 and §8): `kill -9` of the etcd leader, round after round, while a
//! mount writes and fsyncs files; and `kill -9` of one mount's daemon while a second mount of
//! the same file system looks on. Every file whose `fsync` returned is checked — nothing
//! acknowledged may be lost, the mount goes on writing once a new leader is elected, and
//! `fernfs fsck` is clean at the end.
//!
//! The leader kills run twice: at the default (`delegations=auto`, which this workload never
//! makes take) and with the mount holding the write-back delegation throughout.
//!
//! Rounds: `FERN_ETCD_FAULT_ROUNDS` (default 20 each); `FERN_ETCD_FAULT_MOUNT_OPTS` adds
//! `-o OPTS` to every mount (e.g. `delegations=always,log=/tmp/ef.log`, to hunt write-back
//! faults with the daemons' logs). Needs /dev/fuse and root, and an etcd binary: without
//! them it prints SKIPPED and returns, unless FERN_REQUIRE_FUSE=1 / FERN_REQUIRE_ETCD=1
//! make that a failure.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, unique_prefix, LocalEtcd};

mod common;
use common::{ok, pid_with_args, MountGuard, MountPoints};

fn rounds() -> usize {
    std::env::var("FERN_ETCD_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// The content of workload file `name` (derived from it, a few KiB).
fn content(name: &str) -> Vec<u8> {
    let n = 1 + name.bytes().map(usize::from).sum::<usize>() % 24;
    name.repeat(40 * n).into_bytes()
}

/// Creates, writes and fsyncs `dir/name`; true when every step succeeded (acknowledged).
fn write_acked(dir: &Path, name: &str) -> bool {
    let Ok(mut f) = fs::File::create(dir.join(name)) else {
        return false;
    };
    f.write_all(&content(name)).is_ok() && f.sync_all().is_ok()
}

/// Every acknowledged file is under `dir` with its content.
fn check_acked(dir: &Path, acked: &[String], when: &str) {
    for name in acked {
        let got = fs::read(dir.join(name));
        assert!(
            got.as_ref().is_ok_and(|g| *g == content(name)),
            "{when}: acknowledged file {name} lost or wrong ({:?})",
            got.map(|g| g.len())
        );
    }
}

/// The PID of the `fernfs mount … DIR` daemon serving `mp`.
fn daemon_pid(mp: &Path) -> i32 {
    let want = mp.to_str().expect("utf-8");
    pid_with_args(&[b"mount", want.as_bytes()])
        .unwrap_or_else(|| panic!("no fernfs daemon serves {want}"))
}

/// Mounts `url` at `mp` with the options of `FERN_ETCD_FAULT_MOUNT_OPTS`, if any.
fn mount(url: &str, mp: &Path) {
    mount_with(url, mp, "");
}

/// Mounts `url` at `mp` with `-o opts` (none if empty), then those of
/// `FERN_ETCD_FAULT_MOUNT_OPTS` (later options win).
fn mount_with(url: &str, mp: &Path, opts: &str) {
    let mp = mp.to_str().expect("utf-8");
    let extra = std::env::var("FERN_ETCD_FAULT_MOUNT_OPTS").unwrap_or_default();
    let all: Vec<&str> = [opts, extra.as_str()]
        .into_iter()
        .filter(|o| !o.is_empty())
        .collect();
    if all.is_empty() {
        ok(&["mount", url, mp]);
    } else {
        ok(&["mount", url, mp, "-o", &all.join(",")]);
    }
}

fn fsck_clean(url: &str) {
    let out = ok(&["fsck", url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0 problems"), "fsck: {text}");
}

fn needs() -> bool {
    !fern_testkit::skipped(fern_testkit::Need::Fuse, fern_testkit::fuse_as_root())
        && shared_for_tests().is_some()
}

/// At the default (`delegations=auto`): this workload — one file and one fsync at a time —
/// never makes the mount take the write-back delegation, so every operation is a guarded Txn.
#[test]
fn leader_killed_under_a_mount_loses_nothing_acknowledged() {
    leader_killed_under("");
}

/// The same with the mount holding the write-back delegation throughout: its flushes,
/// fenced reads and lease renewals ride through the elections (docs/design.md §7.3, W4, W6).
#[test]
fn leader_killed_under_a_holding_mount_loses_nothing_acknowledged() {
    leader_killed_under("delegations=always");
}

fn leader_killed_under(opts: &str) {
    if !needs() {
        return;
    }
    let mut etcd = LocalEtcd::start_cluster(3).expect("3-member cluster");
    let url = etcd.url(&unique_prefix("leaderkill"));
    ok(&["mkfs", &url]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mp = tmp.path().join("m");
    fs::create_dir(&mp).expect("mkdir");
    let _g = MountGuard(mp.clone());
    mount_with(&url, &mp, opts);

    let acked = Mutex::new(Vec::<String>::new());
    let failed = Mutex::new(0usize);
    let stop = AtomicBool::new(false);
    let n = rounds();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("f{i}");
                if write_acked(&mp, &name) {
                    acked.lock().expect("lock").push(name);
                } else {
                    // EIO while no leader is elected: not acknowledged, so it may or may
                    // not be there; the workload goes on.
                    *failed.lock().expect("lock") += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                i += 1;
            }
        });
        let count = || acked.lock().expect("lock").len();
        let progress = |from: usize, what: &str| {
            let t = Instant::now();
            while count() < from + 3 {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "{what}: the mount made no progress in 30 s ({} failures)",
                    failed.lock().expect("lock")
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for round in 0..n {
            progress(count(), "before the kill");
            let leader = etcd.leader().expect("a leader");
            etcd.kill_member(leader).expect("kill -9 the leader");
            let at_kill = count();
            progress(at_kill, &format!("round {round}: after the leader died"));
            etcd.restart_member(leader).expect("restart the old leader");
        }
        stop.store(true, Ordering::Relaxed);
    });
    let acked = acked.into_inner().expect("lock");
    eprintln!(
        "{n} leader kills ({opts:?}) in {:?}: {} files acknowledged, {} writes failed (EIO) on the way",
        start.elapsed(),
        acked.len(),
        failed.into_inner().expect("lock")
    );
    check_acked(&mp, &acked, "through the mount");
    ok(&["umount", mp.to_str().expect("utf-8")]);
    mount_with(&url, &mp, opts);
    check_acked(&mp, &acked, "after a remount");
    ok(&["umount", mp.to_str().expect("utf-8")]);
    fsck_clean(&url);
}

#[test]
fn a_mount_daemon_killed_loses_nothing_acknowledged_and_the_other_mount_goes_on() {
    if !needs() {
        return;
    }
    let etcd = LocalEtcd::start_cluster(3).expect("3-member cluster");
    let url = etcd.url(&unique_prefix("daemonkill"));
    ok(&["mkfs", &url]);
    let points = MountPoints::two();
    let (a, b) = (points.a.clone(), points.b.clone());
    mount(&url, &b);
    let mut acked = Vec::new();
    let n = rounds();
    let start = Instant::now();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 0..n {
        mount(&url, &a);
        let pid = daemon_pid(&a);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let kill_after = Duration::from_millis(50 + seed % 300);
        let (round_acked, b_name) = std::thread::scope(|s| {
            let w = s.spawn(|| {
                let mut mine = Vec::new();
                for i in 0.. {
                    let name = format!("r{round}-{i}");
                    if !write_acked(&a, &name) {
                        break; // the daemon is gone (ENOTCONN)
                    }
                    mine.push(name);
                }
                mine
            });
            std::thread::sleep(kill_after);
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("kill -9 the daemon of a");
            let mine = w.join().expect("workload");
            // The other mount keeps working while a is dead.
            let name = format!("b{round}");
            assert!(write_acked(&b, &name), "round {round}: b cannot write");
            (mine, name)
        });
        let _ = nix::mount::umount2(&a, nix::mount::MntFlags::MNT_DETACH);
        acked.extend(round_acked);
        acked.push(b_name);
        check_acked(
            &b,
            &acked,
            &format!("round {round}, on b after a's daemon died"),
        );
    }
    eprintln!(
        "{n} daemon kills in {:?}: {} files acknowledged",
        start.elapsed(),
        acked.len()
    );
    ok(&["umount", b.to_str().expect("utf-8")]);
    fsck_clean(&url);
    mount(&url, &a);
    check_acked(&a, &acked, "on a fresh mount");
    ok(&["umount", a.to_str().expect("utf-8")]);
}

/// An etcd that answers nothing (every member frozen with SIGSTOP, as a partition looks from
/// the client) makes the mount's operations fail with EIO after the configured deadline
/// (`timeout_ms` of the client configuration file, here 1.5 s) — never hang, never answer
/// wrong — and the same mount works again once etcd answers.
#[test]
fn an_unreachable_etcd_gives_eio_within_the_deadline_and_the_mount_recovers() {
    if !needs() {
        return;
    }
    let etcd = LocalEtcd::start().expect("etcd");
    let url = etcd.url(&unique_prefix("unreachable"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let conf = tmp.path().join("etcd.conf");
    fs::write(&conf, "timeout_ms = 1500\n").expect("config");
    let with_conf = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fernfs"))
            .args(args)
            .env("FERN_ETCD_CONFIG", &conf)
            .output()
            .expect("run fernfs");
        assert!(
            out.status.success(),
            "fernfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    with_conf(&["mkfs", &url]);
    let mp = tmp.path().join("m");
    fs::create_dir(&mp).expect("mkdir");
    let _g = MountGuard(mp.clone());
    with_conf(&["mount", &url, mp.to_str().expect("utf-8")]);
    assert!(write_acked(&mp, "before"));

    etcd.pause().expect("SIGSTOP etcd");
    type Op<'a> = Box<dyn Fn() -> std::io::Result<()> + 'a>;
    let ops: [(&str, Op); 3] = [
        ("create", Box::new(|| fs::write(mp.join("during"), b"x"))),
        (
            "lookup",
            Box::new(|| fs::metadata(mp.join("never")).map(drop)),
        ),
        ("mkdir", Box::new(|| fs::create_dir(mp.join("d")))),
    ];
    for (what, op) in &ops {
        let t = Instant::now();
        let r = op();
        let took = t.elapsed();
        assert_eq!(
            r.as_ref().map_err(|e| e.raw_os_error()),
            Err(Some(libc::EIO)),
            "{what} with etcd frozen: {r:?}"
        );
        // One operation is a few etcd calls, each bounded by the 1.5 s deadline.
        assert!(took < Duration::from_secs(8), "{what} took {took:?}");
        eprintln!("{what} with etcd frozen: EIO after {took:?}");
    }
    etcd.resume().expect("SIGCONT etcd");
    check_acked(&mp, &["before".to_string()], "after etcd came back");
    assert!(write_acked(&mp, "after"), "the mount must write again");
    check_acked(&mp, &["after".to_string()], "after etcd came back");
    ok(&["umount", mp.to_str().expect("utf-8")]);
    with_conf(&["fsck", &url]);
}
