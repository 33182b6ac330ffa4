//! No decoder that reads from disk panics, whatever the bytes (B6, W1): random bytes and
//! mutations of valid encodings (bit flips, overwritten runs, truncation, extension) go to each
//! entry point of `fern_tree::fuzz` — header, translation table, catalog, node, partition, log
//! record, and a whole image opened and recovered. The cargo-fuzz targets in `fuzz/` call the
//! same functions; this is their CI pass. `FERN_PROPTEST_CASES` sets the cases per decoder.

use std::sync::{Arc, OnceLock};

use fern_tree::blockfile::BlockFile;
use fern_tree::codec::encode_partition;
use fern_tree::device::{BlockDevice, MemDevice};
use fern_tree::{fuzz, Compression, Env, UpsertId, WriteBatch};
use proptest::prelude::*;

mod common;
use common::small_options;

/// Valid encodings to mutate, taken from a real image.
struct Samples {
    image: Vec<u8>,
    header: Vec<u8>,
    btt: Vec<u8>,
    catalog: Vec<u8>,
    nodes: Vec<Vec<u8>>,
    partitions: Vec<Vec<u8>>,
    log: Vec<u8>,
}

fn samples() -> &'static Samples {
    static S: OnceLock<Samples> = OnceLock::new();
    S.get_or_init(|| {
        let mut o = small_options(64 << 10);
        o.register_upsert(UpsertId(1), Arc::new(|_, _, a| Some(a.to_vec())));
        let mem = Arc::new(MemDevice::new());
        let env = Env::create_on(mem.clone(), o).expect("create");
        let t = env.tree("t").expect("tree");
        for i in 0..300u32 {
            t.insert(format!("key{i:05}").as_bytes(), &[i as u8; 20])
                .expect("insert");
        }
        // A data extent in the checkpoint (catalog version 4 holds its table) ...
        let mut b = WriteBatch::new();
        b.insert_extent(&t, b"ext-a", &[], vec![5u8; 3000]);
        env.write(b).expect("extent");
        let a = fern_tree::ExtentRef::decode(&t.get(b"ext-a").expect("get").expect("row"))
            .expect("reference");
        env.checkpoint().expect("checkpoint");
        // ... and the first record after it binds and frees extents (tag 4).
        let mut b = WriteBatch::new();
        b.upsert(&t, b"key00001", UpsertId(1), b"up");
        b.delete(&t, b"key00002");
        b.delete_range(&t, b"key00010", b"key00020");
        b.insert_extent(&t, b"ext-b", b"E", vec![6u8; 5000]);
        b.delete(&t, b"ext-a");
        b.free_extent(a);
        env.write(b).expect("write");
        let mut extents = env.extents();
        extents.push(a);
        env.sync().expect("sync");
        drop(t);
        let image = mem.snapshot();
        std::mem::forget(env); // keep the log tail unreplayed
        let o = BlockFile::open(Arc::new(MemDevice::from_bytes(image.clone()))).expect("open");
        let blocks: Vec<_> = o.file.live_blocks().collect();
        let slice = |off: u64, len: u64| image[off as usize..(off + len) as usize].to_vec();
        let region = blocks
            .iter()
            .max_by_key(|(_, l)| l.len)
            .map(|(_, l)| slice(l.offset, l.len as u64))
            .expect("log region");
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        // The newest header (layout in docs/format.md).
        let gen = |s: usize| u64_at(&image, s * 4096 + 16);
        let h = if gen(0) > gen(1) { 0 } else { 4096 };
        // The first record after the newest checkpoint (the batch above): the log before the
        // older checkpoint's LSN has been returned to the device (W9) and reads as zeros. The
        // region is rotated so that record starts at 0 even where it wraps.
        let at = (u64_at(&image, h + 24) % region.len() as u64) as usize;
        let log = [&region[at..], &region[..at]].concat();
        let nodes = blocks
            .iter()
            .filter(|(_, l)| (l.len as u64) < 64 << 10)
            .filter(|(_, l)| !extents.iter().any(|e| e.offset == l.offset))
            .map(|(id, l)| {
                let mut b = id.0.to_le_bytes().to_vec();
                b.extend(slice(l.offset, l.len as u64));
                b
            })
            .collect();
        // The newest header's BTT.
        let btt = slice(u64_at(&image, h + 32), u32_at(&image, h + 40) as u64);
        let mut partitions = Vec::new();
        for (c, raw) in [
            (Compression::None, b"plain partition bytes".to_vec()),
            (Compression::Lz4, vec![7u8; 3000]),
            (
                Compression::Zstd { level: 3 },
                (0..2000u32).map(|i| i as u8).collect(),
            ),
        ] {
            let mut out = Vec::new();
            encode_partition(c, &raw, &mut out);
            partitions.push(out);
        }
        Samples {
            header: image[h..h + 4096].to_vec(),
            catalog: o.meta.clone(),
            image,
            btt,
            nodes,
            partitions,
            log,
        }
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Overwrite(usize, Vec<u8>),
    Truncate(usize),
    Extend(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Mutation::Overwrite(i, v)),
        any::<usize>().prop_map(Mutation::Truncate),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
    ]
}

