//! Where the space of a small device goes (issue 11, defect 3; BENCHMARKS.md "Space on a small
//! device"): small files (200 B to 64 KiB, log-uniform: the F1/postmark mix) written through
//! the file-system library onto a fixed-size device, as `fernfs mkfs` would format it, until
//! the first ENOSPC; optionally "killed" every N files (the device is copied as a kill -9
//! leaves it: every write the process made, nothing more, and the next round opens the copy,
//! which runs recovery) and with a share of the files deleted as they go.
//!
//! `cargo run --release -p fernfs --example space -- [--mib 256] [--kill-every N]
//!  [--delete-percent P] [--node-kib K] [--cache-mib C] [--seed S] [--text 0|1]`
//!
//! Prints, at every kill and at the end: live file data, the block file's referenced bytes
//! (tree nodes and the log region), allocated, pending release, free, the engine's room and
//! statfs figures, so the difference between data and device is accounted for.

use std::sync::Arc;

use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, MkfsOptions};
use fern_kv_tree::TreeStore;
use fern_tree::device::{BlockDevice, LimitedDevice, MemDevice};
use fern_tree::Options;

struct Args {
    mib: u64,
    kill_every: u64,
    delete_percent: u64,
    node_kib: usize,
    cache_mib: usize,
    seed: u64,
    text: bool,
}

fn args() -> Args {
    let mut a = Args {
        mib: 256,
        kill_every: 0,
        delete_percent: 0,
        node_kib: 1024,
        cache_mib: 128,
        seed: 1,
        text: false,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for pair in v.chunks(2) {
        let n: u64 = pair.get(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: space [--mib N] [--kill-every N] [--delete-percent P] [--node-kib K] [--cache-mib C] [--seed S]");
            std::process::exit(2)
        });
        match pair[0].as_str() {
            "--mib" => a.mib = n,
            "--kill-every" => a.kill_every = n,
            "--delete-percent" => a.delete_percent = n,
            "--node-kib" => a.node_kib = n as usize,
            "--cache-mib" => a.cache_mib = n as usize,
            "--seed" => a.seed = n,
            "--text" => a.text = n != 0,
            other => {
                eprintln!("unknown option {other}");
                std::process::exit(2)
            }
        }
    }
    a
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// 200 B to 64 KiB, log-uniform.
    fn size(&mut self) -> usize {
        let lo = (200f64).ln();
        let hi = ((64 << 10) as f64).ln();
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (lo + u * (hi - lo)).exp() as usize
    }
}

/// File contents: random bytes (incompressible, so compression hides nothing: the worst
/// case), or with `--text 1` text-like words (about 2x with lz4).
fn content(rng: &mut Rng, n: usize, text: bool) -> Vec<u8> {
    if !text {
        return (0..n).map(|_| rng.next() as u8).collect();
    }
    const WORDS: [&str; 16] = [
        "the ", "space ", "of ", "a ", "small ", "device ", "goes ", "where ", "fn ", "let ",
        "mut ", "struct ", "impl ", "0x3f2a ", "return ", "\n",
    ];
    let mut out = Vec::with_capacity(n + 16);
    while out.len() < n {
        let r = rng.next();
        out.extend_from_slice(WORDS[(r % 16) as usize].as_bytes());
        if r.is_multiple_of(7) {
            out.extend_from_slice(format!("{:x}", r >> 40).as_bytes());
        }
    }
    out.truncate(n);
    out
}

fn options(a: &Args) -> Options {
    let size = a.mib << 20;
    Options {
        cache_bytes: a.cache_mib << 20,
        node_bytes: a.node_kib << 10,
        capacity: Some(size),
        // As `fernfs mkfs` sizes it (a sixteenth, 1 MiB to 256 MiB).
        log_bytes: (size / 16 / (1 << 20) * (1 << 20)).clamp(1 << 20, 256 << 20),
        ..Options::default()
    }
}

fn report(what: &str, store: &TreeStore, fs: &Fs, live: u64, files: u64) {
    let env = store.env();
    let s = env.stats();
    let sp = env.space();
    let st = fs.statfs().ok();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let backlog = s_backlog(env);
    println!(
        "{what}: files {files}, live data {:.1} MiB | referenced {:.1} MiB (log region incl.), \
         allocated {:.1}, pending release {:.1}, free holes {:.1}, file end {:.1} | \
         buffered messages {:.1} MiB | space: used {:.1}, available {:.1}, reserve {:.1} | \
         df: size {:.1}, avail {:.1}",
        mib(live),
        mib(s.file.referenced_bytes),
        mib(s.file.allocated_bytes),
        mib(s.file.pending_free_bytes),
        mib(s.file.free_bytes),
        mib(s.file.allocated_bytes + s.file.free_bytes + 8192),
        mib(backlog),
        mib(sp.used),
        mib(sp.available),
        mib(sp.reserve),
        st.map_or(0.0, |st| mib(st.blocks * u64::from(st.bsize))),
        st.map_or(0.0, |st| mib(st.bavail * u64::from(st.bsize))),
    );
}

