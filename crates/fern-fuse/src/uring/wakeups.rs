//! Where a requester wakes up (docs/fuse.md, "Wake-ups on the serving CPU"). A process that
//! makes one request at a time sleeps while its ring thread serves the request on its CPU;
//! the reply wakes it, and the scheduler, seeing that CPU busy with the ring thread that is
//! about to sleep, moves it to an idle CPU. On a virtual machine whose idle vCPUs halt, that
//! wake-up is an interrupt to a halted vCPU — 20 µs here, more than the request — and the
//! process's next request goes to the other CPU's queue, so it ping-pongs: measured, a
//! single-threaded chmod loop on an unpinned fernfs mount ran at 30 µs per call with 0.47
//! migrations per call, against 10 µs pinned. It happens as soon as a handler takes more than
//! about a microsecond (a null handler spinning 2 µs showed it too).
//!
//! The remedy: a ring thread that has nothing more to serve waits for its next request at
//! the `SCHED_IDLE` policy, so the CPU it runs on counts as idle when the reply wakes the
//! requester, which then stays there; the thread takes `SCHED_OTHER` back as soon as it has
//! a request. `SCHED_IDLE` loses to every other runnable task, so this is only safe on a CPU
//! nobody else wants: a ring thread that spent more than half the time since it last looked
//! runnable but not running (its own `/proc/thread-self/schedstat` run delay, read at most
//! every 2 ms) trips a guard that turns the idle waits off for a back-off that doubles while
//! it keeps tripping. `auto` (the default) turns
//! them on only for a second at a time, after a window of requests in which one requester's
//! consecutive requests came from different CPUs — the ping-pong itself; a pinned workload
//! never pays the two policy changes per wait. Owns the detection, the guard and the policy
//! calls; never serves requests.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When ring threads wait at the idle policy (`-o ring_wakeups=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WakeMode {
    /// While one requester's requests are seen moving between CPUs (the default).
    #[default]
    Auto,
    /// Always, but for the guard (tests and measurements).
    Always,
    /// Never.
    Off,
}

impl WakeMode {
    /// The option value.
    pub fn name(self) -> &'static str {
        match self {
            WakeMode::Auto => "auto",
            WakeMode::Always => "always",
            WakeMode::Off => "off",
        }
    }
}

impl FromStr for WakeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WakeMode::Auto),
            "always" => Ok(WakeMode::Always),
            "off" => Ok(WakeMode::Off),
            _ => Err(format!(
                "ring_wakeups must be auto, always or off, not {s:?}"
            )),
        }
    }
}

/// Requests per detection window.
const WINDOW: u64 = 64;
/// Migrations in a window that turn the idle waits on.
const MIGRATIONS_ON: u64 = WINDOW / 8;
/// How long they stay on before the next window decides again.
const ON_FOR: Duration = Duration::from_secs(1);
/// How often, at most, a ring thread that waits at the idle policy reads its run delay.
const CHECK_EVERY: Duration = Duration::from_millis(2);
/// First back-off after a trip, and the longest.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(64);

/// The shared state of one mount's rings (module docs).
#[derive(Debug)]
pub(crate) struct WakePlacement {
    mode: WakeMode,
    /// False when this process cannot leave `SCHED_IDLE` again (no `CAP_SYS_NICE` and a low
    /// `RLIMIT_NICE`) or has no schedstat to guard with: then never used.
    usable: bool,
    epoch: Instant,
    /// The last request seen: requester pid << 16 | queue.
    last: AtomicU64,
    /// This window's requests (low 32 bits) and migrations (high 32 bits).
    window: AtomicU64,
    /// Nanoseconds since `epoch` until which the idle waits are on (auto).
    on_until: AtomicU64,
    /// ... until which they stay off after a trip.
    off_until: AtomicU64,
    backoff_ns: AtomicU64,
    last_trip: AtomicU64,
    trips: AtomicU64,
}

