//! The tree shrinks when data goes away: a range delete that covers whole subtrees frees them
//! without reading their leaves, and small leaves left by point deletes merge with neighbours.

use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Env, Options, WriteBatch};

fn opts() -> Options {
    Options {
        cache_bytes: 4 << 20,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        fanout: 8,
        // Node counts depend on when roots flush; with the background root drain (design.md
        // §2.5) that is a matter of thread timing, so these shape checks run deterministically.
        checkpoint_thread: false,
        ..Options::default()
    }
}

fn fill(env: &Env, t: &fern_tree::Tree, prefix: u8, n: u32) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut b = WriteBatch::new();
        for &i in chunk {
            let mut k = vec![prefix];
            k.extend_from_slice(&i.wrapping_mul(2654435761).to_be_bytes());
            b.insert(t, &k, &[b'v'; 80]);
        }
        env.write(b).unwrap();
    }
}

fn live_nodes(env: &Env) -> u64 {
    env.checkpoint().unwrap();
    env.checkpoint().unwrap(); // frees from the checkpoint before are released one later
    env.stats().file.live_nodes
}

#[test]
fn range_delete_frees_whole_subtrees() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, b'a', 40_000);
    let before = live_nodes(&env);
    t.delete_range(b"a", b"b").unwrap();
    // Later writes elsewhere push the range delete down the tree.
    fill(&env, &t, b'c', 20_000);
    let rows = t
        .range_vec(Bound::Included(b"a"), Bound::Excluded(b"b"))
        .unwrap();
    assert!(rows.is_empty());
    let after = live_nodes(&env);
    eprintln!("live nodes: {before} with 40k rows, {after} after deleting them and adding 20k");
    assert!(
        after < before * 3 / 4,
        "range delete left {after} of {before} nodes"
    );
}

#[test]
fn point_deletes_shrink_the_tree() {
    // Tree A: 30k rows, 95% deleted one by one, then 20k other rows push the deletes down.
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, b'a', 30_000);
    let full = live_nodes(&env);
    for chunk in (0..30_000u32)
        .filter(|i| i % 20 != 0)
        .collect::<Vec<_>>()
        .chunks(500)
    {
        let mut b = WriteBatch::new();
        for &i in chunk {
            let mut k = vec![b'a'];
            k.extend_from_slice(&i.wrapping_mul(2654435761).to_be_bytes());
            b.delete(&t, &k);
        }
        env.write(b).unwrap();
    }
    fill(&env, &t, b'z', 20_000);
    // Messages wait in buffers until something pushes them down; optimize pushes all of them.
    t.optimize().unwrap();
    let n = t
        .range_vec(Bound::Included(b"a"), Bound::Excluded(b"b"))
        .unwrap()
        .len();
    assert_eq!(n, 1500);
    let shrunk = live_nodes(&env);
    // Tree B: the same live rows written directly.
    let env_b = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let tb = env_b.tree("t").unwrap();
    let rows = t.range_vec(Bound::Unbounded, Bound::Unbounded).unwrap();
    for chunk in rows.chunks(500) {
        let mut b = WriteBatch::new();
        for (k, v) in chunk {
            b.insert(&tb, k, v);
        }
        env_b.write(b).unwrap();
    }
    let direct = live_nodes(&env_b);
    eprintln!("A: {:?}", t.verify().unwrap());
    eprintln!("B: {:?}", tb.verify().unwrap());
    eprintln!("live nodes: {full} with 30k rows; {shrunk} after deletes + 20k others; {direct} for the same rows written directly");
    assert!(
        shrunk <= direct * 3 / 2 + 8,
        "deleted rows left {shrunk} nodes vs {direct}"
    );
}

/// 1 MiB nodes with upsert 1 = "add a u64 to a counter" (absent counts as 0), and its argument
/// merge (the sum) when `merge`.
fn counter_options(merge: bool) -> Options {
    let mut o = Options {
        cache_bytes: 16 << 20,
        node_bytes: 1 << 20,
        ..Options::default()
    };
    let add = |a: &[u8], b: Option<&[u8]>| -> Option<Vec<u8>> {
        let a = u64::from_le_bytes(a.try_into().ok()?);
        let b = b
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0);
        Some((a + b).to_le_bytes().to_vec())
    };
    o.register_upsert(
        fern_tree::UpsertId(1),
        Arc::new(move |_k, old, arg| add(arg, old)),
    );
    if merge {
        o.register_merge(
            fern_tree::UpsertId(1),
            Arc::new(|a, b| {
                let a = u64::from_le_bytes(a.try_into().ok()?);
                let b = u64::from_le_bytes(b.try_into().ok()?);
                Some((a + b).to_le_bytes().to_vec())
            }),
        );
    }
    o
}

