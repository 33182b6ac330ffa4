//! Data extents through fern-fs (docs/fs-design.md §9): whole slots become extents, reads
//! see them with block rows on top, unlink frees every extent by one scan of `fs.extent`,
//! and fsck (S8) finds an extent that no row names; repair frees it, and the extents of an
//! inode that no longer exists.

mod common;
#[allow(unused_imports)]
use common::mem_store as open_store;

use fern_fs::path::OpenOptions;
use fern_fs::schema::{self, Trees};
use fern_kv::{KvStore, WriteBatch, WriteOptions};

const MIB: usize = 1 << 20;

fn rw(create: bool) -> OpenOptions {
    OpenOptions::write_only(create, 0o644)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i / 4096) as u8 ^ (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

#[test]
fn whole_slots_become_extents_and_unlink_frees_them() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    // 3 MiB + 5000 bytes from offset 0: three extents, the tail in block rows.
    let data = pattern(3 * MIB + 5000, 1);
    e.p.write_at(&f, 0, &data).expect("write");
    assert_eq!(
        e.store.extents().expect("extents").len(),
        3,
        "one extent per whole slot"
    );
    assert_eq!(e.keys_in("fs.extent"), 3);
    assert!(e.keys_in("fs.data") <= 2, "only the tail is in block rows");
    // A small unaligned write on top of an extent, then reads across the boundary.
    let mut model = data.clone();
    e.p.write_at(&f, MIB as u64 + 100, b"on top")
        .expect("small write");
    model[MIB + 100..MIB + 106].copy_from_slice(b"on top");
    let back = e.p.read_at(&f, 0, model.len() as u32).expect("read");
    assert!(back == model, "extents with rows on top read back");
    let part = e.p.read_at(&f, MIB as u64 - 10, 300).expect("read");
    assert_eq!(part, model[MIB - 10..MIB + 290].to_vec());
    // Truncate into the middle of slot 1: it is dissolved, slot 2 freed.
    e.p.ftruncate(&f, MIB as u64 + 4096 * 3 + 7)
        .expect("truncate");
    model.truncate(MIB + 4096 * 3 + 7);
    assert_eq!(e.store.extents().expect("extents").len(), 1, "slot 0 only");
    let back = e.p.read_at(&f, 0, 3 * MIB as u32).expect("read");
    assert!(back == model, "truncated content");
    e.p.close(f).expect("close");
    let report = fern_fs::check::check(&*e.store).expect("fsck");
    assert!(report.is_clean(), "fsck: {report:?}");
    e.p.unlink(b"/big").expect("unlink");
    assert!(
        e.store.extents().expect("extents").is_empty(),
        "unlink freed every extent"
    );
    assert_eq!(e.keys_in("fs.extent"), 0);
    assert!(fern_fs::check::check(&*e.store).expect("fsck").is_clean());
}

/// A small generator of offsets (the test must not depend on a crate for this).
fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

