//! `fernfs fsck TARGET [--repair]`: checks an unmounted image and optionally repairs it.
//! Opening the image runs the engine's recovery and verifies the checksum of everything read;
//! then every engine tree is walked node by node (structural invariants), and the file-system
//! invariants are checked over every key by `fern_fs::check` (the invariant list and the
//! repair rules live there, next to the schema they are about). This module only sequences
//! those steps and maps the outcome onto fsck(8)'s exit codes: 0 clean, 1 errors corrected
//! (or, without `--repair`, damage the engine works around: a header slot), 4 errors left
//! uncorrected (damaged nodes, a damaged log), 8 operational error (cannot open, lock or read
//! the image).
//!
//! Without `--repair` the image is opened read-only (engine W11): recovery replays the log in
//! memory and nothing is written, so a check never changes what it checks. `--repair` opens it
//! for writing and lets the engine cut a damaged log at the damaged record.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fern_fs::check::{self, Finding, Report};

use super::image::{Access, CmdError, Image, DEFAULT_CACHE};

/// Options of `fernfs fsck`.
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Image file or block device (not mounted), or `etcd://HOST:PORT[,...]/PREFIX` (check
    /// only: nothing can tell yet whether another machine has it mounted).
    pub target: PathBuf,
    /// Repair what can be repaired safely (link counts, dangling entries, orphans, unnamed
    /// inodes into /lost+found, sizes below the stored data, leaked keys).
    #[arg(short = 'r', long, visible_alias = "fix")]
    pub repair: bool,
    /// Also print notes (pending orphans) and every finding, not only the first 100.
    #[arg(short, long)]
    pub verbose: bool,
}

const OK: u8 = 0;
const CORRECTED: u8 = 1;
const UNCORRECTED: u8 = 4;
const OPERATIONAL: u8 = 8;

/// Runs `fernfs fsck`; the exit code is fsck(8)'s.
pub fn run(args: FsckArgs) -> Result<ExitCode, CmdError> {
    match fsck(&args) {
        Ok(code) => Ok(ExitCode::from(code)),
        Err(e) => {
            eprintln!("fernfs fsck: {e}");
            Ok(ExitCode::from(OPERATIONAL))
        }
    }
}

/// Most affected paths listed per damaged node.
const PATHS_PER_NODE: usize = 20;

/// The inodes a key range `[lo, hi)` of a file-system tree may hold (every fs key but the
/// meta tree's starts with a big-endian inode id), inclusive.
fn inode_bounds(lo: &Option<Vec<u8>>, hi: &Option<Vec<u8>>) -> (u64, u64) {
    let ino = |k: &Option<Vec<u8>>| {
        k.as_ref().and_then(|k| {
            let b: [u8; 8] = k.get(..8)?.try_into().ok()?;
            Some(u64::from_be_bytes(b))
        })
    };
    (ino(lo).unwrap_or(0), ino(hi).unwrap_or(u64::MAX))
}

/// Describes the inode range for a report line.
fn inode_range((a, b): (u64, u64)) -> String {
    match (a, b) {
        (0, u64::MAX) => "all inodes".to_string(),
        (a, u64::MAX) => format!("inodes {a} and above"),
        (0, b) => format!("inodes up to {b}"),
        (a, b) if a == b => format!("inode {a}"),
        (a, b) => format!("inodes {a} to {b}"),
    }
}

/// The report lines naming the files and directories a damaged node of engine tree `tree`
/// affects, where the directory entries can tell.
fn affected(kv: &dyn fern_kv::KvStore, tree: &str, bounds: (u64, u64)) -> Vec<String> {
    if tree.ends_with("meta") {
        return vec!["    affects the superblock or the id allocator".into()];
    }
    // A node of the entry tree holds the listings of the directories in its range.
    let what = if tree.ends_with("dentry") {
        "entries of directory"
    } else {
        "data or attributes of"
    };
    match check::paths_of(kv, bounds.0, bounds.1, PATHS_PER_NODE) {
        Ok(paths) if paths.is_empty() => {
            vec!["    no named file or directory in that range".into()]
        }
        Ok(paths) => {
            let mut lines: Vec<String> = paths
                .iter()
                .map(|(ino, p)| {
                    format!(
                        "    affects {what} {} (inode {})",
                        String::from_utf8_lossy(p),
                        ino.0
                    )
                })
                .collect();
            if paths.len() == PATHS_PER_NODE {
                lines.push(format!("    ... (first {PATHS_PER_NODE} listed)"));
            }
            lines
        }
        Err(e) => vec![format!(
            "    which files: unknown, the directory entries are unreadable too ({e})"
        )],
    }
}

/// The file-system check of an etcd file system: its store has no engine trees to verify, and
/// repair is refused because a mount elsewhere may be writing (docs/distributed.md §7).
fn fsck_etcd(url: &str, args: &FsckArgs) -> Result<u8, CmdError> {
    if args.repair {
        return Err(CmdError::new(format!(
            "{url}: --repair of an etcd file system is not supported yet: it needs every mount \
             stopped, and fernfs cannot verify that (no mount registry in etcd yet)"
        )));
    }
    // Through the write-back wrapper (never taking): a mount holding the delegation flushes
    // before anything is checked.
    let kv = super::etcd::open_shared(url, fern_kv::TakePolicy::Never)?;
    let r = check::check_shared(&*kv).map_err(|e| CmdError::new(format!("{url}: {e}")))?;
    summary(url, &r, args.verbose);
    Ok(if r.is_clean() { OK } else { UNCORRECTED })
}

