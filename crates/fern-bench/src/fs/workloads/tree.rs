//! F1 (the TokuBench tree) and what runs on it: F2, F3, F9b, F10.

use super::*;

/// The content of tree file number `g` (200 bytes by default): a pure function of the seed.
pub fn file_content(seed: u64, g: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ g.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The shape of one thread's part of the F1 tree: `files` files in leaf directories of at
/// most `fanout` files, the leaves `depth` levels below the top directory `top`, every
/// directory holding at most `fanout` entries.
#[derive(Clone, Debug)]
pub struct TreeShape {
    /// Top directory ("t0").
    pub top: String,
    /// Files in this part.
    pub files: u64,
    /// Entries per directory at most.
    pub fanout: u64,
    /// Directory levels between `top` and the files (at least 1).
    pub depth: u32,
    /// Global number of this part's first file (for contents).
    pub first: u64,
}

impl TreeShape {
    /// Thread `t`'s part of a tree of `total` files split over `threads` threads.
    pub fn part(total: u64, threads: u32, t: u32, fanout: u64) -> TreeShape {
        let threads = u64::from(threads.max(1));
        let lo = total * u64::from(t) / threads;
        let hi = total * (u64::from(t) + 1) / threads;
        let fanout = fanout.max(2);
        let leaves = (hi - lo).div_ceil(fanout).max(1);
        let mut depth = 1;
        let mut cap = fanout;
        while cap < leaves {
            cap = cap.saturating_mul(fanout);
            depth += 1;
        }
        TreeShape {
            top: format!("t{t}"),
            files: hi - lo,
            fanout,
            depth,
            first: lo,
        }
    }

    /// Digits of leaf `j`, most significant first.
    fn digits(&self, j: u64) -> Vec<u64> {
        let mut d = vec![0; self.depth as usize];
        let mut x = j;
        for slot in d.iter_mut().rev() {
            *slot = x % self.fanout;
            x /= self.fanout;
        }
        d
    }

    fn dir_of(&self, digits: &[u64]) -> String {
        let mut p = self.top.clone();
        for d in digits {
            p.push('/');
            p.push_str(&d.to_string());
        }
        p
    }

    /// Path of file `i` of this part.
    pub fn file_path(&self, i: u64) -> String {
        format!(
            "{}/f{}",
            self.dir_of(&self.digits(i / self.fanout)),
            i % self.fanout
        )
    }

    /// Creates this part (directories as they become needed, then the files); returns the
    /// number of directories made, `top` included.
    pub fn create(&self, t: &dyn FsTarget, seed: u64, file_bytes: usize) -> Result<u64> {
        self.create_counted(t, seed, file_bytes, &AtomicU64::new(0))
    }

    /// As [`TreeShape::create`], adding one to `done` after every file (progress sampling).
    pub fn create_counted(
        &self,
        t: &dyn FsTarget,
        seed: u64,
        file_bytes: usize,
        done: &AtomicU64,
    ) -> Result<u64> {
        t.mkdir(&self.top)?;
        let mut dirs = 1;
        let mut prev: Option<Vec<u64>> = None;
        for i in 0..self.files {
            if i % self.fanout == 0 {
                let digits = self.digits(i / self.fanout);
                let same = prev
                    .as_ref()
                    .map(|p| p.iter().zip(&digits).take_while(|(a, b)| a == b).count())
                    .unwrap_or(0);
                for level in same..digits.len() {
                    t.mkdir(&self.dir_of(&digits[..=level]))?;
                    dirs += 1;
                }
                prev = Some(digits);
            }
            let data = file_content(seed, self.first + i, file_bytes);
            t.write_new(&self.file_path(i), &data)?;
            done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(dirs)
    }
}

/// Indexes 0..n to check: all of them up to 2000, else an even sample of about 2000 plus the
/// last.
pub(super) fn sample(n: u64) -> Vec<u64> {
    if n <= 2000 {
        return (0..n).collect();
    }
    let step = n / 2000;
    let mut v: Vec<u64> = (0..n).step_by(step as usize).collect();
    if v.last() != Some(&(n - 1)) {
        v.push(n - 1);
    }
    v
}

pub(super) fn tree(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    threads: u32,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let s = &spec.sizes;
    let parts: Vec<TreeShape> = (0..threads.max(1))
        .map(|i| TreeShape::part(s.tree_files, threads, i, s.fanout))
        .collect();

    // F1: create the tree, then make it durable.
    let sampler = Sampler::start();
    let start = Instant::now();
    let dirs: u64 = {
        let shared: &dyn FsTarget = t;
        let done: &AtomicU64 = &sampler.done;
        if parts.len() == 1 {
            parts[0].create_counted(shared, spec.seed, s.file_bytes, done)?
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = parts
                    .iter()
                    .map(|p| {
                        sc.spawn(move || p.create_counted(shared, spec.seed, s.file_bytes, done))
                    })
                    .collect();
                let mut sum = 0;
                for h in handles {
                    sum += h
                        .join()
                        .map_err(|_| BenchError::Usage("an F1 thread panicked".into()))??;
                }
                Ok::<u64, BenchError>(sum)
            })?
        }
    };
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    out.series.push(Series {
        workload: "F1".into(),
        system: spec.system.clone(),
        threads: Some(threads),
        rep: spec.rep,
        unit: "files/s".into(),
        points: sampler.finish(secs, s.tree_files as f64, 1.0),
    });
    // Check: every sampled file has its content (its size, on a target that keeps no data).
    let mut errors = 0;
    for p in &parts {
        for i in sample(p.files) {
            match t.read_file(&p.file_path(i)) {
                Ok(d) if !t.keeps_data() && d.len() == s.file_bytes => {}
                Ok(d) if d == file_content(spec.seed, p.first + i, s.file_bytes) => {}
                _ => errors += 1,
            }
        }
    }
    if wants(spec, FsWorkload::F1) {
        let mut r = record(spec, FsWorkload::F1, s.tree_files as f64 / secs, "files/s");
        r.threads = Some(threads);
        r.keys = Some(s.tree_files);
        r.errors = errors;
        out.records.push(r);
    }
    if threads != 1 {
        return Ok(());
    }
    let p = &parts[0];

    // F10: chmod + utime of every file (two operations each), then durable.
    if wants(spec, FsWorkload::F10) {
        let start = Instant::now();
        for i in 0..p.files {
            let path = p.file_path(i);
            t.chmod(&path, 0o600)?;
            t.set_times(&path, 1_000_000_000 + i as i64)?;
        }
        t.sync()?;
        let secs = start.elapsed().as_secs_f64();
        let mut errors = 0;
        for i in sample(p.files) {
            match t.lstat(&p.file_path(i)) {
                Ok(st) if st.mode & 0o7777 == 0o600 && st.mtime_s == 1_000_000_000 + i as i64 => {}
                _ => errors += 1,
            }
        }
        let mut r = record(spec, FsWorkload::F10, 2.0 * p.files as f64 / secs, "ops/s");
        r.metric = Some("chmod + utime".into());
        r.errors = errors;
        out.records.push(r);
    }

    // F2: cold recursive readdir + lstat of every entry.
    if wants(spec, FsWorkload::F2) {
        cold(spec, t, out)?;
        let start = Instant::now();
        let (entries, files) = walk(t, "")?;
        let secs = start.elapsed().as_secs_f64();
        let errors = u64::from(entries != p.files + dirs) + u64::from(files != p.files);
        let mut r = record(spec, FsWorkload::F2, entries as f64 / secs, "entries/s");
        r.metric = Some("cold".into());
        r.keys = Some(entries);
        r.errors = errors;
        out.records.push(r);
    }

    // F3: cold scan reading every file (readdir of every directory, open + read + close of
    // every file), like grep -r. Checked: the count, the bytes, and an order-independent sum
    // of the files' hashes against the expected contents (computed before the timed region).
    if wants(spec, FsWorkload::F3) {
        let expected = (0..p.files).fold(0u64, |acc, i| {
            acc.wrapping_add(content_hash(&file_content(
                spec.seed,
                p.first + i,
                s.file_bytes,
            )))
        });
        cold(spec, t, out)?;
        let start = Instant::now();
        let mut scan = Scan::default();
        read_all(t, &p.top, &mut scan)?;
        let secs = start.elapsed().as_secs_f64();
        let mut errors =
            scan.files.abs_diff(p.files) + scan.bytes.abs_diff(p.files * s.file_bytes as u64);
        if t.keeps_data() && scan.hash != expected {
            errors += 1;
        }
        let mut r = record(spec, FsWorkload::F3, scan.files as f64 / secs, "files/s");
        r.metric = Some("cold, read every file".into());
        r.keys = Some(scan.files);
        r.errors = errors;
        out.records.push(r);
    }

    // F9b: rm -r of the tree, durable.
    if wants(spec, FsWorkload::F9b) {
        let start = Instant::now();
        remove_tree(t, &p.top)?;
        t.rmdir(&p.top)?;
        t.sync()?;
        let secs = start.elapsed().as_secs_f64();
        let left = root_entries(t)?.len() as u64;
        let mut r = record(spec, FsWorkload::F9b, secs, "seconds");
        r.metric = Some("rm -r + sync".into());
        r.keys = Some(p.files);
        r.errors = left;
        out.records.push(r);
    }
    Ok(())
}

