//! A real FUSE mount in a temporary directory: file, directory, symlink, hard link, rename,
//! unlink-while-open, truncate and xattr operations through std::fs and libc; then unmount,
//! remount over the same store and check that everything persisted.
//!
//! Needs /dev/fuse and the right to mount (root, or fusermount3). Without them a test says
//! SKIPPED and returns, unless `FERN_REQUIRE_FUSE=1` (CI) makes that a failure (fern-testkit);
//! a mount that fails for any other reason fails the test. A watchdog detaches the mount and
//! aborts if anything hangs.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fern_fs::{Fs, MkfsOptions};
use fern_fuse::{MountOptions, Mounted};
use fern_kv::mem::MemStore;
use fern_kv::KvStore;
use fern_testkit::{fuse_as_root, fuse_available, skipped, Need};

/// Detaches the mount and aborts the test process if the test has not finished in time. It
/// also runs the mount tests one at a time: a test that forks (a child as `nobody`, a running
/// executable) copies every descriptor the process has open at that moment, including another
/// test's files on another mount, and until the child execs (or for good, if it does not) that
/// other mount is busy and its unmount fails with EBUSY — seen under CPU load.
struct Watchdog(
    #[allow(dead_code)] fern_testkit::Watchdog,
    #[allow(dead_code)] MutexGuard<'static, ()>,
);

static ONE_MOUNT_TEST_AT_A_TIME: Mutex<()> = Mutex::new(());

