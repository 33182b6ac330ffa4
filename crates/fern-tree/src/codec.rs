//! Partition framing: compression plus a crc32c checksum around every node partition.
//!
//! Owns: the partition frame format (docs/format.md, "Partition frame") and the choice to store a
//! partition raw when compression does not pay (invariant B9).
//! Never: panics or over-allocates on bytes read from disk (B8). Every rejection is an
//! [`Error::Checksum`] or [`Error::Corrupt`] whose `what` comes from the caller, so the message
//! names the block ("node 17 partition 3"), not just "a frame".
//!
//! Frame layout (all integers little-endian):
//!
//! | offset | size | field                                             |
//! |--------|------|---------------------------------------------------|
//! | 0      | 1    | codec tag: 0 none, 1 lz4, 2 zstd                  |
//! | 1      | 3    | reserved, zero                                    |
//! | 4      | 4    | uncompressed length                               |
//! | 8      | 4    | payload (stored) length                           |
//! | 12     | 4    | crc32c of bytes 0..12 followed by the payload     |
//! | 16     | n    | payload                                           |

use std::borrow::Cow;
use std::cell::RefCell;

use crate::error::{Error, Result};

/// Size of the frame header in bytes.
pub const FRAME_HEADER_LEN: usize = 16;

/// Largest uncompressed partition accepted. A declared length above it is corruption, which
/// bounds what a damaged header can make the decoder allocate.
pub const MAX_PARTITION_LEN: usize = 64 << 20;

const TAG_NONE: u8 = 0;
const TAG_LZ4: u8 = 1;
const TAG_ZSTD: u8 = 2;

/// How partitions are compressed. Chosen per environment; the frame records the codec actually
/// used, so an environment can change its choice without rewriting old nodes.
///
/// Written and parsed as `none`, `lz4`, `zstd` (level [`Compression::ZSTD_LEVEL`]) or `zstd-N`
/// (the spelling of mkfs's `--compression` and the mount option `compression=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Store raw.
    None,
    /// LZ4 block format (fast, modest ratio).
    Lz4,
    /// Zstandard at the given level.
    Zstd {
        /// Compression level (1..=22; negative levels are the fast modes).
        level: i32,
    },
}

impl Compression {
    /// The zstd level that `zstd` without a level means: the low level measured in
    /// docs/design.md §6 (higher levels cost more CPU per checkpoint for a few % of space).
    pub const ZSTD_LEVEL: i32 = 1;

    /// The engine's default ([`crate::Options::default`]): lz4. zstd-1 made the engine's E1
    /// cost 14–27 % more CPU per row (docs/design.md §6, "Compression"), where its peers use
    /// lz4 too.
    pub const DEFAULT: Compression = Compression::Lz4;

    /// The file system's default (fernfs mkfs, fern-kv-tree stores): zstd level 1, which
    /// stores F8's text in 1.08x gzip -5 instead of lz4's 1.78x for no measurable CPU on the
    /// file-system workloads (docs/design.md §6, "Compression").
    pub const FILE_SYSTEM: Compression = Compression::Zstd {
        level: Self::ZSTD_LEVEL,
    };

    /// The codec tag as persisted (in frames, and by the environment in its options).
    pub fn to_byte(self) -> u8 {
        match self {
            Compression::None => TAG_NONE,
            Compression::Lz4 => TAG_LZ4,
            Compression::Zstd { .. } => TAG_ZSTD,
        }
    }

    /// Inverse of [`Compression::to_byte`]; `level` is only used for zstd (the level is an encoder
    /// setting, decoding does not need it). `None` for an unknown tag.
    pub fn from_byte(b: u8, level: i32) -> Option<Self> {
        match b {
            TAG_NONE => Some(Compression::None),
            TAG_LZ4 => Some(Compression::Lz4),
            TAG_ZSTD => Some(Compression::Zstd { level }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd { level } => write!(f, "zstd-{level}"),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("{s:?}: compression must be none, lz4, zstd or zstd-LEVEL (1..=19)");
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd {
                level: Self::ZSTD_LEVEL,
            }),
            _ => {
                // Levels above 19 need zstd's large windows: not worth it for 16 KiB partitions.
                let level = s
                    .strip_prefix("zstd-")
                    .and_then(|l| l.parse::<i32>().ok())
                    .filter(|l| (1..=19).contains(l))
                    .ok_or_else(bad)?;
                Ok(Compression::Zstd { level })
            }
        }
    }
}

/// Appends one self-describing frame for `raw` to `out`.
///
/// If the codec does not make the payload strictly smaller (or fails), the frame stores `raw`
/// with tag "none", so incompressible data costs only [`FRAME_HEADER_LEN`] bytes (B9).
///
/// # Panics
/// If `raw` is longer than [`MAX_PARTITION_LEN`]: the caller builds partitions, and one that big
/// is a bug there; the decoder would reject the frame anyway.
pub fn encode_partition(c: Compression, raw: &[u8], out: &mut Vec<u8>) {
    assert!(
        raw.len() <= MAX_PARTITION_LEN,
        "partition of {} bytes exceeds MAX_PARTITION_LEN",
        raw.len()
    );
    let compressed = if worth_compressing(c, raw) {
        compress(c, raw)
    } else {
        None
    };
    let (tag, payload): (u8, &[u8]) = match &compressed {
        Some(p) if p.len() < raw.len() => (c.to_byte(), p),
        _ => (TAG_NONE, raw),
    };
    let start = out.len();
    out.push(tag);
    out.extend_from_slice(&[0; 3]);
    // Both lengths are <= MAX_PARTITION_LEN (< u32::MAX) by the assertion above.
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start..start + 12]), payload);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
}

