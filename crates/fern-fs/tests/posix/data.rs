//! File contents: writes, holes, truncate, fallocate, append, st_blocks.

use super::*;

#[test]
fn write_read_round_trip_and_sparse_holes() {
    let e = env();
    put(&e, "/f", b"hello");
    assert_eq!(get(&e, "/f"), b"hello");
    let f = e.p.open(b"/f", rw()).expect("open");
    e.p.write_at(&f, 10_000, b"xyz").expect("sparse write");
    let all = e.p.read_at(&f, 0, 20_000).expect("read");
    assert_eq!(all.len(), 10_003);
    assert_eq!(&all[..5], b"hello");
    assert!(
        all[5..10_000].iter().all(|b| *b == 0),
        "holes read as zeros"
    );
    assert_eq!(&all[10_000..], b"xyz");
    // Block 1 is a hole: only blocks 0 and 2 are stored, and the last one at its real length.
    assert_eq!(e.keys_in("fs.data"), 2);
    assert_eq!(e.p.read_at(&f, 10_003, 10).expect("read at eof"), b"");
    assert_eq!(
        e.p.read_at(&f, 9_998, 4).expect("read across hole"),
        b"\0\0xy"
    );
    e.p.close(f).expect("close");
}

#[test]
fn unaligned_writes_across_blocks() {
    let e = env();
    let f = e.p.open(b"/f", rw()).expect("open");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    e.p.write_at(&f, 4095, &data).expect("write");
    e.p.write_at(&f, 8190, b"ZZZZ").expect("overwrite");
    let mut expect = vec![0u8; 4095];
    expect.extend_from_slice(&data);
    expect[8190..8194].copy_from_slice(b"ZZZZ");
    assert_eq!(e.p.read_at(&f, 0, 1 << 20).expect("read"), expect);
    e.p.close(f).expect("close");
}

#[test]
fn truncate_down_then_up_reads_zeros() {
    let e = env();
    put(&e, "/f", &[9u8; 10_000]);
    e.p.truncate(b"/f", 5000).expect("shrink");
    assert_eq!(
        e.keys_in("fs.data"),
        2,
        "blocks past the end are range-deleted"
    );
    e.p.truncate(b"/f", 12_000).expect("grow");
    let v = get(&e, "/f");
    assert_eq!(v.len(), 12_000);
    assert!(v[..5000].iter().all(|b| *b == 9));
    assert!(
        v[5000..].iter().all(|b| *b == 0),
        "no stale bytes come back"
    );
    e.p.truncate(b"/f", 0).expect("to zero");
    assert_eq!(e.keys_in("fs.data"), 0);
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    assert_eq!(err(e.p.truncate(b"/d", 0)), libc::EISDIR);
}

#[test]
fn fallocate_modes() {
    let e = env();
    put(&e, "/f", &[5u8; 3 * 4096]);
    let f = e.p.open(b"/f", rw()).expect("open");
    e.p.fallocate(&f, 0, 0, 20_000).expect("mode 0");
    assert_eq!(e.p.stat(b"/f").expect("stat").size, 20_000);
    e.p.fallocate(&f, FALLOC_FL_KEEP_SIZE, 0, 40_000)
        .expect("keep size");
    assert_eq!(e.p.stat(b"/f").expect("stat").size, 20_000);
    e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 8192)
        .expect("punch");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 20_000);
    assert!(v[..100].iter().all(|b| *b == 5));
    assert!(v[100..8292].iter().all(|b| *b == 0));
    assert!(v[8292..12_288].iter().all(|b| *b == 5));
    assert_eq!(e.keys_in("fs.data"), 2, "the fully punched block is gone");
    assert_eq!(
        err(e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE, 0, 1)),
        libc::EOPNOTSUPP
    );
    // COLLAPSE_RANGE (8) and INSERT_RANGE (0x20) would shift every later block.
    assert_eq!(err(e.p.fallocate(&f, 0x08, 0, 4096)), libc::EOPNOTSUPP);
    assert_eq!(err(e.p.fallocate(&f, 0x20, 0, 4096)), libc::EOPNOTSUPP);
    assert_eq!(err(e.p.fallocate(&f, 0, 0, 0)), libc::EINVAL);
    e.p.close(f).expect("close");
}

