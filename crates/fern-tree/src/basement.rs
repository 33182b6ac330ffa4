//! Basement nodes: the independently readable, sorted partitions of a leaf.
//!
//! Owns the packed row format (`klen varint | vlen varint | key | value`, rows in strictly
//! ascending key order — invariant N2) and applying a batch of messages to the rows by one merge
//! pass. The in-memory bytes are exactly the partition's uncompressed bytes after a small
//! header, so writing a basement is one compression call and reading one is a decompression plus
//! one validating pass that rebuilds the offset index.

use std::borrow::Cow;
use std::cmp::Ordering;

use crate::error::Result;
use crate::ids::Msn;
use crate::keycmp;
use crate::msg::{self, Kind, MsgRef, UpsertRegistry};
use crate::varint::{get_varint_trusted, put_varint, varint_len, Reader};
use crate::{MAX_KEY_LEN, MAX_VALUE_LEN};

/// A sorted run of rows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Basement {
    data: Vec<u8>,
    offs: Vec<u32>,
    /// Highest MSN applied to this basement; messages at or below it are skipped (invariant I4).
    pub max_msn: Msn,
}

/// Most point messages [`Basement::apply`] edits into the rows in place; more are merged in
/// one pass over all rows.
const IN_PLACE_MAX: usize = 4;

/// Moves row offsets by `delta` bytes (rows after a changed row).
fn shift(offs: &mut [u32], delta: i64) {
    for o in offs {
        *o = (*o as i64 + delta) as u32;
    }
}

/// The length of the row `put_row` writes.
fn row_len(key: &[u8], value: &[u8]) -> usize {
    varint_len(key.len() as u64) + varint_len(value.len() as u64) + key.len() + value.len()
}

