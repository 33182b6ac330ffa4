//! The conformance suite: every scenario the [`crate::KvStore`] contract promises, run against
//! any backend. A backend's own tests call [`run_all`] with a factory that opens a fresh, empty
//! store with the given upsert registry. It owns the scenarios; it must never special-case a
//! backend (a backend that cannot pass a scenario does not implement the trait).
//!
//! Scenarios panic with a message naming what broke, as tests do.

mod extents;
mod guards;
mod reads;
mod txn;
mod writes;

use std::sync::Arc;

use crate::store::KvStore;
use crate::types::{UpdateFnId, UpdateRegistry};

/// Upsert: append the argument to the old value (absent = empty). Order-sensitive, so it
/// shows whether upserts are applied in order.
pub const APPEND: UpdateFnId = UpdateFnId(0xC0_0001);
/// Upsert: always delete the key (returns `None`).
pub const REMOVE: UpdateFnId = UpdateFnId(0xC0_0002);
/// Upsert: add the argument (u64 big-endian) to the old value (u64 big-endian, absent = 0).
/// A malformed old value is left unchanged, as real update functions must do.
pub const ADD_U64: UpdateFnId = UpdateFnId(0xC0_0003);
/// Upsert: prefix the value with the key it was called for, to check the key is passed.
pub const ECHO_KEY: UpdateFnId = UpdateFnId(0xC0_0004);
/// An id that is never registered.
pub const UNREGISTERED: UpdateFnId = UpdateFnId(0xC0_00FF);

/// The upsert functions the suite uses; factories must open the store with it (they may merge
/// in their own).
pub fn registry() -> UpdateRegistry {
    let mut r = UpdateRegistry::new();
    r.register(
        APPEND,
        Arc::new(|_k: &[u8], old: Option<&[u8]>, arg: &[u8]| {
            let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
            v.extend_from_slice(arg);
            Some(v)
        }),
    );
    r.register(
        REMOVE,
        Arc::new(|_k: &[u8], _old: Option<&[u8]>, _arg: &[u8]| None),
    );
    r.register(
        ADD_U64,
        Arc::new(|_k: &[u8], old: Option<&[u8]>, arg: &[u8]| {
            let parse = |b: &[u8]| <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes);
            let Some(delta) = parse(arg) else {
                return old.map(<[u8]>::to_vec);
            };
            match old {
                None => Some(delta.to_be_bytes().to_vec()),
                Some(o) => match parse(o) {
                    Some(n) => Some(n.wrapping_add(delta).to_be_bytes().to_vec()),
                    None => Some(o.to_vec()),
                },
            }
        }),
    );
    r.register(
        ECHO_KEY,
        Arc::new(|k: &[u8], _old: Option<&[u8]>, arg: &[u8]| {
            let mut v = k.to_vec();
            v.extend_from_slice(arg);
            Some(v)
        }),
    );
    r
}

/// Runs every scenario, each on a fresh store from `factory`.
pub fn run_all<S, F>(factory: F)
where
    S: KvStore,
    F: Fn(UpdateRegistry) -> S,
{
    let open = || factory(registry());
    reads::get_put_delete(&open());
    reads::trees_are_independent(&open());
    reads::scan_bounds_and_directions(&open());
    reads::scan_paging(&open());
    writes::upsert_semantics(&open());
    writes::upsert_unknown_fn_applies_nothing(&open());
    writes::range_delete_edges(&open());
    writes::batch_order_and_atomicity(&open());
    writes::limits_are_enforced(&open());
    writes::concurrent_upserts(&open());
    txn::commit_and_isolation(&open());
    txn::point_conflict(&open());
    txn::commit_conflicts_open_transactions(&open());
    txn::absent_key_conflict(&open());
    txn::range_conflict(&open());
    txn::disjoint_writes_do_not_conflict(&open());
    txn::abort_applies_nothing(&open());
    txn::retry_helper(&open());
    txn::concurrent_increments(&open());
    guards::guarded_reads(&open());
    guards::many_keys_at_once(&open());
    guards::guarded_commits(&open());
    extents::refused_without_extents(&open());
    extents::round_trip(&open());
    extents::double_free_refused(&open());
    extents::stale_reference(&open());
    extents::atomic_with_row(&open());
}
