//! Messages: the unit of change that travels down a Bε-tree.
//!
//! A message is born at the root with the next MSN and is applied where it meets the row
//! (a leaf basement), or on the fly by a query that passes it on the way down. This module owns
//! the packed encoding used inside message buffers (the same bytes go to disk, inside a
//! compressed partition) and the semantics of applying a message to a row.
//!
//! Packed message: `kind u8 | msn u64 LE | klen varint | key | payload`, where payload is
//! Insert: `vlen varint | value`; Delete: nothing; Upsert: `fn id u32 LE | alen varint | arg`;
//! RangeDelete: `hlen varint | hi` (the key is `lo`, the range is `[lo, hi)`).

use foldhash::HashMap;
use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ids::{Msn, UpsertId};
use crate::varint::{get_varint_trusted, put_varint, Reader};
use crate::{MAX_KEY_LEN, MAX_VALUE_LEN};

/// An update function: given the key, the current value (if any) and the message argument,
/// returns the new value, or `None` to delete the row. Must be deterministic: after a crash
/// it is applied again to the same inputs and must give the same answer.
pub type UpsertFn = Arc<dyn Fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// Merges two arguments of one upsert function into one: given `older` and `newer`, returns an
/// argument `m` with `f(k, f(k, v, older), newer) == f(k, v, m)` for every key `k` and every
/// value `v` (absent included), or `None` when no such argument exists for this pair. Must be
/// deterministic. The engine uses it to keep one message per key in a buffer instead of a
/// growing run that every read of the key has to fold (a directory's stat upserted by every
/// create in it, a file's size by every write).
pub type MergeFn = Arc<dyn Fn(&[u8], &[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// The registered upsert functions of an environment, by stable id.
#[derive(Clone, Default)]
pub struct UpsertRegistry {
    fns: HashMap<u32, UpsertFn>,
    merges: HashMap<u32, MergeFn>,
}

impl std::fmt::Debug for UpsertRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.fns.keys().collect();
        ids.sort();
        f.debug_struct("UpsertRegistry").field("ids", &ids).finish()
    }
}

impl UpsertRegistry {
    /// Registers `f` under `id`, replacing any earlier function with that id.
    pub fn register(&mut self, id: UpsertId, f: UpsertFn) {
        self.fns.insert(id.0, f);
    }

    /// The function registered under `id`.
    pub fn get(&self, id: UpsertId) -> Result<&UpsertFn> {
        self.fns.get(&id.0).ok_or(Error::UnknownUpsert(id.0))
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: UpsertId) -> bool {
        self.fns.contains_key(&id.0)
    }

    /// Registers the argument merge of function `id` (see [`MergeFn`] for its contract).
    pub fn register_merge(&mut self, id: UpsertId, f: MergeFn) {
        self.merges.insert(id.0, f);
    }

    /// The argument merge of function `id`, if one is registered.
    pub(crate) fn merge_fn(&self, id: UpsertId) -> Option<&MergeFn> {
        self.merges.get(&id.0)
    }
}

/// Message kinds as stored on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Insert = 1,
    Delete = 2,
    Upsert = 3,
    RangeDelete = 4,
}

/// Set on the kind byte of a message that was coalesced into a newer one (see
/// `MsgBuffer`): it stays in the packed bytes, with its length still decodable, until the
/// buffer is compacted or written, and no index points at it. Never on disk.
pub(crate) const DEAD: u8 = 0x80;

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Insert,
            2 => Kind::Delete,
            3 => Kind::Upsert,
            4 => Kind::RangeDelete,
            _ => return None,
        })
    }
}

/// One operation of a write, before it gets an MSN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Insert {
        /// The key.
        key: Vec<u8>,
        /// The new value.
        value: Vec<u8>,
    },
    /// Remove `key` if present.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Apply upsert function `id` with `arg` to the row at `key`.
    Upsert {
        /// The key.
        key: Vec<u8>,
        /// Registered function.
        id: UpsertId,
        /// Argument passed to the function.
        arg: Vec<u8>,
    },
    /// Remove every key in `[lo, hi)`.
    DeleteRange {
        /// Inclusive lower bound.
        lo: Vec<u8>,
        /// Exclusive upper bound.
        hi: Vec<u8>,
    },
}

