//! Block file: round trips, copy-on-write, space reuse, crash and fault behaviour, corruption.
//! Invariant numbers (B1..) refer to docs/format.md.

use std::collections::BTreeMap;
use std::sync::Arc;

use fern_tree::blockfile::{BlockFile, ALIGN, DATA_START, FORMAT_VERSION, HEADER_LEN};
use fern_tree::device::{BlockDevice, CrashDevice, FaultyDevice, FileDevice, MemDevice};
use fern_tree::{Error, Lsn, NodeId};
use proptest::prelude::*;

/// Everything a checkpoint promises to bring back.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct State {
    lsn: u64,
    meta: Vec<u8>,
    nodes: BTreeMap<u64, Vec<u8>>,
}

fn state_of(bf: &BlockFile, lsn: Lsn, meta: Vec<u8>) -> State {
    let nodes = bf
        .live_blocks()
        .map(|(id, loc)| (id.0, bf.read(id, 0, loc.len).expect("read")))
        .collect();
    State {
        lsn: lsn.0,
        meta,
        nodes,
    }
}

fn open_bytes(bytes: Vec<u8>) -> fern_tree::Result<State> {
    let o = BlockFile::open(Arc::new(MemDevice::from_bytes(bytes)))?;
    Ok(state_of(&o.file, o.checkpoint_lsn, o.meta))
}

fn content(id: u64, version: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id as usize * 31 + version as usize * 7 + i) as u8)
        .collect()
}

fn round_trip(dev: Arc<dyn BlockDevice>, reopen: impl Fn() -> Arc<dyn BlockDevice>) {
    let mut bf = BlockFile::create(dev, b"meta-0").unwrap();
    let mut written = BTreeMap::new();
    for i in 0..50u64 {
        let id = bf.alloc_node_id();
        assert_eq!(id, NodeId(i));
        let bytes = content(i, 0, 100 + 300 * i as usize);
        bf.write_node(id, &bytes).unwrap();
        written.insert(i, bytes);
    }
    bf.checkpoint(Lsn(77), b"meta-1").unwrap();
    let locs: Vec<_> = bf.live_blocks().collect();
    drop(bf);
    let o = BlockFile::open(reopen()).unwrap();
    assert_eq!(o.checkpoint_lsn, Lsn(77));
    assert_eq!(o.meta, b"meta-1");
    assert_eq!(o.file.live_blocks().collect::<Vec<_>>(), locs);
    for (id, bytes) in &written {
        let got = o.file.read(NodeId(*id), 0, bytes.len() as u32).unwrap();
        assert_eq!(&got, bytes);
    }
    // Partial reads and the bounds check.
    assert_eq!(o.file.read(NodeId(3), 10, 5).unwrap(), written[&3][10..15]);
    match o.file.read(NodeId(3), 1000, 1) {
        Err(Error::Corrupt { what, .. }) => assert_eq!(what, "node 3"),
        other => panic!("expected Corrupt naming node 3, got {other:?}"),
    }
    assert!(matches!(
        o.file.read(NodeId(999), 0, 1),
        Err(Error::MissingNode(NodeId(999)))
    ));
}

#[test]
fn round_trip_mem() {
    let dev = Arc::new(MemDevice::new());
    let d2 = dev.clone();
    round_trip(dev, move || Arc::new(MemDevice::from_bytes(d2.snapshot())));
}

#[test]
fn round_trip_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    let p2 = path.clone();
    round_trip(Arc::new(FileDevice::create(&path).unwrap()), move || {
        Arc::new(FileDevice::open(&p2).unwrap())
    });
}

#[test]
fn create_refuses_non_empty_device_and_empty_is_not_an_image() {
    let dev = Arc::new(MemDevice::from_bytes(vec![0; 10]));
    assert!(BlockFile::create(dev, b"").is_err());
    let dev = Arc::new(MemDevice::new());
    assert!(matches!(BlockFile::open(dev), Err(Error::NotAnImage)));
}

