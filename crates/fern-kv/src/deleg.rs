//! Delegations on a shared store (docs/design.md §7): the keys and the protocol by which one
//! session holds a part of the keyspace (fern-fs: a directory) so that it may buffer blind
//! writes to it, and by which another session makes it give the part back. It owns the two
//! trees' key formats and the take / fence / release / revoke steps; it must never buffer
//! anything itself (the holder does) and never hold a delegation past its session (the keys
//! are held keys: they vanish with the session).
//!
//! Invariants (cited by the tests, `fern-etcd/tests/delegation.rs`):
//!
//! * **D1** At most one session holds `D`: taking is a transaction guarded by the delegation
//!   key being absent.
//! * **D2** A grant's token (session id ‖ grant number) is never reused, so
//!   [`Delegations::fence`] — "the key still holds my token" — fails for a holder whose
//!   session ended (its key vanished) even if the same session or another one took `D`
//!   again since.
//! * **D3** A revoker's request is a put into the revocation tree; the holder hears every put
//!   ([`crate::KvSession::watch_puts`]), flushes, and releases. A request made while nobody
//!   holds `D` is answered at once by [`Delegations::revoke`] (the key is absent).
//! * **D4** Release deletes the delegation key only under the fence, so a holder that lost
//!   `D` can never delete another session's delegation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{KvError, KvResult};
use crate::guard::KeyGuard;
use crate::retry::{transact, RetryPolicy};
use crate::store::{KvSession, KvStore};
use crate::types::{TreeId, WriteOptions};

/// The trees of the delegation protocol and this session's grant counter.
#[derive(Debug)]
pub struct Delegations {
    /// Delegation keys: `D` → token of the holder.
    deleg: TreeId,
    /// Revocation requests: `len(D):u16 ‖ D ‖ requester session id:u64` → empty.
    revoke: TreeId,
    session: u64,
}

/// Grants made in this process (the second half of a token, D2). One counter for the process,
/// not one per [`Delegations`]: two `Delegations` of one store share a session, and their
/// tokens must still differ.
static GRANTS: AtomicU64 = AtomicU64::new(0);

/// A delegation this session holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The delegated part (fern-fs: a directory id).
    pub key: Vec<u8>,
    /// Session id ‖ grant number, both u64 big-endian: the delegation key's value.
    pub token: Vec<u8>,
}

impl Delegations {
    /// The protocol on trees `deleg_tree` and `revoke_tree` of `store`, for `session`; both
    /// trees' puts by this handle are held by the session from now on.
    pub fn open(
        store: &dyn KvStore,
        session: &dyn KvSession,
        deleg_tree: &str,
        revoke_tree: &str,
    ) -> KvResult<Self> {
        let deleg = store.tree(deleg_tree)?;
        let revoke = store.tree(revoke_tree)?;
        session.hold_tree(deleg)?;
        session.hold_tree(revoke)?;
        Ok(Self {
            deleg,
            revoke,
            session: session.id(),
        })
    }

