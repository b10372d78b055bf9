//! Extended attributes, never following a final symlink.
//!
//! Choice: the `l*xattr` calls on `/proc/self/fd/<parent fd>/<name>`. The
//! magic link pins the parent directory already resolved beneath the root,
//! the single remaining component is looked up in it, and the `l` variants
//! do not follow it if it is a symlink. This works on every kernel with
//! `/proc` mounted and needs no raw syscalls; the `*xattrat` calls of Linux
//! 6.13+ would do the same without `/proc` but libc does not expose them on
//! every architecture yet. Access to one's own `/proc/self/fd` is allowed to
//! the thread even while it acts as an unprivileged caller.
//!
//! Namespaces (`user.`, `trusted.`, `security.`...) are the backing kernel's
//! business: for a non-root caller `as_caller` has dropped `CAP_SYS_ADMIN`,
//! so `trusted.*` is invisible and unwritable exactly as natively.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use mapfs::Result;
use rustix::fs::XattrFlags;

use super::{Loc, Passthrough};

/// `/proc/self/fd/<fd>` or `/proc/self/fd/<fd>/<name>`.
pub(super) fn proc_fd_path(fd: BorrowedFd<'_>, name: Option<&OsStr>) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    if let Some(n) = name {
        p.push(n);
    }
    p
}

fn loc_path(loc: &Loc<'_>) -> PathBuf {
    proc_fd_path(loc.dir(), Some(loc.name()))
}

/// Calls `fill` with a buffer sized by `query` first; retries if the value
/// grew in between (`ERANGE`).
pub(crate) fn sized(
    query: impl Fn() -> rustix::io::Result<usize>,
    fill: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> Result<Vec<u8>> {
    loop {
        let n = query()?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; n];
        match fill(&mut buf) {
            Ok(m) => {
                buf.truncate(m);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The names in a `listxattr` answer (each ends with a NUL).
pub(crate) fn split_names(raw: &[u8]) -> Vec<OsString> {
    raw.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| OsString::from_vec(n.to_vec()))
        .collect()
}

impl Passthrough {
    pub(super) fn do_setxattr(
        &self,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let loc = self.loc(path)?;
        Ok(rustix::fs::lsetxattr(
            loc_path(&loc),
            name,
            value,
            XattrFlags::from_bits_retain(flags as u32),
        )?)
    }

    pub(super) fn do_getxattr(&self, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        let loc = self.loc(path)?;
        let p = loc_path(&loc);
        sized(
            || rustix::fs::lgetxattr_query(&p, name),
            |buf| rustix::fs::lgetxattr(&p, name, buf),
        )
    }

    pub(super) fn do_listxattr(&self, path: &Path) -> Result<Vec<OsString>> {
        let loc = self.loc(path)?;
        let p = loc_path(&loc);
        let raw = sized(
            || rustix::fs::llistxattr_query(&p),
            |buf| rustix::fs::llistxattr(&p, buf),
        )?;
        Ok(split_names(&raw))
    }

    pub(super) fn do_removexattr(&self, path: &Path, name: &OsStr) -> Result<()> {
        let loc = self.loc(path)?;
        Ok(rustix::fs::lremovexattr(loc_path(&loc), name)?)
    }
}