#[test]
fn small_writes_into_extents_are_blind_and_read_back() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    let mut model = pattern(4 * MIB, 3);
    e.p.write_at(&f, 0, &model).expect("write");
    assert_eq!(e.store.extents().expect("extents").len(), 4);
    // Small unaligned writes at random offsets, some across block and slot edges: each is a
    // blind overlay upsert (extent.rs E2), reading neither a row nor an extent. Before
    // overlays each read its block's whole 1 MiB extent (F5/F6, docs/BENCHMARKS.md).
    let (reads, extent_reads) = (e.store.reads(), e.store.extent_reads());
    let mut x = 7u64;
    for i in 0..300 {
        let len = 1 + lcg(&mut x) as usize % 700;
        let at = if i % 50 == 0 {
            MIB * (1 + i / 100) - len / 2
        } else {
            lcg(&mut x) as usize % (4 * MIB - len)
        };
        let bytes: Vec<u8> = (0..len).map(|j| (i + j) as u8 | 1).collect();
        e.p.write_at(&f, at as u64, &bytes).expect("small write");
        model[at..at + len].copy_from_slice(&bytes);
    }
    assert_eq!(e.store.reads() - reads, 0, "small writes read rows");
    assert_eq!(
        e.store.extent_reads() - extent_reads,
        0,
        "small writes read extents"
    );
    // A whole block put over an overlay, and an overlay over that block.
    let block = vec![0xee; 4096];
    e.p.write_at(&f, 2 * 4096, &block).expect("block write");
    model[2 * 4096..3 * 4096].copy_from_slice(&block);
    e.p.write_at(&f, 2 * 4096 + 10, b"xy").expect("small write");
    model[2 * 4096 + 10..2 * 4096 + 12].copy_from_slice(b"xy");
    let back = e.p.read_at(&f, 0, 4 * MIB as u32).expect("read");
    assert!(back == model, "overlays over extents read back");
    for _ in 0..40 {
        let (at, len) = (
            lcg(&mut x) as usize % (4 * MIB),
            1 + lcg(&mut x) as usize % 9000,
        );
        let got = e.p.read_at(&f, at as u64, len as u32).expect("read");
        assert!(
            got[..] == model[at..(at + len).min(4 * MIB)],
            "read at {at}+{len}"
        );
    }
    // A punch and a truncate that cut slots dissolve them, overlays included (E3).
    let (ps, pe) = (MIB + 3000, MIB + 70_000);
    e.p.fallocate(
        &f,
        fern_fs::FALLOC_FL_PUNCH_HOLE | fern_fs::FALLOC_FL_KEEP_SIZE,
        ps as u64,
        (pe - ps) as u64,
    )
    .expect("punch");
    model[ps..pe].fill(0);
    e.p.ftruncate(&f, 3 * MIB as u64 - 5555).expect("truncate");
    model.truncate(3 * MIB - 5555);
    let back = e.p.read_at(&f, 0, 4 * MIB as u32).expect("read");
    assert!(back == model, "after punch and truncate");
    e.p.close(f).expect("close");
    let report = fern_fs::check::check(&*e.store).expect("fsck");
    assert!(report.is_clean(), "fsck: {report:?}");
    let e = e.remount();
    let f = e.p.open(b"/big", rw(false)).expect("open");
    let back = e.p.read_at(&f, 0, 4 * MIB as u32).expect("read");
    assert!(back == model, "after remount");
}

#[test]
fn a_read_write_mount_upgrades_a_version_1_image_before_it_can_write_an_overlay() {
    let e = common::env();
    let t = Trees::open(&*e.store).expect("trees");
    let sb = |kv: &dyn KvStore| {
        schema::Superblock::decode(&kv.get(t.meta, schema::SUPER_KEY).unwrap().unwrap())
            .expect("superblock")
    };
    let mut v1 = sb(&*e.store);
    assert_eq!(v1.version, schema::FORMAT_VERSION);
    v1.version = 1;
    let mut b = WriteBatch::new();
    b.put(t.meta, schema::SUPER_KEY.to_vec(), v1.encode());
    e.store.write(b, WriteOptions::SYNC).expect("write");
    let store = e.store.clone();
    drop(e);
    // Read-only: mounted as it is, nothing written.
    drop(fern_fs::Fs::mount_read_only(store.clone()).expect("read-only mount"));
    assert_eq!(sb(&*store).version, 1);
    drop(fern_fs::Fs::mount(store.clone()).expect("mount"));
    assert_eq!(sb(&*store).version, schema::FORMAT_VERSION);
    // A version this code does not know is refused, not guessed at.
    let mut v9 = v1;
    v9.version = schema::FORMAT_VERSION + 1;
    assert!(schema::Superblock::decode(&v9.encode()).is_err());
}

