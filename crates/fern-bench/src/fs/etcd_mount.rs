//! The systems on etcd (docs/distributed.md §11): each owns a private etcd
//! ([`fern_etcd::local::LocalEtcd`], one member on loopback, data directory in `/dev/shm`, so
//! etcd's own fsyncs cost nothing and what is measured is round trips and the file system's
//! work) and one FUSE mount on it, driven through syscalls by [`super::posix::PosixTarget`]:
//!
//! - `fernfs-etcd`: `fernfs mkfs etcd://…` then `fernfs mount etcd://… MP -f` (the daemon of
//!   [`super::fuse_mount`]).
//! - `juicefs-etcd`: `juicefs format --storage file` with its metadata in the same kind of
//!   private etcd, then `juicefs mount` — only where a `juicefs` binary is on PATH (it is not
//!   built here). Its `file` storage does not fsync data: durable workloads are not comparable
//!   one to one.
//!
//! With `FERN_BENCH_ETCD=HOST:PORT[,HOST:PORT...]` (e.g. the endpoints `scripts/etcd-cluster
//! start` prints) both systems use that cluster instead, each task under a prefix of its own
//! (fernfs `bench-fernfs-PID-N`, JuiceFS `bench-jfs-PID-N`), so both systems run on one
//! cluster; the prefixes are left for `scripts/etcd-cluster stop` to remove.
//!
//! It owns the private etcd server's lifetime (it outlives the mount: teardown unmounts
//! first); it must never touch an etcd it did not start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fern_etcd::local::{unique_prefix, LocalEtcd};

use super::fuse_mount::{mounted_at, FuseMount};
use super::posix::MountGuard;
use crate::{BenchError, Result};

/// How long `juicefs mount` may take to show its mount.
const JUICE_READY: Duration = Duration::from_secs(60);

/// The environment variable naming an existing cluster for the etcd systems.
pub const CLUSTER_ENV: &str = "FERN_BENCH_ETCD";

/// Where an etcd system keeps its metadata (and fernfs its data).
enum Server {
    /// A private single-member etcd, stopped with the task.
    Private(LocalEtcd),
    /// An existing cluster ([`CLUSTER_ENV`]): its endpoints.
    Cluster(String),
}

impl Server {
    fn open() -> Result<Self> {
        match std::env::var(CLUSTER_ENV) {
            Ok(e) if !e.trim().is_empty() => Ok(Server::Cluster(e.trim().to_string())),
            _ => LocalEtcd::start()
                .map(Server::Private)
                .map_err(|e| BenchError::Usage(format!("private etcd: {e}"))),
        }
    }

    /// The URL of a fresh file system of this task (`what` names the system).
    fn url(&self, what: &str) -> String {
        match self {
            Server::Private(etcd) => etcd.url(what),
            Server::Cluster(endpoints) => format!(
                "{}{endpoints}/{}",
                fern_etcd::SCHEME,
                unique_prefix(&format!("bench-{what}"))
            ),
        }
    }

    fn describe(&self) -> String {
        match self {
            Server::Private(_) => format!(
                "a private single-member etcd {} with its data in /dev/shm (etcd's fsyncs free)",
                etcd_version()
            ),
            Server::Cluster(e) => format!(
                "the etcd cluster {e} ({CLUSTER_ENV}; etcd {}), a prefix of this task's own",
                etcd_version()
            ),
        }
    }
}

/// Why `system` (an etcd system) cannot run here, if it cannot.
pub fn etcd_unavailable(system: &str) -> Option<String> {
    let cluster = std::env::var(CLUSTER_ENV).is_ok_and(|e| !e.trim().is_empty());
    if !cluster && !LocalEtcd::binary_available() {
        return Some(format!(
            "{system} skipped: no etcd binary on PATH (apt-get install etcd-server)"
        ));
    }
    if system.starts_with("juicefs") && !juicefs_available() {
        return Some(format!(
            "{system} skipped: no juicefs binary on PATH (it is not built by fernfs)"
        ));
    }
    None
}

