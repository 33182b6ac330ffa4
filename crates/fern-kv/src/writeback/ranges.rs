//! Known-absent key ranges of one tree (docs/design.md §7.3, W2): where the overlay knows the
//! store holds nothing it does not say itself — behind a buffered range delete, or under a
//! prefix the caller promised is unused (`KvStore::assume_absent`). It owns the merging of
//! such ranges; it must never hold values.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::types::KeyRange;

/// Disjoint half-open ranges `[lo, hi)`, `hi == None` meaning unbounded, kept merged.
#[derive(Debug, Default)]
pub(crate) struct AbsentRanges {
    /// `lo` → `hi`; no two ranges overlap or touch.
    ranges: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl AbsentRanges {
    /// True when `key` lies in a known-absent range.
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .is_some_and(|(_, hi)| hi.as_deref().is_none_or(|h| key < h))
    }

    /// Adds `range` (its bounds made half-open; an inclusive high bound `h` becomes
    /// `[.., h ‖ 0x00)`, an exclusive low bound `l` becomes `[l ‖ 0x00, ..)`).
    pub(crate) fn insert(&mut self, range: &KeyRange) {
        if range.is_empty() {
            return;
        }
        let mut lo = match &range.lo {
            Bound::Included(l) => l.clone(),
            Bound::Excluded(l) => successor(l),
            Bound::Unbounded => Vec::new(),
        };
        let mut hi = match &range.hi {
            Bound::Included(h) => Some(successor(h)),
            Bound::Excluded(h) => Some(h.clone()),
            Bound::Unbounded => None,
        };
        if hi.as_deref().is_some_and(|h| h <= lo.as_slice()) {
            return;
        }
        // Absorb every range that overlaps or touches [lo, hi).
        let touching: Vec<Vec<u8>> = self
            .ranges
            .range::<[u8], _>((
                Bound::Unbounded,
                match &hi {
                    Some(h) => Bound::Included(h.as_slice()),
                    None => Bound::Unbounded,
                },
            ))
            .rev()
            .take_while(|(_, h)| h.as_deref().is_none_or(|h| h >= lo.as_slice()))
            .map(|(l, _)| l.clone())
            .collect();
        for l in touching {
            let h = self.ranges.remove(&l).flatten();
            if l < lo {
                lo = l;
            }
            hi = match (hi, h) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        self.ranges.insert(lo, hi);
    }

    /// Number of disjoint ranges.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// The smallest key greater than `k`.
fn successor(k: &[u8]) -> Vec<u8> {
    let mut s = k.to_vec();
    s.push(0);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(0u8..4, 0..3)
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
            Just(Bound::Unbounded),
        ]
    }

    proptest! {
        /// The merged set answers `contains` as the list of every inserted range does.
        #[test]
        fn merged_ranges_contain_what_was_inserted(
            ranges in proptest::collection::vec((bound(), bound()), 0..8),
            probes in proptest::collection::vec(key(), 0..40),
        ) {
            let mut set = AbsentRanges::default();
            let ranges: Vec<KeyRange> =
                ranges.into_iter().map(|(lo, hi)| KeyRange { lo, hi }).collect();
            for r in &ranges {
                set.insert(r);
            }
            for p in &probes {
                let want = ranges.iter().any(|r| r.contains(p));
                prop_assert_eq!(set.contains(p), want, "key {:?} in {:?}", p, ranges);
            }
        }
    }

    #[test]
    fn touching_ranges_merge_into_one() {
        let mut set = AbsentRanges::default();
        set.insert(&KeyRange::half_open(b"a", b"c"));
        set.insert(&KeyRange::half_open(b"c", b"e"));
        set.insert(&KeyRange::half_open(b"x", b"z"));
        assert_eq!(set.len(), 2);
        assert!(set.contains(b"d") && !set.contains(b"e") && set.contains(b"y"));
    }
}
