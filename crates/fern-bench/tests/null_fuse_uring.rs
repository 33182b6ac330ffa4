//! null-fuse through a real mount over FUSE-over-io_uring: basic operations must work and be
//! served by the rings (not silently by the /dev/fuse fallback), the mount must unmount
//! cleanly; with `enable_uring` off the same mount must fall back to /dev/fuse and say why.
//!
//! Needs root (to set /sys/module/fuse/parameters/enable_uring and to mount) and a kernel
//! with CONFIG_FUSE_IO_URING. Without them it is skipped (`fern_testkit::skipped`), and fails
//! instead when `FERN_REQUIRE_FUSE=1`. When the kernel supports uring, a mount that does not use it fails
//! the test whatever the environment says.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use fern_bench::fs::null_fuse::NullMount;
use fern_fuse::uring::{Transport, ENABLE_URING};
use fern_testkit::{Need, Watchdog};

/// Puts `enable_uring` back as it was, whatever happens.
struct Param(String);

impl Param {
    fn set(on: bool) -> std::io::Result<()> {
        fs::write(ENABLE_URING, if on { "1" } else { "0" })
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = Param::set(matches!(self.0.trim(), "Y" | "1"));
    }
}

/// Detaches the mount (a stalled ring would hang forever).
fn detach(mp: &Path) {
    let _ = fern_fuse::lazy_unmount(mp);
}

/// Creates, writes, lists, renames, links and removes through the mount.
fn exercise(mp: &Path) {
    let d = mp.join("dir");
    fs::create_dir(&d).unwrap();
    let f = d.join("file");
    fs::File::create(&f)
        .unwrap()
        .write_all(&[7u8; 5000])
        .unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!(md.len(), 5000);
    assert!(md.is_file());
    // null-fuse keeps no data (reads return zeros, or what the page cache still holds), but
    // a read returns the whole size.
    let mut back = Vec::new();
    fs::File::open(&f).unwrap().read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 5000);
    for i in 0..50 {
        fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 51);
    assert!(names.contains(&"f49".to_string()));
    fs::rename(&f, mp.join("moved")).unwrap();
    assert!(!f.exists());
    assert_eq!(fs::metadata(mp.join("moved")).unwrap().size(), 5000);
    std::os::unix::fs::symlink("moved", mp.join("link")).unwrap();
    assert_eq!(fs::read_link(mp.join("link")).unwrap(), Path::new("moved"));
    let mut perm = fs::metadata(mp.join("moved")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    fs::set_permissions(mp.join("moved"), perm).unwrap();
    assert_eq!(
        fs::metadata(mp.join("moved")).unwrap().mode() & 0o777,
        0o600
    );
    for i in 0..50 {
        fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    fs::remove_dir(&d).unwrap();
    assert_eq!(
        fs::remove_dir(mp.join("moved")).unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
    );
    fs::remove_file(mp.join("moved")).unwrap();
    fs::remove_file(mp.join("link")).unwrap();
    assert_eq!(fs::read_dir(mp).unwrap().count(), 0);
}

#[test]
fn null_fuse_runs_over_io_uring_and_falls_back_when_the_kernel_forbids_it() {
    if fern_testkit::skipped(Need::Fuse, fern_testkit::fuse_as_root()) {
        return;
    }
    let was = match fs::read_to_string(ENABLE_URING) {
        Ok(w) => w,
        Err(e) => {
            let why = format!("{ENABLE_URING}: {e} (kernel without CONFIG_FUSE_IO_URING)");
            fern_testkit::skipped(Need::Fuse, Err(why));
            return;
        }
    };
    let _restore = Param(was);
    if let Err(e) = Param::set(true) {
        let why = format!("cannot switch on {ENABLE_URING}: {e}");
        fern_testkit::skipped(Need::Fuse, Err(why));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let state = dir.path().join("state");
    let watchdog = Watchdog::new(&mp, Duration::from_secs(180), detach);

    let m = NullMount::spawn(&mp, &state, Transport::Uring).unwrap();
    assert_eq!(
        m.status.active(),
        Transport::Uring,
        "the kernel allows io_uring but the mount does not use it: {:?}",
        m.status.note()
    );
    exercise(&mp);
    let served = m.status.ring_requests();
    assert!(
        served >= 100,
        "only {served} requests went through the rings"
    );
    m.unmount().unwrap();

    // The parameter off: the same request falls back to /dev/fuse and says why.
    Param::set(false).unwrap();
    let m = NullMount::spawn(&mp, &state, Transport::Uring).unwrap();
    assert_eq!(m.status.active(), Transport::Dev);
    assert!(
        m.status.note().unwrap_or_default().contains("enable_uring"),
        "{:?}",
        m.status.note()
    );
    exercise(&mp);
    assert_eq!(m.status.ring_requests(), 0);
    m.unmount().unwrap();
    drop(watchdog);
}
