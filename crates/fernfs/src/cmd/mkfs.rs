//! `fernfs mkfs TARGET`: a new, empty file system in an image file (created if missing) or on
//! a block device. It refuses to overwrite a file that already holds data, or a device with a
//! recognised file-system signature (fernfs included), unless `--force`; and a mounted image or
//! device even then (the image lock; O_EXCL on a device, which fails while the kernel has it
//! mounted). It must never touch a file or device it was not asked to format.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use fern_fs::{Fs, MkfsOptions};
use fern_kv_tree::TreeStore;
use fern_tree::{Compression, Options};

use super::blockdev;
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
    /// Image file (created if missing), block device, or `etcd://HOST:PORT[,...]/PREFIX`.
    pub target: PathBuf,
    /// Data block size of files: a power of two from 512 to 65536.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Compression of tree partitions.
    #[arg(long, value_enum, default_value_t = CompressionArg::Lz4)]
    pub compression: CompressionArg,
    /// Overwrite a file that already holds data, or a device holding a file system.
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
    if let Some(url) = super::etcd::url(t) {
        return super::etcd::mkfs(url, args.block_size, args.force);
    }
    let opts = Options {
        compression: match args.compression {
            CompressionArg::Lz4 => Compression::Lz4,
            CompressionArg::Zstd => Compression::Zstd { level: 3 },
            CompressionArg::None => Compression::None,
        },
        cache_bytes: 16 << 20,
        ..Options::default()
    };
    if blockdev::is_block_device(t) {
        return mkfs_device(&args, opts);
    }
    let meta = std::fs::metadata(t).ok();
    if let Some(m) = &meta {
        if !m.is_file() {
            return Err(CmdError::new(format!(
                "{}: not a regular file or block device",
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
    let store = TreeStore::create_with(t, opts, fern_fs::registry())?;
    finish(&args, store)
}

/// Smallest device mkfs formats: room for a small log and a working set of nodes.
const MIN_DEVICE: u64 = 16 << 20;

fn mkfs_device(args: &MkfsArgs, mut opts: Options) -> Result<(), CmdError> {
    let t = &args.target;
    let err = |e: std::io::Error| CmdError::new(format!("{}: {e}", t.display()));
    // O_EXCL on a block device: refused (EBUSY) while the kernel has it mounted or another
    // program holds it exclusively. Kept open until the end.
    let _excl = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_EXCL)
        .open(t)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::EBUSY) {
                CmdError::new(format!(
                    "{} is in use (mounted, or opened exclusively by another program); \
                     unmount it first",
                    t.display()
                ))
            } else {
                err(e)
            }
        })?;
    let _lock = image::lock(t)?;
    if !args.force {
        if let Some(what) = blockdev::probe_signature(t)? {
            return Err(CmdError::new(format!(
                "{} holds a file system or partition table ({what}); add --force to overwrite it",
                t.display()
            )));
        }
    }
    let dev = blockdev::Partition::open(t, true).map_err(err)?;
    if dev.capacity() < MIN_DEVICE {
        return Err(CmdError::new(format!(
            "{}: {} bytes is too small; fernfs needs at least {MIN_DEVICE} bytes",
            t.display(),
            dev.capacity()
        )));
    }
    // The log takes an eighth of a small device, at most the file-image default.
    opts.log_bytes = (dev.capacity() / 8 / (1 << 20) * (1 << 20)).clamp(1 << 20, opts.log_bytes);
    // Headers, catalog and log region lie at the start: clear them so nothing of an earlier
    // file system can be mistaken for log records (see blockdev.rs).
    blockdev::zero_prefix(&dev, opts.log_bytes + (8 << 20)).map_err(err)?;
    let store = TreeStore::create_on_with(Arc::new(dev), opts, fern_fs::registry())?;
    finish(args, store)
}

fn finish(args: &MkfsArgs, store: TreeStore) -> Result<(), CmdError> {
    let t = &args.target;
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
