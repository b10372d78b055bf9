//! Names: special files, symlinks, hard links, unlink, rename.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use mapfs::{Attr, Error, RenameFlags, Result};
use rustix::fs::{AtFlags, FileType, Mode};

use super::attr::stat_loc;
use super::Passthrough;

impl Passthrough {
    pub(super) fn do_readlink(&self, path: &Path) -> Result<OsString> {
        let loc = self.loc(path)?;
        let target = rustix::fs::readlinkat(loc.dir(), loc.name(), Vec::new())?;
        Ok(OsString::from_vec(target.into_bytes()))
    }

    /// Devices need `CAP_MKNOD`, which `as_caller` has removed for
    /// non-root callers, so the kernel refuses them with `EPERM` as it
    /// would natively.
    pub(super) fn do_mknod(&self, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        let loc = self.loc(path)?;
        let kind = match mode & libc::S_IFMT {
            0 => FileType::RegularFile,
            m => FileType::from_raw_mode(m),
        };
        if kind == FileType::Directory || kind == FileType::Symlink {
            return Err(Error::invalid());
        }
        rustix::fs::mknodat(
            loc.dir(),
            loc.name(),
            kind,
            Mode::from_raw_mode(mode & 0o7777),
            rdev,
        )?;
        stat_loc(&loc)
    }

    pub(super) fn do_unlink(&self, path: &Path) -> Result<()> {
        let loc = self.loc(path)?;
        Ok(rustix::fs::unlinkat(
            loc.dir(),
            loc.name(),
            AtFlags::empty(),
        )?)
    }

    pub(super) fn do_symlink(&self, target: &OsStr, path: &Path) -> Result<Attr> {
        let loc = self.loc(path)?;
        // The target is stored verbatim: it is only ever resolved beneath
        // the root (or by the kernel inside the mount), so it is harmless.
        rustix::fs::symlinkat(target, loc.dir(), loc.name())?;
        stat_loc(&loc)
    }

    /// A namespace change for an embedded job's kept directories: any
    /// rename (knowing whether it moves a directory would take one more
    /// system call), its own resolution included, so that it never acts
    /// from a kept directory itself.
    pub(super) fn do_rename(&self, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        self.changing(|| {
            let a = self.loc(from)?;
            let b = self.loc(to)?;
            Ok(rustix::fs::renameat_with(
                a.dir(),
                a.name(),
                b.dir(),
                b.name(),
                backing_rename_flags(flags),
            )?)
        })
    }

    /// No `AT_SYMLINK_FOLLOW`: linking a symlink links the symlink, as
    /// `link(2)` does on Linux.
    pub(super) fn do_link(&self, from: &Path, to: &Path) -> Result<Attr> {
        let a = self.loc(from)?;
        let b = self.loc(to)?;
        rustix::fs::linkat(a.dir(), a.name(), b.dir(), b.name(), AtFlags::empty())?;
        stat_loc(&b)
    }
}

/// The `renameat2` flags of `flags`.
pub(crate) fn backing_rename_flags(flags: RenameFlags) -> rustix::fs::RenameFlags {
    let mut f = rustix::fs::RenameFlags::empty();
    if flags.noreplace {
        f |= rustix::fs::RenameFlags::NOREPLACE;
    }
    if flags.exchange {
        f |= rustix::fs::RenameFlags::EXCHANGE;
    }
    f
}
