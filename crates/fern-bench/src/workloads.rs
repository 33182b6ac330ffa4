//! The engine workloads E1–E7 and E9 of docs/workloads.md, grouped into *scenarios*: the work one
//! child process does on one fresh database.
//!
//! - `random` (per value kind): E1 random inserts, close (E7 space and write amplification are
//!   measured here, after the close and a `sync`), drop the page cache, reopen, E2 lookups,
//!   E3 full scan, E6 range delete + full scan; E7 peak RSS at the end of the process.
//! - `sequential`: E4 ascending inserts.
//! - `upsert`: E5 counter upserts over a tenth as many keys, then every counter read back.
//! - `commits/N` (one scenario per thread count): E9, N threads each committing small batches
//!   durably for a fixed time through the engine's [`Committers`] handle; then close, reopen
//!   and a full scan that must find exactly the rows of every acknowledged commit.
//!
//! Every answer is checked against the generator (the model); wrong answers are counted in the
//! records' `errors` field, never hidden. Timed regions include the engine's final `sync`
//! where the workload ends in a state that must be durable (E1 overall, E4, E5, E6).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::data::{self, ValueKind, KEY_LEN, VALUE_LEN};
use crate::engine::{Batch, Committers, Durability, Engine, EngineConfig, OpenMode, System};
use crate::procinfo;
use crate::report::Record;
use crate::{BenchError, Result};

/// A workload id of docs/workloads.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Workload {
    /// Random inserts.
    E1,
    /// Cold random point lookups after a reopen.
    E2,
    /// Full range scan.
    E3,
    /// Sequential inserts.
    E4,
    /// Upserts (add to a counter), then read all.
    E5,
    /// Range delete of a contiguous 10 %, then a full scan.
    E6,
    /// Space, write amplification, peak RSS.
    E7,
    /// Durable commits of small batches from 1, 4 and 16 threads.
    E9,
}

impl Workload {
    /// Every workload this harness runs.
    pub const ALL: [Workload; 8] = [
        Workload::E1,
        Workload::E2,
        Workload::E3,
        Workload::E4,
        Workload::E5,
        Workload::E6,
        Workload::E7,
        Workload::E9,
    ];

    /// The id, e.g. "E1".
    pub fn name(self) -> &'static str {
        match self {
            Workload::E1 => "E1",
            Workload::E2 => "E2",
            Workload::E3 => "E3",
            Workload::E4 => "E4",
            Workload::E5 => "E5",
            Workload::E6 => "E6",
            Workload::E7 => "E7",
            Workload::E9 => "E9",
        }
    }

    /// Parses "E1" (any case); E8 is known but not implemented yet.
    pub fn parse(s: &str) -> Result<Workload> {
        let up = s.trim().to_ascii_uppercase();
        if let Some(w) = Self::ALL.into_iter().find(|w| w.name() == up) {
            return Ok(w);
        }
        Err(BenchError::Usage(match up.as_str() {
            "E8" => format!("{up} is not implemented yet (E1-E7 and E9 are)"),
            _ => format!("unknown workload {s:?}: expected E1..E7 or E9"),
        }))
    }
}

/// Sizes of one run. `quick` and `full` keep the same data-to-cache ratio.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sizes {
    /// Rows of E1 and E4; upserts of E5.
    pub keys: u64,
    /// Point lookups of E2.
    pub lookups: u64,
    /// Memory budget of every engine, bytes.
    pub budget_bytes: u64,
    /// Rows per write batch.
    pub batch: usize,
    /// E9: thread counts, one scenario (one fresh database) each.
    pub commit_threads: Vec<u32>,
    /// E9: seconds every thread commits for, per thread count.
    pub commit_seconds: f64,
    /// E9: rows per durable commit.
    pub commit_rows: usize,
}

impl Sizes {
    /// Full size: 10M keys, 256 MiB.
    pub fn full() -> Sizes {
        Sizes {
            keys: 10_000_000,
            lookups: 200_000,
            budget_bytes: 256 << 20,
            batch: 1000,
            commit_threads: vec![1, 4, 16],
            commit_seconds: 10.0,
            commit_rows: 10,
        }
    }

