//! The calls the file-system workloads make, as one trait every system under test implements,
//! and the list of systems.
//!
//! Paths are relative to the file system's root ("t0/3/17/f42"), so a workload never knows
//! where (or whether) the file system is mounted. Every call is the one an application makes
//! (stat, readdir, open/pwrite/fsync, rename, ...), so a workload issues the same sequence of
//! calls on every system.

use std::fmt;

use crate::{BenchError, Result};

/// An open file of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId(pub u64);

/// The part of a stat a workload looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatLite {
    /// File size, bytes.
    pub size: u64,
    /// Mode including the file type bits.
    pub mode: u32,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// mtime, seconds.
    pub mtime_s: i64,
}

/// One directory entry: name and whether it is a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Name inside the directory.
    pub name: String,
    /// Directory (true) or anything else.
    pub is_dir: bool,
}

/// A file system under test. Shared by the threads of a multi-threaded workload.
pub trait FsTarget: Sync {
    /// System name of the reports (`fernfs-lib`, `ext4`, ...).
    fn system(&self) -> &'static str;
    /// One line naming what matters (cache size, mount options, image size).
    fn describe(&self) -> String;
    /// mkdir(2), mode 0755.
    fn mkdir(&self, path: &str) -> Result<()>;
    /// open(O_CREAT|O_EXCL|O_WRONLY, 0644), write `data` (if any), close.
    fn write_new(&self, path: &str, data: &[u8]) -> Result<()>;
    /// open(O_RDONLY), read everything, close.
    fn read_file(&self, path: &str) -> Result<Vec<u8>>;
    /// Every entry of a directory (readdir; no stat).
    fn list(&self, path: &str) -> Result<Vec<Entry>>;
    /// lstat(2).
    fn lstat(&self, path: &str) -> Result<StatLite>;
    /// chmod(2).
    fn chmod(&self, path: &str, perm: u32) -> Result<()>;
    /// utimensat(2) setting atime and mtime to `secs` (nanoseconds 0).
    fn set_times(&self, path: &str, secs: i64) -> Result<()>;
    /// rename(2).
    fn rename(&self, from: &str, to: &str) -> Result<()>;
    /// unlink(2).
    fn unlink(&self, path: &str) -> Result<()>;
    /// rmdir(2).
    fn rmdir(&self, path: &str) -> Result<()>;
    /// open(O_RDWR, O_CREAT if `create`).
    fn open(&self, path: &str, create: bool) -> Result<FileId>;
    /// pwrite(2) of all of `data`.
    fn pwrite(&self, f: FileId, offset: u64, data: &[u8]) -> Result<()>;
    /// pread(2) of up to `len` bytes.
    fn pread(&self, f: FileId, offset: u64, len: usize) -> Result<Vec<u8>>;
    /// fsync(2).
    fn fsync(&self, f: FileId) -> Result<()>;
    /// close(2).
    fn close(&self, f: FileId) -> Result<()>;
    /// Whether reads return what was written (false only for the null FUSE file system, which
    /// stores no data: the workloads then skip content checks instead of counting them wrong).
    fn keeps_data(&self) -> bool {
        true
    }
    /// Where the file system is mounted, for workloads that run programs on it (postmark,
    /// tar, git, cp); `None` for a library-only target.
    fn mount_path(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Bytes the file system occupies on its device now (kernel file systems: used blocks
    /// as df counts them; fernfs: the image file's allocated blocks), or `None` where that
    /// means nothing (the null FUSE file system).
    fn space_used(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// Bytes the file system has sent toward its device so far, counted where every system
    /// can be counted alike (F7's write amplification is the difference over the writes and
    /// their fsync, divided by the bytes written): a loop-mounted kernel file system, what its
    /// loop device received; fernfs, the bytes its process (the FUSE daemon, or this process
    /// for the library) dirtied in the image's page cache or wrote directly — every one of them
    /// goes to the device, and rewrites of a page still dirty count once, as on a kernel file
    /// system. `None` where nothing is stored (the null FUSE file system) or not on a device
    /// here (etcd).
    fn device_bytes_written(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// syncfs(2): everything written so far becomes durable.
    fn sync(&self) -> Result<()>;
    /// Makes the next reads cold: unmount and mount again (close and reopen the image), then
    /// drop the OS page cache if `drop_caches` (needs root). Returns whether the page cache
    /// was dropped. Every open file must be closed first.
    fn cold(&mut self, drop_caches: bool) -> Result<bool>;
    /// Releases the file system (sync, unmount, remove what the target created).
    fn finish(self: Box<Self>) -> Result<()>;
}

/// Wraps an error of system `system` doing `op` on `path`.
pub fn op_err(system: &'static str, op: &str, path: &str, e: impl fmt::Display) -> BenchError {
    BenchError::engine(system, format!("{op} {path:?}: {e}"))
}

/// The file systems the harness knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FsSystem {
    /// fern-fs's path library API on a fern-kv-tree image, no FUSE.
    FernfsLib,
    /// The real FUSE mount made by the `fernfs` binary (`fernfs mkfs` + `fernfs mount`),
    /// through syscalls.
    FernfsFuse,
    /// A FUSE file system that answers every request and stores no data: the FUSE-path limit.
    NullFuse,
    /// `FernfsFuse` over FUSE-over-io_uring (`-o transport=uring`).
    FernfsFuseUring,
    /// `NullFuse` over FUSE-over-io_uring.
    NullFuseUring,
    /// ext4 on a fresh loop-mounted image, through syscalls.
    Ext4,
    /// XFS on a fresh loop-mounted image, through syscalls.
    Xfs,
    /// Btrfs on a fresh loop-mounted image, through syscalls.
    Btrfs,
    /// The `fernfs` FUSE mount of a file system in a private etcd (`fernfs mkfs etcd://…`).
    FernfsEtcd,
    /// JuiceFS (`juicefs format --storage file`, metadata in a private etcd), only where a
    /// `juicefs` binary is on PATH.
    JuicefsEtcd,
}

impl FsSystem {
    /// Every system, in report order.
    pub const ALL: [FsSystem; 10] = [
        FsSystem::FernfsLib,
        FsSystem::FernfsFuse,
        FsSystem::NullFuse,
        FsSystem::FernfsFuseUring,
        FsSystem::NullFuseUring,
        FsSystem::Ext4,
        FsSystem::Xfs,
        FsSystem::Btrfs,
        FsSystem::FernfsEtcd,
        FsSystem::JuicefsEtcd,
    ];

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            FsSystem::FernfsLib => "fernfs-lib",
            FsSystem::FernfsFuse => "fernfs-fuse",
            FsSystem::NullFuse => "null-fuse",
            FsSystem::FernfsFuseUring => "fernfs-fuse-uring",
            FsSystem::NullFuseUring => "null-fuse-uring",
            FsSystem::Ext4 => "ext4",
            FsSystem::Xfs => "xfs",
            FsSystem::Btrfs => "btrfs",
            FsSystem::FernfsEtcd => "fernfs-etcd",
            FsSystem::JuicefsEtcd => "juicefs-etcd",
        }
    }

    /// Whether this is a kernel file system (the ratios are to the best of these).
    pub fn is_kernel(self) -> bool {
        self.mkfs_type().is_some()
    }

    /// The `mkfs.TYPE` / `mount -t TYPE` of a kernel file system.
    pub fn mkfs_type(self) -> Option<&'static str> {
        match self {
            FsSystem::Ext4 => Some("ext4"),
            FsSystem::Xfs => Some("xfs"),
            FsSystem::Btrfs => Some("btrfs"),
            _ => None,
        }
    }

