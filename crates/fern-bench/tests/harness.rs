//! Tests of the harness on tiny sizes: every compiled adapter gives the answers of a model
//! (conformance), every workload checks the answers it gets (a wrong engine is caught), and
//! the JSON has the fields of docs/workloads.md "Reporting".

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fern_bench::data::{self, ValueKind};
use fern_bench::runner::{self, Silent};
use fern_bench::workloads::{self, run_task_with};
use fern_bench::{
    Batch, BenchConfig, Committer, Committers, Durability, Engine, EngineConfig, Isolation,
    OpenMode, Record, Result, Scenario, Sizes, System, TaskSpec, Workload,
};

fn tiny() -> Sizes {
    Sizes {
        keys: 2_500,
        lookups: 2_500,
        budget_bytes: 4 << 20,
        batch: 1000,
        commit_threads: vec![1, 4, 16],
        commit_seconds: 0.2,
        commit_rows: 10,
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        budget_bytes: 4 << 20,
        durability: Durability::Deferred,
    }
}

fn spec(system: &str, scenario: Scenario, dir: &Path) -> TaskSpec {
    TaskSpec {
        system: system.to_string(),
        scenario,
        workloads: Workload::ALL.to_vec(),
        sizes: tiny(),
        dir: dir.to_path_buf(),
        seed: 7,
        drop_caches: false,
        rep: 0,
    }
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario::Random {
            values: ValueKind::Incompressible,
        },
        Scenario::Random {
            values: ValueKind::Text,
        },
        Scenario::Sequential,
        Scenario::Upsert,
    ]
}

fn figures(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| format!("{} {}", r.workload, r.metric.clone().unwrap_or_default()))
        .collect()
}

/// The in-memory model: a shared map that survives close + reopen, like a database file.
#[derive(Clone, Default)]
struct Model {
    rows: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
    /// Fault injection: drop every insert of this key index within a batch (index % n == 0).
    lose_every: Option<usize>,
    /// Fault injection: ignore range deletes.
    ignore_range_delete: bool,
}

impl Engine for Model {
    fn name(&self) -> &'static str {
        "model"
    }
    fn describe(&self) -> String {
        "BTreeMap".into()
    }
    fn insert_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut m = self.rows.lock().unwrap();
        for (i, (k, v)) in batch.iter().enumerate() {
            if self.lose_every.is_some_and(|n| i % n == 0) {
                continue;
            }
            m.insert(k.to_vec(), v.to_vec());
        }
        Ok(())
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.rows.lock().unwrap().get(key).cloned())
    }
    fn scan(&mut self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        for (k, v) in self.rows.lock().unwrap().iter() {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }
    fn upsert_add_batch(&mut self, batch: &Batch) -> Result<()> {
        let mut m = self.rows.lock().unwrap();
        for (i, (k, d)) in batch.iter().enumerate() {
            if self.lose_every.is_some_and(|n| i % n == 0) {
                continue;
            }
            let old = m
                .get(k)
                .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
                .unwrap_or(0);
            let new = old + u64::from_le_bytes(d.try_into().unwrap());
            m.insert(k.to_vec(), new.to_le_bytes().to_vec());
        }
        Ok(())
    }
    fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
        if !self.ignore_range_delete {
            self.rows
                .lock()
                .unwrap()
                .retain(|k, _| k.as_slice() < lo || k.as_slice() >= hi);
        }
        Ok(())
    }
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
    fn committers(&mut self) -> Option<Arc<dyn Committers>> {
        Some(Arc::new(self.clone()))
    }
}

impl Committers for Model {
    fn committer(&self) -> Result<Box<dyn Committer>> {
        Ok(Box::new(self.clone()))
    }
}

impl Committer for Model {
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        self.insert_batch(batch)
    }
}

fn run_model(model: &Model, scenario: Scenario) -> Vec<Record> {
    let dir = tempfile::tempdir().unwrap();
    let s = spec("model", scenario, dir.path());
    let opener = |_: &Path, _: &EngineConfig, mode: OpenMode| -> Result<Box<dyn Engine>> {
        if mode == OpenMode::Create {
            model.rows.lock().unwrap().clear();
        }
        Ok(Box::new(model.clone()))
    };
    run_task_with(&s, &opener).unwrap().records
}

