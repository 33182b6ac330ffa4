//! Seeded crash test of the write-ahead log, group commit, checkpoints and recovery.
//!
//! Each seed runs a random workload (inserts, deletes, upserts, range deletes, batches across
//! trees, a tree created mid-way, `Sync` and `Buffered` commits, `sync()`, checkpoints) on a
//! [`CrashDevice`] against a `BTreeMap` model, and cuts the power at a random mutating device
//! call (inside a log append, a group-commit fsync, a checkpoint, an eviction...). The crash image
//! keeps, drops or tears each unsynced write by seed. Half the seeds crash again during recovery.
//! The recovered image must equal the model after exactly k batches, with k at least the last
//! batch acknowledged durable (W3) and at most the last one issued: nothing acknowledged is lost,
//! no batch is half applied (W2), the torn tail is cut (W1, W4), recovery is idempotent (W7) and
//! every tree verifies. Then the recovered environment must keep working across a reopen.
//!
//! `FERN_CRASH_SEEDS=n` sets the number of seeds (default 1000), `FERN_CRASH_SEED_BASE=b` the
//! first one; `FERN_CRASH_SEED=s` runs seed `s` alone. A failure prints the command that
//! reproduces it exactly.

use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::{CrashDevice, MemDevice};
use fern_tree::{Env, Options, UpsertId, WriteBatch};

mod common;
use common::{normalized, remove_range, small_options, Model};

mod crash_at;
use crash_at::{image_after_cut, CrashAt, History};

type Rng = fern_testkit::SplitMix64;

/// The generator of crash seed `seed` (this derivation is what the documented seeds ran with).
fn rng_of(seed: u64) -> Rng {
    Rng::from_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D)
}

const UPSERT: UpsertId = UpsertId(7);
const TREES: [&str; 3] = ["alpha", "beta", "gamma"];

/// Appends the argument and keeps the last 64 bytes; an empty result deletes the row.
fn upsert_fn(_key: &[u8], old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let mut v = old.unwrap_or_default().to_vec();
    v.extend_from_slice(arg);
    let start = v.len().saturating_sub(64);
    let v = v[start..].to_vec();
    (!v.is_empty()).then_some(v)
}

fn options(rng: &mut Rng) -> Options {
    let mut o = small_options([16 << 10, 32 << 10, 64 << 10][rng.below(3) as usize]);
    o.register_upsert(UPSERT, Arc::new(upsert_fn));
    o
}

enum ModelOp {
    Insert(usize, Vec<u8>, Vec<u8>),
    Delete(usize, Vec<u8>),
    Upsert(usize, Vec<u8>, Vec<u8>),
    Range(usize, Vec<u8>, Vec<u8>),
}

fn key(rng: &mut Rng) -> Vec<u8> {
    format!("key{:04}", rng.below(300)).into_bytes()
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = [0, 5, 40, 120, 900][rng.below(5) as usize];
    (0..len)
        .map(|i| (rng.next_u64() as u8).wrapping_add(i as u8))
        .collect()
}

fn apply_model(m: &mut Model, op: &ModelOp) {
    let t = |i: usize| TREES[i].to_string();
    match op {
        ModelOp::Insert(i, k, v) => {
            m.entry(t(*i)).or_default().insert(k.clone(), v.clone());
        }
        ModelOp::Delete(i, k) => {
            m.entry(t(*i)).or_default().remove(k);
        }
        ModelOp::Upsert(i, k, a) => {
            let tree = m.entry(t(*i)).or_default();
            match upsert_fn(k, tree.get(k).map(|v| v.as_slice()), a) {
                Some(v) => tree.insert(k.clone(), v),
                None => tree.remove(k),
            };
        }
        ModelOp::Range(i, lo, hi) => {
            remove_range(m.entry(t(*i)).or_default(), lo, hi);
        }
    }
}

/// Every tree's rows (a tree that does not exist reads as empty), after verifying each tree.
fn contents(env: &Env) -> Result<Model, String> {
    let mut m = Model::new();
    for name in env.tree_names() {
        let t = env.tree(&name).map_err(|e| e.to_string())?;
        t.verify()
            .map_err(|e| format!("tree {name} fails verify: {e}"))?;
        let rows = t
            .range_vec(Bound::Unbounded, Bound::Unbounded)
            .map_err(|e| e.to_string())?;
        if !rows.is_empty() {
            m.insert(name, rows.into_iter().collect());
        }
    }
    Ok(m)
}

/// What one seed did, for the summary (a test that checks nothing should not look green) and
/// for the replay check: the same seed must give the same outcome, to the byte of its image.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// The power was cut before the workload ended.
    crashed_mid_run: bool,
    /// Batches acknowledged durable, and batches recovered.
    durable: usize,
    recovered: usize,
    /// A checksum of the image recovery started from.
    image_crc: u32,
}

