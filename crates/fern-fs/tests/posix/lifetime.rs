//! Lifetimes: unlinked-but-open files and directories, orphans freed at mount.

use super::*;

#[test]
fn unlink_while_open_keeps_data_until_last_close() {
    let e = env();
    put(&e, "/f", &[7u8; 10_000]);
    let f1 = e.p.open(b"/f", rw()).expect("open");
    let f2 = e.p.open(b"/f", OpenOptions::default()).expect("open");
    e.p.unlink(b"/f").expect("unlink");
    assert_eq!(err(e.p.stat(b"/f")), libc::ENOENT);
    assert_eq!(e.keys_in("fs.orphan"), 1, "the orphan is recorded");
    e.p.write_at(&f1, 10_000, b"more")
        .expect("write to unlinked file");
    assert_eq!(
        e.p.read_at(&f2, 9_998, 10).expect("read"),
        [7, 7, b'm', b'o', b'r', b'e']
    );
    assert_eq!(e.fs.getattr(f1.ino()).expect("fstat").nlink, 0);
    e.p.close(f1).expect("close");
    assert_eq!(e.keys_in("fs.data"), 3, "still open once");
    e.p.close(f2).expect("close");
    assert_eq!(e.keys_in("fs.data"), 0, "freed at the last close");
    assert_eq!(e.keys_in("fs.orphan"), 0);
    assert_eq!(e.keys_in("fs.inode"), 1);
}

#[test]
fn orphans_are_freed_at_mount_after_a_crash() {
    let e = env();
    put(&e, "/f", &[1u8; 9000]);
    let f = e.p.open(b"/f", OpenOptions::default()).expect("open");
    e.p.unlink(b"/f").expect("unlink");
    let _abandoned = f; // never closed: the mount "crashes" with the file open
    let e = e.remount();
    assert_eq!(e.keys_in("fs.orphan"), 0);
    assert_eq!(e.keys_in("fs.data"), 0);
    assert_eq!(e.keys_in("fs.inode"), 1);
}

/// More orphans than one transaction of a store with etcd's limits (128 ops, 4 per freed
/// orphan) can free: mount-time cleanup pages them to fit, on a sole writer as on a shared store.
#[test]
fn many_orphans_are_freed_at_mount_within_the_store_limits() {
    let limits = fern_kv::Limits {
        max_ops: Some(128),
        ..fern_kv::Limits::EMBEDDED
    };
    let e = common::env_limited(fern_fs::MkfsOptions::default(), limits);
    let mut abandoned = Vec::new();
    for i in 0..70 {
        let path = format!("/f{i}");
        put(&e, &path, &[3u8; 5000]);
        abandoned.push(
            e.p.open(path.as_bytes(), OpenOptions::default())
                .expect("open"),
        );
        e.p.unlink(path.as_bytes()).expect("unlink");
    }
    assert_eq!(e.keys_in("fs.orphan"), 70);
    let e = e.remount();
    assert_eq!(e.keys_in("fs.orphan"), 0);
    assert_eq!(e.keys_in("fs.data"), 0);
    assert_eq!(e.keys_in("fs.inode"), 1);
    drop(abandoned);
}

/// Issue 12.5: a directory open through a handle outlives its name (rmdir, or a rename over
/// it): its attributes say nlink 0, listing it gives nothing, and the last close frees it.
#[test]
fn an_open_directory_outlives_rmdir_and_rename_over() {
    let e = env();
    let orphans = e.keys_in("fs.orphan");
    for replace in [false, true] {
        e.p.mkdir(b"/d", 0o755).expect("mkdir");
        // Held like the kernel holds what it looked up.
        let d = e.fs.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup");
        let fh = e.fs.opendir(d.ino).expect("opendir");
        if replace {
            e.p.mkdir(b"/e", 0o755).expect("mkdir");
            e.p.rename(b"/e", b"/d", 0).expect("rename over");
        } else {
            e.p.rmdir(b"/d").expect("rmdir");
        }
        let a =
            e.fs.getattr(d.ino)
                .expect("getattr of a removed, open directory");
        assert_eq!(
            (a.nlink, a.kind),
            (0, FileType::Directory),
            "replace={replace}"
        );
        assert!(e.fs.readdir(fh, 0, 100, false).expect("readdir").is_empty());
        // Nothing can be created in it (its keys would outlive it).
        let root = fern_fs::Cred::root();
        assert_eq!(err(e.fs.mkdir(&root, d.ino, b"x", 0o755)), libc::ENOENT);
        assert_eq!(
            err(e.fs.mknod(&root, d.ino, b"y", 0o100644, 0)),
            libc::ENOENT
        );
        assert_eq!(e.keys_in("fs.orphan"), orphans + 1);
        e.fs.releasedir(fh).expect("releasedir");
        assert_eq!(e.keys_in("fs.orphan"), orphans, "freed at the last close");
        assert!(e.fs.getattr(d.ino).is_err());
        if replace {
            e.p.rmdir(b"/d").expect("rmdir");
        }
    }
    // Left open at a crash: the next mount frees it.
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    let d = e.fs.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup");
    let _fh = e.fs.opendir(d.ino).expect("opendir");
    e.p.rmdir(b"/d").expect("rmdir");
    let e = e.remount();
    assert_eq!(e.keys_in("fs.orphan"), orphans);
    assert_eq!(err(e.p.stat(b"/d")), libc::ENOENT);
}
