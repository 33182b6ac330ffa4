//! `fernfs fsck` and `fernfs fsck --repair` on real images damaged through the KV store
//! directly, one kind of damage per test: the check must report it (exit 4), the repair must
//! fix it (exit 1), a second check must be clean (exit 0), and every file the damage did not
//! touch must read back intact. Damage that cannot be repaired safely must stay exit 4 and
//! leave the other files alone; an unusable image is exit 8.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{schema, Cred, Fs, InodeId};
use fern_kv::{KvStore, WriteBatch, WriteOptions};
use fern_kv_tree::TreeStore;

mod common;
use common::{run, text};

const CACHE: usize = 16 << 20;

fn fsck(img: &Path, repair: bool) -> (i32, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["fsck".as_ref(), img.as_os_str()];
    if repair {
        args.push("--repair".as_ref());
    }
    let out = run(&args);
    (out.status.code().unwrap_or(-1), text(&out))
}

/// An image made by `fernfs mkfs`, with a few files every test checks afterwards.
struct Img {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn big() -> Vec<u8> {
    (0..50_000u32).map(|i| (i * 13 % 251) as u8).collect()
}

impl Img {
    fn new() -> Img {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs.img");
        let out = run(&["mkfs".as_ref(), path.as_os_str()]);
        assert!(out.status.success(), "{out:?}");
        let img = Img { _dir: dir, path };
        img.with_fs(|p| {
            p.mkdir(b"/d", 0o755).unwrap();
            p.mkdir(b"/d/sub", 0o755).unwrap();
            write(p, b"/d/keep", b"kept contents");
            write(p, b"/big", &big());
            p.symlink(b"d/keep", b"/link").unwrap();
        });
        img
    }

    /// Runs `f` on the mounted file-system core, then closes the image cleanly.
    fn with_fs<T>(&self, f: impl FnOnce(&PathFs) -> T) -> T {
        let store = Arc::new(TreeStore::open(&self.path, CACHE, fern_fs::registry()).unwrap());
        let fs = Arc::new(Fs::mount(store.clone()).unwrap());
        let p = PathFs::new(fs, Cred::root());
        let r = f(&p);
        drop(p);
        Arc::try_unwrap(store).ok().unwrap().close().unwrap();
        r
    }

    /// Runs `f` on the raw store (the damage), then closes it cleanly.
    fn with_kv<T>(&self, f: impl FnOnce(&dyn KvStore) -> T) -> T {
        let store = TreeStore::open(&self.path, CACHE, fern_fs::registry()).unwrap();
        let r = f(&store);
        store.close().unwrap();
        r
    }

    /// The untouched files read back as written.
    fn assert_intact(&self) {
        self.with_fs(|p| {
            assert_eq!(read(p, b"/d/keep"), b"kept contents");
            assert_eq!(read(p, b"/big"), big());
            assert_eq!(p.readlink(b"/link").unwrap(), b"d/keep");
            assert_eq!(read(p, b"/link"), b"kept contents");
        });
    }

