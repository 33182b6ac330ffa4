//! `fernfs mkfs etcd://…` and two `fernfs mount etcd://…` daemons of one prefix on a private
//! etcd: a namespace change committed through one mount is seen through the other, under the
//! rule of docs/distributed.md §7 (etcd mounts keep kernel entries and attributes for 1 s; a
//! name the other mount never looked up is seen at once, a cached one within the TTL). The
//! later tests are one consistency rule each (§7, "Consistency across mounts"): names in a
//! directory made during the session, open files surviving another mount's start and
//! another mount's unlink, close-to-open for data, atomic rename.
//!
//! Needs /dev/fuse and root (or fusermount3), and an etcd binary: without them it prints
//! SKIPPED and returns, unless FERN_REQUIRE_FUSE=1 / FERN_REQUIRE_ETCD=1 make that a failure.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, unique_prefix};

mod common;
use common::{ok, pid_with_args, run, MountGuard, MountPoints};

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

    let points = MountPoints::two();
    let (a, b) = (points.a.clone(), points.b.clone());
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

/// A formatted prefix with two live mounts of it, `a` and `b` (two daemons, two processes),
/// detached on drop.
struct TwoMounts {
    url: String,
    a: PathBuf,
    b: PathBuf,
    points: MountPoints,
    // Keeps the private etcd alive as long as the mounts.
    _etcd: &'static fern_etcd::local::LocalEtcd,
}

impl TwoMounts {
    /// `None` when the test is skipped (no FUSE as root, or no etcd binary).
    fn start(name: &str) -> Option<TwoMounts> {
        if fern_testkit::skipped(fern_testkit::Need::Fuse, fern_testkit::fuse_as_root()) {
            return None;
        }
        let etcd = shared_for_tests()?;
        let url = etcd.url(&unique_prefix(name));
        ok(&["mkfs", &url]);
        let points = MountPoints::two();
        let (a, b) = (points.a.clone(), points.b.clone());
        // A holds the write-back delegation whenever nobody revoked it in the last cool-down
        // (docs/design.md §7.3): every rule below must hold across its buffer too. B never
        // takes it (`off`): it only revokes. Not B at the default `auto`: B's open/close
        // loops write registrations, so B would take too, and A's `always` (retaking at
        // every cool-down's end) against it traded the delegation at nearly every operation
        // until A's write ran out of retries (EAGAIN; CI, 2026-11-29) — the documented
        // reason `always` is for a sole writer (distributed.md §7).
        ok(&[
            "mount",
            &url,
            a.to_str().expect("utf-8"),
            "-o",
            "delegations=always",
        ]);
        ok(&[
            "mount",
            &url,
            b.to_str().expect("utf-8"),
            "-o",
            "delegations=off",
        ]);
        Some(TwoMounts {
            url,
            a,
            b,
            points,
            _etcd: etcd,
        })
    }

    /// Unmounts both, then checks the file system: clean, and no orphan left behind.
    fn finish(self) {
        ok(&["umount", self.a.to_str().expect("utf-8")]);
        ok(&["umount", self.b.to_str().expect("utf-8")]);
        let out = ok(&["fsck", &self.url]);
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(report.contains("0 problems"), "{report}");
        assert!(!report.contains("pending orphan"), "{report}");
    }
}

/// Drops the kernel's cached pages of `f`, so the next read asks the mount's daemon.
fn drop_page_cache(f: &fs::File) {
    nix::fcntl::posix_fadvise(f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .expect("fadvise");
}

fn read_at(f: &mut fs::File, len: usize) -> Vec<u8> {
    f.seek(SeekFrom::Start(0)).expect("seek");
    let mut v = vec![0u8; len];
    f.read_exact(&mut v).expect("read the open file");
    v
}

/// §7 fix 1: a directory A made in this session is not "complete" in A's memory: a name B
/// adds to it is found by A, and A's exclusive create of that name fails instead of
/// overwriting B's entry. Both mounts creating in it lose nothing.
#[test]
fn a_directory_made_this_session_takes_names_from_both_mounts() {
    let Some(m) = TwoMounts::start("newdir") else {
        return;
    };
    fs::create_dir(m.a.join("d")).expect("mkdir on a");
    fs::write(m.b.join("d/x"), b"from b").expect("create on b");
    assert_eq!(
        fs::read(m.a.join("d/x")).expect("a finds b's name in a's new directory"),
        b"from b"
    );
    let excl = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.a.join("d/x"));
    assert_eq!(
        excl.expect_err("O_EXCL on a name b made").kind(),
        std::io::ErrorKind::AlreadyExists
    );
    assert_eq!(fs::read(m.b.join("d/x")).expect("b's file"), b"from b");
    // Alternating creates into the new directory, and into one B makes.
    fs::create_dir(m.b.join("d/e")).expect("mkdir on b");
    for dir in ["d", "d/e"] {
        for i in 0..10 {
            let (mine, other) = if i % 2 == 0 {
                (&m.a, &m.b)
            } else {
                (&m.b, &m.a)
            };
            let name = format!("{dir}/n{i}");
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(mine.join(&name))
                .and_then(|mut f| f.write_all(name.as_bytes()))
                .expect("exclusive create");
            assert_eq!(fs::read(other.join(&name)).expect("seen"), name.as_bytes());
        }
    }
    for mp in [&m.a, &m.b] {
        assert_eq!(fs::read_dir(mp.join("d")).expect("list").count(), 12);
        assert_eq!(fs::read_dir(mp.join("d/e")).expect("list").count(), 10);
    }
    m.finish();
}

