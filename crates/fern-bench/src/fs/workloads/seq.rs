//! F7: sequential write and cold read of one large file.

use super::*;

/// Fills `buf` with chunk `k` of F7's file (pseudo-random: no file system can compress it).
pub(super) fn seq_chunk(seed: u64, k: u64, buf: &mut [u8]) {
    let mut rng = Rng::new(seed ^ 0xF7F7 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for c in buf.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

/// F7: one file written sequentially in 1 MiB writes + fsync, then (cold) read sequentially
/// in 1 MiB reads. Only the pwrite/fsync and pread calls are timed: generating and checking
/// the data runs between them, outside the clock. Where the target can count what reached its
/// device ([`FsTarget::device_bytes_written`]), the write's amplification is a third figure:
/// those bytes over the writes and their fsync, divided by the file's size.
pub(super) fn seq(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    let bytes = spec.sizes.f7_file_bytes;
    let chunks = bytes.div_ceil(CHUNK as u64);
    let mut buf = vec![0u8; CHUNK];
    let f = t.open("big", true)?;
    let device_before = t.device_bytes_written()?;
    let mut timed = std::time::Duration::ZERO;
    let res = (|| {
        for k in 0..chunks {
            let len = (bytes - k * CHUNK as u64).min(CHUNK as u64) as usize;
            seq_chunk(spec.seed, k, &mut buf[..len]);
            let start = Instant::now();
            t.pwrite(f, k * CHUNK as u64, &buf[..len])?;
            timed += start.elapsed();
        }
        let start = Instant::now();
        t.fsync(f)?;
        timed += start.elapsed();
        Ok::<(), BenchError>(())
    })();
    let closed = t.close(f);
    res?;
    closed?;
    out.records
        .push(f7(spec, bytes, timed, "1 MiB writes + fsync", 0));
    if let (Some(before), Some(after)) = (device_before, t.device_bytes_written()?) {
        let mut r = record(
            spec,
            FsWorkload::F7,
            after.saturating_sub(before) as f64 / bytes as f64,
            "x bytes written",
        );
        r.metric = Some(format!(
            "{} MiB, write amplification (to the device, through the fsync)",
            bytes >> 20
        ));
        out.records.push(r);
    }

    cold(spec, t, out)?;
    let f = t.open("big", false)?;
    let mut timed = std::time::Duration::ZERO;
    let mut errors = 0;
    let mut want = vec![0u8; CHUNK];
    let res = (|| {
        for k in 0..chunks {
            let len = (bytes - k * CHUNK as u64).min(CHUNK as u64) as usize;
            let start = Instant::now();
            let got = t.pread(f, k * CHUNK as u64, CHUNK)?;
            timed += start.elapsed();
            if got.len() != len {
                errors += 1;
            } else if t.keeps_data() {
                seq_chunk(spec.seed, k, &mut want[..len]);
                errors += u64::from(got[..] != want[..len]);
            }
        }
        Ok::<(), BenchError>(())
    })();
    let closed = t.close(f);
    res?;
    closed?;
    out.records
        .push(f7(spec, bytes, timed, "cold 1 MiB reads", errors));
    Ok(())
}

/// An F7 figure: `bytes` moved in `timed`, in MB/s, named by size and `what`.
fn f7(
    spec: &FsTaskSpec,
    bytes: u64,
    timed: std::time::Duration,
    what: &str,
    errors: u64,
) -> Record {
    let mut r = record(
        spec,
        FsWorkload::F7,
        bytes as f64 / 1e6 / timed.as_secs_f64(),
        "MB/s",
    );
    r.metric = Some(format!("{} MiB, {what}", bytes >> 20));
    r.errors = errors;
    r
}
