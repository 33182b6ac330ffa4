//! Seeded power-cut test of data extents (docs/format.md, "Data extents", X1–X10).
//!
//! Each seed runs a random workload on a [`CrashDevice`]: rows that hold a data extent (1 byte
//! to 40 KiB, written with `insert_extent`) or a small inline value, overwrites and deletes that
//! free the extent they replace, range deletes that free every extent in the range, `Sync` and
//! `Buffered` commits, `sync()`, periodic flushes and checkpoints; the power is cut at a random
//! mutating device call (inside an extent's `pwrite`, a log append, a sync, a checkpoint...) and
//! the crash image keeps, drops or tears each unsynced write by seed. Half the seeds crash again
//! during recovery. After recovery:
//! - the rows equal the model after exactly k batches, k at least the last batch acknowledged
//!   durable and at most the last issued, and every extent a row names reads back its data
//!   (nothing acknowledged lost, no torn extent kept: X2, X7);
//! - the live extents are exactly those the rows name (nothing leaked: X1, X6, X9);
//! - no two live extents overlap, and none was handed out twice: after two checkpoints and new
//!   extents written into the freed space, every old extent still verifies (X3, X5);
//! - the state survives another reopen.
//!
//! `FERN_EXTENT_SEEDS=n` (default 1000), `FERN_EXTENT_SEED_BASE=b`, `FERN_EXTENT_SEED=s`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::{CrashDevice, MemDevice};
use fern_tree::{Env, ExtentRef, Options, Tree, WriteBatch};

mod common;
mod crash_at;
use crash_at::{image_after_cut, CrashAt, History};

type Rng = fern_testkit::SplitMix64;

/// Row tags: an extent reference follows `EXT`, inline bytes follow `INLINE`.
const EXT: u8 = b'E';
const INLINE: u8 = b'S';

/// key -> (is an extent, data)
type Model = BTreeMap<Vec<u8>, (bool, Vec<u8>)>;

fn options(rng: &mut Rng) -> Options {
    common::small_options([16 << 10, 32 << 10, 64 << 10][rng.below(3) as usize])
}

fn key(rng: &mut Rng) -> Vec<u8> {
    format!("k{:03}", rng.below(60)).into_bytes()
}

fn data(rng: &mut Rng, seed_byte: u8) -> Vec<u8> {
    let len = match rng.below(4) {
        0 => 1 + rng.below(100) as usize,
        1 => 4096 * (1 + rng.below(4) as usize),
        _ => 1 + rng.below(40 << 10) as usize,
    };
    let mut x = rng.next_u64();
    (0..len)
        .map(|i| {
            x = x.rotate_left(7) ^ i as u64;
            (x as u8) ^ seed_byte
        })
        .collect()
}

/// The extent a row names, if it names one.
fn row_ref(value: &[u8]) -> Result<Option<ExtentRef>, String> {
    match value.first() {
        Some(&EXT) => ExtentRef::decode(&value[1..]).map(Some),
        Some(&INLINE) => Ok(None),
        _ => Err(format!("row of unknown kind: {value:?}")),
    }
}

/// Every row, extents read back (verified), and the references the rows hold.
fn contents(env: &Env, t: &Tree) -> Result<(Model, Vec<ExtentRef>), String> {
    t.verify().map_err(|e| format!("tree fails verify: {e}"))?;
    let rows = t
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .map_err(|e| e.to_string())?;
    let mut m = Model::new();
    let mut refs = Vec::new();
    for (k, v) in rows {
        match row_ref(&v)? {
            Some(r) => {
                let mut buf = vec![0u8; r.len as usize];
                env.read_extent(&r, &mut buf)
                    .map_err(|e| format!("row {:?}: {e}", String::from_utf8_lossy(&k)))?;
                refs.push(r);
                m.insert(k, (true, buf));
            }
            None => {
                m.insert(k, (false, v[1..].to_vec()));
            }
        }
    }
    refs.sort();
    Ok((m, refs))
}

