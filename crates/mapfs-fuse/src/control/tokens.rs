//! The daemon's side of the clients' map cache: the [`Generations`] table
//! sent with Hello, and the last map seen per inode, which decides when an
//! open, an adoption or a release must invalidate what clients cached (token
//! contract in [`mapfs::mapcache`]).
//!
//! "Map" here is the [`DataMap`] *and* the identity (device, inode) of each
//! backing file: clients cache backing descriptors too, so a file system
//! that moves an inode to another backing file under the same map (a copy-up,
//! say) must invalidate them.
//!
//! Cost: without a table (memfd refused) every call returns at once. With
//! one, a bump is one atomic add; the opens, adoptions and releases of
//! tracked inodes also `fstat` each backing file and lock one of
//! [`SHARDS`] shards (never on the read/write path).
//!
//! Lock order: a shard lock is a leaf, except that [`MapTokens::forgotten`]
//! calls its closure (the inode table's lock, itself a leaf) under it.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mapfs::engine::DataFile;
use mapfs::mapcache::Generations;
use mapfs::DataMap;
use parking_lot::Mutex;

/// Number of independently locked parts of the last-map table.
pub const SHARDS: usize = 64;

/// What a client may have cached about an inode.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    map: DataMap,
    /// (st_dev, st_ino) of each backing file, in map order.
    files: Vec<(u64, u64)>,
}

impl Seen {
    /// `None` if a backing file cannot be identified (then nothing about
    /// this inode counts as unchanged).
    fn of(map: DataMap, files: &[Arc<File>]) -> Option<Seen> {
        let files = files
            .iter()
            .map(|f| mapfs::backing::identity(f).map(|id| (id.dev, id.ino)))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some(Seen { map, files })
    }

    fn of_data(data: &DataFile) -> Option<Seen> {
        let (map, files) = data.snapshot();
        Seen::of(map, &files)
    }
}

/// The generation table and the last map seen per inode. See the module
/// docs.
pub struct MapTokens {
    table: Option<Generations>,
    last: Box<[Mutex<HashMap<u64, Seen>>]>,
    /// Bumps made, for `mapfs stats`.
    bumps: AtomicU64,
}

impl std::fmt::Debug for MapTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapTokens")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl MapTokens {
    /// Creates the table; if the kernel refuses (no memfd or seals), logs
    /// once and runs without one (clients then cache nothing).
    pub fn new() -> Self {
        match Generations::create() {
            Ok(t) => Self::with_table(Some(t)),
            Err(e) => {
                tracing::warn!(
                    "no generation table for shim clients ({e}); they will ask the daemon \
                     at every open"
                );
                Self::with_table(None)
            }
        }
    }

    /// Tracks nothing and sends no table.
    pub fn disabled() -> Self {
        Self::with_table(None)
    }

    fn with_table(table: Option<Generations>) -> Self {
        MapTokens {
            table,
            last: (0..SHARDS).map(|_| Mutex::default()).collect(),
            bumps: AtomicU64::new(0),
        }
    }

    fn bumped(&self, t: &Generations, ino: u64) {
        t.bump(ino);
        self.bumps.fetch_add(1, Ordering::Relaxed);
    }

    /// The bumps made since the start or the last reset (`reset`: start
    /// counting again from zero).
    pub fn bumps(&self, reset: bool) -> u64 {
        if reset {
            self.bumps.swap(0, Ordering::Relaxed)
        } else {
            self.bumps.load(Ordering::Relaxed)
        }
    }

    /// The table to send to clients, if there is one.
    pub fn generations(&self) -> Option<&Generations> {
        self.table.as_ref()
    }

    fn shard(&self, ino: u64) -> &Mutex<HashMap<u64, Seen>> {
        // Inode numbers are dense; their low bits spread well enough.
        &self.last[(ino as usize) % SHARDS]
    }

    /// Invalidates what clients cached about `ino`. Call after the change is
    /// applied and before replying to the request that made it.
    pub fn bump(&self, ino: u64) {
        if let Some(t) = &self.table {
            self.bumped(t, ino);
        }
    }

    /// A new open of `ino` got `data`: bumps when its map differs from the
    /// last one seen (which it replaces), or when `force` (the open may
    /// write or truncate).
    pub fn opened(&self, ino: u64, data: &DataFile, force: bool) {
        self.record(ino, data, force);
    }

    /// A client is about to be handed the open of `ino` with `map` over
    /// `files`: if that is not the last map seen (another open got another
    /// one since), whatever token the client read after its open must not
    /// validate it, so bump.
    pub fn adopting(&self, ino: u64, map: &DataMap, files: &[Arc<File>]) {
        let Some(t) = &self.table else { return };
        let seen = Seen::of(map.clone(), files);
        let last = self.shard(ino).lock();
        let same = matches!((last.get(&ino), &seen), (Some(old), Some(s)) if old == s);
        if !same {
            self.bumped(t, ino);
        }
    }

    /// An open of `ino` was released with its final `data` (after the file
    /// system's `release`): bumps when the final map differs from the last
    /// seen (and records it), or when `changed`.
    pub fn released(&self, ino: u64, data: &DataFile, changed: bool) {
        self.record(ino, data, changed);
    }

    /// Records the map of `data` as the last seen for `ino`; bumps when it
    /// differs from the one before, or when `force`. No entry means nothing
    /// valid can be cached: the entry is made at the first open and dropped
    /// (with a bump) at forget.
    fn record(&self, ino: u64, data: &DataFile, force: bool) {
        let Some(t) = &self.table else { return };
        let seen = Seen::of_data(data);
        let mut last = self.shard(ino).lock();
        let differs = match seen {
            Some(seen) => {
                let differs = last.get(&ino).is_some_and(|old| *old != seen);
                last.insert(ino, seen);
                differs
            }
            None => last.remove(&ino).is_some(),
        };
        if differs || force {
            self.bumped(t, ino);
        }
    }

    /// The kernel dropped references to `ino`; when `gone()` says the inode
    /// left the inode table, forgets its last map, with a bump (so the next
    /// open, finding no entry, need not bump).
    pub fn forgotten(&self, ino: u64, gone: impl FnOnce() -> bool) {
        let Some(t) = &self.table else { return };
        let mut last = self.shard(ino).lock();
        if last.contains_key(&ino) && gone() {
            last.remove(&ino);
            self.bumped(t, ino);
        }
    }

    /// Inodes with a last map recorded (for tests and stats).
    pub fn tracked(&self) -> usize {
        self.last.iter().map(|s| s.lock().len()).sum()
    }
}

