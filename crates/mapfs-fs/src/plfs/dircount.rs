//! Link counts of directories, kept current through this daemon's own
//! changes.
//!
//! A directory's backing link count counts every container (a file is a
//! directory in the store), so plfs counts its real subdirectories: two
//! lookups per entry, hundreds of system calls (and round trips on a
//! network store) for a directory of a hundred files. A count is cached
//! with the directory's validator (its mtime and ctime). Each change this
//! daemon makes in a directory (a `mkdir`, an `rmdir`, a file created or
//! removed) would change the validator and cost a count at the next
//! `getattr`: a `mkdir` loop counted every entry of its directory each
//! time (O(n) per `mkdir`). Instead a change runs under the directory's
//! stripe lock between two validators, and a count cached for the
//! validator before it moves to the validator after it, adjusted by what
//! the change did. Changes made by others (another host, the backing
//! directory itself) still show as a validator nobody cached, and are
//! counted again.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;

use mapfs::Result;
use parking_lot::Mutex;

use super::container::Key;
use super::store::{self, Validator};

/// Stripes of the change lock: changes in directories of different
/// stripes run in parallel.
const STRIPES: usize = 64;

/// Counts cached at most; past it the cache starts over.
const CACHED_MAX: usize = 4096;

/// The cache of directory link counts.
#[derive(Debug)]
pub(super) struct DirCounts {
    counts: Mutex<HashMap<Key, (Validator, u32)>>,
    stripes: [Mutex<()>; STRIPES],
}

impl DirCounts {
    pub(super) fn new() -> Self {
        DirCounts {
            counts: Mutex::new(HashMap::new()),
            stripes: [const { Mutex::new(()) }; STRIPES],
        }
    }

    fn stripe(&self, key: Key) -> &Mutex<()> {
        let h = key.0.wrapping_mul(31).wrapping_add(key.1);
        &self.stripes[(h % STRIPES as u64) as usize]
    }

    fn cached(&self, key: Key, v: Validator) -> Option<u32> {
        match self.counts.lock().get(&key) {
            Some(&(cv, n)) if cv == v => Some(n),
            _ => None,
        }
    }

    /// The link count of directory `dir`: cached, or `count`ed (under the
    /// stripe lock, so that no change of this daemon runs between the
    /// validator and the count it validates).
    pub(super) fn get(
        &self,
        dir: BorrowedFd<'_>,
        count: impl FnOnce() -> Result<u32>,
    ) -> Result<u32> {
        let (key, v) = store::key_and_validator(dir)?;
        if let Some(n) = self.cached(key, v) {
            return Ok(n);
        }
        let _stripe = self.stripe(key).lock();
        let v = store::validator(dir)?;
        if let Some(n) = self.cached(key, v) {
            return Ok(n);
        }
        let n = count()?;
        let mut c = self.counts.lock();
        if c.len() >= CACHED_MAX {
            c.clear();
        }
        c.insert(key, (v, n));
        Ok(n)
    }

    /// Runs `change`, a change of this daemon in directory `dir` that adds
    /// `delta` real subdirectories when it succeeds (0 for a file, -1 for
    /// an `rmdir`), keeping a count cached before it valid after it.
    /// Nothing is carried over when the change failed or left `dir`
    /// as it was (it then happened elsewhere: a path raced by a rename):
    /// the next `getattr` counts.
    pub(super) fn change<T>(
        &self,
        dir: BorrowedFd<'_>,
        delta: i32,
        change: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Ok((key, _)) = store::key_and_validator(dir) else {
            return change();
        };
        let _stripe = self.stripe(key).lock();
        let before = store::validator(dir).ok();
        let res = change();
        if res.is_ok() {
            if let (Some(before), Ok(after)) = (before, store::validator(dir)) {
                let mut c = self.counts.lock();
                if let Some(entry) = c.get_mut(&key) {
                    if entry.0 == before && after != before {
                        *entry = (after, entry.1.saturating_add_signed(delta));
                    }
                }
            }
        }
        res
    }
}
