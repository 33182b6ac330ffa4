//! FUSE mounts made by a daemon process of the `fernfs` binary, driven through syscalls by
//! [`super::posix::PosixTarget`]:
//!
//! - `fernfs-fuse`: the real thing, `fernfs mkfs IMAGE` then `fernfs mount IMAGE MP -f` with
//!   default mount options (the node cache set to the run's budget), exactly what a user runs.
//! - `null-fuse`: `fernfs bench null-fuse MP --state FILE` ([`super::null_fuse`]).
//!
//! Both daemons are children of the task process, so they inherit its CPU affinity: with
//! `taskset -c 0` on the task, client and daemon share CPU 0 (checked and reported from
//! /proc). Readiness: the daemon prints `ready` on its stdout once the mount is usable (the
//! protocol `fernfs mount` uses between its parent and its daemon). Cold = unmount, wait for
//! the daemon to exit (fernfs: image closed), start it again; the caller then drops the page
//! cache. Teardown always runs (`Drop`), and the parent's [`super::posix::cleanup_leftovers`]
//! unmounts whatever a killed task left, which ends its daemon.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::posix::MountGuard;
use crate::procinfo;
use crate::{BenchError, Result};

/// Environment variable telling `fernfs mount -f` to report readiness on stdout (the same
/// one its own daemon mode sets).
pub const NOTIFY_ENV: &str = "FERNFS_NOTIFY_STDOUT";
/// How long a daemon may take to mount (fernfs replays its log on open).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a daemon may take to exit after its unmount (fernfs checkpoints and closes).
const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

/// Which daemon.
#[derive(Clone, Debug)]
pub enum Daemon {
    /// `fernfs mount IMAGE MP -f -o OPTIONS`.
    Fernfs {
        /// The image made by `fernfs mkfs`, or an `etcd://` URL.
        image: PathBuf,
        /// `-o` options.
        options: String,
    },
    /// `fernfs bench null-fuse MP --state FILE --transport T`.
    Null {
        /// Where the daemon keeps its namespace between mounts.
        state: PathBuf,
        /// Its FUSE transport.
        transport: fern_fuse::uring::Transport,
    },
}

/// A FUSE mount served by a daemon child process.
pub struct FuseMount {
    exe: PathBuf,
    daemon: Daemon,
    mountpoint: PathBuf,
    child: Option<Child>,
    /// CPUs the last daemon may run on (/proc/PID/status `Cpus_allowed_list`).
    pub daemon_cpus: String,
}

