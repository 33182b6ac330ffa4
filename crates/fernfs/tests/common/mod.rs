//! What the fernfs command-line tests share: running the binary under test
//! (`CARGO_BIN_EXE_fernfs` exists only in this crate's tests, so this cannot live in
//! fern-testkit), a scratch image beside its mount point, a guard that detaches whatever a
//! test left mounted, and the committed image fixtures. Each test file uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

/// The fernfs binary, to add arguments, environment or stdio to.
pub fn fernfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fernfs"))
}

/// Runs `fernfs ARGS` and returns what it did.
pub fn run<S: AsRef<OsStr>>(args: &[S]) -> Output {
    fernfs().args(args).output().expect("run fernfs")
}

/// Runs `fernfs ARGS`, which must succeed (the message carries what it printed).
pub fn ok<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let out = run(args);
    assert!(
        out.status.success(),
        "fernfs {:?} failed: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>(),
        text(&out)
    );
    out
}

/// Sends SIGINT to `child` alone (as a test can send Ctrl-C) and waits for what it printed.
pub fn interrupt(child: Child) -> Output {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("send SIGINT");
    child.wait_with_output().expect("wait for fernfs")
}

/// stdout then stderr, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Detaches, on drop, every mount stacked at the path (a test may leave several), lazily,
/// whatever state their daemons are in.
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        for _ in 0..8 {
            if top(&self.0).is_none() {
                return;
            }
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The topmost mount at `dir`: (type, source).
pub fn top(dir: &Path) -> Option<(String, String)> {
    let table = fern_fuse::mount_table(None).ok()?;
    fern_fuse::top_mount(&table, dir).map(|e| (e.fs_type.clone(), e.source.clone()))
}

/// Two empty mount points `a` and `b` in a scratch directory, each detached on drop: for two
/// mounts of one file system.
pub struct MountPoints {
    // Declared first so they drop first: the mounts go before their directory.
    _guards: [MountGuard; 2],
    pub a: PathBuf,
    pub b: PathBuf,
    pub dir: tempfile::TempDir,
}

impl MountPoints {
    pub fn two() -> MountPoints {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir(&a).expect("mkdir a");
        std::fs::create_dir(&b).expect("mkdir b");
        MountPoints {
            _guards: [MountGuard(a.clone()), MountGuard(b.clone())],
            a,
            b,
            dir: tmp,
        }
    }
}

/// The pid of a process whose command line holds every one of `args` (a daemon the test
/// started, found by its mount point or image).
pub fn pid_with_args(args: &[&[u8]]) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let have: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.iter().all(|a| have.contains(a)) {
            return Some(pid);
        }
    }
    None
}

/// A scratch directory holding the path of an image `fs.img` (not created) and an empty mount
/// point `mnt` that is detached when this is dropped.
pub struct Scratch {
    // Declared first so it drops first: the mount goes before its directory.
    _guard: MountGuard,
    pub img: PathBuf,
    pub mnt: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("create the mount point");
        Scratch {
            _guard: MountGuard(mnt.clone()),
            img,
            mnt,
            dir,
        }
    }

    /// A scratch directory whose image `fernfs mkfs` has made.
    pub fn with_image() -> Scratch {
        let s = Scratch::new();
        ok(&["mkfs".as_ref(), s.img.as_os_str()]);
        s
    }

    /// A scratch directory with an image, for a test that mounts it: `None` when FUSE is not
    /// available (then the test returns; under `FERN_REQUIRE_FUSE=1` this fails it instead).
    pub fn for_mount() -> Option<Scratch> {
        if fern_testkit::skipped(fern_testkit::Need::Fuse, fern_testkit::fuse_available()) {
            return None;
        }
        Some(Scratch::with_image())
    }

    /// `fernfs mount IMG MNT EXTRA…`, which must succeed.
    pub fn mount(&self, extra: &[&str]) {
        let mut args = vec![
            OsStr::new("mount"),
            self.img.as_os_str(),
            self.mnt.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        ok(&args);
    }

    /// `fernfs umount MNT`, which must succeed.
    pub fn umount(&self) {
        ok(&["umount".as_ref(), self.mnt.as_os_str()]);
    }
}

/// Unpacks the committed fixture `tests/fixtures/NAME.img.zst` into `dir` and returns the
/// image's path. Written sparse, as mkfs left it: only the non-zero 4 KiB pages.
pub fn unpack_fixture(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{name}.img.zst"));
    let packed = std::fs::read(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let img = dir.join(format!("{name}.img"));
    let raw = zstd::decode_all(packed.as_slice()).expect("fixture decompresses");
    let f = std::fs::File::create(&img).expect("create image");
    f.set_len(raw.len() as u64).expect("size");
    for (i, page) in raw.chunks(4096).enumerate() {
        if page.iter().any(|&b| b != 0) {
            f.write_all_at(page, i as u64 * 4096).expect("write page");
        }
    }
    img
}
