//! Whole extents kept for the next request, and read ahead of sequential readers
//! (docs/fs-design.md §9, "Reads" and "Read-ahead").
//!
//! FUSE reads arrive in 128 KiB–1 MiB pieces and an extent's crc covers all of it, so an
//! extent that a request covers only in part is read whole once and kept here for the next
//! pieces, keyed by reference: an extent's bytes never change while its reference names it.
//!
//! A reader that goes through a file in order (from one slot into the next:
//! [`ExtentCache::follow`]) has the next [`AHEAD`] extents read for it in the background by
//! [`READERS`] threads, so the device works on them (two at a time) while the reader copies
//! out the current one. The store reads an extent past the host's page cache where it can
//! (fern-tree's `BlockDevice::read_direct`: the kernel's page cache of the mounted file
//! already holds what the reader got, and the image's would be a second copy), which needs
//! aligned buffers; they are reused, since a fresh 1 MiB buffer is fresh pages to fault in and
//! zero.
//!
//! Rules:
//! * **R1** An entry is *reading* until a reader thread fills it, then *ready*. A request that wants
//!   a reading entry waits for it; a read ahead that fails removes its entry and the request
//!   reads the extent itself, so an error reaches the request that meets it, with its retries
//!   (a stale reference: extent.rs).
//! * **R2** At most [`CACHED_EXTENTS`] entries, reading ones included; the oldest go first.
//! * **R3** The reader threads hold the store, never the [`Fs`](crate::fs::Fs); dropping the
//!   cache (with the `Fs`) stops and joins them, so the store is released when the `Fs` is.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut, Range};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use fern_kv::{ExtentRef, KvStore};
use parking_lot::{Condvar, Mutex};

use crate::ids::InodeId;

/// Entries kept (R2): the read-ahead window, the extent being read and one behind it that a
/// request may still want a piece of. With [`SPARE_BUFFERS`] at most 8 MiB of 1 MiB extents,
/// outside the budgets the engine and fern-fs count (inside the mount's memory set aside for
/// what they do not: fern-kv-tree `FsMemory::within`).
const CACHED_EXTENTS: usize = AHEAD as usize + 2;

/// Extents read ahead of a sequential reader (4 MiB with 1 MiB slots): enough to keep the
/// device busy while one is copied out, few enough to leave room behind in the cache.
pub(crate) const AHEAD: u64 = 4;

/// Buffers of dropped entries kept for the next reads.
const SPARE_BUFFERS: usize = 2;

/// Threads reading ahead: two reads in flight keep the device busier than one (a direct read
/// is one request at a time).
const READERS: usize = 2;

/// The read-ahead threads' name (tests count their reads by it).
pub(crate) const READER_NAME: &str = "fernfs-readahead";

/// Files whose reading order is followed at once.
const STREAMS: usize = 16;

/// Address and length alignment of extent buffers: a page, what a store reading past the
/// host's cache needs (fern-tree's `DIRECT_ALIGN`).
pub(crate) const EXTENT_ALIGN: usize = 4096;

/// A buffer for one extent whose bytes start at an [`EXTENT_ALIGN`]ed address.
pub(crate) struct ExtentBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl ExtentBuf {
    fn new(len: usize) -> Self {
        let mem = vec![0u8; len + EXTENT_ALIGN];
        let start = mem.as_ptr().align_offset(EXTENT_ALIGN);
        ExtentBuf { mem, start, len }
    }

    /// Whether it can hold `len` bytes at its aligned start; then it is made that long.
    fn refit(&mut self, len: usize) -> bool {
        if self.start + len > self.mem.len() {
            return false;
        }
        self.len = len;
        true
    }
}

impl Deref for ExtentBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }
}

impl DerefMut for ExtentBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

enum Entry {
    Reading,
    Ready(Arc<ExtentBuf>),
}

/// One file's reading order: the last slot a read touched, the slot up to which (not
/// included) read-ahead was asked, and whether the reads go in order ([`ExtentCache::follow`]).
struct Stream {
    ino: InodeId,
    last_slot: u64,
    ahead_to: u64,
    in_order: bool,
}

#[derive(Default)]
struct State {
    entries: VecDeque<(ExtentRef, Entry)>,
    spare: Vec<ExtentBuf>,
    streams: VecDeque<Stream>,
}

impl State {
    fn buffer(&mut self, len: usize) -> ExtentBuf {
        while let Some(mut b) = self.spare.pop() {
            if b.refit(len) {
                return b;
            }
        }
        ExtentBuf::new(len)
    }

