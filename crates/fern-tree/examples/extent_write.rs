//! F7's write through the engine alone: `MiB` MiB (default 256) of incompressible data in
//! 1 MiB writes into an image file, then a sync, a checkpoint and a close, written either as
//! data extents (one per write) or as 4 KiB rows (today's fern-fs data rows, puts). Prints the
//! load-insensitive measures: bytes the device received per byte of data (write
//! amplification), and the process's CPU time (user + system) per MiB.
//!
//! `cargo run -p fern-tree --release --example extent_write -- [extents|rows] [MiB] [dir]`

use std::time::Duration;

use fern_tree::{Env, Options, WriteBatch};

fn cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    #[allow(unsafe_code)]
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let extents = args.get(1).is_none_or(|m| m != "rows");
    let mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let dir = args.get(3).cloned().unwrap_or_else(|| "/tmp".into());
    let path = std::path::Path::new(&dir).join(format!("extent_write-{}.img", std::process::id()));
    let env = Env::create(&path, Options::default()).expect("create");
    let t = env.tree("data").expect("tree");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut chunk = || -> Vec<u8> {
        (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let data: Vec<Vec<u8>> = (0..mib).map(|_| chunk()).collect();
    let (before, cpu0) = (env.stats().device.bytes_written, cpu());
    for (i, d) in data.into_iter().enumerate() {
        let mut b = WriteBatch::new();
        if extents {
            b.insert_extent(&t, &(i as u64).to_be_bytes(), &[], d);
        } else {
            for (j, block) in d.chunks(4096).enumerate() {
                b.insert(&t, &((i * 256 + j) as u64).to_be_bytes(), block);
            }
        }
        env.write(b).expect("write");
    }
    env.sync().expect("sync");
    let at_sync = env.stats().device.bytes_written - before;
    env.checkpoint().expect("checkpoint");
    let written = env.stats().device.bytes_written - before;
    let used = cpu() - cpu0;
    drop(t);
    env.close().expect("close");
    let _ = std::fs::remove_file(&path);
    let total = (mib << 20) as f64;
    println!(
        "{}: {mib} MiB; device bytes per data byte {:.3} at the sync, {:.3} after a checkpoint; \
         CPU {:.1} ms per MiB",
        if extents { "extents" } else { "4 KiB rows" },
        at_sync as f64 / total,
        written as f64 / total,
        used.as_secs_f64() * 1000.0 / mib as f64
    );
}
