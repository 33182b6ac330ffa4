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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use fern_kv::{Direction, KeyRange, KvStore, TreeId, WriteBatch, WriteOptions};

use crate::attr::{FileType, Stat, Timespec};
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;
use crate::record::{Dentry, Inode};
use crate::schema::{self, Superblock, Trees};

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
    /// Invariant code (C0, S1..S7).
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
}

#[derive(Clone, Copy, Debug)]
enum Tree {
    Meta,
    Dentry,
    Inode,
    Data,
    Xattr,
    Dirparent,
    Orphan,
}

impl Tree {
    fn id(self, t: &Trees) -> TreeId {
        match self {
            Tree::Meta => t.meta,
            Tree::Dentry => t.dentry,
            Tree::Inode => t.inode,
            Tree::Data => t.data,
            Tree::Xattr => t.xattr,
            Tree::Dirparent => t.dirparent,
            Tree::Orphan => t.orphan,
        }
    }
}

fn apply(kv: &dyn KvStore, t: &Trees, ops: Vec<Fix>) -> FsResult<()> {
    let max_ops = kv.limits().max_ops.unwrap_or(1024).clamp(1, 1024);
    for chunk in ops.chunks(max_ops) {
        let mut b = WriteBatch::new();
        for op in chunk {
            match op {
                Fix::Put(tr, k, v) => b.put(tr.id(t), k.clone(), v.clone()),
                Fix::Delete(tr, k) => b.delete(tr.id(t), k.clone()),
                Fix::DeleteRange(tr, lo, hi) => b.delete_range(tr.id(t), lo.clone(), hi.clone()),
            }
        }
        kv.write(b, WriteOptions::NO_SYNC)?;
    }
    kv.sync()?;
    Ok(())
}

/// A directory entry as scanned.
struct Ent {
    parent: u64,
    name: Vec<u8>,
    key: Vec<u8>,
    value: Result<Dentry, String>,
}

impl Ent {
    fn path(&self) -> String {
        format!(
            "entry {:?} in directory {}",
            String::from_utf8_lossy(&self.name),
            self.parent
        )
    }
}

#[derive(Default)]
struct DataInfo {
    blocks: u64,
    /// One past the last stored byte.
    end: u64,
    /// Blocks longer than the block size or empty.
    bad_blocks: Vec<u64>,
}

