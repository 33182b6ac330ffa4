//! Model-based property test: random operation sequences against a BTreeMap, on tiny nodes so
//! trees get deep, with checkpoints, reopen, and a cache small enough to force eviction.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::{BlockDevice, MemDevice};
use fern_tree::{Compression, Env, Options, UpsertId, WriteBatch};
use proptest::prelude::*;

const ADD: UpsertId = UpsertId(1);
const APPEND: UpsertId = UpsertId(2);

fn add(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let o = old
        .and_then(|o| o.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let a = arg.try_into().map(u64::from_le_bytes).unwrap_or(0);
    let n = o.wrapping_add(a);
    // A counter that reaches zero disappears: exercises upserts that delete.
    (n != 0).then(|| n.to_le_bytes().to_vec())
}

fn append(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
    v.extend_from_slice(arg);
    v.truncate(300);
    Some(v)
}

fn options(comp: Compression) -> Options {
    let mut o = Options {
        cache_bytes: 48 * 1024,
        node_bytes: 4096,
        basement_bytes: 512,
        fanout: 4,
        compression: comp,
        ..Options::default()
    };
    o.register_upsert(ADD, Arc::new(|_k, old, arg| add(old, arg)));
    o.register_upsert(APPEND, Arc::new(|_k, old, arg| append(old, arg)));
    // ADD's arguments merge (so buffered runs of it coalesce into one message); APPEND has no
    // merge, so its runs stay and only fold into an older insert or delete.
    o.register_merge(
        ADD,
        Arc::new(|a, b| {
            let a = u64::from_le_bytes(a.try_into().ok()?);
            let b = u64::from_le_bytes(b.try_into().ok()?);
            Some(a.wrapping_add(b).to_le_bytes().to_vec())
        }),
    );
    o
}

#[derive(Debug, Clone)]
enum Step {
    Insert(u16, Vec<u8>),
    Delete(u16),
    Add(u16, u64),
    Append(u16, Vec<u8>),
    DeleteRange(u16, u16),
    Batch(Vec<(u16, Vec<u8>)>, u16),
    Get(u16),
    /// A scan of `lo..hi`: backward (`true`), or forward; a forward scan of `(lo, hi]` too,
    /// so both bound kinds end a window in the middle of a leaf.
    Scan(u16, u16, bool),
    Succ(u16),
    Pred(u16),
    /// Many upserts of one key in one batch (a "hot" key, like a directory's mtime).
    Hot(u16, u8),
    Checkpoint,
    Optimize,
    Reopen,
}

fn key(k: u16) -> Vec<u8> {
    // Long-ish keys make nodes fill quickly; big-endian so byte order is numeric order.
    let mut v = k.to_be_bytes().to_vec();
    v.extend_from_slice(&[b'k'; 14]);
    v
}

fn step() -> impl Strategy<Value = Step> {
    let k = 0u16..600;
    let val = proptest::collection::vec(any::<u8>(), 0..120);
    prop_oneof![
        30 => (k.clone(), val.clone()).prop_map(|(k, v)| Step::Insert(k, v)),
        5 => k.clone().prop_map(Step::Delete),
        6 => (k.clone(), 0u64..5).prop_map(|(k, n)| Step::Add(k, n)),
        3 => (k.clone(), proptest::collection::vec(any::<u8>(), 0..20)).prop_map(|(k, v)| Step::Append(k, v)),
        2 => (k.clone(), 0u16..120).prop_map(|(lo, w)| Step::DeleteRange(lo, lo.saturating_add(w))),
        6 => (proptest::collection::vec((k.clone(), val.clone()), 1..60), k.clone())
            .prop_map(|(rows, d)| Step::Batch(rows, d)),
        8 => k.clone().prop_map(Step::Get),
        3 => (k.clone(), 0u16..200, any::<bool>()).prop_map(|(lo, w, rev)| Step::Scan(lo, lo.saturating_add(w), rev)),
        2 => k.clone().prop_map(Step::Succ),
        2 => k.clone().prop_map(Step::Pred),
        2 => (k.clone(), 1u8..40).prop_map(|(k, n)| Step::Hot(k, n)),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Optimize),
        1 => Just(Step::Reopen),
    ]
}

