//! Lookups read ahead on etcd (fern-fs `lookahead.rs`, docs/distributed.md §8): a second cold
//! lookup in a directory reads the directory and its entries' inode rows in two round trips,
//! and the next lookups there are answered from them — but never against this mount's own
//! changes, never for a name they lack, and never again after an open found their inode gone.
//!
//! The rows may serve answers up to 100 ms old, so the tests that check what they must *not*
//! answer run their steps right after the read (milliseconds here); a slow machine only makes
//! those lookups read the store, which passes for the right reason too.

mod mounts;

use std::sync::Arc;
use std::time::Duration;

use fern_etcd::EtcdStore;
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, FsError};

const AGE: Duration = Duration::from_millis(100);

/// Two mounts (stores, sessions) of one new file system: A made `/d` with `n` files; B reads
/// ahead as a FUSE mount with 1 s TTLs does.
fn two_mounts(what: &str, n: usize) -> Option<(PathFs, PathFs, Arc<EtcdStore>)> {
    let (a, cfg) = mounts::first_mount(what, n, &[])?;
    let (b_fs, b_store) = mounts::mount(&cfg);
    b_fs.set_lookup_ahead(Duration::from_secs(1));
    Some((a, PathFs::new(b_fs, Cred::root()), b_store))
}

/// Two cold lookups in `/d`: the second reads the directory ahead.
fn read_ahead(b: &PathFs) {
    b.stat(b"/d/f0").expect("first lookup");
    b.stat(b"/d/f1")
        .expect("second lookup: reads the directory ahead");
}

/// The permission bits of `path`, or `None` if it is not found (any other error fails).
fn mode(p: &PathFs, path: &str) -> Option<u32> {
    match p.stat(path.as_bytes()) {
        Ok(a) => Some(a.perm),
        Err(FsError::NotFound) => None,
        Err(e) => panic!("stat {path}: {e}"),
    }
}

#[test]
fn cold_lookups_in_one_directory_cost_a_few_round_trips_not_two_each() {
    let Some((_a, b, store)) = two_mounts("ahead-cost", 40) else {
        return;
    };
    b.stat(b"/d").expect("stat /d");
    let before = store.requests();
    for i in 0..40 {
        b.stat(format!("/d/f{i}").as_bytes()).expect("stat");
    }
    let n = store.requests() - before;
    eprintln!("40 cold lookups in one directory: {n} etcd round trips");
    // The first lookup reads its two rows; the second reads the directory (one scan) and
    // its 40 inode rows (one multi-get); the other 38 read nothing. Without: 80.
    assert!(n <= 8, "{n} round trips for 40 cold lookups");
}

#[test]
fn read_ahead_rows_never_hide_this_mounts_own_changes() {
    let Some((_a, b, _)) = two_mounts("ahead-own", 8) else {
        return;
    };
    read_ahead(&b);
    b.chmod(b"/d/f2", 0o600).expect("chmod");
    assert_eq!(mode(&b, "/d/f2"), Some(0o600), "own chmod");
    b.unlink(b"/d/f3").expect("unlink");
    assert_eq!(mode(&b, "/d/f3"), None, "own unlink");
    b.rename(b"/d/f4", b"/d/g4", 0).expect("rename");
    assert_eq!(mode(&b, "/d/f4"), None, "own rename");
    assert_eq!(mode(&b, "/d/g4"), Some(0o644));
    let f = b
        .open(b"/d/f5", OpenOptions::create_write(0o644))
        .expect("open");
    b.write_at(&f, 0, &[7u8; 100]).expect("write");
    b.close(f).expect("close");
    assert_eq!(b.stat(b"/d/f5").expect("stat").size, 100, "own write");
    assert_eq!(
        mode(&b, "/d/f6"),
        Some(0o644),
        "untouched names still answer"
    );
}

