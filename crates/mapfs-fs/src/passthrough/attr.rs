//! Attributes: `stat` of the backing file as [`Attr`], and `setattr`.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mapfs::backing::openat2_beneath;
use mapfs::{Attr, Error, FileKind, Result, SetAttr, TimeSet};
use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, Stat, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT,
};
use rustix::process::{Gid, Uid};

use super::{Loc, Passthrough};

/// `stat` of `(dir, name)` without following a final symlink.
pub(super) fn stat_loc(loc: &Loc<'_>) -> Result<Attr> {
    let st = rustix::fs::statat(loc.dir(), loc.name(), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(stat_to_attr(&st))
}

/// The [`Attr`] of a backing `stat`.
// The `stat` field types differ between architectures; the casts are
// no-ops only on some.
#[allow(clippy::unnecessary_cast)]
pub(super) fn stat_to_attr(st: &Stat) -> Attr {
    Attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: system_time(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: system_time(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: system_time(st.st_ctime as i64, st.st_ctime_nsec as i64),
        kind: FileKind::from_mode(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        blksize: st.st_blksize as u32,
    }
}

/// A `(seconds, nanoseconds)` timestamp, possibly before 1970.
fn system_time(sec: i64, nsec: i64) -> SystemTime {
    let t = if sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(sec as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
    };
    t + Duration::from_nanos(nsec.clamp(0, 999_999_999) as u64)
}

/// The `timespec` for `utimensat` of a [`SetAttr`] time field.
fn timespec(t: Option<TimeSet>) -> Timespec {
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(TimeSet::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        Some(TimeSet::At(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos().into(),
            },
            Err(e) => {
                // Before 1970: floor the seconds, keep nanoseconds positive.
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = i64::from(d.subsec_nanos());
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                }
            }
        },
    }
}

impl Passthrough {
    /// Applies `set` in the order that keeps each change meaningful: size
    /// first (it bumps mtime), then owner (the kernel clears suid/sgid), then
    /// mode (so an explicit suid survives a combined chown+chmod), then times
    /// (an explicit mtime wins over the truncate's).
    pub(super) fn do_setattr(&self, path: &Path, set: &SetAttr) -> Result<Attr> {
        let loc = self.loc(path)?;
        if let Some(size) = set.size {
            // O_NONBLOCK: never hang on a FIFO; the kernel then answers
            // EINVAL like truncate(2) does for non-regular files.
            let fd = openat2_beneath(
                loc.dir(),
                loc.name(),
                OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            rustix::fs::ftruncate(&fd, size)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            rustix::fs::chownat(
                loc.dir(),
                loc.name(),
                set.uid.map(Uid::from_raw),
                set.gid.map(Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(mode) = set.mode {
            self.chmod_nofollow(&loc, mode)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = Timestamps {
                last_access: timespec(set.atime),
                last_modification: timespec(set.mtime),
            };
            rustix::fs::utimensat(loc.dir(), loc.name(), &times, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        stat_loc(&loc)
    }

    /// `chmod` that never follows a final symlink: `fchmodat` has no
    /// `AT_SYMLINK_NOFOLLOW` before `fchmodat2` (6.6), so the entry is
    /// pinned with an `O_PATH|O_NOFOLLOW` fd and changed through its
    /// `/proc/self/fd` link. Symlinks themselves have no mode on Linux
    /// (`EOPNOTSUPP`, as `fchmodat2` answers).
    fn chmod_nofollow(&self, loc: &Loc<'_>, mode: u32) -> Result<()> {
        let mode = Mode::from_raw_mode(mode & 0o7777);
        if loc.is_root() {
            return Ok(rustix::fs::chmodat(loc.dir(), ".", mode, AtFlags::empty())?);
        }
        let fd = openat2_beneath(
            loc.dir(),
            loc.name(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(Error::from_errno(libc::EOPNOTSUPP));
        }
        let proc_path = super::xattr::proc_fd_path(fd.as_fd(), None);
        Ok(rustix::fs::chmod(proc_path.as_os_str(), mode)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespec_roundtrip_before_and_after_epoch() {
        for (sec, nsec) in [
            (0i64, 0i64),
            (1_700_000_000, 123),
            (-1, 500_000_000),
            (-86400, 0),
        ] {
            let t = system_time(sec, nsec);
            let ts = timespec(Some(TimeSet::At(t)));
            assert_eq!((ts.tv_sec, ts.tv_nsec), (sec, nsec));
        }
        assert_eq!(timespec(None).tv_nsec, UTIME_OMIT);
        assert_eq!(timespec(Some(TimeSet::Now)).tv_nsec, UTIME_NOW);
    }
}