fn run_tool(exe: &Path, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BenchError::Usage(format!("cannot run {}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "`{} {}` failed ({}): {}",
            exe.display(),
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether a FUSE mount of `system` can be made here, or why not (for a uring system, also
/// whether the kernel allows FUSE over io_uring: a silent fallback would measure /dev/fuse
/// under the uring name).
pub fn fuse_unavailable(system: &str) -> Option<String> {
    if system.ends_with("-uring") {
        if let Err(why) = fern_fuse::uring::uring_enabled() {
            return Some(format!("{system} skipped: {why}"));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Some(format!("{system} skipped: no /dev/fuse (modprobe fuse)"));
    }
    if !procinfo::is_root() && Command::new("fusermount3").arg("-V").output().is_err() {
        return Some(format!(
            "{system} skipped: not root and no fusermount3 (apt-get install fuse3)"
        ));
    }
    None
}

/// Whether something is mounted on `mp` (/proc/self/mountinfo).
pub(crate) fn mounted_at(mp: &Path) -> bool {
    let Ok(mp) = mp.canonicalize() else {
        return false;
    };
    fern_fuse::mount_table(None)
        .map(|t| t.iter().any(|e| e.mount_point == mp))
        .unwrap_or(false)
}

/// Extra `-o` options for the fernfs-fuse systems' mounts (comma-separated), for A/B runs.
pub const EXTRA_OPTIONS_ENV: &str = "FERN_BENCH_MOUNT_OPTIONS";

impl FuseMount {
    /// `fernfs mkfs image` with defaults, then mounts it on `mountpoint` (created), with the
    /// options of [`EXTRA_OPTIONS_ENV`] added.
    pub fn fernfs(
        exe: &Path,
        image: &Path,
        mountpoint: &Path,
        cache_bytes: u64,
        transport: fern_fuse::uring::Transport,
    ) -> Result<Self> {
        let mut options = format!("cache_size={cache_bytes},transport={}", transport.name());
        // For A/B runs of one mount option (e.g. compression=lz4 against the default): said on
        // stderr, so a report made with it is not mistaken for the defaults.
        if let Some(extra) = std::env::var(EXTRA_OPTIONS_ENV)
            .ok()
            .filter(|e| !e.is_empty())
        {
            eprintln!("fernfs bench: fernfs-fuse mounted with extra options {extra} ({EXTRA_OPTIONS_ENV})");
            options.push(',');
            options.push_str(&extra);
        }
        Self::fernfs_on(exe, image, mountpoint, options)
    }

    /// `fernfs mkfs target`, then `fernfs mount target MP -f -o options`: `target` is an
    /// image or an `etcd://` URL.
    pub fn fernfs_on(
        exe: &Path,
        target: &Path,
        mountpoint: &Path,
        options: String,
    ) -> Result<Self> {
        run_tool(exe, &["mkfs".as_ref(), target.as_os_str()])?;
        Self::start(
            exe,
            Daemon::Fernfs {
                image: target.to_path_buf(),
                options,
            },
            mountpoint,
        )
    }

    /// The null FUSE file system on `mountpoint` (created), its namespace kept in `state`
    /// between mounts.
    pub fn null(
        exe: &Path,
        state: &Path,
        mountpoint: &Path,
        transport: fern_fuse::uring::Transport,
    ) -> Result<Self> {
        let _ = std::fs::remove_file(state);
        Self::start(
            exe,
            Daemon::Null {
                state: state.to_path_buf(),
                transport,
            },
            mountpoint,
        )
    }

    fn start(exe: &Path, daemon: Daemon, mountpoint: &Path) -> Result<Self> {
        std::fs::create_dir_all(mountpoint)?;
        let mut m = FuseMount {
            exe: exe.to_path_buf(),
            daemon,
            mountpoint: mountpoint.to_path_buf(),
            child: None,
            daemon_cpus: String::new(),
        };
        m.mount()?;
        Ok(m)
    }

    fn mount(&mut self) -> Result<()> {
        let mut cmd = Command::new(&self.exe);
        match &self.daemon {
            Daemon::Fernfs { image, options } => {
                cmd.arg("mount")
                    .arg(image)
                    .arg(&self.mountpoint)
                    .arg("-f")
                    .arg("-o")
                    .arg(options)
                    .env(NOTIFY_ENV, "1");
            }
            Daemon::Null { state, transport } => {
                cmd.args(["bench", "null-fuse"])
                    .arg(&self.mountpoint)
                    .arg("--state")
                    .arg(state)
                    .args(["--transport", transport.name()]);
            }
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Usage(format!("cannot run {}: {e}", self.exe.display())))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Usage("daemon: no stdout pipe".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(READY_TIMEOUT);
        match line {
            Ok(l) if l.trim() == "ready" => {
                self.daemon_cpus = cpus_allowed(child.id());
                self.child = Some(child);
                Ok(())
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let why = match other {
                    Ok(l) if !l.trim().is_empty() => l.trim().to_string(),
                    Ok(_) => "the daemon exited before the mount was ready".into(),
                    Err(_) => format!("not ready after {} s", READY_TIMEOUT.as_secs()),
                };
                Err(BenchError::Usage(format!(
                    "FUSE mount on {}: {why}",
                    self.mountpoint.display()
                )))
            }
        }
    }

    fn is_mounted(&self) -> bool {
        mounted_at(&self.mountpoint)
    }

    /// Unmounts (lazily as a last resort) and waits for the daemon to exit.
    fn umount(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let mp = self.mountpoint.to_string_lossy().into_owned();
        let mut last = None;
        for _ in 0..20 {
            if !self.is_mounted() {
                last = None;
                break;
            }
            let r = if procinfo::is_root() {
                Command::new("umount").arg(&mp).output()
            } else {
                Command::new("fusermount3").args(["-u", &mp]).output()
            };
            match r {
                Ok(o) if o.status.success() => {
                    last = None;
                    break;
                }
                Ok(o) => last = Some(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                Err(e) => last = Some(e.to_string()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if last.is_some() {
            let _ = Command::new("umount").args(["-l", &mp]).output();
        }
        // The daemon ends its session on the unmount; fernfs then checkpoints and closes.
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() < EXIT_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(BenchError::Usage(format!(
                        "FUSE daemon of {mp} did not exit after its unmount; killed"
                    )));
                }
            }
        }
        match last {
            Some(e) => Err(BenchError::Usage(format!("umount {mp}: {e}"))),
            None => Ok(()),
        }
    }
}

impl FuseMount {
    /// The running daemon's process id.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// The CPUs process `pid` may run on, from /proc.
pub fn cpus_allowed(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "?".into())
}

impl MountGuard for FuseMount {
    fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn remount(&mut self) -> Result<()> {
        self.umount()?;
        self.mount()
    }

    /// fernfs: the image file's allocated blocks (the image is its device); null: nothing.
    fn space_used(&self) -> Result<Option<u64>> {
        match &self.daemon {
            // An etcd file system has no image here (its bytes are etcd's).
            Daemon::Fernfs { image, .. } if image.to_string_lossy().starts_with("etcd://") => {
                Ok(None)
            }
            Daemon::Fernfs { image, .. } => Ok(Some(super::lib_target::image_blocks(image)?)),
            Daemon::Null { .. } => Ok(None),
        }
    }

    /// fernfs on an image: what the daemon dirtied or wrote (its /proc/PID/io), less what was
    /// dropped before it was written.
    fn device_bytes_written(&self) -> Result<Option<u64>> {
        match (&self.daemon, self.daemon_pid()) {
            (Daemon::Fernfs { image, .. }, Some(pid))
                if !image.to_string_lossy().starts_with("etcd://") =>
            {
                let c = procinfo::io_counters_of(pid)?;
                Ok(Some(c.write_bytes.saturating_sub(c.cancelled_write_bytes)))
            }
            _ => Ok(None),
        }
    }

    fn teardown(&mut self) -> Result<()> {
        let r = self.umount();
        let _ = std::fs::remove_dir(&self.mountpoint);
        r
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("warning: teardown of {}: {e}", self.mountpoint.display());
        }
    }
}