    /// Quick size: 1M keys, 32 MiB (the same ratio of data to cache as full, roughly).
    pub fn quick() -> Sizes {
        Sizes {
            keys: 1_000_000,
            lookups: 200_000,
            budget_bytes: 32 << 20,
            batch: 1000,
            commit_threads: vec![1, 4, 16],
            commit_seconds: 3.0,
            commit_rows: 10,
        }
    }

    /// Logical bytes of `keys` rows (16-byte key + 100-byte value).
    pub fn logical_bytes(&self) -> u64 {
        self.keys * (KEY_LEN + VALUE_LEN) as u64
    }
}

/// The work one child process does on one fresh database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Scenario {
    /// E1 → close → E7 space/write-amp → reopen → E2 → E3 → E6 → E7 peak RSS.
    Random {
        /// Value kind of E1.
        values: ValueKind,
    },
    /// E4.
    Sequential,
    /// E5.
    Upsert,
    /// E9 with this many committing threads.
    Commits {
        /// Committing threads.
        threads: u32,
    },
}

impl Scenario {
    /// The workloads this scenario can report.
    pub fn workloads(self) -> &'static [Workload] {
        match self {
            Scenario::Random { .. } => &[
                Workload::E1,
                Workload::E2,
                Workload::E3,
                Workload::E6,
                Workload::E7,
            ],
            Scenario::Sequential => &[Workload::E4],
            Scenario::Upsert => &[Workload::E5],
            Scenario::Commits { .. } => &[Workload::E9],
        }
    }

    /// Short label for progress and logs.
    pub fn label(self) -> String {
        match self {
            Scenario::Random { values } => format!("random/{}", values.name()),
            Scenario::Sequential => "sequential".into(),
            Scenario::Upsert => "upsert".into(),
            Scenario::Commits { threads } => format!("commits/{threads}"),
        }
    }
}

/// Everything a child process needs to run one engine task.
pub type TaskSpec = crate::runner::Spec<Scenario, Workload, Sizes>;

impl crate::runner::PlannedScenario for Scenario {
    type Workload = Workload;
    fn label(self) -> String {
        Scenario::label(self)
    }
    fn workloads(self) -> &'static [Workload] {
        Scenario::workloads(self)
    }
}

/// What one task measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskOutput {
    /// One record per figure (one repetition).
    pub records: Vec<Record>,
    /// Remarks worth printing (page cache not dropped, engine options).
    pub notes: Vec<String>,
}

/// Opens an engine: `(directory, configuration, mode)`.
pub type Opener<'a> = &'a dyn Fn(&Path, &EngineConfig, OpenMode) -> Result<Box<dyn Engine>>;

/// Runs one task in this process.
pub fn run_task(spec: &TaskSpec) -> Result<TaskOutput> {
    let system = System::parse(&spec.system)?;
    run_task_with(spec, &|dir, cfg, mode| system.open(dir, cfg, mode))
}

/// Runs one task with engines made by `opener` (tests use it to run the workloads against a
/// model engine and a deliberately wrong one). Records are named after `spec.system`.
pub fn run_task_with(spec: &TaskSpec, opener: Opener<'_>) -> Result<TaskOutput> {
    std::fs::create_dir_all(&spec.dir)?;
    let mut t = Task {
        spec,
        opener,
        cfg: EngineConfig {
            budget_bytes: spec.sizes.budget_bytes,
            durability: Durability::Deferred,
        },
        out: TaskOutput::default(),
    };
    match spec.scenario {
        Scenario::Random { values } => t.random(values)?,
        Scenario::Sequential => t.sequential()?,
        Scenario::Upsert => t.upsert()?,
        Scenario::Commits { threads } => {
            t.cfg.durability = Durability::PerBatch;
            t.commits(threads.max(1))?
        }
    }
    Ok(t.out)
}

struct Task<'a> {
    spec: &'a TaskSpec,
    opener: Opener<'a>,
    cfg: EngineConfig,
    out: TaskOutput,
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx] as f64
}

