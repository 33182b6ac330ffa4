//! Message buffers: the per-child queues of pending messages in an internal node.
//!
//! Owns the packed buffer (messages appended in MSN order — invariant N3) and two indexes over
//! it: point messages sorted by (key, MSN), and range deletes in MSN order. The packed bytes are
//! the partition's uncompressed bytes, so writing a buffer is one compression call.

use foldhash::{HashMap, HashMapExt};

use crate::error::Result;
use crate::ids::Msn;
use crate::keycmp;
use crate::msg::{coalesce, Coalesced, Kind, MsgRef, Op, UpsertRegistry, DEAD};
use crate::varint::{get_varint_trusted, Reader};

/// Pending messages for one child.
#[derive(Debug, Default)]
pub(crate) struct MsgBuffer {
    data: Vec<u8>,
    sorted: Vec<u32>,
    ranges: Vec<u32>,
    /// Point messages appended since the last `seal`, not yet in `sorted`.
    pending: Vec<u32>,
    /// Bytes of messages coalesced into newer ones (marked `DEAD` in `data`, in no index).
    dead: usize,
    /// Messages before this offset of `data` are being flushed by a detached flush
    /// (design.md §2.5, DF3): no newer message coalesces into them and the bytes are not
    /// compacted, so the flush's copy and the install's removal name the same messages. 0: none.
    frozen: usize,
    /// The first eight bytes of each key of `sorted`, as integers in the same order, for an
    /// internal node's buffer read from disk with at least [`HEADS_MIN`] messages and not
    /// changed since ([`MsgBuffer::index_heads`]; empty otherwise, and every change clears
    /// it). A cold point read searches its ancestors' buffers for its key: by `sorted` each
    /// probe decodes a message somewhere in the buffer (a cache miss each, 14 % of a cold
    /// lookup's CPU at E2 quick size); by `heads` it searches one contiguous array. Only a
    /// hint: every answer found through it is checked against the keys beside it before it is
    /// used ([`MsgBuffer::first_at_or_after`]).
    heads: Vec<u64>,
    /// Whether the last [`MsgBuffer::seal_coalescing`] left an upsert queued behind another
    /// message for its key that it did not fold into — the only way a key's run of messages
    /// grows toward a hot key (flush.rs `cool_hot_keys`); `true` when the round was not
    /// examined. An insert or delete replaces the message before it, and an upsert with a
    /// merge function folds into it, so most rounds need no hot-key search at all.
    upsert_run_grew: bool,
    /// Where the last few messages of short coalescing rounds went in `sorted` (as found,
    /// before their own insertion): hints for the next round's searches. Successive writes
    /// mostly land beside earlier ones — the next name of a directory being removed, its
    /// parent's stat again — so [`place_near`] brackets a key between hints and gallops from
    /// the closest instead of binary-searching the whole index (each probe a decode somewhere
    /// in the buffer). Any value is safe: every hint is checked against the keys around it.
    fingers: [u32; FINGERS],
    /// The next `fingers` slot to overwrite.
    finger_next: u8,
}

/// How many recent places a buffer keeps as search hints ([`MsgBuffer::fingers`]).
const FINGERS: usize = 4;

/// Fewest messages a decoded buffer keeps [`MsgBuffer::heads`] for: below it a binary search
/// of `sorted` is a handful of probes.
const HEADS_MIN: usize = 64;

/// A buffer compacts its packed bytes once this many bytes, and half of them, are dead.
const COMPACT_DEAD_BYTES: usize = 16 << 10;

/// A copy to change: a detached flush's copy of a cached node, a writer's copy of a node a
/// checkpoint still writes. It keeps the original's room for the packed bytes, so the
/// messages it takes next do not first move the whole buffer to a larger allocation (with
/// exact copies, flights moved each child buffer they filled once more: ~1× the flushed
/// bytes, and fresh pages faulted in). Only the bytes held are copied; the room is untouched
/// address space until used. [`MsgBuffer::freeze`]'s copy, which only gives messages away,
/// is exact.
impl Clone for MsgBuffer {
    fn clone(&self) -> Self {
        let mut data = Vec::with_capacity(self.data.capacity());
        data.extend_from_slice(&self.data);
        MsgBuffer {
            data,
            ..self.clone_exact_index()
        }
    }
}

impl MsgBuffer {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Everything but the packed bytes, copied (`data` left empty).
    fn clone_exact_index(&self) -> Self {
        MsgBuffer {
            data: Vec::new(),
            sorted: self.sorted.clone(),
            ranges: self.ranges.clone(),
            pending: self.pending.clone(),
            dead: self.dead,
            frozen: self.frozen,
            heads: self.heads.clone(),
            upsert_run_grew: self.upsert_run_grew,
            fingers: self.fingers,
            finger_next: self.finger_next,
        }
    }

    /// Takes over the allocations of `used` (a buffer whose messages were just flushed) if
    /// this buffer is empty and has less room: what it receives next fills them instead of
    /// regrowing from nothing, if that room is at most `at_most` bytes (flush.rs `Room`).
    pub(crate) fn reuse_room(&mut self, mut used: MsgBuffer, at_most: usize) {
        let room = used.data.capacity();
        // No packed bytes means no message in any index either.
        if room <= at_most && self.data.is_empty() && self.data.capacity() < room {
            used.data.clear();
            used.sorted.clear();
            self.data = used.data;
            self.sorted = used.sorted;
        }
    }

    /// An empty buffer with room for `count` messages of `bytes` packed bytes in all (a batch
    /// knows both before it packs them: no growth while packing).
    pub(crate) fn with_capacity(bytes: usize, count: usize) -> Self {
        MsgBuffer {
            data: Vec::with_capacity(bytes),
            pending: Vec::with_capacity(count),
            ..Self::default()
        }
    }

    /// Whether every point message is in the sorted index (nothing appended since `seal`).
    pub(crate) fn is_sealed(&self) -> bool {
        self.pending.is_empty()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.len() == self.dead
    }

