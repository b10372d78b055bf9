//! The store of versions, inside the backing directory at
//! `.mapfs-versions/`: `index.sqlite` (one row per version) and `objects/`
//! (one file per version, named by its id).
//!
//! A version is either *whole* (its object holds all its bytes: a reflink,
//! a copy, or the very inode of a file that was unlinked or replaced) or an
//! *undo* (its object holds only the bytes a write session changed, as they
//! were before, and the row lists where they go; the rest of the version is
//! the next newer version of the same file, or the current file). Rows of
//! one file's life share a *lineage*, so a chain of undo versions never
//! reads through another file that later took the same name.
//!
//! SQLite (WAL) lets the daemon and `mapfs versions` use the store at the
//! same time; objects are written before the rows that point to them are
//! filled in.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mapfs::backing::openat2_beneath;
use mapfs::{Error, Result};
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

use super::clone;
use super::committer::{Committer, ID_BLOCK};
use super::pending::{self, Record};
use super::retention::{self, Policy};
use super::stamp;
use super::upkeep::Upkeep;

/// Name of the store directory in the backing root (hidden from the mount).
pub const STORE_DIR: &str = ".mapfs-versions";

/// How a version holds its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The object is the whole version.
    Whole,
    /// The object holds the changed bytes; the rest is the next version.
    Undo,
}

/// Bytes of an undo version: `len` bytes at `logical` are at `at` in its
/// object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// Where in the file.
    pub logical: u64,
    /// How many bytes.
    pub len: u64,
    /// Where in the object.
    pub at: u64,
}

/// One version, as the index holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Id (also the object's name).
    pub id: i64,
    /// The file's path in the file system (`/a/b`), bytes as given.
    pub path: Vec<u8>,
    /// The life of one file this version belongs to.
    pub lineage: i64,
    /// When it was taken, microseconds since the epoch (unique per path).
    pub ts: i64,
    /// How it holds its bytes.
    pub kind: Kind,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes it added to the store (0 for a reflink, until the file
    /// diverges).
    pub stored: u64,
    /// Owner, group and permission bits of the file when it was taken.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// See `uid`.
    pub mode: u32,
    /// What made it: `write`, `truncate`, `unlink`, `replace`, `restore`.
    pub reason: String,
    /// The file's life ended here (unlinked or replaced by another file).
    pub terminal: bool,
    /// Where an undo version's bytes go.
    pub pieces: Vec<Piece>,
}

impl Version {
    /// `NAME@STAMP`, its name in `.versions/`.
    pub fn entry_name(&self) -> Vec<u8> {
        let name = Path::new(OsStr::from_bytes(&self.path))
            .file_name()
            .map_or(&b""[..], |n| n.as_bytes());
        let mut v = name.to_vec();
        v.push(b'@');
        v.extend_from_slice(stamp::format(self.ts).as_bytes());
        v
    }

    /// `PATH@STAMP`, how the CLI names it.
    pub fn full_name(&self) -> String {
        format!(
            "{}@{}",
            String::from_utf8_lossy(&self.path),
            stamp::format(self.ts)
        )
    }
}

/// Owner, mode and size of a file being versioned.
#[derive(Debug, Clone, Copy)]
pub struct FileMeta {
    /// Size in bytes.
    pub size: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

impl FileMeta {
    /// The meta of an open file.
    pub fn of(f: &impl AsFd) -> Result<FileMeta> {
        Ok(FileMeta::from_stat(&rustix::fs::fstat(f)?))
    }

    /// The meta of a file with status `st`.
    pub fn from_stat(st: &rustix::fs::Stat) -> FileMeta {
        FileMeta {
            size: st.st_size as u64,
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
        }
    }
}

/// Totals for `mapfs versions stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Number of versions.
    pub versions: u64,
    /// Paths with history.
    pub paths: u64,
    /// Whole versions.
    pub whole: u64,
    /// Undo versions.
    pub undo: u64,
    /// Sum of the versions' sizes.
    pub logical_bytes: u64,
    /// Bytes the versions added to the store.
    pub stored_bytes: u64,
    /// Blocks the objects occupy, in bytes (shared extents count in full).
    pub allocated_bytes: u64,
    /// Versions not kept because they did not fit in the byte limit (or
    /// the backing file system was full), since the store was made.
    pub skipped: u64,
}

/// What [`Store::add_whole`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// A version was kept, with this id.
    Kept(i64),
    /// No reflink, and a copy was not allowed: the caller may make an
    /// undo version instead.
    NotCopied,
    /// The copy did not fit in the store's byte limit (or the backing
    /// file system was full): no version was kept, and the skip was
    /// counted.
    Skipped,
}

impl Added {
    /// The version kept, if any.
    pub fn id(self) -> Option<i64> {
        match self {
            Added::Kept(id) => Some(id),
            Added::NotCopied | Added::Skipped => None,
        }
    }
}

/// The store of one backing directory.
#[derive(Debug)]
pub struct Store {
    root: OwnedFd,
    dir: OwnedFd,
    objects: OwnedFd,
    db: Mutex<Db>,
    /// Bytes kept by all versions, as this process last knew (summing is
    /// a scan); `None` until first needed, refreshed by every full prune.
    stored_total: Mutex<Option<i64>>,
    /// Removes dropped versions' objects and makes replacements in the
    /// background, once started ([`Store::upkeep_in_background`]).
    upkeep: std::sync::OnceLock<Upkeep>,
    /// Commits recorded versions, once started ([`Store::defer_versions`]).
    committer: std::sync::OnceLock<std::sync::Arc<Committer>>,
    /// The byte limit every copy is checked against before it is written
    /// ([`Store::set_byte_limit`]); `u64::MAX` for none.
    byte_limit: std::sync::atomic::AtomicU64,
    /// Bytes of copies being written, counted against the limit until
    /// their rows count them.
    reserved: std::sync::atomic::AtomicU64,
    /// When the last skipped version was logged (seconds since the
    /// epoch): one line per [`SKIP_LOG_SECS`] at most.
    skip_logged: std::sync::atomic::AtomicU64,
}

/// A skipped version is logged at most once in this many seconds (each
/// write of a user over the limit would otherwise write one line).
const SKIP_LOG_SECS: u64 = 10;

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(c) = self.committer.get() {
            c.stop();
            // What the thread left (it cannot take the store any more).
            if let Err(e) = self.db() {
                tracing::warn!("versions: recorded versions not committed at unmount (the next mount commits them): {e}");
            }
        }
        // After the last commit, which may drop versions: their objects
        // are removed before the store closes.
        drop(self.upkeep.take());
    }
}

fn sql(e: rusqlite::Error) -> Error {
    Error::io().context(format!("version index: {e}"))
}

const SCHEMA: &str = "
PRAGMA journal_mode=WAL;
PRAGMA synchronous=NORMAL;
CREATE TABLE IF NOT EXISTS versions(
  id INTEGER PRIMARY KEY, path BLOB NOT NULL, lineage INTEGER NOT NULL,
  ts INTEGER NOT NULL, kind INTEGER NOT NULL, size INTEGER NOT NULL,
  stored INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  mode INTEGER NOT NULL, reason TEXT NOT NULL, terminal INTEGER NOT NULL,
  pieces BLOB);
CREATE INDEX IF NOT EXISTS versions_path ON versions(path, ts);
CREATE INDEX IF NOT EXISTS versions_lineage ON versions(lineage, ts);
CREATE INDEX IF NOT EXISTS versions_ts ON versions(ts);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
";

const COLUMNS: &str =
    "id, path, lineage, ts, kind, size, stored, uid, gid, mode, reason, terminal, pieces";

fn row_version(r: &rusqlite::Row<'_>) -> rusqlite::Result<Version> {
    let pieces: Option<Vec<u8>> = r.get(12)?;
    Ok(Version {
        id: r.get(0)?,
        path: r.get(1)?,
        lineage: r.get(2)?,
        ts: r.get(3)?,
        kind: if r.get::<_, i64>(4)? == 1 {
            Kind::Undo
        } else {
            Kind::Whole
        },
        size: r.get::<_, i64>(5)? as u64,
        stored: r.get::<_, i64>(6)? as u64,
        uid: r.get(7)?,
        gid: r.get(8)?,
        mode: r.get(9)?,
        reason: r.get(10)?,
        terminal: r.get::<_, i64>(11)? != 0,
        pieces: pieces
            .and_then(|b| postcard::from_bytes(&b).ok())
            .unwrap_or_default(),
    })
}

/// [`Store::list`] through `db` (a transaction's, say).
fn list_in(db: &Connection, path: Option<&[u8]>, under: bool) -> Result<Vec<Version>> {
    let run = |query: &str, args: &[&dyn rusqlite::ToSql]| -> Result<Vec<Version>> {
        let mut st = db
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM versions {query} ORDER BY ts, id"
            ))
            .map_err(sql)?;
        let rows = st.query_map(args, row_version).map_err(sql)?;
        rows.collect::<rusqlite::Result<_>>().map_err(sql)
    };
    match path {
        None => run("", &[]),
        // By the (path, ts) index: retention lists a path's versions at
        // every version made once the count limit is reached.
        Some(p) if !under => run("WHERE path = ?1", &[&p]),
        Some(p) => {
            // The paths beneath `p` are the range [p/, p0) ('0' follows
            // '/'): an index range, not a scan of every version.
            let mut prefix = p.to_vec();
            if !prefix.ends_with(b"/") {
                prefix.push(b'/');
            }
            let mut upper = prefix.clone();
            *upper.last_mut().expect("ends with '/'") = b'/' + 1;
            run(
                "WHERE path = ?1 OR (path >= ?2 AND path < ?3)",
                &[&p, &prefix, &upper],
            )
        }
    }
}