    /// Check finds errors (4), repair fixes them (1), a second check is clean (0).
    fn check_repair_clean(&self, expect: &str) -> String {
        let (code, out) = fsck(&self.path, false);
        assert_eq!(code, 4, "check before repair:\n{out}");
        assert!(out.contains(expect), "expected {expect:?} in:\n{out}");
        let (code, fixed) = fsck(&self.path, true);
        assert_eq!(code, 1, "repair:\n{fixed}");
        assert!(fixed.contains("fixed:"), "{fixed}");
        let (code, out) = fsck(&self.path, false);
        assert_eq!(code, 0, "check after repair:\n{out}\nrepair said:\n{fixed}");
        assert!(out.contains(" 0 problems"), "{out}");
        self.assert_intact();
        fixed
    }
}

fn write(p: &PathFs, path: &[u8], data: &[u8]) {
    let f = p.open(path, OpenOptions::create_write(0o644)).unwrap();
    assert_eq!(p.write_at(&f, 0, data).unwrap(), data.len());
    p.close(f).unwrap();
}

fn read(p: &PathFs, path: &[u8]) -> Vec<u8> {
    let f = p.open(path, OpenOptions::default()).unwrap();
    let size = p.fs().getattr(f.ino()).unwrap().size;
    let data = p.read_at(&f, 0, size as u32 + 10).unwrap();
    p.close(f).unwrap();
    data
}

fn ino(img: &Img, path: &[u8]) -> InodeId {
    img.with_fs(|p| p.lstat(path).unwrap().ino)
}

/// Rewrites the u32 at `at` inside the stat of a value (inline entry: stat after tag + id;
/// inode record: after the tag). Stat layout: mode, uid, gid, nlink u32, size u64, ...
fn patch(kv: &dyn KvStore, tree: &str, key: &[u8], at: usize, bytes: &[u8]) {
    let t = kv.tree(tree).unwrap();
    let mut v = kv.get(t, key).unwrap().expect("key to patch");
    let stat = if v[0] == 1 { 9 } else { 1 };
    v[stat + at..stat + at + bytes.len()].copy_from_slice(bytes);
    let mut b = WriteBatch::new();
    b.put(t, key.to_vec(), v);
    kv.write(b, WriteOptions::SYNC).unwrap();
}

const NLINK: usize = 12;
const SIZE: usize = 16;
/// Offset of `rdev` in the stat: a regular file's stored-block count + 1.
const RDEV: usize = 60;

fn put(kv: &dyn KvStore, tree: &str, key: Vec<u8>, value: Vec<u8>) {
    let t = kv.tree(tree).unwrap();
    let mut b = WriteBatch::new();
    b.put(t, key, value);
    kv.write(b, WriteOptions::SYNC).unwrap();
}

fn delete(kv: &dyn KvStore, tree: &str, key: Vec<u8>) {
    let t = kv.tree(tree).unwrap();
    let mut b = WriteBatch::new();
    b.delete(t, key);
    kv.write(b, WriteOptions::SYNC).unwrap();
}

fn root_key(name: &[u8]) -> Vec<u8> {
    schema::named_key(InodeId::ROOT, name)
}

#[test]
fn fresh_image_is_clean() {
    let img = Img::new();
    let (code, out) = fsck(&img.path, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" 0 problems"), "{out}");
    let (code, out) = fsck(&img.path, true);
    assert_eq!(code, 0, "nothing to repair:\n{out}");
    img.assert_intact();
}

#[test]
fn wrong_link_counts_are_set_from_the_entries() {
    let img = Img::new();
    let d = ino(&img, b"/d");
    img.with_kv(|kv| {
        // A file with one name claiming 7, and a directory claiming 9.
        patch(
            kv,
            "fs.dentry",
            &schema::named_key(d, b"keep"),
            NLINK,
            &7u32.to_be_bytes(),
        );
        patch(kv, "fs.dentry", &root_key(b"d"), NLINK, &9u32.to_be_bytes());
    });
    let fixed = img.check_repair_clean("S3");
    assert!(fixed.contains("S4"), "{fixed}");
    img.with_fs(|p| {
        assert_eq!(p.stat(b"/d/keep").unwrap().nlink, 1);
        assert_eq!(p.stat(b"/d").unwrap().nlink, 3);
    });
}

#[test]
fn hard_link_count_is_repaired_in_the_inode_record() {
    let img = Img::new();
    img.with_fs(|p| {
        write(p, b"/h1", b"linked");
        p.link(b"/h1", b"/d/h2").unwrap();
    });
    let h = ino(&img, b"/h1");
    img.with_kv(|kv| {
        patch(
            kv,
            "fs.inode",
            &schema::id_key(h),
            NLINK,
            &1u32.to_be_bytes(),
        )
    });
    img.check_repair_clean("S3");
    img.with_fs(|p| {
        assert_eq!(p.stat(b"/h1").unwrap().nlink, 2);
        assert_eq!(read(p, b"/d/h2"), b"linked");
    });
}

