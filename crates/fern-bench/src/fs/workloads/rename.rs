//! F9a: rename of a big directory.

use super::*;

pub(super) fn rename(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    out: &mut FsTaskOutput,
) -> Result<()> {
    let n = spec.sizes.rename_files;
    t.mkdir("a")?;
    t.mkdir("b")?;
    t.mkdir("a/big")?;
    for i in 0..n {
        t.write_new(&format!("a/big/f{i}"), &[])?;
    }
    t.sync()?;
    let start = Instant::now();
    t.rename("a/big", "b/big")?;
    let op = start.elapsed().as_secs_f64();
    t.sync()?;
    let total = start.elapsed().as_secs_f64();
    let listed = t.list("b/big")?;
    let mut errors = (listed.len() as u64).abs_diff(n) + u64::from(t.lstat("a/big").is_ok());
    if t.lstat(&format!("b/big/f{}", n.saturating_sub(1))).is_err() && n > 0 {
        errors += 1;
    }
    for (metric, v) in [
        (format!("{n} files, rename + sync"), total),
        (format!("{n} files, rename alone"), op),
    ] {
        let mut r = record(spec, FsWorkload::F9a, v, "seconds");
        r.metric = Some(metric);
        r.keys = Some(n);
        r.errors = errors;
        out.records.push(r);
    }
    Ok(())
}
