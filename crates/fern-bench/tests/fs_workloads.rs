//! Tests of `bench fs` on tiny sizes, fernfs-lib only (CI may have no loop devices, so no
//! ext4 here): every workload runs and finds the answers it checks correct, and the file
//! system really holds what the workloads say (contents, listing counts, the renamed tree,
//! completed deletions), also after a cold remount.

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

#[test]
fn every_workload_runs_and_checks_clean_on_fernfs_lib() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = lib_run(&dir);
    // A memory cap needs child processes: refused in-process, clearly.
    let capped = FsBenchConfig {
        mem_cap: Some(64 << 20),
        ..cfg.clone()
    };
    assert!(runner::run(&capped, &mut Silent)
        .unwrap_err()
        .to_string()
        .contains("child processes"));
    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    // F11, F12 and fs_mark run programs on a mount, which the library target has not: a note
    // says so.
    for w in [
        "F11",
        "F12",
        "F1 through fs_mark",
        "F11 through fs_mark -S 1",
    ] {
        assert!(
            out.notes
                .iter()
                .any(|n| n.starts_with(w) && n.contains("need a mount")),
            "{:?}",
            out.notes
        );
    }
    for w in FsWorkload::ALL
        .into_iter()
        .filter(|w| !matches!(w, FsWorkload::F11 | FsWorkload::F12))
    {
        let rs: Vec<_> = out
            .medians
            .iter()
            .filter(|r| r.workload == w.name())
            .collect();
        assert!(!rs.is_empty(), "no record for {}", w.name());
        for r in rs {
            assert_eq!(r.errors, 0, "{r:?}");
            assert_eq!(r.reps, Some(2), "{r:?}");
            assert!(r.value.is_finite() && r.value > 0.0, "{r:?}");
            assert_eq!(r.system, "fernfs-lib");
        }
    }
    // F1 at 1 and 3 threads, as separate rows.
    let f1: Vec<Option<u32>> = out
        .medians
        .iter()
        .filter(|r| r.workload == "F1")
        .map(|r| r.threads)
        .collect();
    assert_eq!(f1, vec![Some(1), Some(3)]);
    // The JSON has the fields of docs/workloads.md "Reporting".
    let json = serde_json::to_value(&out.medians).unwrap();
    for r in json.as_array().unwrap() {
        for k in ["workload", "system", "value", "unit"] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
    }
    let table = fern_bench::fs::report::markdown_table(&out.medians, &["fernfs-lib".into()]);
    assert!(table.contains("| F9a |"), "{table}");
    // Nothing left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("run")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn tree_has_every_file_with_its_content_and_rm_r_removes_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = lib(&dir);
    let shape = TreeShape::part(300, 1, 0, 8);
    assert_eq!(shape.depth, 2);
    let dirs = shape.create(&t, 9, 200).unwrap();
    t.sync().unwrap();
    t.cold(false).unwrap();
    for i in 0..shape.files {
        assert_eq!(
            t.read_file(&shape.file_path(i)).unwrap(),
            file_content(9, i, 200),
            "file {i}"
        );
    }
    let (entries, files) = walk(&t, "").unwrap();
    assert_eq!((entries, files), (300 + dirs, 300));
    // Balanced: no directory holds more than the fanout.
    let mut todo = vec!["t0".to_string()];
    let mut seen_dirs = 1;
    while let Some(d) = todo.pop() {
        let es = t.list(&d).unwrap();
        assert!(es.len() <= 8, "{d} has {}", es.len());
        for e in es {
            if e.is_dir {
                seen_dirs += 1;
                todo.push(format!("{d}/{}", e.name));
            }
        }
    }
    assert_eq!(seen_dirs, dirs);
    remove_tree(&t, "t0").unwrap();
    t.rmdir("t0").unwrap();
    t.sync().unwrap();
    t.cold(false).unwrap();
    assert!(t.list("").unwrap().is_empty());
    assert!(t.lstat("t0").is_err());
    Box::new(t).finish().unwrap();
}

