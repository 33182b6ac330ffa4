//! What operations cost in store reads and scans (the promises of docs/fs-design.md §3).

use super::*;

#[test]
fn readdirplus_is_one_scan_with_attributes() {
    let e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    for i in 0..50 {
        put(&e, &format!("/d/{i}"), &vec![1; i]);
    }
    e.p.link(b"/d/7", b"/d/zz-link").expect("link");
    let before = e.store.reads();
    let list = e.p.read_dir(b"/d").expect("read_dir");
    let reads = e.store.reads() - before;
    assert_eq!(list.len(), 51);
    assert!(list.iter().all(|d| d.attr.is_some()));
    let seven = list.iter().find(|d| d.name == b"7").expect("7");
    assert_eq!(seven.attr.expect("attr").size, 7);
    // Path resolution (1) + one scan (1) + one inode read per hard-linked entry (2). On a
    // shared store every entry is linked (its stat in the inode tree): one read each.
    let bound = if e.sole() { 5 } else { 5 + list.len() };
    assert!(reads <= bound, "listing with attributes took {reads} reads");
}

#[test]
fn writes_and_creates_do_not_read() {
    let e = env();
    e.p.mkdir(b"/fresh", 0o755).expect("mkdir");
    let dir = e.p.stat(b"/fresh").expect("stat").ino;
    e.fs.lookup(fern_fs::InodeId::ROOT, b"fresh").expect("pin");
    let cred = fern_fs::Cred::root();
    let before = e.store.reads();
    let mut handles = Vec::new();
    for i in 0..20 {
        let flags = OpenFlags {
            write: true,
            exclusive: true,
            ..OpenFlags::default()
        };
        let (_, fh) =
            e.fs.create(&cred, dir, format!("f{i}").as_bytes(), 0o644, flags)
                .expect("create");
        handles.push(fh);
    }
    // The first create reserves an id batch (one read); no create reads an entry — on a
    // sole writer, which knows the names of a directory it made.
    assert!(
        !e.sole() || e.store.reads() - before <= 1,
        "creates in a fresh directory read {}",
        e.store.reads() - before
    );
    let before = e.store.reads();
    for (i, fh) in handles.iter().enumerate() {
        e.fs.write(*fh, (i * 1000) as u64, b"small unaligned write")
            .expect("write");
    }
    // On a shared store each write reads the file's stat (another mount may have changed it).
    assert_eq!(
        e.store.reads() - before,
        if e.sole() { 0 } else { handles.len() },
        "small writes are blind upserts"
    );
    for fh in handles {
        e.fs.release(fh).expect("release");
    }
    assert_eq!(err(e.fs.lookup(dir, b"nope")), libc::ENOENT);
}

#[test]
fn rename_of_a_directory_costs_the_same_whatever_it_holds() {
    let e = env();
    let mut reads = Vec::new();
    for (i, n) in [10usize, 2000].into_iter().enumerate() {
        let (a, b) = (format!("/a{i}"), format!("/b{i}"));
        e.p.mkdir(a.as_bytes(), 0o755).expect("mkdir");
        e.p.mkdir(b.as_bytes(), 0o755).expect("mkdir");
        e.p.mkdir(format!("{a}/big").as_bytes(), 0o755)
            .expect("mkdir");
        for j in 0..n {
            e.p.mknod(format!("{a}/big/f{j}").as_bytes(), 0o100644, 0)
                .expect("mknod");
        }
        let before = e.store.reads();
        e.p.rename(
            format!("{a}/big").as_bytes(),
            format!("{b}/big").as_bytes(),
            0,
        )
        .expect("rename");
        reads.push(e.store.reads() - before);
        assert_eq!(
            e.p.read_dir(format!("{b}/big").as_bytes())
                .expect("list")
                .len(),
            n
        );
    }
    assert_eq!(reads[0], reads[1], "reads of a rename: {reads:?}");
}

