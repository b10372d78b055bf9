//! Open files and directories, by FUSE file handle, and the kernel
//! passthrough backing ids shared by all opens of an inode.
//!
//! Backing ids follow fuser's example: a `Weak` by inode and an `Arc` by
//! handle, so one id serves every open of an inode (the kernel requires all
//! opens of a passthrough inode to be passthrough) and is closed at the last
//! release.
//!
//! Lock order: `files` before `backing`; both are leaves otherwise.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use fuser::BackingId;
use mapfs::engine::DataFile;
use mapfs::lentsize::LentSize;
use mapfs::DirEntry;
use parking_lot::{Mutex, RwLock};

/// A writable open lent to a shim client: its handle and the page where
/// the client keeps its map's size.
type LentWriter = (u64, Arc<LentSize>);

/// One open of a regular file.
#[derive(Debug)]
pub struct OpenFile {
    /// Its FUSE handle (set by [`Handles::add_file`]).
    pub fh: u64,
    /// FUSE inode.
    pub ino: u64,
    /// Path at open time (for `release`/`remap`; renames do not matter to them).
    pub path: PathBuf,
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
    /// Held while the open's map is taken and handed to the file system
    /// (`flush`, `release`), so they reach it in the order of their maps;
    /// holds the backing files (by index) whose descriptors the supervisor
    /// keeps for this open's changes (see [`crate::failover`]).
    pub persisting: Mutex<Vec<u32>>,
    /// The caller's credentials at open (for `release`/`remap`).
    pub ctx: mapfs::Ctx,
    /// Lent to a shim client, which runs its data calls in-process: the
    /// daemon's copy of the map is stale until the client hands it back, so
    /// reads and writes of this open through the mount fail with `EIO`.
    pub lent: AtomicBool,
    /// Bytes of changes handed to the supervisor since the file system was
    /// last handed this open's map (see [`crate::failover`]).
    pub journaled: AtomicU64,
    /// The open of the file system this open shares with other opens of
    /// its inode (see [`Share`]); `None` on mounts where each open has its
    /// own.
    pub share: Option<Arc<Share>>,
}

/// One open of the file system shared by every open of an inode that
/// joined it, with one map executed by the daemon.
///
/// Needed with the kernel's writeback cache over maps that are not
/// whole-file (plfs): the kernel writes a dirty page back, and reads a page
/// to fill a partial write, through whichever open of the inode it picks,
/// so with one map per open a page written back through one open carries
/// another's bytes into its log, and a page read through an open whose map
/// misses another's unflushed writes comes back with older bytes, which
/// the next write-back makes permanent. With one map, the daemon holds
/// what the kernel's page cache holds: one file.
#[derive(Debug)]
pub struct Share {
    /// Whether the file system's open may write (a new open that writes
    /// joins only such a one).
    pub writable: bool,
    /// The handles of the opens sharing it; the last to be released
    /// releases the file system's open.
    pub members: Mutex<Vec<u64>>,
    /// Held while its map is handed to the file system, so hand-overs reach
    /// it in the order of their maps.
    pub persisting: Mutex<()>,
}

impl Share {
    /// A share of a file system's open, without members yet.
    pub fn new(writable: bool) -> Arc<Share> {
        Arc::new(Share {
            writable,
            members: Mutex::new(Vec::new()),
            persisting: Mutex::new(()),
        })
    }

    /// Takes `fh` out; true when no open is left.
    pub fn leave(&self, fh: u64) -> bool {
        let mut m = self.members.lock();
        m.retain(|h| *h != fh);
        m.is_empty()
    }
}

impl OpenFile {
    /// A new open of `ino` (its handle is set when it is registered), with
    /// nothing written, lent or handed to the supervisor yet.
    pub fn new(
        ino: u64,
        path: PathBuf,
        flags: i32,
        ctx: mapfs::Ctx,
        fs_handle: u64,
        data: Arc<DataFile>,
        backing: Option<Arc<BackingId>>,
    ) -> Self {
        OpenFile {
            fh: 0,
            ino,
            path,
            flags,
            fs_handle,
            data,
            backing,
            wrote: AtomicBool::new(false),
            persisting: Mutex::new(Vec::new()),
            ctx,
            lent: AtomicBool::new(false),
            journaled: AtomicU64::new(0),
            share: None,
        }
    }

    /// This open, sharing the file system's open `share`.
    pub fn in_share(mut self, share: Arc<Share>) -> Self {
        self.share = Some(share);
        self
    }

