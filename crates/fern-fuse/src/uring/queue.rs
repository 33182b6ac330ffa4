//! One CPU's ring queue: a thread with its own io_uring that registers `DEPTH` entries (a
//! 288-byte request header and a payload buffer each) with the kernel for queue `qid`, then
//! serves whatever request a completion delivers and commits the reply together with the
//! fetch of the next request (docs/fuse.md, "Transports"). Owns the ring, the entries'
//! buffers and the commit protocol; decoding is `dispatch.rs`'s.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use io_uring::squeue::Entry128;
use io_uring::{cqueue, opcode, types, IoUring};

use super::abi::{self, Fields, InHeader};
use super::dispatch::dispatch;
use super::wakeups::{IdleWaits, WakePlacement};
use super::TransportStatus;
use crate::handler::Handler;
use crate::reply::{Outcome, Slot};

/// Ring entries per queue.
pub(crate) const DEPTH: usize = 4;
/// Offset of `len` in `struct io_uring_sqe` (opcode u8, flags u8, ioprio u16, fd i32,
/// off u64, addr u64, len u32).
const SQE_LEN_OFF: usize = 24;
/// A request payload up to this size is copied out before the handler runs, so the reply can
/// be written into the payload buffer it came in; a larger one (a write's data) stays, and
/// the (small) reply is encoded aside and copied in afterwards.
const COPY_IN_MAX: usize = 4096;

/// One registered ring entry: its buffers stay at fixed addresses for the life of the queue.
struct Ent {
    head: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

impl Ent {
    fn new(payload_size: usize) -> Ent {
        let mut head = vec![0u8; abi::REQ_HEADER_SIZE].into_boxed_slice();
        let mut payload = vec![0u8; payload_size].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Ent { head, payload, iov }
    }
}

/// A `FUSE_IO_URING_CMD_*` SQE for entry `ud` of queue `qid`.
fn command(fd: i32, cmd: u32, qid: u16, commit_id: u64, ent: &Ent, ud: u64) -> Entry128 {
    let e = opcode::UringCmd80::new(types::Fd(fd), cmd)
        .cmd(abi::cmd_req(commit_id, qid))
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(ud);
    with_len(e, 2)
}

/// Sets `sqe->len` (the iovec count FUSE requires), which the io-uring crate's `UringCmd80`
/// does not expose.
fn with_len(e: Entry128, len: u32) -> Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: a `repr(C)` 64-byte `io_uring_sqe` followed by 64
    // command bytes, 128 bytes without padding, and every byte pattern is a valid value.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute::<Entry128, [u8; 128]>(e) };
    raw[SQE_LEN_OFF..SQE_LEN_OFF + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above; only the `len` field changed.
    unsafe { std::mem::transmute::<[u8; 128], Entry128>(raw) }
}

/// Pins the calling thread to CPU `cpu` if the process may run there (a `taskset` mask is
/// respected: then the thread keeps the inherited mask).
fn pin(cpu: usize) {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let Ok(mask) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    if !mask.is_set(cpu).unwrap_or(false) {
        return;
    }
    let mut one = CpuSet::new();
    if one.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &one);
    }
}

/// Creates a ring for 128-byte SQEs; also the probe that io_uring works at all here.
///
/// SINGLE_ISSUER + DEFER_TASKRUN: only the queue's thread, which creates the ring, ever
/// submits, and it always waits for completions inside `io_uring_enter` (`submit_and_wait`),
/// so the kernel may defer the task work that hands it a request (FUSE delivers every request
/// to a ring entry by task work) until that wait instead of interrupting the thread for it.
/// An interleaved A/B (docs/fuse.md, "Ring setup flags: A/B") measured about 5 % less daemon
/// CPU per request with them, and none of the flags ever cost more. A kernel that refuses
/// them (older than 6.1; FUSE over io_uring needs 6.14 anyway) gets a plain ring.
pub(crate) fn new_ring(entries: u32) -> io::Result<IoUring<Entry128, cqueue::Entry>> {
    IoUring::<Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => IoUring::<Entry128, cqueue::Entry>::builder().build(entries),
            _ => Err(e),
        })
}