/// §7 fix 2: a mount starting while another holds an unlinked file open must not free it.
#[test]
fn a_new_mount_does_not_free_a_file_another_holds_open() {
    let Some(m) = TwoMounts::start("orphan") else {
        return;
    };
    let data = vec![7u8; 20_000];
    let mut f = create_rw(&m.a.join("f"));
    f.write_all(&data).expect("write");
    fs::remove_file(m.a.join("f")).expect("unlink on a while open");
    // A third mount starts (its orphan cleanup runs) and stops.
    let c = m.points.dir.path().join("c");
    fs::create_dir(&c).expect("mkdir c");
    let _gc = MountGuard(c.clone());
    ok(&["mount", &m.url, c.to_str().expect("utf-8")]);
    ok(&["umount", c.to_str().expect("utf-8")]);
    drop_page_cache(&f);
    assert_eq!(read_at(&mut f, data.len()), data, "the open file's data");
    drop(f);
    m.finish();
}

/// §7 fix 4: an unlink on A of a file B holds open keeps it readable on B until B closes it;
/// B's last close frees it (finish: no orphan left).
#[test]
fn an_unlink_on_one_mount_keeps_the_file_open_on_the_other() {
    let Some(m) = TwoMounts::start("unlinkopen") else {
        return;
    };
    let data: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(m.a.join("g"), &data).expect("write on a");
    let mut held = fs::File::open(m.b.join("g")).expect("open on b");
    assert_eq!(read_at(&mut held, data.len()), data);
    fs::remove_file(m.a.join("g")).expect("unlink on a");
    assert!(
        within(Duration::from_secs(3), || !m.b.join("g").exists()),
        "the name goes from b too"
    );
    drop_page_cache(&held);
    assert_eq!(read_at(&mut held, data.len()), data, "b still reads it");
    drop(held);
    m.finish();
}

/// §7 fix 3: close-to-open for data. B has cached a file; A rewrites it (same size, so no
/// attribute change reveals it) and closes; B's next open reads A's bytes.
#[test]
fn an_open_after_another_mounts_close_reads_its_data() {
    let Some(m) = TwoMounts::start("c2o") else {
        return;
    };
    fs::write(m.a.join("h"), vec![b'a'; 10_000]).expect("write on a");
    assert_eq!(
        fs::read(m.b.join("h")).expect("read on b"),
        vec![b'a'; 10_000]
    );
    let mut w = fs::OpenOptions::new()
        .write(true)
        .open(m.a.join("h"))
        .expect("open on a");
    w.write_all(&vec![b'b'; 10_000]).expect("rewrite on a");
    drop(w);
    assert_eq!(
        fs::read(m.b.join("h")).expect("reopen on b"),
        vec![b'b'; 10_000],
        "b's open must not keep its stale page cache"
    );
    m.finish();
}

/// Rename is atomic across mounts: while A keeps replacing `t` by rename, every open and read
/// of `t` on B gets one whole version, never a missing name or a mixture.
#[test]
fn a_rename_on_one_mount_is_atomic_on_the_other() {
    let Some(m) = TwoMounts::start("rename") else {
        return;
    };
    let version = |i: u32| format!("version {i:04} ").repeat(300).into_bytes();
    fs::write(m.a.join("t"), version(0)).expect("first version");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (t, stop) = (m.b.join("t"), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // An open of a name that A replaced twice between B's lookup and B's open (the
                // kernel retries a stale handle once) gets ESTALE, as on NFS: read again. A
                // missing name (ENOENT) or any other error fails.
                let got = match fs::read(&t) {
                    Err(e) if e.raw_os_error() == Some(libc::ESTALE) => continue,
                    r => r.expect("t always exists on b"),
                };
                let head = String::from_utf8_lossy(&got[..13]).into_owned();
                let i: u32 = head["version ".len()..12].parse().expect("a version");
                assert_eq!(got, version(i), "one whole version");
                seen.insert(i);
            }
            seen
        })
    };
    for i in 1..=20 {
        let tmp = m.a.join(format!("t.{i}"));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .expect("new version");
        f.write_all(&version(i)).expect("write version");
        drop(f);
        // B's open/close loop keeps changing the open registrations this rename's transaction
        // reads, so under load its bounded retries can run out: EAGAIN, the documented result
        // of `RetriesExhausted` (docs/distributed.md §5), with nothing applied. Atomicity is
        // what this test checks; a rename starved by another mount's churn is a known liveness
        // gap (closing note, 2026-11-27), so it is tried again here.
        let mut tries = 0;
        while let Err(e) = fs::rename(&tmp, m.a.join("t")) {
            tries += 1;
            assert!(
                e.raw_os_error() == Some(libc::EAGAIN) && tries < 20,
                "rename over t: {e} (try {tries})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(
        within(Duration::from_secs(3), || fs::read(m.b.join("t")).ok()
            == Some(version(20))),
        "b sees the last version within its TTLs"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.join().expect("reader");
    assert!(!seen.is_empty());
    m.finish();
}

/// Creates (or truncates) `path` for reading and writing: a file a test holds open.
fn create_rw(path: &std::path::Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()))
}

