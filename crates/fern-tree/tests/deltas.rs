//! Leaf deltas (docs/format.md "Leaf deltas"): flushes into leaves write deltas up to the bound
//! and then merge (D5), reads see every delta's messages, a crash between a delta's write and
//! the next checkpoint loses nothing that was synced, a damaged delta is a checksum error that
//! names it, an image with deltas opens with deltas turned off, and a cold point read skips
//! the deltas whose key filter rules its key out (D6).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::blockfile::BlockFile;
use fern_tree::device::{BlockDevice, CrashDevice, MemDevice};
use fern_tree::{Durability, Env, Error, Options, WriteBatch};

mod common;
use common::{remove_range, small_options};

type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts(leaf_deltas: usize) -> Options {
    Options {
        leaf_deltas,
        ..small_options(256 << 10)
    }
}

fn key(i: u32) -> Vec<u8> {
    i.wrapping_mul(2_654_435_761).to_be_bytes().to_vec()
}

/// Random-order inserts, overwrites, deletes and short range deletes of `n` keys (a few bytes
/// of value each, so a flush into a leaf moves far less than the leaf holds: the case deltas
/// are for). A range delete spans several of a delta's partitions as often as not.
fn workload(env: &Env, rows: &mut Rows, n: u32, round: u32, durability: Durability) {
    let t = env.tree("t").expect("tree");
    for i in 0..n {
        let mut b = WriteBatch::new();
        let k = key(i % 4000);
        if i % 97 == 50 {
            let lo = k.clone();
            let hi = (u32::from_be_bytes([k[0], k[1], k[2], k[3]]).saturating_add(1 << 22))
                .to_be_bytes()
                .to_vec();
            b.delete_range(&t, &lo, &hi);
            remove_range(rows, &lo, &hi);
        } else if i % 11 == 10 {
            b.delete(&t, &k);
            rows.remove(&k);
        } else {
            let v = format!("v{round}-{i}-{}", "x".repeat((i % 13) as usize)).into_bytes();
            b.insert(&t, &k, &v);
            rows.insert(k, v);
        }
        env.write_with(b, durability).expect("write");
    }
}

fn check(env: &Env, rows: &Rows) {
    let t = env.tree("t").expect("tree");
    let got = t
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan");
    let want: Vec<_> = rows.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(got == want, "scan differs from the model");
    for i in (0..4000).step_by(7) {
        let k = key(i);
        assert_eq!(t.get(&k).expect("get"), rows.get(&k).cloned(), "key {i}");
    }
    t.verify().expect("verify");
}

/// Flushes into leaves write deltas, chains reach the bound and merge, and reads (point,
/// scan, after a reopen) see every message; `Tree::verify` checks D1–D3 on the way.
#[test]
fn deltas_fill_up_merge_and_read_back() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts(3)).expect("create");
    let mut rows = Rows::new();
    let mut saw_deltas = false;
    for round in 0..6 {
        workload(&env, &mut rows, 3000, round, Durability::Buffered);
        check(&env, &rows);
        saw_deltas |= env.tree("t").unwrap().verify().unwrap().deltas > 0;
    }
    let work = env.stats().work;
    assert!(work.delta_appends > 0, "no flush wrote a delta: {work:?}");
    assert!(work.delta_merges > 0, "no chain was merged: {work:?}");
    assert!(saw_deltas, "verify never saw a delta in the tree");
    // Bound K: a merge happens at most every K + 1 flushes into one leaf, so appends can
    // outnumber merges by at most K per leaf (and leaves come and go by splits and merges).
    assert!(work.delta_appends <= 3 * (work.delta_merges + work.leaf_flushes));
    env.close().expect("close");
    let env = Env::open_on(dev as Arc<dyn BlockDevice>, opts(3)).expect("reopen");
    check(&env, &rows);
}

/// Cold point reads read only the deltas whose key filter may hold the key (format.md "Key
/// filters of leaf deltas", D6): after a reopen every key reads back as the model says —
/// including keys whose newest value sits in a delta, so no filter dropped a key — while most
/// deltas on the lookups' paths were skipped unread.
#[test]
fn cold_point_reads_skip_deltas_their_filters_rule_out() {
    // Leaves of a few basements and flushes far smaller than half a node: chains of deltas.
    let opts = || Options {
        node_bytes: 16 << 10,
        basement_bytes: 1 << 10,
        cache_bytes: 512 << 10,
        ..opts(3)
    };
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts()).expect("create");
    let t = env.tree("t").expect("tree");
    let mut rows = Rows::new();
    // Inserts and overwrites only: no range delete, so every delta gets a filter. Written
    // until the tree holds a fair number of deltas (chains merge as they fill, D5).
    let mut deltas = 0;
    for n in 0..20_000u32 {
        let i = n.wrapping_mul(7_919) % 4000;
        let v = format!("v{n}").into_bytes();
        let mut b = WriteBatch::new();
        b.insert(&t, &key(i), &v);
        rows.insert(key(i), v);
        env.write(b).expect("write");
        if n % 500 == 499 {
            deltas = t.verify().expect("verify").deltas;
            if deltas >= 20 {
                break;
            }
        }
    }
    assert!(
        deltas > 0,
        "the workload left no delta to skip: {:?}",
        env.stats().work
    );
    drop(t);
    env.close().expect("close");

    let env = Env::open_on(dev as Arc<dyn BlockDevice>, opts()).expect("reopen");
    let t = env.tree("t").expect("tree");
    let before = env.stats().work.delta_skips;
    for (k, v) in &rows {
        assert_eq!(t.get(k).expect("get").as_ref(), Some(v));
    }
    let skips = env.stats().work.delta_skips - before;
    assert!(
        skips > 0,
        "no lookup skipped a delta ({deltas} deltas in the tree)"
    );
    t.verify().expect("verify");
}

