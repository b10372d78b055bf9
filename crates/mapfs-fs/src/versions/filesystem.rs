//! The [`FileSystem`] implementation of [`Versions`]: namespace calls go to
//! the inner passthrough as the caller, with the store hidden and
//! `.versions/` read-only; opens for writing start or join write sessions
//! (see the module docs of `versions`).

use std::ffi::{OsStr, OsString};
use std::path::Path;

use mapfs::{
    Attr, Capabilities, Ctx, DataMap, DirEntry, Error, FileKind, FileSystem, OpenFlags, Opened,
    RenameFlags, Result, SetAttr, StatFs,
};

use super::virtual_dir::{self, Place};
use super::{bytes, eperm, erofs, store, Versions};

/// Refuses changes to the store and to `.versions`.
fn writable_place(path: &Path) -> Result<()> {
    match virtual_dir::place(path) {
        Place::Normal => Ok(()),
        Place::Hidden => Err(eperm()),
        Place::Virtual(_) => Err(erofs()),
    }
}

/// Lookups of the store fail as if it were not there.
fn readable_place(path: &Path) -> Result<()> {
    match virtual_dir::place(path) {
        Place::Hidden => Err(Error::not_found()),
        _ => Ok(()),
    }
}

fn is_root(path: &Path) -> bool {
    bytes(path).iter().all(|&c| c == b'/' || c == b'.')
}

