//! Message buffers: the per-child queues of pending messages in an internal node.
//!
//! Owns the packed buffer (messages appended in MSN order — invariant N3) and two indexes over
//! it: point messages sorted by (key, MSN), and range deletes in MSN order. The packed bytes are
//! the partition's uncompressed bytes, so writing a buffer is one compression call.

use crate::error::Result;
use crate::ids::Msn;
use crate::msg::{Kind, MsgRef, Op};
use crate::varint::Reader;

/// Pending messages for one child.
#[derive(Clone, Debug, Default)]
pub(crate) struct MsgBuffer {
    data: Vec<u8>,
    sorted: Vec<u32>,
    ranges: Vec<u32>,
}

impl MsgBuffer {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Packed bytes held (what decides which child is flushed).
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn count(&self) -> usize {
        self.sorted.len() + self.ranges.len()
    }

    pub(crate) fn mem(&self) -> usize {
        self.data.capacity()
            + (self.sorted.capacity() + self.ranges.capacity()) * 4
            + std::mem::size_of::<Self>()
    }

    #[inline]
    fn at(&self, off: u32) -> MsgRef<'_> {
        MsgRef::decode_trusted(&self.data, off as usize)
    }

    fn index(&mut self, off: u32) {
        let m = MsgRef::decode_trusted(&self.data, off as usize);
        if m.kind == Kind::RangeDelete {
            self.ranges.push(off);
            return;
        }
        let (key, msn) = (m.key, m.msn);
        // New messages usually carry the highest MSN, so the upper bound of the key is the spot.
        let pos = self.sorted.partition_point(|&o| {
            let x = MsgRef::decode_trusted(&self.data, o as usize);
            (x.key, x.msn) <= (key, msn)
        });
        self.sorted.insert(pos, off);
    }

    /// Appends a new message.
    pub(crate) fn push(&mut self, op: &Op, msn: Msn) {
        let off = self.data.len() as u32;
        op.encode(msn, &mut self.data);
        self.index(off);
    }

    /// Appends a copy of a message from another buffer.
    pub(crate) fn push_raw(&mut self, src: &[u8]) {
        let off = self.data.len() as u32;
        self.data.extend_from_slice(src);
        self.index(off);
    }

    /// Range deletes in MSN order.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = MsgRef<'_>> + '_ {
        self.ranges.iter().map(move |&o| self.at(o))
    }

    /// Every message in MSN order, with its packed bytes.
    pub(crate) fn in_msn_order(&self) -> impl Iterator<Item = (MsgRef<'_>, &[u8])> + '_ {
        let mut pos = 0usize;
        std::iter::from_fn(move || {
            if pos >= self.data.len() {
                return None;
            }
            let m = MsgRef::decode_trusted(&self.data, pos);
            let raw = &self.data[pos..pos + m.len];
            pos += m.len;
            Some((m, raw))
        })
    }

    /// Point messages for exactly `key`, in MSN order.
    pub(crate) fn for_key<'a>(&'a self, key: &[u8], out: &mut Vec<MsgRef<'a>>) {
        let start = self.sorted.partition_point(|&o| self.at(o).key < key);
        for &o in &self.sorted[start..] {
            let m = self.at(o);
            if m.key != key {
                break;
            }
            out.push(m);
        }
    }

    /// Point messages with keys in `[lo, hi)` (`hi = None`: unbounded), in (key, MSN) order.
    pub(crate) fn points_in<'a>(&'a self, lo: &[u8], hi: Option<&[u8]>, out: &mut Vec<MsgRef<'a>>) {
        let start = self.sorted.partition_point(|&o| self.at(o).key < lo);
        for &o in &self.sorted[start..] {
            let m = self.at(o);
            if hi.is_some_and(|h| m.key >= h) {
                break;
            }
            out.push(m);
        }
    }

    /// Serializes as partition bytes: `count u32 | messages`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.count() as u32).to_le_bytes());
        out.extend_from_slice(&self.data);
    }

    /// Parses partition bytes from disk, validating every message and the MSN order.
    pub(crate) fn decode(raw: &[u8], what: &dyn Fn() -> String) -> Result<MsgBuffer> {
        let mut r = Reader::new(raw, what);
        let count = r.u32()? as usize;
        let base = r.pos();
        let mut buf = MsgBuffer {
            data: raw[base..].to_vec(),
            sorted: Vec::new(),
            ranges: Vec::new(),
        };
        let mut last = Msn(0);
        let mut points = Vec::with_capacity(count.min(raw.len() / 10));
        for _ in 0..count {
            let (kind, start) = MsgRef::validate(&mut r)?;
            let off = (start - base) as u32;
            let m = buf.at(off);
            if m.msn <= last && last != Msn(0) {
                return Err(r.err("messages out of MSN order (invariant N3)"));
            }
            last = m.msn;
            if kind == Kind::RangeDelete {
                buf.ranges.push(off);
            } else {
                points.push(off);
            }
        }
        if r.remaining() != 0 {
            return Err(r.err(format!(
                "{} trailing bytes after {count} messages",
                r.remaining()
            )));
        }
        // Data order is MSN order, so a stable sort by key yields (key, MSN) order.
        points.sort_by(|&a, &b| buf.at(a).key.cmp(buf.at(b).key));
        buf.sorted = points;
        Ok(buf)
    }
}
