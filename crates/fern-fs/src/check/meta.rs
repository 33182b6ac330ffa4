//! C0: the superblock's allocator (`next_id` above every id in use) and the root directory
//! record.

use super::scan::Scan;
use super::{new_dir_stat, Ctx, Fix, Tree, ST_META};
use crate::attr::FileType;
use crate::ids::InodeId;
use crate::record::Inode;
use crate::schema;

pub(super) fn check(s: &Scan, c: &mut Ctx, max_id: u64) {
    let root = InodeId::ROOT.0;
    let alloc_fix = |n: u64| {
        Some((
            format!("set next_id to {n}"),
            vec![Fix::Put(
                Tree::Meta,
                schema::ALLOC_KEY.to_vec(),
                n.to_be_bytes().to_vec(),
            )],
        ))
    };
    match &s.next_id {
        Err(e) => c.push(
            "C0",
            ST_META,
            format!("next_id: {e}"),
            alloc_fix(max_id + 1),
        ),
        Ok(n) if *n <= max_id => c.push(
            "C0",
            ST_META,
            format!("next_id {n} is not above id {max_id}, which is in use"),
            alloc_fix(max_id + 1),
        ),
        Ok(_) => {}
    }
    let root_ok = matches!(s.records.get(&root), Some(Ok(i)) if i.stat.kind().ok() == Some(FileType::Directory));
    if !root_ok {
        let what = match s.records.get(&root) {
            None => "missing".to_string(),
            Some(Err(e)) => format!("undecodable ({e})"),
            Some(Ok(_)) => "not a directory".to_string(),
        };
        let rec = Inode {
            stat: new_dir_stat(0o755),
            payload: vec![],
        };
        c.push(
            "C0",
            ST_META,
            format!("root inode record {what}"),
            Some((
                "recreate the root directory (owner root, mode 755)".into(),
                vec![
                    Fix::Put(
                        Tree::Inode,
                        schema::id_key(InodeId::ROOT),
                        rec.encode_record(),
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId::ROOT),
                        root.to_be_bytes().to_vec(),
                    ),
                ],
            )),
        );
    }
}
