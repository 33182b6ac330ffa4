//! F11, F12: external programs (postmark, tar, git, cp) run on the mount.

use super::*;

/// The mount of a target that has one; for a library-only target, a note ("`what` not
/// measured on ...") and `None`.
pub(in crate::fs) fn mount_of(
    spec: &FsTaskSpec,
    t: &dyn FsTarget,
    what: &str,
    out: &mut FsTaskOutput,
) -> Option<PathBuf> {
    let m = t.mount_path();
    if m.is_none() {
        out.notes.push(format!(
            "{what} not measured on {}: it runs programs, which need a mount",
            spec.system
        ));
    }
    m
}

/// Runs a program to completion, failing with its output's tail.
pub(in crate::fs) fn run_prog(cmd: &mut std::process::Command, what: &str) -> Result<String> {
    let o = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| BenchError::Usage(format!("cannot run {what}: {e} (is it installed?)")))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(BenchError::Usage(format!(
            "{what} failed ({}): {}",
            o.status,
            tail.join(" / ")
        )));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// F11: `threads` postmark instances at once, each in its own directory of the mount with
/// docs/workloads.md's configuration and its share of the files and transactions. Timed: from
/// starting them to the last one's exit, plus the sync (postmark itself never fsyncs, so the
/// sync is what makes the run durable). Checked: every instance ran to its end and left its
/// directory empty, as postmark does.
pub(super) fn postmark(
    spec: &FsTaskSpec,
    t: &mut dyn FsTarget,
    threads: u32,
    out: &mut FsTaskOutput,
) -> Result<()> {
    use std::io::Write;
    let Some(mp) = mount_of(spec, t, "F11", out) else {
        return Ok(());
    };
    let s = &spec.sizes;
    let n = u64::from(threads.max(1));
    let (files, tx) = (
        (s.postmark_files / n).max(1),
        (s.postmark_transactions / n).max(1),
    );
    for k in 0..n {
        t.mkdir(&format!("pm{k}"))?;
    }
    t.sync()?;
    let start = Instant::now();
    let mut children = Vec::new();
    for k in 0..n {
        let config = format!(
            "set location {}\nset number {files}\nset transactions {tx}\nset size 500 10000\n\
             set subdirectories 100\nset read 4096\nset write 4096\nset buffering false\n\
             set bias read 5\nset bias create 5\nset seed {}\nrun\nquit\n",
            mp.join(format!("pm{k}")).display(),
            spec.seed + k
        );
        let mut c = std::process::Command::new("postmark")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| {
                BenchError::Usage(format!(
                    "cannot run postmark: {e} (apt-get install postmark)"
                ))
            })?;
        if let Some(mut i) = c.stdin.take() {
            i.write_all(config.as_bytes())?;
        }
        children.push(c);
    }
    let mut errors = 0;
    let mut failed = None;
    for c in children {
        let o = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&o.stdout);
        if !o.status.success() || !text.contains("Deleting subdirectories...Done") {
            errors += 1;
            failed.get_or_insert_with(|| {
                format!(
                    "postmark ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )
            });
        }
    }
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    if let Some(f) = failed {
        out.notes.push(format!("F11 on {}: {f}", spec.system));
    }
    for k in 0..n {
        errors += t.list(&format!("pm{k}"))?.len() as u64;
    }
    let mut r = record(spec, FsWorkload::F11, (tx * n) as f64 / secs, "tx/s");
    r.metric = Some(format!(
        "postmark {} files, {} tx, whole run + sync",
        files * n,
        tx * n
    ));
    r.threads = Some(threads);
    r.keys = Some(tx * n);
    r.errors = errors;
    out.records.push(r);
    Ok(())
}

/// Makes F12's source tree in `src` on the host (not the system under test): `files` text
/// files of 0.5-12 KiB in directories of 64, committed into a git repository, then packed
/// into the tarball `tar` and removed. Untimed.
pub(super) fn make_source_tarball(
    seed: u64,
    files: u64,
    src: &std::path::Path,
    tar: &std::path::Path,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(src);
    for i in 0..files {
        let d = src
            .join(format!("m{}", i / 64 / 64))
            .join(format!("d{}", i / 64));
        if i % 64 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        let mut body = corpus_file(seed, i);
        body.truncate(512 + (i.wrapping_mul(7919) % (12 << 10)) as usize);
        std::fs::write(d.join(format!("f{}.c", i % 64)), body)?;
    }
    let git = |args: &[&str]| {
        run_prog(
            std::process::Command::new("git")
                .arg("-C")
                .arg(src)
                .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
                .args(args),
            &format!("git {}", args.join(" ")),
        )
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "generated tree"])?;
    run_prog(
        std::process::Command::new("tar")
            .arg("cf")
            .arg(tar)
            .arg("-C")
            .arg(src)
            .arg("."),
        "tar cf",
    )?;
    std::fs::remove_dir_all(src)?;
    Ok(())
}

/// F12: a generated source tree (git repository included) untarred onto the mount + sync;
/// then, cold, `git status` in it (a fresh checkout's index does not match the new inodes,
/// so git re-reads every file); then `cp -r` of the tree on the mount + sync.
pub(super) fn apps(spec: &FsTaskSpec, t: &mut dyn FsTarget, out: &mut FsTaskOutput) -> Result<()> {
    let Some(mp) = mount_of(spec, t, "F12", out) else {
        return Ok(());
    };
    let n = spec.sizes.apps_files;
    let tarball = spec.dir.join("f12.tar");
    make_source_tarball(spec.seed, n, &spec.dir.join("f12-src"), &tarball)?;
    let label = |what: &str| format!("{n} files: {what}");
    let push = |what: &str, secs: f64, errors: u64, out: &mut FsTaskOutput| {
        let mut r = record(spec, FsWorkload::F12, secs, "seconds");
        r.metric = Some(label(what));
        r.keys = Some(n);
        r.errors = errors;
        out.records.push(r);
    };

    t.mkdir("src")?;
    let start = Instant::now();
    run_prog(
        std::process::Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .arg("-C")
            .arg(mp.join("src")),
        "tar xf",
    )?;
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&tarball);
    let (entries, files) = walk(t, "src")?;
    // Every generated file plus git's own files: fewer than the generated ones is wrong.
    push("untar + sync", secs, n.saturating_sub(files), out);

    if t.keeps_data() {
        cold(spec, t, out)?;
        let start = Instant::now();
        let status = run_prog(
            std::process::Command::new("git")
                .arg("-C")
                .arg(mp.join("src"))
                .args(["status", "--porcelain"]),
            "git status",
        )?;
        let secs = start.elapsed().as_secs_f64();
        // Every file reads back as committed, so the tree is clean: any line is wrong.
        push("git status, cold", secs, status.lines().count() as u64, out);
    } else {
        out.notes.push(format!(
            "F12 git status not measured on {}: git cannot read a repository that reads back \
             as zeros",
            spec.system
        ));
    }

    let start = Instant::now();
    run_prog(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(mp.join("src"))
            .arg(mp.join("copy")),
        "cp -r",
    )?;
    t.sync()?;
    let secs = start.elapsed().as_secs_f64();
    let (copied, _) = walk(t, "copy")?;
    push("cp -r + sync", secs, copied.abs_diff(entries), out);
    Ok(())
}
