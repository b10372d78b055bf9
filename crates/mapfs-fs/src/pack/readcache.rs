//! What reads found in the database since its last write transaction:
//! final names of path walks and slotted files' extents, so that a file
//! looked up and then opened (every `open(2)` of a path: the kernel's
//! `LOOKUP`, then `OPEN`) is read from the database once.
//!
//! The cache is only as old as the database's last change: every write
//! transaction, committed or rolled back, counts as one
//! ([`db::writes`]), and the cache empties itself when that count moved
//! since it was filled. The count moves while the connection's lock is
//! held, so an entry filled under the lock at count `n` is the database's
//! state for as long as the count is `n`. Only this daemon changes the
//! database while it serves it (it holds the database's lock, and runs the
//! `mapfs pack` tools itself), so nothing changes it behind the count. The
//! instances of an embedded job share the database: theirs adds what
//! SQLite counts of other connections' commits (`Pack::version`).
//! Callers must not use it inside a write transaction, whose own changes
//! are not counted until it ends.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::db::{self, Inode};

/// An extent row: `(logical, off, len)`.
pub type Row = (u64, u64, u64);

/// Most entries of each kind; past it the cache starts afresh, so memory
/// stays bounded.
const MAX_ENTRIES: usize = 65_536;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ReadCache {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The [`db::writes`] count the entries were read at.
    writes: u64,
    /// Final names of walks: `None` for one found missing (the kernel's
    /// `LOOKUP` of a new file's name comes just before its `CREATE`, which
    /// need not ask again).
    names: HashMap<(i64, Vec<u8>), Option<Inode>>,
    extents: HashMap<i64, Vec<Row>>,
}

impl Inner {
    /// The entries, emptied first if the database changed since.
    fn at(&mut self, writes: u64) -> &mut Self {
        if self.writes != writes {
            self.names.clear();
            self.extents.clear();
            self.writes = writes;
        }
        self
    }
}

impl ReadCache {
    /// Entry `name` of directory `parent`, if read since the database last
    /// changed (`Some(None)`: found missing); `writes` is [`db::writes`]
    /// read under the connection's lock.
    pub fn name(&self, writes: u64, parent: i64, name: &[u8]) -> Option<Option<Inode>> {
        // The key is built only to look up: names are short.
        let mut c = self.inner.lock();
        c.at(writes).names.get(&(parent, name.to_vec())).cloned()
    }

    /// Remembers `i` as entry `name` of `parent` (`None`: there is none),
    /// read at `writes`.
    pub fn put_name(&self, writes: u64, parent: i64, name: &[u8], i: Option<&Inode>) {
        let mut c = self.inner.lock();
        let c = c.at(writes);
        if c.names.len() >= MAX_ENTRIES {
            c.names.clear();
        }
        c.names.insert((parent, name.to_vec()), i.cloned());
    }

    /// The extents of `ino`, if read since the database last changed.
    pub fn extents(&self, writes: u64, ino: i64) -> Option<Vec<Row>> {
        self.inner.lock().at(writes).extents.get(&ino).cloned()
    }

    /// Remembers the extents of `ino`, read at `writes`.
    pub fn put_extents(&self, writes: u64, ino: i64, rows: &[Row]) {
        let mut c = self.inner.lock();
        let c = c.at(writes);
        if c.extents.len() >= MAX_ENTRIES {
            c.extents.clear();
        }
        c.extents.insert(ino, rows.to_vec());
    }
}

/// [`db::extents`] of `ino` through `cache` (at `writes`).
pub fn extents(
    conn: &rusqlite::Connection,
    cache: &ReadCache,
    writes: u64,
    ino: i64,
) -> mapfs::Result<Vec<Row>> {
    if let Some(rows) = cache.extents(writes, ino) {
        return Ok(rows);
    }
    let rows = db::extents(conn, ino)?;
    cache.put_extents(writes, ino, &rows);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ino: i64) -> Inode {
        db::test_inode(ino, libc::S_IFREG | 0o644)
    }

    #[test]
    fn entries_last_until_the_database_changes() {
        let c = ReadCache::default();
        c.put_name(7, 1, b"a", Some(&file(5)));
        c.put_extents(7, 5, &[(0, 4096, 10)]);
        assert_eq!(c.name(7, 1, b"a").unwrap().unwrap().ino, 5);
        assert_eq!(c.extents(7, 5).unwrap(), vec![(0, 4096, 10)]);
        assert!(c.name(7, 1, b"b").is_none());
        c.put_name(7, 1, b"b", None);
        assert!(
            matches!(c.name(7, 1, b"b"), Some(None)),
            "not remembered as missing"
        );
        assert!(c.name(7, 1, b"a").unwrap().is_some());
        // A write transaction ended: everything read before is gone.
        assert!(c.name(8, 1, b"b").is_none());
        assert!(c.name(8, 1, b"a").is_none());
        assert!(c.extents(8, 5).is_none());
        assert!(
            c.name(7, 1, b"a").is_none(),
            "an older count revived entries"
        );
    }

    #[test]
    fn stays_bounded() {
        let c = ReadCache::default();
        for i in 0..(MAX_ENTRIES as i64 + 10) {
            c.put_name(1, 1, format!("f{i}").as_bytes(), Some(&file(i + 2)));
            assert!(c.inner.lock().names.len() <= MAX_ENTRIES);
        }
    }
}
