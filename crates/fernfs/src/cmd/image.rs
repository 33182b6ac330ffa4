//! Opening a fernfs image (one file or block device holding a fern-tree environment) for the file-system
//! subcommands, and their shared error type. It owns the image lock: whoever has the image
//! open for writing holds an exclusive `flock` on it, so a second mount, a mkfs over a
//! mounted image or an fsck of a mounted image is refused instead of corrupting it (the
//! engine itself does not lock); a read-only open (`fsck` without `--repair`, `stat`,
//! `export`: the engine's W11, nothing is written) holds a shared lock, so it waits for no
//! other reader but never runs beside a writer. A lock held by a mount daemon whose mount is
//! already gone
//! (a plain `umount` returns when the kernel detaches the mount, before the daemon has
//! closed the image) is waited for, bounded and announced: see `holder`. It must never
//! format anything by itself.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fern_fs::{Fs, FsError};
use fern_kv::{KvError, KvStore};
use fern_kv_tree::TreeStore;
use fern_tree::{Compression, Options, RecoveryReport};
use nix::fcntl::{Flock, FlockArg};

/// An error of a file-system subcommand: what failed, and what to do about it.
#[derive(Debug)]
pub struct CmdError(pub String);

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CmdError {}

impl CmdError {
    /// An error with context.
    pub fn new(msg: impl Into<String>) -> Self {
        CmdError(msg.into())
    }
}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for CmdError {
            fn from(e: $t) -> Self {
                CmdError(e.to_string())
            }
        }
    )*};
}
from_display!(std::io::Error, FsError, KvError, fern_fuse::OptionError);
#[cfg(feature = "bench")]
from_display!(fern_bench::BenchError);

/// Default node-cache size of a mount or fsck.
pub const DEFAULT_CACHE: u64 = 128 << 20;

/// An image opened for use, locked against any other user until dropped.
pub struct Image {
    /// The store inside.
    pub store: Arc<TreeStore>,
    /// Canonical path of the image file.
    pub path: PathBuf,
    _lock: Flock<File>,
}

/// How an image is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and write (mount, import, `fsck --repair`): recovery checkpoints.
    ReadWrite,
    /// Never write the image (W11): `fsck`, `stat`, `export`.
    ReadOnly,
    /// `fsck --repair`: read and write, and a damaged log is cut at the damage instead of
    /// refusing the open (what was dropped is in [`Image::recovery`]).
    Repair,
}

/// How long [`lock`] waits for a daemon that is unmounting to close the image.
pub const UNMOUNTING_WAIT: Duration = Duration::from_secs(30);

/// One attempt at the lock (`how`: shared or exclusive, never blocking): `Ok(None)` when
/// someone else holds it.
fn try_lock(path: &Path, how: FlockArg) -> Result<Option<Flock<File>>, CmdError> {
    let f = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
    match Flock::lock(f, how) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(CmdError::new(format!("{}: lock: {errno}", path.display()))),
    }
}

/// Takes the exclusive lock on the image at `path`. If a fernfs mount daemon holds it and its
/// mount is no longer in its mount table, that daemon is unmounting: wait for it (announced on
/// stderr) up to [`UNMOUNTING_WAIT`]. Any other holder — a daemon still mounted, an fsck, an
/// import — is an error at once, naming it.
pub fn lock(path: &Path) -> Result<Flock<File>, CmdError> {
    lock_as(path, FlockArg::LockExclusiveNonblock)
}

