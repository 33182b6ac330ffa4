//! Access times on etcd are written lazily (fern-fs `atime.rs`, docs/distributed.md §7
//! "Access times are written lazily"): a cold listing or read under relatime costs no round
//! trip for its atime, the mount that read shows the new atime at once, other mounts see it
//! after the next sync (or within `LAZY_FOR` of a later access) — and a lazy write never
//! overwrites an atime set explicitly since, nor brings back a removed inode.

mod mounts;

use std::sync::Arc;

use fern_etcd::EtcdStore;
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, InodeId, TimeSet, Timespec};
use mounts::first_mount;

/// Two mounts of one new file system: A made `/d` with `n` files of 100 bytes; B is a fresh
/// mount under relatime (the default). Returns A, B and B's store (for round trip counts).
fn two_mounts(what: &str, n: usize) -> Option<(PathFs, PathFs, Arc<EtcdStore>)> {
    let (a, cfg) = first_mount(what, n, &[5u8; 100])?;
    let (b, b_store) = mounts::mount(&cfg);
    Some((a, PathFs::new(b, Cred::root()), b_store))
}

/// A cold readdirplus of `/d` by `p`'s mount; returns the etcd round trips it took.
fn list_plus(p: &PathFs, store: &EtcdStore) -> u64 {
    let fs = p.fs();
    let dir = fs.lookup(InodeId::ROOT, b"d").expect("lookup").ino;
    let fh = fs.opendir(dir).expect("opendir");
    let before = store.requests();
    let listed = fs.readdir(fh, 0, usize::MAX, true).expect("readdirplus");
    let n = store.requests() - before;
    for (_, e) in &listed {
        fs.forget(e.ino, 1);
    }
    fs.releasedir(fh).expect("releasedir");
    fs.forget(dir, 1);
    n
}

fn atime(p: &PathFs, path: &[u8]) -> Timespec {
    p.stat(path).expect("stat").atime
}

#[test]
fn a_cold_listing_writes_its_directorys_atime_lazily() {
    let Some((a, b, b_store)) = two_mounts("lazy-ls", 20) else {
        return;
    };
    let before = atime(&a, b"/d");
    let mtime = a.stat(b"/d").expect("stat").mtime;
    assert!(
        before <= mtime,
        "a new directory's atime is not newer than its mtime"
    );
    // Relatime would write this listing's atime (atime <= mtime): the name scan and one
    // multi-get of the inode rows, nothing for the atime (it was 5: the directory's stat,
    // the upsert's base read and its Txn).
    let n = list_plus(&b, &b_store);
    assert!(
        n <= 2,
        "a cold readdirplus of 20 files took {n} round trips"
    );
    // The mount that listed shows the access at once...
    let shown = atime(&b, b"/d");
    assert!(
        shown > mtime,
        "B shows the listing's atime ({shown:?} vs mtime {mtime:?})"
    );
    // ...the other mount once B syncs.
    assert_eq!(atime(&a, b"/d"), before, "not written before B's sync");
    b.fs().syncfs().expect("sync B");
    assert_eq!(atime(&a, b"/d"), shown, "A sees B's access after B's sync");
    // Written once: B now shows what the store holds.
    assert_eq!(atime(&b, b"/d"), shown);
}

#[test]
fn a_read_writes_the_files_atime_lazily_and_a_later_access_flushes_it_when_due() {
    let Some((a, b, _)) = two_mounts("lazy-read", 2) else {
        return;
    };
    let before = atime(&a, b"/d/f0");
    let f = b.open(b"/d/f0", OpenOptions::default()).expect("open");
    assert_eq!(b.read_at(&f, 0, 100).expect("read"), vec![5u8; 100]);
    b.close(f).expect("close");
    let shown = atime(&b, b"/d/f0");
    assert!(shown > before, "B shows the read's atime");
    assert_eq!(atime(&a, b"/d/f0"), before, "not written yet");
    // An access after LAZY_FOR writes every pending one with it.
    std::thread::sleep(fern_fs::LAZY_FOR + std::time::Duration::from_millis(50));
    let f = b.open(b"/d/f1", OpenOptions::default()).expect("open");
    b.read_at(&f, 0, 100).expect("read");
    b.close(f).expect("close");
    assert_eq!(atime(&a, b"/d/f0"), shown, "written by the later access");
}

/// An access recorded before an explicit atime set must not overwrite it when written:
/// relatime would (the set time is older than mtime).
#[test]
fn an_atime_set_after_an_access_is_kept_by_the_lazy_write() {
    let Some((a, b, _)) = two_mounts("lazy-set", 1) else {
        return;
    };
    let f = b.open(b"/d/f0", OpenOptions::default()).expect("open");
    b.read_at(&f, 0, 100).expect("read");
    b.close(f).expect("close");
    let set = Timespec { sec: 1000, nsec: 0 };
    b.utimens(b"/d/f0", Some(TimeSet::At(set)), None)
        .expect("utimens");
    assert_eq!(atime(&b, b"/d/f0"), set, "B shows the time it set");
    b.fs().syncfs().expect("sync B");
    assert_eq!(
        atime(&a, b"/d/f0"),
        set,
        "the pending access did not overwrite it"
    );
    assert_eq!(atime(&b, b"/d/f0"), set);
}

/// A file read on B and then removed by A: B's lazy atime write must not bring back its
/// inode row (a stat delta leaves an absent row absent), and the sync succeeds.
#[test]
fn a_lazy_atime_write_of_a_removed_file_writes_nothing() {
    let Some((a, b, b_store)) = two_mounts("lazy-gone", 1) else {
        return;
    };
    let f = b.open(b"/d/f0", OpenOptions::default()).expect("open");
    let ino = f.ino();
    b.read_at(&f, 0, 100).expect("read");
    b.close(f).expect("close");
    a.unlink(b"/d/f0").expect("unlink");
    b.fs().syncfs().expect("sync B");
    let inode_tree = fern_kv::KvStore::tree(&*b_store, "fs.inode").expect("tree");
    let row = fern_kv::KvRead::get(&*b_store, inode_tree, &ino.0.to_be_bytes()).expect("get");
    assert_eq!(row, None, "the removed file's inode row stays absent");
    let report = fern_fs::check::check(&*b_store).expect("check");
    assert!(report.is_clean(), "fsck: {report:?}");
}

/// What a write to an unreachable cluster returns.
fn unreachable() -> fern_kv::KvError {
    fern_kv::KvError::Unavailable("injected: etcd unreachable".into())
}

/// A flush whose write fails keeps its accesses: the next one writes them.
#[test]
fn accesses_whose_write_failed_are_written_by_the_next_flush() {
    let Some((a, cfg)) = first_mount("lazy-fail", 1, &[5u8; 100]) else {
        return;
    };
    let store = Arc::new(fern_kv::faults::FailingWrites::new(Box::new(
        EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"),
    )));
    let b = PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("mount B")),
        Cred::root(),
    );
    let before = atime(&a, b"/d/f0");
    let f = b.open(b"/d/f0", OpenOptions::default()).expect("open");
    b.read_at(&f, 0, 100).expect("read");
    b.close(f).expect("close");
    let shown = atime(&b, b"/d/f0");
    assert!(shown > before);
    store.fail_with(Some(unreachable));
    assert!(b.fs().syncfs().is_err(), "the flush's write fails");
    assert_eq!(atime(&b, b"/d/f0"), shown, "B still shows the access");
    store.fail_with(None);
    b.fs().syncfs().expect("sync B");
    assert_eq!(atime(&a, b"/d/f0"), shown, "written by the next flush");
}
