//! `fernfs fsck` (without `--repair`), `fernfs stat` and `fernfs export` never change the image
//! they read (engine invariant W11, issue 11 defect 4): the file's bytes, length, allocated
//! blocks and mtime are the same afterwards, on a clean image, on one whose log was never
//! replayed (a killed process), and on damaged ones. Also what fsck says about each damage:
//! a garbage header slot (exit 1, "header slot B unreadable, using A"), two damaged nodes (both
//! reported, exit 4), a damaged log record (exit 4, naming it).
//!
//! The images start from the committed fixtures (tests/fixtures, format 1).

use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs};
use fern_kv_tree::TreeStore;
use fern_tree::blockfile::BlockFile;
use fern_tree::device::MemDevice;

mod common;
use common::{run, text, unpack_fixture};

/// Everything a write could change: content hash, length, allocated blocks, mtime.
fn fingerprint(img: &Path) -> (u64, u64, u64, i64, i64) {
    let mut h = std::hash::DefaultHasher::new();
    let mut f = std::fs::File::open(img).expect("open");
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    let m = std::fs::metadata(img).expect("metadata");
    (h.finish(), m.len(), m.blocks(), m.mtime(), m.mtime_nsec())
}

/// Offsets (in the image file) of the log frames: headers with the magic in the log region.
fn log_frames(img: &Path) -> Vec<u64> {
    let bytes = std::fs::read(img).expect("read image");
    let bf = BlockFile::open(Arc::new(MemDevice::from_bytes(bytes.clone()))).expect("block file");
    let log = bf
        .file
        .live_blocks()
        .map(|(_, l)| l)
        .max_by_key(|l| l.len)
        .expect("log region");
    let (lo, hi) = (log.offset as usize, log.offset as usize + log.len as usize);
    bytes[lo..hi]
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"FWAL")
        .map(|(i, _)| (lo + i) as u64)
        .collect()
}

fn flip(img: &Path, at: u64, mask: u8) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .expect("open");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read byte");
    f.write_all_at(&[b[0] ^ mask], at).expect("write byte");
}

/// Runs fsck, stat and export on `img`; asserts the image did not change; returns fsck's exit
/// code and output.
fn read_commands_leave_it_alone(img: &Path, dir: &Path) -> (i32, String) {
    let before = fingerprint(img);
    let fsck = run(&["fsck".as_ref(), img.as_os_str()]);
    assert_eq!(fingerprint(img), before, "fsck changed {}", img.display());
    let stat = run(&["stat".as_ref(), img.as_os_str()]);
    assert_eq!(fingerprint(img), before, "stat changed {}", img.display());
    let out = dir.join(format!(
        "export-{}",
        img.file_name().expect("name").to_string_lossy()
    ));
    let export = run(&["export".as_ref(), img.as_os_str(), out.as_os_str()]);
    assert_eq!(fingerprint(img), before, "export changed {}", img.display());
    // A readable image is read completely by all three.
    if fsck.status.code() == Some(0) {
        assert!(stat.status.success(), "{}", text(&stat));
        assert!(export.status.success(), "{}", text(&export));
    }
    (fsck.status.code().unwrap_or(-1), text(&fsck))
}

#[test]
fn clean_and_unreplayed_images_are_not_written() {
    let t = tempfile::tempdir().expect("tempdir");
    for name in ["fs-v1-clean", "fs-v1-unreplayed"] {
        let img = unpack_fixture(name, t.path());
        let (code, out) = read_commands_leave_it_alone(&img, t.path());
        assert_eq!(code, 0, "{name}:\n{out}");
        assert!(out.contains(" 0 problems"), "{out}");
    }
    // The replay a read-only open did in memory is what a read-write open makes durable: the
    // unreplayed image's `late` file was exported above.
    let late = t.path().join("export-fs-v1-unreplayed.img/late");
    assert!(late.exists(), "the log was replayed in memory");
}

