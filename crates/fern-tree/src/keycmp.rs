//! Key order for the hot searches (a basement's rows, a buffer's sorted index): the same
//! lexicographic byte order as `<[u8]>::cmp`, compared eight bytes at a time inline.
//!
//! Why not `<[u8]>::cmp`: it calls `memcmp`, whose call and length dispatch cost more than
//! the comparison itself for the engine's keys (8-40 bytes: an inode id and a block number or a
//! name). A binary search of a 140-row basement made eight such calls per message applied
//! (examples/commit_cost.rs under cachegrind: ~690 instructions per search).

use std::cmp::Ordering;

/// Compares two keys in lexicographic byte order (shorter first on a common prefix).
#[inline]
pub(crate) fn cmp(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_be_bytes(a[i..i + 8].try_into().expect("eight bytes"));
        let y = u64::from_be_bytes(b[i..i + 8].try_into().expect("eight bytes"));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    while i < n {
        if a[i] != b[i] {
            return a[i].cmp(&b[i]);
        }
        i += 1;
    }
    a.len().cmp(&b.len())
}

/// `a < b` in key order.
#[inline]
pub(crate) fn lt(a: &[u8], b: &[u8]) -> bool {
    cmp(a, b) == Ordering::Less
}

/// `a <= b` in key order.
#[inline]
pub(crate) fn le(a: &[u8], b: &[u8]) -> bool {
    cmp(a, b) != Ordering::Greater
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The order is exactly `<[u8]>::cmp`'s, for keys sharing long prefixes too (the
        /// eight-byte steps and the byte tail).
        #[test]
        fn orders_keys_as_slices_do(
            prefix in proptest::collection::vec(any::<u8>(), 0..24),
            a in proptest::collection::vec(any::<u8>(), 0..20),
            b in proptest::collection::vec(any::<u8>(), 0..20),
        ) {
            let a: Vec<u8> = prefix.iter().chain(&a).copied().collect();
            let b: Vec<u8> = prefix.iter().chain(&b).copied().collect();
            prop_assert_eq!(super::cmp(&a, &b), a.cmp(&b));
            prop_assert_eq!(super::cmp(&a, &a), std::cmp::Ordering::Equal);
            prop_assert_eq!(super::lt(&a, &b), a < b);
            prop_assert_eq!(super::le(&a, &b), a <= b);
        }
    }
}
