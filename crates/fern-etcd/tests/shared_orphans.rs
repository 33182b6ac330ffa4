//! Open-file registrations of fern-fs on etcd (docs/distributed.md §7 rule 3) when one store —
//! one session, one lease — serves more than one `Fs` in a process, one after the other (a
//! remount in place, as the fern-fs model test's `Remount` does) or at once. Production mounts
//! have one `Fs` per store; these pin down what fern-fs promises when that is not so:
//!
//! * an `Fs` dropped with files still open removes its registrations, so the next `Fs` of the
//!   store frees the orphans at mount (before: they stayed until the lease ended, and the
//!   model test found "orphans left after the last close" on Create a / Unlink a / Remount);
//! * two `Fs` of one store never remove each other's registration (before: both used the key
//!   file ‖ session, so one's close unregistered the other's open and an unlink on a third
//!   mount freed a file still open);
//! * across stores (sessions): a rename over a file other mounts keep opening completes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::{EtcdConfig, EtcdStore};
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, MkfsOptions};
use fern_kv::{Direction, KeyRange, KvRead, KvStore};

fn keys(store: &EtcdStore, tree: &str) -> usize {
    let t = store.tree(tree).expect("tree");
    store
        .scan(t, &KeyRange::all(), Direction::Forward, usize::MAX)
        .expect("scan")
        .len()
}

fn formatted(what: &str) -> Option<(fern_etcd::EtcdConfig, Arc<EtcdStore>)> {
    let etcd = shared_for_tests()?;
    let cfg = etcd.config(&unique_prefix(what));
    let store = Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    Fs::mkfs(&*store, MkfsOptions::default()).expect("mkfs");
    Some((cfg, store))
}

#[test]
fn an_fs_dropped_with_open_files_lets_the_next_fs_of_its_store_free_them() {
    let Some((_, store)) = formatted("orphdrop") else {
        return;
    };
    let p = PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("mount")),
        Cred::root(),
    );
    let _held = p
        .open(b"/a", OpenOptions::create_write(0o644))
        .expect("create");
    p.unlink(b"/a").expect("unlink");
    let _live = p
        .open(b"/a", OpenOptions::create_write(0o644))
        .expect("create");
    assert_eq!(keys(&store, "fs.orphan"), 1);
    assert_eq!(keys(&store, "fs.open"), 2);
    // Handles abandoned, as at a crash; the store (its lease) lives on.
    drop(p);
    assert_eq!(keys(&store, "fs.open"), 0, "registrations of a dropped Fs");
    let p = PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("remount")),
        Cred::root(),
    );
    assert_eq!(
        keys(&store, "fs.orphan"),
        0,
        "orphan freed by the next mount"
    );
    assert!(p.stat(b"/a").is_ok(), "the live file stays");
}

#[test]
fn two_fs_of_one_store_never_unregister_each_others_opens() {
    let Some((cfg, store)) = formatted("orphtwo") else {
        return;
    };
    let one = PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("mount")),
        Cred::root(),
    );
    let two = PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("mount")),
        Cred::root(),
    );
    let other_store = Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    let other = PathFs::new(
        Arc::new(Fs::mount(other_store).expect("mount")),
        Cred::root(),
    );

    let f = one
        .open(b"/x", OpenOptions::create_write(0o644))
        .expect("create");
    one.write_at(&f, 0, b"kept while open").expect("write");
    let g = two.open(b"/x", OpenOptions::default()).expect("open");
    two.close(g).expect("close");
    other.unlink(b"/x").expect("unlink");
    assert_eq!(
        one.read_at(&f, 0, 100).expect("read after unlink"),
        b"kept while open"
    );
    one.close(f).expect("close");
    assert_eq!(keys(&store, "fs.orphan"), 0, "freed at the last close");
    assert_eq!(keys(&store, "fs.open"), 0);
}