fn compress(c: Compression, raw: &[u8]) -> Option<Vec<u8>> {
    match c {
        Compression::None => None,
        Compression::Lz4 => Some(lz4_flex::block::compress(raw)),
        Compression::Zstd { level } => zstd_compress(level, raw),
    }
}

thread_local! {
    /// This thread's zstd compression context and its level. A fresh context per partition
    /// (what `zstd::bulk::compress` does) costs more than compressing a 16 KiB partition: its
    /// tables are allocated and, above the process's mmap threshold, faulted in zeroed each
    /// time. Kept per thread (writers, checkpointer, writeback), so there is no lock; its
    /// memory (well under 1 MiB at low levels for 16 KiB–1 MiB partitions) is outside the
    /// node cache's bound.
    static ZSTD_COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    /// This thread's zstd decompression context, for the same reason.
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

fn zstd_compress(level: i32, raw: &[u8]) -> Option<Vec<u8>> {
    ZSTD_COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, c) = slot.as_mut()?;
        c.compress(raw).ok()
    })
}

/// Decompresses a zstd payload into at most `capacity` bytes.
fn zstd_decompress(payload: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    ZSTD_DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        d.decompress(payload, capacity)
    })
}

/// Partitions at least this long are sampled before they are compressed.
const SAMPLE_FROM: usize = 8 << 10;
/// Bytes of the sample (from the middle of the partition).
const SAMPLE_LEN: usize = 2 << 10;

/// Whether compressing `raw` with `c` is worth trying: a partition of incompressible rows (the
/// E1 "incompressible" values, already-compressed file data) costs a full compression attempt
/// that B9 then discards, on every write of the node. A sample from the middle that does not
/// shrink by at least 1/16 predicts that; text and repetitive rows compress far better than
/// that in any 2 KiB window. The sample is judged by `c` itself, not by the cheaper lz4: data
/// without repeats but with few distinct bytes (hex, base64) defeats lz4 and still shrinks by
/// a third or more under zstd's entropy stage. With the thread's zstd context reused, a 2 KiB
/// zstd-1 attempt costs a few µs. A wrong guess only stores a compressible partition raw (B9
/// allows codec 0 for anything), never anything unreadable.
fn worth_compressing(c: Compression, raw: &[u8]) -> bool {
    if c == Compression::None {
        return false;
    }
    if raw.len() < SAMPLE_FROM {
        return true;
    }
    let at = raw.len() / 2 - SAMPLE_LEN / 2;
    let sample = &raw[at..at + SAMPLE_LEN];
    compress(c, sample).is_some_and(|p| p.len() < SAMPLE_LEN - SAMPLE_LEN / 16)
}

