//! Offline check and repair of a fernfs store (`fernfs fsck`). It owns the file-system
//! invariants as they appear in the schema's keys — every tree is scanned whole, so it also
//! sees what a walk from the root cannot (records nothing names, keys of freed inodes) — and
//! the repairs that are safe to make without a human. It must only run while nothing else
//! writes the store (the command holds the image lock), and must never destroy a byte that
//! some name could still reach.
//!
//! Invariants (codes as printed; S for the schema, so they are never confused with the
//! benchmark workloads F1–F12):
//! * C0 the superblock decodes; `next_id` is above every id in use; the root is a directory
//!   record.
//! * S1 every entry decodes and names a live inode of its type (a linked entry, its record);
//!   every entry's parent is a live directory; no inode has two homes (two inline entries, or
//!   an inline entry and a record).
//! * S2 every directory's `fs.dirparent` is the directory its entry is in (the root's is the
//!   root); every directory is reachable from the root (no cycles); no dirparent for a
//!   non-directory.
//! * S3 a non-directory's link count equals the entries naming it.
//! * S4 a directory's link count is 2 + its subdirectories.
//! * S5 a symlink's size is its target's length.
//! * S6 no stored data byte at or beyond the file size (D1), blocks no longer than the block
//!   size, data only for regular files; a counted file's stored-block count is its number of
//!   stored blocks (D2).
//! * S7 orphan records name unreferenced inodes (a pending orphan — a file unlinked while
//!   open before a crash — is normal and freed by the next mount); every inode record is
//!   named, orphaned or the root; no data, xattrs or keys belonging to no inode.
//! * S8 data extents (docs/fs-design.md §9, format.md X9): every `fs.extent` row decodes and
//!   names a live extent of one whole slot, no extent is named twice, and the store's live
//!   extents are exactly those the rows name (none leaked). An extent slot counts all its
//!   blocks toward D2 and ends below the size (D1, extent.rs E1); block rows inside it shadow.
//!
//! Repair is iterative: each round scans everything, computes findings, and applies the fixes
//! of the earliest *stage* that has any (structure before counts, since removing or moving an
//! entry changes the counts), then scans again. What cannot be fixed safely — undecodable
//! values, an inode with two homes, entries under a non-directory — is left and reported.
//! Keys that may belong to such unknown inodes are never freed.
//!
//! Layout: `scan.rs` reads the store, `index.rs` finds each inode's home, and each invariant
//! family has its file — `meta.rs` (C0), `names.rs` (S1, S2 reachability), `orphans.rs`
//! (S7), `counts.rs` (S2 `..`, S3–S5), `data.rs` (S6), `extents.rs` (S8); `lost_found.rs` is where repair puts
//! what it cannot name. This file holds the findings, the repair rounds and their order.

mod counts;
mod data;
mod extents;
mod index;
mod lost_found;
mod meta;
mod names;
mod orphans;
mod scan;

pub use scan::paths_of;

use fern_kv::{KvStore, TreeId, WriteBatch, WriteOptions};

use crate::attr::{FileType, Stat, Timespec};
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;
use crate::schema::Trees;
use index::Index;
use lost_found::LostFound;
use scan::Scan;

/// Name of the directory under the root that repair moves unnamed inodes into.
pub const LOST_FOUND: &[u8] = b"lost+found";

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// A normal state with pending work (an orphan left by a crash): not an error.
    Note,
    /// A broken invariant.
    Error,
}

/// One thing the check found.
#[derive(Clone, Debug)]
pub struct Finding {
    /// Invariant code (C0, S1..S8).
    pub code: &'static str,
    /// What is wrong, with paths or ids.
    pub message: String,
    /// Note or error.
    pub severity: Severity,
    /// What repair does about it; `None` when it cannot be fixed safely.
    pub fix: Option<String>,
    stage: u8,
    ops: Vec<Fix>,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code, self.message)?;
        match &self.fix {
            Some(fix) => write!(f, " [repair: {fix}]"),
            None => write!(f, " [cannot be repaired safely]"),
        }
    }
}

/// What one check saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Directories (the root included).
    pub dirs: u64,
    /// Non-directory inodes that have at least one name.
    pub files: u64,
    /// Directory entries.
    pub entries: u64,
    /// Data blocks.
    pub blocks: u64,
    /// Everything found, notes included.
    pub findings: Vec<Finding>,
}

impl Report {
    /// The broken invariants (notes left out).
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }

    /// True when no invariant is broken.
    pub fn is_clean(&self) -> bool {
        self.errors().next().is_none()
    }
}