    /// A new open of `owner`'s inode that shares its open of the file
    /// system, its map and its path (`flags` and `ctx`: the new open's).
    pub fn joining(owner: &OpenFile, flags: i32, ctx: mapfs::Ctx) -> Self {
        let share = owner.share.clone().expect("a shared open");
        OpenFile::new(
            owner.ino,
            owner.path.clone(),
            flags,
            ctx,
            owner.fs_handle,
            owner.data.clone(),
            None,
        )
        .in_share(share)
    }
}

/// An open directory: the listing taken at `opendir`, served by offset.
#[derive(Debug)]
pub struct OpenDir {
    /// Entries, without `.` and `..`.
    pub entries: Vec<DirEntry>,
}

/// A backing id registered with the kernel and the file it stands for.
#[derive(Debug)]
struct LiveBacking {
    id: Weak<BackingId>,
    /// Device and inode of the file (`None`: not known).
    file: Option<(u64, u64)>,
}

/// The handle tables of one mount.
#[derive(Debug, Default)]
pub struct Handles {
    next: AtomicU64,
    files: RwLock<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<OpenDir>>>,
    backing: Mutex<HashMap<u64, LiveBacking>>,
    /// Sizes written through opens whose map is not whole-file and not yet
    /// handed to the file system, by inode.
    unflushed: Mutex<HashMap<u64, Unflushed>>,
    /// `unflushed.len()`, a lock-free "none" for [`Handles::written_size`]
    /// (asked at every attribute reply).
    unflushed_count: AtomicUsize,
    /// Backing ids of opens a resumed daemon could not reopen, kept until
    /// their release (the kernel still does their I/O with them).
    orphans: Mutex<HashMap<u64, Arc<BackingId>>>,
    /// Handles of placeholder opens (no data).
    placeholders: Mutex<HashSet<u64>>,
    /// Writable opens lent to shim clients, by inode: their handles and the
    /// pages where the clients keep their maps' sizes.
    lent_sizes: Mutex<HashMap<u64, Vec<LentWriter>>>,
    /// `lent_sizes.len()`, a lock-free "none" for [`Handles::lent_size`].
    lent_count: AtomicUsize,
    /// Opens that may write, by inode (for [`Handles::has_writer`], asked
    /// at every copy handed to a shim client: no scan of every open).
    writers: Mutex<HashMap<u64, usize>>,
}

/// Whether an open with `flags` may write its file.
fn may_write(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

/// The size of an inode as changes through non-whole-file opens left it,
/// while some of those opens have not handed their map to the file system
/// (which answers `getattr` from what it was handed).
#[derive(Debug)]
struct Unflushed {
    /// Set by the last truncate since the file system last knew the size
    /// (`None`: the file system's size is the base).
    set: Option<u64>,
    /// The furthest end of writes since that truncate.
    grown: u64,
    /// Opens with unflushed changes: handle -> count of changes, so a flush
    /// clears only what it handed over.
    opens: HashMap<u64, u64>,
}

/// How a change through an open moved the file's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeChange {
    /// Bytes up to this offset exist now (a write, an allocation): the size
    /// grows to it if it was smaller.
    Extend(u64),
    /// The size is now this (a truncate, or a shim client's map, which holds
    /// all of that client's changes).
    Set(u64),
    /// Bytes changed, the size did not (a hole punched, a range zeroed
    /// within the file).
    Keep,
}

/// Handles a daemon may give per millisecond of its life (see
/// [`successor_base`]): more than any daemon could.
const HANDLES_PER_MS: u64 = 1 << 20;

/// The first handle number of a daemon taking over a connection: the
/// milliseconds since boot times `HANDLES_PER_MS`. Every daemon before
/// it on the connection was born earlier and gave fewer than
/// `HANDLES_PER_MS` handles per millisecond it lived, so every number any
/// of them gave is below this one. A successor that numbered on from the
/// handles it restored could give a number again that a dead daemon gave,
/// released and never answered the release of: the kernel sends such a
/// `RELEASE` again, and it would release the successor's open instead.
pub fn successor_base() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let ms = t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000;
    ms.saturating_mul(HANDLES_PER_MS)
}