    /// Takes the delegation of `key` (D1): `Some` if nobody held it, `None` if someone does.
    pub fn take(&self, store: &dyn KvStore, key: &[u8]) -> KvResult<Option<Grant>> {
        let n = GRANTS.fetch_add(1, Ordering::Relaxed);
        let mut token = self.session.to_be_bytes().to_vec();
        token.extend_from_slice(&n.to_be_bytes());
        let guard = self.free(key);
        let r = transact(store, &RetryPolicy::default(), WriteOptions::SYNC, |txn| {
            txn.guard(&guard)?;
            txn.batch().put(self.deleg, key.to_vec(), token.clone());
            Ok::<_, KvError>(())
        });
        match r {
            Ok(()) => Ok(Some(Grant {
                key: key.to_vec(),
                token,
            })),
            Err(KvError::GuardFailed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// "`grant` is still held": the guard every flush of the holder's buffer carries (D2).
    pub fn fence(&self, grant: &Grant) -> KeyGuard {
        KeyGuard::holds(self.deleg, &grant.key, &grant.token)
    }

    /// "Nobody holds `key`": the guard of every other session's read or transaction of the
    /// delegated part.
    pub fn free(&self, key: &[u8]) -> KeyGuard {
        KeyGuard::absent(self.deleg, key)
    }

    /// Gives `grant` back (D4). `Ok(false)`: it was no longer held (the session's lease
    /// expired, and perhaps another session took the part since) — the holder's unflushed
    /// buffer must be dropped and reported lost.
    pub fn release(&self, store: &dyn KvStore, grant: &Grant) -> KvResult<bool> {
        let fence = self.fence(grant);
        let r = transact(store, &RetryPolicy::default(), WriteOptions::SYNC, |txn| {
            txn.guard(&fence)?;
            txn.batch().delete(self.deleg, grant.key.clone());
            Ok::<_, KvError>(())
        });
        match r {
            Ok(()) => Ok(true),
            Err(KvError::GuardFailed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Asks the holder of `key`, if any, to flush and release it, and waits until nobody
    /// holds it (D3): `true` then, `false` if it is still held after `timeout` (the caller
    /// fails with a timeout; a dead holder's key goes with its session's time to live, so a
    /// timeout of that length always ends in `true` once the store is reachable).
    pub fn revoke(
        &self,
        store: &dyn KvStore,
        session: &dyn KvSession,
        key: &[u8],
        timeout: Duration,
    ) -> KvResult<bool> {
        if store.get(self.deleg, key)?.is_none() {
            return Ok(true);
        }
        let req = self.request_key(key)?;
        let mut b = crate::WriteBatch::new();
        b.put(self.revoke, req.clone(), Vec::new());
        store.write(b, WriteOptions::SYNC)?;
        let freed = session.wait_absent(self.deleg, key, timeout);
        let mut b = crate::WriteBatch::new();
        b.delete(self.revoke, req);
        // The request is held by this session: if this delete fails it goes with the session.
        let _ = store.write(b, WriteOptions::SYNC);
        freed
    }

    /// Calls `on_request(D)` for every revocation request of any part (D3), on a thread of
    /// the store's (see [`KvSession::watch_puts`]); the holder ignores parts it does not hold.
    pub fn watch(
        &self,
        session: &dyn KvSession,
        on_request: Box<dyn Fn(Vec<u8>) + Send>,
    ) -> KvResult<()> {
        session.watch_puts(
            self.revoke,
            Box::new(move |req| {
                if let Some(d) = part_of_request(&req) {
                    on_request(d.to_vec());
                }
            }),
        )
    }

    /// `len(D):u16 ‖ D ‖ session`: prefix-free in `D`, one request per session and part.
    fn request_key(&self, key: &[u8]) -> KvResult<Vec<u8>> {
        let len = u16::try_from(key.len()).map_err(|_| KvError::TooLarge {
            what: "delegated key",
            actual: key.len(),
            limit: u16::MAX as usize,
        })?;
        let mut k = len.to_be_bytes().to_vec();
        k.extend_from_slice(key);
        k.extend_from_slice(&self.session.to_be_bytes());
        Ok(k)
    }
}

/// The part a revocation request names; `None` for a malformed key (ignored: a request is
/// only ever written by [`Delegations::revoke`]).
fn part_of_request(req: &[u8]) -> Option<&[u8]> {
    let len = u16::from_be_bytes(req.get(..2)?.try_into().ok()?) as usize;
    let d = req.get(2..2 + len)?;
    (req.len() == 2 + len + 8).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::part_of_request;

    #[test]
    fn request_keys_name_their_part() {
        let mut k = 3u16.to_be_bytes().to_vec();
        k.extend_from_slice(b"abc");
        k.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(part_of_request(&k), Some(&b"abc"[..]));
        assert_eq!(part_of_request(&k[..k.len() - 1]), None, "short");
        assert_eq!(
            part_of_request(&[0xff, 0xff, 1]),
            None,
            "length past the end"
        );
        assert_eq!(part_of_request(&[]), None);
    }
}
