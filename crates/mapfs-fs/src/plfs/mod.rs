//! `plfs`: the 1-to-M pattern, for N-1 checkpoints (after PLFS).
//!
//! # Mapping
//!
//! Directories, symlinks, FIFOs, sockets and devices are the same nodes at
//! the same paths beneath the backing directory, served by an inner
//! [`Passthrough`]. Every *regular file* `/a/f` is a *container directory*
//! `<backing>/a/f/` holding:
//!
//! - `.plfs`, an empty regular file that is the file's identity: its
//!   permission bits, owner, group, atime and mtime are the file's. A backing
//!   directory is a container iff it holds a regular file named `.plfs`, so a
//!   user file named `.plfs` (itself a container directory) confuses nothing.
//! - `data.<id>`: data logs. Every writable open gets a fresh log of its own
//!   at its first write, and from then on the map
//!   [`Growth::AppendLog`](mapfs::Growth::AppendLog) into it: each writer
//!   (the daemon, a shim client, another node) appends to its own log, so no
//!   two executors ever place bytes in the same backing space. Opens start
//!   with a [`ReadOnly`](mapfs::Growth::ReadOnly) map and no log; a writable
//!   one gets its log from [`remap`](mapfs::FileSystem::remap), which the
//!   executor calls when a write does not fit (and the daemon before it
//!   lends a writable open to a shim client), so an open that never writes
//!   creates and removes nothing. A log nothing refers to is removed at
//!   release.
//! - `index.<id>`: index droppings, one per writing open (plus bases written
//!   by truncation and compaction). A dropping holds records, each with a
//!   sequence number: bytes of a log mapped at a logical range, a hole, a size
//!   set or grown. Format and rules: `format.rs` (postcard after an 8-byte
//!   magic `PLFSIDX1`), `delta.rs` (what an open records), `merge.rs` (how
//!   records combine).
//! - `tmp.<id>`: a dropping being written (renamed to `index.<id>`).
//!
//! `open` merges all droppings, records in sequence order, into the file's
//! current map; extents name logs, turned into indexes of `Opened::files`.
//! `Attr::ino` is the container directory's backing inode number with a hash
//! of its birth time above bit 40 (`container::file_ino`): stable across
//! renames and remounts, and not the number of a file removed just before
//! (backing file systems reuse inode numbers at once); every open also keeps
//! a descriptor of its container, so the backing number itself is not
//! reused while the file is open. `nlink` is 1; `blocks` is
//! the sum of the logs' blocks (an approximation: bytes shadowed by later
//! writes count until a compaction frees their log). A directory's `nlink`
//! is 2 plus its real subdirectories (containers are files). A file's mtime
//! is set to the time of each flush that recorded new bytes, unless the
//! times were set explicitly since (`futimens` before `close`, as `tar` and
//! `cp -p` do).
//!
//! # Who decides
//!
//! As in [`Passthrough`], the backing kernel decides for the caller (via
//! [`mapfs::creds::as_caller`]): every path is walked as the caller, `.plfs`
//! is created as the caller (owner, group, umask and setgid directories come
//! from the kernel), opens are checked by opening `.plfs` as the caller with
//! the requested access mode and `O_TRUNC`, chmod/chown/utimens and xattrs of
//! a file act on `.plfs` as the caller, and `unlink` first renames the
//! container to a hidden name in the same directory as the caller (so sticky
//! directories and directory permissions rule exactly as for a file) before
//! the daemon removes it. Logs and droppings are created, read and removed by
//! the daemon itself (mode 0600): they are the file system's private data.
//!
//! # Consistency
//!
//! Close-to-open: executors call `flush` at every `close(2)`, `fsync` and
//! size change of a written open, and `release` at the end; both rewrite
//! that open's dropping atomically and durably (written to `tmp.<id>`,
//! synced, renamed, directory synced), so the next `open` or `getattr`
//! anywhere sees the bytes, and after `fsync` (where the executor has synced
//! the logs first) they survive a crash. What a dropping records is the
//! open's *delta* (see `delta.rs`): two writers of disjoint ranges of one
//! file both survive in either order. Overlapping writes of two opens that are both unflushed
//! resolve to the open that flushed later (the map carries no write times,
//! so exact "later write wins" would need the engine to stamp extents). `open`
//! with `O_TRUNC` and `truncate` add a dropping that sets the size; the
//! bytes that opens still writing had written before it are shadowed by it
//! (their log length at the truncate is noted), their later writes are not.
//! A truncate through an open is recorded as one when it cuts the size below
//! what that open found or last recorded; it cannot cut writes the open did
//! not see (another open's, unflushed when it opened). Executors flush an
//! open before shrinking it, and hand one open's maps over in order.
//! Merged maps are cached per container (keyed by its backing dev/ino,
//! validated by the directory's mtime/ctime, dropped by every local change).
//!
//! An open sees the file as merged at its `open` plus its own writes: a
//! descriptor opened *before* another open wrote and closed keeps the older
//! bytes until it is reopened (close-to-open, as NFS; refreshing it would
//! need the executor to install a new map).
//!
//! Executors must give each open its own writes, or give all opens of a
//! file one open: a kernel writeback cache shared by several writable
//! opens of one file (FUSE `writeback_cache`) writes a page back through
//! whichever open it picks and fills partial pages by reading through one
//! open's map, so with a map per open, writers sharing a page (N-1 with
//! blocks smaller than a page) lose bytes. The FUSE adapter does the
//! latter when plfs is mounted with `--data daemon --writeback-cache on`
//! (its `Share`): one handle of this file system serves every open of
//! the inode, flushed at each of their closes and released at the last.
//!
//! Compaction: when the release of an open that wrote a dropping finds more
//! than [`COMPACT_AFTER`] droppings and no open writer of the file remains in
//! this process, when an open finds that many and no writer anywhere, and at
//! every truncate with no open writer, the droppings are rewritten as one
//! base dropping and logs no extent refers to are removed, except logs a
//! live writer holds. (The release of an open that recorded nothing changes
//! nothing, and takes no lock: a compaction it would have found due waits
//! for the next open or writing release.)
//!
//! Several processes may serve one backing directory (daemons, embedded
//! shims): dropping writes, truncates and compactions take an exclusive
//! `flock` on the container's `.plfs`, merges a shared one, and every writer
//! holds a shared `flock` on its own log, which compaction tests (see
//! `store.rs`). Sequence numbers come from the clock, so their records
//! interleave by time.
//!
//! # Security
//!
//! Every backing access goes through the [`BackingRoot`] (`openat2` with
//! `RESOLVE_BENEATH`) or `*at` calls on directory fds obtained that way,
//! never following a final symlink; inside a container every entry is opened
//! `O_NOFOLLOW|O_NONBLOCK` and must be a regular file, so a symlink, FIFO or
//! directory planted in place of `.plfs`, a log or a dropping is refused.
//! Paths whose parent is a container are `ENOTDIR`: a container's insides are
//! never reachable as names of the file system. `flush` and `release` find
//! the container by the handle's directory fd, not by path, so a rename or
//! unlink while open is harmless (an unlinked file has nothing to persist).
//! A container is removed (unlink, rename over) under its lock; a lookup,
//! `getattr` or `open` that raced it finds the name no longer holding what
//! it looked up, or the container gone once it gets the lock, and looks the
//! name up again (`ESTALE` internally), so a reader of a name replaced by
//! `rename` sees the old or the new file whole, never a half-removed one.
//!
//! Renaming a file into another directory: the kernel lets a directory
//! change parents only with write permission on the directory itself, which
//! a file does not need, so when the caller's rename of a container to
//! another directory fails with `EACCES`, the rules of `rename(2)` for a
//! file (write and search permission on both directories, sticky bits) are
//! checked as the caller and the daemon renames (`names.rs`). A permission
//! changed between that check and the rename is not seen.
//!
//! # Not supported, and why
//!
//! - Hard links (`link` is `EPERM`): a container directory cannot have two
//!   names.
//! - Names starting with `.plfs-new.` or `.plfs-gone.` are reserved (hidden,
//!   and `EPERM` to create). A crash in the middle of `unlink` leaves a
//!   hidden `.plfs-gone.*` container, removed by a later `rmdir` of its
//!   directory.
//! - Paths are checked only for a container as the *immediate* parent; a
//!   directory planted inside a container directly in the backing store is
//!   reachable (still beneath the root).