#[test]
fn entries_naming_missing_inodes_are_removed() {
    let img = Img::new();
    img.with_fs(|p| {
        write(p, b"/h1", b"gone soon");
        p.link(b"/h1", b"/d/h2").unwrap();
    });
    let h = ino(&img, b"/h1");
    img.with_kv(|kv| {
        // The record of a hard-linked file vanishes: both names dangle, its data is leaked.
        delete(kv, "fs.inode", schema::id_key(h));
        // And a made-up linked entry (tag 2, id, mode) for an id never allocated.
        let mut ghost = vec![2u8];
        ghost.extend_from_slice(&999_999u64.to_be_bytes());
        ghost.extend_from_slice(&0o100644u32.to_be_bytes());
        put(kv, "fs.dentry", root_key(b"ghost"), ghost);
    });
    let fixed = img.check_repair_clean("does not exist");
    assert!(
        fixed.contains("data blocks of inode"),
        "leaked data freed:\n{fixed}"
    );
    img.with_fs(|p| {
        for gone in [&b"/h1"[..], b"/d/h2", b"/ghost"] {
            assert!(p.lstat(gone).is_err());
        }
    });
    img.with_kv(|kv| {
        let data = kv.tree("fs.data").unwrap();
        let (lo, hi) = schema::blocks_from(h, 0);
        let left = kv
            .scan(
                data,
                &fern_kv::KeyRange::half_open(&lo, &hi),
                fern_kv::Direction::Forward,
                10,
            )
            .unwrap();
        assert!(left.is_empty(), "data of the removed inode left behind");
    });
}

#[test]
fn orphan_record_on_a_live_file_is_dropped_and_the_file_kept() {
    let img = Img::new();
    let keep = ino(&img, b"/d/keep");
    // Without repair, the next mount would free this live file's data.
    img.with_kv(|kv| put(kv, "fs.orphan", schema::id_key(keep), vec![]));
    img.check_repair_clean("still has names");
}

#[test]
fn pending_orphans_are_a_note_and_repair_frees_them() {
    let img = Img::new();
    // Unlinked while open, then the "daemon" dies without releasing it.
    let o = img.with_fs(|p| {
        write(p, b"/o", &[7u8; 9000]);
        let f = p.open(b"/o", OpenOptions::default()).unwrap();
        p.unlink(b"/o").unwrap();
        // Never closed: dropping a library handle leaves the file open until unmount.
        f.ino()
    });
    img.with_kv(|kv| {
        let t = kv.tree("fs.orphan").unwrap();
        assert!(kv.get(t, &schema::id_key(o)).unwrap().is_some());
    });
    let (code, out) = fsck(&img.path, false);
    assert_eq!(code, 0, "a pending orphan is not an error:\n{out}");
    assert!(out.contains("1 notes"), "{out}");
    let (code, out) = fsck(&img.path, true);
    assert_eq!(
        code, 0,
        "freeing a pending orphan corrects no error:\n{out}"
    );
    img.with_kv(|kv| {
        for tree in ["fs.orphan", "fs.inode"] {
            let t = kv.tree(tree).unwrap();
            assert!(kv.get(t, &schema::id_key(o)).unwrap().is_none(), "{tree}");
        }
        let data = kv.tree("fs.data").unwrap();
        assert!(kv.get(data, &schema::block_key(o, 0)).unwrap().is_none());
    });
    // An orphan record whose inode is gone altogether is an error, and is dropped.
    img.with_kv(|kv| put(kv, "fs.orphan", schema::id_key(InodeId(424_242)), vec![]));
    img.check_repair_clean("has no record");
}

#[test]
fn unnamed_inode_records_go_to_lost_found_or_are_freed() {
    let img = Img::new();
    img.with_fs(|p| {
        write(p, b"/h1", b"precious");
        p.link(b"/h1", b"/h2").unwrap();
        write(p, b"/e1", b"");
        p.link(b"/e1", b"/e2").unwrap();
    });
    let (h, e) = (ino(&img, b"/h1"), ino(&img, b"/e1"));
    img.with_kv(|kv| {
        for name in [&b"h1"[..], b"h2", b"e1", b"e2"] {
            delete(kv, "fs.dentry", root_key(name));
        }
    });
    let fixed = img.check_repair_clean("has a record but no name");
    assert!(fixed.contains("lost+found"), "{fixed}");
    img.with_fs(|p| {
        let moved = format!("/lost+found/#{}", h.0);
        assert_eq!(read(p, moved.as_bytes()), b"precious");
        assert_eq!(p.stat(moved.as_bytes()).unwrap().nlink, 1);
        // The empty one had nothing worth keeping.
        assert!(p.lstat(format!("/lost+found/#{}", e.0).as_bytes()).is_err());
        assert_eq!(p.stat(b"/").unwrap().nlink, 4, "root: 2 + d + lost+found");
    });
}

