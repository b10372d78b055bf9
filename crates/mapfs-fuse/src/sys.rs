//! Syscall wrappers the safe crates do not have.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use rustix::mm::{MapFlags, ProtFlags};

/// Takes ownership of descriptor `fd`, inherited from the parent process
/// that named it, after checking that it is an open socket; sets
/// close-on-exec so that it goes no further.
pub fn inherited_socket(fd: i32) -> io::Result<OwnedFd> {
    inherited(fd, "a socket", |st| {
        st.st_mode & libc::S_IFMT == libc::S_IFSOCK as _
    })
}

/// A descriptor inherited from the parent at number `fd`, checked with
/// `check` (given its `fstat`) before it is owned, and made close-on-exec.
fn inherited(
    fd: i32,
    what: &str,
    check: impl FnOnce(&rustix::fs::Stat) -> bool,
) -> io::Result<OwnedFd> {
    let st = rustix::fs::fstat(
        // SAFETY: borrowed only for this call; fstat fails with EBADF on a
        // number that is not open.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .map_err(|e| io::Error::other(format!("inherited descriptor {fd}: {e}")))?;
    if !check(&st) {
        return Err(io::Error::other(format!(
            "inherited descriptor {fd} is not {what}"
        )));
    }
    // SAFETY: `fd` is open (fstat succeeded), was handed to this process by
    // its parent for this purpose, and is taken once (the caller removes
    // the variable that named it).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// An inherited regular file (a memfd) of exactly `size` bytes.
pub fn inherited_memfd(fd: i32, size: u64) -> io::Result<OwnedFd> {
    inherited(fd, &format!("a file of {size} bytes"), |st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG as _ && st.st_size as u64 == size
    })
}

/// An inherited eventfd.
pub fn inherited_eventfd(fd: i32) -> io::Result<OwnedFd> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    let is_eventfd = link.is_some_and(|l| l.as_os_str() == "anon_inode:[eventfd]");
    inherited(fd, "an eventfd", |_| is_eventfd)
}

/// A shared read-write mapping of the first `words` 64-bit words of a file,
/// touched only through atomics (memory another process maps too);
/// unmapped on drop.
pub struct SharedWords {
    words: &'static [AtomicU64],
}

impl std::fmt::Debug for SharedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedWords({} words)", self.words.len())
    }
}

impl SharedWords {
    /// Maps `fd` (at least `words * 8` bytes long).
    pub fn map(fd: BorrowedFd<'_>, words: usize) -> io::Result<SharedWords> {
        // SAFETY: a new mapping at an address the kernel chooses, so no
        // existing memory is aliased. It is page-aligned (so aligned for
        // AtomicU64, which has u64's layout), `words * 8` bytes long, and
        // every process touches it only through atomics. The slice lives in
        // this value, which unmaps it on drop and lends it out only for the
        // borrow of `&self`. The callers' files are never shrunk while
        // mapped (a memfd only its two ends hold).
        unsafe {
            let p = rustix::mm::mmap(
                std::ptr::null_mut(),
                words * 8,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?;
            Ok(SharedWords {
                words: std::slice::from_raw_parts(p.cast::<AtomicU64>(), words),
            })
        }
    }
}

impl std::ops::Deref for SharedWords {
    type Target = [AtomicU64];

    fn deref(&self) -> &[AtomicU64] {
        self.words
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length; no reference
        // into it outlives `self` (lent only through `&self`).
        unsafe {
            let _ = rustix::mm::munmap(self.words.as_ptr() as *mut _, self.words.len() * 8);
        }
    }
}
