//! Syscall wrappers the safe crates do not have.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Takes ownership of descriptor `fd`, inherited from the parent process
/// that named it, after checking that it is an open socket; sets
/// close-on-exec so that it goes no further.
pub fn inherited_socket(fd: i32) -> io::Result<OwnedFd> {
    // Checked on the number before it is owned: a stale or wrong number
    // must not become an `OwnedFd` that closes someone else's descriptor.
    let st = nix::sys::stat::fstat(
        // SAFETY: borrowed only for this call; fstat fails with EBADF on a
        // number that is not open.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .map_err(|e| io::Error::other(format!("inherited descriptor {fd}: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other(format!(
            "inherited descriptor {fd} is not a socket"
        )));
    }
    // SAFETY: `fd` is open (fstat succeeded), was handed to this process by
    // its parent for this purpose, and is taken once (the caller removes
    // the variable that named it).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}
