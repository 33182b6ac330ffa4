//! What fern-tree's integration tests share: the small engine of the directed and seeded tests,
//! the model the seeded tests check recovery against, and where an image keeps its write-ahead
//! log. Each test file uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::blockfile::{BlockFile, BlockLoc};
use fern_tree::device::MemDevice;
use fern_tree::Options;

/// A 64 KiB cache, 4 KiB nodes, 512-byte basements and fanout 4 (a few hundred rows make a
/// tree several levels deep and evict), a log of `log_bytes`, and no background threads: a
/// test is then a function of its own steps alone.
pub fn small_options(log_bytes: u64) -> Options {
    Options {
        cache_bytes: 64 << 10,
        node_bytes: 4096,
        basement_bytes: 512,
        fanout: 4,
        log_bytes,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

/// 64 KiB nodes, 4 KiB basements, fanout 8, a 64 MiB log, a cache of `cache_bytes`, and the
/// background threads as a mount runs them (checkpoint, writeback, root drain), without the
/// periodic log sync: for tests of what those threads do.
pub fn threaded_options(cache_bytes: usize) -> Options {
    Options {
        cache_bytes,
        node_bytes: 64 << 10,
        basement_bytes: 4 << 10,
        fanout: 8,
        log_bytes: 64 << 20,
        sync_interval: None,
        checkpoint_thread: true,
        ..Options::default()
    }
}

/// The log region of an image: its largest extent (nodes are a few KiB, the log more).
pub fn log_region(image: &[u8]) -> BlockLoc {
    BlockFile::open(Arc::new(MemDevice::from_bytes(image.to_vec())))
        .expect("block file")
        .file
        .live_blocks()
        .map(|(_, l)| l)
        .max_by_key(|l| l.len)
        .expect("log region")
}

/// Every tree's rows by tree name: what a seeded test expects the engine to hold.
pub type Model = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// `m` without its empty trees (a tree that was never written and an emptied one read alike).
pub fn normalized(m: &Model) -> Model {
    m.iter()
        .filter(|(_, t)| !t.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Removes the rows of `rows` in `[lo, hi)`, as a range delete does; returns their keys.
pub fn remove_range<V>(rows: &mut BTreeMap<Vec<u8>, V>, lo: &[u8], hi: &[u8]) -> Vec<Vec<u8>> {
    let doomed: Vec<Vec<u8>> = rows
        .range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)))
        .map(|(k, _)| k.clone())
        .collect();
    for k in &doomed {
        rows.remove(k);
    }
    doomed
}