mod attr;
mod container;
mod delta;
mod dircount;
mod format;
mod merge;
mod names;
mod open;
mod recover;
mod requirements;
mod store;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use mapfs::backing::BackingRoot;
use mapfs::creds::as_caller;
use mapfs::{
    Attr, Ctx, DataMap, DirEntry, Error, FileKind, FileSystem, OpenFlags, Opened, RenameFlags,
    Result, SetAttr, StatFs,
};
use parking_lot::Mutex;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::passthrough::Passthrough;
use container::Key;
use delta::{Delta, Epoch};
use format::IDENTITY;
use store::Store;

pub use format::{check_hostid, default_hostid};
pub use recover::{Finding, FsckFinding, Recovery};

/// Droppings a container may collect before a release compacts them.
pub const COMPACT_AFTER: usize = 32;

/// The 1-to-M file system. See the module docs.
#[derive(Debug)]
pub struct Plfs {
    /// Serves every node that is not a file, and the caller-checked parts.
    pt: Passthrough,
    store: Store,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    /// Link counts of directories (a scan each), kept through this
    /// daemon's changes.
    counts: dircount::DirCounts,
    /// Whether the store renames with `RENAME_NOREPLACE` (learned at the
    /// first create: [`NOREPLACE_UNKNOWN`], [`NOREPLACE_YES`] or
    /// [`NOREPLACE_NO`]); without it new containers are made in place.
    noreplace: std::sync::atomic::AtomicU8,
    /// Containers of removed files that a writer elsewhere kept an entry
    /// in (see `names.rs`, `do_unlink`): tried again at later removals,
    /// at most [`LEFTOVERS_KEPT`] (beyond that they wait for the removal
    /// of their directory, which removes leftovers).
    leftovers: Mutex<Vec<(OwnedFd, std::ffi::OsString)>>,
}

