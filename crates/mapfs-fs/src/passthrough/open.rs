//! Opening files, `access`, `statfs`.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use mapfs::{Attr, DataMap, OpenFlags, Opened, Result, StatFs};
use rustix::fs::{Access, AtFlags, Mode, OFlags};

use super::attr::stat_to_attr;
use super::Passthrough;

/// Open flags passed on to the backing file. Everything else is dropped:
/// creation flags (handled by `create`), `O_NOCTTY`, `O_PATH`, `O_TMPFILE`,
/// and kernel-internal bits such as `FMODE_EXEC` that `openat2` rejects.
const PASSED_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_LARGEFILE;

/// The backing open flags for `flags`: exactly the access mode asked
/// (passthrough and mmap depend on it), never following a final symlink.
fn backing_flags(flags: OpenFlags) -> OFlags {
    OFlags::from_bits_retain((flags.0 & PASSED_FLAGS) as u32) | OFlags::NOFOLLOW
}

fn opened(file: File) -> Opened {
    Opened {
        map: DataMap::whole_file(),
        files: vec![Arc::new(file)],
        handle: 0,
    }
}

impl Passthrough {
    pub(super) fn do_open(&self, path: &Path, flags: OpenFlags) -> Result<Opened> {
        let fd = self.root.open(path, backing_flags(flags), Mode::empty())?;
        Ok(opened(File::from(fd)))
    }

    /// `O_EXCL` is honoured; without it an existing file is opened (and
    /// truncated if `O_TRUNC`). A dangling symlink in the way is not
    /// followed to create its target (`ELOOP`, or `EEXIST` with `O_EXCL`).
    pub(super) fn do_create(
        &self,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        let mut f = backing_flags(flags) | OFlags::CREATE;
        if flags.0 & libc::O_EXCL != 0 {
            f |= OFlags::EXCL;
        }
        let fd = self
            .root
            .open(path, f, Mode::from_raw_mode(mode & 0o7777))?;
        let attr = stat_to_attr(&rustix::fs::fstat(&fd)?);
        Ok((attr, opened(File::from(fd))))
    }

    /// `AT_EACCESS`: check with the thread's file-system ids (the caller's,
    /// set by `as_caller`), not the daemon's real uid.
    pub(super) fn do_access(&self, path: &Path, mask: i32) -> Result<()> {
        let loc = self.loc(path)?;
        Ok(rustix::fs::accessat(
            loc.dir(),
            loc.name(),
            Access::from_bits_retain(mask as u32),
            AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Statistics of the file system holding `path` (normally the backing
    /// root's).
    pub(super) fn do_statfs(&self, path: &Path) -> Result<StatFs> {
        let fd = self
            .root
            .open(path, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        let s = rustix::fs::fstatvfs(&fd)?;
        Ok(StatFs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }
}
