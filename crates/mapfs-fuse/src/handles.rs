//! Open files and directories, by FUSE file handle, and the kernel
//! passthrough backing ids shared by all opens of an inode.
//!
//! Backing ids follow fuser's example: a `Weak` by inode and an `Arc` by
//! handle, so one id serves every open of an inode (the kernel requires all
//! opens of a passthrough inode to be passthrough) and is closed at the last
//! release.
//!
//! Lock order: `files` before `backing`; both are leaves otherwise.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use fuser::BackingId;
use mapfs::engine::DataFile;
use mapfs::DirEntry;
use parking_lot::{Mutex, RwLock};

/// One open of a regular file.
#[derive(Debug)]
pub struct OpenFile {
    /// FUSE inode.
    pub ino: u64,
    /// Path at open time (for `release`/`remap`; renames do not matter to them).
    pub path: PathBuf,
    /// Process that opened it (thread-group id as the kernel reports it).
    pub pid: u32,
    /// `open(2)` flags.
    pub flags: i32,
    /// The file system's own handle.
    pub fs_handle: u64,
    /// Data state executed by the daemon (and shared with shim clients).
    pub data: Arc<DataFile>,
    /// Kernel passthrough id, when the kernel does the I/O.
    pub backing: Option<Arc<BackingId>>,
    /// Set by a write through the daemon, so `release` knows the map changed.
    pub wrote: AtomicBool,
    /// The caller's credentials at open (for `release`/`remap`).
    pub ctx: mapfs::Ctx,
    /// Lent to a shim client, which runs its data calls in-process: the
    /// daemon's copy of the map is stale until the client hands it back, so
    /// reads and writes of this open through the mount fail with `EIO`.
    pub lent: AtomicBool,
}

/// An open directory: the listing taken at `opendir`, served by offset.
#[derive(Debug)]
pub struct OpenDir {
    /// Entries, without `.` and `..`.
    pub entries: Vec<DirEntry>,
}

/// The handle tables of one mount.
#[derive(Debug, Default)]
pub struct Handles {
    next: AtomicU64,
    files: RwLock<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    backing: Mutex<HashMap<u64, Weak<BackingId>>>,
    /// Open files whose map is not whole-file (a fast "none" for
    /// [`Handles::written_size`]).
    not_whole: AtomicUsize,
}

impl Handles {
    fn next_fh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers an open file; returns its handle.
    pub fn add_file(&self, file: OpenFile) -> u64 {
        let fh = self.next_fh();
        if file.data.whole_file_backing().is_none() {
            self.not_whole.fetch_add(1, Ordering::Relaxed);
        }
        self.files.write().insert(fh, Arc::new(file));
        fh
    }

    /// The open file `fh`.
    pub fn file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.files.read().get(&fh).cloned()
    }

    /// Removes and returns the open file `fh`.
    pub fn remove_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let f = self.files.write().remove(&fh)?;
        if f.data.whole_file_backing().is_none() {
            self.not_whole.fetch_sub(1, Ordering::Relaxed);
        }
        Some(f)
    }

    /// Opens of `ino` by `pid`, most recent first.
    pub fn files_of(&self, pid: u32, ino: u64) -> Vec<(u64, Arc<OpenFile>)> {
        let mut v: Vec<(u64, Arc<OpenFile>)> = self
            .files
            .read()
            .iter()
            .filter(|(_, f)| f.pid == pid && f.ino == ino)
            .map(|(fh, f)| (*fh, f.clone()))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.0));
        v
    }

    /// Any open of `ino` executed by the daemon (for `getattr` of an open,
    /// unlinked file).
    pub fn any_file_of(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.files.read().values().find(|f| f.ino == ino).cloned()
    }

    /// The size of `ino` as written through an open whose map is not
    /// whole-file 1-to-1 (the file system learns it only at flush or
    /// release): the largest such open's.
    pub fn written_size(&self, ino: u64) -> Option<u64> {
        if self.not_whole.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.files
            .read()
            .values()
            .filter(|f| {
                f.ino == ino
                    && f.wrote.load(Ordering::Relaxed)
                    && f.data.whole_file_backing().is_none()
            })
            .filter_map(|f| f.data.size().ok())
            .max()
    }

    /// Registers an open directory; returns its handle.
    pub fn add_dir(&self, dir: OpenDir) -> u64 {
        let fh = self.next_fh();
        self.dirs.lock().insert(fh, Arc::new(dir));
        fh
    }

    /// The open directory `fh`.
    pub fn dir(&self, fh: u64) -> Option<Arc<OpenDir>> {
        self.dirs.lock().get(&fh).cloned()
    }

    /// Forgets the open directory `fh`.
    pub fn remove_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// The live backing id of `ino`, or a new one from `create`.
    pub fn backing_for(
        &self,
        ino: u64,
        create: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> std::io::Result<Arc<BackingId>> {
        let mut map = self.backing.lock();
        if let Some(id) = map.get(&ino).and_then(Weak::upgrade) {
            return Ok(id);
        }
        let id = Arc::new(create()?);
        map.insert(ino, Arc::downgrade(&id));
        Ok(id)
    }

    /// True when `ino` currently has opens in passthrough mode (every new
    /// open of it must then be passthrough too).
    pub fn has_backing(&self, ino: u64) -> bool {
        self.backing
            .lock()
            .get(&ino)
            .is_some_and(|w| w.strong_count() > 0)
    }

    /// Drops dead backing-id entries of `ino`.
    pub fn prune_backing(&self, ino: u64) {
        let mut map = self.backing.lock();
        if map.get(&ino).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&ino);
        }
    }
}
