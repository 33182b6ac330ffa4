//! POSIX edge cases, one test per rule, through the path API and the inode API.

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use common::env;
use fern_fs::path::OpenOptions;
use fern_fs::FALLOC_FL_ZERO_RANGE;
use fern_fs::{FileType, Fs, FsError, OpenFlags, SetAttr, TimeSet, Timespec};
use fern_fs::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, RENAME_EXCHANGE, RENAME_NOREPLACE};

fn rw() -> OpenOptions {
    OpenOptions::create_write(0o644)
}

fn put(e: &common::Env, path: &str, data: &[u8]) {
    let f = e.p.open(path.as_bytes(), rw()).expect("open");
    e.p.write_at(&f, 0, data).expect("write");
    e.p.close(f).expect("close");
}

fn get(e: &common::Env, path: &str) -> Vec<u8> {
    let f =
        e.p.open(path.as_bytes(), OpenOptions::default())
            .expect("open");
    let v = e.p.read_at(&f, 0, 1 << 20).expect("read");
    e.p.close(f).expect("close");
    v
}

fn err<T: std::fmt::Debug>(r: Result<T, FsError>) -> i32 {
    r.expect_err("expected an error").errno()
}

#[test]
fn write_read_round_trip_and_sparse_holes() {
    let e = env();
    put(&e, "/f", b"hello");
    assert_eq!(get(&e, "/f"), b"hello");
    let f = e.p.open(b"/f", rw()).expect("open");
    e.p.write_at(&f, 10_000, b"xyz").expect("sparse write");
    let all = e.p.read_at(&f, 0, 20_000).expect("read");
    assert_eq!(all.len(), 10_003);
    assert_eq!(&all[..5], b"hello");
    assert!(
        all[5..10_000].iter().all(|b| *b == 0),
        "holes read as zeros"
    );
    assert_eq!(&all[10_000..], b"xyz");
    // Block 1 is a hole: only blocks 0 and 2 are stored, and the last one at its real length.
    assert_eq!(e.keys_in("fs.data"), 2);
    assert_eq!(e.p.read_at(&f, 10_003, 10).expect("read at eof"), b"");
    assert_eq!(
        e.p.read_at(&f, 9_998, 4).expect("read across hole"),
        b"\0\0xy"
    );
    e.p.close(f).expect("close");
}

#[test]
fn unaligned_writes_across_blocks() {
    let e = env();
    let f = e.p.open(b"/f", rw()).expect("open");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    e.p.write_at(&f, 4095, &data).expect("write");
    e.p.write_at(&f, 8190, b"ZZZZ").expect("overwrite");
    let mut expect = vec![0u8; 4095];
    expect.extend_from_slice(&data);
    expect[8190..8194].copy_from_slice(b"ZZZZ");
    assert_eq!(e.p.read_at(&f, 0, 1 << 20).expect("read"), expect);
    e.p.close(f).expect("close");
}

#[test]
fn create_exclusive_and_not() {
    let e = env();
    put(&e, "/f", b"data");
    let mut excl = rw();
    excl.flags.exclusive = true;
    assert_eq!(err(e.p.open(b"/f", excl)), libc::EEXIST);
    let f =
        e.p.open(b"/f", rw())
            .expect("non-exclusive create opens the existing file");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/f"), b"data", "no truncation without O_TRUNC");
    let mut trunc = rw();
    trunc.flags.truncate = true;
    let f = e.p.open(b"/f", trunc).expect("open O_TRUNC");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/f"), b"");
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    assert_eq!(err(e.p.open(b"/d", rw())), libc::EISDIR);
    assert_eq!(err(e.p.open(b"/nodir/f", rw())), libc::ENOENT);
    assert_eq!(err(e.p.open(b"/f/x", rw())), libc::ENOTDIR);
}

#[test]
fn name_length_limit() {
    let e = env();
    let ok = format!("/{}", "a".repeat(255));
    let long = format!("/{}", "a".repeat(256));
    put(&e, &ok, b"");
    assert_eq!(err(e.p.open(long.as_bytes(), rw())), libc::ENAMETOOLONG);
    assert_eq!(err(e.p.mkdir(long.as_bytes(), 0o755)), libc::ENAMETOOLONG);
    assert_eq!(err(e.p.stat(long.as_bytes())), libc::ENAMETOOLONG);
}

#[test]
fn mknod_types() {
    let e = env();
    let a = e.p.mknod(b"/fifo", 0o010644, 0).expect("fifo");
    assert_eq!(a.kind, FileType::Fifo);
    let a = e.p.mknod(b"/sock", 0o140644, 0).expect("socket");
    assert_eq!(a.kind, FileType::Socket);
    let a = e.p.mknod(b"/chr", 0o020644, 0x0501).expect("char device");
    assert_eq!((a.kind, a.rdev), (FileType::CharDevice, 0x0501));
    let a = e.p.mknod(b"/blk", 0o060644, 0x0802).expect("block device");
    assert_eq!(e.p.stat(b"/blk").expect("stat"), a);
    let a = e.p.mknod(b"/reg", 0o100600, 0).expect("regular");
    assert_eq!((a.kind, a.perm), (FileType::Regular, 0o600));
    assert_eq!(err(e.p.mknod(b"/dir", 0o040755, 0)), libc::EINVAL);
    assert_eq!(err(e.p.mknod(b"/fifo", 0o010644, 0)), libc::EEXIST);
}

#[test]
fn mkdir_rmdir_and_link_counts() {
    let e = env();
    assert_eq!(e.p.stat(b"/").expect("root").nlink, 2);
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    e.p.mkdir(b"/d/e", 0o755).expect("mkdir");
    put(&e, "/d/f", b"x");
    assert_eq!(e.p.stat(b"/").expect("root").nlink, 3);
    assert_eq!(e.p.stat(b"/d").expect("d").nlink, 3, "2 + one subdirectory");
    assert_eq!(err(e.p.mkdir(b"/d", 0o755)), libc::EEXIST);
    assert_eq!(err(e.p.rmdir(b"/d")), libc::ENOTEMPTY);
    assert_eq!(err(e.p.rmdir(b"/d/f")), libc::ENOTDIR);
    assert_eq!(err(e.p.unlink(b"/d/e")), libc::EISDIR);
    assert_eq!(err(e.p.rmdir(b"/nope")), libc::ENOENT);
    e.p.rmdir(b"/d/e").expect("rmdir");
    e.p.unlink(b"/d/f").expect("unlink");
    assert_eq!(e.p.stat(b"/d").expect("d").nlink, 2);
    e.p.rmdir(b"/d").expect("rmdir empty");
    assert_eq!(e.p.stat(b"/").expect("root").nlink, 2);
    assert_eq!(err(e.p.stat(b"/d")), libc::ENOENT);
    assert_eq!(e.keys_in("fs.dentry"), 0);
    assert_eq!(e.keys_in("fs.data"), 0, "unlink frees the data");
}

