//! Entry points for fuzzing every decoder that reads bytes from disk: header slot, block
//! translation table, catalog, node, partition, log record, and a whole image (open + recover).
//! Used by the cargo-fuzz targets in `fuzz/` and by the decoder proptest in
//! `tests/decoders.rs`. Each function must return (an error is fine) and never panic, whatever
//! the input. Owns nothing; never used by the engine itself.

use std::sync::Arc;

use crate::blockfile::{self, BlockLoc};
use crate::device::MemDevice;
use crate::ids::{Lsn, NodeId};

/// Decodes `bytes` as header slot 0.
pub fn header(bytes: &[u8]) {
    blockfile::fuzz_header(bytes);
}

/// Decodes `bytes` as a block translation table.
pub fn btt(bytes: &[u8]) -> bool {
    blockfile::fuzz_btt(bytes)
}

/// Decodes `bytes` as the catalog (the meta blob).
pub fn catalog(bytes: &[u8]) -> bool {
    crate::catalog::fuzz_catalog(bytes)
}

/// Decodes `bytes` as a node id (8 bytes, little-endian: the id the translation table would
/// look the block up under) followed by a whole node block (header and every partition).
pub fn node(bytes: &[u8]) -> bool {
    let Some((id, block)) = bytes.split_first_chunk::<8>() else {
        return false;
    };
    let Ok(len) = u32::try_from(block.len()) else {
        return false;
    };
    let dev = MemDevice::from_bytes(block.to_vec());
    let id = NodeId(u64::from_le_bytes(*id));
    crate::node::Node::read(&dev, id, BlockLoc { offset: 0, len }, true).is_ok()
}

/// Decodes `bytes` as one partition frame.
pub fn partition(bytes: &[u8]) -> bool {
    crate::codec::decode_partition(bytes, &|| "fuzzed partition".to_string()).is_ok()
}

/// Decodes `bytes` as a log record frame at the LSN its header claims, and as a bare payload.
pub fn log_record(bytes: &[u8]) -> bool {
    let lsn = bytes
        .get(8..16)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let framed = crate::wal::decode_frame(bytes, Lsn(lsn));
    let bare = crate::wal::decode_record(bytes, "fuzzed log record");
    matches!(framed, Ok(Some(_))) || bare.is_ok()
}

/// Opens (and recovers) `bytes` as a whole image, with upsert function 1 registered (it
/// replaces the value with the argument).
pub fn image(bytes: &[u8]) -> bool {
    let mut opts = crate::Options {
        sync_interval: None,
        checkpoint_thread: false,
        ..crate::Options::default()
    };
    opts.register_upsert(crate::UpsertId(1), Arc::new(|_, _, a| Some(a.to_vec())));
    crate::Env::open_on(Arc::new(MemDevice::from_bytes(bytes.to_vec())), opts).is_ok()
}