/// Appends one packed row.
#[inline]
fn put_row(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    put_varint(out, key.len() as u64);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

impl Basement {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.offs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    /// Bytes of packed rows (what the partition holds before compression).
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Heap memory held, for the cache's accounting.
    pub(crate) fn mem(&self) -> usize {
        self.data.capacity() + self.offs.capacity() * 4 + std::mem::size_of::<Self>()
    }

    /// Row `i` as (key, value).
    #[inline]
    pub(crate) fn row(&self, i: usize) -> (&[u8], &[u8]) {
        let p = self.offs[i] as usize;
        let (kl, p) = get_varint_trusted(&self.data, p);
        let (vl, p) = get_varint_trusted(&self.data, p);
        let k = &self.data[p..p + kl as usize];
        let v = &self.data[p + kl as usize..p + kl as usize + vl as usize];
        (k, v)
    }

    #[inline]
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        self.row(i).0
    }

    /// Packed bytes of row `i`, for copying a row unchanged.
    fn raw_row(&self, i: usize) -> &[u8] {
        let start = self.offs[i] as usize;
        let end = self
            .offs
            .get(i + 1)
            .map(|&o| o as usize)
            .unwrap_or(self.data.len());
        &self.data[start..end]
    }

    /// Binary search by key: Ok(index) if present, Err(insertion point) otherwise. A key past
    /// the last row (rows written in key order: new inodes, appended blocks) takes one
    /// comparison.
    pub(crate) fn search(&self, key: &[u8]) -> std::result::Result<usize, usize> {
        if let Some(&last) = self.offs.last() {
            if keycmp::lt(self.key_at_off(last), key) {
                return Err(self.offs.len());
            }
        }
        self.offs
            .binary_search_by(|&o| keycmp::cmp(self.key_at_off(o), key))
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.search(key).ok().map(|i| self.row(i).1)
    }

    /// Index of the first row with key >= `key`.
    pub(crate) fn lower_bound(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Ok(i) | Err(i) => i,
        }
    }

    /// Drops every row with a key at or after `key`.
    pub(crate) fn truncate_at(&mut self, key: &[u8]) {
        let r = self.lower_bound(key);
        if let Some(&o) = self.offs.get(r) {
            self.data.truncate(o as usize);
            self.offs.truncate(r);
        }
    }

    /// Drops every row with a key below `key`.
    pub(crate) fn drop_before(&mut self, key: &[u8]) {
        let r = self.lower_bound(key);
        let cut = self.offs.get(r).map_or(self.data.len(), |&o| o as usize);
        self.data.drain(..cut);
        self.offs.drain(..r);
        shift(&mut self.offs, -(cut as i64));
    }

    /// Applies messages to the rows in one merge pass.
    ///
    /// `points` are point messages sorted by (key, msn); `ranges` are range deletes in MSN order.
    /// Messages at or below `max_msn` were applied before and are skipped (invariant I4).
    pub(crate) fn apply(
        &mut self,
        points: &[MsgRef<'_>],
        ranges: &[MsgRef<'_>],
        upserts: &UpsertRegistry,
    ) -> Result<()> {
        let floor = self.max_msn;
        if points.len() <= IN_PLACE_MAX && ranges.iter().all(|r| r.msn <= floor) {
            return self.apply_in_place(points, upserts);
        }
        self.apply_merging(points, ranges, upserts)
    }

    /// [`apply`](Self::apply) by one merge pass into a new row array: for many messages or
    /// range deletes.
    fn apply_merging(
        &mut self,
        points: &[MsgRef<'_>],
        ranges: &[MsgRef<'_>],
        upserts: &UpsertRegistry,
    ) -> Result<()> {
        let floor = self.max_msn;
        let ranges: Vec<MsgRef<'_>> = ranges.iter().filter(|r| r.msn > floor).copied().collect();
        // Room for every row that stays and every message's row (an upsert's value may still
        // grow it): sized from the messages themselves, since growing a basement-sized array
        // mid-merge copies it (a 20,000-name directory's entries, ~100 bytes each, overflowed
        // a fixed 64 bytes per message and were a sixth of a cold listing's time).
        let incoming: usize = points.iter().map(|p| row_len(p.key, p.payload)).sum();
        let mut out = Vec::with_capacity(self.data.len() + incoming);
        let mut offs = Vec::with_capacity(self.offs.len() + points.len());
        let mut max = floor;
        let (mut i, mut j) = (0usize, 0usize);
        while i < self.len() || j < points.len() {
            if ranges.is_empty() {
                // Without range deletes, the rows before the next message's key are copied
                // unchanged: find them by binary search and copy them as one slice, instead
                // of comparing every row (a small batch into a full basement is the common
                // case: a leaf root, a hot key pushed down).
                let at = match points.get(j) {
                    Some(p) => i + self.lower_bound_from(i, p.key),
                    None => self.len(),
                };
                self.copy_rows(i, at, &mut out, &mut offs);
                i = at;
                if j == points.len() {
                    break;
                }
            }
            let order = match (i < self.len(), j < points.len()) {
                (true, true) => self.key(i).cmp(points[j].key),
                (true, false) => Ordering::Less,
                _ => Ordering::Greater,
            };
            let (key, old): (&[u8], Option<&[u8]>) = match order {
                Ordering::Less => {
                    // A row no point message touches: only a range delete can remove it.
                    let k = self.key(i);
                    if !ranges.iter().any(|r| r.covers(k)) {
                        offs.push(out.len() as u32);
                        out.extend_from_slice(self.raw_row(i));
                    }
                    i += 1;
                    continue;
                }
                Ordering::Equal => {
                    let (k, v) = self.row(i);
                    i += 1;
                    (k, Some(v))
                }
                Ordering::Greater => (points[j].key, None),
            };
            let mut end = j;
            while end < points.len() && points[end].key == key {
                end += 1;
            }
            let msgs = &points[j..end];
            j = end;
            // Borrowed until an upsert makes a value: the row's old value and an insert's
            // payload are copied once, into the new rows.
            let mut value = old.map(Cow::Borrowed);
            // Interleave this key's point messages with the covering range deletes by MSN.
            let mut covering = ranges.iter().filter(|r| r.covers(key)).peekable();
            for m in msgs.iter().filter(|m| m.msn > floor) {
                while let Some(r) = covering.next_if(|r| r.msn < m.msn) {
                    value = msg::apply_borrowed(r, key, value, upserts)?;
                }
                value = msg::apply_borrowed(m, key, value, upserts)?;
                max = max.max(m.msn);
            }
            if covering.next().is_some() {
                value = None;
            }
            if let Some(v) = value {
                offs.push(out.len() as u32);
                put_row(&mut out, key, &v);
            }
        }
        for r in &ranges {
            max = max.max(r.msn);
        }
        self.data = out;
        self.offs = offs;
        self.max_msn = max;
        Ok(())
    }

    /// [`apply`](Self::apply) of a few point messages (no range delete above the floor) by
    /// editing the rows where they stand: each changed row is spliced into place (the rows
    /// after it move, the offsets after it shift), instead of building a new row array. A leaf
    /// root takes every write batch this way (a small tree: the file system's inode and
    /// directory trees), and rebuilding its 16 KiB basement per batch — an allocation and a
    /// copy of every row — was 12 % of the FUSE request thread's time in postmark.
    fn apply_in_place(&mut self, points: &[MsgRef<'_>], upserts: &UpsertRegistry) -> Result<()> {
        let floor = self.max_msn;
        let mut max = floor;
        let mut j = 0;
        while j < points.len() {
            let key = points[j].key;
            let mut end = j;
            while end < points.len() && points[end].key == key {
                end += 1;
            }
            // In MSN order; those at or below the floor were applied before (I4).
            let msgs = &points[j..end];
            j = end;
            let live = &msgs[msgs.partition_point(|m| m.msn <= floor)..];
            let Some(newest) = live.last() else {
                continue;
            };
            max = max.max(newest.msn);
            let found = self.search(key);
            // The newest insert or delete sets the value by itself: only the upserts after it
            // read a value, and the row's old value is read only when there is none.
            let (mut value, rest) = match live
                .iter()
                .rposition(|m| matches!(m.kind, Kind::Insert | Kind::Delete))
            {
                Some(at) => (
                    (live[at].kind == Kind::Insert).then_some(Cow::Borrowed(live[at].payload)),
                    &live[at + 1..],
                ),
                None => (found.ok().map(|i| Cow::Borrowed(self.row(i).1)), live),
            };
            for m in rest {
                value = msg::apply_borrowed(m, key, value, upserts)?;
            }
            let mut row = Vec::new();
            if let Some(v) = &value {
                row.reserve_exact(key.len() + v.len() + 2 * 10);
                put_row(&mut row, key, v);
            }
            let is_deleted = value.is_none();
            drop(value);
            match found {
                Ok(i) => {
                    let start = self.offs[i] as usize;
                    let old_len = self.raw_row(i).len();
                    self.splice(start..start + old_len, &row);
                    if is_deleted {
                        self.offs.remove(i);
                        shift(&mut self.offs[i..], -(old_len as i64));
                    } else {
                        shift(&mut self.offs[i + 1..], row.len() as i64 - old_len as i64);
                    }
                }
                Err(i) if !is_deleted => {
                    let start = self.offs.get(i).map_or(self.data.len(), |&o| o as usize);
                    self.splice(start..start, &row);
                    self.offs.insert(i, start as u32);
                    shift(&mut self.offs[i + 1..], row.len() as i64);
                }
                Err(_) => {} // deleting a row that is not here
            }
        }
        self.max_msn = max;
        Ok(())
    }

    /// Replaces `data[range]` with `bytes`, growing the allocation by at least an eighth when
    /// it must grow (so the rows of a basement written one by one are not reallocated every
    /// time, while the cache's accounting of its capacity stays near its size).
    ///
    /// Moves the tail once and copies `bytes` in with `memcpy`: `Vec::splice` fills from an
    /// iterator byte by byte, which was a tenth of the instructions of a small write batch
    /// into a leaf root.
    fn splice(&mut self, range: std::ops::Range<usize>, bytes: &[u8]) {
        let (start, end, len) = (range.start, range.end, self.data.len());
        let grow = bytes.len().saturating_sub(range.len());
        if len + grow > self.data.capacity() {
            self.data.reserve_exact(grow.max(len / 8));
        }
        let new_end = start + bytes.len();
        if new_end > end {
            self.data.resize(len + (new_end - end), 0);
        }
        self.data.copy_within(end..len, new_end);
        self.data.truncate(len + new_end - end);
        self.data[start..new_end].copy_from_slice(bytes);
    }

    /// Index, relative to `from`, of the first row at or after `from` with key >= `key`.
    ///
    /// Galloping: probes `from`, `from + 1`, `from + 3`, ... then searches the last step, so
    /// the cost is logarithmic in the distance moved — cheap both for a few messages spread
    /// over many rows and for a message on nearly every row.
    fn lower_bound_from(&self, from: usize, key: &[u8]) -> usize {
        let rows = &self.offs[from..];
        let below = |o: &u32| keycmp::lt(self.key_at_off(*o), key);
        let (mut lo, mut step) = (0usize, 1usize);
        while lo < rows.len() && below(&rows[lo]) {
            lo += step;
            step *= 2;
        }
        // rows[..lo - step / 2 + 1] are below `key` (or lo == 0); the answer is in between.
        let start = if lo == 0 { 0 } else { lo + 1 - step / 2 };
        let end = lo.min(rows.len());
        start + rows[start..end].partition_point(below)
    }

    #[inline]
    fn key_at_off(&self, o: u32) -> &[u8] {
        let (kl, p) = get_varint_trusted(&self.data, o as usize);
        let (_, p) = get_varint_trusted(&self.data, p);
        &self.data[p..p + kl as usize]
    }

    /// Appends rows `from..to` unchanged to a basement being built as (`out`, `offs`).
    fn copy_rows(&self, from: usize, to: usize, out: &mut Vec<u8>, offs: &mut Vec<u32>) {
        if from >= to {
            return;
        }
        let start = self.offs[from] as usize;
        let end = self.offs.get(to).map_or(self.data.len(), |&o| o as usize);
        let base = out.len() as u32;
        offs.extend(self.offs[from..to].iter().map(|&o| o - start as u32 + base));
        out.extend_from_slice(&self.data[start..end]);
    }

    /// Splits off rows `at..` into a new basement.
    pub(crate) fn split_off(&mut self, at: usize) -> Basement {
        let mut right = Basement {
            max_msn: self.max_msn,
            ..Basement::default()
        };
        if at >= self.len() {
            return right;
        }
        let cut = self.offs[at] as usize;
        right.data = self.data[cut..].to_vec();
        right.offs = self.offs[at..].iter().map(|&o| o - cut as u32).collect();
        self.data.truncate(cut);
        self.offs.truncate(at);
        self.data.shrink_to_fit();
        self.offs.shrink_to_fit();
        right
    }

    /// Index at which to split so that the left part holds about half the bytes.
    pub(crate) fn middle(&self) -> usize {
        let half = (self.data.len() / 2) as u32;
        // Both halves keep at least one row, even when one row holds most of the bytes.
        self.offs
            .partition_point(|&o| o < half)
            .clamp(1, self.len().saturating_sub(1).max(1))
    }

    /// Serializes as partition bytes: `max_msn u64 | count u32 | rows`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.max_msn.0.to_le_bytes());
        out.extend_from_slice(&(self.offs.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.data);
    }

    /// Parses partition bytes from disk, checking every length and the key order. An owned
    /// buffer (a decompressed partition) becomes the rows' bytes without a copy.
    pub(crate) fn decode(raw: Cow<'_, [u8]>, what: &dyn Fn() -> String) -> Result<Basement> {
        let (max_msn, offs, base) = Basement::check(&raw, what)?;
        let data = match raw {
            Cow::Borrowed(b) => b[base..].to_vec(),
            Cow::Owned(mut v) => {
                v.drain(..base);
                v
            }
        };
        Ok(Basement {
            data,
            offs,
            max_msn,
        })
    }

    /// Checks partition bytes: every length and the key order. Returns the basement's
    /// `max_msn`, its row offsets and where the rows start.
    fn check(raw: &[u8], what: &dyn Fn() -> String) -> Result<(Msn, Vec<u32>, usize)> {
        let mut r = Reader::new(raw, what);
        let max_msn = Msn(r.u64()?);
        let count = r.u32()? as usize;
        let base = r.pos();
        let mut offs = Vec::with_capacity(count.min(raw.len() / 2));
        let mut prev: Option<&[u8]> = None;
        for _ in 0..count {
            offs.push((r.pos() - base) as u32);
            let kl = r.varint()?;
            let vl = r.varint()?;
            if kl > MAX_KEY_LEN as u64 || vl > MAX_VALUE_LEN as u64 {
                return Err(r.err(format!("row lengths {kl}/{vl} exceed the limits")));
            }
            let k = r.bytes(kl as usize)?;
            r.bytes(vl as usize)?;
            if prev.is_some_and(|p| p >= k) {
                return Err(r.err("rows out of order (invariant N2)"));
            }
            prev = Some(k);
        }
        if r.remaining() != 0 {
            return Err(r.err(format!(
                "{} trailing bytes after {count} rows",
                r.remaining()
            )));
        }
        Ok((max_msn, offs, base))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::msg::Kind;
    use crate::UpsertId;

    /// Upsert 7 appends its argument to the value (creating the row if absent); an empty
    /// argument deletes the row.
    fn upserts() -> UpsertRegistry {
        let mut r = UpsertRegistry::default();
        r.register(
            UpsertId(7),
            Arc::new(|_k: &[u8], old: Option<&[u8]>, arg: &[u8]| {
                if arg.is_empty() {
                    return None;
                }
                let mut v = old.unwrap_or_default().to_vec();
                v.extend_from_slice(arg);
                Some(v)
            }),
        );
        r
    }

    fn basement(rows: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>, max_msn: u64) -> Basement {
        let mut b = Basement {
            max_msn: Msn(max_msn),
            ..Basement::default()
        };
        for (k, v) in rows {
            b.offs.push(b.data.len() as u32);
            put_row(&mut b.data, k, v);
        }
        b
    }

    fn rows_of(b: &Basement) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..b.len())
            .map(|i| (b.row(i).0.to_vec(), b.row(i).1.to_vec()))
            .collect()
    }

    proptest! {
        /// The in-place path and the merge pass give the same rows and the same `max_msn`,
        /// whatever the mix of inserts, deletes and upserts, new and existing keys, and
        /// messages at or below the floor (I4) — and both equal the messages applied one by
        /// one (each path skips work an insert or delete makes moot).
        #[test]
        fn editing_in_place_equals_merging(
            rows in prop::collection::btree_map(
                prop::collection::vec(0u8..8, 1..3),
                prop::collection::vec(any::<u8>(), 0..40),
                0..30,
            ),
            floor in 0u64..4,
            msgs in prop::collection::vec(
                (prop::collection::vec(0u8..8, 1..3), 0u8..3, prop::collection::vec(any::<u8>(), 0..20)),
                1..=IN_PLACE_MAX,
            ),
        ) {
            // Sorted by (key, msn), as a buffer hands them over; MSNs 1.. straddle the floor.
            let mut msgs: Vec<_> = msgs.into_iter().enumerate().collect();
            msgs.sort_by(|a, b| (&a.1 .0, a.0).cmp(&(&b.1 .0, b.0)));
            let refs: Vec<MsgRef<'_>> = msgs
                .iter()
                .map(|(n, (key, kind, payload))| MsgRef {
                    kind: [Kind::Insert, Kind::Delete, Kind::Upsert][*kind as usize],
                    msn: Msn(*n as u64 + 1),
                    key,
                    payload: if *kind == 1 { &[] } else { payload },
                    upsert: UpsertId(7),
                    len: 0,
                })
                .collect();
            let up = upserts();
            // The model: every message above the floor applied in MSN order to its row.
            let mut expect = rows.clone();
            for m in refs.iter().filter(|m| m.msn.0 > floor) {
                let old = expect.remove(m.key);
                if let Some(v) = msg::apply(m, m.key, old, &up).unwrap() {
                    expect.insert(m.key.to_vec(), v);
                }
            }
            let mut a = basement(&rows, floor);
            let mut b = a.clone();
            a.apply_in_place(&refs, &up).unwrap();
            b.apply_merging(&refs, &[], &up).unwrap();
            prop_assert_eq!(rows_of(&a), expect.into_iter().collect::<Vec<_>>());
            prop_assert_eq!(rows_of(&a), rows_of(&b));
            prop_assert_eq!(a.max_msn, b.max_msn);
            prop_assert_eq!(&a.data, &b.data);
        }
    }
}