impl<'a> Task<'a> {
    fn wants(&self, w: Workload) -> bool {
        self.spec.workloads.contains(&w)
    }

    fn push(&mut self, w: Workload, metric: &str, value: f64, unit: &str, errors: u64) {
        let spec = self.spec;
        let mut r = Record::new(w, &spec.system, value, unit);
        r.metric = Some(metric.to_string());
        if let Scenario::Random { values } = spec.scenario {
            r.variant = Some(values.name().to_string());
        }
        r.keys = Some(spec.sizes.keys);
        r.budget_mib = Some(spec.sizes.budget_bytes >> 20);
        r.errors = errors;
        self.out.records.push(r);
    }

    fn open(&mut self, mode: OpenMode) -> Result<Box<dyn Engine>> {
        let e = (self.opener)(&self.spec.dir, &self.cfg, mode)?;
        if mode == OpenMode::Create {
            self.out
                .notes
                .push(format!("{}: {}", e.name(), e.describe()));
        }
        Ok(e)
    }

    /// Inserts `n` rows produced by `row(i, key, value)` in batches; returns (time of the
    /// whole load including the final sync, time of the last 10 % excluding the sync).
    fn load(
        &self,
        eng: &mut dyn Engine,
        n: u64,
        mut row: impl FnMut(u64, &mut [u8; KEY_LEN], &mut [u8; VALUE_LEN]),
    ) -> Result<(Duration, Duration)> {
        let mut batch = Batch::new();
        let (mut k, mut v) = ([0u8; KEY_LEN], [0u8; VALUE_LEN]);
        let last_start_idx = n - n / 10;
        let start = Instant::now();
        let mut last_start = start;
        let mut i = 0;
        while i < n {
            if i >= last_start_idx && last_start == start {
                last_start = Instant::now();
            }
            batch.clear();
            let end = (i + self.spec.sizes.batch as u64).min(n);
            for j in i..end {
                row(j, &mut k, &mut v);
                batch.push(&k, &v);
            }
            eng.insert_batch(&batch)?;
            i = end;
        }
        let last = last_start.elapsed();
        eng.sync()?;
        Ok((start.elapsed(), last))
    }

    /// Full scan: (rows, elapsed, rows out of order, rows for which `bad` is true).
    fn scan(
        eng: &mut dyn Engine,
        mut bad: impl FnMut(&[u8]) -> bool,
    ) -> Result<(u64, Duration, u64, u64)> {
        let (mut rows, mut disorder, mut bad_rows) = (0u64, 0u64, 0u64);
        let mut prev: Vec<u8> = Vec::new();
        let start = Instant::now();
        eng.scan(&mut |k, _v| {
            if rows > 0 && k <= prev.as_slice() {
                disorder += 1;
            }
            if bad(k) {
                bad_rows += 1;
            }
            prev.clear();
            prev.extend_from_slice(k);
            rows += 1;
            true
        })?;
        Ok((rows, start.elapsed(), disorder, bad_rows))
    }