#[test]
fn threads_split_the_tree_without_overlap() {
    let parts: Vec<TreeShape> = (0..4).map(|i| TreeShape::part(1001, 4, i, 128)).collect();
    assert_eq!(parts.iter().map(|p| p.files).sum::<u64>(), 1001);
    let mut firsts: Vec<u64> = parts.iter().map(|p| p.first).collect();
    firsts.dedup();
    assert_eq!(firsts.len(), 4);
    let dir = tempfile::tempdir().unwrap();
    let t = lib(&dir);
    std::thread::scope(|s| {
        for p in &parts {
            let t = &t;
            s.spawn(move || p.create(t, 1, 200).unwrap());
        }
    });
    for p in &parts {
        for i in [0, p.files - 1] {
            assert_eq!(
                t.read_file(&p.file_path(i)).unwrap(),
                file_content(1, p.first + i, 200)
            );
        }
    }
    assert_eq!(walk(&t, "").unwrap().1, 1001);
}

#[test]
fn renamed_directory_keeps_every_file_across_a_remount() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = lib(&dir);
    t.mkdir("a").unwrap();
    t.mkdir("b").unwrap();
    t.mkdir("a/big").unwrap();
    for i in 0..300 {
        t.write_new(&format!("a/big/f{i}"), b"x").unwrap();
    }
    t.rename("a/big", "b/big").unwrap();
    t.sync().unwrap();
    t.cold(false).unwrap();
    assert!(t.lstat("a/big").is_err());
    let names: HashSet<String> = t
        .list("b/big")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 300);
    assert_eq!(t.read_file("b/big/f299").unwrap(), b"x");
}

#[test]
fn random_writes_land_where_they_were_written() {
    let offs = random_offsets(3, 1 << 20, 575, 500);
    assert_eq!(offs.len(), 500);
    let set: HashSet<u64> = offs.iter().copied().collect();
    assert_eq!(set.len(), 500, "offsets repeat");
    assert!(offs.iter().all(|o| o % 575 == 0 && o + 575 <= 1 << 20));

    let dir = tempfile::tempdir().unwrap();
    let mut t = lib(&dir);
    let f = t.open("big", true).unwrap();
    t.pwrite(f, 0, &vec![0xAB; 1 << 20]).unwrap();
    for (i, &o) in offs.iter().enumerate() {
        t.pwrite(f, o, &file_content(5, i as u64, 575)).unwrap();
    }
    t.fsync(f).unwrap();
    t.close(f).unwrap();
    t.cold(false).unwrap();
    let f = t.open("big", false).unwrap();
    for (i, &o) in offs.iter().enumerate() {
        assert_eq!(t.pread(f, o, 575).unwrap(), file_content(5, i as u64, 575));
    }
    assert_eq!(t.lstat("big").unwrap().size, 1 << 20);
    // A byte no write touched keeps the sequential pattern.
    let untouched = (0..(1u64 << 20) / 575)
        .map(|s| s * 575)
        .find(|o| !set.contains(o))
        .unwrap();
    assert_eq!(t.pread(f, untouched, 575).unwrap(), vec![0xAB; 575]);
    t.close(f).unwrap();
    // F9c's unlink frees it completely.
    t.unlink("big").unwrap();
    t.sync().unwrap();
    t.cold(false).unwrap();
    assert!(t.lstat("big").is_err());
    assert!(t.list("").unwrap().is_empty());
}

#[test]
fn one_task_reports_only_what_was_asked_and_catches_nothing_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let spec = FsTaskSpec {
        system: "fernfs-lib".into(),
        scenario: FsScenario::Tree { threads: 1 },
        workloads: vec![FsWorkload::F2],
        sizes: tiny(),
        dir: dir.path().join("t"),
        seed: 11,
        drop_caches: false,
        rep: 0,
    };
    let out = workloads::run_task(&spec).unwrap();
    let ws: Vec<&str> = out.records.iter().map(|r| r.workload.as_str()).collect();
    assert_eq!(ws, vec!["F2"]);
    assert_eq!(out.records[0].errors, 0);
    // F2 counted every file and directory of the tree.
    let shape = TreeShape::part(300, 1, 0, 8);
    let leaves = 300u64.div_ceil(8);
    let level1 = leaves.div_ceil(8);
    assert_eq!(shape.depth, 2);
    assert_eq!(out.records[0].keys, Some(300 + 1 + level1 + leaves));
}