/// Serves queue `qid` until the kernel ends every entry (unmount). Reports on `registered`
/// whether registration was accepted (the kernel answers a refused REGISTER at once).
pub(crate) fn serve<H: Handler>(
    qid: u16,
    dev: Arc<OwnedFd>,
    h: Arc<H>,
    payload_size: usize,
    status: Arc<TransportStatus>,
    placement: Arc<WakePlacement>,
    registered: Sender<io::Result<()>>,
) {
    pin(usize::from(qid));
    let waits = IdleWaits::new(placement);
    let fd = dev.as_raw_fd();
    // Declared before the ring, so the ring (and with it every command) goes first.
    let mut ents: Vec<Ent> = (0..DEPTH).map(|_| Ent::new(payload_size)).collect();
    let mut scratch = vec![0u8; payload_size].into_boxed_slice();
    let mut ring = match new_ring((DEPTH * 2) as u32) {
        Ok(r) => r,
        Err(e) => {
            let _ = registered.send(Err(e));
            return;
        }
    };
    for (i, ent) in ents.iter().enumerate() {
        let sqe = command(fd, abi::CMD_REGISTER, qid, 0, ent, i as u64);
        // SAFETY: the entry's buffers and iovecs live in `ents`, which outlives the ring;
        // the queue is DEPTH * 2 deep, so it has room.
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            let _ = registered.send(Err(io::Error::other("submission queue full")));
            return;
        }
    }
    if let Err(e) = ring.submit() {
        let _ = registered.send(Err(e));
        return;
    }
    let mut ready: Vec<(usize, i32)> = ring
        .completion()
        .map(|c| (c.user_data() as usize, c.result()))
        .collect();
    if let Some(&(_, err)) = ready.iter().find(|(_, r)| *r < 0) {
        // A refused REGISTER: the kernel has switched the connection back to /dev/fuse.
        let _ = registered.send(Err(io::Error::from_raw_os_error(-err)));
        leak_if_pending(ents, ring, ready.iter().filter(|(_, r)| *r < 0).count());
        return;
    }
    let _ = registered.send(Ok(()));
    let mut live = DEPTH;
    loop {
        for (ud, res) in ready.drain(..) {
            let Some(ent) = ents.get_mut(ud) else {
                continue;
            };
            if res < 0 {
                // -ENOTCONN at unmount (or a cancelled command): this entry is done.
                live -= 1;
                if ![libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&-res) {
                    log::warn!("fuse ring queue {qid}: entry ended with errno {}", -res);
                }
                continue;
            }
            let (commit_id, pid) = serve_one(&*h, ent, &mut scratch);
            waits.note(pid, qid);
            status.ring_requests.fetch_add(1, Ordering::Relaxed);
            let sqe = command(
                fd,
                abi::CMD_COMMIT_AND_FETCH,
                qid,
                commit_id,
                ent,
                ud as u64,
            );
            // SAFETY: as for REGISTER; each entry has at most one command in flight, and
            // this one's completion was just taken.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                log::error!("fuse ring queue {qid}: submission queue full");
            }
        }
        if live == 0 {
            return;
        }
        // Nothing left to serve: the reply just pushed may wake a requester that should stay
        // on this CPU (wakeups.rs).
        let idle = waits.before();
        let waited = ring.submit_and_wait(1);
        waits.after(idle);
        match waited {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => {
                log::error!("fuse ring queue {qid}: {e}");
                leak_if_pending(ents, ring, 0);
                return;
            }
        }
        ready.extend(
            ring.completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
    }
}