    fn random(&mut self, kind: ValueKind) -> Result<()> {
        let n = self.spec.sizes.keys;
        let seed = self.spec.seed;
        let logical = self.spec.sizes.logical_bytes() as f64;
        let io0 = procinfo::io_counters()?;
        let mut eng = self.open(OpenMode::Create)?;
        let (total, last) = self.load(eng.as_mut(), n, |i, k, v| {
            *k = data::random_key(seed, i);
            data::fill_value(kind, seed, i, v);
        })?;
        eng.close()?;
        procinfo::sync_all();
        let io1 = procinfo::io_counters()?;
        let (alloc, apparent) = procinfo::dir_usage(&self.spec.dir)?;
        if self.wants(Workload::E1) {
            self.push(Workload::E1, "overall", rate(n, total), "inserts/s", 0);
            self.push(Workload::E1, "last 10%", rate(n / 10, last), "inserts/s", 0);
        }
        if self.wants(Workload::E7) {
            self.push(Workload::E7, "space", alloc as f64 / logical, "x", 0);
            self.push(
                Workload::E7,
                "apparent space",
                apparent as f64 / logical,
                "x",
                0,
            );
            let written = io1.write_bytes.saturating_sub(io0.write_bytes);
            self.push(Workload::E7, "write amp", written as f64 / logical, "x", 0);
            // write_bytes is charged when a page is first dirtied, so rewrites of a page that
            // is still dirty are absorbed by the page cache and never reach the device; the
            // bytes of write calls show the engine's own write volume.
            let issued = io1.wchar.saturating_sub(io0.wchar);
            self.push(Workload::E7, "write calls", issued as f64 / logical, "x", 0);
        }
        let reads = [Workload::E2, Workload::E3, Workload::E6];
        if reads.iter().any(|w| self.wants(*w)) {
            let dropped = self.spec.drop_caches && procinfo::drop_page_cache();
            if !dropped {
                self.out
                    .notes
                    .push("page cache NOT dropped before E2 (not root, or disabled)".into());
            }
            let mut eng = self.open(OpenMode::Reopen)?;
            if self.wants(Workload::E2) {
                self.lookups(eng.as_mut(), kind)?;
            }
            if self.wants(Workload::E3) {
                let (rows, d, disorder, _) = Self::scan(eng.as_mut(), |_| false)?;
                let errors = disorder + rows.abs_diff(n);
                self.push(Workload::E3, "full scan", rate(rows, d), "rows/s", errors);
            }
            if self.wants(Workload::E6) {
                self.range_delete(eng.as_mut())?;
            }
            eng.close()?;
        }
        if self.wants(Workload::E7) {
            let rss = procinfo::peak_rss_bytes().unwrap_or(0);
            self.push(
                Workload::E7,
                "peak RSS",
                rss as f64 / (1 << 20) as f64,
                "MiB",
                0,
            );
        }
        Ok(())
    }

    fn lookups(&mut self, eng: &mut dyn Engine, kind: ValueKind) -> Result<()> {
        let (n, seed) = (self.spec.sizes.keys, self.spec.seed);
        let count = self.spec.sizes.lookups;
        let mut rng = data::Rng::new(seed ^ 0xE2);
        // With at least as many lookups as keys, every key is looked up (tests rely on it).
        let order: Option<Vec<u64>> = (count >= n).then(|| {
            let mut o: Vec<u64> = (0..n).collect();
            for i in (1..o.len()).rev() {
                o.swap(i, rng.below(i as u64 + 1) as usize);
            }
            o
        });
        let mut lat = Vec::with_capacity(count as usize);
        let mut errors = 0u64;
        let io0 = procinfo::io_counters().ok();
        let start = Instant::now();
        for j in 0..count {
            let i = match &order {
                Some(o) => o[(j % n) as usize],
                None => rng.below(n),
            };
            let key = data::random_key(seed, i);
            let t0 = Instant::now();
            let got = eng.get(&key)?;
            lat.push(t0.elapsed().as_nanos() as u64);
            if got.as_deref() != Some(&data::value(kind, seed, i)[..]) {
                errors += 1;
            }
        }
        let d = start.elapsed();
        lat.sort_unstable();
        self.push(Workload::E2, "lookups", rate(count, d), "lookups/s", errors);
        self.push(Workload::E2, "p50", percentile(&lat, 0.50) / 1e3, "us", 0);
        self.push(Workload::E2, "p99", percentile(&lat, 0.99) / 1e3, "us", 0);
        // What each lookup cost the device and the kernel: a cold read's bytes are the
        // engine's read granularity (a basement, a block, an SST's data block) times the
        // levels that missed the cache.
        if let (Some(io0), Ok(io1)) = (io0, procinfo::io_counters()) {
            let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / count.max(1) as f64;
            let bytes = per(io0.read_bytes, io1.read_bytes);
            self.push(Workload::E2, "read per lookup", bytes / 1024.0, "KiB", 0);
            let calls = per(io0.syscr, io1.syscr);
            self.push(Workload::E2, "reads per lookup", calls, "calls", 0);
        }
        Ok(())
    }

