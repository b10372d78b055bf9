//! Acting as another user in permission tests.
//!
//! Two ways: [`command_as`] for whole programs (std's `CommandExt::uid/gid`,
//! which also drops root's supplementary groups), and [`run_as`] for a few raw
//! syscalls whose exact errno the test compares with native.

use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::io::Errno;

/// uid of `nobody` on Debian.
pub const NOBODY_UID: u32 = 65534;
/// gid of `nogroup` on Debian.
pub const NOBODY_GID: u32 = 65534;

/// A [`Command`] that runs `program` as `uid`/`gid` with no supplementary groups.
pub fn command_as(program: impl AsRef<std::ffi::OsStr>, uid: u32, gid: u32) -> Command {
    let mut cmd = Command::new(program);
    cmd.uid(uid).gid(gid);
    cmd
}

/// A [`Command`] that runs `program` as nobody/nogroup.
pub fn command_as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    command_as(program, NOBODY_UID, NOBODY_GID)
}

/// Runs `sh -c script` as nobody and returns its output.
pub fn sh_as_nobody(script: &str) -> std::io::Result<std::process::Output> {
    command_as_nobody("/bin/sh")
        .arg("-c")
        .arg(script)
        .env("HOME", "/")
        .output()
}

/// Runs `f` in a forked child that switched to `uid`/`gid` (no supplementary
/// groups) and returns its result (`Err(errno)` as reported by `f`).
///
/// The child is a fork of a multi-threaded test process, so `f` must only make
/// raw system calls on data prepared before the call (rustix calls taking
/// `&CStr` paths qualify): no allocation, no printing, no locks. All fds but
/// 0-2 are closed in the child before `f` runs.
pub fn run_as(uid: u32, gid: u32, f: impl FnOnce() -> Result<(), Errno>) -> Result<(), Errno> {
    // SAFETY: fork(2) wrapper. The child only performs raw syscalls (documented
    // contract of `f`) and leaves through _exit, never returning into Rust code
    // that may touch locks held by other threads of the parent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    if pid == 0 {
        // The child inherited every fd of every test thread; holding them
        // would keep other tests' flock()s and open files alive. `f` opens
        // what it needs itself.
        // SAFETY: close_range(2) on the child's own fd table.
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
        // SAFETY: plain credential syscalls in the freshly forked child.
        let ok = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(gid) == 0
                && libc::setuid(uid) == 0
        };
        let code = if !ok {
            // 255 is not an errno: the parent reports it as a set-up failure.
            255
        } else {
            match f() {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().clamp(1, 254),
            }
        };
        // SAFETY: terminating the child without running atexit handlers or
        // destructors that belong to the parent.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            panic!("waitpid({pid}) failed: {}", std::io::Error::last_os_error());
        }
    }
    assert!(
        libc::WIFEXITED(status),
        "run_as child died abnormally (status {status:#x})"
    );
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        255 => panic!("run_as child could not switch to uid {uid} gid {gid}"),
        e => Err(Errno::from_raw_os_error(e)),
    }
}

/// [`run_as`] for nobody/nogroup.
pub fn run_as_nobody(f: impl FnOnce() -> Result<(), Errno>) -> Result<(), Errno> {
    run_as(NOBODY_UID, NOBODY_GID, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_has_no_groups() {
        if !rustix::process::getuid().is_root() {
            eprintln!("SKIPPED nobody_has_no_groups: needs root");
            return;
        }
        let out = command_as_nobody("id").output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.contains("uid=65534"), "{s}");
        assert!(!s.contains("(root)"), "root group leaked: {s}");
    }

    #[test]
    fn run_as_reports_errno() {
        if !rustix::process::getuid().is_root() {
            eprintln!("SKIPPED run_as_reports_errno: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path =
            std::ffi::CString::new(dir.path().join("x").into_os_string().into_encoded_bytes())
                .unwrap();
        // tempdir is 0700 root: nobody may not create in it.
        let r = run_as_nobody(|| {
            rustix::fs::mkdir(path.as_c_str(), rustix::fs::Mode::from_raw_mode(0o755))
        });
        assert_eq!(r, Err(Errno::ACCESS));
        assert_eq!(run_as_nobody(|| Ok(())), Ok(()));
    }
}
