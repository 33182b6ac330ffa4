//! `fernfs import` / `export` round trip through the library API (no FUSE needed): contents,
//! permission bits, symlinks, hard links and file mtimes survive; fsck is clean afterwards.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

mod common;
use common::{fernfs, interrupt, ok};

#[test]
fn import_then_export_round_trips_a_tree() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("sub/deeper")).unwrap();
    fs::write(src.join("a"), b"hello").unwrap();
    let big: Vec<u8> = (0..2_500_000u32).map(|i| (i * 7 % 256) as u8).collect();
    fs::write(src.join("sub/big"), &big).unwrap();
    fs::hard_link(src.join("a"), src.join("sub/deeper/a2")).unwrap();
    std::os::unix::fs::symlink("../a", src.join("sub/s")).unwrap();
    fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o711)).unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(src.join("sub/big"))
        .unwrap()
        .set_modified(old)
        .unwrap();

    let img = t.path().join("fs.img");
    let target = format!("{}:/imported/here", img.display());
    let out = t.path().join("out");
    ok(&["mkfs".as_ref(), img.as_os_str()]);
    ok(&["import".as_ref(), src.as_os_str(), target.as_ref()]);
    ok(&["fsck".as_ref(), img.as_os_str()]);
    ok(&["export".as_ref(), target.as_ref(), out.as_os_str()]);

    assert_eq!(fs::read(out.join("a")).unwrap(), b"hello");
    assert_eq!(fs::read(out.join("sub/big")).unwrap(), big);
    assert_eq!(
        fs::read_link(out.join("sub/s")).unwrap(),
        std::path::Path::new("../a")
    );
    let (a, a2) = (
        fs::metadata(out.join("a")).unwrap(),
        fs::metadata(out.join("sub/deeper/a2")).unwrap(),
    );
    assert_eq!(a.ino(), a2.ino(), "hard link kept");
    assert_eq!(a.mode() & 0o7777, 0o640);
    assert_eq!(
        fs::metadata(out.join("sub")).unwrap().mode() & 0o7777,
        0o711
    );
    assert_eq!(
        fs::metadata(out.join("sub/big"))
            .unwrap()
            .modified()
            .unwrap(),
        old
    );
}