#[test]
fn rename_replace_noreplace_exchange() {
    let e = env();
    put(&e, "/a", b"A");
    put(&e, "/b", b"B");
    e.p.rename(b"/a", b"/b", 0).expect("rename over a file");
    assert_eq!(get(&e, "/b"), b"A");
    assert_eq!(err(e.p.stat(b"/a")), libc::ENOENT);
    assert_eq!(e.keys_in("fs.data"), 1, "the replaced file's data is freed");
    put(&e, "/c", b"C");
    assert_eq!(
        err(e.p.rename(b"/c", b"/b", RENAME_NOREPLACE)),
        libc::EEXIST
    );
    e.p.rename(b"/c", b"/new", RENAME_NOREPLACE)
        .expect("noreplace to a free name");
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    put(&e, "/d/inner", b"I");
    e.p.rename(b"/new", b"/d", RENAME_EXCHANGE)
        .expect("exchange file and directory");
    assert_eq!(get(&e, "/d"), b"C");
    assert_eq!(get(&e, "/new/inner"), b"I");
    assert_eq!(
        err(e.p.rename(b"/b", b"/zzz", RENAME_EXCHANGE)),
        libc::ENOENT
    );
    assert_eq!(
        err(e.p.rename(b"/b", b"/d", RENAME_EXCHANGE | RENAME_NOREPLACE)),
        libc::EINVAL
    );
    assert_eq!(err(e.p.rename(b"/missing", b"/x", 0)), libc::ENOENT);
    e.p.rename(b"/b", b"/b", 0)
        .expect("rename onto itself is a no-op");
    assert_eq!(get(&e, "/b"), b"A");
}

#[test]
fn rename_directory_rules() {
    let e = env();
    e.p.mkdir(b"/a", 0o755).expect("mkdir");
    e.p.mkdir(b"/a/b", 0o755).expect("mkdir");
    e.p.mkdir(b"/empty", 0o755).expect("mkdir");
    e.p.mkdir(b"/full", 0o755).expect("mkdir");
    put(&e, "/full/f", b"");
    put(&e, "/file", b"");
    assert_eq!(
        err(e.p.rename(b"/a", b"/a/b/c", 0)),
        libc::EINVAL,
        "into own subtree"
    );
    assert_eq!(
        err(e.p.rename(b"/a", b"/a/c", 0)),
        libc::EINVAL,
        "into itself"
    );
    assert_eq!(err(e.p.rename(b"/a", b"/full", 0)), libc::ENOTEMPTY);
    assert_eq!(err(e.p.rename(b"/a", b"/file", 0)), libc::ENOTDIR);
    assert_eq!(err(e.p.rename(b"/file", b"/empty", 0)), libc::EISDIR);
    assert_eq!(
        err(e.p.rename(b"/a", b"/a/b", RENAME_EXCHANGE)),
        libc::EINVAL
    );
    e.p.rename(b"/a", b"/empty", 0)
        .expect("directory over empty directory");
    assert!(
        e.p.stat(b"/empty/b").is_ok(),
        "children move with their directory"
    );
    assert_eq!(
        e.p.stat(b"/").expect("root").nlink,
        4,
        "root: a and empty merged into one"
    );
    e.p.rename(b"/empty", b"/full/moved", 0)
        .expect("move across directories");
    assert_eq!(e.p.stat(b"/full").expect("full").nlink, 3);
    assert_eq!(e.p.stat(b"/").expect("root").nlink, 3);
    assert_eq!(
        e.p.stat(b"/full/moved/b/..").expect("dotdot").ino,
        e.p.stat(b"/full/moved").expect("moved").ino
    );
    e.p.rename(b"/full/moved/b", b"/b", 0).expect("up and out");
    assert_eq!(err(e.p.rename(b"/full", b"/full/moved/x", 0)), libc::EINVAL);
}

#[test]
fn hard_links_share_an_inode() {
    let e = env();
    put(&e, "/f", b"shared");
    let a = e.p.link(b"/f", b"/g").expect("link");
    assert_eq!(a.nlink, 2);
    assert_eq!(
        e.p.stat(b"/f").expect("f").ino,
        e.p.stat(b"/g").expect("g").ino
    );
    let f = e.p.open(b"/g", rw()).expect("open");
    e.p.write_at(&f, 6, b"!").expect("write");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/f"), b"shared!");
    assert_eq!(
        e.p.stat(b"/f").expect("f").size,
        7,
        "stat follows the inode, not the entry"
    );
    assert_eq!(err(e.p.link(b"/f", b"/g")), libc::EEXIST);
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    assert_eq!(err(e.p.link(b"/d", b"/d2")), libc::EPERM);
    e.p.rename(b"/f", b"/g", 0)
        .expect("rename between links of one inode is a no-op");
    assert!(e.p.stat(b"/f").is_ok());
    e.p.unlink(b"/f").expect("unlink one");
    assert_eq!(e.p.stat(b"/g").expect("g").nlink, 1);
    assert_eq!(get(&e, "/g"), b"shared!");
    e.p.unlink(b"/g").expect("unlink last");
    // On a shared store /d's stat lives in the inode tree too (docs/distributed.md §7 rule 2).
    assert_eq!(
        e.keys_in("fs.data") + e.keys_in("fs.inode"),
        if e.sole() { 1 } else { 2 },
        "only the root's (and /d's) record is left"
    );
}

