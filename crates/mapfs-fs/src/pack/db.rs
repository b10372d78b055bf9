//! The database: schema, connection setup, and the rows the file system
//! reads and writes. Everything about a file but its bytes lives here.
//!
//! Tables:
//! - `inodes`: one row per file, directory, symlink or special file. A
//!   regular file in a slot names it (`pack`, `off`, `cap`); `own = 1`
//!   means its bytes are the backing file `files/<ino>` instead.
//! - `dentries`: `(parent, name) -> ino`; hard links are several rows.
//! - `extents`: the written ranges of a slotted file, `logical -> off` in
//!   its pack file, `len` bytes. Every extent keeps the slot's shift
//!   (`off - logical == slot off`), so the slot is the file's backing space.
//! - `slots`: every slot ever cut from a pack file, `(pack, off, cap)`, with
//!   its owner: `ino > 0` a file's current slot, `ino < 0` a slot still used
//!   by open handles of file `-ino` (after a remap, or while a new slot is
//!   being filled), `NULL` free.
//! - `packs`: pack files and where their next new slot starts.
//! - `xattrs`: extended attributes.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mapfs::{Attr, Error, FileKind, Result};
use rusqlite::{params, Connection, OptionalExtension};

/// Name of the database in the backing directory.
pub const DB_NAME: &str = "pack.db";

/// Inode number of the root directory.
pub const ROOT: i64 = 1;

/// A database error as an `EIO` naming what failed.
pub fn dberr(e: rusqlite::Error) -> Error {
    Error::io().context(format!("pack database: {e}"))
}

/// `?` on rusqlite results inside functions returning [`mapfs::Result`].
pub trait DbResult<T> {
    /// Turns the error into [`dberr`]'s.
    fn db(self) -> Result<T>;
}

