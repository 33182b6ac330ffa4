//! S6, stored data: no byte at or beyond the file size (D1), no block longer than the block
//! size nor a malformed overlay row (overlay.rs O1, O2), data only for regular files, a
//! counted file's stored-block count is its number of stored blocks (D2); and data blocks of
//! no inode (S7). Removing an inode's data removes
//! its extent rows and frees their extents too (extents.rs).

use super::index::Index;
use super::scan::Scan;
use super::{Ctx, Fix, Report, Tree, ST_COUNTS};
use crate::attr::{FileType, Stat};
use crate::ids::InodeId;
use crate::schema;

pub(super) fn check(s: &Scan, ix: &Index, c: &mut Ctx, report: &mut Report) {
    let bs = u64::from(s.sb.block_size);
    let may_free = !ix.undecodable_entries;
    for (&id, d) in &s.data {
        report.blocks += d.blocks;
        if !ix.live(id) {
            let (lo, hi) = schema::blocks_from(InodeId(id), 0);
            c.push(
                "S7",
                ST_COUNTS,
                format!(
                    "{} data blocks of inode {id}, which does not exist",
                    d.blocks
                ),
                may_free.then(|| {
                    let mut ops = vec![Fix::DeleteRange(Tree::Data, lo, hi)];
                    ops.extend(s.drop_extent_rows(id));
                    ("delete them (and free its extents)".to_string(), ops)
                }),
            );
            continue;
        }
        let Some(st) = ix.stat_of(id) else { continue };
        let Ok(kind) = st.kind() else { continue };
        if kind != FileType::Regular {
            let (lo, hi) = schema::blocks_from(InodeId(id), 0);
            c.push(
                "S6",
                ST_COUNTS,
                format!("{} data blocks of inode {id}, a {kind:?}", d.blocks),
                Some({
                    let mut ops = vec![Fix::DeleteRange(Tree::Data, lo, hi)];
                    ops.extend(s.drop_extent_rows(id));
                    ("delete them (and free its extents)".to_string(), ops)
                }),
            );
            continue;
        }
        if !d.bad_blocks.is_empty() {
            c.push(
                "S6",
                ST_COUNTS,
                format!(
                    "inode {id}: blocks {:?} are empty, longer than the block size {bs} or malformed overlays",
                    d.bad_blocks
                ),
                None,
            );
        }
        if d.end > st.size {
            let end = d.end;
            c.push(
                "S6",
                ST_COUNTS,
                format!("inode {id}: data stored up to byte {end}, size {}", st.size),
                ix.rewrite(id, &|s| s.size = end).map(|f| {
                    (
                        format!("raise the size to {end} (keeps every stored byte)"),
                        vec![f],
                    )
                }),
            );
        }
    }
    // D2: a counted file's stored-block count (its st_blocks) equals its stored blocks.
    let mut counted: Vec<u64> = ix.home.keys().copied().collect();
    counted.sort_unstable();
    for id in counted {
        let Some(n) = ix.stat_of(id).and_then(Stat::stored_blocks) else {
            continue;
        };
        let have = s.data.get(&id).map_or(0, |d| d.blocks);
        if n != have {
            c.push(
                "S6",
                ST_COUNTS,
                format!("inode {id}: counts {n} stored blocks, has {have}"),
                ix.rewrite(id, &|st| st.set_stored_blocks(have))
                    .map(|f| (format!("set the count to {have}"), vec![f])),
            );
        }
    }
}