fn s_backlog(env: &fern_tree::Env) -> u64 {
    env.backlog().map_or(0, |b| b.bytes)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let size = a.mib << 20;
    let mut mem = Arc::new(MemDevice::new());
    let dev: Arc<dyn BlockDevice> = Arc::new(LimitedDevice::new(mem.clone(), size));
    let store = TreeStore::create_on_with(dev, options(&a), fern_fs::registry())?;
    Fs::mkfs(&store, MkfsOptions::default())?;
    store.close()?;
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut live_files: Vec<(u64, u64)> = Vec::new(); // (id, bytes)
    let mut live = 0u64;
    let mut next = 0u64;
    let mut kills = 0;
    println!(
        "device {} MiB, node {} KiB, cache {} MiB, kill every {} files, delete {} %, seed {}",
        a.mib, a.node_kib, a.cache_mib, a.kill_every, a.delete_percent, a.seed
    );
    loop {
        let dev: Arc<dyn BlockDevice> = Arc::new(LimitedDevice::new(mem.clone(), size));
        let store = Arc::new(TreeStore::open_on_with(
            dev,
            options(&a),
            fern_fs::registry(),
        )?);
        let fs = Arc::new(Fs::mount(store.clone())?);
        let p = PathFs::new(fs.clone(), Cred::root());
        let round_start = next;
        let full = loop {
            if a.kill_every > 0 && next - round_start >= a.kill_every {
                break false;
            }
            let n = rng.size();
            let body = content(&mut rng, n, a.text);
            let dir = format!("/d{}", next / 1000);
            if next.is_multiple_of(1000) {
                match p.mkdir(dir.as_bytes(), 0o755) {
                    Ok(_) | Err(fern_fs::FsError::Exists) => {}
                    Err(e) if e.errno() == libc::ENOSPC => break true,
                    Err(e) => return Err(e.into()),
                }
            }
            let name = format!("{dir}/f{next}");
            let r = p
                .open(name.as_bytes(), OpenOptions::create_write(0o644))
                .and_then(|f| {
                    let w = p.write_at(&f, 0, &body);
                    let c = p.close(f);
                    w.and(c)
                });
            match r {
                Ok(()) => {
                    live += n as u64;
                    live_files.push((next, n as u64));
                    next += 1;
                }
                Err(e) if e.errno() == libc::ENOSPC => {
                    let _ = p.unlink(name.as_bytes());
                    break true;
                }
                Err(e) => return Err(e.into()),
            }
            if a.delete_percent > 0 && rng.next() % 100 < a.delete_percent && !live_files.is_empty()
            {
                let k = (rng.next() % live_files.len() as u64) as usize;
                let (id, bytes) = live_files.swap_remove(k);
                p.unlink(format!("/d{}/f{id}", id / 1000).as_bytes())?;
                live -= bytes;
            }
        };
        if full {
            report("ENOSPC", &store, &fs, live, live_files.len() as u64);
            drop(p);
            drop(fs);
            Arc::try_unwrap(store)
                .map_err(|_| "store still shared")?
                .close()?;
            let dev: Arc<dyn BlockDevice> = Arc::new(LimitedDevice::new(mem.clone(), size));
            let store = TreeStore::open_on_with(dev, options(&a), fern_fs::registry())?;
            let fs = Fs::mount(Arc::new(store))?;
            let st = fs.statfs()?;
            println!(
                "after close and reopen: df avail {:.1} MiB; kills {kills}",
                (st.bavail * u64::from(st.bsize)) as f64 / (1 << 20) as f64
            );
            println!(
                "RESULT: {:.1} MiB of file data in {} files on a {} MiB device",
                live as f64 / (1 << 20) as f64,
                live_files.len(),
                a.mib
            );
            return Ok(());
        }
        // kill -9 right after an fsync (so the list of live files is exact): what the
        // process wrote is on the device; nothing is closed, no checkpoint is taken.
        fern_kv::KvStore::sync(&*store)?;
        report("kill", &store, &fs, live, live_files.len() as u64);
        let image = mem.snapshot();
        // The old handles close on the old device, which is dropped: only the copy goes on.
        drop(p);
        drop(fs);
        drop(store);
        mem = Arc::new(MemDevice::from_bytes(image));
        kills += 1;
    }
}
