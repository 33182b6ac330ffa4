//! Background reclamation (format.md B13): a steady stream of deletes gets reclamation passes
//! that run no checkpoint of their own — the checkpoints that release what they freed are left
//! to the writers for `RELEASE_WAIT` (each one writes every dirty node) — and once the deletes
//! stop, the checkpoint thread runs them itself, so deleted space returns without further
//! writes. A pass asked for after a quiet spell first waits out a grace.
//!
//! The device's sync is slowed to a known 25 ms, so a checkpoint takes at least 50 ms (it
//! syncs at least twice) on any machine.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fern_tree::device::{BlockDevice, MemDevice};
use fern_tree::{Env, WriteBatch};

mod common;

const SYNC: Duration = Duration::from_millis(25);

/// A memory device whose syncs take `SYNC`, like a disk's flush.
#[derive(Debug)]
struct SlowSync(MemDevice);

impl BlockDevice for SlowSync {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        std::thread::sleep(SYNC);
        self.0.sync()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("row{i:08}").into_bytes()
}

fn checkpoints(env: &Env) -> u64 {
    env.stats().file.generation
}

/// Waits up to 10 s for a checkpoint after generation `seen`; fails with `what` otherwise.
fn await_checkpoint_after(env: &Env, seen: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while checkpoints(env) == seen {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stream_of_deletes_runs_passes_without_checkpoints_and_the_release_follows() {
    let dev: Arc<dyn BlockDevice> = Arc::new(SlowSync(MemDevice::new()));
    let env = Env::create_on(dev, common::threaded_options(8 << 20)).expect("create");
    let t = env.tree("t").expect("tree");
    for chunk in 0..20u64 {
        let mut b = WriteBatch::new();
        for i in chunk * 100..(chunk + 1) * 100 {
            b.insert(&t, &key(i), &[b'v'; 200]);
        }
        env.write(b).expect("insert");
    }
    // Every delete says it frees 8 MiB, so each one alone asks for a background pass.
    let start_checkpoints = checkpoints(&env);
    let start_passes = env.stats().work.reclaim_passes;
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_millis(2500) {
        let mut b = WriteBatch::new();
        b.delete(&t, &key(i % 2000));
        env.write_releasing(b, 8 << 20).expect("delete");
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let passes = env.stats().work.reclaim_passes - start_passes;
    let during = checkpoints(&env) - start_checkpoints;
    assert!(passes >= 1, "no reclamation pass ran in 2.5 s of deletes");
    // With their own checkpoints (a pair each, and one per round), the passes ran ~10 here.
    assert!(
        during <= 2,
        "{during} checkpoints in 2.5 s of deletes and {passes} passes: passes checkpoint"
    );
    // The deletes stopped and nothing else writes; the checkpoints that release what the
    // passes freed still come, from the checkpoint thread.
    let stopped = checkpoints(&env);
    let deadline = Instant::now() + Duration::from_secs(10);
    while checkpoints(&env) < stopped + 2 {
        assert!(
            Instant::now() < deadline,
            "the release of what the passes freed never ran after the deletes stopped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    env.close().expect("close");
}

/// B13's grace: a pass asked for after a quiet spell waits a second, so a sync right after a
/// delete (`rm big; sync`) does not queue behind the pass's checkpoints; the pass still runs
/// once the grace is over, with no write to wake it.
#[test]
fn a_sync_right_after_a_delete_does_not_wait_for_a_reclamation_pass() {
    let dev: Arc<dyn BlockDevice> = Arc::new(SlowSync(MemDevice::new()));
    let env = Env::create_on(dev, common::threaded_options(8 << 20)).expect("create");
    let t = env.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    for i in 0..100 {
        b.insert(&t, &key(i), &[b'v'; 200]);
    }
    env.write(b).expect("insert");
    env.sync().expect("sync");
    let before = checkpoints(&env);
    let mut b = WriteBatch::new();
    b.delete(&t, &key(7));
    env.write_releasing(b, 8 << 20).expect("delete");
    env.sync().expect("sync after the delete");
    // Ungraced, the pass started at once: two checkpoints of two 25 ms syncs each, done well
    // within this wait.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        checkpoints(&env),
        before,
        "a reclamation pass ran right after the delete, beside its sync"
    );
    await_checkpoint_after(
        &env,
        before,
        "the reclamation pass never ran after its grace",
    );
    assert_eq!(t.get(&key(7)).expect("get"), None);
    env.close().expect("close");
}