impl Handles {
    fn next_fh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Numbers the handles given from now on above `base` (a restored
    /// handle's, or a successor's [`successor_base`]).
    pub fn number_above(&self, base: u64) {
        self.next.fetch_max(base, Ordering::Relaxed);
    }

    /// Registers an open file; returns its handle.
    pub fn add_file(&self, mut file: OpenFile) -> u64 {
        let fh = self.next_fh();
        file.fh = fh;
        self.insert_file(fh, file);
        fh
    }

    fn insert_file(&self, fh: u64, file: OpenFile) {
        let mut files = self.files.write();
        if may_write(file.flags) {
            *self.writers.lock().entry(file.ino).or_default() += 1;
        }
        if let Some(share) = &file.share {
            share.members.lock().push(fh);
        }
        if let Some(old) = files.insert(fh, Arc::new(file)) {
            self.forget_writer(&old);
        }
    }

    /// Takes `file`, removed from the table, off the writer counts.
    fn forget_writer(&self, file: &OpenFile) {
        if !may_write(file.flags) {
            return;
        }
        let mut writers = self.writers.lock();
        if let Some(n) = writers.get_mut(&file.ino) {
            *n -= 1;
            if *n == 0 {
                writers.remove(&file.ino);
            }
        }
    }

    /// The open file `fh`.
    pub fn file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.files.read().get(&fh).cloned()
    }

    /// Records (`Some`) or forgets (`None`) the size page of the writable
    /// open `fh` of `ino` lent to a shim client.
    pub fn lent_with_size(&self, ino: u64, fh: u64, size: Option<Arc<LentSize>>) {
        let mut all = self.lent_sizes.lock();
        match size {
            Some(s) => all.entry(ino).or_default().push((fh, s)),
            None => {
                if let Some(v) = all.get_mut(&ino) {
                    v.retain(|(h, _)| *h != fh);
                    if v.is_empty() {
                        all.remove(&ino);
                    }
                }
            }
        }
        self.lent_count.store(all.len(), Ordering::Relaxed);
    }

    /// The size the shim clients writing `ino` through their own maps give
    /// it (the largest, when several do).
    pub fn lent_size(&self, ino: u64) -> Option<u64> {
        if self.lent_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.lent_sizes
            .lock()
            .get(&ino)
            .and_then(|v| v.iter().map(|(_, s)| s.get()).max())
    }

    /// Registers an open file under the handle an earlier daemon gave it
    /// (failover); later handles are numbered above it.
    pub fn restore_file(&self, fh: u64, mut file: OpenFile) {
        self.number_above(fh);
        file.fh = fh;
        self.insert_file(fh, file);
    }

    /// Registers a placeholder open under an earlier daemon's handle.
    pub fn restore_placeholder(&self, fh: u64) {
        self.number_above(fh);
        self.placeholders.lock().insert(fh);
    }

    /// Registers an open directory under an earlier daemon's handle.
    pub fn restore_dir(&self, fh: u64, dir: OpenDir) {
        self.number_above(fh);
        self.dirs.lock().insert(fh, Arc::new(dir));
    }

    /// The backing id an earlier daemon registered for `ino`, shared by
    /// every restored open of it: the one already restored, or `wrap()`.
    /// `file`: the file a restored open of it was opened again on, which the
    /// id stands for from then on (`None`: its open could not be opened
    /// again). Without it a restored id matched any file, and an open of a
    /// name that had got another file since (a `versions` rewrite gives the
    /// name a new inode) was handed the old file's id: the kernel wrote the
    /// new file's bytes into the old one, by then a version.
    pub fn restore_backing(
        &self,
        ino: u64,
        file: Option<&std::fs::File>,
        wrap: impl FnOnce() -> BackingId,
    ) -> Arc<BackingId> {
        let identity = file.and_then(file_identity);
        let mut map = self.backing.lock();
        if let Some(live) = map.get_mut(&ino) {
            if let Some(id) = live.id.upgrade() {
                live.file = live.file.or(identity);
                return id;
            }
        }
        let id = Arc::new(wrap());
        map.insert(
            ino,
            LiveBacking {
                id: Arc::downgrade(&id),
                file: identity,
            },
        );
        id
    }

    /// Keeps `id` until handle `fh`, which could not be restored, is
    /// released.
    pub fn keep_orphan(&self, fh: u64, id: Arc<BackingId>) {
        self.number_above(fh);
        self.orphans.lock().insert(fh, id);
    }

    /// Takes an unrestored handle's backing id out (`None` if `fh` is not
    /// one); dropping the last reference closes the id with the kernel.
    pub fn take_orphan(&self, fh: u64) -> Option<Arc<BackingId>> {
        self.orphans.lock().remove(&fh)
    }

    /// Registers a placeholder open; returns its handle.
    pub fn add_placeholder(&self) -> u64 {
        let fh = self.next_fh();
        self.placeholders.lock().insert(fh);
        fh
    }

    /// True if `fh` is a placeholder open.
    pub fn is_placeholder(&self, fh: u64) -> bool {
        self.placeholders.lock().contains(&fh)
    }

