//! File-system images of older formats, committed as bytes (`tests/fixtures/*.img.zst`,
//! zstd-compressed: the sparse 256 MiB log region of a `fernfs mkfs` image packs into a few
//! KiB), checked and exported by this build. A future format change must open them with
//! exactly these files or refuse them clearly. `tests/fixtures/README.md` says what each is.
//!
//! The tests never regenerate them; `generate_fs_fixtures` (ignored; run with
//! `FERN_WRITE_FIXTURES=DIR cargo test -p fernfs --release --test fixtures -- --ignored`)
//! documents how they were made and writes a set of the current format into DIR.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs};
use fern_kv_tree::TreeStore;

mod common;
use common::{run, text, unpack_fixture};

/// The host tree imported into the clean image.
fn big() -> Vec<u8> {
    (0..20_000u32).map(|i| (i * 31 % 253) as u8).collect()
}

const LATE: &[u8] = b"written after the last checkpoint, then the process died\n";

/// fsck is clean and export gives exactly the imported tree (plus `late` if `with_late`).
fn check_fixture(name: &str, with_late: bool) {
    let t = tempfile::tempdir().expect("tempdir");
    let img = unpack_fixture(name, t.path());
    let out = run(&["fsck".as_ref(), img.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "fsck {name}:\n{}", text(&out));
    let dest = t.path().join("out");
    let out = run(&["export".as_ref(), img.as_os_str(), dest.as_os_str()]);
    assert!(out.status.success(), "export {name}:\n{}", text(&out));
    assert_eq!(std::fs::read(dest.join("a")).expect("a"), b"hello fernfs\n");
    assert_eq!(std::fs::read(dest.join("sub/b")).expect("sub/b"), big());
    assert_eq!(
        std::fs::read_link(dest.join("sub/s")).expect("sub/s"),
        Path::new("../a")
    );
    let mut names: Vec<String> = std::fs::read_dir(&dest)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want = vec!["a", "sub"];
    if with_late {
        want.push("late");
        assert_eq!(std::fs::read(dest.join("late")).expect("late"), LATE);
    }
    want.sort();
    assert_eq!(names, want);
}

/// Made by `fernfs mkfs` and `fernfs import` (engine format 1), closed cleanly.
#[test]
fn fs_v1_clean_checks_and_exports() {
    check_fixture("fs-v1-clean", false);
}

/// The clean image with one more file written and synced, then the process lost (no close):
/// `late` is only in the log.
#[test]
fn fs_v1_unreplayed_checks_and_exports() {
    check_fixture("fs-v1-unreplayed", true);
}

#[test]
#[ignore = "writes fixture images; run by hand (see the module comment)"]
fn generate_fs_fixtures() {
    let Ok(out) = std::env::var("FERN_WRITE_FIXTURES") else {
        panic!("set FERN_WRITE_FIXTURES=DIR");
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).expect("mkdir");
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    std::fs::write(src.join("a"), b"hello fernfs\n").expect("a");
    std::fs::write(src.join("sub/b"), big()).expect("b");
    std::os::unix::fs::symlink("../a", src.join("sub/s")).expect("symlink");
    let img = t.path().join("fs.img");
    for args in [
        vec!["mkfs".as_ref(), img.as_os_str()],
        vec!["import".as_ref(), src.as_os_str(), img.as_os_str()],
    ] {
        let o = run(&args);
        assert!(o.status.success(), "{}", text(&o));
    }
    let pack = |name: &str| {
        let bytes = std::fs::read(&img).expect("read image");
        let packed = zstd::encode_all(bytes.as_slice(), 19).expect("compress");
        std::fs::write(out.join(format!("{name}.img.zst")), packed).expect("write fixture");
    };
    pack("fs-v1-clean");
    // One more file, fsynced, then the process "dies": the store is forgotten, not closed.
    let store = Arc::new(TreeStore::open(&img, 16 << 20, fern_fs::registry()).expect("open image"));
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    let p = PathFs::new(fs.clone(), Cred::root());
    let f = p
        .open(b"/late", OpenOptions::create_write(0o644))
        .expect("create late");
    assert_eq!(p.write_at(&f, 0, LATE).expect("write"), LATE.len());
    p.fsync(&f).expect("fsync");
    p.close(f).expect("close");
    fs.syncfs().expect("syncfs");
    std::mem::forget(p);
    std::mem::forget(fs);
    std::mem::forget(store);
    pack("fs-v1-unreplayed");
}
