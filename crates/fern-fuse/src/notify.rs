//! Notifications the daemon sends the kernel unasked (`FUSE_NOTIFY_*`): owns their encoding
//! and writing them on a dup of the session's `/dev/fuse` descriptor (the kernel takes
//! notifications only there, never from a ring). Which changes need one is the adapter's
//! business (`adapter.rs`).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::uring::abi;

/// `FUSE_NOTIFY_INVAL_INODE` (include/uapi/linux/fuse.h, `enum fuse_notify_code`).
const NOTIFY_INVAL_INODE: i32 = 2;

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

    /// Makes the kernel drop its cached attributes of `ino` (offset -1: the page cache is
    /// kept), so its next permission check or stat asks us. Attribute-only invalidation
    /// takes no inode or page lock in the kernel, so it is safe from inside a request (a
    /// WRITE holds the inode's lock). ENOENT (the kernel does not know the inode) and
    /// ENODEV (unmounted) are expected; other failures are logged.
    pub fn inval_attrs(&self, ino: u64) {
        let Some(dev) = &self.dev else {
            return;
        };
        let msg = inval_inode(ino, -1, 0);
        match nix::unistd::write(&**dev, &msg) {
            Ok(_) => {}
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENODEV) => {}
            Err(e) => log::warn!("FUSE notify inval_inode {ino}: {e}"),
        }
    }
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
}