/// A key upserted by every operation (a directory's mtime on every create) does not pile up
/// pending messages: they are pushed to the leaf once they pass a threshold, so reads of it
/// stay cheap, and the value stays exact.
#[test]
fn hot_key_upserts_are_pushed_to_the_leaf() {
    let env = Env::create_on(Arc::new(MemDevice::new()), counter_options(false)).unwrap();
    let t = env.tree("t").unwrap();
    // Enough other rows that the root is an internal node with buffers.
    fill(&env, &t, b'a', 30_000);
    for i in 0..5_000u64 {
        let mut b = WriteBatch::new();
        b.upsert(&t, b"hot", fern_tree::UpsertId(1), &1u64.to_le_bytes());
        b.insert(&t, &i.to_be_bytes(), b"x");
        env.write(b).unwrap();
    }
    assert_eq!(
        t.get(b"hot").unwrap(),
        Some(5_000u64.to_le_bytes().to_vec())
    );
    let report = t.verify().unwrap();
    eprintln!("{report:?}");
    // Bounded per level by the hot-key threshold (64), where a plain Bε-tree would still hold
    // all 5,000 in the root's buffer (it is under its size limit).
    let pending = t.pending_messages_for(b"hot").unwrap();
    assert!(
        pending <= 64 * report.height as usize,
        "{pending} messages for the hot key still buffered"
    );
    env.close().unwrap();
}

/// With a merge function registered, consecutive upserts of one key collapse into one buffered
/// message (and an upsert after an insert folds into it), so a read of a hot key folds one
/// message per level however often it was written; a range delete between two upserts keeps
/// them apart. Values stay exact through a reopen.
#[test]
fn mergeable_upserts_coalesce_in_buffers() {
    let options = || counter_options(true);
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone(), options()).unwrap();
    let t = env.tree("t").unwrap();
    fill(&env, &t, b'a', 30_000);
    t.insert(b"folded", &100u64.to_le_bytes()).unwrap();
    for i in 0..5_000u64 {
        let mut b = WriteBatch::new();
        b.upsert(&t, b"hot", fern_tree::UpsertId(1), &1u64.to_le_bytes());
        b.upsert(&t, b"folded", fern_tree::UpsertId(1), &2u64.to_le_bytes());
        b.insert(&t, &i.to_be_bytes(), b"x");
        env.write(b).unwrap();
    }
    let report = t.verify().unwrap();
    assert_eq!(
        t.get(b"hot").unwrap(),
        Some(5_000u64.to_le_bytes().to_vec())
    );
    assert_eq!(
        t.get(b"folded").unwrap(),
        Some(10_100u64.to_le_bytes().to_vec())
    );
    for k in [&b"hot"[..], b"folded"] {
        let pending = t.pending_messages_for(k).unwrap();
        assert!(
            pending <= report.height as usize,
            "{pending} messages for {k:?} still buffered in a tree of height {}",
            report.height
        );
    }
    // A range delete between two upserts of a key: the later upsert must not merge across it.
    t.upsert(b"cut", fern_tree::UpsertId(1), &5u64.to_le_bytes())
        .unwrap();
    t.delete_range(b"cut", b"cuu").unwrap();
    t.upsert(b"cut", fern_tree::UpsertId(1), &7u64.to_le_bytes())
        .unwrap();
    assert_eq!(t.get(b"cut").unwrap(), Some(7u64.to_le_bytes().to_vec()));
    env.checkpoint().unwrap();
    env.close().unwrap();
    let env = Env::open_on(dev, options()).unwrap();
    let t = env.tree("t").unwrap();
    assert_eq!(
        t.get(b"hot").unwrap(),
        Some(5_000u64.to_le_bytes().to_vec())
    );
    assert_eq!(t.get(b"cut").unwrap(), Some(7u64.to_le_bytes().to_vec()));
    assert_eq!(
        t.get(b"folded").unwrap(),
        Some(10_100u64.to_le_bytes().to_vec())
    );
    t.verify().unwrap();
}
