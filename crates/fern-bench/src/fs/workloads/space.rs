//! F8: space used by a text-like corpus, against gzip -5.

use super::*;

/// File `i` of F8's corpus: 1-32 KiB of English-like text (the engine benchmarks' text
/// values: skewed common words), in lines. A pure function of the seed.
pub fn corpus_file(seed: u64, i: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0xF8F8 ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = 1024 + rng.below(31 * 1024) as usize;
    let mut v = Vec::with_capacity(len + crate::data::VALUE_LEN);
    let mut k = rng.next_u64();
    while v.len() < len {
        let line = crate::data::value(crate::data::ValueKind::Text, seed, k);
        v.extend_from_slice(&line[..line.len() - 1]);
        v.push(b'\n');
        k = k.wrapping_add(1 + rng.below(1 << 20));
    }
    v.truncate(len);
    v
}

/// Path of corpus file `i` (128 files per directory).
pub(super) fn corpus_path(i: u64) -> String {
    format!("c/d{}/f{}", i / 128, i % 128)
}

/// Files of a corpus of at least `bytes` bytes.
pub fn corpus_files(seed: u64, bytes: u64) -> (u64, u64) {
    let (mut n, mut total) = (0, 0);
    while total < bytes {
        total += corpus_file(seed, n).len() as u64;
        n += 1;
    }
    (n, total)
}

/// Size of the corpus compressed as `gzip -5` would: deflate at level 5 (zlib's level table is
/// gzip's) in a gzip container, fed file by file and counted, never held in memory.
pub(super) fn gzip5_bytes(seed: u64, files: u64) -> Result<u64> {
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    /// A sink that only counts.
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut gz = GzEncoder::new(Count(0), Compression::new(5));
    for i in 0..files {
        gz.write_all(&corpus_file(seed, i))?;
    }
    Ok(gz.finish()?.0)
}

/// F8: the corpus written as files (128 per directory) + sync, then unmounted and mounted
/// again (everything the file system defers is then on the device); the growth of the
/// device's used bytes from the fresh file system is the figure, beside gzip -5 of the same
/// bytes.
pub(super) fn space(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let Some(before) = t.space_used()? else {
        out.notes.push(format!(
            "F8 not measured on {}: it stores nothing, so it uses no space",
            spec.system
        ));
        return Ok(());
    };
    let (files, logical) = corpus_files(spec.seed, spec.sizes.f8_corpus_bytes);
    t.mkdir("c")?;
    for i in 0..files {
        if i % 128 == 0 {
            t.mkdir(&format!("c/d{}", i / 128))?;
        }
        t.write_new(&corpus_path(i), &corpus_file(spec.seed, i))?;
    }
    t.sync()?;
    cold(spec, t, out)?;
    let after = t.space_used()?.unwrap_or(before);
    let used = after.saturating_sub(before);
    let mut errors = 0;
    for i in sample(files).into_iter().take(200) {
        match t.read_file(&corpus_path(i)) {
            Ok(d) if t.keeps_data() && d == corpus_file(spec.seed, i) => {}
            Ok(d) if !t.keeps_data() && d.len() == corpus_file(spec.seed, i).len() => {}
            _ => errors += 1,
        }
    }
    let gz = gzip5_bytes(spec.seed, files)?;
    let label = format!(
        "{} MiB text in {files} files (gzip -5: {:.1} MiB)",
        logical >> 20,
        gz as f64 / (1 << 20) as f64
    );
    let mut r = record(spec, FsWorkload::F8, used as f64, "bytes");
    r.metric = Some(label.clone());
    r.keys = Some(files);
    r.errors = errors;
    out.records.push(r);
    let mut r = record(
        spec,
        FsWorkload::F8,
        used as f64 / gz.max(1) as f64,
        "x gzip -5",
    );
    r.metric = Some(label);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fern_testkit::{programs, skipped, Need};
    use std::io::Write;

    /// The in-process figure is the one `gzip -5` gives (GNU gzip's deflate is not zlib's
    /// code, so the streams may differ by a few bytes; the sizes must agree within 0.5 %).
    #[test]
    fn gzip5_matches_the_gzip_program() {
        if skipped(Need::Tools, programs(&["gzip"])) {
            return;
        }
        let (seed, files) = (7, 400);
        let mut child = std::process::Command::new("gzip")
            .args(["-5", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feeder = std::thread::spawn(move || {
            for i in 0..files {
                stdin.write_all(&corpus_file(seed, i)).unwrap();
            }
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        let program = out.stdout.len() as f64;
        let ours = gzip5_bytes(seed, files).unwrap() as f64;
        assert!(
            (ours / program - 1.0).abs() < 0.005,
            "in process {ours} bytes, gzip -5 {program} bytes"
        );
    }
}