#[test]
fn a_name_another_mount_created_is_found_by_the_next_lookup() {
    let Some((a, b, _)) = two_mounts("ahead-new", 8) else {
        return;
    };
    read_ahead(&b);
    assert_eq!(mode(&b, "/d/new"), None);
    let f = a
        .open(b"/d/new", OpenOptions::create_write(0o640))
        .expect("create on A");
    a.close(f).expect("close");
    assert_eq!(
        mode(&b, "/d/new"),
        Some(0o640),
        "missing names are not cached"
    );
}

/// A removes `/d/f2` (freed: open nowhere) after B read `/d` ahead; `probe` is what B does
/// with the name while its rows may still show it (as a kernel's cached entry would): it must
/// fail, and then the name must be gone — the kernel retries a failed open or stat with one
/// fresh lookup (LOOKUP_REVAL).
fn removed_elsewhere(what: &str, probe: impl Fn(&PathFs, fern_fs::Attr) -> Result<(), FsError>) {
    let Some((a, b, _)) = two_mounts(what, 8) else {
        return;
    };
    read_ahead(&b);
    a.unlink(b"/d/f2")
        .expect("unlink on A (not open anywhere: freed)");
    if let Ok(stale) = b.stat(b"/d/f2") {
        let r = probe(&b, stale);
        assert!(
            matches!(r, Err(FsError::Stale | FsError::NotFound)),
            "{what} of a freed file: {r:?}"
        );
    }
    assert_eq!(mode(&b, "/d/f2"), None);
    std::thread::sleep(AGE);
    assert_eq!(mode(&b, "/d/f2"), None);
}

#[test]
fn an_open_of_a_file_removed_elsewhere_makes_the_next_lookup_read_the_store() {
    removed_elsewhere("open", |b, _| {
        b.open(b"/d/f2", OpenOptions::default()).map(|_| ())
    });
}

#[test]
fn a_getattr_of_a_file_removed_elsewhere_makes_the_next_lookup_read_the_store() {
    removed_elsewhere("getattr", |b, stale| b.fs().getattr(stale.ino).map(|_| ()));
}

/// A's tree for the walk tests: `/w` with subdirectories `s0`..`s2` of `n` files each.
fn walk_tree(what: &str, n: usize) -> Option<(PathFs, PathFs, Arc<EtcdStore>)> {
    let (a, b, b_store) = two_mounts(what, 0)?;
    a.mkdir(b"/w", 0o755).expect("mkdir");
    for s in 0..3 {
        a.mkdir(format!("/w/s{s}").as_bytes(), 0o755)
            .expect("mkdir");
        for i in 0..n {
            let f = a
                .open(
                    format!("/w/s{s}/f{i}").as_bytes(),
                    OpenOptions::create_write(0o644),
                )
                .expect("create");
            a.close(f).expect("close");
        }
    }
    Some((a, b, b_store))
}

/// A readdirplus of `dir` from the start, as the kernel sends it after an opendir; returns
/// (names, etcd round trips of the listing alone).
fn readdirplus(p: &PathFs, store: &EtcdStore, dir: fern_fs::InodeId) -> (Vec<Vec<u8>>, u64) {
    let fs = p.fs();
    let fh = fs.opendir(dir).expect("opendir");
    let before = store.requests();
    let listed = fs.readdir(fh, 0, usize::MAX, true).expect("readdirplus");
    let n = store.requests() - before;
    fs.releasedir(fh).expect("releasedir");
    let names = listed.iter().map(|(_, e)| e.name.clone()).collect();
    for (_, e) in &listed {
        fs.forget(e.ino, 1);
    }
    (names, n)
}

