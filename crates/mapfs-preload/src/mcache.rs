//! The per-process map cache (DeFUSE's M-Cache): re-adopting an unchanged
//! file costs no round trip to the daemon.
//!
//! After an adoption of a whole-file map the shim keeps an `O_PATH`
//! descriptor of the backing file (numbered at or above [`sys::HIGH_FD`],
//! marked as the shim's), keyed by the mount's inode number and the
//! daemon's generation token of that inode read *before* asking the daemon.
//! The next adoption of the same inode reads the token again (a load from the
//! daemon's shared, read-only table, no system call): if the daemon has seen
//! no change of the inode's map, size or name since (see
//! [`mapfs::mapcache`]), the shim reopens the cached backing file itself
//! with the application's flags. The application already opened the file
//! through the mount (the kernel checked its permissions there), and the
//! reopen is checked by the kernel again, as the application's own user,
//! against the backing file; a reopen the kernel refuses is a miss, not an
//! error. A stale entry is dropped and the daemon asked as usual.
//!
//! `MAPFS_PRELOAD_MAP_CACHE=<n>` sets the capacity (default 256 files; 0
//! turns the cache off). Each entry holds one descriptor.

use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};

use mapfs::mapcache::MapCache;
use mapfs_interpose::sync::Mutex;
use rustix::fs::{Mode, OFlags};

use crate::{mounts, report, sys, table};

/// A cached backing file.
struct Cached {
    /// `O_PATH` descriptor, the shim's own.
    fd: RawFd,
    /// Its device and inode, to notice the number was taken over.
    dev: u64,
    ino: u64,
}

impl Cached {
    /// The descriptor, if it is still the shim's descriptor of that file.
    fn live(&self) -> Option<RawFd> {
        if table::state(self.fd) != table::SHIM {
            return None;
        }
        match sys::identity(self.fd) {
            Ok(id) if id.dev == self.dev && id.ino == self.ino => Some(self.fd),
            _ => None,
        }
    }

    fn close(self) {
        if let Some(fd) = self.live() {
            table::release_shim_fd(fd);
            sys::close_own(fd);
        }
    }
}

/// One cache per attached mount (inode numbers are per mount).
static CACHES: Mutex<Vec<Option<MapCache<Cached>>>> = Mutex::new(Vec::new());

fn capacity() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("MAPFS_PRELOAD_MAP_CACHE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(256)
    })
}

/// The token to cache an adoption of `ino` on mount `mount` under, read
/// before the daemon is asked (`None`: nothing will be cached).
pub fn token_before_asking(mount: usize, ino: u64) -> Option<u64> {
    if capacity() == 0 {
        return None;
    }
    let m = mounts::all().get(mount)?;
    m.connect().ok()?;
    m.token(ino)
}

/// A new descriptor of the backing file of `ino`, opened with the
/// application's `flags`, if the cache holds it under the current token.
pub fn reopen(mount: usize, ino: u64, flags: i32) -> Option<OwnedFd> {
    if capacity() == 0 {
        return None;
    }
    let m = mounts::all().get(mount)?;
    let token = m.token(ino)?;
    let mut caches = CACHES.lock();
    drop_if_stale(&mut caches, mount, m);
    let cached = caches.get_mut(mount)?.as_mut()?.get(ino, token)?;
    let Some(fd) = cached.live() else {
        drop(caches);
        forget(mount, ino);
        return None;
    };
    let (dev, bino) = (cached.dev, cached.ino);
    let file = mapfs::control::reopen(sys::fd(fd), flags).ok()?;
    match sys::identity(file.as_raw_fd()) {
        Ok(id) if id.dev == dev && id.ino == bino => {
            report::count_cache_hit();
            Some(file)
        }
        _ => None,
    }
}

/// Remembers the backing file `backing` of `ino` under `token`.
pub fn store(mount: usize, ino: u64, token: u64, backing: BorrowedFd<'_>) {
    let Ok(id) = sys::identity(backing.as_raw_fd()) else {
        return;
    };
    let proc_path = format!("/proc/self/fd/{}", backing.as_raw_fd());
    let Ok(path_fd) = rustix::fs::open(
        proc_path.as_str(),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let Ok(high) = sys::dup_high(path_fd.as_raw_fd()) else {
        return;
    };
    drop(path_fd);
    let fd = high.into_raw_fd();
    table::claim_shim_fd(fd);
    let value = Cached {
        fd,
        dev: id.dev,
        ino: id.ino,
    };
    let mut caches = CACHES.lock();
    if let Some(m) = mounts::all().get(mount) {
        drop_if_stale(&mut caches, mount, m);
    }
    if caches.len() <= mount {
        caches.resize_with(mount + 1, || None);
    }
    caches[mount]
        .get_or_insert_with(|| MapCache::new(capacity(), |_, c: Cached| c.close()))
        .insert(ino, token, value);
}

/// Empties the cache of `mount` if its daemon was replaced since (its
/// entries are keyed by the old daemon's tokens).
fn drop_if_stale(caches: &mut [Option<MapCache<Cached>>], mount: usize, m: &mounts::Mount) {
    if m.take_cache_stale() {
        if let Some(Some(c)) = caches.get_mut(mount) {
            c.clear();
        }
    }
}

/// Drops what is cached about `ino` whose descriptor number is no longer
/// the shim's (nothing to close).
fn forget(mount: usize, ino: u64) {
    let mut caches = CACHES.lock();
    if let Some(Some(c)) = caches.get_mut(mount) {
        let _ = c.remove(ino);
    }
}

/// Empties every cache, closing its descriptors; returns how many.
pub fn clear() -> usize {
    let mut caches = CACHES.lock();
    let mut n = 0;
    for c in caches.iter_mut().flatten() {
        n += c.len();
        c.clear();
    }
    n
}