#[derive(Clone, Debug)]
enum Op {
    New(u16),
    Write(usize, u16),
    Free(usize),
    Checkpoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u16..9000).prop_map(Op::New),
        4 => (any::<usize>(), 0u16..9000).prop_map(|(i, l)| Op::Write(i, l)),
        1 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Checkpoint),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// B4 (copy-on-write) and B2 (header choice): after every operation, the current device
    /// bytes reopen to exactly the last committed checkpoint; with the newest header destroyed,
    /// to exactly the one before it; and every snapshot taken at a checkpoint still reopens to
    /// its own state after all later writes.
    #[test]
    fn cow_never_touches_durable_blocks(ops in prop::collection::vec(op(), 1..80)) {
        check_cow(ops)?;
    }
}

/// A zero-length node allocated past the file's last byte (nothing is written there) and
/// named by the newest checkpoint: the image reopens. Found by `cow_never_touches_durable_blocks`
/// in CI: the open's extent check refused an empty extent lying past the end of the file.
#[test]
fn an_empty_node_past_the_last_written_byte_reopens() {
    use Op::*;
    let ops = vec![
        New(0),
        New(0),
        Free(0),
        New(0),
        Free(28703),
        New(4725),
        Free(18222071688515387484),
        New(3939),
        New(6515),
        New(1296),
        New(1382),
        Free(18445440826819060075),
        Free(10780164853601914708),
        Free(1341119714438101332),
        Free(12447918258750074829),
        New(701),
        Free(17006722098214085499),
        New(6051),
        New(4612),
        New(5526),
        New(6827),
        New(507),
        Write(10472906016160778553, 0),
        Checkpoint,
    ];
    check_cow(ops).unwrap();
}

/// The body of `cow_never_touches_durable_blocks` for one sequence of operations.
fn check_cow(ops: Vec<Op>) -> Result<(), TestCaseError> {
    {
        let dev = Arc::new(MemDevice::new());
        let mut bf = BlockFile::create(dev.clone(), b"m0").unwrap();
        let mut cur: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut live: Vec<NodeId> = Vec::new();
        let mut committed = vec![
            State {
                lsn: 0,
                meta: b"m0".to_vec(),
                nodes: BTreeMap::new()
            };
            2
        ];
        let mut snapshots = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let v = step as u64;
            match op {
                Op::New(len) => {
                    let id = bf.alloc_node_id();
                    let bytes = content(id.0, v, len as usize);
                    bf.write_node(id, &bytes).unwrap();
                    cur.insert(id.0, bytes);
                    live.push(id);
                }
                Op::Write(i, len) if !live.is_empty() => {
                    let id = live[i % live.len()];
                    let bytes = content(id.0, v, len as usize);
                    bf.write_node(id, &bytes).unwrap();
                    cur.insert(id.0, bytes);
                }
                Op::Free(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    bf.free_node(id);
                    cur.remove(&id.0);
                }
                Op::Checkpoint => {
                    let meta = format!("meta {step}").into_bytes();
                    bf.checkpoint(Lsn(v + 1), &meta).unwrap();
                    committed.push(State {
                        lsn: v + 1,
                        meta,
                        nodes: cur.clone(),
                    });
                    snapshots.push((dev.snapshot(), committed.last().unwrap().clone()));
                }
                _ => {}
            }
            let n = committed.len();
            let img = dev.snapshot();
            prop_assert_eq!(&open_bytes(img.clone()).unwrap(), &committed[n - 1]);
            // Destroy the newest header: slot = generation % 2, generation = checkpoints + 1.
            let gen = (n - 1) as u64;
            let mut bad = img;
            bad[(gen % 2 * ALIGN) as usize + 20] ^= 0x40;
            prop_assert_eq!(&open_bytes(bad).unwrap(), &committed[n - 2]);
        }
        for (img, st) in snapshots {
            prop_assert_eq!(open_bytes(img).unwrap(), st);
        }
    }
    Ok(())
}