#[test]
fn unknown_and_future_names_are_refused_with_a_hint() {
    assert!(FsWorkload::parse_list("F13")
        .unwrap_err()
        .to_string()
        .contains("F12"));
    assert_eq!(FsWorkload::parse_list("f7").unwrap(), [FsWorkload::F7]);
    assert_eq!(FsWorkload::parse_list("f9").unwrap().len(), 3);
    assert_eq!(FsSystem::parse("xfs").unwrap(), FsSystem::Xfs);
    assert_eq!(FsSystem::parse(" null-fuse ").unwrap(), FsSystem::NullFuse);
    assert!(FsSystem::parse("nope")
        .unwrap_err()
        .to_string()
        .contains("fernfs-fuse"));
    // Ratios are to the best kernel file system: exactly ext4, xfs and btrfs are kernel ones.
    let kernel: Vec<&str> = FsSystem::ALL
        .iter()
        .filter(|s| s.is_kernel())
        .map(|s| s.name())
        .collect();
    assert_eq!(kernel, ["ext4", "xfs", "btrfs"]);
}

/// A target with planted faults: the content of every file named "f3" reads wrong, and
/// listings leave out every entry named "f5". The workloads must count both. With
/// `size_lies`, every 7th lstat of a regular file also reports one byte more (fs_mark names
/// its files at random, so the name-keyed faults would miss them).
struct Faulty<T> {
    inner: T,
    size_lies: Option<std::sync::atomic::AtomicU64>,
}

impl<T: FsTarget> Faulty<T> {
    fn new(inner: T) -> Self {
        Faulty {
            inner,
            size_lies: None,
        }
    }
}

impl<T: FsTarget + 'static> FsTarget for Faulty<T> {
    fn system(&self) -> &'static str {
        "fernfs-lib"
    }
    fn describe(&self) -> String {
        "faulty".into()
    }
    fn mkdir(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.mkdir(p)
    }
    fn write_new(&self, p: &str, d: &[u8]) -> fern_bench::Result<()> {
        self.inner.write_new(p, d)
    }
    fn read_file(&self, p: &str) -> fern_bench::Result<Vec<u8>> {
        let mut d = self.inner.read_file(p)?;
        if p.ends_with("/f3") {
            d[0] ^= 1;
        }
        Ok(d)
    }
    fn list(&self, p: &str) -> fern_bench::Result<Vec<fern_bench::fs::target::Entry>> {
        let mut v = self.inner.list(p)?;
        v.retain(|e| e.name != "f5");
        Ok(v)
    }
    fn lstat(&self, p: &str) -> fern_bench::Result<fern_bench::fs::target::StatLite> {
        let mut st = self.inner.lstat(p)?;
        if let Some(n) = &self.size_lies {
            if !st.is_dir && n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 7 == 6 {
                st.size += 1;
            }
        }
        Ok(st)
    }
    fn keeps_data(&self) -> bool {
        self.inner.keeps_data()
    }
    fn mount_path(&self) -> Option<std::path::PathBuf> {
        self.inner.mount_path()
    }
    fn chmod(&self, p: &str, m: u32) -> fern_bench::Result<()> {
        self.inner.chmod(p, m)
    }
    fn set_times(&self, p: &str, s: i64) -> fern_bench::Result<()> {
        self.inner.set_times(p, s)
    }
    fn rename(&self, a: &str, b: &str) -> fern_bench::Result<()> {
        self.inner.rename(a, b)
    }
    fn unlink(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.unlink(p)
    }
    fn rmdir(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.rmdir(p)
    }
    fn open(&self, p: &str, c: bool) -> fern_bench::Result<fern_bench::fs::target::FileId> {
        self.inner.open(p, c)
    }
    fn pwrite(
        &self,
        f: fern_bench::fs::target::FileId,
        o: u64,
        d: &[u8],
    ) -> fern_bench::Result<()> {
        self.inner.pwrite(f, o, d)
    }
    fn pread(
        &self,
        f: fern_bench::fs::target::FileId,
        o: u64,
        l: usize,
    ) -> fern_bench::Result<Vec<u8>> {
        self.inner.pread(f, o, l)
    }
    fn fsync(&self, f: fern_bench::fs::target::FileId) -> fern_bench::Result<()> {
        self.inner.fsync(f)
    }
    fn close(&self, f: fern_bench::fs::target::FileId) -> fern_bench::Result<()> {
        self.inner.close(f)
    }
    fn sync(&self) -> fern_bench::Result<()> {
        self.inner.sync()
    }
    fn space_used(&self) -> fern_bench::Result<Option<u64>> {
        self.inner.space_used()
    }
    fn cold(&mut self, d: bool) -> fern_bench::Result<bool> {
        self.inner.cold(d)
    }
    fn finish(self: Box<Self>) -> fern_bench::Result<()> {
        Box::new(self.inner).finish()
    }
}

