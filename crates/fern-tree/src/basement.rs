//! Basement nodes: the independently readable, sorted partitions of a leaf.
//!
//! Owns the packed row format (`klen varint | vlen varint | key | value`, rows in strictly
//! ascending key order — invariant N2) and applying a batch of messages to the rows by one merge
//! pass. The in-memory bytes are exactly the partition's uncompressed bytes after a small
//! header, so writing a basement is one compression call and reading one is a decompression plus
//! one validating pass that rebuilds the offset index.

use std::cmp::Ordering;

use crate::error::Result;
use crate::ids::Msn;
use crate::msg::{self, MsgRef, UpsertRegistry};
use crate::varint::{get_varint_trusted, put_varint, Reader};
use crate::{MAX_KEY_LEN, MAX_VALUE_LEN};

/// A sorted run of rows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Basement {
    data: Vec<u8>,
    offs: Vec<u32>,
    /// Highest MSN applied to this basement; messages at or below it are skipped (invariant I4).
    pub max_msn: Msn,
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

    /// Binary search by key: Ok(index) if present, Err(insertion point) otherwise.
    pub(crate) fn search(&self, key: &[u8]) -> std::result::Result<usize, usize> {
        self.offs.binary_search_by(|&o| {
            let (kl, p) = get_varint_trusted(&self.data, o as usize);
            let (_, p) = get_varint_trusted(&self.data, p);
            self.data[p..p + kl as usize].cmp(key)
        })
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
        let ranges: Vec<MsgRef<'_>> = ranges.iter().filter(|r| r.msn > floor).copied().collect();
        let mut out = Vec::with_capacity(self.data.len() + 64 * points.len());
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
            let mut value = old.map(<[u8]>::to_vec);
            // Interleave this key's point messages with the covering range deletes by MSN.
            let mut covering = ranges.iter().filter(|r| r.covers(key)).peekable();
            for m in msgs.iter().filter(|m| m.msn > floor) {
                while let Some(r) = covering.next_if(|r| r.msn < m.msn) {
                    value = msg::apply(r, key, value, upserts)?;
                }
                value = msg::apply(m, key, value, upserts)?;
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

    /// Index, relative to `from`, of the first row at or after `from` with key >= `key`.
    ///
    /// Galloping: probes `from`, `from + 1`, `from + 3`, ... then searches the last step, so
    /// the cost is logarithmic in the distance moved — cheap both for a few messages spread
    /// over many rows and for a message on nearly every row.
    fn lower_bound_from(&self, from: usize, key: &[u8]) -> usize {
        let rows = &self.offs[from..];
        let below = |o: &u32| self.key_at_off(*o) < key;
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

    /// Parses partition bytes from disk, checking every length and the key order.
    pub(crate) fn decode(raw: &[u8], what: &dyn Fn() -> String) -> Result<Basement> {
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
        Ok(Basement {
            data: raw[base..].to_vec(),
            offs,
            max_msn,
        })
    }
}
