//! Translation of etcd client failures into [`KvError`]. It owns the one place that reads
//! etcd's error codes and messages; it must never retry or hide a failure.

use std::time::Duration;

use etcd_client::Error;
use fern_kv::KvError;
use tonic::Code;

/// What went wrong with one etcd call, as the store needs to tell it apart.
pub(crate) enum Failure {
    /// A read at a revision that compaction removed (docs/distributed.md §2, §6).
    Compacted,
    /// The request never left this machine (no connection to the member it was sent to), so
    /// sending it again cannot apply anything twice.
    NotSent(KvError),
    /// Anything else, already in fern-kv's vocabulary.
    Kv(KvError),
}

impl From<Failure> for KvError {
    fn from(f: Failure) -> Self {
        match f {
            // Only reads pinned to a transaction's revision reach a caller with this; the
            // transaction reruns on a fresh snapshot.
            Failure::Compacted => KvError::Conflict,
            Failure::NotSent(e) | Failure::Kv(e) => e,
        }
    }
}

/// A call that did not answer within the store's deadline.
pub(crate) fn timed_out(endpoints: &str, deadline: Duration) -> Failure {
    Failure::Kv(KvError::Unavailable(format!(
        "etcd at {endpoints} did not answer within {deadline:?}"
    )))
}

/// Classifies a client error.
pub(crate) fn classify(e: Error, endpoints: &str) -> Failure {
    let unavailable = |why: String| {
        // The client's own wording for a connection that could not be made: the only sign
        // that the request was not sent (a reset connection may have delivered it).
        let not_sent = why.contains("tcp connect error");
        let e = KvError::Unavailable(format!("etcd at {endpoints}: {why}"));
        if not_sent {
            Failure::NotSent(e)
        } else {
            Failure::Kv(e)
        }
    };
    match e {
        Error::GRpcStatus(s) => {
            let msg = s.message();
            if msg.contains("required revision has been compacted") {
                return Failure::Compacted;
            }
            if msg.contains("request is too large") || msg.contains("too many operations") {
                return Failure::Kv(KvError::TooLarge {
                    what: "etcd request (refused by the server)",
                    actual: 0,
                    limit: 0,
                });
            }
            // A status carrying a source error was made by the client from a failure to talk
            // to the server (a reset connection to a member that died); the server's own
            // errors come with a code and no source.
            if std::error::Error::source(&s).is_some() {
                let cause = std::error::Error::source(&s).map(ToString::to_string);
                return unavailable(format!("{msg}: {}", cause.unwrap_or_default()));
            }
            match s.code() {
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::ResourceExhausted => unavailable(format!("{:?}: {msg}", s.code())),
                _ => Failure::Kv(KvError::Backend(Box::new(Error::GRpcStatus(s)))),
            }
        }
        Error::TransportError(t) => unavailable(format!("transport: {t}")),
        Error::IoError(io) => Failure::Kv(KvError::Io(io)),
        other => Failure::Kv(KvError::Backend(Box::new(other))),
    }
}
