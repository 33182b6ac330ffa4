//! Guarded reads and the failure of guarded commits on etcd (fern-kv `KeyGuard`, store.rs
//! contract "Guards"; docs/design.md §7). A guard is one etcd compare — `version == 0` for
//! "absent", `value == v` for "holds v" — put in the same Txn as the read or the commit, so a
//! guard costs no round trip of its own. It owns that translation; it must never read a key
//! outside the Txn it guards except to name which guard failed after the Txn did.

use etcd_client::{GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};
use fern_kv::{KeyGuard, KvError, KvResult};

use crate::error::Failure;
use crate::plan::Guard;
use crate::store::{compare, EtcdStore, Resend};

impl EtcdStore {
    /// The etcd compares of `guards`.
    pub(crate) fn value_guards(&self, guards: &[KeyGuard]) -> KvResult<Vec<Guard>> {
        guards
            .iter()
            .map(|g| {
                Ok(Guard::Value {
                    key: self.keyspace().key(g.tree, &g.key)?,
                    value: g.expect.clone(),
                })
            })
            .collect()
    }

    /// One etcd Range from `from` with `opts`, and the revision it was read at. With guards
    /// it is the Then branch of a Txn `If(guards)`: one round trip either way; a guard that
    /// does not hold fails it with [`KvError::GuardFailed`].
    pub(crate) fn range(
        &self,
        guards: &[KeyGuard],
        from: &[u8],
        opts: &GetOptions,
    ) -> Result<(GetResponse, i64), Failure> {
        if guards.is_empty() {
            let resp = self.call(Resend::Always, |mut kv| {
                let (from, opts) = (from.to_vec(), opts.clone());
                async move { kv.get(from, Some(opts)).await }
            })?;
            let rev = resp.header().map_or(0, |h| h.revision());
            return Ok((resp, rev));
        }
        let compares: Vec<_> = self
            .value_guards(guards)
            .map_err(Failure::Kv)?
            .iter()
            .map(compare)
            .collect();
        let txn = Txn::new()
            .when(compares)
            .and_then(vec![TxnOp::get(from.to_vec(), Some(opts.clone()))]);
        let resp = self.call(Resend::Always, |mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })?;
        if !resp.succeeded() {
            let e = self.guard_failure(guards).map_err(Failure::Kv)?;
            return Err(Failure::Kv(e));
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => Ok((g, rev)),
            _ => Err(Failure::Kv(KvError::Backend(
                "etcd answered a guarded read without its Range".into(),
            ))),
        }
    }

    /// The values of `keys`, in order: one Txn per [`crate::store::MAX_TXN_OPS`] ops, the
    /// guards' compares counted as the commits count them, each `If(guards)` when there are
    /// guards — one round trip per chunk either way.
    pub(crate) fn get_many_at(
        &self,
        guards: &[KeyGuard],
        keys: &[(fern_kv::TreeId, Vec<u8>)],
    ) -> KvResult<Vec<Option<Vec<u8>>>> {
        Ok(self.read_many_at(guards, keys, None, &[], 0)?.0)
    }

    /// [`Self::get_many_at`] with the first `limit` rows of each of `ranges` (of `tree`) read
    /// in the first Txn, as Range ops after its keys (fern-kv `get_many_reading_ahead`). The
    /// ranges must fit in one Txn beside the guards.
    pub(crate) fn read_many_at(
        &self,
        guards: &[KeyGuard],
        keys: &[(fern_kv::TreeId, Vec<u8>)],
        tree: Option<fern_kv::TreeId>,
        ranges: &[fern_kv::KeyRange],
        limit: usize,
    ) -> KvResult<fern_kv::ReadAhead> {
        let compares: Vec<_> = self.value_guards(guards)?.iter().map(compare).collect();
        let room = crate::store::MAX_TXN_OPS.saturating_sub(guards.len());
        if ranges.len() >= room {
            return Err(KvError::TooLarge {
                what: "etcd ranges read ahead in one Txn",
                actual: ranges.len(),
                limit: room.saturating_sub(1),
            });
        }
        let mut scans = Vec::with_capacity(ranges.len());
        if let Some(tree) = tree {
            for r in ranges {
                let er = self.keyspace().range(tree, r)?;
                let opts = GetOptions::new()
                    .with_range(er.hi.clone())
                    .with_limit(limit as i64);
                scans.push(TxnOp::get(er.lo.clone(), Some(opts)));
            }
        }
        let tag_len = match tree {
            Some(t) => self.keyspace().tag(t)?.len(),
            None => 0,
        };
        let mut out = Vec::with_capacity(keys.len());
        let mut rows = Vec::with_capacity(ranges.len());
        let mut rest = keys;
        let mut first = true;
        while first || !rest.is_empty() {
            let with_scans = if first { scans.len() } else { 0 };
            let n = rest.len().min((room - with_scans).max(1));
            let (chunk, after) = rest.split_at(n);
            rest = after;
            let mut ops = chunk
                .iter()
                .map(|(t, k)| Ok(TxnOp::get(self.keyspace().key(*t, k)?, None)))
                .collect::<KvResult<Vec<_>>>()?;
            if first {
                ops.extend(scans.iter().cloned());
            }
            first = false;
            if ops.is_empty() {
                break;
            }
            let txn = Txn::new().when(compares.clone()).and_then(ops);
            let resp = self
                .call(Resend::Always, |mut kv| {
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .map_err(KvError::from)?;
            if !resp.succeeded() {
                return Err(self.guard_failure(guards)?);
            }
            let answers = resp.op_responses();
            let (got, scanned) = answers.split_at(chunk.len().min(answers.len()));
            let found = crate::store::read_answers(chunk.len(), got)?;
            out.extend(found.into_iter().map(|kv| kv.map(|kv| kv.value().to_vec())));
            if with_scans > 0 {
                if scanned.len() != with_scans {
                    return Err(KvError::Backend(
                        format!(
                            "etcd answered {with_scans} ranges with {} responses",
                            scanned.len()
                        )
                        .into(),
                    ));
                }
                for a in scanned {
                    let TxnOpResponse::Get(g) = a else {
                        return Err(KvError::Backend(
                            "etcd answered a range with another op".into(),
                        ));
                    };
                    let mut page = Vec::with_capacity(g.kvs().len());
                    for kv in g.kvs() {
                        let Some(user_key) = kv.key().get(tag_len..) else {
                            return Err(KvError::Backend(
                                format!("etcd returned key {:?} outside the range", kv.key())
                                    .into(),
                            ));
                        };
                        page.push((user_key.to_vec(), kv.value().to_vec()));
                    }
                    rows.push(Some(page));
                }
            }
        }
        rows.resize(ranges.len(), None);
        Ok((out, rows))
    }

    /// Why a Txn guarded by `guards` failed: [`KvError::GuardFailed`] for the first guard
    /// that does not hold now, or [`KvError::Conflict`] when all hold again (the key changed
    /// back in between; rerunning is right).
    pub(crate) fn guard_failure(&self, guards: &[KeyGuard]) -> KvResult<KvError> {
        let keys: Vec<Vec<u8>> = self
            .value_guards(guards)?
            .into_iter()
            .map(|g| match g {
                Guard::Value { key, .. } => key,
                Guard::Key { key, .. } => key,
                Guard::Range { range, .. } => range.lo,
            })
            .collect();
        let now = self.read_keys(&keys)?;
        for (g, k) in guards.iter().zip(&keys) {
            let found = now.get(k).and_then(|s| s.value.as_deref());
            if let Err(e) = g.check(found) {
                return Ok(e);
            }
        }
        Ok(KvError::Conflict)
    }
}