impl<T> DbResult<T> for rusqlite::Result<T> {
    fn db(self) -> Result<T> {
        self.map_err(dberr)
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inodes(
    ino INTEGER PRIMARY KEY AUTOINCREMENT,
    mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
    nlink INTEGER NOT NULL, size INTEGER NOT NULL DEFAULT 0,
    atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
    rdev INTEGER NOT NULL DEFAULT 0, target BLOB,
    own INTEGER NOT NULL DEFAULT 0,
    pack INTEGER, off INTEGER, cap INTEGER);
CREATE TABLE IF NOT EXISTS dentries(
    parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,
    PRIMARY KEY(parent, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS extents(
    ino INTEGER NOT NULL, logical INTEGER NOT NULL, off INTEGER NOT NULL,
    len INTEGER NOT NULL, PRIMARY KEY(ino, logical)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slots(
    pack INTEGER NOT NULL, off INTEGER NOT NULL, cap INTEGER NOT NULL,
    ino INTEGER, PRIMARY KEY(pack, off)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS slots_free ON slots(cap, pack, off) WHERE ino IS NULL;
-- Stores made before 2026-11-26 had two more indexes, each a page or two
-- written to the WAL by every create or flush of a file: entries by inode
-- (a rename's test that a directory does not move below itself now
-- compares paths) and slots by owner (only an instance's start looked slots
-- up by owner).
DROP INDEX IF EXISTS dentries_ino;
DROP INDEX IF EXISTS slots_owner;
CREATE TABLE IF NOT EXISTS packs(id INTEGER PRIMARY KEY, end INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS xattrs(
    ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY(ino, name)) WITHOUT ROWID;
";

/// Opens (creating if needed) the database of backing directory `dir`, in
/// WAL mode. `full_sync`: every commit is synced (power-loss durable);
/// otherwise commits survive a crash of the process, not of the machine.
/// `exclusive`: this connection keeps the database's lock until it is
/// closed (SQLite's exclusive locking mode, asked before WAL mode so that
/// the WAL index lives in this process's memory): no other connection can
/// use the database meanwhile, and no statement or transaction takes and
/// lets go of the shared-memory locks, a few system calls each.
pub fn open(dir: &Path, full_sync: bool, exclusive: bool) -> Result<Connection> {
    let path = dir.join(DB_NAME);
    if let Ok(md) = std::fs::symlink_metadata(&path) {
        if !md.file_type().is_file() {
            return Err(
                Error::invalid().context(format!("{} is not a regular file", path.display()))
            );
        }
    }
    let conn = Connection::open(&path).db()?;
    // The database is the daemon's private data, like the pack files (its
    // WAL and shared-memory files take its mode).
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    conn.busy_timeout(Duration::from_secs(30)).db()?;
    if exclusive {
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE").db()?;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .db()?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::io().context(format!("pack database refused WAL mode ({mode})")));
    }
    let sync = if full_sync { "FULL" } else { "NORMAL" };
    conn.pragma_update(None, "synchronous", sync).db()?;
    conn.execute_batch(SCHEMA).db()?;
    // Every statement of the file system stays prepared (the default keeps
    // 16, fewer than it uses).
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

/// Write transactions ended (committed or rolled back) in this process.
static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many write transactions ended in this process: while it stays the
/// same, nothing changed the database of a connection whose lock the
/// caller holds (see `readcache.rs`).
pub fn writes() -> u64 {
    WRITES.load(std::sync::atomic::Ordering::SeqCst)
}

/// Runs one of the transaction statements, prepared once per connection:
/// a transaction per request made their parsing a visible cost.
fn statement(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// A write transaction, rolled back when dropped uncommitted.
pub struct WriteTx<'c> {
    conn: &'c Connection,
    done: bool,
}

impl std::ops::Deref for WriteTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl WriteTx<'_> {
    /// Commits the transaction.
    pub fn commit(mut self) -> rusqlite::Result<()> {
        statement(self.conn, "COMMIT")?;
        self.done = true;
        WRITES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Whatever the transaction read or wrote is no longer current.
        WRITES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // A failed COMMIT may have ended the transaction already.
        if !self.conn.is_autocommit() {
            if let Err(e) = statement(self.conn, "ROLLBACK") {
                tracing::warn!("pack database: rollback failed: {e}");
            }
        }
    }
}

/// A locked connection for reads. Shared between processes (an embedded
/// job), it is inside one read transaction until dropped: SQLite takes and
/// lets go of a WAL read lock (two `fcntl`s) per transaction, which was one
/// per query, several per request.
pub struct ReadDb<'c> {
    conn: parking_lot::MutexGuard<'c, Connection>,
    in_tx: bool,
}

impl std::ops::Deref for ReadDb<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl<'c> ReadDb<'c> {
    /// `conn` for reads, in a read transaction if `in_tx` (for a connection
    /// other processes share; one alone has its locks for its life).
    pub fn new(conn: parking_lot::MutexGuard<'c, Connection>, in_tx: bool) -> Result<Self> {
        if in_tx {
            statement(&conn, "BEGIN").db()?;
        }
        Ok(ReadDb { conn, in_tx })
    }
}

impl Drop for ReadDb<'_> {
    fn drop(&mut self) {
        if !self.in_tx || self.conn.is_autocommit() {
            return;
        }
        if let Err(e) = statement(&self.conn, "COMMIT") {
            tracing::warn!("pack database: ending a read transaction: {e}");
        }
    }
}

/// A write transaction that takes the write lock at once, so two processes
/// never deadlock upgrading read locks. The `&mut` keeps a second
/// transaction from starting on the connection inside this one.
pub fn write_tx(conn: &mut Connection) -> Result<WriteTx<'_>> {
    statement(conn, "BEGIN IMMEDIATE").db()?;
    Ok(WriteTx { conn, done: false })
}

/// Runs `f` in a write transaction on `conn`, holding its lock
/// throughout; committed when `f` returns `Ok`, rolled back otherwise.
pub fn write<T>(
    conn: &parking_lot::Mutex<Connection>,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    let mut c = conn.lock();
    let tx = write_tx(&mut c)?;
    let v = f(&tx)?;
    tx.commit().db()?;
    Ok(v)
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    to_ns(SystemTime::now())
}

/// A `stat` time (`st_*time`, `st_*time_nsec`) as nanoseconds since the
/// epoch.
pub fn stat_ns(secs: i64, nsecs: i64) -> i64 {
    secs * 1_000_000_000 + nsecs
}

/// A time as nanoseconds since the epoch (negative before it).
pub fn to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

/// Nanoseconds since the epoch as a time.
pub fn from_ns(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// A slot: `cap` bytes at `off` of pack file `pack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Pack file id.
    pub pack: i64,
    /// Offset in the pack file.
    pub off: u64,
    /// Capacity in bytes.
    pub cap: u64,
}

/// An inode row for unit tests: `ino` with `mode` (type and permission
/// bits), root's, no slot.
#[cfg(test)]
pub fn test_inode(ino: i64, mode: u32) -> Inode {
    Inode {
        ino,
        mode,
        uid: 0,
        gid: 0,
        nlink: 1,
        size: 0,
        atime: 0,
        mtime: 0,
        ctime: 0,
        rdev: 0,
        own: false,
        slot: None,
    }
}

/// One inode row.
#[derive(Debug, Clone)]
pub struct Inode {
    pub ino: i64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub rdev: u64,
    pub own: bool,
    pub slot: Option<Slot>,
}

impl Inode {
    /// The file type.
    pub fn kind(&self) -> FileKind {
        FileKind::from_mode(self.mode)
    }

    /// True for directories.
    pub fn is_dir(&self) -> bool {
        self.kind() == FileKind::Dir
    }

    /// Attributes as stored (a file of its own gets size and blocks from
    /// its backing file: see the caller).
    pub fn attr(&self) -> Attr {
        let blocks = match self.slot {
            Some(s) => s.cap.div_ceil(512),
            None => 0,
        };
        Attr {
            ino: self.ino as u64,
            size: self.size,
            blocks,
            atime: from_ns(self.atime),
            mtime: from_ns(self.mtime),
            ctime: from_ns(self.ctime),
            kind: self.kind(),
            perm: (self.mode & 0o7777) as u16,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: 4096,
        }
    }
}

const INODE_COLS: &str =
    "ino, mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, own, pack, off, cap";

fn inode_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Inode> {
    let pack: Option<i64> = r.get(11)?;
    let slot = match pack {
        Some(pack) => Some(Slot {
            pack,
            off: r.get::<_, i64>(12)? as u64,
            cap: r.get::<_, i64>(13)? as u64,
        }),
        None => None,
    };
    Ok(Inode {
        ino: r.get(0)?,
        mode: r.get(1)?,
        uid: r.get(2)?,
        gid: r.get(3)?,
        nlink: r.get(4)?,
        size: r.get::<_, i64>(5)? as u64,
        atime: r.get(6)?,
        mtime: r.get(7)?,
        ctime: r.get(8)?,
        rdev: r.get::<_, i64>(9)? as u64,
        own: r.get::<_, i64>(10)? != 0,
        slot,
    })
}

/// The inode `ino`, if it exists.
pub fn inode(conn: &Connection, ino: i64) -> Result<Option<Inode>> {
    // Built once: every path walk and open asks, and the statement cache
    // looks statements up by their text.
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("SELECT {INODE_COLS} FROM inodes WHERE ino = ?1"));
    conn.prepare_cached(&SQL)
        .db()?
        .query_row([ino], inode_row)
        .optional()
        .db()
}

/// The inode `ino`, or `ENOENT`.
pub fn get_inode(conn: &Connection, ino: i64) -> Result<Inode> {
    inode(conn, ino)?.ok_or_else(Error::not_found)
}

/// The inode named `name` in directory `parent`.
pub fn lookup(conn: &Connection, parent: i64, name: &[u8]) -> Result<Option<Inode>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let cols = INODE_COLS
            .split(", ")
            .map(|c| format!("i.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "SELECT {cols} FROM dentries d JOIN inodes i ON i.ino = d.ino \
             WHERE d.parent = ?1 AND d.name = ?2"
        )
    });
    conn.prepare_cached(&SQL)
        .db()?
        .query_row(params![parent, name], inode_row)
        .optional()
        .db()
}

/// Inserts a new inode; returns its number.
#[allow(clippy::too_many_arguments)]
pub fn insert_inode(
    conn: &Connection,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    rdev: u64,
    target: Option<&[u8]>,
) -> Result<i64> {
    let now = now_ns();
    conn.prepare_cached(
        "INSERT INTO inodes(mode, uid, gid, nlink, size, atime, mtime, ctime, rdev, target) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?6, ?7, ?8)",
    )
    .db()?
    .execute(params![
        mode,
        uid,
        gid,
        nlink,
        size as i64,
        now,
        rdev as i64,
        target
    ])
    .db()?;
    Ok(conn.last_insert_rowid())
}

/// Adds the entry `name` -> `ino` to directory `parent`.
pub fn insert_dentry(conn: &Connection, parent: i64, name: &[u8], ino: i64) -> Result<()> {
    conn.prepare_cached("INSERT INTO dentries(parent, name, ino) VALUES (?1, ?2, ?3)")
        .db()?
        .execute(params![parent, name, ino])
        .db()?;
    Ok(())
}

/// Removes the entry `name` of directory `parent`.
pub fn delete_dentry(conn: &Connection, parent: i64, name: &[u8]) -> Result<()> {
    conn.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")
        .db()?
        .execute(params![parent, name])
        .db()?;
    Ok(())
}

/// Adds `delta` to the link count of `ino`, and sets its ctime to now.
pub fn add_nlink(conn: &Connection, ino: i64, delta: i64) -> Result<()> {
    conn.prepare_cached("UPDATE inodes SET nlink = nlink + ?2, ctime = ?3 WHERE ino = ?1")
        .db()?
        .execute(params![ino, delta, now_ns()])
        .db()?;
    Ok(())
}

/// Sets a directory's mtime and ctime to now (its entries changed).
pub fn touch_dir(conn: &Connection, ino: i64) -> Result<()> {
    let now = now_ns();
    conn.prepare_cached("UPDATE inodes SET mtime = ?2, ctime = ?2 WHERE ino = ?1")
        .db()?
        .execute(params![ino, now])
        .db()?;
    Ok(())
}

/// Sets the ctime of `ino` to now.
pub fn touch_ctime(conn: &Connection, ino: i64) -> Result<()> {
    conn.prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")
        .db()?
        .execute(params![ino, now_ns()])
        .db()?;
    Ok(())
}

/// True when directory `ino` has no entries.
pub fn dir_is_empty(conn: &Connection, ino: i64) -> Result<bool> {
    let n: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")
        .db()?
        .query_row([ino], |r| r.get(0))
        .optional()
        .db()?;
    Ok(n.is_none())
}

/// The extents of a slotted file: `(logical, off, len)`, by logical offset.
pub fn extents(conn: &Connection, ino: i64) -> Result<Vec<(u64, u64, u64)>> {
    let mut st = conn
        .prepare_cached("SELECT logical, off, len FROM extents WHERE ino = ?1 ORDER BY logical")
        .db()?;
    let rows = st
        .query_map([ino], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        })
        .db()?;
    rows.collect::<rusqlite::Result<Vec<_>>>().db()
}

