//! One module per subcommand of `fernfs`.

pub mod bench;
pub mod blockdev;
pub mod etcd;
pub mod fsck;
pub mod image;
pub mod mkfs;
pub mod mount;
pub mod stat;
pub mod transfer;