pub(in crate::fs) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// `find -ls`: readdir of every directory and lstat of every entry. Returns (entries, files).
pub fn walk(t: &dyn FsTarget, dir: &str) -> Result<(u64, u64)> {
    let (mut entries, mut files) = (0, 0);
    for e in t.list(dir)? {
        if e.name == "lost+found" && dir.is_empty() {
            continue;
        }
        let path = join(dir, &e.name);
        let st = t.lstat(&path)?;
        entries += 1;
        if st.is_dir {
            let (a, b) = walk(t, &path)?;
            entries += a;
            files += b;
        } else {
            files += 1;
        }
    }
    Ok((entries, files))
}

/// What a reading scan saw.
#[derive(Debug, Default)]
pub(super) struct Scan {
    files: u64,
    bytes: u64,
    hash: u64,
}

/// FNV-1a of a file's content (summed over files, the sum is independent of listing order).
pub(super) fn content_hash(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `grep -r`: readdir every directory below `dir`, read every file.
pub(super) fn read_all(t: &dyn FsTarget, dir: &str, scan: &mut Scan) -> Result<()> {
    for e in t.list(dir)? {
        let path = join(dir, &e.name);
        if e.is_dir {
            read_all(t, &path, scan)?;
        } else {
            let d = t.read_file(&path)?;
            scan.files += 1;
            scan.bytes += d.len() as u64;
            scan.hash = scan.hash.wrapping_add(content_hash(&d));
        }
    }
    Ok(())
}

/// `rm -r` of the contents of `dir`: readdir, unlink files, recurse into and rmdir
/// directories.
pub fn remove_tree(t: &dyn FsTarget, dir: &str) -> Result<()> {
    for e in t.list(dir)? {
        let path = join(dir, &e.name);
        if e.is_dir {
            remove_tree(t, &path)?;
            t.rmdir(&path)?;
        } else {
            t.unlink(&path)?;
        }
    }
    Ok(())
}

/// Entries of the root other than ext4's lost+found.
pub(super) fn root_entries(t: &dyn FsTarget) -> Result<Vec<String>> {
    Ok(t.list("")?
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != "lost+found")
        .collect())
}
