//! Fault injection for tests: a store whose writes fail on demand, as when a device fills up
//! or a cluster becomes unreachable, and whose next scans fail a given number of times, as
//! when a concurrent commit or a compaction invalidates a read, so a caller's handling of a
//! refused write or read can be tested against the real store underneath. It owns only those
//! switches; everything else goes through.

use parking_lot::Mutex;

use crate::error::{KvError, KvResult};
use crate::extent::ExtentRef;
use crate::store::{KvRead, KvSession, KvStore, KvTxn};
use crate::types::{Direction, KeyRange, Limits, TreeId, WriteOptions};
use crate::WriteBatch;

/// `inner` with writes (`write`; transactions are the inner store's) that fail while a failure
/// is set ([`FailingWrites::fail_with`]).
pub struct FailingWrites {
    inner: Box<dyn KvStore>,
    failure: Mutex<Option<Failure>>,
    /// Scans still to fail, and with what.
    failing_scans: Mutex<(u32, Option<Failure>)>,
}

/// Makes the error an injected failure returns.
type Failure = fn() -> KvError;

impl FailingWrites {
    /// Writes go through until a failure is set.
    pub fn new(inner: Box<dyn KvStore>) -> Self {
        Self {
            inner,
            failure: Mutex::new(None),
            failing_scans: Mutex::new((0, None)),
        }
    }

    /// The next `count` scans (`KvRead::scan` of the store itself) fail with what `failure`
    /// makes; later ones go through.
    pub fn fail_scans(&self, count: u32, failure: Failure) {
        *self.failing_scans.lock() = (count, Some(failure));
    }

    /// From now on every `write` fails with what `failure` makes (`None`: writes go through
    /// again).
    pub fn fail_with(&self, failure: Option<Failure>) {
        *self.failure.lock() = failure;
    }
}

impl KvRead for FailingWrites {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.inner.get(tree, key)
    }

    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        {
            let mut f = self.failing_scans.lock();
            if let (n @ 1.., Some(fail)) = *f {
                f.0 = n - 1;
                return Err(fail());
            }
        }
        self.inner.scan(tree, range, dir, limit)
    }

    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.inner.read_extent(r, buf)
    }
}

impl KvStore for FailingWrites {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        self.inner.tree(name)
    }

    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        if let Some(fail) = *self.failure.lock() {
            return Err(fail());
        }
        self.inner.write(batch, opts)
    }

    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        self.inner.begin()
    }

    fn sync(&self) -> KvResult<()> {
        self.inner.sync()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn session(&self) -> KvResult<Option<&dyn KvSession>> {
        self.inner.session()
    }

    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> KvResult<Vec<Option<Vec<u8>>>> {
        self.inner.get_many(keys)
    }
}
