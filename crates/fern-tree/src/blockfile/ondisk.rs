//! The block file's bytes on disk (docs/format.md, "Header slot", "Block translation table"):
//! the header slot and BTT encodings, and the loading of a checkpoint a header names, verified
//! against its crc32c before any byte is trusted (B6) and against the file's length and the
//! other extents (B1).
//!
//! Owns: the byte layout of a header and a BTT entry. Never: decides which header is current
//! or what is allocated (blockfile.rs), or writes anything.

use std::collections::BTreeMap;

use super::{
    BlockLoc, Ckpt, Slot, ALIGN, BTT_ENTRY_LEN, DATA_START, FORMAT_VERSION, HEADER_LEN, MAGIC,
};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::ids::Lsn;

/// BTT entry offset of an unused id.
const FREE_OFFSET: u64 = u64::MAX;

/// The decoded fields of a header slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Header {
    pub(super) generation: u64,
    pub(super) lsn: Lsn,
    pub(super) btt: BlockLoc,
    pub(super) btt_crc: u32,
    pub(super) meta: BlockLoc,
    pub(super) meta_crc: u32,
}

/// What one header slot holds.
pub(super) enum SlotState {
    /// No magic: never written (or not ours).
    Absent,
    /// Our magic, but damaged.
    Invalid(Error),
    /// Verified, but written by a newer format version.
    Unsupported(u32),
    Valid(Header),
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

pub(super) fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = Vec::with_capacity(ALIGN as usize);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    b.extend_from_slice(&h.generation.to_le_bytes());
    b.extend_from_slice(&h.lsn.0.to_le_bytes());
    for (ext, crc) in [(h.btt, h.btt_crc), (h.meta, h.meta_crc)] {
        b.extend_from_slice(&ext.offset.to_le_bytes());
        b.extend_from_slice(&ext.len.to_le_bytes());
        b.extend_from_slice(&crc.to_le_bytes());
    }
    b.extend_from_slice(&(ALIGN as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(b.len(), HEADER_LEN);
    b.resize(ALIGN as usize, 0);
    b
}

/// Decodes header slot `slot` from its bytes (fewer than [`ALIGN`] if the file is short).
pub(super) fn decode_header(slot: usize, b: &[u8]) -> SlotState {
    let what = format!("header {slot}");
    if b.len() < 16 || b[..8] != MAGIC {
        return SlotState::Absent;
    }
    let version = le_u32(b, 8);
    // The crc position comes from the header itself, so a future version can grow the header
    // and still be recognised (and refused) by this build instead of looking damaged.
    let len = le_u32(b, 12) as usize;
    if !(20..=ALIGN as usize).contains(&len) || len > b.len() {
        return SlotState::Invalid(Error::corrupt(what, format!("header length {len}")));
    }
    let expected = le_u32(b, len - 4);
    let actual = crc32c::crc32c(&b[..len - 4]);
    if expected != actual {
        return SlotState::Invalid(Error::Checksum {
            what,
            expected,
            actual,
        });
    }
    if version != FORMAT_VERSION {
        return SlotState::Unsupported(version);
    }
    if len != HEADER_LEN || le_u32(b, 64) as u64 != ALIGN {
        return SlotState::Invalid(Error::corrupt(what, "bad header length or alignment"));
    }
    SlotState::Valid(Header {
        generation: le_u64(b, 16),
        lsn: Lsn(le_u64(b, 24)),
        btt: BlockLoc {
            offset: le_u64(b, 32),
            len: le_u32(b, 40),
        },
        btt_crc: le_u32(b, 44),
        meta: BlockLoc {
            offset: le_u64(b, 48),
            len: le_u32(b, 56),
        },
        meta_crc: le_u32(b, 60),
    })
}

/// Fuzzing entry point: decodes header slot 0 from `b`.
pub(crate) fn fuzz_header(b: &[u8]) {
    let _ = decode_header(0, b);
}

/// Fuzzing entry point: decodes a BTT from `b`.
pub(crate) fn fuzz_btt(b: &[u8]) -> bool {
    decode_btt(b, "fuzzed translation table").is_ok()
}

/// Where an extent may start (B1): aligned, after the header slots, and low enough that adding
/// a length cannot overflow.
fn valid_offset(off: u64) -> bool {
    off.is_multiple_of(ALIGN) && (DATA_START..1 << 62).contains(&off)
}

pub(super) fn encode_btt(cur: &[Slot]) -> Vec<u8> {
    // Trailing free ids carry no information; dropping them keeps the table small after shrinks.
    let used = cur
        .iter()
        .rposition(|s| *s != Slot::Free)
        .map_or(0, |i| i + 1);
    let mut b = Vec::with_capacity(used * BTT_ENTRY_LEN);
    for s in &cur[..used] {
        let (off, len) = match s {
            Slot::Free => (FREE_OFFSET, 0),
            Slot::Reserved => (0, 0),
            Slot::At(l) => (l.offset, l.len),
        };
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
    }
    b
}

fn decode_btt(b: &[u8], what: &str) -> Result<Vec<Slot>> {
    if !b.len().is_multiple_of(BTT_ENTRY_LEN) {
        return Err(Error::corrupt(
            what,
            format!("length {} not a multiple of {BTT_ENTRY_LEN}", b.len()),
        ));
    }
    b.chunks_exact(BTT_ENTRY_LEN)
        .enumerate()
        .map(|(i, e)| {
            let (off, len) = (le_u64(e, 0), le_u32(e, 8));
            match (off, len) {
                (FREE_OFFSET, 0) => Ok(Slot::Free),
                (0, 0) => Ok(Slot::Reserved),
                (off, len) if valid_offset(off) => Ok(Slot::At(BlockLoc { offset: off, len })),
                _ => Err(Error::corrupt(
                    what,
                    format!("entry for node {i} has invalid extent ({off}, {len})"),
                )),
            }
        })
        .collect()
}

/// Checks that `exts` are aligned, lie inside a file of `file_len` bytes (empty ones anywhere)
/// and do not overlap
/// (identical extents listed twice are fine: two checkpoints share unchanged nodes).
pub(super) fn validate_extents(exts: &[(BlockLoc, String)], file_len: u64) -> Result<()> {
    let mut by_off: BTreeMap<u64, (BlockLoc, &str)> = BTreeMap::new();
    for (loc, name) in exts {
        if !valid_offset(loc.offset) {
            return Err(Error::corrupt(
                name.as_str(),
                format!("extent at {} is not valid", loc.offset),
            ));
        }
        // An empty extent holds no byte, so no file length cuts it: a zero-length node
        // allocated past the last byte written is never written and never extends the file.
        if loc.len > 0 && loc.offset + loc.len as u64 > file_len {
            return Err(Error::corrupt(
                "image",
                format!(
                    "truncated: {name} ends at {} but the file has {file_len} bytes",
                    loc.offset + loc.len as u64
                ),
            ));
        }
        if let Some((other, oname)) = by_off.insert(loc.offset, (*loc, name)) {
            if other != *loc {
                return Err(Error::corrupt(
                    name.as_str(),
                    format!("extent overlaps {oname}"),
                ));
            }
        }
    }
    let mut prev: Option<(u64, &str)> = None;
    for (off, (loc, name)) in &by_off {
        if let Some((end, pname)) = prev {
            if *off < end {
                return Err(Error::corrupt(*name, format!("extent overlaps {pname}")));
            }
        }
        prev = Some((off + loc.extent_len(), name));
    }
    Ok(())
}

/// Reads and verifies the BTT and meta blob a header references.
pub(super) fn load_ckpt(
    dev: &dyn BlockDevice,
    h: &Header,
    file_len: u64,
) -> Result<(Ckpt, Vec<u8>)> {
    let read = |ext: BlockLoc, crc: u32, what: String| -> Result<Vec<u8>> {
        if ext.len == 0 {
            return Ok(Vec::new());
        }
        if !valid_offset(ext.offset) {
            return Err(Error::corrupt(
                what,
                format!("invalid extent at {}", ext.offset),
            ));
        }
        if ext.offset + ext.len as u64 > file_len {
            return Err(Error::corrupt(
                "image",
                format!("truncated: {what} ends past the end of the file ({file_len} bytes)"),
            ));
        }
        let mut buf = vec![0u8; ext.len as usize];
        dev.read_at(&mut buf, ext.offset)
            .map_err(|e| Error::io(format!("reading the {what}"), e))?;
        let actual = crc32c::crc32c(&buf);
        if actual != crc {
            return Err(Error::Checksum {
                what,
                expected: crc,
                actual,
            });
        }
        Ok(buf)
    };
    let g = h.generation;
    let btt_what = format!("translation table of checkpoint {g}");
    let btt = read(h.btt, h.btt_crc, btt_what.clone())?;
    let btt = decode_btt(&btt, &btt_what)?;
    let meta = read(h.meta, h.meta_crc, format!("meta blob of checkpoint {g}"))?;
    Ok((
        Ckpt {
            generation: g,
            lsn: h.lsn,
            btt,
            btt_ext: h.btt,
            meta_ext: h.meta,
        },
        meta,
    ))
}
