//! The index of every container: per-container locks, the merged-map cache,
//! and the operations that rewrite droppings (truncate, compaction).
//!
//! Locking: one mutex per container (striped by its backing `(dev, ino)`)
//! inside the process, then an `flock` on the container's `.plfs` across
//! processes (daemons and embedded shims sharing a backing directory):
//! exclusive around every dropping write, truncate and compaction, shared
//! around a merge. So a merge never sees a compaction half done, never caches
//! a state older than a write this process already made, and a compaction
//! never removes a dropping being rewritten. Logs of live writers are held
//! with a shared `flock` of their own, which compaction tests before removing
//! a log, wherever the writer runs.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use mapfs::Result;
use parking_lot::{Mutex, MutexGuard};
use tracing::warn;

use super::container::{self, Key};
use super::format::{self, Dropping, Op, Record, INDEX_PREFIX};
use super::merge::{merge, Merged};

/// Number of lock stripes.
const STRIPES: usize = 64;
/// Cache bound in containers; past it the cache is emptied (it only saves
/// merges).
const CACHE_MAX: usize = 4096;
/// Cache bound in index entries (merged extents plus the records of kept
/// droppings, ~40 bytes each in memory: 4 Mi entries is ~160 MiB); past it
/// the cache is emptied before the next entry goes in, and a container whose
/// droppings alone exceed a quarter of it keeps only its merged map.
pub(super) const CACHE_ENTRIES_MAX: usize = 4 << 20;

/// What a merge of one container found.
#[derive(Debug)]
pub(super) struct Loaded {
    /// The merged index.
    pub merged: Merged,
    /// 512-byte blocks of all logs (the file's `st_blocks`; an
    /// approximation: bytes shadowed by later writes still count until a
    /// compaction drops their log).
    pub log_blocks: u64,
    /// Logs whose writer may have died: no dropping of their own, or one
    /// written while still open (see `recover.rs`). Live writers are here
    /// too; an `flock` test tells them apart.
    pub suspects: Vec<String>,
    /// Number of droppings merged.
    pub droppings: usize,
}

/// One container's cache entry.
#[derive(Debug)]
struct Cached {
    validator: Validator,
    /// The directory changed less than [`RACY`] before this merge: a later
    /// change may keep the same timestamps (coarse clocks), so the
    /// validator proves nothing and the next use lists the directory again
    /// (reusing the closed droppings).
    racy: bool,
    loaded: Arc<Loaded>,
    /// Closed droppings by name and inode: never rewritten once closed (a writer's
    /// last dropping is written at its release; bases and truncations get
    /// fresh names), so a name seen again is the same dropping and is not
    /// read again.
    closed: HashMap<(String, u64), Arc<Dropping>>,
    /// Read-only descriptors of the container's logs, kept so that an open
    /// of a file written by many writers does not open every log again
    /// (an open costs a round trip on a distributed store). A log's name is
    /// never reused, and its recorded bytes never change.
    logs: HashMap<String, Arc<File>>,
    /// Blocks of the logs of closed writers (their logs no longer grow), so
    /// that a merge does not stat every log again.
    blocks: HashMap<String, u64>,
    /// Index entries this entry holds (see [`CACHE_ENTRIES_MAX`]).
    entries: usize,
}

/// Log descriptors the cache keeps open at most, over all containers.
const LOG_FDS_MAX: usize = 4096;

/// The container directory's change/modify times: a dropping renamed in or
/// removed changes them, so a cached merge with other times is stale.
pub(super) type Validator = (i64, i64, i64, i64);

/// How long after a directory's last change its timestamps are trusted to
/// tell a later change apart: more than the timestamp granularity of any
/// backing store (kernels stamp with a clock that ticks every few
/// milliseconds, unless multigrain timestamps apply) and than the clock
/// difference between hosts.
const RACY: std::time::Duration = std::time::Duration::from_secs(1);

/// True when a directory whose validator is `v` changed less than [`RACY`]
/// ago (or in the future, by another host's clock).
fn racy(v: Validator) -> bool {
    let changed = |s: i64, ns: i64| i128::from(s) * 1_000_000_000 + i128::from(ns);
    let last = changed(v.0, v.1).max(changed(v.2, v.3));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    now - last < RACY.as_nanos() as i128
}

