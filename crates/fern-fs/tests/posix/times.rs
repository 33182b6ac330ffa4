//! Timestamps and the atime policies.

use super::*;

#[test]
fn timestamps_follow_posix() {
    let e = env();
    let f = e.p.open(b"/f", rw()).expect("create");
    let created = e.p.stat(b"/f").expect("stat");
    assert_eq!(created.atime, created.mtime);
    let root = e.p.stat(b"/").expect("root");
    assert!(
        root.mtime >= created.ctime && root.ctime >= created.ctime,
        "create touches the parent"
    );
    std::thread::sleep(std::time::Duration::from_millis(2));
    e.p.write_at(&f, 0, b"x").expect("write");
    let written = e.p.stat(b"/f").expect("stat");
    assert!(written.mtime > created.mtime && written.ctime > created.ctime);
    assert_eq!(written.atime, created.atime, "write does not touch atime");
    std::thread::sleep(std::time::Duration::from_millis(2));
    e.p.chmod(b"/f", 0o600).expect("chmod");
    let chmodded = e.p.stat(b"/f").expect("stat");
    assert_eq!(chmodded.perm, 0o600);
    assert_eq!(chmodded.mtime, written.mtime, "chmod leaves mtime");
    assert!(chmodded.ctime > written.ctime, "chmod sets ctime");
    let t = Timespec {
        sec: 1_000_000_000,
        nsec: 123_456_789,
    };
    e.p.utimens(b"/f", Some(TimeSet::At(t)), Some(TimeSet::At(t)))
        .expect("utimens");
    let a = e.p.stat(b"/f").expect("stat");
    assert_eq!((a.atime, a.mtime), (t, t), "nanoseconds are kept");
    assert!(a.ctime >= chmodded.ctime);
    e.p.read_at(&f, 0, 1).expect("read");
    assert!(
        e.p.stat(b"/f").expect("stat").atime > t,
        "relatime: read refreshes an old atime"
    );
    let c =
        e.fs.setattr(
            f.ino(),
            &SetAttr {
                ctime: Some(t),
                ..SetAttr::default()
            },
        )
        .expect("explicit ctime");
    assert_eq!(c.ctime, t);
    let before = e.p.stat(b"/").expect("root");
    std::thread::sleep(std::time::Duration::from_millis(2));
    e.p.rename(b"/f", b"/g", 0).expect("rename");
    assert!(
        e.p.stat(b"/").expect("root").mtime > before.mtime,
        "rename touches the parent"
    );
    assert!(
        e.p.stat(b"/g").expect("g").ctime > t,
        "rename sets the inode's ctime"
    );
    e.p.close(f).expect("close");
}

#[test]
fn relatime_reads_write_atime_only_when_stale() {
    let e = env();
    put(&e, "/f", b"data");
    // Just created: atime == mtime, so the first read refreshes it (relatime).
    let a0 = e.p.stat(b"/f").expect("stat").atime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert_eq!(get(&e, "/f"), b"data");
    let a1 = e.p.stat(b"/f").expect("stat").atime;
    assert!(a1 > a0, "the first read after a change updates atime");
    // atime is now newer than mtime and ctime and less than a day old: reads leave it.
    std::thread::sleep(std::time::Duration::from_millis(2));
    get(&e, "/f");
    assert_eq!(
        e.p.stat(b"/f").expect("stat").atime,
        a1,
        "no atime write per read"
    );
    // A write makes it stale again.
    put(&e, "/f", b"more");
    std::thread::sleep(std::time::Duration::from_millis(2));
    get(&e, "/f");
    assert!(e.p.stat(b"/f").expect("stat").atime > a1);
}

/// A listing from the start reads the directory: its atime follows the same relatime rule.
#[test]
fn relatime_listing_marks_directory_atime_only_when_stale() {
    let e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    put(&e, "/d/f", b"x");
    let a0 = e.p.stat(b"/d").expect("stat").atime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert_eq!(e.p.read_dir(b"/d").expect("readdir").len(), 1);
    let a1 = e.p.stat(b"/d").expect("stat").atime;
    assert!(a1 > a0, "the first listing after a change updates atime");
    std::thread::sleep(std::time::Duration::from_millis(2));
    e.p.read_dir(b"/d").expect("readdir");
    assert_eq!(
        e.p.stat(b"/d").expect("stat").atime,
        a1,
        "no write per listing"
    );
    // A new entry changes mtime/ctime: the next listing marks atime again.
    put(&e, "/d/g", b"y");
    std::thread::sleep(std::time::Duration::from_millis(2));
    e.p.read_dir(b"/d").expect("readdir");
    assert!(e.p.stat(b"/d").expect("stat").atime > a1);
}

/// Issue 12.6: the atime policy of the mount: noatime never writes atime, strictatime on every
/// read, nodiratime spares directories (relatime, the default, has its own test above).
#[test]
fn atime_policies_noatime_strictatime_nodiratime() {
    use fern_fs::{AtimeMode, AtimePolicy};
    let e = env();
    put(&e, "/f", b"data");
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    let atime = |p: &str| e.p.stat(p.as_bytes()).expect("stat").atime;
    let pause = || std::thread::sleep(std::time::Duration::from_millis(2));
    e.fs.set_atime_policy(AtimePolicy {
        mode: AtimeMode::Never,
        nodiratime: false,
    });
    let a0 = atime("/f");
    pause();
    get(&e, "/f");
    assert_eq!(atime("/f"), a0, "noatime: even a stale atime stays");
    e.fs.set_atime_policy(AtimePolicy {
        mode: AtimeMode::Strict,
        nodiratime: true,
    });
    pause();
    get(&e, "/f");
    let a1 = atime("/f");
    assert!(a1 > a0);
    pause();
    get(&e, "/f");
    assert!(atime("/f") > a1, "strictatime: every read");
    let d0 = atime("/d");
    pause();
    e.p.read_dir(b"/d").expect("list");
    assert_eq!(atime("/d"), d0, "nodiratime");
    e.fs.set_atime_policy(AtimePolicy {
        mode: AtimeMode::Strict,
        nodiratime: false,
    });
    e.p.read_dir(b"/d").expect("list");
    assert!(atime("/d") > d0);
}