/// Issue 13 (fernfs's request path): a small read is point reads, not a range scan; a node
/// this mount made answers the kernel's `security.capability` check, listxattr and chmod's
/// ACL check without a read; rmdir of a directory this mount made checks emptiness without
/// a scan. Each still sees what is stored once it changes. On a store other mounts write
/// (etcd) none of this may be remembered: there every check reads, and only the answers are
/// checked.
#[test]
fn small_reads_xattr_checks_and_own_rmdir_neither_read_nor_scan_needlessly() {
    let e = env();
    let sole = e.sole();
    let cheap = e.store.inner.point_reads_cheap();
    e.p.mkdir(b"/fresh", 0o755).expect("mkdir");
    let dir = e.p.stat(b"/fresh").expect("stat").ino;
    e.fs.lookup(fern_fs::InodeId::ROOT, b"fresh").expect("pin");
    let cred = fern_fs::Cred::root();
    let flags = OpenFlags {
        write: true,
        exclusive: true,
        ..OpenFlags::default()
    };
    let (f, fh) = e.fs.create(&cred, dir, b"f", 0o644, flags).expect("create");
    let bs = 4096usize;
    let data: Vec<u8> = (0..3 * bs + 100).map(|i| (i % 251) as u8).collect();
    e.fs.write(fh, 0, &data).expect("write");
    let scans = e.store.scans();
    let got = e.fs.read(f.ino, 100, 3 * bs as u32).expect("read");
    assert_eq!(got, data[100..100 + 3 * bs]);
    if cheap {
        assert_eq!(e.store.scans() - scans, 0, "a 4-block read scanned");
    }
    // A store with a round trip per read (etcd) gets one scan instead of four reads.
    e.store
        .remote
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (reads, scans) = (e.store.reads(), e.store.scans());
    let got = e.fs.read(f.ino, 100, 3 * bs as u32).expect("read");
    assert_eq!(got, data[100..100 + 3 * bs]);
    // The stat comes from this mount's stat mirror where it is the only writer.
    assert_eq!(
        (e.store.reads() - reads, e.store.scans() - scans),
        (if sole { 1 } else { 2 }, 1),
        "a remote store's read: the stat (unless mirrored) and one scan"
    );
    e.store
        .remote
        .store(false, std::sync::atomic::Ordering::SeqCst);

    let reads = e.store.reads();
    assert_eq!(
        err(e.fs.getxattr(f.ino, b"security.capability")),
        libc::ENODATA
    );
    assert!(e.fs.listxattr(f.ino).expect("listxattr").is_empty());
    let chmod = SetAttr {
        mode: Some(0o640),
        ..SetAttr::default()
    };
    e.fs.set_attributes_as(&cred, f.ino, &chmod).expect("chmod");
    if sole {
        assert_eq!(
            e.store.reads() - reads,
            0,
            "xattr checks of a node made here read the store"
        );
    } else {
        assert!(
            e.store.reads() - reads >= 3,
            "a shared store's xattr checks must read what other mounts may have set"
        );
    }
    // Once attributes exist they are read: a named entry makes the ACL stored, and chmod
    // rewrites its mask.
    e.fs.setxattr(f.ino, b"user.k", b"v", 0).expect("setxattr");
    assert_eq!(e.fs.getxattr(f.ino, b"user.k").expect("getxattr"), b"v");
    let acl = acl_value(&[
        (1, 6, NONE),
        (2, 6, 1000),
        (4, 4, NONE),
        (0x10, 6, NONE),
        (0x20, 4, NONE),
    ]);
    e.fs.setxattr(f.ino, ACL_A, &acl, 0)
        .expect("set access ACL");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    e.fs.set_attributes_as(&cred, f.ino, &chmod).expect("chmod");
    let masked = acl_value(&[
        (1, 6, NONE),
        (2, 6, 1000),
        (4, 4, NONE),
        (0x10, 0, NONE),
        (0x20, 0, NONE),
    ]);
    assert_eq!(e.fs.getxattr(f.ino, ACL_A).expect("ACL"), masked);
    e.fs.release(fh).expect("release");

    e.fs.mkdir(&cred, dir, b"sub", 0o755).expect("mkdir sub");
    let sub = e.fs.lookup(dir, b"sub").expect("lookup sub");
    let (_, g) =
        e.fs.create(&cred, sub.ino, b"g", 0o644, flags)
            .expect("create g");
    e.fs.release(g).expect("release g");
    let scans = e.store.scans();
    assert_eq!(err(e.fs.rmdir(dir, b"sub")), libc::ENOTEMPTY);
    e.fs.unlink(sub.ino, b"g").expect("unlink");
    e.fs.rmdir(dir, b"sub").expect("rmdir");
    if sole {
        assert_eq!(
            e.store.scans() - scans,
            0,
            "rmdir of a directory made here scanned"
        );
    }
}