/// Most removed containers [`Plfs::leftovers`] remembers.
const LEFTOVERS_KEPT: usize = 64;

/// [`Plfs::noreplace`] not learned yet.
const NOREPLACE_UNKNOWN: u8 = 0;
/// The store has `RENAME_NOREPLACE`.
const NOREPLACE_YES: u8 = 1;
/// The store lacks `RENAME_NOREPLACE` (GlusterFS's client).
const NOREPLACE_NO: u8 = 2;

/// What the merged-index cache of one [`Plfs`] holds and has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    /// Index entries cached (merged extents plus records of cached closed
    /// droppings; ~40 bytes each), bounded by a fixed budget.
    pub cached_entries: usize,
    /// Droppings read from the backing store since this file system began.
    pub droppings_read: usize,
}

/// One open of a file.
#[derive(Debug)]
struct Handle {
    /// The container, found by fd so renames and unlinks do not matter. It
    /// also keeps the container's inode allocated while the file is open, so
    /// its number (the file's `ino`) is not reused meanwhile, as with any
    /// open file.
    dir: OwnedFd,
    key: Key,
    /// Writable opens only.
    w: Option<Writer>,
}

/// What a writable open keeps.
#[derive(Debug)]
struct Writer {
    /// Names this open's dropping and log with `index.<id>`/`data.<id>`.
    id: String,
    /// The backing files the open was given, which the map of its first
    /// write extends with its log.
    files: Vec<Arc<File>>,
    /// Its log, once it has one, and the name of each backing file.
    logs: Mutex<Logs>,
    /// The map at open (the delta's base).
    open_map: DataMap,
    /// Highest sequence number merged at open.
    floor: u64,
    /// What the last flush recorded.
    recorded: Mutex<Delta>,
    /// Events seen while writing (see `delta.rs`), by increasing length.
    epochs: Mutex<Vec<Epoch>>,
    /// The last dropping written says the open is still writing
    /// ([`format::Dropping::open`]): the release must write one that does not.
    dropping_open: std::sync::atomic::AtomicBool,
    /// `.plfs`'s mtime as this open last saw or set it: when it differs at
    /// a flush, someone set the times explicitly (`futimens` before close,
    /// as `tar` and `cp -p` do) and the flush must not overwrite them.
    mtime: Mutex<(i64, i64)>,
}

/// The backing files of a writable open, by their `Opened::files` index.
#[derive(Debug)]
struct Logs {
    /// Log name of each backing file; the open's own log comes last once
    /// it exists.
    names: Vec<String>,
    /// The open's own log: made at its first write (see `Plfs::do_remap`),
    /// so an open that never writes creates, and leaves, nothing.
    own: Option<Arc<File>>,
}