#[test]
fn symlinks_and_loops() {
    let e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    put(&e, "/d/f", b"through");
    let a = e.p.symlink(b"/d", b"/l").expect("symlink");
    assert_eq!((a.kind, a.size), (FileType::Symlink, 2));
    assert_eq!(e.p.readlink(b"/l").expect("readlink"), b"/d");
    assert_eq!(get(&e, "/l/f"), b"through");
    e.p.symlink(b"d/f", b"/rel").expect("relative symlink");
    assert_eq!(get(&e, "/rel"), b"through");
    assert_eq!(e.p.lstat(b"/rel").expect("lstat").kind, FileType::Symlink);
    e.p.symlink(b"/y", b"/x").expect("symlink");
    e.p.symlink(b"/x", b"/y").expect("symlink");
    assert_eq!(err(e.p.stat(b"/x")), libc::ELOOP);
    assert_eq!(err(e.p.readlink(b"/d")), libc::EINVAL);
    assert_eq!(err(e.p.symlink(b"", b"/empty")), libc::ENOENT);
    assert_eq!(
        err(e.p.symlink(&[b'a'; 4096], b"/long")),
        libc::ENAMETOOLONG
    );
}

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

#[test]
fn truncate_down_then_up_reads_zeros() {
    let e = env();
    put(&e, "/f", &[9u8; 10_000]);
    e.p.truncate(b"/f", 5000).expect("shrink");
    assert_eq!(
        e.keys_in("fs.data"),
        2,
        "blocks past the end are range-deleted"
    );
    e.p.truncate(b"/f", 12_000).expect("grow");
    let v = get(&e, "/f");
    assert_eq!(v.len(), 12_000);
    assert!(v[..5000].iter().all(|b| *b == 9));
    assert!(
        v[5000..].iter().all(|b| *b == 0),
        "no stale bytes come back"
    );
    e.p.truncate(b"/f", 0).expect("to zero");
    assert_eq!(e.keys_in("fs.data"), 0);
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    assert_eq!(err(e.p.truncate(b"/d", 0)), libc::EISDIR);
}

#[test]
fn fallocate_modes() {
    let e = env();
    put(&e, "/f", &[5u8; 3 * 4096]);
    let f = e.p.open(b"/f", rw()).expect("open");
    e.p.fallocate(&f, 0, 0, 20_000).expect("mode 0");
    assert_eq!(e.p.stat(b"/f").expect("stat").size, 20_000);
    e.p.fallocate(&f, FALLOC_FL_KEEP_SIZE, 0, 40_000)
        .expect("keep size");
    assert_eq!(e.p.stat(b"/f").expect("stat").size, 20_000);
    e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 8192)
        .expect("punch");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 20_000);
    assert!(v[..100].iter().all(|b| *b == 5));
    assert!(v[100..8292].iter().all(|b| *b == 0));
    assert!(v[8292..12_288].iter().all(|b| *b == 5));
    assert_eq!(e.keys_in("fs.data"), 2, "the fully punched block is gone");
    assert_eq!(
        err(e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE, 0, 1)),
        libc::EOPNOTSUPP
    );
    // COLLAPSE_RANGE (8) and INSERT_RANGE (0x20) would shift every later block.
    assert_eq!(err(e.p.fallocate(&f, 0x08, 0, 4096)), libc::EOPNOTSUPP);
    assert_eq!(err(e.p.fallocate(&f, 0x20, 0, 4096)), libc::EOPNOTSUPP);
    assert_eq!(err(e.p.fallocate(&f, 0, 0, 0)), libc::EINVAL);
    e.p.close(f).expect("close");
}

/// Issue 12.8: FALLOC_FL_ZERO_RANGE zeroes a range (whole blocks dropped, partial edges
/// zeroed) and extends the size unless KEEP_SIZE.
#[test]
fn fallocate_zero_range() {
    let e = env();
    put(&e, "/f", &[5u8; 3 * 4096]);
    let f = e.p.open(b"/f", rw()).expect("open");
    let blocks = e.keys_in("fs.data");
    e.p.fallocate(&f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 100, 8192)
        .expect("zero range");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 3 * 4096);
    assert!(v[..100].iter().all(|b| *b == 5));
    assert!(v[100..8292].iter().all(|b| *b == 0));
    assert!(v[8292..].iter().all(|b| *b == 5));
    assert_eq!(
        e.keys_in("fs.data"),
        blocks - 1,
        "the whole block in the range is gone"
    );
    // Without KEEP_SIZE the size grows to the end of the range, which reads as zeros.
    e.p.fallocate(&f, FALLOC_FL_ZERO_RANGE, 12_000, 10_000)
        .expect("zero range past the end");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 22_000);
    assert!(v[8292..12_000].iter().all(|b| *b == 5));
    assert!(v[12_000..].iter().all(|b| *b == 0));
    assert_eq!(
        err(e.p.fallocate(
            &f,
            FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            0,
            1
        )),
        libc::EOPNOTSUPP
    );
    e.p.close(f).expect("close");
}

#[test]
fn append_writes_at_end() {
    let e = env();
    put(&e, "/log", b"one");
    let mut app = rw();
    app.flags.append = true;
    let f = e.p.open(b"/log", app).expect("open append");
    e.p.write_at(&f, 0, b",two").expect("append");
    e.p.write_at(&f, 0, b",three").expect("append");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/log"), b"one,two,three");
    let ro = e.p.open(b"/log", OpenOptions::default()).expect("open");
    assert_eq!(err(e.p.write_at(&ro, 0, b"x")), libc::EBADF);
    e.p.close(ro).expect("close");
}

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
fn chown_clears_setuid() {
    let e = env();
    put(&e, "/f", b"");
    e.p.chmod(b"/f", 0o6755).expect("chmod");
    e.p.chown(b"/f", Some(5), Some(6)).expect("chown");
    let a = e.p.stat(b"/f").expect("stat");
    assert_eq!((a.uid, a.gid, a.perm), (5, 6, 0o755));
}