/// The fields of a frame header, checked for plausibility but not against the checksum.
struct FrameHeader {
    tag: u8,
    raw_len: usize,
    payload_len: usize,
    crc: u32,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn parse_header(header: &[u8], what: &dyn Fn() -> String) -> Result<FrameHeader> {
    if header.len() < FRAME_HEADER_LEN {
        return Err(Error::corrupt(
            what(),
            format!(
                "partition frame truncated: {} bytes, header needs {FRAME_HEADER_LEN}",
                header.len()
            ),
        ));
    }
    let h = FrameHeader {
        tag: header[0],
        raw_len: le_u32(header, 4) as usize,
        payload_len: le_u32(header, 8) as usize,
        crc: le_u32(header, 12),
    };
    if h.raw_len > MAX_PARTITION_LEN {
        return Err(Error::corrupt(
            what(),
            format!(
                "declared partition length {} exceeds {MAX_PARTITION_LEN}",
                h.raw_len
            ),
        ));
    }
    // A compressed payload never exceeds the raw length: encode_partition stores raw otherwise.
    if h.payload_len > h.raw_len || (h.tag == TAG_NONE && h.payload_len != h.raw_len) {
        return Err(Error::corrupt(
            what(),
            format!(
                "partition payload length {} inconsistent with length {} (codec tag {})",
                h.payload_len, h.raw_len, h.tag
            ),
        ));
    }
    Ok(h)
}

/// Total frame length (header + payload) from the first [`FRAME_HEADER_LEN`] bytes, without
/// verifying the checksum (lengths are still bounds-checked, so the result is at most
/// `FRAME_HEADER_LEN + MAX_PARTITION_LEN`).
pub fn frame_len(header: &[u8], what: &dyn Fn() -> String) -> Result<usize> {
    let h = parse_header(header, what)?;
    Ok(FRAME_HEADER_LEN + h.payload_len)
}

/// Verifies the checksum of exactly one frame and returns the uncompressed partition.
///
/// `frame` must be exactly one frame (use [`frame_len`] to cut it out of a block); trailing bytes
/// are corruption. Never panics; allocates at most the declared uncompressed length (which is
/// bounded by [`MAX_PARTITION_LEN`]).
pub fn decode_partition(frame: &[u8], what: &dyn Fn() -> String) -> Result<Vec<u8>> {
    decode_partition_ref(frame, what).map(Cow::into_owned)
}

/// [`decode_partition`] without a copy of an uncompressed payload: it is borrowed from
/// `frame` (a cold read then copies its bytes once, into the partition that keeps them).
pub(crate) fn decode_partition_ref<'f>(
    frame: &'f [u8],
    what: &dyn Fn() -> String,
) -> Result<Cow<'f, [u8]>> {
    let h = parse_header(frame, what)?;
    let total = FRAME_HEADER_LEN + h.payload_len;
    if frame.len() != total {
        return Err(Error::corrupt(
            what(),
            format!(
                "partition frame is {} bytes, header declares {total}",
                frame.len()
            ),
        ));
    }
    let payload = &frame[FRAME_HEADER_LEN..];
    let actual = crc32c::crc32c_append(crc32c::crc32c(&frame[..12]), payload);
    if actual != h.crc {
        return Err(Error::Checksum {
            what: what(),
            expected: h.crc,
            actual,
        });
    }
    // The checksum covers the reserved bytes, so non-zero ones mean a writer we do not know.
    if frame[1..4] != [0, 0, 0] {
        return Err(Error::corrupt(
            what(),
            "reserved bytes of partition frame are not zero",
        ));
    }
    let decompress_err = |e: String| Error::corrupt(what(), format!("decompression failed: {e}"));
    let raw = match h.tag {
        TAG_NONE => Cow::Borrowed(payload),
        TAG_LZ4 => {
            let mut raw = vec![0u8; h.raw_len];
            let n = lz4_flex::block::decompress_into(payload, &mut raw)
                .map_err(|e| decompress_err(e.to_string()))?;
            raw.truncate(n);
            Cow::Owned(raw)
        }
        // `capacity` caps the output buffer, so a lying zstd frame header cannot make us allocate
        // more than the (bounded) declared length.
        TAG_ZSTD => Cow::Owned(
            zstd_decompress(payload, h.raw_len).map_err(|e| decompress_err(e.to_string()))?,
        ),
        t => {
            return Err(Error::corrupt(what(), format!("unknown codec tag {t}")));
        }
    };
    if raw.len() != h.raw_len {
        return Err(Error::corrupt(
            what(),
            format!(
                "partition decompressed to {} bytes, header declares {}",
                raw.len(),
                h.raw_len
            ),
        ));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_each_codec() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        for c in [
            Compression::None,
            Compression::Lz4,
            Compression::Zstd { level: 3 },
        ] {
            let mut out = vec![0xAA];
            encode_partition(c, &data, &mut out);
            let frame = &out[1..];
            assert_eq!(frame_len(frame, &|| "t".into()).unwrap(), frame.len());
            assert_eq!(frame[0], c.to_byte());
            assert_eq!(decode_partition(frame, &|| "t".into()).unwrap(), data);
        }
    }

    /// A partition of random bytes (the E1 incompressible values) is stored raw without a
    /// whole-partition compression attempt; text still compresses.
    #[test]
    fn sampling_skips_incompressible_partitions() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..16 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .copied()
            .cycle()
            .take(16 << 10)
            .collect();
        for c in [Compression::Lz4, Compression::Zstd { level: 1 }] {
            assert!(!worth_compressing(c, &random), "{c:?} random");
            assert!(worth_compressing(c, &text), "{c:?} text");
            for (data, tag) in [(&random, TAG_NONE), (&text, c.to_byte())] {
                let mut out = Vec::new();
                encode_partition(c, data, &mut out);
                assert_eq!(out[0], tag);
                assert_eq!(&decode_partition(&out, &|| "t".into()).unwrap(), data);
            }
        }
        assert!(
            worth_compressing(Compression::Lz4, &random[..4096]),
            "small: always tried"
        );
        // Hex digits without repeats: lz4 finds no matches, zstd's entropy stage halves them.
        // Each codec judges its own sample, so zstd still compresses them.
        let hex: Vec<u8> = random
            .iter()
            .map(|b| b"0123456789abcdef"[(b & 15) as usize])
            .collect();
        assert!(!worth_compressing(Compression::Lz4, &hex), "lz4 hex");
        let zstd = Compression::Zstd { level: 1 };
        assert!(worth_compressing(zstd, &hex), "zstd hex");
        let mut out = Vec::new();
        encode_partition(zstd, &hex, &mut out);
        assert_eq!(out[0], TAG_ZSTD);
        assert!(
            out.len() < hex.len() * 6 / 10,
            "{} of {}",
            out.len(),
            hex.len()
        );
    }
}
