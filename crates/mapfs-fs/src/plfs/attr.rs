//! Attributes of files: identity (`.plfs`) plus merged size, and `setattr`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mapfs::backing::openat2_beneath;
use mapfs::creds::as_caller;
use mapfs::{Attr, Ctx, Error, FileKind, FileSystem as _, Result, SetAttr};
use rustix::fs::{AtFlags, Mode, OFlags, Stat};
use rustix::process::{Gid, Uid};

use super::container;
use super::format::IDENTITY;
use super::{identity, Plfs};

/// A `(seconds, nanoseconds)` timestamp, possibly before 1970.
fn system_time(sec: i64, nsec: i64) -> SystemTime {
    let t = if sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(sec as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    };
    t + Duration::from_nanos(nsec.clamp(0, 999_999_999) as u64)
}

impl Plfs {
    /// The attributes of the file in container `dir`: `.plfs`'s mode,
    /// owner and times, the merged size, the container's inode number.
    // The `stat` field types differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn file_attr(&self, dir: &OwnedFd) -> Result<Attr> {
        self.file_attr_seen(dir, None)
    }

    /// [`Plfs::file_attr`], given what a walk that just found the file saw
    /// of it (`Found::seen`: its identity's `stat`, if it had one,
    /// and the container's), each a round trip saved on a network store.
    pub(super) fn file_attr_seen(
        &self,
        dir: &OwnedFd,
        seen: Option<(Option<Stat>, Stat)>,
    ) -> Result<Attr> {
        let id = match seen
            .and_then(|(id, _)| id)
            .or_else(|| container::identity_stat(dir.as_fd()))
        {
            Some(st) => st,
            // It was a file when looked up: removed since, look again.
            None => return Err(Error::from_errno(libc::ESTALE)),
        };
        let (key, v) = match seen {
            Some((_, st)) => super::store::key_and_validator_of(&st),
            None => super::store::key_and_validator(dir.as_fd())?,
        };
        let loaded = self.store.load_seen(dir.as_fd(), key, v)?;
        self.attr_of(dir, &id, loaded.merged.map.size(), loaded.log_blocks)
    }

    /// The attributes of the file in container `dir` whose identity's
    /// `stat` is `id`, with its size and blocks.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn attr_of(&self, dir: &OwnedFd, id: &Stat, size: u64, blocks: u64) -> Result<Attr> {
        Ok(Attr {
            ino: container::file_ino(dir.as_fd())?,
            size,
            blocks,
            atime: system_time(id.st_atime as i64, id.st_atime_nsec as i64),
            mtime: system_time(id.st_mtime as i64, id.st_mtime_nsec as i64),
            ctime: system_time(id.st_ctime as i64, id.st_ctime_nsec as i64),
            kind: FileKind::File,
            perm: (id.st_mode & 0o7777) as u16,
            nlink: 1,
            uid: id.st_uid,
            gid: id.st_gid,
            rdev: 0,
            blksize: id.st_blksize as u32,
        })
    }

    /// Size first (a dropping, after checking the caller may write), then
    /// owner, mode and times on `.plfs` as the caller (the passthrough's
    /// order and checks). A new owner also goes to the container directory,
    /// so sticky-directory rules see the file's owner.
    pub(super) fn do_setattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        dir: &OwnedFd,
        set: &SetAttr,
    ) -> Result<Attr> {
        if let Some(size) = set.size {
            as_caller(ctx, || {
                openat2_beneath(
                    dir.as_fd(),
                    IDENTITY.as_ref(),
                    OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map(drop)
                .map_err(Error::from)
            })?;
            let before = self.file_attr(dir)?.size;
            self.truncate_file(dir, size)?;
            if before != size {
                container::touch_mtime(dir.as_fd())?;
            }
        }
        let rest = SetAttr { size: None, ..*set };
        if !rest.is_empty() {
            self.pt.setattr(ctx, &identity(path), &rest)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            // The caller was allowed the change on `.plfs`; mirror it, best
            // effort (a daemon without CAP_CHOWN may not; the file's owner
            // is `.plfs`'s in any case).
            let _ = rustix::fs::chownat(
                dir,
                "",
                set.uid.map(Uid::from_raw),
                set.gid.map(Gid::from_raw),
                AtFlags::EMPTY_PATH,
            );
        }
        self.file_attr(dir)
    }
}
