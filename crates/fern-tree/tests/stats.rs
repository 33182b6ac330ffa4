//! `Env::stats()` and `Env::backlog()`: message bytes are exactly what users wrote, device
//! traffic covers every layer (log included), the backlog equals what a full verify walk
//! counts, and computing it never reads a leaf.

use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Env, Options, WriteBatch};

fn opts() -> Options {
    Options {
        cache_bytes: 8 << 20,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        fanout: 8,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    i.wrapping_mul(2654435761).to_be_bytes().to_vec()
}

/// Writes `n` rows of 60-byte values in batches of 200; returns the user bytes written.
fn fill(env: &Env, t: &fern_tree::Tree, n: u32) -> u64 {
    let mut bytes = 0u64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            b.insert(t, &key(i), &[b'v'; 60]);
            bytes += 4 + 60;
        }
        env.write(b).unwrap();
    }
    bytes
}

#[test]
fn message_bytes_device_traffic_and_hit_rate() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("t").unwrap();
    let s0 = env.stats();
    assert_eq!(s0.message_bytes, 0);
    assert_eq!(s0.write_amplification(), None);
    let mut user = fill(&env, &t, 5_000);
    t.delete_range(b"\x00", b"\x10").unwrap();
    user += 2;
    let mut b = WriteBatch::new();
    b.delete(&t, &key(7));
    env.write(b).unwrap();
    user += 4;
    env.sync().unwrap();
    let s = env.stats();
    assert_eq!(
        s.message_bytes, user,
        "keys + values + range bounds, exactly"
    );
    assert_eq!(s.messages, 5_002);
    // Every message went through the log at least once: the device saw at least that much.
    assert!(
        s.device.bytes_written >= user,
        "{} device bytes for {user} user bytes",
        s.device.bytes_written
    );
    assert!(s.device.syncs >= 1 && s.device.writes > 0);
    let wa = s.write_amplification().unwrap();
    assert!(wa >= 1.0, "{wa}");
    env.checkpoint().unwrap();
    let after_ckpt = env.stats();
    assert!(
        after_ckpt.device.bytes_written > s.device.bytes_written,
        "a checkpoint writes nodes"
    );
    assert_eq!(
        after_ckpt.message_bytes, user,
        "a checkpoint writes no messages"
    );
    for i in 0..2_000 {
        t.get(&key(i)).unwrap();
    }
    let r = env.stats().cache_hit_rate().unwrap();
    assert!(r > 0.5 && r <= 1.0, "hot reads hit the cache: {r}");
}

#[test]
fn backlog_matches_a_full_walk_and_reads_no_leaf() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), opts()).unwrap();
    let a = env.tree("a").unwrap();
    let b = env.tree("b").unwrap();
    fill(&env, &a, 40_000);
    fill(&env, &b, 3_000);
    let expect = |env: &Env| {
        let (mut msgs, mut internal) = (0, 0);
        for name in env.tree_names() {
            let r = env.tree(&name).unwrap().verify().unwrap();
            msgs += r.pending_messages;
            internal += r.internal;
        }
        (msgs, internal)
    };
    let got = env.backlog().unwrap();
    let (msgs, internal) = expect(&env);
    assert!(msgs > 0, "the workload leaves messages buffered");
    assert_eq!((got.messages, got.internal_nodes), (msgs, internal));
    assert_eq!(got.trees, 2);
    assert!(got.bytes >= got.messages * 4);
    env.close().unwrap();

    // Cold: a fresh open reads only internal nodes to count the backlog.
    let env = Env::open_on(dev, opts()).unwrap();
    let before = env.stats();
    let cold = env.backlog().unwrap();
    let after = env.stats();
    assert_eq!(cold.messages, msgs);
    let loaded = after.cache.misses - before.cache.misses;
    assert!(
        loaded <= cold.internal_nodes,
        "{loaded} nodes read from the device for {} internal nodes: leaves were read",
        cold.internal_nodes
    );
}

/// The work counters split the node bytes the device received by cause (checkpoints and
/// eviction; writeback is off without the checkpoint thread), and count flushes and the
/// nodes writers had to read back.
#[test]
fn work_counters_split_node_writes_by_cause() {
    let env = Env::create_on(
        Arc::new(MemDevice::new()),
        Options {
            cache_bytes: 256 << 10,
            ..opts()
        },
    )
    .unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, 20_000);
    env.checkpoint().unwrap();
    let s = env.stats();
    let w = s.work;
    assert!(w.checkpoint_nodes > 0 && w.checkpoint_bytes > 0, "{w:?}");
    assert!(
        w.evicted_nodes > 0 && w.evicted_bytes > 0,
        "beyond the cache: {w:?}"
    );
    assert_eq!(
        (w.writeback_nodes, w.writeback_bytes),
        (0, 0),
        "no thread: {w:?}"
    );
    assert!(w.leaf_flushes > 0 && w.internal_flushes > 0 && w.flushed_bytes > 0);
    assert!(
        w.leaf_flushed_bytes > 0 && w.leaf_flushed_bytes < w.flushed_bytes,
        "leaf flushes are a part of all flushes: {w:?}"
    );
    assert!(
        w.writer_reads > 0,
        "evicted nodes are read back by flushes: {w:?}"
    );
    assert!(
        s.log_end.0 + w.checkpoint_bytes + w.evicted_bytes <= s.device.bytes_written,
        "the causes are parts of the device's total: {s:?}"
    );
}

/// With the background threads, dirty leaves are written ahead of eviction (writeback.rs)
/// and nothing is lost: every row reads back, before and after a reopen.
#[test]
fn writeback_cleans_leaves_and_loses_nothing() {
    let dev = Arc::new(MemDevice::new());
    let o = Options {
        cache_bytes: 256 << 10,
        checkpoint_thread: true,
        ..opts()
    };
    let env = Env::create_on(dev.clone(), o.clone()).unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, 20_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while env.stats().work.writeback_nodes == 0 && std::time::Instant::now() < deadline {
        // Keep the cache above the writeback threshold, and leave the thread (which needs the
        // read lock between batches) time to be scheduled on a loaded machine.
        fill(&env, &t, 1_000);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let w = env.stats().work;
    assert!(w.writeback_nodes > 0 && w.writeback_bytes > 0, "{w:?}");
    let check = |t: &fern_tree::Tree| {
        for i in 0..20_000u32 {
            assert_eq!(
                t.get(&key(i)).unwrap().as_deref(),
                Some(&[b'v'; 60][..]),
                "row {i}"
            );
        }
    };
    check(&t);
    drop(t);
    env.close().unwrap();
    let env = Env::open_on(dev, o).unwrap();
    check(&env.tree("t").unwrap());
    env.close().unwrap();
}

/// Eviction takes leaves before internal nodes (cache.rs): when the internal nodes fit in the
/// cache and the leaves do not, random writes never make a flush read an internal node back —
/// every node a writer reads is a leaf receiving a flush. Under plain LRU, internal nodes not
/// flushed into lately were evicted for just-flushed leaves and read back by the next flush.
#[test]
fn eviction_keeps_internal_nodes_cached() {
    let env = Env::create_on(
        Arc::new(MemDevice::new()),
        Options {
            cache_bytes: 1 << 20, // the internal nodes fit, the leaves (~4 MB) do not
            ..opts()
        },
    )
    .unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, 60_000);
    let w = env.stats().work;
    assert!(w.evicted_nodes > 0, "the leaves do not fit: {w:?}");
    assert!(
        w.writer_reads <= w.leaf_flushes,
        "writers read only leaves they flush into: {w:?}"
    );
}
