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
    fill(Env::create(path, opts()).unwrap())
}

/// `env` with rows 0..ROWS written into its tree "t".
fn fill(env: Env) -> (Env, fern_tree::Tree) {
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

/// A device that counts the read-ahead it is asked for.
#[derive(Debug)]
struct CountsPrefetch {
    inner: fern_tree::device::MemDevice,
    prefetched: std::sync::atomic::AtomicU64,
}

impl fern_tree::device::BlockDevice for CountsPrefetch {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn prefetch(&self, _offset: u64, _len: u64) {
        self.prefetched
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_scan_asks_the_device_for_the_next_leaves_and_a_short_one_does_not() {
    use std::ops::Bound;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let dev = Arc::new(CountsPrefetch {
        inner: fern_tree::device::MemDevice::new(),
        prefetched: Default::default(),
    });
    let opts = Options {
        checkpoint_thread: false,
        ..opts()
    };
    {
        let (env, t) = fill(Env::create_on(dev.clone(), opts.clone()).unwrap());
        t.optimize().unwrap();
        env.close().unwrap();
    }
    let env = Env::open_on(dev.clone(), opts).unwrap();
    let t = env.tree("t").unwrap();
    dev.prefetched.store(0, Ordering::Relaxed);
    // A scan whose end lies inside one leaf (a readdir page, a small range) reads nothing
    // ahead.
    let mut rows = 0;
    let (lo, hi) = ([0x40u8, 0, 0], [0x40u8, 0x02]);
    t.scan(
        Bound::Included(&lo[..]),
        Bound::Excluded(&hi[..]),
        |_, _| {
            rows += 1;
            true
        },
    )
    .unwrap();
    assert!(rows > 0 && rows < 200, "{rows} rows in the small range");
    let short = dev.prefetched.load(Ordering::Relaxed);
    assert_eq!(short, 0, "read-ahead for a scan ending inside its leaf");
    let mut rows = 0u64;
    t.scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
        rows += 1;
        true
    })
    .unwrap();
    assert_eq!(rows, ROWS);
    let full = dev.prefetched.load(Ordering::Relaxed) - short;
    // ~190 leaves of 64 KiB under ~12 parents: every leaf but each parent's last asks for the
    // ones after it.
    eprintln!("{full} read-ahead requests for a full scan");
    assert!(full >= 100, "{full} read-ahead requests for a full scan");
    env.close().unwrap();
}
