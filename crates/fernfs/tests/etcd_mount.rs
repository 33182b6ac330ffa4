//! `fernfs mkfs etcd://…` and two `fernfs mount etcd://…` daemons of one prefix on a private
//! etcd: a namespace change committed through one mount is seen through the other, under the
//! rule of docs/distributed.md §7 (etcd mounts keep kernel entries and attributes for 1 s; a
//! name the other mount never looked up is seen at once, a cached one within the TTL).
//!
//! Needs /dev/fuse and root (or fusermount3), and an etcd binary: without them it prints
//! SKIPPED and returns, unless FERN_REQUIRE_FUSE=1 / FERN_REQUIRE_ETCD=1 make that a failure.

use std::fs;
use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, unique_prefix};

mod common;
use common::{ok, run, MountGuard};

/// Polls `cond` until it holds or `limit` passes.
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_mounts_of_one_prefix_see_each_others_namespace() {
    // Root: the mounts are made with mount(2).
    if fern_testkit::skipped(fern_testkit::Need::Fuse, fern_testkit::fuse_as_root()) {
        return;
    }
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let url = etcd.url(&unique_prefix("mount"));
    ok(&["mkfs", &url]);
    let again = run(&["mkfs", &url]);
    assert!(
        !again.status.success(),
        "mkfs must refuse a formatted prefix"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    ok(&["mkfs", &url, "--force"]);

    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir(&a).expect("mkdir a");
    fs::create_dir(&b).expect("mkdir b");
    let _ga = MountGuard(a.clone());
    let _gb = MountGuard(b.clone());
    ok(&["mount", &url, a.to_str().expect("utf-8")]);
    ok(&["mount", &url, b.to_str().expect("utf-8")]);

    // B looks a name up before it exists (a failed lookup is not cached)...
    assert!(!b.join("f").exists());
    // ... A creates it and writes it (every write is an etcd Txn, durable when it returns) ...
    fs::write(a.join("f"), b"written on a").expect("write on a");
    // ... and B's next lookup finds it, with A's data (B never cached this file).
    assert_eq!(fs::read(b.join("f")).expect("read on b"), b"written on a");

    // A rename on B: the new name is seen by A at once, the old one is gone within the TTL.
    fs::rename(b.join("f"), b.join("g")).expect("rename on b");
    assert_eq!(
        fs::read(a.join("g")).expect("new name on a"),
        b"written on a"
    );
    assert!(
        within(Duration::from_secs(3), || !a.join("f").exists()),
        "the old name must vanish from A within its entry TTL"
    );

    // An unlink on A is seen by B within the TTL (B holds a cached entry for g).
    fs::remove_file(a.join("g")).expect("unlink on a");
    assert!(
        within(Duration::from_secs(3), || !b.join("g").exists()),
        "the unlinked name must vanish from B within its entry TTL"
    );

    // Creates from both mounts into one directory lose nothing.
    for i in 0..20 {
        let (m, other) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        fs::write(m.join(format!("n{i}")), format!("{i}")).expect("create");
        assert_eq!(
            fs::read_to_string(other.join(format!("n{i}"))).expect("seen on the other mount"),
            format!("{i}")
        );
    }
    let mut names: Vec<String> = fs::read_dir(&a)
        .expect("list a")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 20, "{names:?}");

    ok(&["umount", a.to_str().expect("utf-8")]);
    ok(&["umount", b.to_str().expect("utf-8")]);
    // The file system outlives its mounts: a new mount sees everything.
    ok(&["mount", &url, a.to_str().expect("utf-8")]);
    assert_eq!(fs::read_dir(&a).expect("list").count(), 20);
    ok(&["umount", a.to_str().expect("utf-8")]);
    // And checks clean; repair is refused while nothing can tell whether a mount is active.
    let out = ok(&["fsck", &url]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("0 problems"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let repair = run(&["fsck", &url, "--repair"]);
    assert_eq!(repair.status.code(), Some(8), "operational error");
    assert!(String::from_utf8_lossy(&repair.stderr).contains("not supported"));
}