    /// Packed bytes of live messages (what decides which child is flushed, and what is written).
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() - self.dead
    }

    pub(crate) fn count(&self) -> usize {
        self.sorted.len() + self.pending.len() + self.ranges.len()
    }

    pub(crate) fn mem(&self) -> usize {
        self.data.capacity()
            + (self.sorted.capacity() + self.ranges.capacity() + self.pending.capacity()) * 4
            + self.heads.capacity() * 8
            + std::mem::size_of::<Self>()
    }

    #[inline]
    fn at(&self, off: u32) -> MsgRef<'_> {
        MsgRef::decode_trusted(&self.data, off as usize)
    }

    /// The key of the message at `off` (cheaper than a full decode, for sorting).
    #[inline]
    fn key_at(&self, off: u32) -> &[u8] {
        key_at(&self.data, off)
    }

    fn index(&mut self, off: u32) {
        if self.data[off as usize] == Kind::RangeDelete as u8 {
            self.ranges.push(off);
        } else {
            self.pending.push(off);
        }
    }

    /// Merges messages appended since the last call into the sorted index. Writers call it
    /// after appending; readers only see sealed buffers (invariant N7).
    pub(crate) fn seal(&mut self) {
        self.seal_at(None, None);
    }

    /// `seal`, given the order by key this round's messages most likely have: indexes into
    /// the round (its messages in MSN order), as [`KeyOrder`] reads them off a sealed source's
    /// index. The sort then mostly checks it (a stable sort of sorted runs is linear) instead of
    /// ordering the round from scratch. A wrong hint costs time, never order: ties go by MSN
    /// whatever the hint says, and a hint that is not a permutation of the round is ignored.
    pub(crate) fn seal_hinted(&mut self, hint: &[u32]) {
        self.seal_at(None, Some(hint));
    }

    /// `seal`, given for each pending message (in `pending` order) where it goes in `sorted`
    /// as of now — after every sealed message with a key at or below its own — when the caller
    /// already searched for it (coalescing does), so a few new messages cost no new search.
    fn seal_at(&mut self, places: Option<Places>, hint: Option<&[u32]>) {
        if self.pending.is_empty() {
            return;
        }
        self.drop_heads();
        let mut pending = std::mem::take(&mut self.pending);
        let places = places.filter(|p| p.at.len() == pending.len());
        if let Some(Places {
            at,
            by_key: Some(order),
        }) = places.as_ref().filter(|p| p.by_key.is_some())
        {
            // A long round whose key order and places coalescing already found: the merge
            // needs no comparison. `order` is stable by key, so places ascend along it and
            // messages of one key keep MSN order, after every older (sorted) one.
            let mut merged = Vec::with_capacity(self.sorted.len() + pending.len());
            let mut s = 0;
            for &i in order {
                let p = at[i as usize];
                merged.extend_from_slice(&self.sorted[s..p]);
                s = p;
                merged.push(pending[i as usize]);
            }
            merged.extend_from_slice(&self.sorted[s..]);
            self.sorted = merged;
            return;
        }
        if let Some(places) = places.map(|p| p.at) {
            if pending.len() * 16 < self.sorted.len() {
                let mut todo: Vec<(usize, u32)> = places.into_iter().zip(pending).collect();
                // By key, stable: equal keys keep MSN order. Places grow with the key, so
                // inserting from the last one backwards leaves the earlier places valid, and
                // of two messages with one place the older is inserted last, i.e. first.
                todo.sort_by(|a, b| self.key_at(a.1).cmp(self.key_at(b.1)));
                for &(at, off) in todo.iter().rev() {
                    self.sorted.insert(at, off);
                }
                return;
            }
        }
        // Appended in MSN order (offsets grow with the MSN), so sorting by (key, offset) gives
        // (key, MSN) order whatever order a hint started from; every pending message is newer
        // than every sorted one, so ties in the merge go to `sorted` first.
        if let Some(order) = hint.and_then(|h| permuted(&pending, h)) {
            pending = order;
        }
        sort_by_key(&self.data, &mut pending, |off| off);
        if self.sorted.is_empty() {
            self.sorted = pending;
            return;
        }
        if pending.len() * 16 < self.sorted.len() {
            // A few new messages (the common case: a small write batch): binary-search each
            // one's place (after every older message for its key) instead of a full merge,
            // which would compare every key in the buffer on every small batch.
            for off in pending {
                let key = self.key_at(off);
                let at = place_in(&self.data, &self.sorted, key);
                self.sorted.insert(at, off);
            }
            return;
        }
        let old = std::mem::take(&mut self.sorted);
        let mut merged = Vec::with_capacity(old.len() + pending.len());
        let (mut i, mut j) = (0, 0);
        while i < old.len() && j < pending.len() {
            if self.key_at(old[i]) <= self.key_at(pending[j]) {
                merged.push(old[i]);
                i += 1;
            } else {
                merged.push(pending[j]);
                j += 1;
            }
        }
        merged.extend_from_slice(&old[i..]);
        merged.extend_from_slice(&pending[j..]);
        self.sorted = merged;
    }

    /// `seal`, after first coalescing each message appended since the last seal with the
    /// previous message for its key where one message can do the work of both
    /// (`msg::coalesce`), and compacting the packed bytes when many are dead. Messages stay in
    /// MSN order (invariant N3): a replacement takes the newer message's place and MSN.
    ///
    /// `hint`: the round's likely order by key, as for [`MsgBuffer::seal_hinted`].
    pub(crate) fn seal_coalescing(&mut self, upserts: &UpsertRegistry, hint: Option<&[u32]>) {
        // Until the round is examined, any upsert in it may have lengthened a run.
        self.upsert_run_grew = !self.pending.is_empty();
        let places = self.coalesce_pending(upserts, hint);
        self.seal_at(places, hint);
        if self.frozen == 0 && self.dead >= COMPACT_DEAD_BYTES && self.dead * 2 >= self.data.len() {
            self.compact();
        }
    }

    /// Coalesces this round's messages (see `seal_coalescing`). Returns, for each message left
    /// in `pending`, its place in `sorted` (see `seal_at`), found by the search coalescing makes
    /// anyway; `None` when the round was not examined.
    fn coalesce_pending(
        &mut self,
        upserts: &UpsertRegistry,
        hint: Option<&[u32]>,
    ) -> Option<Places> {
        let tail = *self.pending.first()? as usize;
        // A range delete appended in this round sits between the new point messages; such
        // rounds are rare, so they are simply not coalesced.
        if self.ranges.last().is_some_and(|&r| r as usize >= tail) {
            return None;
        }
        if self.pending.len() == 1 {
            return Some(self.coalesce_one(upserts));
        }
        Some(self.coalesce_round(upserts, hint, tail))
    }

    /// [`MsgBuffer::coalesce_pending`] for any round (the pending messages start at `tail`
    /// of the packed bytes, and no range delete is among them).
    fn coalesce_round(
        &mut self,
        upserts: &UpsertRegistry,
        hint: Option<&[u32]>,
        tail: usize,
    ) -> Places {
        // This round's messages in MSN order; `None` once coalesced into a later one. A
        // message that replaced a sealed one takes over its place in `sorted` (the index of
        // that place rides along): it is the newest for its key, so that place is its place.
        // Each also carries where it would be inserted into `sorted` (its search result).
        let mut out: Vec<Option<(Slot, Option<usize>, usize)>> =
            Vec::with_capacity(self.pending.len());
        let mut kill: Vec<u32> = Vec::new();
        let mut changed = false;
        let mut grew = false;
        {
            let data = &self.data;
            let sorted = &self.sorted;
            let pending = &self.pending;
            // A long round (a flush moving a whole buffer, a large batch): one stable sort of
            // the round by key and one galloping walk along `sorted` give every message its
            // place — P log P + P log(S/P) comparisons instead of P binary searches of log S,
            // each probe a cache miss — and the key order is what sealing needs next anyway.
            let bulk = (pending.len() * 16 >= sorted.len()).then(|| {
                let round: Vec<u32> = (0..pending.len() as u32).collect();
                let mut order = hint.and_then(|h| permuted(&round, h)).unwrap_or(round);
                // Ties by index, i.e. MSN, whatever order a hint started from.
                sort_by_key(data, &mut order, |i| pending[i as usize]);
                let mut at = vec![0usize; pending.len()];
                let mut j = 0;
                for &i in &order {
                    j = place_from(data, sorted, j, key_at(data, pending[i as usize]));
                    at[i as usize] = j;
                }
                (order, at)
            });
            let fingers = self.fingers;
            let search = |i: usize, key: &[u8]| match &bulk {
                Some((_, at)) => at[i],
                None => place_near(data, sorted, &fingers, key),
            };
            let mut last = LastByKey::with_capacity(self.pending.len());
            for (i, &off) in self.pending.iter().enumerate() {
                let m = MsgRef::decode_trusted(data, off as usize);
                let mut slot = Slot::Here(off);
                let mut place = None;
                let at;
                // Whether an older message for this key stays buffered before this one.
                let mut behind = false;
                if let Some(j) = last.get(m.key) {
                    // The previous message for this key came in this round.
                    at = out[j].as_ref().map_or_else(|| search(i, m.key), |e| e.2);
                    if let Some((prev, prev_place, _)) = &out[j] {
                        match coalesce(&prev.view(data), &m, upserts) {
                            Coalesced::No => behind = true,
                            Coalesced::DropOlder => {
                                place = *prev_place;
                                out[j] = None;
                            }
                            Coalesced::Replace(b) => {
                                place = *prev_place;
                                out[j] = None;
                                slot = Slot::Made(b);
                            }
                        }
                    }
                } else {
                    // The previous message for this key, if any, is the last sealed one; a
                    // newer range delete covering the key stands between them.
                    at = search(i, m.key);
                    behind = at > 0 && key_at(data, self.sorted[at - 1]) == m.key;
                    // A message being flushed (DF3) is never coalesced into.
                    if behind {
                        if let Some((prev_off, prev)) = self.foldable_before(at, m.key) {
                            match coalesce(&prev, &m, upserts) {
                                Coalesced::No => {}
                                Coalesced::DropOlder => {
                                    behind = false;
                                    kill.push(prev_off);
                                    place = Some(at - 1);
                                }
                                Coalesced::Replace(b) => {
                                    behind = false;
                                    kill.push(prev_off);
                                    place = Some(at - 1);
                                    slot = Slot::Made(b);
                                }
                            }
                        }
                    }
                }
                changed |= place.is_some() || matches!(slot, Slot::Made(_));
                grew |= behind && m.kind == Kind::Upsert;
                last.insert(m.key, out.len());
                out.push(Some((slot, place, at)));
            }
            self.upsert_run_grew = grew;
            if bulk.is_none() {
                for e in out.iter().flatten() {
                    let place = e.1.unwrap_or(e.2);
                    self.fingers[usize::from(self.finger_next)] = place as u32;
                    self.finger_next = (self.finger_next + 1) % FINGERS as u8;
                }
            }
            if !changed && out.iter().all(Option::is_some) {
                return Places {
                    at: out.iter().flatten().map(|e| e.2).collect(),
                    by_key: bulk.map(|(order, _)| order),
                };
            }
            // Rebuild this round's bytes: the surviving messages, in their MSN order.
            let mut fresh = Vec::with_capacity(data.len() - tail);
            let mut pending = Vec::with_capacity(out.len());
            let mut places = Vec::with_capacity(out.len());
            let mut placed = Vec::new();
            for (slot, place, at) in out.iter().flatten() {
                let off = (tail + fresh.len()) as u32;
                match place {
                    Some(i) => placed.push((*i, off)),
                    None => {
                        pending.push(off);
                        places.push(*at);
                    }
                }
                match slot {
                    Slot::Here(o) => {
                        let m = MsgRef::decode_trusted(data, *o as usize);
                        fresh.extend_from_slice(&data[*o as usize..*o as usize + m.len]);
                    }
                    Slot::Made(b) => fresh.extend_from_slice(b),
                }
            }
            drop(out);
            self.data.truncate(tail);
            self.data.extend_from_slice(&fresh);
            self.pending = pending;
            for (i, off) in placed {
                self.sorted[i] = off;
            }
            for &o in &kill {
                let m = MsgRef::decode_trusted(&self.data, o as usize);
                self.dead += m.len;
                self.data[o as usize] |= DEAD;
            }
            Places {
                at: places,
                by_key: None,
            }
        }
    }

    /// The sealed message at `sorted[at - 1]` (offset and view), the last one for `key`,
    /// when a newer message for `key` may fold into it: not being flushed (DF3) and with no
    /// newer range delete covering `key` between them. The caller checked the key.
    fn foldable_before(&self, at: usize, key: &[u8]) -> Option<(u32, MsgRef<'_>)> {
        let off = self.sorted[at - 1];
        if (off as usize) < self.frozen {
            return None;
        }
        let prev = self.at(off);
        let cut = self.ranges.iter().any(|&r| {
            let r = self.at(r);
            r.msn > prev.msn && r.covers(key)
        });
        (!cut).then_some((off, prev))
    }

    /// [`MsgBuffer::coalesce_pending`] for the commonest round, one point message (a setattr's
    /// stat, a write's block or stat: one per tree): the same outcome without the long
    /// round's bookkeeping — no per-round lists, no rebuilt round bytes. The message folds into
    /// the last sealed message of its key (unless that one is being flushed, DF3, or a newer
    /// range delete covering the key stands between them) and takes its place in `sorted`;
    /// otherwise it is left pending with its place.
    fn coalesce_one(&mut self, upserts: &UpsertRegistry) -> Places {
        let off = self.pending[0];
        let data = &self.data;
        let m = MsgRef::decode_trusted(data, off as usize);
        let at = place_near(data, &self.sorted, &self.fingers, m.key);
        let behind = at > 0 && key_at(data, self.sorted[at - 1]) == m.key;
        let folded = match behind.then(|| self.foldable_before(at, m.key)).flatten() {
            Some((_, prev)) => coalesce(&prev, &m, upserts),
            None => Coalesced::No,
        };
        let upsert = m.kind == Kind::Upsert;
        let place = match folded {
            Coalesced::No => at,
            Coalesced::DropOlder | Coalesced::Replace(_) => at - 1,
        };
        self.fingers[usize::from(self.finger_next)] = place as u32;
        self.finger_next = (self.finger_next + 1) % FINGERS as u8;
        let replacement = match folded {
            Coalesced::No => {
                self.upsert_run_grew = behind && upsert;
                return Places {
                    at: vec![at],
                    by_key: None,
                };
            }
            Coalesced::DropOlder => None,
            Coalesced::Replace(b) => Some(b),
        };
        self.upsert_run_grew = false;
        // The message stays the newest at the end of the packed bytes (or its replacement
        // does), and takes the older one's place in `sorted`; the older one dies.
        if let Some(b) = replacement {
            self.data.truncate(off as usize);
            self.data.extend_from_slice(&b);
        }
        let prev_off = std::mem::replace(&mut self.sorted[at - 1], off);
        self.pending.clear();
        let dead = MsgRef::decode_trusted(&self.data, prev_off as usize).len;
        self.dead += dead;
        self.data[prev_off as usize] |= DEAD;
        Places {
            at: Vec::new(),
            by_key: None,
        }
    }

    /// Marks every message now in the buffer as being flushed by a detached flush (DF3); the
    /// buffer must be sealed. Returns a copy of them, which the flush moves down.
    pub(crate) fn freeze(&mut self) -> MsgBuffer {
        debug_assert!(self.is_sealed() && self.frozen == 0);
        self.frozen = self.data.len();
        MsgBuffer {
            data: self.data.clone(),
            frozen: 0,
            ..self.clone_exact_index()
        }
    }

    /// Ends a detached flush that was discarded: the frozen messages stay, as ordinary ones.
    pub(crate) fn unfreeze(&mut self) {
        self.frozen = 0;
    }

    /// Ends a detached flush that was installed: removes the frozen messages (now below),
    /// keeping the newer ones in MSN order with their (key, MSN) order. Must be sealed.
    pub(crate) fn drop_frozen(&mut self) {
        debug_assert!(self.is_sealed());
        let cut = std::mem::take(&mut self.frozen);
        if cut == 0 {
            return;
        }
        self.drop_heads();
        // Both indexes keep the offsets past the cut, moved down by it.
        let cut32 = cut as u32;
        for index in [&mut self.sorted, &mut self.ranges] {
            index.retain(|&o| o >= cut32);
            index.iter_mut().for_each(|o| *o -= cut32);
        }
        // Dead bytes after the cut stay counted; those before it leave with it.
        let mut dead_before = 0;
        let mut pos = 0;
        while pos < cut {
            let m = MsgRef::decode_trusted(&self.data, pos);
            if self.data[pos] & DEAD != 0 {
                dead_before += m.len;
            }
            pos += m.len;
        }
        self.dead -= dead_before;
        self.data.drain(..cut);
    }

    /// Whether a detached flush is moving this buffer's older messages down.
    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen > 0
    }

    /// Drops dead messages from the packed bytes, keeping the live ones in MSN order.
    fn compact(&mut self) {
        self.drop_heads();
        let mut data = Vec::with_capacity(self.data.len() - self.dead);
        // (old offset, new offset) in increasing order of both.
        let mut moved: Vec<(u32, u32)> = Vec::with_capacity(self.count());
        let mut pos = 0usize;
        while pos < self.data.len() {
            let m = MsgRef::decode_trusted(&self.data, pos);
            if self.data[pos] & DEAD == 0 {
                moved.push((pos as u32, data.len() as u32));
                data.extend_from_slice(&self.data[pos..pos + m.len]);
            }
            pos += m.len;
        }
        let remap = |o: &mut u32| {
            if let Ok(i) = moved.binary_search_by_key(o, |&(old, _)| old) {
                *o = moved[i].1;
            }
        };
        self.sorted.iter_mut().for_each(remap);
        self.ranges.iter_mut().for_each(remap);
        self.pending.iter_mut().for_each(remap);
        self.data = data;
        self.dead = 0;
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

    /// An upper bound on how many bytes applying these messages can add to the rows below:
    /// deletes and range deletes only remove, inserts add at most their own size, and an upsert
    /// is assumed to add its argument (registered functions are expected to stay near that).
    pub(crate) fn growth_bound(&self) -> usize {
        self.in_msn_order()
            .filter(|(m, _)| matches!(m.kind, Kind::Insert | Kind::Upsert))
            .map(|(m, _)| m.len)
            .sum()
    }

    /// How many deletes and range deletes the buffer holds (what `tree::reclaim_step` moves).
    pub(crate) fn deletes(&self) -> usize {
        self.in_msn_order()
            .filter(|(m, _)| matches!(m.kind, Kind::Delete | Kind::RangeDelete))
            .count()
    }

    /// Every message in MSN order, with its packed bytes.
    pub(crate) fn in_msn_order(&self) -> impl Iterator<Item = (MsgRef<'_>, &[u8])> + '_ {
        let mut pos = 0usize;
        std::iter::from_fn(move || loop {
            if pos >= self.data.len() {
                return None;
            }
            let m = MsgRef::decode_trusted(&self.data, pos);
            let raw = &self.data[pos..pos + m.len];
            pos += m.len;
            if raw[0] & DEAD == 0 {
                return Some((m, raw));
            }
        })
    }

    /// Forgets `heads` (the buffer changes).
    #[inline]
    fn drop_heads(&mut self) {
        if !self.heads.is_empty() {
            self.heads = Vec::new();
        }
    }

    /// Builds `heads` for a buffer just read from disk that readers will search many times
    /// (an internal node's buffer, cached with its node) — not for a leaf delta's partition,
    /// which a lookup decodes and searches once.
    pub(crate) fn index_heads(&mut self) {
        if self.is_sealed() && self.sorted.len() >= HEADS_MIN {
            self.heads = self
                .sorted
                .iter()
                .map(|&o| key_prefix(key_at(&self.data, o)))
                .collect();
        }
    }

    /// Index in `sorted` of the first message with a key >= `key` ([`first_in`]), found
    /// through `heads` when the buffer has them. Such an answer is used only once the keys on
    /// either side of it confirm it (a stale hint costs a search, never a wrong answer).
    fn first_at_or_after(&self, key: &[u8]) -> usize {
        if !self.heads.is_empty() && self.heads.len() == self.sorted.len() {
            // Prefix order never contradicts key order: every message before the first head
            // >= the key's is below the key, and every one from the first head > it above.
            let p = key_prefix(key);
            let lo = self.heads.partition_point(|&h| h < p);
            let hi = lo + self.heads[lo..].partition_point(|&h| h == p);
            let at = lo
                + self.sorted[lo..hi].partition_point(|&o| keycmp::lt(key_at(&self.data, o), key));
            let below = |i: usize| keycmp::lt(key_at(&self.data, self.sorted[i]), key);
            if (at == 0 || below(at - 1)) && (at == self.sorted.len() || !below(at)) {
                return at;
            }
        }
        first_in(&self.data, &self.sorted, key)
    }

    /// Point messages for exactly `key`, in MSN order.
    pub(crate) fn for_key<'a>(&'a self, key: &[u8], out: &mut Vec<MsgRef<'a>>) {
        debug_assert!(
            self.pending.is_empty(),
            "reading an unsealed buffer (invariant N7)"
        );
        let start = self.first_at_or_after(key);
        for &o in &self.sorted[start..] {
            let m = self.at(o);
            if m.key != key {
                break;
            }
            out.push(m);
        }
    }

    /// How many point messages for exactly `key` are buffered.
    pub(crate) fn count_for_key(&self, key: &[u8]) -> usize {
        debug_assert!(
            self.pending.is_empty(),
            "reading an unsealed buffer (invariant N7)"
        );
        let start = self.first_at_or_after(key);
        let end = place_in(&self.data, &self.sorted, key);
        end - start
    }

    /// Whether the last coalescing seal may have lengthened some key's run of upserts (see
    /// [`MsgBuffer::upsert_run_grew`]): when not, no key of that round is hotter than before.
    pub(crate) fn upsert_run_grew(&self) -> bool {
        self.upsert_run_grew
    }

    /// Whether at least `n` (≥ 1) point messages for exactly `key` are buffered: one search and
    /// one comparison, for the hot-key check a write makes when a run grew.
    pub(crate) fn has_at_least_for_key(&self, key: &[u8], n: usize) -> bool {
        debug_assert!(
            self.pending.is_empty(),
            "reading an unsealed buffer (invariant N7)"
        );
        let start = self.first_at_or_after(key);
        n >= 1
            && self
                .sorted
                .get(start + n - 1)
                .is_some_and(|&o| self.key_at(o) == key)
    }

    /// Point messages with keys in `[lo, hi)` (`hi = None`: unbounded), in (key, MSN) order.
    pub(crate) fn points_in<'a>(&'a self, lo: &[u8], hi: Option<&[u8]>, out: &mut Vec<MsgRef<'a>>) {
        debug_assert!(
            self.pending.is_empty(),
            "reading an unsealed buffer (invariant N7)"
        );
        let start = self.first_at_or_after(lo);
        let end = hi.map_or(self.sorted.len(), |h| self.first_at_or_after(h).max(start));
        // One reservation for the whole run (a window of a freshly filled directory takes
        // thousands of messages; growing `out` one push at a time copied it over and over).
        out.extend(self.sorted[start..end].iter().map(|&o| self.at(o)));
    }

    /// Serializes as partition bytes: `count u32 | messages`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.count() as u32).to_le_bytes());
        if self.dead == 0 {
            out.extend_from_slice(&self.data);
        } else {
            for (_, raw) in self.in_msn_order() {
                out.extend_from_slice(raw);
            }
        }
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
            pending: Vec::new(),
            dead: 0,
            frozen: 0,
            heads: Vec::new(),
            // Set by each coalescing seal for its own round; none has happened here.
            upsert_run_grew: false,
            fingers: [0; FINGERS],
            finger_next: 0,
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
        sort_by_key(&buf.data, &mut points, |off| off);
        buf.sorted = points;
        Ok(buf)
    }
}