fn fsck(args: &FsckArgs) -> Result<u8, CmdError> {
    if let Some(url) = super::etcd::url(&args.target) {
        return fsck_etcd(url, args);
    }
    let name = args.target.display().to_string();
    let access = if args.repair {
        Access::Repair
    } else {
        Access::ReadOnly
    };
    let image = match Image::open_as(&args.target, DEFAULT_CACHE, access) {
        Ok(i) => i,
        // A damaged log is an error fsck found, not one that kept it from checking.
        Err(e) if e.0.contains("write-ahead log is damaged") => {
            println!("{e}");
            return Ok(UNCORRECTED);
        }
        Err(e) => return Err(e),
    };
    // What recovery worked around.
    let rec = image.recovery();
    let mut code = OK;
    for n in &rec.header_notes {
        if args.repair {
            println!("{name}: {n}; rewritten by the repair");
        } else {
            println!("{name}: {n}");
        }
        code = CORRECTED;
    }
    if let Some(cut) = &rec.log_cut {
        println!(
            "{name}: write-ahead log damaged at LSN {} ({}): cut there; dropped that record and              {} later records (LSN {}..{}); everything before LSN {} kept",
            cut.at, cut.why, cut.records_dropped, cut.at, cut.to, cut.at
        );
        code = CORRECTED;
    }
    // Engine structure first: the file-system check reads through these trees.
    let env = image.store.env();
    let mut engine_errors = Vec::new();
    let mut damaged_ranges = Vec::new();
    let mut nodes = 0u64;
    for tree in env.tree_names() {
        match env.tree(&tree).and_then(|t| t.verify_all()) {
            Ok((r, damaged)) => {
                nodes += r.leaves + r.internal + r.deltas;
                for d in damaged {
                    let bounds = inode_bounds(&d.lo, &d.hi);
                    engine_errors.push(format!(
                        "engine tree {tree:?}, node {} ({}): {}",
                        d.node,
                        inode_range(bounds),
                        d.error
                    ));
                    damaged_ranges.push((engine_errors.len() - 1, tree.clone(), bounds));
                }
            }
            Err(e) => engine_errors.push(format!("engine tree {tree:?}: {e}")),
        }
    }
    println!(
        "{name}: engine: {} trees, {nodes} nodes verified, {} damaged",
        env.tree_names().len(),
        engine_errors.len()
    );
    let kv = image.kv();
    for (i, e) in engine_errors.iter().enumerate() {
        println!("  {e}");
        for (_, tree, bounds) in damaged_ranges.iter().filter(|(j, ..)| *j == i) {
            for line in affected(&*kv, tree, *bounds) {
                println!("{line}");
            }
        }
    }
    if !engine_errors.is_empty() {
        println!(
            "  the file-system check needs every node; not run{}",
            if args.repair {
                ", not repairing: restore the damaged files from a backup"
            } else {
                ""
            }
        );
        drop(kv);
        image.close()?;
        return Ok(UNCORRECTED);
    }
    let fs_code = if args.repair {
        let r = check::repair(&*kv).map_err(|e| CmdError::new(format!("{name}: {e}")))?;
        for f in &r.fixed {
            if args.verbose || f.severity == check::Severity::Error {
                println!("  fixed: {f}");
            }
        }
        summary(&name, &r.after, args.verbose);
        if !r.after.is_clean() {
            UNCORRECTED
        } else if r.errors_fixed() > 0 {
            println!("{name}: {} errors corrected", r.errors_fixed());
            CORRECTED
        } else {
            OK
        }
    } else {
        let r = check::check(&*kv).map_err(|e| CmdError::new(format!("{name}: {e}")))?;
        summary(&name, &r, args.verbose);
        if r.is_clean() {
            OK
        } else {
            UNCORRECTED
        }
    };
    drop(kv);
    image.close()?;
    Ok(code.max(fs_code))
}

fn summary(name: &str, r: &Report, verbose: bool) {
    let errors: Vec<&Finding> = r.errors().collect();
    let notes = r.findings.len() - errors.len();
    println!(
        "{name}: {} directories, {} other inodes, {} entries, {} data blocks, {} problems",
        r.dirs,
        r.files,
        r.entries,
        r.blocks,
        errors.len()
    );
    let limit = if verbose { usize::MAX } else { 100 };
    for f in errors.iter().take(limit) {
        println!("  {f}");
    }
    if errors.len() > limit {
        println!("  ... and {} more (-v lists all)", errors.len() - limit);
    }
    if notes > 0 {
        println!(
            "  {notes} notes (pending orphans: files unlinked while open, freed at the next mount)"
        );
        if verbose {
            for f in r
                .findings
                .iter()
                .filter(|f| f.severity == check::Severity::Note)
            {
                println!("  note: {f}");
            }
        }
    }
}
