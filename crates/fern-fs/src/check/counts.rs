//! Per-inode counts, checked for inodes with one home once the structure is sound: S2's `..`
//! of each directory, S3 (a file's link count is the entries naming it), S4 (a directory's is
//! 2 + its subdirectories), S5 (a symlink's size is its target's length).

use std::collections::{BTreeSet, HashMap};

use super::index::{Home, Index};
use super::scan::Scan;
use super::{Ctx, Fix, Report, Tree, ST_COUNTS};
use crate::attr::FileType;
use crate::ids::InodeId;
use crate::record::Dentry;
use crate::schema;

pub(super) fn check(s: &Scan, ix: &Index, c: &mut Ctx, report: &mut Report) {
    let root = InodeId::ROOT.0;
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for e in &s.entries {
        if let Ok(d) = &e.value {
            if d.kind().ok() == Some(FileType::Directory) {
                *subdirs.entry(e.parent).or_default() += 1;
            }
        }
    }
    let ids: BTreeSet<u64> = ix.home.keys().copied().collect();
    for &id in &ids {
        let Some(st) = ix.stat_of(id) else { continue };
        let Ok(kind) = st.kind() else { continue };
        let st = *st;
        if id != root && !ix.named(id) {
            continue; // an orphan or unnamed record, handled above
        }
        if kind == FileType::Directory {
            report.dirs += 1;
            let want = 2 + subdirs.get(&id).copied().unwrap_or(0);
            if st.nlink != want {
                c.push(
                    "S4",
                    ST_COUNTS,
                    format!("directory {id}: link count {}, expected {want}", st.nlink),
                    ix.rewrite(id, &|s| s.nlink = want)
                        .map(|f| (format!("set it to {want}"), vec![f])),
                );
            }
            let want_parent = match (ix.home.get(&id), ix.linked.get(&id).map(Vec::as_slice)) {
                (Some(Home::Inline(i)), _) => s.entries[*i].parent,
                (_, Some([i])) => s.entries[*i].parent,
                _ => root,
            };
            let ok = matches!(s.dirparent.get(&id), Some(Ok(p)) if *p == want_parent);
            if !ok {
                let was = match s.dirparent.get(&id) {
                    None => "missing".to_string(),
                    Some(Err(e)) => e.clone(),
                    Some(Ok(p)) => format!("{p}"),
                };
                c.push(
                    "S2",
                    ST_COUNTS,
                    format!("directory {id}: `..` is {was}, its entry is in {want_parent}"),
                    Some((
                        format!("set `..` to {want_parent}"),
                        vec![Fix::Put(
                            Tree::Dirparent,
                            schema::id_key(InodeId(id)),
                            want_parent.to_be_bytes().to_vec(),
                        )],
                    )),
                );
            }
        } else {
            report.files += 1;
            let want =
                ix.inline.get(&id).map_or(0, Vec::len) + ix.linked.get(&id).map_or(0, Vec::len);
            let want = want as u32;
            if st.nlink != want {
                c.push(
                    "S3",
                    ST_COUNTS,
                    format!(
                        "inode {id}: link count {}, {want} entries name it",
                        st.nlink
                    ),
                    ix.rewrite(id, &|s| s.nlink = want)
                        .map(|f| (format!("set it to {want}"), vec![f])),
                );
            }
        }
        if kind == FileType::Symlink {
            let plen = match ix.home.get(&id) {
                Some(Home::Inline(i)) => match &s.entries[*i].value {
                    Ok(Dentry::Inline { inode, .. }) => inode.payload.len(),
                    _ => 0,
                },
                _ => s
                    .records
                    .get(&id)
                    .and_then(|r| r.as_ref().ok())
                    .map_or(0, |r| r.payload.len()),
            } as u64;
            if st.size != plen {
                c.push(
                    "S5",
                    ST_COUNTS,
                    format!("symlink {id}: size {}, target of {plen} bytes", st.size),
                    ix.rewrite(id, &|s| s.size = plen)
                        .map(|f| (format!("set the size to {plen}"), vec![f])),
                );
            }
        }
    }
}
