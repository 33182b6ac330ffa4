//! Flushes beside the writer (design.md §2.5; betree/detached.rs DF1–DF4): the drain moves a
//! root's child buffer down on copies while writers keep appending to the root and readers
//! keep reading. A writer thread runs random inserts, deletes, range deletes and merging
//! upserts (the coalescing DF3 must keep away from the messages in flight) against a model;
//! a reader thread checks rows it knows cannot change; the tree is checked against the model,
//! verified, closed and reopened. The test fails unless detached flushes were installed.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fern_tree::device::{BlockDevice, MemDevice};
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

/// A memory device that, once armed, holds the first read the drain thread makes until the
/// test opens the gate — a read a detached flush makes for a node not in the cache, with no
/// lock held (DF1) — and counts every call that changes the device.
#[derive(Debug, Default)]
struct HeldDrainRead {
    mem: MemDevice,
    armed: AtomicBool,
    /// (a drain read is held, the gate is open)
    gate: Mutex<(bool, bool)>,
    moved: Condvar,
    changes: AtomicU64,
}

impl HeldDrainRead {
    fn held(&self) -> bool {
        self.gate.lock().unwrap().0
    }

    fn open(&self) {
        self.gate.lock().unwrap().1 = true;
        self.moved.notify_all();
    }
}

impl BlockDevice for HeldDrainRead {
    fn len(&self) -> io::Result<u64> {
        self.mem.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if std::thread::current().name() == Some("fern-drain")
            && self.armed.swap(false, Ordering::SeqCst)
        {
            let mut g = self.gate.lock().unwrap();
            g.0 = true;
            self.moved.notify_all();
            while !g.1 {
                g = self.moved.wait(g).unwrap();
            }
        }
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.mem.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.mem.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.mem.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.mem.punch_hole(offset, len)
    }
}

/// A close that finds a flush in flight ends the environment without waiting for it: once
/// `close` returns, that flush may neither install (its nodes would be dirty after the final
/// checkpoint) nor evict (a late write into an image another process may have opened by then,
/// into a block that one allocated). It is discarded, and the image holds every row.
#[test]
fn a_flush_in_flight_at_close_is_discarded_and_writes_nothing() {
    let dev = Arc::new(HeldDrainRead::default());
    let opts = || Options {
        cache_bytes: 1 << 20,
        ..self::opts()
    };
    let val = |i: u64| i.to_le_bytes().repeat(12);
    let mut model = BTreeMap::new();
    {
        let env = Env::create_on(dev.clone(), opts()).unwrap();
        let t = env.tree("t").unwrap();
        for chunk in 0..200u64 {
            let mut b = WriteBatch::new();
            for i in chunk * 100..(chunk + 1) * 100 {
                b.insert(&t, &key(i), &val(i));
                model.insert(key(i), val(i));
            }
            env.write(b).unwrap();
        }
        env.close().unwrap();
    }
    // Reopened with a cold cache, a flush beside the writer soon reads a node from the device.
    // The writes run on a thread of their own: a writer may jam (DF4's wait for the install)
    // behind the held flight, and only the close ends that wait.
    let env = Env::open_on(dev.clone(), opts()).unwrap();
    dev.armed.store(true, Ordering::SeqCst);
    let writer = {
        let (env, dev) = (env.clone(), dev.clone());
        std::thread::spawn(move || {
            let t = env.tree("t").unwrap();
            let mut written = Vec::new();
            let mut i = 0u64;
            while !dev.held() {
                let mut b = WriteBatch::new();
                let rows: Vec<_> = (i..i + 10).map(|i| (key(i), val(i))).collect();
                i += 10;
                for (k, v) in &rows {
                    b.insert(&t, k, v);
                }
                match env.write(b) {
                    Ok(()) => written.extend(rows),
                    // The close came between the check and the write: nothing was logged.
                    Err(e) if e.to_string().contains("closed") => break,
                    Err(e) => panic!("write: {e}"),
                }
            }
            written
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dev.held() {
        assert!(
            Instant::now() < deadline && !writer.is_finished(),
            "no flush beside the writer read from the device: {:?}",
            env.stats().work
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let probe = env.clone();
    let before = probe.stats().work;
    env.close().unwrap();
    let changes = dev.changes.load(Ordering::SeqCst);
    model.extend(writer.join().unwrap());
    dev.open();
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe.stats().work.detached_discards == before.detached_discards {
        assert!(
            Instant::now() < deadline,
            "the flight did not end in a discard: {:?}",
            probe.stats().work
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Whatever else the drain thread might do now, give it the time.
    std::thread::sleep(Duration::from_millis(100));
    let after = probe.stats().work;
    assert_eq!(after.detached_installs, before.detached_installs);
    assert_eq!(
        dev.changes.load(Ordering::SeqCst),
        changes,
        "the device changed after close returned"
    );
    drop(probe);

    let env = Env::open_on(dev, opts()).unwrap();
    let t = env.tree("t").unwrap();
    let mut rows = Vec::new();
    t.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
        rows.push((k.to_vec(), v.to_vec()));
        true
    })
    .unwrap();
    assert_eq!(rows.len(), model.len(), "row count");
    assert!(rows.into_iter().eq(model), "rows differ from the model");
    t.verify().unwrap();
}
