//! FUSE-style directory listings (`opendir`/`readdir` with u64 offsets): the read-ahead that
//! answers a listing's requests from one scan, and what it must never do (serve stale
//! attributes, lose or repeat entries the kernel did not take, hide a rewind's new names).

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use common::env;
use fern_fs::path::OpenOptions;
use fern_fs::InodeId;

fn put(e: &common::Env, path: &str, data: &[u8]) {
    let opts = OpenOptions::create_write(0o644);
    let f = e.p.open(path.as_bytes(), opts).expect("open");
    e.p.write_at(&f, 0, data).expect("write");
    e.p.close(f).expect("close");
}

/// A directory `/d` with `n` empty files `f000`, `f001`, ...; returns its inode (pinned).
fn dir_with(e: &common::Env, n: usize) -> InodeId {
    e.p.mkdir(b"/d", 0o755).expect("mkdir");
    for i in 0..n {
        put(e, &format!("/d/f{i:03}"), b"");
    }
    e.fs.lookup(InodeId::ROOT, b"d").expect("lookup d").ino
}

fn names(page: &[(u64, fern_fs::DirEntry)]) -> Vec<String> {
    page.iter()
        .map(|(_, d)| String::from_utf8_lossy(&d.name).into_owned())
        .collect()
}

#[test]
fn a_listing_in_many_requests_is_one_scan() {
    let e = env();
    let dir = dir_with(&e, 300);
    let fh = e.fs.opendir(dir).expect("opendir");
    let before = e.store.reads();
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page = e.fs.readdir(fh, offset, 7, false).expect("readdir");
        let Some((last, _)) = page.last() else { break };
        offset = *last;
        seen.extend(names(&page));
    }
    let expect: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
    assert_eq!(seen, expect, "every entry once, in name order");
    // One scan of the entries and one read of the directory's own stat (atime), where 43
    // requests used to cost a scan each, the final empty one included.
    assert!(
        e.store.reads() - before <= 2,
        "{} reads for one listing",
        e.store.reads() - before
    );
    e.fs.releasedir(fh).expect("releasedir");
}

#[test]
fn entries_the_kernel_did_not_take_are_returned_again() {
    let e = env();
    let dir = dir_with(&e, 40);
    let fh = e.fs.opendir(dir).expect("opendir");
    let first = e.fs.readdir(fh, 0, 10, false).expect("readdir");
    assert_eq!(first.len(), 10);
    // The kernel's buffer held only four: it asks again from the fourth entry's offset.
    let (off4, _) = first[3];
    let next = e.fs.readdir(fh, off4, 10, false).expect("readdir");
    assert_eq!(names(&next)[0], "f004");
    assert_eq!(next[0].0, off4 + 1, "offsets stay dense");
    // A seek back to the first entry resumes after it.
    let back = e.fs.readdir(fh, first[0].0, 2, false).expect("seek back");
    assert_eq!(names(&back), ["f001", "f002"]);
    assert!(
        e.fs.readdir(fh, 1000, 1, false).is_err(),
        "an offset never handed out is refused"
    );
    e.fs.releasedir(fh).expect("releasedir");
}

#[test]
fn plus_attributes_are_read_by_the_request_that_returns_them() {
    let e = env();
    let dir = dir_with(&e, 20);
    let fh = e.fs.opendir(dir).expect("opendir");
    let first = e.fs.readdir(fh, 0, 5, true).expect("readdirplus");
    assert!(first.iter().all(|(_, d)| d.attr.is_some()));
    // Changed and removed after the scan that read them ahead.
    put(&e, "/d/f007", b"twelve bytes");
    e.p.unlink(b"/d/f009").expect("unlink");
    let (last, _) = first[first.len() - 1];
    let next = e.fs.readdir(fh, last, 10, true).expect("readdirplus");
    let f7 = next
        .iter()
        .find(|(_, d)| d.name == b"f007")
        .expect("f007 listed");
    assert_eq!(f7.1.attr.as_ref().expect("attr").size, 12, "fresh size");
    assert!(
        next.iter().all(|(_, d)| d.name != b"f009"),
        "a name removed since the scan gets no attributes and is not listed"
    );
    // Every plus entry was pinned: forgetting them all leaves the counts balanced.
    for (_, d) in first.iter().chain(next.iter()) {
        e.fs.forget(d.ino, 1);
    }
    e.fs.releasedir(fh).expect("releasedir");
}

