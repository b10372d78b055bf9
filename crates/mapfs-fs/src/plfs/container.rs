//! Backing operations on one container directory, all relative to a
//! directory fd obtained beneath the backing root, never following a
//! symlink: a symlink, FIFO or directory planted in place of `.plfs`, a log
//! or a dropping is refused (`ELOOP`/`EIO`), never opened or followed.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use mapfs::backing::openat2_beneath;
use mapfs::{Error, Result};
use rustix::fs::{
    AtFlags, FileType, FlockOperation, Mode, OFlags, Stat, StatxFlags, Timespec, Timestamps,
    UTIME_NOW, UTIME_OMIT,
};
use tracing::warn;

use super::format::{self, Dropping, IDENTITY, INDEX_PREFIX, LOG_PREFIX, NEW_PREFIX, TMP_PREFIX};

/// A container's identity in memory: the backing directory's (dev, ino).
pub(super) type Key = (u64, u64);

/// How deep [`remove_tree`] descends (containers hold only files; anything
/// deeper was planted and is left for the administrator).
const MAX_DEPTH: u32 = 8;

/// `(st_dev, st_ino)` of an open directory.
pub(super) fn key_of(dir: BorrowedFd<'_>) -> Result<Key> {
    let st = rustix::fs::fstat(dir)?;
    Ok((st.st_dev, st.st_ino))
}

/// Bits of a file's `ino` above the backing inode number (see
/// [`file_ino`]).
const INO_BITS: u32 = 40;

/// The `ino` of the file whose container is `dir`: the container's backing
/// inode number, with a hash of its birth time in the bits above
/// [`INO_BITS`]. Backing file systems reuse a freed inode number at once, so
/// a file created right after another was removed (a rename over, an unlink
/// and create) would otherwise get the number the kernel may still cache
/// for the old one; with the birth time mixed in, the new file has a new
/// number. Stable across renames and remounts (both parts are), unique among
/// live files (the low bits are the backing number). Without a birth time or
/// with inode numbers that large, the backing number alone.
pub(super) fn file_ino(dir: BorrowedFd<'_>) -> Result<u64> {
    let sx = rustix::fs::statx(
        dir,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::INO | StatxFlags::BTIME,
    )?;
    let ino = sx.stx_ino;
    if sx.stx_mask & StatxFlags::BTIME.bits() == 0 || ino >> INO_BITS != 0 {
        return Ok(ino);
    }
    let t = (sx.stx_btime.tv_sec as u64)
        .wrapping_mul(1_000_000_007)
        .wrapping_add(u64::from(sx.stx_btime.tv_nsec));
    // Fibonacci hashing; 23 bits so the number stays below 2^63.
    let h = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 23);
    Ok(ino | (h << INO_BITS))
}