    /// Forgets the placeholder open `fh`; false if it is not one.
    pub fn remove_placeholder(&self, fh: u64) -> bool {
        self.placeholders.lock().remove(&fh)
    }

    /// Number of open files.
    pub fn open_files(&self) -> usize {
        self.files.read().len()
    }

    /// Every open file.
    pub fn all_files(&self) -> Vec<Arc<OpenFile>> {
        self.files.read().values().cloned().collect()
    }

    /// Removes and returns the open file `fh`.
    pub fn remove_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        let mut files = self.files.write();
        let file = files.remove(&fh)?;
        self.forget_writer(&file);
        Some(file)
    }

    /// The open of `ino` a new open joins (see [`Share`]): one whose file
    /// system open may write, or for a new open that only reads, any.
    pub fn share_of(&self, ino: u64, writes: bool) -> Option<Arc<OpenFile>> {
        let files = self.files.read();
        let mut read_only = None;
        for f in files.values().filter(|f| f.ino == ino) {
            match &f.share {
                Some(share) if share.writable => return Some(f.clone()),
                Some(_) => read_only = read_only.or(Some(f)),
                None => {}
            }
        }
        read_only.filter(|_| !writes).cloned()
    }

    /// The other opens in `file`'s share that are still registered.
    pub fn sharing_with(&self, file: &OpenFile) -> Vec<Arc<OpenFile>> {
        let Some(share) = &file.share else {
            return Vec::new();
        };
        let members = share.members.lock().clone();
        let files = self.files.read();
        (members.iter())
            .filter(|fh| **fh != file.fh)
            .filter_map(|fh| files.get(fh).cloned())
            .collect()
    }

    /// Any open of `ino` executed by the daemon (for `getattr` of an open,
    /// unlinked file).
    pub fn any_file_of(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.files.read().values().find(|f| f.ino == ino).cloned()
    }

    /// True when `ino` has an open that may write it (its access mode is
    /// not read-only).
    pub fn has_writer(&self, ino: u64) -> bool {
        self.writers.lock().contains_key(&ino)
    }

    /// True when `ino` has an open that runs through the daemon (not in
    /// kernel passthrough).
    pub fn has_daemon_open(&self, ino: u64) -> bool {
        (self.files.read().values()).any(|f| f.ino == ino && f.backing.is_none())
    }

    /// Records a change through `file` (not whole-file) that the file
    /// system learns only when the open's map is flushed.
    ///
    /// The size follows the kernel's rule for one file, whatever open made
    /// the change: writes grow it, truncates set it. An open's own view of
    /// the size is no guide: it may predate another open's truncate, or miss
    /// another open's writes.
    pub fn note_change(&self, file: &OpenFile, change: SizeChange) {
        let mut all = self.unflushed.lock();
        let entry = all.entry(file.ino).or_insert_with(|| {
            self.unflushed_count.fetch_add(1, Ordering::Relaxed);
            Unflushed {
                set: None,
                grown: 0,
                opens: HashMap::new(),
            }
        });
        match change {
            SizeChange::Extend(end) => entry.grown = entry.grown.max(end),
            SizeChange::Set(size) => {
                entry.set = Some(size);
                entry.grown = 0;
            }
            SizeChange::Keep => {}
        }
        *entry.opens.entry(file.fh).or_insert(0) += 1;
    }

    /// How many changes of `file` are unflushed, to pass to
    /// [`Handles::flushed`] once its map as of now is with the file system.
    pub fn changes(&self, file: &OpenFile) -> u64 {
        self.unflushed
            .lock()
            .get(&file.ino)
            .and_then(|u| u.opens.get(&file.fh).copied())
            .unwrap_or(0)
    }

    /// The file system holds `file`'s map as of `changes` (from
    /// [`Handles::changes`] before it was handed over); a change made since
    /// keeps the open unflushed.
    pub fn flushed(&self, file: &OpenFile, changes: u64) {
        self.clear(file, |n| n == changes);
    }

    /// `file` is released: whatever it did is the file system's now.
    pub fn forget_changes(&self, file: &OpenFile) {
        self.clear(file, |_| true);
    }

    fn clear(&self, file: &OpenFile, done: impl FnOnce(u64) -> bool) {
        let mut all = self.unflushed.lock();
        let Some(entry) = all.get_mut(&file.ino) else {
            return;
        };
        if entry.opens.get(&file.fh).is_some_and(|n| done(*n)) {
            entry.opens.remove(&file.fh);
        }
        if entry.opens.is_empty() {
            all.remove(&file.ino);
            self.unflushed_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The size of `ino`, whose file system says `fs_size`, while an open
    /// whose map is not whole-file 1-to-1 has changes the file system has
    /// not been handed (it learns them at flush or release).
    pub fn written_size(&self, ino: u64, fs_size: u64) -> Option<u64> {
        if self.unflushed_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.unflushed
            .lock()
            .get(&ino)
            .map(|u| u.set.unwrap_or(fs_size).max(u.grown))
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

    /// The backing id for a passthrough open of `ino` on `file`: the live
    /// one of `ino` if it stands for `file`, else a new one from `create`.
    /// `Ok(None)`: the live one stands for another file (a new file took
    /// the name while the kernel still runs opens of the old one), and the
    /// kernel takes one backing file per inode. A live id whose file is not
    /// known (restored after a failover for an open that could not be
    /// opened again) is shared, as before the failover.
    pub fn backing_for(
        &self,
        ino: u64,
        file: &std::fs::File,
        create: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> std::io::Result<Option<Arc<BackingId>>> {
        let identity = file_identity(file);
        let mut map = self.backing.lock();
        if let Some(live) = map.get(&ino) {
            if let Some(id) = live.id.upgrade() {
                let other = matches!((live.file, identity), (Some(a), Some(b)) if a != b);
                return Ok((!other).then_some(id));
            }
        }
        let id = Arc::new(create()?);
        map.insert(
            ino,
            LiveBacking {
                id: Arc::downgrade(&id),
                file: identity,
            },
        );
        Ok(Some(id))
    }

    /// True when `ino` currently has opens in passthrough mode (every new
    /// open of it must then be passthrough too).
    pub fn has_backing(&self, ino: u64) -> bool {
        self.backing
            .lock()
            .get(&ino)
            .is_some_and(|b| b.id.strong_count() > 0)
    }

    /// Drops dead backing-id entries of `ino`.
    pub fn prune_backing(&self, ino: u64) {
        let mut map = self.backing.lock();
        if map.get(&ino).is_some_and(|b| b.id.strong_count() == 0) {
            map.remove(&ino);
        }
    }
}

/// A file's (device, inode), as backing ids are told apart.
fn file_identity(file: &std::fs::File) -> Option<(u64, u64)> {
    mapfs::backing::identity(file)
        .ok()
        .map(|id| (id.dev, id.ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(ino: u64, flags: i32) -> OpenFile {
        let data = Arc::new(DataFile::new(mapfs::Opened {
            map: mapfs::DataMap::whole_file(),
            files: vec![Arc::new(tempfile::tempfile().unwrap())],
            handle: 0,
        }));
        OpenFile::new(
            ino,
            PathBuf::from("/f"),
            flags,
            mapfs::Ctx::current(),
            0,
            data,
            None,
        )
    }

    /// The writer counts follow every way a handle comes and goes,
    /// including a restored handle that replaces one.
    #[test]
    fn writers_are_counted_per_inode() {
        let h = Handles::default();
        let r = h.add_file(open(7, libc::O_RDONLY));
        assert!(!h.has_writer(7));
        let w1 = h.add_file(open(7, libc::O_WRONLY));
        let w2 = h.add_file(open(7, libc::O_RDWR));
        assert!(h.has_writer(7) && !h.has_writer(8));
        h.remove_file(w1);
        assert!(h.has_writer(7), "one writer is left");
        h.remove_file(w2);
        assert!(!h.has_writer(7));
        h.restore_file(r, open(7, libc::O_RDWR));
        assert!(h.has_writer(7), "a restored writer counts");
        h.restore_file(r, open(7, libc::O_RDONLY));
        assert!(!h.has_writer(7), "the writer it replaced no longer counts");
        h.remove_file(r);
        assert!(h.remove_file(r).is_none());
        assert!(!h.has_writer(7));
    }

    /// A successor never gives a number its predecessors gave: a
    /// `RELEASE` of a dead daemon's handle, sent again, must not find one
    /// of its successor's opens.
    #[test]
    fn a_successor_numbers_above_every_handle_given_before() {
        // A fresh daemon, then two successors, each giving handles.
        let mut last = 0;
        for daemon in 0..3 {
            let h = Handles::default();
            if daemon > 0 {
                // It restores an older open, then numbers on.
                h.restore_placeholder(last - 5);
                h.number_above(successor_base());
            }
            let first = h.add_placeholder();
            assert!(
                first > last,
                "daemon {daemon} gave {first} again (last before: {last})"
            );
            for _ in 0..10_000 {
                last = h.add_placeholder();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