impl Watchdog {
    fn new(mountpoint: &Path, limit: Duration) -> Watchdog {
        // A test that failed while holding the lock poisons it; the next one still runs.
        let serial = ONE_MOUNT_TEST_AT_A_TIME
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let detach: fn(&Path) = |mp| {
            let _ = fern_fuse::lazy_unmount(mp);
        };
        Watchdog(
            fern_testkit::Watchdog::new(mountpoint, limit, detach),
            serial,
        )
    }
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let p = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call; value is a valid
    // slice of the length passed.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get_xattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let p = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: strings are NUL-terminated; buf is writable for buf.len() bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn list_xattr(p: &Path) -> std::io::Result<Vec<String>> {
    let p = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: the path is NUL-terminated; buf is writable for buf.len() bytes.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// What every test here starts from: a scratch directory holding an empty mount point
/// (`mnt`, reachable by every user), its watchdog, and a freshly formatted memory store.
struct Scratch {
    _tmp: tempfile::TempDir,
    mp: std::path::PathBuf,
    _dog: Watchdog,
    kv: Arc<dyn KvStore>,
}

fn scratch(limit: Duration) -> Scratch {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mp = tmp.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let dog = Watchdog::new(&mp, limit);
    let kv: Arc<dyn KvStore> = Arc::new(MemStore::new(fern_fs::registry()));
    Fs::mkfs(&*kv, MkfsOptions::default()).unwrap();
    Scratch {
        _tmp: tmp,
        mp,
        _dog: dog,
        kv,
    }
}

fn mount(kv: &Arc<dyn KvStore>, mp: &Path) -> Mounted {
    let fs = Arc::new(Fs::mount(kv.clone()).expect("fern-fs mount"));
    Mounted::spawn(fs, mp, &MountOptions::default()).expect("FUSE mount")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn posix_operations_through_a_real_mount_persist_across_remount() {
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    let s = scratch(Duration::from_secs(120));
    let (mp, kv) = (s.mp.clone(), s.kv.clone());
    let m = mount(&kv, &mp);

    // Files: create, write, read back, append, truncate (shrink and extend).
    let f = mp.join("hello.txt");
    fs::write(&f, b"hello, fern\n").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello, fern\n");
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"more\n")
        .unwrap();
    assert_eq!(fs::read_to_string(&f).unwrap(), "hello, fern\nmore\n");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(mp.join("big"), &big).unwrap();
    assert_eq!(fs::read(mp.join("big")).unwrap(), big);
    let h = OpenOptions::new().write(true).open(mp.join("big")).unwrap();
    h.set_len(10_000).unwrap();
    h.set_len(20_000).unwrap();
    drop(h);
    let got = fs::read(mp.join("big")).unwrap();
    assert_eq!(got.len(), 20_000);
    assert_eq!(&got[..10_000], &big[..10_000]);
    assert!(
        got[10_000..].iter().all(|b| *b == 0),
        "extension reads zeros"
    );

    // Directories, permissions, listing.
    fs::create_dir_all(mp.join("a/b/c")).unwrap();
    fs::set_permissions(mp.join("a"), fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(fs::metadata(mp.join("a")).unwrap().mode() & 0o7777, 0o750);
    for i in 0..300 {
        fs::write(mp.join(format!("a/b/f{i:03}")), format!("{i}")).unwrap();
    }
    let listed = names(&mp.join("a/b"));
    assert_eq!(listed.len(), 301);
    assert_eq!(fs::metadata(mp.join("a")).unwrap().nlink(), 3);
    assert_eq!(
        fs::remove_dir(mp.join("a/b")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );

    // Symlinks.
    std::os::unix::fs::symlink("hello.txt", mp.join("link")).unwrap();
    assert_eq!(
        fs::read_link(mp.join("link")).unwrap(),
        Path::new("hello.txt")
    );
    assert_eq!(fs::read(mp.join("link")).unwrap(), fs::read(&f).unwrap());

    // Hard links share an inode and count links.
    fs::hard_link(&f, mp.join("a/hard")).unwrap();
    let (m1, m2) = (
        fs::metadata(&f).unwrap(),
        fs::metadata(mp.join("a/hard")).unwrap(),
    );
    assert_eq!(m1.ino(), m2.ino());
    assert_eq!(m2.nlink(), 2);

    // Rename: file over file, directory move.
    fs::write(mp.join("victim"), b"old").unwrap();
    fs::write(mp.join("mover"), b"new").unwrap();
    fs::rename(mp.join("mover"), mp.join("victim")).unwrap();
    assert_eq!(fs::read(mp.join("victim")).unwrap(), b"new");
    assert!(!mp.join("mover").exists());
    fs::rename(mp.join("a/b/c"), mp.join("c-moved")).unwrap();
    assert!(mp.join("c-moved").is_dir());

    // Unlink while open: the open file keeps working, and is gone after close.
    let mut open = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mp.join("ghost"))
        .unwrap();
    open.write_all(b"boo").unwrap();
    fs::remove_file(mp.join("ghost")).unwrap();
    assert!(!mp.join("ghost").exists());
    open.write_all(b"!").unwrap();
    open.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(s, "boo!");
    assert_eq!(open.metadata().unwrap().nlink(), 0);
    drop(open);

    // Extended attributes.
    set_xattr(&f, "user.colour", b"green").unwrap();
    set_xattr(&f, "user.empty", b"").unwrap();
    assert_eq!(get_xattr(&f, "user.colour").unwrap(), b"green");
    let mut xs = list_xattr(&f).unwrap();
    xs.sort();
    assert_eq!(xs, vec!["user.colour", "user.empty"]);
    assert_eq!(
        get_xattr(&f, "user.none").unwrap_err().raw_os_error(),
        Some(libc::ENODATA)
    );

    // Errors come back as the right errno.
    assert_eq!(
        fs::read(mp.join("nope")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    assert_eq!(
        fs::create_dir(mp.join("a")).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );

    File::open(&f).unwrap().sync_all().unwrap();
    let ino_hello = fs::metadata(&f).unwrap().ino();
    m.unmount().expect("unmount");

    // Remount over the same store: everything is still there.
    let m = mount(&kv, &mp);
    assert_eq!(fs::read_to_string(&f).unwrap(), "hello, fern\nmore\n");
    assert_eq!(fs::metadata(&f).unwrap().ino(), ino_hello);
    assert_eq!(fs::metadata(&f).unwrap().nlink(), 2);
    assert_eq!(fs::read(mp.join("big")).unwrap().len(), 20_000);
    assert_eq!(names(&mp.join("a/b")).len(), 300);
    assert_eq!(
        fs::read_link(mp.join("link")).unwrap(),
        Path::new("hello.txt")
    );
    assert_eq!(fs::read(mp.join("victim")).unwrap(), b"new");
    assert!(mp.join("c-moved").is_dir());
    assert!(!mp.join("ghost").exists());
    assert_eq!(get_xattr(&f, "user.colour").unwrap(), b"green");
    assert_eq!(fs::metadata(mp.join("a")).unwrap().mode() & 0o7777, 0o750);
    let mut top = names(&mp);
    top.sort();
    assert_eq!(
        top,
        vec!["a", "big", "c-moved", "hello.txt", "link", "victim"]
    );
    m.unmount().expect("second unmount");
}

#[test]
fn concurrent_clients_in_one_directory() {
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    let s = scratch(Duration::from_secs(120));
    let (mp, kv) = (s.mp.clone(), s.kv.clone());
    let fs = Arc::new(Fs::mount(kv.clone()).unwrap());
    let opts = MountOptions {
        threads: 4,
        ..MountOptions::default()
    };
    let m = Mounted::spawn(fs, &mp, &opts).expect("FUSE mount");
    let dir = mp.join("shared");
    fs::create_dir(&dir).unwrap();
    // Four clients create, rename and delete in one directory at once, while a fifth lists it.
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                for i in 0..150 {
                    let p = dir.join(format!("t{t}-{i}"));
                    fs::write(&p, format!("{t}:{i}")).unwrap();
                    if i % 3 == 0 {
                        fs::rename(&p, dir.join(format!("t{t}-{i}-renamed"))).unwrap();
                    } else if i % 5 == 0 {
                        fs::remove_file(&p).unwrap();
                    }
                }
            })
        })
        .collect();
    let lister = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            for _ in 0..20 {
                for e in fs::read_dir(&dir).unwrap() {
                    // Entries may vanish between the listing and the stat; nothing else may fail.
                    if let Err(err) = e.unwrap().metadata() {
                        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
                    }
                }
            }
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    lister.join().unwrap();
    let mut expected = Vec::new();
    for t in 0..4 {
        for i in 0..150 {
            if i % 3 == 0 {
                expected.push(format!("t{t}-{i}-renamed"));
            } else if i % 5 != 0 {
                expected.push(format!("t{t}-{i}"));
            }
        }
    }
    expected.sort();
    assert_eq!(names(&dir), expected);
    for n in &expected {
        let (t, i) = n.trim_end_matches("-renamed")[1..].split_once('-').unwrap();
        assert_eq!(fs::read_to_string(dir.join(n)).unwrap(), format!("{t}:{i}"));
    }
    assert_eq!(fs::metadata(&dir).unwrap().nlink(), 2);
    m.unmount().expect("unmount");
}

