//! `O_TRUNC` without a copy: when nothing else has the file open, its own
//! inode becomes the version (a hard link into the store, as `unlink` keeps
//! a removed file) and a new empty inode, with the same owner, mode,
//! extended attributes and access time, takes the name in one rename.
//!
//! On a backing file system that cannot share extents, a rewrite with
//! `O_TRUNC` used to copy every byte into the store first; now it costs a
//! few metadata calls whatever the file's size.
//!
//! Only a file with one name, no setuid/setgid bit, and no open through
//! this daemon (reader or writer) is replaced: another name, or another
//! open, would go on seeing the old inode, the version, where natively it
//! sees the truncated file. The kernel may still run a passthrough open of
//! the old inode whose release is on its way; the mount then answers the
//! next open of the name `ESTALE` and the kernel looks it up again (see
//! `mapfs_fuse`'s adapter), so no byte for the new file lands in the
//! version. Anything that fails before the rename leaves the file as it
//! was and the caller copies instead.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mapfs::Result;
use rustix::fs::{AtFlags, XattrFlags};

use super::session::{self, Current, Session};
use super::store::{FileMeta, Store};
use super::{bytes, Versions, Writer};
use crate::passthrough::xattr::{sized, split_names};

/// What `O_TRUNC` removes natively (`file_remove_privs`), so the new file
/// does not get it.
const DROPPED_BY_TRUNCATE: &str = "security.capability";

impl Versions {
    /// Makes `old` (the file at `path`, `st` its status) the version of a
    /// truncating open with `flags` by giving the name a new empty inode,
    /// and starts the write session of that inode with this open as its
    /// writer. Returns the writer's handle and descriptor (opened with
    /// `flags`, as the caller's open of `old` was). `None`: the file does
    /// not qualify, or the replacement failed before it took the name;
    /// nothing changed.
    pub(super) fn replace_for_truncate(
        &self,
        path: &Path,
        old: &File,
        st: &rustix::fs::Stat,
        flags: i32,
    ) -> Result<Option<(u64, File)>> {
        if st.st_nlink != 1 || st.st_size <= 0 || st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
        {
            return Ok(None);
        }
        // Its blocks stay in the store: over the byte limit, the caller's
        // copy path finds the version does not fit either, and skips it.
        if !self.store.fits(st.st_blocks as u64 * 512)? {
            return Ok(None);
        }
        let key = (st.st_dev, st.st_ino);
        // Held until the new inode's session exists: no writer of either
        // inode starts meanwhile.
        let mut sessions = self.sessions.lock();
        if sessions.contains_key(&key) || self.opens.lock().get(&key).is_some_and(|n| *n > 0) {
            return Ok(None);
        }
        let (dir, name) = self.inner.root().parent(path)?;
        let now = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        if (now.st_dev, now.st_ino) != key {
            return Ok(None);
        }
        let (new, tmp) = self.store.new_replacement()?;
        // The writer's own open file description, with its flags.
        let writer = like(old, &new, st).and_then(|()| self.store.open_replacement(&tmp, flags));
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!("versions: no replacement for {}: {e}", path.display());
                self.store.drop_replacement(&tmp);
                return Ok(None);
            }
        };
        let meta = FileMeta::from_stat(st);
        let id =
            match self
                .store
                .record_linked(bytes(path), dir.as_fd(), &name, &meta, "write", false)
            {
                Ok(id) => id,
                Err(e) => {
                    self.store.drop_replacement(&tmp);
                    return Err(e);
                }
            };
        // `old` is the version's object now: marked through a descriptor
        // of it, not by opening its new name.
        let mark = old
            .try_clone()
            .map_err(Into::into)
            .and_then(Store::mark_object);
        let placed = mark.and_then(|mark| {
            self.store.place_replacement(&tmp, dir.as_fd(), &name)?;
            Ok(mark)
        });
        let mark = match placed {
            Ok(mark) => mark,
            Err(e) => {
                tracing::debug!(
                    "versions: replacement of {} not placed: {e}",
                    path.display()
                );
                self.store.drop_replacement(&tmp);
                self.store.unrecord(id)?;
                return Ok(None);
            }
        };
        // Only now may the row be committed: until the rename, the version's
        // object is the file its name shows (`Store::adopt_pending`).
        self.store.publish(id);
        let new_st = rustix::fs::fstat(&new)?;
        let mut s = Session::new(Arc::new(new))?;
        s.writers = 1;
        s.direct = 1;
        s.marks.push(mark);
        s.versions.push(id);
        s.latest = Some(id);
        s.current = Current::Whole;
        // The file changed after its version (it was emptied), whatever
        // its stamp says: the session must keep it.
        s.stamp = session::CHANGED;
        let new_key = (new_st.st_dev, new_st.st_ino);
        sessions.insert(new_key, s);
        drop(sessions);
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.writers.lock().insert(
            handle,
            Writer {
                key: new_key,
                settled: None,
            },
        );
        Ok(Some((handle, writer)))
    }
}

/// Gives `new` the owner, mode, extended attributes and access time of
/// `old` (status `st`).
fn like(old: &File, new: &File, st: &rustix::fs::Stat) -> Result<()> {
    rustix::fs::fchown(
        new,
        Some(rustix::process::Uid::from_raw(st.st_uid)),
        Some(rustix::process::Gid::from_raw(st.st_gid)),
    )?;
    rustix::fs::fchmod(new, rustix::fs::Mode::from_raw_mode(st.st_mode & 0o7777))?;
    let names = sized(
        || rustix::fs::flistxattr_query(old),
        |buf| rustix::fs::flistxattr(old, buf),
    )?;
    for name in split_names(&names) {
        if name == DROPPED_BY_TRUNCATE {
            continue;
        }
        let value = sized(
            || rustix::fs::fgetxattr_query(old, &name),
            |buf| rustix::fs::fgetxattr(old, &name, buf),
        )?;
        rustix::fs::fsetxattr(new, name, &value, XattrFlags::CREATE)?;
    }
    // Modified now, as a truncation marks it: the new file may have been
    // made a while ago (`upkeep.rs` keeps a few ready).
    let now = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_NOW,
    };
    rustix::fs::futimens(
        new,
        &rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: st.st_atime as _,
                tv_nsec: st.st_atime_nsec as _,
            },
            last_modification: now,
        },
    )?;
    Ok(())
}
