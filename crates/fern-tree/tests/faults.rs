//! Fault injection: every mutating device call of a workload is made to fail in turn (EIO, and
//! ENOSPC for every other point). The failing call returns an error (`Error::NoSpace` for ENOSPC),
//! the environment is poisoned (E2: later writes return `Error::Poisoned`, W3: no waiter is told
//! its commit is durable), and the image is never corrupted: it reopens, every tree verifies, and
//! it holds the model after k batches, k between the last acknowledged and the last issued.
//! Read faults at every read of an open make it fail cleanly (never a panic, never wrong data).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::{BlockDevice, FaultyDevice, MemDevice};
use fern_tree::{Durability, Env, Error, Options, WriteBatch};

mod common;
use common::small_options;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn options() -> Options {
    small_options(32 << 10)
}

const BATCHES: u64 = 60;

fn batch_ops(i: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    (0..3)
        .map(|j| {
            let k = format!("k{:03}", (i * 7 + j * 13) % 150).into_bytes();
            if (i + j).is_multiple_of(5) {
                (k, None)
            } else {
                (k, Some(vec![(i + j) as u8; ((i * 31 + j) % 300) as usize]))
            }
        })
        .collect()
}

/// Runs the workload until the first error. Returns (models after k batches, last acknowledged
/// k, last issued k, the first error).
fn workload(env: &Env) -> (Vec<Model>, usize, usize, Option<Error>) {
    let mut states = vec![Model::new()];
    let (mut acked, mut issued) = (0, 0);
    let t = match env.tree("t") {
        Ok(t) => t,
        Err(e) => return (states, acked, issued, Some(e)),
    };
    for i in 0..BATCHES {
        let mut m = states[states.len() - 1].clone();
        let mut b = WriteBatch::new();
        for (k, v) in batch_ops(i) {
            match v {
                Some(v) => {
                    b.insert(&t, &k, &v);
                    m.insert(k, v);
                }
                None => {
                    b.delete(&t, &k);
                    m.remove(&k);
                }
            }
        }
        states.push(m);
        issued = states.len() - 1;
        let d = if i.is_multiple_of(3) {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        if let Err(e) = env.write_with(b, d) {
            return (states, acked, issued, Some(e));
        }
        if d == Durability::Sync {
            acked = issued;
        }
        if i % 17 == 16 {
            if let Err(e) = env.checkpoint() {
                return (states, acked, issued, Some(e));
            }
            acked = issued;
        }
    }
    if let Err(e) = env.sync() {
        return (states, acked, issued, Some(e));
    }
    (states, issued, issued, None)
}

fn rows(env: &Env) -> Model {
    let t = env.tree("t").expect("tree");
    t.verify().expect("tree verifies");
    t.range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan")
        .into_iter()
        .collect()
}

#[test]
fn every_write_fault_poisons_and_never_corrupts() {
    // Count the mutating calls of a clean run.
    let probe = Arc::new(FaultyDevice::failing(Arc::new(MemDevice::new()), u64::MAX));
    let env = Env::create_on(probe.clone(), options()).expect("create");
    let (_, _, _, err) = workload(&env);
    assert!(err.is_none());
    let total = probe.calls();
    drop(env);
    assert!(
        total > 50,
        "workload too small to be interesting ({total} calls)"
    );
    let mut poisoned_checked = 0;
    for fail_at in 0..total {
        let mem = Arc::new(MemDevice::new());
        let enospc = fail_at % 2 == 1;
        let dev: Arc<dyn BlockDevice> = if enospc {
            Arc::new(FaultyDevice::no_space(mem.clone(), fail_at))
        } else {
            Arc::new(FaultyDevice::failing(mem.clone(), fail_at))
        };
        let env = match Env::create_on(dev, options()) {
            Ok(env) => env,
            Err(e) => {
                if enospc {
                    assert!(matches!(e, Error::NoSpace { .. }), "create: {e}");
                }
                continue; // never acknowledged; nothing to check
            }
        };
        let (states, acked, issued, err) = workload(&env);
        let err = err.unwrap_or_else(|| panic!("fault at call {fail_at} went unnoticed"));
        if enospc {
            assert!(
                matches!(err, Error::NoSpace { .. } | Error::Poisoned(_)),
                "fault {fail_at}: ENOSPC surfaced as {err}"
            );
        }
        // E2: poisoned from now on (creating the tree is a write too, if it failed).
        let again = env.tree("t").and_then(|t| t.insert(b"later", b"x"));
        assert!(
            matches!(again, Err(Error::Poisoned(_))),
            "fault {fail_at}: a write after the failure returned {again:?}"
        );
        assert!(matches!(env.sync(), Err(Error::Poisoned(_))));
        poisoned_checked += 1;
        drop(env);
        let env = Env::open_on(Arc::new(MemDevice::from_bytes(mem.snapshot())), options())
            .unwrap_or_else(|e| panic!("fault {fail_at}: image does not reopen: {e}"));
        let got = rows(&env);
        assert!(
            (acked..=issued).any(|k| states[k] == got),
            "fault {fail_at}: recovered state is not the model after {acked}..={issued} batches"
        );
    }
    assert!(poisoned_checked > 20);
    eprintln!("{total} fault points checked ({poisoned_checked} after creation)");
}

#[test]
fn read_faults_fail_cleanly() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let (_, _, _, err) = workload(&env);
    assert!(err.is_none());
    let t = env.tree("t").expect("tree");
    t.insert(b"tail", b"in the log only").expect("insert");
    env.sync().expect("sync");
    drop(t);
    let image = mem.snapshot();
    std::mem::forget(env); // a crash: the tail stays in the log
    let probe = Arc::new(FaultyDevice::failing_reads(
        Arc::new(MemDevice::from_bytes(image.clone())),
        u64::MAX,
    ));
    drop(Env::open_on(probe.clone(), options()).expect("open"));
    let reads = probe.reads();
    for fail_at in 0..reads {
        let dev = Arc::new(FaultyDevice::failing_reads(
            Arc::new(MemDevice::from_bytes(image.clone())),
            fail_at,
        ));
        // An unreadable fallback checkpoint is allowed to open; anything else must fail, and
        // nothing may panic or return wrong data.
        if let Ok(env) = Env::open_on(dev, options()) {
            if let Ok(t) = env.tree("t") {
                let v = t.get(b"tail");
                assert!(
                    matches!(v, Err(_) | Ok(Some(_))),
                    "read fault {fail_at}: {v:?}"
                );
            }
        }
    }
}