    fn recycle(&mut self, b: ExtentBuf) {
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(b);
        }
    }

    /// Makes room for one entry (R2).
    fn make_room(&mut self) {
        while self.entries.len() >= CACHED_EXTENTS {
            match self.entries.pop_front() {
                // Held by no request any more: its memory serves the next read.
                Some((_, Entry::Ready(old))) => {
                    if let Ok(b) = Arc::try_unwrap(old) {
                        self.recycle(b);
                    }
                }
                // A reader finds it gone and keeps the buffer (its waiters read themselves).
                Some((_, Entry::Reading)) | None => {}
            }
        }
    }

    fn position(&self, r: &ExtentRef) -> Option<usize> {
        self.entries.iter().position(|(k, _)| k == r)
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a reader thread finishes a read (R1).
    filled: Condvar,
}

/// The read-ahead threads and their queue.
struct Worker {
    queue: mpsc::Sender<ExtentRef>,
    threads: Vec<JoinHandle<()>>,
}

/// See the module comment.
#[derive(Default)]
pub(crate) struct ExtentCache {
    shared: Arc<Shared>,
    worker: Mutex<Option<Worker>>,
}

impl ExtentCache {
    /// Extent `r` if it is cached, after waiting for it if it is being read ahead (R1).
    pub(crate) fn get(&self, r: &ExtentRef) -> Option<Arc<ExtentBuf>> {
        let mut st = self.shared.state.lock();
        loop {
            let i = st.position(r)?;
            match &st.entries[i].1 {
                Entry::Ready(d) => return Some(Arc::clone(d)),
                Entry::Reading => self.shared.filled.wait(&mut st),
            }
        }
    }

    /// An aligned buffer of `len` bytes to read an extent into (its contents are overwritten).
    pub(crate) fn buffer(&self, len: usize) -> ExtentBuf {
        self.shared.state.lock().buffer(len)
    }

    /// Keeps `data`, extent `r`'s bytes, for the next requests.
    pub(crate) fn put(&self, r: ExtentRef, data: Arc<ExtentBuf>) {
        let mut st = self.shared.state.lock();
        match st.position(&r) {
            Some(i) => st.entries[i].1 = Entry::Ready(data),
            None => {
                st.make_room();
                st.entries.push_back((r, Entry::Ready(data)));
            }
        }
        self.shared.filled.notify_all();
    }

    /// Follows `ino`'s reading order given the slots `[slots.start, slots.end)` a read touches,
    /// and returns the slots to read ahead now. A file is read in order once a read starts in
    /// the slot after the one its last read ended in (a run of pieces inside one slot, which a
    /// random reader of 256 KiB makes too, is not enough), and stays so while each read starts
    /// in that slot or the next; any other read ends it. Each slot is returned once while the
    /// order holds, so a read ahead costs one look at the file's extent rows per slot read.
    pub(crate) fn follow(&self, ino: InodeId, slots: Range<u64>) -> Range<u64> {
        let (lo, hi) = (slots.start, slots.end.max(slots.start + 1));
        let mut st = self.shared.state.lock();
        let streams = &mut st.streams;
        let Some(s) = streams.iter_mut().find(|s| s.ino == ino) else {
            if streams.len() >= STREAMS {
                streams.pop_front();
            }
            streams.push_back(Stream {
                ino,
                last_slot: hi - 1,
                ahead_to: hi,
                in_order: false,
            });
            return 0..0;
        };
        if lo == s.last_slot + 1 {
            s.in_order = true;
        } else if lo != s.last_slot {
            s.in_order = false;
            s.ahead_to = hi;
        }
        s.last_slot = hi - 1;
        let from = s.ahead_to.max(hi);
        let to = hi + AHEAD;
        if !s.in_order || to <= from {
            return 0..0;
        }
        s.ahead_to = to;
        from..to
    }

    /// Has the extents `refs` read in the background into the cache (those not there yet),
    /// starting the reader threads on first use with its own handle on `store` (R3).
    pub(crate) fn read_ahead(&self, store: &Arc<dyn KvStore>, refs: &[ExtentRef]) {
        let mut queued = Vec::new();
        {
            let mut st = self.shared.state.lock();
            for r in refs {
                if st.position(r).is_none() {
                    st.make_room();
                    st.entries.push_back((*r, Entry::Reading));
                    queued.push(*r);
                }
            }
        }
        if queued.is_empty() {
            return;
        }
        let mut w = self.worker.lock();
        if w.is_none() {
            *w = self.start_worker(store);
        }
        let sent = match &*w {
            Some(w) => queued.iter().all(|r| w.queue.send(*r).is_ok()),
            None => false,
        };
        if !sent {
            // No reader threads (none could be started): nobody will fill them; requests read
            // for themselves (R1).
            let mut st = self.shared.state.lock();
            st.entries
                .retain(|(k, e)| !(queued.contains(k) && matches!(e, Entry::Reading)));
            self.shared.filled.notify_all();
        }
    }

