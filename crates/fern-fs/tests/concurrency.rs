//! Several threads on one mount through the path API, and big writes on a store with etcd's
//! per-transaction limits.

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use fern_fs::path::OpenOptions;
use fern_fs::{FileType, MkfsOptions};
use fern_kv::Limits;

fn rw() -> OpenOptions {
    OpenOptions::create_write(0o644)
}

#[test]
fn threads_create_write_rename_unlink() {
    let e = common::env();
    e.p.mkdir(b"/shared", 0o755).expect("mkdir");
    std::thread::scope(|s| {
        for t in 0..4 {
            let p = e.p.clone();
            s.spawn(move || {
                p.mkdir(format!("/t{t}").as_bytes(), 0o755).expect("mkdir");
                for i in 0..60 {
                    let name = format!("/shared/{t}-{i}");
                    let f = p.open(name.as_bytes(), rw()).expect("create");
                    p.write_at(&f, 0, name.as_bytes()).expect("write");
                    p.close(f).expect("close");
                    match i % 3 {
                        0 => p
                            .rename(name.as_bytes(), format!("/t{t}/{i}").as_bytes(), 0)
                            .expect("rename"),
                        1 => p.unlink(name.as_bytes()).expect("unlink"),
                        _ => {}
                    }
                }
            });
        }
    });
    assert_eq!(e.p.read_dir(b"/shared").expect("list").len(), 4 * 20);
    for t in 0..4 {
        let listing = e.p.read_dir(format!("/t{t}").as_bytes()).expect("list");
        assert_eq!(listing.len(), 20);
        assert!(listing.iter().all(|d| d.kind == FileType::Regular));
    }
    let f = e.p.open(b"/t2/30", OpenOptions::default()).expect("open");
    assert_eq!(e.p.read_at(&f, 0, 100).expect("read"), b"/shared/2-30");
    e.p.close(f).expect("close");
    assert_eq!(e.p.stat(b"/").expect("root").nlink, 2 + 5);
}

#[test]
fn concurrent_appends_lose_nothing() {
    let e = common::env();
    let mut app = rw();
    app.flags.append = true;
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let p = e.p.clone();
            s.spawn(move || {
                let f = p.open(b"/log", app).expect("open");
                for _ in 0..100 {
                    p.write_at(&f, 0, &[b'a' + t; 10]).expect("append");
                }
                p.close(f).expect("close");
            });
        }
    });
    let f = e.p.open(b"/log", OpenOptions::default()).expect("open");
    let data = e.p.read_at(&f, 0, 1 << 20).expect("read");
    e.p.close(f).expect("close");
    assert_eq!(data.len(), 4000);
    assert!(
        data.chunks(10).all(|c| c.iter().all(|b| *b == c[0])),
        "appends do not interleave"
    );
}

#[test]
fn renames_between_directories_do_not_deadlock() {
    let e = common::env();
    e.p.mkdir(b"/x", 0o755).expect("mkdir");
    e.p.mkdir(b"/y", 0o755).expect("mkdir");
    for i in 0..8 {
        let f =
            e.p.open(format!("/x/{i}").as_bytes(), rw())
                .expect("create");
        e.p.close(f).expect("close");
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            let p = e.p.clone();
            s.spawn(move || {
                for round in 0..50 {
                    let i = (t * 2 + round) % 8;
                    let (a, b) = if round % 2 == 0 {
                        ("x", "y")
                    } else {
                        ("y", "x")
                    };
                    // Races with other threads are expected to fail with ENOENT, never hang.
                    let _ = p.rename(
                        format!("/{a}/{i}").as_bytes(),
                        format!("/{b}/{i}").as_bytes(),
                        0,
                    );
                    let _ = p.rename(b"/x", b"/y", fern_fs::RENAME_EXCHANGE);
                }
            });
        }
    });
    let total = e.p.read_dir(b"/x").expect("x").len() + e.p.read_dir(b"/y").expect("y").len();
    assert_eq!(total, 8, "every file is in exactly one place");
}

#[test]
fn big_writes_split_under_etcd_limits() {
    let etcd = Limits {
        max_ops: Some(128),
        max_bytes: Some(1536 * 1024),
        ..Limits::EMBEDDED
    };
    let e = common::env_limited(
        MkfsOptions {
            block_size: 512,
            ..MkfsOptions::default()
        },
        etcd,
    );
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let f = e.p.open(b"/big", rw()).expect("create");
    e.p.write_at(&f, 100, &data)
        .expect("write larger than one transaction");
    let got = e.p.read_at(&f, 100, 400_000).expect("read");
    assert!(got == data);
    e.p.ftruncate(&f, 1000)
        .expect("truncate is a range delete: one op");
    e.p.close(f).expect("close");
    e.p.unlink(b"/big")
        .expect("unlink of a big file fits one transaction");
    assert_eq!(e.keys_in("fs.data"), 0);
}

/// Lookups seed the stat mirror without the inode's lock (docs/fs-design.md §4, rule 4). A
/// stat write (setxattr's ctime) committed while a lookup's read is in flight (the store
/// answers, then waits) must keep that lookup from seeding the stat it read: afterwards this
/// mount answers what a fresh mount reads.
#[test]
fn a_lookup_never_seeds_a_stat_a_racing_write_made_stale() {
    use fern_fs::{Cred, Fs, InodeId, OpenFlags};
    use std::sync::atomic::Ordering;
    let e = common::env();
    let root = InodeId::ROOT;
    let flags = OpenFlags {
        write: true,
        ..OpenFlags::default()
    };
    let (f, fh) =
        e.fs.create(&Cred::root(), root, b"f", 0o644, flags)
            .expect("create");
    e.fs.release(fh).expect("release");
    for round in 0..20u32 {
        e.store.read_delay_us.store(20_000, Ordering::SeqCst);
        std::thread::scope(|s| {
            let fs = &e.fs;
            s.spawn(move || {
                let a = fs.lookup(root, b"f").expect("lookup");
                fs.forget(a.ino, 1);
            });
            s.spawn(move || {
                // Inside the lookup's 20 ms wait.
                std::thread::sleep(std::time::Duration::from_millis(5));
                // Changes the ctime and leaves the mirror empty (nothing applies it).
                fs.setxattr(f.ino, b"user.k", &round.to_be_bytes(), 0)
                    .expect("setxattr");
            });
        });
        e.store.read_delay_us.store(0, Ordering::SeqCst);
        let ro = Fs::mount_read_only(e.store.clone()).expect("fresh mount");
        let want = ro.lookup(root, b"f").expect("fresh lookup");
        assert_eq!(e.fs.getattr(f.ino).expect("getattr"), want, "round {round}");
    }
}
