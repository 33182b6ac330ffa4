//! Key filters of leaf deltas (docs/format.md "Key filters of leaf deltas", D6/D7): a Bloom
//! filter per delta, kept in the parent's entry for it, that tells a point read which of a
//! leaf's deltas cannot hold its key, so it reads and decodes only the others. The hash is part
//! of the image format (crc32c, seeded twice) and must never change.
//! Never: decides which deltas get a filter (betree/delta.rs) or where one is stored (node.rs).

/// Bits per key of a new filter; with `PROBES` probes, about 1 % false positives.
const BITS_PER_KEY: usize = 10;
/// Probes per key of a new filter.
const PROBES: u8 = 7;
/// Smallest filter, in bytes of bits.
pub(crate) const MIN_BYTES: usize = 8;
/// Largest filter, in bytes of bits: a delta is at most half a node (D5), so a cap only raises
/// the false-positive rate of an unusually large one.
pub(crate) const MAX_BYTES: usize = 4096;
/// Most probes a stored filter may ask for (a larger count is a damaged entry).
const MAX_PROBES: u8 = 16;
/// Seed of the second hash.
const SEED: u32 = 0x9E37_79B9;

/// A Bloom filter over the keys of one leaf delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyFilter {
    probes: u8,
    bits: Box<[u8]>,
}

impl KeyFilter {
    /// A filter holding every key of `keys` (`count` of them, duplicates allowed).
    pub(crate) fn build<'a>(keys: impl Iterator<Item = &'a [u8]>, count: usize) -> KeyFilter {
        let bytes = (count * BITS_PER_KEY)
            .div_ceil(8)
            .clamp(MIN_BYTES, MAX_BYTES);
        let mut f = KeyFilter {
            probes: PROBES,
            bits: vec![0; bytes].into_boxed_slice(),
        };
        for key in keys {
            for bit in f.positions(key) {
                f.bits[bit / 8] |= 1 << (bit % 8);
            }
        }
        f
    }

    /// False only if `key` is certainly not one of the keys the filter was built from (D6).
    pub(crate) fn may_contain(&self, key: &[u8]) -> bool {
        self.positions(key)
            .all(|bit| self.bits[bit / 8] & (1 << (bit % 8)) != 0)
    }

    /// The bits `key` sets: `(h1 + j·h2) mod m` for `j < probes` (format.md).
    fn positions(&self, key: &[u8]) -> impl Iterator<Item = usize> {
        let m = (self.bits.len() * 8) as u64;
        let h1 = u64::from(crc32c::crc32c(key));
        let h2 = u64::from(crc32c::crc32c_append(SEED, key) | 1);
        (0..u64::from(self.probes)).map(move |j| ((h1 + j * h2) % m) as usize)
    }

    /// Bytes of its encoding (`k u8 | bits`), the entry's `flen`.
    pub(crate) fn encoded_len(&self) -> usize {
        1 + self.bits.len()
    }

    /// Appends `k u8 | bits`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.probes);
        out.extend_from_slice(&self.bits);
    }

    /// Reads `k u8 | bits` (all of `raw`), refusing sizes and probe counts no writer makes.
    pub(crate) fn decode(raw: &[u8]) -> Result<KeyFilter, String> {
        let Some((&probes, bits)) = raw.split_first() else {
            return Err("empty key filter".into());
        };
        if probes == 0 || probes > MAX_PROBES {
            return Err(format!("key filter with {probes} probes"));
        }
        if !(MIN_BYTES..=MAX_BYTES).contains(&bits.len()) {
            return Err(format!("key filter of {} bytes", bits.len()));
        }
        Ok(KeyFilter {
            probes,
            bits: bits.into(),
        })
    }

    /// Heap memory held, for the cache's accounting.
    pub(crate) fn mem(&self) -> usize {
        self.bits.len() + std::mem::size_of::<Self>()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// D6: every key a filter was built from is reported as maybe present, also after an
        /// encode and decode.
        #[test]
        fn no_false_negatives(keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..400)) {
            let f = KeyFilter::build(keys.iter().map(Vec::as_slice), keys.len());
            let mut raw = Vec::new();
            f.encode(&mut raw);
            prop_assert_eq!(raw.len(), f.encoded_len());
            let g = KeyFilter::decode(&raw).unwrap();
            prop_assert_eq!(&g, &f);
            for k in &keys {
                prop_assert!(g.may_contain(k));
            }
        }
    }

    #[test]
    fn about_one_key_in_a_hundred_is_a_false_positive() {
        let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
        let keys: Vec<[u8; 8]> = (0..1000).map(key).collect();
        let f = KeyFilter::build(keys.iter().map(|k| &k[..]), keys.len());
        let false_positives = (1000..101_000).filter(|&i| f.may_contain(&key(i))).count();
        // 10 bits per key and 7 probes: ~0.8 % expected.
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }

    #[test]
    fn sizes_are_bounded_and_damage_is_refused() {
        assert_eq!(
            KeyFilter::build([].into_iter(), 0).encoded_len(),
            1 + MIN_BYTES
        );
        let many: Vec<[u8; 8]> = (0..100_000u64).map(u64::to_be_bytes).collect();
        let big = KeyFilter::build(many.iter().map(|k| &k[..]), many.len());
        assert_eq!(big.encoded_len(), 1 + MAX_BYTES);
        assert!(many.iter().all(|k| big.may_contain(k)));
        assert!(KeyFilter::decode(&[]).is_err());
        assert!(KeyFilter::decode(&[0; 9]).is_err(), "no probes");
        assert!(KeyFilter::decode(&[17; 9]).is_err(), "too many probes");
        assert!(KeyFilter::decode(&[7; 8]).is_err(), "too few bytes");
        assert!(
            KeyFilter::decode(&vec![7; 2 + MAX_BYTES]).is_err(),
            "too many bytes"
        );
        assert!(KeyFilter::decode(&[7; 9]).is_ok());
    }
}
