//! Deterministic workload data: keys and values are pure functions of (seed, index), so a
//! workload can regenerate any key or its expected value without keeping them in memory, and a
//! run is reproduced exactly from its seed.
//!
//! The generator is our own splitmix64 so numbers never change with a dependency's version.

use serde::{Deserialize, Serialize};

/// Key length of the engine workloads (docs/workloads.md E1).
pub const KEY_LEN: usize = 16;
/// Value length of the engine workloads (docs/workloads.md E1).
pub const VALUE_LEN: usize = 100;

/// splitmix64's output function: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small, fast, seeded generator (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(mix64(seed ^ 0x5EED_F00D_CAFE_BABE))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in `[0, n)` (n > 0), by multiply-shift; the bias is below 2^-32 for our n.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// What the values look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueKind {
    /// Random bytes: no compressor can shrink them.
    Incompressible,
    /// Words of English-like text drawn with a skew: compresses roughly like prose.
    Text,
}

impl ValueKind {
    /// Name used in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Incompressible => "incompressible",
            ValueKind::Text => "text",
        }
    }

    /// Parses a name given by [`ValueKind::name`].
    pub fn parse(s: &str) -> Option<ValueKind> {
        match s.trim() {
            "incompressible" | "random" => Some(ValueKind::Incompressible),
            "text" | "text-like" => Some(ValueKind::Text),
            _ => None,
        }
    }
}

/// The i-th random key of the key stream `seed`: 16 uniformly distributed bytes.
pub fn random_key(seed: u64, i: u64) -> [u8; KEY_LEN] {
    let a = mix64(seed.wrapping_mul(0xA24B_AED4_963E_E407) ^ i);
    let b = mix64(a ^ 0xD6E8_FEB8_6659_FD93 ^ i.rotate_left(32));
    let mut k = [0u8; KEY_LEN];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

/// The i-th sequential key: `i` as a 16-byte big-endian integer, so byte order is insert order.
pub fn sequential_key(i: u64) -> [u8; KEY_LEN] {
    (i as u128).to_be_bytes()
}

const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "file", "system", "tree",
    "buffer", "message", "node", "leaf", "write", "read", "block", "cache", "disk", "key", "value",
    "range",
];

/// Fills `out` with the value of row `i` of the stream `seed`.
pub fn fill_value(kind: ValueKind, seed: u64, i: u64, out: &mut [u8; VALUE_LEN]) {
    let mut rng = Rng::new(seed ^ mix64(i.wrapping_add(0x1234_5678)));
    match kind {
        ValueKind::Incompressible => {
            for chunk in out.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&r[..chunk.len()]);
            }
        }
        ValueKind::Text => {
            let mut pos = 0;
            while pos < VALUE_LEN {
                // The smaller of two uniform draws: frequent words first, like real text.
                let w = rng
                    .below(WORDS.len() as u64)
                    .min(rng.below(WORDS.len() as u64));
                for &b in WORDS[w as usize].as_bytes().iter().chain(b" ") {
                    if pos == VALUE_LEN {
                        break;
                    }
                    out[pos] = b;
                    pos += 1;
                }
            }
        }
    }
}

/// The value of row `i` of the stream `seed`.
pub fn value(kind: ValueKind, seed: u64, i: u64) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    fill_value(kind, seed, i, &mut v);
    v
}

/// Bounds `[lo, hi)` of the E6 range delete: the middle tenth of the 128-bit key space
/// (45 % to 55 %), which holds a contiguous ~10 % of uniformly random keys.
pub fn e6_bounds() -> ([u8; KEY_LEN], [u8; KEY_LEN]) {
    let tenth = u128::MAX / 20;
    ((tenth * 9).to_be_bytes(), (tenth * 11).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deterministic_and_distinct() {
        assert_eq!(random_key(1, 5), random_key(1, 5));
        assert_ne!(random_key(1, 5), random_key(2, 5));
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            assert!(seen.insert(random_key(7, i)));
        }
    }

    #[test]
    fn text_values_are_printable_and_compressible_looking() {
        let v = value(ValueKind::Text, 3, 9);
        assert!(v.iter().all(|b| b.is_ascii_lowercase() || *b == b' '));
        assert_ne!(value(ValueKind::Text, 3, 9), value(ValueKind::Text, 3, 10));
        assert_ne!(
            value(ValueKind::Incompressible, 3, 9),
            value(ValueKind::Incompressible, 3, 10)
        );
    }

    #[test]
    fn e6_range_holds_about_a_tenth() {
        let (lo, hi) = e6_bounds();
        let n = 100_000;
        let inside = (0..n)
            .filter(|&i| {
                let k = random_key(11, i);
                k >= lo && k < hi
            })
            .count();
        assert!((9_000..11_000).contains(&inside), "{inside}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(1);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
