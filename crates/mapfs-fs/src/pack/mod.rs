//! `pack`: the M-to-1 pattern, many small files in a few large pack files.
//!
//! # Layout of the backing directory
//!
//! - `pack.db`: a SQLite database in WAL mode (`db.rs`): the namespace
//!   (names, hard links, symlinks, special files), attributes, extended
//!   attributes, and where every file's bytes are.
//! - `packs/pack.NNNNNN`: pack files, cut into *slots* (`slots.rs`). A
//!   regular file of up to `threshold` bytes (an option, default 64 KiB)
//!   lives in one slot whose capacity is a power of two from 512 bytes up;
//!   its written ranges are recorded as extents inside the slot.
//! - `files/<ino>`: files larger than the threshold, one backing file each.
//!   Their map is the whole-file 1-to-1 map, so kernel passthrough and the
//!   preload shim run their reads and writes without the daemon.
//!
//! # Maps and remap
//!
//! A slotted file's map is [`Growth::InPlace`](mapfs::Growth::InPlace)
//! with the slot's capacity as limit: writes inside the slot land in place.
//! A write past the slot, or into a hole below the last extent, asks for a
//! `remap`: the bytes move to a new slot of the class of the new size (holes
//! written as zeros), or, past the threshold, to a file of their own. A new
//! file has no slot until its first write, so an empty file costs no space
//! and a 1 KiB file a 1 KiB slot.
//!
//! # Consistency and crashes
//!
//! Close-to-open, like plfs: `flush` (every `close(2)`, `fsync`, size
//! change) and `release` record the open's map (extents, size, mtime) in one
//! transaction. A slot taken by a remap belongs to the open (`ino < 0` in
//! `slots`) until that open's next flush makes it the file's slot; at mount
//! such slots, and files whose last name went while open, are reclaimed. So
//! after a crash every file is as its last flush left it: its extents name
//! bytes that were written before that flush, never a slot's stale bytes.
//! Commits survive a crash of the daemon; with `-o sync=full` every commit
//! is also synced (what `fsync` needs to survive power loss; without it a
//! power loss may lose the last commits, never consistency).
//!
//! Two writable opens of one file share its slot while neither remaps;
//! after a remap each has its own copy and the last to flush decides (a
//! file moved to a file of its own ignores later flushes of older opens).
//!
//! # Space
//!
//! Freed slots are reused by the next file of their class. `mapfs pack
//! compact` (`tools.rs`), safe while mounted, moves slots of files not open
//! toward the front, cuts pack files after their last slot and punches the
//! free slots' blocks out; it takes an OFD write lock on a slot's range
//! before moving it, where every open of this daemon holds a read lock.
//!
//! # The database's only user
//!
//! The instance holds `pack.db` in SQLite's exclusive locking mode for its
//! life, and runs the `mapfs pack` tools itself when its mount's control
//! socket asks ([`FileSystem::tool`]). Being the only writer, it remembers
//! what it read until its next write transaction (`readcache.rs`).
//!
//! # Security
//!
//! The daemon creates every backing file itself (mode 0600), opens them
//! `O_NOFOLLOW`, and checks permissions against the database's modes for
//! every open and every name change (the kernel checks first too:
//! every mapfs mount has `default_permissions`).

mod born;
mod data;
mod db;
mod dircache;
mod names;
mod pending;
mod perm;
mod readcache;
mod shared;
mod slots;
mod tools;

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use mapfs::housekeeping::Bell;
use mapfs::{
    Attr, Capabilities, Ctx, DataMap, DirEntry, Error, FileSystem, Housekeeping, OpenFlags, Opened,
    RenameFlags, Result, SetAttr, StatFs,
};
use parking_lot::Mutex;
use rusqlite::{Connection, OptionalExtension};
use rustix::fs::{Mode, OFlags};

use db::DbResult;
pub use tools::{
    check, compact, stats, CheckReport, CompactReport, PackStats, TOOL_CHECK, TOOL_COMPACT,
    TOOL_STATS,
};

/// Default size past which a file gets a backing file of its own.
pub const DEFAULT_THRESHOLD: u64 = 64 * 1024;

/// How often a daemon whose new files are born in files of their own moves
/// those released since into slots (the release that fills a batch does
/// it at once).
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Subdirectory of the backing directory with the files of their own.
pub const OWN_DIR: &str = "files";

