//! Cold point reads under a cache far smaller than the data: once every leaf's header has been
//! read, a lookup costs one partition read. The cache sheds the basements of clean leaves and
//! keeps their headers (partial eviction, invariant C3), instead of dropping whole leaves and
//! making the next lookup of each read its header and then a basement.

use fern_tree::{Env, Options, WriteBatch};

const ROWS: u64 = 120_000;

fn opts() -> Options {
    Options {
        cache_bytes: 3 << 20,
        node_bytes: 64 << 10,
        basement_bytes: 4 << 10,
        fanout: 16,
        sync_interval: None,
        ..Options::default()
    }
}

fn key(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let mut x = i ^ 0xA076_1D64_78BD_642F;
    (0..12)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// A new environment at `path` holding rows 0..ROWS.
fn filled(path: &std::path::Path) -> (Env, fern_tree::Tree) {
    let env = Env::create(path, opts()).unwrap();
    let t = env.tree("t").unwrap();
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(1000) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            b.insert(&t, &key(i), &value(i));
        }
        env.write(b).unwrap();
    }
    (env, t)
}

/// An xorshift sequence of row numbers.
fn picks(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % ROWS
        })
        .collect()
}

#[test]
fn a_cold_lookup_reads_one_basement_once_the_leaf_headers_are_cached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    {
        let (env, t) = filled(&path);
        t.optimize().unwrap(); // every row in a leaf: a lookup's reads are the leaf's
        env.close().unwrap();
    }
    let env = Env::open(&path, opts()).unwrap();
    let t = env.tree("t").unwrap();
    // ~12 MB of rows against a 3 MiB cache: every leaf's header gets read, and most basements
    // are evicted again before they are asked for twice.
    for i in picks(7, 60_000) {
        assert_eq!(t.get(&key(i)).unwrap(), Some(value(i)), "row {i}");
    }
    let before = env.stats();
    assert!(
        before.cache.partial_evictions > 0,
        "the cache shed basements: {:?}",
        before.cache
    );
    let lookups = 20_000;
    for i in picks(11, lookups) {
        assert_eq!(t.get(&key(i)).unwrap(), Some(value(i)), "row {i}");
    }
    let after = env.stats();
    let headers_read = after.cache.misses - before.cache.misses;
    let reads = after.device.reads - before.device.reads;
    eprintln!("{lookups} lookups: {reads} device reads, {headers_read} headers read");
    assert!(
        headers_read * 100 <= lookups as u64,
        "{headers_read} of {lookups} lookups read a node's header again: {:?}",
        after.cache
    );
    assert!(
        reads <= lookups as u64,
        "{reads} device reads for {lookups} cold lookups (one basement each at most)"
    );
    assert!(
        reads * 2 >= lookups as u64,
        "{reads} device reads for {lookups} lookups: the cache was meant to be too small"
    );
    env.close().unwrap();
}

#[test]
fn a_key_decided_by_a_buffered_message_is_answered_without_reading_its_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    let changed: Vec<u64> = (0..300).map(|i| i * 397).collect();
    {
        let (env, t) = filled(&path);
        t.optimize().unwrap(); // every row in a leaf, every buffer empty
                               // Newer messages for a few keys, small enough to stay in the root's buffers:
                               // overwrites, deletes, and a range delete that covers one key.
        let mut b = WriteBatch::new();
        for (n, &i) in changed.iter().enumerate() {
            match n % 3 {
                0 => b.insert(&t, &key(i), b"new"),
                1 => b.delete(&t, &key(i)),
                _ => {
                    let k = key(i);
                    let mut hi = k.to_vec();
                    hi.push(0);
                    b.delete_range(&t, &k, &hi);
                }
            }
        }
        env.write(b).unwrap();
        env.close().unwrap();
    }
    let env = Env::open(&path, opts()).unwrap();
    let t = env.tree("t").unwrap();
    for (n, &i) in changed.iter().enumerate() {
        let want = (n % 3 == 0).then(|| b"new".to_vec());
        assert_eq!(t.get(&key(i)).unwrap(), want, "row {i}");
    }
    let s = env.stats();
    // 300 keys spread over every leaf: read from the leaves, they would have fetched most of
    // the ~200 leaves' headers and 300 basements. Only the internal nodes on the way are read.
    assert!(
        s.cache.misses <= 20,
        "{} nodes read for keys whose answer is in the root: {:?}",
        s.cache.misses,
        s.cache
    );
    // The unchanged rows beside them still read their leaves.
    assert_eq!(t.get(&key(1)).unwrap(), Some(value(1)));
    assert!(env.stats().cache.misses > s.cache.misses);
    env.close().unwrap();
}
