//! The open through the mount kept beside an adoption: the file
//! system's `release` runs at the application's close, not at adoption, and
//! locks of adopted descriptors are the mount's locks, seen by processes that
//! use the mount without the shim.
//!
//! Each test drives a python3 program under the shim step by step (it
//! prints a stage name and waits for `go` on stdin) and checks from this
//! process, through the mount, what another process sees at that stage.

mod common;
mod preload_support;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use common::{flock_struct, fuse_or_skip, mount, DataMode};
use preload_support::*;

/// Python helpers every script starts with.
const PRELUDE: &str = r#"
import os, sys, fcntl, ctypes
libc = ctypes.CDLL(None, use_errno=True)
status = libc.mapfs_preload_fd_status
def stage(name):
    print(name, flush=True)
    assert sys.stdin.readline().strip() == 'go'
fd = os.open(sys.argv[1], os.O_RDWR)
assert os.pread(fd, 10, 0) == b'0123456789'
assert status(fd) == 3, f'not adopted: {status(fd)}'
"#;

const LOCKS_SCRIPT: &str = r#"
EXECED = """
import os, sys, fcntl, ctypes
fd = int(sys.argv[1])
assert ctypes.CDLL(None).mapfs_preload_fd_status(fd) == 3, 'not re-adopted after exec'
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 500, 0)
print('execed', flush=True)
assert sys.stdin.readline().strip() == 'go'
"""
d = os.dup(fd)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0, 0)
stage('posix')
os.close(d)
import struct
q = struct.pack('hhqqi', fcntl.F_WRLCK, os.SEEK_CUR, 5, 10, 0)
r = struct.unpack('hhqqi', fcntl.fcntl(fd, fcntl.F_GETLK, q)[:28])
assert r[:4] == (fcntl.F_UNLCK, os.SEEK_CUR, 5, 10), f'F_GETLK without conflict: {r}'
stage('dup-closed')
os.lseek(fd, 1000, 0)
assert libc.lockf(fd, 2, 50) == 0, ctypes.get_errno()   # F_TLOCK [1000, 1050)
assert os.lseek(fd, 0, 1) == 1000
stage('lockf')
assert libc.lockf(fd, 0, 50) == 0                        # F_ULOCK
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
stage('flock')
os.set_inheritable(fd, True)
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, '-c', EXECED, str(fd)])
assert os.waitpid(pid, 0)[1] == 0
# A failed exec leaves the kept open close-on-exec again.
try:
    os.execv('/nonexistent/mapfs-test', ['x'])
except OSError:
    pass
kept = [int(n) for n in os.listdir('/proc/self/fd')
        if int(n) >= 512 and os.readlink(f'/proc/self/fd/{n}') == sys.argv[1]]
assert kept and not any(os.get_inheritable(k) for k in kept), f'kept {kept}'
os.close(fd)
stage('closed')
"#;

/// `F_GETLK` for a write lock on `[start, start+len)` through `f`: the pid
/// of a conflicting holder, if any.
fn holder(f: &File, start: i64, len: i64) -> Option<i32> {
    let mut l = flock_struct(libc::F_WRLCK, start, len);
    // SAFETY: F_GETLK with a valid struct flock.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut l) };
    assert_eq!(r, 0, "F_GETLK: {}", std::io::Error::last_os_error());
    (l.l_type != libc::F_UNLCK as i16).then_some(l.l_pid)
}

/// `F_SETLK` of `ty` on `[start, start+len)` through `f`.
fn setlk(f: &File, ty: i32, start: i64, len: i64) -> std::io::Result<()> {
    let l = flock_struct(ty, start, len);
    // SAFETY: F_SETLK with a valid struct flock.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &l) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn try_flock(f: &File) -> std::io::Result<()> {
    // SAFETY: flock on an open descriptor.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn locks_are_the_mounts(mode: DataMode) {
    let test = format!("preload locks ({mode})");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let s = mount(mode, &[]);
    let path = s.mountpoint().join("locked.db");
    std::fs::write(&path, b"0123456789".repeat(200)).unwrap();
    let mut p = Stepped::start(&s, "locks", &format!("{PRELUDE}{LOCKS_SCRIPT}"), &path);
    let pid = p.child.id() as i32;
    // This process uses the mount without the shim.
    let mine = File::options().read(true).write(true).open(&path).unwrap();

    p.reached("posix");
    assert_eq!(holder(&mine, 0, 100), Some(pid), "{test}: F_GETLK");
    let e = setlk(&mine, libc::F_WRLCK, 50, 10).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
        "{test}: a conflicting F_SETLK through the mount must fail, got {e}"
    );
    setlk(&mine, libc::F_WRLCK, 100, 100).expect("a lock next to the shim's");
    setlk(&mine, libc::F_UNLCK, 100, 100).unwrap();
    p.go();

    p.reached("dup-closed");
    assert_eq!(
        holder(&mine, 0, 100),
        None,
        "{test}: closing a dup must drop the process's record locks"
    );
    p.go();

    p.reached("lockf");
    assert_eq!(
        holder(&mine, 1000, 50),
        Some(pid),
        "{test}: lockf from the offset"
    );
    assert_eq!(holder(&mine, 0, 1000), None, "{test}: lockf range start");
    assert_eq!(holder(&mine, 1050, 0), None, "{test}: lockf range end");
    p.go();

    p.reached("flock");
    let e = try_flock(&mine).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EWOULDBLOCK),
        "{test}: flock held under the shim must exclude the mount"
    );
    p.go();

    p.reached("execed");
    let execed = holder(&mine, 500, 10);
    assert!(
        execed.is_some_and(|h| h != pid),
        "{test}: a lock taken after exec on an inherited descriptor: {execed:?}"
    );
    assert!(
        try_flock(&mine).is_err(),
        "{test}: the flock shared with the exec'd child"
    );
    p.go();

    p.reached("closed");
    try_flock(&mine).expect("flock is free once the shim process closed its file");
    assert_eq!(holder(&mine, 0, 0), None, "{test}: no record lock left");
    p.go();
    p.finish();
}

