//! S8: data extents (docs/fs-design.md §9, format.md X9). Reads the `fs.extent` rows and
//! compares them with the store's live extents; counts extent slots as stored blocks for
//! S6's D1/D2. It reports and never repairs (freeing a leaked extent is the next step).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fern_kv::{ExtentRef, KvStore};

use super::scan::{id_of, prefix_id, scan_tree, Scan};
use super::{Ctx, ST_COUNTS};
use crate::error::FsResult;
use crate::schema::{self, Trees};

impl Scan {
    /// Reads the `fs.extent` rows and compares them with the store's live extents.
    pub(super) fn read_extents(&mut self, kv: &dyn KvStore, t: &Trees) -> FsResult<()> {
        let mut named: HashMap<ExtentRef, u64> = HashMap::new();
        let mut problems = Vec::new();
        if let Some(xt) = t.extent {
            let mut slots: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
            scan_tree(kv, xt, |k, v| {
                let (Some(id), Some(slot)) = (prefix_id(&k), k.get(8..).and_then(id_of)) else {
                    problems.push(format!("extent row key of {} bytes", k.len()));
                    return;
                };
                match schema::parse_extent_row(&v) {
                    Ok(r) if u64::from(r.len()) != schema::SLOT_BYTES => problems.push(format!(
                        "inode {id} slot {slot}: extent of {} bytes, not one slot",
                        r.len()
                    )),
                    Ok(r) => {
                        if let Some(other) = named.insert(r, id) {
                            problems.push(format!(
                                "inode {id} slot {slot}: extent also named by inode {other}"
                            ));
                        }
                        slots.entry(id).or_default().insert(slot);
                    }
                    Err(e) => problems.push(format!("inode {id} slot {slot}: {e}")),
                }
            })?;
            self.extent_slots = slots;
        }
        let live: BTreeSet<ExtentRef> = kv.extents()?.into_iter().collect();
        for (r, id) in &named {
            if !live.contains(r) {
                problems.push(format!("inode {id}: names extent {r:?}, which is not live"));
            }
        }
        let leaked = live.iter().filter(|r| !named.contains_key(r)).count();
        if leaked > 0 {
            problems.push(format!("{leaked} live extents named by no row (leaked)"));
        }
        problems.sort();
        self.extent_problems = problems;
        Ok(())
    }

    /// Adds every extent slot's blocks to its inode's stored blocks, and its end to the
    /// inode's stored end (rows inside a slot were not counted: they shadow).
    pub(super) fn count_extent_slots(&mut self, per_slot: u64) {
        for (&id, slots) in &self.extent_slots {
            let d = self.data.entry(id).or_default();
            d.blocks += slots.len() as u64 * per_slot;
            if let Some(last) = slots.last() {
                d.end = d.end.max((last + 1) * schema::SLOT_BYTES);
            }
        }
    }
}

/// Reports what [`Scan::read_extents`] found.
pub(super) fn check(s: &Scan, c: &mut Ctx) {
    for p in &s.extent_problems {
        c.push("S8", ST_COUNTS, p.clone(), None);
    }
}