impl Logs {
    /// The `Opened::files` index of the own log (`u32::MAX`, which no
    /// extent names, before it exists).
    fn own_index(&self) -> u32 {
        match self.own {
            Some(_) => (self.names.len() - 1) as u32,
            None => u32::MAX,
        }
    }
}

/// What a path names.
enum Node {
    /// A file: its container directory (`O_PATH`).
    File(OwnedFd),
    /// A real directory.
    Dir,
    /// Anything else (symlink, FIFO, socket, device, or a stray regular file
    /// placed in the backing directory by hand).
    Other,
}

/// A path resolved beneath the root: parent directory, name, node.
struct Found {
    parent: OwnedFd,
    name: OsString,
    node: Node,
    /// What the walk saw of a file: its identity's `stat` and the
    /// container's, reused for its attributes (each is a round trip on a
    /// network store).
    seen: Option<(Option<rustix::fs::Stat>, rustix::fs::Stat)>,
}

/// True when `path` names the root of the file system.
fn is_root(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, Component::RootDir | Component::CurDir))
}

/// Runs `f` again while it answers `ESTALE` (a file removed or replaced
/// between its lookup and its use), a few times; then passes the answer on.
fn retry_stale<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    const ATTEMPTS: usize = 16;
    let mut n = 1;
    loop {
        match f() {
            Err(e) if e.errno() == libc::ESTALE && n < ATTEMPTS => n += 1,
            r => return r,
        }
    }
}

/// `path/.plfs`: the identity of the file at `path`.
fn identity(path: &Path) -> PathBuf {
    path.join(IDENTITY)
}

impl Plfs {
    /// Opens the backing directory, as host [`default_hostid`].
    pub fn new(backing: &Path) -> Result<Self> {
        Self::on_host(backing, &default_hostid())
    }

    /// Opens the backing directory as host `hostid` (it names this host's
    /// logs and droppings; see [`check_hostid`]), after checking that the
    /// backing store provides what plfs relies on (atomic rename, flock
    /// across processes, current listings: `requirements.rs`); a store that
    /// lacks it is refused with `EINVAL` and a message saying what failed.
    pub fn on_host(backing: &Path, hostid: &str) -> Result<Self> {
        check_hostid(hostid)?;
        let pt = Passthrough::new(backing)?;
        requirements::check(pt.root())?;
        Ok(Plfs {
            pt,
            store: Store::new(hostid),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            counts: dircount::DirCounts::new(),
            noreplace: std::sync::atomic::AtomicU8::new(NOREPLACE_UNKNOWN),
            leftovers: Mutex::new(Vec::new()),
        })
    }

    /// [`Plfs::on_host`] over a store already checked for this job: every
    /// process of an embedded job builds its own instance (`mapfs run
    /// --embed`, which checks the store once before starting the job), and
    /// the check costs about a hundred system calls.
    pub fn on_checked_host(backing: &Path, hostid: &str) -> Result<Self> {
        check_hostid(hostid)?;
        Ok(Plfs {
            pt: Passthrough::new(backing)?,
            store: Store::new(hostid),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            counts: dircount::DirCounts::new(),
            noreplace: std::sync::atomic::AtomicU8::new(NOREPLACE_UNKNOWN),
            leftovers: Mutex::new(Vec::new()),
        })
    }

    /// What the index cache holds and has read (for measurements: see
    /// `docs/plfs-hosts.md`).
    pub fn index_stats(&self) -> IndexStats {
        let (cached_entries, droppings_read) = self.store.stats();
        IndexStats {
            cached_entries,
            droppings_read,
        }
    }

    fn root(&self) -> &BackingRoot {
        self.pt.root()
    }