/// X1, X3, X9: the live extents are exactly the rows' references and none overlap.
fn check_extents(env: &Env, refs: &[ExtentRef]) -> Result<(), String> {
    let live = env.extents();
    if live != refs {
        return Err(format!(
            "live extents {} differ from the {} the rows name (leaked: {:?}; missing: {:?})",
            live.len(),
            refs.len(),
            live.iter()
                .filter(|r| !refs.contains(r))
                .collect::<Vec<_>>(),
            refs.iter()
                .filter(|r| !live.contains(r))
                .collect::<Vec<_>>()
        ));
    }
    for w in live.windows(2) {
        if w[0].offset + (w[0].len as u64).div_ceil(4096) * 4096 > w[1].offset {
            return Err(format!("extents overlap: {:?} and {:?}", w[0], w[1]));
        }
    }
    Ok(())
}

/// Adds the ops that put `value` (extent or inline) at `k` and free what the row held.
fn put(
    batch: &mut WriteBatch,
    t: &Tree,
    k: &[u8],
    ext: bool,
    value: Vec<u8>,
) -> Result<(), String> {
    if let Some(old) = t.get(k).map_err(|e| e.to_string())? {
        if let Some(r) = row_ref(&old)? {
            batch.free_extent(r);
        }
    }
    if ext {
        batch.insert_extent(t, k, &[EXT], value);
    } else {
        let mut v = vec![INLINE];
        v.extend_from_slice(&value);
        batch.insert(t, k, &v);
    }
    Ok(())
}

