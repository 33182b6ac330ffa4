//! The key layout (docs/distributed.md §1): `P = prefix ‖ 0x00`, tree data under
//! `P ‖ 'k' ‖ len(name) ‖ name ‖ key`. It owns the translation between fern-kv keys and ranges
//! and etcd keys and `[lo, hi)` ranges; it must never talk to etcd.

use std::ops::Bound;

use fern_kv::{prefix_successor, KeyRange, KvError, KvResult, TreeId};
use parking_lot::RwLock;

/// The tag byte of tree data keys.
const DATA: u8 = b'k';

/// An etcd range `[lo, hi)` (etcd's `key`, `range_end`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdRange {
    /// First key of the range.
    pub lo: Vec<u8>,
    /// First key after the range.
    pub hi: Vec<u8>,
}

impl EtcdRange {
    /// True when no key lies in the range.
    pub fn is_empty(&self) -> bool {
        self.lo >= self.hi
    }

    /// True when `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.lo.as_slice() <= key && key < self.hi.as_slice()
    }
}

/// The trees of one store: tags by local id, ids by name.
#[derive(Debug)]
pub struct Keyspace {
    base: Vec<u8>,
    tags: RwLock<Vec<(String, Vec<u8>)>>,
}

impl Keyspace {
    /// The keyspace of the file system under `prefix` (no NUL; checked by the config).
    pub fn new(prefix: &[u8]) -> Self {
        let mut base = prefix.to_vec();
        base.push(0);
        Self {
            base,
            tags: RwLock::new(Vec::new()),
        }
    }

    /// Every key of the file system: `[P, prefix ‖ 0x01)`.
    pub fn all(&self) -> EtcdRange {
        let mut hi = self.base.clone();
        if let Some(last) = hi.last_mut() {
            *last = 1;
        }
        EtcdRange {
            lo: self.base.clone(),
            hi,
        }
    }

    /// The id of tree `name`, assigning the next local id on first use.
    pub fn tree(&self, name: &str) -> KvResult<TreeId> {
        if name.is_empty() || name.len() > 255 {
            return Err(KvError::UnknownTree(name.to_owned()));
        }
        if let Some(i) = self.tags.read().iter().position(|(n, _)| n == name) {
            return Ok(TreeId(i as u32));
        }
        let mut tags = self.tags.write();
        if let Some(i) = tags.iter().position(|(n, _)| n == name) {
            return Ok(TreeId(i as u32));
        }
        let id = u32::try_from(tags.len()).map_err(|_| KvError::UnknownTree(name.to_owned()))?;
        let mut tag = self.base.clone();
        tag.push(DATA);
        tag.push(name.len() as u8);
        tag.extend_from_slice(name.as_bytes());
        tags.push((name.to_owned(), tag));
        Ok(TreeId(id))
    }

    /// The key prefix of tree `id`.
    pub fn tag(&self, id: TreeId) -> KvResult<Vec<u8>> {
        self.tags
            .read()
            .get(id.0 as usize)
            .map(|(_, t)| t.clone())
            .ok_or(KvError::InvalidTree(id))
    }

    /// The etcd key of `key` in tree `id`.
    pub fn key(&self, id: TreeId, key: &[u8]) -> KvResult<Vec<u8>> {
        let mut k = self.tag(id)?;
        k.extend_from_slice(key);
        Ok(k)
    }

    /// The etcd range of `range` in tree `id` (possibly empty).
    pub fn range(&self, id: TreeId, range: &KeyRange) -> KvResult<EtcdRange> {
        let tag = self.tag(id)?;
        let at = |k: &[u8], after: bool| {
            let mut v = tag.clone();
            v.extend_from_slice(k);
            if after {
                v.push(0);
            }
            v
        };
        let lo = match &range.lo {
            Bound::Included(k) => at(k, false),
            Bound::Excluded(k) => at(k, true),
            Bound::Unbounded => tag.clone(),
        };
        let hi = match &range.hi {
            Bound::Excluded(k) => at(k, false),
            Bound::Included(k) => at(k, true),
            // The tag ends in a UTF-8 name, which never holds a 0xff byte, so the successor
            // exists.
            Bound::Unbounded => prefix_successor(&tag).unwrap_or_default(),
        };
        Ok(EtcdRange { lo, hi })
    }

    /// The etcd range `[lo, hi)` of a range delete in tree `id`.
    pub fn half_open(&self, id: TreeId, lo: &[u8], hi: &[u8]) -> KvResult<EtcdRange> {
        Ok(EtcdRange {
            lo: self.key(id, lo)?,
            hi: self.key(id, hi)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_trees_are_disjoint() {
        let a = Keyspace::new(b"fs1");
        let b = Keyspace::new(b"fs1x");
        let ta = a.tree("t").expect("tree");
        let tb = b.tree("t").expect("tree");
        let ra = a.range(ta, &KeyRange::all()).expect("range");
        let rb = b.range(tb, &KeyRange::all()).expect("range");
        assert!(ra.hi <= rb.lo || rb.hi <= ra.lo, "{ra:?} {rb:?}");
        assert!(a.all().contains(&ra.lo) && !a.all().contains(&rb.lo));
        let t2 = a.tree("t2").expect("tree");
        let r2 = a.range(t2, &KeyRange::all()).expect("range");
        assert!(ra.hi <= r2.lo || r2.hi <= ra.lo, "{ra:?} {r2:?}");
        assert_eq!(a.tree("t").expect("tree"), ta);
        assert!(a.tree("").is_err());
        let long = "\u{ff}".repeat(100);
        let tl = a.tree(&long).expect("tree");
        assert!(!a.range(tl, &KeyRange::all()).expect("range").is_empty());
    }
}