/// The latest message of the round for each key seen: a short list searched linearly for the
/// usual round of a few messages (no hashing, no allocation beyond the list), a map for long
/// rounds (a flush moving a whole buffer).
enum LastByKey<'a> {
    Few(Vec<(&'a [u8], usize)>),
    Many(HashMap<&'a [u8], usize>),
}

impl<'a> LastByKey<'a> {
    const FEW: usize = 16;

    fn with_capacity(n: usize) -> Self {
        if n <= Self::FEW {
            LastByKey::Few(Vec::with_capacity(n))
        } else {
            LastByKey::Many(HashMap::with_capacity(n))
        }
    }

    fn get(&self, key: &[u8]) -> Option<usize> {
        match self {
            LastByKey::Few(v) => v.iter().rev().find(|(k, _)| *k == key).map(|&(_, j)| j),
            LastByKey::Many(m) => m.get(key).copied(),
        }
    }

    fn insert(&mut self, key: &'a [u8], j: usize) {
        match self {
            LastByKey::Few(v) => v.push((key, j)),
            LastByKey::Many(m) => {
                m.insert(key, j);
            }
        }
    }
}

/// Where each message of a round goes in `sorted` (see `MsgBuffer::seal_at`), and, for a long
/// round, the round's order by key (stable: MSN order within a key), as indexes into `pending`.
struct Places {
    at: Vec<usize>,
    by_key: Option<Vec<u32>>,
}

/// A message of the round being coalesced: still in the buffer's bytes, or newly made.
enum Slot {
    Here(u32),
    Made(Vec<u8>),
}

impl Slot {
    fn view<'a>(&'a self, data: &'a [u8]) -> MsgRef<'a> {
        match self {
            Slot::Here(o) => MsgRef::decode_trusted(data, *o as usize),
            Slot::Made(b) => MsgRef::decode_trusted(b, 0),
        }
    }
}

/// Where a message for `key` goes in `sorted` (after every message of a key <= `key`). A key
/// past the last one — a new inode, a new block, the next row of a sequential load — is
/// answered by one comparison instead of a binary search whose every probe decodes a message
/// somewhere in the buffer (a cache miss each).
fn place_in(data: &[u8], sorted: &[u32], key: &[u8]) -> usize {
    match sorted.last() {
        Some(&last) if keycmp::le(key_at(data, last), key) => sorted.len(),
        _ => sorted.partition_point(|&o| keycmp::le(key_at(data, o), key)),
    }
}

/// [`place_in`] helped by `fingers`, recent places in `sorted` (any values: each is checked).
/// Each finger inside the index bounds the answer from below (the message before it is at or
/// below `key`) or from above (it is past `key`); the search then gallops from the best lower
/// bound toward the best upper one, a few probes when the key lands beside a finger.
fn place_near(data: &[u8], sorted: &[u32], fingers: &[u32], key: &[u8]) -> usize {
    let n = sorted.len();
    match sorted.last() {
        None => return 0,
        Some(&last) if keycmp::le(key_at(data, last), key) => return n,
        Some(_) => {}
    }
    // The answer is in `lo..=hi`: every message before `lo` is at or below `key`, and the
    // message at `hi` (if any) is past it.
    let (mut lo, mut hi) = (0, n - 1);
    for &f in fingers {
        let f = f as usize;
        if f <= lo || f > hi {
            continue;
        }
        if keycmp::le(key_at(data, sorted[f - 1]), key) {
            lo = f;
        } else {
            hi = f - 1;
        }
    }
    place_from(data, &sorted[..hi], lo, key)
}

/// [`place_in`] for a key known to go at or after `from` (keys visited in ascending order):
/// gallops from `from` — 1, 2, 4, ... messages ahead — then searches the last step, so a walk
/// of P ascending keys along S messages costs about P log(S/P) comparisons, not S.
fn place_from(data: &[u8], sorted: &[u32], from: usize, key: &[u8]) -> usize {
    let mut lo = from; // every message before `lo` has a key <= `key`
    let mut step = 1;
    let hi = loop {
        let probe = lo + step - 1;
        if probe >= sorted.len() {
            break sorted.len();
        }
        if !keycmp::le(key_at(data, sorted[probe]), key) {
            break probe;
        }
        lo = probe + 1;
        step *= 2;
    };
    lo + sorted[lo..hi].partition_point(|&o| keycmp::le(key_at(data, o), key))
}

/// Index of the first message in `sorted` with a key >= `key` (one comparison when `key` is
/// past the last, as in [`place_in`]).
fn first_in(data: &[u8], sorted: &[u32], key: &[u8]) -> usize {
    match sorted.last() {
        Some(&last) if keycmp::lt(key_at(data, last), key) => sorted.len(),
        _ => sorted.partition_point(|&o| keycmp::lt(key_at(data, o), key)),
    }
}

/// The key of the packed message at `off` of `data`.
#[inline]
fn key_at(data: &[u8], off: u32) -> &[u8] {
    let (klen, p) = get_varint_trusted(data, off as usize + 9);
    &data[p..p + klen as usize]
}

/// Sorts `items` by the key of the message each stands for (at `offset_of(item)` in `data`),
/// ties by the item itself: offsets and a round's indexes both grow with the MSN, so this is
/// (key, MSN) order. Each item carries its key's first 8 bytes as an integer, so most
/// comparisons are one integer comparison instead of two message decodes and a memcmp
/// (sorting was a sixth of E1's instructions). Stable sort: sorted runs (a hint) merge cheaply.
fn sort_by_key(data: &[u8], items: &mut [u32], offset_of: impl Fn(u32) -> u32) {
    let key = |item: u32| key_at(data, offset_of(item));
    if items.len() <= 16 {
        // A write's few messages: not worth a decorated copy.
        items.sort_by(|&a, &b| keycmp::cmp(key(a), key(b)).then(a.cmp(&b)));
        return;
    }
    let mut decorated: Vec<(u64, u32)> = items.iter().map(|&i| (key_prefix(key(i)), i)).collect();
    decorated.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| keycmp::cmp(key(a.1), key(b.1)))
            .then(a.1.cmp(&b.1))
    });
    for (slot, (_, item)) in items.iter_mut().zip(decorated) {
        *slot = item;
    }
}