/// Everything the store holds, decoded as far as it decodes.
struct Scan {
    sb: Superblock,
    next_id: Result<u64, String>,
    records: BTreeMap<u64, Result<Inode, String>>,
    entries: Vec<Ent>,
    dirparent: BTreeMap<u64, Result<u64, String>>,
    orphans: BTreeSet<u64>,
    data: BTreeMap<u64, DataInfo>,
    xattrs: BTreeMap<u64, u64>,
    /// Extent slots of each inode (S8).
    extent_slots: BTreeMap<u64, BTreeSet<u64>>,
    /// What is wrong with the extent rows and the live extents (S8).
    extent_problems: Vec<String>,
    /// Keys of the wrong shape: (tree, key, what).
    bad_keys: Vec<(Tree, Vec<u8>, &'static str)>,
}

fn scan_tree(
    kv: &dyn KvStore,
    tree: TreeId,
    mut each: impl FnMut(Vec<u8>, Vec<u8>),
) -> FsResult<()> {
    let mut range = KeyRange::all();
    loop {
        let page = kv.scan(tree, &range, Direction::Forward, 512)?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        range.lo = Bound::Excluded(last.clone());
        for (k, v) in page {
            each(k, v);
        }
    }
}

fn id_of(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

fn prefix_id(key: &[u8]) -> Option<u64> {
    key.get(..8).and_then(id_of)
}

impl Scan {
    fn read(kv: &dyn KvStore, t: &Trees) -> FsResult<Scan> {
        let sb = match kv.get(t.meta, schema::SUPER_KEY)? {
            Some(v) => Superblock::decode(&v)?,
            None => return Err(FsError::NotFormatted("no superblock".into())),
        };
        let next_id = match kv.get(t.meta, schema::ALLOC_KEY)? {
            None => Err("missing".to_string()),
            Some(v) => id_of(&v).ok_or_else(|| format!("{} bytes, not 8", v.len())),
        };
        let mut s = Scan {
            sb,
            next_id,
            records: BTreeMap::new(),
            entries: Vec::new(),
            dirparent: BTreeMap::new(),
            orphans: BTreeSet::new(),
            data: BTreeMap::new(),
            xattrs: BTreeMap::new(),
            extent_slots: BTreeMap::new(),
            extent_problems: Vec::new(),
            bad_keys: Vec::new(),
        };
        s.read_extents(kv, t)?;
        let mut bad = Vec::new();
        scan_tree(kv, t.inode, |k, v| match id_of(&k) {
            Some(id) => {
                let rec = Inode::decode_record(&v).map_err(|e| e.to_string());
                s.records.insert(id, rec);
            }
            None => bad.push((Tree::Inode, k, "inode key not 8 bytes")),
        })?;
        scan_tree(kv, t.dentry, |k, v| match prefix_id(&k) {
            Some(parent) if k.len() > 8 => s.entries.push(Ent {
                parent,
                name: k[8..].to_vec(),
                value: Dentry::decode(&v).map_err(|e| e.to_string()),
                key: k,
            }),
            _ => bad.push((Tree::Dentry, k, "entry key without a name")),
        })?;
        scan_tree(kv, t.dirparent, |k, v| match id_of(&k) {
            Some(id) => {
                let p = id_of(&v).ok_or_else(|| format!("value of {} bytes", v.len()));
                s.dirparent.insert(id, p);
            }
            None => bad.push((Tree::Dirparent, k, "dirparent key not 8 bytes")),
        })?;
        scan_tree(kv, t.orphan, |k, _| match id_of(&k) {
            Some(id) => {
                s.orphans.insert(id);
            }
            None => bad.push((Tree::Orphan, k, "orphan key not 8 bytes")),
        })?;
        let bs = u64::from(s.sb.block_size);
        let per_slot = schema::SLOT_BYTES / bs;
        scan_tree(kv, t.data, |k, v| {
            if k.len() != 16 {
                bad.push((Tree::Data, k, "data key not 16 bytes"));
                return;
            }
            let id = prefix_id(&k).unwrap_or(0);
            let block = id_of(&k[8..]).unwrap_or(0);
            let d = s.data.entry(id).or_default();
            // A row inside an extent slot shadows a block the extent already counts.
            let shadow = s
                .extent_slots
                .get(&id)
                .is_some_and(|slots| slots.contains(&(block / per_slot)));
            d.blocks += u64::from(!shadow);
            let len = v.len() as u64;
            if len == 0 || len > bs {
                d.bad_blocks.push(block);
            }
            let end = block.saturating_mul(bs).saturating_add(len);
            d.end = d.end.max(end);
        })?;
        for (&id, slots) in &s.extent_slots {
            let d = s.data.entry(id).or_default();
            d.blocks += slots.len() as u64 * per_slot;
            if let Some(last) = slots.last() {
                d.end = d.end.max((last + 1) * schema::SLOT_BYTES);
            }
        }
        scan_tree(kv, t.xattr, |k, _| match prefix_id(&k) {
            Some(id) if k.len() > 8 => *s.xattrs.entry(id).or_default() += 1,
            _ => bad.push((Tree::Xattr, k, "xattr key without a name")),
        })?;
        s.bad_keys = bad;
        Ok(s)
    }
}

impl Scan {
    /// Reads the `fs.extent` rows and compares them with the store's live extents (S8).
    fn read_extents(&mut self, kv: &dyn KvStore, t: &Trees) -> FsResult<()> {
        let mut named: HashMap<fern_kv::ExtentRef, u64> = HashMap::new();
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
        let live: BTreeSet<fern_kv::ExtentRef> = kv.extents()?.into_iter().collect();
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
}

/// Where an inode's stat lives.
#[derive(Clone, Copy, Debug)]
enum Home {
    /// In this entry (index into `Scan::entries`).
    Inline(usize),
    /// In the `fs.inode` record.
    Record,
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

fn free_ops(id: u64) -> Vec<Fix> {
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

fn lf_name(id: u64) -> Vec<u8> {
    format!("#{id}").into_bytes()
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
    let root = InodeId::ROOT.0;

    // ---- C0: allocator and root.
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

    // ---- Index the entries.
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
    // An inode's stat, if it is unambiguous and decodes.
    let stat_of = |id: u64| -> Option<&Stat> {
        match home.get(&id)? {
            Home::Inline(i) => match &s.entries[*i].value {
                Ok(Dentry::Inline { inode, .. }) => Some(&inode.stat),
                _ => None,
            },
            Home::Record => s.records.get(&id)?.as_ref().ok().map(|i| &i.stat),
        }
    };
    let kind_of = |id: u64| stat_of(id).and_then(|st| st.kind().ok());
    // Ids whose keys must never be freed: anything an undecodable value might be.
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

    // ---- lost+found, if repair will need it.
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
    let lf_target = lf_id.unwrap_or(c.next_free);
    let mut need_lf = false;

    // ---- S1: entries.
    let mut missing_parents: BTreeMap<u64, usize> = BTreeMap::new();
    for e in &s.entries {
        let Ok(d) = &e.value else { continue };
        let id = d.id().0;
        if e.parent != root && kind_of(e.parent) != Some(FileType::Directory) {
            if home.contains_key(&e.parent) || keep.contains(&e.parent) {
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
            if ambiguous.contains(&id) {
                continue;
            }
            match s.records.get(&id) {
                None => c.push(
                    "S1",
                    ST_STRUCTURE,
                    if inline.contains_key(&id) {
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
                    if rk == Some(FileType::Directory) && linked.get(&id).map_or(0, Vec::len) > 1 {
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
        let fix = if lf_blocked {
            None
        } else {
            need_lf = true;
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
                        schema::named_key(InodeId(lf_target), &lf_name(p)),
                        d.encode(),
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(p)),
                        lf_target.to_be_bytes().to_vec(),
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

    // ---- S7: orphans and unnamed records.
    let named = |id: u64| inline.contains_key(&id) || linked.contains_key(&id);
    for &o in &s.orphans {
        if named(o) {
            c.push(
                "S7",
                ST_STRUCTURE,
                format!("orphan record for inode {o}, which still has names"),
                Some((
                    "drop the orphan record, keep the file".into(),
                    vec![Fix::Delete(Tree::Orphan, schema::id_key(InodeId(o)))],
                )),
            );
        } else if keep.contains(&o) {
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
        if id == root || named(id) || s.orphans.contains(&id) {
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
        } else if lf_blocked {
            None
        } else {
            need_lf = true;
            let key = schema::named_key(InodeId(lf_target), &lf_name(id));
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
                        lf_target.to_be_bytes().to_vec(),
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

    // ---- S2: reachability (cycles). Parent of each directory by its entry.
    let mut dir_parent: HashMap<u64, usize> = HashMap::new();
    for (&id, h) in &home {
        if let Home::Inline(i) = h {
            if kind_of(id) == Some(FileType::Directory) {
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
        let fix = if lf_blocked {
            None
        } else {
            need_lf = true;
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
                        schema::named_key(InodeId(lf_target), &lf_name(victim)),
                        v,
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(victim)),
                        lf_target.to_be_bytes().to_vec(),
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

    if need_lf && lf_id.is_none() {
        let d = Dentry::Inline {
            id: InodeId(lf_target),
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
                format!("create /lost+found (inode {lf_target})"),
                vec![
                    Fix::Put(
                        Tree::Dentry,
                        schema::named_key(InodeId::ROOT, LOST_FOUND),
                        d.encode(),
                    ),
                    Fix::Put(
                        Tree::Dirparent,
                        schema::id_key(InodeId(lf_target)),
                        root.to_be_bytes().to_vec(),
                    ),
                    Fix::Put(
                        Tree::Meta,
                        schema::ALLOC_KEY.to_vec(),
                        (lf_target + 1).to_be_bytes().to_vec(),
                    ),
                ],
            )),
        );
    }

    // ---- Counts (S2 dirparent, S3, S4, S5, S6) and leaked keys. Computed only for inodes
    // with one home; a later round sees them again after structural fixes.
    let mut report = Report {
        entries: s.entries.len() as u64,
        ..Report::default()
    };
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for e in &s.entries {
        if let Ok(d) = &e.value {
            if d.kind().ok() == Some(FileType::Directory) {
                *subdirs.entry(e.parent).or_default() += 1;
            }
        }
    }
    // Rewrites the stat of `id` at its home with `f`.
    let rewrite = |id: u64, f: &dyn Fn(&mut Stat)| -> Option<Fix> {
        match home.get(&id)? {
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
    };
    let bs = u64::from(s.sb.block_size);
    let ids: BTreeSet<u64> = home.keys().copied().collect();
    for &id in &ids {
        let Some(st) = stat_of(id) else { continue };
        let Ok(kind) = st.kind() else { continue };
        let st = *st;
        if id != root && !named(id) {
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
                    rewrite(id, &|s| s.nlink = want)
                        .map(|f| (format!("set it to {want}"), vec![f])),
                );
            }
            let want_parent = match (home.get(&id), linked.get(&id).map(Vec::as_slice)) {
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
            let want = inline.get(&id).map_or(0, Vec::len) + linked.get(&id).map_or(0, Vec::len);
            let want = want as u32;
            if st.nlink != want {
                c.push(
                    "S3",
                    ST_COUNTS,
                    format!(
                        "inode {id}: link count {}, {want} entries name it",
                        st.nlink
                    ),
                    rewrite(id, &|s| s.nlink = want)
                        .map(|f| (format!("set it to {want}"), vec![f])),
                );
            }
        }
        if kind == FileType::Symlink {
            let plen = match home.get(&id) {
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
                    rewrite(id, &|s| s.size = plen)
                        .map(|f| (format!("set the size to {plen}"), vec![f])),
                );
            }
        }
    }
    // Data and xattrs.
    let live = |id: u64| home.contains_key(&id) || s.orphans.contains(&id) || keep.contains(&id);
    let may_free = !undecodable_entries;
    for (&id, d) in &s.data {
        report.blocks += d.blocks;
        if !live(id) {
            let (lo, hi) = schema::blocks_from(InodeId(id), 0);
            c.push(
                "S7",
                ST_COUNTS,
                format!(
                    "{} data blocks of inode {id}, which does not exist",
                    d.blocks
                ),
                may_free.then(|| {
                    (
                        "delete them".to_string(),
                        vec![Fix::DeleteRange(Tree::Data, lo, hi)],
                    )
                }),
            );
            continue;
        }
        let Some(st) = stat_of(id) else { continue };
        let Ok(kind) = st.kind() else { continue };
        if kind != FileType::Regular {
            let (lo, hi) = schema::blocks_from(InodeId(id), 0);
            c.push(
                "S6",
                ST_COUNTS,
                format!("{} data blocks of inode {id}, a {kind:?}", d.blocks),
                Some((
                    "delete them".to_string(),
                    vec![Fix::DeleteRange(Tree::Data, lo, hi)],
                )),
            );
            continue;
        }
        if !d.bad_blocks.is_empty() {
            c.push(
                "S6",
                ST_COUNTS,
                format!(
                    "inode {id}: blocks {:?} are empty or longer than the block size {bs}",
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
                rewrite(id, &|s| s.size = end).map(|f| {
                    (
                        format!("raise the size to {end} (keeps every stored byte)"),
                        vec![f],
                    )
                }),
            );
        }
    }
    for p in &s.extent_problems {
        c.push("S8", ST_COUNTS, p.clone(), None);
    }
    // D2: a counted file's stored-block count (its st_blocks) equals its stored blocks.
    let mut counted: Vec<u64> = home.keys().copied().collect();
    counted.sort_unstable();
    for id in counted {
        let Some(n) = stat_of(id).and_then(Stat::stored_blocks) else {
            continue;
        };
        let have = s.data.get(&id).map_or(0, |d| d.blocks);
        if n != have {
            c.push(
                "S6",
                ST_COUNTS,
                format!("inode {id}: counts {n} stored blocks, has {have}"),
                rewrite(id, &|st| st.set_stored_blocks(have))
                    .map(|f| (format!("set the count to {have}"), vec![f])),
            );
        }
    }
    for (&id, &n) in &s.xattrs {
        if !live(id) {
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
        if kind_of(id) != Some(FileType::Directory) && !keep.contains(&id) && id != root {
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
    report.findings = c.out;
    report
}

/// Paths of the directory entries naming an inode in `lo..=hi` (at most `limit` of them, by
/// entry order), built from the entry tree alone: fsck uses it to say which files and
/// directories a damaged engine node affects, while that node's own tree cannot be read (as
/// e2fsck names the files of a bad block). Fails if the entry tree cannot be read either.
pub fn paths_of(
    kv: &dyn KvStore,
    lo: u64,
    hi: u64,
    limit: usize,
) -> FsResult<Vec<(InodeId, Vec<u8>)>> {
    let t = Trees::open(kv)?;
    // child -> (parent, name), and the entries that hit the range.
    let mut up: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut hits = Vec::new();
    scan_tree(kv, t.dentry, |k, v| {
        let (Some(parent), Ok(d)) = (prefix_id(&k), Dentry::decode(&v)) else {
            return;
        };
        let child = d.id().0;
        let name = k[8..].to_vec();
        if (lo..=hi).contains(&child) && hits.len() < limit {
            hits.push((child, parent, name.clone()));
        }
        up.entry(child).or_insert((parent, name));
    })?;
    let path = |mut id: u64, leaf: Vec<u8>| {
        let mut parts = vec![leaf];
        // Bounded: a damaged image may hold a cycle.
        for _ in 0..4096 {
            if id == InodeId::ROOT.0 {
                break;
            }
            match up.get(&id) {
                Some((p, name)) => {
                    parts.push(name.clone());
                    id = *p;
                }
                None => {
                    parts.push(format!("?{id}").into_bytes());
                    break;
                }
            }
        }
        parts.reverse();
        let mut out = Vec::new();
        for p in parts {
            out.push(b'/');
            out.extend_from_slice(&p);
        }
        out
    };
    let mut out: Vec<(InodeId, Vec<u8>)> = hits
        .into_iter()
        .map(|(child, parent, name)| (InodeId(child), path(parent, name)))
        .collect();
    if (lo..=hi).contains(&InodeId::ROOT.0) && out.len() < limit {
        out.insert(0, (InodeId::ROOT, b"/".to_vec()));
    }
    Ok(out)
}
