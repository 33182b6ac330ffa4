//! `fernfs import` / `export` round trip through the library API (no FUSE needed): contents,
//! permission bits, symlinks, hard links and file mtimes survive; fsck is clean afterwards.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

fn fernfs(args: &[&std::ffi::OsStr]) {
    let out = Command::new(env!("CARGO_BIN_EXE_fernfs"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fernfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

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
    fernfs(&["mkfs".as_ref(), img.as_os_str()]);
    fernfs(&["import".as_ref(), src.as_os_str(), target.as_ref()]);
    fernfs(&["fsck".as_ref(), img.as_os_str()]);
    fernfs(&["export".as_ref(), target.as_ref(), out.as_os_str()]);

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