/// A key's first 8 bytes as a big-endian integer, zero-padded: two keys whose prefixes
/// differ compare as their prefixes do (a shorter key's padding only ties with zero bytes,
/// and ties fall back to the whole keys).
fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// `items` in the order `hint` gives (indexes into `items`), or `None` unless `hint` names
/// every index exactly once.
fn permuted(items: &[u32], hint: &[u32]) -> Option<Vec<u32>> {
    if hint.len() != items.len() {
        return None;
    }
    let mut seen = vec![false; items.len()];
    let mut out = Vec::with_capacity(items.len());
    for &i in hint {
        let slot = seen.get_mut(i as usize)?;
        if std::mem::replace(slot, true) {
            return None;
        }
        out.push(items[i as usize]);
    }
    Some(out)
}

/// The order by key of messages copied out of sealed buffers into others, read off the
/// sources' sorted indexes instead of sorting each copy again: a flush moves a whole sorted
/// buffer into its child's buffers, a delta partitions one, a fold gathers several, and
/// without this every copy was sorted anew (a fifth of the background flusher's time on E1).
///
/// Note each point message as it is pushed (its bytes in the source, where the source's
/// index points); `hints` then gives, per destination, the indexes of its new round in the
/// order the sources' indexes list them: sorted for one source, sorted runs for several (each
/// source's run in key order), which the hinted seals' stable sort merges.
pub(crate) struct KeyOrder {
    /// (address of the message's bytes in its source, destination, index in the
    /// destination's round).
    taken: Vec<(usize, u32, u32)>,
    rounds: Vec<u32>,
}

