//! S7: orphan records name unreferenced inodes; every inode record is named, orphaned or the
//! root; no data, xattrs, `..` records or keys belong to no inode.

use super::index::Index;
use super::lost_found::{lf_name, LostFound};
use super::scan::Scan;
use super::{Ctx, Fix, Severity, Tree, ST_COUNTS, ST_STRUCTURE};
use crate::attr::FileType;
use crate::ids::InodeId;
use crate::record::Dentry;
use crate::schema;

pub(super) fn free_ops(id: u64) -> Vec<Fix> {
    let id = InodeId(id);
    let (dlo, dhi) = schema::blocks_from(id, 0);
    let (xlo, xhi) = schema::id_prefix_range(id);
    vec![
        Fix::DeleteRange(Tree::Data, dlo, dhi),
        Fix::DeleteRange(Tree::Xattr, xlo, xhi),
        Fix::Delete(Tree::Inode, schema::id_key(id)),
        Fix::Delete(Tree::Orphan, schema::id_key(id)),
    ]
}

/// Orphan records, and inode records no entry names.
pub(super) fn check_unnamed(s: &Scan, ix: &Index, c: &mut Ctx, lf: &mut LostFound) {
    let root = InodeId::ROOT.0;
    for &o in &s.orphans {
        if ix.named(o) {
            c.push(
                "S7",
                ST_STRUCTURE,
                format!("orphan record for inode {o}, which still has names"),
                Some((
                    "drop the orphan record, keep the file".into(),
                    vec![Fix::Delete(Tree::Orphan, schema::id_key(InodeId(o)))],
                )),
            );
        } else if ix.keep.contains(&o) {
            // An undecodable record: freeing it could be right, but is not provably safe.
        } else if s.records.contains_key(&o) {
            c.push_sev(
                "S7",
                ST_STRUCTURE,
                Severity::Note,
                format!(
                    "inode {o} is a pending orphan (unlinked while open; freed at the next mount)"
                ),
                Some(("free it".into(), free_ops(o))),
            );
        } else {
            c.push(
                "S7",
                ST_STRUCTURE,
                format!("orphan record for inode {o}, which has no record"),
                Some(("free its keys".into(), free_ops(o))),
            );
        }
    }
    for (&id, rec) in &s.records {
        if id == root || ix.named(id) || s.orphans.contains(&id) {
            continue;
        }
        let Ok(rec) = rec else { continue };
        let has_content = rec.stat.size > 0
            || !rec.payload.is_empty()
            || s.data.contains_key(&id)
            || s.xattrs.contains_key(&id);
        let kind = rec.stat.kind().ok();
        let fix = if !has_content && kind != Some(FileType::Directory) {
            Some(("free it (no data, no name)".to_string(), free_ops(id)))
        } else if lf.blocked {
            None
        } else {
            lf.need = true;
            let key = schema::named_key(InodeId(lf.target), &lf_name(id));
            let ops = if kind == Some(FileType::Directory) {
                // Directories always live inline in their entry.
                let d = Dentry::Inline {
                    id: InodeId(id),
                    inode: rec.clone(),
                };
                vec![
                    Fix::Put(Tree::Dentry, key, d.encode()),
                    Fix::Delete(Tree::Inode, schema::id_key(InodeId(id))),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(id)),
                        lf.target.to_be_bytes().to_vec(),
                    ),
                ]
            } else {
                let d = Dentry::Linked {
                    id: InodeId(id),
                    mode: rec.stat.mode,
                };
                vec![Fix::Put(Tree::Dentry, key, d.encode())]
            };
            Some((format!("move it to /lost+found/#{id}"), ops))
        };
        c.push(
            "S7",
            ST_STRUCTURE,
            format!(
                "inode {id} ({} bytes) has a record but no name",
                rec.stat.size
            ),
            fix,
        );
    }
}

/// Xattrs of no inode, `..` records of non-directories and keys of the wrong shape.
pub(super) fn check_leaks(s: &Scan, ix: &Index, c: &mut Ctx) {
    let root = InodeId::ROOT.0;
    let may_free = !ix.undecodable_entries;
    for (&id, &n) in &s.xattrs {
        if !ix.live(id) {
            let (lo, hi) = schema::id_prefix_range(InodeId(id));
            c.push(
                "S7",
                ST_COUNTS,
                format!("{n} xattrs of inode {id}, which does not exist"),
                may_free.then(|| {
                    (
                        "delete them".to_string(),
                        vec![Fix::DeleteRange(Tree::Xattr, lo, hi)],
                    )
                }),
            );
        }
    }
    for &id in s.dirparent.keys() {
        if ix.kind_of(id) != Some(FileType::Directory) && !ix.keep.contains(&id) && id != root {
            c.push(
                "S2",
                ST_COUNTS,
                format!("`..` record for {id}, which is not a directory"),
                Some((
                    "delete it".to_string(),
                    vec![Fix::Delete(Tree::Dirparent, schema::id_key(InodeId(id)))],
                )),
            );
        }
    }
    for (tree, key, what) in &s.bad_keys {
        c.push(
            "S7",
            ST_COUNTS,
            format!("{what}: {key:02x?}"),
            Some((
                "delete the key".to_string(),
                vec![Fix::Delete(*tree, key.clone())],
            )),
        );
    }
}