    /// The parent directory of `path` and its final name, for creating or
    /// looking up an entry. A parent that is a file (container) is
    /// `ENOTDIR`. Run as the caller: the walk checks search permission.
    fn parent_of(&self, path: &Path) -> Result<(OwnedFd, OsString)> {
        let (parent, name) = self.root().parent(path)?;
        let top = path.parent().is_none_or(is_root);
        if !top && container::is_container(parent.as_fd()) {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        Ok((parent, name))
    }

    /// Like [`Plfs::parent_of`], refusing the reserved names (`EPERM`): for
    /// operations that create `path`.
    fn parent_for_new(&self, path: &Path) -> Result<(OwnedFd, OsString)> {
        let (parent, name) = self.parent_of(path)?;
        if format::reserved_name(name.as_bytes()) {
            return Err(Error::from_errno(libc::EPERM)
                .context(format!("{} is a name reserved by plfs", path.display())));
        }
        Ok((parent, name))
    }

    /// Resolves an existing non-root `path` (as the caller).
    fn find(&self, path: &Path) -> Result<Found> {
        self.walk(path, true)
    }

    /// [`Plfs::find`]; without `recheck`, a container found with its
    /// identity is taken as the file without looking at the name again (for
    /// `getattr`: a file renamed away meanwhile answers with its attributes,
    /// as a native `stat` racing a rename may; one round trip less on a
    /// network store).
    fn walk(&self, path: &Path, recheck: bool) -> Result<Found> {
        let (parent, name) = self.parent_of(path)?;
        if format::reserved_name(name.as_bytes()) {
            return Err(Error::not_found());
        }
        // Opened as a directory straight away (files are containers, so
        // most names are): anything else fails to open as one.
        let mut seen = None;
        let node = match container::open_dir(parent.as_fd(), &name) {
            Err(e) if matches!(e.errno(), libc::ENOTDIR | libc::ELOOP) => Node::Other,
            Err(e) => return Err(e),
            Ok(dir) => {
                let id = container::identity_stat(dir.as_fd());
                let file = id.is_some() || self.made_meanwhile(parent.as_fd(), &name, dir.as_fd());
                // The name must still hold what was judged: a file replaced by
                // a rename and being removed has lost its `.plfs` and would pass
                // for a directory.
                let was = rustix::fs::fstat(&dir)?;
                if recheck || id.is_none() {
                    let now = rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW)?;
                    if (now.st_dev, now.st_ino) != (was.st_dev, was.st_ino) {
                        return Err(Error::from_errno(libc::ESTALE));
                    }
                }
                if file {
                    seen = Some((id, was));
                    Node::File(dir)
                } else {
                    Node::Dir
                }
            }
        };
        Ok(Found {
            parent,
            name,
            node,
            seen,
        })
    }

    /// What `path` names, `None` for the root (as the caller).
    fn node(&self, ctx: &Ctx, path: &Path) -> Result<Option<Node>> {
        if is_root(path) {
            return Ok(None);
        }
        retry_stale(|| as_caller(ctx, || self.find(path).map(|f| Some(f.node))))
    }

    /// The container of `path` if it is a file (walked as the caller).
    fn file_dir(&self, ctx: &Ctx, path: &Path) -> Result<Option<OwnedFd>> {
        Ok(match self.node(ctx, path)? {
            Some(Node::File(d)) => Some(d),
            _ => None,
        })
    }

    /// The logs of the opens still writing container `key`.
    fn live_logs(&self, key: Key) -> Vec<String> {
        self.handles
            .lock()
            .values()
            .filter(|h| h.key == key)
            .filter_map(|h| h.w.as_ref())
            .map(|w| format!("{}{}", format::LOG_PREFIX, w.id))
            .collect()
    }

    /// Records, for every open writing container `key`, how long its log is
    /// at the truncate numbered `seq` (so its bytes written before order
    /// before the truncate), except the open `except` that truncated. The
    /// caller holds the container's lock.
    fn mark_epoch(&self, key: Key, seq: u64, except: Option<&str>) {
        let handles = self.handles.lock();
        let writers = handles
            .values()
            .filter(|h| h.key == key)
            .filter_map(|h| h.w.as_ref())
            .filter(|w| Some(w.id.as_str()) != except);
        for w in writers {
            // Without a log yet, the open has written nothing: all it
            // writes comes after the truncate, as with an empty log.
            let len = match &w.logs.lock().own {
                Some(log) => match log.metadata() {
                    Ok(md) => md.len(),
                    Err(_) => continue,
                },
                None => 0,
            };
            let mut ep = w.epochs.lock();
            if ep.last().is_none_or(|e| e.len < len) {
                ep.push(Epoch { len, seq });
            }
        }
    }

    /// Sets the size of a file (not through an open): a dropping that says
    /// so, then a compaction when no open of this process writes the file.
    fn truncate_file(&self, dir: &OwnedFd, size: u64) -> Result<()> {
        let key = container::key_of(dir.as_fd())?;
        let _g = self.store.lock(dir.as_fd(), key)?;
        let seq = self.store.truncate_locked(dir.as_fd(), key, size)?;
        self.mark_epoch(key, seq, None);
        if self.live_logs(key).is_empty() {
            self.store.compact_locked(dir.as_fd(), key, &[])?;
        }
        Ok(())
    }
}