#[test]
fn locks_of_adopted_descriptors_are_the_mounts_passthrough() {
    locks_are_the_mounts(DataMode::Passthrough);
}

#[test]
fn locks_of_adopted_descriptors_are_the_mounts_daemon() {
    locks_are_the_mounts(DataMode::DaemonNoWriteback);
}

/// Descriptors of the daemon open on `backing` (how many opens of it the
/// daemon serves).
fn daemon_opens_of(daemon: i32, backing: &Path) -> usize {
    let want = std::fs::canonicalize(backing).unwrap();
    std::fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == want))
        .count()
}

fn release_at_close(mode: DataMode) {
    let test = format!("preload release at close ({mode})");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let s = mount(mode, &[]);
    let path = s.mountpoint().join("kept.bin");
    std::fs::write(&path, b"0123456789".repeat(10)).unwrap();
    let backing = s.backing().join("kept.bin");
    let daemon = daemon_pid(&s);
    eventually("the daemon to release the test's own write", || {
        daemon_opens_of(daemon, &backing) == 0
    });
    let script = format!("{PRELUDE}stage('adopted')\nos.close(fd)\nstage('closed')\n");
    let mut p = Stepped::start(&s, "release", &script, &path);
    p.reached("adopted");
    assert!(
        daemon_opens_of(daemon, &backing) >= 1,
        "{test}: the file system's open must live until the application closes its file"
    );
    p.go();
    p.reached("closed");
    eventually("the daemon to release the closed file", || {
        daemon_opens_of(daemon, &backing) == 0
    });
    p.go();
    p.finish();
}

#[test]
fn release_runs_at_the_applications_close_passthrough() {
    release_at_close(DataMode::Passthrough);
}

#[test]
fn release_runs_at_the_applications_close_daemon() {
    release_at_close(DataMode::DaemonNoWriteback);
}

/// Two opens of one file in one process, the first holding a record
/// lock: the second open's data calls (which adopt or lend it, putting
/// another file under its number) and its close must not drop the lock,
/// which POSIX drops only when the process closes a descriptor of the
/// file. SQLite's connections, one per thread, are such opens.
const SECOND_OPEN_SCRIPT: &str = r#"
import os, sys, fcntl
def stage(name):
    print(name, flush=True)
    assert sys.stdin.readline().strip() == 'go'
a = os.open(sys.argv[1], os.O_RDWR)
os.pwrite(a, b'a' * 4096, 0)
fcntl.lockf(a, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0, 0)
b = os.open(sys.argv[1], os.O_RDWR)
for i in range(20):
    os.pwrite(b, b'b', 200 + i)
    assert os.pread(b, 1, 0) == b'a'
stage('second-open-used')
"#;

fn second_open_keeps_locks(fs: &str) {
    let test = format!("preload locks, second open ({fs})");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let s = mapfs_testkit::MountSession::builder(common::mapfs_bin())
        .fs(fs)
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let path = s.mountpoint().join("two.db");
    std::fs::write(&path, b"0123456789".repeat(500)).unwrap();
    let mut p = Stepped::start(&s, "second-open", SECOND_OPEN_SCRIPT, &path);
    let pid = p.child.id() as i32;
    let mine = File::options().read(true).write(true).open(&path).unwrap();
    p.reached("second-open-used");
    assert_eq!(
        holder(&mine, 0, 100),
        Some(pid),
        "{test}: the lock of the first open was dropped"
    );
    p.go();
    p.finish();
}

#[test]
fn a_second_open_keeps_the_first_opens_locks_passthrough() {
    second_open_keeps_locks("passthrough");
}

#[test]
fn a_second_open_keeps_the_first_opens_locks_plfs() {
    second_open_keeps_locks("plfs");
}
