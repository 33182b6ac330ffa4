//! `fernfs mkfs` and sizes (issue 12, item 9; format.md B11): `--size` with K/M/G/T, a
//! pre-sized sparse file taken as it is, what an existing file holds said before refusing,
//! `--force` keeping the file's size, and an image that never grows past its size: filled
//! through the file-system library, it reports ENOSPC with its length unchanged, and statfs
//! reports that size as the capacity.

use std::process::Output;
use std::sync::Arc;

use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs};
use fern_kv_tree::TreeStore;

mod common;

/// `fernfs mkfs ARGS TARGET`.
fn mkfs(args: &[&str], target: &std::path::Path) -> Output {
    common::fernfs()
        .arg("mkfs")
        .args(args)
        .arg(target)
        .output()
        .expect("run fernfs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).expect("stat").len()
}

#[test]
fn size_option_and_presized_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    // --size with a suffix: the image has that length from the start.
    let a = dir.path().join("a.img");
    let o = mkfs(&["--size", "64M"], &a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(len(&a), 64 << 20);
    assert!(stderr(&o).contains("67108864 bytes"), "{}", stderr(&o));
    // A pre-sized sparse file is accepted (no data in it), and keeps its size.
    let b = dir.path().join("b.img");
    std::fs::File::create(&b)
        .and_then(|f| f.set_len(1 << 30))
        .expect("truncate -s 1G");
    let o = mkfs(&[], &b);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(len(&b), 1 << 30);
    // Formatting it again is refused, and the message says what is there.
    let o = mkfs(&[], &b);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("contains a fernfs file system") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    // --force keeps the size; --force --size sets a new one.
    let o = mkfs(&["--force"], &b);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(len(&b), 1 << 30);
    let o = mkfs(&["--force", "--size", "1T"], &b);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(len(&b), 1 << 40);
    // Other data: refused with its size named; nothing changed.
    let c = dir.path().join("c.txt");
    std::fs::write(&c, b"precious").expect("write");
    let o = mkfs(&[], &c);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("holds 8 bytes of data that is not a fernfs image"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&c).expect("read"), b"precious");
    // Bad sizes are usage errors.
    for bad in ["12x", "0", "1M"] {
        let o = mkfs(&["--size", bad], &dir.path().join("d.img"));
        assert!(!o.status.success(), "--size {bad} accepted");
    }
}

#[test]
fn a_sized_image_never_grows_and_reports_enospc_and_its_capacity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("small.img");
    let size: u64 = 48 << 20;
    let o = mkfs(&["--size", "48M"], &img);
    assert!(o.status.success(), "{}", stderr(&o));
    let store = TreeStore::open(&img, 16 << 20, fern_fs::registry()).expect("open");
    let fs = Arc::new(Fs::mount(Arc::new(store)).expect("mount"));
    let st = fs.statfs().expect("statfs");
    let total = st.blocks * u64::from(st.bsize);
    assert_eq!(total, size, "statfs shows the image's size");
    let avail0 = st.bavail * u64::from(st.bsize);
    assert!(
        avail0 > size / 2 && avail0 < size,
        "available {avail0} of {size}"
    );
    let p = PathFs::new(fs.clone(), Cred::root());
    let chunk = fern_testkit::noise(&mut 0x2545_f491_4f6c_dd1du64, 64 << 10);
    let mut written = 0u64;
    let err = 'fill: loop {
        let name = format!("/f{written}");
        let f = match p.open(name.as_bytes(), OpenOptions::create_write(0o644)) {
            Ok(f) => f,
            Err(e) => break 'fill e,
        };
        for k in 0..4 {
            if let Err(e) = p.write_at(&f, k * chunk.len() as u64, &chunk) {
                let _ = p.close(f);
                break 'fill e;
            }
            written += chunk.len() as u64;
        }
        p.close(f).expect("close");
        assert!(written < 2 * size, "the image never filled");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(written > size / 3, "only {written} bytes fit in {size}");
    assert_eq!(len(&img), size, "the image grew past its size");
    // Deletes work on the full image and the space comes back.
    for i in (0..written / (4 << 16)).step_by(2) {
        p.unlink(format!("/f{}", i * (4 << 16)).as_bytes())
            .expect("unlink on a full image");
    }
    let f = p
        .open(b"/after", OpenOptions::create_write(0o644))
        .expect("create after deletes");
    p.write_at(&f, 0, &chunk).expect("write after deletes");
    p.close(f).expect("close");
    drop(p);
    let store = fs.store().clone();
    drop(fs);
    drop(store);
    assert_eq!(len(&img), size);
}

/// Deleted data gives its space back to the host (issue 12, item 10): after writing 40 MiB,
/// deleting it all and closing, the image file's allocated blocks fall back near where an
/// empty image starts — for a sized image and for one that grows.
#[test]
fn deleted_data_gives_its_space_back_to_the_host() {
    use std::os::unix::fs::MetadataExt;
    for sized in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("x.img");
        let args: &[&str] = if sized { &["--size", "256M"] } else { &[] };
        let o = mkfs(args, &img);
        assert!(o.status.success(), "{}", stderr(&o));
        let on_disk = || std::fs::metadata(&img).expect("stat").blocks() * 512;
        let empty = on_disk();
        let open = || {
            let store = TreeStore::open(&img, 16 << 20, fern_fs::registry()).expect("open");
            Arc::new(Fs::mount(Arc::new(store)).expect("mount"))
        };
        let close = |fs: Arc<Fs>| {
            let store = fs.store().clone();
            drop(fs);
            drop(store);
        };
        let fs = open();
        let p = PathFs::new(fs.clone(), Cred::root());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..40 {
            let data = fern_testkit::noise(&mut x, 1 << 20);
            let f = p
                .open(
                    format!("/f{i}").as_bytes(),
                    OpenOptions::create_write(0o644),
                )
                .expect("create");
            p.write_at(&f, 0, &data).expect("write");
            p.close(f).expect("close");
        }
        drop(p);
        close(fs);
        let full = on_disk();
        assert!(
            full >= empty + (36 << 20),
            "sized {sized}: {empty} -> {full}"
        );
        let fs = open();
        let p = PathFs::new(fs.clone(), Cred::root());
        for i in 0..40 {
            p.unlink(format!("/f{i}").as_bytes()).expect("unlink");
        }
        drop(p);
        close(fs);
        close(open());
        let after = on_disk();
        assert!(
            after <= empty + (8 << 20),
            "sized {sized}: empty {empty}, with 40 MiB {full}, after deleting it {after}"
        );
    }
}