    fn start_worker(&self, store: &Arc<dyn KvStore>) -> Option<Worker> {
        let (queue, jobs) = mpsc::channel::<ExtentRef>();
        let jobs = Arc::new(Mutex::new(jobs));
        let mut threads = Vec::new();
        for n in 0..READERS {
            let (shared, store, jobs) = (
                Arc::clone(&self.shared),
                Arc::clone(store),
                Arc::clone(&jobs),
            );
            let spawned =
                std::thread::Builder::new()
                    .name(READER_NAME.into())
                    .spawn(move || loop {
                        let Ok(r) = jobs.lock().recv() else {
                            return; // the cache is gone (R3)
                        };
                        shared.fill(&*store, r);
                    });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) if n == 0 => {
                    log::warn!("no extent read-ahead: cannot start its thread: {e}");
                    return None;
                }
                Err(_) => break, // fewer readers: still correct
            }
        }
        Some(Worker { queue, threads })
    }
}

impl Shared {
    /// A reader's job: reads extent `r` into a buffer and makes its entry ready, or removes
    /// the entry if the read failed (R1); wakes every waiter either way.
    fn fill(&self, store: &dyn KvStore, r: ExtentRef) {
        let mut buf = self.state.lock().buffer(r.len() as usize);
        // A panic in the store (a bug) must not leave the entry reading and its waiters
        // asleep for good: it counts as a failed read.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.read_extent(&r, &mut buf)
        }))
        .unwrap_or_else(|_| {
            Err(fern_kv::KvError::Backend(
                "extent read-ahead panicked".into(),
            ))
        });
        let mut st = self.state.lock();
        let reading = st
            .position(&r)
            .filter(|&i| matches!(st.entries[i].1, Entry::Reading));
        match (reading, read) {
            (Some(i), Ok(())) => st.entries[i].1 = Entry::Ready(Arc::new(buf)),
            (Some(i), Err(_)) => {
                st.entries.remove(i);
                st.recycle(buf);
            }
            (None, _) => st.recycle(buf),
        }
        self.filled.notify_all();
    }
}

impl Drop for ExtentCache {
    fn drop(&mut self) {
        // Closing the queue ends each reader's loop once its current read is done (R3).
        if let Some(Worker { queue, threads }) = self.worker.get_mut().take() {
            drop(queue);
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_buffers_are_aligned_and_refit_only_within_their_memory() {
        let mut b = ExtentBuf::new(3 * EXTENT_ALIGN);
        assert_eq!(b.as_ptr() as usize % EXTENT_ALIGN, 0);
        assert_eq!(b.len(), 3 * EXTENT_ALIGN);
        assert!(b.refit(2 * EXTENT_ALIGN));
        assert_eq!(b.len(), 2 * EXTENT_ALIGN);
        assert!(b.refit(3 * EXTENT_ALIGN));
        assert!(!b.refit(5 * EXTENT_ALIGN));
    }

    #[test]
    fn only_reads_that_go_on_into_the_next_slot_read_ahead_and_each_slot_once() {
        let c = ExtentCache::default();
        let ino = InodeId(7);
        assert_eq!(c.follow(ino, 0..1), 0..0, "a first read is no order yet");
        assert_eq!(c.follow(ino, 0..1), 0..0, "nor pieces of one slot");
        assert_eq!(c.follow(ino, 1..2), 2..2 + AHEAD, "into the next slot");
        assert_eq!(c.follow(ino, 1..2), 0..0, "asked already");
        assert_eq!(c.follow(ino, 2..3), 2 + AHEAD..3 + AHEAD, "one more slot");
        assert_eq!(c.follow(ino, 2..4), 3 + AHEAD..4 + AHEAD);
        assert_eq!(c.follow(ino, 40..41), 0..0, "a jump ends the order");
        assert_eq!(c.follow(ino, 40..41), 0..0);
        assert_eq!(
            c.follow(ino, 41..42),
            42..42 + AHEAD,
            "and the next slot starts one"
        );
        assert_eq!(
            c.follow(InodeId(8), 42..43),
            0..0,
            "another file has its own order"
        );
    }
}