/// What `cp -a` / `tar --xattrs` keep survives import then export (issue 12.12): owner and
/// group, set-id bits, mode, access and modification times, xattrs (on files, directories and,
/// for `trusted.`, symlinks), owners of symlinks, FIFOs, sockets and device nodes, hard links
/// of a FIFO, and holes — a 100 MiB file with one byte written takes almost no space in the
/// image or in the exported copy. Needs root (chown, mknod, trusted xattrs).
#[test]
fn import_export_keep_owners_xattrs_special_files_and_holes() {
    use std::os::unix::ffi::OsStrExt;
    let root = if fern_testkit::is_root() {
        Ok(())
    } else {
        Err("needs root (chown, mknod, trusted xattrs)")
    };
    if fern_testkit::skipped(fern_testkit::Need::Fuse, root) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    let p = |n: &str| src.join(n);
    fs::write(p("owned"), b"mine").unwrap();
    std::os::unix::fs::chown(p("owned"), Some(1234), Some(5678)).unwrap();
    fs::set_permissions(p("owned"), fs::Permissions::from_mode(0o4751)).unwrap();
    std::os::unix::fs::chown(p("d"), Some(42), Some(43)).unwrap();
    fs::set_permissions(p("d"), fs::Permissions::from_mode(0o2750)).unwrap();
    std::os::unix::fs::symlink("owned", p("link")).unwrap();
    std::os::unix::fs::lchown(p("link"), Some(7), Some(8)).unwrap();
    let xattr = |path: &std::path::Path, n: &str, v: &[u8]| {
        rustix::fs::lsetxattr(path, n, v, rustix::fs::XattrFlags::empty()).unwrap()
    };
    xattr(&p("owned"), "user.color", b"green");
    xattr(&p("d"), "user.dir", b"yes");
    xattr(&p("link"), "trusted.t", b"on a symlink");
    nix::unistd::mkfifo(&p("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
    std::os::unix::fs::chown(p("fifo"), Some(99), Some(98)).unwrap();
    fs::hard_link(p("fifo"), p("d/fifo2")).unwrap();
    let dev = nix::sys::stat::makedev(1, 3);
    nix::sys::stat::mknod(
        &p("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        dev,
    )
    .unwrap();
    drop(std::os::unix::net::UnixListener::bind(p("sock")).unwrap());
    let sparse = fs::File::create(p("sparse")).unwrap();
    sparse.set_len(100 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"x", 50 << 20).unwrap();
    drop(sparse);
    let old = |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
    fs::File::options()
        .write(true)
        .open(p("owned"))
        .unwrap()
        .set_times(
            fs::FileTimes::new()
                .set_accessed(old(1_111_111_111))
                .set_modified(old(1_222_222_222)),
        )
        .unwrap();

    let img = t.path().join("fs.img");
    let out = t.path().join("out");
    ok(&["mkfs".as_ref(), img.as_os_str()]);
    ok(&["import".as_ref(), src.as_os_str(), img.as_os_str()]);
    let allocated = fs::metadata(&img).unwrap().blocks() * 512;
    assert!(
        allocated < 40 << 20,
        "a 100 MiB file with one byte took {allocated} bytes of image"
    );
    ok(&["fsck".as_ref(), img.as_os_str()]);
    ok(&["export".as_ref(), img.as_os_str(), out.as_os_str()]);

    for name in [
        "owned", "d", "link", "fifo", "d/fifo2", "null", "sock", "sparse",
    ] {
        let (a, b) = (
            fs::symlink_metadata(src.join(name)).unwrap(),
            fs::symlink_metadata(out.join(name)).unwrap(),
        );
        assert_eq!(a.mode(), b.mode(), "{name}: type and mode");
        assert_eq!((a.uid(), a.gid()), (b.uid(), b.gid()), "{name}: owner");
        assert_eq!(a.rdev(), b.rdev(), "{name}: device");
        assert_eq!(a.len(), b.len(), "{name}: size");
        if name != "d" {
            assert_eq!(
                (a.mtime(), a.mtime_nsec()),
                (b.mtime(), b.mtime_nsec()),
                "{name}: mtime"
            );
        }
    }
    let o = fs::metadata(out.join("owned")).unwrap();
    assert_eq!(o.atime(), 1_111_111_111, "atime kept");
    assert_eq!(
        fs::metadata(out.join("fifo")).unwrap().ino(),
        fs::metadata(out.join("d/fifo2")).unwrap().ino(),
        "hard-linked FIFO stays one inode"
    );
    let get = |path: &std::path::Path, n: &str| {
        let mut v = vec![0u8; 64];
        let len = rustix::fs::lgetxattr(path, n, &mut v[..])
            .unwrap_or_else(|e| panic!("xattr {n} of {}: {e}", path.display()));
        v.truncate(len);
        v
    };
    assert_eq!(get(&out.join("owned"), "user.color"), b"green");
    assert_eq!(get(&out.join("d"), "user.dir"), b"yes");
    assert_eq!(get(&out.join("link"), "trusted.t"), b"on a symlink");
    let s = fs::metadata(out.join("sparse")).unwrap();
    assert!(
        s.blocks() * 512 <= 64 << 10,
        "export wrote zeros: {} blocks",
        s.blocks()
    );
    let mut one = [0u8; 1];
    std::os::unix::fs::FileExt::read_at(
        &fs::File::open(out.join("sparse")).unwrap(),
        &mut one,
        50 << 20,
    )
    .unwrap();
    assert_eq!(&one, b"x");
    assert_eq!(
        fs::read_link(out.join("link"))
            .unwrap()
            .as_os_str()
            .as_bytes(),
        b"owned"
    );
}

/// Exporting a path the image does not have fails and creates nothing on the host.
#[test]
fn export_of_a_missing_path_creates_nothing() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("fs.img");
    let out = t.path().join("out");
    ok(&["mkfs".as_ref(), img.as_os_str()]);
    let r = fernfs()
        .arg("export")
        .arg(format!("{}:/no/such/dir", img.display()))
        .arg(&out)
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("/no/such/dir"));
    assert!(!out.exists(), "the destination must not be created");
}

/// Ctrl-C during an import stops it cleanly: exit status non-zero, a message saying what was
/// copied and where it stopped, the image closed and clean, and every file in it complete
/// (the one being copied was removed).
#[test]
fn an_interrupted_import_says_what_was_copied_and_leaves_whole_files() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let n_files = 24u32;
    for n in 0..n_files {
        let data: Vec<u8> = (0..4u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ n as u8)
            .collect();
        fs::write(src.join(format!("f{n:02}")), data).unwrap();
    }
    let img = t.path().join("fs.img");
    ok(&["mkfs".as_ref(), img.as_os_str()]);
    // Progress is seen in the image's allocated blocks (its length is set up front).
    let allocated = || fs::metadata(&img).unwrap().blocks() * 512;
    let start_alloc = allocated();
    let child = fernfs()
        .arg("import")
        .arg(&src)
        .arg(&img)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while allocated() < start_alloc + (8 << 20) {
        assert!(started.elapsed().as_secs() < 60, "import wrote nothing");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let out = interrupt(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the import finished before the signal: {err}"
    );
    assert!(err.contains("interrupted by signal 2"), "{err}");
    assert!(
        err.contains("copied: ") && err.contains("not copied: "),
        "{err}"
    );
    ok(&["fsck".as_ref(), img.as_os_str()]);
    let out_dir = t.path().join("out");
    ok(&["export".as_ref(), img.as_os_str(), out_dir.as_os_str()]);
    let got: Vec<_> = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!((got.len() as u32) < n_files, "nothing was left out");
    for p in got {
        let name = p.file_name().unwrap();
        assert_eq!(
            fs::read(&p).unwrap(),
            fs::read(src.join(name)).unwrap(),
            "{name:?} incomplete"
        );
    }
}
