//! Translation of fern-tree's errors into fern-kv's vocabulary. It owns the mapping and nothing
//! else; it must never lose the class of a failure (corrupt stays corrupt, no-space stays
//! no-space) or the engine's own error, which every mapped I/O error carries as its payload.

use std::io;

use fern_kv::{KvError, UpdateFnId};
use fern_tree::Error;

/// Maps an engine error to the store error callers see.
///
/// | fern-tree                                   | fern-kv                                    |
/// |---------------------------------------------|--------------------------------------------|
/// | `KeyTooLarge`, `ValueTooLarge`              | `TooLarge { what: "key" / "value", .. }`    |
/// | `UnknownUpsert(id)`                         | `UnknownUpdateFn(UpdateFnId(id))`           |
/// | `UnknownTree(name)`                         | `UnknownTree(name)`                         |
/// | `Poisoned`                                  | `Unavailable`                               |
/// | `NoSpace`                                   | `Io`, kind `StorageFull`                    |
/// | `Checksum`, `Corrupt`, `MissingNode`, `NotAnImage`, `UnsupportedVersion` | `Io`, kind `InvalidData` |
/// | `Io { source, .. }`                         | `Io`, the source's kind                     |
/// | `InvalidArgument` and anything newer        | `Backend`                                   |
///
/// Every `Io` produced here wraps the original [`fern_tree::Error`]; [`engine_error`] gets it
/// back, so a caller can tell a checksum mismatch from a torn catalog.
pub fn map_error(e: Error) -> KvError {
    match e {
        Error::KeyTooLarge { len, max } => KvError::TooLarge {
            what: "key",
            actual: len,
            limit: max,
        },
        Error::ValueTooLarge { len, max } => KvError::TooLarge {
            what: "value",
            actual: len,
            limit: max,
        },
        Error::UnknownUpsert(id) => KvError::UnknownUpdateFn(UpdateFnId(id)),
        Error::UnknownTree(name) => KvError::UnknownTree(name),
        Error::Poisoned(why) => KvError::Unavailable(format!(
            "fern-tree environment refuses writes after an earlier failure: {why}"
        )),
        e @ Error::NoSpace { .. } => KvError::Io(io::Error::new(io::ErrorKind::StorageFull, e)),
        e @ Error::ReadOnly(_) => KvError::Io(io::Error::new(io::ErrorKind::ReadOnlyFilesystem, e)),
        e @ (Error::Checksum { .. }
        | Error::Corrupt { .. }
        | Error::MissingNode(_)
        | Error::NotAnImage
        | Error::UnsupportedVersion { .. }) => {
            KvError::Io(io::Error::new(io::ErrorKind::InvalidData, e))
        }
        Error::Io { context, source } => {
            let kind = source.kind();
            KvError::Io(io::Error::new(kind, Error::Io { context, source }))
        }
        e => KvError::Backend(Box::new(e)),
    }
}

/// The engine error behind a [`KvError`] that [`map_error`] produced, if it carries one
/// (`Io` and `Backend` do; `TooLarge` and the other structured variants carry their meaning
/// in their fields).
pub fn engine_error(e: &KvError) -> Option<&Error> {
    match e {
        KvError::Io(io) => io.get_ref()?.downcast_ref::<Error>(),
        KvError::Backend(b) => b.downcast_ref::<Error>(),
        _ => None,
    }
}

/// True when `e` says the image is damaged (checksum mismatch, malformed structure, missing
/// node, not an image, unknown format version).
pub fn is_corrupt(e: &KvError) -> bool {
    matches!(
        engine_error(e),
        Some(
            Error::Checksum { .. }
                | Error::Corrupt { .. }
                | Error::MissingNode(_)
                | Error::NotAnImage
                | Error::UnsupportedVersion { .. }
        )
    )
}

/// True when `e` says the device is full.
pub fn is_no_space(e: &KvError) -> bool {
    matches!(e, KvError::Io(io) if io.kind() == io::ErrorKind::StorageFull)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_survive_the_mapping() {
        let corrupt = map_error(Error::corrupt("node 3", "bad tag"));
        assert!(is_corrupt(&corrupt));
        assert!(!is_no_space(&corrupt));
        assert!(matches!(
            engine_error(&corrupt),
            Some(Error::Corrupt { what, .. }) if what == "node 3"
        ));
        let sum = map_error(Error::Checksum {
            what: "header 0".into(),
            expected: 1,
            actual: 2,
        });
        assert!(is_corrupt(&sum));
        assert!(matches!(&sum, KvError::Io(io) if io.kind() == io::ErrorKind::InvalidData));
        for e in [
            Error::MissingNode(fern_tree::NodeId(9)),
            Error::NotAnImage,
            Error::UnsupportedVersion {
                found: 9,
                supported: 1,
            },
        ] {
            assert!(is_corrupt(&map_error(e)));
        }

        let full = map_error(Error::io(
            "writing node 4",
            io::Error::from_raw_os_error(libc::ENOSPC),
        ));
        assert!(is_no_space(&full), "{full}");
        assert!(!is_corrupt(&full));
        assert!(matches!(engine_error(&full), Some(Error::NoSpace { .. })));

        let eio = map_error(Error::io(
            "reading block",
            io::Error::new(io::ErrorKind::PermissionDenied, "nope"),
        ));
        assert!(matches!(&eio, KvError::Io(io) if io.kind() == io::ErrorKind::PermissionDenied));
        assert!(matches!(engine_error(&eio), Some(Error::Io { .. })));

        assert!(matches!(
            map_error(Error::KeyTooLarge { len: 20, max: 10 }),
            KvError::TooLarge {
                what: "key",
                actual: 20,
                limit: 10
            }
        ));
        assert!(matches!(
            map_error(Error::ValueTooLarge { len: 20, max: 10 }),
            KvError::TooLarge { what: "value", .. }
        ));
        assert!(matches!(
            map_error(Error::UnknownUpsert(7)),
            KvError::UnknownUpdateFn(UpdateFnId(7))
        ));
        assert!(matches!(
            map_error(Error::UnknownTree("x".into())),
            KvError::UnknownTree(n) if n == "x"
        ));
        assert!(matches!(
            map_error(Error::Poisoned("disk died".into())),
            KvError::Unavailable(_)
        ));
        let inval = map_error(Error::InvalidArgument("bad".into()));
        assert!(matches!(
            engine_error(&inval),
            Some(Error::InvalidArgument(_))
        ));
    }
}
