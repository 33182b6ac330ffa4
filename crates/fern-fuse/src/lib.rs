//! fern-fuse: the FUSE adapter of fernfs. It serves a [`fern_fs::Fs`] to the kernel through the
//! `fuser` crate (no libfuse build dependency); it mounts by itself (`mount(2)` as root,
//! `fusermount3` otherwise) so that it alone decides what gets unmounted.
//!
//! * [`FernFuse`]: the request handlers — one fern-fs call and one reply match each.
//! * [`MountOptions`]: the `-o` vocabulary and the kernel-caching choices, each documented.
//! * [`Mounted`] / [`serve`]: running a session, and the shutdown order that keeps every
//!   acknowledged write.
//! * [`KernelMount`]: mounting as type `fuse.fernfs` and unmounting only our own mount;
//!   [`mount_table`] / [`top_mount`]: reading /proc/PID/mountinfo.
//!
//! Request handling is multi-threaded: fuser 0.18's `Filesystem` takes `&self` and its session
//! runs `threads` loops on the one `/dev/fuse` channel; fern-fs is `Sync` and does its own
//! (striped) locking. It must never hold file-system state of its own beyond what a reply needs.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod adapter;
mod convert;
mod fusermount;
mod killpriv;
mod mount;
mod options;
mod session;

pub use adapter::FernFuse;
pub use mount::{
    fusermount_unmount, lazy_unmount, mount_table, top_mount, unescape, KernelMount, MountEntry,
    Unmounted, FS_TYPE,
};
pub use options::{parse_size, MountOptions, OptionError, StatsSource, STATS_XATTR};
pub use session::{block_session_signals, serve, Mounted, Stopped};