impl Default for MapTokens {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mapfs::{Extent, Growth, Opened};

    fn data(file: &Arc<File>, map: DataMap) -> DataFile {
        DataFile::new(Opened {
            map,
            files: vec![Arc::clone(file)],
            handle: 1,
        })
    }

    fn extent_map(len: u64) -> DataMap {
        DataMap::new(
            vec![Extent {
                logical: 0,
                file: 0,
                offset: 0,
                len,
            }],
            len,
            Growth::ReadOnly,
        )
        .unwrap()
    }

    #[test]
    fn opens_adoptions_and_releases_bump_only_on_change() {
        let t = MapTokens::new();
        let g = t.generations().expect("memfd works here");
        let a = Arc::new(tempfile::tempfile().unwrap());
        let b = Arc::new(tempfile::tempfile().unwrap());
        let tok = |ino| g.token(ino);
        let d = data(&a, DataMap::whole_file());

        // First open: nothing to invalidate; read-only reopens keep the token.
        t.opened(5, &d, false);
        let t0 = tok(5);
        t.opened(5, &d, false);
        t.adopting(5, &DataMap::whole_file(), std::slice::from_ref(&a));
        t.released(5, &d, false);
        assert_eq!(tok(5), t0);

        // A writable open, a writable release: bumps.
        t.opened(5, &d, true);
        assert_eq!(tok(5), t0 + 1);
        t.released(5, &d, true);
        assert_eq!(tok(5), t0 + 2);

        // Same map over another backing file: bumps.
        let db = data(&b, DataMap::whole_file());
        t.opened(5, &db, false);
        assert_eq!(tok(5), t0 + 3);
        // Adopting an open whose map is no longer the last seen: bumps.
        t.adopting(5, &DataMap::whole_file(), std::slice::from_ref(&a));
        assert_eq!(tok(5), t0 + 4);
        // Another map: bumps; a release with yet another final map: bumps.
        t.opened(5, &data(&b, extent_map(10)), false);
        assert_eq!(tok(5), t0 + 5);
        t.released(5, &data(&b, extent_map(20)), false);
        assert_eq!(tok(5), t0 + 6);
        t.opened(5, &data(&b, extent_map(20)), false);
        assert_eq!(tok(5), t0 + 6);

        // Forget: only once gone, then bump and start afresh.
        t.forgotten(5, || false);
        assert_eq!((tok(5), t.tracked()), (t0 + 6, 1));
        t.forgotten(5, || true);
        assert_eq!((tok(5), t.tracked()), (t0 + 7, 0));
        t.forgotten(5, || panic!("not asked for an untracked inode"));
        t.opened(5, &d, false);
        assert_eq!(tok(5), t0 + 7);
    }

    #[test]
    fn without_a_table_nothing_is_tracked() {
        let t = MapTokens::disabled();
        let a = Arc::new(tempfile::tempfile().unwrap());
        t.opened(1, &data(&a, DataMap::whole_file()), true);
        t.bump(1);
        assert!(t.generations().is_none());
        assert_eq!(t.tracked(), 0);
    }
}