/// A store that counts point reads of `security.capability` attributes: the request the
/// kernel makes before every write unless FUSE_HANDLE_KILLPRIV_V2 is on.
struct CapsReads {
    inner: Arc<dyn KvStore>,
    xattr: fern_kv::TreeId,
    count: std::sync::atomic::AtomicUsize,
}

impl fern_kv::KvRead for CapsReads {
    fn get(&self, tree: fern_kv::TreeId, key: &[u8]) -> fern_kv::KvResult<Option<Vec<u8>>> {
        if tree == self.xattr && key.ends_with(b"security.capability") {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.get(tree, key)
    }
    fn scan(
        &self,
        tree: fern_kv::TreeId,
        range: &fern_kv::KeyRange,
        dir: fern_kv::Direction,
        limit: usize,
    ) -> fern_kv::KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(tree, range, dir, limit)
    }
    fn read_extent(&self, r: &fern_kv::ExtentRef, buf: &mut [u8]) -> fern_kv::KvResult<()> {
        self.inner.read_extent(r, buf)
    }
}

impl KvStore for CapsReads {
    fn tree(&self, name: &str) -> fern_kv::KvResult<fern_kv::TreeId> {
        self.inner.tree(name)
    }
    fn write(&self, b: fern_kv::WriteBatch, o: fern_kv::WriteOptions) -> fern_kv::KvResult<()> {
        self.inner.write(b, o)
    }
    fn begin(&self) -> fern_kv::KvResult<Box<dyn fern_kv::KvTxn + '_>> {
        self.inner.begin()
    }
    fn sync(&self) -> fern_kv::KvResult<()> {
        self.inner.sync()
    }
    fn limits(&self) -> fern_kv::Limits {
        self.inner.limits()
    }
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

