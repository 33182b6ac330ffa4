//! The writeback thread is not woken for nothing: with the cache full of clean nodes (after a
//! checkpoint, or a read of a large range), `wants_writeback` holds, but a round finds no
//! dirty leaf to write. Writers then leave the thread alone for a short quiet period instead
//! of waking it across cores for an empty round after every batch.

use std::sync::Arc;
use std::time::Instant;

use fern_tree::device::MemDevice;
use fern_tree::{Env, WriteBatch};

mod common;

fn key(i: u64) -> Vec<u8> {
    format!("row{i:08}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    fern_testkit::noise(&mut (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1), 200)
}

#[test]
fn a_cache_full_of_clean_nodes_does_not_wake_writeback_for_every_batch() {
    let env = Env::create_on(
        Arc::new(MemDevice::new()),
        common::threaded_options(2 << 20),
    )
    .expect("create");
    let t = env.tree("t").expect("tree");
    // 8 MiB of rows through a 2 MiB cache, then a checkpoint: every cached node is clean.
    for chunk in 0..400u64 {
        let mut b = WriteBatch::new();
        for i in chunk * 100..(chunk + 1) * 100 {
            b.insert(&t, &key(i), &value(i));
        }
        env.write(b).expect("insert");
    }
    env.checkpoint().expect("checkpoint");
    // Fill the cache with clean leaves by reading them.
    for i in (0..40_000).step_by(7) {
        assert_eq!(t.get(&key(i)).expect("get"), Some(value(i)), "row {i}");
    }
    let used = env.stats().cache.used_bytes;
    let limit = env.stats().cache.limit_bytes;
    assert!(
        used * 10 > limit * 8,
        "the test needs the cache over 8/10 full ({used} of {limit})"
    );
    // Small batches that stay in the root's buffers: no leaf becomes dirty.
    let before = env.stats().work.writeback_rounds;
    let start = Instant::now();
    for i in 0..1500u64 {
        let mut b = WriteBatch::new();
        b.insert(&t, &key(i * 13), b"x");
        env.write(b).expect("small write");
        if i % 10 == 0 {
            std::thread::yield_now();
        }
    }
    let ms = start.elapsed().as_millis() as u64;
    let rounds = env.stats().work.writeback_rounds - before;
    // One empty round, then at most one per quiet period (20 ms), plus slack for a slow
    // machine's scheduling. Without the quiet period every batch could wake an empty round.
    assert!(
        rounds <= 3 + ms / 20,
        "{rounds} writeback rounds in {ms} ms of 1500 small batches into clean nodes"
    );
    env.close().expect("close");
}