/// Replaces the extents of `ino`.
pub fn set_extents(conn: &Connection, ino: i64, ext: &[(u64, u64, u64)]) -> Result<()> {
    conn.prepare_cached("DELETE FROM extents WHERE ino = ?1")
        .db()?
        .execute([ino])
        .db()?;
    let mut ins = conn
        .prepare_cached("INSERT INTO extents(ino, logical, off, len) VALUES (?1, ?2, ?3, ?4)")
        .db()?;
    for &(l, o, n) in ext {
        ins.execute(params![ino, l as i64, o as i64, n as i64])
            .db()?;
    }
    Ok(())
}

/// Cuts the extents of `ino` at `size` (a shrink).
pub fn cut_extents(conn: &Connection, ino: i64, size: u64) -> Result<()> {
    let ext = extents(conn, ino)?;
    let kept: Vec<_> = ext
        .into_iter()
        .filter(|e| e.0 < size)
        .map(|(l, o, n)| (l, o, n.min(size - l)))
        .collect();
    set_extents(conn, ino, &kept)
}

/// Sets `owner` as the owner of slot `s` (`None`: free).
pub fn set_slot_owner(conn: &Connection, s: Slot, owner: Option<i64>) -> Result<()> {
    conn.prepare_cached("UPDATE slots SET ino = ?3 WHERE pack = ?1 AND off = ?2")
        .db()?
        .execute(params![s.pack, s.off as i64, owner])
        .db()?;
    Ok(())
}