/// The pid of the daemon serving mountpoint `mp` (started with `-f` and the mountpoint).
fn daemon_of(mp: &std::path::Path) -> Option<i32> {
    pid_with_args(&[b"mount", b"-f", mp.to_string_lossy().as_bytes()])
}

/// §7 rule 3, the other half: a mount killed with SIGKILL while holding an unlinked file open
/// leaves a registration that its lease takes away within `LEASE_TTL`; the next mount then
/// frees the file (fsck: no pending orphan). While the lease lives, a mount leaves it alone.
#[test]
fn a_killed_mounts_open_files_are_freed_once_its_lease_expires() {
    let Some(m) = TwoMounts::start("killed") else {
        return;
    };
    let mut f = create_rw(&m.a.join("f"));
    f.write_all(&[9u8; 5000]).expect("write");
    fs::remove_file(m.b.join("f")).expect("unlink on b while a holds it");
    let pid = daemon_of(&m.a).expect("a's daemon");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill a's daemon");
    drop(f);
    let _ = nix::mount::umount2(&m.a, nix::mount::MntFlags::MNT_DETACH);
    let remount_c = |m: &TwoMounts| {
        let c = m.points.dir.path().join("c");
        let _ = fs::create_dir(&c);
        let _gc = MountGuard(c.clone());
        ok(&["mount", &m.url, c.to_str().expect("utf-8")]);
        ok(&["umount", c.to_str().expect("utf-8")]);
    };
    // At once: the dead mount's lease still holds the file, so it stays.
    remount_c(&m);
    let out = ok(&["fsck", &m.url]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("pending orphan"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::thread::sleep(fern_etcd::LEASE_TTL + Duration::from_secs(2));
    remount_c(&m);
    ok(&["umount", m.b.to_str().expect("utf-8")]);
    let out = ok(&["fsck", &m.url]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("0 problems"), "{report}");
    assert!(!report.contains("pending orphan"), "{report}");
}

/// `fernfs stat MOUNTPOINT` of an etcd mount reports what it walked and the daemon's FUSE
/// transport (the pjdfstest script checks that line). It failed with "No such file or
/// directory": the mount's source, the URL, was taken for an image path.
#[test]
fn stat_of_an_etcd_mountpoint_walks_it_and_names_the_transport() {
    let Some(m) = TwoMounts::start("statmnt") else {
        return;
    };
    fs::write(m.a.join("one"), b"abc").expect("write");
    fs::create_dir(m.a.join("d")).expect("mkdir");
    let out = ok(&["stat", m.b.to_str().expect("utf-8")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("etcd file system:"), "{text}");
    assert!(text.contains("regular files:      1"), "{text}");
    assert!(text.contains("directories:        2"), "{text}");
    assert!(text.contains("FUSE transport:"), "{text}");
    m.finish();
}

/// A clean unmount of a mount holding the write-back delegation sends what it buffered before
/// the daemon exits (docs/design.md §7.3): files made a moment before `umount` — before the
/// once-a-second flush — are all there on the next mount, and fsck is clean.
#[test]
fn an_unmount_sends_what_the_write_back_buffered() {
    if fern_testkit::skipped(fern_testkit::Need::Fuse, fern_testkit::fuse_as_root()) {
        return;
    }
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let url = etcd.url(&unique_prefix("umountflush"));
    ok(&["mkfs", &url]);
    let points = MountPoints::two();
    let a = points.a.to_str().expect("utf-8");
    ok(&["mount", &url, a, "-o", "delegations=always"]);
    for i in 0..40 {
        fs::write(points.a.join(format!("f{i}")), b"buffered").expect("write");
    }
    ok(&["umount", a]);
    ok(&["mount", &url, a, "-o", "delegations=off"]);
    let names = fs::read_dir(&points.a).expect("list").count();
    assert_eq!(names, 40, "every file made before the unmount");
    assert_eq!(fs::read(points.a.join("f39")).expect("read"), b"buffered");
    ok(&["umount", a]);
    let out = ok(&["fsck", &url]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 problems"));
}