/// What a repair did and what it left.
#[derive(Clone, Debug, Default)]
pub struct RepairReport {
    /// The findings that were fixed, in the order they were fixed.
    pub fixed: Vec<Finding>,
    /// A final check after the last fix: what is left (empty of errors when all was fixed).
    pub after: Report,
}

impl RepairReport {
    /// Errors (not notes) that were corrected.
    pub fn errors_fixed(&self) -> usize {
        self.fixed
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count()
    }
}

/// Checks every invariant of the file system in `kv` without writing anything. Fails only
/// when the store cannot be read or holds no fernfs superblock.
pub fn check(kv: &dyn KvStore) -> FsResult<Report> {
    let t = Trees::open(kv)?;
    let scan = Scan::read(kv, &t)?;
    Ok(analyze(&scan))
}

/// Whole checks [`check_shared`] runs before it gives up on conflicts.
const SHARED_CHECK_ATTEMPTS: u32 = 5;

/// [`check`] of a store other processes may write while it reads (etcd: a lease expiring, a
/// compaction under a long scan, a mount elsewhere): a read that conflicts
/// ([`KvError::Conflict`](fern_kv::KvError::Conflict)) only says the store moved under the
/// check, so the whole check starts over, up to five times, instead of failing.
pub fn check_shared(kv: &dyn KvStore) -> FsResult<Report> {
    let mut attempt = 1;
    loop {
        match check(kv) {
            Err(FsError::Kv(fern_kv::KvError::Conflict)) if attempt < SHARED_CHECK_ATTEMPTS => {
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// Checks and repairs what can be repaired safely, then checks again. Every fix is written
/// with a synced batch per round, so an interrupted repair leaves a store a later repair can
/// continue from.
pub fn repair(kv: &dyn KvStore) -> FsResult<RepairReport> {
    let t = Trees::open(kv)?;
    let mut out = RepairReport::default();
    // Each round fixes at least one stage; six stages, plus slack for fixes that uncover
    // others (a recreated directory whose counts are then checked).
    for _ in 0..12 {
        let scan = Scan::read(kv, &t)?;
        let report = analyze(&scan);
        let Some(stage) = report
            .findings
            .iter()
            .filter(|f| f.fix.is_some())
            .map(|f| f.stage)
            .min()
        else {
            out.after = report;
            return Ok(out);
        };
        let mut ops = Vec::new();
        for f in report.findings {
            if f.fix.is_some() && f.stage == stage {
                ops.extend(f.ops.iter().cloned());
                out.fixed.push(f);
            }
        }
        apply(kv, &t, ops)?;
    }
    let scan = Scan::read(kv, &t)?;
    out.after = analyze(&scan);
    Ok(out)
}

/// One write of a repair.
#[derive(Clone, Debug)]
enum Fix {
    Put(Tree, Vec<u8>, Vec<u8>),
    Delete(Tree, Vec<u8>),
    DeleteRange(Tree, Vec<u8>, Vec<u8>),
    /// Deletes these `fs.extent` rows and frees these extents, all in one batch (extent.rs
    /// E4: a row never outlives its extent, an extent never its last row). With no rows (a
    /// leaked extent), the batch deletes a key no inode can have ([`NO_EXTENT_ROW`]): the
    /// engine refuses a batch that frees without changing a row (format.md, X9).
    DropExtents {
        keys: Vec<Vec<u8>>,
        refs: Vec<fern_kv::ExtentRef>,
    },
}

impl Fix {
    /// Operations it adds to a batch.
    fn ops(&self) -> usize {
        match self {
            Fix::DropExtents { keys, refs } => keys.len().max(1) + refs.len(),
            _ => 1,
        }
    }
}

/// The `fs.extent` key of slot 0 of inode 0, an id never allocated (ids start at the root,
/// 1): deleting it changes nothing, and gives a batch that only frees leaked extents its row.
const NO_EXTENT_ROW: [u8; 16] = [0; 16];

#[derive(Clone, Copy, Debug)]
enum Tree {
    Meta,
    Dentry,
    Inode,
    Data,
    Xattr,
    Dirparent,
    Orphan,
    Extent,
}

impl Tree {
    fn id(self, t: &Trees) -> FsResult<TreeId> {
        Ok(match self {
            Tree::Meta => t.meta,
            Tree::Dentry => t.dentry,
            Tree::Inode => t.inode,
            Tree::Data => t.data,
            Tree::Xattr => t.xattr,
            Tree::Dirparent => t.dirparent,
            Tree::Orphan => t.orphan,
            // Only a store with extents has extent rows to repair.
            Tree::Extent => t
                .extent
                .ok_or_else(|| FsError::corrupt("an extent repair on a store without extents"))?,
        })
    }
}

fn apply(kv: &dyn KvStore, t: &Trees, ops: Vec<Fix>) -> FsResult<()> {
    let max_ops = kv.limits().max_ops.unwrap_or(1024).clamp(1, 1024);
    let mut b = WriteBatch::new();
    for op in &ops {
        // A fix is never split across batches (DropExtents must stay whole, E4).
        if !b.is_empty() && b.len() + b.extent_frees().len() + op.ops() > max_ops {
            kv.write(std::mem::take(&mut b), WriteOptions::NO_SYNC)?;
        }
        match op {
            Fix::Put(tr, k, v) => b.put(tr.id(t)?, k.clone(), v.clone()),
            Fix::Delete(tr, k) => b.delete(tr.id(t)?, k.clone()),
            Fix::DeleteRange(tr, lo, hi) => b.delete_range(tr.id(t)?, lo.clone(), hi.clone()),
            Fix::DropExtents { keys, refs } => {
                let xt = Tree::Extent.id(t)?;
                if keys.is_empty() {
                    b.delete(xt, NO_EXTENT_ROW.to_vec());
                }
                for k in keys {
                    b.delete(xt, k.clone());
                }
                for r in refs {
                    b.free_extent(*r);
                }
            }
        }
    }
    if !b.is_empty() {
        kv.write(b, WriteOptions::NO_SYNC)?;
    }
    kv.sync()?;
    Ok(())
}

struct Ctx {
    out: Vec<Finding>,
    /// Next id to hand to something repair creates (lost+found).
    next_free: u64,
}

impl Ctx {
    fn push(
        &mut self,
        code: &'static str,
        stage: u8,
        message: String,
        fix: Option<(String, Vec<Fix>)>,
    ) {
        self.push_sev(code, stage, Severity::Error, message, fix);
    }

    fn push_sev(
        &mut self,
        code: &'static str,
        stage: u8,
        severity: Severity,
        message: String,
        fix: Option<(String, Vec<Fix>)>,
    ) {
        let (fix, ops) = match fix {
            Some((what, ops)) => (Some(what), ops),
            None => (None, Vec::new()),
        };
        self.out.push(Finding {
            code,
            message,
            severity,
            fix,
            stage,
            ops,
        });
    }
}

fn new_dir_stat(perm: u32) -> Stat {
    Stat::new(
        FileType::Directory.mode_bits() | perm,
        0,
        0,
        2,
        Timespec::now(),
    )
}

// Stages: fixes of a lower stage are applied (and the store scanned again) before any of a
// higher one is computed from a state they would change.
const ST_META: u8 = 0;
const ST_LOST_FOUND: u8 = 1;
const ST_STRUCTURE: u8 = 2;
const ST_COUNTS: u8 = 3;

fn analyze(s: &Scan) -> Report {
    let max_id = s
        .records
        .keys()
        .copied()
        .chain(
            s.entries
                .iter()
                .filter_map(|e| e.value.as_ref().ok().map(|d| d.id().0)),
        )
        .chain(s.entries.iter().map(|e| e.parent))
        .max()
        .unwrap_or(InodeId::ROOT.0);
    let mut c = Ctx {
        out: Vec::new(),
        next_free: max_id.max(InodeId::FIRST_FREE - 1) + 1,
    };
    if let Ok(n) = s.next_id {
        c.next_free = c.next_free.max(n);
    }

    meta::check(s, &mut c, max_id);
    let ix = Index::build(s, &mut c);
    let mut lf = LostFound::find(s, c.next_free);
    names::check_entries(s, &ix, &mut c, &mut lf);
    orphans::check_unnamed(s, &ix, &mut c, &mut lf);
    names::check_cycles(s, &ix, &mut c, &mut lf);
    lf.create_if_needed(&mut c);
    // Counts and leaked keys are computed only for inodes with one home; a later round sees
    // them again after structural fixes.
    let mut report = Report {
        entries: s.entries.len() as u64,
        ..Report::default()
    };
    counts::check(s, &ix, &mut c, &mut report);
    data::check(s, &ix, &mut c, &mut report);
    extents::check(s, &mut c);
    orphans::check_leaks(s, &ix, &mut c);
    report.findings = c.out;
    report
}
