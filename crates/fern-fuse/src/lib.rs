//! fern-fuse: the FUSE adapter of fernfs. It serves a [`fern_fs::Fs`] to the kernel through the
//! `fuser` crate (no libfuse build dependency); it mounts by itself (`mount(2)` as root,
//! `fusermount3` otherwise) so that it alone decides what gets unmounted.
//!
//! * [`FernFuse`]: the request handlers — one fern-fs call and one reply match each — behind
//!   the transport-neutral [`Handler`] trait and its reply types.
//! * [`uring`]: the transports: fuser's `/dev/fuse` loops ([`Classic`]) and FUSE over
//!   io_uring (per-CPU ring queues), chosen with `-o transport=`.
//! * [`MountOptions`]: the `-o` vocabulary and the kernel-caching choices, each documented.
//! * [`Mounted`] / [`serve`]: running a session, and the shutdown order that keeps every
//!   acknowledged write.
//! * [`KernelMount`]: mounting as type `fuse.fernfs` and unmounting only our own mount;
//!   [`mount_table`] / [`top_mount`]: reading /proc/PID/mountinfo.
//!
//! Request handling is multi-threaded: `threads` fuser loops on `/dev/fuse`, plus one ring
//! queue thread per CPU with the uring transport; fern-fs is `Sync` and does its own
//! (striped) locking. It must never hold file-system state of its own beyond what a reply needs.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod adapter;
mod convert;
mod fusermount;
mod handler;
mod killpriv;
mod mount;
mod notify;
mod options;
mod release;
mod reply;
mod session;
mod ticker;
pub mod uring;

pub use adapter::{negotiate, FernFuse, INIT_FLAGS, OPEN_FLAGS};
pub use handler::{Classic, Handler, Request};
pub use mount::{
    fusermount_unmount, lazy_unmount, mount_table, top_mount, unescape, KernelMount, MountEntry,
    Unmounted, FS_TYPE,
};
pub use notify::Notifier;
pub use options::{parse_size, MountOptions, OptionError, StatsSource, STATS_XATTR};
pub use reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
pub use session::{block_session_signals, serve, Mounted, Stopped};
