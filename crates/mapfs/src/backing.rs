//! Safe access to the backing store: every path is resolved beneath the
//! backing root's directory fd, so `..` and symlinks can never escape it.
//! Paths are never concatenated onto the root's host path, so a path close to
//! PATH_MAX inside the file system stays usable.

use std::ffi::OsString;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use crate::error::Result;

/// The backing root directory, held open.
#[derive(Debug)]
pub struct BackingRoot {
    root: OwnedFd,
}

impl BackingRoot {
    /// Opens `dir` as a backing root (must be a directory).
    pub fn new(dir: &Path) -> Result<Self> {
        todo!()
    }

    /// The root directory fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        todo!()
    }

    /// Opens `path` (absolute inside the file system, `/` is the root) with
    /// `flags`, resolved beneath the root with no magic links; `..` and
    /// absolute symlinks that would leave the root fail with `EXDEV`.
    pub fn open(&self, path: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        todo!()
    }

    /// Opens the parent directory of `path` (`O_PATH|O_DIRECTORY`, beneath
    /// the root) and returns it with the final name, for `*at` calls that
    /// must not follow a final symlink.
    pub fn parent(&self, path: &Path) -> Result<(OwnedFd, OsString)> {
        todo!()
    }
}