/// The lock file one instance holds for its life (`crate::sole`).
pub const LOCK_NAME: &str = "pack.lock";

/// Subdirectory of the backing directory with the files whose kernel locks
/// stand for a file's record locks and `flock`s in embedded mode
/// ([`FileSystem::lock_file`]): `locks/<ino>`, made at a file's first lock.
pub const LOCKS_DIR: &str = "locks";

/// Options of a pack mount.
#[derive(Debug, Clone, Copy)]
pub struct PackOptions {
    /// Files larger than this get a backing file of their own.
    pub threshold: u64,
    /// Sync every database commit (power-loss durability of `fsync`).
    pub full_sync: bool,
    /// The store is taken over from a daemon that died (failover): the
    /// slots its open handles held, and the files removed while open, are
    /// kept as they are (programs under `mapfs run` may still write in
    /// slots they were lent); the next fresh mount reclaims them.
    pub resumed: bool,
    /// One of several instances over the store (the processes of an
    /// embedded job, `shared.rs`): the database is not held locked, and
    /// what a daemon keeps in memory about opens is told by locks.
    pub shared: bool,
    /// A file created through this instance starts in a file of its own
    /// (a whole-file map, run natively by kernel passthrough or the shim)
    /// and moves into a slot at its last release if it fits
    /// (`born.rs`); not with `shared` or `full_sync`.
    pub new_files_own: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            threshold: DEFAULT_THRESHOLD,
            full_sync: false,
            resumed: false,
            shared: false,
            new_files_own: false,
        }
    }
}

impl PackOptions {
    /// Reads `threshold=BYTES` (a size as [`mapfs::size::parse`] takes it,
    /// 512 to 64 MiB) and `sync=normal|full`.
    pub fn parse(threshold: Option<&str>, sync: Option<&str>) -> Result<Self> {
        let mut o = PackOptions::default();
        if let Some(t) = threshold {
            let v = mapfs::size::parse(t)
                .map_err(|e| Error::invalid().context(format!("pack: threshold: {e}")))?;
            if !(slots::MIN_SLOT..=64 << 20).contains(&v) {
                return Err(Error::invalid().context(format!(
                    "pack: threshold {t:?} out of range (512 bytes to 64 MiB)"
                )));
            }
            o.threshold = v;
        }
        match sync {
            None | Some("normal") => {}
            Some("full") => o.full_sync = true,
            Some(s) => {
                return Err(
                    Error::invalid().context(format!("pack: sync={s:?} (expected normal or full)"))
                )
            }
        }
        Ok(o)
    }
}

/// A subdirectory of the store (mode 0700, made if `create`), opened
/// without following a symlink; `None` when it does not exist and may not
/// be made.
fn private_dir(path: &Path, create: bool) -> Result<Option<OwnedFd>> {
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
    }
    match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) if !create => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The lock one instance (a daemon, or a `mapfs pack` tool run offline)
