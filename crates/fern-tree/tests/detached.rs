//! Flushes beside the writer (design.md §2.5; betree/detached.rs DF1–DF4): the drain moves a
//! root's child buffer down on copies while writers keep appending to the root and readers
//! keep reading. A writer thread runs random inserts, deletes, range deletes and merging
//! upserts (the coalescing DF3 must keep away from the messages in flight) against a model;
//! a reader thread checks rows it knows cannot change; the tree is checked against the model,
//! verified, closed and reopened. The test fails unless detached flushes were installed.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Env, Options, UpsertId, WriteBatch};

const ADD: UpsertId = UpsertId(1);

fn add(old: Option<&[u8]>, arg: &[u8]) -> Option<Vec<u8>> {
    let o = old
        .and_then(|o| o.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let a = arg.try_into().map(u64::from_le_bytes).unwrap_or(0);
    Some(o.wrapping_add(a).to_le_bytes().to_vec())
}

fn opts() -> Options {
    let mut o = Options {
        cache_bytes: 4 << 20,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        fanout: 6,
        flush_beside_writer: Some(true),
        ..Options::default()
    };
    o.register_upsert(ADD, Arc::new(|_k, old, arg| add(old, arg)));
    // Runs of ADD merge into one message: exactly what must not reach a flushed message.
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

fn key(i: u64) -> Vec<u8> {
    format!("k{:08}", i.wrapping_mul(2654435761) % 100_000).into_bytes()
}

/// Rows under this prefix are written once before the readers start and never touched again.
fn fixed_key(i: u64) -> Vec<u8> {
    format!("fixed{i:06}").into_bytes()
}

#[test]
fn flushes_beside_the_writer_lose_and_double_nothing() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), opts()).unwrap();
    let t = env.tree("t").unwrap();
    let mut b = WriteBatch::new();
    for i in 0..2_000 {
        b.insert(&t, &fixed_key(i), &i.to_le_bytes());
    }
    env.write(b).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 7u64;
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                let i = (x >> 33) % 2_000;
                let v = t.get(&fixed_key(i)).unwrap();
                assert_eq!(v.as_deref(), Some(&i.to_le_bytes()[..]), "row {i} changed");
                reads += 1;
            }
            reads
        })
    };

    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut x = 1u64;
    let mut rnd = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    for round in 0..3_000u64 {
        let mut b = WriteBatch::new();
        for _ in 0..20 {
            let k = key(rnd() % 3_000);
            match rnd() % 10 {
                0..=3 => {
                    let v = rnd().to_le_bytes().repeat(1 + (rnd() % 8) as usize);
                    b.insert(&t, &k, &v);
                    model.insert(k, v);
                }
                4 => {
                    b.delete(&t, &k);
                    model.remove(&k);
                }
                _ => {
                    let n = rnd() % 1000;
                    b.upsert(&t, &k, ADD, &n.to_le_bytes());
                    let old = model.get(&k).map(Vec::as_slice);
                    let new = add(old, &n.to_le_bytes()).unwrap();
                    model.insert(k, new);
                }
            }
        }
        if round % 97 == 0 {
            let (lo, hi) = (key(rnd() % 3_000), key(rnd() % 3_000));
            let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            b.delete_range(&t, &lo, &hi);
            let doomed: Vec<_> = model
                .range(lo.clone()..hi.clone())
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                model.remove(&k);
            }
        }
        env.write(b).unwrap();
        if round % 250 == 0 {
            let k = key(rnd() % 3_000);
            assert_eq!(t.get(&k).unwrap(), model.get(&k).cloned(), "round {round}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0);

    let check = |t: &fern_tree::Tree| {
        let mut rows: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        t.scan(
            Bound::Included(&b"k"[..]),
            Bound::Excluded(&b"l"[..]),
            |k, v| {
                rows.push((k.to_vec(), v.to_vec()));
                true
            },
        )
        .unwrap();
        let expect: Vec<(Vec<u8>, Vec<u8>)> =
            model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(rows.len(), expect.len(), "row count");
        assert!(rows == expect, "rows differ from the model");
        t.verify().unwrap();
    };
    check(&t);
    let work = env.stats().work;
    assert!(
        work.detached_installs > 0,
        "no flush ran beside the writer: {work:?}"
    );
    drop(t);
    env.close().unwrap();
    let env = Env::open_on(dev, opts()).unwrap();
    check(&env.tree("t").unwrap());
}