/// The lineage and stamp of a new version of `path` taken at `ts`: the
/// lineage continues the path's last one unless that ended, and the
/// stamp follows the path's latest (stamps are unique per path).
fn lineage_and_ts(tx: &Connection, path: &[u8], ts: i64) -> rusqlite::Result<(i64, i64)> {
    let last: Option<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT lineage, terminal, ts FROM versions WHERE path = ?1 ORDER BY ts DESC LIMIT 1",
        )?
        .query_row(params![path], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let lineage = match last {
        Some((l, 0, _)) => l,
        _ => tx
            .prepare_cached("SELECT coalesce(max(lineage), 0) + 1 FROM versions")?
            .query_row([], |r| r.get(0))?,
    };
    Ok((lineage, ts.max(last.map_or(0, |l| l.2 + 1))))
}

/// Inserts the row of recorded version `r` inside `tx`; false (nothing
/// done) if it has one already or its object is gone (the caller dropped
/// it after a failure, or it was never linked).
/// What a path of the mount names now: the (device, inode) of the backing
/// file, if any ([`Store::adopt_pending`]).
pub type Named<'a> = dyn Fn(&[u8]) -> Option<(u64, u64)> + 'a;

fn has_row(tx: &Connection, id: i64) -> Result<bool> {
    tx.prepare_cached("SELECT EXISTS(SELECT 1 FROM versions WHERE id = ?1)")
        .and_then(|mut st| st.query_row(params![id], |row| row.get(0)))
        .map_err(sql)
}

fn insert_recorded(tx: &Connection, objects: BorrowedFd<'_>, r: &Record) -> Result<Option<u64>> {
    if has_row(tx, r.id)? {
        return Ok(None);
    }
    let Ok(st) = rustix::fs::statat(objects, object_name(r.id), AtFlags::SYMLINK_NOFOLLOW) else {
        return Ok(None);
    };
    // The inode's blocks, not its size: a sparse file of 1 TiB costs what
    // it holds, and counted at its size it would push every other version
    // out of the byte limit.
    let stored = r.size.min(st.st_blocks as u64 * 512);
    let (lineage, ts) = lineage_and_ts(tx, &r.path, r.ts).map_err(sql)?;
    tx.prepare_cached(
        "INSERT INTO versions(id, path, lineage, ts, kind, size, stored, uid, gid, mode, reason, terminal)
         VALUES (?1, ?2, ?3, ?4, 0, ?5, ?11, ?6, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.id,
            r.path,
            lineage,
            ts,
            r.size as i64,
            r.uid,
            r.gid,
            r.mode,
            r.reason,
            r.terminal as i64,
            stored as i64
        ])
    })
    .map_err(sql)?;
    Ok(Some(stored))
}

/// The id of every version in the index.
fn row_ids(db: &Connection) -> Result<std::collections::HashSet<i64>> {
    db.prepare("SELECT id FROM versions")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(sql)
}

/// Deletes the rows of `ids` inside `tx`; answers the bytes they kept.
fn delete_rows_in(tx: &rusqlite::Transaction<'_>, ids: &[i64]) -> Result<i64> {
    let mut freed = 0i64;
    for id in ids {
        freed += tx
            .prepare_cached("SELECT stored FROM versions WHERE id = ?1")
            .and_then(|mut st| st.query_row(params![id], |r| r.get::<_, i64>(0)).optional())
            .map_err(sql)?
            .unwrap_or(0);
        tx.prepare_cached("DELETE FROM versions WHERE id = ?1")
            .and_then(|mut st| st.execute(params![id]))
            .map_err(sql)?;
    }
    Ok(freed)
}

/// `path` relative to the root, for `*at` calls.
fn rel(path: &[u8]) -> &OsStr {
    let p = path.strip_prefix(b"/").unwrap_or(path);
    OsStr::from_bytes(if p.is_empty() { b"." } else { p })
}

/// The `meta` key of the highest version id ever given. Ids are never
/// given twice: [`Store::delete_ids`] removes a version's object after its
/// row is gone, outside the transaction, so a version given the id of one
/// being deleted lost its object to that deletion (SQLite gives a deleted
/// highest rowid again): a writer's open that took a version just as the
/// release of the file's previous writer dropped an unchanged one failed
/// with `ENOENT`, or kept a version without its bytes. Kept in the index
/// rather than by `AUTOINCREMENT`, which a table made before cannot take.
const LAST_ID: &str = "last_id";

/// Names of replacements being made (`Store::new_replacement`); object
/// names are numbers.
const REPLACEMENT_PREFIX: &str = ".replacement-";

/// Names of replacements made ahead (`upkeep.rs`), not in use yet.
pub const SPARE_PREFIX: &str = ".spare-";

fn object_name(id: i64) -> String {
    id.to_string()
}

/// The index's connection, and the process that opened it.
#[derive(Debug)]
struct Db {
    conn: Connection,
    pid: rustix::process::Pid,
    path: PathBuf,
    flags: rusqlite::OpenFlags,
}

fn connect(path: &Path, flags: rusqlite::OpenFlags) -> Result<Connection> {
    let conn = Connection::open_with_flags(path, flags).map_err(sql)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(sql)?;
    Ok(conn)
}

/// Makes the index's tables if the store is new. An existing index is only
/// read here: a process starting while another one writes versions (a
/// program's child `exec`ed under embedded mode, the parent's threads
/// writing) got "database is locked" from the schema's statements, which
/// SQLite does not always wait out, and its image ran without the file
/// system.
fn init_schema(conn: &Connection) -> Result<()> {
    let made: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get(0),
        )
        .map_err(sql)?;
    let wal = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
        .map_err(sql)?
        .eq_ignore_ascii_case("wal");
    if made && wal {
        return conn
            .execute_batch("PRAGMA synchronous=NORMAL;")
            .map_err(sql);
    }
    // A new store, made by one process (the mount, or the job's first).
    let mut tries = 0;
    loop {
        match conn.execute_batch(SCHEMA) {
            Ok(()) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && tries < 200 =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(sql(e)),
        }
    }
}