/// Issue 12.8: FALLOC_FL_ZERO_RANGE zeroes a range (whole blocks dropped, partial edges
/// zeroed) and extends the size unless KEEP_SIZE.
#[test]
fn fallocate_zero_range() {
    let e = env();
    put(&e, "/f", &[5u8; 3 * 4096]);
    let f = e.p.open(b"/f", rw()).expect("open");
    let blocks = e.keys_in("fs.data");
    e.p.fallocate(&f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 100, 8192)
        .expect("zero range");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 3 * 4096);
    assert!(v[..100].iter().all(|b| *b == 5));
    assert!(v[100..8292].iter().all(|b| *b == 0));
    assert!(v[8292..].iter().all(|b| *b == 5));
    assert_eq!(
        e.keys_in("fs.data"),
        blocks - 1,
        "the whole block in the range is gone"
    );
    // Without KEEP_SIZE the size grows to the end of the range, which reads as zeros.
    e.p.fallocate(&f, FALLOC_FL_ZERO_RANGE, 12_000, 10_000)
        .expect("zero range past the end");
    let v = e.p.read_at(&f, 0, 30_000).expect("read");
    assert_eq!(v.len(), 22_000);
    assert!(v[8292..12_000].iter().all(|b| *b == 5));
    assert!(v[12_000..].iter().all(|b| *b == 0));
    assert_eq!(
        err(e.p.fallocate(
            &f,
            FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            0,
            1
        )),
        libc::EOPNOTSUPP
    );
    e.p.close(f).expect("close");
}

#[test]
fn append_writes_at_end() {
    let e = env();
    put(&e, "/log", b"one");
    let mut app = rw();
    app.flags.append = true;
    let f = e.p.open(b"/log", app).expect("open append");
    e.p.write_at(&f, 0, b",two").expect("append");
    e.p.write_at(&f, 0, b",three").expect("append");
    e.p.close(f).expect("close");
    assert_eq!(get(&e, "/log"), b"one,two,three");
    let ro = e.p.open(b"/log", OpenOptions::default()).expect("open");
    assert_eq!(err(e.p.write_at(&ro, 0, b"x")), libc::EBADF);
    e.p.close(ro).expect("close");
}

/// Issue 12.7: st_blocks counts the blocks really stored: a 100 MiB file with one byte
/// written reports one block; writes into holes, truncation and hole punching keep the count
/// exact, also for a fresh mount (the count is in the stat).
#[test]
fn st_blocks_counts_stored_blocks_of_sparse_files() {
    let mut e = env();
    let blocks = |e: &common::Env, p: &str| e.p.stat(p.as_bytes()).expect("stat").blocks;
    let f = e.p.open(b"/s", rw()).expect("create");
    e.p.write_at(&f, 100 * 1024 * 1024 - 1, b"x")
        .expect("write");
    e.p.close(f).expect("close");
    assert_eq!(e.p.stat(b"/s").expect("stat").size, 100 << 20);
    assert_eq!(blocks(&e, "/s"), 8, "one 4 KiB block");
    for round in 0..2 {
        // Fill two holes (one twice: rewriting stored data adds nothing), extend, punch.
        let f = e.p.open(b"/s", rw()).expect("open");
        e.p.write_at(&f, 0, &[1u8; 5000]).expect("write");
        e.p.write_at(&f, 0, &[2u8; 5000]).expect("rewrite");
        assert_eq!(blocks(&e, "/s"), 8 * 3, "round {round}");
        e.p.fallocate(&f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096)
            .expect("punch");
        assert_eq!(blocks(&e, "/s"), 8 * 2);
        e.p.ftruncate(&f, 8192).expect("truncate");
        assert_eq!(blocks(&e, "/s"), 8, "only block 1 is left");
        e.p.ftruncate(&f, 100 << 20).expect("extend");
        assert_eq!(blocks(&e, "/s"), 8);
        e.p.write_at(&f, (100 << 20) - 1, b"x").expect("write");
        e.p.close(f).expect("close");
        assert_eq!(blocks(&e, "/s"), 16);
        e.p.truncate(b"/s", 0).expect("truncate to 0");
        assert_eq!(blocks(&e, "/s"), 0);
        let f = e.p.open(b"/s", rw()).expect("open");
        e.p.write_at(&f, 100 * 1024 * 1024 - 1, b"x")
            .expect("write");
        e.p.close(f).expect("close");
        // A dense file counts every block; a fresh mount continues from the stored count.
        put(&e, "/dense", &[7u8; 3 * 4096 + 1]);
        assert_eq!(blocks(&e, "/dense"), 8 * 4);
        e = e.remount();
    }
    // A file without a count (an image from before it existed: rdev 0) reports what its size
    // implies, and is counted from there on.
    e.p.setattr(b"/dense", &SetAttr::default()).expect("touch");
    assert_eq!(blocks(&e, "/dense"), 8 * 4);
}