/// Rewriting the same nodes and checkpointing forever does not grow the file: replaced extents
/// come back after two checkpoints (B4) and are reused first-fit.
#[test]
fn space_is_reused() {
    let dev = Arc::new(MemDevice::new());
    let mut bf = BlockFile::create(dev.clone(), b"").unwrap();
    let ids: Vec<_> = (0..20).map(|_| bf.alloc_node_id()).collect();
    let mut max_len = 0;
    for round in 0..300u64 {
        for &id in &ids {
            let len = 4000 + ((round * 7 + id.0 * 13) % 9000) as usize;
            bf.write_node(id, &content(id.0, round, len)).unwrap();
        }
        bf.checkpoint(Lsn(round), b"meta").unwrap();
        max_len = max_len.max(dev.len().unwrap());
    }
    let live: u64 = 20 * 3 * ALIGN; // at most 3 units per node
                                    // current + two durable versions of every node, plus fragmentation slack
    assert!(max_len <= DATA_START + 4 * live, "file grew to {max_len}");
    let s = bf.stats();
    assert_eq!(s.live_nodes, 20);
    assert_eq!(s.file_len, dev.len().unwrap());
}

/// Freeing the nodes at the end of the file shrinks the file (tail truncation) once no durable
/// checkpoint references them; big freed holes in the middle are punched (read back as zeros).
#[test]
fn tail_truncation_and_hole_punching() {
    let dev = Arc::new(MemDevice::new());
    let mut bf = BlockFile::create(dev.clone(), b"").unwrap();
    let ids: Vec<_> = (0..600).map(|_| bf.alloc_node_id()).collect();
    for &id in &ids {
        bf.write_node(id, &[0xEE; 8192]).unwrap();
    }
    bf.checkpoint(Lsn(1), b"").unwrap();
    let full = dev.len().unwrap();
    // Free a 2 MiB run in the middle and everything after node 400.
    let mid: Vec<_> = bf.live_blocks().skip(100).take(256).collect();
    for &(id, _) in &mid {
        bf.free_node(id);
    }
    for &id in &ids[400..] {
        bf.free_node(id);
    }
    bf.checkpoint(Lsn(2), b"").unwrap();
    // The previous checkpoint still references the freed blocks: nothing may shrink yet (B4).
    assert!(dev.len().unwrap() >= full - 2 * ALIGN);
    // Checkpoint 3 releases the freed nodes; the BTTs of checkpoints 2 and 3 were written at the
    // old tail (nothing was free yet) and each stays until two later checkpoints replace it.
    let mut punched = Vec::new();
    for lsn in 3..6 {
        bf.checkpoint(Lsn(lsn), b"").unwrap();
        if lsn == 3 {
            punched = dev.snapshot();
        }
    }
    let after = dev.len().unwrap();
    assert!(
        after < full * 3 / 4,
        "file {after} not truncated from {full}"
    );
    assert_eq!(bf.stats().file_len, after);
    let (start, end) = (mid[0].1.offset as usize, mid[255].1.offset as usize + 8192);
    assert!(
        punched[start..end].iter().all(|&b| b == 0),
        "hole not punched"
    );
    let img = dev.snapshot();
    // Everything still live reads back and reopens.
    let st = open_bytes(img).unwrap();
    assert_eq!(st.nodes.len(), 600 - 256 - 200);
    assert!(st.nodes.values().all(|v| v == &vec![0xEE; 8192]));
}

