//! Bounded, jittered retry of optimistic transactions. This module owns the retry policy;
//! it must never retry anything but a conflict (other errors go straight back to the caller),
//! and never without bound (TiFS's unbounded retries are a known trap).

use std::time::Duration;

use crate::error::KvError;
use crate::store::{KvStore, KvTxn};
use crate::types::WriteOptions;

/// Errors that can carry a [`KvError`] and say whether they are a transaction conflict.
pub trait Retryable: From<KvError> {
    /// True when the transaction should run again.
    fn is_conflict(&self) -> bool;
}

impl Retryable for KvError {
    fn is_conflict(&self) -> bool {
        KvError::is_conflict(self)
    }
}

/// How often and how patiently to retry.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Most runs of the transaction body, the first included.
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubled each time up to `max_backoff`.
    pub base_backoff: Duration,
    /// Upper bound of one backoff.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 16,
            base_backoff: Duration::from_micros(50),
            max_backoff: Duration::from_millis(20),
        }
    }
}

impl RetryPolicy {
    /// The backoff before attempt `attempt + 1`: exponential, capped, with "full jitter"
    /// (uniform in `[0, cap]`) so that colliding writers spread out instead of colliding again.
    pub fn backoff(&self, attempt: u32, seed: &mut u64) -> Duration {
        let exp = self.base_backoff.saturating_mul(1u32 << attempt.min(20));
        let cap = exp.min(self.max_backoff).as_nanos() as u64;
        if cap == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(next_random(seed) % (cap + 1))
    }
}

/// The waits between the attempts of one retried operation, by a [`RetryPolicy`]: the one
/// place that counts attempts and sleeps, for [`transact`] and for backends that retry
/// internally (etcd's emulated upserts).
#[derive(Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    /// The jitter's xorshift state; 0 until the first retry draws it (never 0 after).
    seed: u64,
    attempt: u32,
}

impl Backoff {
    /// Backoff for an operation whose first attempt is under way.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            // Drawn at the first retry: most operations never retry, and drawing it (a
            // SipHash of fresh keys) was a visible share of a small transaction's cost.
            seed: 0,
            attempt: 1,
        }
    }

    /// Call after a failed attempt: `false` when every attempt of the policy is used (no
    /// sleep), otherwise sleeps the jittered backoff and returns `true` for one more attempt.
    pub fn retry(&mut self) -> bool {
        if self.attempt >= self.policy.max_attempts.max(1) {
            return false;
        }
        if self.seed == 0 {
            self.seed = jitter_seed();
        }
        std::thread::sleep(self.policy.backoff(self.attempt - 1, &mut self.seed));
        self.attempt += 1;
        true
    }

    /// Attempts made so far, the running one included.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

/// Runs `body` in a fresh transaction and commits it, retrying on conflict according to
/// `policy`. `body` may run several times, so it must have no side effects outside the
/// transaction. After the last conflicting attempt the error is
/// [`KvError::RetriesExhausted`].
pub fn transact<T, E, F>(
    store: &dyn KvStore,
    policy: &RetryPolicy,
    opts: WriteOptions,
    mut body: F,
) -> Result<T, E>
where
    E: Retryable,
    F: FnMut(&mut dyn KvTxn) -> Result<T, E>,
{
    transact_opts(store, policy, |txn| body(txn).map(|v| (v, opts)))
}

/// [`transact`] whose body also chooses the commit's options (a removal learns inside the
/// transaction how much data it frees, `WriteOptions::freeing`).
pub fn transact_opts<T, E, F>(
    store: &dyn KvStore,
    policy: &RetryPolicy,
    mut body: F,
) -> Result<T, E>
where
    E: Retryable,
    F: FnMut(&mut dyn KvTxn) -> Result<(T, WriteOptions), E>,
{
    let mut backoff = Backoff::new(*policy);
    loop {
        let mut txn = store.begin()?;
        let outcome = match body(&mut *txn) {
            Ok((value, opts)) => txn.commit(opts).map(|()| value).map_err(E::from),
            Err(e) => Err(e),
        };
        match outcome {
            Err(e) if e.is_conflict() => {
                if !backoff.retry() {
                    return Err(E::from(KvError::RetriesExhausted {
                        attempts: backoff.attempts(),
                    }));
                }
            }
            other => return other,
        }
    }
}

/// A per-call seed: jitter needs to differ between threads, not to be unpredictable.
fn jitter_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    // RandomState's keys differ per instance, which is all the variety jitter needs.
    let mut h = RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish() | 1
}

/// xorshift64: enough randomness for jitter without a dependency.
fn next_random(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}
