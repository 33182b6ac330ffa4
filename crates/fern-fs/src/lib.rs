//! fern-fs: POSIX file-system semantics over the [`fern_kv::KvStore`] trait.
//!
//! The core API ([`Fs`]) is inode-number based, the shape the FUSE adapter calls; the
//! [`path`] module puts a path-based library API on top (TokuFS's user-space library). The
//! schema (trees, key and value layouts) is specified in `docs/fs-design.md`.
//!
//! Open the store with [`registry()`] (the update functions fern-fs's blind writes need), run
//! [`Fs::mkfs`] once, then [`Fs::mount`].
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod acl;
mod alloc;
mod atime;
pub mod attr;
mod cache;
pub mod check;
mod codec;
mod data;
mod dir;
mod error;
mod extent;
mod extent_cache;
mod fs;
mod ids;
mod inode_ops;
mod locks;
mod lookahead;
mod namespace;
mod overlay;
mod owner;
pub mod path;
pub mod perm;
mod record;
mod rename;
pub mod schema;
mod shared;
mod stored;
pub mod upsert;
mod xattr;

pub use atime::{AtimeMode, AtimePolicy, LAZY_FOR};
pub use attr::{Attr, FileType, SetAttr, TimeSet, Timespec};
pub use cache::{InodeTableFigures, Releasable};
pub use data::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
pub use dir::{DirEntry, READ_AHEAD};
pub use error::{FsError, FsResult};
pub use fs::{Fs, MkfsOptions, MAX_FILE_SIZE, NAME_MAX, PATH_MAX};
pub use ids::{Fh, InodeId};
pub use inode_ops::{OpenFlags, StatFs};
pub use owner::setid_bits_to_clear;
pub use perm::Cred;
pub use rename::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
pub use schema::{DELEG_TREE, REVOKE_TREE, WRITE_BACK_PART};
pub use upsert::registry;
pub use xattr::{XATTR_CREATE, XATTR_REPLACE};