/// The stat mirror (docs/fs-design.md §4): on a store this mount alone writes, the attributes of
/// a file it created or looked up are answered from memory — getattr, setattr's reply (untar's
/// utime and chmod, F10) and read's size check read nothing — and every answer is what a fresh
/// mount reads from the store; unlink after a lookup (rm -r, F9b) does not read the entry
/// again. On a shared store (etcd) each of them reads.
#[test]
fn stat_mirror_answers_getattr_setattr_read_and_unlink_without_reading() {
    let e = env();
    let sole = fern_kv::KvStore::session(&*e.store)
        .expect("session")
        .is_none();
    let cred = fern_fs::Cred::root();
    let flags = OpenFlags {
        write: true,
        exclusive: true,
        ..OpenFlags::default()
    };
    let root = fern_fs::InodeId::ROOT;
    let (f, fh) =
        e.fs.create(&cred, root, b"m", 0o644, flags)
            .expect("create");
    e.fs.write(fh, 0, b"hello").expect("write");
    let fresh = || {
        let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
        ro.lookup(root, b"m").expect("fresh lookup")
    };
    let reads = e.store.reads();
    let utime = SetAttr {
        atime: Some(TimeSet::At(Timespec { sec: 7, nsec: 8 })),
        mtime: Some(TimeSet::At(Timespec { sec: 9, nsec: 10 })),
        ..SetAttr::default()
    };
    let a = e.fs.setattr(f.ino, &utime).expect("utime");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let b = e.fs.setattr(f.ino, &chmod).expect("chmod");
    let c = e.fs.getattr(f.ino).expect("getattr");
    assert_eq!(e.fs.read(f.ino, 0, 100).expect("read"), b"hello");
    let used = e.store.reads() - reads;
    assert_eq!(b, c);
    assert_eq!(
        (a.mtime, a.size, b.perm),
        (Timespec { sec: 9, nsec: 10 }, 5, 0o600)
    );
    // On a shared store the read's atime is written lazily (fern-fs atime.rs): a sync
    // writes it, after which this mount and the store must agree.
    e.fs.syncfs().expect("sync");
    let d = e.fs.getattr(f.ino).expect("getattr");
    assert_eq!(d, fresh(), "the mirror differs from the store");
    if sole {
        // The read's one point read is its data block.
        assert_eq!(used, 1, "setattr, getattr or read read the stat");
    } else {
        assert!(
            used >= 4,
            "a shared store's attributes must be read each time"
        );
    }
    e.fs.release(fh).expect("release");

    // After a remount, a readdirplus seeds it (os.walk then read, F3) ...
    let e = e.remount();
    let dh = e.fs.opendir(root).expect("opendir");
    let listed = e.fs.readdir(dh, 0, 100, true).expect("readdirplus");
    e.fs.releasedir(dh).expect("releasedir");
    let m = listed
        .iter()
        .find(|(_, d)| d.name == b"m")
        .and_then(|(_, d)| d.attr)
        .expect("m listed with attributes");
    let reads = e.store.reads();
    assert_eq!(e.fs.getattr(m.ino).expect("getattr"), m);
    if sole {
        assert_eq!(e.store.reads() - reads, 0, "a listed stat was read again");
    }
    e.fs.forget(m.ino, 1);
    // ... and so does a lookup: getattr and a setattr reply read nothing.
    let g = e.fs.lookup(root, b"m").expect("lookup");
    let reads = e.store.reads();
    let h = e.fs.getattr(g.ino).expect("getattr");
    let i = e.fs.setattr(g.ino, &utime).expect("utime");
    if sole {
        assert_eq!(
            e.store.reads() - reads,
            0,
            "a looked-up stat was read again"
        );
    }
    assert_eq!(g, h);
    let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
    assert_eq!(i, ro.lookup(root, b"m").expect("fresh lookup"));

    // rm's unlink after its lookup: the entry is known exactly, so it is not read again.
    let reads = e.store.reads();
    e.fs.unlink(root, b"m").expect("unlink");
    if sole {
        assert_eq!(e.store.reads() - reads, 0, "unlink re-read the entry");
    }
    let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
    assert_eq!(err(ro.lookup(root, b"m")), libc::ENOENT);
    // A shared store answers ESTALE for an inode freed here (the kernel then looks the name
    // up again, in case another mount reused it); a sole writer knows it is gone.
    let gone = if sole { libc::ENOENT } else { libc::ESTALE };
    assert_eq!(err(e.fs.getattr(g.ino)), gone);
}

