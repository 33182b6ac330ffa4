//! One module per subcommand of `fernfs`, and the pieces they share (image, lock holder,
//! interrupts, daemon log, block devices, etcd URLs, the target of the offline subcommands,
//! time stamps).

#[cfg(feature = "bench")]
pub mod bench;
pub mod blockdev;
pub mod daemon_log;
pub mod etcd;
pub mod fsck;
pub mod holder;
pub mod image;
pub mod interrupt;
pub mod mkfs;
pub mod mount;
pub mod stat;
pub mod target;
pub mod transfer;
pub mod utc;
