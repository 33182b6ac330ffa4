//! Who holds an image's lock, and whether that holder is a mount daemon that is unmounting.
//!
//! The lock is a `flock` on the image, so the kernel knows the holder: /proc/locks lists each
//! flock with the pid that took it and the file's device and inode. A holder is *unmounting*
//! when it is a fernfs mount daemon (its command line is `… mount …`, as `fernfs mount`
//! re-executes itself, or a `mount.fernfs` helper) and its own mount table
//! (/proc/PID/mountinfo, its namespace) no longer has a `fuse.fernfs` mount of this image: the
//! kernel has detached the mount (a plain `umount` returns then) and the daemon is syncing,
//! checkpointing and closing. (A daemon still starting — image open, mount not yet made —
//! looks the same for a moment; a waiter then sees the mount appear and fails as "mounted".)
//! It owns this look-up only; it takes no lock.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::image::CmdError;

/// The holder of an image's lock.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// Nobody (or it could not be found).
    None,
    /// A mount daemon whose mount of the image is gone: it is closing the image.
    Unmounting(i32),
    /// A mount daemon with the image mounted at this path.
    Mounted(i32, PathBuf),
    /// Another process (fsck, import, export, mkfs, stat): pid and command line.
    Other(i32, String),
}

/// Finds the holder of the lock on `image` (canonical path).
pub fn of(image: &Path) -> Holder {
    let Some(pid) = flock_holder(image) else {
        return Holder::None;
    };
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return Holder::None; // gone meanwhile
    };
    let args: Vec<String> = cmd
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let helper = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n.to_string_lossy().starts_with("mount."));
    let daemon = helper || args.get(1).is_some_and(|a| a == "mount");
    if !daemon {
        return Holder::Other(pid, args.join(" "));
    }
    let src = image.to_string_lossy();
    let mounted = fern_fuse::mount_table(Some(pid)).ok().and_then(|t| {
        t.into_iter()
            .find(|e| e.fs_type == fern_fuse::FS_TYPE && e.source == src)
    });
    match mounted {
        Some(e) => Holder::Mounted(pid, e.mount_point),
        None => Holder::Unmounting(pid),
    }
}

impl Holder {
    /// The "in use" error for a lock we could not take after `waited`.
    pub fn in_use_error(&self, image: &Path, waited: Duration) -> CmdError {
        let img = image.display();
        CmdError::new(match self {
            Holder::Mounted(pid, mp) => format!(
                "{img} is in use: mounted on {} (daemon pid {pid}); unmount it first with \
                 `fernfs umount {}`",
                mp.display(),
                mp.display()
            ),
            Holder::Unmounting(pid) => format!(
                "{img} is in use: the daemon that is unmounting it (pid {pid}) has not closed \
                 it after {} s",
                waited.as_secs()
            ),
            Holder::Other(pid, cmd) => format!("{img} is in use by pid {pid} ({cmd})"),
            Holder::None => format!("{img} is in use (locked by another process)"),
        })
    }
}

/// The pid holding a flock on `path`, from /proc/locks (`1: FLOCK ADVISORY WRITE PID
/// MAJ:MIN:INODE 0 EOF`, device numbers in hex; waiters' lines carry `->` and are skipped).
fn flock_holder(path: &Path) -> Option<i32> {
    let md = std::fs::metadata(path).ok()?;
    let (maj, min) = (
        nix::sys::stat::major(md.dev()),
        nix::sys::stat::minor(md.dev()),
    );
    let want = format!("{maj:02x}:{min:02x}:{}", md.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}
