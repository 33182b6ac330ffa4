//! Key guards: a condition on one key that a store checks atomically with a read or a commit
//! (docs/design.md §7, "read guards"). A shared-store caller uses them to say "only if nobody
//! holds a delegation of this directory" (the delegation key is absent) or "only if I still
//! hold it" (the key holds exactly my grant token) without a round trip of its own. It owns
//! the vocabulary of the condition; the stores evaluate it.

use crate::error::{KvError, KvResult};
use crate::types::TreeId;

/// "`key` of `tree` holds exactly `expect`" (`None`: the key is absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyGuard {
    /// The tree of the guarded key.
    pub tree: TreeId,
    /// The guarded key.
    pub key: Vec<u8>,
    /// The value the key must hold; `None`: the key must be absent.
    pub expect: Option<Vec<u8>>,
}

impl KeyGuard {
    /// The key must be absent.
    pub fn absent(tree: TreeId, key: &[u8]) -> Self {
        Self {
            tree,
            key: key.to_vec(),
            expect: None,
        }
    }

    /// The key must hold exactly `value`.
    pub fn holds(tree: TreeId, key: &[u8], value: &[u8]) -> Self {
        Self {
            tree,
            key: key.to_vec(),
            expect: Some(value.to_vec()),
        }
    }

    /// `Ok` when `found` (the key's value, `None` if absent) satisfies the guard, else
    /// [`KvError::GuardFailed`] naming the key.
    pub fn check(&self, found: Option<&[u8]>) -> KvResult<()> {
        if found == self.expect.as_deref() {
            Ok(())
        } else {
            Err(self.failed())
        }
    }

    /// The error of this guard not holding.
    pub fn failed(&self) -> KvError {
        KvError::GuardFailed {
            tree: self.tree,
            key: self.key.clone(),
        }
    }
}