#[test]
fn wrong_answers_are_counted_not_hidden() {
    let run = |scenario: FsScenario, workloads: Vec<FsWorkload>| {
        let dir = tempfile::tempdir().unwrap();
        let spec = FsTaskSpec {
            system: "fernfs-lib".into(),
            scenario,
            workloads,
            sizes: tiny(),
            dir: dir.path().to_path_buf(),
            seed: 3,
            drop_caches: false,
            rep: 0,
        };
        let t = Faulty::new(LibTarget::create(&dir.path().join("x.img"), CACHE).unwrap());
        workloads::run_task_on(&spec, Box::new(t))
    };
    // F1: the "f3" files read wrong (one per leaf directory: 38 leaves of 8 files).
    let out = run(
        FsScenario::Tree { threads: 1 },
        vec![FsWorkload::F1, FsWorkload::F2],
    )
    .unwrap();
    let f1 = out.records.iter().find(|r| r.workload == "F1").unwrap();
    assert_eq!(f1.errors, 300u64.div_ceil(8));
    // F2: the hidden "f5" entries make the count wrong.
    let f2 = out.records.iter().find(|r| r.workload == "F2").unwrap();
    assert!(f2.errors > 0, "{f2:?}");
    // F3: the scan reads wrong content ("f3") and misses files ("f5"); checked on its own so
    // the missed files alone cannot be what is caught.
    let out = run(
        FsScenario::Tree { threads: 1 },
        vec![FsWorkload::F1, FsWorkload::F3],
    )
    .unwrap();
    let f3 = out.records.iter().find(|r| r.workload == "F3").unwrap();
    assert!(f3.errors >= 2 * 300u64.div_ceil(8), "{f3:?}");
    // F8: corpus files named "f3" read back wrong.
    let out = run(FsScenario::Space, vec![FsWorkload::F8]).unwrap();
    assert!(
        !out.records.is_empty() && out.records.iter().all(|r| r.errors > 0),
        "{:?}",
        out.records
    );
    // F4 and F9a: a listing that misses an entry is caught.
    let out = run(FsScenario::OneDir, vec![FsWorkload::F4]).unwrap();
    assert!(
        out.records.iter().any(|r| r.errors > 0),
        "{:?}",
        out.records
    );
    let out = run(FsScenario::Rename, vec![FsWorkload::F9a]).unwrap();
    assert!(
        out.records.iter().all(|r| r.errors > 0),
        "{:?}",
        out.records
    );
    // F9b: rm -r cannot see "f5" files, so their directories cannot be removed: it fails.
    assert!(run(FsScenario::Tree { threads: 1 }, vec![FsWorkload::F9b]).is_err());
}

/// A plain directory as a "mount" (remount does nothing), so the program-running workloads
/// can be tested without root or FUSE.
struct DirGuard(std::path::PathBuf);

/// A target on the plain directory `mp`.
fn dir_target(mp: &std::path::Path, keeps_data: bool) -> fern_bench::fs::posix::PosixTarget {
    fern_bench::fs::posix::PosixTarget::on_mount(
        "ext4",
        Box::new(DirGuard(mp.to_path_buf())),
        "a directory".into(),
        fern_bench::fs::posix::SyncBy::Syncfs,
        keeps_data,
    )
}

/// A task of `scenario` on a fresh plain directory under `root` (names tagged with `tag`):
/// the target, the spec (its scratch directory made) and the "mount".
fn dir_task(
    root: &std::path::Path,
    scenario: FsScenario,
    tag: &str,
    keeps_data: bool,
) -> (
    fern_bench::fs::posix::PosixTarget,
    FsTaskSpec,
    std::path::PathBuf,
) {
    let mp = root.join(format!("mnt-{}-{tag}", scenario.label()));
    std::fs::create_dir_all(&mp).unwrap();
    let spec = FsTaskSpec {
        system: "ext4".into(),
        scenario,
        workloads: scenario.workloads().to_vec(),
        sizes: tiny(),
        dir: root.join(format!("task-{}-{tag}", scenario.label())),
        seed: 5,
        drop_caches: false,
        rep: 0,
    };
    std::fs::create_dir_all(&spec.dir).unwrap();
    (dir_target(&mp, keeps_data), spec, mp)
}

