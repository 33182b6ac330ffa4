//! Partition frames: round trips, raw fallback, and damage detection (B8, B9).

use fern_tree::codec::{
    decode_partition, encode_partition, frame_len, Compression, FRAME_HEADER_LEN, MAX_PARTITION_LEN,
};
use fern_tree::Error;
use proptest::prelude::*;

const WHAT: &str = "node 17 partition 3";

fn what() -> String {
    WHAT.to_string()
}

fn codecs() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        (1i32..=9).prop_map(|level| Compression::Zstd { level }),
    ]
}

/// Data that compresses (repeats) or not (random), chosen by the strategy.
fn data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..3000),
        (prop::collection::vec(any::<u8>(), 1..16), 0usize..400)
            .prop_map(|(unit, n)| unit.repeat(n)),
    ]
}

/// Asserts `r` is a Checksum or Corrupt error naming WHAT.
fn assert_named_error(r: fern_tree::Result<Vec<u8>>) -> Result<(), TestCaseError> {
    match r {
        Err(Error::Checksum { what, .. }) | Err(Error::Corrupt { what, .. }) => {
            prop_assert_eq!(what, WHAT);
            Ok(())
        }
        other => Err(TestCaseError::fail(format!(
            "expected a named error, got {other:?}"
        ))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn round_trip(c in codecs(), raw in data()) {
        let mut out = Vec::new();
        encode_partition(c, &raw, &mut out);
        prop_assert_eq!(frame_len(&out, &what).unwrap(), out.len());
        // B9: never more than the header over the raw size.
        prop_assert!(out.len() <= FRAME_HEADER_LEN + raw.len());
        prop_assert_eq!(decode_partition(&out, &what).unwrap(), raw);
    }

    /// B8: flipping any bits of any byte of a frame is an error naming `what`, never a panic
    /// and never silently different data.
    #[test]
    fn flipped_bits_are_named_errors(
        c in codecs(), raw in data(), pos in any::<prop::sample::Index>(), mask in 1u8..=255,
    ) {
        let mut out = Vec::new();
        encode_partition(c, &raw, &mut out);
        let i = pos.index(out.len());
        out[i] ^= mask;
        assert_named_error(decode_partition(&out, &what))?;
    }

    /// Truncated or extended frames are errors.
    #[test]
    fn wrong_length_is_error(c in codecs(), raw in data(), cut in any::<prop::sample::Index>(), extra in 1usize..8) {
        let mut out = Vec::new();
        encode_partition(c, &raw, &mut out);
        let short = &out[..cut.index(out.len())];
        assert_named_error(decode_partition(short, &what))?;
        let mut long = out.clone();
        long.extend(std::iter::repeat_n(0u8, extra));
        assert_named_error(decode_partition(&long, &what))?;
    }

    /// Garbage with a *valid* checksum reaches the decompressors: they must fail cleanly too.
    #[test]
    fn garbage_payload_with_valid_crc(tag in 0u8..4, raw_len in 0u32..5000, payload in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut f = vec![tag, 0, 0, 0];
        f.extend_from_slice(&raw_len.to_le_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&f), &payload);
        f.extend_from_slice(&crc.to_le_bytes());
        f.extend_from_slice(&payload);
        match decode_partition(&f, &what) {
            // Accepting is fine only if the output has exactly the declared length.
            Ok(v) => prop_assert_eq!(v.len(), raw_len as usize),
            Err(e) => assert_named_error(Err(e))?,
        }
    }

    /// Random bytes are never accepted (the checksum catches them) and never panic.
    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = frame_len(&bytes, &what);
        assert_named_error(decode_partition(&bytes, &what))?;
    }
}

#[test]
fn incompressible_data_stored_raw() {
    let raw = fern_testkit::noise(&mut 7, 4096);
    for c in [Compression::Lz4, Compression::Zstd { level: 3 }] {
        let mut out = Vec::new();
        encode_partition(c, &raw, &mut out);
        assert_eq!(out[0], Compression::None.to_byte(), "B9: raw fallback");
        assert_eq!(out.len(), FRAME_HEADER_LEN + raw.len());
    }
    let mut out = Vec::new();
    encode_partition(Compression::Zstd { level: 3 }, &vec![0u8; 4096], &mut out);
    assert_eq!(out[0], 2);
    assert!(out.len() < 200);
}

/// B8: a declared length over the cap is refused before anything is allocated.
#[test]
fn oversized_declared_length_rejected() {
    let mut f = vec![1, 0, 0, 0];
    f.extend_from_slice(&((MAX_PARTITION_LEN as u32) + 1).to_le_bytes());
    f.extend_from_slice(&4u32.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    assert!(matches!(frame_len(&f, &what), Err(Error::Corrupt { .. })));
    assert!(matches!(
        decode_partition(&f, &what),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn compression_bytes_round_trip() {
    for c in [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd { level: 5 },
    ] {
        assert_eq!(Compression::from_byte(c.to_byte(), 5), Some(c));
    }
    assert_eq!(Compression::from_byte(9, 0), None);
}

/// The names mkfs's `--compression` and the mount option `compression=` take.
#[test]
fn compression_names_round_trip() {
    for c in [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd { level: 1 },
        Compression::Zstd { level: 19 },
    ] {
        assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
    }
    assert_eq!(
        "zstd".parse::<Compression>(),
        Ok(Compression::Zstd {
            level: Compression::ZSTD_LEVEL
        })
    );
    for bad in ["", "zstd-0", "zstd-20", "zstd-x", "zstd3", "LZ4", "gzip"] {
        let e = bad.parse::<Compression>().expect_err(bad);
        assert!(e.contains("compression must be"), "{bad}: {e}");
    }
}