/// FileDevice punch_hole really releases blocks (checked via st_blocks where supported).
#[test]
fn file_device_punch_hole_zeroes() {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileDevice::create(dir.path().join("f")).unwrap();
    dev.write_at(&vec![7u8; 3 << 20], 0).unwrap();
    dev.punch_hole(1 << 20, 1 << 20).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    dev.read_at(&mut buf, 1 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(dev.len().unwrap(), 3 << 20, "KEEP_SIZE");
}

/// B7: a freed id is reused only after the next checkpoint.
#[test]
fn freed_ids_reused_after_checkpoint() {
    let mut bf = BlockFile::create(Arc::new(MemDevice::new()), b"").unwrap();
    let a = bf.alloc_node_id();
    let b = bf.alloc_node_id();
    bf.write_node(a, b"x").unwrap();
    bf.free_node(a);
    let c = bf.alloc_node_id();
    assert!(c != a && c != b);
    bf.checkpoint(Lsn(1), b"").unwrap();
    assert_eq!(bf.alloc_node_id(), a);
    assert!(bf.write_node(NodeId(50), b"x").is_err(), "unallocated id");
}

/// B3: a device that dies at any mutating call during a checkpoint leaves an image that opens
/// at the old or the new checkpoint, never anything else — whatever subset of the unsynced
/// writes reached the medium (torn writes included).
#[test]
fn crash_at_every_step_of_a_checkpoint() {
    for fail_at in 0..12 {
        for seed in 0..20u64 {
            let crash = Arc::new(CrashDevice::new());
            let mut bf = BlockFile::create(crash.clone(), b"m0").unwrap();
            let ids: Vec<_> = (0..8).map(|_| bf.alloc_node_id()).collect();
            for &id in &ids {
                bf.write_node(id, &content(id.0, 1, 5000)).unwrap();
            }
            bf.checkpoint(Lsn(1), b"m1").unwrap();
            let old = state_of(&bf, Lsn(1), b"m1".to_vec());
            drop(bf);
            let faulty = Arc::new(FaultyDevice::failing(crash.clone(), fail_at));
            let mut bf = BlockFile::open(faulty.clone()).unwrap().file;
            let mut new = old.clone();
            let mut result = Ok(());
            for &id in &ids[..4] {
                let bytes = content(id.0, 2, 7000);
                result = bf.write_node(id, &bytes).map(|_| ());
                if result.is_err() {
                    break;
                }
                new.nodes.insert(id.0, bytes);
            }
            bf.free_node(ids[7]);
            new.nodes.remove(&ids[7].0);
            if result.is_ok() {
                result = bf.checkpoint(Lsn(2), b"m2");
            }
            new.lsn = 2;
            new.meta = b"m2".to_vec();
            let got = open_bytes(crash.crash_image(seed)).unwrap();
            if result.is_ok() {
                assert_eq!(
                    got, new,
                    "fail_at {fail_at} seed {seed}: committed state lost"
                );
            } else {
                assert!(
                    got == old || got == new,
                    "fail_at {fail_at} seed {seed}: opened {got:?}"
                );
                // After a failed checkpoint the handle refuses further work.
                if faulty.calls() > 4 {
                    assert!(matches!(
                        bf.checkpoint(Lsn(3), b""),
                        Err(Error::Poisoned(_))
                    ));
                }
            }
        }
    }
}

/// A failed node write leaves the BTT pointing at the old block.
#[test]
fn failed_write_keeps_old_block() {
    let mem = Arc::new(MemDevice::new());
    let mut bf = BlockFile::create(mem.clone(), b"").unwrap();
    let id = bf.alloc_node_id();
    bf.write_node(id, b"old").unwrap();
    bf.checkpoint(Lsn(1), b"").unwrap();
    drop(bf);
    let faulty = Arc::new(FaultyDevice::failing(mem, 0));
    let mut bf = BlockFile::open(faulty).unwrap().file;
    let loc = bf.loc(id);
    assert!(bf.write_node(id, b"new").is_err());
    assert_eq!(bf.loc(id), loc);
    assert_eq!(bf.read(id, 0, 3).unwrap(), b"old");
}

// ---- corruption ----

fn sample_image() -> (Vec<u8>, State) {
    let dev = Arc::new(MemDevice::new());
    let mut bf = BlockFile::create(dev.clone(), b"first").unwrap();
    for i in 0..10 {
        let id = bf.alloc_node_id();
        bf.write_node(id, &content(i, 0, 3000)).unwrap();
    }
    bf.checkpoint(Lsn(5), b"the meta blob").unwrap();
    let st = state_of(&bf, Lsn(5), b"the meta blob".to_vec());
    (dev.snapshot(), st)
}

/// B2: a flipped bit in either header falls back to the other; in both it is an error.
#[test]
fn header_bit_flips() {
    let (img, st) = sample_image();
    // Newest is generation 2 in slot 0; slot 1 holds generation 1 (the empty image).
    let older = State {
        lsn: 0,
        meta: b"first".to_vec(),
        nodes: BTreeMap::new(),
    };
    for byte in 0..HEADER_LEN {
        for (slot, expect) in [(0usize, &older), (1, &st)] {
            let mut bad = img.clone();
            bad[slot * ALIGN as usize + byte] ^= 1 << (byte % 8);
            assert_eq!(&open_bytes(bad).unwrap(), expect, "slot {slot} byte {byte}");
        }
        let mut bad = img.clone();
        bad[byte] ^= 1 << (byte % 8);
        bad[ALIGN as usize + byte] ^= 1 << (byte % 8);
        match open_bytes(bad) {
            Err(Error::Checksum { .. } | Error::Corrupt { .. } | Error::NotAnImage) => {}
            other => panic!("byte {byte}: expected an error, got {other:?}"),
        }
    }
}

fn newest_header(img: &[u8]) -> (usize, u64, u32, u64, u32) {
    let h = &img[..HEADER_LEN]; // generation 2 lives in slot 0
    let u64at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    let u32at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
    assert_eq!(u64at(16), 2);
    (0, u64at(32), u32at(40), u64at(48), u32at(56))
}

/// B6: a flipped bit in the BTT or the meta blob is a Checksum error naming it.
#[test]
fn btt_and_meta_bit_flips() {
    let (img, _) = sample_image();
    let (_, btt_off, btt_len, meta_off, meta_len) = newest_header(&img);
    for (off, len, name) in [
        (btt_off, btt_len, "translation table"),
        (meta_off, meta_len, "meta blob"),
    ] {
        for i in 0..len as usize {
            let mut bad = img.clone();
            bad[off as usize + i] ^= 1 << (i % 8);
            match open_bytes(bad) {
                Err(Error::Checksum { what, .. }) => assert!(what.contains(name), "{what}"),
                other => panic!("{name} byte {i}: expected Checksum, got {other:?}"),
            }
        }
    }
}

#[test]
fn truncated_image_is_an_error() {
    let (img, _) = sample_image();
    for len in [
        0,
        100,
        ALIGN as usize,
        DATA_START as usize + 5,
        img.len() - 1,
    ] {
        let r = open_bytes(img[..len].to_vec());
        assert!(r.is_err(), "truncated to {len} opened: {r:?}");
    }
}

#[test]
fn random_bytes_are_not_an_image() {
    let junk = fern_testkit::noise(&mut 99, 50_000);
    assert!(matches!(open_bytes(junk), Err(Error::NotAnImage)));
}

/// A verified header of a newer version is refused, not skipped.
#[test]
fn newer_version_is_unsupported() {
    let (mut img, _) = sample_image();
    img[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32c::crc32c(&img[..HEADER_LEN - 4]);
    img[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    match open_bytes(img) {
        Err(Error::UnsupportedVersion { found, supported }) => {
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
}

/// B1: the header layout is what docs/format.md says (a fixture of the first bytes).
#[test]
fn header_layout_fixture() {
    let (img, _) = sample_image();
    assert_eq!(&img[..8], b"FERNTREE");
    assert_eq!(u32::from_le_bytes(img[8..12].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_le_bytes(img[12..16].try_into().unwrap()),
        HEADER_LEN as u32
    );
    assert_eq!(u64::from_le_bytes(img[24..32].try_into().unwrap()), 5); // lsn
    assert_eq!(u32::from_le_bytes(img[64..68].try_into().unwrap()), 4096);
    assert!(img[HEADER_LEN..ALIGN as usize].iter().all(|&b| b == 0));
}
