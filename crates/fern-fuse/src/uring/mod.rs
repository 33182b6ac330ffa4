//! FUSE over io_uring: the choice of transport ([`Transport`]), its negotiation in INIT and
//! what a mount ended up using ([`TransportStatus`]), and the per-CPU ring queues
//! ([`Rings`]) that serve requests next to fuser's `/dev/fuse` loops. Owns when the rings are
//! used and their lifetime; see docs/fuse.md, "Transports".

pub(crate) mod abi;
mod dispatch;
mod queue;
mod wakeups;

pub use wakeups::WakeMode;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use fuser::{InitFlags, KernelConfig};

use crate::handler::Handler;
use crate::mount::KernelMount;
use crate::options::MountOptions;

/// The module parameter root sets to let FUSE connections use io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// How requests travel between the kernel and the handlers (`-o transport=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// `Uring` where the kernel allows it, else `Dev`, quietly except for one log line
    /// with the reason (the default: docs/fuse.md, "Transports").
    #[default]
    Auto,
    /// read(2)/writev(2) on `/dev/fuse`.
    Dev,
    /// Per-CPU io_uring queues, falling back to `Dev` with a warning where the kernel does
    /// not allow them.
    Uring,
}

impl Transport {
    /// The option value.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Dev => "dev",
            Transport::Uring => "uring",
        }
    }
}

impl FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "dev" => Ok(Transport::Dev),
            "uring" => Ok(Transport::Uring),
            _ => Err(format!("transport must be auto, dev or uring, not {s:?}")),
        }
    }
}

/// Switches FUSE over io_uring on for the whole kernel (`-o enable_uring`, root only) if it
/// is off; returns whether this call switched it. A global setting: it stays on after the
/// mount ends and lets every FUSE server that asks for io_uring use it, which is why a
/// mount never does this unless told to (docs/fuse.md, "Transports").
pub fn switch_on_uring() -> io::Result<bool> {
    if uring_enabled().is_ok() {
        return Ok(false);
    }
    std::fs::write(ENABLE_URING, "1").map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("enable_uring: cannot switch on {ENABLE_URING}: {e}"),
        )
    })?;
    log::warn!(
        "switched on {ENABLE_URING} (enable_uring): FUSE over io_uring is now allowed for every \
         FUSE server on this machine until it is switched off or the fuse module reloaded"
    );
    Ok(true)
}

/// Whether this kernel lets a FUSE server use io_uring now: `Err` says why not.
pub fn uring_enabled() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if matches!(v.trim(), "Y" | "1") => Ok(()),
        Ok(_) => Err(format!("{ENABLE_URING} is off")),
        Err(e) => Err(format!(
            "{ENABLE_URING}: {e} (kernel without CONFIG_FUSE_IO_URING)"
        )),
    }
}

/// Which transport a mount asked for, which one it uses, and why not the one it asked for.
#[derive(Debug)]
pub struct TransportStatus {
    requested: Transport,
    negotiated: AtomicBool,
    active: AtomicBool,
    note: Mutex<Option<String>>,
    pub(crate) ring_requests: AtomicU64,
    /// The rings' wake-up placement, once they started (wakeups.rs).
    wakeups: Mutex<Option<Arc<wakeups::WakePlacement>>>,
}

impl TransportStatus {
    /// A mount asking for `requested`.
    pub fn new(requested: Transport) -> Arc<TransportStatus> {
        Arc::new(TransportStatus {
            requested,
            negotiated: AtomicBool::new(false),
            active: AtomicBool::new(false),
            note: Mutex::new(None),
            ring_requests: AtomicU64::new(0),
            wakeups: Mutex::new(None),
        })
    }

    fn fall_back(&self, why: String) {
        if self.requested == Transport::Uring {
            log::warn!("FUSE transport: uring asked for, using dev: {why}");
        } else {
            log::info!("FUSE transport: dev, as io_uring is not available: {why}");
        }
        if let Ok(mut n) = self.note.lock() {
            *n = Some(why);
        }
    }

