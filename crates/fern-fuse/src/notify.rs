//! Notifications the daemon sends the kernel unasked (`FUSE_NOTIFY_*`): owns their encoding
//! and writing them on a dup of the session's `/dev/fuse` descriptor (the kernel takes
//! notifications only there, never from a ring). Which changes need one is the adapter's
//! business (`adapter.rs`).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use nix::errno::Errno;

use crate::uring::abi;

/// `FUSE_NOTIFY_INVAL_INODE` (include/uapi/linux/fuse.h, `enum fuse_notify_code`).
const NOTIFY_INVAL_INODE: i32 = 2;
/// `FUSE_NOTIFY_INVAL_ENTRY`.
const NOTIFY_INVAL_ENTRY: i32 = 3;
/// `FUSE_NOTIFY_PRUNE` (protocol 7.45, Linux 6.18).
const NOTIFY_PRUNE: i32 = 9;

/// Writes notifications to the kernel; one without a descriptor (before the mount, in unit
/// tests) sends nothing.
#[derive(Clone, Default)]
pub struct Notifier {
    dev: Option<Arc<OwnedFd>>,
}

impl Notifier {
    /// A notifier writing on `dev` (a dup of the session's `/dev/fuse` descriptor).
    pub(crate) fn new(dev: OwnedFd) -> Notifier {
        Notifier {
            dev: Some(Arc::new(dev)),
        }
    }

