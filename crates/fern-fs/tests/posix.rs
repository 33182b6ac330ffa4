//! POSIX edge cases, one test per rule, through the path API and the inode API.

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use common::env;
use fern_fs::path::OpenOptions;
use fern_fs::{FileType, FsError, OpenFlags, SetAttr, TimeSet, Timespec};
use fern_fs::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, RENAME_EXCHANGE, RENAME_NOREPLACE};

fn rw() -> OpenOptions {
    OpenOptions {
        flags: OpenFlags {
            write: true,
            ..OpenFlags::default()
        },
        create: true,
        perm: 0o644,
    }
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
    let excl = OpenOptions {
        flags: OpenFlags {
            write: true,
            exclusive: true,
            ..OpenFlags::default()
        },
        ..rw()
    };
    assert_eq!(err(e.p.open(b"/f", excl)), libc::EEXIST);
    let f =
        e.p.open(b"/f", rw())
            .expect("non-exclusive create opens the existing file");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/f"), b"data", "no truncation without O_TRUNC");
    let trunc = OpenOptions {
        flags: OpenFlags {
            write: true,
            truncate: true,
            ..OpenFlags::default()
        },
        ..rw()
    };
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
    assert_eq!(
        e.keys_in("fs.data") + e.keys_in("fs.inode"),
        1,
        "only the root's record is left"
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
    assert_eq!(err(e.p.fallocate(&f, 0x10, 0, 1)), libc::EOPNOTSUPP);
    assert_eq!(err(e.p.fallocate(&f, 0, 0, 0)), libc::EINVAL);
    e.p.close(f).expect("close");
}

#[test]
fn append_writes_at_end() {
    let e = env();
    put(&e, "/log", b"one");
    let app = OpenOptions {
        flags: OpenFlags {
            write: true,
            append: true,
            ..OpenFlags::default()
        },
        ..rw()
    };
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
    let a =
        e.p.utimens(b"/f", Some(TimeSet::At(t)), Some(TimeSet::At(t)))
            .expect("utimens");
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
    let a = e.p.chown(b"/f", Some(5), Some(6)).expect("chown");
    assert_eq!((a.uid, a.gid, a.perm), (5, 6, 0o755));
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
    // Path resolution (1) + one scan (1) + one inode read per hard-linked entry (2).
    assert!(reads <= 5, "listing with attributes took {reads} reads");
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
    // The first create reserves an id batch (one read); no create reads an entry.
    assert!(
        e.store.reads() - before <= 1,
        "creates in a fresh directory read {}",
        e.store.reads() - before
    );
    let before = e.store.reads();
    for (i, fh) in handles.iter().enumerate() {
        e.fs.write(*fh, (i * 1000) as u64, b"small unaligned write")
            .expect("write");
    }
    assert_eq!(
        e.store.reads() - before,
        0,
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
    let f = e.p.chmod(b"/f", 0o640).expect("chmod");
    let owner = Cred::user(10, 99);
    let group = Cred {
        uid: 11,
        gid: 1,
        groups: vec![20],
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
    let odd = e.p.chmod(b"/f", 0o070).expect("chmod");
    assert_eq!(
        err(check_access(
            &odd,
            &Cred {
                uid: 10,
                gid: 20,
                groups: vec![]
            },
            MAY_READ
        )),
        libc::EACCES
    );
    // Sticky directory: only the owner of the file or directory (or root) may remove.
    e.p.mkdir(b"/tmp", 0o777).expect("mkdir");
    let tmp = e.p.chmod(b"/tmp", 0o1777).expect("sticky");
    let victim = e.p.stat(b"/f").expect("stat");
    assert!(check_delete(&tmp, &victim, &owner).is_ok());
    assert_eq!(err(check_delete(&tmp, &victim, &other)), libc::EPERM);
    let plain = e.p.chmod(b"/tmp", 0o777).expect("not sticky");
    assert!(check_delete(&plain, &victim, &other).is_ok());
    let ro = e.p.chmod(b"/tmp", 0o755).expect("read-only dir");
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
