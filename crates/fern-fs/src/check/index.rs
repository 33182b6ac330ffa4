//! Where each inode lives (S1's "no inode has two homes"): its stat inline in one entry or in
//! its `fs.inode` record. Builds the index every later check reads, reports undecodable
//! entries and records and inodes with two homes, and keeps the ids whose keys must never be
//! freed. Never: repairs (an inode with two homes is left for a human).

use std::collections::{BTreeSet, HashMap};

use super::scan::Scan;
use super::{Ctx, Fix, Tree, ST_STRUCTURE};
use crate::attr::{FileType, Stat};
use crate::ids::InodeId;
use crate::record::Dentry;
use crate::schema;

/// Where an inode's stat lives.
#[derive(Clone, Copy, Debug)]
pub(super) enum Home {
    /// In this entry (index into `Scan::entries`).
    Inline(usize),
    /// In the `fs.inode` record.
    Record,
}

/// The entries indexed by the inode they name, and each inode's single home.
pub(super) struct Index<'a> {
    s: &'a Scan,
    pub(super) inline: HashMap<u64, Vec<usize>>,
    pub(super) linked: HashMap<u64, Vec<usize>>,
    pub(super) undecodable_entries: bool,
    pub(super) home: HashMap<u64, Home>,
    pub(super) ambiguous: BTreeSet<u64>,
    /// Ids whose keys must never be freed: anything an undecodable value might be.
    pub(super) keep: BTreeSet<u64>,
}

impl<'a> Index<'a> {
    pub(super) fn build(s: &'a Scan, c: &mut Ctx) -> Index<'a> {
        let root = InodeId::ROOT.0;
        let mut inline: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut linked: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut undecodable_entries = false;
        for (i, e) in s.entries.iter().enumerate() {
            match &e.value {
                Ok(Dentry::Inline { id, .. }) => inline.entry(id.0).or_default().push(i),
                Ok(Dentry::Linked { id, .. }) => linked.entry(id.0).or_default().push(i),
                Err(err) => {
                    undecodable_entries = true;
                    c.push(
                        "S1",
                        ST_STRUCTURE,
                        format!("{}: undecodable ({err})", e.path()),
                        None,
                    );
                }
            }
        }
        // Each inode's single home, when it has exactly one; ids with two homes are reported and
        // then left alone by every later check.
        let mut home: HashMap<u64, Home> = HashMap::new();
        let mut ambiguous: BTreeSet<u64> = BTreeSet::new();
        for (&id, idx) in &inline {
            if idx.len() > 1 || s.records.contains_key(&id) || id == root {
                ambiguous.insert(id);
                let names: Vec<String> = idx.iter().map(|&i| s.entries[i].path()).collect();
                c.push(
                    "S1",
                    ST_STRUCTURE,
                    format!(
                        "inode {id} has more than one home: {}{}",
                        names.join(", "),
                        if s.records.contains_key(&id) {
                            " and an inode record"
                        } else {
                            ""
                        }
                    ),
                    None,
                );
            } else {
                home.insert(id, Home::Inline(idx[0]));
            }
        }
        for &id in s.records.keys() {
            if !ambiguous.contains(&id) && !inline.contains_key(&id) {
                home.insert(id, Home::Record);
            }
        }
        let mut keep: BTreeSet<u64> = ambiguous.clone();
        keep.extend(
            s.records
                .iter()
                .filter(|(_, r)| r.is_err())
                .map(|(id, _)| *id),
        );
        for (id, r) in &s.records {
            if let Err(e) = r {
                if *id != root {
                    c.push(
                        "S7",
                        ST_STRUCTURE,
                        format!("inode record {id}: undecodable ({e})"),
                        None,
                    );
                }
            }
        }

        Index {
            s,
            inline,
            linked,
            undecodable_entries,
            home,
            ambiguous,
            keep,
        }
    }

    /// An inode's stat, if it is unambiguous and decodes.
    pub(super) fn stat_of(&self, id: u64) -> Option<&'a Stat> {
        let s = self.s;
        match self.home.get(&id)? {
            Home::Inline(i) => match &s.entries[*i].value {
                Ok(Dentry::Inline { inode, .. }) => Some(&inode.stat),
                _ => None,
            },
            Home::Record => s.records.get(&id)?.as_ref().ok().map(|i| &i.stat),
        }
    }

    pub(super) fn kind_of(&self, id: u64) -> Option<FileType> {
        self.stat_of(id).and_then(|st| st.kind().ok())
    }

    /// Whether some entry names `id`.
    pub(super) fn named(&self, id: u64) -> bool {
        self.inline.contains_key(&id) || self.linked.contains_key(&id)
    }

    /// Whether `id`'s keys belong to an inode (or might: `keep`).
    pub(super) fn live(&self, id: u64) -> bool {
        self.home.contains_key(&id) || self.s.orphans.contains(&id) || self.keep.contains(&id)
    }

    /// Rewrites the stat of `id` at its home with `f`.
    pub(super) fn rewrite(&self, id: u64, f: &dyn Fn(&mut Stat)) -> Option<Fix> {
        let s = self.s;
        match self.home.get(&id)? {
            Home::Inline(i) => {
                let e = &s.entries[*i];
                let Ok(Dentry::Inline { inode, .. }) = &e.value else {
                    return None;
                };
                let mut inode = inode.clone();
                f(&mut inode.stat);
                Some(Fix::Put(
                    Tree::Dentry,
                    e.key.clone(),
                    Dentry::Inline {
                        id: InodeId(id),
                        inode,
                    }
                    .encode(),
                ))
            }
            Home::Record => {
                let mut inode = s.records.get(&id)?.as_ref().ok()?.clone();
                f(&mut inode.stat);
                Some(Fix::Put(
                    Tree::Inode,
                    schema::id_key(InodeId(id)),
                    inode.encode_record(),
                ))
            }
        }
    }
}