    fn range_delete(&mut self, eng: &mut dyn Engine) -> Result<()> {
        let (n, seed) = (self.spec.sizes.keys, self.spec.seed);
        let (lo, hi) = data::e6_bounds();
        let in_range = |k: &[u8]| k >= &lo[..] && k < &hi[..];
        let deleted = (0..n)
            .filter(|&i| in_range(&data::random_key(seed, i)))
            .count() as u64;
        let start = Instant::now();
        eng.delete_range(&lo, &hi)?;
        eng.sync()?;
        let d = start.elapsed();
        self.push(Workload::E6, "range delete", d.as_secs_f64(), "seconds", 0);
        let (rows, d, disorder, bad) = Self::scan(eng, in_range)?;
        let errors = disorder + bad + rows.abs_diff(n - deleted);
        self.push(Workload::E6, "scan after", rate(rows, d), "rows/s", errors);
        Ok(())
    }

    fn sequential(&mut self) -> Result<()> {
        let (n, seed) = (self.spec.sizes.keys, self.spec.seed);
        let mut eng = self.open(OpenMode::Create)?;
        let (total, _) = self.load(eng.as_mut(), n, |i, k, v| {
            *k = data::sequential_key(i);
            data::fill_value(ValueKind::Incompressible, seed, i, v);
        })?;
        // A cheap check that the rows are there: first, middle and last.
        let mut errors = 0;
        for i in [0, n / 2, n.saturating_sub(1)] {
            let want = data::value(ValueKind::Incompressible, seed, i);
            if eng.get(&data::sequential_key(i))?.as_deref() != Some(&want[..]) {
                errors += 1;
            }
        }
        eng.close()?;
        self.push(Workload::E4, "inserts", rate(n, total), "inserts/s", errors);
        Ok(())
    }

    fn upsert(&mut self) -> Result<()> {
        let (n, seed) = (self.spec.sizes.keys, self.spec.seed);
        let counters = (n / 10).max(1);
        let key_seed = seed ^ 0xE5;
        let mut model = vec![0u64; counters as usize];
        let mut rng = data::Rng::new(seed ^ 0xE5E5);
        let mut eng = self.open(OpenMode::Create)?;
        let mut batch = Batch::new();
        let start = Instant::now();
        let mut done = 0;
        while done < n {
            batch.clear();
            let end = (done + self.spec.sizes.batch as u64).min(n);
            for _ in done..end {
                let j = rng.below(counters);
                let delta = 1 + rng.below(1000);
                model[j as usize] += delta;
                batch.push(&data::random_key(key_seed, j), &delta.to_le_bytes());
            }
            eng.upsert_add_batch(&batch)?;
            done = end;
        }
        eng.sync()?;
        let d = start.elapsed();
        let mut errors = 0;
        let start = Instant::now();
        for (j, want) in model.iter().enumerate() {
            let got = eng.get(&data::random_key(key_seed, j as u64))?;
            let ok = match got {
                Some(v) => v.len() == 8 && crate::engine::decode_counter(Some(&v)) == *want,
                None => *want == 0,
            };
            if !ok {
                errors += 1;
            }
        }
        let rd = start.elapsed();
        eng.close()?;
        self.push(Workload::E5, "upserts", rate(n, d), "upserts/s", 0);
        self.push(
            Workload::E5,
            "read all",
            rate(counters, rd),
            "reads/s",
            errors,
        );
        Ok(())
    }

