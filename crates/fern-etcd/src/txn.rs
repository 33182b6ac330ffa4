//! Optimistic transactions on etcd (docs/distributed.md §4). A transaction owns its read set
//! — the revision its first read pinned, the `mod_revision` of every key it saw, the etcd
//! ranges its scans covered — and its buffered batch; commit is one Txn guarded by that read
//! set. It must never read at another revision than the pinned one, so that what it read is
//! one snapshot.

use std::cell::RefCell;
use std::collections::BTreeMap;

use fern_kv::{
    Direction, KeyGuard, KeyRange, KvError, KvRead, KvResult, KvTxn, TreeId, WriteBatch,
    WriteOptions,
};

use crate::keys::EtcdRange;
use crate::plan::Guard;
use crate::store::{covered_range, EtcdStore};

#[derive(Default)]
struct Reads {
    /// Revision of the snapshot, set by the first read.
    revision: Option<i64>,
    /// etcd key → `mod_revision` seen (0: absent).
    keys: BTreeMap<Vec<u8>, i64>,
    /// Covered scan ranges.
    ranges: Vec<EtcdRange>,
}

impl Reads {
    fn guards(&self) -> Vec<Guard> {
        let Some(rev) = self.revision else {
            return Vec::new();
        };
        let keys = self.keys.iter().map(|(k, m)| Guard::Key {
            key: k.clone(),
            mod_revision: *m,
        });
        let ranges = self
            .ranges
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| Guard::Range {
                range: r.clone(),
                below: rev + 1,
            });
        keys.chain(ranges).collect()
    }
}

/// A transaction on an [`EtcdStore`].
pub(crate) struct EtcdTxn<'a> {
    store: &'a EtcdStore,
    reads: RefCell<Reads>,
    /// Key guards the commit is conditional on (compares, no read).
    guards: Vec<KeyGuard>,
    /// Guards of the read that pins the snapshot (`KvTxn::guard_reads`): compares in its
    /// Txn, so every read at the snapshot saw them hold.
    read_guards: Vec<KeyGuard>,
    batch: WriteBatch,
}

impl<'a> EtcdTxn<'a> {
    pub(crate) fn new(store: &'a EtcdStore) -> Self {
        Self {
            store,
            reads: RefCell::new(Reads::default()),
            guards: Vec::new(),
            read_guards: Vec::new(),
            batch: WriteBatch::new(),
        }
    }
}

impl EtcdTxn<'_> {
    /// The guards the next read carries: those of `guard_reads` until a read has pinned the
    /// snapshot, none after (reads at the snapshot saw them hold already).
    fn pinning_guards(&self, rev: Option<i64>) -> &[KeyGuard] {
        if rev.is_none() {
            &self.read_guards
        } else {
            &[]
        }
    }
}

impl KvRead for EtcdTxn<'_> {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        let rev = self.reads.borrow().revision;
        let p = self
            .store
            .get_at(tree, key, rev, self.pinning_guards(rev))
            .map_err(KvError::from)?;
        let k = self.store.keyspace().key(tree, key)?;
        let mut r = self.reads.borrow_mut();
        r.revision.get_or_insert(p.revision);
        r.keys.insert(k, p.mod_revision);
        Ok(p.value)
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let rev = self.reads.borrow().revision;
        let s = self
            .store
            .scan_at(tree, range, dir, limit, rev, self.pinning_guards(rev))
            .map_err(KvError::from)?;
        let ks = self.store.keyspace();
        let covered = covered_range(ks, tree, range, dir, limit, &s.pairs)?;
        let mut r = self.reads.borrow_mut();
        if let Some(rev) = s.revision {
            r.revision.get_or_insert(rev);
        }
        for ((k, _), m) in s.pairs.iter().zip(&s.mod_revisions) {
            r.keys.insert(ks.key(tree, k)?, *m);
        }
        if limit > 0 {
            r.ranges.push(covered);
        }
        Ok(s.pairs)
    }
}

impl KvTxn for EtcdTxn<'_> {
    fn batch(&mut self) -> &mut WriteBatch {
        &mut self.batch
    }

    /// Only a compare in the commit's Txn: no round trip now.
    fn guard(&mut self, guard: &KeyGuard) -> KvResult<()> {
        self.store.keyspace().key(guard.tree, &guard.key)?;
        self.guards.push(guard.clone());
        Ok(())
    }

    /// A compare in the Txn of the first read (pinning the snapshot) and one in the commit.
    fn guard_reads(&mut self, guard: &KeyGuard) -> KvResult<()> {
        self.guard(guard)?;
        self.read_guards.push(guard.clone());
        Ok(())
    }

    fn commit(self: Box<Self>, _opts: WriteOptions) -> KvResult<()> {
        let reads = self.reads.borrow().guards();
        self.store.apply(&self.batch, &reads, &self.guards)
    }
}