#[test]
fn garbage_header_slot_is_reported_not_written() {
    let t = tempfile::tempdir().expect("tempdir");
    let img = unpack_fixture("fs-v1-clean", t.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .expect("open");
    f.write_all_at(&[0xA5; 56], 4096 + 16).expect("garbage");
    drop(f);
    let (code, out) = read_commands_leave_it_alone(&img, t.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("header slot B unreadable"), "{out}");
    assert!(out.contains("using A"), "{out}");
    // --repair rewrites the slot; then the image is clean.
    let r = run(&["fsck".as_ref(), img.as_os_str(), "--repair".as_ref()]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    let r = run(&["fsck".as_ref(), img.as_os_str()]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r));
}

/// The clean fixture unpacked, and its node blocks, smallest first (the log region left out).
fn clean_with_nodes(dir: &Path) -> (PathBuf, Vec<fern_tree::blockfile::BlockLoc>) {
    let img = unpack_fixture("fs-v1-clean", dir);
    let bytes = std::fs::read(&img).expect("read");
    let bf = BlockFile::open(Arc::new(MemDevice::from_bytes(bytes))).expect("block file");
    let mut blocks: Vec<_> = bf.file.live_blocks().map(|(_, l)| l).collect();
    blocks.sort_by_key(|l| l.len);
    blocks.pop(); // the log region
    (img, blocks)
}

#[test]
fn every_damaged_node_is_reported_not_written() {
    let t = tempfile::tempdir().expect("tempdir");
    let (img, blocks) = clean_with_nodes(t.path());
    assert!(blocks.len() >= 2, "{blocks:?}");
    // Each tree of this small file system is one node: damage two of them, mid-block.
    for l in &blocks[blocks.len() - 2..] {
        flip(&img, l.offset + u64::from(l.len) / 2, 0x04);
    }
    let (code, out) = read_commands_leave_it_alone(&img, t.path());
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(" 2 damaged"),
        "both damaged nodes are reported:\n{out}"
    );
    assert_eq!(out.matches("  engine tree ").count(), 2, "{out}");
}

/// With the directory entries intact, fsck names the files a damaged node holds.
#[test]
fn damaged_data_node_names_its_files() {
    let t = tempfile::tempdir().expect("tempdir");
    let (img, blocks) = clean_with_nodes(t.path());
    // The largest node is the data tree's (20,000 bytes of sub/b).
    let l = blocks.last().expect("a node");
    flip(&img, l.offset + u64::from(l.len) / 2, 0x04);
    let (code, out) = read_commands_leave_it_alone(&img, t.path());
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("engine tree \"fs.data\""), "{out}");
    assert!(
        out.contains("affects data or attributes of /sub/b"),
        "{out}"
    );
    assert!(out.contains("affects data or attributes of /a"), "{out}");
}

/// The clean fixture opened by this build, six files written and fsynced one by one, then the
/// process lost (handles forgotten; no background threads, so nothing writes afterwards): a
/// current-format image whose log holds records and sync marks.
fn killed_image(dir: &Path) -> PathBuf {
    let img = unpack_fixture("fs-v1-clean", dir);
    let killed = dir.join("killed.img");
    std::fs::rename(&img, &killed).expect("rename");
    let opts = fern_tree::Options {
        cache_bytes: 16 << 20,
        sync_interval: None,
        checkpoint_thread: false,
        ..fern_tree::Options::default()
    };
    let store = Arc::new(TreeStore::open_with(&killed, opts, fern_fs::registry()).expect("open"));
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    let p = PathFs::new(fs.clone(), Cred::root());
    for i in 0..6 {
        let f = p
            .open(
                format!("/k{i}").as_bytes(),
                OpenOptions::create_write(0o644),
            )
            .expect("create");
        p.write_at(&f, 0, format!("file {i}\n").as_bytes())
            .expect("write");
        p.fsync(&f).expect("fsync");
        p.close(f).expect("close");
    }
    std::mem::forget(p);
    std::mem::forget(fs);
    std::mem::forget(store);
    killed
}

#[test]
fn killed_image_is_not_written() {
    let t = tempfile::tempdir().expect("tempdir");
    let img = killed_image(t.path());
    let (code, out) = read_commands_leave_it_alone(&img, t.path());
    assert_eq!(code, 0, "{out}");
    let k5 = t.path().join("export-killed.img/k5");
    assert_eq!(std::fs::read(k5).expect("k5 exported"), b"file 5\n");
}

#[test]
fn damaged_log_is_reported_not_written() {
    let t = tempfile::tempdir().expect("tempdir");
    let img = killed_image(t.path());
    let frames = log_frames(&img);
    assert!(frames.len() >= 12, "{frames:?}");
    // The payload of the first record after the checkpoint: the sync marks after it prove
    // it durable.
    flip(&img, frames[0] + 36 + 3, 0x10);
    let (code, out) = read_commands_leave_it_alone(&img, t.path());
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("log record at LSN"), "{out}");
    assert!(out.contains("--repair"), "{out}");
}
