//! Creates answered before their commit.
//!
//! A new file born in a file of its own (`born.rs`) costs its creator a
//! database transaction that a create on a passthrough mount does not:
//! about half of the `CREATE` request. Where it is born, the daemon can
//! instead make `files/<ino>` with the create's record in an extended
//! attribute of that file (one `fsetxattr`, on the file the kernel or the
//! shim will write anyway) and answer; the inode and its name go into the
//! database with the next write transaction of any kind, before anything
//! else in it (so that transaction sees the name): usually a batch of
//! moves into slots after releases, or the daemon's housekeeping round
//! (every 50 ms), both after the creator's `close(2)` returned.
//!
//! Until then the name lives here: path walks and `getattr` find it here
//! first, and every other read of the database (an open's included)
//! commits the creates here first (`Pack::db`). A crash of the daemon in between loses no
//! file: the next instance over the store (a fresh mount or a failover's
//! successor) finds `files/<ino>` with its record, an inode number past the
//! largest the database ever gave out (SQLite's `AUTOINCREMENT` counter,
//! which any commit of the inode raised), and enters it under its name
//! before it serves anything. A file whose number the database did give out
//! was committed once: a leftover of its removal, removed as before.
//!
//! Only a daemon alone with its store does this, and not with `sync=full`
//! (whose commits are synced before the answer); a backing file system
//! without user extended attributes turns it off at the first create.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use mapfs::{Attr, Ctx, Error, OpenFlags, Opened, Result};
use rusqlite::{Connection, OptionalExtension};
use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

use super::db::{self, DbResult, Inode};
use super::names;
use super::Pack;

/// The extended attribute of `files/<ino>` that holds its create's record
/// while the create is not committed (and after: it is never removed, the
/// inode counter tells which records are stale).
pub const RECORD_XATTR: &str = "user.mapfs.create";

/// Most creates kept uncommitted: the next one commits them first, so
/// memory stays bounded.
pub const MAX_PENDING: usize = 256;

/// What the database will hold of a create: what its record says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Record {
    parent: i64,
    name: Vec<u8>,
    mode: u32,
    uid: u32,
    gid: u32,
    /// Nanoseconds since the epoch (the file's birth and its parent's
    /// new mtime).
    time: i64,
}

/// Creates not committed yet.
#[derive(Debug, Default)]
pub struct Pending {
    /// By inode number, in the order they were given out.
    files: BTreeMap<i64, Record>,
    /// `(parent, name) -> ino`.
    names: HashMap<(i64, Vec<u8>), i64>,
    /// The time of the last create waiting in each directory (`parent ->
    /// time`): asked at every `GETATTR` of a directory, which a scan of
    /// `files` would make as slow as the creates waiting are many.
    dir_times: HashMap<i64, i64>,
    /// The database's inode counter ([`counter`]) as last read; only a
    /// committed write transaction moves it ([`Pack::forget_pending`]).
    counter: Option<i64>,
}

impl Pending {
    /// True when nothing waits for a commit.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The inode created as `name` in `parent`, if it waits here.
    pub fn lookup(&self, parent: i64, name: &[u8]) -> Option<Inode> {
        if self.files.is_empty() {
            // Most walks: no key to build.
            return None;
        }
        let ino = *self.names.get(&(parent, name.to_vec()))?;
        self.inode(ino)
    }

    /// Inode `ino`, if its create waits here.
    pub fn inode(&self, ino: i64) -> Option<Inode> {
        self.files.get(&ino).map(|r| r.inode(ino))
    }

    /// The time of the last create waiting here in directory `ino`: its
    /// mtime and ctime, which the database has older.
    pub fn parent_time(&self, ino: i64) -> Option<i64> {
        self.dir_times.get(&ino).copied()
    }

    /// Adds the create of `ino`.
    fn add(&mut self, ino: i64, rec: Record) {
        note_time(&mut self.dir_times, &rec);
        self.names.insert((rec.parent, rec.name.clone()), ino);
        self.files.insert(ino, rec);
    }

    /// Removes the creates `inos`, committed.
    fn remove(&mut self, inos: &[i64]) {
        for ino in inos {
            if let Some(rec) = self.files.remove(ino) {
                self.names.remove(&(rec.parent, rec.name));
            }
        }
        // A commit takes every create waiting (they are added under the
        // connection's lock, which it holds), so this is rarely a scan.
        self.dir_times.clear();
        for r in self.files.values() {
            note_time(&mut self.dir_times, r);
        }
    }
}

/// Makes `dir_times` hold `rec`'s time for its directory if it is the latest.
fn note_time(dir_times: &mut HashMap<i64, i64>, rec: &Record) {
    let t = dir_times.entry(rec.parent).or_insert(rec.time);
    *t = (*t).max(rec.time);
}