/// A put into a held tree in an ordinary batch (fern-fs: a file's registration in the
/// transaction creating it) is held by the lease: it goes when the session
/// ends, so a dead mount's creations-in-progress never pin files forever.
#[test]
fn puts_into_a_held_tree_go_with_the_session() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let cfg = etcd.config(&unique_prefix("held"));
    let reader = EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect");
    let writer = EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect");
    let session = writer.session().expect("session").expect("shared");
    let (held, plain) = (
        writer.tree("held").expect("tree"),
        writer.tree("plain").expect("tree"),
    );
    session.hold_tree(held).expect("hold");
    let mut b = fern_kv::WriteBatch::new();
    b.put(held, b"k".to_vec(), b"v".to_vec());
    b.put(plain, b"k".to_vec(), b"v".to_vec());
    writer.write(b, fern_kv::WriteOptions::SYNC).expect("write");
    let mut txn = writer.begin().expect("begin");
    txn.batch().put(held, b"t".to_vec(), Vec::new());
    txn.commit(fern_kv::WriteOptions::SYNC).expect("commit");
    let (rh, rp) = (
        reader.tree("held").expect("tree"),
        reader.tree("plain").expect("tree"),
    );
    assert_eq!(keys(&reader, "held"), 2);
    drop(writer); // revokes the lease
    assert_eq!(
        reader.get(rh, b"k").expect("get"),
        None,
        "held put outlived its session"
    );
    assert_eq!(keys(&reader, "held"), 0);
    assert_eq!(reader.get(rp, b"k").expect("get"), Some(b"v".to_vec()));
}

fn mount(cfg: &EtcdConfig) -> (Arc<EtcdStore>, PathFs) {
    let store = Arc::new(EtcdStore::connect(cfg, fern_fs::registry()).expect("connect"));
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    (store, PathFs::new(fs, Cred::root()))
}

fn put(p: &PathFs, path: &[u8], data: &[u8]) {
    let f = p
        .open(path, OpenOptions::create_write(0o644))
        .expect("create");
    p.write_at(&f, 0, data).expect("write");
    p.close(f).expect("close");
}

/// A rename over a file that other mounts keep opening and closing completes, and the file
/// it replaced is freed (docs/distributed.md §7 rule 3). Three `Fs` on one prefix, each with
/// its own connection and session, as three machines' mounts. Before: the rename's transaction
/// read the replaced file's registrations, so every open and close of it elsewhere conflicted
/// it; with readers polling the file (the classic "write a new version, rename it over the
/// old" update) the rename ran out of retries (EAGAIN).
#[test]
fn a_rename_over_a_file_another_mount_keeps_opening_completes_and_frees_it() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let cfg = etcd.config(&unique_prefix("churn"));
    let store = EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect");
    Fs::mkfs(&store, MkfsOptions::default()).expect("mkfs");
    let (store_a, a) = mount(&cfg);
    let (_store_b, b) = mount(&cfg);
    let (_store_c, c) = mount(&cfg);
    put(&a, b"/target", b"version 0");
    let stop = Arc::new(AtomicBool::new(false));
    let opens = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        // Two other machines poll the file, two readers each: open, close, as fast as they
        // can.
        for p in [&b, &b, &c, &c] {
            let (stop, opens) = (&stop, &opens);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(f) = p.open(b"/target", OpenOptions::default()) {
                        p.close(f).expect("close on a polling mount");
                        opens.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while opens.load(Ordering::Relaxed) < 20 {
            std::thread::yield_now();
        }
        for i in 1..=20 {
            put(&a, b"/next", format!("version {i}").as_bytes());
            let r = a.rename(b"/next", b"/target", 0);
            if r.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            r.unwrap_or_else(|e| panic!("rename {i} over a polled file: {e:?}"));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        opens.load(Ordering::Relaxed) >= 20,
        "the polling mount never opened the file"
    );
    let f = b.open(b"/target", OpenOptions::default()).expect("open");
    assert_eq!(b.read_at(&f, 0, 64).expect("read"), b"version 20");
    b.close(f).expect("close");
    // Every replaced version is freed: by the rename's follow-up, or by the poller's close.
    assert_eq!(
        keys(&store_a, "fs.orphan"),
        0,
        "replaced files left as orphans"
    );
    assert_eq!(keys(&store_a, "fs.open"), 0, "registrations left");
}