impl Op {
    /// Checks the documented size limits.
    pub(crate) fn validate(&self, upserts: &UpsertRegistry) -> Result<()> {
        let key_ok = |k: &[u8]| {
            if k.len() > MAX_KEY_LEN {
                Err(Error::KeyTooLarge {
                    len: k.len(),
                    max: MAX_KEY_LEN,
                })
            } else {
                Ok(())
            }
        };
        let value_ok = |v: &[u8]| {
            if v.len() > MAX_VALUE_LEN {
                Err(Error::ValueTooLarge {
                    len: v.len(),
                    max: MAX_VALUE_LEN,
                })
            } else {
                Ok(())
            }
        };
        match self {
            Op::Insert { key, value } => {
                key_ok(key)?;
                value_ok(value)
            }
            Op::Delete { key } => key_ok(key),
            Op::Upsert { key, id, arg } => {
                key_ok(key)?;
                value_ok(arg)?;
                upserts.get(*id).map(|_| ())
            }
            Op::DeleteRange { lo, hi } => {
                key_ok(lo)?;
                key_ok(hi)
            }
        }
    }

    /// At least the length of [`encode`](Self::encode)'s output (varints counted at their
    /// widest), so a record can be allocated once instead of grown op by op.
    pub(crate) fn encoded_len_bound(&self) -> usize {
        const HEAD: usize = 1 + 8 + 10; // kind, msn, key length
        HEAD + match self {
            Op::Insert { key, value } => key.len() + 10 + value.len(),
            Op::Delete { key } => key.len(),
            Op::Upsert { key, arg, .. } => key.len() + 4 + 10 + arg.len(),
            Op::DeleteRange { lo, hi } => lo.len() + 10 + hi.len(),
        }
    }

    /// Appends the packed form of this op with `msn` to `out`.
    pub(crate) fn encode(&self, msn: Msn, out: &mut Vec<u8>) {
        match self {
            Op::Insert { key, value } => encode_msg(out, Kind::Insert, msn, key, None, value),
            Op::Delete { key } => encode_msg(out, Kind::Delete, msn, key, None, &[]),
            Op::Upsert { key, id, arg } => encode_msg(out, Kind::Upsert, msn, key, Some(*id), arg),
            Op::DeleteRange { lo, hi } => encode_msg(out, Kind::RangeDelete, msn, lo, None, hi),
        }
    }
}

/// Appends one packed message (format.md "Messages"): `kind | msn | key`, then the payload —
/// none for a delete, the upsert id before it for an upsert (`upsert` is read only then).
fn encode_msg(
    out: &mut Vec<u8>,
    kind: Kind,
    msn: Msn,
    key: &[u8],
    upsert: Option<UpsertId>,
    payload: &[u8],
) {
    out.push(kind as u8);
    out.extend_from_slice(&msn.0.to_le_bytes());
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    match kind {
        Kind::Delete => {}
        Kind::Upsert => {
            out.extend_from_slice(&upsert.unwrap_or(UpsertId(0)).0.to_le_bytes());
            put_varint(out, payload.len() as u64);
            out.extend_from_slice(payload);
        }
        Kind::Insert | Kind::RangeDelete => {
            put_varint(out, payload.len() as u64);
            out.extend_from_slice(payload);
        }
    }
}

/// A decoded view of one packed message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MsgRef<'a> {
    pub kind: Kind,
    pub msn: Msn,
    pub key: &'a [u8],
    /// Insert: the value. Upsert: the argument. RangeDelete: `hi`. Delete: empty.
    pub payload: &'a [u8],
    pub upsert: UpsertId,
    /// Total encoded length.
    pub len: usize,
}