/// The [`Validator`] of directory `dir` now.
pub(super) fn validator(dir: BorrowedFd<'_>) -> Result<Validator> {
    Ok(key_and_validator(dir)?.1)
}

/// The [`Key`] and [`Validator`] of directory `dir` now, from one `fstat`.
pub(super) fn key_and_validator(dir: BorrowedFd<'_>) -> Result<(Key, Validator)> {
    Ok(key_and_validator_of(&rustix::fs::fstat(dir)?))
}

/// [`key_and_validator`] of a `stat` of the container already taken.
pub(super) fn key_and_validator_of(st: &rustix::fs::Stat) -> (Key, Validator) {
    #[allow(clippy::unnecessary_cast)]
    (
        (st.st_dev, st.st_ino),
        (
            st.st_mtime as i64,
            st.st_mtime_nsec as i64,
            st.st_ctime as i64,
            st.st_ctime_nsec as i64,
        ),
    )
}

/// A container locked for changes (in-process and across processes).
#[derive(Debug)]
pub(super) struct Locked<'a> {
    _stripe: MutexGuard<'a, ()>,
    _flock: container::Flock,
}

/// Locks and cache of all containers.
#[derive(Debug)]
pub(super) struct Store {
    /// This host's id (names the droppings it writes).
    pub host: String,
    stripes: Vec<Mutex<()>>,
    cache: Mutex<CacheMap>,
    /// Droppings read from the backing store so far (measurements).
    reads: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct CacheMap {
    map: HashMap<Key, Cached>,
    entries: usize,
    /// Log descriptors held by all entries.
    fds: usize,
}

impl CacheMap {
    fn remove(&mut self, key: &Key) -> Option<Cached> {
        let c = self.map.remove(key)?;
        self.entries -= c.entries;
        self.fds -= c.logs.len();
        Some(c)
    }

    fn insert(&mut self, key: Key, c: Cached) {
        self.remove(&key);
        if self.map.len() >= CACHE_MAX || self.entries + c.entries > CACHE_ENTRIES_MAX {
            self.map.clear();
            self.entries = 0;
            self.fds = 0;
        }
        self.entries += c.entries;
        self.fds += c.logs.len();
        self.map.insert(key, c);
    }
}

impl Store {
    pub fn new(host: &str) -> Self {
        Store {
            host: host.to_owned(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            cache: Mutex::new(CacheMap::default()),
            reads: Default::default(),
        }
    }

    /// The in-process lock of container `key` (see [`Store::lock`]).
    fn stripe(&self, key: Key) -> MutexGuard<'_, ()> {
        let h = key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key.1;
        self.stripes[(h % STRIPES as u64) as usize].lock()
    }

