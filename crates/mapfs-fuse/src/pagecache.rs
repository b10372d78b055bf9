//! Which inodes' pages in the kernel's page cache are known to hold their
//! files' bytes, so that a read-only open may keep them
//! (`FOPEN_KEEP_CACHE`) instead of dropping them and reading again through
//! the daemon.
//!
//! The kernel drops an inode's cached pages at every open that does not
//! ask to keep them. Keeping them is right only while every change of the
//! file went through those pages: writes the kernel sent (it wrote its
//! pages first), truncates and hole punches it ran. Changes it never saw
//! make them stale:
//!
//! - another host or process writing the backing files, which only a file
//!   system that owns its backing store can rule out
//!   ([`mapfs::Capabilities::only_this_mount_writes`]);
//! - a shim client writing the backing file itself (a writable open lent
//!   or adopted), and kernel passthrough writing it (the FUSE inode's own
//!   pages are not updated).
//!
//! - a second kernel inode of the same file (a replaced file's old inode
//!   held beside the new one, a hard link found again after its first
//!   name went: see [`crate::inodes`]): writes through one do not update
//!   the other's pages.
//!
//! A file (by the file system's number) is *clean* from its creation
//! through this mount, or from a read-only open that dropped its pages
//! while it had one kernel inode and no open could write it, until an open
//! that may write it outside the kernel's pages is lent, adopted or run by
//! passthrough, or a second kernel inode of it appears. A daemon that took
//! over from a dead one starts with no clean file (the dead one's clients
//! may have written).

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use parking_lot::Mutex;

/// What says that a backing file did not change: size, mtime and ctime.
type Version = (u64, i64, i64, i64, i64);

fn version(f: &File) -> std::io::Result<Version> {
    let m = f.metadata()?;
    Ok((
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// The bytes of backing file `f` if it holds 1 to `limit` bytes (read
/// through a read-only reopen when `f` is write-only), with what
/// [`unchanged_since`] compares.
pub fn small_file_bytes(f: &File, limit: u64) -> std::io::Result<Option<(Vec<u8>, Version)>> {
    let v = version(f)?;
    if v.0 == 0 || v.0 > limit {
        return Ok(None);
    }
    let mut buf = vec![0u8; v.0 as usize];
    match f.read_exact_at(&mut buf, 0) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => {
            // The daemon's own descriptor of the file, opened again.
            let r = File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
            r.read_exact_at(&mut buf, 0)?;
        }
        Err(e) => return Err(e),
    }
    Ok(Some((buf, v)))
}

/// Whether `f` is as it was when [`small_file_bytes`] read it.
pub fn unchanged_since(f: &File, v: &Version) -> bool {
    version(f).is_ok_and(|now| now == *v)
}

/// The clean files of one mount, by the file system's inode number.
/// Bounded by the inodes the kernel holds: a file leaves when the kernel
/// forgets its last inode. Disabled (it keeps nothing and says so) for a
/// file system whose backing files others may write.
#[derive(Debug)]
pub struct KeptPages {
    enabled: bool,
    clean: Mutex<HashSet<u64>>,
}

impl KeptPages {
    /// The set of a mount whose file system says
    /// [`mapfs::Capabilities::only_this_mount_writes`] (`enabled`); any other
    /// mount's pages are dropped at every open, and nothing is recorded.
    pub fn new(enabled: bool) -> Self {
        KeptPages {
            enabled,
            clean: Mutex::default(),
        }
    }

    /// Whether read-only opens of this mount may keep pages at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// File `ino` was just created through the mount: the kernel has no
    /// page of it that could be stale.
    pub fn created(&self, ino: u64) {
        if self.enabled {
            self.clean.lock().insert(ino);
        }
    }

    /// A read-only open of file `ino` is being answered: true if it may
    /// keep the kernel's cached pages. `may_be_written` tells whether the
    /// file has a second kernel inode or an open that may write it (through
    /// the mount or lent); none may appear between this call's check and
    /// its effect, so both happen under the lock
    /// [`KeptPages::written_outside`] takes. An open that keeps nothing
    /// makes the file clean when `may_be_written` is false: the kernel drops
    /// its pages as it takes the answer, and reads through the mount fill
    /// them afresh.
    pub fn open_read_only(&self, ino: u64, may_be_written: impl FnOnce() -> bool) -> bool {
        if !self.enabled {
            return false;
        }
        let mut clean = self.clean.lock();
        if may_be_written() {
            return false;
        }
        !clean.insert(ino)
    }

    /// File `ino` may be written where the kernel's pages do not see it
    /// (an open lent, adopted or run by passthrough; a second kernel inode).
    pub fn written_outside(&self, ino: u64) {
        if self.enabled {
            self.clean.lock().remove(&ino);
        }
    }

    /// Runs `store`, which puts the whole of file `ino` in the kernel's
    /// pages, unless `may_be_written` (as for [`KeptPages::open_read_only`]);
    /// the file is clean if it ran and succeeded. Both happen under the
    /// lock [`KeptPages::written_outside`] takes, so that a writer outside
    /// the pages that appears meanwhile leaves the file unclean.
    pub fn filled(
        &self,
        ino: u64,
        may_be_written: impl FnOnce() -> bool,
        store: impl FnOnce() -> bool,
    ) {
        if !self.enabled {
            return;
        }
        let mut clean = self.clean.lock();
        if !may_be_written() && store() {
            clean.insert(ino);
        }
    }

    /// The kernel forgot the last inode of file `ino` (its pages with it).
    pub fn forgotten(&self, ino: u64) {
        self.written_outside(ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_is_clean_after_a_creation_or_an_open_with_no_writer() {
        let p = KeptPages::new(true);
        // Unknown (a fresh daemon, or one that took over): drop once.
        assert!(!p.open_read_only(1, || false));
        assert!(p.open_read_only(1, || false));
        p.created(2);
        assert!(p.open_read_only(2, || false));
    }

    #[test]
    fn a_file_filled_with_no_writer_is_clean() {
        let p = KeptPages::new(true);
        p.written_outside(3);
        p.filled(3, || true, || panic!("stored beside a writer"));
        assert!(!p.open_read_only(3, || true));
        p.filled(4, || false, || false);
        assert!(
            !p.open_read_only(4, || false),
            "a failed store made it clean"
        );
        p.filled(5, || false, || true);
        assert!(p.open_read_only(5, || false));
        let off = KeptPages::new(false);
        off.filled(6, || false, || panic!("stored with pages off"));
    }

    #[test]
    fn a_writer_outside_the_pages_a_second_inode_or_any_writer_keeps_nothing() {
        let p = KeptPages::new(true);
        p.created(1);
        assert!(!p.open_read_only(1, || true), "a writer, or a second inode");
        // The open with a writer dropped the pages but left it unclean:
        // the writer may still write outside them.
        p.written_outside(1);
        assert!(!p.open_read_only(1, || true));
        assert!(!p.open_read_only(1, || false), "first open after: drops");
        assert!(p.open_read_only(1, || false));
        p.forgotten(1);
        assert!(!p.open_read_only(1, || false));
    }

    #[test]
    fn a_disabled_set_keeps_nothing() {
        let p = KeptPages::new(false);
        p.created(1);
        assert!(!p.open_read_only(1, || false));
        assert!(!p.open_read_only(1, || false));
        assert!(p.clean.lock().is_empty());
    }
}