/// The owner column of slot `s` (outer `None`: no such slot).
pub fn slot_owner(conn: &Connection, s: Slot) -> Result<Option<Option<i64>>> {
    conn.prepare_cached("SELECT ino FROM slots WHERE pack = ?1 AND off = ?2")
        .db()?
        .query_row(params![s.pack, s.off as i64], |r| r.get(0))
        .optional()
        .db()
}

/// Records `s` as the current slot of `ino` (`None`: no slot).
pub fn set_inode_slot(conn: &Connection, ino: i64, s: Option<Slot>) -> Result<()> {
    conn.prepare_cached("UPDATE inodes SET pack = ?2, off = ?3, cap = ?4 WHERE ino = ?1")
        .db()?
        .execute(params![
            ino,
            s.map(|s| s.pack),
            s.map(|s| s.off as i64),
            s.map(|s| s.cap as i64)
        ])
        .db()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store made when the schema had the two indexes loses them at its
    /// next open, and keeps its rows.
    #[test]
    fn an_older_store_drops_the_indexes_writes_paid_for() {
        let t = tempfile::tempdir().unwrap();
        {
            let c = open(t.path(), false, false).unwrap();
            c.execute_batch(
                "CREATE INDEX dentries_ino ON dentries(ino);
                 CREATE INDEX slots_owner ON slots(ino);
                 INSERT INTO dentries(parent, name, ino) VALUES (1, x'61', 2);",
            )
            .unwrap();
        }
        let c = open(t.path(), false, true).unwrap();
        let indexes: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            !indexes
                .iter()
                .any(|n| n == "dentries_ino" || n == "slots_owner"),
            "{indexes:?}"
        );
        assert!(indexes.iter().any(|n| n == "slots_free"), "{indexes:?}");
        let n: i64 = c
            .query_row("SELECT count(*) FROM dentries", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }
}