    /// Locks container `dir` for changing its droppings or logs: the
    /// in-process stripe, then the exclusive cross-process `flock`.
    pub fn lock(&self, dir: BorrowedFd<'_>, key: Key) -> Result<Locked<'_>> {
        let stripe = self.stripe(key);
        let flock = container::lock_identity(dir, true)?;
        Ok(Locked {
            _stripe: stripe,
            _flock: flock,
        })
    }

    /// Forgets the cached merge of `key` (its closed droppings stay cached:
    /// dropping names are unique, so the next merge reuses them).
    pub fn invalidate(&self, key: Key) {
        if let Some(c) = self.cache.lock().map.get_mut(&key) {
            c.validator = (i64::MIN, 0, i64::MIN, 0);
        }
    }

    /// Forgets container `key` once it has been removed: under its stripe,
    /// so a merge of it running meanwhile (which caches only a container
    /// still linked, checked under the stripe) cannot put it back. The
    /// backing file system reuses the inode number at once, and a new
    /// container with the old one's timestamps must not inherit its index.
    pub fn forget(&self, key: Key) {
        let _stripe = self.stripe(key);
        self.cache.lock().remove(&key);
    }

    /// The merged index of container `dir`: from the cache when the
    /// directory is unchanged, else merged under the in-process lock and the
    /// shared `flock` (no compaction or dropping write anywhere meanwhile).
    /// `v` is `dir`'s validator, just taken by the caller.
    pub fn load_seen(&self, dir: BorrowedFd<'_>, key: Key, v: Validator) -> Result<Arc<Loaded>> {
        if let Some(l) = self.cached_as(key, v) {
            return Ok(l);
        }
        let _stripe = self.stripe(key);
        // Removed while we waited for the lock: `ESTALE` (see
        // `lock_identity`), and the name is looked up again.
        let _flock = container::lock_identity(dir, false)?;
        // `v`, taken before the lock, may be older than the listing: the
        // entry is then only invalid sooner, never stale.
        self.merge_now(dir, key, v)
    }

    /// [`Store::load_seen`] for a caller holding [`Store::lock`].
    pub fn load_locked(&self, dir: BorrowedFd<'_>, key: Key) -> Result<Arc<Loaded>> {
        let v = validator(dir)?;
        match self.cached_as(key, v) {
            Some(l) => Ok(l),
            None => self.merge_now(dir, key, v),
        }
    }

    /// The cached merge of `key` if the directory's validator `v` proves
    /// it current.
    fn cached_as(&self, key: Key, v: Validator) -> Option<Arc<Loaded>> {
        match self.cache.lock().map.get(&key) {
            Some(c) if c.validator == v && !c.racy => Some(c.loaded.clone()),
            _ => None,
        }
    }

    /// A read-only descriptor of log `name` of container `dir`, from the
    /// cache when an earlier open opened it (see [`Cached::logs`]).
    pub fn log_file(&self, dir: BorrowedFd<'_>, key: Key, name: &str) -> Result<Arc<File>> {
        if let Some(f) = self
            .cache
            .lock()
            .map
            .get(&key)
            .and_then(|c| c.logs.get(name))
        {
            return Ok(f.clone());
        }
        let f = Arc::new(container::open_file(dir, name, rustix::fs::OFlags::RDONLY)?);
        let mut cache = self.cache.lock();
        if cache.fds < LOG_FDS_MAX {
            if let Some(c) = cache.map.get_mut(&key) {
                if c.logs.insert(name.to_owned(), f.clone()).is_none() {
                    cache.fds += 1;
                }
            }
        }
        Ok(f)
    }

    /// Index entries held by the cache now, and droppings read so far.
    pub fn stats(&self) -> (usize, usize) {
        (
            self.cache.lock().entries,
            self.reads.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Merges container `dir` incrementally: droppings already cached as
    /// closed are not read again, only new or still-open ones. `v` is the
    /// directory's validator taken before the listing (the cache entry's).
    fn merge_now(&self, dir: BorrowedFd<'_>, key: Key, v: Validator) -> Result<Arc<Loaded>> {
        let listing = container::list(dir)?;
        // The previous entry's closed droppings and log descriptors,
        // whatever its validator.
        let (known, mut logs, known_blocks) = self
            .cache
            .lock()
            .remove(&key)
            .map(|c| (c.closed, c.logs, c.blocks))
            .unwrap_or_default();
        logs.retain(|n, _| listing.logs.contains(n));
        let mut closed = HashMap::new();
        let mut ds: Vec<Arc<Dropping>> = Vec::with_capacity(listing.indexes.len());
        let mut names: Vec<&str> = Vec::with_capacity(listing.indexes.len());
        let mut open_ids: HashMap<&str, bool> = HashMap::new();
        let mut read = 0;
        for (n, ino) in listing.indexes.iter().zip(&listing.index_inos) {
            let k = (n.clone(), *ino);
            let d = match known.get(&k) {
                Some(d) => d.clone(),
                None => {
                    read += 1;
                    match container::read_dropping(dir, n) {
                        Ok(Some(d)) => Arc::new(d),
                        Ok(None) => continue,
                        Err(e) => {
                            warn!("plfs: skipping dropping {n}: {e}");
                            continue;
                        }
                    }
                }
            };
            open_ids.insert(&n[INDEX_PREFIX.len()..], d.open);
            if !d.open && k.1 != u64::MAX {
                closed.insert(k, d.clone());
            }
            names.push(n);
            ds.push(d);
        }
        let merged = merge(&ds);
        // A log is suspect when its own dropping says open, or when it has
        // none and no dropping names it (a compaction base that names it
        // replaced its own dropping: it was recorded).
        let named: std::collections::HashSet<&str> =
            merged.logs.iter().map(String::as_str).collect();
        let suspects = listing
            .logs
            .iter()
            .filter(|l| {
                let id = &l[format::LOG_PREFIX.len()..];
                match open_ids.get(id) {
                    Some(open) => *open,
                    None => !named.contains(l.as_str()),
                }
            })
            .cloned()
            .collect::<Vec<String>>();
        let mut blocks = HashMap::new();
        let mut log_blocks = 0;
        for l in &listing.logs {
            let b = match known_blocks.get(l) {
                Some(b) if !suspects.contains(l) => *b,
                _ => container::log_blocks(dir, l),
            };
            log_blocks += b;
            if !suspects.contains(l) {
                blocks.insert(l.clone(), b);
            }
        }
        let records: usize = closed
            .values()
            .map(|d: &Arc<Dropping>| d.records.len())
            .sum();
        if records > CACHE_ENTRIES_MAX / 4 {
            closed.clear();
        }
        let entries = merged.map.extents().len() + if closed.is_empty() { 0 } else { records };
        let loaded = Arc::new(Loaded {
            merged,
            log_blocks,
            suspects,
            droppings: ds.len(),
        });
        self.reads
            .fetch_add(read, std::sync::atomic::Ordering::Relaxed);
        // A removed container is never cached (see `forget`).
        if rustix::fs::fstat(dir)?.st_nlink > 0 {
            self.cache.lock().insert(
                key,
                Cached {
                    validator: v,
                    racy: racy(v),
                    loaded: loaded.clone(),
                    closed,
                    logs,
                    blocks,
                    entries,
                },
            );
        }
        Ok(loaded)
    }

    /// Sets the size of the file in container `dir` to `size` by adding a
    /// dropping that says so; returns its sequence number. The caller holds
    /// the lock.
    pub fn truncate_locked(&self, dir: BorrowedFd<'_>, key: Key, size: u64) -> Result<u64> {
        let cur = self.load_locked(dir, key)?;
        let seq = format::next_seq(cur.merged.max_seq);
        let d = Dropping {
            logs: Vec::new(),
            records: vec![Record {
                seq,
                op: Op::SetSize(size),
            }],
            open: false,
        };
        container::write_dropping(
            dir,
            &format!("{INDEX_PREFIX}{}", format::host_id(&self.host)),
            &d,
        )?;
        self.invalidate(key);
        Ok(seq)
    }

    /// Rewrites all droppings of `dir` as one base dropping and removes the
    /// logs nothing refers to any more, except `live` (logs of opens still
    /// writing: their droppings come later). The caller holds the lock.
    ///
    /// Crash safety: the base is complete and renamed in before anything is
    /// removed, and its sequence number is above every merged record, so a
    /// crash part way leaves old droppings that the base shadows.
    pub fn compact_locked(&self, dir: BorrowedFd<'_>, key: Key, live: &[String]) -> Result<()> {
        let listing = container::list(dir)?;
        let ds = container::read_droppings(dir, &listing.indexes);
        let merged = merge(&ds);
        let refs = merged.referenced_logs();
        let index_of: HashMap<&str, u32> = refs
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, i as u32))
            .collect();
        let seq = format::next_seq(merged.max_seq);
        let mut records: Vec<Record> = merged
            .map
            .extents()
            .iter()
            .map(|e| Record {
                seq,
                op: Op::Data {
                    logical: e.logical,
                    len: e.len,
                    log: index_of[merged.logs[e.file as usize].as_str()],
                    offset: e.offset,
                },
            })
            .collect();
        records.push(Record {
            seq,
            op: Op::SetSize(merged.map.size()),
        });
        let base = Dropping {
            logs: refs.iter().map(|s| s.to_string()).collect(),
            records,
            open: false,
        };
        container::write_dropping(
            dir,
            &format!("{INDEX_PREFIX}{}", format::host_id(&self.host)),
            &base,
        )?;
        // Every dropping writer holds the exclusive lock while its `tmp.*`
        // exists, so the ones seen here are leftovers of a crash.
        for n in listing.indexes.iter().chain(&listing.tmps) {
            container::remove(dir, n)?;
        }
        for n in &listing.logs {
            if !index_of.contains_key(n.as_str()) && !live.contains(n) {
                container::remove_log_if_unused(dir, n)?;
            }
        }
        container::fsync_dir(dir)?;
        self.invalidate(key);
        Ok(())
    }
}