#[test]
fn workloads_report_every_figure_and_no_error_on_a_correct_engine() {
    let model = Model::default();
    let all: Vec<Record> = scenarios()
        .into_iter()
        .flat_map(|s| run_model(&model, s))
        .collect();
    let figs = figures(&all);
    for want in [
        "E1 overall",
        "E1 last 10%",
        "E2 lookups",
        "E2 p50",
        "E2 p99",
        "E3 full scan",
        "E4 inserts",
        "E5 upserts",
        "E5 read all",
        "E6 range delete",
        "E6 scan after",
        "E7 space",
        "E7 write amp",
        "E7 peak RSS",
    ] {
        assert!(figs.iter().any(|f| f == want), "missing {want} in {figs:?}");
    }
    for r in &all {
        assert_eq!(r.errors, 0, "{r:?}");
        assert!(r.value.is_finite() && r.value >= 0.0, "{r:?}");
        assert_eq!(r.system, "model");
    }
}

#[test]
fn workloads_catch_a_wrong_engine() {
    let lossy = Model {
        lose_every: Some(97),
        ..Model::default()
    };
    let errors = |records: &[Record], fig: &str| -> u64 {
        records
            .iter()
            .filter(|r| format!("{} {}", r.workload, r.metric.clone().unwrap_or_default()) == fig)
            .map(|r| r.errors)
            .sum()
    };
    let random = run_model(
        &lossy,
        Scenario::Random {
            values: ValueKind::Incompressible,
        },
    );
    assert!(errors(&random, "E2 lookups") > 0);
    assert!(errors(&random, "E3 full scan") > 0);
    assert!(errors(&random, "E6 scan after") > 0);
    assert!(errors(&run_model(&lossy, Scenario::Upsert), "E5 read all") > 0);
    assert!(errors(&run_model(&lossy, Scenario::Sequential), "E4 inserts") > 0);

    let no_range_delete = Model {
        ignore_range_delete: true,
        ..Model::default()
    };
    let random = run_model(
        &no_range_delete,
        Scenario::Random {
            values: ValueKind::Text,
        },
    );
    assert!(errors(&random, "E6 scan after") > 0);
    assert_eq!(errors(&random, "E2 lookups"), 0);
}

