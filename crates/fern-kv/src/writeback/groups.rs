//! Cutting the dirty log into Txns (docs/design.md §7.3, W3): runs of whole batches, each run
//! within the store's limits as the store will count them. It owns that count; it must never
//! reorder ops.
//!
//! A store that cannot put a key inside a range it deletes in the same Txn (etcd) splits the
//! range around every such key, so a run's cost is its ops plus, for every put or delete, the
//! range deletes before it in the run that cover its key. A batch whose own cost is over the
//! limit (a truncate followed by many block writes, buffered and resolved into one batch) is
//! cut between its ops: its steps apply in order, so the end state is the same, but a crash
//! between them leaves the first part only — as a write larger than one Txn does without
//! write-back (docs/distributed.md §3).

use crate::batch::{Op, WriteBatch};
use crate::types::{KeyRange, TreeId};

/// A run of ops being built, with its cost.
#[derive(Default)]
pub(crate) struct Run {
    batch: WriteBatch,
    /// Range deletes in the run, for the cost of later keys.
    deleted: Vec<(TreeId, KeyRange)>,
    ops: usize,
    bytes: usize,
}

impl Run {
    /// What `op` would add to this run: (ops, bytes).
    fn cost(&self, op: &Op) -> (usize, usize) {
        let pieces = match op {
            Op::Put { tree, key, .. } | Op::Delete { tree, key } => self
                .deleted
                .iter()
                .filter(|(t, r)| t == tree && r.contains(key))
                .count(),
            _ => 0,
        };
        (1 + pieces, op.size())
    }

    fn fits(&self, extra: (usize, usize), max_ops: usize, max_bytes: usize) -> bool {
        self.ops + extra.0 <= max_ops && self.bytes + extra.1 <= max_bytes
    }

    fn push(&mut self, op: Op, cost: (usize, usize)) {
        if let Op::DeleteRange { tree, lo, hi } = &op {
            self.deleted.push((*tree, KeyRange::half_open(lo, hi)));
        }
        self.ops += cost.0;
        self.bytes += cost.1;
        self.batch.push(op);
    }

    /// The cost of `b` appended to this run, op by op.
    fn cost_of(&self, b: &WriteBatch) -> (usize, usize) {
        let mut probe = Run {
            deleted: self.deleted.clone(),
            ..Run::default()
        };
        for op in b.ops() {
            let c = probe.cost(op);
            probe.push(op.clone(), c);
        }
        (probe.ops, probe.bytes)
    }
}

/// `log`'s batches, in order, cut into Txn-sized runs (module docs).
pub(crate) fn cut(
    log: impl IntoIterator<Item = WriteBatch>,
    max_ops: usize,
    max_bytes: usize,
) -> Vec<WriteBatch> {
    let mut out = Vec::new();
    let mut run = Run::default();
    for b in log {
        let whole = run.cost_of(&b);
        if run.fits(whole, max_ops, max_bytes) {
            for op in b.into_ops() {
                let c = run.cost(&op);
                run.push(op, c);
            }
            continue;
        }
        if !run.batch.is_empty() {
            out.push(std::mem::take(&mut run).batch);
        }
        if run.fits(run.cost_of(&b), max_ops, max_bytes) {
            for op in b.into_ops() {
                let c = run.cost(&op);
                run.push(op, c);
            }
            continue;
        }
        // One batch over the limit on its own: cut between its ops.
        for op in b.into_ops() {
            let c = run.cost(&op);
            if !run.batch.is_empty() && !run.fits(c, max_ops, max_bytes) {
                out.push(std::mem::take(&mut run).batch);
            }
            let c = run.cost(&op);
            run.push(op, c);
        }
    }
    if !run.batch.is_empty() {
        out.push(run.batch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(TreeId(1), k.to_vec(), b"v".to_vec());
        b
    }

    /// Every run within the limit as counted with range pieces, the ops in their order.
    #[test]
    fn puts_under_a_deleted_range_count_their_pieces() {
        let mut log = Vec::new();
        let mut dr = WriteBatch::new();
        dr.delete_range(TreeId(1), b"a".to_vec(), b"b".to_vec());
        log.push(dr);
        for i in 0..200u32 {
            log.push(put(format!("a{i:03}").as_bytes()));
        }
        let runs = cut(log.clone(), 128, usize::MAX);
        let flat: Vec<Op> = runs.iter().flat_map(|r| r.ops().to_vec()).collect();
        let want: Vec<Op> = log.iter().flat_map(|b| b.ops().to_vec()).collect();
        assert_eq!(flat, want, "order kept");
        // The first run: the range delete and 63 puts (each a put and a piece).
        assert_eq!(runs[0].len(), 64);
        for r in &runs {
            let mut probe = Run::default();
            for op in r.ops() {
                let c = probe.cost(op);
                probe.push(op.clone(), c);
            }
            assert!(probe.ops <= 128, "a run costs {}", probe.ops);
        }
    }

    #[test]
    fn a_batch_over_the_limit_alone_is_cut_between_its_ops() {
        let mut big = WriteBatch::new();
        for i in 0..300u32 {
            big.put(TreeId(1), format!("k{i}").into_bytes(), b"v".to_vec());
        }
        let runs = cut(vec![put(b"first"), big], 128, usize::MAX);
        assert_eq!(runs.iter().map(WriteBatch::len).sum::<usize>(), 301);
        assert!(runs.iter().all(|r| r.len() <= 128));
        assert_eq!(runs[0].len(), 1, "the batch before it stays whole, alone");
    }
}