impl fern_bench::fs::posix::MountGuard for DirGuard {
    fn mountpoint(&self) -> &std::path::Path {
        &self.0
    }
    fn remount(&mut self) -> fern_bench::Result<()> {
        Ok(())
    }
    fn teardown(&mut self) -> fern_bench::Result<()> {
        Ok(())
    }
    fn space_used(&self) -> fern_bench::Result<Option<u64>> {
        Ok(None)
    }
}

#[test]
fn postmark_and_applications_run_on_a_mount_and_are_checked() {
    let tools = fern_testkit::programs(&["git", "tar", "cp"]).and_then(|()| {
        // postmark has no --version; it reads commands from stdin and exits at its end.
        if fern_testkit::program_available("postmark", &[]) {
            Ok(())
        } else {
            Err("missing: postmark".to_string())
        }
    });
    if skipped(Need::Tools, tools) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |scenario: FsScenario, keeps_data: bool| {
        let (t, spec, _) = dir_task(dir.path(), scenario, &keeps_data.to_string(), keeps_data);
        workloads::run_task_on(&spec, Box::new(t)).unwrap()
    };
    let out = run(FsScenario::Postmark { threads: 2 }, true);
    assert_eq!(out.records.len(), 1, "{out:?}");
    let r = &out.records[0];
    assert_eq!(
        (r.workload.as_str(), r.threads, r.errors),
        ("F11", Some(2), 0)
    );
    assert!(r.value > 0.0 && r.unit == "tx/s", "{r:?}");
    let out = run(FsScenario::Apps, true);
    let metrics: Vec<(String, u64)> = out
        .records
        .iter()
        .map(|r| (r.metric.clone().unwrap(), r.errors))
        .collect();
    assert_eq!(
        metrics,
        [
            ("40 files: untar + sync".to_string(), 0),
            ("40 files: git status, cold".to_string(), 0),
            ("40 files: cp -r + sync".to_string(), 0)
        ]
    );
}

#[test]
fn fs_mark_plan_keeps_directories_small_and_the_total_exact() {
    use fern_bench::fs::fsmark::FsMarkPlan;
    // Quick F1: 20,000 files; one thread needs two invocations (16,384 per -d at most).
    let p = FsMarkPlan::new(20_000, 1, 128).unwrap();
    assert_eq!(p.per_dir, vec![10_000, 10_000]);
    assert_eq!(p.dirs(1), vec!["t1".to_string()]);
    let p = FsMarkPlan::new(20_000, 4, 128).unwrap();
    assert_eq!((p.per_dir.clone(), p.files()), (vec![5_000], 20_000));
    // Full F1: 1,000,000 files exactly, never more than 128 × 128 per -d directory.
    for threads in [1, 4] {
        let p = FsMarkPlan::new(1_000_000, threads, 128).unwrap();
        assert_eq!(p.files(), 1_000_000);
        assert!(p.per_dir.iter().all(|&n| n <= 128 * 128), "{p:?}");
    }
    assert_eq!(
        FsMarkPlan::new(1_000_000, 1, 128).unwrap().per_dir.len(),
        62
    );
    assert_eq!(
        FsMarkPlan::new(1_000_000, 4, 128).unwrap().per_dir,
        vec![15_625; 16]
    );
    // Invocation 2 of a 4-thread plan gets the next four top directories, with docs/workloads.md's
    // arguments.
    let p = FsMarkPlan::new(200_000, 4, 128).unwrap();
    let args = p.args(2, 200, false, std::path::Path::new("/l"));
    assert_eq!(
        args.join(" "),
        format!(
            "-d t8 -d t9 -d t10 -d t11 -D 128 -N 128 -n {} -s 200 -S 0 -L 1 -k -l /l",
            p.per_dir[2]
        )
    );
    // More than 64 -d directories, no thread, or fewer files than threads: refused.
    for (files, threads) in [(1000, 65), (1000, 0), (3, 4)] {
        assert!(FsMarkPlan::new(files, threads, 128).is_err());
    }
}

