//! The session of an [`crate::EtcdStore`] on its cluster (docs/distributed.md §7): one etcd
//! lease, granted on the first `KvStore::session` call, kept alive by a task on the store's
//! runtime, and revoked when the store is dropped. Keys put under it (fern-fs's open-file
//! registrations) vanish with it: at once on a clean unmount, after [`LEASE_TTL`] when the
//! process dies or is cut off from etcd. It owns the lease's life and nothing else; it must
//! never write a key itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use etcd_client::Client;
use fern_kv::{KvError, KvResult};

use crate::error::{classify, timed_out};

/// Time to live of a session's lease: how long a dead mount's registrations outlive it. Long
/// enough that a busy or briefly partitioned mount keeps its lease (it is renewed every
/// fifth of it), short enough that a crashed mount's open files are freed soon after.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// A granted lease and whether it is known lost.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The etcd lease id (positive, unique in the cluster's history).
    pub id: i64,
    /// Set by the keep-alive task when etcd says the lease expired: everything held by it is
    /// gone, and later puts into held trees fail (etcd refuses an unknown lease).
    pub lost: Arc<AtomicBool>,
    /// When the lease can expire at the earliest: the send time of the last renewal (or of
    /// the grant) that etcd answered, plus the TTL it gave.
    pub valid_until: Arc<Mutex<Instant>>,
    /// Fault injection for tests: no periodic renewal is sent before this instant
    /// (`EtcdStore::stall_renewals`), as when the renewal stream lags after an election.
    pub stalled_until: Arc<Mutex<Instant>>,
}

impl Lease {
    /// Grants a lease of [`LEASE_TTL`] and starts keeping it alive on `rt`.
    pub fn grant(
        client: &Client,
        rt: &tokio::runtime::Runtime,
        timeout: Duration,
        endpoints: &str,
    ) -> KvResult<Lease> {
        let mut lc = client.lease_client();
        let ttl = LEASE_TTL.as_secs() as i64;
        let sent = Instant::now();
        let granted = rt
            .block_on(async { tokio::time::timeout(timeout, lc.grant(ttl, None)).await })
            .map_err(|_| KvError::from(timed_out(endpoints, timeout)))?
            .map_err(|e| KvError::from(classify(e, endpoints)))?;
        let lease = Lease {
            id: granted.id(),
            lost: Arc::new(AtomicBool::new(false)),
            valid_until: Arc::new(Mutex::new(
                sent + Duration::from_secs(granted.ttl().max(0) as u64),
            )),
            stalled_until: Arc::new(Mutex::new(sent)),
        };
        rt.spawn(keep_alive(
            client.clone(),
            lease.id,
            lease.lost.clone(),
            lease.valid_until.clone(),
            lease.stalled_until.clone(),
            timeout.min(LEASE_TTL / 5),
        ));
        Ok(lease)
    }

    /// Renews the lease now, outside the periodic renewals, within `timeout`: for a holder of
    /// a write-back delegation whose last renewal is too old to answer from its cache (fern-kv
    /// W6) — after a leader election the periodic stream may take a few seconds to answer
    /// again while the cluster already does. `Unavailable` when etcd did not answer in time;
    /// marks the lease lost when etcd says it is gone.
    pub fn renew_now(
        &self,
        client: &Client,
        rt: &tokio::runtime::Runtime,
        timeout: Duration,
        endpoints: &str,
    ) -> KvResult<()> {
        let mut lc = client.lease_client();
        let r = rt.block_on(async {
            tokio::time::timeout(timeout, async {
                let (mut keeper, mut stream) = lc.keep_alive(self.id).await?;
                let sent = Instant::now();
                keeper.keep_alive().await?;
                Ok::<_, etcd_client::Error>((sent, stream.message().await?))
            })
            .await
        });
        match r {
            Err(_) => Err(KvError::from(timed_out(endpoints, timeout))),
            Ok(Ok((sent, Some(resp)))) => {
                if !note_renewal(&self.lost, &self.valid_until, sent, resp.ttl()) {
                    return Err(KvError::Unavailable(format!(
                        "etcd at {endpoints}: this mount's lease expired"
                    )));
                }
                Ok(())
            }
            Ok(Ok((_, None))) => Err(KvError::Unavailable(format!(
                "etcd at {endpoints}: the lease renewal stream closed"
            ))),
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                self.lost.store(true, Ordering::Release);
                Err(KvError::Unavailable(format!(
                    "etcd at {endpoints}: this mount's lease expired"
                )))
            }
            Ok(Err(e)) => Err(KvError::from(classify(e, endpoints))),
        }
    }

    /// Ends the lease now (its keys disappear); best effort within `timeout`: if etcd cannot
    /// be reached the lease simply expires.
    pub fn revoke(&self, client: &Client, rt: &tokio::runtime::Runtime, timeout: Duration) {
        let mut lc = client.lease_client();
        let id = self.id;
        let _ = rt.block_on(async { tokio::time::timeout(timeout, lc.revoke(id)).await });
    }
}

/// Renews lease `id` every fifth of its TTL until etcd says it is gone (then marks it lost and
/// stops: a new lease could not bring back what the old one held). A broken stream is opened
/// again; the task ends with the store's runtime.
///
/// Every step is bounded by `timeout`: after a leader is killed, a stream to a surviving
/// member can stay open and never answer a renewal (the forward to the dead leader is
/// dropped), and an unbounded wait there let the lease expire under a live mount — a
/// write-back holder then stopped answering (W6) and lost its grant; an opened stream that
/// does not answer in time is replaced.
async fn keep_alive(
    client: Client,
    id: i64,
    lost: Arc<AtomicBool>,
    valid_until: Arc<Mutex<Instant>>,
    stalled_until: Arc<Mutex<Instant>>,
    timeout: Duration,
) {
    // A fifth, not a third: a write-back holder answers only while its renewal is recent
    // (fern-kv W6), so a leader election must fit in the slack between renewals.
    let period = LEASE_TTL / 5;
    let mut lc = client.lease_client();
    loop {
        match tokio::time::timeout(timeout, lc.keep_alive(id)).await {
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                // etcd answered that the lease no longer exists.
                lost.store(true, Ordering::Release);
                return;
            }
            Err(_) | Ok(Err(_)) => {}
            Ok(Ok((mut keeper, mut stream))) => loop {
                let stall = stalled_until
                    .lock()
                    .saturating_duration_since(Instant::now());
                if !stall.is_zero() {
                    tokio::time::sleep(stall).await;
                }
                let sent = Instant::now();
                match tokio::time::timeout(timeout, keeper.keep_alive()).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
                match tokio::time::timeout(timeout, stream.message()).await {
                    Ok(Ok(Some(r))) => {
                        if !note_renewal(&lost, &valid_until, sent, r.ttl()) {
                            return;
                        }
                    }
                    _ => break,
                }
                tokio::time::sleep(period).await;
            },
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Records etcd's answer to a renewal sent at `sent`: a positive `ttl` moves `valid_until`
/// (never back: answers may arrive out of order between the periodic stream and
/// [`Lease::renew_now`]); zero or less means etcd no longer knows the lease, which is then
/// lost. Returns whether the lease is alive.
fn note_renewal(lost: &AtomicBool, valid_until: &Mutex<Instant>, sent: Instant, ttl: i64) -> bool {
    if ttl <= 0 {
        lost.store(true, Ordering::Release);
        return false;
    }
    let until = sent + Duration::from_secs(ttl as u64);
    let mut v = valid_until.lock();
    *v = (*v).max(until);
    true
}