impl FileSystem for Plfs {
    /// `.plfs-locks` in the container, made on first use with the file's
    /// permission bits (read-write where the caller may, else read-only:
    /// read locks only, as for a descriptor opened read-only). Not `.plfs`,
    /// which plfs itself `flock`s.
    fn lock_file(&self, ctx: &Ctx, path: &Path) -> Result<Option<File>> {
        let Some(dir) = retry_stale(|| self.file_dir(ctx, path))? else {
            return Ok(None);
        };
        as_caller(ctx, || {
            let st = rustix::fs::statat(&dir, IDENTITY, AtFlags::SYMLINK_NOFOLLOW)?;
            let mode = Mode::from_raw_mode(st.st_mode & 0o666);
            let open = |access: OFlags| {
                rustix::fs::openat(
                    &dir,
                    format::LOCKS,
                    access | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    mode,
                )
            };
            let fd = match open(OFlags::RDWR) {
                Err(rustix::io::Errno::ACCESS) => open(OFlags::RDONLY)?,
                r => r?,
            };
            Ok(Some(File::from(fd)))
        })
    }

    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        retry_stale(|| {
            let found = if is_root(path) {
                None
            } else {
                Some(as_caller(ctx, || self.walk(path, false))?)
            };
            match found {
                Some(Found {
                    node: Node::File(dir),
                    seen,
                    ..
                }) => self.file_attr_seen(&dir, seen),
                _ => self.pt.getattr(ctx, path).map(|a| self.fix_dir(path, a)),
            }
        })
    }

    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        match self.file_dir(ctx, path)? {
            Some(dir) => self.do_setattr(ctx, path, &dir, set),
            None => self
                .pt
                .setattr(ctx, path, set)
                .map(|a| self.fix_dir(path, a)),
        }
    }

    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        self.do_readdir(ctx, path)
    }

    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        self.node(ctx, path)?;
        self.pt.readlink(ctx, path)
    }

    fn mknod(&self, ctx: &Ctx, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        if mode & libc::S_IFMT == 0 || mode & libc::S_IFMT == libc::S_IFREG {
            let (dir, id) = self.make_file(ctx, path, mode)?;
            return self.attr_of(&dir, &id, 0, 0);
        }
        as_caller(ctx, || self.parent_for_new(path))?;
        self.pt.mknod(ctx, path, mode, rdev)
    }

    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        let (parent, _) = as_caller(ctx, || self.parent_for_new(path))?;
        self.counts
            .change(parent.as_fd(), 1, || self.pt.mkdir(ctx, path, mode))
    }

    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        self.do_unlink(ctx, path)
    }

    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        if let Some(Node::File(_)) = self.node(ctx, path)? {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        let rmdir = || match self.pt.rmdir(ctx, path) {
            // Containers whose removal a crash interrupted are hidden, so
            // they must not keep the directory from being removed.
            Err(e) if e.errno() == libc::ENOTEMPTY && self.remove_leftovers(path)? => {
                self.pt.rmdir(ctx, path)
            }
            r => r,
        };
        match as_caller(ctx, || self.parent_of(path)) {
            Ok((parent, _)) => self.counts.change(parent.as_fd(), -1, rmdir),
            Err(_) => rmdir(),
        }
    }

    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        as_caller(ctx, || self.parent_for_new(path))?;
        self.pt.symlink(ctx, target, path)
    }

    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        self.do_rename(ctx, from, to, flags)
    }

    /// Hard links are not supported (a container has one name): `EPERM`.
    fn link(&self, _ctx: &Ctx, _from: &Path, _to: &Path) -> Result<Attr> {
        Err(Error::from_errno(libc::EPERM).context("plfs does not support hard links"))
    }

    fn statfs(&self, ctx: &Ctx, path: &Path) -> Result<StatFs> {
        self.pt.statfs(ctx, path)
    }

    fn setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        let p = self.xattr_path(ctx, path)?;
        self.pt.setxattr(ctx, &p, name, value, flags)
    }

    fn getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        let p = self.xattr_path(ctx, path)?;
        self.pt.getxattr(ctx, &p, name)
    }

    fn listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        let p = self.xattr_path(ctx, path)?;
        self.pt.listxattr(ctx, &p)
    }

    fn removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        let p = self.xattr_path(ctx, path)?;
        self.pt.removexattr(ctx, &p, name)
    }

    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        let p = self.xattr_path(ctx, path)?;
        self.pt.access(ctx, &p, mask)
    }

    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        self.do_open(ctx, path, flags)
    }

    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        self.do_create(ctx, path, flags, mode)
    }

    fn release(&self, _ctx: &Ctx, _path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        self.do_release(handle, map)
    }

    /// The first write of a writable open: its log is created, and the map
    /// appends to it from now on.
    fn remap(
        &self,
        _ctx: &Ctx,
        _path: &Path,
        handle: u64,
        map: &DataMap,
        _offset: u64,
        _len: u64,
    ) -> Result<Opened> {
        self.do_remap(handle, map)
    }

    fn flush(&self, _ctx: &Ctx, _path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        let h = self.handles.lock().get(&handle).cloned();
        match h {
            Some(h) => self.persist(&h, map, false),
            None => Ok(()),
        }
    }

    fn fsyncdir(&self, ctx: &Ctx, path: &Path, datasync: bool) -> Result<()> {
        if let Some(Node::File(_)) = self.node(ctx, path)? {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        self.pt.fsyncdir(ctx, path, datasync)
    }
}

