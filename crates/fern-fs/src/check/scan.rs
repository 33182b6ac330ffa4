//! Reading the whole store for fsck: every tree scanned, every value decoded as far as it
//! decodes, keys of the wrong shape set aside (`Scan`); and the entry-tree walk that names
//! the paths under a damaged engine node (`paths_of`). Never: judges what it read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use fern_kv::{Direction, ExtentRef, KeyRange, KvStore, TreeId};

use super::Tree;
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;
use crate::overlay;
use crate::record::{Dentry, Inode};
use crate::schema::{self, Superblock, Trees};

/// A directory entry as scanned.
pub(super) struct Ent {
    pub(super) parent: u64,
    pub(super) name: Vec<u8>,
    pub(super) key: Vec<u8>,
    pub(super) value: Result<Dentry, String>,
}

impl Ent {
    pub(super) fn path(&self) -> String {
        format!(
            "entry {:?} in directory {}",
            String::from_utf8_lossy(&self.name),
            self.parent
        )
    }
}

#[derive(Default)]
pub(super) struct DataInfo {
    pub(super) blocks: u64,
    /// One past the last stored byte.
    pub(super) end: u64,
    /// Blocks longer than the block size or empty.
    pub(super) bad_blocks: Vec<u64>,
}

/// Everything the store holds, decoded as far as it decodes.
pub(super) struct Scan {
    pub(super) sb: Superblock,
    pub(super) next_id: Result<u64, String>,
    pub(super) records: BTreeMap<u64, Result<Inode, String>>,
    pub(super) entries: Vec<Ent>,
    pub(super) dirparent: BTreeMap<u64, Result<u64, String>>,
    pub(super) orphans: BTreeSet<u64>,
    pub(super) data: BTreeMap<u64, DataInfo>,
    pub(super) xattrs: BTreeMap<u64, u64>,
    /// Keys of the wrong shape: (tree, key, what).
    pub(super) bad_keys: Vec<(Tree, Vec<u8>, &'static str)>,
    /// Extent slots of each inode and the extent each names (S8, extents.rs).
    pub(super) extent_slots: BTreeMap<u64, BTreeMap<u64, ExtentRef>>,
    /// What is wrong with the extent rows and the live extents (S8), but leaks.
    pub(super) extent_problems: Vec<String>,
    /// Live extents that no row names (S8), ascending.
    pub(super) leaked_extents: Vec<ExtentRef>,
    /// Whether some `fs.extent` row did not decode: it might name a "leaked" extent, so
    /// repair frees none (check.rs: never destroy a byte a name could still reach).
    pub(super) undecodable_extent_rows: bool,
}

pub(super) fn scan_tree(
    kv: &dyn KvStore,
    tree: TreeId,
    mut each: impl FnMut(Vec<u8>, Vec<u8>),
) -> FsResult<()> {
    let mut range = KeyRange::all();
    loop {
        let page = kv.scan(tree, &range, Direction::Forward, 512)?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        range.lo = Bound::Excluded(last.clone());
        for (k, v) in page {
            each(k, v);
        }
    }
}

pub(super) fn id_of(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

pub(super) fn prefix_id(key: &[u8]) -> Option<u64> {
    key.get(..8).and_then(id_of)
}

impl Scan {
    pub(super) fn read(kv: &dyn KvStore, t: &Trees) -> FsResult<Scan> {
        let sb = match kv.get(t.meta, schema::SUPER_KEY)? {
            Some(v) => Superblock::decode(&v)?,
            None => return Err(FsError::NotFormatted("no superblock".into())),
        };
        let next_id = match kv.get(t.meta, schema::ALLOC_KEY)? {
            None => Err("missing".to_string()),
            Some(v) => id_of(&v).ok_or_else(|| format!("{} bytes, not 8", v.len())),
        };
        let mut s = Scan {
            sb,
            next_id,
            records: BTreeMap::new(),
            entries: Vec::new(),
            dirparent: BTreeMap::new(),
            orphans: BTreeSet::new(),
            data: BTreeMap::new(),
            xattrs: BTreeMap::new(),
            bad_keys: Vec::new(),
            extent_slots: BTreeMap::new(),
            extent_problems: Vec::new(),
            leaked_extents: Vec::new(),
            undecodable_extent_rows: false,
        };
        s.read_extents(kv, t)?;
        let mut bad = Vec::new();
        scan_tree(kv, t.inode, |k, v| match id_of(&k) {
            Some(id) => {
                let rec = Inode::decode_record(&v).map_err(|e| e.to_string());
                s.records.insert(id, rec);
            }
            None => bad.push((Tree::Inode, k, "inode key not 8 bytes")),
        })?;
        scan_tree(kv, t.dentry, |k, v| match prefix_id(&k) {
            Some(parent) if k.len() > 8 => s.entries.push(Ent {
                parent,
                name: k[8..].to_vec(),
                value: Dentry::decode(&v).map_err(|e| e.to_string()),
                key: k,
            }),
            _ => bad.push((Tree::Dentry, k, "entry key without a name")),
        })?;
        scan_tree(kv, t.dirparent, |k, v| match id_of(&k) {
            Some(id) => {
                let p = id_of(&v).ok_or_else(|| format!("value of {} bytes", v.len()));
                s.dirparent.insert(id, p);
            }
            None => bad.push((Tree::Dirparent, k, "dirparent key not 8 bytes")),
        })?;
        scan_tree(kv, t.orphan, |k, _| match id_of(&k) {
            Some(id) => {
                s.orphans.insert(id);
            }
            None => bad.push((Tree::Orphan, k, "orphan key not 8 bytes")),
        })?;
        let bs = u64::from(s.sb.block_size);
        let per_slot = schema::SLOT_BYTES / bs;
        scan_tree(kv, t.data, |k, v| {
            if k.len() != 16 {
                bad.push((Tree::Data, k, "data key not 16 bytes"));
                return;
            }
            let id = prefix_id(&k).unwrap_or(0);
            let block = id_of(&k[8..]).unwrap_or(0);
            let d = s.data.entry(id).or_default();
            // A row inside an extent slot shadows a block the extent already counts.
            let shadow = s
                .extent_slots
                .get(&id)
                .is_some_and(|slots| slots.contains_key(&(block / per_slot)));
            d.blocks += u64::from(!shadow);
            // An overlay row (overlay.rs) stores its written bytes, up to its last one.
            let (len, bad) = if overlay::is_overlay(&v, bs as usize) {
                let ok = overlay::well_formed(&v, bs as usize);
                (overlay::written_end(&v, bs as usize) as u64, !ok)
            } else {
                (v.len() as u64, v.is_empty() || v.len() as u64 > bs)
            };
            if bad {
                d.bad_blocks.push(block);
            }
            let end = block.saturating_mul(bs).saturating_add(len);
            d.end = d.end.max(end);
        })?;
        s.count_extent_slots(per_slot);
        scan_tree(kv, t.xattr, |k, _| match prefix_id(&k) {
            Some(id) if k.len() > 8 => *s.xattrs.entry(id).or_default() += 1,
            _ => bad.push((Tree::Xattr, k, "xattr key without a name")),
        })?;
        s.bad_keys = bad;
        Ok(s)
    }
}

/// Paths of the directory entries naming an inode in `lo..=hi` (at most `limit` of them, by
/// entry order), built from the entry tree alone: fsck uses it to say which files and
/// directories a damaged engine node affects, while that node's own tree cannot be read (as
/// e2fsck names the files of a bad block). Fails if the entry tree cannot be read either.
pub fn paths_of(
    kv: &dyn KvStore,
    lo: u64,
    hi: u64,
    limit: usize,
) -> FsResult<Vec<(InodeId, Vec<u8>)>> {
    let t = Trees::open(kv)?;
    // child -> (parent, name), and the entries that hit the range.
    let mut up: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut hits = Vec::new();
    scan_tree(kv, t.dentry, |k, v| {
        let (Some(parent), Ok(d)) = (prefix_id(&k), Dentry::decode(&v)) else {
            return;
        };
        let child = d.id().0;
        let name = k[8..].to_vec();
        if (lo..=hi).contains(&child) && hits.len() < limit {
            hits.push((child, parent, name.clone()));
        }
        up.entry(child).or_insert((parent, name));
    })?;
    let path = |mut id: u64, leaf: Vec<u8>| {
        let mut parts = vec![leaf];
        // Bounded: a damaged image may hold a cycle.
        for _ in 0..4096 {
            if id == InodeId::ROOT.0 {
                break;
            }
            match up.get(&id) {
                Some((p, name)) => {
                    parts.push(name.clone());
                    id = *p;
                }
                None => {
                    parts.push(format!("?{id}").into_bytes());
                    break;
                }
            }
        }
        parts.reverse();
        let mut out = Vec::new();
        for p in parts {
            out.push(b'/');
            out.extend_from_slice(&p);
        }
        out
    };
    let mut out: Vec<(InodeId, Vec<u8>)> = hits
        .into_iter()
        .map(|(child, parent, name)| (InodeId(child), path(parent, name)))
        .collect();
    if (lo..=hi).contains(&InodeId::ROOT.0) && out.len() < limit {
        out.insert(0, (InodeId::ROOT, b"/".to_vec()));
    }
    Ok(out)
}
