//! The namespace: create, names, special files, directories, rename, links, symlinks, listing, path walks.

use super::*;

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