fn run(steps: Vec<Step>, comp: Compression) -> Result<(), TestCaseError> {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new());
    let mut env = Env::create_on(dev.clone(), options(comp)).unwrap();
    let mut t = env.tree("t").unwrap();
    let mut other = env.tree("other").unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let paranoid = std::env::var("FERN_MODEL_PARANOID").is_ok();
    for (n, s) in steps.into_iter().enumerate() {
        let desc = format!("{s:?}");
        match s {
            Step::Insert(k, v) => {
                t.insert(&key(k), &v).unwrap();
                model.insert(key(k), v);
            }
            Step::Delete(k) => {
                t.delete(&key(k)).unwrap();
                model.remove(&key(k));
            }
            Step::Add(k, n) => {
                t.upsert(&key(k), ADD, &n.to_le_bytes()).unwrap();
                match add(model.get(&key(k)).map(|v| v.as_slice()), &n.to_le_bytes()) {
                    Some(v) => model.insert(key(k), v),
                    None => model.remove(&key(k)),
                };
            }
            Step::Append(k, a) => {
                t.upsert(&key(k), APPEND, &a).unwrap();
                let v = append(model.get(&key(k)).map(|v| v.as_slice()), &a).unwrap();
                model.insert(key(k), v);
            }
            Step::DeleteRange(lo, hi) => {
                t.delete_range(&key(lo), &key(hi)).unwrap();
                let doomed: Vec<_> = model
                    .range(key(lo)..key(hi))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in doomed {
                    model.remove(&k);
                }
            }
            Step::Batch(rows, d) => {
                let mut b = WriteBatch::new();
                for (k, v) in &rows {
                    b.insert(&t, &key(*k), v);
                    b.insert(&other, &key(*k), b"x");
                    model.insert(key(*k), v.clone());
                }
                b.delete(&t, &key(d));
                model.remove(&key(d));
                env.write(b).unwrap();
            }
            Step::Get(k) => {
                prop_assert_eq!(
                    t.get(&key(k)).unwrap(),
                    model.get(&key(k)).cloned(),
                    "get {}",
                    k
                );
            }
            Step::Scan(lo, hi, rev) => {
                let want: Vec<_> = model
                    .range(key(lo)..key(hi))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if rev {
                    let mut got = Vec::new();
                    let mut c = t.cursor();
                    c.seek_before(&key(hi)).unwrap();
                    while let Some((k, v)) = c.entry() {
                        if k < key(lo) {
                            break;
                        }
                        got.push((k, v));
                        c.prev().unwrap();
                    }
                    got.reverse();
                    prop_assert_eq!(got, want, "reverse scan {}..{}", lo, hi);
                    // Back from a forward seek: the window a seek materializes starts at its
                    // key, so the step back leaves it.
                    let mut c = t.cursor();
                    c.seek(&key(hi)).unwrap();
                    if c.valid() {
                        c.prev().unwrap();
                    } else {
                        c.seek_last().unwrap();
                    }
                    let before: Vec<_> = model
                        .range(..key(hi))
                        .rev()
                        .take(3)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let mut got = Vec::new();
                    while got.len() < 3 {
                        let Some(e) = c.entry() else { break };
                        got.push(e);
                        c.prev().unwrap();
                    }
                    prop_assert_eq!(got, before, "back from a seek to {}", hi);
                } else {
                    let got = t
                        .range_vec(Bound::Included(&key(lo)), Bound::Excluded(&key(hi)))
                        .unwrap();
                    prop_assert_eq!(got, want, "scan {}..{}", lo, hi);
                    let bounds = (Bound::Excluded(key(lo)), Bound::Included(key(hi)));
                    let want: Vec<_> = model
                        .range(bounds)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let got = t
                        .range_vec(Bound::Excluded(&key(lo)), Bound::Included(&key(hi)))
                        .unwrap();
                    prop_assert_eq!(got, want, "scan ({}, {}]", lo, hi);
                }
            }
            Step::Succ(k) => {
                let want = model
                    .range((Bound::Excluded(key(k)), Bound::Unbounded))
                    .next()
                    .map(|(k, v)| (k.clone(), v.clone()));
                prop_assert_eq!(t.successor(&key(k)).unwrap(), want, "successor {}", k);
            }
            Step::Pred(k) => {
                let want = model
                    .range(..key(k))
                    .next_back()
                    .map(|(k, v)| (k.clone(), v.clone()));
                prop_assert_eq!(t.predecessor(&key(k)).unwrap(), want, "predecessor {}", k);
            }
            Step::Hot(k, n) => {
                let mut b = WriteBatch::new();
                for _ in 0..n {
                    b.upsert(&t, &key(k), ADD, &3u64.to_le_bytes());
                    match add(
                        model.get(&key(k)).map(|v| v.as_slice()),
                        &3u64.to_le_bytes(),
                    ) {
                        Some(v) => model.insert(key(k), v),
                        None => model.remove(&key(k)),
                    };
                }
                env.write(b).unwrap();
            }
            Step::Checkpoint => env.checkpoint().unwrap(),
            Step::Optimize => t.optimize().unwrap(),
            Step::Reopen => {
                env.close().unwrap();
                env = Env::open_on(dev.clone(), options(comp)).unwrap();
                t = env.tree("t").unwrap();
                other = env.tree("other").unwrap();
            }
        }
        if paranoid {
            t.verify().unwrap();
            let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let got = t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap();
            if got != all {
                let gk: Vec<_> = got
                    .iter()
                    .map(|(k, _)| u16::from_be_bytes([k[0], k[1]]))
                    .collect();
                let wk: Vec<_> = all
                    .iter()
                    .map(|(k, _)| u16::from_be_bytes([k[0], k[1]]))
                    .collect();
                let missing: Vec<_> = all
                    .iter()
                    .filter(|e| !got.contains(e))
                    .map(|(k, _)| {
                        (
                            u16::from_be_bytes([k[0], k[1]]),
                            t.get(k).unwrap().is_some(),
                        )
                    })
                    .collect();
                panic!("missing {missing:?} diverged after step {n}: {}\ngot keys {gk:?}\nwant keys {wk:?}", &desc[..desc.len().min(200)]);
            }
        }
    }
    t.verify().unwrap();
    // Full forward scan, and a full walk backwards, agree with the model.
    let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(
        t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap(),
        all.clone()
    );
    let mut back = Vec::new();
    let mut c = t.cursor();
    c.seek_last().unwrap();
    while let Some(e) = c.entry() {
        back.push(e);
        c.prev().unwrap();
    }
    back.reverse();
    prop_assert_eq!(back, all.clone());
    // And after a final reopen.
    env.close().unwrap();
    let env = Env::open_on(dev, options(comp)).unwrap();
    let t = env.tree("t").unwrap();
    prop_assert_eq!(
        t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap(),
        all
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("FERN_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn matches_btreemap_lz4(steps in proptest::collection::vec(step(), 1..400)) {
        run(steps, Compression::Lz4)?;
    }

    #[test]
    fn matches_btreemap_zstd(steps in proptest::collection::vec(step(), 1..150)) {
        run(steps, Compression::Zstd { level: 1 })?;
    }
}

