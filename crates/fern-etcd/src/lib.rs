//! fern-etcd: the [`fern_kv::KvStore`] backend on etcd v3, the storage of fernfs's distributed
//! mode. docs/distributed.md is its specification; this crate must follow it.
//!
//! * [`keys`]: where each fern-kv key lives in etcd (one prefix per file system).
//! * [`plan`]: how a [`fern_kv::WriteBatch`] becomes one etcd Txn (upserts emulated, one op per
//!   key, range deletes split, etcd's limits checked before anything is sent).
//! * [`EtcdStore`]: reads, batch application with bounded retries, the async client behind a
//!   runtime owned by the store; [`txn`] its optimistic transactions (compare on mod_revision).
//! * [`EtcdConfig`]: endpoints, prefix, deadline, TLS and user; parsed from
//!   `etcd://[USER@]HOST:PORT[,…]/PREFIX` and the client configuration file.
//! * `session`: held keys — the store's etcd lease, kept alive while the store lives
//!   (`KvStore::session`; fern-fs's open-file registrations).
//! * `guarded`: fern-kv key guards as compares in the same Txn as the read or commit.
//! * `watch`: `KvSession::watch_puts` / `wait_absent` (the delegation protocol's watches,
//!   docs/design.md §7.2).
//! * [`local`]: a private etcd on loopback for tests and scripts.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod guarded;
pub mod keys;
pub mod local;
pub mod plan;
mod session;
mod store;
mod txn;
mod watch;

pub use config::{BadUrl, EtcdConfig, Password, TlsFiles, SCHEME};
pub use session::LEASE_TTL;
pub use store::{EtcdStore, ETCD_LIMITS};