impl FileSystem for Versions {
    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.getattr(ctx, path),
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(rest) => {
                let sight = virtual_dir::Sight::new(ctx, self.inner.root());
                virtual_dir::getattr(&sight, &self.store, rest, &self.root_attr(ctx)?)
            }
        }
    }

    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        writable_place(path)?;
        if let Some(size) = set.size {
            self.before_truncate(ctx, path, size)?;
        }
        self.inner.setattr(ctx, path, set)
    }

    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        match virtual_dir::place(path) {
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(rest) => {
                let sight = virtual_dir::Sight::new(ctx, self.inner.root());
                virtual_dir::readdir(&sight, &self.store, rest, &self.root_attr(ctx)?)
            }
            Place::Normal => {
                let mut v = self.inner.readdir(ctx, path)?;
                if is_root(path) {
                    v.retain(|e| {
                        e.name != OsStr::new(store::STORE_DIR)
                            && e.name != OsStr::new(virtual_dir::VIRTUAL_DIR)
                    });
                }
                Ok(v)
            }
        }
    }

    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.readlink(ctx, path),
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(_) => Err(Error::invalid()),
        }
    }

    fn mknod(&self, ctx: &Ctx, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        writable_place(path)?;
        self.inner.mknod(ctx, path, mode, rdev)
    }

    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        writable_place(path)?;
        self.inner.mkdir(ctx, path, mode)
    }

    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        writable_place(path)?;
        let kept = self.keep_removed(path, "unlink")?;
        match self.inner.unlink(ctx, path) {
            Ok(()) => {
                if kept.is_some() {
                    self.retain(path);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(id) = kept {
                    let _ = self.store.delete_ids(&[id]);
                }
                Err(e)
            }
        }
    }

    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        writable_place(path)?;
        self.inner.rmdir(ctx, path)
    }

    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        writable_place(path)?;
        self.inner.symlink(ctx, target, path)
    }

    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        writable_place(from)?;
        writable_place(to)?;
        let same = match (self.inner.getattr(ctx, from), self.inner.getattr(ctx, to)) {
            (Ok(a), Ok(b)) => a.ino == b.ino,
            _ => false,
        };
        let kept = if flags.exchange || flags.noreplace || same {
            None
        } else {
            self.keep_removed(to, "replace")?
        };
        if let Err(e) = self.inner.rename(ctx, from, to, flags) {
            if let Some(id) = kept {
                let _ = self.store.delete_ids(&[id]);
            }
            return Err(e);
        }
        if !same {
            self.store.rename(bytes(from), bytes(to), flags.exchange)?;
        }
        if kept.is_some() {
            self.retain(to);
        }
        Ok(())
    }

    fn link(&self, ctx: &Ctx, from: &Path, to: &Path) -> Result<Attr> {
        readable_place(from)?;
        writable_place(from)?;
        writable_place(to)?;
        self.inner.link(ctx, from, to)
    }

    /// `.versions` entries appear whenever a version is made.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_names_appearing(|path| matches!(virtual_dir::place(path), Place::Virtual(_)))
    }

    fn statfs(&self, ctx: &Ctx, path: &Path) -> Result<StatFs> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.statfs(ctx, path),
            _ => self.inner.statfs(ctx, Path::new("/")),
        }
    }

    fn setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        writable_place(path)?;
        self.inner.setxattr(ctx, path, name, value, flags)
    }

    fn getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.getxattr(ctx, path, name),
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(_) => Err(Error::from_errno(libc::ENODATA)),
        }
    }

    fn listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.listxattr(ctx, path),
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(_) => Ok(Vec::new()),
        }
    }

    fn removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        writable_place(path)?;
        self.inner.removexattr(ctx, path, name)
    }

    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        match virtual_dir::place(path) {
            Place::Normal => self.inner.access(ctx, path, mask),
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(rest) => {
                if mask & libc::W_OK != 0 {
                    return Err(erofs());
                }
                self.getattr(ctx, path).map(|_| ()).and_then(|()| {
                    match virtual_dir::version_at(&self.store, rest)? {
                        Some(v) if mask & libc::R_OK != 0 && !virtual_dir::may_read(ctx, &v) => {
                            Err(Error::from_errno(libc::EACCES))
                        }
                        _ => Ok(()),
                    }
                })
            }
        }
    }

    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        match virtual_dir::place(path) {
            Place::Hidden => Err(Error::not_found()),
            Place::Virtual(rest) => self.virtual_open(ctx, rest, flags),
            Place::Normal if flags.writable() || flags.0 & libc::O_TRUNC != 0 => {
                self.open_writer(ctx, path, flags, false)
            }
            Place::Normal => {
                let mut o = self.inner.open(ctx, path, flags)?;
                self.track(&mut o)?;
                Ok(o)
            }
        }
    }

    fn reopen_whole_file(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        match virtual_dir::place(path) {
            Place::Normal if flags.writable() => self.open_writer(ctx, path, flags, true),
            // Readers and `.versions` entries always get whole-file maps.
            _ => self.open(ctx, path, flags),
        }
    }

    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        writable_place(path)?;
        if flags.0 & libc::O_EXCL == 0 {
            if let Ok(a) = self.inner.getattr(ctx, path) {
                if a.kind == FileKind::File {
                    let opened = self.open_writer(ctx, path, flags, false)?;
                    return Ok((self.inner.getattr(ctx, path)?, opened));
                }
            }
        }
        let (attr, mut o) = self.inner.create(ctx, path, flags, mode)?;
        self.track(&mut o)?;
        Ok((attr, o))
    }

    fn release(&self, _ctx: &Ctx, _path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        if handle == 0 || self.untrack(handle) {
            return Ok(());
        }
        self.end_writer(handle, map)
    }

    fn flush(&self, _ctx: &Ctx, _path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        // A version is in the index when the program's close returns
        // (`pending.rs`): `mapfs versions` elsewhere finds it.
        self.store.sync_pending()?;
        self.settle(handle, map)
    }

    fn remap(
        &self,
        _ctx: &Ctx,
        _path: &Path,
        handle: u64,
        map: &DataMap,
        offset: u64,
        len: u64,
    ) -> Result<Opened> {
        self.remap_writer(handle, map, offset, len)
    }

    /// The file itself (a new open of it): embedded mode keeps the locks
    /// of opens it serves by the data engine there, where they meet the
    /// locks of processes that hold the file natively (read-only opens are
    /// the backing file).
    fn lock_file(&self, ctx: &Ctx, path: &Path) -> Result<Option<std::fs::File>> {
        readable_place(path)?;
        if let Place::Virtual(_) = virtual_dir::place(path) {
            return Ok(None);
        }
        let opened = self
            .inner
            .open(ctx, path, OpenFlags(libc::O_RDWR))
            .or_else(|_| self.inner.open(ctx, path, OpenFlags(libc::O_RDONLY)))?;
        let file = opened
            .files
            .into_iter()
            .next()
            .ok_or_else(|| Error::io().context("an open without its file"))?;
        let file = std::sync::Arc::try_unwrap(file).or_else(|shared| shared.try_clone())?;
        Ok(Some(file))
    }

    fn fsyncdir(&self, ctx: &Ctx, path: &Path, datasync: bool) -> Result<()> {
        readable_place(path)?;
        if let Place::Virtual(_) = virtual_dir::place(path) {
            return Ok(());
        }
        self.inner.fsyncdir(ctx, path, datasync)
    }
}
