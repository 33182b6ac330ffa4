//! What file-system operations cost in etcd round trips (docs/distributed.md §8): counted,
//! not timed, so the figures hold on a loaded machine. The bounds are today's costs; a change
//! that adds round trips to a hot path fails here and must say why.

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
    measure("create + close (empty)", 1, &mut || {
        let f = p.open(b"/d/a", rw()).expect("create");
        p.close(f).expect("close");
    });
    let f = p.open(b"/d/a", rw()).expect("open");
    // 2, not 1: st_blocks keeps a per-mount mirror of each file's size and stored blocks
    // (fern-fs stored.rs). A file reopened through the name cache (no lookup read its stat)
    // pays one stat read at its first write; later writes are blind again (the next two).
    measure("first write 4 KiB after reopen", 2, &mut || {
        p.write_at(&f, 0, &[1u8; 4096]).expect("write");
    });
    measure("write 4 KiB (one block)", 1, &mut || {
        p.write_at(&f, 4096, &[1u8; 4096]).expect("write");
    });
    measure("write 100 B inside a block", 2, &mut || {
        p.write_at(&f, 10, &[2u8; 100]).expect("write");
    });
    measure("write 1 MiB", 3, &mut || {
        p.write_at(&f, 0, &vec![3u8; 1 << 20]).expect("write");
    });
    p.close(f).expect("close");
    measure("stat", 1, &mut || {
        p.stat(b"/d/a").expect("stat");
    });
    measure("rename", 3, &mut || {
        p.rename(b"/d/a", b"/d/b", 0).expect("rename");
    });
    measure("unlink (1 MiB file)", 2, &mut || {
        p.unlink(b"/d/b").expect("unlink");
    });
    measure("mkdir", 1, &mut || {
        p.mkdir(b"/d/e", 0o755).expect("mkdir");
    });
    for (what, n, bound) in costs {
        assert!(n <= bound, "{what}: {n} round trips, more than {bound}");
    }
}