#[derive(Default)]
struct Outcome {
    crashed_mid_run: bool,
    torn_cut: bool,
    extents_checked: usize,
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut rng = Rng::from_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED_E7E7);
    let opts = options(&mut rng);
    let steps = 10 + rng.below(90);
    let crash_at = rng.below(30 + steps * 3);
    let base = Arc::new(CrashDevice::new());
    let dev = Arc::new(CrashAt::device(base, crash_at, seed));
    let mut hist = History::new(Model::new());
    let mut crashed_mid_run = true;
    'run: {
        let Ok(env) = Env::create_on(dev.clone(), opts.clone()) else {
            return Ok(Outcome {
                crashed_mid_run: true,
                ..Outcome::default()
            });
        };
        let Ok(t) = env.tree("rows") else { break 'run };
        for step in 0..steps {
            let r = rng.below(100);
            if r < 70 {
                let mut batch = WriteBatch::new();
                let mut model = hist.next_model();
                let mut touched = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let k = key(&mut rng);
                    // One op per key per batch: the frees are found by reading the row as it
                    // was before the batch.
                    if touched.contains(&k) {
                        continue;
                    }
                    let kind = rng.below(10);
                    if kind < 8 {
                        touched.push(k.clone());
                    }
                    match kind {
                        0..=5 => {
                            let ext = rng.below(4) != 0;
                            let mut v = data(&mut rng, step as u8);
                            if !ext {
                                v.truncate(1 + v.len() % 300); // inline rows stay small
                            }
                            if put(&mut batch, &t, &k, ext, v.clone()).is_err() {
                                break 'run;
                            }
                            model.insert(k, (ext, v));
                        }
                        6 | 7 => {
                            match t.get(&k) {
                                Ok(Some(old)) => {
                                    if let Some(r) = row_ref(&old)? {
                                        batch.free_extent(r);
                                    }
                                }
                                Ok(None) => {}
                                Err(_) => break 'run,
                            }
                            batch.delete(&t, &k);
                            model.remove(&k);
                        }
                        _ => {
                            // A range delete frees every extent in the range (X9) without
                            // reading their data.
                            let hi = key(&mut rng);
                            let (lo, hi) = if k <= hi { (k, hi) } else { (hi, k) };
                            let Ok(rows) = t.range_vec(
                                Bound::Included(lo.as_slice()),
                                Bound::Excluded(hi.as_slice()),
                            ) else {
                                break 'run;
                            };
                            if touched
                                .iter()
                                .any(|t| t.as_slice() >= lo.as_slice() && *t < hi)
                            {
                                // A key this batch already changed lies in the range: its
                                // frees would be found in the wrong version. Skip the op.
                                continue;
                            }
                            for (_, rv) in &rows {
                                if let Some(r) = row_ref(rv)? {
                                    batch.free_extent(r);
                                }
                            }
                            batch.delete_range(&t, &lo, &hi);
                            touched.extend(common::remove_range(&mut model, &lo, &hi));
                        }
                    }
                }
                if batch.is_empty() {
                    continue;
                }
                if let Err(e) = hist.write(&env, batch, model, &mut rng) {
                    if matches!(e, fern_tree::Error::InvalidArgument(_)) {
                        return Err(format!("batch refused: {e}"));
                    }
                    break 'run;
                }
            } else if r < 92 {
                let settle = match r {
                    ..78 => Env::sync,
                    78..84 => Env::periodic_flush,
                    _ => Env::checkpoint,
                };
                if hist.settled(settle(&env)).is_err() {
                    break 'run;
                }
            } else {
                let Ok(rows) = t.range_vec(Bound::Unbounded, Bound::Unbounded) else {
                    break 'run;
                };
                if let Some((_, v)) = rows.first() {
                    if let Ok(Some(r)) = row_ref(v) {
                        let mut buf = vec![0u8; r.len as usize];
                        if env.read_extent(&r, &mut buf).is_err() {
                            break 'run;
                        }
                    }
                }
            }
        }
        crashed_mid_run = false;
        dev.gate().cut();
        drop(t);
        drop(env);
    }
    let image = image_after_cut(&dev, &mut rng, seed, &opts);
    let mem = Arc::new(MemDevice::from_bytes(image));
    let env =
        Env::open_on(mem.clone(), opts.clone()).map_err(|e| format!("recovery failed: {e}"))?;
    let torn_cut = env.recovery().torn_extent_cut.is_some();
    let t = env.tree("rows").map_err(|e| e.to_string())?;
    let (got, refs) = contents(&env, &t)?;
    check_extents(&env, &refs)?;
    let k = hist.recovered(|m| *m == got, &format!("{} rows", got.len()))?;
    // No space handed out twice (X3, X5): free half the rows, checkpoint twice (the freed
    // space returns), fill it with new extents, and every surviving extent must still verify.
    let mut model = hist.states[k].clone();
    let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    for (i, k) in keys.iter().enumerate() {
        if i % 2 == 0 {
            let mut b = WriteBatch::new();
            if let Some(r) = row_ref(&t.get(k).map_err(|e| e.to_string())?.unwrap_or_default())? {
                b.free_extent(r);
            }
            b.delete(&t, k);
            env.write(b).map_err(|e| e.to_string())?;
            model.remove(k);
        }
    }
    env.checkpoint().map_err(|e| e.to_string())?;
    env.checkpoint().map_err(|e| e.to_string())?;
    for i in 0..8u8 {
        let k = format!("new{i}").into_bytes();
        let v = data(&mut rng, 0xA5 ^ i);
        let mut b = WriteBatch::new();
        b.insert_extent(&t, &k, &[EXT], v.clone());
        env.write(b).map_err(|e| e.to_string())?;
        model.insert(k, (true, v));
    }
    env.sync().map_err(|e| e.to_string())?;
    let (after, refs) = contents(&env, &t).map_err(|e| format!("after reuse: {e}"))?;
    check_extents(&env, &refs)?;
    if after != model {
        return Err("rows after freeing and rewriting differ from the model".into());
    }
    let snap = mem.snapshot(); // a crash right after sync()
    drop(t);
    drop(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(snap)), opts)
        .map_err(|e| format!("second reopen failed: {e}"))?;
    let t = env.tree("rows").map_err(|e| e.to_string())?;
    let (again, refs) = contents(&env, &t)?;
    check_extents(&env, &refs)?;
    if again != model {
        return Err("writes after recovery were not recovered".into());
    }
    Ok(Outcome {
        crashed_mid_run,
        torn_cut,
        extents_checked: refs.len(),
    })
}

#[test]
fn extent_crash_seeds() {
    let passed = crash_at::run_all("FERN_EXTENT", "extent_crash", 1000, run_seed);
    let sum = |f: fn(&Outcome) -> usize| passed.iter().map(f).sum::<usize>();
    eprintln!(
        "{} extent crash seeds passed: {} crashed mid-run, {} recoveries cut a torn extent's \
         record (X7), {} live extents verified at the end",
        passed.len(),
        sum(|o| o.crashed_mid_run as usize),
        sum(|o| o.torn_cut as usize),
        sum(|o| o.extents_checked)
    );
}
