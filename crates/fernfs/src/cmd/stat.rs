//! `fernfs stat TARGET|MOUNTPOINT`: what an image holds and what it costs on disk — files,
//! directories, logical bytes against the image's allocated bytes (the space ratio, which
//! includes compression and the engine's log and free space). An unmounted image is read
//! through the library API; a mounted one through the mount (its image is locked by the
//! daemon). Live engine counters (cache hit rate, write amplification, message backlog) need
//! the daemon to export them and are not reported yet. It must never write to the image
//! beyond what mounting the core does (freeing orphans).

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Args;
use fern_fs::{FileType, InodeId};

use super::image::{CmdError, Image, DEFAULT_CACHE};
use super::mount::mounted_image;

/// Options of `fernfs stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Image file, or the mount point of a mounted image.
    pub target: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default)]
struct Counts {
    dirs: u64,
    files: u64,
    symlinks: u64,
    other: u64,
    logical_bytes: u64,
}

/// Runs `fernfs stat`.
pub fn run(args: StatArgs) -> Result<(), CmdError> {
    let target = args
        .target
        .canonicalize()
        .map_err(|e| CmdError::new(format!("{}: {e}", args.target.display())))?;
    let (image, counts, via) = if target.is_dir() {
        let image = mounted_image(&target).ok_or_else(|| {
            CmdError::new(format!("{}: no fernfs mounted there", target.display()))
        })?;
        (image, walk_mount(&target)?, "mount")
    } else {
        let img = Image::open(&target, DEFAULT_CACHE)?;
        let fs = img.fs()?;
        let c = walk_image(&fs)?;
        drop(fs);
        img.close()?;
        (target.clone(), c, "image")
    };
    let meta = std::fs::metadata(&image)?;
    let on_disk = meta.blocks() * 512;
    let ratio = if on_disk > 0 {
        counts.logical_bytes as f64 / on_disk as f64
    } else {
        0.0
    };
    if args.json {
        println!(
            "{{\"image\":{:?},\"read_via\":\"{via}\",\"directories\":{},\"files\":{},\
             \"symlinks\":{},\"other\":{},\"logical_bytes\":{},\"image_bytes\":{},\
             \"image_allocated_bytes\":{on_disk},\"logical_per_allocated\":{ratio:.4}}}",
            image.display().to_string(),
            counts.dirs,
            counts.files,
            counts.symlinks,
            counts.other,
            counts.logical_bytes,
            meta.len()
        );
    } else {
        println!(
            "image:              {} (read via the {via})",
            image.display()
        );
        println!("directories:        {}", counts.dirs);
        println!("regular files:      {}", counts.files);
        println!("symlinks:           {}", counts.symlinks);
        println!("other inodes:       {}", counts.other);
        println!("logical bytes:      {}", counts.logical_bytes);
        println!("image size:         {}", meta.len());
        println!("image allocated:    {on_disk}");
        println!("logical/allocated:  {ratio:.3}");
    }
    Ok(())
}

fn walk_image(fs: &fern_fs::Fs) -> Result<Counts, CmdError> {
    let mut c = Counts::default();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([InodeId::ROOT]);
    while let Some(dir) = queue.pop_front() {
        c.dirs += 1;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.list(dir, after.as_deref(), 256, true)?;
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                let size = e.attr.map(|a| a.size).unwrap_or(0);
                match e.kind {
                    FileType::Directory => {
                        // Pin it so it can be listed (the core lists known directories only).
                        fs.lookup(dir, &e.name)?;
                        queue.push_back(e.ino);
                    }
                    // Hard links: each inode counts once.
                    FileType::Regular if seen.insert(e.ino.0) => {
                        c.files += 1;
                        c.logical_bytes += size;
                    }
                    FileType::Regular => {}
                    FileType::Symlink => c.symlinks += 1,
                    _ => c.other += 1,
                }
            }
        }
    }
    Ok(c)
}

fn walk_mount(root: &Path) -> Result<Counts, CmdError> {
    let mut c = Counts::default();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([root.to_path_buf()]);
    while let Some(dir) = queue.pop_front() {
        c.dirs += 1;
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let m = e.metadata()?;
            let t = m.file_type();
            if t.is_dir() {
                queue.push_back(e.path());
            } else if t.is_file() {
                if seen.insert(m.ino()) {
                    c.files += 1;
                    c.logical_bytes += m.len();
                }
            } else if t.is_symlink() {
                c.symlinks += 1;
            } else {
                c.other += 1;
            }
        }
    }
    Ok(c)
}
