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
    }
}

fn lib(dir: &tempfile::TempDir) -> LibTarget {
    LibTarget::create(&dir.path().join("fern.img"), CACHE).unwrap()
}

#[test]
fn every_workload_runs_and_checks_clean_on_fernfs_lib() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FsBenchConfig {
        systems: vec![FsSystem::FernfsLib],
        workloads: FsWorkload::ALL.to_vec(),
        sizes: tiny(),
        reps: 2,
        dir: dir.path().join("run"),
        seed: 7,
        drop_caches: false,
        isolation: Isolation::InProcess,
        pin: false,
    };
    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    for w in FsWorkload::ALL {
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
    // The JSON has the fields of WORKLOADS.md "Reporting".
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
    assert!(FsWorkload::parse_list("F7").is_err());
    assert_eq!(FsWorkload::parse_list("f9").unwrap().len(), 3);
    assert!(FsSystem::parse("xfs")
        .unwrap_err()
        .to_string()
        .contains("not implemented yet"));
    assert!(FsSystem::parse("nope").is_err());
}