#[test]
fn fsck_finds_a_leaked_extent() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    e.p.write_at(&f, 0, &pattern(MIB, 2)).expect("write");
    e.p.close(f).expect("close");
    assert!(fern_fs::check::check(&*e.store).expect("fsck").is_clean());
    // An extent whose row is deleted in the same batch without freeing it: live, unnamed.
    let t = Trees::open(&*e.store).expect("trees");
    let xt = t.extent.expect("the memory store has extents");
    let mut b = WriteBatch::new();
    let key = schema::extent_key(fern_fs::InodeId(999_999), 0);
    b.put_extent(xt, key.clone(), &[schema::EXTENT_TAG], pattern(MIB, 3));
    b.delete(xt, key);
    e.store.write(b, WriteOptions::SYNC).expect("write");
    let report = fern_fs::check::check(&*e.store).expect("fsck");
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.code == "S8" && f.message.contains("leaked")),
        "fsck must report the leaked extent: {report:?}"
    );
    // Repair frees the leaked extent and keeps the file's own.
    let before = e.store.extents().expect("extents").len();
    let fixed = fern_fs::check::repair(&*e.store).expect("repair");
    assert!(fixed.after.is_clean(), "after repair: {:?}", fixed.after);
    assert_eq!(
        e.store.extents().expect("extents").len(),
        before - 1,
        "the leaked extent is freed, the file's kept"
    );
    let f = e.p.open(b"/big", OpenOptions::default()).expect("open");
    let back = e.p.read_at(&f, 0, MIB as u32).expect("read");
    assert!(back == pattern(MIB, 2), "the file's extent is untouched");
}

#[test]
fn fsck_repair_frees_the_extents_of_a_dead_inode() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    e.p.write_at(&f, 0, &pattern(3 * MIB, 4)).expect("write");
    e.p.close(f).expect("close");
    let keep = e.p.open(b"/keep", rw(true)).expect("create");
    e.p.write_at(&keep, 0, &pattern(MIB, 5)).expect("write");
    e.p.close(keep).expect("close");
    assert_eq!(e.store.extents().expect("extents").len(), 4);
    // The file's entry (its inline stat) goes, its extent rows stay: an inode that does not
    // exist holding three extents.
    let t = Trees::open(&*e.store).expect("trees");
    let mut b = WriteBatch::new();
    b.delete(t.dentry, schema::named_key(fern_fs::InodeId::ROOT, b"big"));
    e.store.write(b, WriteOptions::SYNC).expect("write");
    let report = fern_fs::check::check(&*e.store).expect("fsck");
    assert!(!report.is_clean(), "fsck sees the dead inode's extents");
    let fixed = fern_fs::check::repair(&*e.store).expect("repair");
    assert!(fixed.after.is_clean(), "after repair: {:?}", fixed.after);
    assert_eq!(
        e.store.extents().expect("extents").len(),
        1,
        "the dead inode's extents are freed, /keep's kept"
    );
    assert_eq!(e.keys_in("fs.extent"), 1, "and their rows deleted");
    let keep = e.p.open(b"/keep", OpenOptions::default()).expect("open");
    let back = e.p.read_at(&keep, 0, MIB as u32).expect("read");
    assert!(
        back == pattern(MIB, 5),
        "the live file's extent is untouched"
    );
}