    /// In INIT: asks for FUSE_OVER_IO_URING only if dev was not requested, the parameter is
    /// on, the kernel offers it and an io_uring can be created here — announcing it and then
    /// registering nothing would stall every request of the mount.
    pub(crate) fn negotiate(&self, config: &mut KernelConfig) {
        if self.requested == Transport::Dev {
            return;
        }
        if let Err(why) = uring_enabled() {
            return self.fall_back(why);
        }
        if !config
            .capabilities()
            .contains(InitFlags::FUSE_OVER_IO_URING)
        {
            return self.fall_back("the kernel does not offer FUSE_OVER_IO_URING".into());
        }
        if let Err(e) = queue::new_ring(2) {
            return self.fall_back(format!("io_uring_setup: {e}"));
        }
        if config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .is_ok()
        {
            self.negotiated.store(true, Ordering::Relaxed);
        }
    }

    /// The transport asked for.
    pub fn requested(&self) -> Transport {
        self.requested
    }

    /// The transport requests use: `Uring` once every queue has registered.
    pub fn active(&self) -> Transport {
        if self.active.load(Ordering::Relaxed) {
            Transport::Uring
        } else {
            Transport::Dev
        }
    }

    /// Requests served through the rings so far.
    pub fn ring_requests(&self) -> u64 {
        self.ring_requests.load(Ordering::Relaxed)
    }

    /// Why the mount does not use io_uring, if it asked for it (or for `auto`) and does not.
    pub fn note(&self) -> Option<String> {
        self.note.lock().ok().and_then(|n| n.clone())
    }

    /// The status as a JSON object (for `fernfs stat`).
    pub fn json(&self) -> String {
        let note = match self.note() {
            Some(n) => format!("\"{}\"", n.replace('\\', "\\\\").replace('"', "\\\"")),
            None => "null".into(),
        };
        let wakeups = match self.wakeups.lock().ok().and_then(|w| w.clone()) {
            Some(w) => format!(
                "{{\"mode\":\"{}\",\"usable\":{},\"stalls\":{}}}",
                w.mode().name(),
                w.usable(),
                w.trips()
            ),
            None => "null".into(),
        };
        format!(
            "{{\"requested\":\"{}\",\"active\":\"{}\",\"ring_requests\":{},\"ring_wakeups\":{wakeups},\"note\":{note}}}",
            self.requested.name(),
            self.active().name(),
            self.ring_requests()
        )
    }
}

/// The ring queue threads of one mount.
pub struct Rings {
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    /// Waits for the queue threads, which end when the kernel ends their entries (unmount).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The kernel's number of ring queues: one per possible CPU.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: usize = last
            .parse()
            .map_err(|_| io::Error::other(format!("cpu/possible: {s:?}")))?;
        max = max.max(n);
    }
    Ok(max + 1)
}

/// Starts the ring queues if INIT negotiated io_uring (otherwise returns no rings): one
/// thread per possible CPU on a dup of the session's `/dev/fuse` descriptor, each with a
/// payload buffer big enough for `max_write`. Returns once every queue has registered (then
/// the status says `uring`) or one was refused (then the kernel has gone back to /dev/fuse
/// and the status says why).
pub fn start<H: Handler>(
    dev: impl AsFd,
    handler: Arc<H>,
    max_write: u32,
    wake_mode: WakeMode,
    status: &Arc<TransportStatus>,
) -> io::Result<Option<Rings>> {
    if !status.negotiated.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let placement = wakeups::WakePlacement::new(wake_mode);
    if let Ok(mut w) = status.wakeups.lock() {
        *w = Some(placement.clone());
    }
    let dev: Arc<OwnedFd> = Arc::new(dev.as_fd().try_clone_to_owned()?);
    // The kernel's payload is max(8 KiB, max_write, max_pages pages); fuser asks for as many
    // pages as max_write (or max_readahead) needs, and the kernel caps them at 256.
    let payload = (max_write as usize).next_multiple_of(4096).max(1 << 20);
    let n = possible_cpus()?;
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::with_capacity(n);
    for qid in 0..n {
        let (dev, h, st, tx) = (dev.clone(), handler.clone(), status.clone(), tx.clone());
        let placement = placement.clone();
        let qid16 = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
        threads.push(
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || queue::serve(qid16, dev, h, payload, st, placement, tx))?,
        );
    }
    drop(tx);
    let mut refused = None;
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => refused = Some(e),
            Err(_) => refused = Some(io::Error::other("a ring queue thread ended")),
        }
    }
    match refused {
        None => {
            status.active.store(true, Ordering::Relaxed);
            log::info!(
                "FUSE transport: uring ({n} queues x {} entries)",
                queue::DEPTH
            );
        }
        Some(e) => status.fall_back(format!("ring registration refused: {e}")),
    }
    Ok(Some(Rings { threads }))
}