    /// Writes one notification. ENODEV (unmounted) and the errnos in `done` count as sent;
    /// without a descriptor nothing is sent and that counts as sent too.
    fn send(&self, msg: &[u8], done: &[Errno]) -> Result<(), Errno> {
        let Some(dev) = &self.dev else {
            return Ok(());
        };
        match nix::unistd::write(&**dev, msg) {
            Ok(_) => Ok(()),
            Err(e) if e == Errno::ENODEV || done.contains(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Makes the kernel drop its cached attributes of `ino` (offset -1: the page cache is
    /// kept), so its next permission check or stat asks us. Attribute-only invalidation
    /// takes no inode or page lock in the kernel, so it is safe from inside a request (a
    /// WRITE holds the inode's lock). ENOENT (the kernel does not know the inode) and
    /// ENODEV (unmounted) are expected; other failures are logged.
    pub fn inval_attrs(&self, ino: u64) {
        if let Err(e) = self.send(&inval_inode(ino, -1, 0), &[Errno::ENOENT]) {
            log::warn!("FUSE notify inval_inode {ino}: {e}");
        }
    }

    /// Asks the kernel to drop the inodes `ids` where nothing uses them (no open file, no
    /// dentry in use), which sends their FORGETs (`FUSE_NOTIFY_PRUNE`). `Ok(false)`: the
    /// kernel does not know this notification (before Linux 6.18 it answers EINVAL).
    /// ENODEV (unmounted) counts as done.
    pub fn prune(&self, ids: &[u64]) -> std::io::Result<bool> {
        match self.send(&prune(ids), &[]) {
            Ok(()) => Ok(true),
            Err(Errno::EINVAL) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the kernel drop its entry `name` in directory `parent` (`FUSE_NOTIFY_INVAL_ENTRY`):
    /// an unused dentry goes, and with it the inode if nothing else holds it. The kernel
    /// takes `parent`'s lock: never call it while serving a request. ENOENT (the kernel does
    /// not know the directory) and ENODEV (unmounted) count as done.
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        Ok(self.send(&inval_entry(parent, name), &[Errno::ENOENT])?)
    }
}

/// The bytes of `FUSE_NOTIFY_PRUNE`: the out header, `struct fuse_notify_prune_out { u32
/// count; u32 padding; u64 spare; }` and `count` node ids.
fn prune(ids: &[u64]) -> Vec<u8> {
    let len = abi::OUT_HEADER_SIZE + 16 + 8 * ids.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&abi::out_header(len as u32, NOTIFY_PRUNE, 0));
    m.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    m.extend_from_slice(&[0u8; 12]);
    for id in ids {
        m.extend_from_slice(&id.to_le_bytes());
    }
    m
}

/// The bytes of `FUSE_NOTIFY_INVAL_ENTRY`: the out header, `struct
/// fuse_notify_inval_entry_out { u64 parent; u32 namelen; u32 flags; }` and the name with a
/// terminating NUL (flags 0: drop the entry, not only expire it).
fn inval_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let len = abi::OUT_HEADER_SIZE + 16 + name.len() + 1;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&abi::out_header(len as u32, NOTIFY_INVAL_ENTRY, 0));
    m.extend_from_slice(&parent.to_le_bytes());
    m.extend_from_slice(&(name.len() as u32).to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(name);
    m.push(0);
    m
}

/// The bytes of `FUSE_NOTIFY_INVAL_INODE`: the out header (`unique` 0, the code in `error`)
/// and `struct fuse_notify_inval_inode_out { u64 ino; s64 off; s64 len; }`.
fn inval_inode(ino: u64, off: i64, len: i64) -> [u8; abi::OUT_HEADER_SIZE + 24] {
    let mut m = [0u8; abi::OUT_HEADER_SIZE + 24];
    let h = abi::out_header(m.len() as u32, NOTIFY_INVAL_INODE, 0);
    m[..abi::OUT_HEADER_SIZE].copy_from_slice(&h);
    let body = &mut m[abi::OUT_HEADER_SIZE..];
    body[0..8].copy_from_slice(&ino.to_le_bytes());
    body[8..16].copy_from_slice(&off.to_le_bytes());
    body[16..24].copy_from_slice(&len.to_le_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inval_inode_has_the_kernels_layout() {
        let m = inval_inode(0x1122, -1, 0);
        assert_eq!(m.len(), 40);
        assert_eq!(u32::from_le_bytes(m[0..4].try_into().unwrap()), 40, "len");
        assert_eq!(i32::from_le_bytes(m[4..8].try_into().unwrap()), 2, "code");
        assert_eq!(
            u64::from_le_bytes(m[8..16].try_into().unwrap()),
            0,
            "unique"
        );
        assert_eq!(u64::from_le_bytes(m[16..24].try_into().unwrap()), 0x1122);
        assert_eq!(i64::from_le_bytes(m[24..32].try_into().unwrap()), -1);
        assert_eq!(i64::from_le_bytes(m[32..40].try_into().unwrap()), 0);
    }

    #[test]
    fn prune_and_inval_entry_have_the_kernels_layout() {
        let m = prune(&[7, 0x0102_0304_0506_0708]);
        assert_eq!(m.len(), 16 + 16 + 16);
        assert_eq!(u32::from_le_bytes(m[0..4].try_into().unwrap()), 48, "len");
        assert_eq!(i32::from_le_bytes(m[4..8].try_into().unwrap()), 9, "code");
        assert_eq!(
            u32::from_le_bytes(m[16..20].try_into().unwrap()),
            2,
            "count"
        );
        assert_eq!(&m[20..32], &[0u8; 12], "padding and spare");
        assert_eq!(u64::from_le_bytes(m[32..40].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_le_bytes(m[40..48].try_into().unwrap()),
            0x0102_0304_0506_0708
        );

        let m = inval_entry(0x33, b"abc");
        assert_eq!(m.len(), 16 + 16 + 4);
        assert_eq!(u32::from_le_bytes(m[0..4].try_into().unwrap()), 36, "len");
        assert_eq!(i32::from_le_bytes(m[4..8].try_into().unwrap()), 3, "code");
        assert_eq!(u64::from_le_bytes(m[16..24].try_into().unwrap()), 0x33);
        assert_eq!(
            u32::from_le_bytes(m[24..28].try_into().unwrap()),
            3,
            "namelen"
        );
        assert_eq!(
            u32::from_le_bytes(m[28..32].try_into().unwrap()),
            0,
            "flags"
        );
        assert_eq!(&m[32..], b"abc\0");
    }
}
