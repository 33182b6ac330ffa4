//! Directed tests of the log's edge cases: a damaged tail is cut (W4), damage followed by records
//! that prove it was durable is an error naming the record (W4), an unregistered upsert in the
//! log fails the open, a batch larger than half the log is refused, and a log that fills keeps
//! checkpointing instead of overwriting needed records (W5); log space no checkpoint needs is
//! returned without losing a needed record (W9).

use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::MemDevice;
use fern_tree::{Durability, Env, Error, Options, UpsertId, WriteBatch};

mod common;
use common::log_region;

fn options() -> Options {
    Options {
        log_bytes: 64 << 10,
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

/// An image whose log holds, after the checkpoint at LSN 0: the creation of tree "t" (a 7-byte
/// payload at LSN 0, so the first batch is at LSN 43) and `n` Sync inserts of `k<i>`.
fn image_with_log(n: u32) -> Vec<u8> {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    for i in 0..n {
        let mut b = WriteBatch::new();
        b.insert(&t, format!("k{i}").as_bytes(), &[i as u8; 10]);
        env.write_with(b, Durability::Sync).expect("commit");
    }
    let image = mem.snapshot();
    // A crash: no close, no checkpoint; the log holds everything.
    std::mem::forget(t);
    std::mem::forget(env);
    image
}

fn keys(env: &Env) -> Vec<Vec<u8>> {
    env.tree("t")
        .expect("tree")
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan")
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn intact_log_replays_everything() {
    let env = Env::open_on(
        Arc::new(MemDevice::from_bytes(image_with_log(5))),
        options(),
    )
    .expect("open");
    assert_eq!(keys(&env).len(), 5);
}

/// The frames of an image's log from LSN 0 (the tests' logs do not wrap): (LSN, framed length,
/// whether it is a sync mark).
fn frames(image: &[u8]) -> Vec<(u64, u64, bool)> {
    let log = log_region(image);
    let mut out = Vec::new();
    let mut lsn = 0u64;
    loop {
        let at = (log.offset + lsn) as usize;
        let Some(h) = fern_tree::wal::decode_frame_header(&image[at..at + 36], fern_tree::Lsn(lsn))
        else {
            return out;
        };
        let framed = 36 + u64::from(h.len);
        let mark = image[at + 36] == 3;
        out.push((lsn, framed, mark));
        lsn += framed;
    }
}

/// W4/W10: every Sync commit is followed by a sync mark (two frames, the second on a 512-byte
/// boundary); a damaged last frame (the last mark, which nothing proves durable) is a torn
/// tail: cut, every record replayed.
#[test]
fn damaged_last_frame_is_a_torn_tail() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    let f = frames(&image);
    let &(last, len, mark) = f.last().expect("frames");
    assert!(mark, "the last frame is the mark of the last sync: {f:?}");
    assert_eq!(
        f.iter().filter(|x| x.2).count(),
        10,
        "one mark (two frames) per Sync commit"
    );
    image[(log.offset + last + len - 1) as usize] ^= 0x40;
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(keys(&env).len(), 5, "every record replayed");
}

/// Opening `image` fails with a checksum error naming the log record at LSN `rec`: damage to a
/// record proven durable is never cut silently (W4).
fn assert_refused_naming(image: Vec<u8>, rec: u64) {
    match Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()) {
        Err(Error::Checksum { what, .. }) => {
            assert!(
                what.contains(&format!("log record at LSN {rec} ")),
                "{what}"
            )
        }
        Err(e) => panic!("expected a checksum error, got {e}"),
        Ok(_) => panic!("a damaged synced record was cut silently"),
    }
}

/// W4/W10: the last Sync commit's record is proven durable by the mark after it, so damage to
/// it is an error naming it, not a cut (before sync marks this lost the commit silently).
#[test]
fn damaged_last_synced_record_is_refused() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    let f = frames(&image);
    let &(rec, len, mark) = &f[f.len() - 3];
    assert!(!mark);
    image[(log.offset + rec + len - 1) as usize] ^= 0x40;
    assert_refused_naming(image, rec);
}

/// W4: a damaged frame *header* hides the chain; the scan searches for the frames after it.
#[test]
fn damaged_header_is_found_by_searching_forward() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    let f = frames(&image);
    let (rec, _, _) = f[3];
    image[(log.offset + rec + 5) as usize] ^= 0x01; // the length field
    assert_refused_naming(image, rec);
}

