//! Opening a fernfs image (one file or block device holding a fern-tree environment) for the file-system
//! subcommands, and their shared error type. It owns the image lock: whoever has the image
//! open for writing holds an exclusive `flock` on it, so a second mount, a mkfs over a
//! mounted image or an fsck of a mounted image is refused instead of corrupting it (the
//! engine itself does not lock). It must never format anything by itself.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fern_fs::{Fs, FsError};
use fern_kv::{KvError, KvStore};
use fern_kv_tree::TreeStore;
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
from_display!(
    std::io::Error,
    FsError,
    KvError,
    fern_fuse::OptionError,
    fern_bench::BenchError
);

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

/// Takes the exclusive lock on the image file at `path`, failing at once if it is held.
pub fn lock(path: &Path) -> Result<Flock<File>, CmdError> {
    let f = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            CmdError::new(format!(
                "{} is in use (mounted, or being checked); unmount it first with \
                 `fernfs umount MOUNTPOINT`",
                path.display()
            ))
        } else {
            CmdError::new(format!("{}: lock: {errno}", path.display()))
        }
    })
}

/// Waits up to `limit` for the lock on `path` to become free (a daemon finishing its
/// shutdown), then releases it at once.
pub fn wait_unlocked(path: &Path, limit: Duration) -> Result<(), CmdError> {
    let start = Instant::now();
    loop {
        match lock(path) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() >= limit => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
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
        Some(E::Checksum { .. } | E::Corrupt { .. } | E::MissingNode(_)) => CmdError::new(format!(
            "{p}: the fernfs image is damaged ({e}); see `fernfs fsck --repair`"
        )),
        _ => CmdError::new(format!("{p}: cannot open the fernfs image: {e}")),
    }
}

impl Image {
    /// Opens and locks the fernfs image at `path` with a node cache of `cache_bytes`.
    pub fn open(path: &Path, cache_bytes: u64) -> Result<Image, CmdError> {
        let path = path
            .canonicalize()
            .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
        let lock = lock(&path)?;
        let opened = if super::blockdev::is_block_device(&path) {
            let dev = super::blockdev::Partition::open(&path, false)
                .map_err(|e| CmdError::new(format!("{}: {e}", path.display())))?;
            TreeStore::open_on(Arc::new(dev), cache_bytes as usize, fern_fs::registry())
        } else {
            TreeStore::open(&path, cache_bytes as usize, fern_fs::registry())
        };
        let store = opened.map_err(|e| open_error(&path, &e))?;
        Ok(Image {
            store: Arc::new(store),
            path,
            _lock: lock,
        })
    }

    /// The store as the file system sees it.
    pub fn kv(&self) -> Arc<dyn KvStore> {
        self.store.clone()
    }

    /// Mounts the file system core on this image (cleaning up files left unlinked-but-open by
    /// the previous mount).
    pub fn fs(&self) -> Result<Arc<Fs>, CmdError> {
        Fs::mount(self.kv()).map(Arc::new).map_err(|e| {
            CmdError::new(format!(
                "{}: cannot mount the file system: {e}",
                self.path.display()
            ))
        })
    }

    /// Makes everything durable and closes the engine; the lock goes last.
    pub fn close(self) -> Result<(), CmdError> {
        let Image { store, path, _lock } = self;
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
