//! `fernfs`: the command-line tool of fernfs.
//!
//! Each subcommand lives in its own module under `cmd/` (`mkfs`, `mount`, `umount`, `fsck`,
//! `stat`, `import`/`export`, `bench`). This file only parses the command line and dispatches;
//! results go to stdout, progress and diagnostics to stderr.
//!
//! Hand-written where a crate was weighed and not taken (issue 17):
//! - the stop-signal thread (`cmd/interrupt.rs`) blocks SIGINT/SIGTERM/SIGHUP and takes them
//!   with `sigwait` through nix: no handler, no `unsafe`, about 20 lines. signal-hook would
//!   install handlers with a self-pipe and still need the thread and the flag, so it would be
//!   neither smaller nor safer; and a blocked mask, unlike a handler, is inherited by the
//!   engine's threads, which must never take these signals.
//! - sizes (`--size 64M`, `cache_size=256M`) are fern-fuse's `parse_size`, ten lines with the
//!   one syntax both accept (binary K/M/G/T, no fractions); a size crate would accept more
//!   spellings than the documented ones and shrink nothing.
#![deny(unsafe_code)]

mod cmd;
mod memory;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// fernfs: a write-optimized file system on a Bε-tree.
#[derive(Debug, Parser)]
#[command(name = "fernfs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks of docs/workloads.md, side by side with peers.
    #[cfg(feature = "bench")]
    Bench(cmd::bench::BenchArgs),
    /// Make a new file system in an image file.
    Mkfs(cmd::mkfs::MkfsArgs),
    /// Mount an image (a daemon by default; returns when the mount is ready).
    Mount(cmd::mount::MountArgs),
    /// Unmount, and wait until the image is closed.
    Umount(cmd::mount::UmountArgs),
    /// Check (and with --repair, repair) an unmounted image; exit codes as fsck(8).
    Fsck(cmd::fsck::FsckArgs),
    /// Files, logical bytes and space used of an image or a mounted image.
    Stat(cmd::stat::StatArgs),
    /// Copy a host directory into an unmounted image (IMAGE[:/path]).
    Import(cmd::transfer::ImportArgs),
    /// Copy a tree out of an unmounted image (IMAGE[:/path]) into a host directory.
    Export(cmd::transfer::ExportArgs),
}

/// The binary's allocator is jemalloc. Node buffers, basements, message buffers and extent
/// data are allocated and freed by the megabyte all the time; glibc either keeps freed ones in a
/// fragmented heap (resident memory 1.25-1.65x the cache bound with its default, rising mmap
/// threshold) or, with the threshold fixed at 64 KiB, hands each one back to the kernel and
/// faults in fresh zeroed pages for the next (a sixth of E1's CPU, 40 % of the root drain's
/// in postmark). jemalloc reuses freed pages and returns them after a second of disuse
/// (docs/BENCHMARKS.md, "The binary on jemalloc": E1 CPU -17 %, postmark daemon CPU -19 %, peak
/// resident memory of E1 at the glibc figure).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start: one arena (2-core machines; the request and engine
/// threads keep their own caches in front of it, and more arenas only hold more idle pages) and
/// freed pages returned after 1 s instead of 10 s. `_RJEM_MALLOC_CONF` overrides them.
#[allow(unsafe_code)]
// jemalloc reads this symbol by name; nothing else can set its options
// SAFETY: a thin pointer to a NUL-terminated static string, which is what jemalloc reads.
#[cfg(not(feature = "system-alloc"))]
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_CONF: &u8 = &b"narenas:1,dirty_decay_ms:1000\0"[0];

/// The C libraries linked in (zstd's contexts) still use glibc's malloc: large blocks go to
/// mmap at a fixed threshold so that freed ones do not stay in a fragmented heap (glibc's
/// default raises the threshold after the first large free).
#[allow(unsafe_code)] // the one FFI call of the binary; no safe wrapper exists
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

fn main() -> ExitCode {
    fix_mmap_threshold();
    // Run as mount(8)'s helper: called as mount.fernfs / mount.fuse.fernfs, or as
    // `fernfs SOURCE MOUNTPOINT -o OPTIONS` (how fuse3's mount.fuse runs a fuse.TYPE program).
    let cli = <Cli as clap::CommandFactory>::command();
    let mut names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
    names.push("help");
    if let Some(code) = cmd::mount::helper_main(&names) {
        return code;
    }
    let cli = Cli::parse();
    let ok = |()| ExitCode::SUCCESS;
    let result: Result<ExitCode, cmd::image::CmdError> = match cli.command {
        #[cfg(feature = "bench")]
        Command::Bench(args) => cmd::bench::run(args).map(ok).map_err(Into::into),
        Command::Mkfs(args) => cmd::mkfs::run(args).map(ok),
        Command::Mount(args) => cmd::mount::run(args).map(ok),
        Command::Umount(args) => cmd::mount::umount(args).map(ok),
        Command::Fsck(args) => cmd::fsck::run(args),
        Command::Stat(args) => cmd::stat::run(args).map(ok),
        Command::Import(args) => cmd::transfer::import(args).map(ok),
        Command::Export(args) => cmd::transfer::export(args).map(ok),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fernfs: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[cfg(feature = "bench")]
    #[test]
    fn bench_engine_parses_lists() {
        let cli = Cli::try_parse_from([
            "fernfs",
            "bench",
            "engine",
            "--quick",
            "--workloads",
            "E1,E3",
            "--systems",
            "fern-tree",
            "--reps",
            "2",
            "--json",
            "out.json",
        ])
        .unwrap();
        let Command::Bench(b) = cli.command else {
            panic!("expected bench")
        };
        let cmd::bench::BenchCommand::Engine(e) = b.command else {
            panic!("expected engine")
        };
        assert!(e.quick);
        assert_eq!(e.workloads, vec!["E1", "E3"]);
        assert_eq!(e.systems, vec!["fern-tree"]);
        assert_eq!(e.run.reps, Some(2));
        assert_eq!(e.run.json, Some(std::path::PathBuf::from("out.json")));
    }
}
