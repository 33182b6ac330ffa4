//! The namespace: S1 (every entry decodes and names a live inode of its type, in a live
//! directory) and S2's reachability (every directory reachable from the root, no cycles).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::index::{Home, Index};
use super::lost_found::{lf_name, LostFound};
use super::scan::Scan;
use super::{new_dir_stat, Ctx, Fix, Tree, ST_STRUCTURE};
use crate::attr::FileType;
use crate::ids::InodeId;
use crate::record::{Dentry, Inode};
use crate::schema;

/// S1: each decoded entry against its parent and the inode it names; entries in a directory
/// that does not exist.
pub(super) fn check_entries(s: &Scan, ix: &Index, c: &mut Ctx, lf: &mut LostFound) {
    let root = InodeId::ROOT.0;
    let mut missing_parents: BTreeMap<u64, usize> = BTreeMap::new();
    for e in &s.entries {
        let Ok(d) = &e.value else { continue };
        let id = d.id().0;
        if e.parent != root && ix.kind_of(e.parent) != Some(FileType::Directory) {
            if ix.home.contains_key(&e.parent) || ix.keep.contains(&e.parent) {
                c.push(
                    "S1",
                    ST_STRUCTURE,
                    format!("{}: its parent {} is not a directory", e.path(), e.parent),
                    None,
                );
            } else {
                *missing_parents.entry(e.parent).or_default() += 1;
            }
        }
        if let Dentry::Linked { mode, .. } = d {
            if ix.ambiguous.contains(&id) {
                continue;
            }
            match s.records.get(&id) {
                None => c.push(
                    "S1",
                    ST_STRUCTURE,
                    if ix.inline.contains_key(&id) {
                        format!("{}: a link to inode {id}, which has no record", e.path())
                    } else {
                        format!("{}: names inode {id}, which does not exist", e.path())
                    },
                    Some((
                        "remove the entry".into(),
                        vec![Fix::Delete(Tree::Dentry, e.key.clone())],
                    )),
                ),
                Some(Err(_)) => {}
                Some(Ok(rec)) => {
                    let rk = rec.stat.kind().ok();
                    // A directory made on a shared store has its one entry linked to its
                    // record (docs/distributed.md §7); a second name would be a hard link.
                    if rk == Some(FileType::Directory) && ix.linked.get(&id).map_or(0, Vec::len) > 1
                    {
                        c.push(
                            "S1",
                            ST_STRUCTURE,
                            format!("{}: a hard link to directory {id}", e.path()),
                            None,
                        );
                    } else if FileType::from_mode(*mode) != rk {
                        let fixed = Dentry::Linked {
                            id: InodeId(id),
                            mode: rec.stat.mode,
                        };
                        c.push(
                            "S1",
                            ST_STRUCTURE,
                            format!(
                                "{}: says mode {:o}, inode {id} is mode {:o}",
                                e.path(),
                                mode,
                                rec.stat.mode
                            ),
                            Some((
                                "take the type from the inode".into(),
                                vec![Fix::Put(Tree::Dentry, e.key.clone(), fixed.encode())],
                            )),
                        );
                    }
                }
            }
        }
    }
    for (&p, &n) in &missing_parents {
        let fix = if lf.blocked {
            None
        } else {
            lf.need = true;
            let d = Dentry::Inline {
                id: InodeId(p),
                inode: Inode {
                    stat: new_dir_stat(0o700),
                    payload: vec![],
                },
            };
            Some((
                format!("recreate directory {p} as /lost+found/#{p}"),
                vec![
                    Fix::Put(
                        Tree::Dentry,
                        schema::named_key(InodeId(lf.target), &lf_name(p)),
                        d.encode(),
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(p)),
                        lf.target.to_be_bytes().to_vec(),
                    ),
                ],
            ))
        };
        c.push(
            "S1",
            ST_STRUCTURE,
            format!("{n} entries are in directory {p}, which does not exist"),
            fix,
        );
    }
}

/// S2: directories no walk from the root reaches, because they form a cycle.
pub(super) fn check_cycles(s: &Scan, ix: &Index, c: &mut Ctx, lf: &mut LostFound) {
    let root = InodeId::ROOT.0;
    // Parent of each directory by its entry.
    let mut dir_parent: HashMap<u64, usize> = HashMap::new();
    for (&id, h) in &ix.home {
        if let Home::Inline(i) = h {
            if ix.kind_of(id) == Some(FileType::Directory) {
                dir_parent.insert(id, *i);
            }
        }
    }
    let mut children: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, e) in s.entries.iter().enumerate() {
        children.entry(e.parent).or_default().push(i);
    }
    let mut reached: BTreeSet<u64> = BTreeSet::from([root]);
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for &i in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            if let Ok(Dentry::Inline { id, .. }) = &s.entries[i].value {
                if dir_parent.get(&id.0) == Some(&i) && reached.insert(id.0) {
                    stack.push(id.0);
                }
            }
        }
    }
    let mut in_cycle_reported: BTreeSet<u64> = BTreeSet::new();
    for &d in dir_parent.keys() {
        if reached.contains(&d) || in_cycle_reported.contains(&d) {
            continue;
        }
        // Walk up: a missing or non-directory ancestor is reported above; a loop is a cycle.
        let mut seen = vec![d];
        let mut cur = d;
        let cycle = loop {
            let Some(&i) = dir_parent.get(&cur) else {
                break None;
            };
            let p = s.entries[i].parent;
            if reached.contains(&p) {
                break None;
            }
            if let Some(pos) = seen.iter().position(|&x| x == p) {
                break Some(seen[pos..].to_vec());
            }
            seen.push(p);
            cur = p;
        };
        let Some(cycle) = cycle else { continue };
        in_cycle_reported.extend(cycle.iter().copied());
        let victim = *cycle.iter().min().unwrap_or(&d);
        let e = &s.entries[dir_parent[&victim]];
        let fix = if lf.blocked {
            None
        } else {
            lf.need = true;
            let v = match &e.value {
                Ok(d) => d.encode(),
                Err(_) => Vec::new(),
            };
            Some((
                format!("move directory {victim} to /lost+found/#{victim}"),
                vec![
                    Fix::Delete(Tree::Dentry, e.key.clone()),
                    Fix::Put(
                        Tree::Dentry,
                        schema::named_key(InodeId(lf.target), &lf_name(victim)),
                        v,
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(victim)),
                        lf.target.to_be_bytes().to_vec(),
                    ),
                ],
            ))
        };
        c.push(
            "S2",
            ST_STRUCTURE,
            format!("directories {cycle:?} form a cycle unreachable from the root"),
            fix,
        );
    }
}
