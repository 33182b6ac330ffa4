//! Allocator against a naive first-fit model (a sorted Vec of holes), and a balance check.

use fern_tree::alloc::Allocator;
use fern_tree::blockfile::ALIGN;
use proptest::prelude::*;

/// The obviously-correct version: linear scan over a sorted list of holes. Same rules as the
/// real allocator (A1): coalesce on free, a hole reaching `end` lowers `end`.
#[derive(Debug)]
struct Model {
    holes: Vec<(u64, u64)>,
    end: u64,
}

impl Model {
    fn alloc(&mut self, len: u64) -> u64 {
        if let Some(i) = self.holes.iter().position(|h| h.1 >= len) {
            let (off, hl) = self.holes[i];
            if hl == len {
                self.holes.remove(i);
            } else {
                self.holes[i] = (off + len, hl - len);
            }
            off
        } else {
            self.end += len;
            self.end - len
        }
    }

    fn free(&mut self, off: u64, len: u64) {
        self.holes.push((off, len));
        self.holes.sort();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for h in self.holes.drain(..) {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 == h.0 => last.1 += h.1,
                _ => merged.push(h),
            }
        }
        if let Some(&(o, l)) = merged.last() {
            if o + l == self.end {
                self.end = o;
                merged.pop();
            }
        }
        self.holes = merged;
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    /// Free the live extent at this index (modulo the number live).
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..=16).prop_map(|units| Op::Alloc(units * ALIGN)),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Same offsets, same holes, same end as the model after every step (A1, A2).
    #[test]
    fn matches_naive_first_fit(ops in prop::collection::vec(op(), 1..400)) {
        let start = 2 * ALIGN;
        let mut a = Allocator::new(start);
        let mut m = Model { holes: Vec::new(), end: start };
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(len) => {
                    let off = a.alloc(len);
                    prop_assert_eq!(off, m.alloc(len));
                    live.push((off, len));
                }
                Op::Free(i) if !live.is_empty() => {
                    let (off, len) = live.swap_remove(i % live.len());
                    a.free(off, len);
                    m.free(off, len);
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(a.holes().collect::<Vec<_>>(), m.holes.clone());
            prop_assert_eq!(a.end(), m.end);
            prop_assert_eq!(a.free_bytes(), m.holes.iter().map(|h| h.1).sum::<u64>());
            a.check();
        }
    }

    /// Rebuilding with mark_used (in any order) gives the same holes and end as the allocator
    /// that produced the extents — what BlockFile::open relies on (B5).
    #[test]
    fn mark_used_rebuilds_same_state(ops in prop::collection::vec(op(), 1..200), seed in any::<u64>()) {
        let mut a = Allocator::new(2 * ALIGN);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(len) => live.push((a.alloc(len), len)),
                Op::Free(i) if !live.is_empty() => {
                    let (off, len) = live.swap_remove(i % live.len());
                    a.free(off, len);
                }
                Op::Free(_) => {}
            }
        }
        // deterministic shuffle
        let mut s = seed | 1;
        for i in (1..live.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            live.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut b = Allocator::new(2 * ALIGN);
        for &(off, len) in &live {
            b.mark_used(off, len);
        }
        b.check();
        prop_assert_eq!(b.holes().collect::<Vec<_>>(), a.holes().collect::<Vec<_>>());
        prop_assert_eq!(b.end(), a.end());
    }
}

/// A2: after 100k operations (including the adversarial pattern of allocating in increasing
/// offset order, which degenerates an unbalanced tree into a list) the depth stays logarithmic.
#[test]
fn stays_balanced_after_100k_ops() {
    let mut a = Allocator::new(0);
    let mut live = Vec::new();
    for _ in 0..50_000 {
        live.push(a.alloc(ALIGN));
    }
    // Free every other extent in increasing order: 25k holes inserted in sorted key order.
    for (i, &off) in live.iter().enumerate() {
        if i % 2 == 0 {
            a.free(off, ALIGN);
        }
    }
    let n = a.hole_count();
    assert_eq!(n, 25_000);
    let bound = 4 * (usize::BITS - n.leading_zeros()) as usize + 8;
    assert!(
        a.depth() <= bound,
        "depth {} > bound {bound} for {n} holes",
        a.depth()
    );
    a.check();
    // Then a mixed workload with a deterministic generator.
    let mut s: u64 = 42;
    let mut rest: Vec<u64> = live.iter().copied().skip(1).step_by(2).collect();
    for _ in 0..25_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if s.is_multiple_of(3) && !rest.is_empty() {
            let off = rest.swap_remove((s as usize / 3) % rest.len());
            a.free(off, ALIGN);
        } else {
            rest.push(a.alloc(ALIGN));
        }
    }
    let n = a.hole_count().max(1);
    let bound = 4 * (usize::BITS - n.leading_zeros()) as usize + 8;
    assert!(
        a.depth() <= bound,
        "depth {} > bound {bound} for {n} holes",
        a.depth()
    );
    a.check();
}

#[test]
fn tail_free_lowers_end_and_zero_len_is_one_unit() {
    let mut a = Allocator::new(8192);
    let x = a.alloc(0);
    let y = a.alloc(5000); // rounds to two units
    assert_eq!((x, y), (8192, 8192 + ALIGN));
    assert_eq!(a.end(), 8192 + 3 * ALIGN);
    a.free(x, 0);
    assert_eq!(a.holes().collect::<Vec<_>>(), vec![(8192, ALIGN)]);
    a.free(y, 5000);
    assert_eq!(a.end(), 8192, "A1: freeing the tail lowers end");
    assert_eq!(a.holes().count(), 0);
    assert_eq!(a.hole_containing(8192), None);
}