/// [`lock`], shared or exclusive as `how` says.
fn lock_as(path: &Path, how: FlockArg) -> Result<Flock<File>, CmdError> {
    let start = Instant::now();
    let mut announced = false;
    loop {
        if let Some(l) = try_lock(path, how)? {
            return Ok(l);
        }
        let holder = super::holder::of(path);
        match holder {
            super::holder::Holder::Unmounting(pid) if start.elapsed() < UNMOUNTING_WAIT => {
                if !announced {
                    eprintln!(
                        "fernfs: waiting for the daemon that is unmounting {} (pid {pid})…",
                        path.display()
                    );
                    announced = true;
                }
            }
            // Released between our attempt and the look-up: try again.
            super::holder::Holder::None if start.elapsed() < UNMOUNTING_WAIT => {}
            h => return Err(h.in_use_error(path, start.elapsed())),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `limit` for the lock on `path` to become free (a daemon finishing its
/// shutdown), then releases it at once.
pub fn wait_unlocked(path: &Path, limit: Duration) -> Result<(), CmdError> {
    let start = Instant::now();
    loop {
        match try_lock(path, FlockArg::LockExclusiveNonblock)? {
            Some(_) => return Ok(()),
            None if start.elapsed() >= limit => {
                return Err(super::holder::of(path).in_use_error(path, start.elapsed()))
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Refuses what is not a fernfs image by its signature (the engine's header magic in either
/// header slot: a damaged slot 0 with a good slot 1 is still an image), before the engine
/// reports it as a bare I/O error.
pub fn check_signature(path: &Path) -> Result<(), CmdError> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path).map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
    let magic = fern_tree::blockfile::MAGIC;
    let has = |off: u64| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, off).is_ok() && b == magic
    };
    if has(0) || has(fern_tree::blockfile::ALIGN) {
        Ok(())
    } else {
        Err(CmdError::new(format!(
            "{}: not a fernfs image (no fernfs signature at offset 0); create one with \
             `fernfs mkfs`",
            path.display()
        )))
    }
}

/// What to tell a user whose image did not open. Only an image with no fernfs header at all
/// is told to make one: advice to run `mkfs` on an intact image (one that is full, or on a
/// failing disk) would destroy the data in it.
pub fn open_error(path: &Path, e: &KvError) -> CmdError {
    use fern_tree::Error as E;
    let p = path.display();
    match fern_kv_tree::engine_error(e) {
        Some(E::NotAnImage) => CmdError::new(format!(
            "{p}: not a fernfs image ({e}); create one with `fernfs mkfs`"
        )),
        Some(E::NoSpace { .. }) => CmdError::new(format!(
            "{p}: the fernfs image could not be opened because its device is full ({e}); \
             the data in it is intact: give the image more room (a larger device or file) \
             and open it again"
        )),
        // A damaged log is not "not an image" either: mkfs would destroy what it holds.
        Some(E::Checksum { what, .. }) if what.contains("log record at LSN") => {
            CmdError::new(format!(
                "{p}: the write-ahead log is damaged: {e}. Nothing was changed. `fernfs fsck \
                 --repair` cuts the log at the damaged record, keeping everything before it"
            ))
        }
        Some(E::Checksum { .. } | E::Corrupt { .. } | E::MissingNode(_)) => CmdError::new(format!(
            "{p}: the fernfs image is damaged ({e}); see `fernfs fsck --repair`"
        )),
        _ => CmdError::new(format!("{p}: cannot open the fernfs image: {e}")),
    }
}

impl Image {
    /// Opens and locks the fernfs image at `path` as `access` says.
    pub fn open_as(path: &Path, cache_bytes: u64, access: Access) -> Result<Image, CmdError> {
        Self::open_changing(path, cache_bytes, access, None)
    }

    /// [`Image::open_as`], and from now on writes new partitions with `compression` (the mount
    /// option `compression=`; `Options::change_compression`) when it is given.
    pub fn open_changing(
        path: &Path,
        cache_bytes: u64,
        access: Access,
        compression: Option<Compression>,
    ) -> Result<Image, CmdError> {
        let path = path
            .canonicalize()
            .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
        check_signature(&path)?;
        let read_only = access == Access::ReadOnly;
        let lock = lock_as(
            &path,
            if read_only {
                FlockArg::LockSharedNonblock
            } else {
                FlockArg::LockExclusiveNonblock
            },
        )?;
        let opts = Options {
            cache_bytes: cache_bytes as usize,
            read_only,
            cut_damaged_log: access == Access::Repair,
            change_compression: compression,
            ..Options::default()
        };
        let opened = if super::blockdev::is_block_device(&path) {
            let dev = super::blockdev::Partition::open_existing(&path, read_only)
                .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
            TreeStore::open_on_with(Arc::new(dev), opts, fern_fs::registry())
        } else {
            TreeStore::open_with(&path, opts, fern_fs::registry())
        };
        let store = opened.map_err(|e| open_error(&path, &e))?;
        Ok(Image {
            store: Arc::new(store),
            path,
            _lock: lock,
        })
    }

    /// What the engine's recovery found and worked around (damaged header slot, log cut).
    pub fn recovery(&self) -> RecoveryReport {
        self.store.env().recovery()
    }

    /// The store as the file system sees it.
    pub fn kv(&self) -> Arc<dyn KvStore> {
        self.store.clone()
    }

    /// Mounts the file system core on this image (cleaning up files left unlinked-but-open by
    /// the previous mount).
    pub fn fs(&self) -> Result<Arc<Fs>, CmdError> {
        let mounted = if self.store.env().is_read_only() {
            Fs::mount_read_only(self.kv())
        } else {
            Fs::mount(self.kv())
        };
        mounted.map(Arc::new).map_err(|e| {
            CmdError::new(format!(
                "{}: cannot mount the file system: {e}",
                self.path.display()
            ))
        })
    }

    /// Makes everything durable and closes the engine; the lock goes last.
    pub fn close(self) -> Result<(), CmdError> {
        let Image { store, path, _lock } = self;
        if store.env().is_read_only() {
            return Ok(()); // nothing to make durable: nothing was written (W11)
        }
        match Arc::try_unwrap(store) {
            Ok(store) => store
                .close()
                .map_err(|e| CmdError::new(format!("{}: close: {e}", path.display()))),
            // Someone still holds the store (a thread that has not finished): sync instead;
            // the engine checkpoints again when the last holder drops it.
            Err(store) => store
                .sync()
                .map_err(|e| CmdError::new(format!("{}: sync: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(e: fern_tree::Error) -> String {
        open_error(Path::new("img"), &fern_kv_tree::map_error(e)).0
    }

    #[test]
    fn only_a_file_without_a_header_is_told_to_run_mkfs() {
        assert!(msg(fern_tree::Error::NotAnImage).contains("fernfs mkfs"));
        let full = msg(fern_tree::Error::NoSpace {
            context: "writing node 7 for a checkpoint".into(),
        });
        assert!(!full.contains("mkfs") && full.contains("full"), "{full}");
        let damaged = msg(fern_tree::Error::corrupt("node 3", "bad"));
        assert!(
            !damaged.contains("mkfs") && damaged.contains("fsck"),
            "{damaged}"
        );
        let io = msg(fern_tree::Error::io(
            "reading the headers",
            std::io::Error::other("disk gone"),
        ));
        assert!(!io.contains("mkfs"), "{io}");
    }
}