/// `O_PATH` fd of directory `name` in `at`, not following a symlink.
pub(super) fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd> {
    Ok(openat2_beneath(
        at,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// True when `dir` holds a regular file named `.plfs`, i.e. is a container.
pub(super) fn is_container(dir: BorrowedFd<'_>) -> bool {
    identity_stat(dir).is_some()
}

/// The `stat` of `dir`'s identity (`.plfs`), if `dir` is a container.
pub(super) fn identity_stat(dir: BorrowedFd<'_>) -> Option<rustix::fs::Stat> {
    match rustix::fs::statat(dir, IDENTITY, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => Some(st),
        _ => None,
    }
}

/// The entries of a container that matter.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// `index.*` names, sorted (the merge's tie-break order).
    pub indexes: Vec<String>,
    /// Their inode numbers as listed (a dropping replaced under the same
    /// name by hand has another, unless the number was reused), `u64::MAX`
    /// for an entry that is not a regular file (or whose type the listing
    /// does not give): never taken from the cache.
    pub index_inos: Vec<u64>,
    /// `data.*` names.
    pub logs: Vec<String>,
    /// `tmp.*` names (droppings never completed).
    pub tmps: Vec<String>,
}

/// Lists a container (as whoever runs this: the daemon).
pub(super) fn list(dir: BorrowedFd<'_>) -> Result<Listing> {
    let fd = openat2_beneath(
        dir,
        OsStr::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Listing::default();
    each_entry(fd.as_fd(), |name, kind, ino| {
        let Ok(name) = std::str::from_utf8(name.as_bytes()) else {
            return;
        };
        if name.starts_with(INDEX_PREFIX) {
            out.indexes.push(name.to_owned());
            // A symlink or anything else planted under the name is not the
            // dropping that was cached, even with a reused inode number.
            let not_file = kind != FileType::RegularFile;
            out.index_inos.push(if not_file { u64::MAX } else { ino });
        } else if name.starts_with(LOG_PREFIX) {
            out.logs.push(name.to_owned());
        } else if name.starts_with(TMP_PREFIX) {
            out.tmps.push(name.to_owned());
        }
    })?;
    let mut pairs: Vec<(String, u64)> = out
        .indexes
        .drain(..)
        .zip(out.index_inos.drain(..))
        .collect();
    pairs.sort();
    (out.indexes, out.index_inos) = pairs.into_iter().unzip();
    Ok(out)
}

/// Bytes of directory entries one `getdents` may return: enough for a
/// container of a few dozen droppings and logs in one call. Each call is a
/// round trip on a network store, and the kernel's FUSE client fills one
/// page per request, so a smaller buffer (as `rustix::fs::Dir` starts with)
/// costs requests a page would have answered.
const LISTING_BUF: usize = 32 * 1024;

/// Calls `f` with the name, type and inode number of every entry of
/// directory `fd` but `.` and `..`, reading from its current position.
pub(super) fn each_entry(
    fd: BorrowedFd<'_>,
    mut f: impl FnMut(&OsStr, FileType, u64),
) -> Result<()> {
    let mut buf = Vec::with_capacity(LISTING_BUF);
    let mut d = rustix::fs::RawDir::new(fd, buf.spare_capacity_mut());
    while let Some(e) = d.next() {
        let e = e?;
        let n = OsStr::from_bytes(e.file_name().to_bytes());
        if n != "." && n != ".." {
            f(n, e.file_type(), e.ino());
        }
    }
    Ok(())
}

/// 512-byte blocks allocated to log `name` of `dir` (0 if it vanished).
pub(super) fn log_blocks(dir: BorrowedFd<'_>, name: &str) -> u64 {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_or(0, |st| st.st_blocks as u64)
}

/// Names of the real subdirectories of `dir` (not following symlinks;
/// `.` and `..` left out).
pub(super) fn subdirs(dir: BorrowedFd<'_>) -> Result<Vec<std::ffi::OsString>> {
    let fd = openat2_beneath(
        dir,
        OsStr::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    each_entry(fd.as_fd(), |n, kind, _| {
        let is_dir = match kind {
            FileType::Directory => true,
            FileType::Unknown => matches!(
                rustix::fs::statat(&fd, n, AtFlags::SYMLINK_NOFOLLOW),
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory
            ),
            _ => false,
        };
        if is_dir {
            out.push(n.to_os_string());
        }
    })?;
    Ok(out)
}

/// Opens regular file `name` in `dir` with `flags` (no symlink, never
/// blocking on a planted FIFO); anything but a regular file is `EIO`.
pub(super) fn open_file(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> Result<File> {
    Ok(open_file_stat(dir, name, flags)?.0)
}

/// [`open_file`], with the `fstat` it took of the file.
fn open_file_stat(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> Result<(File, Stat)> {
    // openat2 rejects a mode without O_CREAT.
    let mode = if flags.contains(OFlags::CREATE) {
        Mode::from_raw_mode(0o600)
    } else {
        Mode::empty()
    };
    let fd = openat2_beneath(
        dir,
        OsStr::new(name),
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        mode,
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Error::io().context(format!("{name} in a plfs container is not a file")));
    }
    // Clear O_NONBLOCK again: it only guarded the open.
    let fl = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK)?;
    Ok((File::from(fd), st))
}

/// The bytes of dropping `name`. A dropping is written whole under a
/// temporary name and renamed into place, never changed after, so the size
/// its open saw is all there is: one read of that size, without the size
/// query and the read of end-of-file that `read_to_end` adds (each a round
/// trip on a network store). A short read (not a dropping as written) is
/// read on to the end.
fn read_whole(dir: BorrowedFd<'_>, name: &str) -> Result<Vec<u8>> {
    let (mut f, st) = open_file_stat(dir, name, OFlags::RDONLY)?;
    let size = usize::try_from(st.st_size).unwrap_or(0);
    let mut buf = vec![0u8; size];
    let mut got = 0;
    while got < size {
        match f.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    buf.truncate(got);
    if got < size {
        f.read_to_end(&mut buf)?;
    }
    Ok(buf)
}

/// Reads and decodes dropping `name`; `None` when it vanished (removed by a
/// compaction since it was listed).
pub(super) fn read_dropping(dir: BorrowedFd<'_>, name: &str) -> Result<Option<Dropping>> {
    let res = read_whole(dir, name).and_then(|buf| format::decode(&buf));
    match res {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.errno() == libc::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads and decodes the droppings `names`; vanished ones (removed by a
/// compaction since the listing) are skipped, unreadable ones skipped with a
/// warning.
pub(super) fn read_droppings(dir: BorrowedFd<'_>, names: &[String]) -> Vec<Dropping> {
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let res = read_whole(dir, n).and_then(|buf| format::decode(&buf));
        match res {
            Ok(d) => out.push(d),
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => warn!("plfs: skipping dropping {n}: {e}"),
        }
    }
    out
}

/// Replaces dropping `name` atomically and durably: a temporary file is
/// written and synced, renamed over `name`, and the directory synced.
pub(super) fn write_dropping(dir: BorrowedFd<'_>, name: &str, d: &Dropping) -> Result<()> {
    let bytes = format::encode(d)?;
    let tmp = format!("{TMP_PREFIX}{}", format::new_id());
    let mut f = open_file(dir, &tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)?;
    let res = f
        .write_all(&bytes)
        .and_then(|_| f.sync_data())
        .map_err(Error::from)
        .and_then(|_| Ok(rustix::fs::renameat(dir, tmp.as_str(), dir, name)?));
    if let Err(e) = res {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    fsync_dir(dir)
}

/// Syncs directory `dir` itself (names created, renamed, removed in it).
pub(super) fn fsync_dir(dir: BorrowedFd<'_>) -> Result<()> {
    let fd = openat2_beneath(
        dir,
        OsStr::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(rustix::fs::fsync(&fd)?)
}

/// Removes file `name` from `dir`; already gone is fine.
pub(super) fn remove(dir: BorrowedFd<'_>, name: &str) -> Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets the file's mtime (and so ctime) to now: its data changed.
pub(super) fn touch_mtime(dir: BorrowedFd<'_>) -> Result<()> {
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
    };
    Ok(rustix::fs::utimensat(
        dir,
        IDENTITY,
        &times,
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// Removes `name` in `parent` with everything beneath it (a container, or
/// a half-created one), never following a symlink: entries are unlinked
/// relative to the directory fd they were listed from.
pub(super) fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> Result<()> {
    remove_tree_at(parent, name, 0)
}

/// Removes the container named `name` in `parent` with everything in it:
/// its identity and then the directory, which is all a file never written
/// holds (no listing needed); else, the directory not being empty, every
/// entry listed in it. The container is opened by its name here, not taken
/// from an earlier lookup: what goes is what the name holds. A crash part
/// way leaves the hidden name, which `rmdir` of the parent clears whatever
/// it holds.
pub(super) fn remove_container(parent: BorrowedFd<'_>, name: &OsStr) -> Result<()> {
    let fd = match open_to_list(parent, name) {
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        // Not a directory any more (planted): removed as what it is.
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return remove_tree(parent, name)
        }
        r => r?,
    };
    if let Ok(()) | Err(rustix::io::Errno::NOENT) =
        rustix::fs::unlinkat(&fd, IDENTITY, AtFlags::empty())
    {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    remove_listed(fd, parent, name, 0)
}

fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr, depth: u32) -> Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    remove_entries(parent, name, depth)
}

/// Removes directory `name` in `parent` and everything beneath it.
fn remove_entries(parent: BorrowedFd<'_>, name: &OsStr, depth: u32) -> Result<()> {
    if depth >= MAX_DEPTH {
        return Err(Error::from_errno(libc::ENOTEMPTY));
    }
    let fd = match open_to_list(parent, name) {
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        r => r?,
    };
    remove_listed(fd, parent, name, depth)
}

/// Directory `name` in `parent`, opened (beneath it, never through a
/// symlink) to list and remove what it holds.
fn open_to_list(parent: BorrowedFd<'_>, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    openat2_beneath(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Removes everything listed in directory `fd`, then the directory itself,
/// `name` in `parent`.
fn remove_listed(fd: OwnedFd, parent: BorrowedFd<'_>, name: &OsStr, depth: u32) -> Result<()> {
    let mut names = Vec::new();
    each_entry(fd.as_fd(), |n, _, _| names.push(n.to_os_string()))?;
    for n in names {
        remove_tree_at(fd.as_fd(), &n, depth + 1)?;
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Takes the container's cross-process lock: `flock` on `.plfs`, shared
/// for merging, exclusive for writing or removing droppings and logs. Held
/// until the returned file is dropped. (`flock` locks belong to the open file
/// description, so a process must not take it twice on one container: the
/// in-process stripe lock is always taken first and serialises that.)
///
/// A container removed meanwhile has no `.plfs` any more, or had it removed
/// while this waited for the lock (containers are removed under it):
/// `ESTALE` (the caller looks its name up again, or has nothing left to
/// do). So a lock held is a container present.
pub(super) fn lock_identity(dir: BorrowedFd<'_>, exclusive: bool) -> Result<Flock> {
    // As `open_file`, but `O_NONBLOCK` stays: nothing reads this
    // descriptor, and `flock` ignores it.
    let fd = openat2_beneath(
        dir,
        OsStr::new(IDENTITY),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => Error::from_errno(libc::ESTALE),
        e => e.into(),
    })?;
    let op = if exclusive {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::LockShared
    };
    rustix::fs::flock(&fd, op)?;
    let lock = Flock(File::from(fd));
    // Checked once locked: the one `fstat` tells a planted non-file and a
    // container removed while this waited (its identity unlinked).
    let st = rustix::fs::fstat(&lock.0)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Error::io().context("the identity of a plfs container is not a file"));
    }
    if st.st_nlink == 0 {
        return Err(Error::from_errno(libc::ESTALE));
    }
    Ok(lock)
}

/// A held container lock ([`lock_identity`]), unlocked when dropped.
#[derive(Debug)]
pub(super) struct Flock(File);

impl Drop for Flock {
    fn drop(&mut self) {
        // Unlocked before the close: a FUSE backing store (Gluster) releases
        // a lock at close only once its asynchronous release arrives, which
        // other hosts would wait for.
        let _ = rustix::fs::flock(&self.0, FlockOperation::Unlock);
    }
}

/// Marks `log` as in use by a live writer (a shared `flock` held as long as
/// any descriptor of this open of it exists, in any process it was handed
/// to), so compactions anywhere leave it alone.
pub(super) fn hold_log(log: &File) -> Result<()> {
    Ok(rustix::fs::flock(log, FlockOperation::LockShared)?)
}

/// Removes log `name` unless a live writer holds it; true when removed.
pub(super) fn remove_log_if_unused(dir: BorrowedFd<'_>, name: &str) -> Result<bool> {
    let f = match open_file(dir, name, OFlags::RDONLY) {
        Ok(f) => f,
        Err(e) if e.errno() == libc::ENOENT => return Ok(false),
        Err(e) => return Err(e),
    };
    match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            remove(dir, name)?;
            Ok(true)
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Renames `from` in `fd` to `to` in `td` unless `to` exists (`EEXIST`).
/// With `RENAME_NOREPLACE` where the store has it; where it does not
/// (GlusterFS's FUSE client answers `EINVAL`), the target is checked to be
/// free and a plain rename follows: a container is a non-empty directory, so
/// the rename cannot replace a file, a symlink or a non-empty directory
/// created meanwhile (`ENOTDIR`/`ENOTEMPTY`, reported as `EEXIST`); only an
/// empty directory created under the same name in that window is replaced.
pub(super) fn rename_noreplace(
    fd: BorrowedFd<'_>,
    from: &OsStr,
    td: BorrowedFd<'_>,
    to: &OsStr,
) -> Result<()> {
    match rustix::fs::renameat_with(fd, from, td, to, rustix::fs::RenameFlags::NOREPLACE) {
        Err(rustix::io::Errno::INVAL) => {}
        r => return Ok(r?),
    }
    match rustix::fs::statat(td, to, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => return Err(Error::from_errno(libc::EEXIST)),
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match rustix::fs::renameat(fd, from, td, to) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::NOTEMPTY | rustix::io::Errno::NOTDIR | rustix::io::Errno::EXIST) => {
            Err(Error::from_errno(libc::EEXIST))
        }
        Err(e) => Err(e.into()),
    }
}

/// The right to put a new container in place under one name, on a store
/// whose renames cannot refuse an existing target: a claim file created
/// with `O_EXCL` in the parent (atomic on every store, GlusterFS included),
/// removed when dropped. Its name is reserved (hidden, refused to users) and
/// derived from a hash of the claimed name, so two names may share a claim
/// (they then only take turns). A claim older than [`CLAIM_STALE`] was left
/// by a creator that died and is broken.
#[derive(Debug)]
pub(super) struct Claim<'a> {
    parent: BorrowedFd<'a>,
    name: String,
}

/// After this long a claim's creator is taken for dead (making a container,
/// a directory and one file, takes milliseconds, even on Gluster).
const CLAIM_STALE: std::time::Duration = std::time::Duration::from_secs(10);

impl<'a> Claim<'a> {
    /// Takes the claim on `name` in `parent`, waiting for another creator's
    /// (up to [`CLAIM_STALE`], then breaking it).
    pub(super) fn take(parent: BorrowedFd<'a>, name: &OsStr) -> Result<Claim<'a>> {
        let claim = claim_name(name);
        let mut wait = 1u64;
        loop {
            match open_file(
                parent,
                &claim,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            ) {
                Ok(_) => {
                    return Ok(Claim {
                        parent,
                        name: claim,
                    })
                }
                Err(e) if e.errno() == libc::EEXIST => {}
                Err(e) => return Err(e),
            }
            let age = rustix::fs::statat(parent, claim.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .ok()
                .and_then(|st| {
                    let made = std::time::UNIX_EPOCH
                        + std::time::Duration::new(st.st_mtime as u64, st.st_mtime_nsec as u32);
                    made.elapsed().ok()
                });
            if age.is_some_and(|a| a > CLAIM_STALE) {
                warn!("plfs: breaking the stale claim {claim} (its creator died)");
                let _ = rustix::fs::unlinkat(parent, claim.as_str(), AtFlags::empty());
                continue;
            }
            std::thread::sleep(std::time::Duration::from_millis(wait));
            wait = (wait * 2).min(20);
        }
    }
}

/// The claim file of `name`. FNV-1a: every host must derive the same claim
/// from a name, whatever Rust built its binary (std's `DefaultHasher` may
/// change).
fn claim_name(name: &OsStr) -> String {
    let hash = (name.as_bytes().iter()).fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{NEW_PREFIX}claim.{hash:016x}")
}

/// True while a creator holds the claim of `name` in `parent`.
pub(super) fn claimed(parent: BorrowedFd<'_>, name: &OsStr) -> bool {
    rustix::fs::statat(parent, claim_name(name).as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Err(e) = rustix::fs::unlinkat(self.parent, self.name.as_str(), AtFlags::empty()) {
            warn!("plfs: cannot remove claim {}: {e}", self.name);
        }
    }
}

/// A fresh hidden name for a container being created in a directory.
pub(super) fn new_name() -> String {
    format!("{NEW_PREFIX}{}", format::new_id())
}
