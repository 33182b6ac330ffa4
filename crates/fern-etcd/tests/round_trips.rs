//! What file-system operations cost in etcd round trips (docs/distributed.md §8): counted,
//! not timed, so the figures hold on a loaded machine. The bounds are today's costs; a change
//! that adds round trips to a hot path fails here and must say why.
//!
//! The costs are those of a mount of a *shared* store (every etcd store is one), under the
//! rules of docs/distributed.md §7: no single-writer cache (each path component is looked up,
//! each existence check and each write's size read), stats in the inode tree (a lookup reads
//! the entry, then the record), open files registered under the mount's lease (a first open
//! puts the registration and re-reads the inode; a last close removes it in a transaction
//! that reads the orphan record), a name put only in a directory read alive in the same
//! transaction.

use std::sync::Arc;

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::EtcdStore;
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, MkfsOptions};

fn rw() -> OpenOptions {
    OpenOptions::create_write(0o644)
}

#[test]
fn round_trips_per_operation() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    let store = Arc::new(
        EtcdStore::connect(&etcd.config(&unique_prefix("cost")), fern_fs::registry())
            .expect("connect"),
    );
    Fs::mkfs(&*store, MkfsOptions::default()).expect("mkfs");
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    let p = PathFs::new(fs, Cred::root());
    p.mkdir(b"/d", 0o755).expect("mkdir");
    // Warm up: the first create reserves a range of inode ids (one transaction per 1024).
    let f = p.open(b"/d/warm", rw()).expect("create");
    p.close(f).expect("close");

    let mut costs = Vec::new();
    let mut measure = |what: &'static str, bound: u64, op: &mut dyn FnMut()| {
        let before = store.requests();
        op();
        let n = store.requests() - before;
        eprintln!("{what:<28} {n:>3} etcd round trips");
        costs.push((what, n, bound));
    };
    // Lookup of /d (2), the create transaction (parent alive, entry absent, commit with the
    // open registration in it: 3), close (2). [9 while the registration was a put of its
    // own and a re-read of the inode.]
    measure("create + close (empty)", 7, &mut || {
        let f = p.open(b"/d/a", rw()).expect("create");
        p.close(f).expect("close");
    });
    let f = p.open(b"/d/a", rw()).expect("open");
    // Every write reads the file's stat first (size and stored blocks: another mount may have
    // changed them, fern-fs stored.rs), then writes one Txn.
    measure("first write 4 KiB after reopen", 2, &mut || {
        p.write_at(&f, 0, &[1u8; 4096]).expect("write");
    });
    measure("write 4 KiB (one block)", 2, &mut || {
        p.write_at(&f, 4096, &[1u8; 4096]).expect("write");
    });
    measure("write 100 B inside a block", 3, &mut || {
        p.write_at(&f, 10, &[2u8; 100]).expect("write");
    });
    measure("write 1 MiB", 4, &mut || {
        p.write_at(&f, 0, &vec![3u8; 1 << 20]).expect("write");
    });
    p.close(f).expect("close");
    measure("stat", 4, &mut || {
        p.stat(b"/d/a").expect("stat");
    });
    measure("rename", 7, &mut || {
        p.rename(b"/d/a", b"/d/b", 0).expect("rename");
    });
    measure("unlink (1 MiB file)", 6, &mut || {
        p.unlink(b"/d/b").expect("unlink");
    });
    measure("mkdir", 5, &mut || {
        p.mkdir(b"/d/e", 0o755).expect("mkdir");
    });
    for (what, n, bound) in costs {
        assert!(n <= bound, "{what}: {n} round trips, more than {bound}");
    }
}

/// A cold readdirplus of 200 files (another mount made them): the entries' rows and inode
/// rows come in one Txn per 126 entries, not two round trips per entry (a cold `find -ls`
/// of 1,000 files ran at 511 entries/s on etcd before), and every entry carries its own
/// file's attributes.
#[test]
fn a_cold_readdirplus_reads_its_entries_in_a_few_round_trips() {
    let Some(n) = cold_readdirplus(fern_fs::AtimePolicy::default()) else {
        return;
    };
    // The name scan and right after it one Txn of inode rows per 126 entries (the scan's
    // entry rows are not read again); the listing's atime is written lazily (fern-fs
    // atime.rs). [8 while each Txn read both rows of 63 entries; 6 while the directory's stat
    // and its atime upsert were read and written here.]
    assert!(
        n <= 3,
        "a cold readdirplus of 200 files took {n} round trips"
    );
}

/// Under relatime (the default) a listing costs what it costs under `noatime`: its atime
/// is written lazily, its stat read then (fern-fs atime.rs).
#[test]
fn a_cold_readdirplus_under_relatime_costs_no_more_than_under_noatime() {
    let relatime = cold_readdirplus(fern_fs::AtimePolicy::default());
    let noatime = cold_readdirplus(fern_fs::AtimePolicy {
        mode: fern_fs::AtimeMode::Never,
        nodiratime: false,
    });
    let (Some(relatime), Some(noatime)) = (relatime, noatime) else {
        return;
    };
    assert_eq!(
        noatime, relatime,
        "noatime {noatime} round trips, relatime {relatime}"
    );
}

/// The etcd round trips of a cold readdirplus of 200 files another mount made, by a mount
/// with atime policy `atime`; `None` without etcd.
fn cold_readdirplus(atime: fern_fs::AtimePolicy) -> Option<u64> {
    let etcd = shared_for_tests()?;
    let cfg = etcd.config(&unique_prefix("cost-ls"));
    let writer = Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    Fs::mkfs(&*writer, MkfsOptions::default()).expect("mkfs");
    let w = PathFs::new(
        Arc::new(Fs::mount(writer.clone()).expect("mount")),
        Cred::root(),
    );
    w.mkdir(b"/l", 0o755).expect("mkdir");
    const FILES: usize = 200;
    for i in 0..FILES {
        let f = w
            .open(format!("/l/f{i:03}").as_bytes(), rw())
            .expect("create");
        w.write_at(&f, 0, &vec![7u8; i]).expect("write");
        w.close(f).expect("close");
    }
    let store = Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    fs.set_atime_policy(atime);
    // As the kernel does: look the directory up (pinning it), then open it.
    let dir = fs.lookup(fern_fs::InodeId::ROOT, b"l").expect("lookup").ino;
    let fh = fs.opendir(dir).expect("opendir");
    let before = store.requests();
    let listed = fs.readdir(fh, 0, usize::MAX, true).expect("readdirplus");
    let n = store.requests() - before;
    eprintln!("cold readdirplus of {FILES} files: {n} etcd round trips");
    assert_eq!(listed.len(), FILES);
    for (_, e) in &listed {
        let name = String::from_utf8(e.name.clone()).expect("utf-8");
        let size: u64 = name[1..].parse().expect("number");
        let attr = e.attr.as_ref().expect("attributes");
        assert_eq!(attr.size, size, "{name} carries its own attributes");
        assert_eq!(attr.ino, e.ino);
        fs.forget(e.ino, 1);
    }
    fs.releasedir(fh).expect("releasedir");
    fs.forget(dir, 1);
    Some(n)
}