/// Runs `script` with `sh -c` as nobody (uid/gid 65534) in `dir`, optionally with `stdout`.
fn as_nobody(dir: &Path, script: &str, stdout: Option<File>) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir)
        .uid(65534)
        .gid(65534);
    if let Some(f) = stdout {
        cmd.stdout(f);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "as nobody: {script}: {out:?}");
}

/// With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves dropping privileges to us: a write, a
/// truncate or an O_TRUNC open by an unprivileged user clears set-user-id (and set-group-id
/// when group-executable) and removes file capabilities; root's writes keep them; and writes
/// no longer make the kernel ask for `security.capability` first.
#[test]
fn killpriv_v2_unprivileged_modification_drops_set_id_bits_and_capabilities() {
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    if skipped(Need::Fuse, fuse_as_root()) {
        return;
    }
    // nobody must reach the mount point (`scratch` makes it reachable).
    let s = scratch(Duration::from_secs(120));
    let (mp, mem) = (s.mp.clone(), s.kv.clone());
    let xattr = mem.tree("fs.xattr").unwrap();
    let counted = Arc::new(CapsReads {
        inner: mem,
        xattr,
        count: Default::default(),
    });
    let kv: Arc<dyn KvStore> = counted.clone();
    let fs_ = Arc::new(Fs::mount(kv).unwrap());
    let opts = MountOptions {
        allow_other: true,
        ..MountOptions::default()
    };
    let m = Mounted::spawn(fs_, &mp, &opts).expect("FUSE mount");
    fs::set_permissions(&mp, fs::Permissions::from_mode(0o777)).unwrap();

    let make = |name: &str, mode: u32| {
        let p = mp.join(name);
        fs::write(&p, b"0123456789").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(mode_of(&p), mode, "{name} set up");
        p
    };
    // Writes to a file without privileges cost no capability lookup after the first: the
    // kernel marks the inode S_NOSEC (SB_NOSEC comes with KILLPRIV_V2). Without it, every
    // write asks for security.capability first.
    let plain = make("plain", 0o644);
    let before = counted.count.load(Ordering::SeqCst);
    {
        let mut f = OpenOptions::new().append(true).open(&plain).unwrap();
        for _ in 0..50 {
            f.write_all(b"p").unwrap();
        }
    }
    let lookups = counted.count.load(Ordering::SeqCst) - before;
    assert!(
        lookups <= 2,
        "50 writes made {lookups} security.capability lookups: KILLPRIV_V2 not in effect"
    );
    // Writes by root (CAP_FSETID) keep the bits.
    let rootw = make("rootw", 0o4777);
    OpenOptions::new()
        .append(true)
        .open(&rootw)
        .unwrap()
        .write_all(b"r")
        .unwrap();
    assert_eq!(mode_of(&rootw), 0o4777, "root's write keeps set-uid");

    // Unprivileged writes through handles nobody opened.
    let suid = make("suid", 0o4777);
    let sgid_x = make("sgid_x", 0o2777);
    let sgid_nox = make("sgid_nox", 0o2767);
    as_nobody(
        &mp,
        "printf x >> suid && printf x >> sgid_x && printf x >> sgid_nox",
        None,
    );
    assert_eq!(mode_of(&suid), 0o0777, "write by nobody clears set-uid");
    assert_eq!(mode_of(&sgid_x), 0o0777, "and group-executable set-gid");
    assert_eq!(
        mode_of(&sgid_nox),
        0o2767,
        "set-gid without g+x is not a privilege"
    );
    assert_eq!(fs::read(&suid).unwrap(), b"0123456789x");

    // An unprivileged write through a handle root opened (inherited descriptor).
    let inherited = make("inherited", 0o6777);
    let f = OpenOptions::new().append(true).open(&inherited).unwrap();
    as_nobody(&mp, "printf y", Some(f));
    assert_eq!(mode_of(&inherited), 0o0777);
    assert_eq!(fs::read(&inherited).unwrap(), b"0123456789y");

    // Truncate and O_TRUNC by nobody.
    let trunc = make("trunc", 0o4777);
    let otrunc = make("otrunc", 0o4777);
    as_nobody(&mp, "truncate -s 3 trunc && : > otrunc", None);
    assert_eq!(
        (mode_of(&trunc), fs::metadata(&trunc).unwrap().len()),
        (0o0777, 3)
    );
    assert_eq!(
        (mode_of(&otrunc), fs::metadata(&otrunc).unwrap().len()),
        (0o0777, 0)
    );

    // File capabilities (a VFS_CAP_REVISION_2 value granting CAP_NET_BIND_SERVICE) go with
    // an unprivileged write.
    let caps = make("caps", 0o0777);
    let mut cap = Vec::new();
    for w in [0x0200_0000u32, 1 << 10, 0, 0, 0] {
        cap.extend_from_slice(&w.to_le_bytes());
    }
    set_xattr(&caps, "security.capability", &cap).unwrap();
    assert!(get_xattr(&caps, "security.capability").is_ok());
    as_nobody(&mp, "printf z >> caps", None);
    let gone = get_xattr(&caps, "security.capability").unwrap_err();
    assert_eq!(
        gone.raw_os_error(),
        Some(libc::ENODATA),
        "capabilities dropped"
    );

    m.unmount().unwrap();
}