impl KeyOrder {
    pub(crate) fn new(destinations: usize) -> Self {
        KeyOrder {
            taken: Vec::new(),
            rounds: vec![0; destinations],
        }
    }

    /// The point message whose bytes are `raw` (borrowed from its source buffer) was just
    /// pushed into destination `dest`, after that destination's earlier messages of the round.
    pub(crate) fn note(&mut self, raw: &[u8], dest: usize) {
        self.taken
            .push((raw.as_ptr() as usize, dest as u32, self.rounds[dest]));
        self.rounds[dest] += 1;
    }

    /// Per destination, its round's indexes in the sources' index order. Every list is empty
    /// when a source is not sealed or the sources' indexes and the noted messages differ.
    pub(crate) fn hints(mut self, sources: &[&MsgBuffer]) -> Vec<Vec<u32>> {
        let none = || vec![Vec::new(); self.rounds.len()];
        let listed: usize = sources.iter().map(|s| s.sorted.len()).sum();
        if sources.iter().any(|s| !s.is_sealed()) || listed != self.taken.len() {
            return none();
        }
        // Noted in MSN order: one source's addresses already ascend.
        self.taken.sort_unstable_by_key(|t| t.0);
        let mut out: Vec<Vec<u32>> = self
            .rounds
            .iter()
            .map(|&n| Vec::with_capacity(n as usize))
            .collect();
        for src in sources {
            let base = src.data.as_ptr() as usize;
            for &off in &src.sorted {
                match self
                    .taken
                    .binary_search_by_key(&(base + off as usize), |t| t.0)
                {
                    Ok(i) => {
                        let (_, dest, idx) = self.taken[i];
                        out[dest as usize].push(idx);
                    }
                    Err(_) => return none(),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::UpsertId;

    proptest! {
        /// The searches with the past-the-end shortcut answer as a plain binary search would,
        /// for keys before, among, equal to and past the buffer's keys.
        #[test]
        fn shortcut_searches_equal_binary_search(
            keys in prop::collection::vec(prop::collection::vec(0u8..6, 0..4), 0..40),
            probe in prop::collection::vec(0u8..7, 0..5),
            fingers in prop::collection::vec(0u32..44, FINGERS),
        ) {
            let mut buf = MsgBuffer::new();
            for (i, k) in keys.iter().enumerate() {
                buf.push(&Op::Delete { key: k.clone() }, Msn(i as u64 + 1));
            }
            buf.seal();
            let (data, sorted) = (&buf.data, &buf.sorted);
            prop_assert_eq!(
                place_in(data, sorted, &probe),
                sorted.partition_point(|&o| key_at(data, o) <= &probe[..])
            );
            prop_assert_eq!(
                first_in(data, sorted, &probe),
                sorted.partition_point(|&o| key_at(data, o) < &probe[..])
            );
            // Prefix order never contradicts key order.
            for k in &keys {
                if key_prefix(k) != key_prefix(&probe) {
                    prop_assert_eq!(key_prefix(k).cmp(&key_prefix(&probe)), k[..].cmp(&probe[..]));
                }
            }
            // Galloping from any point at or before the answer finds the same place.
            let place = place_in(data, sorted, &probe);
            for from in 0..=place {
                prop_assert_eq!(place_from(data, sorted, from, &probe), place);
            }
            // Fingers anywhere — inside, outside, stale — only speed the search up.
            prop_assert_eq!(place_near(data, sorted, &fingers, &probe), place);
        }
    }

    proptest! {
        /// A buffer read from disk searches through its key prefixes (`heads`): every key
        /// lookup answers as the buffer it was written from does — for keys sharing their
        /// first eight bytes too — after more messages are sealed into it, and with a stale
        /// hint (heads of other keys), which the check beside each answer must catch.
        #[test]
        fn searches_through_heads_answer_as_the_index_does(
            keys in prop::collection::vec(
                (prop::collection::vec(0u8..3, 0..10), 0u8..4), HEADS_MIN..HEADS_MIN * 3),
            more in prop::collection::vec(prop::collection::vec(0u8..3, 0..10), 0..8),
            probes in prop::collection::vec(prop::collection::vec(0u8..3, 0..11), 1..24),
            stale in any::<u64>(),
        ) {
            let mut written = MsgBuffer::new();
            for (i, (k, v)) in keys.iter().enumerate() {
                let op = Op::Insert { key: k.clone(), value: vec![*v] };
                written.push(&op, Msn(i as u64 + 1));
            }
            written.seal();
            let mut raw = Vec::new();
            written.encode(&mut raw);
            let mut read = MsgBuffer::decode(&raw, &String::new).expect("decode");
            read.index_heads();
            let same = |a: &MsgBuffer, b: &MsgBuffer, probe: &[u8]| {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                a.for_key(probe, &mut x);
                b.for_key(probe, &mut y);
                let (mut px, mut py) = (Vec::new(), Vec::new());
                a.points_in(probe, None, &mut px);
                b.points_in(probe, None, &mut py);
                let flat = |v: &[MsgRef<'_>]| -> Vec<(Vec<u8>, u64, Vec<u8>)> {
                    v.iter().map(|m| (m.key.to_vec(), m.msn.0, m.payload.to_vec())).collect()
                };
                flat(&x) == flat(&y)
                    && flat(&px) == flat(&py)
                    && a.count_for_key(probe) == b.count_for_key(probe)
                    && a.has_at_least_for_key(probe, 1) == b.has_at_least_for_key(probe, 1)
            };
            prop_assert_eq!(read.heads.len(), read.sorted.len());
            for p in &probes {
                prop_assert!(same(&read, &written, p), "probe {:?}", p);
                // The answer is the plain search's.
                prop_assert_eq!(read.first_at_or_after(p), first_in(&read.data, &read.sorted, p));
            }
            // A stale hint: heads that name other keys than `sorted` does.
            let mut wrong = read.clone();
            let n = wrong.heads.len();
            for (i, h) in wrong.heads.iter_mut().enumerate() {
                *h = (stale ^ i as u64).rotate_left(i as u32 % 64) % (n as u64 + 1) * (u64::MAX / (n as u64 + 1));
            }
            wrong.heads.sort_unstable();
            for p in &probes {
                prop_assert_eq!(wrong.first_at_or_after(p), first_in(&wrong.data, &wrong.sorted, p));
            }
            // Sealing more messages in drops the hint; searches stay right.
            for (i, k) in more.iter().enumerate() {
                let op = Op::Delete { key: k.clone() };
                read.push(&op, Msn((keys.len() + i) as u64 + 1));
                written.push(&op, Msn((keys.len() + i) as u64 + 1));
            }
            read.seal();
            written.seal();
            if !more.is_empty() {
                prop_assert!(read.heads.is_empty());
            }
            for p in probes.iter().chain(&more) {
                prop_assert!(same(&read, &written, p), "probe {:?} after sealing more", p);
            }
        }
    }

    /// (key, MSN, payload) of every point message, in index order.
    /// A message of key `k` by `kind`: 0 insert, 1 delete, 2 upsert of a function with a
    /// merge function, 3 upsert of one without, 4 a range delete of `[k, k + 2)`.
    fn kind_op(&(k, kind): &(u8, u8)) -> Op {
        match kind {
            0 => Op::Insert {
                key: vec![k],
                value: vec![1],
            },
            1 => Op::Delete { key: vec![k] },
            4 => Op::DeleteRange {
                lo: vec![k],
                hi: vec![k + 2],
            },
            _ => Op::Upsert {
                key: vec![k],
                id: UpsertId(u32::from(kind)),
                arg: vec![1],
            },
        }
    }

    /// Upsert functions 2 and 3 append their argument to the value; only 2 can merge.
    fn appending_upserts() -> UpsertRegistry {
        let mut upserts = UpsertRegistry::default();
        for id in [2, 3] {
            upserts.register(
                UpsertId(id),
                std::sync::Arc::new(|_, old, arg| Some([old.unwrap_or(&[]), arg].concat())),
            );
        }
        upserts.register_merge(
            UpsertId(2),
            std::sync::Arc::new(|a, b| Some([a, b].concat())),
        );
        upserts
    }

    fn listed(buf: &MsgBuffer) -> Vec<(Vec<u8>, u64, Vec<u8>)> {
        let mut out = Vec::new();
        buf.points_in(&[], None, &mut out);
        out.iter()
            .map(|m| (m.key.to_vec(), m.msn.0, m.payload.to_vec()))
            .collect()
    }

    /// A buffer with `sealed` messages already sealed and `round` appended after them.
    fn with_round(sealed: &[(u8, bool)], round: &[(u8, bool)]) -> MsgBuffer {
        let op = |i: usize, &(k, del): &(u8, bool)| {
            if del {
                Op::Delete { key: vec![k] }
            } else {
                Op::Insert {
                    key: vec![k],
                    value: vec![i as u8],
                }
            }
        };
        let mut buf = MsgBuffer::new();
        for (i, m) in sealed.iter().enumerate() {
            buf.push(&op(i, m), Msn(i as u64 + 1));
        }
        buf.seal();
        for (i, m) in round.iter().enumerate() {
            buf.push(&op(i, m), Msn((sealed.len() + i) as u64 + 1));
        }
        buf
    }

    proptest! {
        /// A hint only saves work: whatever it says — the right order, a shuffle, or not a
        /// permutation at all — a hinted seal lists exactly what a plain one does, with and
        /// without coalescing, for short and long rounds.
        #[test]
        fn hinted_seals_list_what_plain_seals_do(
            sealed in prop::collection::vec((0u8..12, any::<bool>()), 0..60),
            round in prop::collection::vec((0u8..12, any::<bool>()), 1..40),
            shuffle in prop::collection::vec(any::<u32>(), 40),
            spoil in prop::option::of((0usize..40, any::<u32>())),
        ) {
            let mut hint: Vec<u32> = (0..round.len() as u32).collect();
            hint.sort_by_key(|&i| shuffle[i as usize]);
            if let Some((at, v)) = spoil {
                let at = at % hint.len();
                hint[at] = v % (round.len() as u32 + 2);
            }
            let upserts = UpsertRegistry::default();

            let (mut plain, mut hinted) = (with_round(&sealed, &round), with_round(&sealed, &round));
            plain.seal();
            hinted.seal_hinted(&hint);
            prop_assert_eq!(listed(&plain), listed(&hinted));

            let (mut plain, mut hinted) = (with_round(&sealed, &round), with_round(&sealed, &round));
            plain.seal_coalescing(&upserts, None);
            hinted.seal_coalescing(&upserts, Some(&hint));
            prop_assert_eq!(listed(&plain), listed(&hinted));
        }

        /// `upsert_run_grew` is sound: when a coalescing seal says no run grew, no key upserted
        /// in the round has more buffered messages than before it (or than one, if it had
        /// none) — the hot-key check it lets a write skip could not have fired for it.
        #[test]
        fn a_round_that_grew_no_upsert_run_left_no_key_longer(
            sealed in prop::collection::vec((0u8..6, 0u8..4), 0..30),
            round in prop::collection::vec((0u8..6, 0u8..4), 1..12),
        ) {
            let (op, upserts) = (kind_op, appending_upserts());
            let mut buf = MsgBuffer::new();
            let mut msn = 0;
            for m in &sealed {
                msn += 1;
                buf.push(&op(m), Msn(msn));
            }
            buf.seal_coalescing(&upserts, None);
            let before: Vec<usize> = (0..6u8).map(|k| buf.count_for_key(&[k])).collect();
            for m in &round {
                msn += 1;
                buf.push(&op(m), Msn(msn));
            }
            buf.seal_coalescing(&upserts, None);
            if !buf.upsert_run_grew() {
                for &(k, kind) in &round {
                    if kind >= 2 {
                        let after = buf.count_for_key(&[k]);
                        prop_assert!(after <= before[k as usize].max(1), "key {k}: {after} after");
                    }
                }
            }
        }

        /// The one-message fast path (`coalesce_one`) leaves a buffer exactly as the general
        /// round does: the same messages in (key, MSN) order, the same live bytes, the same
        /// answer about grown runs — over inserts, deletes, upserts with and without a merge
        /// function, and range deletes among the sealed messages.
        #[test]
        fn a_one_message_round_coalesces_as_a_general_round_does(
            sealed in prop::collection::vec((0u8..6, 0u8..5), 0..30),
            msg in (0u8..6, 0u8..4),
        ) {
            let (op, upserts) = (kind_op, appending_upserts());
            let mut fast = MsgBuffer::new();
            for (i, m) in sealed.iter().enumerate() {
                fast.push(&op(m), Msn(i as u64 + 1));
            }
            fast.seal_coalescing(&upserts, None);
            fast.push(&op(&msg), Msn(sealed.len() as u64 + 1));
            let mut general = fast.clone();
            let tail = fast.pending[0] as usize;
            let places = fast.coalesce_one(&upserts);
            fast.seal_at(Some(places), None);
            let places = general.coalesce_round(&upserts, None, tail);
            general.seal_at(Some(places), None);
            prop_assert_eq!(listed(&fast), listed(&general));
            prop_assert_eq!(fast.bytes(), general.bytes());
            prop_assert_eq!(fast.upsert_run_grew(), general.upsert_run_grew());
        }

        /// Copies of a sealed buffer routed to several destinations get, from `KeyOrder`, the
        /// order of their rounds by (key, MSN): the hint the seals then only check.
        #[test]
        fn key_order_reads_each_copys_order_off_its_source(
            keys in prop::collection::vec(0u8..40, 1..120),
            pivots in prop::collection::btree_set(1u8..40, 0..5),
        ) {
            let pivots: Vec<Vec<u8>> = pivots.into_iter().map(|p| vec![p]).collect();
            let mut src = MsgBuffer::new();
            for (i, &k) in keys.iter().enumerate() {
                src.push(&Op::Delete { key: vec![k] }, Msn(i as u64 + 1));
            }
            src.seal();
            let mut dests = vec![MsgBuffer::new(); pivots.len() + 1];
            let mut order = KeyOrder::new(dests.len());
            for (m, raw) in src.in_msn_order() {
                let i = crate::node::child_for(&pivots, m.key);
                dests[i].push_raw(raw);
                order.note(raw, i);
            }
            let hints = order.hints(&[&src]);
            for (dest, hint) in dests.iter().zip(&hints) {
                let round: Vec<(Vec<u8>, u64)> = dest
                    .pending
                    .iter()
                    .map(|&o| {
                        let m = dest.at(o);
                        (m.key.to_vec(), m.msn.0)
                    })
                    .collect();
                prop_assert!(permuted(&dest.pending, hint).is_some());
                let in_hint: Vec<_> = hint.iter().map(|&i| round[i as usize].clone()).collect();
                let mut sorted = round.clone();
                sorted.sort();
                prop_assert_eq!(in_hint, sorted);
            }
        }
    }

    fn filled(n: u64) -> MsgBuffer {
        let mut b = MsgBuffer::new();
        for i in 0..n {
            let op = Op::Insert {
                key: i.to_be_bytes().to_vec(),
                value: vec![7; 100],
            };
            b.push(&op, Msn(i + 1));
        }
        b.seal();
        b
    }

    #[test]
    fn a_copy_to_change_keeps_the_room_and_a_frozen_copy_is_exact() {
        let mut b = filled(300);
        b.data.reserve(b.data.len() * 3);
        let room = b.data.capacity();
        let copy = b.clone();
        assert_eq!(copy.data, b.data);
        assert_eq!(copy.sorted, b.sorted);
        assert_eq!(
            copy.data.capacity(),
            room,
            "a writer's copy keeps the room to grow"
        );
        let frozen = b.freeze();
        assert_eq!(frozen.data, b.data);
        assert_eq!(
            frozen.data.capacity(),
            frozen.data.len(),
            "the flush's copy is exact"
        );
        assert_eq!(frozen.frozen, 0);
        assert!(b.is_frozen());
    }

    #[test]
    fn an_emptied_buffer_takes_over_the_flushed_ones_room_within_its_bound() {
        let used = filled(300);
        let room = used.data.capacity();
        assert!(room >= 300 * 100);

        let mut slot = MsgBuffer::new();
        slot.reuse_room(filled(300), room - 1);
        assert_eq!(
            slot.data.capacity(),
            0,
            "over the bound: the room goes with the messages"
        );

        slot.reuse_room(used, room);
        assert_eq!(slot.data.capacity(), room);
        assert!(slot.is_empty() && slot.count() == 0 && slot.is_sealed());
        // The kept room takes messages as a new buffer would, without growing.
        slot.push(&Op::Delete { key: b"k".to_vec() }, Msn(1000));
        slot.seal();
        assert_eq!(slot.data.capacity(), room);
        assert_eq!(slot.count(), 1);

        // A slot that already received messages keeps what it has.
        let before = slot.data.clone();
        slot.reuse_room(filled(600), usize::MAX);
        assert_eq!(slot.data, before);
    }
}
