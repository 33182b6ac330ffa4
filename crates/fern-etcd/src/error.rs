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
    /// The request was certainly not applied — it never left this machine (no connection to
    /// the member it was sent to), or etcd refused it before proposing it to raft (no leader,
    /// leader changed, proposal dropped, too many requests) — so sending it again cannot
    /// apply anything twice (docs/distributed.md §5).
    NotSent(KvError),
    /// The cluster refused this client: wrong user or password, no permission on the prefix,
    /// a missing or rejected certificate. Sending again cannot help.
    Denied(KvError),
    /// The auth token this client got at connect time is no longer valid (etcd's simple
    /// tokens expire after `--auth-token-ttl` without use): reconnecting with the same
    /// credentials gets a new one. The request was refused, not applied.
    TokenExpired(KvError),
    /// Anything else, already in fern-kv's vocabulary.
    Kv(KvError),
}

impl From<Failure> for KvError {
    fn from(f: Failure) -> Self {
        match f {
            // Only reads pinned to a transaction's revision reach a caller with this; the
            // transaction reruns on a fresh snapshot.
            Failure::Compacted => KvError::Conflict,
            Failure::NotSent(e)
            | Failure::Denied(e)
            | Failure::TokenExpired(e)
            | Failure::Kv(e) => e,
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
            // Refused by the server before it proposed the request (etcd 3.4's
            // ErrGRPCNoLeader, ErrGRPCLeaderChanged, raft's ErrProposalDropped,
            // ErrGRPCTooManyRequests): nothing was applied. Timeouts ("request timed out…")
            // are not among them: a timed-out proposal may still commit.
            if [
                "etcdserver: no leader",
                "etcdserver: leader changed",
                "raft proposal dropped",
                "etcdserver: too many requests",
            ]
            .iter()
            .any(|m| msg.contains(m))
            {
                return Failure::NotSent(KvError::Unavailable(format!(
                    "etcd at {endpoints}: {msg}"
                )));
            }
            if msg.contains("invalid auth token") {
                return Failure::TokenExpired(KvError::Unavailable(format!(
                    "etcd at {endpoints}: {msg}"
                )));
            }
            if let Some(hint) = denied_hint(msg, s.code()) {
                return Failure::Denied(KvError::Unavailable(format!(
                    "etcd at {endpoints} refused access: {msg} ({hint})"
                )));
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
                let cause = std::error::Error::source(&s).map(chain).unwrap_or_default();
                let why = format!("{msg}: {cause}");
                if endpoints.starts_with("http://")
                    && (why.contains("broken pipe")
                        || why.contains("connection closed")
                        || why.contains("connection reset"))
                {
                    // What a TLS server does to a client that speaks plain HTTP/2 to it: close
                    // the connection or reset it, depending on when it reads the bytes. Only a
                    // hint: the failure stays `unavailable`, resent like any other.
                    return unavailable(format!(
                        "{why} (if the cluster serves https, give `ca` in the etcd client \
                         configuration)"
                    ));
                }
                if let Some(hint) = tls_hint(&why) {
                    return Failure::Denied(KvError::Unavailable(format!(
                        "etcd at {endpoints}: TLS failed: {why} ({hint})"
                    )));
                }
                return unavailable(why);
            }
            match s.code() {
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::ResourceExhausted => unavailable(format!("{:?}: {msg}", s.code())),
                _ => Failure::Kv(KvError::Backend(Box::new(Error::GRpcStatus(s)))),
            }
        }
        Error::TransportError(t) => {
            let why = chain(&t);
            match tls_hint(&why) {
                Some(hint) => Failure::Denied(KvError::Unavailable(format!(
                    "etcd at {endpoints}: TLS failed: {why} ({hint})"
                ))),
                None => unavailable(format!("transport: {why}")),
            }
        }
        Error::IoError(io) => Failure::Kv(KvError::Io(io)),
        other => Failure::Kv(KvError::Backend(Box::new(other))),
    }
}

/// A server error that means this client is not let in, with what to check.
fn denied_hint(msg: &str, code: Code) -> Option<&'static str> {
    if msg.contains("authentication failed") || msg.contains("user name not found") {
        Some("check the user in the URL and its password")
    } else if msg.contains("user name is empty") {
        Some("the cluster has auth enabled: give etcd://USER@… and a password")
    } else if msg.contains("permission denied") || code == Code::PermissionDenied {
        Some("the user's role must grant readwrite on the file system's prefix")
    } else if code == Code::Unauthenticated {
        Some("check the user and password")
    } else {
        None
    }
}

/// A transport failure caused by TLS, with what to check.
fn tls_hint(why: &str) -> Option<&'static str> {
    let w = why.to_ascii_lowercase();
    if w.contains("certificate") || w.contains("unknownissuer") || w.contains("bad cert") {
        Some("check `ca`, `cert` and `key` in the etcd client configuration")
    } else if w.contains("tls") || w.contains("handshake") || w.contains("corrupt message") {
        Some("is the cluster serving https, and the configuration giving `ca`?")
    } else {
        None
    }
}

/// An error and its sources, `: `-joined (the client's own wording is at the bottom).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
