//! /lost+found, where repair moves what no name reaches (S1 missing parents, S2 cycles, S7
//! unnamed records): whether it exists, whether a non-directory blocks it, and the finding
//! that creates it when a repair needs it.

use super::scan::Scan;
use super::{new_dir_stat, Ctx, Fix, Severity, Tree, LOST_FOUND, ST_LOST_FOUND};
use crate::attr::FileType;
use crate::ids::InodeId;
use crate::record::{Dentry, Inode};
use crate::schema;

/// The lost+found directory as found, and whether a repair this round needs it.
pub(super) struct LostFound {
    id: Option<u64>,
    /// A non-directory holds the name: nothing can be moved there.
    pub(super) blocked: bool,
    /// Its id, or the id it will be created with.
    pub(super) target: u64,
    pub(super) need: bool,
}

/// The name an inode moved to lost+found gets.
pub(super) fn lf_name(id: u64) -> Vec<u8> {
    format!("#{id}").into_bytes()
}

impl LostFound {
    pub(super) fn find(s: &Scan, next_free: u64) -> LostFound {
        let root = InodeId::ROOT.0;
        let lf = s
            .entries
            .iter()
            .find(|e| e.parent == root && e.name == LOST_FOUND);
        let lf_id = match lf.map(|e| &e.value) {
            Some(Ok(Dentry::Inline { id, inode }))
                if inode.stat.kind().ok() == Some(FileType::Directory) =>
            {
                Some(id.0)
            }
            _ => None,
        };
        let lf_blocked = lf.is_some() && lf_id.is_none();
        let lf_target = lf_id.unwrap_or(next_free);
        LostFound {
            id: lf_id,
            blocked: lf_blocked,
            target: lf_target,
            need: false,
        }
    }

    /// The finding that creates /lost+found, if a repair needs it and it is missing.
    pub(super) fn create_if_needed(&self, c: &mut Ctx) {
        let root = InodeId::ROOT.0;
        if self.need && self.id.is_none() {
            let d = Dentry::Inline {
                id: InodeId(self.target),
                inode: Inode {
                    stat: new_dir_stat(0o700),
                    payload: vec![],
                },
            };
            c.push_sev(
                "S7",
                ST_LOST_FOUND,
                Severity::Note,
                "/lost+found is needed and missing".into(),
                Some((
                    format!("create /lost+found (inode {})", self.target),
                    vec![
                        Fix::Put(
                            Tree::Dentry,
                            schema::named_key(InodeId::ROOT, LOST_FOUND),
                            d.encode(),
                        ),
                        Fix::Put(
                            Tree::Dirparent,
                            schema::id_key(InodeId(self.target)),
                            root.to_be_bytes().to_vec(),
                        ),
                        Fix::Put(
                            Tree::Meta,
                            schema::ALLOC_KEY.to_vec(),
                            (self.target + 1).to_be_bytes().to_vec(),
                        ),
                    ],
                )),
            );
        }
    }
}
