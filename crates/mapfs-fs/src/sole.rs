//! One instance at a time over a backing directory, for the file systems
//! whose instances keep state another instance would need to see (`pack`:
//! the slots it reserved and the files unlinked while open; `versions`: its
//! write sessions). A second mount of the same directory would otherwise
//! reclaim the first one's slots, or version the same writes twice.
//!
//! The lock is an exclusive `flock` on a file of the store, held by the
//! instance for its life and released by the kernel when its process ends,
//! however it ends: a daemon that failover or `restart` replaces has exited
//! before its successor builds the file system, and the successor waits a
//! moment for a predecessor still exiting.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use mapfs::backing::openat2_beneath;
use mapfs::{Error, Result};
use rustix::fs::{FlockOperation, Mode, OFlags};

/// How long a new instance waits for the previous one to exit.
const WAIT: Duration = Duration::from_secs(5);

/// The lock of one instance; released when dropped.
#[derive(Debug)]
pub struct Sole {
    _file: File,
}

/// Takes the lock file `name` in `dir` (created if missing, mode 0600) for
/// the instance of the file system `what` over `shown` (for the message),
/// or fails with `EBUSY` when another instance holds it.
pub fn take(dir: BorrowedFd<'_>, name: &str, what: &str, shown: &str) -> Result<Sole> {
    lock(
        dir,
        name,
        what,
        shown,
        FlockOperation::NonBlockingLockExclusive,
    )
}

/// [`take`] for one of several instances that share the directory (the
/// processes of an embedded job, each running the file system): any
/// number of them hold the lock together, and none while a sole instance
/// (a mount) holds it, nor a mount while any of them does.
pub fn take_shared(dir: BorrowedFd<'_>, name: &str, what: &str, shown: &str) -> Result<Sole> {
    lock(
        dir,
        name,
        what,
        shown,
        FlockOperation::NonBlockingLockShared,
    )
}

/// The lock file `name` in `dir` taken exclusively if no instance holds it
/// now (no wait): for a shared instance that finds work a dead sole
/// instance left (see [`Sole::share`]).
pub fn try_take(dir: BorrowedFd<'_>, name: &str) -> Result<Option<Sole>> {
    let file = lock_file(dir, name)?;
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(Sole { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// [`take_shared`], but alone if no instance holds the lock now: then
/// `(lock, true)`, and the caller does what a sole instance does at its
/// start (what a dead sole instance left) before it [`Sole::share`]s the
/// lock with the others.
pub fn take_first_or_shared(
    dir: BorrowedFd<'_>,
    name: &str,
    what: &str,
    shown: &str,
) -> Result<(Sole, bool)> {
    match try_take(dir, name)? {
        Some(alone) => Ok((alone, true)),
        None => Ok((take_shared(dir, name, what, shown)?, false)),
    }
}

impl Sole {
    /// Turns a lock taken alone ([`try_take`]) into one of the shared
    /// instances' ([`take_shared`]). The kernel may drop the exclusive lock
    /// before it grants the shared one: a sole instance starting in that
    /// moment wins, and this fails as [`take_shared`] would have.
    pub fn share(self, what: &str, shown: &str) -> Result<Sole> {
        wait_for(
            self._file,
            what,
            shown,
            FlockOperation::NonBlockingLockShared,
        )
    }
}

fn lock_file(dir: BorrowedFd<'_>, name: &str) -> Result<File> {
    let fd = openat2_beneath(
        dir,
        OsStr::new(name),
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(File::from(fd))
}

fn lock(
    dir: BorrowedFd<'_>,
    name: &str,
    what: &str,
    shown: &str,
    op: FlockOperation,
) -> Result<Sole> {
    wait_for(lock_file(dir, name)?, what, shown, op)
}

fn wait_for(file: File, what: &str, shown: &str, op: FlockOperation) -> Result<Sole> {
    let start = Instant::now();
    loop {
        match rustix::fs::flock(&file, op) {
            Ok(()) => return Ok(Sole { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(Error::from_errno(libc::EBUSY).context(format!(
                    "{shown} is already served by another {what} instance (a mount of it, or \
                     a program running it): one at a time, unmount the other first"
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
}
