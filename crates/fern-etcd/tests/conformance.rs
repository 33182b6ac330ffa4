//! fern-kv's conformance suite, unchanged, on etcd: one private server for the binary, a fresh
//! prefix for every scenario's store.

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::EtcdStore;

#[test]
fn conforms_on_etcd() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    fern_kv::conformance::run_all(|r| {
        EtcdStore::connect(&etcd.config(&unique_prefix("conf")), r).expect("connect")
    });
}