/// Conformance of one adapter against a model, directly through the trait.
fn conformance(system: System) {
    let dir = tempfile::tempdir().unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut e = system.open(dir.path(), &cfg(), OpenMode::Create).unwrap();
    let mut b = Batch::new();
    for chunk in 0..5u64 {
        b.clear();
        for i in chunk * 700..(chunk + 1) * 700 {
            let (k, v) = (data::random_key(3, i), data::value(ValueKind::Text, 3, i));
            b.push(&k, &v);
            model.insert(k.to_vec(), v.to_vec());
        }
        e.insert_batch(&b).unwrap();
    }
    // Overwrite one key: the last write wins.
    b.clear();
    let k0 = data::random_key(3, 0);
    b.push(&k0, b"new");
    e.insert_batch(&b).unwrap();
    model.insert(k0.to_vec(), b"new".to_vec());
    // Counters: the same key several times in one batch, and across batches.
    for round in 0..3u64 {
        b.clear();
        for j in 0..50u64 {
            let k = data::sequential_key(1_000_000 + j % 7);
            let d = round * 100 + j;
            b.push(&k, &d.to_le_bytes());
            let old = model
                .get(&k[..])
                .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
                .unwrap_or(0);
            model.insert(k.to_vec(), (old + d).to_le_bytes().to_vec());
        }
        e.upsert_add_batch(&b).unwrap();
    }
    let (lo, hi) = data::e6_bounds();
    e.delete_range(&lo, &hi).unwrap();
    model.retain(|k, _| k.as_slice() < &lo[..] || k.as_slice() >= &hi[..]);
    e.sync().unwrap();

    let check = |e: &mut Box<dyn Engine>, what: &str| {
        let mut got = Vec::new();
        e.scan(&mut |k, v| {
            got.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
        let want: Vec<_> = model.clone().into_iter().collect();
        assert_eq!(got.len(), want.len(), "{system} {what}: row count");
        assert!(got == want, "{system} {what}: rows differ");
        for (k, v) in model.iter().take(200) {
            assert_eq!(e.get(k).unwrap().as_ref(), Some(v), "{system} {what}: get");
        }
        assert_eq!(e.get(&lo).unwrap(), None, "{system} {what}: deleted range");
        assert_eq!(
            e.get(b"absent").unwrap(),
            None,
            "{system} {what}: absent key"
        );
        // A scan stops when asked to.
        let mut n = 0;
        e.scan(&mut |_, _| {
            n += 1;
            n < 10
        })
        .unwrap();
        assert_eq!(n, 10, "{system} {what}: scan stop");
    };
    check(&mut e, "before reopen");
    e.close().unwrap();
    let mut e = system.open(dir.path(), &cfg(), OpenMode::Reopen).unwrap();
    check(&mut e, "after reopen");
    e.close().unwrap();
}

#[test]
fn every_compiled_adapter_conforms_to_the_model() {
    for system in System::compiled() {
        conformance(system);
    }
}

#[test]
fn every_compiled_adapter_passes_every_workload_without_error() {
    for system in System::compiled() {
        for scenario in scenarios() {
            let dir = tempfile::tempdir().unwrap();
            let out = workloads::run_task(&spec(system.name(), scenario, dir.path())).unwrap();
            assert!(!out.records.is_empty());
            for r in &out.records {
                assert_eq!(r.errors, 0, "{system} {scenario:?}: {r:?}");
                assert!(r.value.is_finite(), "{r:?}");
            }
        }
    }
}

#[test]
fn run_writes_json_records_with_the_reporting_fields() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = BenchConfig {
        systems: System::compiled(),
        workloads: vec![Workload::E1, Workload::E3, Workload::E5, Workload::E7],
        variants: vec![ValueKind::Incompressible],
        sizes: Sizes {
            keys: 1_000,
            lookups: 100,
            budget_bytes: 4 << 20,
            batch: 100,
            ..Sizes::quick()
        },
        reps: 2,
        dir: dir.path().join("scratch"),
        seed: 1,
        drop_caches: false,
        isolation: Isolation::InProcess,
        mem_cap: None,
    };
    // Interleaved: rep 0 of every system before rep 1 of any.
    let plan = cfg.plan();
    let n_sys = cfg.systems.len();
    assert_eq!(plan.len(), 2 * 2 * n_sys);
    assert!(plan[..2 * n_sys].iter().all(|t| t.rep == 0));
    assert_eq!(plan[0].system, cfg.systems[0].name());

    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    let json_path = dir.path().join("out.json");
    fern_bench::report::write_json(&json_path, &out.medians).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let list = v.as_array().expect("a JSON list");
    assert!(!list.is_empty());
    for r in list {
        assert!(r["workload"].as_str().unwrap().starts_with('E'));
        assert!(System::compiled()
            .iter()
            .any(|s| s.name() == r["system"].as_str().unwrap()));
        assert!(r["value"].is_number());
        assert!(!r["unit"].as_str().unwrap().is_empty());
        assert_eq!(r["reps"].as_u64(), Some(2));
        assert_eq!(r["values"].as_array().unwrap().len(), 2);
        assert_eq!(r["errors"].as_u64(), Some(0), "{r}");
    }
    let table = fern_bench::report::markdown_table(
        &out.medians,
        &cfg.systems
            .iter()
            .map(|s| s.name().to_string())
            .collect::<Vec<_>>(),
    );
    assert!(table.contains("| E1 | overall (incompressible) | inserts/s ↑ |"));
    assert!(table.contains("| E5 | upserts | upserts/s ↑ |"));
}

fn commits(threads: u32) -> Scenario {
    Scenario::Commits { threads }
}

#[test]
fn e9_on_fern_tree_commits_from_1_4_16_threads_and_every_commit_survives_reopen() {
    for threads in [1, 4, 16] {
        let dir = tempfile::tempdir().unwrap();
        let s = spec("fern-tree", commits(threads), dir.path());
        let out = workloads::run_task(&s).unwrap();
        assert_eq!(out.records.len(), 1, "{:?}", out.records);
        let r = &out.records[0];
        assert_eq!(r.workload, "E9");
        assert_eq!(r.unit, "commits/s");
        assert_eq!(r.threads, Some(threads));
        assert_eq!(r.errors, 0, "{r:?}");
        assert!(r.value > 0.0, "{r:?}");
        // Count the rows again through a fresh open: every acknowledged commit is there.
        let rows = r.keys.unwrap();
        assert!(rows > 0 && rows.is_multiple_of(10), "{r:?}");
        let mut eng = System::FernTree
            .open(dir.path(), &cfg(), OpenMode::Reopen)
            .unwrap();
        let mut n = 0u64;
        eng.scan(&mut |_, _| {
            n += 1;
            true
        })
        .unwrap();
        eng.close().unwrap();
        assert_eq!(n, rows, "{threads} threads");
    }
}

#[test]
fn e9_catches_lost_commits_and_skips_engines_without_committers() {
    let ok = run_model(&Model::default(), commits(4));
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].errors, 0, "{ok:?}");
    assert!(ok[0].value > 0.0);
    let lossy = Model {
        lose_every: Some(7),
        ..Model::default()
    };
    let bad = run_model(&lossy, commits(4));
    assert!(bad[0].errors > 0, "{bad:?}");

    /// An engine whose adapter has no concurrent commits.
    struct Serial(Model);
    impl Engine for Serial {
        fn name(&self) -> &'static str {
            "serial"
        }
        fn describe(&self) -> String {
            String::new()
        }
        fn insert_batch(&mut self, b: &Batch) -> Result<()> {
            self.0.insert_batch(b)
        }
        fn get(&mut self, k: &[u8]) -> Result<Option<Vec<u8>>> {
            self.0.get(k)
        }
        fn scan(&mut self, v: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
            self.0.scan(v)
        }
        fn upsert_add_batch(&mut self, b: &Batch) -> Result<()> {
            self.0.upsert_add_batch(b)
        }
        fn delete_range(&mut self, lo: &[u8], hi: &[u8]) -> Result<()> {
            self.0.delete_range(lo, hi)
        }
        fn sync(&mut self) -> Result<()> {
            Ok(())
        }
        fn close(self: Box<Self>) -> Result<()> {
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let s = spec("serial", commits(4), dir.path());
    let opener = |_: &Path, _: &EngineConfig, _: OpenMode| -> Result<Box<dyn Engine>> {
        Ok(Box::new(Serial(Model::default())))
    };
    let out = run_task_with(&s, &opener).unwrap();
    assert!(out.records.is_empty());
    assert!(
        out.notes.iter().any(|n| n.contains("E9 skipped")),
        "{:?}",
        out.notes
    );
}

