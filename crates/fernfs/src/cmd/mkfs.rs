//! `fernfs mkfs TARGET`: a new, empty file system in an image file (created if missing). It
//! refuses to overwrite a file that already holds data unless `--force`, and a mounted image
//! even then (the image lock). It must never touch a file it was not asked to format.

use std::fs::OpenOptions;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use fern_fs::{Fs, MkfsOptions};
use fern_kv_tree::TreeStore;
use fern_tree::{Compression, Options};

use super::image::{self, CmdError};

/// Partition compression of the new image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompressionArg {
    /// LZ4: fast, modest ratio (default).
    Lz4,
    /// Zstandard level 3: better ratio, slower.
    Zstd,
    /// No compression.
    None,
}

/// Options of `fernfs mkfs`.
#[derive(Debug, Args)]
pub struct MkfsArgs {
    /// Image file to create (created if missing).
    pub target: PathBuf,
    /// Data block size of files: a power of two from 512 to 65536.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Compression of tree partitions.
    #[arg(long, value_enum, default_value_t = CompressionArg::Lz4)]
    pub compression: CompressionArg,
    /// Overwrite a file that already holds data (an older image, or anything else).
    #[arg(long)]
    pub force: bool,
}

/// Runs `fernfs mkfs`.
pub fn run(args: MkfsArgs) -> Result<(), CmdError> {
    if !fern_fs::schema::valid_block_size(args.block_size) {
        return Err(CmdError::new(format!(
            "--block-size {}: must be a power of two from 512 to 65536",
            args.block_size
        )));
    }
    let t = &args.target;
    let meta = std::fs::metadata(t).ok();
    if let Some(m) = &meta {
        if !m.is_file() {
            return Err(CmdError::new(format!(
                "{}: not a regular file (fernfs images are files)",
                t.display()
            )));
        }
        if m.len() > 0 && !args.force {
            return Err(CmdError::new(format!(
                "{} already holds data ({} bytes); add --force to overwrite it",
                t.display(),
                m.len()
            )));
        }
    }
    // Create (or keep) the file, lock it, and only then empty it: a mounted image is refused.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(t)
        .map_err(|e| CmdError::new(format!("{}: {e}", t.display())))?;
    let _lock = image::lock(t)?;
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(t)
        .map_err(|e| CmdError::new(format!("{}: {e}", t.display())))?;
    let opts = Options {
        compression: match args.compression {
            CompressionArg::Lz4 => Compression::Lz4,
            CompressionArg::Zstd => Compression::Zstd { level: 3 },
            CompressionArg::None => Compression::None,
        },
        cache_bytes: 16 << 20,
        ..Options::default()
    };
    let store = TreeStore::create_with(t, opts, fern_fs::registry())?;
    let mkfs = MkfsOptions {
        block_size: args.block_size,
        root_uid: nix::unistd::getuid().as_raw(),
        root_gid: nix::unistd::getgid().as_raw(),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&store, mkfs)?;
    store.close()?;
    eprintln!(
        "fernfs: made a file system in {} (block size {}, {:?} compression)",
        t.display(),
        args.block_size,
        args.compression
    );
    Ok(())
}
