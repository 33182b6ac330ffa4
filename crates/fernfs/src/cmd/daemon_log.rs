//! The mount daemon's logger: where fern-fuse's and the daemon's `log` records go once the
//! daemon's stderr is /dev/null. `-o log=PATH` appends to that file; otherwise syslog through
//! /dev/log (journald listens there too) when it exists; otherwise stderr (useful with `-f`).
//! Records at info and above are kept: mount, unmount, signals, and every error (a failed
//! sync, an unmount that could not be done). It owns the sinks and the line format only.

use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};

use super::image::CmdError;

/// Syslog's socket.
const DEV_LOG: &str = "/dev/log";

enum Sink {
    File(Mutex<File>),
    Syslog(UnixDatagram),
    Stderr,
}

struct DaemonLog {
    sink: Sink,
    pid: u32,
}

/// Installs the logger for this process: `file` if given, else syslog, else stderr. Returns
/// a description of where it logs (for the documentation's promise and for tests).
pub fn install(file: Option<&Path>) -> Result<String, CmdError> {
    let (sink, place) = match file {
        Some(p) => {
            let f = File::options()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| CmdError::new(format!("log file {}: {e}", p.display())))?;
            (Sink::File(Mutex::new(f)), p.display().to_string())
        }
        None => match UnixDatagram::unbound().and_then(|s| s.connect(DEV_LOG).map(|()| s)) {
            Ok(s) => (Sink::Syslog(s), "syslog".to_string()),
            Err(_) => (Sink::Stderr, "stderr".to_string()),
        },
    };
    let logger = DaemonLog {
        sink,
        pid: std::process::id(),
    };
    log::set_boxed_logger(Box::new(logger))
        .map_err(|e| CmdError::new(format!("installing the logger: {e}")))?;
    log::set_max_level(LevelFilter::Info);
    Ok(place)
}

impl Log for DaemonLog {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= Level::Info
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        // A logger must never fail its caller: write errors are dropped.
        match &self.sink {
            Sink::File(f) => {
                if let Ok(mut f) = f.lock() {
                    let _ = writeln!(
                        f,
                        "{} fernfs[{}] {}: {}",
                        super::utc::now(),
                        self.pid,
                        r.level(),
                        r.args()
                    );
                }
            }
            Sink::Syslog(s) => {
                // RFC 3164 as /dev/log takes it: <facility*8 + severity>; facility daemon (3).
                let sev = match r.level() {
                    Level::Error => 3,
                    Level::Warn => 4,
                    Level::Info => 6,
                    Level::Debug | Level::Trace => 7,
                };
                let msg = format!("<{}>fernfs[{}]: {}", 3 * 8 + sev, self.pid, r.args());
                let _ = s.send(msg.as_bytes());
            }
            Sink::Stderr => eprintln!("fernfs[{}] {}: {}", self.pid, r.level(), r.args()),
        }
    }

    fn flush(&self) {
        if let Sink::File(f) = &self.sink {
            if let Ok(mut f) = f.lock() {
                let _ = f.flush();
            }
        }
    }
}
