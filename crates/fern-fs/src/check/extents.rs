//! S8: data extents (docs/fs-design.md §9, format.md X9). Reads the `fs.extent` rows and
//! compares them with the store's live extents; counts extent slots as stored blocks for
//! S6's D1/D2. Repair frees what no name can reach: a live extent no row names (a leak), and
//! the extents of an inode that does not exist (with its rows, `data.rs`). It never frees an
//! extent while some row fails to decode (that row might name it), and leaves a row naming a
//! dead or wrong-sized extent, or an extent named twice, to a human.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fern_kv::{ExtentRef, KvStore};

use super::scan::{id_of, prefix_id, scan_tree, Scan};
use super::{Ctx, Fix, ST_COUNTS};
use crate::error::FsResult;
use crate::ids::InodeId;
use crate::schema::{self, Trees};

/// Extents freed by one repair batch: bounded so a batch of frees stays far below the
/// engine's log record and batch limits whatever the file's size.
const FREES_PER_BATCH: usize = 128;

impl Scan {
    /// Reads the `fs.extent` rows and compares them with the store's live extents.
    pub(super) fn read_extents(&mut self, kv: &dyn KvStore, t: &Trees) -> FsResult<()> {
        let mut named: HashMap<ExtentRef, u64> = HashMap::new();
        let mut problems = Vec::new();
        if let Some(xt) = t.extent {
            let mut slots: BTreeMap<u64, BTreeMap<u64, ExtentRef>> = BTreeMap::new();
            let mut undecodable = false;
            scan_tree(kv, xt, |k, v| {
                let (Some(id), Some(slot)) = (prefix_id(&k), k.get(8..).and_then(id_of)) else {
                    problems.push(format!("extent row key of {} bytes", k.len()));
                    undecodable = true;
                    return;
                };
                match schema::parse_extent_row(&v) {
                    Ok(r) => {
                        // Named even when of the wrong size: a row names it, so it is no leak.
                        if let Some(other) = named.insert(r, id) {
                            problems.push(format!(
                                "inode {id} slot {slot}: extent also named by inode {other}"
                            ));
                        }
                        if u64::from(r.len()) == schema::SLOT_BYTES {
                            slots.entry(id).or_default().insert(slot, r);
                        } else {
                            problems.push(format!(
                                "inode {id} slot {slot}: extent of {} bytes, not one slot",
                                r.len()
                            ));
                        }
                    }
                    Err(e) => {
                        problems.push(format!("inode {id} slot {slot}: {e}"));
                        undecodable = true;
                    }
                }
            })?;
            self.extent_slots = slots;
            self.undecodable_extent_rows = undecodable;
        }
        let live: BTreeSet<ExtentRef> = kv.extents()?.into_iter().collect();
        for (r, id) in &named {
            if !live.contains(r) {
                problems.push(format!("inode {id}: names extent {r:?}, which is not live"));
            }
        }
        self.leaked_extents = live
            .into_iter()
            .filter(|r| !named.contains_key(r))
            .collect();
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
            if let Some((last, _)) = slots.last_key_value() {
                d.end = d.end.max((last + 1) * schema::SLOT_BYTES);
            }
        }
    }

    /// The repair that deletes every `fs.extent` row of inode `id` and frees the extents
    /// they name, each free in the batch that deletes its row (E4). Empty when it has none.
    pub(super) fn drop_extent_rows(&self, id: u64) -> Vec<Fix> {
        let Some(slots) = self.extent_slots.get(&id) else {
            return Vec::new();
        };
        let id = InodeId(id);
        let slots: Vec<(u64, ExtentRef)> = slots.iter().map(|(s, r)| (*s, *r)).collect();
        slots
            .chunks(FREES_PER_BATCH)
            .map(|c| Fix::DropExtents {
                keys: c.iter().map(|(s, _)| schema::extent_key(id, *s)).collect(),
                refs: c.iter().map(|(_, r)| *r).collect(),
            })
            .collect()
    }
}

/// Reports what [`Scan::read_extents`] found, with the repair of leaked extents.
pub(super) fn check(s: &Scan, c: &mut Ctx) {
    for p in &s.extent_problems {
        c.push("S8", ST_COUNTS, p.clone(), None);
    }
    let leaked = &s.leaked_extents;
    if leaked.is_empty() {
        return;
    }
    let fix = (!s.undecodable_extent_rows).then(|| {
        let ops = leaked
            .chunks(FREES_PER_BATCH)
            .map(|c| Fix::DropExtents {
                keys: Vec::new(),
                refs: c.to_vec(),
            })
            .collect();
        ("free them (no row names them)".to_string(), ops)
    });
    let bytes: u64 = leaked.iter().map(|r| u64::from(r.len())).sum();
    c.push(
        "S8",
        ST_COUNTS,
        format!(
            "{} live extents named by no row (leaked, {bytes} bytes)",
            leaked.len()
        ),
        fix,
    );
}
