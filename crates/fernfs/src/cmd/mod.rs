//! One module per subcommand of `fernfs`.

#[cfg(feature = "bench")]
pub mod bench;
pub mod blockdev;
pub mod fsck;
pub mod image;
pub mod mkfs;
pub mod mount;
pub mod stat;
pub mod transfer;