/// holds on the store in `backing` for its life (`crate::sole`).
fn take_instance_lock(backing: &Path) -> Result<crate::sole::Sole> {
    let root = rustix::fs::open(
        backing,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    crate::sole::take(
        root.as_fd(),
        LOCK_NAME,
        "pack",
        &backing.display().to_string(),
    )
}

/// The M-to-1 file system. See the module docs.
#[derive(Debug)]
pub struct Pack {
    conn: Mutex<Connection>,
    /// Directories met by path walks (`dircache.rs`).
    dirs: dircache::DirCache,
    /// Names and extents read since the database last changed
    /// (`readcache.rs`).
    reads: readcache::ReadCache,
    packs: slots::Packs,
    own_dir: OwnedFd,
    backing: PathBuf,
    threshold: u64,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Opens per inode (an unlinked file is deleted at its last release).
    opens: Mutex<HashMap<i64, u32>>,
    /// Files whose last name went while open (deleted at the last release).
    orphans: Mutex<HashSet<i64>>,
    /// Files this daemon created in a file of their own, to move into a
    /// slot at their last release (`born.rs`).
    born: Mutex<HashSet<i64>>,
    /// Born files released by their last open, to move into slots a batch
    /// at a time (`born.rs`).
    to_pack: Mutex<Vec<i64>>,
    /// Born files being moved into a slot (taken with `opens` held): their
    /// opens wait on `packed`.
    packing: Mutex<HashSet<i64>>,
    /// Signalled, with `opens` held, when a move into a slot ends.
    packed: parking_lot::Condvar,
    /// Slots this daemon marked as used by opens only (`ino < 0`): freed
    /// when the last open using them ends.
    zombies: Mutex<HashSet<db::Slot>>,
    /// Slots reserved in the database for new slots, by capacity.
    reserve: Mutex<HashMap<u64, Vec<db::Slot>>>,
    /// Whether any `security.` xattr exists: the kernel asks for
    /// `security.capability` before every write, and the answer is
    /// almost always "none".
    security_xattrs: std::sync::atomic::AtomicBool,
    next_handle: AtomicU64,
    /// Held for the instance's life: alone (a daemon), or shared with the
    /// other processes of an embedded job.
    _sole: crate::sole::Sole,
    /// One of several instances ([`PackOptions::shared`]).
    shared: bool,
    /// Files this process has open, for the other instances (`shared.rs`).
    open_locks: shared::OpenLocks,
    /// What transactions of a shared instance left to free after their
    /// commit.
    reaps: Mutex<Vec<shared::Reap>>,
    /// The process a shared instance's memory is about: a forked child
    /// starts afresh (its parent's opens, reserved slots and locks are not
    /// its).
    pid: std::sync::atomic::AtomicI32,
    /// SQLite's count of other connections' commits, as last seen: the
    /// directories remembered are dropped when it moves.
    data_version: std::sync::atomic::AtomicI64,
    full_sync: bool,
    /// [`PackOptions::new_files_own`], where it applies.
    new_files_own: bool,
    /// Creates of born files are answered before their commit
    /// (`pending.rs`): where they are born, until the backing store
    /// refuses a user extended attribute.
    defer_creates: std::sync::atomic::AtomicBool,
    /// Those creates, until the next write transaction commits them.
    pending: Mutex<pending::Pending>,
    /// [`LOCKS_DIR`], once it exists.
    locks_dir: std::sync::OnceLock<OwnedFd>,
    /// The daemon's housekeeping bell, rung as work is queued for it (born
    /// files released, creates answered): without one, a full batch of
    /// born files moves in the release that fills it.
    bell: std::sync::Arc<std::sync::OnceLock<Bell>>,
}

/// One open.
#[derive(Debug, Clone)]
struct Handle {
    ino: i64,
    /// The slot the open's map uses (acquired in `Packs`).
    slot: Option<db::Slot>,
    /// The file's mtime as this open last saw or set it.
    mtime_seen: i64,
    /// The map this open last recorded (or found at open): a flush or
    /// release of the same map has nothing to record.
    recorded: Option<DataMap>,
    /// The [`Pack::version`] at which this open last saw the file named and
    /// owning the open's slot (at the open's read, or just after a
    /// transaction of its own): a shared instance's release that finds the
    /// database at that version has nothing to free.
    settled: Option<u64>,
}

impl Pack {
    /// Opens (creating if empty) the pack store in `backing`, and recovers
    /// what a crash left: slots only open handles held, and files whose
    /// last name was removed while open (not when `opts.resumed`: see
    /// [`PackOptions::resumed`]).
    pub fn new(backing: &Path, opts: PackOptions) -> Result<Self> {
        // A directory of ordinary files is not a store: refuse it rather
        // than hide its files behind an empty file system.
        if !backing.join(db::DB_NAME).exists() {
            if let Some(e) = std::fs::read_dir(backing)?.next() {
                return Err(Error::invalid().context(format!(
                    "{} holds {:?} but no pack store ({}): use an empty directory",
                    backing.display(),
                    e?.file_name(),
                    db::DB_NAME
                )));
            }
        }
        // Before anything is reclaimed: another instance's reserved slots
        // look unowned to this one. A shared instance that finds no other
        // starts as a fresh mount does, then lets others share.
        let (sole, reclaim) = if opts.shared {
            let root = rustix::fs::open(
                backing,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            crate::sole::take_first_or_shared(
                root.as_fd(),
                LOCK_NAME,
                "pack",
                &backing.display().to_string(),
            )?
        } else {
            (take_instance_lock(backing)?, !opts.resumed)
        };
        let mut conn = db::open(backing, opts.full_sync, !opts.shared)?;
        let own_dir = private_dir(&backing.join(OWN_DIR), true)?.expect("made");
        let root_md = std::fs::metadata(backing)?;
        let tx = db::write_tx(&mut conn)?;
        if db::inode(&tx, db::ROOT)?.is_none() {
            let now = db::now_ns();
            tx.execute(
                "INSERT INTO inodes(ino, mode, uid, gid, nlink, atime, mtime, ctime) \
                 VALUES (?1, ?2, ?3, ?4, 2, ?5, ?5, ?5)",
                rusqlite::params![
                    db::ROOT,
                    libc::S_IFDIR | (root_md.mode() & 0o7777),
                    root_md.uid(),
                    root_md.gid(),
                    now
                ],
            )
            .db()?;
        }
        if reclaim {
            tx.execute("UPDATE slots SET ino = NULL WHERE ino < 0", [])
                .db()?;
        }
        tx.commit().db()?;
        let fs = Pack {
            conn: Mutex::new(conn),
            dirs: dircache::DirCache::default(),
            reads: readcache::ReadCache::default(),
            packs: slots::Packs::new(backing)?,
            own_dir,
            backing: backing.to_path_buf(),
            threshold: opts.threshold,
            handles: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            orphans: Mutex::new(HashSet::new()),
            born: Mutex::new(HashSet::new()),
            to_pack: Mutex::new(Vec::new()),
            packing: Mutex::new(HashSet::new()),
            packed: parking_lot::Condvar::new(),
            zombies: Mutex::new(HashSet::new()),
            reserve: Mutex::new(HashMap::new()),
            security_xattrs: std::sync::atomic::AtomicBool::new(true),
            next_handle: AtomicU64::new(1),
            _sole: sole,
            shared: opts.shared,
            open_locks: shared::OpenLocks::new(backing),
            reaps: Mutex::new(Vec::new()),
            pid: std::sync::atomic::AtomicI32::new(
                rustix::process::getpid().as_raw_nonzero().get(),
            ),
            data_version: std::sync::atomic::AtomicI64::new(0),
            full_sync: opts.full_sync,
            new_files_own: opts.new_files_own && !opts.shared && !opts.full_sync,
            defer_creates: std::sync::atomic::AtomicBool::new(
                opts.new_files_own && !opts.shared && !opts.full_sync,
            ),
            pending: Mutex::new(pending::Pending::default()),
            locks_dir: std::sync::OnceLock::new(),
            bell: std::sync::Arc::default(),
        };
        // Before anything else reads the namespace, and on a successor
        // too: the creates a dead daemon answered are files its programs
        // hold.
        let kept = if opts.shared {
            HashSet::new()
        } else {
            fs.recover_pending()?
        };
        // A successor leaves the files removed while open to the next
        // fresh mount: a program may still write in their slots.
        let orphans: Vec<i64> = if !reclaim {
            Vec::new()
        } else {
            let conn = fs.conn.lock();
            let mut st = conn
                .prepare("SELECT ino FROM inodes WHERE nlink = 0 AND ino != 1")
                .db()?;
            let v = st
                .query_map([], |r| r.get(0))
                .db()?
                .collect::<rusqlite::Result<Vec<i64>>>()
                .db()?;
            v
        };
        let any: Option<i64> = fs
            .conn
            .lock()
            .query_row(
                "SELECT 1 FROM xattrs WHERE name >= CAST('security.' AS BLOB) \
                 AND name < CAST('security/' AS BLOB) LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .db()?;
        // Another instance may set one at any time.
        fs.security_xattrs.store(
            any.is_some() || opts.shared,
            std::sync::atomic::Ordering::Relaxed,
        );
        for ino in orphans {
            let gone = fs.write(|tx| fs.destroy(tx, ino))?;
            fs.remove_own(gone);
        }
        if reclaim {
            fs.remove_strays(&kept)?;
        }
        // Others may share the store from now on.
        let fs = if opts.shared && reclaim {
            let sole = fs._sole;
            Pack {
                _sole: sole.share("pack", &backing.display().to_string())?,
                ..fs
            }
        } else {
            fs
        };
        Ok(fs)
    }

    /// The connection, after committing the creates answered before their
    /// commit (`pending.rs`): what is read through it is the whole truth.
    fn db(&self) -> Result<db::ReadDb<'_>> {
        self.settle()?;
        self.read_db()
    }

    /// [`Pack::lock_db`] for reads: a shared instance's in one read
    /// transaction, in which it reads SQLite's count of other connections'
    /// commits.
    fn read_db(&self) -> Result<db::ReadDb<'_>> {
        if !self.shared {
            return db::ReadDb::new(self.lock_db()?, false);
        }
        let conn = db::ReadDb::new(self.own_conn()?, true)?;
        self.see_others(&conn)?;
        Ok(conn)
    }

    /// The connection, which may not know of the creates in
    /// [`Pack::pending`]. A shared instance's is this process's own: in a
    /// child forked from the process that built the instance, a new one,
    /// and none of the parent's opens, reserved slots or locks; and it
    /// forgets the directories it remembered when another instance changed
    /// the database since it last looked.
    fn lock_db(&self) -> Result<parking_lot::MutexGuard<'_, Connection>> {
        let conn = self.own_conn()?;
        if self.shared {
            self.see_others(&conn)?;
        }
        Ok(conn)
    }

    /// The connection, this process's own (see [`Pack::lock_db`]).
    fn own_conn(&self) -> Result<parking_lot::MutexGuard<'_, Connection>> {
        use std::sync::atomic::Ordering::Release;
        let mut conn = self.conn.lock();
        if !self.shared {
            // A daemon's instance never crosses a fork.
            return Ok(conn);
        }
        if self.forked() {
            let me = rustix::process::getpid().as_raw_nonzero().get();
            let fresh = db::open(&self.backing, self.full_sync, !self.shared)?;
            // Closing the parent's connection could act on its locks.
            std::mem::forget(std::mem::replace(&mut *conn, fresh));
            self.handles.lock().clear();
            self.opens.lock().clear();
            self.orphans.lock().clear();
            self.zombies.lock().clear();
            self.reserve.lock().clear();
            self.reaps.lock().clear();
            self.packs.reset();
            self.open_locks.reset();
            self.dirs.clear();
            self.pid.store(me, Release);
        }
        Ok(conn)
    }

    /// Reads SQLite's count of other connections' commits through `conn`
    /// (a shared instance's): the directories remembered are dropped when
    /// it moved.
    fn see_others(&self, conn: &Connection) -> Result<()> {
        let v: i64 = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .db()?;
        if self
            .data_version
            .swap(v, std::sync::atomic::Ordering::Release)
            != v
        {
            self.dirs.clear();
        }
        Ok(())
    }

    /// What the database's state is, as far as this process can tell:
    /// [`db::writes`], and SQLite's count of other connections' commits as
    /// [`Pack::db`] last read it (always 0 for a daemon, the database's
    /// only user). Read with the connection's lock held, after
    /// [`Pack::db`]: while it stays the same, what was read is current
    /// (see `readcache.rs`).
    fn version(&self) -> u64 {
        let others = self.data_version.load(std::sync::atomic::Ordering::Acquire) as u64;
        db::writes().wrapping_add(others << 32)
    }

    /// [`names::resolve_read`] at the database's [`Pack::version`], or a
    /// create answered before its commit (`pending.rs`).
    fn resolve_read(&self, ctx: &Ctx, path: &Path) -> Result<(db::Inode, u64)> {
        let conn = self.read_db()?;
        let pending = self.pending.lock();
        let version = self.version();
        let mut found = names::resolve_read(
            &conn,
            &self.dirs,
            &self.reads,
            version,
            ctx,
            path,
            |parent, name| pending.lookup(parent, name),
        )?;
        if found.0.is_dir() {
            // Its times in the database are older than its last create.
            if let Some(t) = pending.parent_time(found.0.ino) {
                found.0.mtime = found.0.mtime.max(t);
                found.0.ctime = found.0.ctime.max(t);
            }
        }
        Ok(found)
    }

    /// Runs `f` in a write transaction, committed when it returns `Ok`;
    /// then frees what it left for a shared instance to free.
    fn write<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let (res, left) = {
            let mut c = self.own_conn()?;
            let res = db::write_tx(&mut c).and_then(|tx| {
                if self.shared {
                    // In the transaction: no read lock of its own.
                    self.see_others(&tx)?;
                }
                // First: what follows may name them.
                let settled = self.commit_pending(&tx)?;
                let v = f(&tx)?;
                tx.commit().db()?;
                self.forget_pending(&settled);
                Ok(v)
            });
            // Pushed by this transaction only: the connection's lock is held.
            let left = std::mem::take(&mut *self.reaps.lock());
            (res, left)
        };
        if res.is_ok() {
            self.reap(left);
        }
        res
    }

    /// Frees the slots and deletes the files a committed transaction (or a
    /// release) left unused, where no process uses them now (`shared.rs`).
    fn reap(&self, left: Vec<shared::Reap>) {
        for r in left {
            if let Err(e) = self.reap_one(r) {
                tracing::debug!("pack: {r:?} left for the next fresh instance: {e}");
            }
        }
    }

    fn reap_one(&self, r: shared::Reap) -> Result<()> {
        match r {
            shared::Reap::Slot(s) => {
                // Most slots a release lets go of are still their file's.
                let owner = db::slot_owner(&*self.db()?, s)?.flatten();
                if owner.is_none_or(|o| o >= 0) || self.packs.in_use(s) {
                    return Ok(());
                }
                let Some(file) = self.packs.take_unused(s)? else {
                    return Ok(());
                };
                let res = self.write(|tx| {
                    if db::slot_owner(tx, s)?.flatten().is_some_and(|o| o < 0) {
                        db::set_slot_owner(tx, s, None)?;
                    }
                    Ok(())
                });
                let _ = slots::range_lock(&file, s, slots::LockKind::Unlock);
                res
            }
            shared::Reap::Ino(ino) => {
                let named = db::inode(&*self.db()?, ino)?.is_none_or(|i| i.nlink > 0);
                if named || ino == db::ROOT || self.opens.lock().contains_key(&ino) {
                    return Ok(());
                }
                if !self.open_locks.take_alone(ino)? {
                    return Ok(());
                }
                let res = self.write(|tx| match db::inode(tx, ino)? {
                    Some(i) if i.nlink == 0 => self.destroy(tx, ino),
                    _ => Ok(None),
                });
                self.open_locks.unhold(ino);
                self.remove_own(res?);
                Ok(())
            }
        }
    }

    /// An open of `ino` starts in this process: others see it (shared).
    fn enter(&self, ino: i64) -> Result<()> {
        let first = {
            let mut opens = self.opens.lock();
            while self.packing.lock().contains(&ino) {
                self.packed.wait(&mut opens);
            }
            let n = opens.entry(ino).or_insert(0);
            *n += 1;
            *n == 1
        };
        if self.shared && first {
            if let Err(e) = self.open_locks.hold(ino) {
                self.leave(ino);
                return Err(e);
            }
        }
        Ok(())
    }

    /// An open of `ino` ends in this process; true when it was the last.
    fn leave(&self, ino: i64) -> bool {
        let last = {
            let mut opens = self.opens.lock();
            let n = opens.entry(ino).or_insert(1);
            *n = n.saturating_sub(1);
            let last = *n == 0;
            if last {
                opens.remove(&ino);
            }
            last
        };
        if self.shared && last {
            self.open_locks.unhold(ino);
        }
        last
    }

    /// A new slot of capacity `cap` for an open (marked as used
    /// by opens only until a flush gives it to the file), from this
    /// instance's reserve, refilled a batch at a time.
    fn take_slot(&self, cap: u64) -> Result<db::Slot> {
        if self.forked() {
            // The reserve is the parent's until the connection is this
            // process's own.
            drop(self.own_conn()?);
        }
        let reserved = self.reserve.lock().get_mut(&cap).and_then(|l| l.pop());
        let s = match reserved {
            Some(s) => s,
            None => {
                let n = if self.shared {
                    slots::SHARED_RESERVE_BATCH
                } else {
                    slots::RESERVE_BATCH
                };
                let mut batch = self.write(|tx| {
                    (0..n)
                        .map(|_| slots::alloc(tx, cap, slots::RESERVED))
                        .collect::<Result<Vec<_>>>()
                })?;
                batch.reverse();
                let s = batch.pop().expect("a batch of one or more");
                if !batch.is_empty() {
                    self.reserve.lock().entry(cap).or_default().extend(batch);
                }
                s
            }
        };
        // The owner in the database stays negative: `-1` reads as "only
        // opens use it" exactly like `-ino`.
        self.zombies.lock().insert(s);
        Ok(s)
    }

    /// Frees the slots this instance reserved and did not hand out (at its
    /// end: [`FileSystem::finish`]).
    fn free_reserve(&self) -> Result<()> {
        if self.forked() {
            // Not this process's to give back.
            return Ok(());
        }
        let held: Vec<db::Slot> = self.reserve.lock().drain().flat_map(|(_, l)| l).collect();
        if held.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            for &s in &held {
                if db::slot_owner(tx, s)?.flatten() == Some(slots::RESERVED) {
                    db::set_slot_owner(tx, s, None)?;
                }
            }
            Ok(())
        })
    }

    /// A shared instance in a child forked from the process its memory is
    /// about (until [`Pack::lock_db`] makes it this process's).
    fn forked(&self) -> bool {
        self.shared
            && self.pid.load(std::sync::atomic::Ordering::Acquire)
                != rustix::process::getpid().as_raw_nonzero().get()
    }

    /// [`LOCKS_DIR`], made if `create` (else `None` while it does not exist).
    fn locks_dir(&self, create: bool) -> Result<Option<&OwnedFd>> {
        if let Some(d) = self.locks_dir.get() {
            return Ok(Some(d));
        }
        let Some(fd) = private_dir(&self.backing.join(LOCKS_DIR), create)? else {
            return Ok(None);
        };
        Ok(Some(self.locks_dir.get_or_init(|| fd)))
    }

    /// Removes the lock file of a deleted inode, if it has one (best effort:
    /// a leftover is an empty file).
    pub(super) fn remove_lock_file(&self, ino: i64) {
        if let Ok(Some(d)) = self.locks_dir(false) {
            let _ = rustix::fs::unlinkat(d, ino.to_string(), rustix::fs::AtFlags::empty());
        }
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// [`stats`] of this instance's store, through the database it holds.
    pub fn stats(&self) -> Result<PackStats> {
        tools::stats_on(&*self.db()?, &self.backing)
    }

    /// [`check`] of this instance's store, through the database it holds.
    pub fn check(&self) -> Result<CheckReport> {
        tools::check_on(&*self.db()?, &self.backing)
    }
}