/// A write by an unprivileged user clears set-user-id behind the kernel's back (KILLPRIV_V2):
/// after the WRITE the kernel refreshes size and times but keeps its cached mode, so until its
/// attributes expired it still honoured the dropped bit — another user executing the file right
/// after ran it as its owner. The adapter now invalidates the kernel's attributes after such a
/// write (FUSE_NOTIFY_INVAL_INODE). A copy of `id`, owned by nobody, set-user-id, rewritten in
/// place by nobody (one byte, the same value), then run by daemon (uid 1) at once: it must
/// report euid 1.
#[test]
fn a_write_that_drops_set_user_id_is_seen_by_the_kernel_at_once() {
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    if skipped(Need::Fuse, fuse_as_root()) {
        return;
    }
    let s = scratch(Duration::from_secs(120));
    let opts = MountOptions {
        allow_other: true,
        // set-user-id is honoured only on a suid mount (fernfs mounts nosuid by default).
        passthrough: vec!["suid".into()],
        ..MountOptions::default()
    };
    let fs_ = Arc::new(Fs::mount(s.kv.clone()).unwrap());
    let m = Mounted::spawn(fs_, &s.mp, &opts).expect("FUSE mount");
    fs::set_permissions(&s.mp, fs::Permissions::from_mode(0o777)).unwrap();
    let id = s.mp.join("id");
    let euid_of_daemon = || {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new(&id)
            .arg("-u")
            .uid(1)
            .gid(1)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for round in 0..3 {
        fs::copy("/usr/bin/id", &id).unwrap();
        std::os::unix::fs::chown(&id, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).unwrap();
        assert_eq!(
            euid_of_daemon(),
            "65534",
            "round {round}: set-user-id works here"
        );
        as_nobody(
            &s.mp,
            "printf '\\177' | dd of=id bs=1 count=1 conv=notrunc status=none",
            None,
        );
        assert_eq!(
            euid_of_daemon(),
            "1",
            "round {round}: the kernel still honoured the set-user-id bit nobody's write dropped"
        );
        assert_eq!(mode_of(&id), 0o755);
        fs::remove_file(&id).unwrap();
    }
    m.unmount().unwrap();
}

/// open(O_RDONLY|O_TRUNC) of a file being executed is ETXTBSY on Linux, and must not touch the
/// file: with FUSE_ATOMIC_O_TRUNC the kernel let us truncate it before checking, killing the
/// running process (SIGBUS) — pjdfstest's open::etxtbsy flake.
#[test]
fn open_rdonly_trunc_of_a_running_executable_is_etxtbsy_and_harmless() {
    use std::os::unix::fs::OpenOptionsExt;
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    let s = scratch(Duration::from_secs(120));
    let (mp, kv) = (s.mp.clone(), s.kv.clone());
    let m = mount(&kv, &mp);
    let sleep = fs::read("/bin/sleep").unwrap();
    for round in 0..5 {
        let exe = mp.join(format!("sleep{round}"));
        fs::write(&exe, &sleep).unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = std::process::Command::new(&exe).arg("10").spawn().unwrap();
        let r = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_TRUNC)
            .open(&exe);
        assert_eq!(
            r.map(|_| ()).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ETXTBSY)),
            "round {round}"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: the running executable died: {:?}",
            child.try_wait()
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            fs::read(&exe).unwrap(),
            sleep,
            "round {round}: contents kept"
        );
    }
    // Without a process running it, the same open truncates.
    let f = mp.join("sleep0");
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(&f)
        .unwrap();
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);
    m.unmount().unwrap();
}

