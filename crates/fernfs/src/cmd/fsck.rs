//! `fernfs fsck TARGET`: file-system invariants of an unmounted image, checked through the
//! fern-fs API. Opening the image runs the engine's own recovery and checksum verification of
//! what it reads; mounting the core frees the orphans of a crashed mount. Then a walk of the
//! whole namespace from the root checks:
//!
//! * F1 every entry resolves to a live inode of the entry's type;
//! * F2 every directory's `..` (dirparent) is the directory it was found in, and no directory
//!   is reached twice;
//! * F3 every non-directory's link count equals the number of entries naming it;
//! * F4 every directory's link count is 2 + its subdirectories;
//! * F5 symlink targets read back, with the length the size says.
//!
//! Exit codes follow fsck(8): 0 clean, 4 errors left uncorrected, 8 operational error.
//! `--repair` is not implemented yet; it must never write anything but orphan cleanup.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fern_fs::{FileType, Fs, InodeId};

use super::image::{CmdError, Image, DEFAULT_CACHE};

/// Options of `fernfs fsck`.
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Image file (not mounted).
    pub target: PathBuf,
    /// Print every directory visited.
    #[arg(short, long)]
    pub verbose: bool,
}

/// What the walk found.
#[derive(Debug, Default)]
pub struct Report {
    /// Directories visited.
    pub dirs: u64,
    /// Non-directory inodes found.
    pub files: u64,
    /// Entries read.
    pub entries: u64,
    /// Violations, each naming the invariant.
    pub problems: Vec<String>,
}

/// Runs `fernfs fsck`; the exit code is fsck(8)'s.
pub fn run(args: FsckArgs) -> Result<ExitCode, CmdError> {
    let image = match Image::open(&args.target, DEFAULT_CACHE) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("fernfs fsck: {e}");
            return Ok(ExitCode::from(8));
        }
    };
    let fs = match image.fs() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("fernfs fsck: {e}");
            return Ok(ExitCode::from(8));
        }
    };
    let report = check(&fs, args.verbose);
    drop(fs);
    image.close()?;
    println!(
        "{}: {} directories, {} other inodes, {} entries, {} problems",
        args.target.display(),
        report.dirs,
        report.files,
        report.entries,
        report.problems.len()
    );
    for p in report.problems.iter().take(100) {
        println!("  {p}");
    }
    if report.problems.len() > 100 {
        println!("  ... and {} more", report.problems.len() - 100);
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

/// Walks the namespace of `fs` and checks F1-F5.
pub fn check(fs: &Fs, verbose: bool) -> Report {
    let mut r = Report::default();
    // Non-directories: (entries naming it, link count, a path for messages).
    let mut links: HashMap<InodeId, (u32, u32, String)> = HashMap::new();
    let mut seen_dirs: HashSet<InodeId> = HashSet::from([InodeId::ROOT]);
    let mut queue = VecDeque::from([(InodeId::ROOT, "/".to_string())]);
    while let Some((dir, path)) = queue.pop_front() {
        r.dirs += 1;
        if verbose {
            eprintln!("{path}");
        }
        let mut subdirs = 0u32;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = match fs.list(dir, after.as_deref(), 256, false) {
                Ok(p) => p,
                Err(e) => {
                    r.problems.push(format!("F1 {path}: listing failed: {e}"));
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                r.entries += 1;
                let name = String::from_utf8_lossy(&e.name);
                let child = if path == "/" {
                    format!("/{name}")
                } else {
                    format!("{path}/{name}")
                };
                let attr = match fs.lookup(dir, &e.name) {
                    Ok(a) => a,
                    Err(err) => {
                        r.problems
                            .push(format!("F1 {child}: entry does not resolve: {err}"));
                        continue;
                    }
                };
                if attr.ino != e.ino || attr.kind != e.kind {
                    r.problems.push(format!(
                        "F1 {child}: entry says inode {} {:?}, inode is {} {:?}",
                        e.ino.0, e.kind, attr.ino.0, attr.kind
                    ));
                }
                match attr.kind {
                    FileType::Directory => {
                        subdirs += 1;
                        match fs.parent_of(attr.ino) {
                            Ok(p) if p == dir => {}
                            Ok(p) => r.problems.push(format!(
                                "F2 {child}: `..` is inode {}, found in inode {}",
                                p.0, dir.0
                            )),
                            Err(err) => r.problems.push(format!("F2 {child}: no `..`: {err}")),
                        }
                        if seen_dirs.insert(attr.ino) {
                            queue.push_back((attr.ino, child));
                        } else {
                            r.problems.push(format!(
                                "F2 {child}: directory {} reached twice",
                                attr.ino.0
                            ));
                            fs.forget(attr.ino, 1);
                        }
                        // Directories stay pinned: their listing comes later.
                    }
                    kind => {
                        if kind == FileType::Symlink {
                            match fs.readlink(attr.ino) {
                                Ok(t) if t.len() as u64 == attr.size => {}
                                Ok(t) => r.problems.push(format!(
                                    "F5 {child}: target of {} bytes, size {}",
                                    t.len(),
                                    attr.size
                                )),
                                Err(err) => r.problems.push(format!("F5 {child}: readlink: {err}")),
                            }
                        }
                        let l = links
                            .entry(attr.ino)
                            .or_insert((0, attr.nlink, child.clone()));
                        l.0 += 1;
                        fs.forget(attr.ino, 1);
                    }
                }
            }
        }
        match fs.getattr(dir) {
            Ok(a) if a.nlink == 2 + subdirs => {}
            Ok(a) => r.problems.push(format!(
                "F4 {path}: link count {}, expected {} (2 + {subdirs} subdirectories)",
                a.nlink,
                2 + subdirs
            )),
            Err(err) => r.problems.push(format!("F4 {path}: getattr: {err}")),
        }
    }
    r.files = links.len() as u64;
    for (ino, (found, nlink, path)) in links {
        if found != nlink {
            r.problems.push(format!(
                "F3 {path} (inode {}): link count {nlink}, {found} entries name it",
                ino.0
            ));
        }
    }
    r
}
