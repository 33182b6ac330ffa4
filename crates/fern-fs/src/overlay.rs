//! Overlay rows: the one kind of `fs.data` value that is not a block's bytes. A partial-block
//! write into a slot that may hold a data extent cannot be the zero-filling Write upsert (its
//! zeros would hide the extent's bytes below them) and must not read the extent to merge
//! (a 1 MiB read per 575-byte write, fs-design.md §9). So it is a blind upsert that records
//! *which* bytes it wrote: the row is the block's bytes followed by a mask of written bytes,
//! and a read lays the masked bytes over whatever lies beneath (the extent's bytes, or zeros).
//!
//! Format (fs-design.md, "Overlay rows"): `bytes[bs] · mask[bs / 8]`, bit `i % 8` of mask byte
//! `i / 8` set when byte `i` was written. Rules, cited where they are kept:
//! * **O1** A row of exactly `bs + bs / 8` bytes is an overlay; every other row is raw block
//!   bytes of at most `bs`. The two can be told apart only knowing `bs`, so every block
//!   update that may meet an overlay carries the block size (upsert.rs, argument version 2).
//! * **O2** An overlay's unwritten bytes are zero; an overlay with no written byte is deleted,
//!   one with every byte written becomes the raw block (`bs` bytes).
//! * **O3** Overlays are written only into slots that lie wholly below the file's size on a
//!   store with extents (the slots that may hold an extent, extent.rs E1); a read lays a raw
//!   row over the extent's bytes, an overlay's written bytes over them.

/// Length of an overlay row for block size `bs`.
pub(crate) fn overlay_len(bs: usize) -> usize {
    bs + bs / 8
}

/// Whether `row` is an overlay for block size `bs` (O1).
pub(crate) fn is_overlay(row: &[u8], bs: usize) -> bool {
    row.len() == overlay_len(bs)
}

/// An overlay row for block size `bs` with nothing written.
pub(crate) fn empty(bs: usize) -> Vec<u8> {
    vec![0; overlay_len(bs)]
}

/// Writes `bytes` at `offset` into overlay `row` (the caller bounds `offset + len <= bs`).
pub(crate) fn write(row: &mut [u8], bs: usize, offset: usize, bytes: &[u8]) {
    let (data, mask) = row.split_at_mut(bs);
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
    set_bits(mask, offset, offset + bytes.len());
}

/// Zeroes `[from, to)` of overlay `row`, as written zeros (they hide the bytes beneath).
pub(crate) fn zero(row: &mut [u8], bs: usize, from: usize, to: usize) {
    let (data, mask) = row.split_at_mut(bs);
    data[from..to].fill(0);
    set_bits(mask, from, to);
}

/// The row to store for an overlay just changed (O2): `None` if nothing is written, the raw
/// block if everything is, else the overlay itself.
pub(crate) fn settle(mut row: Vec<u8>, bs: usize) -> Option<Vec<u8>> {
    let mask = &row[bs..];
    if mask.iter().all(|m| *m == 0) {
        None
    } else if mask.iter().all(|m| *m == 0xff) {
        row.truncate(bs);
        Some(row)
    } else {
        Some(row)
    }
}

/// Copies the written bytes of overlay `row` that fall in `[from, to)` of its block onto
/// `out`, which holds those block bytes (`out.len() == to - from`).
pub(crate) fn lay_over(row: &[u8], bs: usize, from: usize, to: usize, out: &mut [u8]) {
    let (data, mask) = row.split_at(bs);
    let mut i = from;
    while i < to {
        // Whole mask bytes at once where they are aligned and full or empty.
        if i.is_multiple_of(8) && i + 8 <= to {
            match mask[i / 8] {
                0 => {
                    i += 8;
                    continue;
                }
                0xff => {
                    out[i - from..i - from + 8].copy_from_slice(&data[i..i + 8]);
                    i += 8;
                    continue;
                }
                _ => {}
            }
        }
        if mask[i / 8] & (1 << (i % 8)) != 0 {
            out[i - from] = data[i];
        }
        i += 1;
    }
}

/// One past the last written byte of overlay `row` (0 if none), for D1 checks.
pub(crate) fn written_end(row: &[u8], bs: usize) -> usize {
    let mask = &row[bs..];
    mask.iter()
        .enumerate()
        .rev()
        .find(|(_, m)| **m != 0)
        .map_or(0, |(i, m)| i * 8 + 8 - m.leading_zeros() as usize)
}

/// Whether overlay `row` keeps O2: every unwritten byte is zero, and some but not all bytes
/// are written.
pub(crate) fn well_formed(row: &[u8], bs: usize) -> bool {
    let (data, mask) = row.split_at(bs);
    let some = mask.iter().any(|m| *m != 0);
    let all = mask.iter().all(|m| *m == 0xff);
    some && !all
        && data
            .iter()
            .enumerate()
            .all(|(i, b)| *b == 0 || mask[i / 8] & (1 << (i % 8)) != 0)
}

fn set_bits(mask: &mut [u8], from: usize, to: usize) {
    let mut i = from;
    while i < to {
        if i.is_multiple_of(8) && i + 8 <= to {
            mask[i / 8] = 0xff;
            i += 8;
        } else {
            mask[i / 8] |= 1 << (i % 8);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 64;

    #[test]
    fn written_bytes_are_laid_over_and_others_kept() {
        let mut row = empty(BS);
        write(&mut row, BS, 3, b"abc");
        write(&mut row, BS, 20, &[7; 13]);
        let row = settle(row, BS).expect("written");
        assert!(is_overlay(&row, BS) && well_formed(&row, BS));
        let mut out = vec![9u8; BS];
        lay_over(&row, BS, 0, BS, &mut out);
        let mut want = vec![9u8; BS];
        want[3..6].copy_from_slice(b"abc");
        want[20..33].fill(7);
        assert_eq!(out, want);
        // A window of the block.
        let mut part = vec![1u8; 10];
        lay_over(&row, BS, 0, 10, &mut part);
        assert_eq!(&part[..], &[1, 1, 1, b'a', b'b', b'c', 1, 1, 1, 1]);
        assert_eq!(written_end(&row, BS), 33);
    }

    #[test]
    fn settles_to_nothing_or_to_the_raw_block() {
        assert_eq!(settle(empty(BS), BS), None);
        let mut row = empty(BS);
        write(&mut row, BS, 0, &[5; BS]);
        assert_eq!(settle(row, BS), Some(vec![5; BS]));
    }

    #[test]
    fn zeroing_writes_zeros_and_keeps_unwritten_bytes_zero() {
        let mut row = empty(BS);
        write(&mut row, BS, 0, &[5; 17]);
        zero(&mut row, BS, 30, 35);
        assert!(well_formed(&row, BS));
        assert_eq!(written_end(&row, BS), 35);
        let mut out = vec![9u8; BS];
        lay_over(&row, BS, 0, BS, &mut out);
        assert_eq!(&out[..17], &[5; 17]);
        assert_eq!(&out[17..30], &[9; 13]);
        assert_eq!(&out[30..35], &[0; 5]);
        assert_eq!(&out[35..], &[9; BS - 35]);
    }
}
