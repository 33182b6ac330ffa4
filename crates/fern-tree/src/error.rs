//! The engine's error type. One enum for the whole crate; every variant says
//! what went wrong precisely enough to act on (which block, what was expected).
//! Corrupt input from disk is always reported here, never by a panic.

use std::io;

use crate::ids::NodeId;

/// Result alias used throughout fern-tree.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call on the block device failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The device has no space left.
    #[error("no space left on device while {context}")]
    NoSpace {
        /// What the engine was doing.
        context: String,
    },
    /// A checksum did not match: the data on disk is corrupt.
    #[error(
        "checksum mismatch in {what} (expected crc32c {expected:#010x}, found {actual:#010x})"
    )]
    Checksum {
        /// Which structure: "header 0", "node 17 partition 3", "translation table", ...
        what: String,
        /// Checksum stored on disk.
        expected: u32,
        /// Checksum of the bytes read.
        actual: u32,
    },
    /// A structure read from disk is malformed (bad length, bad tag, out of range, ...).
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which structure.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A node id that the translation table does not map.
    #[error("node {0} is not in the block translation table")]
    MissingNode(NodeId),
    /// The image does not start with a fern-tree header.
    #[error("not a fern-tree image (no valid header found)")]
    NotAnImage,
    /// The image was written by a newer (or unknown) format version.
    #[error("unsupported format version {found} (this build reads versions up to {supported})")]
    UnsupportedVersion {
        /// Version found on disk.
        found: u32,
        /// Newest version this build understands.
        supported: u32,
    },
    /// A key longer than [`crate::MAX_KEY_LEN`].
    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge {
        /// Length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A value longer than [`crate::MAX_VALUE_LEN`].
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// Length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An upsert names a function id that was not registered with the environment.
    #[error("upsert function {0} is not registered with this environment")]
    UnknownUpsert(u32),
    /// A named tree that does not exist (or a tree handle from another environment).
    #[error("no tree named {0:?}")]
    UnknownTree(String),
    /// Invalid options or arguments.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An earlier write or sync failed; the environment refuses further writes until reopened.
    #[error("environment is read-only after an earlier I/O failure: {0}")]
    Poisoned(String),
    /// The environment was opened with `Options::read_only` (W11): it never writes its image.
    #[error("the image was opened read-only: {0} is not allowed")]
    ReadOnly(&'static str),
}

impl Error {
    /// Wraps an I/O error with what the engine was doing; ENOSPC becomes [`Error::NoSpace`].
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        let context = context.into();
        if source.raw_os_error() == Some(libc::ENOSPC)
            || source.kind() == io::ErrorKind::StorageFull
        {
            Error::NoSpace { context }
        } else {
            Error::Io { context, source }
        }
    }

    /// Shorthand for [`Error::Corrupt`].
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }
}
