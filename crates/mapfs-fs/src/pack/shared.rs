//! Several instances over one store: the processes of an embedded job
//! (`mapfs run --embed pack:BACKING:PREFIX`), each running `pack` itself
//! with its own connection to the database.
//!
//! A daemon knows every open of its store, so it frees a slot, or deletes a
//! file whose last name went, when its own last open of it ends. Shared
//! instances cannot see each other's opens, so each says what it holds with
//! OFD read locks, which the kernel drops when the process ends however it
//! ends:
//!
//! - on a slot's byte range of its pack file, while any open of this
//!   process uses the slot (`slots.rs`, as a daemon does for `mapfs pack
//!   compact`);
//! - on byte `ino` of [`OPENS_NAME`], while any open of this process has
//!   file `ino` open.
//!
//! A slot a file leaves is marked as used by opens only (`ino < 0`) and a
//! file's last name sets its link count to 0, as in a daemon; whoever could
//! free it then tries ([`Reap`], after the transaction that left it): it
//! takes a write lock on the range or byte without waiting, which succeeds
//! only if no process holds it, frees in one transaction, and lets go. An
//! open that read the slot or file before the free waits for the read lock
//! and then reads the database again, as it does after a compaction. When
//! two instances let go at the same moment both tries may fail: the slot or
//! file then waits for the next instance that starts alone (a mount, or the
//! first process of a job), which reclaims everything only opens held.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use mapfs::{Error, Result};
use nix::fcntl::{fcntl, FcntlArg};
use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags};

use super::db::Slot;

/// The file whose bytes stand for inodes in the open locks.
pub const OPENS_NAME: &str = "pack.opens";

/// Work a transaction left for after its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// A slot now used by opens only: free it if no process uses it.
    Slot(Slot),
    /// A file with no name left: delete it if no process has it open.
    Ino(i64),
}

/// This process's descriptor of [`OPENS_NAME`] (one description per
/// process: a forked child opens its own, see [`OpenLocks::reset`]).
#[derive(Debug)]
pub struct OpenLocks {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl OpenLocks {
    /// The open locks of the store in `backing` (the file is opened at first
    /// use).
    pub fn new(backing: &Path) -> Self {
        OpenLocks {
            path: backing.join(OPENS_NAME),
            file: Mutex::new(None),
        }
    }

    /// Forgets the descriptor (in a forked child: the locks on it are the
    /// parent's, and the parent lets go of them).
    pub fn reset(&self) {
        if let Some(f) = self.file.lock().take() {
            // Closing would not drop the parent's OFD locks, but the file
            // stays the parent's business.
            std::mem::forget(f);
        }
    }

    fn with<T>(&self, f: impl FnOnce(&File) -> Result<T>) -> Result<T> {
        let mut g = self.file.lock();
        if g.is_none() {
            let fd = rustix::fs::open(
                &self.path,
                OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            // Opened at first use, in a program when embedded: above the
            // numbers the program uses (see `mapfs::fdnum`).
            *g = Some(File::from(mapfs::fdnum::lasting(fd)));
        }
        f(g.as_ref().expect("just opened"))
    }

    /// Marks `ino` open by this process, waiting while another deletes it.
    pub fn hold(&self, ino: i64) -> Result<()> {
        self.with(|f| lock(f, ino as u64, 1, libc::F_RDLCK, true))
    }

    /// This process no longer has `ino` open.
    pub fn unhold(&self, ino: i64) {
        let _ = self.with(|f| lock(f, ino as u64, 1, libc::F_UNLCK, false));
    }

    /// True when no other process has `ino` open. Takes `ino`'s byte for
    /// writing: the caller [`OpenLocks::unhold`]s it when done, or
    /// [`OpenLocks::hold`]s it again if this process has the file open.
    pub fn take_alone(&self, ino: i64) -> Result<bool> {
        self.with(|f| try_write(f, ino as u64, 1))
    }
}

/// Takes a write lock on `len` bytes at `start` of `file` without waiting:
/// false when another description holds any of them.
pub fn try_write(file: &File, start: u64, len: u64) -> Result<bool> {
    match lock(file, start, len, libc::F_WRLCK, false) {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == libc::EAGAIN || e.errno() == libc::EACCES => Ok(false),
        Err(e) => Err(e),
    }
}

/// An OFD lock of type `ty` on `len` bytes at `start` of `file`.
pub fn lock(file: &File, start: u64, len: u64, ty: i32, wait: bool) -> Result<()> {
    let fl = libc::flock {
        l_type: ty as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start as libc::off_t,
        l_len: len as libc::off_t,
        // An OFD lock has no owning process: the kernel wants 0 here.
        l_pid: 0,
    };
    loop {
        let arg = if wait {
            FcntlArg::F_OFD_SETLKW(&fl)
        } else {
            FcntlArg::F_OFD_SETLK(&fl)
        };
        match fcntl(file.as_fd(), arg) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::from_errno(e as i32)),
        }
    }
}