/// `read_into` reuses the caller's buffer (the FUSE adapter keeps one per thread): bytes a
/// previous read left there never show through a hole, and reads through the extent cache,
/// whose dropped buffers are recycled, keep returning each extent's own bytes.
#[test]
fn read_into_a_reused_buffer_shows_no_stale_bytes() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    // Slots 0-9 in extents, then a hole of one slot, then 4 KiB of block rows.
    let data = pattern(10 * MIB, 7);
    e.p.write_at(&f, 0, &data).expect("write");
    e.p.write_at(&f, 11 * MIB as u64, &[9u8; 4096])
        .expect("write");
    // Open while read by inode number (a closed, unlooked-up inode is forgotten).
    let ino = f.ino();
    let mut buf = vec![0xAB; 2 * MIB];
    // Requests of 128 KiB across every slot (each extent read once, then from the cache).
    read_pieces(&e, ino, 0, 10 * MIB, &data, &mut buf);
    // The hole, then past the end: zeros and a short read, whatever the buffer held.
    buf.iter_mut().for_each(|b| *b = 0xCD);
    e.fs.read_into(ino, 10 * MIB as u64, MIB as u32, &mut buf)
        .expect("read hole");
    assert!(
        buf.len() == MIB && buf.iter().all(|&b| b == 0),
        "a hole reads as zeros"
    );
    e.fs.read_into(ino, 11 * MIB as u64, MIB as u32, &mut buf)
        .expect("read tail");
    assert_eq!(buf, vec![9u8; 4096], "short read at the end of file");
    e.p.close(f).expect("close");
}

/// Slot-sized writes one after another: on the fern-tree store each one fills the buffer the
/// previous extent was written from (`KvStore::extent_buffer`); every extent must still read
/// back as written, and the ones written over as their last write.
#[test]
fn extents_written_one_after_another_read_back() {
    let e = common::env();
    let f = e.p.open(b"/seq", rw(true)).expect("create");
    let mut model = vec![0u8; 6 * MIB];
    for (round, slot) in [0usize, 1, 2, 3, 4, 5, 2, 4].into_iter().enumerate() {
        let data = pattern(MIB, 40 + round as u8);
        e.p.write_at(&f, (slot * MIB) as u64, &data).expect("write");
        model[slot * MIB..(slot + 1) * MIB].copy_from_slice(&data);
    }
    assert_eq!(e.store.extents().expect("extents").len(), 6);
    let back = e.p.read_at(&f, 0, 6 * MIB as u32).expect("read");
    assert!(back == model, "every extent reads back as last written");
    e.p.close(f).expect("close");
    assert!(fern_fs::check::check(&*e.store).expect("fsck").is_clean());
}

/// Reads `ino`'s bytes `[from, to)` in 128 KiB requests, as FUSE sends them, into `buf`
/// (reused, as the FUSE adapter reuses its own): every piece must equal `model` there.
fn read_pieces(
    e: &common::Env,
    ino: fern_fs::InodeId,
    from: usize,
    to: usize,
    model: &[u8],
    buf: &mut Vec<u8>,
) {
    for off in (from..to).step_by(128 << 10) {
        e.fs.read_into(ino, off as u64, 128 << 10, buf)
            .expect("read");
        assert!(*buf == model[off..off + (128 << 10)], "bytes at {off}");
    }
}

/// A reader going through a file in order has the next extents read for it by the read-ahead
/// threads (extent_cache.rs), each extent read once in all; a reader jumping around has none.
#[test]
fn a_sequential_reader_has_each_next_extent_read_ahead_once() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    let data = pattern(8 * MIB, 3);
    e.p.write_at(&f, 0, &data).expect("write");
    e.p.close(f).expect("close");
    // A fresh mount: nothing cached.
    let e = e.remount();
    let f = e.p.open(b"/big", rw(false)).expect("open");
    let (reads, ahead) = (e.store.extent_reads(), e.store.extent_reads_ahead());
    read_pieces(&e, f.ino(), 0, 8 * MIB, &data, &mut Vec::new());
    assert_eq!(
        e.store.extent_reads() - reads,
        8,
        "every extent read exactly once"
    );
    assert_eq!(
        e.store.extent_reads_ahead() - ahead,
        6,
        "all but the first two read ahead (reads in order start in the second slot)"
    );
    e.p.close(f).expect("close");

    // Out of order, on a fresh mount: every extent read by the request that wants it.
    let e = e.remount();
    let f = e.p.open(b"/big", rw(false)).expect("open");
    let (reads, ahead) = (e.store.extent_reads(), e.store.extent_reads_ahead());
    for slot in [5, 2, 7, 0, 3] {
        read_pieces(
            &e,
            f.ino(),
            slot * MIB,
            slot * MIB + (256 << 10),
            &data,
            &mut Vec::new(),
        );
    }
    assert_eq!(e.store.extent_reads() - reads, 5);
    assert_eq!(e.store.extent_reads_ahead(), ahead, "no read ahead");
    e.p.close(f).expect("close");
}

