//! The free-space allocator of the block file: first fit, lowest offset, in O(log n).
//!
//! Owns: which byte ranges of the file are free. Free extents ("holes") live in a treap keyed by
//! offset; every treap node also stores the largest hole in its subtree, so the lowest-offset hole
//! that fits a request is found by one descent (the PerconaFT 2016 fix for its linear scan).
//! Never: does I/O, knows what a range holds, or hands out anything below `start` (the headers).
//!
//! State invariants (checked by `check` in tests):
//! - A1: holes are disjoint, non-adjacent (freeing coalesces with both neighbours), lie in
//!   `[start, end)`, and none ends at `end` — a hole reaching `end` is absorbed by lowering `end`,
//!   so `end` is always one past the highest allocated byte and the file tail can be truncated.
//! - A2: every node's `max` is the largest `len` in its subtree; priorities are heap-ordered, so
//!   the expected depth is O(log n) whatever the order of operations.
//!
//! Lengths are rounded up to [`ALIGN`]; offsets must be multiples of it.

use crate::blockfile::ALIGN;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    off: u64,
    len: u64,
    /// Largest `len` in the subtree rooted here (A2).
    max: u64,
    prio: u64,
    left: u32,
    right: u32,
}

/// First-fit allocator over units of [`ALIGN`] bytes. See the module comment.
#[derive(Clone, Debug)]
pub struct Allocator {
    start: u64,
    end: u64,
    free_bytes: u64,
    /// Treap nodes; `spare` lists the slots of removed nodes for reuse.
    nodes: Vec<Node>,
    spare: Vec<u32>,
    root: u32,
    holes: usize,
    /// splitmix64 state for priorities: deterministic, so a failing test replays exactly.
    rng: u64,
}

fn round_up(len: u64) -> u64 {
    len.div_ceil(ALIGN) * ALIGN
}

impl Allocator {
    /// An allocator with nothing allocated; space below `start` is never handed out.
    pub fn new(start: u64) -> Self {
        debug_assert!(start.is_multiple_of(ALIGN), "start {start} not aligned");
        Allocator {
            start,
            end: start,
            free_bytes: 0,
            nodes: Vec::new(),
            spare: Vec::new(),
            root: NIL,
            holes: 0,
            rng: 0x5EED_F00D_CAFE_F00D,
        }
    }

    /// Allocates `len` bytes (rounded up to [`ALIGN`]; zero counts as one unit) at the lowest
    /// offset where they fit, growing [`end`](Self::end) if no hole is large enough.
    pub fn alloc(&mut self, len: u64) -> u64 {
        let len = round_up(len.max(1));
        match self.first_fit(len) {
            Some((off, hole)) => {
                self.remove(off);
                if hole > len {
                    self.insert(off + len, hole - len);
                }
                self.free_bytes -= len;
                off
            }
            None => {
                let off = self.end;
                self.end += len;
                off
            }
        }
    }

    /// Returns `[offset, offset+len)` (len rounded up like [`alloc`](Self::alloc)) to the free
    /// space, coalescing with neighbouring holes and lowering `end` if it was the last extent.
    pub fn free(&mut self, offset: u64, len: u64) {
        let len = round_up(len.max(1));
        debug_assert!(
            offset.is_multiple_of(ALIGN),
            "free of unaligned offset {offset}"
        );
        debug_assert!(
            offset >= self.start && offset + len <= self.end,
            "free of [{offset}, +{len}) outside [{}, {})",
            self.start,
            self.end
        );
        let (mut lo, mut hi) = (offset, offset + len);
        if let Some((p, plen)) = self.last_at_or_before(offset) {
            debug_assert!(p + plen <= offset, "double free of [{offset}, +{len})");
            if p + plen == offset {
                self.remove(p);
                lo = p;
            }
        }
        if let Some((s, slen)) = self.first_after(offset) {
            debug_assert!(s >= hi, "free of [{offset}, +{len}) overlaps hole at {s}");
            if s == hi {
                self.remove(s);
                hi = s + slen;
            }
        }
        self.free_bytes += len;
        if hi == self.end {
            // A1: the merged hole is the tail of the file; it stops being "inside" the file.
            self.free_bytes -= hi - lo;
            self.end = lo;
        } else {
            self.insert(lo, hi - lo);
        }
    }

    /// Marks `[offset, offset+len)` as allocated; used to rebuild the allocator from the
    /// translation table at open. The range must not overlap anything already allocated
    /// (callers validate on-disk extents first); any order of calls is fine.
    pub fn mark_used(&mut self, offset: u64, len: u64) {
        let len = round_up(len.max(1));
        debug_assert!(offset.is_multiple_of(ALIGN) && offset >= self.start);
        if offset >= self.end {
            if offset > self.end {
                self.insert(self.end, offset - self.end);
                self.free_bytes += offset - self.end;
            }
            self.end = offset + len;
            return;
        }
        let Some((h, hlen)) = self.last_at_or_before(offset) else {
            debug_assert!(
                false,
                "mark_used of [{offset}, +{len}) overlaps allocated space"
            );
            return;
        };
        debug_assert!(
            h + hlen >= offset + len,
            "mark_used of [{offset}, +{len}) overlaps allocated space"
        );
        if h + hlen < offset + len {
            return;
        }
        self.remove(h);
        self.free_bytes -= len;
        if offset > h {
            self.insert(h, offset - h);
        }
        if h + hlen > offset + len {
            self.insert(offset + len, h + hlen - offset - len);
        }
    }

    /// One past the highest allocated byte (at least `start`).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The first offset this allocator may hand out.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Total size of the holes below [`end`](Self::end).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes allocated between `start` and `end`.
    pub fn allocated_bytes(&self) -> u64 {
        self.end - self.start - self.free_bytes
    }