/// Directory entries looked at by one thread in [`real_subdirs`]; more
/// are shared among up to [`COUNT_THREADS`] threads.
const COUNT_PER_THREAD: usize = 16;

/// Threads [`real_subdirs`] uses at most (per count).
const COUNT_THREADS: usize = 8;

/// How many of the directories `names` in `dir` are not containers. Each
/// look is two lookups, round trips on a network store (0.7 ms each on the
/// Gluster test bed, whose caches plfs across hosts needs off), so a large
/// directory's entries are looked at from several threads at once.
fn real_subdirs(dir: BorrowedFd<'_>, names: &[std::ffi::OsString]) -> u32 {
    let real = |name: &std::ffi::OsString| {
        container::open_dir(dir, name).is_ok_and(|sub| !container::is_container(sub.as_fd()))
    };
    let threads = (names.len() / COUNT_PER_THREAD).min(COUNT_THREADS);
    if threads < 2 {
        return names.iter().filter(|n| real(n)).count() as u32;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0u32;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(name) = names.get(i) else {
                            return n;
                        };
                        n += u32::from(real(name));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .sum()
    })
}

impl Plfs {
    /// A directory's link count as if containers were files: 2 plus its
    /// real subdirectories (the backing count includes every container).
    fn fix_dir(&self, path: &Path, mut a: Attr) -> Attr {
        if a.kind == FileKind::Dir {
            if let Ok(n) = self.dir_nlink(path) {
                a.nlink = n;
            }
        }
        a
    }

    fn dir_nlink(&self, path: &Path) -> Result<u32> {
        let fd = self.root().open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        self.counts.get(fd.as_fd(), || {
            let mut dirs: Vec<std::ffi::OsString> = Vec::new();
            container::each_entry(fd.as_fd(), |name, kind, _| {
                if !format::reserved_name(name.as_bytes())
                    && matches!(kind, FileType::Directory | FileType::Unknown)
                {
                    dirs.push(name.to_os_string());
                }
            })?;
            Ok(2 + real_subdirs(fd.as_fd(), &dirs))
        })
    }

    /// Removes `.plfs-gone.*` leftovers in directory `path` (as the daemon);
    /// true when there were any.
    fn remove_leftovers(&self, path: &Path) -> Result<bool> {
        let fd = self.root().open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        let mut gone = Vec::new();
        container::each_entry(fd.as_fd(), |name, _, _| {
            if name.as_bytes().starts_with(format::GONE_PREFIX.as_bytes()) {
                gone.push(name.to_os_string());
            }
        })?;
        for n in &gone {
            container::remove_tree(fd.as_fd(), n)?;
        }
        Ok(!gone.is_empty())
    }

    /// Where the attributes of `path` live for xattrs and `access`: `.plfs`
    /// for a file, the node itself otherwise.
    fn xattr_path(&self, ctx: &Ctx, path: &Path) -> Result<PathBuf> {
        Ok(match self.node(ctx, path)? {
            Some(Node::File(_)) => identity(path),
            _ => path.to_path_buf(),
        })
    }
}