impl Store {
    /// The index, through this process's own connection: a forked child
    /// (embedded mode builds the store in a program, which may fork) must
    /// not use its parent's, whose SQLite locks are the parent's. The
    /// inherited one is left unclosed (closing it could act on the
    /// parent's locks and WAL).
    fn db(&self) -> Result<parking_lot::MappedMutexGuard<'_, Connection>> {
        let mut db = self.db.lock();
        let me = rustix::process::getpid();
        if db.pid != me {
            let fresh = connect(&db.path, db.flags)?;
            std::mem::forget(std::mem::replace(&mut db.conn, fresh));
            db.pid = me;
        }
        if let Some(c) = self.committer().filter(|c| c.waiting()) {
            // Recorded versions first: no use of the index misses them.
            self.commit_waiting(c, &mut db.conn)?;
        }
        Ok(parking_lot::MutexGuard::map(db, |d| &mut d.conn))
    }

    /// Opens (and with `create`, makes) the store of the backing directory
    /// whose root fd is `root`.
    pub fn open(root: BorrowedFd<'_>, create: bool) -> Result<Store> {
        let root = rustix::io::fcntl_dupfd_cloexec(root, 3)?;
        if create {
            match rustix::fs::mkdirat(&root, STORE_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Error::from(e).context("cannot make the version store")),
            }
        }
        let dir = openat2_beneath(
            root.as_fd(),
            OsStr::new(STORE_DIR),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::from(e).context(format!("no version store ({STORE_DIR})")))?;
        if create {
            match rustix::fs::mkdirat(&dir, "objects", Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let objects = openat2_beneath(
            dir.as_fd(),
            OsStr::new("objects"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let db_path = PathBuf::from(format!("/proc/self/fd/{}/index.sqlite", dir.as_raw_fd()));
        let mut flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= rusqlite::OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = connect(&db_path, flags)?;
        init_schema(&conn)?;
        Ok(Store {
            root,
            dir,
            objects,
            db: Mutex::new(Db {
                conn,
                pid: rustix::process::getpid(),
                path: db_path,
                flags: flags & !rusqlite::OpenFlags::SQLITE_OPEN_CREATE,
            }),
            stored_total: Mutex::new(None),
            upkeep: std::sync::OnceLock::new(),
            committer: std::sync::OnceLock::new(),
            byte_limit: std::sync::atomic::AtomicU64::new(u64::MAX),
            reserved: std::sync::atomic::AtomicU64::new(0),
            skip_logged: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// From now on, [`Store::record_linked`] records versions in the log
    /// and a thread commits their rows (see `pending.rs`), applying
    /// `policy` to them. For the instance that holds the store, after
    /// [`Store::adopt_pending`]; a process that forks must not.
    pub fn defer_versions(self: &std::sync::Arc<Self>, policy: Policy) -> Result<()> {
        if self.committer.get().is_some() {
            return Ok(());
        }
        let fd = rustix::fs::openat(
            &self.dir,
            pending::LOG,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let log = File::from(fd);
        // Adopted already: every record in it has its row.
        log.set_len(0)?;
        let c = std::sync::Arc::new(Committer::new(log, policy));
        Committer::start(&c, self)?;
        let _ = self.committer.set(c);
        Ok(())
    }

    /// True when the log of recorded versions holds records (a shared
    /// instance, which records none, finds only a dead daemon's there).
    pub fn has_pending(&self) -> Result<bool> {
        match rustix::fs::statat(&self.dir, pending::LOG, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(st.st_size > 0),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Inserts the rows of versions a dead instance recorded but did not
    /// commit (`pending.rs`), then empties the log. Only for the instance
    /// that holds the store. Answers how many it inserted.
    ///
    /// `named` answers the (device, inode) a path of the mount names now,
    /// if any. A record whose object is still the file its path names was
    /// appended by a rewrite that died before its new file took the name:
    /// that rewrite never happened (its open never returned), so the
    /// record is dropped and the object's link removed. Kept, the version
    /// would be the live file itself, and the next change of the file (the
    /// same open sent again after a failover finds a file of two links and
    /// truncates it in place) would change the version too.
    pub fn adopt_pending(&self, named: &Named<'_>) -> Result<usize> {
        let fd = match rustix::fs::openat(
            &self.dir,
            pending::LOG,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut log = File::from(fd);
        let records = pending::read_all(&mut log)?;
        let mut added = 0;
        if !records.is_empty() {
            let mut db = self.db()?;
            let tx = db
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql)?;
            for r in &records {
                if !has_row(&tx, r.id)? && self.still_named(r, named) {
                    let _ = self.remove_object(r.id);
                    continue;
                }
                added += insert_recorded(&tx, self.objects.as_fd(), r)?.is_some() as usize;
            }
            tx.commit().map_err(sql)?;
            drop(db);
            *self.stored_total.lock() = None;
        }
        log.set_len(0)?;
        Ok(added)
    }

    /// True when `r`'s object is the file its path names (see
    /// [`Store::adopt_pending`]).
    fn still_named(&self, r: &Record, named: &Named<'_>) -> bool {
        let Ok(obj) =
            rustix::fs::statat(&self.objects, object_name(r.id), AtFlags::SYMLINK_NOFOLLOW)
        else {
            return false;
        };
        #[allow(clippy::unnecessary_cast)]
        let key = (obj.st_dev as u64, obj.st_ino as u64);
        named(&r.path) == Some(key)
    }

    /// What is wrong with the store, in words (empty: nothing): the
    /// index's own check, rows without their object, objects without a
    /// row, and a log of recorded versions not committed. For tests and
    /// tools, on a store no instance is using (a live one may be between
    /// an object and its row).
    pub fn check(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        let db = self.db()?;
        let integrity: String = db
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(sql)?;
        if integrity != "ok" {
            problems.push(format!("index: {integrity}"));
        }
        let ids = row_ids(&db)?;
        drop(db);
        let objects = self.object_ids()?;
        let mut missing: Vec<_> = ids.difference(&objects).collect();
        missing.sort();
        if !missing.is_empty() {
            problems.push(format!("versions without their object: {missing:?}"));
        }
        let mut orphans: Vec<_> = objects.difference(&ids).collect();
        orphans.sort();
        if !orphans.is_empty() {
            problems.push(format!("objects without a version: {orphans:?}"));
        }
        match rustix::fs::statat(&self.dir, pending::LOG, AtFlags::empty()) {
            Ok(st) if st.st_size > 0 => problems.push(format!(
                "{} holds {} bytes of versions not committed",
                pending::LOG,
                st.st_size
            )),
            _ => {}
        }
        Ok(problems)
    }

    /// The recorded-version committer, once started.
    pub(super) fn committer(&self) -> Option<&Committer> {
        self.committer.get().map(|c| &**c)
    }

    /// An id for a recorded version: from a block reserved in the index
    /// ([`LAST_ID`]), so the index's own ids never meet it.
    fn next_id(&self, c: &Committer) -> Result<i64> {
        let mut ids = c.ids.lock();
        if ids.0 >= ids.1 {
            let mut db = self.db()?;
            let tx = db
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql)?;
            let base: i64 = tx
                .prepare_cached(
                    "SELECT max((SELECT coalesce(max(id), 0) FROM versions),
                                coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?1), 0)) + 1",
                )
                .and_then(|mut st| st.query_row(params![LAST_ID], |r| r.get(0)))
                .map_err(sql)?;
            tx.prepare_cached("INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)")
                .and_then(|mut st| st.execute(params![LAST_ID, (base + ID_BLOCK - 1).to_string()]))
                .map_err(sql)?;
            tx.commit().map_err(sql)?;
            *ids = (base, base + ID_BLOCK);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// [`Store::add_linked`], with the row recorded in the log and
    /// committed by the committer's thread when there is one (see
    /// `pending.rs`): the caller must not apply retention itself (the
    /// committer applies the count limit with the row), changes the file's
    /// name only after this returns, then calls [`Store::publish`] (or
    /// [`Store::unrecord`] if it could not).
    pub fn record_linked(
        &self,
        path: &[u8],
        dir: BorrowedFd<'_>,
        name: &OsStr,
        meta: &FileMeta,
        reason: &str,
        ends_life: bool,
    ) -> Result<i64> {
        let Some(c) = self.committer() else {
            return self.add_linked(path, dir, name, meta, reason, ends_life);
        };
        let id = self.next_id(c)?;
        self.past_orphan(id, || {
            Ok(rustix::fs::linkat(
                dir,
                name,
                &self.objects,
                object_name(id),
                AtFlags::empty(),
            )?)
        })?;
        let r = Record {
            id,
            path: path.to_vec(),
            ts: stamp::now_us(),
            size: meta.size,
            uid: meta.uid,
            gid: meta.gid,
            mode: meta.mode,
            reason: reason.to_string(),
            terminal: ends_life,
        };
        if let Err(e) = c.log(r) {
            let _ = self.remove_object(id);
            return Err(Error::from(e).context("cannot record a version"));
        }
        Ok(id)
    }

    /// The file whose version [`Store::record_linked`] recorded as `id`
    /// has left its name: the row may be committed.
    pub fn publish(&self, id: i64) {
        if let Some(c) = self.committer() {
            c.publish(id);
        }
    }

    /// The change that [`Store::record_linked`] recorded version `id` for
    /// did not happen: the version goes.
    pub fn unrecord(&self, id: i64) -> Result<()> {
        match self.committer() {
            Some(c) => {
                c.forget(id);
                self.remove_object(id)
            }
            None => self.delete_ids(&[id]),
        }
    }

    /// Commits the rows of recorded versions, if any wait: after this
    /// returns, other processes find them in the index.
    pub fn sync_pending(&self) -> Result<()> {
        if self.committer().is_some_and(Committer::waiting) {
            drop(self.db()?);
        }
        Ok(())
    }

    /// Commits the waiting records into `conn` (the index, held), each
    /// batch's paths brought back to the count limit in the same
    /// transaction.
    fn commit_waiting(&self, c: &Committer, conn: &mut Connection) -> Result<()> {
        let records = c.take();
        if records.is_empty() {
            return Ok(());
        }
        let done = (|| -> Result<(i64, i64, Vec<i64>, bool)> {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql)?;
            let mut added = 0i64;
            for r in &records {
                if let Some(stored) = insert_recorded(&tx, self.objects.as_fd(), r)? {
                    added += stored as i64;
                }
            }
            let batch: Vec<i64> = records.iter().map(|r| r.id).collect();
            let mut paths: Vec<&[u8]> = records.iter().map(|r| &r.path[..]).collect();
            paths.sort_unstable();
            paths.dedup();
            let (dropped, freed, over) = self.retain_in(&tx, &paths, &c.policy, &batch, added)?;
            tx.commit().map_err(sql)?;
            Ok((added, freed, dropped, over))
        })();
        match done {
            Ok((added, freed, dropped, over)) => {
                c.truncate_if_idle();
                self.retained(added, freed, &dropped, over)
            }
            Err(e) => {
                c.put_back(records);
                // It may count this batch already.
                *self.stored_total.lock() = None;
                Err(e)
            }
        }
    }

    /// Whether the store exceeds `policy`'s age or byte limit, with
    /// `delta` bytes not counted yet in the cached total.
    fn over_limits(&self, tx: &Connection, policy: &Policy, delta: i64) -> Result<bool> {
        if let Some(d) = policy.keep_days {
            let old: bool = tx
                .prepare_cached("SELECT EXISTS(SELECT 1 FROM versions WHERE ts < ?1)")
                .and_then(|mut st| {
                    st.query_row(params![stamp::now_us() - (d * 86_400e6) as i64], |r| {
                        r.get(0)
                    })
                })
                .map_err(sql)?;
            if old {
                return Ok(true);
            }
        }
        let Some(max) = policy.keep_bytes else {
            return Ok(false);
        };
        let mut cached = self.stored_total.lock();
        let total = match *cached {
            Some(t) => t + delta,
            // Summing is a scan: once, then kept up to date (the sum
            // counts `delta` already, which the caller adds after the
            // commit).
            None => {
                let t = tx
                    .prepare_cached("SELECT coalesce(sum(stored), 0) FROM versions")
                    .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
                    .map_err(sql)?;
                *cached = Some(t - delta);
                t
            }
        };
        Ok(total as u64 > max)
    }

    /// From now on, objects of dropped versions are removed, and the empty
    /// files that replace rewritten ones made, by a thread of this
    /// process (see `upkeep.rs`). For a daemon: a process that forks must
    /// not.
    pub fn upkeep_in_background(&self) -> Result<()> {
        if self.upkeep.get().is_none() {
            let prefix = format!("{SPARE_PREFIX}{}-", std::process::id());
            let u = Upkeep::start(self.objects.as_fd(), prefix)?;
            let _ = self.upkeep.set(u);
        }
        Ok(())
    }

    /// Removes objects that have no row: left by a process killed between
    /// dropping a version's row and removing its object. Only for the
    /// instance that holds the store (another may be making a version;
    /// and it makes its object under the index's write lock, held here).
    pub fn remove_orphans(&self) -> Result<usize> {
        let mut db = self.db()?;
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let ids = row_ids(&tx)?;
        let mut removed = 0;
        for id in self.object_ids()? {
            if !ids.contains(&id)
                && rustix::fs::unlinkat(&self.objects, object_name(id), AtFlags::empty()).is_ok()
            {
                removed += 1;
            }
        }
        tx.commit().map_err(sql)?;
        Ok(removed)
    }

    /// The ids of the objects in `objects/` (names that are numbers).
    fn object_ids(&self) -> Result<std::collections::HashSet<i64>> {
        Ok(rustix::fs::Dir::read_from(&self.objects)?
            .flatten()
            .filter_map(|e| {
                std::str::from_utf8(e.file_name().to_bytes())
                    .ok()
                    .and_then(|n| n.parse::<i64>().ok())
            })
            .collect())
    }

    /// The backing root.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The store directory (for anonymous temporary files on the same file
    /// system).
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Records the mount's retention policy, for `prune` without flags.
    /// Every process of an embedded job starts the file system, so the
    /// policy is written only when it changed, in one immediate
    /// transaction: a child started while its parent's threads wrote
    /// versions failed to start with "database is locked" (a deferred
    /// write, which SQLite may refuse at once instead of waiting).
    pub fn save_policy(&self, p: &Policy) -> Result<()> {
        let want = [
            ("keep", p.keep.map(|v| v.to_string())),
            ("keep_days", p.keep_days.map(|v| v.to_string())),
            ("keep_bytes", p.keep_bytes.map(|v| v.to_string())),
            ("policy", Some("1".into())),
        ];
        let mut db = self.db()?;
        let get = |db: &Connection, k: &str| -> Result<Option<String>> {
            db.query_row("SELECT value FROM meta WHERE key = ?1", params![k], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql)
        };
        let mut same = true;
        for (k, v) in &want {
            same &= get(&db, k)? == *v;
        }
        if same {
            return Ok(());
        }
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        for (k, v) in want {
            match v {
                Some(v) => tx.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
                    params![k, v],
                ),
                None => tx.execute("DELETE FROM meta WHERE key = ?1", params![k]),
            }
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// The policy the last mount recorded (the default if none did).
    pub fn load_policy(&self) -> Result<Policy> {
        let db = self.db()?;
        let get = |k: &str| -> Result<Option<String>> {
            db.query_row("SELECT value FROM meta WHERE key = ?1", params![k], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql)
        };
        if get("policy")?.is_none() {
            return Ok(Policy::default());
        }
        Ok(Policy {
            keep: get("keep")?.and_then(|v| v.parse().ok()),
            keep_days: get("keep_days")?.and_then(|v| v.parse().ok()),
            keep_bytes: get("keep_bytes")?.and_then(|v| v.parse().ok()),
        })
    }

    /// Adds a row for a new version of `path` inside `tx` and returns its
    /// id, one never given before (see [`LAST_ID`]). The lineage continues
    /// the path's last one unless that ended.
    fn insert(
        tx: &rusqlite::Transaction<'_>,
        path: &[u8],
        kind: Kind,
        meta: &FileMeta,
        reason: &str,
    ) -> rusqlite::Result<i64> {
        let (lineage, ts) = lineage_and_ts(tx, path, stamp::now_us())?;
        let id: i64 = tx
            .prepare_cached(
                "SELECT max((SELECT coalesce(max(id), 0) FROM versions),
                            coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?1), 0)) + 1",
            )?
            .query_row(params![LAST_ID], |r| r.get(0))?;
        tx.prepare_cached("INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)")?
            .execute(params![LAST_ID, id.to_string()])?;
        tx.prepare_cached(
            "INSERT INTO versions(id, path, lineage, ts, kind, size, stored, uid, gid, mode, reason, terminal)
             VALUES (?10, ?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, ?9, 0)",
        )?
        .execute(params![
            path,
            lineage,
            ts,
            (kind == Kind::Undo) as i64,
            meta.size as i64,
            meta.uid,
            meta.gid,
            meta.mode,
            reason,
            id
        ])?;
        Ok(id)
    }

    /// Removes the object of version `id`; one already gone is fine.
    fn remove_object(&self, id: i64) -> Result<()> {
        match rustix::fs::unlinkat(&self.objects, object_name(id), AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs `place`, which makes the object of a new version `id`. A
    /// process that died between making an object and committing its row
    /// left one by that name (its id was not recorded as given either): an
    /// orphan in the way, removed and `place` tried again. Rare, so it is
    /// removed only when found (an unlink before every version cost a
    /// system call each).
    fn past_orphan<T>(&self, id: i64, mut place: impl FnMut() -> Result<T>) -> Result<T> {
        match place() {
            Err(e) if e.errno() == libc::EEXIST => {
                let _ = self.remove_object(id);
                place()
            }
            other => other,
        }
    }

    /// Makes a version in one transaction: its row, then its object by
    /// `fill(id)`, which answers the bytes it adds to the store and whether
    /// the file's life ended, or `None` to make no version after all.
    fn make_version<T>(
        &self,
        path: &[u8],
        kind: Kind,
        meta: &FileMeta,
        reason: &str,
        mut fill: impl FnMut(i64) -> Result<Option<(u64, bool, T)>>,
    ) -> Result<Option<(i64, T)>> {
        let mut db = self.db()?;
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let id = Self::insert(&tx, path, kind, meta, reason).map_err(sql)?;
        let remove = || {
            let _ = self.remove_object(id);
        };
        // No row ever had this id (it was just given out under the write
        // lock).
        let filled = self.past_orphan(id, || fill(id));
        match filled {
            Ok(Some((stored, terminal, t))) => {
                let done = tx
                    .prepare_cached("UPDATE versions SET stored = ?2, terminal = ?3 WHERE id = ?1")
                    .and_then(|mut st| st.execute(params![id, stored as i64, terminal as i64]))
                    .and_then(|_| tx.commit());
                if let Err(e) = done {
                    remove();
                    return Err(sql(e));
                }
                drop(db);
                self.count_stored(stored as i64);
                Ok(Some((id, t)))
            }
            Ok(None) => {
                remove();
                Ok(None)
            }
            Err(e) => {
                remove();
                Err(e)
            }
        }
    }

    /// Makes the object of version `id`, owned by the versioned file's
    /// owner (`meta`): its blocks are charged to that user, so their
    /// quota counts what their changes keep. A daemon that may not give
    /// files away (not root) keeps them as its own.
    fn create_object(&self, id: i64, meta: &FileMeta) -> Result<File> {
        let fd = rustix::fs::openat(
            &self.objects,
            object_name(id),
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let _ = rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(meta.uid)),
            Some(rustix::fs::Gid::from_raw(meta.gid)),
        );
        Ok(File::from(fd))
    }

    /// Every copy into the store is checked against `limit` (bytes; `None`
    /// for none) before it is written: see [`Store::reserve`].
    pub fn set_byte_limit(&self, limit: Option<u64>) {
        self.byte_limit.store(
            limit.unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether copies are checked against a byte limit.
    pub fn is_limited(&self) -> bool {
        self.byte_limit().is_some()
    }

    fn byte_limit(&self) -> Option<u64> {
        match self.byte_limit.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => None,
            l => Some(l),
        }
    }

    /// Bytes all versions keep (cached; summed once through `db`).
    fn stored_now(&self, db: &Connection) -> Result<i64> {
        let mut cached = self.stored_total.lock();
        if let Some(t) = *cached {
            return Ok(t);
        }
        let t = db
            .prepare_cached("SELECT coalesce(sum(stored), 0) FROM versions")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
            .map_err(sql)?;
        *cached = Some(t);
        Ok(t)
    }

    /// Reserves room for `need` bytes about to be copied into the store,
    /// a hard bound: the bytes kept, those being copied and `need` stay
    /// within the byte limit. The oldest versions go to make room (never
    /// one being made); `false` when even then it does not fit (`need`
    /// alone over the limit, or the versions being made hold the rest).
    /// A reservation made is given back with [`Store::unreserve`] once
    /// the copy's row counts it (or the copy failed).
    pub fn reserve(&self, need: u64) -> Result<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(max) = self.byte_limit() else {
            return Ok(true);
        };
        if need == 0 {
            return Ok(true);
        }
        if need > max {
            return Ok(false);
        }
        for attempt in 0..2 {
            let mut db = self.db()?;
            let total = self.stored_now(&db)?.max(0) as u64;
            let reserved = self.reserved.load(Relaxed);
            if total.saturating_add(reserved).saturating_add(need) <= max {
                // Under the index's lock: reservations do not race.
                self.reserved.fetch_add(need, Relaxed);
                return Ok(true);
            }
            if attempt == 1 {
                break;
            }
            // Down to nine tenths with this copy, as retention after a
            // version goes (a store at its limit is not pruned at every
            // copy).
            let room = Policy {
                keep: None,
                keep_days: None,
                keep_bytes: Some(
                    (max / 10 * LOW_WATER_TENTHS).saturating_sub(need.saturating_add(reserved)),
                ),
            };
            let tx = db
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql)?;
            let all = list_in(&tx, None, false)?;
            let ids = self.choose_sparing(&all, &room, &[]);
            let freed = delete_rows_in(&tx, &ids)?;
            tx.commit().map_err(sql)?;
            drop(db);
            self.count_stored(-freed);
            self.delete_objects(&ids)?;
        }
        Ok(false)
    }

    /// Whether a version that is a file's own inode, `allocated` bytes of
    /// blocks (which the store then keeps from being freed), fits in the
    /// byte limit: [`Store::reserve`], the oldest going to make room, and
    /// given back at once (the row counts it when it is made).
    pub fn fits(&self, allocated: u64) -> Result<bool> {
        let fits = self.reserve(allocated)?;
        if fits {
            self.unreserve(allocated);
        }
        Ok(fits)
    }

    /// Gives back `need` bytes of [`Store::reserve`].
    pub fn unreserve(&self, need: u64) {
        if self.byte_limit().is_some() && need > 0 {
            let _ = self.reserved.fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |r| Some(r.saturating_sub(need)),
            );
        }
    }

    /// A version of `path` needing `need` bytes is not kept: counted in
    /// the store (`mapfs versions stats`), logged at most once per
    /// [`SKIP_LOG_SECS`]. The older undo versions of the path's lineage
    /// (up to a whole one) go too, and so does `undo`, an undo version
    /// given up on, if any: they are read through the newer versions, and
    /// the changes this version would have kept are now missing from the
    /// chain.
    pub fn skip(&self, path: &[u8], need: u64, undo: Option<i64>) -> Result<()> {
        let dropped = {
            let mut db = self.db()?;
            let tx = db
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql)?;
            let mut ids: Vec<i64> = undo.into_iter().collect();
            let line = list_in(&tx, Some(path), false)?;
            if let Some(last) = line.iter().rev().find(|v| Some(v.id) != undo) {
                if !last.terminal {
                    let lineage = last.lineage;
                    for v in line.iter().rev().filter(|v| Some(v.id) != undo) {
                        if v.lineage != lineage || v.kind != Kind::Undo {
                            break;
                        }
                        ids.push(v.id);
                    }
                }
            }
            let freed = delete_rows_in(&tx, &ids)?;
            let n: i64 = tx
                .query_row(
                    "SELECT coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'skipped'), 0)",
                    [],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            tx.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('skipped', ?1)",
                params![(n + 1).to_string()],
            )
            .map_err(sql)?;
            tx.commit().map_err(sql)?;
            drop(db);
            self.count_stored(-freed);
            ids
        };
        self.delete_objects(&dropped)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.skip_logged.load(std::sync::atomic::Ordering::Relaxed);
        if now >= last + SKIP_LOG_SECS
            && self
                .skip_logged
                .compare_exchange(
                    last,
                    now,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                "versions: a version of {} bytes was not kept: over the store's byte limit \
                 (`mapfs versions stats` counts them); {} older undo versions of its file dropped",
                need,
                dropped.len().saturating_sub(undo.is_some() as usize)
            );
        }
        Ok(())
    }

    /// Marks version `id` as being made, for every process using the store
    /// (the daemon's retention spares its own sessions' versions already;
    /// `mapfs versions prune` runs elsewhere): a shared `flock` on its
    /// object, held as long as the returned file is open.
    pub fn mark_in_use(&self, id: i64) -> Result<File> {
        Self::mark_object(self.open_object(id)?)
    }

    /// [`Store::mark_in_use`] through `object`, a descriptor of the
    /// version's object the caller holds (no open by name).
    pub fn mark_object(object: File) -> Result<File> {
        rustix::fs::flock(&object, rustix::fs::FlockOperation::LockShared)?;
        Ok(object)
    }

    /// Whether some process marked version `id` as being made
    /// ([`Store::mark_in_use`]).
    fn in_use(&self, id: i64) -> bool {
        let Ok(f) = self.open_object(id) else {
            return false;
        };
        matches!(
            rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK)
        )
    }

    /// Opens the object of version `id` for reading.
    pub fn open_object(&self, id: i64) -> Result<File> {
        let fd = openat2_beneath(
            self.objects.as_fd(),
            OsStr::new(&object_name(id)),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// A whole version of `path` from `src` (readable): a reflink, or a copy
    /// if `copy_allowed`, of the bytes `src` holds (its holes stay holes).
    /// A copy is made only if it fits in the byte limit
    /// ([`Store::reserve`]); one that does not, or finds the backing file
    /// system full, is skipped ([`Store::skip`]): the change it was for
    /// goes ahead without a version.
    pub fn add_whole(
        &self,
        path: &[u8],
        src: &File,
        meta: &FileMeta,
        reason: &str,
        copy_allowed: bool,
    ) -> Result<Added> {
        let need = if copy_allowed {
            clone::allocated(src, 0, meta.size)?
        } else {
            0
        };
        let fits = self.reserve(need)?;
        let made = self.make_version(path, Kind::Whole, meta, reason, |id| {
            let obj = self.create_object(id, meta)?;
            let made = clone::clone_or_copy(src, &obj, meta.size, copy_allowed && fits)?;
            let stored = || {
                obj.metadata().map_or(need, |m| {
                    (std::os::unix::fs::MetadataExt::blocks(&m) * 512).min(need)
                })
            };
            Ok(made.map(|shared| (if shared { 0 } else { stored() }, false, ())))
        });
        if fits {
            self.unreserve(need);
        }
        match made {
            Ok(Some((id, ()))) => Ok(Added::Kept(id)),
            Ok(None) if copy_allowed => {
                self.skip(path, need, None)?;
                Ok(Added::Skipped)
            }
            Ok(None) => Ok(Added::NotCopied),
            Err(e) if copy_allowed && matches!(e.errno(), libc::ENOSPC | libc::EDQUOT) => {
                self.skip(path, need, None)?;
                Ok(Added::Skipped)
            }
            Err(e) => Err(e),
        }
    }

    /// A whole version of `path` that is the file's own inode: `dir`/`name`
    /// (a backing name of it) is hard-linked into the store, costing
    /// nothing. The caller then removes or replaces the name; `ends_life`
    /// when no file takes its place (its lineage ends).
    pub fn add_linked(
        &self,
        path: &[u8],
        dir: BorrowedFd<'_>,
        name: &OsStr,
        meta: &FileMeta,
        reason: &str,
        ends_life: bool,
    ) -> Result<i64> {
        let made = self.make_version(path, Kind::Whole, meta, reason, |id| {
            rustix::fs::linkat(dir, name, &self.objects, object_name(id), AtFlags::empty())?;
            // What the inode holds, not its size (a sparse file).
            let held =
                rustix::fs::statat(&self.objects, object_name(id), AtFlags::SYMLINK_NOFOLLOW)
                    .map_or(meta.size, |st| meta.size.min(st.st_blocks as u64 * 512));
            Ok(Some((held, ends_life, ())))
        })?;
        Ok(made.expect("always made").0)
    }

    /// A new empty file in the store, the daemon's, under a temporary name
    /// (see [`Store::place_replacement`]): the file that replaces one whose
    /// inode became its version.
    pub fn new_replacement(&self) -> Result<(File, String)> {
        if let Some(spare) = self.upkeep.get().and_then(Upkeep::take_spare) {
            return Ok(spare);
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{REPLACEMENT_PREFIX}{}-{n}", std::process::id());
        let fd = rustix::fs::openat(
            &self.objects,
            &name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        Ok((File::from(fd), name))
    }

    /// Opens the replacement `tmp` again with the open flags `flags` (a
    /// writer's own open file description, as [`mapfs::control::reopen`]
    /// makes one, without a walk through `/proc`).
    pub fn open_replacement(&self, tmp: &str, flags: i32) -> Result<File> {
        let fd = mapfs::control::open_like(flags, |oflags| {
            rustix::fs::openat(&self.objects, tmp, oflags | OFlags::NOFOLLOW, Mode::empty())
        })?;
        Ok(File::from(fd))
    }

    /// Renames the replacement `tmp` over `dir`/`name` (atomically: the name
    /// always names a file).
    pub fn place_replacement(&self, tmp: &str, dir: BorrowedFd<'_>, name: &OsStr) -> Result<()> {
        Ok(rustix::fs::renameat(&self.objects, tmp, dir, name)?)
    }

    /// Removes the replacement `tmp` (best effort: a leftover is removed
    /// at the next mount).
    pub fn drop_replacement(&self, tmp: &str) {
        let _ = rustix::fs::unlinkat(&self.objects, tmp, AtFlags::empty());
    }

    /// Removes replacements (and spare ones) a daemon that died left (only
    /// the instance that holds the store's lock may: another's would be in
    /// use).
    pub fn remove_replacements(&self) -> Result<()> {
        for e in rustix::fs::Dir::read_from(&self.objects)?.flatten() {
            let name = e.file_name().to_bytes();
            if name.starts_with(REPLACEMENT_PREFIX.as_bytes())
                || name.starts_with(SPARE_PREFIX.as_bytes())
            {
                let _ = rustix::fs::unlinkat(&self.objects, e.file_name(), AtFlags::empty());
            }
        }
        Ok(())
    }

    /// An undo version of `path` (empty so far) and its object.
    pub fn add_undo(&self, path: &[u8], meta: &FileMeta) -> Result<(i64, File)> {
        let made = self.make_version(path, Kind::Undo, meta, "write", |id| {
            Ok(Some((0, false, self.create_object(id, meta)?)))
        })?;
        Ok(made.expect("always made"))
    }

    /// Records where an undo version's bytes go.
    pub fn set_pieces(&self, id: i64, pieces: &[Piece], stored: u64, added: u64) -> Result<()> {
        self.count_stored(added as i64);
        let blob = postcard::to_allocvec(pieces).map_err(|_| Error::io())?;
        self.db()?
            .prepare_cached("UPDATE versions SET pieces = ?2, stored = ?3 WHERE id = ?1")
            .and_then(|mut st| st.execute(params![id, blob, stored as i64]))
            .map_err(sql)?;
        Ok(())
    }

    /// Every version, oldest first; only those of `path` (and, with
    /// `under`, of the paths beneath it) when given.
    pub fn list(&self, path: Option<&[u8]>, under: bool) -> Result<Vec<Version>> {
        list_in(&*self.db()?, path, under)
    }

    /// The version of `path` taken at `ts`.
    pub fn find(&self, path: &[u8], ts: i64) -> Result<Option<Version>> {
        self.db()?
            .query_row(
                &format!("SELECT {COLUMNS} FROM versions WHERE path = ?1 AND ts = ?2"),
                params![path, ts],
                row_version,
            )
            .optional()
            .map_err(sql)
    }

    /// The version with id `id`.
    pub fn get(&self, id: i64) -> Result<Option<Version>> {
        self.db()?
            .query_row(
                &format!("SELECT {COLUMNS} FROM versions WHERE id = ?1"),
                params![id],
                row_version,
            )
            .optional()
            .map_err(sql)
    }

    /// Removes versions and their objects.
    pub fn delete_ids(&self, ids: &[i64]) -> Result<()> {
        self.delete_rows(ids)?;
        self.delete_objects(ids)
    }

    /// The first half of [`Store::delete_ids`]: the rows, in one
    /// transaction, before the objects (a crash between the two leaves
    /// orphan objects, never a row without its object).
    fn delete_rows(&self, ids: &[i64]) -> Result<()> {
        let mut db = self.db()?;
        let tx = db.transaction().map_err(sql)?;
        let freed = delete_rows_in(&tx, ids)?;
        tx.commit().map_err(sql)?;
        drop(db);
        self.count_stored(-freed);
        Ok(())
    }

    /// The second half of [`Store::delete_ids`]: the objects of deleted
    /// rows, by the upkeep thread when there is one. Their ids are never given
    /// again ([`LAST_ID`]), so a version made since cannot lose its object
    /// here.
    fn delete_objects(&self, ids: &[i64]) -> Result<()> {
        for id in ids {
            if self
                .upkeep
                .get()
                .is_some_and(|u| u.offer_removal(object_name(*id)))
            {
                continue;
            }
            self.remove_object(*id)?;
        }
        Ok(())
    }

    /// History follows a rename: versions of `from` (or beneath it, for a
    /// directory) become versions of `to`. With `exchange`, those of `to`
    /// move to `from` at the same time.
    pub fn rename(&self, from: &[u8], to: &[u8], exchange: bool) -> Result<()> {
        let moves = |a: &[u8], b: &[u8]| -> Result<Vec<(i64, Vec<u8>)>> {
            Ok(self
                .list(Some(a), true)?
                .into_iter()
                .map(|v| {
                    let mut p = b.to_vec();
                    p.extend_from_slice(&v.path[a.len()..]);
                    (v.id, p)
                })
                .collect())
        };
        let mut all = moves(from, to)?;
        if exchange {
            all.extend(moves(to, from)?);
        }
        if all.is_empty() {
            return Ok(());
        }
        let mut db = self.db()?;
        let tx = db.transaction().map_err(sql)?;
        for (id, p) in all {
            tx.execute(
                "UPDATE versions SET path = ?2 WHERE id = ?1",
                params![id, p],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// Retention after a version of `path` was made: the count limit on
    /// `path` alone, and the whole store only when the age or byte limit is
    /// exceeded (so making a version costs no scan of every version). The
    /// count limit is checked and applied in one transaction, and the
    /// dropped objects go to the upkeep thread if there is one: a mount at its
    /// count limit drops a version at every rewrite (it took four
    /// transactions and the object's removal before).
    pub fn prune_after(&self, path: &[u8], policy: &Policy, protect: &[i64]) -> Result<Vec<i64>> {
        let mut db = self.db()?;
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let (dropped, freed, over) = self.retain_in(&tx, &[path], policy, protect, 0)?;
        tx.commit().map_err(sql)?;
        drop(db);
        self.retained(0, freed, &dropped, over)?;
        Ok(dropped)
    }

    /// Retention inside `tx` after versions of `paths` were made: when the
    /// store exceeds the age or byte limit, the whole store, down to nine
    /// tenths of the byte limit ([`LOW_WATER_TENTHS`]: a store at its limit
    /// then scans every version once per tenth of the limit made, not at
    /// every version; measured: rewrites through the mount fell from 380 to
    /// 34-57 MB/s once a store reached its limit, on tmpfs); else the count
    /// limit on `paths` alone. Never drops one in `protect`. `delta`: bytes
    /// added in `tx` that the cached total does not count yet. Answers the
    /// ids whose rows it deleted (their objects are the caller's, after the
    /// commit: [`Store::retained`]), the bytes they kept, and whether it
    /// pruned the whole store.
    fn retain_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        paths: &[&[u8]],
        policy: &Policy,
        protect: &[i64],
        delta: i64,
    ) -> Result<(Vec<i64>, i64, bool)> {
        if self.over_limits(tx, policy, delta)? {
            let low = Policy {
                keep_bytes: policy.keep_bytes.map(|b| b / 10 * LOW_WATER_TENTHS),
                ..*policy
            };
            let all = list_in(tx, None, false)?;
            let ids = self.choose_sparing(&all, &low, protect);
            let freed = delete_rows_in(tx, &ids)?;
            return Ok((ids, freed, true));
        }
        let Some(keep) = policy.keep else {
            return Ok((Vec::new(), 0, false));
        };
        let count_only = Policy {
            keep: Some(keep),
            keep_days: None,
            keep_bytes: None,
        };
        let (mut dropped, mut freed) = (Vec::new(), 0);
        for path in paths {
            let count: i64 = tx
                .prepare_cached("SELECT count(*) FROM versions WHERE path = ?1")
                .and_then(|mut st| st.query_row(params![path], |r| r.get(0)))
                .map_err(sql)?;
            if count as u64 > keep {
                let all = list_in(tx, Some(path), false)?;
                let ids = self.choose_sparing(&all, &count_only, protect);
                freed += delete_rows_in(tx, &ids)?;
                dropped.extend(ids);
            }
        }
        Ok((dropped, freed, false))
    }

    /// After a committed [`Store::retain_in`] (and `added` bytes of new
    /// versions): the cached total, and the dropped versions' objects.
    fn retained(&self, added: i64, freed: i64, dropped: &[i64], whole: bool) -> Result<()> {
        if whole {
            // Summed again when next needed, as after `prune`.
            *self.stored_total.lock() = None;
        } else {
            self.count_stored(added - freed);
        }
        self.delete_objects(dropped)
    }

    /// Applies retention; returns the ids dropped.
    pub fn prune(&self, policy: &Policy, protect: &[i64]) -> Result<Vec<i64>> {
        let all = self.list(None, false)?;
        let dropped = self.prune_among(all, policy, protect)?;
        // Other processes (the CLI, another mount) change the store too.
        *self.stored_total.lock() = None;
        Ok(dropped)
    }

    /// Keeps the cached total of bytes kept up to date.
    fn count_stored(&self, delta: i64) {
        if let Some(t) = self.stored_total.lock().as_mut() {
            *t += delta;
        }
    }

    fn prune_among(&self, all: Vec<Version>, policy: &Policy, protect: &[i64]) -> Result<Vec<i64>> {
        let drop = self.choose_sparing(&all, policy, protect);
        if !drop.is_empty() {
            self.delete_ids(&drop)?;
        }
        Ok(drop)
    }

    /// The ids of `all` that `policy` drops, never one in `protect` nor
    /// one another process is making ([`Store::in_use`]).
    fn choose_sparing(&self, all: &[Version], policy: &Policy, protect: &[i64]) -> Vec<i64> {
        let entries: Vec<retention::Entry<'_>> = all
            .iter()
            .map(|v| retention::Entry {
                id: v.id,
                path: &v.path,
                lineage: v.lineage,
                ts: v.ts,
                undo: v.kind == Kind::Undo,
                stored: v.stored,
            })
            .collect();
        let now = stamp::now_us();
        let mut protect = protect.to_vec();
        let mut drop = retention::choose(&entries, policy, now, &protect);
        // Versions another process is making are spared too; sparing one
        // may change what the limits choose, so choose again.
        loop {
            let busy: Vec<i64> = drop.iter().copied().filter(|id| self.in_use(*id)).collect();
            if busy.is_empty() {
                return drop;
            }
            protect.extend(busy);
            drop = retention::choose(&entries, policy, now, &protect);
        }
    }

    /// Totals of the store.
    pub fn totals(&self) -> Result<Totals> {
        let all = self.list(None, false)?;
        let mut t = Totals {
            versions: all.len() as u64,
            ..Totals::default()
        };
        let mut paths: Vec<&[u8]> = all.iter().map(|v| &v.path[..]).collect();
        paths.sort();
        paths.dedup();
        t.paths = paths.len() as u64;
        t.skipped = self
            .db()?
            .query_row(
                "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'skipped'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map_err(sql)?
            .unwrap_or(0) as u64;
        for v in &all {
            match v.kind {
                Kind::Whole => t.whole += 1,
                Kind::Undo => t.undo += 1,
            }
            t.logical_bytes += v.size;
            t.stored_bytes += v.stored;
            if let Ok(st) =
                rustix::fs::statat(&self.objects, object_name(v.id), AtFlags::SYMLINK_NOFOLLOW)
            {
                t.allocated_bytes += st.st_blocks as u64 * 512;
            }
        }
        Ok(t)
    }

    /// Opens the current backing file at `path` for reading, as the daemon.
    pub fn open_current(&self, path: &[u8]) -> Result<File> {
        let fd = openat2_beneath(
            self.root.as_fd(),
            rel(path),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// The bytes of version `v`: its object when whole; otherwise an
    /// anonymous file in the store rebuilt from its base (the next whole
    /// version of its lineage, or the current file) and the undo versions
    /// between, newest first.
    pub fn contents(&self, v: &Version) -> Result<File> {
        if v.kind == Kind::Whole {
            return self.open_object(v.id);
        }
        let newer: Vec<Version> = {
            let db = self.db()?;
            let mut st = db
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM versions WHERE lineage = ?1 AND ts > ?2 ORDER BY ts"
                ))
                .map_err(sql)?;
            let rows = st
                .query_map(params![v.lineage, v.ts], row_version)
                .map_err(sql)?;
            rows.collect::<rusqlite::Result<_>>().map_err(sql)?
        };
        let mut chain = vec![v.clone()];
        let mut base = None;
        for n in newer {
            if n.kind == Kind::Whole {
                base = Some(self.open_object(n.id)?);
                break;
            }
            chain.push(n);
        }
        let base = match base {
            Some(b) => b,
            None => self.open_current(&v.path)?,
        };
        let out = File::from(rustix::fs::openat(
            &self.dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?);
        let base_len = base.metadata()?.len();
        clone::clone_or_copy(&base, &out, base_len, true)?;
        for u in chain.iter().rev() {
            out.set_len(u.size)?;
            let obj = self.open_object(u.id)?;
            for p in &u.pieces {
                // A saved hole is a hole in the object: zeros over
                // whatever the newer version had there.
                clone::copy_sparse(&obj, p.at, &out, p.logical, p.len, true)?;
            }
            out.set_len(u.size)?;
        }
        Ok(out)
    }

    /// Reads all of version `v` into memory (for tests and small files).
    pub fn read_all(&self, v: &Version) -> Result<Vec<u8>> {
        let f = self.contents(v)?;
        let mut buf = vec![0u8; v.size as usize];
        f.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }
}

/// The share of `keep-bytes`, in tenths, that a store over it is pruned
/// down to after a version is made (`mapfs versions prune` goes to the limit
/// itself).
const LOW_WATER_TENTHS: u64 = 9;

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a new directory (and that directory, open), and a source
    /// file holding "old bytes" with its metadata.
    fn store_and_source() -> (tempfile::TempDir, File, Store, File, FileMeta) {
        let dir = tempfile::tempdir().unwrap();
        let root = File::open(dir.path()).unwrap();
        let store = Store::open(root.as_fd(), true).unwrap();
        let src = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &src, b"old bytes").unwrap();
        let meta = FileMeta::of(&src).unwrap();
        (dir, root, store, src, meta)
    }

    /// A daemon killed between making a version's object and committing
    /// its row leaves an object whose id the next version is given again:
    /// the new version must be made anyway (a failover's reopen takes one).
    #[test]
    fn an_orphan_object_does_not_block_the_next_version() {
        let (dir, _root, store, src, meta) = store_and_source();
        let first = store
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        // The next id's object, as a dead daemon left it.
        let objects = dir.path().join(STORE_DIR).join("objects");
        std::fs::write(objects.join(object_name(first + 1)), b"orphan").unwrap();
        let second = store
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        assert_eq!(second, first + 1);
        let kept = std::fs::read(objects.join(object_name(second))).unwrap();
        assert_eq!(kept, b"old bytes");
    }

    /// A daemon killed with versions recorded but not committed
    /// (`pending.rs`), and with dropped versions whose objects the upkeep thread
    /// had not removed: the next instance commits the first and removes
    /// the second, and nothing else changes.
    #[test]
    fn a_dead_instance_s_recorded_versions_are_adopted_and_its_orphans_removed() {
        let (dir, root, store, src, meta) = store_and_source();
        let kept = store
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        let objects = dir.path().join(STORE_DIR).join("objects");
        // Two versions recorded, objects linked, rows not committed; a
        // third recorded whose object its daemon removed after a failure;
        // one dropped version's object left behind.
        let rec = |id: i64, path: &[u8], terminal: bool| Record {
            id,
            path: path.to_vec(),
            ts: stamp::now_us(),
            size: 9,
            uid: 1234,
            gid: 56,
            mode: 0o640,
            reason: "write".into(),
            terminal,
        };
        let (a, b, gone, orphan) = (kept + 10, kept + 11, kept + 12, kept + 13);
        std::fs::write(objects.join(object_name(a)), b"version a").unwrap();
        std::fs::write(objects.join(object_name(b)), b"version b").unwrap();
        std::fs::write(objects.join(object_name(orphan)), b"dropped").unwrap();
        // And one committed before its daemon died (its row exists).
        let log: Vec<u8> = [
            rec(kept, b"/f", false),
            rec(a, b"/f", false),
            rec(b, b"/g", true),
            rec(gone, b"/f", false),
        ]
        .iter()
        .flat_map(pending::frame)
        .collect();
        std::fs::write(dir.path().join(STORE_DIR).join(pending::LOG), log).unwrap();
        drop(store);
        let next = Store::open(root.as_fd(), false).unwrap();
        assert_eq!(
            next.adopt_pending(&|_| None).unwrap(),
            2,
            "two records had their objects"
        );
        assert_eq!(next.remove_orphans().unwrap(), 1, "one object had no row");
        assert!(
            next.check().unwrap().is_empty(),
            "{:?}",
            next.check().unwrap()
        );
        let f = next.list(Some(b"/f"), false).unwrap();
        assert_eq!(f.iter().map(|v| v.id).collect::<Vec<_>>(), [kept, a]);
        assert_eq!(f[1].lineage, f[0].lineage, "the file's life goes on");
        assert!(f[1].ts > f[0].ts);
        let g = &next.list(Some(b"/g"), false).unwrap()[0];
        assert_eq!(
            (g.id, g.uid, g.gid, g.mode, g.size, g.stored, g.terminal, g.kind),
            (b, 1234, 56, 0o640, 9, 9, true, Kind::Whole)
        );
        assert_eq!(next.read_all(g).unwrap(), b"version b");
        assert!(!objects.join(object_name(orphan)).exists());
        // Adopting again changes nothing: the log was emptied.
        assert_eq!(next.adopt_pending(&|_| None).unwrap(), 0);
        // Ids given from now on come after every adopted one.
        let later = next
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        assert!(later > b, "{later} after {b}");
    }

    /// A rewrite killed after its version was recorded (the old inode
    /// linked into the store) but before the new file took the name: the
    /// record names the live file. The successor drops it and the link, so
    /// the file is a file of one name again, whose next rewrite (the same
    /// open sent again) makes a version of its own; kept, the version would
    /// change with the file.
    #[test]
    fn a_record_whose_rewrite_never_took_the_name_is_dropped() {
        use std::os::unix::fs::MetadataExt;
        let (dir, _root, store, src, meta) = store_and_source();
        let kept = store
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        std::fs::write(dir.path().join("f"), b"the live file").unwrap();
        let store_dir = dir.path().join(STORE_DIR);
        let (unplaced, placed) = (kept + 10, kept + 11);
        std::fs::hard_link(
            dir.path().join("f"),
            store_dir.join("objects").join(object_name(unplaced)),
        )
        .unwrap();
        // And one whose rewrite completed: its object is no file's now.
        std::fs::write(
            store_dir.join("objects").join(object_name(placed)),
            b"old g",
        )
        .unwrap();
        let rec = |id: i64, path: &[u8]| Record {
            id,
            path: path.to_vec(),
            ts: stamp::now_us(),
            size: 13,
            uid: 0,
            gid: 0,
            mode: 0o644,
            reason: "write".into(),
            terminal: false,
        };
        let log: Vec<u8> = [rec(unplaced, b"/f"), rec(placed, b"/g")]
            .iter()
            .flat_map(pending::frame)
            .collect();
        std::fs::write(store_dir.join(pending::LOG), log).unwrap();
        std::fs::write(dir.path().join("g"), b"new g").unwrap();
        drop(store);
        let next = Store::open(File::open(dir.path()).unwrap().as_fd(), false).unwrap();
        let named = |path: &[u8]| {
            let p = dir.path().join(std::str::from_utf8(&path[1..]).unwrap());
            std::fs::symlink_metadata(p)
                .ok()
                .map(|m| (m.dev(), m.ino()))
        };
        assert_eq!(next.adopt_pending(&named).unwrap(), 1, "only /g's version");
        let f = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(f.nlink(), 1, "the store's link to the live file is gone");
        assert_eq!(
            std::fs::read(dir.path().join("f")).unwrap(),
            b"the live file"
        );
        assert_eq!(
            next.list(Some(b"/f"), false)
                .unwrap()
                .iter()
                .map(|v| v.id)
                .collect::<Vec<_>>(),
            [kept]
        );
        let g = next.list(Some(b"/g"), false).unwrap();
        assert_eq!(g.iter().map(|v| v.id).collect::<Vec<_>>(), [placed]);
        assert!(
            next.check().unwrap().is_empty(),
            "{:?}",
            next.check().unwrap()
        );
    }

    /// A recorded version is committed only once its rewrite published it
    /// (the name has its new file), and the log keeps it until then.
    #[test]
    fn a_recorded_version_waits_for_its_rewrite() {
        let (dir, root, store, _src, _meta) = store_and_source();
        let store = std::sync::Arc::new(store);
        store.adopt_pending(&|_| None).unwrap();
        store.defer_versions(Policy::default()).unwrap();
        std::fs::write(dir.path().join("f"), b"old").unwrap();
        let meta = FileMeta::of(&File::open(dir.path().join("f")).unwrap()).unwrap();
        let d = File::open(dir.path()).unwrap();
        let id = store
            .record_linked(b"/f", d.as_fd(), OsStr::new("f"), &meta, "write", false)
            .unwrap();
        let rows = || {
            Store::open(root.as_fd(), false)
                .unwrap()
                .list(Some(b"/f"), false)
                .unwrap()
                .len()
        };
        store.sync_pending().unwrap();
        assert_eq!(rows(), 0, "committed before its rewrite took the name");
        let log = dir.path().join(STORE_DIR).join(pending::LOG);
        assert!(
            std::fs::metadata(&log).unwrap().len() > 0,
            "the log lost it"
        );
        std::fs::remove_file(dir.path().join("f")).unwrap();
        store.publish(id);
        store.sync_pending().unwrap();
        assert_eq!(rows(), 1);
        // A rewrite that failed: never committed, its object gone.
        std::fs::write(dir.path().join("f"), b"new").unwrap();
        let meta = FileMeta::of(&File::open(dir.path().join("f")).unwrap()).unwrap();
        let failed = store
            .record_linked(b"/f", d.as_fd(), OsStr::new("f"), &meta, "write", false)
            .unwrap();
        store.unrecord(failed).unwrap();
        store.sync_pending().unwrap();
        assert_eq!(rows(), 1);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"new");
        let object = dir
            .path()
            .join(STORE_DIR)
            .join("objects")
            .join(object_name(failed));
        assert!(!object.exists(), "the failed rewrite's object is left");
    }

    /// A daemon killed with versions recorded but not committed, then only
    /// an embedded job (shared instances) over its store: a process that
    /// finds the store free commits the log before it shares the store; one
    /// that finds other processes of the job leaves it.
    #[test]
    fn an_embedded_process_alone_commits_a_dead_daemon_s_log() {
        use super::super::{Config, Versions, LOCK_NAME};
        let (dir, _root, store, src, meta) = store_and_source();
        let kept = store
            .add_whole(b"/f", &src, &meta, "write", true)
            .unwrap()
            .id()
            .expect("a version");
        let id = kept + 10;
        let store_dir = dir.path().join(STORE_DIR);
        std::fs::write(
            store_dir.join("objects").join(object_name(id)),
            b"version a",
        )
        .unwrap();
        let rec = Record {
            id,
            path: b"/f".to_vec(),
            ts: stamp::now_us(),
            size: 9,
            uid: 0,
            gid: 0,
            mode: 0o644,
            reason: "write".into(),
            terminal: false,
        };
        std::fs::write(store_dir.join(pending::LOG), pending::frame(&rec)).unwrap();
        drop(store);
        let ids = |v: &Versions| -> Vec<i64> {
            v.store
                .list(Some(b"/f"), false)
                .unwrap()
                .iter()
                .map(|v| v.id)
                .collect()
        };
        let shared = Config {
            shared: true,
            ..Config::default()
        };
        let lock_dir = File::open(&store_dir).unwrap();
        let other = crate::sole::take_shared(lock_dir.as_fd(), LOCK_NAME, "versions", "t").unwrap();
        let v = Versions::new(dir.path(), shared).unwrap();
        assert!(
            v.store.has_pending().unwrap(),
            "another process holds the store"
        );
        assert_eq!(ids(&v), [kept]);
        drop((v, other));
        // Alone: but a process another test of this binary forks at this
        // moment holds a copy of the lock's descriptor until it execs (seen
        // once in CI), and the instance then rightly shares the store and
        // leaves the log. Such a holder goes within milliseconds.
        let mut tries = 0;
        let v = loop {
            let v = Versions::new(dir.path(), shared).unwrap();
            tries += 1;
            if !v.store.has_pending().unwrap() || tries == 50 {
                break v;
            }
            drop(v);
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(
            !v.store.has_pending().unwrap(),
            "alone, it committed the log"
        );
        assert_eq!(ids(&v), [kept, id]);
        assert_eq!(
            v.store
                .read_all(&v.store.list(Some(b"/f"), false).unwrap()[1])
                .unwrap(),
            b"version a"
        );
        // It shares the store now: the job's next process joins, a mount
        // cannot.
        let next = crate::sole::take_shared(lock_dir.as_fd(), LOCK_NAME, "versions", "t").unwrap();
        assert!(crate::sole::try_take(lock_dir.as_fd(), LOCK_NAME)
            .unwrap()
            .is_none());
        drop(next);
    }

    /// Versions recorded through the committer are in the index for
    /// another process (another connection) once `sync_pending` returns,
    /// and the count limit holds with them.
    #[test]
    fn recorded_versions_are_committed_with_the_count_limit() {
        let (dir, root, store, _src, _meta) = store_and_source();
        let store = std::sync::Arc::new(store);
        store.adopt_pending(&|_| None).unwrap();
        let policy = Policy {
            keep: Some(3),
            keep_days: None,
            keep_bytes: None,
        };
        store.defer_versions(policy).unwrap();
        let d = File::open(dir.path()).unwrap();
        let mut ids = Vec::new();
        for i in 0..6u8 {
            std::fs::write(dir.path().join("f"), [b'0' + i; 5]).unwrap();
            let meta = FileMeta::of(&File::open(dir.path().join("f")).unwrap()).unwrap();
            ids.push(
                store
                    .record_linked(b"/f", d.as_fd(), OsStr::new("f"), &meta, "write", false)
                    .unwrap(),
            );
            // The caller then gives the name a new file, as a rewrite does.
            std::fs::remove_file(dir.path().join("f")).unwrap();
            store.publish(*ids.last().unwrap());
            store.sync_pending().unwrap();
            let other = Store::open(root.as_fd(), false).unwrap();
            let seen: Vec<i64> = other
                .list(Some(b"/f"), false)
                .unwrap()
                .iter()
                .map(|v| v.id)
                .collect();
            let from = (i as usize + 1).saturating_sub(3);
            assert_eq!(seen, ids[from..], "after version {i}");
        }
        drop(store);
        let after = Store::open(root.as_fd(), false).unwrap();
        assert!(
            after.check().unwrap().is_empty(),
            "{:?}",
            after.check().unwrap()
        );
        let bodies: Vec<Vec<u8>> = after
            .list(Some(b"/f"), false)
            .unwrap()
            .iter()
            .map(|v| after.read_all(v).unwrap())
            .collect();
        assert_eq!(bodies, [[b'3'; 5], [b'4'; 5], [b'5'; 5]]);
    }

    /// The release of a writer that changed nothing drops its version
    /// while the file's next writer opens and takes one: the deletion
    /// removes the object after the row, so the new version must not be
    /// given the deleted id, or the deletion removes its object instead
    /// (the open failed with `ENOENT`, or kept a version without its
    /// bytes). Nor may another process using the store give it again.
    #[test]
    fn a_deleted_version_s_id_is_never_given_again() {
        let (_dir, root, store, _src, meta) = store_and_source();
        let (dropped, _) = store.add_undo(b"/f", &meta).unwrap();
        // The deletion has removed the row, not yet the object...
        store.delete_rows(&[dropped]).unwrap();
        // ...when the next writer's version is made...
        let (taken, _obj) = store.add_undo(b"/f", &meta).unwrap();
        let _mark = store.mark_in_use(taken).unwrap();
        // ...and then the deletion ends.
        store.delete_objects(&[dropped]).unwrap();
        store
            .open_object(taken)
            .expect("the new version's object is still there");
        assert_ne!(taken, dropped);
        // The newest version deleted, another connection to the store (as
        // `mapfs versions` makes) gives a new id too.
        store.delete_ids(&[taken]).unwrap();
        let other = Store::open(root.as_fd(), false).unwrap();
        let (later, _) = other.add_undo(b"/f", &meta).unwrap();
        assert!(later > taken, "id {later} given again (newest was {taken})");
    }
}