/// A walk: the readdirplus of `/w` reads its subdirectories' names in the same round trip,
/// so each subdirectory's listing right after it costs only its inode rows (1 round trip,
/// was 2: the name scan).
#[test]
fn a_walk_lists_each_subdirectory_in_one_round_trip() {
    let Some((_a, b, b_store)) = walk_tree("walk", 20) else {
        return;
    };
    let fs = b.fs();
    let w = fs.lookup(fern_fs::InodeId::ROOT, b"w").expect("lookup").ino;
    let (subs, _) = readdirplus(&b, &b_store, w);
    assert_eq!(subs.len(), 3);
    for s in &subs {
        let ino = fs.lookup(w, s).expect("lookup").ino;
        let (names, n) = readdirplus(&b, &b_store, ino);
        assert_eq!(names.len(), 20, "every name of {s:?}");
        assert!(n <= 1, "{s:?} listed in {n} round trips");
        fs.forget(ino, 1);
    }
    fs.forget(w, 1);
}

/// Rule 2 for walks: a name this mount created in a subdirectory after the walk read it
/// ahead is listed (the subdirectory's stripe count moved: the listing scans again).
#[test]
fn a_subdirectory_listing_read_ahead_shows_this_mounts_later_create() {
    let Some((_a, b, b_store)) = walk_tree("walk-own", 2) else {
        return;
    };
    let fs = b.fs();
    let w = fs.lookup(fern_fs::InodeId::ROOT, b"w").expect("lookup").ino;
    readdirplus(&b, &b_store, w);
    let f = b
        .open(b"/w/s1/new", OpenOptions::create_write(0o644))
        .expect("create on B");
    b.close(f).expect("close");
    let s1 = fs.lookup(w, b"s1").expect("lookup").ino;
    let (names, _) = readdirplus(&b, &b_store, s1);
    assert!(
        names.iter().any(|n| n == b"new"),
        "B's own create is listed: {names:?}"
    );
    fs.forget(s1, 1);
    fs.forget(w, 1);
}

/// A listing read ahead is used once and only within the age: a later listing (here after
/// the age) reads the store and finds another mount's create.
#[test]
fn a_subdirectory_listing_read_ahead_expires() {
    let Some((a, b, b_store)) = walk_tree("walk-age", 2) else {
        return;
    };
    let fs = b.fs();
    let w = fs.lookup(fern_fs::InodeId::ROOT, b"w").expect("lookup").ino;
    readdirplus(&b, &b_store, w);
    let f = a
        .open(b"/w/s2/other", OpenOptions::create_write(0o644))
        .expect("create on A");
    a.close(f).expect("close");
    std::thread::sleep(AGE + Duration::from_millis(20));
    let s2 = fs.lookup(w, b"s2").expect("lookup").ino;
    let (names, _) = readdirplus(&b, &b_store, s2);
    assert!(
        names.iter().any(|n| n == b"other"),
        "A's create is listed after the age: {names:?}"
    );
    fs.forget(s2, 1);
    fs.forget(w, 1);
}

/// `..` of a subdirectory a walk read ahead is the listed parent without a read, but after
/// this mount moved the subdirectory it is the new parent (the move holds its stripe).
#[test]
fn a_walked_subdirectorys_dotdot_follows_this_mounts_rename() {
    let Some((_a, b, b_store)) = walk_tree("walk-dotdot", 1) else {
        return;
    };
    let fs = b.fs();
    let w = fs.lookup(fern_fs::InodeId::ROOT, b"w").expect("lookup").ino;
    readdirplus(&b, &b_store, w);
    let s0 = fs.lookup(w, b"s0").expect("lookup").ino;
    let s1 = fs.lookup(w, b"s1").expect("lookup").ino;
    let before = b_store.requests();
    assert_eq!(fs.listed_parent_of(s1).expect(".."), w);
    assert_eq!(b_store.requests(), before, "answered from the walk");
    b.rename(b"/w/s0", b"/s0", 0).expect("rename on B");
    assert_eq!(
        fs.listed_parent_of(s0).expect(".."),
        fern_fs::InodeId::ROOT,
        "the moved directory's new parent"
    );
    fs.forget(s0, 1);
    fs.forget(s1, 1);
    fs.forget(w, 1);
}