/// A failed LOOKUP is cached by the kernel as a negative entry for the mount's `negative_ttl`
/// (docs/fuse.md, "Kernel caching"): a name that appears behind the kernel's back — created
/// through the library here, as another writer of a shared store would — stays invisible
/// until the TTL runs out, which is right only for a store this mount alone writes. With
/// `negative_timeout=0` (shared stores, `MountOptions::shared`) it is seen at once. A name
/// the kernel creates itself is never hidden: it turns the negative entry positive.
#[test]
fn missing_names_are_cached_only_where_the_mount_is_the_only_writer() {
    if skipped(Need::Fuse, fuse_available()) {
        return;
    }
    for (opts, cached) in [
        (MountOptions::default(), true),
        (MountOptions::shared(Duration::from_secs(3600)), false),
    ] {
        let s = scratch(Duration::from_secs(60));
        let mp = &s.mp;
        let fs = Arc::new(Fs::mount(s.kv.clone()).expect("fern-fs mount"));
        let m = Mounted::spawn(fs.clone(), mp, &opts).expect("FUSE mount");

        assert!(fs::symlink_metadata(mp.join("late")).is_err());
        let root = fern_fs::perm::Cred::root();
        let a = fs
            .mkdir(&root, fern_fs::InodeId::ROOT, b"late", 0o755)
            .unwrap();
        fs.forget(a.ino, 1);
        assert_eq!(
            fs::symlink_metadata(mp.join("late")).is_ok(),
            !cached,
            "negative entry cached: {cached}"
        );
        // The kernel's own create through a cached negative entry.
        assert!(fs::symlink_metadata(mp.join("mine")).is_err());
        fs::write(mp.join("mine"), b"x").unwrap();
        assert_eq!(fs::read(mp.join("mine")).unwrap(), b"x");
        m.unmount().unwrap();
    }
}

/// The mount's read-ahead as the kernel has it, in KiB (its backing device's `read_ahead_kb`).
fn read_ahead_kb(mp: &Path) -> u64 {
    let dev = fs::metadata(mp).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

/// After the handshake the mount's read-ahead is `read_ahead` (4 MiB by default), so a large
/// file read in sequence arrives as 1 MiB READs — one per data extent — instead of the
/// kernel's 128 KiB; `read_ahead=0` leaves the kernel's own.
#[test]
fn the_mounts_read_ahead_is_set_after_the_handshake() {
    if skipped(Need::Fuse, fuse_as_root()) {
        return;
    }
    let s = scratch(Duration::from_secs(60));
    let fs_ = Arc::new(Fs::mount(s.kv.clone()).expect("fern-fs mount"));
    let kernel_default = {
        let mut opts = MountOptions::default();
        opts.parse_into("read_ahead=0").unwrap();
        let m = Mounted::spawn(fs_.clone(), &s.mp, &opts).expect("FUSE mount");
        let kb = read_ahead_kb(&s.mp);
        m.unmount().unwrap();
        kb
    };
    for (option, want) in [("", 4096), ("read_ahead=256k", 256)] {
        let mut opts = MountOptions::default();
        opts.parse_into(option).unwrap();
        let m = Mounted::spawn(fs_.clone(), &s.mp, &opts).expect("FUSE mount");
        assert_eq!(read_ahead_kb(&s.mp), want, "with '{option}'");
        m.unmount().unwrap();
    }
    assert_ne!(
        kernel_default, 1024,
        "the kernel's own read-ahead was left alone"
    );
}