/// A readdirplus answers from its listing's own read-ahead scan while nothing has changed
/// since that scan (F3's `os.walk` read every listed entry a second time: one point read per
/// file, docs/fs-design.md §8), and reads the entry again once something has: a write
/// between two readdirplus requests of one listing shows in the second.
#[test]
fn readdirplus_answers_from_its_scan_unless_something_changed_since() {
    let e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    for i in 0..20u8 {
        let path = format!("/d/f{i:02}");
        let f =
            e.p.open(path.as_bytes(), OpenOptions::create_write(0o644))
                .expect("create");
        e.p.write_at(&f, 0, &vec![i; usize::from(i) + 1])
            .expect("write");
        e.p.close(f).expect("close");
    }
    // Cold: no stat mirrored, nothing pinned.
    let e = e.remount();
    let sole = e.sole();
    let dir =
        e.fs.lookup(fern_fs::InodeId::ROOT, b"d")
            .expect("lookup")
            .ino;
    let dh = e.fs.opendir(dir).expect("opendir");
    let first = e.fs.readdir(dh, 0, 5, true).expect("readdirplus");
    assert_eq!(first.len(), 5);
    // Served from the read-ahead of the first request: no scan and, where this mount is the
    // only writer, no read either.
    let (reads, scans) = (e.store.reads(), e.store.scans());
    let second = e.fs.readdir(dh, 5, 5, true).expect("readdirplus");
    assert_eq!(second.len(), 5);
    assert_eq!(e.store.scans() - scans, 0);
    if sole {
        assert_eq!(e.store.reads() - reads, 0, "a listed entry was read again");
    }
    let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
    ro.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup");
    for (_, d) in first.iter().chain(&second) {
        let a = d.attr.expect("attributes");
        assert_eq!(a, ro.lookup(dir, &d.name).expect("lookup"), "{:?}", d.name);
    }
    // Something changes after the scan: a listed-but-not-yet-served file grows.
    let served: Vec<Vec<u8>> = first
        .iter()
        .chain(&second)
        .map(|(_, d)| d.name.clone())
        .collect();
    let victim = (0..20u8)
        .map(|i| format!("f{i:02}").into_bytes())
        .find(|n| !served.contains(n))
        .expect("an unserved name");
    let mut path = b"/d/".to_vec();
    path.extend_from_slice(&victim);
    let f =
        e.p.open(&path, OpenOptions::write_only(false, 0))
            .expect("open");
    e.p.write_at(&f, 0, &[7u8; 1000]).expect("write");
    e.p.close(f).expect("close");
    let rest = e.fs.readdir(dh, 10, 100, true).expect("readdirplus");
    assert_eq!(rest.len(), 10);
    let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
    ro.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup");
    for (_, d) in &rest {
        let a = d.attr.expect("attributes");
        assert_eq!(a, ro.lookup(dir, &d.name).expect("lookup"), "{:?}", d.name);
        if d.name == victim {
            assert_eq!(a.size, 1000, "the write after the scan is not shown");
        }
    }
    assert!(rest.iter().any(|(_, d)| d.name == victim));
    e.fs.releasedir(dh).expect("releasedir");
}

/// Unlinking a file of a few blocks deletes them one by one (D1 bounds them by its size): a
/// range delete stays in the engine's buffers until flushed, and every point read below it
/// checks it. Larger files keep the one range delete; either way no data row is left. (The
/// files are opened by path and closed, so this mount forgets them: their xattrs are deleted
/// too, by a range delete each.)
#[test]
fn unlinking_a_small_file_deletes_its_blocks_without_a_range_delete() {
    let e = env();
    let bs = e.fs.block_size() as usize;
    put(&e, "/empty", &[]);
    put(&e, "/small", &vec![1; 3 * bs + 5]);
    put(&e, "/big", &vec![2; 20 * bs]);
    let mut cost = Vec::new();
    for name in ["/empty", "/small", "/big"] {
        let before = e.store.range_deletes();
        e.p.unlink(name.as_bytes()).expect("unlink");
        cost.push(e.store.range_deletes() - before);
    }
    // One range delete is the file's xattrs; the big file's data is the second.
    assert_eq!(
        cost,
        vec![1, 1, 2],
        "range deletes per unlink: empty, 4 blocks, 20 blocks"
    );
    assert_eq!(e.keys_in("fs.data"), 0, "data rows left behind");
}