/// Runs one seed; `Err` describes the failure.
fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut rng = rng_of(seed);
    let opts = options(&mut rng);
    let steps = 10 + rng.below(140);
    // Device calls of a run are up to a few hundred; crash anywhere in that range (or never).
    let crash_at = rng.below(20 + steps * 2);
    let base = Arc::new(CrashDevice::new());
    let dev = Arc::new(CrashAt::device(base.clone(), crash_at, seed));
    let mut hist = History::new(Model::new());
    let mut trees = Vec::new();
    let mut crashed_mid_run = true;
    'run: {
        let Ok(env) = Env::create_on(dev.clone(), opts.clone()) else {
            // Creation never returned: nothing was acknowledged; an unopenable image is allowed.
            return Ok(Outcome {
                crashed_mid_run: true,
                ..Outcome::default()
            });
        };
        for name in &TREES[..2] {
            match env.tree(name) {
                Ok(t) => trees.push(t),
                Err(_) => break 'run,
            }
        }
        for _ in 0..steps {
            let r = rng.below(100);
            if r < 75 {
                if trees.len() < 3 && rng.below(30) == 0 {
                    match env.tree(TREES[2]) {
                        Ok(t) => trees.push(t),
                        Err(_) => break 'run,
                    }
                }
                let mut batch = WriteBatch::new();
                let mut model = hist.next_model();
                for _ in 0..1 + rng.below(4) {
                    let ti = rng.below(trees.len() as u64) as usize;
                    let t = &trees[ti];
                    let op = match rng.below(10) {
                        0..=4 => {
                            let (k, v) = (key(&mut rng), value(&mut rng));
                            batch.insert(t, &k, &v);
                            ModelOp::Insert(ti, k, v)
                        }
                        5 | 6 => {
                            let k = key(&mut rng);
                            batch.delete(t, &k);
                            ModelOp::Delete(ti, k)
                        }
                        7 | 8 => {
                            let k = key(&mut rng);
                            let a: Vec<u8> =
                                (0..rng.below(20)).map(|_| rng.next_u64() as u8).collect();
                            batch.upsert(t, &k, UPSERT, &a);
                            ModelOp::Upsert(ti, k, a)
                        }
                        _ => {
                            let (a, b) = (key(&mut rng), key(&mut rng));
                            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                            batch.delete_range(t, &lo, &hi);
                            ModelOp::Range(ti, lo, hi)
                        }
                    };
                    apply_model(&mut model, &op);
                }
                if hist.write(&env, batch, model, &mut rng).is_err() {
                    break 'run;
                }
            } else if r < 92 {
                let settle = if r < 85 { Env::sync } else { Env::checkpoint };
                if hist.settled(settle(&env)).is_err() {
                    break 'run;
                }
            } else {
                // A read in the middle (exercises eviction from the read path).
                let t = &trees[rng.below(trees.len() as u64) as usize];
                if t.get(&key(&mut rng)).is_err() {
                    break 'run;
                }
            }
        }
        crashed_mid_run = false;
        dev.gate().cut(); // the destructor's checkpoint below fails: the machine is gone
        drop(trees);
        drop(env);
    }
    let image = image_after_cut(&dev, &mut rng, seed, &opts);
    let image_crc = crc32c::crc32c(&image);
    let mem = Arc::new(MemDevice::from_bytes(image));
    let env =
        Env::open_on(mem.clone(), opts.clone()).map_err(|e| format!("recovery failed: {e}"))?;
    let got = contents(&env)?;
    let what = format!(
        "{} trees, {} rows",
        got.len(),
        got.values().map(|t| t.len()).sum::<usize>()
    );
    let k = hist.recovered(|m| normalized(m) == got, &what)?;
    // The recovered environment keeps working: write, reopen, read it back.
    let mut model = hist.states[k].clone();
    let t = env.tree(TREES[0]).map_err(|e| e.to_string())?;
    for i in 0..20u32 {
        let k = format!("after{i:03}").into_bytes();
        t.insert(&k, &i.to_le_bytes()).map_err(|e| e.to_string())?;
        model
            .entry(TREES[0].to_string())
            .or_default()
            .insert(k, i.to_le_bytes().to_vec());
    }
    env.sync().map_err(|e| e.to_string())?;
    drop(t);
    let after = mem.snapshot(); // a crash right after sync(): no destructor checkpoint
    drop(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(after)), opts)
        .map_err(|e| format!("second reopen failed: {e}"))?;
    if contents(&env)? != normalized(&model) {
        return Err("writes after recovery were not recovered".into());
    }
    Ok(Outcome {
        crashed_mid_run,
        durable: hist.durable,
        recovered: k,
        image_crc,
    })
}

/// A seed replays exactly: the reproduction command a failure prints runs the same workload,
/// cuts the power at the same device call and leaves the same image. (Writing the dirty nodes of
/// a checkpoint in hash-map order, with a hasher seeded per map, broke this.)
#[test]
fn a_seed_replays_exactly() {
    for seed in 0..20 {
        let first = run_seed(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let second = run_seed(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(first, second, "seed {seed} ran twice differently");
    }
}

#[test]
fn crash_seeds() {
    let passed = crash_at::run_all("FERN_CRASH", "crash", 1000, run_seed);
    let sum = |f: fn(&Outcome) -> usize| passed.iter().map(f).sum::<usize>();
    eprintln!(
        "{} crash seeds passed: {} crashed mid-run; {} batches acknowledged durable, {} recovered",
        passed.len(),
        sum(|o| o.crashed_mid_run as usize),
        sum(|o| o.durable),
        sum(|o| o.recovered)
    );
}