/// Walks a real directory: (files, files whose size is not `size`, most entries in one
/// directory, directories).
fn real_tree(dir: &std::path::Path, size: u64) -> (u64, u64, u64, u64) {
    let (mut files, mut bad, mut dirs) = (0, 0, 0);
    let entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    let mut widest = entries.len() as u64;
    for e in entries {
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        if md.is_dir() {
            let (f, b, w, d) = real_tree(&e.path(), size);
            files += f;
            bad += b;
            widest = widest.max(w);
            dirs += d + 1;
        } else {
            files += 1;
            bad += u64::from(md.len() != size);
        }
    }
    (files, bad, widest, dirs)
}

fn fs_mark_installed() -> bool {
    let check = if fern_bench::fs::fsmark::fs_mark_available() {
        Ok(())
    } else {
        Err("fs_mark missing (apt-get install fsmark; CI installs it)")
    };
    !skipped(Need::Tools, check)
}

/// Runs one fs_mark task on a plain directory posing as a mount; returns the output and the
/// directory.
fn fs_mark_task(
    root: &std::path::Path,
    threads: u32,
    fsync: bool,
    size_lies: bool,
) -> (fern_bench::fs::workloads::FsTaskOutput, std::path::PathBuf) {
    let scenario = FsScenario::FsMark { threads, fsync };
    let (t, spec, mp) = dir_task(root, scenario, &size_lies.to_string(), true);
    let out = if size_lies {
        let mut f = Faulty::new(t);
        f.size_lies = Some(Default::default());
        workloads::run_task_on(&spec, Box::new(f)).unwrap()
    } else {
        workloads::run_task_on(&spec, Box::new(t)).unwrap()
    };
    (out, mp)
}

