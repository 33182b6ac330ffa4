//! The store beneath: mkfs and mount, remount, corrupt values, statfs, a full store, errno mapping.

use super::*;

#[test]
fn remount_keeps_everything_and_512_byte_blocks_work() {
    let e = common::env_with(fern_fs::MkfsOptions {
        block_size: 512,
        ..Default::default()
    });
    e.p.mkdir(b"/d", 0o700).expect("mkdir");
    put(
        &e,
        "/d/f",
        &(0..3000u32).map(|i| i as u8).collect::<Vec<_>>(),
    );
    e.p.link(b"/d/f", b"/h").expect("link");
    e.p.symlink(b"/d/f", b"/s").expect("symlink");
    e.p.setxattr(b"/h", b"user.k", b"v", 0).expect("setxattr");
    assert_eq!(e.keys_in("fs.data"), 6, "3000 bytes in 512-byte blocks");
    let e = e.remount();
    assert_eq!(e.fs.block_size(), 512);
    assert_eq!(
        get(&e, "/s"),
        (0..3000u32).map(|i| i as u8).collect::<Vec<_>>()
    );
    assert_eq!(e.p.stat(b"/h").expect("stat").nlink, 2);
    assert_eq!(e.p.getxattr(b"/d/f", b"user.k").expect("xattr"), b"v");
    assert_eq!(e.p.stat(b"/d").expect("stat").perm, 0o700);
    put(&e, "/after", b"ids are not reused");
    assert_ne!(
        e.p.stat(b"/after").expect("stat").ino,
        e.p.stat(b"/h").expect("stat").ino
    );
}

#[test]
fn mkfs_and_mount_validate() {
    let store = std::sync::Arc::new(fern_kv::mem::MemStore::new(fern_fs::registry()));
    let bad = fern_fs::MkfsOptions {
        block_size: 1000,
        ..Default::default()
    };
    assert_eq!(err(fern_fs::Fs::mkfs(&*store, bad)), libc::EINVAL);
    assert!(matches!(
        fern_fs::Fs::mount(store.clone()),
        Err(FsError::NotFormatted(_))
    ));
    fern_fs::Fs::mkfs(&*store, Default::default()).expect("mkfs");
    assert_eq!(
        err(fern_fs::Fs::mkfs(&*store, Default::default())),
        libc::EEXIST
    );
}

#[test]
fn corrupt_values_are_errors_not_panics() {
    let e = env();
    put(&e, "/f", b"x");
    let t = fern_kv::KvStore::tree(&*e.store, "fs.dentry").expect("tree");
    let mut b = fern_kv::WriteBatch::new();
    b.put(
        t,
        fern_fs::schema::named_key(fern_fs::InodeId::ROOT, b"f"),
        vec![1, 2, 3],
    );
    b.put(
        t,
        fern_fs::schema::named_key(fern_fs::InodeId::ROOT, b"g"),
        vec![9; 100],
    );
    fern_kv::KvStore::write(&*e.store, b, fern_kv::WriteOptions::NO_SYNC).expect("corrupt");
    assert_eq!(err(e.p.stat(b"/f")), libc::EIO);
    assert_eq!(err(e.p.stat(b"/g")), libc::EIO);
    assert_eq!(err(e.p.read_dir(b"/")), libc::EIO);
}

#[test]
fn statfs_and_sync() {
    let e = env();
    let s = e.fs.statfs().expect("statfs");
    assert_eq!((s.bsize, s.namelen), (4096, 255));
    put(&e, "/f", b"x");
    let f = e.p.open(b"/f", rw()).expect("open");
    e.p.fsync(&f).expect("fsync");
    e.fs.fsync(f.ino(), true).expect("fdatasync");
    e.fs.syncfs().expect("syncfs");
    e.p.close(f).expect("close");
    assert!(e.fs.statfs().expect("statfs").files > s.files - 1);
}

#[test]
fn errno_mapping_is_posix() {
    assert_eq!(FsError::NotFound.errno(), libc::ENOENT);
    assert_eq!(FsError::NameTooLong.errno(), libc::ENAMETOOLONG);
    assert_eq!(FsError::XDev.errno(), libc::EXDEV);
    assert_eq!(
        FsError::Kv(fern_kv::KvError::Conflict).errno(),
        libc::EAGAIN
    );
    assert_eq!(FsError::corrupt("x").errno(), libc::EIO);
}

/// A full device as fern-kv-tree reports it: the engine's `NoSpace`, a `KvError::Io` of kind
/// `StorageFull`.
fn device_full() -> fern_kv::KvError {
    fern_kv::KvError::Io(std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        "device full",
    ))
}

