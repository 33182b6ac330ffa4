//! F5, F6, F9c: writes into and unlink of big files.

use super::*;

/// Writes `bytes` of pseudo-random data sequentially in 1 MiB writes, then fsyncs.
pub(super) fn write_big(t: &dyn FsTarget, path: &str, bytes: u64, seed: u64) -> Result<()> {
    let f = t.open(path, true)?;
    let mut rng = Rng::new(seed ^ 0xB16_F11E);
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    let res = (|| {
        while off < bytes {
            let len = (bytes - off).min(buf.len() as u64) as usize;
            for c in buf[..len].chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            t.pwrite(f, off, &buf[..len])?;
            off += len as u64;
        }
        t.fsync(f)
    })();
    let closed = t.close(f);
    res?;
    closed
}

/// `count` distinct write offsets `slot × len` in a file of `file_bytes`, in random order.
pub fn random_offsets(seed: u64, file_bytes: u64, len: usize, count: u64) -> Vec<u64> {
    let slots = (file_bytes / len.max(1) as u64).max(1);
    let count = count.min(slots);
    let mut rng = Rng::new(seed ^ 0x000F_F5E7);
    let mut seen = std::collections::HashSet::with_capacity(count as usize);
    let mut v = Vec::with_capacity(count as usize);
    while (v.len() as u64) < count {
        let s = rng.below(slots);
        if seen.insert(s) {
            v.push(s * len as u64);
        }
    }
    v
}

pub(super) fn micro(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    w: FsWorkload,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let s = &spec.sizes;
    let (file_bytes, writes, len) = match w {
        FsWorkload::F5 => (s.f5_file_bytes, s.f5_writes, s.f5_write_len),
        _ => (s.f6_file_bytes, s.f6_writes, s.f6_write_len),
    };
    write_big(t, "big", file_bytes, spec.seed)?;
    t.sync()?;
    cold(spec, t, out)?;
    let offsets = random_offsets(spec.seed, file_bytes, len, writes);
    let payloads: Vec<Vec<u8>> = (0..offsets.len() as u64)
        .map(|i| file_content(spec.seed ^ 0x5EED, i, len))
        .collect();
    let f = t.open("big", false)?;
    let sampler = Sampler::start();
    let start = Instant::now();
    for (off, data) in offsets.iter().zip(&payloads) {
        t.pwrite(f, *off, data)?;
        sampler.done.fetch_add(1, Ordering::Relaxed);
    }
    t.fsync(f)?;
    let secs = start.elapsed().as_secs_f64();
    let done = sampler.finish(secs, offsets.len() as f64, len as f64 / 1e6);
    if w == FsWorkload::F5 {
        out.series.push(Series {
            workload: "F5".into(),
            system: spec.system.clone(),
            threads: None,
            rep: spec.rep,
            unit: "MB/s".into(),
            points: done,
        });
    }
    let mut errors = 0;
    let n = offsets.len() as u64;
    for i in sample(n).into_iter().take(500) {
        let i = i as usize;
        match t.pread(f, offsets[i], len) {
            Ok(d) if !t.keeps_data() && d.len() == len => {}
            Ok(d) if d == payloads[i] => {}
            _ => errors += 1,
        }
    }
    match t.lstat("big") {
        Ok(st) if st.size == file_bytes => {}
        _ => errors += 1,
    }
    t.close(f)?;
    let mut r = if w == FsWorkload::F5 {
        record(spec, w, (n * len as u64) as f64 / 1e6 / secs, "MB/s")
    } else {
        record(spec, w, secs, "seconds")
    };
    r.metric = Some(format!("{n} × {len} B + fsync, cold"));
    r.keys = Some(n);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

pub(super) fn unlink(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let bytes = spec.sizes.unlink_bytes;
    write_big(t, "big", bytes, spec.seed)?;
    t.sync()?;
    let start = Instant::now();
    t.unlink("big")?;
    let op = start.elapsed().as_secs_f64();
    t.sync()?;
    let total = start.elapsed().as_secs_f64();
    let errors = u64::from(t.lstat("big").is_ok()) + root_entries(t)?.len() as u64;
    let mib = bytes >> 20;
    for (metric, v) in [
        (format!("{mib} MiB, unlink + sync"), total),
        (format!("{mib} MiB, unlink alone"), op),
    ] {
        let mut r = record(spec, FsWorkload::F9c, v, "seconds");
        r.metric = Some(metric);
        r.errors = errors;
        out.records.push(r);
    }
    Ok(())
}
