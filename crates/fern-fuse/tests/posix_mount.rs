//! POSIX behaviour that users rely on without thinking, checked through a real FUSE mount with
//! the tools they use (issue 12): permissions that survive `cp -p`/`cp -a`/`mv`, POSIX ACLs
//! that the kernel enforces, set-id bits dropped by chown of any non-directory, an open
//! directory that outlives its name, the atime mount options, st_blocks of sparse files, and
//! the fallocate/rename modes.
//!
//! Needs root and /dev/fuse (and `setfacl`/`getfacl` from the `acl` package). Without them a
//! test says SKIPPED and returns, unless `FERN_REQUIRE_FUSE=1` (CI), where it fails.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use fern_fs::{Fs, MkfsOptions};
use fern_fuse::{MountOptions, Mounted};
use fern_kv::mem::MemStore;
use fern_kv::KvStore;

/// Tests of this file mount one at a time (a forked child would otherwise inherit another
/// test's descriptors on another mount and make its unmount fail with EBUSY).
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether this machine can run the tests (root, /dev/fuse and `tools`); where CI declares it
/// can (`FERN_REQUIRE_FUSE=1`), a missing piece fails the test (fern-testkit).
fn runnable(tools: &[&str]) -> bool {
    let check = fern_testkit::fuse_as_root().and_then(|()| fern_testkit::programs(tools));
    !fern_testkit::skipped(fern_testkit::Need::Fuse, check)
}

/// A fresh file system mounted (allow_other, so `nobody` can use it) in a temporary
/// directory that everyone may enter.
struct Fixture {
    mount: Option<Mounted>,
    dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Fixture {
    fn new(extra: &str) -> Fixture {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let mp = dir.path().join("mnt");
        fs::create_dir(&mp).expect("mkdir");
        let kv: Arc<dyn KvStore> = Arc::new(MemStore::new(fern_fs::registry()));
        Fs::mkfs(&*kv, MkfsOptions::default()).expect("mkfs");
        let fs_ = Arc::new(Fs::mount(kv).expect("fern-fs mount"));
        let mut opts = MountOptions {
            allow_other: true,
            ..MountOptions::default()
        };
        opts.parse_into(extra).expect("options");
        let m = Mounted::spawn(fs_, &mp, &opts).expect("FUSE mount");
        fs::set_permissions(&mp, fs::Permissions::from_mode(0o777)).expect("chmod");
        Fixture {
            mount: Some(m),
            dir,
            _serial: serial,
        }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// A scratch path on the host, outside the mount.
    fn host(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            if let Err(e) = m.unmount() {
                eprintln!("unmount: {e}");
                let _ = fern_fuse::lazy_unmount(&self.mnt());
            }
        }
    }
}

/// Runs `script` with `sh -c` in `dir` (as `user` when given, through `runuser`); returns
/// (success, stdout + stderr).
fn sh(dir: &Path, user: Option<&str>, script: &str) -> (bool, String) {
    let mut cmd = match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.args(["-u", u, "--", "sh", "-c", script]);
            c
        }
        None => {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            c
        }
    };
    let out = cmd.current_dir(dir).output().expect("spawn sh");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// `sh` that must succeed; returns its output.
fn ok(dir: &Path, script: &str) -> String {
    let (good, out) = sh(dir, None, script);
    assert!(good, "{script}: {out}");
    out
}