/// Gives up a ring that may still have commands in the kernel: its buffers must then never
/// be freed (the kernel may still write a request into them while it cancels).
fn leak_if_pending(ents: Vec<Ent>, ring: IoUring<Entry128, cqueue::Entry>, ended: usize) {
    if ended < ents.len() {
        std::mem::forget(ents);
    }
    drop(ring);
}

/// Runs the request in `ent` and writes the reply into it; returns its commit id and the
/// requester's pid (0 for the kernel's own requests, or a header that did not parse).
fn serve_one<H: Handler>(h: &H, ent: &mut Ent, scratch: &mut [u8]) -> (u64, u32) {
    let head = Fields(&ent.head);
    let commit_id = head.u64(abi::ENT_COMMIT_ID).unwrap_or(0);
    let len = head.u32(abi::ENT_PAYLOAD_SZ).unwrap_or(0) as usize;
    let len = len.min(ent.payload.len());
    let mut op = [0u8; abi::OP_IN_SIZE];
    op.copy_from_slice(&ent.head[abi::OP_IN_OFF..abi::OP_IN_OFF + abi::OP_IN_SIZE]);
    let Some(req) = InHeader::parse(&ent.head[abi::IN_OUT_OFF..abi::OP_IN_OFF]) else {
        return (commit_id, 0);
    };
    let mut outcome = Outcome::default();
    let copied_in = len <= COPY_IN_MAX;
    if copied_in {
        // Small input (names): copy it aside, reply straight into the payload buffer.
        scratch[..len].copy_from_slice(&ent.payload[..len]);
        let slot = slot(&mut ent.payload, &mut outcome);
        dispatch(h, &req, &op, &scratch[..len], slot);
    } else {
        // Large input (write data): read it in place, encode the reply aside.
        let slot = slot(scratch, &mut outcome);
        dispatch(h, &req, &op, &ent.payload[..len], slot);
        ent.payload[..outcome.len].copy_from_slice(&scratch[..outcome.len]);
    }
    if !outcome.replied {
        log::error!("FUSE opcode {} got no reply", req.opcode);
        outcome.error = -libc::EIO;
    }
    if outcome.error != 0 {
        outcome.len = 0;
    }
    let out = abi::out_header(
        (abi::OUT_HEADER_SIZE + outcome.len) as u32,
        outcome.error,
        req.unique,
    );
    ent.head[abi::IN_OUT_OFF..abi::IN_OUT_OFF + abi::OUT_HEADER_SIZE].copy_from_slice(&out);
    ent.head[abi::ENT_PAYLOAD_SZ..abi::ENT_PAYLOAD_SZ + 4]
        .copy_from_slice(&(outcome.len as u32).to_le_bytes());
    (commit_id, req.pid)
}

fn slot<'a>(buf: &'a mut [u8], outcome: &'a mut Outcome) -> Slot<'a> {
    let limit = buf.len();
    Slot {
        out: abi::Encoder::new(buf),
        limit,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQE bytes the kernel reads: opcode URING_CMD, fd, addr (iovecs), len 2, cmd_op,
    /// and `fuse_uring_cmd_req` at byte 48 (the SQE's command area).
    #[test]
    fn a_ring_command_has_the_kernels_layout() {
        let ent = Ent::new(8192);
        let e = command(7, abi::CMD_COMMIT_AND_FETCH, 3, 0xabcd, &ent, 9);
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute::<Entry128, [u8; 128]>(e) };
        let f = Fields(&raw);
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(f.u32(4), Some(7));
        assert_eq!(f.u64(16), Some(ent.iov.as_ptr() as u64));
        assert_eq!(f.u32(24), Some(2));
        assert_eq!(f.u32(8), Some(abi::CMD_COMMIT_AND_FETCH), "cmd_op");
        assert_eq!(f.u64(32), Some(9), "user_data");
        assert_eq!(f.u64(48 + 8), Some(0xabcd), "commit_id");
        assert_eq!(u16::from_le_bytes([raw[48 + 16], raw[48 + 17]]), 3, "qid");
    }
}
