//! F4: one directory of empty files.

use super::*;

pub(super) fn onedir(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let n = spec.sizes.onedir_files;
    let start = Instant::now();
    t.mkdir("d")?;
    for i in 0..n {
        t.write_new(&format!("d/f{i}"), &[])?;
    }
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let mut r = record(spec, FsWorkload::F4, n as f64 / secs, "files/s");
    r.metric = Some("create".into());
    r.keys = Some(n);
    out.records.push(r);

    cold(spec, t, out)?;
    let start = Instant::now();
    let listed = t.list("d")?;
    let secs = start.elapsed().as_secs_f64();
    let mut r = record(spec, FsWorkload::F4, n as f64 / secs, "files/s");
    r.metric = Some("list cold".into());
    r.keys = Some(n);
    r.errors =
        (listed.len() as u64).abs_diff(n) + listed.iter().filter(|e| e.is_dir).count() as u64;
    out.records.push(r);
    Ok(())
}
