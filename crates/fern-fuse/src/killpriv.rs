//! Dropping privileges on modification, which FUSE_HANDLE_KILLPRIV_V2 hands to us. Without it
//! the kernel does this itself: before every write it asks us for `security.capability`
//! (one extra round trip per write) and sends a chmod when set-id bits must go. With it, the
//! kernel only tells us what it wants: a write carries FUSE_WRITE_KILL_SUIDGID when the writer
//! lacks CAP_FSETID; a chown of a non-directory, and a truncate by a writer without
//! CAP_FSETID, should drop the bits and file capabilities (fuser 0.18 hides the setattr/open
//! flags that say so, so for those the caller's uid stands in for CAP_FSETID, which is also
//! fern-fs's rule). The rules, as Linux applies them: set-user-id always goes, set-group-id
//! only when group-executable (otherwise it marks mandatory locking, not privilege), and
//! `security.capability` goes.
//!
//! fern-fs clears set-id bits itself, blindly inside the stat upsert, for writes through a
//! handle opened by a non-root caller and for truncates by one (`open_as`, `setattr_as`).
//! This module covers the rest with in-process reads (no round trip): file capabilities, and
//! a killing write through a handle opened by root. It does that once per handle — the first
//! killing write — so later writes cost nothing; a set-id bit set again while the handle is
//! open is still cleared by fern-fs's blind upsert when the handle was opened by a non-root
//! caller. It must never clear anything the kernel's own rules would keep.

use std::collections::HashSet;
use std::sync::Mutex;

use fern_fs::{setid_bits_to_clear, Fh, Fs, InodeId, SetAttr};

/// The file-capability attribute.
const CAPS: &[u8] = b"security.capability";

/// Handles whose privileges were already dropped by a write.
#[derive(Default)]
pub(crate) struct KillPriv {
    done: Mutex<HashSet<Fh>>,
}

impl KillPriv {
    /// After a write through `fh` that the kernel flagged FUSE_WRITE_KILL_SUIDGID.
    pub(crate) fn after_write(&self, fs: &Fs, ino: InodeId, fh: Fh) {
        let first = self.done.lock().map(|mut d| d.insert(fh)).unwrap_or(true);
        if first {
            drop_privs(fs, ino);
        }
    }

    /// A handle was released.
    pub(crate) fn forget(&self, fh: Fh) {
        if let Ok(mut d) = self.done.lock() {
            d.remove(&fh);
        }
    }
}

/// Clears the set-id bits (per [`fern_fs::setid_bits_to_clear`]) and file capabilities of `ino`. Failures
/// are logged, not returned: the modification itself succeeded and is already acknowledged
/// to the kernel's caller.
pub(crate) fn drop_privs(fs: &Fs, ino: InodeId) {
    match fs.getattr(ino) {
        Ok(a) if setid_bits_to_clear(a.perm) != 0 => {
            let sa = SetAttr {
                mode: Some(a.perm & !setid_bits_to_clear(a.perm)),
                ..SetAttr::default()
            };
            if let Err(e) = fs.setattr(ino, &sa) {
                log::warn!("clearing set-id bits of inode {}: {e}", ino.0);
            }
        }
        Ok(_) => {}
        Err(e) => log::warn!("clearing set-id bits of inode {}: {e}", ino.0),
    }
    drop_caps(fs, ino);
}

/// Removes `security.capability` from `ino` if it has one.
pub(crate) fn drop_caps(fs: &Fs, ino: InodeId) {
    if fs.getxattr(ino, CAPS).is_ok() {
        if let Err(e) = fs.removexattr(ino, CAPS) {
            log::warn!("removing file capabilities of inode {}: {e}", ino.0);
        }
    }
}