impl Record {
    /// The inode the database will hold: a file of its own, one link, no
    /// bytes but what `files/<ino>` holds.
    fn inode(&self, ino: i64) -> Inode {
        Inode {
            ino,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: 1,
            size: 0,
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            rdev: 0,
            own: true,
            slot: None,
        }
    }

    /// Enters it as inode `ino` in transaction `tx`.
    fn commit(&self, tx: &Connection, ino: i64) -> Result<()> {
        tx.prepare_cached(
            "INSERT INTO inodes(ino, mode, uid, gid, nlink, atime, mtime, ctime, own) \
             VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5, ?5, 1)",
        )
        .db()?
        .execute(rusqlite::params![
            ino, self.mode, self.uid, self.gid, self.time
        ])
        .db()?;
        db::insert_dentry(tx, self.parent, &self.name, ino)?;
        tx.prepare_cached("UPDATE inodes SET mtime = ?2, ctime = ?2 WHERE ino = ?1 AND mtime < ?2")
            .db()?
            .execute(rusqlite::params![self.parent, self.time])
            .db()?;
        Ok(())
    }
}

/// Files in `backing`'s `files/` that a daemon created and answered and
/// died before committing: the next instance over the store enters them.
/// Counted by the offline tools, which do not.
pub(super) fn awaiting_entry(conn: &Connection, backing: &Path) -> Result<u64> {
    let dir = match rustix::fs::open(
        backing.join(super::OWN_DIR),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    Ok(records_past_counter(conn, &dir)?.len() as u64)
}

/// The create records of the files in `dir` (a store's `files/`) whose
/// number is past the database's counter: creates a daemon answered and
/// died before committing.
fn records_past_counter(conn: &Connection, dir: &OwnedFd) -> Result<Vec<(i64, Record)>> {
    let seq = counter(conn)?;
    let mut found = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(ino) = name.to_str().ok().and_then(|n| n.parse::<i64>().ok()) else {
            continue;
        };
        if ino <= seq {
            continue;
        }
        if let Some(rec) = read_record(dir, name)? {
            found.push((ino, rec));
        }
    }
    Ok(found)
}