/// Repair: `cut_damaged_log` opens at the damage, keeps everything before it and reports what
/// it dropped; the image then opens normally.
#[test]
fn repair_cuts_at_the_damage_and_reports_it() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    let f = frames(&image);
    // The third batch: records are create, b0, b1, b2, ... (marks between them).
    let i = f
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.2)
        .nth(3)
        .map(|(i, _)| i)
        .expect("a third batch");
    let (rec, _, _) = f[i];
    image[(log.offset + rec + 40) as usize] ^= 0x08;
    let mem = Arc::new(MemDevice::from_bytes(image));
    let env = Env::open_on(
        mem.clone(),
        Options {
            cut_damaged_log: true,
            ..options()
        },
    )
    .expect("repair open");
    let cut = env.recovery().log_cut.expect("a cut is reported");
    assert_eq!(cut.at.0, rec);
    assert_eq!(cut.records_dropped, (f.len() - i - 1) as u64, "{cut:?}");
    assert_eq!(cut.to.0, f.last().map(|x| x.0 + x.1).expect("frames"));
    assert_eq!(keys(&env), vec![b"k0".to_vec(), b"k1".to_vec()]);
    env.close().expect("close");
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(mem.snapshot())), options())
        .expect("opens after the repair");
    assert_eq!(keys(&env).len(), 2);
    assert!(env.recovery().log_cut.is_none());
}

/// W4: damage followed by records whose `synced` field shows it was durable is an error that
/// names the record, not a silent cut.
#[test]
fn damage_before_durable_records_is_an_error() {
    let mut image = image_with_log(5);
    let log = log_region(&image);
    // The first batch (LSN 43): its payload starts at 43 + 36.
    image[(log.offset + 43 + 36 + 20) as usize] ^= 0x01;
    match Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()) {
        Err(Error::Checksum { what, .. }) => {
            assert!(what.contains("log record at LSN 43"), "{what}")
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
}

/// Recovery runs upserts through the registered functions; a log naming an unregistered one
/// fails the open instead of dropping the update.
#[test]
fn replay_needs_the_upsert_functions() {
    let mut o = options();
    o.register_upsert(
        UpsertId(9),
        Arc::new(|_, old, arg| {
            let mut v = old.unwrap_or_default().to_vec();
            v.extend_from_slice(arg);
            Some(v)
        }),
    );
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), o.clone()).expect("create");
    let t = env.tree("t").expect("tree");
    t.upsert(b"c", UpsertId(9), b"ab").expect("upsert");
    t.upsert(b"c", UpsertId(9), b"cd").expect("upsert");
    env.sync().expect("sync");
    let image = mem.snapshot();
    std::mem::forget(t);
    std::mem::forget(env);
    let err = Env::open_on(Arc::new(MemDevice::from_bytes(image.clone())), options());
    assert!(matches!(err, Err(Error::UnknownUpsert(9))), "{err:?}");
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), o).expect("open");
    assert_eq!(
        env.tree("t").expect("tree").get(b"c").expect("get"),
        Some(b"abcd".to_vec())
    );
}

/// A batch larger than half the log region is refused without poisoning; a log that fills
/// up makes writers checkpoint (W5) and nothing needed is overwritten.
#[test]
fn oversized_batches_and_full_logs() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    let big = vec![1u8; 40 << 10];
    assert!(matches!(
        t.insert(b"big", &big),
        Err(Error::InvalidArgument(_))
    ));
    // Many times the log's size, each batch a tenth of it.
    let v = vec![2u8; 6 << 10];
    for i in 0..100u32 {
        t.insert(format!("v{i:03}").as_bytes(), &v).expect("insert");
    }
    env.sync().expect("sync");
    assert!(
        env.stats().log_end.0 > 8 * (64 << 10),
        "the log wrapped several times"
    );
    let image = mem.snapshot();
    std::mem::forget(t);
    std::mem::forget(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(keys(&env).len(), 100);
}

// ---------------------------------------------------------------------------------------------
// W9: log space below the older checkpoint's LSN goes back to the device (a punched hole),
// and that never costs a record recovery needs: after checkpoints with writers around them,
// after a close (both headers then name the final state, so either alone opens it complete),
// and after the log wrapped over punched space. The seeded crash test (tests/crash.rs) cuts the
// power inside these punches too.

fn nonzero_log_bytes(image: &[u8]) -> usize {
    let log = log_region(image);
    image[log.offset as usize..(log.offset + u64::from(log.len)) as usize]
        .iter()
        .filter(|&&b| b != 0)
        .count()
}

