//! Flipped bits anywhere in a written image are detected and reported with the block they hit:
//! reads either return exactly the data that was written or an error naming the corrupt node
//! or structure — never wrong data and never a panic.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use fern_tree::device::{BlockDevice, MemDevice};
use fern_tree::{Compression, Env, Error, Options};

mod common;
use common::log_region;

/// The codecs every image-level damage test runs with: each decoder meets damaged frames.
const CODECS: [Compression; 2] = [Compression::Lz4, Compression::Zstd { level: 1 }];

fn opts() -> Options {
    opts_with(Options::default().compression)
}

fn opts_with(compression: Compression) -> Options {
    Options {
        compression,
        cache_bytes: 1 << 20,
        node_bytes: 16 << 10,
        basement_bytes: 2 << 10,
        fanout: 4,
        // Big enough for one MAX_VALUE_LEN insert (a batch may take half the log region).
        log_bytes: 4 << 20,
        sync_interval: None,
        ..Options::default()
    }
}

fn build() -> (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>) {
    build_with(Options::default().compression)
}

fn build_with(c: Compression) -> (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let dev = Arc::new(MemDevice::new());
    let env = Env::create_on(dev.clone() as Arc<dyn BlockDevice>, opts_with(c)).unwrap();
    let t = env.tree("t").unwrap();
    let mut model = BTreeMap::new();
    for i in 0u32..3000 {
        let k = i.wrapping_mul(2654435761).to_be_bytes().to_vec();
        let v = format!("value {i} {}", "x".repeat((i % 50) as usize)).into_bytes();
        t.insert(&k, &v).unwrap();
        model.insert(k, v);
    }
    env.close().unwrap();
    // A second checkpoint of the same state: both header slots then describe all the data, so
    // a damaged newest header falls back to an identical older one (invariant B-headers).
    let env = Env::open_on(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap();
    env.close().unwrap();
    (dev.snapshot(), model)
}

/// Reads everything; Ok(true) if it matched the model.
fn read_all(img: Vec<u8>, model: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<bool, Error> {
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(img)), opts())?;
    let t = env.tree("t")?;
    let rows = t.range_vec(Bound::Unbounded, Bound::Unbounded)?;
    let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut ok = rows == want;
    for (k, v) in model.iter().step_by(37) {
        ok &= t.get(k)?.as_ref() == Some(v);
    }
    Ok(ok)
}

#[test]
fn every_flipped_bit_is_detected_or_harmless() {
    for c in CODECS {
        flipped_bits(c);
    }
}

fn flipped_bits(c: Compression) {
    let (img, model) = build_with(c);
    assert!(read_all(img.clone(), &model).unwrap());
    // Flips go outside the write-ahead log region (the largest extent): after the clean close
    // every record in it precedes the checkpoint, so flips there are harmless by design (and
    // the region's size would swamp the live data). tests/crash.rs covers damaged log records.
    let log = log_region(&img);
    let (log_at, log_len) = (log.offset as usize, log.len as usize);
    let mut detected = 0;
    let mut harmless = 0;
    let mut x: u64 = 0xDEADBEEF;
    // 1500 flips in all, shared by the codecs (each flip reopens the image).
    let flips = 1500 / CODECS.len();
    for _ in 0..flips {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut pos = (x % (img.len() - log_len) as u64) as usize;
        if pos >= log_at {
            pos += log_len;
        }
        let bit = (x >> 40) % 8;
        let mut bad = img.clone();
        bad[pos] ^= 1 << bit;
        let r = std::panic::catch_unwind(|| read_all(bad, &model));
        match r {
            Err(_) => panic!("panic on a flipped bit at byte {pos}"),
            Ok(Ok(true)) => harmless += 1, // free space, or the other (older) header slot
            Ok(Ok(false)) => panic!("flipped bit at byte {pos} returned wrong data silently"),
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("node")
                        || msg.contains("header")
                        || msg.contains("table")
                        || msg.contains("catalog")
                        || msg.contains("meta")
                        || msg.contains("image"),
                    "error for byte {pos} does not say where: {msg}"
                );
                detected += 1;
            }
        }
    }
    eprintln!("{c}: {detected} detected, {harmless} harmless of {flips} flips");
    assert!(
        detected > flips / 3,
        "{c}: most of the image is live data; only {detected} flips detected"
    );
}

#[test]
fn node_checksum_error_names_the_node() {
    for c in CODECS {
        node_checksum_error(c);
    }
}

fn node_checksum_error(c: Compression) {
    let (img, model) = build_with(c);
    // Flip a byte of a node block. The search runs from the image's end, where the last
    // checkpoint wrote its nodes: from the start it first crossed the whole 4 MiB log region
    // (an open and a full read per probed byte, ~70 s of the test suite).
    let env = Env::open_on(Arc::new(MemDevice::from_bytes(img.clone())), opts()).unwrap();
    drop(env);
    let mut found = false;
    for pos in (16384..img.len()).rev().step_by(997) {
        let mut bad = img.clone();
        bad[pos] ^= 0x10;
        if let Err(e) = read_all(bad, &model) {
            let msg = e.to_string();
            if msg.contains("node ") {
                assert!(
                    matches!(e, Error::Checksum { .. } | Error::Corrupt { .. }),
                    "{e:?}"
                );
                found = true;
                break;
            }
        }
    }
    assert!(found, "{c}: no node-level corruption error found");
}

#[test]
fn not_an_image_and_truncated_images_are_errors() {
    let r = Env::open_on(Arc::new(MemDevice::from_bytes(vec![0x5a; 100_000])), opts());
    assert!(matches!(r, Err(Error::NotAnImage)), "{r:?}");
    let (img, model) = build();
    for cut in [0usize, 100, 4096, 8192, img.len() / 2, img.len() - 1] {
        let r = std::panic::catch_unwind(|| read_all(img[..cut].to_vec(), &model));
        match r {
            Err(_) => panic!("panic on image truncated to {cut}"),
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => panic!("truncated image ({cut}) returned wrong data"),
            Ok(Err(_)) => {}
        }
    }
}

#[test]
fn oversized_keys_and_values_are_rejected() {
    let env = Env::create_on(Arc::new(MemDevice::new()), opts()).unwrap();
    let t = env.tree("t").unwrap();
    let big_key = vec![1u8; fern_tree::MAX_KEY_LEN + 1];
    let big_val = vec![1u8; fern_tree::MAX_VALUE_LEN + 1];
    assert!(matches!(
        t.insert(&big_key, b"v"),
        Err(Error::KeyTooLarge { .. })
    ));
    assert!(matches!(
        t.insert(b"k", &big_val),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(matches!(
        t.upsert(b"k", fern_tree::UpsertId(77), b""),
        Err(Error::UnknownUpsert(77))
    ));
    // Values at the limit work, and the tree is still usable after the rejections.
    let max_val = vec![7u8; fern_tree::MAX_VALUE_LEN];
    t.insert(b"k", &max_val).unwrap();
    assert_eq!(t.get(b"k").unwrap(), Some(max_val));
    assert!(env.tree("").is_err());
}