#[test]
fn e9_every_compiled_adapter_commits_concurrently_without_error() {
    for system in System::compiled() {
        let dir = tempfile::tempdir().unwrap();
        let out = workloads::run_task(&spec(system.name(), commits(4), dir.path())).unwrap();
        for r in &out.records {
            assert_eq!(r.errors, 0, "{system}: {r:?}");
            assert!(r.value > 0.0, "{system}: {r:?}");
            assert_eq!(r.threads, Some(4));
        }
        if out.records.is_empty() {
            assert!(
                out.notes.iter().any(|n| n.contains("E9 skipped")),
                "{system}"
            );
        }
    }
}

#[test]
fn e9_plan_has_one_task_per_thread_count_and_system_and_json_carries_threads() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = BenchConfig {
        systems: vec![System::FernTree],
        workloads: vec![Workload::E9],
        variants: vec![ValueKind::Incompressible],
        sizes: Sizes {
            commit_threads: vec![1, 4],
            commit_seconds: 0.1,
            ..tiny()
        },
        reps: 1,
        dir: dir.path().join("scratch"),
        seed: 1,
        drop_caches: false,
        isolation: Isolation::InProcess,
        mem_cap: None,
    };
    let plan = cfg.plan();
    assert_eq!(plan.len(), 2);
    assert_eq!(plan[0].scenario, commits(1));
    assert_eq!(plan[1].scenario, commits(4));
    let out = runner::run(&cfg, &mut Silent).unwrap();
    assert!(out.failures.is_empty(), "{:?}", out.failures);
    let json_path = dir.path().join("e9.json");
    fern_bench::report::write_json(&json_path, &out.medians).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    for (r, t) in list.iter().zip([1, 4]) {
        assert_eq!(r["workload"], "E9");
        assert_eq!(r["system"], "fern-tree");
        assert_eq!(r["unit"], "commits/s");
        assert_eq!(r["threads"].as_u64(), Some(t));
        assert!(r["value"].as_f64().unwrap() > 0.0);
    }
}
