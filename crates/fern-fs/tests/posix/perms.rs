//! Ownership and permission: access checks, set-id clearing, set-gid directories, xattrs and POSIX ACLs.

use super::*;

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
