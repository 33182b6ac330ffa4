//! `fernfs mkfs TARGET`: a new, empty file system in an image file (created if missing) or on
//! a block device. It refuses to overwrite a file that already holds data, or a device with a
//! recognised file-system signature (fernfs included), unless `--force`, and says what it
//! found; and it refuses a mounted image or device even then (the image lock; O_EXCL on a
//! device, which fails while the kernel has it mounted). It must never touch a file or device
//! it was not asked to format.
//!
//! Sizes: a device's size is its capacity. An image file gets one from `--size`, or from its
//! own length when it already has one (`truncate -s 1G f; fernfs mkfs f`, as mkfs.ext4 takes
//! it; an empty or sparse all-zero file holds nothing, which is checked with SEEK_DATA, not by
//! reading it); the image keeps that length and never grows past it (format.md, B11). A new
//! file without `--size` grows as it is written, up to what its host file system holds.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use fern_fs::{Fs, MkfsOptions};
use fern_kv_tree::TreeStore;
use fern_tree::{Compression, Options};

use super::blockdev;
use super::image::{self, CmdError};

/// Options of `fernfs mkfs`.
#[derive(Debug, Args)]
pub struct MkfsArgs {
    /// Image file (created if missing), block device, or `etcd://HOST:PORT[,...]/PREFIX`.
    pub target: PathBuf,
    /// Data block size of files: a power of two from 512 to 65536.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Compression of tree partitions: zstd (level 1), zstd-N (level N, 1..=19), lz4 or none.
    /// Each partition whose sample does not compress is stored raw whatever the choice.
    #[arg(long, default_value_t = Compression::FILE_SYSTEM)]
    pub compression: Compression,
    /// Overwrite a file that already holds data, or a device holding a file system.
    #[arg(long)]
    pub force: bool,
    /// Size of an image file, with an optional K, M, G or T suffix (binary multiples): the
    /// image keeps this length, never grows past it, and `df` shows it as the capacity.
    /// Default: an existing file's own length; a new file grows as it is written.
    #[arg(long, value_parser = size_arg)]
    pub size: Option<u64>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    fern_fuse::parse_size(s)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size (a number with an optional K, M, G or T)"))
}

/// Log region of an image of `size` bytes: a sixteenth, whole MiB, from 1 MiB to the default
/// (256 MiB). The log is space the tree cannot use; a checkpoint runs every quarter of it.
fn log_bytes_for(size: u64, default: u64) -> u64 {
    (size / 16 / (1 << 20) * (1 << 20)).clamp(1 << 20, default)
}

/// Node size of an image of `size` bytes: a 256th, a power of two from 64 KiB to the default
/// (1 MiB, reached at 256 MiB). Free space counts only holes a whole node fits in and the
/// reserve is 12 nodes (format.md B11, B12), so 1 MiB nodes on a 64 MiB device left a fifth of
/// it to the reserve and lost another tenth to holes between nodes.
fn node_bytes_for(size: u64, default: usize) -> usize {
    let nth = (size / 256).max(1);
    let pow2 = 1u64 << (63 - nth.leading_zeros());
    (pow2 as usize).clamp(64 << 10, default)
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
        compression: args.compression,
        cache_bytes: 16 << 20,
        ..Options::default()
    };
    if blockdev::is_block_device(t) {
        if args.size.is_some() {
            return Err(CmdError::new(format!(
                "{}: --size is for image files; a block device's size is its own",
                t.display()
            )));
        }
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
            if let Some(what) = contents(t, m)? {
                return Err(CmdError::new(format!(
                    "{} {what}; add --force to overwrite it",
                    t.display()
                )));
            }
        }
    }
    // --size, else the file's own length (a pre-sized or --force'd file keeps it).
    let size = args
        .size
        .or_else(|| meta.as_ref().map(|m| m.len()).filter(|&n| n > 0));
    let mut opts = opts;
    if let Some(size) = size {
        if size < MIN_DEVICE {
            return Err(CmdError::new(format!(
                "{}: {size} bytes is too small; fernfs needs at least {MIN_DEVICE} bytes",
                t.display()
            )));
        }
        opts.capacity = Some(size);
        opts.log_bytes = log_bytes_for(size, opts.log_bytes);
        opts.node_bytes = node_bytes_for(size, opts.node_bytes);
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
    opts.log_bytes = log_bytes_for(dev.capacity(), opts.log_bytes);
    opts.node_bytes = node_bytes_for(dev.capacity(), opts.node_bytes);
    // Headers, catalog and log region lie at the start: clear them so nothing of an earlier
    // file system can be mistaken for log records (see blockdev.rs).
    blockdev::zero_prefix(&dev, opts.log_bytes + (8 << 20)).map_err(err)?;
    let store = TreeStore::create_on_with(Arc::new(dev), opts, fern_fs::registry())?;
    finish(args, store)
}

/// What a non-empty file holds, said so a user can decide about `--force`; `None` when it
/// holds nothing (all holes: an empty or sparse file, which mkfs takes as it is).
fn contents(path: &std::path::Path, m: &std::fs::Metadata) -> Result<Option<String>, CmdError> {
    let err = |e: std::io::Error| CmdError::new(format!("{}: {e}", path.display()));
    let f = std::fs::File::open(path).map_err(err)?;
    match rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(0)) {
        // No data anywhere: holes only.
        Err(rustix::io::Errno::NXIO) => return Ok(None),
        Ok(_) => {}
        // A file system without SEEK_DATA: assume the file holds data (refusing is safe).
        Err(_) => {}
    }
    let mut head = [0u8; 8];
    let fernfs = [0u64, 4096].iter().any(|&off| {
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut head, off).is_ok() && head == fern_tree::blockfile::MAGIC
    });
    let when = m
        .modified()
        .map(super::utc::of)
        .unwrap_or_else(|_| "an unknown date".into());
    if fernfs {
        return Ok(Some(format!(
            "contains a fernfs file system (last written {when})"
        )));
    }
    Ok(Some(match blockdev::probe_signature(path)? {
        Some(what) => format!("holds a file system or partition table ({what})"),
        None => format!("holds {} bytes of data that is not a fernfs image", m.len()),
    }))
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
    let size = match store.env().space() {
        s if s.fixed => format!("{} bytes", s.capacity),
        _ => "growing as it is written".into(),
    };
    store.close()?;
    eprintln!(
        "fernfs: made a file system in {} ({size}, block size {}, {} compression)",
        t.display(),
        args.block_size,
        args.compression
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_images_get_smaller_nodes() {
        let d = 1 << 20;
        assert_eq!(node_bytes_for(16 << 20, d), 64 << 10);
        assert_eq!(node_bytes_for(64 << 20, d), 256 << 10);
        assert_eq!(node_bytes_for(100 << 20, d), 256 << 10);
        assert_eq!(node_bytes_for(256 << 20, d), 1 << 20);
        assert_eq!(node_bytes_for(1 << 40, d), 1 << 20);
        assert_eq!(node_bytes_for(0, d), 64 << 10);
    }
}
