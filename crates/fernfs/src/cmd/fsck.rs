//! `fernfs fsck TARGET [--repair]`: checks an unmounted image and optionally repairs it.
//! Opening the image runs the engine's recovery and verifies the checksum of everything read;
//! then every engine tree is walked node by node (structural invariants), and the file-system
//! invariants are checked over every key by `fern_fs::check` (the invariant list and the
//! repair rules live there, next to the schema they are about). This module only sequences
//! those steps and maps the outcome onto fsck(8)'s exit codes: 0 clean, 1 errors corrected,
//! 4 errors left uncorrected, 8 operational error (cannot open, lock or read the image).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fern_fs::check::{self, Finding, Report};

use super::image::{CmdError, Image, DEFAULT_CACHE};

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

/// The file-system check of an etcd file system: its store has no engine trees to verify, and
/// repair is refused because a mount elsewhere may be writing (docs/distributed.md §7).
fn fsck_etcd(url: &str, args: &FsckArgs) -> Result<u8, CmdError> {
    if args.repair {
        return Err(CmdError::new(format!(
            "{url}: --repair of an etcd file system is not supported yet: it needs every mount \
             stopped, and fernfs cannot verify that (no mount registry in etcd yet)"
        )));
    }
    let kv = super::etcd::open(url)?;
    let r = check::check(&*kv).map_err(|e| CmdError::new(format!("{url}: {e}")))?;
    summary(url, &r, args.verbose);
    Ok(if r.is_clean() { OK } else { UNCORRECTED })
}

fn fsck(args: &FsckArgs) -> Result<u8, CmdError> {
    if let Some(url) = super::etcd::url(&args.target) {
        return fsck_etcd(url, args);
    }
    let image = Image::open(&args.target, DEFAULT_CACHE)?;
    let name = args.target.display().to_string();
    // Engine structure first: the file-system check reads through these trees.
    let env = image.store.env();
    let mut engine_errors = Vec::new();
    let mut nodes = 0u64;
    for tree in env.tree_names() {
        match env.tree(&tree).and_then(|t| t.verify()) {
            Ok(r) => nodes += r.leaves + r.internal,
            Err(e) => engine_errors.push(format!("engine tree {tree:?}: {e}")),
        }
    }
    println!(
        "{name}: engine: {} trees, {nodes} nodes verified, {} damaged",
        env.tree_names().len(),
        engine_errors.len()
    );
    for e in &engine_errors {
        println!("  {e}");
    }
    let kv = image.kv();
    let code = if args.repair {
        if !engine_errors.is_empty() {
            println!("  not repairing: the engine trees are damaged (restore from a backup)");
            UNCORRECTED
        } else {
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
        }
    } else {
        let r = check::check(&*kv).map_err(|e| CmdError::new(format!("{name}: {e}")))?;
        summary(&name, &r, args.verbose);
        if r.is_clean() && engine_errors.is_empty() {
            OK
        } else {
            UNCORRECTED
        }
    };
    drop(kv);
    image.close()?;
    Ok(if engine_errors.is_empty() {
        code
    } else {
        UNCORRECTED
    })
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