impl FileSystem for Pack {
    /// One daemon per backing directory (`pack.lock`), and `mapfs pack
    /// compact` moves slots without changing a byte: only this mount
    /// writes. New files up to the threshold, born in a file of their own,
    /// move into a slot at their last release (`born.rs`), where a bell
    /// rung as born files are released and creates answered calls for
    /// housekeeping. Slotted files' maps are not whole-file: a close
    /// persists them.
    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::default().with_only_this_mount_writing(!self.shared);
        if self.new_files_own {
            caps.with_whole_file_left_at_close(self.threshold)
                .with_housekeeping(Housekeeping::rung(HOUSEKEEPING_EVERY, self.bell.clone()))
        } else {
            caps
        }
    }

    /// Moves the born files released since into slots, and commits the
    /// creates answered before their commit (`pending.rs`).
    fn housekeeping(&self) {
        self.pack_queued();
        if let Err(e) = self.settle() {
            tracing::warn!("pack: committing creates: {e}");
        }
    }

    /// The slots reserved for new files and not handed out go back to the
    /// free lists.
    fn finish(&self) {
        if let Err(e) = self.free_reserve() {
            tracing::warn!("pack: reserved slots left for the next fresh instance: {e}");
        }
    }

    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        let (i, _) = self.resolve_read(ctx, path)?;
        self.attr_of(&i)
    }

    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        self.do_setattr(ctx, path, set)
    }

    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        self.do_readdir(ctx, path)
    }

    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        let conn = self.db()?;
        let i = names::resolve(&conn, &self.dirs, ctx, path)?;
        let t: Option<Vec<u8>> = conn
            .query_row("SELECT target FROM inodes WHERE ino = ?1", [i.ino], |r| {
                r.get(0)
            })
            .db()?;
        match t {
            Some(t) if i.kind() == mapfs::FileKind::Symlink => {
                Ok(OsStr::from_bytes(&t).to_os_string())
            }
            _ => Err(Error::invalid()),
        }
    }

    fn mknod(&self, ctx: &Ctx, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        let mode = if mode & libc::S_IFMT == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        let i = self.write(|tx| names::make_node(tx, &self.dirs, ctx, path, mode, rdev, None))?;
        Ok(i.attr())
    }

    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        let mode = libc::S_IFDIR | (mode & 0o7777);
        let i = self.write(|tx| names::make_node(tx, &self.dirs, ctx, path, mode, 0, None))?;
        Ok(i.attr())
    }

    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        self.do_unlink(ctx, path, false)
    }

    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        self.do_unlink(ctx, path, true)
    }

    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        if target.len() >= 4096 {
            return Err(Error::from_errno(libc::ENAMETOOLONG));
        }
        let mode = libc::S_IFLNK | 0o777;
        let i = self.write(|tx| {
            names::make_node(tx, &self.dirs, ctx, path, mode, 0, Some(target.as_bytes()))
        })?;
        Ok(i.attr())
    }

    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        self.do_rename(ctx, from, to, flags)
    }

    fn link(&self, ctx: &Ctx, from: &Path, to: &Path) -> Result<Attr> {
        self.do_link(ctx, from, to)
    }

    /// Space is the backing file system's; the file count is the
    /// database's, with no fixed limit.
    fn statfs(&self, _ctx: &Ctx, _path: &Path) -> Result<StatFs> {
        let v = rustix::fs::fstatvfs(&self.own_dir)?;
        let files: i64 = self
            .db()?
            .query_row("SELECT count(*) FROM inodes", [], |r| r.get(0))
            .db()?;
        let ffree = 1u64 << 32;
        Ok(StatFs {
            blocks: v.f_blocks,
            bfree: v.f_bfree,
            bavail: v.f_bavail,
            files: files as u64 + ffree,
            ffree,
            bsize: v.f_bsize as u32,
            namelen: names::NAME_MAX as u32,
            frsize: v.f_frsize as u32,
        })
    }

    fn setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        self.do_setxattr(ctx, path, name, value, flags)
    }

    fn getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        self.do_getxattr(ctx, path, name)
    }

    fn listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        self.do_listxattr(ctx, path)
    }

    fn removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        self.do_removexattr(ctx, path, name)
    }

    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        let (i, _) = self.resolve_read(ctx, path)?;
        perm::check(ctx, &i, (mask & 7) as u32)
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

    fn flush(&self, _ctx: &Ctx, _path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        self.persist(handle, map)
    }

    fn remap(
        &self,
        _ctx: &Ctx,
        _path: &Path,
        handle: u64,
        map: &DataMap,
        offset: u64,
        len: u64,
    ) -> Result<Opened> {
        self.do_remap(handle, map, offset, len)
    }

    /// [`TOOL_STATS`], [`TOOL_CHECK`] and [`TOOL_COMPACT`] (no input;
    /// output encoded with [`mapfs::control::encode`]), through this
    /// instance's database, whose lock it holds.
    fn tool(&self, _ctx: &Ctx, name: &str, _input: &[u8]) -> Result<Vec<u8>> {
        // The tools report and change the store as a released file leaves
        // it, not as it waits in a queue.
        self.pack_queued();
        let out = match name {
            TOOL_STATS => mapfs::control::encode(&self.stats()?),
            TOOL_CHECK => mapfs::control::encode(&self.check()?),
            TOOL_COMPACT => {
                self.settle()?;
                mapfs::control::encode(&tools::compact_on(&self.conn, &self.backing)?)
            }
            _ => {
                return Err(Error::not_implemented().context(format!(
                    "pack has no tool {name:?} (it has {TOOL_STATS}, {TOOL_CHECK}, {TOOL_COMPACT})"
                )))
            }
        };
        out.map_err(|e| Error::io().context(format!("encoding the {name} report: {e}")))
    }

    /// `locks/<ino>`: a file's locks in embedded mode must meet those of
    /// the job's other processes, and its bytes are a range of a pack file
    /// shared with other files (or, past the threshold, a file whose
    /// number is not the file's).
    fn lock_file(&self, ctx: &Ctx, path: &Path) -> Result<Option<std::fs::File>> {
        let (i, _) = self.resolve_read(ctx, path)?;
        if i.kind() != mapfs::FileKind::File {
            return Ok(None);
        }
        let dir = self.locks_dir(true)?.expect("made");
        let fd = rustix::fs::openat(
            dir,
            i.ino.to_string(),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(Some(std::fs::File::from(mapfs::fdnum::lasting(fd))))
    }

    fn fsyncdir(&self, _ctx: &Ctx, _path: &Path, _datasync: bool) -> Result<()> {
        // Every namespace change is committed when its call returns; a
        // checkpoint-free WAL sync makes them durable.
        // Not in a read transaction, which would keep the checkpoint
        // from passing it.
        self.settle()?;
        let conn = self.lock_db()?;
        conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)").db()?;
        Ok(())
    }
}