fn mutate(base: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = base.to_vec();
    for m in muts {
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let n = b.len();
                b[i % n] ^= x;
            }
            Mutation::Overwrite(i, v) if !b.is_empty() => {
                let n = b.len();
                for (j, x) in v.iter().enumerate() {
                    b[(i + j) % n] = *x;
                }
            }
            Mutation::Truncate(i) => {
                let n = b.len() + 1;
                b.truncate(i % n);
            }
            Mutation::Extend(v) => b.extend_from_slice(v),
            _ => {}
        }
    }
    b
}

fn cases() -> u32 {
    std::env::var("FERN_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

#[test]
fn samples_decode_before_mutation() {
    // The mutation tests only mean something if the unmutated samples are valid.
    let s = samples();
    assert!(fuzz::btt(&s.btt));
    assert!(fuzz::catalog(&s.catalog));
    assert!(!s.nodes.is_empty() && s.nodes.iter().all(|n| fuzz::node(n)));
    assert!(s.partitions.iter().all(|p| fuzz::partition(p)));
    assert!(fuzz::log_record(&s.log), "first log record decodes");
    assert!(fuzz::image(&s.image));
    let dev = MemDevice::from_bytes(s.image.clone());
    assert!(dev.len().unwrap() > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..600)) {
        fuzz::header(&b);
        fuzz::btt(&b);
        fuzz::catalog(&b);
        fuzz::node(&b);
        fuzz::partition(&b);
        fuzz::log_record(&b);
    }

    #[test]
    fn mutated_headers_and_tables(muts in prop::collection::vec(mutation(), 1..4)) {
        let s = samples();
        fuzz::header(&mutate(&s.header, &muts));
        fuzz::btt(&mutate(&s.btt, &muts));
        fuzz::catalog(&mutate(&s.catalog, &muts));
    }

    #[test]
    fn mutated_nodes_and_partitions(i in any::<usize>(), muts in prop::collection::vec(mutation(), 1..4)) {
        let s = samples();
        fuzz::node(&mutate(&s.nodes[i % s.nodes.len()], &muts));
        fuzz::partition(&mutate(&s.partitions[i % s.partitions.len()], &muts));
    }

    #[test]
    fn mutated_log_records(muts in prop::collection::vec(mutation(), 1..4)) {
        let s = samples();
        fuzz::log_record(&mutate(&s.log, &muts));
        fuzz::log_record(&mutate(&s.log[36..], &muts));
    }

    #[test]
    fn mutated_images_open_or_fail_cleanly(muts in prop::collection::vec(mutation(), 1..4)) {
        let s = samples();
        // Keep most mutations inside the meaningful part (headers, catalog, nodes, log).
        fuzz::image(&mutate(&s.image, &muts));
    }
}
