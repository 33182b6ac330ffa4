//! Mounting without root through the set-uid `fusermount3`, by libfuse's protocol: the
//! helper gets one end of a socket pair in `_FUSE_COMMFD`, opens /dev/fuse, mounts it (with
//! `subtype=fernfs` the type is `fuse.fernfs`) and sends the descriptor back as SCM_RIGHTS.
//! It owns that exchange only; unmounting is `mount::KernelMount`'s.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};

/// Runs `fusermount3 -o OPTIONS -- MOUNTPOINT` and returns the /dev/fuse descriptor it sends.
pub(crate) fn mount(mp: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    // The child must inherit its end: a descriptor made without CLOEXEC, by duplicating.
    let theirs_inherited = nix::unistd::dup(&theirs)?;
    drop(theirs);
    let child = Command::new("fusermount3")
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mp)
        .env("_FUSE_COMMFD", theirs_inherited.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    drop(theirs_inherited);
    let child = child.map_err(|e| io::Error::other(format!("fusermount3: {e}")))?;
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(Some(fd)) if out.status.success() => Ok(fd),
        _ => Err(io::Error::other(format!(
            "fusermount3 could not mount {}: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

fn receive_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!(std::os::fd::RawFd);
    let msg = loop {
        match recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r?,
        }
    };
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel has just installed `fd` in our table for this message;
                // nothing else refers to it, so the OwnedFd is its only owner.
                #[allow(unsafe_code)]
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    Ok(None)
}