/// Issue 12.4: chown drops set-id bits on every non-directory, as Linux's chown_common does
/// (set-group-id only when group-executable); a directory keeps them.
#[test]
fn chown_clears_setid_on_fifos_devices_and_sockets() {
    let e = env();
    for (path, mode) in [
        ("/fifo", 0o010000),
        ("/chr", 0o020000),
        ("/blk", 0o060000),
        ("/sock", 0o140000),
    ] {
        e.p.mknod(path.as_bytes(), mode | 0o644, 0).expect("mknod");
        e.p.chmod(path.as_bytes(), 0o6555).expect("chmod");
        e.p.chown(path.as_bytes(), Some(65534), Some(65534))
            .expect("chown");
        assert_eq!(
            e.p.stat(path.as_bytes()).expect("stat").perm,
            0o555,
            "{path}"
        );
        // Set-group-id without group-execute marks mandatory locking and stays.
        e.p.chmod(path.as_bytes(), 0o6545).expect("chmod");
        e.p.chown(path.as_bytes(), Some(1), Some(1)).expect("chown");
        assert_eq!(
            e.p.stat(path.as_bytes()).expect("stat").perm,
            0o2545,
            "{path}"
        );
    }
    e.p.mkdir(b"/d", 0o6755).expect("mkdir");
    e.p.chown(b"/d", Some(65534), Some(65534)).expect("chown");
    assert_eq!(e.p.stat(b"/d").expect("stat").perm, 0o6755);
}