/// A mounted session of `handler` with the transport asked for: our own kernel mount
/// (`KernelMount`, so nothing but that mount is ever unmounted), fuser's session on its
/// `/dev/fuse` descriptor running the INIT handshake (negotiating io_uring when asked and
/// allowed), then the ring queues. Run the session (`run`/`spawn`), unmount with
/// `kernel.unmount`, then join the rings.
pub struct Mount<H: Handler> {
    /// fuser's session: the `/dev/fuse` loops.
    pub session: fuser::Session<crate::Classic<H>>,
    /// The ring queues, if the rings are in use.
    pub rings: Option<Rings>,
    /// What transport the mount uses.
    pub status: Arc<TransportStatus>,
    /// The kernel mount: the only thing that unmounts it.
    pub kernel: KernelMount,
}

impl<H: Handler> Mount<H> {
    /// Mounts `handler` at `mountpoint` with `opts` (the handler must ask for `opts.max_write`
    /// in INIT: it sizes the ring buffers). If the handshake or the rings fail, our mount is
    /// detached again.
    pub fn new(
        handler: H,
        mountpoint: &std::path::Path,
        opts: &MountOptions,
        status: Arc<TransportStatus>,
    ) -> io::Result<Mount<H>> {
        if opts.enable_uring {
            switch_on_uring()?;
        }
        let (fd, kernel) = KernelMount::mount(mountpoint, opts)?;
        let mut handler = handler;
        match fd.try_clone() {
            Ok(dup) => handler.set_notifier(crate::notify::Notifier::new(dup)),
            Err(e) => {
                let _ = kernel.unmount(true);
                return Err(e);
            }
        }
        let config = opts.fuser_config();
        let acl = config.acl;
        let (classic, published) = crate::Classic::new(handler, status.clone());
        let started = fuser::Session::from_fd(classic, fd, acl, config).and_then(|session| {
            let rings = match published.get() {
                Some(h) => start(
                    &session,
                    h.clone(),
                    opts.max_write,
                    opts.ring_wakeups,
                    &status,
                )?,
                None => None,
            };
            Ok((session, rings))
        });
        let (session, rings) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = kernel.unmount(true);
                return Err(e);
            }
        };
        // After the handshake: the INIT reply may only lower the kernel's read-ahead.
        kernel.set_read_ahead(opts.read_ahead);
        let line = format!(
            "FUSE transport of {}: {}",
            mountpoint.display(),
            status.json()
        );
        log::info!("{line}");
        if status.requested() == Transport::Uring
            || (status.requested() == Transport::Auto && status.active() == Transport::Dev)
        {
            // Also on stderr, where a foreground mount (`fernfs mount -f`) says everything
            // else, when the mount does not use the rings it asked or hoped for: the reason
            // is in the line (a background mount's log has it, and `fernfs stat`).
            eprintln!("{line}");
        }
        Ok(Mount {
            session,
            rings,
            status,
            kernel,
        })
    }
}

/// `stats` with the mount's transport added as `"transport": {...}` to its JSON object, so
/// `fernfs stat MOUNTPOINT` shows it.
pub fn stats_with_transport(
    stats: crate::StatsSource,
    status: Arc<TransportStatus>,
) -> crate::StatsSource {
    crate::StatsSource::new(move || {
        let t = format!("\"transport\":{}", status.json());
        match stats.get() {
            Some(v) if v.first() == Some(&b'{') => {
                let rest = &v[1..];
                let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
                let mut out = format!("{{{t}").into_bytes();
                if !empty {
                    out.push(b',');
                }
                out.extend_from_slice(rest);
                out
            }
            _ => format!("{{{t}}}").into_bytes(),
        }
    })
}
