//! Record locks and `flock` on placeholders (files served by the data
//! engine): kept on the file system's lock file for the file, so that the
//! processes of a job, each with its own placeholders, see each other's
//! locks.
//!
//! Every lock is taken as an open-file-description lock (`F_OFD_*`) on
//! that file (a process's classic POSIX locks on a file would all go the
//! first time the process closes *any* descriptor of it, and the file
//! system opens and closes its backing files freely), on one of two
//! descriptions of it:
//! - POSIX record locks (`F_SETLK`, `F_SETLKW`, `F_GETLK`, `lockf`) on the
//!   process's description ([`crate::engine_fd::SharedFile::posix_lock_fd`]),
//!   one for every open of the file in the process: they are one set
//!   whatever descriptor took them, two opens of the process never
//!   conflict, `F_GETLK` does not report the process's own locks, closing
//!   any descriptor of the file drops them all, and a forked child does
//!   not inherit them, as POSIX says. `F_GETLK` reports `l_pid` -1 for
//!   another process's lock.
//! - `F_OFD_*` locks and `flock` on the open's own description
//!   ([`crate::engine_fd::EngineOpen::ofd_lock_fd`]): they belong to the
//!   open, shared by its `dup`s and forked children.

use std::ffi::c_int;
use std::os::fd::AsRawFd;

use libc::off_t;

use crate::engine_fd::EngineOpen;

/// The descriptor `o`'s `F_OFD_*` locks and `flock`s go to, or errno.
fn lock_raw(o: &EngineOpen) -> Result<c_int, c_int> {
    o.ofd_lock_fd().map(|f| f.as_raw_fd())
}

/// The descriptor the process's POSIX locks on `o`'s file go to, or errno.
fn posix_raw(o: &EngineOpen) -> Result<c_int, c_int> {
    o.shared().posix_lock_fd()
}

/// `fcntl(fd, cmd, arg)` when `cmd` is a lock command: `Some(result)` with
/// errno set, or `None` for any other command. `fcntl` is libc's, called
/// on the lock file.
///
/// # Safety
/// For a lock command, `arg` is the caller's pointer to a `struct flock`.
pub unsafe fn fcntl(
    o: &EngineOpen,
    cmd: c_int,
    arg: libc::c_ulong,
    real: impl FnOnce(c_int, c_int, libc::c_ulong) -> c_int,
) -> Option<c_int> {
    let (ofd, posix) = match cmd {
        libc::F_GETLK => (libc::F_OFD_GETLK, true),
        libc::F_SETLK => (libc::F_OFD_SETLK, true),
        libc::F_SETLKW => (libc::F_OFD_SETLKW, true),
        libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => (cmd, false),
        _ => return None,
    };
    let user = arg as *mut libc::flock;
    if user.is_null() {
        return Some(fail(libc::EFAULT));
    }
    let lfd = match if posix { posix_raw(o) } else { lock_raw(o) } {
        Ok(f) => f,
        Err(e) => return Some(fail(e)),
    };
    // SAFETY: per the contract.
    let mut fl = unsafe { *user };
    if let Err(e) = absolute(o, &mut fl) {
        return Some(fail(e));
    }
    // OFD locks require 0 here.
    fl.l_pid = 0;
    let r = real(lfd, ofd, &mut fl as *mut libc::flock as libc::c_ulong);
    if r == 0 && ofd == libc::F_OFD_GETLK {
        // SAFETY: per the contract.
        unsafe { *user = fl };
    }
    Some(r)
}

/// `flock(fd, op)` on the lock file.
pub fn flock(o: &EngineOpen, op: c_int, real: impl FnOnce(c_int, c_int) -> c_int) -> c_int {
    match lock_raw(o) {
        Ok(f) => real(f, op),
        Err(e) => fail(e),
    }
}

/// `lockf(fd, cmd, len)`: the range from the description's offset.
pub fn lockf(o: &EngineOpen, cmd: c_int, len: off_t) -> c_int {
    let lfd = match posix_raw(o) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let start = o.offset_now() as off_t;
    let (start, len) = if len < 0 {
        (start + len, -len)
    } else {
        (start, len)
    };
    if start < 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: `flock` is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    let (op, ty) = match cmd {
        libc::F_LOCK => (libc::F_OFD_SETLKW, libc::F_WRLCK),
        libc::F_TLOCK => (libc::F_OFD_SETLK, libc::F_WRLCK),
        libc::F_ULOCK => (libc::F_OFD_SETLK, libc::F_UNLCK),
        libc::F_TEST => (libc::F_OFD_GETLK, libc::F_WRLCK),
        _ => return fail(libc::EINVAL),
    };
    fl.l_type = ty as i16;
    // SAFETY: libc's fcntl on the lock file with a valid `struct flock`
    // (it passes through this library's hook, inside its guard).
    let r = unsafe { libc::fcntl(lfd, op, &mut fl as *mut libc::flock) };
    if r == 0 && cmd == libc::F_TEST && fl.l_type != libc::F_UNLCK as i16 {
        return fail(libc::EACCES);
    }
    r
}

/// Makes `fl`'s range absolute: the lock file has no offset or size of
/// its own to be relative to.
fn absolute(o: &EngineOpen, fl: &mut libc::flock) -> Result<(), c_int> {
    let base = match fl.l_whence as c_int {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => o.offset_now() as off_t,
        libc::SEEK_END => o.size()? as off_t,
        _ => return Err(libc::EINVAL),
    };
    fl.l_start = fl.l_start.checked_add(base).ok_or(libc::EOVERFLOW)?;
    fl.l_whence = libc::SEEK_SET as i16;
    Ok(())
}

fn fail(e: c_int) -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
    -1
}
