//! `fernfs mkfs` / `mount` / `fsck` / `stat` on a real block device: a loop device made by the
//! test with losetup over a sparse file. mkfs formats it; refuses to overwrite it when it holds
//! fernfs or another recognised file system (ext4 made by mkfs.ext4) unless --force; refuses a
//! device the kernel has mounted even with --force; and a re-format leaves an empty file system.
//!
//! Needs root, /dev/fuse, losetup and mkfs.ext4; otherwise SKIPPED, a failure under
//! `FERN_REQUIRE_FUSE=1` (fern-testkit). The loop device is detached and every mount undone by
//! guards, so a failing test leaves nothing.

use std::fs;
use std::process::Command;

use fern_testkit::{skipped, LoopDevice, Need};

mod common;
use common::{ok, run, MountGuard};

fn refused(args: &[&std::ffi::OsStr], says: &str) {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "fernfs {args:?} must fail");
    assert!(
        err.contains(says),
        "fernfs {args:?}: expected {says:?} in {err}"
    );
}

fn usable() -> Result<(), String> {
    fern_testkit::fuse_as_root()?;
    for tool in ["losetup", "mkfs.ext4"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Err(format!("{tool} is not installed"));
        }
    }
    Ok(())
}

#[test]
fn mkfs_mount_and_fsck_on_a_loop_device() {
    if skipped(Need::Fuse, usable()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _unmount = MountGuard(mnt.clone());
    let dev = LoopDevice::new(&tmp.path().join("backing"), 160 << 20);
    let (d, m) = (dev.path().as_os_str(), mnt.as_os_str());

    ok(&["mkfs".as_ref(), d]);
    refused(&["mkfs".as_ref(), d], "(fernfs); add --force");
    ok(&["mount".as_ref(), d, m]);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 253) as u8).collect();
    fs::write(mnt.join("big"), &big).unwrap();
    fs::create_dir(mnt.join("dir")).unwrap();
    fs::write(mnt.join("dir/small"), b"on a block device").unwrap();
    // The mount is recognised as ours for stat (its source is a device, not a file).
    let stat = ok(&["stat".as_ref(), m, "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(v["files"], 2, "{v}");
    refused(&["mkfs".as_ref(), d, "--force".as_ref()], "in use");
    ok(&["umount".as_ref(), m]);

    let fsck = ok(&["fsck".as_ref(), d]);
    assert!(String::from_utf8_lossy(&fsck.stdout).contains(" 0 problems"));
    let stat = ok(&["stat".as_ref(), d, "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert!(
        v["image_allocated_bytes"].as_u64().unwrap() >= 3_000_000 / 4,
        "{v}"
    );
    ok(&["mount".as_ref(), d, m]);
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    assert_eq!(
        fs::read(mnt.join("dir/small")).unwrap(),
        b"on a block device"
    );
    ok(&["umount".as_ref(), m]);

    // Another file system's signature is recognised; a kernel mount blocks even --force.
    let ext4 = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(d)
        .output()
        .unwrap();
    assert!(ext4.status.success(), "{ext4:?}");
    refused(&["mkfs".as_ref(), d], "ext");
    nix::mount::mount(
        Some(dev.path()),
        mnt.as_path(),
        Some("ext4"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    refused(&["mkfs".as_ref(), d, "--force".as_ref()], "in use");
    nix::mount::umount(mnt.as_path()).unwrap();

    // --force formats it; the old contents are gone and the new file system is clean.
    ok(&["mkfs".as_ref(), d, "--force".as_ref()]);
    ok(&["mount".as_ref(), d, m]);
    let names: Vec<_> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "fresh file system lists {names:?}");
    ok(&["umount".as_ref(), m]);
    let fsck = ok(&["fsck".as_ref(), d]);
    assert!(String::from_utf8_lossy(&fsck.stdout).contains(" 0 problems"));
}

#[test]
fn too_small_a_device_is_refused_clearly() {
    if skipped(Need::Fuse, usable()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dev = LoopDevice::new(&tmp.path().join("backing"), 8 << 20);
    refused(&["mkfs".as_ref(), dev.path().as_os_str()], "too small");
}