#[test]
fn xattrs() {
    let e = env();
    put(&e, "/f", b"");
    assert_eq!(err(e.p.getxattr(b"/f", b"user.a")), libc::ENODATA);
    assert_eq!(
        err(e.p.setxattr(b"/f", b"user.a", b"1", fern_fs::XATTR_REPLACE)),
        libc::ENODATA
    );
    e.p.setxattr(b"/f", b"user.a", b"1", fern_fs::XATTR_CREATE)
        .expect("create");
    assert_eq!(
        err(e.p.setxattr(b"/f", b"user.a", b"2", fern_fs::XATTR_CREATE)),
        libc::EEXIST
    );
    e.p.setxattr(b"/f", b"user.a", b"2", fern_fs::XATTR_REPLACE)
        .expect("replace");
    e.p.setxattr(b"/f", b"user.b", b"", 0)
        .expect("set empty value");
    assert_eq!(e.p.getxattr(b"/f", b"user.a").expect("get"), b"2");
    assert_eq!(
        e.p.listxattr(b"/f").expect("list"),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    e.p.removexattr(b"/f", b"user.a").expect("remove");
    assert_eq!(err(e.p.removexattr(b"/f", b"user.a")), libc::ENODATA);
    assert_eq!(err(e.p.setxattr(b"/f", &[b'n'; 256], b"", 0)), libc::ERANGE);
    assert_eq!(
        err(e.p.setxattr(b"/f", b"user.big", &vec![0; 65537], 0)),
        libc::E2BIG
    );
    e.p.unlink(b"/f").expect("unlink");
    assert_eq!(
        e.keys_in("fs.xattr"),
        0,
        "unlink removes xattrs with one range delete"
    );
}

#[test]
fn readdir_cookies_survive_concurrent_deletes() {
    let e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    for i in 0..100 {
        put(&e, &format!("/d/f{i:03}"), b"");
    }
    let dir = e.p.stat(b"/d").expect("stat").ino;
    e.fs.lookup(fern_fs::InodeId::ROOT, b"d").expect("pin d");
    let fh = e.fs.opendir(dir).expect("opendir");
    let mut seen = Vec::new();
    let mut offset = 0;
    let mut deleted = std::collections::HashSet::new();
    loop {
        let page = e.fs.readdir(fh, offset, 7, false).expect("readdir");
        let Some((last, _)) = page.last() else { break };
        offset = *last;
        seen.extend(
            page.iter()
                .map(|(_, d)| String::from_utf8_lossy(&d.name).into_owned()),
        );
        // Delete one already listed and one not yet listed, between pages.
        let n = seen.len();
        for victim in [format!("f{:03}", n - 1), format!("f{:03}", (n + 3).min(99))] {
            if deleted.insert(victim.clone()) {
                e.fs.unlink(dir, victim.as_bytes()).expect("unlink");
            }
        }
    }
    let unique: std::collections::HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no entry is listed twice");
    for i in 0..100 {
        let name = format!("f{i:03}");
        if !deleted.contains(&name) {
            assert!(
                unique.contains(&name),
                "{name} was never deleted and must be listed"
            );
        }
    }
    // Seeking back to an earlier offset resumes after that entry.
    let again = e.fs.readdir(fh, 1, 1, false).expect("seek back");
    assert_eq!(again.len(), 1);
    assert!(again[0].1.name > seen[0].clone().into_bytes());
    e.fs.releasedir(fh).expect("releasedir");
}

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

#[test]
fn permission_checks() {
    use fern_fs::perm::{check_access, check_delete, check_setattr, MAY_EXEC, MAY_READ, MAY_WRITE};
    use fern_fs::Cred;
    let e = env();
    put(&e, "/f", b"");
    e.p.chown(b"/f", Some(10), Some(20)).expect("chown");
    e.p.chmod(b"/f", 0o640).expect("chmod");
    let f = e.p.stat(b"/f").expect("stat");
    let owner = Cred::user(10, 99);
    let group = Cred {
        uid: 11,
        gid: 1,
        groups: vec![20],
        umask: 0,
    };
    let other = Cred::user(12, 30);
    assert!(check_access(&f, &owner, MAY_READ | MAY_WRITE).is_ok());
    assert!(check_access(&f, &group, MAY_READ).is_ok());
    assert_eq!(err(check_access(&f, &group, MAY_WRITE)), libc::EACCES);
    assert_eq!(err(check_access(&f, &other, MAY_READ)), libc::EACCES);
    assert!(
        check_access(&f, &Cred::root(), MAY_READ | MAY_WRITE).is_ok(),
        "root reads and writes anything"
    );
    assert_eq!(
        err(check_access(&f, &Cred::root(), MAY_EXEC)),
        libc::EACCES,
        "but executes only executables"
    );
    // Owner class wins even when it grants less than the group class.
    e.p.chmod(b"/f", 0o070).expect("chmod");
    let odd = e.p.stat(b"/f").expect("stat");
    assert_eq!(
        err(check_access(
            &odd,
            &Cred {
                uid: 10,
                gid: 20,
                groups: vec![],
                umask: 0,
            },
            MAY_READ
        )),
        libc::EACCES
    );
    // Sticky directory: only the owner of the file or directory (or root) may remove.
    e.p.mkdir(b"/tmp", 0o777).expect("mkdir");
    e.p.chmod(b"/tmp", 0o1777).expect("sticky");
    let tmp = e.p.stat(b"/tmp").expect("stat");
    let victim = e.p.stat(b"/f").expect("stat");
    assert!(check_delete(&tmp, &victim, &owner).is_ok());
    assert_eq!(err(check_delete(&tmp, &victim, &other)), libc::EPERM);
    e.p.chmod(b"/tmp", 0o777).expect("not sticky");
    let plain = e.p.stat(b"/tmp").expect("stat");
    assert!(check_delete(&plain, &victim, &other).is_ok());
    e.p.chmod(b"/tmp", 0o755).expect("read-only dir");
    let ro = e.p.stat(b"/tmp").expect("stat");
    assert_eq!(err(check_delete(&ro, &victim, &other)), libc::EACCES);
    // setattr rules.
    let chmod = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    assert!(check_setattr(&victim, &owner, &chmod).is_ok());
    assert_eq!(err(check_setattr(&victim, &other, &chmod)), libc::EPERM);
    let give = SetAttr {
        uid: Some(12),
        ..SetAttr::default()
    };
    assert_eq!(
        err(check_setattr(&victim, &owner, &give)),
        libc::EPERM,
        "only root gives files away"
    );
    let chgrp = SetAttr {
        gid: Some(99),
        ..SetAttr::default()
    };
    assert!(
        check_setattr(&victim, &owner, &chgrp).is_ok(),
        "owner may chgrp to a group it is in"
    );
    let stamp = SetAttr {
        mtime: Some(TimeSet::At(Timespec::default())),
        ..SetAttr::default()
    };
    assert_eq!(err(check_setattr(&victim, &other, &stamp)), libc::EPERM);
}

fn as_user(e: &common::Env, uid: u32, gid: u32, groups: &[u32]) -> fern_fs::path::PathFs {
    let cred = fern_fs::Cred {
        uid,
        gid,
        groups: groups.to_vec(),
        umask: 0,
    };
    fern_fs::path::PathFs::new(e.fs.clone(), cred)
}

#[test]
fn setgid_directory_passes_its_group_on() {
    let e = env();
    e.p.mkdir(b"/d", 0o777).expect("mkdir");
    e.p.chown(b"/d", None, Some(50)).expect("chown");
    e.p.chmod(b"/d", 0o2777).expect("chmod g+s");
    e.p.mkdir(b"/plain", 0o777).expect("mkdir");
    let u = as_user(&e, 1000, 1000, &[]);
    let sub = u.mkdir(b"/d/sub", 0o755).expect("mkdir in setgid dir");
    assert_eq!(
        (sub.gid, sub.perm),
        (50, 0o2755),
        "a subdirectory inherits group and S_ISGID"
    );
    let deeper = u.mkdir(b"/d/sub/deeper", 0o700).expect("nested");
    assert_eq!(
        (deeper.gid, deeper.perm),
        (50, 0o2700),
        "inheritance carries down"
    );
    put_as(&u, "/d/f", 0o644);
    let f = e.p.stat(b"/d/f").expect("stat");
    assert_eq!(
        (f.uid, f.gid, f.perm),
        (1000, 50, 0o644),
        "a file takes the group only"
    );
    let l = u.symlink(b"f", b"/d/l").expect("symlink");
    assert_eq!(l.gid, 50);
    // A set-group-id program for a group its creator is not in loses the bit...
    put_as(&u, "/d/x", 0o2755);
    assert_eq!(e.p.stat(b"/d/x").expect("x").perm, 0o755);
    // ...but not for a member, nor for root, nor when it is not group-executable.
    put_as(&as_user(&e, 1000, 1000, &[50]), "/d/y", 0o2755);
    assert_eq!(e.p.stat(b"/d/y").expect("y").perm, 0o2755);
    put_as(&e.p, "/d/z", 0o2755);
    assert_eq!(e.p.stat(b"/d/z").expect("z").perm, 0o2755);
    put_as(&u, "/d/w", 0o2644);
    assert_eq!(e.p.stat(b"/d/w").expect("w").perm, 0o2644);
    // A directory without S_ISGID: the creator's group.
    assert_eq!(u.mkdir(b"/plain/s", 0o755).expect("mkdir").gid, 1000);
    // Clearing S_ISGID takes effect for the next create (the per-mount table follows chmod).
    e.p.chmod(b"/d", 0o777).expect("chmod g-s");
    assert_eq!(u.mkdir(b"/d/after", 0o755).expect("mkdir").gid, 1000);
    e.p.chmod(b"/plain", 0o2777).expect("chmod g+s");
    assert_eq!(u.mkdir(b"/plain/t", 0o755).expect("mkdir").gid, 0);
    // After a remount the rule comes from the stored mode.
    let e = e.remount();
    let u = as_user(&e, 1000, 1000, &[]);
    let again = u.mkdir(b"/d/sub/again", 0o755).expect("after remount");
    assert_eq!((again.gid, again.perm), (50, 0o2755));
}

fn put_as(p: &fern_fs::path::PathFs, path: &str, perm: u32) {
    let mut o = rw();
    o.perm = perm;
    o.flags.exclusive = true;
    let f = p.open(path.as_bytes(), o).expect("create");
    p.close(f).expect("close");
}

#[test]
fn write_and_truncate_by_non_root_clear_setid() {
    let e = env();
    let root = fern_fs::Cred::root();
    let user = fern_fs::Cred::user(1000, 1000);
    let u = as_user(&e, 1000, 1000, &[]);
    let setid = |path: &str, perm: u32| {
        put(&e, path, b"");
        e.p.chown(path.as_bytes(), Some(1000), Some(1000))
            .expect("chown");
        e.p.chmod(path.as_bytes(), perm).expect("chmod");
        // Pinned (looked up) as the kernel would before using the inode number.
        e.fs.lookup(fern_fs::InodeId::ROOT, &path.as_bytes()[1..])
            .expect("lookup")
            .ino
    };
    let perm = |path: &str| e.p.stat(path.as_bytes()).expect("stat").perm;
    // A write by a non-root caller, the owner included, clears S_ISUID and, when the file is
    // group-executable, S_ISGID.
    setid("/a", 0o6755);
    let f = u.open(b"/a", rw()).expect("open as user");
    u.write_at(&f, 0, b"x").expect("write");
    u.close(f).expect("close");
    assert_eq!(perm("/a"), 0o755);
    // Not group-executable: S_ISGID marks mandatory locking and stays.
    setid("/b", 0o6644);
    let f = u.open(b"/b", rw()).expect("open");
    u.write_at(&f, 0, b"x").expect("write");
    u.close(f).expect("close");
    assert_eq!(perm("/b"), 0o2644);
    // Root keeps the bits.
    setid("/c", 0o6755);
    put(&e, "/c", b"x");
    assert_eq!(perm("/c"), 0o6755);
    // Truncate by a non-root caller clears them; by root it does not.
    let d = setid("/d", 0o4755);
    let size = |n| SetAttr {
        size: Some(n),
        ..SetAttr::default()
    };
    e.fs.setattr_as(&root, d, &size(5))
        .expect("truncate as root");
    assert_eq!(perm("/d"), 0o4755);
    e.fs.setattr_as(&user, d, &size(0))
        .expect("truncate as user");
    assert_eq!(perm("/d"), 0o755);
    // O_TRUNC by a non-root caller.
    let t = setid("/t", 0o4755);
    let flags = OpenFlags {
        write: true,
        truncate: true,
        ..OpenFlags::default()
    };
    let fh = e.fs.open_as(&user, t, flags).expect("open O_TRUNC");
    e.fs.release(fh).expect("release");
    assert_eq!(perm("/t"), 0o755);
    // Without credentials (a trusted caller) nothing is cleared.
    let k = setid("/k", 0o6755);
    let fh = e.fs.open(k, flags).expect("open");
    e.fs.write(fh, 0, b"x").expect("write");
    e.fs.release(fh).expect("release");
    assert_eq!(perm("/k"), 0o6755);
    // The write stays blind: clearing is part of the stat upsert.
    let w = setid("/w", 0o4755);
    let fh =
        e.fs.open_as(
            &user,
            w,
            OpenFlags {
                write: true,
                ..OpenFlags::default()
            },
        )
        .expect("open");
    let before = e.store.reads();
    e.fs.write(fh, 0, b"x").expect("write");
    assert_eq!(
        e.store.reads() - before,
        usize::from(!e.sole()),
        "a write that clears set-id bits reads nothing (on a shared store: the stat, as every write)"
    );
    e.fs.release(fh).expect("release");
    assert_eq!(perm("/w"), 0o755);
}

/// A store whose media fills up on demand: writes fail as fern-kv-tree reports the engine's
/// `NoSpace` (`KvError::Io` of kind `StorageFull`).
struct FullStore {
    inner: Box<dyn fern_kv::KvStore>,
    full: std::sync::atomic::AtomicBool,
}

impl fern_kv::KvRead for FullStore {
    fn get(&self, t: fern_kv::TreeId, k: &[u8]) -> fern_kv::KvResult<Option<Vec<u8>>> {
        self.inner.get(t, k)
    }
    fn scan(
        &self,
        t: fern_kv::TreeId,
        r: &fern_kv::KeyRange,
        d: fern_kv::Direction,
        limit: usize,
    ) -> fern_kv::KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(t, r, d, limit)
    }
    fn read_extent(&self, r: &fern_kv::ExtentRef, buf: &mut [u8]) -> fern_kv::KvResult<()> {
        self.inner.read_extent(r, buf)
    }
}