    /// Whether the system goes through a FUSE mount.
    pub fn is_fuse(self) -> bool {
        matches!(
            self,
            FsSystem::FernfsFuse
                | FsSystem::NullFuse
                | FsSystem::FernfsFuseUring
                | FsSystem::NullFuseUring
                | FsSystem::FernfsEtcd
                | FsSystem::JuicefsEtcd
        )
    }

    /// The FUSE transport of a FUSE system.
    pub fn transport(self) -> fern_fuse::uring::Transport {
        match self {
            FsSystem::FernfsFuseUring | FsSystem::NullFuseUring => {
                fern_fuse::uring::Transport::Uring
            }
            _ => fern_fuse::uring::Transport::Dev,
        }
    }

    /// Parses a system name.
    pub fn parse(name: &str) -> Result<FsSystem> {
        let t = name.trim();
        if let Some(s) = Self::ALL.into_iter().find(|s| s.name() == t) {
            return Ok(s);
        }
        let known: Vec<&str> = Self::ALL.iter().map(|s| s.name()).collect();
        Err(BenchError::Usage(format!(
            "unknown system {name:?}; known: {}",
            known.join(", ")
        )))
    }

    /// Whether a name is a kernel file system's.
    pub fn name_is_kernel(name: &str) -> bool {
        Self::ALL
            .into_iter()
            .any(|s| s.name() == name && s.is_kernel())
    }
}

impl fmt::Display for FsSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