/// A check of a store that moved under it (etcd: a commit elsewhere, a compaction under a long
/// scan) starts over instead of failing: CI once saw `fernfs fsck etcd://…` fail with
/// "transaction conflict" right after a test's leader kills.
#[test]
fn a_shared_check_starts_over_when_a_read_conflicts() {
    let store = fern_kv::faults::FailingWrites::new(crate::open_store(
        fern_fs::registry(),
        fern_kv::Limits::EMBEDDED,
    ));
    fern_fs::Fs::mkfs(&store, fern_fs::MkfsOptions::default()).expect("mkfs");
    store.fail_scans(2, || fern_kv::KvError::Conflict);
    assert!(matches!(
        fern_fs::check::check(&store),
        Err(FsError::Kv(fern_kv::KvError::Conflict))
    ));
    assert!(fern_fs::check::check_shared(&store)
        .expect("fsck")
        .is_clean());
    store.fail_scans(100, || fern_kv::KvError::Conflict);
    assert!(
        fern_fs::check::check_shared(&store).is_err(),
        "a store that never stops moving is an error, not a loop"
    );
}

/// Freeing orphans at mount is best effort: a conflict there (seen in CI on etcd, right after
/// leader kills, with another mount registering opens) leaves the orphan for a later mount
/// instead of failing the mount.
#[test]
fn a_conflict_while_freeing_orphans_does_not_fail_the_mount() {
    let (store, p) = failing_store();
    {
        let f = p.open(b"/f", rw()).expect("create");
        p.write_at(&f, 0, b"data").expect("write");
        p.unlink(b"/f").expect("unlink");
        let _abandoned = f; // never closed: an orphan for the next mount
        drop(p);
    }
    store.fail_scans(1, || fern_kv::KvError::Conflict);
    let fs = fern_fs::Fs::mount(store.clone()).expect("a conflict must not fail the mount");
    drop(fs);
    // The next mount frees it.
    let fs = fern_fs::Fs::mount(store.clone()).expect("mount");
    drop(fs);
    use fern_kv::{KvRead, KvStore};
    let orphans = KvStore::tree(&*store, "fs.orphan").expect("tree");
    let left = KvRead::scan(
        &*store,
        orphans,
        &fern_kv::KeyRange::all(),
        fern_kv::Direction::Forward,
        10,
    )
    .expect("scan");
    assert!(left.is_empty(), "freed by the later mount: {left:?}");
}

/// A formatted store whose failures a test switches on, and a mount of it.
fn failing_store() -> (
    std::sync::Arc<fern_kv::faults::FailingWrites>,
    fern_fs::path::PathFs,
) {
    let store = std::sync::Arc::new(fern_kv::faults::FailingWrites::new(crate::open_store(
        fern_fs::registry(),
        fern_kv::Limits::EMBEDDED,
    )));
    fern_fs::Fs::mkfs(&*store, fern_fs::MkfsOptions::default()).expect("mkfs");
    let fs = std::sync::Arc::new(fern_fs::Fs::mount(store.clone()).expect("mount"));
    (store, fern_fs::path::PathFs::new(fs, fern_fs::Cred::root()))
}

#[test]
fn storage_full_is_enospc() {
    let (store, p) = failing_store();
    let f = p.open(b"/f", rw()).expect("create");
    store.fail_with(Some(device_full));
    assert_eq!(err(p.write_at(&f, 0, b"data")), libc::ENOSPC);
    assert_eq!(err(p.ftruncate(&f, 100)), libc::ENOSPC);
    store.fail_with(None);
    p.write_at(&f, 0, b"data").expect("space again");
    p.close(f).expect("close");
    let io = |kind| FsError::Kv(fern_kv::KvError::Io(std::io::Error::from(kind))).errno();
    assert_eq!(io(std::io::ErrorKind::StorageFull), libc::ENOSPC);
    assert_eq!(io(std::io::ErrorKind::InvalidData), libc::EIO);
}

#[test]
fn statfs_counts_inodes_and_store_space() {
    let e = env();
    let used = |s: &fern_fs::StatFs| s.files.checked_sub(s.ffree).expect("ffree <= files");
    let s0 = e.fs.statfs().expect("statfs");
    assert_eq!(used(&s0), 1, "a new file system holds the root only");
    for i in 0..10 {
        put(&e, &format!("/f{i}"), &[7u8; 5000]);
    }
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    let s1 = e.fs.statfs().expect("statfs");
    assert_eq!(
        used(&s1),
        12,
        "one inode per create, not the reserved id batch"
    );
    e.fs.syncfs().expect("sync");
    let s2 = e.fs.statfs().expect("statfs");
    // Available excludes the store's reserve for checkpoints and deletes (format.md B11).
    assert!(s2.bfree <= s2.blocks && s2.bavail <= s2.bfree);
    match fern_kv::KvStore::space_used(&*e.store) {
        // The figure is the store's own, rounded up to blocks.
        Some(bytes) => {
            assert!(bytes > 0);
            let used_blocks = s2.blocks - s2.bfree;
            let bs = u64::from(s2.bsize);
            assert!(used_blocks > 0 && used_blocks.abs_diff(bytes.div_ceil(bs)) <= 64 << 20 >> 12);
        }
        None => assert_eq!(s2.bfree, s2.blocks, "unknown space: nothing reported used"),
    }
}