    /// E9: `threads` threads commit `commit_rows`-row batches durably until
    /// `commit_seconds` have passed; the figure is acknowledged commits per second. After a
    /// close and a reopen a full scan must find exactly the rows of every acknowledged commit
    /// (key = thread, commit number, row: 4 + 8 + 4 bytes big-endian; anything else, a
    /// missing row or a row out of order is counted in `errors`).
    fn commits(&mut self, threads: u32) -> Result<()> {
        let spec = self.spec;
        let (rows, seed) = (spec.sizes.commit_rows.max(1), spec.seed);
        let mut eng = self.open(OpenMode::Create)?;
        let Some(handle) = eng.committers() else {
            let name = eng.name();
            eng.close()?;
            self.out.notes.push(format!(
                "{name}: E9 skipped (no concurrent durable commits in this adapter)"
            ));
            return Ok(());
        };
        let secs = Duration::from_secs_f64(spec.sizes.commit_seconds.max(0.0));
        let (done, elapsed) = run_committers(&handle, threads, rows, seed, secs)?;
        drop(handle);
        eng.close()?;
        let total: u64 = done.iter().sum();
        let eng = self.open(OpenMode::Reopen)?;
        let errors = check_commits(eng, &done, rows)?;
        let mut r = Record::new(
            Workload::E9,
            &spec.system,
            rate(total, elapsed),
            "commits/s",
        );
        r.metric = Some(format!("{threads} threads"));
        r.threads = Some(threads);
        r.keys = Some(total * rows as u64);
        r.errors = errors;
        self.out.records.push(r);
        Ok(())
    }
}

/// The key of row `row` of commit `n` of thread `t` in E9.
fn commit_key(t: u32, n: u64, row: u32) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[..4].copy_from_slice(&t.to_be_bytes());
    k[4..12].copy_from_slice(&n.to_be_bytes());
    k[12..].copy_from_slice(&row.to_be_bytes());
    k
}

/// Runs the E9 threads; returns the commits each thread had acknowledged and the time from
/// the common start until the last thread finished its last commit.
fn run_committers(
    handle: &Arc<dyn Committers>,
    threads: u32,
    rows: usize,
    seed: u64,
    secs: Duration,
) -> Result<(Vec<u64>, Duration)> {
    let stop = AtomicBool::new(false);
    let start_line = Barrier::new(threads as usize + 1);
    let (results, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, start_line) = (&stop, &start_line);
                s.spawn(move || -> Result<u64> {
                    let committer = handle.committer();
                    start_line.wait();
                    let mut c = committer?;
                    let mut batch = Batch::new();
                    let mut v = [0u8; VALUE_LEN];
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        batch.clear();
                        for row in 0..rows as u32 {
                            let i = (u64::from(t) << 40) ^ (n << 8) ^ u64::from(row);
                            data::fill_value(ValueKind::Incompressible, seed, i, &mut v);
                            batch.push(&commit_key(t, n, row), &v);
                        }
                        c.commit(&batch)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        std::thread::sleep(secs);
        stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(BenchError::Usage("E9 thread panicked".into())))
            })
            .collect();
        (results, start.elapsed())
    });
    let done = results.into_iter().collect::<Result<Vec<u64>>>()?;
    Ok((done, elapsed))
}

/// Scans the reopened E9 database: exactly the rows of the acknowledged commits, in order.
/// Returns the number of wrong, missing or disordered rows; closes the engine.
fn check_commits(mut eng: Box<dyn Engine>, done: &[u64], rows: usize) -> Result<u64> {
    let want: u64 = done.iter().sum::<u64>() * rows as u64;
    let (mut seen, mut bad) = (0u64, 0u64);
    let mut prev: Option<[u8; KEY_LEN]> = None;
    eng.scan(&mut |k, v| {
        let ok = k.len() == KEY_LEN && v.len() == VALUE_LEN && {
            let t = u32::from_be_bytes(k[..4].try_into().unwrap_or_default());
            let n = u64::from_be_bytes(k[4..12].try_into().unwrap_or_default());
            let row = u32::from_be_bytes(k[12..].try_into().unwrap_or_default());
            (t as usize) < done.len() && n < done[t as usize] && (row as usize) < rows
        };
        let key: [u8; KEY_LEN] = k.try_into().unwrap_or([0; KEY_LEN]);
        if !ok || prev.is_some_and(|p| key <= p) {
            bad += 1;
        } else {
            seen += 1;
        }
        prev = Some(key);
        true
    })?;
    eng.close()?;
    Ok(bad + want.abs_diff(seen))
}