impl WakePlacement {
    /// The placement for `mode`, checking once whether this process may use it.
    pub(crate) fn new(mode: WakeMode) -> Arc<WakePlacement> {
        let usable =
            mode != WakeMode::Off && idle_policy_is_reversible() && RunDelay::open().is_some();
        if mode != WakeMode::Off && !usable {
            log::info!(
                "ring wake-ups: off (this process cannot leave SCHED_IDLE again, or the \
                 kernel has no schedstat)"
            );
        }
        Arc::new(Self::with(mode, usable))
    }

    fn with(mode: WakeMode, usable: bool) -> WakePlacement {
        WakePlacement {
            mode,
            usable,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            window: AtomicU64::new(0),
            on_until: AtomicU64::new(0),
            off_until: AtomicU64::new(0),
            backoff_ns: AtomicU64::new(0),
            last_trip: AtomicU64::new(0),
            trips: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A request from `pid` arrived on queue `qid`.
    pub(crate) fn note(&self, pid: u32, qid: u16) {
        if self.mode == WakeMode::Auto && self.usable {
            self.note_at(pid, qid, self.now());
        }
    }

    fn note_at(&self, pid: u32, qid: u16, now: u64) {
        if pid == 0 {
            return; // the kernel's own (async releases, forgets): no requester to place
        }
        let key = (u64::from(pid) << 16) | u64::from(qid);
        let prev = self.last.swap(key, Ordering::Relaxed);
        let migrated = prev >> 16 == u64::from(pid) && prev != key;
        if self.on_until.load(Ordering::Relaxed) > now
            || self.off_until.load(Ordering::Relaxed) > now
        {
            return;
        }
        let add = 1 + (u64::from(migrated) << 32);
        let w = self.window.fetch_add(add, Ordering::Relaxed) + add;
        if w & 0xffff_ffff >= WINDOW {
            self.window.store(0, Ordering::Relaxed);
            if w >> 32 >= MIGRATIONS_ON {
                self.on_until
                    .store(now + ON_FOR.as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Whether a ring thread with nothing to serve should wait at the idle policy now.
    pub(crate) fn idle_wait_now(&self) -> bool {
        self.idle_wait_at(self.now())
    }

    fn idle_wait_at(&self, now: u64) -> bool {
        if !self.usable {
            return false;
        }
        match self.mode {
            WakeMode::Off => false,
            WakeMode::Always => self.off_until.load(Ordering::Relaxed) <= now,
            WakeMode::Auto => self.on_until.load(Ordering::Relaxed) > now,
        }
    }

    /// A ring thread was kept off its CPU (a stall, as `kept_off` judges): the idle waits go
    /// off for a back-off that doubles while stalls keep coming.
    fn stalled_at(&self, now: u64) {
        let last = self.last_trip.swap(now, Ordering::Relaxed);
        let prev = self.backoff_ns.load(Ordering::Relaxed);
        let backoff = if prev > 0 && now.saturating_sub(last) < 2 * prev {
            (2 * prev).min(BACKOFF_MAX.as_nanos() as u64)
        } else {
            BACKOFF_MIN.as_nanos() as u64
        };
        self.backoff_ns.store(backoff, Ordering::Relaxed);
        self.on_until.store(0, Ordering::Relaxed);
        self.off_until.store(now + backoff, Ordering::Relaxed);
        self.window.store(0, Ordering::Relaxed);
        if self.trips.fetch_add(1, Ordering::Relaxed) == 0 {
            log::info!(
                "ring wake-ups: a ring thread was kept from its CPU; idle waits off for {:?} \
                 (and longer while it repeats)",
                Duration::from_nanos(backoff)
            );
        }
    }

    /// The mode asked for.
    pub(crate) fn mode(&self) -> WakeMode {
        self.mode
    }

    /// Whether this process can use the idle waits at all.
    pub(crate) fn usable(&self) -> bool {
        self.usable
    }

    /// Times the guard tripped.
    pub(crate) fn trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }
}

/// One ring thread's side: its run-delay counter and the policy switches around a wait.
pub(crate) struct IdleWaits {
    placement: Arc<WakePlacement>,
    delay: Option<RunDelay>,
    /// When the run delay was last read, and what it was.
    checked: Cell<Option<(Instant, u64)>>,
}

/// Proof that [`IdleWaits::before`] switched the thread to `SCHED_IDLE`.
pub(crate) struct Wait(());

impl IdleWaits {
    /// For the calling ring thread (its schedstat is opened here: `thread-self`).
    pub(crate) fn new(placement: Arc<WakePlacement>) -> IdleWaits {
        let delay = placement.usable.then(RunDelay::open).flatten();
        IdleWaits {
            placement,
            delay,
            checked: Cell::new(None),
        }
    }

    /// A request from `pid` arrived on queue `qid`.
    pub(crate) fn note(&self, pid: u32, qid: u16) {
        self.placement.note(pid, qid);
    }

    /// Before a wait with nothing left to serve: switches to `SCHED_IDLE` if the idle waits
    /// are on.
    pub(crate) fn before(&self) -> Option<Wait> {
        if self.delay.is_none() || !self.placement.idle_wait_now() {
            return None;
        }
        set_policy(libc::SCHED_IDLE).ok().map(|()| Wait(()))
    }

    /// After the wait: back to `SCHED_OTHER` (before serving anything), then the guard — at
    /// most every [`CHECK_EVERY`], the share of the time since the last look that this thread
    /// spent runnable but not running.
    pub(crate) fn after(&self, w: Option<Wait>) {
        if w.is_none() {
            return;
        }
        if let Err(e) = set_policy(libc::SCHED_OTHER) {
            // The probe said it would work; if it does not, the thread must not stay idle.
            log::error!("ring wake-ups: cannot leave SCHED_IDLE: {e}");
        }
        let now = Instant::now();
        let last = self.checked.get();
        if last.is_some_and(|(at, _)| now.duration_since(at) < CHECK_EVERY) {
            return;
        }
        let Some(delay) = self.delay.as_ref().and_then(RunDelay::read) else {
            return;
        };
        self.checked.set(Some((now, delay)));
        if let Some((at, before)) = last {
            if kept_off(delay.saturating_sub(before), now.duration_since(at)) {
                self.placement.stalled_at(self.placement.now());
            }
        }
    }
}

/// Whether a thread that spent `delay` nanoseconds of `wall` runnable but not running was
/// kept from its CPU: more than half the time. Serving one requester it waits only while the
/// requester finishes blocking (a few percent); beside a busy task on its CPU, nearly always.
fn kept_off(delay: u64, wall: Duration) -> bool {
    u128::from(delay) * 2 > wall.as_nanos()
}

/// The calling thread's run delay (nanoseconds spent runnable but not running), from
/// `/proc/thread-self/schedstat`, opened by the thread it describes.
struct RunDelay(File);

impl RunDelay {
    fn open() -> Option<RunDelay> {
        let d = RunDelay(File::open("/proc/thread-self/schedstat").ok()?);
        d.read().map(|_| d)
    }

    fn read(&self) -> Option<u64> {
        let mut b = [0u8; 96];
        let n = self.0.read_at(&mut b, 0).ok()?;
        std::str::from_utf8(&b[..n])
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

/// Sets the calling thread's scheduling policy (priority 0).
#[allow(unsafe_code)]
fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads one `sched_param` through the pointer, which points at
    // a live value; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &p) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether a thread of this process can go to `SCHED_IDLE` and come back (tried on a
/// thread of its own, which ends either way: a thread that could not come back is gone).
fn idle_policy_is_reversible() -> bool {
    std::thread::spawn(|| {
        set_policy(libc::SCHED_IDLE).is_ok() && set_policy(libc::SCHED_OTHER).is_ok()
    })
    .join()
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_requester_that_stays_on_one_queue_never_turns_the_idle_waits_on() {
        let p = WakePlacement::with(WakeMode::Auto, true);
        for i in 0..10 * WINDOW {
            p.note_at(42, 0, i * 1000);
            assert!(!p.idle_wait_at(i * 1000));
        }
    }

    #[test]
    fn a_requester_moving_between_queues_turns_them_on_for_a_while() {
        let p = WakePlacement::with(WakeMode::Auto, true);
        for i in 0..WINDOW {
            p.note_at(42, (i % 2) as u16, i * 1000);
        }
        let t = WINDOW * 1000;
        assert!(p.idle_wait_at(t));
        assert!(!p.idle_wait_at(t + ON_FOR.as_nanos() as u64));
        // Several requesters taking turns are not one requester moving.
        let q = WakePlacement::with(WakeMode::Auto, true);
        for i in 0..WINDOW {
            q.note_at(100 + (i % 2) as u32, (i % 2) as u16, i * 1000);
        }
        assert!(!q.idle_wait_at(t));
        // Requests of the kernel's own (pid 0) neither count nor break a requester's run.
        let k = WakePlacement::with(WakeMode::Auto, true);
        for i in 0..2 * WINDOW {
            let pid = if i % 2 == 0 { 0 } else { 42 };
            k.note_at(pid, ((i / 2) % 2) as u16, i * 1000);
        }
        assert!(k.idle_wait_at(2 * t));
    }

    #[test]
    fn a_stall_turns_them_off_with_a_back_off_that_doubles_while_stalls_repeat() {
        let p = WakePlacement::with(WakeMode::Always, true);
        assert!(p.idle_wait_at(0));
        p.stalled_at(10 * MS);
        assert!(!p.idle_wait_at(10 * MS + 99 * MS));
        assert!(p.idle_wait_at(10 * MS + 100 * MS));
        p.stalled_at(150 * MS); // soon after: 200 ms
        assert!(!p.idle_wait_at(150 * MS + 199 * MS));
        assert!(p.idle_wait_at(150 * MS + 200 * MS));
        p.stalled_at(400 * MS); // again: 400 ms
        assert!(!p.idle_wait_at(400 * MS + 399 * MS));
        p.stalled_at(100_000 * MS); // long after: back to 100 ms
        assert!(p.idle_wait_at(100_100 * MS));
        assert_eq!(p.trips(), 4);
        // In auto mode a stall also ends the current period and holds detection off.
        let a = WakePlacement::with(WakeMode::Auto, true);
        for i in 0..WINDOW {
            a.note_at(42, (i % 2) as u16, i);
        }
        assert!(a.idle_wait_at(WINDOW));
        a.stalled_at(WINDOW);
        assert!(!a.idle_wait_at(WINDOW + 1));
        for i in 0..WINDOW {
            a.note_at(42, (i % 2) as u16, WINDOW + 2 + i);
        }
        assert!(!a.idle_wait_at(2 * WINDOW + 2));
    }

    #[test]
    fn a_thread_is_kept_off_when_it_waited_on_the_run_queue_most_of_the_time() {
        let ms = Duration::from_millis(1);
        assert!(!kept_off(100_000, 2 * ms)); // 5 %: a requester finishing its block
        assert!(!kept_off(MS, 2 * ms)); // exactly half
        assert!(kept_off(MS + 1, 2 * ms));
        assert!(kept_off(9 * MS, 10 * ms)); // beside a busy loop
        assert!(!kept_off(0, 60_000 * ms)); // an idle mount: asleep, not waiting
    }

    #[test]
    fn unusable_or_off_never_waits_idle() {
        for p in [
            WakePlacement::with(WakeMode::Always, false),
            WakePlacement::with(WakeMode::Off, true),
        ] {
            for i in 0..WINDOW {
                p.note_at(42, (i % 2) as u16, i);
            }
            assert!(!p.idle_wait_at(WINDOW));
        }
    }

    #[test]
    fn a_thread_goes_idle_and_comes_back_and_reads_its_run_delay() {
        std::thread::spawn(|| {
            assert!(RunDelay::open().and_then(|d| d.read()).is_some());
            // Root (CI, the mounts' tests) may always come back; others only with RLIMIT_NICE.
            if idle_policy_is_reversible() {
                set_policy(libc::SCHED_IDLE).unwrap();
                // SAFETY: sched_getscheduler only reads its pid argument.
                #[allow(unsafe_code)]
                let now = unsafe { libc::sched_getscheduler(0) };
                assert_eq!(now, libc::SCHED_IDLE);
                set_policy(libc::SCHED_OTHER).unwrap();
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [WakeMode::Auto, WakeMode::Always, WakeMode::Off] {
            assert_eq!(m.name().parse::<WakeMode>(), Ok(m));
        }
        assert!("sometimes".parse::<WakeMode>().is_err());
    }
}