/// With deltas off nothing writes one, and an image holding deltas opens and reads with
/// deltas off; its chains merge on their leaves' next flushes.
#[test]
fn deltas_off_writes_none_and_reads_an_image_with_them() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts(0)).expect("create");
    let mut rows = Rows::new();
    workload(&env, &mut rows, 3000, 0, Durability::Buffered);
    assert_eq!(env.stats().work.delta_appends, 0);
    env.close().expect("close");

    let env = Env::open_on(dev.clone() as Arc<dyn BlockDevice>, opts(4)).expect("open");
    workload(&env, &mut rows, 3000, 1, Durability::Buffered);
    check(&env, &rows);
    env.close().expect("close");
    let env = Env::open_on(dev.clone() as Arc<dyn BlockDevice>, opts(0)).expect("open");
    let held = env.tree("t").unwrap().verify().unwrap().deltas;
    assert!(held > 0, "the image should hold deltas for this test");
    check(&env, &rows);
    workload(&env, &mut rows, 3000, 2, Durability::Buffered);
    check(&env, &rows);
    assert_eq!(env.stats().work.delta_appends, 0);
    assert!(env.stats().work.delta_merges > 0);
}

/// A power cut after deltas were written (by eviction, or only in the log) but before the
/// next checkpoint: recovery replays the log through the root, and every synced write is
/// there, for every crash image the device can leave.
#[test]
fn crash_between_delta_writes_and_checkpoint() {
    let dev = Arc::new(CrashDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts(3)).expect("create");
    let mut rows = Rows::new();
    workload(&env, &mut rows, 2000, 0, Durability::Buffered);
    env.checkpoint().expect("checkpoint");
    let before = env.stats().work.delta_appends;
    workload(&env, &mut rows, 1500, 1, Durability::Sync);
    let work = env.stats().work;
    assert!(
        work.delta_appends > before,
        "the synced part should write deltas: {work:?}"
    );
    for seed in 0..8 {
        let img = dev.crash_image(seed);
        let env = Env::open_on(
            Arc::new(CrashDevice::from_bytes(img)) as Arc<dyn BlockDevice>,
            opts(3),
        )
        .expect("recover");
        check(&env, &rows);
    }
    drop(env);
}

/// The ids and block offsets of the leaf deltas (node kind 2) in an image.
fn delta_blocks(img: &[u8]) -> Vec<(u64, u64, u32)> {
    let bf = BlockFile::open(Arc::new(MemDevice::from_bytes(img.to_vec()))).expect("block file");
    bf.file
        .live_blocks()
        .filter(|(_, l)| {
            let o = l.offset as usize;
            l.len >= 16 && &img[o..o + 4] == b"FNOD" && img[o + 5] == 2
        })
        .map(|(id, l)| (id.0, l.offset, l.len))
        .collect()
}

/// A flipped byte in a delta's messages is a checksum error that names the delta; fsck's
/// `verify_all` reports it with its leaf's key range and goes on.
#[test]
fn damaged_delta_is_a_checksum_error_naming_it() {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts(3)).expect("create");
    let mut rows = Rows::new();
    workload(&env, &mut rows, 5000, 0, Durability::Buffered);
    env.close().expect("close");
    let img = dev.snapshot();
    let deltas = delta_blocks(&img);
    assert!(!deltas.is_empty(), "the image should hold deltas");
    let (id, offset, len) = deltas[0];
    let mut bad = img.clone();
    // The last byte of the block lies in its one partition frame.
    bad[(offset + len as u64 - 1) as usize] ^= 0x40;
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(bad)), opts(3)).expect("open");
    let t = env.tree("t").expect("tree");
    match t.verify() {
        Err(Error::Checksum { what, .. }) => {
            assert!(
                what.contains(&format!("leaf delta node {id} partition")),
                "error should name the delta: {what}"
            );
        }
        other => panic!("expected a checksum error naming leaf delta {id}, got {other:?}"),
    }
    let (_, damaged) = t.verify_all().expect("verify_all");
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(damaged[0].node.0, id);
    assert!(matches!(damaged[0].error, Error::Checksum { .. }));
}