#[test]
fn children_of_a_lost_directory_are_recovered_into_lost_found() {
    let img = Img::new();
    let d = ino(&img, b"/d");
    img.with_kv(|kv| delete(kv, "fs.dentry", root_key(b"d")));
    // The test's own files under /d move; check them at their new place.
    let (code, out) = fsck(&img.path, false);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("which does not exist"), "{out}");
    let (code, out) = fsck(&img.path, true);
    assert_eq!(code, 1, "{out}");
    let (code, out) = fsck(&img.path, false);
    assert_eq!(code, 0, "{out}");
    img.with_fs(|p| {
        let base = format!("/lost+found/#{}", d.0);
        assert_eq!(read(p, format!("{base}/keep").as_bytes()), b"kept contents");
        assert!(p.stat(format!("{base}/sub").as_bytes()).is_ok());
        assert_eq!(p.stat(base.as_bytes()).unwrap().nlink, 3);
        assert_eq!(read(p, b"/big"), big());
        // The symlink pointed into /d: it dangles now, which is not fsck's business.
        assert_eq!(p.readlink(b"/link").unwrap(), b"d/keep");
    });
}

#[test]
fn size_below_the_stored_data_is_raised() {
    let img = Img::new();
    img.with_kv(|kv| {
        patch(
            kv,
            "fs.dentry",
            &root_key(b"big"),
            SIZE,
            &100u64.to_be_bytes(),
        )
    });
    img.check_repair_clean("S6");
}

/// D2: a stored-block count (st_blocks) that disagrees with the blocks stored is reset.
#[test]
fn a_wrong_stored_block_count_is_reset() {
    let img = Img::new();
    let blocks = |img: &Img| img.with_fs(|p| p.stat(b"/big").unwrap().blocks);
    let right = blocks(&img);
    assert_eq!(right, 13 * 8, "50,000 bytes in 4 KiB blocks");
    img.with_kv(|kv| {
        patch(
            kv,
            "fs.dentry",
            &root_key(b"big"),
            RDEV,
            &3u64.to_be_bytes(),
        )
    });
    assert_eq!(blocks(&img), 2 * 8);
    img.check_repair_clean("counts 2 stored blocks, has 13");
    assert_eq!(blocks(&img), right);
}

#[test]
fn wrong_dirparent_and_next_id_are_rewritten() {
    let img = Img::new();
    let sub = ino(&img, b"/d/sub");
    img.with_kv(|kv| {
        put(
            kv,
            "fs.dirparent",
            schema::id_key(sub),
            1u64.to_be_bytes().to_vec(),
        );
        put(
            kv,
            "fs.meta",
            b"next_id".to_vec(),
            2u64.to_be_bytes().to_vec(),
        );
    });
    let fixed = img.check_repair_clean("S2");
    assert!(fixed.contains("next_id"), "{fixed}");
    // New files get fresh ids, not ones in use.
    img.with_fs(|p| {
        write(p, b"/new", b"n");
        assert!(p.stat(b"/new").unwrap().ino.0 > sub.0);
    });
    assert_eq!(fsck(&img.path, false).0, 0);
}

#[test]
fn undecodable_entry_is_left_uncorrected_and_nothing_else_is_touched() {
    let img = Img::new();
    img.with_kv(|kv| put(kv, "fs.dentry", root_key(b"junk"), vec![9, 9, 9]));
    let (code, out) = fsck(&img.path, false);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("undecodable"), "{out}");
    let (code, out) = fsck(&img.path, true);
    assert_eq!(code, 4, "cannot be repaired safely:\n{out}");
    assert!(out.contains("cannot be repaired safely"), "{out}");
    img.assert_intact();
}

#[test]
fn unusable_targets_are_operational_errors() {
    let t = tempfile::tempdir().unwrap();
    let junk = t.path().join("junk");
    std::fs::write(&junk, vec![0x5a; 100_000]).unwrap();
    let (code, out) = fsck(&junk, false);
    assert_eq!(code, 8, "{out}");
    assert!(out.contains("fernfs mkfs"), "says what to do: {out}");
    let (code, _) = fsck(&t.path().join("missing"), true);
    assert_eq!(code, 8);
    // A locked (mounted) image is refused, not checked.
    let img = Img::new();
    let _lock = nix::fcntl::Flock::lock(
        std::fs::File::open(&img.path).unwrap(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .unwrap();
    let (code, out) = fsck(&img.path, true);
    assert_eq!(code, 8, "{out}");
    assert!(out.contains("in use"), "{out}");
}