#[test]
fn fs_mark_makes_the_tree_it_is_asked_for_and_is_checked() {
    if !fs_mark_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // tiny(): F1 300 files, fanout 8 (so at most 64 files per -d directory per invocation);
    // F11's fs_mark half 120 files.
    for (threads, fsync, files, workload) in [
        (1, false, 300, "F1"),
        (3, false, 300, "F1"),
        (1, true, 120, "F11"),
        (2, true, 120, "F11"),
    ] {
        let (out, mp) = fs_mark_task(dir.path(), threads, fsync, false);
        assert_eq!(out.records.len(), 1, "{out:?}");
        let r = &out.records[0];
        assert_eq!(
            (
                r.workload.as_str(),
                r.threads,
                r.keys,
                r.errors,
                r.unit.as_str()
            ),
            (workload, Some(threads), Some(files), 0, "files/s"),
            "{r:?}"
        );
        assert!(r.value.is_finite() && r.value > 0.0, "{r:?}");
        // The state itself, read with std::fs: every file there, 200 bytes each, no directory
        // wider than the fanout, top directories t0.. (one per thread and invocation), and
        // fs_mark's log not left on the file system under test.
        let (found, bad, widest, _) = real_tree(&mp, 200);
        assert_eq!((found, bad), (files, 0), "{workload} {threads} threads");
        assert!(widest <= 8, "a directory holds {widest} entries");
        let per_thread = files / u64::from(threads);
        let runs = per_thread.div_ceil(64);
        let mut tops: Vec<String> = std::fs::read_dir(&mp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        tops.sort();
        let mut want: Vec<String> = (0..runs * u64::from(threads))
            .map(|k| format!("t{k}"))
            .collect();
        want.sort();
        assert_eq!(tops, want);
    }
}

#[test]
fn fs_mark_wrong_sizes_and_missing_files_are_counted() {
    if !fs_mark_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Every 7th lstat lies about a file's size: 300 files → 42 wrong answers.
    let (out, mp) = fs_mark_task(dir.path(), 1, false, true);
    assert_eq!(out.records[0].errors, 300 / 7, "{:?}", out.records);
    // The count itself: a file removed and another truncated behind the harness's back.
    let t = dir_target(&mp, true);
    let before = fern_bench::fs::fsmark::count_tree(&t, "t0", 200).unwrap();
    let leaf = std::fs::read_dir(mp.join("t0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_dir(p).unwrap().count() >= 2)
        .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&leaf)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    std::fs::remove_file(&files[0]).unwrap();
    std::fs::write(&files[1], b"short").unwrap();
    let after = fern_bench::fs::fsmark::count_tree(&t, "t0", 200).unwrap();
    assert_eq!(
        (after.files, after.wrong_size),
        (before.files - 1, before.wrong_size + 1)
    );
}

#[test]
fn device_limits_are_measured_by_fio_or_noted() {
    use fern_bench::fs::limits::{self, LIMITS_SYSTEM, LIMITS_WORKLOAD};
    let dir = tempfile::tempdir().unwrap();
    let cfg = FsBenchConfig {
        workloads: vec![FsWorkload::F9c],
        reps: 1,
        limits: true,
        ..lib_run(&dir)
    };
    // One limits task per repetition, first, on no file system.
    let plan = cfg.plan();
    assert_eq!(plan[0].scenario, FsScenario::Limits);
    assert_eq!(plan[0].system, LIMITS_SYSTEM);
    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    let lim: Vec<_> = out
        .medians
        .iter()
        .filter(|r| r.workload == LIMITS_WORKLOAD)
        .collect();
    if !limits::fio_available() {
        assert!(lim.is_empty());
        assert!(out.notes.iter().any(|n| n.contains("fio is not installed")));
        skipped(
            Need::Tools,
            Err("fio missing (apt-get install fio; CI installs it)"),
        );
        return;
    }
    let units: Vec<&str> = lim.iter().map(|r| r.unit.as_str()).collect();
    assert_eq!(units, ["MB/s", "MB/s", "fsyncs/s"], "{lim:?}");
    for r in &lim {
        assert!(r.value.is_finite() && r.value > 0.0, "{r:?}");
        assert_eq!(r.system, LIMITS_SYSTEM);
    }
    // The sequential rows moved exactly the F7 size in 1 MiB blocks (tiny(): 3 MiB).
    assert_eq!((lim[0].keys, lim[1].keys), (Some(3), Some(3)));
    // Their own table in the report, not a file-system column; fio's files are gone.
    let table = fern_bench::fs::report::limits_table(&out.medians);
    assert!(table.contains("fsyncs/s"), "{table}");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("run")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn fio_reports_are_read_and_failures_refused() {
    use fern_bench::fs::limits::parse_fio;
    let ok = r#"fio: some warning
{"jobs":[{"error":0,"write":{"bw_bytes":1000000,"iops":250.5,"total_ios":751},
  "read":{"bw_bytes":0,"iops":0.0,"total_ios":0}}]}"#;
    let j = parse_fio(ok, "write").unwrap();
    assert_eq!((j.bw_bytes, j.iops, j.ios), (1e6, 250.5, 751));
    assert!(parse_fio(&ok.replace("\"error\":0", "\"error\":5"), "write").is_err());
    assert!(parse_fio("no json here", "write").is_err());
    assert!(parse_fio(r#"{"jobs":[]}"#, "write").is_err());
    assert!(parse_fio(r#"{"jobs":[{"error":0}]}"#, "read").is_err());
}

#[test]
fn memory_cap_holds_its_processes_and_reads_back_their_peak() {
    use fern_bench::fs::runner::{memcg_of, MemCap};
    let memcg = if !fern_bench::procinfo::is_root() {
        Err("needs root")
    } else if !std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        Err("needs the cgroup v1 memory controller")
    } else {
        Ok(())
    };
    if skipped(Need::Tools, memcg) {
        return;
    }
    let own = memcg_of("self").unwrap();
    let cap = MemCap::create(64 << 20).unwrap();
    // Nested under this process's own cgroup, so outer limits still apply.
    assert!(
        cap.path()
            .to_string_lossy()
            .contains(own.trim_start_matches('/')),
        "{} not under {own}",
        cap.path().display()
    );
    cap.reset().unwrap();
    // A process that joins and touches 24 MiB of memory: charged to the cap, under its limit.
    let procs = cap.path().join("cgroup.procs");
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec dd if=/dev/zero of=/dev/null bs=24M count=2 status=none",
            procs.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let u = cap.usage().unwrap();
    assert_eq!(u.limit, 64 << 20);
    assert!(u.peak >= 24 << 20 && u.peak <= u.limit, "{u:?}");
    assert_eq!(u.oom_kills, 0, "{u:?}");
    // Reset starts the next task's peak afresh.
    cap.reset().unwrap();
    assert!(cap.usage().unwrap().peak < 24 << 20);
}
