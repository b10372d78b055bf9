//! Finding a mount's daemon as a pidfd, so `umount` waits for that very
//! process and never for whatever process reuses its pid.
//!
//! First choice: the daemon's control socket, whose listening end the
//! kernel ties to the process that made it (`SO_PEERPIDFD`, Linux 6.5); a
//! pid file is only trusted once the process it names is confirmed to be
//! serving this mountpoint.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::mounts;

/// `SO_PEERPIDFD` of `<asm-generic/socket.h>` (Linux 6.5).
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the daemon serving `mountpoint`, if one can be confirmed.
pub fn daemon_of(mountpoint: &Path) -> Option<OwnedFd> {
    from_socket(mountpoint).or_else(|| from_pid_file(mountpoint))
}

/// A pidfd of the supervisor of the daemon serving `mountpoint`: the
/// supervisor its info file names, kept only if that process is a mapfs
/// supervisor of this mountpoint (checked after the pidfd is taken).
pub fn supervisor_of(mountpoint: &Path) -> Option<OwnedFd> {
    let pid = mounts::read_info(mountpoint)?.supervisor_pid?;
    confirmed(pid as i32, mountpoint)
}

/// The pidfd of the process listening on the mount's control socket.
fn from_socket(mountpoint: &Path) -> Option<OwnedFd> {
    let sock = UnixStream::connect(mapfs::control::socket_path(mountpoint)).ok()?;
    peer_pidfd(&sock)
}

/// `getsockopt(SO_PEERPIDFD)`.
fn peer_pidfd(sock: &UnixStream) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes (one int) to `fd`, both
    // valid for the call; `sock` is an open socket.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return None;
    }
    // SAFETY: on success the kernel installed a new descriptor we now own.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd for the pid in the mount's pid file, kept only if that process
/// is a mapfs daemon of this mountpoint (checked after the pidfd is taken,
/// so a pid reused later cannot slip in).
fn from_pid_file(mountpoint: &Path) -> Option<OwnedFd> {
    let pid: i32 = std::fs::read_to_string(mounts::pid_path(mountpoint))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    confirmed(pid, mountpoint)
}

/// A pidfd of `pid` if it is a background mapfs process (daemon or
/// supervisor) of `mountpoint`.
fn confirmed(pid: i32, mountpoint: &Path) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())).ok()?;
    let want = mountpoint.as_os_str().as_encoded_bytes();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let serves = args.contains(&b"mount".as_slice())
        && args.contains(&b"--daemonized".as_slice())
        && args.contains(&want);
    serves.then_some(fd)
}

/// Is process `pid` running? A pidfd turns readable when its process
/// exits, zombie or not, where `kill(pid, 0)` still succeeds for a zombie
/// nobody reaped; `kill` is the fallback for kernels without pidfds.
pub fn running(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => !wait_exit(&fd, Duration::ZERO),
        Err(rustix::io::Errno::NOSYS) => rustix::process::test_kill_process(p).is_ok(),
        Err(_) => false,
    }
}

/// Waits until the process of `pidfd` exits (its pidfd turns readable);
/// false if it is still running after `timeout`.
pub fn wait_exit(pidfd: &OwnedFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: one valid pollfd, for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return rc > 0;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_child_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("sleep");
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        assert!(!wait_exit(&fd, Duration::ZERO), "exited at once?");
        assert!(wait_exit(&fd, Duration::from_secs(60)));
        child.wait().unwrap();
    }

    #[test]
    fn peer_pidfd_names_the_listening_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let sock = UnixStream::connect(&path).unwrap();
        let fd = peer_pidfd(&sock).expect("SO_PEERPIDFD (Linux >= 6.5)");
        let fdinfo =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
        let pid_line = fdinfo.lines().find(|l| l.starts_with("Pid:")).unwrap();
        assert_eq!(
            pid_line.split_whitespace().nth(1),
            Some(std::process::id().to_string().as_str())
        );
    }
}
