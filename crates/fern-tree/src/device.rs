//! The block-device trait: every byte the engine reads or writes goes through it.
//!
//! Owns: positioned reads and writes, length changes, durability barriers, hole punching.
//! Never: caching, buffering or reordering — an implementation does exactly what it is asked.

use std::io;

/// A random-access byte device (a file, memory, or a test device that injects faults).
///
/// `write_at` makes bytes visible to later reads but not durable; only `sync` promises
/// durability of every write that returned before it started.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the device is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; reading past the end is an `UnexpectedEof` error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, growing the device if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates or extends (with zeros) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Returns the space of `[offset, offset+len)` to the host; reads of it return zeros.
    /// Devices that cannot do it may leave the bytes in place.
    fn punch_hole(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}
