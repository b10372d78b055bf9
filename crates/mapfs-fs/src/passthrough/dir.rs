//! Directories: listing (with attributes, for `readdirplus`), creation,
//! removal, sync.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use mapfs::{Attr, DirEntry, FileKind, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::attr::{stat_loc, stat_to_attr};
use super::Passthrough;

/// The [`FileKind`] of a `d_type`, when the backing file system reports one.
fn kind_of(t: FileType) -> Option<FileKind> {
    Some(match t {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        FileType::Fifo => FileKind::Fifo,
        FileType::Socket => FileKind::Socket,
        FileType::CharacterDevice => FileKind::CharDev,
        FileType::BlockDevice => FileKind::BlockDev,
        FileType::Unknown => return None,
    })
}

impl Passthrough {
    /// Reading needs `r` on the directory (checked by the open, as for the
    /// caller); each entry's attributes are a `fstatat` relative to the
    /// directory, so an entry the caller may not stat (no `x`), or one that
    /// vanished meanwhile, is listed without attributes.
    pub(super) fn do_readdir(&self, path: &Path) -> Result<Vec<DirEntry>> {
        let fd = self.root.open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        // `Dir::new`, not `read_from`: that opens "." again through the
        // directory, which needs search permission, and a directory its
        // caller may read but not search lists natively (mode 0477 ...).
        let mut dir = rustix::fs::Dir::new(rustix::io::dup(&fd)?)?;
        let mut out = Vec::new();
        while let Some(e) = dir.read() {
            let e = e?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let attr = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .ok()
                .map(|st| stat_to_attr(&st));
            let kind = match (&attr, kind_of(e.file_type())) {
                (Some(a), _) => a.kind,
                (None, Some(k)) => k,
                // Neither d_type nor stat: a regular file is the least
                // surprising guess; a later lookup corrects it.
                (None, None) => FileKind::File,
            };
            out.push(DirEntry {
                name: name.to_os_string(),
                ino: attr.map_or(e.ino(), |a| a.ino),
                kind,
                attr,
            });
        }
        Ok(out)
    }

    pub(super) fn do_mkdir(&self, path: &Path, mode: u32) -> Result<Attr> {
        let loc = self.loc(path)?;
        rustix::fs::mkdirat(loc.dir(), loc.name(), Mode::from_raw_mode(mode & 0o7777))?;
        stat_loc(&loc)
    }

    /// A namespace change for an embedded job's kept directories (the
    /// directory, or one below it, may be kept by another process).
    pub(super) fn do_rmdir(&self, path: &Path) -> Result<()> {
        self.changing(|| {
            let loc = self.loc(path)?;
            Ok(rustix::fs::unlinkat(
                loc.dir(),
                loc.name(),
                AtFlags::REMOVEDIR,
            )?)
        })
    }

    pub(super) fn do_fsyncdir(&self, path: &Path, datasync: bool) -> Result<()> {
        let fd = self.root.open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        if datasync {
            rustix::fs::fdatasync(&fd)?;
        } else {
            rustix::fs::fsync(&fd)?;
        }
        Ok(())
    }
}
