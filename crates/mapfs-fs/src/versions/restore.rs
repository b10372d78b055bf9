//! Restoring a version: the file at a path becomes the version's bytes,
//! owner and mode again. The file it replaces is kept as a version itself
//! (its inode, linked into the store), so a restore can be undone; a path
//! whose file (or directories) were removed is made again.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use mapfs::backing::openat2_beneath;
use mapfs::{Error, FileKind, Result};
use rustix::fs::{AtFlags, Mode, OFlags};

use super::clone;
use super::store::{FileMeta, Store, Version};

impl Store {
    /// Opens the directory `dir` (fs path) beneath the root, making missing
    /// directories (mode 0755) on the way.
    fn make_dirs(&self, dir: &Path) -> Result<OwnedFd> {
        let mut cur = rustix::io::fcntl_dupfd_cloexec(self.root_fd(), 3)?;
        for c in dir.components() {
            let Component::Normal(name) = c else {
                continue;
            };
            match rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            cur = openat2_beneath(
                cur.as_fd(),
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
        }
        Ok(cur)
    }

    /// Makes the file at `to` (fs path, `/a/b`) hold version `v`; returns
    /// the id of the version that keeps what `to` held before, if anything.
    pub fn restore(&self, v: &Version, to: &[u8]) -> Result<Option<i64>> {
        let to_path = Path::new(OsStr::from_bytes(to));
        let name = to_path
            .file_name()
            .ok_or_else(|| Error::invalid().context("restore target has no file name"))?;
        let dir = self.make_dirs(to_path.parent().unwrap_or(Path::new("/")))?;
        let src = self.contents(v)?;
        let tmp_name = format!(".mapfs-restore.{}.{}", std::process::id(), v.id);
        let tmp = File::from(rustix::fs::openat(
            &dir,
            tmp_name.as_str(),
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?);
        let filled = (|| -> Result<()> {
            clone::clone_or_copy(&src, &tmp, v.size, true)?;
            tmp.set_len(v.size)?;
            // The owner may not be ours to give (an unprivileged user's
            // store): the bytes and mode still come back.
            let _ = rustix::fs::fchown(
                &tmp,
                Some(rustix::process::Uid::from_raw(v.uid)),
                Some(rustix::process::Gid::from_raw(v.gid)),
            );
            rustix::fs::fchmod(&tmp, Mode::from_raw_mode(v.mode & 0o7777))?;
            tmp.sync_all()?;
            Ok(())
        })();
        let kept = filled.and_then(|()| self.keep_before_restore(&dir, name, to));
        let kept = match kept {
            Ok(k) => k,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&dir, tmp_name.as_str(), AtFlags::empty());
                return Err(e);
            }
        };
        if let Err(e) = rustix::fs::renameat(&dir, tmp_name.as_str(), &dir, name) {
            let _ = rustix::fs::unlinkat(&dir, tmp_name.as_str(), AtFlags::empty());
            if let Some(id) = kept {
                let _ = self.delete_ids(&[id]);
            }
            return Err(e.into());
        }
        Ok(kept)
    }

    /// Keeps the regular file `dir`/`name` (about to be replaced) as a
    /// version of `path`.
    fn keep_before_restore(&self, dir: &OwnedFd, name: &OsStr, path: &[u8]) -> Result<Option<i64>> {
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if FileKind::from_mode(st.st_mode) != FileKind::File {
            return Err(Error::from_errno(libc::EISDIR)
                .context("restore target exists and is not a regular file"));
        }
        if st.st_size == 0 {
            return Ok(None);
        }
        let meta = FileMeta::from_stat(&st);
        if st.st_nlink == 1 {
            return self
                .add_linked(path, dir.as_fd(), name, &meta, "restore", true)
                .map(Some);
        }
        let f = File::from(openat2_beneath(
            dir.as_fd(),
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
        Ok(match self.add_whole(path, &f, &meta, "restore", true)? {
            super::store::Added::Kept(id) => Some(id),
            _ => None,
        })
    }
}