impl fern_kv::KvStore for FullStore {
    fn tree(&self, name: &str) -> fern_kv::KvResult<fern_kv::TreeId> {
        self.inner.tree(name)
    }
    fn write(&self, b: fern_kv::WriteBatch, o: fern_kv::WriteOptions) -> fern_kv::KvResult<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(fern_kv::KvError::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "device full",
            )));
        }
        self.inner.write(b, o)
    }
    fn begin(&self) -> fern_kv::KvResult<Box<dyn fern_kv::KvTxn + '_>> {
        self.inner.begin()
    }
    fn sync(&self) -> fern_kv::KvResult<()> {
        self.inner.sync()
    }
    fn limits(&self) -> fern_kv::Limits {
        self.inner.limits()
    }
}

#[test]
fn storage_full_is_enospc() {
    let store = std::sync::Arc::new(FullStore {
        inner: crate::open_store(fern_fs::registry(), fern_kv::Limits::EMBEDDED),
        full: std::sync::atomic::AtomicBool::new(false),
    });
    fern_fs::Fs::mkfs(&*store, fern_fs::MkfsOptions::default()).expect("mkfs");
    let fs = std::sync::Arc::new(fern_fs::Fs::mount(store.clone()).expect("mount"));
    let p = fern_fs::path::PathFs::new(fs, fern_fs::Cred::root());
    let f = p.open(b"/f", rw()).expect("create");
    store.full.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(err(p.write_at(&f, 0, b"data")), libc::ENOSPC);
    assert_eq!(err(p.ftruncate(&f, 100)), libc::ENOSPC);
    store.full.store(false, std::sync::atomic::Ordering::SeqCst);
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

/// Path walks answer directory components from memory (the mount's directory-entry cache);
/// every rename, exchange and rmdir must be seen by the next walk.
#[test]
fn path_walks_follow_directory_renames_exchanges_and_removals() {
    let e = env();
    e.p.mkdir(b"/a", 0o755).expect("mkdir");
    e.p.mkdir(b"/a/b", 0o755).expect("mkdir");
    put(&e, "/a/b/f", b"one");
    // Renamed away: the old path is gone, the new one leads to the same directory.
    e.p.rename(b"/a/b", b"/c", 0).expect("rename");
    assert_eq!(err(e.p.stat(b"/a/b/f")), libc::ENOENT);
    assert_eq!(get(&e, "/c/f"), b"one");
    // A new directory under the old name is a different directory.
    e.p.mkdir(b"/a/b", 0o755).expect("mkdir again");
    put(&e, "/a/b/g", b"two");
    assert_eq!(err(e.p.stat(b"/c/g")), libc::ENOENT);
    // Exchanged: each path now leads to the other directory.
    e.p.rename(b"/a/b", b"/c", RENAME_EXCHANGE)
        .expect("exchange");
    assert_eq!(get(&e, "/a/b/f"), b"one");
    assert_eq!(get(&e, "/c/g"), b"two");
    // Replaced by a rename over an empty directory.
    e.p.mkdir(b"/d", 0o755).expect("mkdir d");
    e.p.unlink(b"/c/g").expect("unlink");
    e.p.rename(b"/d", b"/c", 0).expect("rename over empty dir");
    put(&e, "/c/h", b"three");
    assert_eq!(err(e.p.stat(b"/d/h")), libc::ENOENT);
    // Removed: the path no longer resolves, and a file under the same name is not a directory.
    e.p.unlink(b"/c/h").expect("unlink");
    e.p.rmdir(b"/c").expect("rmdir");
    assert_eq!(err(e.p.stat(b"/c/h")), libc::ENOENT);
    put(&e, "/c", b"file");
    assert_eq!(err(e.p.stat(b"/c/h")), libc::ENOTDIR);
    // Moved under another directory: its entries come along.
    e.p.mkdir(b"/x", 0o755).expect("mkdir x");
    e.p.rename(b"/a", b"/x/a", 0).expect("move a");
    assert_eq!(get(&e, "/x/a/b/f"), b"one");
    assert_eq!(err(e.p.stat(b"/a/b/f")), libc::ENOENT);
}

/// The path API acts as its credentials everywhere: opening an existing file (no O_CREAT),
/// ftruncate and truncate by a non-root caller clear set-id bits too.
#[test]
fn path_api_open_and_truncate_as_user_clear_setid() {
    let e = env();
    let u = as_user(&e, 1000, 1000, &[]);
    let setid = |path: &str| {
        put(&e, path, b"");
        e.p.chown(path.as_bytes(), Some(1000), Some(1000))
            .expect("chown");
        e.p.chmod(path.as_bytes(), 0o6755).expect("chmod");
    };
    let perm = |path: &str| e.p.stat(path.as_bytes()).expect("stat").perm;
    let write_only = OpenOptions {
        flags: OpenFlags {
            write: true,
            ..OpenFlags::default()
        },
        create: false,
        perm: 0,
    };
    setid("/w");
    let f = u.open(b"/w", write_only).expect("open existing as user");
    u.write_at(&f, 0, b"x").expect("write");
    u.close(f).expect("close");
    assert_eq!(perm("/w"), 0o755);
    setid("/f");
    let f = u.open(b"/f", write_only).expect("open");
    u.ftruncate(&f, 3).expect("ftruncate");
    u.close(f).expect("close");
    assert_eq!(perm("/f"), 0o755);
    setid("/t");
    u.truncate(b"/t", 3).expect("truncate");
    assert_eq!(perm("/t"), 0o755);
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

/// An ACL value in the kernel's xattr format from (tag, perm, id) triples.
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const ACL_A: &[u8] = b"system.posix_acl_access";
const ACL_D: &[u8] = b"system.posix_acl_default";
const NONE: u32 = u32::MAX;

/// Issue 12.1: an access ACL is validated, keeps the mode in step (group bits = mask), is
/// enforced against other users, follows chmod, and is stored only when the mode cannot say it.
#[test]
fn access_acls_are_validated_enforced_and_kept_in_step_with_the_mode() {
    use fern_fs::perm::{MAY_READ, MAY_WRITE};
    let e = env();
    put(&e, "/f", b"secret");
    e.p.chmod(b"/f", 0o644).expect("chmod");
    let nobody = as_user(&e, 65534, 65534, &[]);
    let other = as_user(&e, 1000, 1000, &[]);
    assert!(
        nobody.access(b"/f", MAY_READ).is_ok(),
        "0644: everyone reads"
    );
    // setfacl -m u:nobody:--- f
    let deny = acl_value(&[
        (1, 6, NONE),
        (2, 0, 65534),
        (4, 4, NONE),
        (0x10, 4, NONE),
        (0x20, 4, NONE),
    ]);
    e.p.setxattr(b"/f", ACL_A, &deny, 0).expect("set ACL");
    assert_eq!(e.p.stat(b"/f").expect("stat").perm, 0o644);
    assert_eq!(e.p.getxattr(b"/f", ACL_A).expect("get ACL"), deny);
    assert_eq!(err(nobody.access(b"/f", MAY_READ)), libc::EACCES);
    assert!(other.access(b"/f", MAY_READ).is_ok());
    assert_eq!(err(other.access(b"/f", MAY_WRITE)), libc::EACCES);
    // chmod 600 rewrites the mask and other entries.
    e.p.chmod(b"/f", 0o600).expect("chmod");
    let after = acl_value(&[
        (1, 6, NONE),
        (2, 0, 65534),
        (4, 4, NONE),
        (0x10, 0, NONE),
        (0x20, 0, NONE),
    ]);
    assert_eq!(e.p.getxattr(b"/f", ACL_A).expect("get ACL"), after);
    assert_eq!(err(other.access(b"/f", MAY_READ)), libc::EACCES);
    // The ACL sets the mode; one the mode can express is stored as the mode only.
    e.p.setxattr(
        b"/f",
        ACL_A,
        &acl_value(&[(1, 7, NONE), (4, 5, NONE), (0x20, 0, NONE)]),
        0,
    )
    .expect("set ACL");
    assert_eq!(e.p.stat(b"/f").expect("stat").perm, 0o750);
    assert_eq!(err(e.p.getxattr(b"/f", ACL_A)), libc::ENODATA);
    // Malformed values are EINVAL and change nothing; default ACLs are for directories.
    for bad in [
        vec![1, 2, 3],
        acl_value(&[(4, 4, NONE), (1, 6, NONE), (0x20, 4, NONE)]),
        acl_value(&[(1, 6, NONE), (2, 4, 7), (4, 4, NONE), (0x20, 4, NONE)]),
        acl_value(&[(1, 9, NONE), (4, 4, NONE), (0x20, 4, NONE)]),
    ] {
        assert_eq!(err(e.p.setxattr(b"/f", ACL_A, &bad, 0)), libc::EINVAL);
    }
    assert_eq!(e.p.stat(b"/f").expect("stat").perm, 0o750);
    let def = acl_value(&[(1, 7, NONE), (4, 5, NONE), (0x20, 5, NONE)]);
    assert_eq!(err(e.p.setxattr(b"/f", ACL_D, &def, 0)), libc::EACCES);
}

/// Issue 12.1: a directory's default ACL is inherited (access ACL = default masked by the
/// create mode, no umask; directories also get the default ACL), also after a remount.
#[test]
fn default_acls_are_inherited_without_the_umask() {
    use fern_fs::perm::MAY_WRITE;
    let mut e = env();
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    e.p.mkdir(b"/plain", 0o777).expect("mkdir");
    let def = acl_value(&[
        (1, 7, NONE),
        (2, 7, 1000),
        (4, 5, NONE),
        (0x10, 7, NONE),
        (0x20, 5, NONE),
    ]);
    e.p.setxattr(b"/d", ACL_D, &def, 0)
        .expect("set default ACL");
    for round in 0..2 {
        let cred = fern_fs::Cred {
            umask: 0o077,
            ..fern_fs::Cred::root()
        };
        let p = fern_fs::path::PathFs::new(e.fs.clone(), cred);
        let f = format!("/d/f{round}");
        put_as(&p, &f, 0o666);
        assert_eq!(e.p.stat(f.as_bytes()).expect("stat").perm, 0o664);
        let access = acl_value(&[
            (1, 6, NONE),
            (2, 7, 1000),
            (4, 5, NONE),
            (0x10, 6, NONE),
            (0x20, 4, NONE),
        ]);
        assert_eq!(
            e.p.getxattr(f.as_bytes(), ACL_A).expect("access ACL"),
            access
        );
        assert!(as_user(&e, 1000, 1000, &[])
            .access(f.as_bytes(), MAY_WRITE)
            .is_ok());
        let sub = format!("/d/sub{round}");
        p.mkdir(sub.as_bytes(), 0o777).expect("mkdir");
        assert_eq!(e.p.stat(sub.as_bytes()).expect("stat").perm, 0o775);
        assert_eq!(
            e.p.getxattr(sub.as_bytes(), ACL_D).expect("default ACL"),
            def
        );
        // Without a default ACL the umask applies, and nothing is inherited.
        let g = format!("/plain/f{round}");
        put_as(&p, &g, 0o666);
        assert_eq!(e.p.stat(g.as_bytes()).expect("stat").perm, 0o600);
        assert_eq!(err(e.p.getxattr(g.as_bytes(), ACL_A)), libc::ENODATA);
        // A fresh mount learns the default ACL from the store.
        e = e.remount();
    }
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

/// Issue 12.8: RENAME_WHITEOUT moves the name and leaves a character device 0/0 with mode 0
/// at the source, in one step; it cannot be combined with RENAME_EXCHANGE.
#[test]
fn rename_whiteout_leaves_a_whiteout_device() {
    use fern_fs::RENAME_WHITEOUT;
    let e = env();
    put(&e, "/a", b"moved");
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    e.p.mkdir(b"/sub", 0o755).expect("mkdir");
    e.p.rename(b"/a", b"/sub/b", RENAME_WHITEOUT)
        .expect("rename");
    assert_eq!(get(&e, "/sub/b"), b"moved");
    let w = e.p.lstat(b"/a").expect("whiteout");
    assert_eq!((w.kind, w.rdev, w.perm), (FileType::CharDevice, 0, 0));
    let root_links = e.p.stat(b"/").expect("stat").nlink;
    e.p.rename(b"/d", b"/sub/d", RENAME_WHITEOUT | RENAME_NOREPLACE)
        .expect("rename a directory");
    assert_eq!(
        e.p.lstat(b"/d").expect("whiteout").kind,
        FileType::CharDevice
    );
    assert_eq!(e.p.stat(b"/").expect("stat").nlink, root_links - 1);
    assert_eq!(e.p.stat(b"/sub").expect("stat").nlink, 3);
    assert_eq!(
        err(e
            .p
            .rename(b"/sub/b", b"/a", RENAME_WHITEOUT | RENAME_EXCHANGE)),
        libc::EINVAL
    );
    // A fresh mount sees the same.
    let e = e.remount();
    assert_eq!(
        e.p.lstat(b"/a").expect("whiteout").kind,
        FileType::CharDevice
    );
}

/// Issue 12.7: st_blocks counts the blocks really stored: a 100 MiB file with one byte
/// written reports one block; writes into holes, truncation and hole punching keep the count
/// exact, also for a fresh mount (the count is in the stat).
#[test]
fn st_blocks_counts_stored_blocks_of_sparse_files() {
    let mut e = env();
    let blocks = |e: &common::Env, p: &str| e.p.stat(p.as_bytes()).expect("stat").blocks;
    let f = e.p.open(b"/s", rw()).expect("create");
    e.p.write_at(&f, 100 * 1024 * 1024 - 1, b"x")
        .expect("write");
    e.p.close(f).expect("close");
    assert_eq!(e.p.stat(b"/s").expect("stat").size, 100 << 20);
    assert_eq!(blocks(&e, "/s"), 8, "one 4 KiB block");
    for round in 0..2 {
        // Fill two holes (one twice: rewriting stored data adds nothing), extend, punch.
        let f = e.p.open(b"/s", rw()).expect("open");
        e.p.write_at(&f, 0, &[1u8; 5000]).expect("write");
        e.p.write_at(&f, 0, &[2u8; 5000]).expect("rewrite");
        assert_eq!(blocks(&e, "/s"), 8 * 3, "round {round}");
        e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)
            .expect("punch");
        assert_eq!(blocks(&e, "/s"), 8 * 2);
        e.p.ftruncate(&f, 8192).expect("truncate");
        assert_eq!(blocks(&e, "/s"), 8, "only block 1 is left");
        e.p.ftruncate(&f, 100 << 20).expect("extend");
        assert_eq!(blocks(&e, "/s"), 8);
        e.p.write_at(&f, (100 << 20) - 1, b"x").expect("write");
        e.p.close(f).expect("close");
        assert_eq!(blocks(&e, "/s"), 16);
        e.p.truncate(b"/s", 0).expect("truncate to 0");
        assert_eq!(blocks(&e, "/s"), 0);
        let f = e.p.open(b"/s", rw()).expect("open");
        e.p.write_at(&f, 100 * 1024 * 1024 - 1, b"x")
            .expect("write");
        e.p.close(f).expect("close");
        // A dense file counts every block; a fresh mount continues from the stored count.
        put(&e, "/dense", &[7u8; 3 * 4096 + 1]);
        assert_eq!(blocks(&e, "/dense"), 8 * 4);
        e = e.remount();
    }
    // A file without a count (an image from before it existed: rdev 0) reports what its size
    // implies, and is counted from there on.
    e.p.setattr(b"/dense", &SetAttr::default()).expect("touch");
    assert_eq!(blocks(&e, "/dense"), 8 * 4);
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
