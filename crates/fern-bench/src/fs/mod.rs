//! File-system workloads of docs/workloads.md (F1-F8, F9a/b/c, F10) run through a file
//! system's own interface: fern-fs's library API on a fern-kv-tree image (`fernfs-lib`), or
//! POSIX syscalls on a mount: the fernfs FUSE daemon (`fernfs-fuse`), the null FUSE file
//! system (`null-fuse`), or a fresh loop-mounted kernel file system (`ext4`, `xfs`, `btrfs`).
//!
//! Layout:
//! - [`target`]: the [`FsTarget`] trait, the handful of calls the workloads make, and the
//!   [`FsSystem`] list; a new system is one more implementation.
//! - [`lib_target`]: fernfs through `fern_fs::path::PathFs`; cold = close + reopen the image.
//! - [`posix`]: any mounted file system through std::fs/libc, and [`posix::LoopMount`], the
//!   loop-mounted image whose teardown always runs.
//! - [`fuse_mount`]: FUSE mounts served by a daemon child (fernfs's own, or the null one).
//! - [`etcd_mount`]: `fernfs-etcd` and `juicefs-etcd`, mounts on a private etcd.
//! - [`null_fuse`]: the null FUSE file system (namespace only, no data: the FUSE-path limit).
//! - [`workloads`]: the workloads, grouped into scenarios (the work one child process does
//!   on one fresh file system), each checking the answers it gets.
//! - [`runner`]: the run plan (repetitions × scenarios × systems, systems innermost: A B A B),
//!   child processes (pinned with `taskset -c 0` when available), medians, leftover cleanup.
//! - [`report`]: the markdown table with ratios to the best kernel file system.

pub mod etcd_mount;
pub mod fsmark;
pub mod fuse_mount;
pub mod lib_target;
pub mod limits;
pub mod null_fuse;
pub mod plot;
pub mod posix;
pub mod report;
pub mod runner;
pub mod target;
pub mod workloads;

use serde::{Deserialize, Serialize};

use crate::{BenchError, Result};

pub use target::{FsSystem, FsTarget};

/// A file-system workload id of docs/workloads.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FsWorkload {
    /// TokuBench: create N files of 200 bytes in a balanced tree (≤ 128 entries per directory).
    F1,
    /// Cold recursive readdir + lstat of F1's tree.
    F2,
    /// Cold scan of F1's tree reading every file's content (`grep -r`-like).
    F3,
    /// One directory: N empty files created, then listed cold.
    F4,
    /// 575-byte non-overlapping writes at random offsets into one large file, then fsync.
    F5,
    /// 1000 random 4-byte writes into a file, then one fsync.
    F6,
    /// Sequential write of one large file in 1 MiB writes + fsync; cold sequential read.
    F7,
    /// Space: a text-like corpus written as files; bytes used on the device vs gzip -5.
    F8,
    /// Rename of a directory holding many files.
    F9a,
    /// rm -r of the F1 tree.
    F9b,
    /// Unlink of a big file.
    F9c,
    /// chmod + utime of every F1 file.
    F10,
    /// postmark (mail-server transactions), 1 and 4 concurrent instances.
    F11,
    /// Applications: untar of a generated source tree, cold `git status`, `cp -r`.
    F12,
}

impl FsWorkload {
    /// Every workload this harness runs, in report order.
    pub const ALL: [FsWorkload; 14] = [
        FsWorkload::F1,
        FsWorkload::F2,
        FsWorkload::F3,
        FsWorkload::F4,
        FsWorkload::F5,
        FsWorkload::F6,
        FsWorkload::F7,
        FsWorkload::F8,
        FsWorkload::F9a,
        FsWorkload::F9b,
        FsWorkload::F9c,
        FsWorkload::F10,
        FsWorkload::F11,
        FsWorkload::F12,
    ];

    /// The id, e.g. "F9a".
    pub fn name(self) -> &'static str {
        match self {
            FsWorkload::F1 => "F1",
            FsWorkload::F2 => "F2",
            FsWorkload::F3 => "F3",
            FsWorkload::F4 => "F4",
            FsWorkload::F5 => "F5",
            FsWorkload::F6 => "F6",
            FsWorkload::F7 => "F7",
            FsWorkload::F8 => "F8",
            FsWorkload::F9a => "F9a",
            FsWorkload::F9b => "F9b",
            FsWorkload::F9c => "F9c",
            FsWorkload::F10 => "F10",
            FsWorkload::F11 => "F11",
            FsWorkload::F12 => "F12",
        }
    }

    /// Parses an id (any case); "F9" means F9a, F9b and F9c.
    pub fn parse_list(s: &str) -> Result<Vec<FsWorkload>> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("F9") {
            return Ok(vec![FsWorkload::F9a, FsWorkload::F9b, FsWorkload::F9c]);
        }
        if let Some(w) = Self::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(t))
        {
            return Ok(vec![w]);
        }
        let known: Vec<&str> = Self::ALL.iter().map(|w| w.name()).collect();
        Err(BenchError::Usage(format!(
            "unknown workload {s:?}; known: {}",
            known.join(", ")
        )))
    }
}

