//! The file-system error enum and its single mapping to errno. This module owns the POSIX
//! vocabulary of failures; it must never decide policy (which operation returns which error is
//! decided where the operation is implemented).

use fern_kv::KvError;

/// Result of every file-system operation.
pub type FsResult<T> = Result<T, FsError>;

/// Every way a file-system operation can fail, named after the POSIX error it becomes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// ENOENT: no such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST: the name already exists.
    #[error("file exists")]
    Exists,
    /// ENOTEMPTY: directory not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// EISDIR: is a directory.
    #[error("is a directory")]
    IsDir,
    /// ENOTDIR: not a directory.
    #[error("not a directory")]
    NotDir,
    /// ENAMETOOLONG: a name over 255 bytes or a symlink target over 4095 bytes.
    #[error("name too long")]
    NameTooLong,
    /// ELOOP: too many symbolic links while resolving a path.
    #[error("too many levels of symbolic links")]
    Loop,
    /// EINVAL: invalid argument (e.g. rename of a directory into its own subtree).
    #[error("invalid argument")]
    Invalid,
    /// ENOSPC: no space left (id space exhausted). A store that runs out of media space
    /// reports `KvError::Io` of kind `StorageFull`, which [`FsError::errno`] also maps here.
    #[error("no space left on device")]
    NoSpace,
    /// EPERM: operation not permitted.
    #[error("operation not permitted")]
    Perm,
    /// EACCES: permission denied.
    #[error("permission denied")]
    Access,
    /// EXDEV: cross-device link.
    #[error("cross-device link")]
    XDev,
    /// ENODATA: no such extended attribute.
    #[error("no such attribute")]
    NoData,
    /// ERANGE: an attribute name too long, or a buffer too small.
    #[error("result out of range")]
    Range,
    /// E2BIG: an attribute value too large.
    #[error("argument list too long")]
    TooBig,
    /// EFBIG: offset or size beyond the largest file.
    #[error("file too large")]
    FileTooBig,
    /// EOPNOTSUPP: a mode or flag this file system does not implement.
    #[error("operation not supported")]
    NotSupported,
    /// EBADF: unknown or wrongly-opened file handle.
    #[error("bad file handle")]
    BadHandle,
    /// ESTALE: an inode number this mount no longer (or never) knew.
    #[error("stale inode")]
    Stale,
    /// EIO: a value read from the store is not what this format writes.
    #[error("corrupt {what}")]
    Corrupt {
        /// Which record, and what was wrong with it.
        what: String,
    },
    /// EIO: the store holds no fernfs superblock, or one of an unsupported version.
    #[error("not a fernfs store: {0}")]
    NotFormatted(String),
    /// The store failed.
    #[error(transparent)]
    Kv(#[from] KvError),
}

impl FsError {
    /// A corruption error naming what was being decoded.
    pub fn corrupt(what: impl Into<String>) -> Self {
        FsError::Corrupt { what: what.into() }
    }

    /// The errno this error becomes at the system-call boundary. The one place that decides it.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::IsDir => libc::EISDIR,
            FsError::NotDir => libc::ENOTDIR,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Loop => libc::ELOOP,
            FsError::Invalid => libc::EINVAL,
            FsError::NoSpace => libc::ENOSPC,
            FsError::Perm => libc::EPERM,
            FsError::Access => libc::EACCES,
            FsError::XDev => libc::EXDEV,
            FsError::NoData => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::TooBig => libc::E2BIG,
            FsError::FileTooBig => libc::EFBIG,
            FsError::NotSupported => libc::EOPNOTSUPP,
            FsError::BadHandle => libc::EBADF,
            FsError::Stale => libc::ESTALE,
            FsError::Corrupt { .. } | FsError::NotFormatted(_) => libc::EIO,
            // A conflict that escaped the bounded retries is transient: the caller may retry.
            FsError::Kv(KvError::Conflict | KvError::RetriesExhausted { .. }) => libc::EAGAIN,
            FsError::Kv(KvError::TooLarge { .. }) => libc::EFBIG,
            // The backend's media is full (fern-kv-tree: the engine's `NoSpace`); kept as the
            // store's error so the message says which write hit it.
            FsError::Kv(KvError::Io(e)) if e.kind() == std::io::ErrorKind::StorageFull => {
                libc::ENOSPC
            }
            FsError::Kv(_) => libc::EIO,
        }
    }
}

impl fern_kv::Retryable for FsError {
    fn is_conflict(&self) -> bool {
        matches!(self, FsError::Kv(KvError::Conflict))
    }
}