/// A long deterministic run that builds a deep tree (several levels) and checks everything.
#[test]
fn deep_tree_sequential_and_random() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), options(Compression::Lz4)).unwrap();
    let t = env.tree("t").unwrap();
    let mut model = BTreeMap::new();
    let mut x: u64 = 12345;
    for i in 0..20_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = if i % 2 == 0 {
            i.to_be_bytes().to_vec()
        } else {
            (x as u32).to_be_bytes().to_vec()
        };
        let v = format!("value-{i}").into_bytes();
        t.insert(&k, &v).unwrap();
        model.insert(k, v);
        if i % 5000 == 4999 {
            env.checkpoint().unwrap();
        }
    }
    t.delete_range(&1000u32.to_be_bytes(), &9000u32.to_be_bytes())
        .unwrap();
    let doomed: Vec<_> = model
        .range(1000u32.to_be_bytes().to_vec()..9000u32.to_be_bytes().to_vec())
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        model.remove(&k);
    }
    let all: Vec<_> = model.into_iter().collect();
    assert_eq!(
        t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap(),
        all
    );
    env.close().unwrap();
    let env = Env::open_on(dev, options(Compression::Lz4)).unwrap();
    let t = env.tree("t").unwrap();
    assert_eq!(
        t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap(),
        all
    );
    for (k, v) in all.iter().step_by(97) {
        assert_eq!(t.get(k).unwrap().as_ref(), Some(v));
    }
}