fn juicefs_available() -> bool {
    Command::new("juicefs")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Extra `-o` options of the `fernfs-etcd` mount (comma-separated), for A/B runs.
pub const ETCD_OPTIONS_ENV: &str = "FERN_BENCH_ETCD_OPTIONS";

/// A mount on a private etcd; unmounted before the server stops.
pub struct EtcdMount {
    // Field order is drop order: the mount goes before its server.
    mount: Box<dyn MountGuard>,
    _etcd: Server,
}

impl EtcdMount {
    /// `fernfs-etcd` in `dir`: a private etcd, `fernfs mkfs` and `fernfs mount -f` on it.
    pub fn fernfs(exe: &Path, dir: &Path) -> Result<(Self, String)> {
        let etcd = Server::open()?;
        let url = etcd.url("fernfs");
        let mut options = "transport=dev".to_string();
        // For A/B runs (e.g. delegations=off against the default), said in the report.
        let extra = std::env::var(ETCD_OPTIONS_ENV).unwrap_or_default();
        if !extra.is_empty() {
            options.push(',');
            options.push_str(&extra);
        }
        let m = FuseMount::fernfs_on(exe, Path::new(&url), &dir.join("mnt"), options.clone())?;
        let about = format!(
            "fernfs-etcd: `fernfs mkfs {url}` + `fernfs mount … MP -f -o {options}` by {} \
             (etcd mount defaults: 1 s entry/attribute TTLs, write-back `delegations=auto` unless \
             the options say otherwise), daemon on CPUs {}; {}; sync = fsync of the root directory (sends what \
             the write-back buffered)",
            exe.display(),
            m.daemon_cpus,
            etcd.describe(),
        );
        Ok((
            EtcdMount {
                mount: Box::new(m),
                _etcd: etcd,
            },
            about,
        ))
    }

    /// `juicefs-etcd` in `dir`: a private etcd, `juicefs format --storage file` with its
    /// bucket in `dir`, and `juicefs mount` (foreground, a child of this process).
    pub fn juicefs(dir: &Path) -> Result<(Self, String)> {
        let etcd = Server::open()?;
        let meta = etcd.url("jfs");
        let bucket = dir.join("jfs-bucket");
        std::fs::create_dir_all(&bucket)?;
        let out = Command::new("juicefs")
            .args(["format", "--storage", "file", "--bucket"])
            .arg(format!("{}/", bucket.display()))
            .arg(&meta)
            .arg("bench")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BenchError::Usage(format!("juicefs format: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Usage(format!(
                "juicefs format {meta}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut m = JuiceMount {
            meta: meta.clone(),
            mountpoint: dir.join("mnt"),
            child: None,
        };
        m.mount()?;
        let about = format!(
            "juicefs-etcd: `juicefs format --storage file {meta}` (data files in {}, not \
             fsynced by JuiceFS) + `juicefs mount … MP` (defaults), {}",
            bucket.display(),
            etcd.describe()
        );
        Ok((
            EtcdMount {
                mount: Box::new(m),
                _etcd: etcd,
            },
            about,
        ))
    }
}

fn etcd_version() -> String {
    Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim_start_matches("etcd Version:").trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

impl MountGuard for EtcdMount {
    fn mountpoint(&self) -> &Path {
        self.mount.mountpoint()
    }

    fn remount(&mut self) -> Result<()> {
        self.mount.remount()
    }

    fn teardown(&mut self) -> Result<()> {
        // The server stops when `self` is dropped (its guard removes the data directory).
        self.mount.teardown()
    }

    /// The bytes are etcd's (and JuiceFS's bucket): no device of the file system's own.
    fn space_used(&self) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// A `juicefs mount` child process.
struct JuiceMount {
    meta: String,
    mountpoint: PathBuf,
    child: Option<Child>,
}

impl JuiceMount {
    fn mounted(&self) -> bool {
        mounted_at(&self.mountpoint)
    }

    fn mount(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.mountpoint)?;
        let child = Command::new("juicefs")
            .arg("mount")
            .arg(&self.meta)
            .arg(&self.mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| BenchError::Usage(format!("juicefs mount: {e}")))?;
        self.child = Some(child);
        let start = Instant::now();
        while !self.mounted() {
            if start.elapsed() > JUICE_READY {
                let _ = self.umount();
                return Err(BenchError::Usage(format!(
                    "juicefs mount on {}: not mounted after {} s",
                    self.mountpoint.display(),
                    JUICE_READY.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn umount(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let out = Command::new("juicefs")
            .arg("umount")
            .arg(&self.mountpoint)
            .output();
        if self.mounted() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
        let _ = child.wait();
        match out {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(BenchError::Usage(format!(
                "juicefs umount {}: {}",
                self.mountpoint.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ))),
            Err(e) => Err(BenchError::Usage(format!("juicefs umount: {e}"))),
        }
    }
}

impl MountGuard for JuiceMount {
    fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn remount(&mut self) -> Result<()> {
        self.umount()?;
        self.mount()
    }

    fn teardown(&mut self) -> Result<()> {
        let r = self.umount();
        let _ = std::fs::remove_dir(&self.mountpoint);
        r
    }

    fn space_used(&self) -> Result<Option<u64>> {
        Ok(None)
    }
}

impl Drop for JuiceMount {
    fn drop(&mut self) {
        let _ = self.umount();
    }
}