impl<'a> MsgRef<'a> {
    /// Decodes the message at `pos` of a buffer the engine built or already validated.
    #[inline]
    pub(crate) fn decode_trusted(buf: &'a [u8], pos: usize) -> MsgRef<'a> {
        let kind = Kind::from_byte(buf[pos] & !DEAD).unwrap_or(Kind::Delete);
        let mut msn = [0u8; 8];
        msn.copy_from_slice(&buf[pos + 1..pos + 9]);
        let (klen, p) = get_varint_trusted(buf, pos + 9);
        let key = &buf[p..p + klen as usize];
        let mut p = p + klen as usize;
        let mut upsert = UpsertId(0);
        let payload: &[u8] = match kind {
            Kind::Delete => &[],
            Kind::Insert | Kind::RangeDelete => {
                let (n, q) = get_varint_trusted(buf, p);
                p = q + n as usize;
                &buf[q..p]
            }
            Kind::Upsert => {
                let mut id = [0u8; 4];
                id.copy_from_slice(&buf[p..p + 4]);
                upsert = UpsertId(u32::from_le_bytes(id));
                let (n, q) = get_varint_trusted(buf, p + 4);
                p = q + n as usize;
                &buf[q..p]
            }
        };
        MsgRef {
            kind,
            msn: Msn(u64::from_le_bytes(msn)),
            key,
            payload,
            upsert,
            len: p - pos,
        }
    }

    /// Validates the message at the reader's position (untrusted bytes from disk or the log)
    /// and advances past it. Returns the kind and the message's start offset.
    pub(crate) fn validate(r: &mut Reader<'_>) -> Result<(Kind, usize)> {
        let start = r.pos();
        let kind_byte = r.u8()?;
        let kind = Kind::from_byte(kind_byte)
            .ok_or_else(|| r.err(format!("bad message kind {kind_byte}")))?;
        r.u64()?;
        r.len_prefixed(MAX_KEY_LEN)?;
        match kind {
            Kind::Delete => {}
            Kind::Insert => {
                r.len_prefixed(MAX_VALUE_LEN)?;
            }
            Kind::RangeDelete => {
                r.len_prefixed(MAX_KEY_LEN)?;
            }
            Kind::Upsert => {
                r.u32()?;
                r.len_prefixed(MAX_VALUE_LEN)?;
            }
        }
        Ok((kind, start))
    }

    /// For a range delete: whether it covers `key`.
    #[inline]
    pub(crate) fn covers(&self, key: &[u8]) -> bool {
        self.kind == Kind::RangeDelete && self.key <= key && key < self.payload
    }
}

/// Applies message `m` to the row at `key` whose current value is `old`. A point message must
/// have `m.key == key`; a range delete removes the row if it covers `key`.
pub(crate) fn apply(
    m: &MsgRef<'_>,
    key: &[u8],
    old: Option<Vec<u8>>,
    upserts: &UpsertRegistry,
) -> Result<Option<Vec<u8>>> {
    Ok(apply_borrowed(m, key, old.map(Cow::Owned), upserts)?.map(Cow::into_owned))
}

/// [`apply`] without copies: an insert's value borrows its payload and a range delete that
/// misses keeps `old` as it is; only an upsert makes a new value.
pub(crate) fn apply_borrowed<'a>(
    m: &MsgRef<'a>,
    key: &[u8],
    old: Option<Cow<'a, [u8]>>,
    upserts: &UpsertRegistry,
) -> Result<Option<Cow<'a, [u8]>>> {
    Ok(match m.kind {
        Kind::Insert => Some(Cow::Borrowed(m.payload)),
        Kind::Delete => None,
        Kind::Upsert => {
            let f = upserts.get(m.upsert)?;
            f(key, old.as_deref(), m.payload).map(Cow::Owned)
        }
        Kind::RangeDelete => {
            if m.covers(key) {
                None
            } else {
                old
            }
        }
    })
}

/// What `coalesce` decided for an older and a newer point message of one key that are
/// adjacent in one buffer (nothing for that key between them).
pub(crate) enum Coalesced {
    /// Keep both.
    No,
    /// The newer message alone has the effect of both (it overwrites): drop the older.
    DropOlder,
    /// Replace both with this message (it carries the newer MSN).
    Replace(Vec<u8>),
}

/// Whether two point messages of one key, `older` then `newer` with nothing between them for
/// that key, can be replaced by one with the same effect on any row below: an insert or
/// delete overwrites whatever came before; an upsert folds into an older insert or delete (the
/// function is applied now instead of at every read); two upserts of one function merge when
/// it has a merge function that accepts the pair.
pub(crate) fn coalesce(
    older: &MsgRef<'_>,
    newer: &MsgRef<'_>,
    upserts: &UpsertRegistry,
) -> Coalesced {
    debug_assert_eq!(older.key, newer.key);
    let key = newer.key;
    // The replacement's kind, upsert id and payload (encoded straight from the borrowed key).
    let (kind, upsert, payload) = match (older.kind, newer.kind) {
        (_, Kind::Insert | Kind::Delete) => return Coalesced::DropOlder,
        (Kind::Insert | Kind::Delete, Kind::Upsert) => {
            let Ok(f) = upserts.get(newer.upsert) else {
                return Coalesced::No;
            };
            let old = (older.kind == Kind::Insert).then_some(older.payload);
            match f(key, old, newer.payload) {
                Some(value) if value.len() <= MAX_VALUE_LEN => (Kind::Insert, None, value),
                Some(_) => return Coalesced::No,
                None => (Kind::Delete, None, Vec::new()),
            }
        }
        (Kind::Upsert, Kind::Upsert) if older.upsert == newer.upsert => {
            let Some(merge) = upserts.merge_fn(newer.upsert) else {
                return Coalesced::No;
            };
            match merge(older.payload, newer.payload) {
                Some(arg) if arg.len() <= MAX_VALUE_LEN => (Kind::Upsert, Some(newer.upsert), arg),
                _ => return Coalesced::No,
            }
        }
        _ => return Coalesced::No,
    };
    let mut out = Vec::with_capacity(newer.len + 16);
    encode_msg(&mut out, kind, newer.msn, key, upsert, &payload);
    Coalesced::Replace(out)
}