/// The create record of `dir/name`, if it has one.
fn read_record(dir: &OwnedFd, name: &CStr) -> Result<Option<Record>> {
    let f = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => f,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut buf = [0u8; 512];
    match rustix::fs::fgetxattr(&f, RECORD_XATTR, &mut buf) {
        Ok(n) => Ok(postcard::from_bytes(&buf[..n]).ok()),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The largest inode number the database ever gave out or was given.
fn counter(conn: &Connection) -> Result<i64> {
    let seq: Option<i64> = conn
        .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'inodes'")
        .db()?
        .query_row([], |r| r.get(0))
        .optional()
        .db()?;
    Ok(seq.unwrap_or(db::ROOT).max(db::ROOT))
}

impl Pack {
    /// Creates `path` as a born file (`born.rs`) answered before its
    /// commit; `None` when this instance does not (or no longer: the
    /// backing store has no user extended attributes) and the caller
    /// creates in a transaction.
    pub(super) fn create_pending(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<Option<(Attr, Opened)>> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.defer_creates.load(Relaxed) {
            return Ok(None);
        }
        if self.pending.lock().files.len() >= MAX_PENDING {
            self.settle()?;
        }
        let (i, f) = {
            let conn = self.lock_db()?;
            // The kernel's `LOOKUP` of the name, just before, left it
            // missing in the read cache.
            let reads = Some((&self.reads, self.version()));
            let (parent, name) = names::parent_for_new(&conn, &self.dirs, reads, ctx, path)?;
            let mut pending = self.pending.lock();
            if pending.names.contains_key(&(parent.ino, name.clone())) {
                return Err(Error::from_errno(libc::EEXIST));
            }
            let (uid, gid, mode) = names::new_owner(ctx, &parent, libc::S_IFREG | (mode & 0o7777));
            let rec = Record {
                parent: parent.ino,
                name,
                mode,
                uid,
                gid,
                time: db::now_ns(),
            };
            let bytes =
                postcard::to_stdvec(&rec).map_err(|e| Error::io().context(e.to_string()))?;
            let counted = match pending.counter {
                Some(c) => c,
                None => counter(&conn)?,
            };
            pending.counter = Some(counted);
            let mut ino = counted.max(pending.files.keys().next_back().copied().unwrap_or(0));
            // A writer's close reads the file back into the kernel's pages
            // (`Capabilities::leaves_whole_file_at_close`): through this
            // descriptor, rather than one opened again, when the creator,
            // its owner, may read it anyway (the kernel refuses reads of a
            // write-only open before they reach the backing file).
            let access = if flags.access() == libc::O_WRONLY && rec.mode & libc::S_IRUSR != 0 {
                libc::O_RDWR
            } else {
                flags.access()
            };
            let f = loop {
                ino += 1;
                // A leftover of a create whose record a fresh mount never
                // saw (a successor keeps them): take the next number.
                match self.own_file(ino, access | libc::O_CREAT | libc::O_EXCL) {
                    Ok(f) => break f,
                    Err(e) if e.errno() == libc::EEXIST => continue,
                    Err(e) => return Err(e),
                }
            };
            if let Err(e) =
                rustix::fs::fsetxattr(&f, RECORD_XATTR, &bytes, rustix::fs::XattrFlags::empty())
            {
                self.remove_own(Some(ino));
                if e == rustix::io::Errno::NOTSUP {
                    tracing::info!(
                        "pack: the backing store has no user extended attributes; \
                         every create commits before it is answered"
                    );
                    self.defer_creates.store(false, Relaxed);
                    return Ok(None);
                }
                return Err(e.into());
            }
            let i = rec.inode(ino);
            pending.add(ino, rec);
            if let Some(bell) = self.bell.get() {
                bell.soon();
            }
            (i, f)
        };
        self.enter(i.ino)?;
        self.born_open(&i, f).map(Some)
    }

    /// Enters every create waiting in [`Pending`] in transaction `tx`,
    /// before anything else it does; returns their numbers, to forget once
    /// `tx` commits. The caller holds the connection's lock, under which
    /// alone creates are added.
    pub(super) fn commit_pending(&self, tx: &Connection) -> Result<Vec<i64>> {
        let pending = self.pending.lock();
        for (ino, rec) in &pending.files {
            rec.commit(tx, *ino)?;
        }
        Ok(pending.files.keys().copied().collect())
    }

    /// Forgets the creates `inos`, committed by a write transaction (which
    /// may have moved the inode counter too).
    pub(super) fn forget_pending(&self, inos: &[i64]) {
        let mut pending = self.pending.lock();
        pending.counter = None;
        pending.remove(inos);
    }

    /// Commits every create waiting in [`Pending`].
    pub(super) fn settle(&self) -> Result<()> {
        if self.pending.lock().is_empty() {
            return Ok(());
        }
        self.write(|_| Ok(()))
    }

    /// Enters the creates a daemon answered and died before committing:
    /// `files/<ino>` with a record and a number past the database's
    /// counter. Runs before the instance serves. Returns the numbers of
    /// those it could not enter (kept in `files/`, never removed).
    pub(super) fn recover_pending(&self) -> Result<HashSet<i64>> {
        let mut found = records_past_counter(&*self.lock_db()?, &self.own_dir)?;
        let mut kept = HashSet::new();
        if found.is_empty() {
            return Ok(kept);
        }
        found.sort_by_key(|(ino, _)| *ino);
        let mut entered = 0;
        self.write(|tx| {
            for (ino, rec) in &found {
                let parent_ok =
                    db::inode(tx, rec.parent)?.is_some_and(|p| p.is_dir() && p.nlink > 0);
                if !parent_ok || db::lookup(tx, rec.parent, &rec.name)?.is_some() {
                    // Not reachable by the rules above; kept, never lost.
                    tracing::warn!(
                        ino,
                        name = ?OsStr::from_bytes(&rec.name),
                        "pack: a create answered before a crash has no place to go back to; \
                         its bytes stay in files/{ino}"
                    );
                    kept.insert(*ino);
                    continue;
                }
                rec.commit(tx, *ino)?;
                entered += 1;
            }
            Ok(())
        })?;
        if entered > 0 {
            tracing::info!("pack: entered {entered} file(s) created just before a crash");
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(parent: i64, name: &str, time: i64) -> Record {
        Record {
            parent,
            name: name.as_bytes().to_vec(),
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            time,
        }
    }

    #[test]
    fn a_directory_has_the_time_of_its_last_create_waiting() {
        let mut p = Pending::default();
        assert_eq!(p.parent_time(1), None);
        p.add(10, rec(1, "a", 100));
        p.add(11, rec(1, "b", 300));
        p.add(12, rec(2, "c", 200));
        p.add(13, rec(1, "d", 250));
        assert_eq!(p.parent_time(1), Some(300));
        assert_eq!(p.parent_time(2), Some(200));
        assert_eq!(p.lookup(1, b"d").map(|i| i.ino), Some(13));
        // The latest of directory 1 committed: the next latest is its time.
        p.remove(&[11, 12]);
        assert_eq!(p.parent_time(1), Some(250));
        assert_eq!(p.parent_time(2), None, "a directory with none waiting");
        assert!(p.lookup(1, b"b").is_none());
        p.remove(&[10, 13]);
        assert!(p.is_empty());
        assert_eq!(p.parent_time(1), None);
    }
}
