//! Ctrl-C for the long commands (import, export, bench): SIGINT, SIGTERM and SIGHUP become a
//! flag that the work loop polls, so it stops at a clean point, removes or names what it left
//! half done, and says what was and was not done. The signals are blocked in every thread and
//! taken by one waiting thread (no handler, no unsafe; why not signal-hook: main.rs). Child
//! processes start with an empty mask (std resets it), so they still die of the terminal's
//! Ctrl-C.
//! It owns the flag only; what "clean up" means is each command's.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use nix::sys::signal::{SigSet, Signal};

use super::image::CmdError;

/// Set once a stop signal arrived.
#[derive(Clone)]
pub struct Interrupt(Arc<AtomicI32>);

impl Interrupt {
    /// Blocks the stop signals in the calling thread (and so in every thread it starts
    /// later: call it before opening an image) and starts the thread that waits for them.
    pub fn install() -> Result<Interrupt, CmdError> {
        Self::install_with(|_| {})
    }

    /// [`Interrupt::install`], and `on_signal` runs on the waiting thread once the flag is
    /// set (a command whose work loop cannot poll — a child process doing the work — cleans
    /// up there, and may end the process).
    pub fn install_with(
        on_signal: impl FnOnce(i32) + Send + 'static,
    ) -> Result<Interrupt, CmdError> {
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        set.thread_block()
            .map_err(|e| CmdError::new(format!("blocking SIGINT: {e}")))?;
        let flag = Arc::new(AtomicI32::new(0));
        let f = flag.clone();
        std::thread::Builder::new()
            .name("fernfs-interrupt".into())
            .spawn(move || {
                if let Ok(sig) = set.wait() {
                    f.store(sig as i32, Ordering::SeqCst);
                    on_signal(sig as i32);
                }
            })
            .map_err(|e| CmdError::new(format!("starting the signal thread: {e}")))?;
        Ok(Interrupt(flag))
    }

    /// The signal that asked us to stop, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// `Err` naming the signal once one arrived: the `?` of a work loop.
    pub fn check(&self) -> Result<(), CmdError> {
        match self.signal() {
            None => Ok(()),
            Some(s) => Err(CmdError::new(format!("interrupted by signal {s}"))),
        }
    }
}

/// Kills (SIGKILL) every child process of this process, found by their parent pid in
/// /proc/PID/stat; returns how many. Only `bench` starts children it must kill.
#[cfg(feature = "bench")]
pub fn kill_children() -> usize {
    let me = std::process::id().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `PID (comm) STATE PPID ...`; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if ppid == Some(me.as_str())
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            n += 1;
        }
    }
    n
}