    /// Free extents `(offset, len)` in offset order, all below [`end`](Self::end).
    pub fn holes(&self) -> impl Iterator<Item = (u64, u64)> {
        let mut out = Vec::with_capacity(self.holes);
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL || !stack.is_empty() {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            if let Some(n) = stack.pop() {
                let node = &self.nodes[n as usize];
                out.push((node.off, node.len));
                t = node.right;
            }
        }
        out.into_iter()
    }

    /// Bytes of the holes that whole extents of `unit` bytes can use: each hole counts
    /// `⌊len / unit⌋ · unit`. Space accounting counts the rest as used (fragments too small
    /// for a node, format.md B12). Subtrees whose largest hole is below `unit` are skipped (A2).
    pub fn free_in_units(&self, unit: u64) -> u64 {
        let unit = unit.max(ALIGN);
        let mut total = 0;
        let mut stack = vec![self.root];
        while let Some(t) = stack.pop() {
            if t == NIL || self.nodes[t as usize].max < unit {
                continue;
            }
            let n = &self.nodes[t as usize];
            total += n.len / unit * unit;
            stack.push(n.left);
            stack.push(n.right);
        }
        total
    }

    /// The hole containing byte `offset`, if that byte is free.
    pub fn hole_containing(&self, offset: u64) -> Option<(u64, u64)> {
        self.last_at_or_before(offset)
            .filter(|&(h, len)| offset < h + len)
    }

    /// Depth of the treap (0 when there are no holes); for balance tests.
    pub fn depth(&self) -> usize {
        let mut deepest = 0;
        let mut stack = vec![(self.root, 1usize)];
        while let Some((t, d)) = stack.pop() {
            if t != NIL {
                deepest = deepest.max(d);
                let n = &self.nodes[t as usize];
                stack.push((n.left, d + 1));
                stack.push((n.right, d + 1));
            }
        }
        deepest
    }

    /// Number of holes.
    pub fn hole_count(&self) -> usize {
        self.holes
    }

    // ---- treap internals ----

    fn max_of(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].max
        }
    }

    fn fix(&mut self, t: u32) {
        let n = &self.nodes[t as usize];
        let m = n.len.max(self.max_of(n.left)).max(self.max_of(n.right));
        self.nodes[t as usize].max = m;
    }

    /// Lowest-offset hole of at least `len` bytes: descend left while the left subtree has a big
    /// enough hole, because everything there has a lower offset (A2 makes this one path).
    fn first_fit(&self, len: u64) -> Option<(u64, u64)> {
        let mut t = self.root;
        if self.max_of(t) < len {
            return None;
        }
        while t != NIL {
            let n = &self.nodes[t as usize];
            if self.max_of(n.left) >= len {
                t = n.left;
            } else if n.len >= len {
                return Some((n.off, n.len));
            } else {
                t = n.right;
            }
        }
        None
    }

    fn last_at_or_before(&self, off: u64) -> Option<(u64, u64)> {
        let (mut t, mut best) = (self.root, None);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.off <= off {
                best = Some((n.off, n.len));
                t = n.right;
            } else {
                t = n.left;
            }
        }
        best
    }

    fn first_after(&self, off: u64) -> Option<(u64, u64)> {
        let (mut t, mut best) = (self.root, None);
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.off > off {
                best = Some((n.off, n.len));
                t = n.left;
            } else {
                t = n.right;
            }
        }
        best
    }

    /// Splits `t` into (keys < `key`, keys >= `key`).
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].off < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.fix(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.fix(t);
            (l, t)
        }
    }

    /// Joins two treaps where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].prio >= self.nodes[b as usize].prio {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.fix(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.fix(b);
            b
        }
    }

    fn next_prio(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn insert(&mut self, off: u64, len: u64) {
        let node = Node {
            off,
            len,
            max: len,
            prio: self.next_prio(),
            left: NIL,
            right: NIL,
        };
        let idx = match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let (l, r) = self.split(self.root, off);
        let l = self.merge(l, idx);
        self.root = self.merge(l, r);
        self.holes += 1;
    }

    fn remove(&mut self, off: u64) {
        let (l, r) = self.split(self.root, off);
        let (m, r) = self.split(r, off + 1);
        debug_assert!(m != NIL && self.nodes[m as usize].off == off);
        if m != NIL {
            self.spare.push(m);
            self.holes -= 1;
        }
        self.root = self.merge(l, r);
    }

    /// Verifies A1 and A2; panics with a description if either is broken. For tests.
    #[doc(hidden)]
    pub fn check(&self) {
        let holes: Vec<_> = self.holes().collect();
        assert_eq!(holes.len(), self.holes);
        let mut prev_end = None;
        for &(off, len) in &holes {
            assert!(
                len > 0 && off >= self.start && off + len < self.end,
                "A1 at {off}"
            );
            if let Some(p) = prev_end {
                assert!(off > p, "A1: holes at {off} touch or overlap");
            }
            prev_end = Some(off + len);
        }
        assert_eq!(self.free_bytes, holes.iter().map(|h| h.1).sum::<u64>());
        let mut stack = vec![self.root];
        while let Some(t) = stack.pop() {
            if t != NIL {
                let n = &self.nodes[t as usize];
                let m = n.len.max(self.max_of(n.left)).max(self.max_of(n.right));
                assert_eq!(n.max, m, "A2: stale max at {}", n.off);
                for c in [n.left, n.right] {
                    if c != NIL {
                        assert!(self.nodes[c as usize].prio <= n.prio, "A2: heap order");
                    }
                }
                stack.push(n.left);
                stack.push(n.right);
            }
        }
    }
}
