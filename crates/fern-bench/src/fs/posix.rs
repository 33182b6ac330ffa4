//! Any mounted file system through syscalls (std::fs and libc), and [`LoopMount`]: a kernel
//! file system on a fresh image file, loop-attached with `losetup --direct-io=on` (no double
//! caching), made with the file system's default mkfs options and mounted by the harness.
//!
//! Teardown always runs: [`LoopMount`]'s `Drop` unmounts (lazily if it must) and detaches the
//! loop device, on success, on error and on panic (the release profile unwinds). If the
//! process is killed outright, the parent runs [`cleanup_leftovers`] on the task's directory,
//! so no mount or loop device outlives a run.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::target::{op_err, Entry, FileId, FsTarget, StatLite};
use crate::procinfo;
use crate::{BenchError, Result};

/// Runs a command, failing with its stderr.
fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BenchError::Usage(format!("cannot run {cmd}: {e} (is it installed?)")))?;
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "`{cmd} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(cmd).is_file())
}

/// Why a loop-mounted `fstype` cannot be used here, or `None` if it can.
pub fn loop_mount_unavailable(fstype: &str) -> Option<String> {
    if !procinfo::is_root() {
        return Some(format!(
            "{fstype} skipped: loop-mounting an image needs root (run the benchmark with sudo)"
        ));
    }
    let mkfs = format!("mkfs.{fstype}");
    for tool in ["losetup", "mount", "umount", mkfs.as_str()] {
        if !on_path(tool) {
            let pkg = match fstype {
                "xfs" => "xfsprogs",
                "btrfs" => "btrfs-progs",
                _ => "util-linux / e2fsprogs",
            };
            return Some(format!(
                "{fstype} skipped: `{tool}` not found (apt-get install {pkg})"
            ));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some(format!(
            "{fstype} skipped: no /dev/loop-control (load the loop module: `modprobe loop`)"
        ));
    }
    None
}

/// A kernel file system on an image file, attached to a loop device and mounted.
#[derive(Debug)]
pub struct LoopMount {
    fstype: String,
    image: PathBuf,
    dev: Option<String>,
    mountpoint: PathBuf,
    mounted: bool,
}

impl LoopMount {
    /// Creates a sparse image of `size` bytes at `image`, attaches it with direct I/O, makes
    /// `fstype` on it with default options and mounts it on `mountpoint` (created).
    pub fn create(fstype: &str, image: &Path, size: u64, mountpoint: &Path) -> Result<LoopMount> {
        if let Some(why) = loop_mount_unavailable(fstype) {
            return Err(BenchError::Usage(why));
        }
        let f = File::create(image)?;
        f.set_len(size)?;
        drop(f);
        let mut m = LoopMount {
            fstype: fstype.to_string(),
            image: image.to_path_buf(),
            dev: None,
            mountpoint: mountpoint.to_path_buf(),
            mounted: false,
        };
        // From here on, Drop undoes whatever was done.
        let img = image.to_string_lossy().into_owned();
        let dev = run("losetup", &["--direct-io=on", "-f", "--show", &img])?;
        m.dev = Some(dev.clone());
        let mkfs = format!("mkfs.{fstype}");
        // Default options, quiet; the image is fresh (sparse zeros), so no `-f` is needed.
        let quiet: &[&str] = match fstype {
            f if f.starts_with("ext") || f == "xfs" || f == "btrfs" => &["-q"],
            _ => &[],
        };
        let mut args: Vec<&str> = quiet.to_vec();
        args.push(&dev);
        run(&mkfs, &args)?;
        fs::create_dir_all(mountpoint)?;
        m.mount()?;
        Ok(m)
    }

    fn mount(&mut self) -> Result<()> {
        let dev = self.dev.clone().unwrap_or_default();
        let mp = self.mountpoint.to_string_lossy().into_owned();
        run("mount", &["-t", &self.fstype, &dev, &mp])?;
        self.mounted = true;
        Ok(())
    }

    fn umount(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        let mp = self.mountpoint.to_string_lossy().into_owned();
        let mut last = None;
        // Up to 10 s: once seen failing with EBUSY for over 2 s right after a 256 MiB file was
        // fsynced and closed on XFS (nothing of ours was open), on this busy shared machine.
        for _ in 0..50 {
            match run("umount", &[&mp]) {
                Ok(_) => {
                    self.mounted = false;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // Name who holds it, so the failure can be understood.
        let holders = Command::new("fuser")
            .args(["-vm", &mp])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .replace('\n', "; ")
            })
            .unwrap_or_default();
        Err(match last {
            Some(e) if !holders.is_empty() => {
                BenchError::Usage(format!("{e} (holders: {holders})"))
            }
            Some(e) => e,
            None => BenchError::Usage(format!("umount {mp} failed")),
        })
    }

    /// Unmounts and mounts again (cold metadata and data).
    pub fn remount(&mut self) -> Result<()> {
        self.umount()?;
        self.mount()
    }

    /// Where the file system is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The loop device.
    pub fn device(&self) -> Option<&str> {
        self.dev.as_deref()
    }

    /// Unmounts, detaches and removes the image; reports the first failure.
    pub fn teardown(&mut self) -> Result<()> {
        let mut first: Option<BenchError> = None;
        if let Err(e) = self.umount() {
            // Last resort so the loop device can go: a lazy unmount.
            let mp = self.mountpoint.to_string_lossy().into_owned();
            if run("umount", &["-l", &mp]).is_ok() {
                self.mounted = false;
            }
            first = Some(e);
        }
        if let Some(dev) = self.dev.take() {
            if let Err(e) = run("losetup", &["-d", &dev]) {
                first.get_or_insert(e);
            }
        }
        let _ = fs::remove_dir(&self.mountpoint);
        let _ = fs::remove_file(&self.image);
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("warning: teardown of {}: {e}", self.mountpoint.display());
        }
    }
}

/// Unmounts every mount below `dir` and detaches every loop device whose backing file is
/// below `dir` (what a killed task may leave behind). Returns what it cleaned.
pub fn cleanup_leftovers(dir: &Path) -> Vec<String> {
    let mut done = Vec::new();
    let Ok(dir) = dir.canonicalize() else {
        return done;
    };
    if let Ok(table) = fern_fuse::mount_table(None) {
        let mut points: Vec<PathBuf> = table
            .into_iter()
            .map(|e| e.mount_point)
            .filter(|p| p.starts_with(&dir))
            .collect();
        points.sort();
        for p in points.into_iter().rev() {
            let s = p.to_string_lossy().into_owned();
            if run("umount", &[&s]).is_ok() || run("umount", &["-l", &s]).is_ok() {
                done.push(format!("unmounted {s}"));
            }
        }
    }
    if let Ok(list) = run("losetup", &["-n", "-O", "NAME,BACK-FILE", "-l"]) {
        for line in list.lines() {
            let mut it = line.split_whitespace();
            let (Some(dev), Some(back)) = (it.next(), it.next()) else {
                continue;
            };
            if Path::new(back).starts_with(&dir) && run("losetup", &["-d", dev]).is_ok() {
                done.push(format!("detached {dev} ({back})"));
            }
        }
    }
    done
}

/// Makes this process ignore SIGINT and SIGTERM sent to its process group: a task child calls
/// it so that a Ctrl-C stops the parent while the running task finishes and tears its mount
/// down (a child killed outright is cleaned up by the parent or by the next run's sweep).
pub fn ignore_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing SIG_IGN touches no memory of ours and has no handler to race.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Cleans what dead runs left in `tmp`: for every `fernfs-bench-fs-PID` directory whose PID
/// no longer runs, unmounts and detaches what is below it and removes it. Returns what it did.
pub fn sweep_stale_runs(tmp: &Path) -> Vec<String> {
    let mut done = Vec::new();
    let Ok(rd) = fs::read_dir(tmp) else {
        return done;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("fernfs-bench-fs-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        done.extend(cleanup_leftovers(&dir));
        if fs::remove_dir_all(&dir).is_ok() {
            // A finished run keeps its scratch directory when a task failed (the failure
            // message points at the task's log there), so not every leftover is a crash.
            done.push(format!(
                "removed {} (left by an earlier run: one that died, or the logs of its failed \
                 tasks)",
                dir.display()
            ));
        }
    }
    done
}

/// A mount the harness made and must undo: a loop-mounted kernel file system or a FUSE daemon.
pub trait MountGuard: Send + Sync {
    /// Where it is mounted.
    fn mountpoint(&self) -> &Path;
    /// Unmounts and mounts again (cold metadata and data in the file system itself).
    fn remount(&mut self) -> Result<()>;
    /// Unmounts and releases everything it made; reports the first failure.
    fn teardown(&mut self) -> Result<()>;
    /// Bytes used on the device (see [`FsTarget::space_used`]).
    fn space_used(&self) -> Result<Option<u64>>;
    /// Bytes sent toward the device so far (see [`FsTarget::device_bytes_written`]).
    fn device_bytes_written(&self) -> Result<Option<u64>> {
        Ok(None)
    }
}

impl MountGuard for LoopMount {
    fn mountpoint(&self) -> &Path {
        LoopMount::mountpoint(self)
    }

    fn remount(&mut self) -> Result<()> {
        LoopMount::remount(self)
    }

    fn teardown(&mut self) -> Result<()> {
        LoopMount::teardown(self)
    }

    /// Used blocks as df(1) counts them: (f_blocks - f_bfree) × f_frsize.
    fn space_used(&self) -> Result<Option<u64>> {
        let st = rustix::fs::statvfs(&self.mountpoint).map_err(std::io::Error::from)?;
        Ok(Some((st.f_blocks - st.f_bfree) * st.f_frsize))
    }

    /// What the loop device received: data, metadata and journal alike.
    fn device_bytes_written(&self) -> Result<Option<u64>> {
        match &self.dev {
            Some(dev) => Ok(Some(procinfo::block_device_bytes_written(dev)?)),
            None => Ok(None),
        }
    }
}

/// How [`FsTarget::sync`] makes everything durable on a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncBy {
    /// syncfs(2) on the mount.
    Syncfs,
    /// fsync(2) of the root directory. The kernel sends no request for syncfs(2) on a
    /// /dev/fuse mount (FUSE_SYNCFS is virtiofs-only), so on FUSE syncfs would time nothing;
    /// fsync of a directory is FUSE_FSYNCDIR, which fern-fs answers by making the whole store
    /// durable (one ordered log).
    FsyncRoot,
}

/// A mounted file system driven through syscalls.
pub struct PosixTarget {
    system: &'static str,
    root: PathBuf,
    mount: Option<Box<dyn MountGuard>>,
    files: Mutex<HashMap<u64, File>>,
    next: AtomicU64,
    about: String,
    sync_by: SyncBy,
    keeps_data: bool,
}

impl PosixTarget {
    /// A fresh loop-mounted `fstype` of `size` bytes; image and mountpoint live in `dir`.
    pub fn loop_mounted(
        system: &'static str,
        fstype: &str,
        dir: &Path,
        size: u64,
    ) -> Result<PosixTarget> {
        let m = LoopMount::create(fstype, &dir.join("image"), size, &dir.join("mnt"))?;
        let about = format!(
            "{system}: loop-mounted {} GiB sparse image (losetup --direct-io=on), default \
             mkfs.{fstype} and mount options, syscalls via std::fs/libc",
            size >> 30
        );
        Ok(PosixTarget::on_mount(
            system,
            Box::new(m),
            about,
            SyncBy::Syncfs,
            true,
        ))
    }

    /// Syscalls on a mount made by someone else's guard (`keeps_data` false: reads are not
    /// expected to return what was written, so content checks are skipped).
    pub fn on_mount(
        system: &'static str,
        mount: Box<dyn MountGuard>,
        about: String,
        sync_by: SyncBy,
        keeps_data: bool,
    ) -> PosixTarget {
        PosixTarget {
            system,
            root: mount.mountpoint().to_path_buf(),
            mount: Some(mount),
            files: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            about,
            sync_by,
            keeps_data,
        }
    }

    fn p(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn err(&self, op: &str, path: &str, e: impl std::fmt::Display) -> BenchError {
        op_err(self.system, op, path, e)
    }

    fn with_file<T>(
        &self,
        f: FileId,
        op: &str,
        body: impl FnOnce(&File) -> std::io::Result<T>,
    ) -> Result<T> {
        let files = self.files.lock();
        let file = files
            .get(&f.0)
            .ok_or_else(|| self.err(op, &format!("fd {}", f.0), "not open"))?;
        body(file).map_err(|e| self.err(op, &format!("fd {}", f.0), e))
    }
}

impl FsTarget for PosixTarget {
    fn system(&self) -> &'static str {
        self.system
    }

    fn describe(&self) -> String {
        self.about.clone()
    }

    fn mkdir(&self, path: &str) -> Result<()> {
        fs::create_dir(self.p(path)).map_err(|e| self.err("mkdir", path, e))
    }

    fn write_new(&self, path: &str, data: &[u8]) -> Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(self.p(path))
            .map_err(|e| self.err("create", path, e))?;
        if !data.is_empty() {
            f.write_all_at(data, 0)
                .map_err(|e| self.err("write", path, e))?;
        }
        Ok(())
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        File::open(self.p(path))
            .and_then(|mut f| f.read_to_end(&mut out))
            .map_err(|e| self.err("read", path, e))?;
        Ok(out)
    }

    fn list(&self, path: &str) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for e in fs::read_dir(self.p(path)).map_err(|e| self.err("readdir", path, e))? {
            let e = e.map_err(|e| self.err("readdir", path, e))?;
            let is_dir = e
                .file_type()
                .map(|t| t.is_dir())
                .map_err(|e| self.err("readdir", path, e))?;
            out.push(Entry {
                name: e.file_name().to_string_lossy().into_owned(),
                is_dir,
            });
        }
        Ok(out)
    }

    fn lstat(&self, path: &str) -> Result<StatLite> {
        let m = fs::symlink_metadata(self.p(path)).map_err(|e| self.err("lstat", path, e))?;
        Ok(StatLite {
            size: m.len(),
            mode: m.mode(),
            is_dir: m.is_dir(),
            mtime_s: m.mtime(),
        })
    }

    fn chmod(&self, path: &str, perm: u32) -> Result<()> {
        fs::set_permissions(self.p(path), fs::Permissions::from_mode(perm))
            .map_err(|e| self.err("chmod", path, e))
    }

    fn set_times(&self, path: &str, secs: i64) -> Result<()> {
        use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD};
        let t = Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        };
        let times = Timestamps {
            last_access: t,
            last_modification: t,
        };
        utimensat(CWD, self.p(path), &times, AtFlags::empty())
            .map_err(|e| self.err("utimens", path, std::io::Error::from(e)))
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        fs::rename(self.p(from), self.p(to))
            .map_err(|e| self.err("rename", &format!("{from} -> {to}"), e))
    }

    fn unlink(&self, path: &str) -> Result<()> {
        fs::remove_file(self.p(path)).map_err(|e| self.err("unlink", path, e))
    }

    fn rmdir(&self, path: &str) -> Result<()> {
        fs::remove_dir(self.p(path)).map_err(|e| self.err("rmdir", path, e))
    }

    fn open(&self, path: &str, create: bool) -> Result<FileId> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(0o644)
            .open(self.p(path))
            .map_err(|e| self.err("open", path, e))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(id, f);
        Ok(FileId(id))
    }

    fn pwrite(&self, f: FileId, offset: u64, data: &[u8]) -> Result<()> {
        self.with_file(f, "pwrite", |file| file.write_all_at(data, offset))
    }

    fn pread(&self, f: FileId, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.with_file(f, "pread", |file| {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match file.read_at(&mut buf[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            buf.truncate(got);
            Ok(buf)
        })
    }

    fn fsync(&self, f: FileId) -> Result<()> {
        self.with_file(f, "fsync", |file| file.sync_all())
    }

    fn close(&self, f: FileId) -> Result<()> {
        self.files
            .lock()
            .remove(&f.0)
            .map(drop)
            .ok_or_else(|| self.err("close", &format!("fd {}", f.0), "not open"))
    }

    fn keeps_data(&self) -> bool {
        self.keeps_data
    }

    fn mount_path(&self) -> Option<PathBuf> {
        Some(self.root.clone())
    }

    fn space_used(&self) -> Result<Option<u64>> {
        match &self.mount {
            Some(m) => m.space_used(),
            None => Ok(None),
        }
    }

    fn device_bytes_written(&self) -> Result<Option<u64>> {
        match &self.mount {
            Some(m) => m.device_bytes_written(),
            None => Ok(None),
        }
    }

    fn sync(&self) -> Result<()> {
        let root = self.root.display().to_string();
        let d = File::open(&self.root).map_err(|e| self.err("syncfs", &root, e))?;
        if self.sync_by == SyncBy::FsyncRoot {
            return d.sync_all().map_err(|e| self.err("fsync", &root, e));
        }
        rustix::fs::syncfs(&d).map_err(|e| self.err("syncfs", &root, std::io::Error::from(e)))
    }

    fn cold(&mut self, drop_caches: bool) -> Result<bool> {
        self.files.lock().clear();
        if let Some(m) = self.mount.as_mut() {
            m.remount()?;
        }
        Ok(drop_caches && procinfo::drop_page_cache())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.files.lock().clear();
        match self.mount.take() {
            Some(mut m) => m.teardown(),
            None => Ok(()),
        }
    }
}