/// An unlink deletes only rows that may exist (fs-design.md §9 "Unlink"): for a file this
/// mount made, never gave an xattr and still knows (the kernel holds a lookup), its entry,
/// its parent's stat and its data rows — two trees, no range delete; not the xattr range, the
/// inode record or the orphan record, which cannot exist. A file with an xattr, or one known
/// only since a remount, still has its xattrs deleted; nothing is left behind either way.
#[test]
fn unlinking_deletes_only_rows_that_may_exist() {
    let e = env();
    let sole = e.sole();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    let dir = e.p.stat(b"/d").expect("stat").ino;
    e.fs.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup d");
    let make = |e: &common::Env, name: &[u8], xattr: bool| {
        let flags = OpenFlags {
            write: true,
            exclusive: true,
            ..OpenFlags::default()
        };
        let (attr, fh) =
            e.fs.create(&fern_fs::Cred::root(), dir, name, 0o644, flags)
                .expect("create");
        e.fs.write(fh, 0, &[7; 100]).expect("write");
        if xattr {
            e.fs.setxattr(attr.ino, b"user.k", b"v", 0)
                .expect("setxattr");
        }
        e.fs.release(fh).expect("release");
    };
    let cost = |e: &common::Env, name: &[u8]| {
        let (r, t) = (e.store.range_deletes(), e.store.trees_written());
        e.fs.unlink(dir, name).expect("unlink");
        (e.store.range_deletes() - r, e.store.trees_written() - t)
    };
    make(&e, b"plain", false);
    make(&e, b"tagged", true);
    make(&e, b"older", false);
    let (ranges, trees) = cost(&e, b"plain");
    if sole {
        assert_eq!(
            (ranges, trees),
            (0, 2),
            "a known plain file: (range deletes, trees written)"
        );
    } else {
        // Another mount may have set an xattr, and every entry is linked (docs/distributed.md).
        assert_eq!(ranges, 1, "a shared store's unlink must delete the xattrs");
    }
    assert_eq!(cost(&e, b"tagged").0, 1, "a file with an xattr");
    assert_eq!(e.keys_in("fs.xattr"), 0, "xattrs left behind");
    let e = e.remount();
    e.fs.lookup(fern_fs::InodeId::ROOT, b"d").expect("lookup d");
    e.fs.lookup(dir, b"older").expect("lookup older");
    assert_eq!(cost(&e, b"older").0, 1, "a file known only since a remount");
    assert_eq!(e.keys_in("fs.data"), 0, "data rows left behind");
    assert_eq!(e.keys_in("fs.xattr"), 0, "xattrs left behind");
    if sole {
        assert_eq!(e.keys_in("fs.inode"), 1, "only the root's record is left");
    }
}

#[test]
fn a_directory_changed_by_create_unlink_mkdir_rmdir_or_rename_answers_getattr_without_reading() {
    let e = env();
    let cred = fern_fs::Cred::root();
    let root = fern_fs::InodeId::ROOT;
    let d = e.fs.mkdir(&cred, root, b"d", 0o755).expect("mkdir").ino;
    e.fs.getattr(d).expect("getattr"); // the mirror holds d's stat from here on
    let fresh = || {
        let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
        ro.lookup(root, b"d").expect("fresh lookup")
    };
    let flags = OpenFlags {
        write: true,
        exclusive: true,
        ..OpenFlags::default()
    };
    type Change<'a> = Box<dyn Fn() + 'a>;
    e.fs.getattr(root).expect("getattr");
    let changes: [(&str, Change); 6] = [
        (
            "create",
            Box::new(|| {
                let (_, fh) = e.fs.create(&cred, d, b"g", 0o644, flags).expect("create");
                e.fs.release(fh).expect("release");
            }),
        ),
        (
            "rename",
            Box::new(|| e.fs.rename(d, b"g", d, b"f", 0).expect("rename")),
        ),
        (
            "mkdir",
            Box::new(|| {
                e.fs.mkdir(&cred, d, b"s", 0o755).expect("mkdir");
            }),
        ),
        ("unlink", Box::new(|| e.fs.unlink(d, b"f").expect("unlink"))),
        ("rmdir", Box::new(|| e.fs.rmdir(d, b"s").expect("rmdir"))),
        (
            "rename to another directory",
            Box::new(|| {
                e.fs.mkdir(&cred, d, b"t", 0o755).expect("mkdir");
                e.fs.rename(d, b"t", root, b"t", 0).expect("rename");
            }),
        ),
    ];
    // A getattr that must be answered by the mirror (on a sole-writer store).
    let getattr_reading_nothing = |ino, what: &str| {
        let reads = e.store.reads();
        let a = e.fs.getattr(ino).expect("getattr");
        let read = e.store.reads() - reads;
        assert!(!e.sole() || read == 0, "getattr after {what} read the stat");
        a
    };
    for (what, change) in changes {
        std::thread::sleep(std::time::Duration::from_millis(2)); // a new mtime each time
        change();
        let a = getattr_reading_nothing(d, what);
        assert_eq!(a, fresh(), "after {what} the mirror differs from the store");
    }
    // The other parent of the last rename too (its nlink went up by one).
    let r = getattr_reading_nothing(root, "a rename into it");
    let ro = Fs::mount_read_only(e.store.clone()).expect("mount");
    assert_eq!(r, ro.getattr(root).expect("fresh getattr"));
}