fn all_rows(env: &Env) -> Vec<(Vec<u8>, Vec<u8>)> {
    env.tree("t")
        .expect("tree")
        .range_vec(Bound::Unbounded, Bound::Unbounded)
        .expect("scan")
}

fn write_range(env: &Env, from: u32, to: u32) {
    let t = env.tree("t").expect("tree");
    for i in from..to {
        let mut b = WriteBatch::new();
        b.insert(&t, format!("k{i:05}").as_bytes(), &[i as u8; 3000]);
        env.write_with(b, Durability::Sync).expect("commit");
    }
}

fn expected(n: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| (format!("k{i:05}").into_bytes(), vec![i as u8; 3000]))
        .collect()
}

/// A clean close leaves no log bytes allocated, and either header alone opens the full state.
#[test]
fn close_returns_the_whole_log_and_both_headers_hold_the_state() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    write_range(&env, 0, 60); // ~180 KiB of records: the 64 KiB region wraps
    env.close().expect("close");
    let image = mem.snapshot();
    assert_eq!(nonzero_log_bytes(&image), 0, "the log region is all holes");
    let env =
        Env::open_on(Arc::new(MemDevice::from_bytes(image.clone())), options()).expect("open");
    assert_eq!(all_rows(&env), expected(60));
    drop(env);
    // B2: damage either header slot; the other one must open the same, complete state (no
    // log records are left to replay from an older checkpoint).
    for slot in 0..2usize {
        let mut damaged = image.clone();
        damaged[slot * 4096 + 20] ^= 0xff;
        let env = Env::open_on(Arc::new(MemDevice::from_bytes(damaged)), options())
            .unwrap_or_else(|e| panic!("open with slot {slot} damaged: {e}"));
        assert_eq!(all_rows(&env), expected(60), "slot {slot} damaged");
    }
}

/// Two checkpoints with no write between them leave nothing to keep; records appended after
/// that (landing in punched space, wrapping over it) recover after a crash.
#[test]
fn records_written_over_punched_space_recover() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    write_range(&env, 0, 30);
    env.checkpoint().expect("checkpoint");
    env.checkpoint().expect("checkpoint");
    assert_eq!(nonzero_log_bytes(&mem.snapshot()), 0, "nothing is needed");
    // Records around the region's end and over punched bytes, some after more checkpoints.
    write_range(&env, 30, 45);
    env.checkpoint().expect("checkpoint");
    write_range(&env, 45, 70);
    let image = mem.snapshot();
    assert!(nonzero_log_bytes(&image) > 0, "the live records are there");
    // A crash: no close.
    std::mem::forget(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(all_rows(&env), expected(70));
}

/// Writers running while checkpoints return log space: every acknowledged record survives a
/// crash at the end.
#[test]
fn concurrent_writers_and_checkpoints() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    env.tree("t").expect("tree");
    std::thread::scope(|s| {
        for w in 0..2u32 {
            let env = &env;
            s.spawn(move || write_range(env, w * 100, w * 100 + 100));
        }
        let env = &env;
        s.spawn(move || {
            for _ in 0..40 {
                env.checkpoint().expect("checkpoint");
            }
        });
    });
    let image = mem.snapshot();
    std::mem::forget(env);
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(image)), options()).expect("open");
    assert_eq!(all_rows(&env), expected(200));
}

/// W10: a sync that made records durable leaves exactly one mark pending; the periodic flusher
/// syncs it (once: a sync covering only a mark appends no mark, so it does not loop), and
/// `Env::sync` right after a `Sync` commit needs no device sync (fsync of a file, then of its
/// directory, costs one).
#[test]
fn sync_marks_cost_one_flush_and_do_not_loop() {
    let mem = Arc::new(MemDevice::new());
    let env = Env::create_on(mem.clone(), options()).expect("create");
    let t = env.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.insert(&t, b"a", b"1");
    env.write_with(b, Durability::Sync).expect("commit");
    let s = env.stats();
    assert!(
        s.log_durable < s.log_end,
        "the mark is written, not yet durable"
    );
    let syncs = s.log_syncs;
    env.sync().expect("sync");
    assert_eq!(
        env.stats().log_syncs,
        syncs,
        "no record pending: no device sync"
    );
    env.periodic_flush().expect("flush");
    let s = env.stats();
    assert_eq!(s.log_syncs, syncs + 1, "the flusher syncs the pending mark");
    assert_eq!(s.log_durable, s.log_end, "and appends no new one");
    env.periodic_flush().expect("flush");
    assert_eq!(env.stats().log_syncs, syncs + 1, "nothing pending: no sync");
}
