//! Where a file system keeps the descriptors it holds for a long time.
//!
//! Embedded, a file system runs inside the program, and the program owns
//! the small descriptor numbers: a shell's `exec 3> f` replaces whatever
//! has number 3, and `exec 3>&-` closes it. A descriptor a file system
//! opens after its start (a lock file opened at first use, a database
//! reopened in a forked child) would take the lowest free number. Such
//! descriptors are moved to [`LASTING_FROM`] and up, where programs do not
//! reach (dash keeps its own at 10 and up).

use std::os::fd::OwnedFd;

/// The lowest number a lasting descriptor takes.
pub const LASTING_FROM: i32 = 100;

/// `fd` moved to a number of [`LASTING_FROM`] or more, close-on-exec (kept
/// where it is when the move fails, for example under a low descriptor
/// limit).
pub fn lasting(fd: OwnedFd) -> OwnedFd {
    if std::os::fd::AsRawFd::as_raw_fd(&fd) >= LASTING_FROM {
        return fd;
    }
    rustix::io::fcntl_dupfd_cloexec(&fd, LASTING_FROM).unwrap_or(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_descriptor_moves_up_and_the_low_number_is_freed() {
        let f: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let low = std::os::fd::AsRawFd::as_raw_fd(&f);
        assert!(low < LASTING_FROM, "the test needs a low number");
        let high = lasting(f);
        assert!(std::os::fd::AsRawFd::as_raw_fd(&high) >= LASTING_FROM);
        // SAFETY: probing a number for an open descriptor.
        let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(low) };
        assert!(
            rustix::io::fcntl_getfd(b).is_err(),
            "the low number stayed open"
        );
    }
}
