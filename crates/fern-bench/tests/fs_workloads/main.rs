//! Tests of `bench fs` on tiny sizes, fernfs-lib only (CI may have no loop devices, so no
//! ext4 here): every workload runs and finds the answers it checks correct, and the file
//! system really holds what the workloads say (contents, listing counts, the renamed tree,
//! completed deletions), also after a cold remount.
//!
//! `library` drives the workloads on fernfs-lib; `programs` runs the workloads that are other
//! programs (postmark, git, tar, fs_mark, fio) and the memory cap, on a plain directory.

use std::collections::HashSet;

use fern_bench::fs::lib_target::LibTarget;
use fern_bench::fs::runner::{self, FsBenchConfig};
use fern_bench::fs::target::{FsSystem, FsTarget};
use fern_bench::fs::workloads::{
    self, file_content, random_offsets, remove_tree, walk, FsScenario, FsTaskSpec, TreeShape,
};
use fern_bench::fs::{FsSizes, FsWorkload};
use fern_bench::runner::Silent;
use fern_bench::Isolation;
use fern_testkit::{skipped, Need};

const CACHE: u64 = 8 << 20;

fn tiny() -> FsSizes {
    FsSizes {
        tree_files: 300,
        tree_threads: vec![1, 3],
        file_bytes: 200,
        fanout: 8,
        onedir_files: 200,
        f5_file_bytes: 1 << 20,
        f5_writes: 100,
        f5_write_len: 575,
        f6_file_bytes: 512 << 10,
        f6_writes: 50,
        f6_write_len: 4,
        rename_files: 300,
        unlink_bytes: 3 << 20,
        fern_cache_bytes: CACHE,
        f7_file_bytes: 3 << 20,
        f8_corpus_bytes: 1 << 20,
        postmark_files: 50,
        postmark_transactions: 200,
        postmark_threads: vec![1, 2],
        apps_files: 40,
        fsmark_sync_files: 120,
        limits_fsync_seconds: 1,
    }
}

fn lib(dir: &tempfile::TempDir) -> LibTarget {
    LibTarget::create(&dir.path().join("fern.img"), CACHE).unwrap()
}

/// Every workload on fernfs-lib, in this process, at tiny sizes, 2 repetitions, scratch space
/// in `dir`/run, no device limits.
fn lib_run(dir: &tempfile::TempDir) -> FsBenchConfig {
    FsBenchConfig {
        systems: vec![FsSystem::FernfsLib],
        workloads: FsWorkload::ALL.to_vec(),
        sizes: tiny(),
        reps: 2,
        dir: dir.path().join("run"),
        seed: 7,
        drop_caches: false,
        isolation: Isolation::InProcess,
        pin: false,
        mem_cap: None,
        limits: false,
    }
}

mod faulty;
mod library;
mod programs;

use faulty::Faulty;