#[test]
fn a_rewind_sees_the_directory_as_it_is_now() {
    let e = env();
    let dir = dir_with(&e, 5);
    let fh = e.fs.opendir(dir).expect("opendir");
    let all = e.fs.readdir(fh, 0, 100, false).expect("readdir");
    assert_eq!(all.len(), 5);
    let (last, _) = all[4];
    assert!(e
        .fs
        .readdir(fh, last, 100, false)
        .expect("at the end")
        .is_empty());
    put(&e, "/d/new", b"");
    e.p.unlink(b"/d/f000").expect("unlink");
    let again = e.fs.readdir(fh, 0, 100, false).expect("rewind");
    assert_eq!(names(&again), ["f001", "f002", "f003", "f004", "new"]);
    e.fs.releasedir(fh).expect("releasedir");
}

/// A reply buffer that holds `cap` entries, as the kernel's getdents buffer does.
fn fill(
    e: &common::Env,
    fh: fern_fs::Fh,
    offset: u64,
    plus: bool,
    cap: usize,
) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    e.fs.readdir_fill(fh, offset, plus, |off, d| {
        if got.len() == cap {
            return true;
        }
        assert_eq!(d.attr.is_some(), plus, "attributes exactly with plus");
        got.push((off, String::from_utf8_lossy(&d.name).into_owned()));
        false
    })
    .expect("readdir_fill");
    got
}

#[test]
fn filled_replies_resume_after_the_last_entry_taken() {
    let e = env();
    let dir = dir_with(&e, 300);
    for plus in [false, true] {
        let fh = e.fs.opendir(dir).expect("opendir");
        let before = e.store.reads();
        let mut seen = Vec::new();
        let mut offset = 0;
        loop {
            let got = fill(&e, fh, offset, plus, 45);
            let Some((last, _)) = got.last() else { break };
            offset = *last;
            seen.extend(got.into_iter().map(|(_, n)| n));
        }
        let expect: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
        assert_eq!(seen, expect, "every entry once, in order (plus: {plus})");
        let reads = e.store.reads() - before;
        // Names: one scan and the directory's stat. Plus: one point read per entry offered
        // to the buffer as well (those that did not fit are offered again).
        let bound = if plus { 2 + 300 + 8 * 16 } else { 2 };
        assert!(reads <= bound, "{reads} reads (plus: {plus})");
        e.fs.releasedir(fh).expect("releasedir");
    }
}

#[test]
fn a_seek_back_across_read_ahead_scans_resumes_at_the_right_name() {
    let e = env();
    let n = fern_fs::READ_AHEAD * 2 + 100;
    let dir = dir_with(&e, n);
    let mut expect: Vec<String> = (0..n).map(|i| format!("f{i:03}")).collect();
    expect.sort(); // name order: "f100" < "f1000" < "f101"
    let fh = e.fs.opendir(dir).expect("opendir");
    let all = e.fs.readdir(fh, 0, usize::MAX, false).expect("readdir");
    assert_eq!(
        names(&all),
        expect,
        "three scans, every entry once, in order"
    );
    for (i, (off, _)) in all.iter().enumerate() {
        assert_eq!(*off, i as u64 + 1, "offsets are dense");
    }
    // Back into the first scan's entries: what follows is served again, in order, across the
    // later scans' boundaries, and the offsets are the ones handed out before.
    let at = 10;
    let again =
        e.fs.readdir(fh, at as u64, usize::MAX, false)
            .expect("seek back");
    assert_eq!(names(&again), expect[at..]);
    assert_eq!(again.first().map(|(o, _)| *o), Some(at as u64 + 1));
    // And with attributes: entries served again are read afresh and carry them.
    let back = fern_fs::READ_AHEAD as u64 + 5;
    let plus = e.fs.readdir(fh, back, 3, true).expect("readdirplus");
    assert_eq!(names(&plus), expect[back as usize..back as usize + 3]);
    assert!(plus.iter().all(|(_, d)| d.attr.is_some()));
    for (_, d) in &plus {
        e.fs.forget(d.ino, 1);
    }
    e.fs.releasedir(fh).expect("releasedir");
}
