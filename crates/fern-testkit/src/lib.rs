//! What a test may need from the machine, and the one rule for a test that cannot run here.
//!
//! A test that needs root, `/dev/fuse`, an external program or a server calls [`skipped`] with
//! its requirement and the result of checking it. On a developer's machine without that
//! requirement the test prints `SKIPPED: …` and returns. Where the requirement is declared
//! present — CI exports `FERN_REQUIRE_FUSE=1`, `FERN_REQUIRE_TOOLS=1` and `FERN_REQUIRE_ETCD=1`
//! after installing what they stand for — the same situation is a failure, so a test that should
//! have run can never be counted as passed. Every skip is also appended to the file named by
//! `FERN_SKIP_LOG`, which is how `scripts/test` counts skips apart from passes.
#![deny(unsafe_code)]

use std::fmt::Display;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A requirement a test can have of the machine; each maps to the variable that declares it
/// present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Root and `/dev/fuse` (real mounts, loop devices, other users' credentials).
    Fuse,
    /// External programs and kernel features the harness drives (fio, fs_mark, postmark, git,
    /// the cgroup v1 memory controller).
    Tools,
    /// An `etcd` server binary to start on loopback.
    Etcd,
}

impl Need {
    /// The environment variable that, set to `1`, turns a skip into a failure.
    pub fn variable(self) -> &'static str {
        match self {
            Need::Fuse => "FERN_REQUIRE_FUSE",
            Need::Tools => "FERN_REQUIRE_TOOLS",
            Need::Etcd => "FERN_REQUIRE_ETCD",
        }
    }

    /// Whether this run declared the requirement present.
    pub fn required(self) -> bool {
        std::env::var(self.variable()).is_ok_and(|v| v == "1")
    }
}

/// `true` when the test must return now because `check` failed and the requirement is optional
/// here; panics (fails the test) when `check` failed and the run requires `need`.
///
/// ```ignore
/// if fern_testkit::skipped(Need::Fuse, fern_testkit::fuse_available()) {
///     return;
/// }
/// ```
pub fn skipped<E: Display>(need: Need, check: Result<(), E>) -> bool {
    let Err(why) = check else {
        return false;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    if need.required() {
        panic!(
            "{test} cannot run: {why}, but {}=1 says this machine must run it",
            need.variable()
        );
    }
    eprintln!("SKIPPED: {test}: {why}");
    if let Ok(log) = std::env::var("FERN_SKIP_LOG") {
        // One line per skip; appends of one short line from concurrent tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
    true
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // Effective uid from /proc avoids a libc dependency; a missing /proc means "not root" here.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Whether a real FUSE mount can be made: `/dev/fuse` exists, and we are root or have
/// `fusermount3`.
pub fn fuse_available() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is absent".into());
    }
    if !is_root() && !program_available("fusermount3", &["-V"]) {
        return Err("not root and no fusermount3 (apt-get install fuse3)".into());
    }
    Ok(())
}

/// Like [`fuse_available`], and root as well (tests acting as other users, loop devices).
pub fn fuse_as_root() -> Result<(), String> {
    fuse_available()?;
    if !is_root() {
        return Err("needs root".into());
    }
    Ok(())
}

/// Whether `program` runs (with `args`, which should make it exit quickly).
pub fn program_available(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `Ok` when every program in `programs` runs with `--version`, else which ones are missing.
pub fn programs(programs: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| !program_available(p, &["--version"]))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("missing: {}", missing.join(", ")))
    }
}

/// `n` bytes of xorshift64 (shifts 13, 7, 17; the low byte of each state) starting after
/// `state`, which advances: incompressible data, so compression does not hide the volume, that
/// a test regenerates from its seed.
pub fn noise(state: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state as u8
        })
        .collect()
}

/// The seeds a seeded test runs, from its environment variables: `one` (a single seed, to
/// replay a failure), else `count` seeds (default `default_count`) from `base` (default 0).
/// A value that is not a number fails the test, naming the variable.
pub fn seeds_from_env(one: &str, count: &str, base: &str, default_count: u64) -> Vec<u64> {
    let var = |name: &str| {
        std::env::var(name).ok().map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("{name}={s:?} is not a number"))
        })
    };
    if let Some(s) = var(one) {
        return vec![s];
    }
    let n = var(count).unwrap_or(default_count);
    let b = var(base).unwrap_or(0);
    (b..b.saturating_add(n)).collect()
}

/// splitmix64: the seeded generator of the crash and fault tests. A failing seed must replay
/// exactly, so its sequence never changes with a dependency's version; one copy serves every
/// test that draws from it.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `state` (tests derive it from their seed as they always did,
    /// so documented seeds keep their runs).
    pub fn from_state(state: u64) -> Self {
        SplitMix64(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `[0, n)` by remainder (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One element of `v`, or `None` when it is empty.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len() as u64) as usize])
        }
    }
}

/// A loop device over a sparse backing file, detached when dropped (root and losetup).
pub struct LoopDevice(std::path::PathBuf);

impl LoopDevice {
    /// Makes `backing` a sparse file of `size` bytes and attaches it (`losetup --find --show`).
    /// Panics when that fails: callers checked [`fuse_as_root`] and `losetup` first.
    pub fn new(backing: &Path, size: u64) -> LoopDevice {
        std::fs::File::create(backing)
            .and_then(|f| f.set_len(size))
            .expect("backing file");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect("run losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().into())
    }

    /// The device node, e.g. `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).output();
    }
}

/// Stops a hung mount test: unless it is dropped within `limit`, a thread detaches
/// `mountpoint` with `detach` and aborts the process (a stalled mount would hang the run
/// forever, and a test thread blocked in the kernel cannot be stopped another way).
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn new(mountpoint: &Path, limit: Duration, detach: fn(&Path)) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let (d, mp) = (done.clone(), mountpoint.to_path_buf());
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < limit {
                if d.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("watchdog: test hung; detaching {}", mp.display());
            detach(&mp);
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passing_check_never_skips() {
        assert!(!skipped::<String>(Need::Tools, Ok(())));
    }

    #[test]
    fn splitmix64_keeps_its_sequence() {
        // The first outputs of splitmix64 from state 0 (the reference sequence): a change
        // here would silently move every documented crash seed to another run.
        let mut r = SplitMix64::from_state(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn a_missing_program_is_reported_by_name() {
        let err = programs(&["sh", "fern-no-such-program"]).unwrap_err();
        assert_eq!(err, "missing: fern-no-such-program");
    }
}