fn perm(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

/// Issue 12.1: `cp -p`, `cp -a` and `mv` keep group/other bits (cp sets
/// `system.posix_acl_access` and skips its chmod when that succeeds); `nobody` can read a
/// moved 0644 file.
#[test]
fn cp_and_mv_keep_permission_bits() {
    if !runnable(&["cp", "mv", "runuser"]) {
        return;
    }
    let fx = Fixture::new("");
    let (mnt, host) = (fx.mnt(), fx.host(""));
    ok(
        &host,
        "umask 022; echo data > t; chmod 644 t; mkdir d; chmod 755 d; echo in > d/x; \
         echo moved > m; chmod 644 m",
    );
    ok(
        &host,
        &format!(
            "cp -p t {0}/p && cp -a d {0}/d && mv m {0}/m",
            mnt.display()
        ),
    );
    assert_eq!(perm(&mnt.join("p")), 0o644, "cp -p");
    assert_eq!(perm(&mnt.join("d")), 0o755, "cp -a of a directory");
    assert_eq!(perm(&mnt.join("m")), 0o644, "mv");
    let (good, out) = sh(&mnt, Some("nobody"), "cat m");
    assert!(
        good && out == "moved\n",
        "nobody reads the moved file: {out}"
    );
}

/// Issue 12.1: the kernel enforces ACLs (a named-user `---` entry stops `nobody` reading a
/// 0644 file), chmod rewrites the mask, and directories pass on their default ACL.
#[test]
fn acls_are_enforced_kept_in_step_and_inherited() {
    if !runnable(&["setfacl", "getfacl", "runuser"]) {
        return;
    }
    let fx = Fixture::new("");
    let mnt = fx.mnt();
    ok(&mnt, "echo secret > f; chmod 644 f");
    assert!(sh(&mnt, Some("nobody"), "cat f").0, "0644: nobody reads");
    ok(&mnt, "setfacl -m u:nobody:--- f");
    let (good, out) = sh(&mnt, Some("nobody"), "cat f");
    assert!(
        !good && out.contains("Permission denied"),
        "ACL denies: {out}"
    );
    assert!(sh(&mnt, Some("daemon"), "cat f").0, "others still read");
    assert_eq!(perm(&mnt.join("f")), 0o644);
    ok(&mnt, "chmod 600 f");
    let acl = ok(&mnt, "getfacl -cp f");
    assert!(acl.contains("mask::---"), "chmod sets the mask: {acl}");
    assert!(acl.contains("other::---"), "{acl}");
    // Removing the ACL (setfacl -b) leaves the mode; an ACL equal to the mode is no ACL.
    ok(&mnt, "chmod 644 f; setfacl -b f");
    assert!(sh(&mnt, Some("nobody"), "cat f").0, "ACL removed");
    ok(&mnt, "setfacl -m u::rwx,g::r-x,o::--- f");
    assert_eq!(perm(&mnt.join("f")), 0o750);
    let minimal = ok(&mnt, "getfacl -cp f");
    assert!(
        !minimal.contains("mask"),
        "stored as the mode only: {minimal}"
    );
    // Default ACLs: inherited by new files (masked by the create mode, no umask) and dirs.
    ok(&mnt, "mkdir dd; setfacl -d -m u:nobody:rwx,m::rwx dd");
    ok(&mnt, "umask 077; touch dd/nf; mkdir dd/nd");
    assert_eq!(
        perm(&mnt.join("dd/nf")),
        0o664,
        "touch: 0666 masked by the default ACL"
    );
    assert_eq!(perm(&mnt.join("dd/nd")), 0o775);
    let f = ok(&mnt, "getfacl -cp dd/nf");
    assert!(
        f.contains("user:nobody:rwx") && f.contains("mask::rw-"),
        "{f}"
    );
    let d = ok(&mnt, "getfacl -cp dd/nd");
    assert!(d.contains("default:user:nobody:rwx"), "{d}");
    assert!(
        sh(&mnt, Some("nobody"), "echo w >> dd/nf").0,
        "inherited entry grants"
    );
    // Without a default ACL the umask applies.
    ok(&mnt, "umask 077; touch plain");
    assert_eq!(perm(&mnt.join("plain")), 0o600);
}

/// Issue 12.4: chown of a fifo drops set-user-id and set-group-id (group-executable), as
/// ext4 does: `mkfifo x; chmod 06555 x; chown 65534:65534 x` gives 555.
#[test]
fn chown_of_a_fifo_clears_set_id_bits() {
    if !runnable(&["mkfifo"]) {
        return;
    }
    let fx = Fixture::new("");
    let mnt = fx.mnt();
    ok(&mnt, "mkfifo x; chmod 06555 x; chown 65534:65534 x");
    assert_eq!(perm(&mnt.join("x")), 0o555);
    ok(&mnt, "mknod c c 1 3; chmod 06555 c; chown 1:1 c");
    assert_eq!(perm(&mnt.join("c")), 0o555);
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path")
}

fn fstat(fd: i32) -> std::io::Result<libc::stat> {
    // SAFETY: `st` is plain old data the kernel fills; fd is ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; st is valid for writes.
    if unsafe { libc::fstat(fd, &mut st) } == 0 {
        Ok(st)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Issue 12.5: a directory open through a descriptor keeps working after rmdir and after a
/// rename over it: fstat gives nlink 0, not ENOENT, and a listing is an empty success or the
/// kernel's ENOENT for a dead directory, never a stale entry.
#[test]
fn an_open_directory_outlives_its_name() {
    if !runnable(&[]) {
        return;
    }
    let fx = Fixture::new("");
    let mnt = fx.mnt();
    for replace in [false, true] {
        let d = mnt.join("d");
        fs::create_dir(&d).expect("mkdir");
        let c = cpath(&d);
        // SAFETY: c is a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        assert!(fd >= 0, "open: {}", std::io::Error::last_os_error());
        if replace {
            fs::create_dir(mnt.join("e")).expect("mkdir");
            fs::rename(mnt.join("e"), &d).expect("rename over");
        } else {
            fs::remove_dir(&d).expect("rmdir");
        }
        let st = fstat(fd).expect("fstat of a removed directory");
        assert_eq!(st.st_nlink, 0, "replace={replace}");
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf is writable for its length; fd is an open directory.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        let e = std::io::Error::last_os_error();
        assert!(
            n == 0 || (n < 0 && e.raw_os_error() == Some(libc::ENOENT)),
            "listing a removed directory: {n} {e}"
        );
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        if replace {
            fs::remove_dir(&d).expect("rmdir");
        }
    }
}

/// atime of `p` as `stat -c %x` prints it (nanoseconds).
fn atime_of(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).expect("stat");
    (m.atime(), m.atime_nsec())
}

/// Issue 12.6: `-o noatime`, `strictatime` and the default relatime reach fern-fs. Reads go
/// around the page cache (O_DIRECT), since a read the cache answers never reaches the daemon.
#[test]
fn atime_mount_options() {
    if !runnable(&["dd"]) {
        return;
    }
    for opt in ["", "noatime", "strictatime", "strictatime,nodiratime"] {
        let fx = Fixture::new(opt);
        let mnt = fx.mnt();
        ok(&mnt, "echo hello > f; mkdir d");
        let read = || {
            ok(
                &mnt,
                "dd if=f of=/dev/null iflag=direct bs=4096 count=1 2>&1",
            )
        };
        let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
        let a0 = atime_of(&mnt.join("f"));
        pause();
        read();
        let a1 = atime_of(&mnt.join("f"));
        pause();
        read();
        let a2 = atime_of(&mnt.join("f"));
        match opt {
            // Just written, so stale: the first read updates it, the second does not.
            "" => assert!(a1 > a0 && a2 == a1, "relatime: {a0:?} {a1:?} {a2:?}"),
            "noatime" => assert!(a1 == a0 && a2 == a0, "noatime: {a0:?} {a1:?} {a2:?}"),
            _ => assert!(a1 > a0 && a2 > a1, "{opt}: {a0:?} {a1:?} {a2:?}"),
        }
        let d0 = atime_of(&mnt.join("d"));
        pause();
        ok(&mnt, "ls d > /dev/null");
        let d1 = atime_of(&mnt.join("d"));
        if opt.contains("nodiratime") || opt == "noatime" {
            assert_eq!(d1, d0, "{opt}: directory atime");
        } else {
            assert!(d1 > d0, "{opt}: a listing reads the directory");
        }
    }
}

/// Issue 12.8: through the kernel, `renameat2(RENAME_WHITEOUT)` works (overlayfs's call) and
/// leaves a 0/0 character device; FALLOC_FL_ZERO_RANGE zeroes and extends.
#[test]
fn rename_whiteout_and_zero_range() {
    if !runnable(&["fallocate"]) {
        return;
    }
    let fx = Fixture::new("");
    let mnt = fx.mnt();
    ok(&mnt, "echo data > a");
    let (a, b) = (cpath(&mnt.join("a")), cpath(&mnt.join("b")));
    // SAFETY: both paths are NUL-terminated and live across the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_WHITEOUT,
        )
    };
    assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
    let m = fs::symlink_metadata(mnt.join("a")).expect("whiteout");
    assert_eq!((m.mode() & libc::S_IFMT, m.rdev()), (libc::S_IFCHR, 0));
    assert_eq!(fs::read(mnt.join("b")).expect("read"), b"data\n");
    ok(
        &mnt,
        "head -c 12288 /dev/urandom > z; fallocate -z -o 100 -l 20000 z",
    );
    let z = fs::read(mnt.join("z")).expect("read");
    assert_eq!(z.len(), 20_100);
    assert!(z[100..].iter().all(|b| *b == 0));
    ok(&mnt, "fallocate -z -n -o 30000 -l 100 z");
    assert_eq!(fs::metadata(mnt.join("z")).expect("stat").len(), 20_100);
}

/// Issue 12.7: a 100 MiB file with one byte written takes one block, for stat and du.
#[test]
fn sparse_files_report_the_blocks_they_store() {
    if !runnable(&["dd", "du"]) {
        return;
    }
    let fx = Fixture::new("");
    let mnt = fx.mnt();
    ok(
        &mnt,
        "dd if=/dev/zero of=s bs=1 count=1 seek=104857599 2>/dev/null",
    );
    let m = fs::metadata(mnt.join("s")).expect("stat");
    assert_eq!((m.len(), m.blocks()), (100 << 20, 8));
    assert_eq!(ok(&mnt, "du -k s").split_whitespace().next(), Some("4"));
    assert_eq!(
        ok(&mnt, "du -k --apparent-size s")
            .split_whitespace()
            .next(),
        Some("102400")
    );
    ok(&mnt, "head -c 40960 /dev/urandom > dense");
    assert_eq!(fs::metadata(mnt.join("dense")).expect("stat").blocks(), 80);
}