/// Sizes of one run (docs/workloads.md "full / quick").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsSizes {
    /// Files of the F1 tree (also F2, F9b, F10).
    pub tree_files: u64,
    /// Thread counts of F1 (the other tree workloads run on the 1-thread tree).
    pub tree_threads: Vec<u32>,
    /// Bytes per F1 file.
    pub file_bytes: usize,
    /// Most entries per directory of the F1 tree.
    pub fanout: u64,
    /// Files of F4's single directory.
    pub onedir_files: u64,
    /// Size of F5's file, bytes.
    pub f5_file_bytes: u64,
    /// Writes of F5.
    pub f5_writes: u64,
    /// Bytes per F5 write.
    pub f5_write_len: usize,
    /// Size of F6's file, bytes.
    pub f6_file_bytes: u64,
    /// Writes of F6.
    pub f6_writes: u64,
    /// Bytes per F6 write.
    pub f6_write_len: usize,
    /// Files in F9a's renamed directory.
    pub rename_files: u64,
    /// Size of F9c's unlinked file, bytes.
    pub unlink_bytes: u64,
    /// Node cache of fernfs-lib, bytes.
    pub fern_cache_bytes: u64,
    /// Size of F7's sequentially written file, bytes.
    #[serde(default = "default_f7")]
    pub f7_file_bytes: u64,
    /// Bytes of F8's text-like corpus.
    #[serde(default = "default_f8")]
    pub f8_corpus_bytes: u64,
    /// postmark's `set number` (files), split over the instances.
    #[serde(default = "default_pm_files")]
    pub postmark_files: u64,
    /// postmark's `set transactions`, split over the instances.
    #[serde(default = "default_pm_tx")]
    pub postmark_transactions: u64,
    /// Concurrent postmark instances of F11.
    #[serde(default = "default_pm_threads")]
    pub postmark_threads: Vec<u32>,
    /// Files of F12's generated source tree.
    #[serde(default = "default_apps")]
    pub apps_files: u64,
    /// Files of F11's fs_mark half (`fs_mark -S 1`), split over its threads (the thread
    /// counts are `postmark_threads`).
    #[serde(default = "default_pm_files")]
    pub fsmark_sync_files: u64,
    /// Seconds of the device's fsync-rate measurement (fio).
    #[serde(default = "default_fsync_secs")]
    pub limits_fsync_seconds: u64,
}

fn default_fsync_secs() -> u64 {
    3
}

fn default_pm_files() -> u64 {
    5_000
}

fn default_pm_tx() -> u64 {
    50_000
}

fn default_pm_threads() -> Vec<u32> {
    vec![1, 4]
}

fn default_apps() -> u64 {
    5_000
}

fn default_f7() -> u64 {
    256 << 20
}

fn default_f8() -> u64 {
    64 << 20
}

impl FsSizes {
    /// Full sizes of docs/workloads.md.
    pub fn full() -> FsSizes {
        FsSizes {
            tree_files: 1_000_000,
            tree_threads: vec![1, 4],
            file_bytes: 200,
            fanout: 128,
            onedir_files: 1_000_000,
            f5_file_bytes: 4 << 30,
            f5_writes: 100_000,
            f5_write_len: 575,
            f6_file_bytes: 1 << 30,
            f6_writes: 1000,
            f6_write_len: 4,
            rename_files: 100_000,
            unlink_bytes: 4 << 30,
            fern_cache_bytes: 128 << 20,
            f7_file_bytes: 4 << 30,
            f8_corpus_bytes: 1 << 30,
            postmark_files: 100_000,
            postmark_transactions: 1_000_000,
            postmark_threads: vec![1, 4],
            apps_files: 50_000,
            fsmark_sync_files: 100_000,
            limits_fsync_seconds: 10,
        }
    }

    /// Quick sizes of docs/workloads.md.
    pub fn quick() -> FsSizes {
        FsSizes {
            tree_files: 20_000,
            tree_threads: vec![1, 4],
            onedir_files: 20_000,
            f5_file_bytes: 256 << 20,
            f5_writes: 5_000,
            f6_file_bytes: 128 << 20,
            rename_files: 10_000,
            unlink_bytes: 256 << 20,
            f7_file_bytes: 256 << 20,
            f8_corpus_bytes: 64 << 20,
            postmark_files: 5_000,
            postmark_transactions: 50_000,
            apps_files: 5_000,
            fsmark_sync_files: 5_000,
            limits_fsync_seconds: 3,
            ..FsSizes::full()
        }
    }

    /// Bytes of the largest file any requested workload writes (to size kernel images).
    pub fn largest_file(&self) -> u64 {
        self.f5_file_bytes
            .max(self.f6_file_bytes)
            .max(self.unlink_bytes)
            .max(self.f7_file_bytes)
            .max(self.f8_corpus_bytes)
    }

    /// Most files any workload creates.
    pub fn most_files(&self) -> u64 {
        self.tree_files
            .max(self.onedir_files)
            .max(self.rename_files)
            .max(self.postmark_files)
            .max(self.fsmark_sync_files)
            .max(3 * self.apps_files)
    }
}