/// An extent replaced after it was read ahead is never served from the cache: the cache is
/// keyed by reference, and the file's row names the new extent.
#[test]
fn an_extent_rewritten_after_its_read_ahead_reads_as_rewritten() {
    let e = common::env();
    let f = e.p.open(b"/big", rw(true)).expect("create");
    let mut model = pattern(8 * MIB, 5);
    e.p.write_at(&f, 0, &model).expect("write");
    let ino = f.ino();
    // Into slot 1: read-ahead of slots 2-5 asked.
    read_pieces(&e, ino, 0, MIB + (256 << 10), &model, &mut Vec::new());
    // Slot 3 written anew (a new extent; the old one freed), slot 4 in part (an overlay).
    let new = pattern(MIB, 77);
    e.p.write_at(&f, 3 * MIB as u64, &new).expect("rewrite");
    model[3 * MIB..4 * MIB].copy_from_slice(&new);
    e.p.write_at(&f, 4 * MIB as u64 + 100, b"on top")
        .expect("small write");
    model[4 * MIB + 100..4 * MIB + 106].copy_from_slice(b"on top");
    read_pieces(&e, ino, MIB + (256 << 10), 8 * MIB, &model, &mut Vec::new());
    e.p.close(f).expect("close");
    assert!(fern_fs::check::check(&*e.store).expect("fsck").is_clean());
}

/// `read_to` writes every byte it returns, whatever the buffer held (data.rs D3): extents,
/// zeros between them (a hole slot, a punched block) and block rows on top.
#[test]
fn read_to_writes_every_byte_of_a_dirty_buffer() {
    let e = common::env();
    let f = e.p.open(b"/holes", rw(true)).expect("create");
    // Slots 0, 1 and 3 in extents, slot 2 a hole, then a short tail in block rows.
    let mut model = vec![0u8; 4 * MIB + 1000];
    for slot in [0usize, 1, 3] {
        let data = pattern(MIB, slot as u8);
        e.p.write_at(&f, (slot * MIB) as u64, &data).expect("write");
        model[slot * MIB..(slot + 1) * MIB].copy_from_slice(&data);
    }
    e.p.write_at(&f, 4 * MIB as u64, &[3u8; 1000])
        .expect("tail");
    model[4 * MIB..].fill(3);
    // A block of slot 1 written small on top (an overlay row over the extent).
    e.p.write_at(&f, MIB as u64 + 5000, b"over")
        .expect("small write");
    model[MIB + 5000..MIB + 5004].copy_from_slice(b"over");
    let ino = f.ino();
    let mut buf = vec![0xEE; 5 * MIB];
    for (offset, size) in [
        (0, 5 * MIB),
        (MIB - 4096, 2 * MIB),
        (2 * MIB + 100, MIB),
        (3 * MIB + 7, MIB + 2000),
        (4 * MIB, 4096),
    ] {
        buf.fill(0xEE);
        let n =
            e.fs.read_to(ino, offset as u64, size as u32, &mut buf)
                .expect("read_to");
        let want = &model[offset..(offset + size).min(model.len())];
        assert_eq!(n, want.len(), "length at {offset}");
        assert!(buf[..n] == *want, "bytes at {offset}..+{size}");
    }
    // A buffer too small for what the file has there is refused, not filled short.
    assert!(e.fs.read_to(ino, 0, MIB as u32, &mut buf[..4096]).is_err());
    e.p.close(f).expect("close");
}
