//! One module per subcommand of `fernfs`.

#[cfg(feature = "bench")]
pub mod bench;
pub mod blockdev;
pub mod daemon_log;
pub mod fsck;
pub mod holder;
pub mod image;
pub mod interrupt;
pub mod mkfs;
pub mod mount;
pub mod stat;
pub mod transfer;
