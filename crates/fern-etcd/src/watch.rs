//! Watches for the session of an [`EtcdStore`] (`KvSession::watch_puts`,
//! `KvSession::wait_absent`; docs/design.md §7): how a delegation holder hears revocation
//! requests and how a revoker waits for the delegation key to go. It owns the etcd watch
//! streams and their resumption; it must never write a key.
//!
//! A watch stream can break (a member dies, the connection drops). The task resumes from
//! the revision after the last event it delivered, so no put is missed; if that revision was
//! compacted it lists the tree again (every key present is delivered again — the contract
//! says "at least once").

use std::sync::mpsc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use fern_kv::{KvError, KvResult, TreeId};

use crate::store::EtcdStore;

/// Pause before opening a broken watch again.
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

impl EtcdStore {
    /// `KvSession::watch_puts`: lists `tree`, delivers its keys, then watches it from the
    /// listing's revision; `on_put` runs on a thread of its own, fed by a task on the
    /// store's runtime (the callback may block on the store; the runtime must not).
    pub(crate) fn watch_tree_puts(
        &self,
        tree: TreeId,
        on_put: Box<dyn Fn(Vec<u8>) + Send>,
    ) -> KvResult<()> {
        let range = self.keyspace().range(tree, &fern_kv::KeyRange::all())?;
        let tag_len = self.keyspace().tag(tree)?.len();
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::Builder::new()
            .name("fern-etcd-watch".into())
            .spawn(move || {
                // Ends when the task's sender goes (the store's runtime was dropped).
                while let Ok(key) = rx.recv() {
                    on_put(key);
                }
            })
            .map_err(KvError::Io)?;
        let client = self.client();
        // The first listing is synchronous, so a request put before this call returns is
        // delivered even if the watch were slow to start.
        let next = self
            .rt()
            .block_on(list(client.clone(), &range.lo, &range.hi, tag_len, &tx))
            .map_err(|e| KvError::Unavailable(format!("etcd watch of a tree: {e}")))?;
        self.rt()
            .spawn(watch_task(client, range.lo, range.hi, tag_len, next, tx));
        Ok(())
    }

    /// `KvSession::wait_absent`: reads `key`; while present, watches it for a delete.
    pub(crate) fn wait_key_absent(
        &self,
        tree: TreeId,
        key: &[u8],
        timeout: Duration,
    ) -> KvResult<bool> {
        let deadline = Instant::now() + timeout;
        let k = self.keyspace().key(tree, key)?;
        loop {
            let p = self.get_at(tree, key, None, &[])?;
            if p.value.is_none() {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let client = self.client();
            let k = k.clone();
            // Ok(true): a delete was seen; Ok(false)/Err: the stream ended, read again.
            let seen = self.rt().block_on(async move {
                tokio::time::timeout(left, async move {
                    let mut wc = client.watch_client();
                    let opts = WatchOptions::new().with_start_revision(p.revision + 1);
                    let (_watcher, mut stream) = wc.watch(k, Some(opts)).await?;
                    while let Some(resp) = stream.message().await? {
                        if resp.canceled() || resp.compact_revision() > 0 {
                            return Ok(false);
                        }
                        if resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            return Ok(true);
                        }
                    }
                    Ok::<bool, etcd_client::Error>(false)
                })
                .await
            });
            match seen {
                Ok(Ok(true)) => return Ok(true),
                Ok(Ok(false)) => {}
                Ok(Err(_)) => std::thread::sleep(REWATCH_PAUSE.min(left)),
                Err(_) => {} // deadline: the read at the top answers
            }
        }
    }
}

/// Sends every key of `[lo, hi)` (tree keys: the tag cut off) and returns the revision to
/// watch from.
async fn list(
    client: Client,
    lo: &[u8],
    hi: &[u8],
    tag_len: usize,
    tx: &mpsc::Sender<Vec<u8>>,
) -> Result<i64, etcd_client::Error> {
    let mut kv = client.kv_client();
    let opts = GetOptions::new().with_range(hi.to_vec()).with_keys_only();
    let resp = kv.get(lo.to_vec(), Some(opts)).await?;
    for kv in resp.kvs() {
        if let Some(k) = kv.key().get(tag_len..) {
            let _ = tx.send(k.to_vec());
        }
    }
    Ok(resp.header().map_or(0, |h| h.revision()) + 1)
}

/// Watches `[lo, hi)` from revision `next` for as long as the runtime lives, sending each
/// put's tree key; resumes a broken stream after the last delivered event.
async fn watch_task(
    client: Client,
    lo: Vec<u8>,
    hi: Vec<u8>,
    tag_len: usize,
    mut next: i64,
    tx: mpsc::Sender<Vec<u8>>,
) {
    loop {
        let mut wc = client.watch_client();
        let opts = WatchOptions::new()
            .with_range(hi.clone())
            .with_start_revision(next);
        if let Ok((_watcher, mut stream)) = wc.watch(lo.clone(), Some(opts)).await {
            while let Ok(Some(resp)) = stream.message().await {
                if resp.compact_revision() > 0 {
                    // Events after `next` are gone: list again, deliver what is there.
                    match list(client.clone(), &lo, &hi, tag_len, &tx).await {
                        Ok(n) => next = n,
                        Err(_) => break,
                    }
                    break;
                }
                if resp.canceled() {
                    break;
                }
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    next = next.max(kv.mod_revision() + 1);
                    if e.event_type() != EventType::Put {
                        continue;
                    }
                    if let Some(k) = kv.key().get(tag_len..) {
                        if tx.send(k.to_vec()).is_err() {
                            return; // the receiving thread is gone
                        }
                    }
                }
            }
        }
        tokio::time::sleep(REWATCH_PAUSE).await;
    }
}
