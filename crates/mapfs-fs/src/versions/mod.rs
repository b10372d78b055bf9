//! `versions`: every change through the mount keeps the old bytes, at the
//! cost of the bytes changed.
//!
//! # Mapping
//!
//! The namespace is the backing directory's, served by an inner
//! [`Passthrough`]. A file that is only read gets its whole-file 1-to-1 map
//! (kernel passthrough and the shim run it natively). A version is taken
//! *before any byte can change*: when an open for writing (or with
//! `O_TRUNC`) is granted, at `truncate`, and when `unlink` or `rename`
//! removes a file. Taking it when the open is granted (not at the first
//! write, which the shim and kernel passthrough never send here) makes the
//! mount, the shim and embedded use produce the same versions. Opens of one
//! file for writing that overlap form one *session* (`session.rs`) and share
//! a version, unless an open finds the file changed since the latest one;
//! a version nothing changed afterwards is dropped. Readers are counted: a
//! writer of a file open for reading gets a whole-file map (executors serve
//! all opens of an inode with kernel passthrough from one backing file).
//!
//! How a version is kept (see `store.rs`):
//! - a reflink of the file (`FICLONE`) where the backing file system shares
//!   extents (xfs, btrfs): no bytes are copied, the writer gets the
//!   whole-file map and writes natively;
//! - a copy, for files up to `max-size`, elsewhere;
//! - above that, an *undo* version (`delta.rs`): the writer's map keeps the
//!   unchanged bytes on the file and sends writes to a log; each close
//!   saves the bytes about to be overwritten and then applies the writes, so
//!   a version costs the bytes changed. Such writers are not whole-file and
//!   run through the daemon (or the shim's map engine);
//! - `unlink` and `rename` over a file keep the file's own inode (a hard
//!   link into the store): no copy at all; so does an `O_TRUNC` open of a
//!   file nothing else has open, whose name then gets a new empty inode
//!   (`replace.rs`).
//!
//! History lives in `BACKING/.mapfs-versions/` (never visible in the mount)
//! and is read through the read-only `/.versions/DIR/NAME@STAMP` entries
//! (`virtual_dir.rs`) or `mapfs versions`. It follows renames. Retention
//! (`retention.rs`) by count per path, age and total bytes runs when a
//! version is made and at `mapfs versions prune`. A mount records an
//! `O_TRUNC` rewrite's version in a log and commits its row (and its
//! retention) in a thread (`pending.rs`, `committer.rs`); another thread
//! removes dropped versions' objects and makes the empty files rewrites
//! take (`upkeep.rs`).
//!
//! # Who decides
//!
//! As in [`Passthrough`]: every namespace operation and every open runs as
//! the caller against the backing kernel; a version is only made after the
//! caller's open (or truncate check) succeeded, so a caller who may not
//! change a file cannot make the daemon spend store space on it. The store
//! is the daemon's (mode 0700); versions are readable in `.versions` by
//! whoever could read the file when it was versioned (its owner, group and
//! mode then).
//!
//! # Limits
//!
//! Changes made behind the mount (directly in the backing directory) are not
//! versioned, and an undo version whose newer content was changed behind the
//! mount reads back wrong. A file removed while open for writing keeps
//! changing in its version (the version is its inode). Empty files make no
//! versions.

mod clone;
mod committer;
pub mod delta;
mod filesystem;
mod pending;
mod replace;
mod restore;
pub mod retention;
mod session;
pub mod stamp;
pub mod store;
mod upkeep;
pub mod virtual_dir;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mapfs::creds::as_caller;
use mapfs::{Attr, Ctx, DataMap, Error, FileKind, FileSystem, OpenFlags, Opened, Result};
use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags};
use tracing::warn;

use crate::passthrough::Passthrough;
use delta::Undo;
pub use retention::Policy;
use session::{stamp_of, Current, Session};
use store::{Added, FileMeta, Store};

/// Settings of a `versions` mount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Largest file copied whole when the backing cannot reflink; larger
    /// ones get undo versions.
    pub max_size: u64,
    /// Retention.
    pub policy: Policy,
    /// No `keep-bytes` was given: the store may hold a tenth of the backing
    /// file system (every resource a writer can make the daemon spend is
    /// bounded).
    pub keep_bytes_auto: bool,
    /// Other processes run instances over the same backing directory at
    /// the same time (embedded mode: every process of the job). Each sees
    /// only its own write sessions, so a writer's version is always whole
    /// (a reflink, else a copy, whatever `max_size`): an undo version keeps
    /// only what its own instance's writers overwrite, and an `O_TRUNC`
    /// that gave the name a new inode would leave another process writing
    /// into the version.
    pub shared: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_size: 64 << 10,
            policy: Policy::default(),
            keep_bytes_auto: true,
            shared: false,
        }
    }
}

impl Config {
    /// The settings given as mount options `max-size`, `keep`, `keep-days`
    /// and `keep-bytes` (`get` answers an option's value); `none` lifts a
    /// retention limit.
    pub fn from_options<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> std::result::Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("max-size") {
            c.max_size = parse_size(v).map_err(|e| format!("max-size: {e}"))?;
        }
        let none = |v: &str| v.trim() == "none";
        if let Some(v) = get("keep") {
            c.policy.keep = if none(v) {
                None
            } else {
                match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        return Err(format!(
                            "keep: {v:?} is not a count of at least 1 (or none)"
                        ))
                    }
                }
            };
        }
        if let Some(v) = get("keep-days") {
            c.policy.keep_days = if none(v) {
                None
            } else {
                match v.trim().parse::<f64>() {
                    Ok(d) if d.is_finite() && d > 0.0 => Some(d),
                    _ => {
                        return Err(format!(
                            "keep-days: {v:?} is not a positive number of days (or none)"
                        ))
                    }
                }
            };
        }
        if let Some(v) = get("keep-bytes") {
            c.keep_bytes_auto = false;
            c.policy.keep_bytes = if none(v) {
                None
            } else {
                Some(parse_size(v).map_err(|e| format!("keep-bytes: {e}"))?)
            };
        }
        Ok(c)
    }
}

/// A size with an optional `K`, `M`, `G` or `T` unit (powers of 1024):
/// [`mapfs::size::parse`], the parser of every mapfs size.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    mapfs::size::parse(s)
}

/// The key of a backing inode.
type Key = (u64, u64);

/// One writable open.
struct Writer {
    key: Key,
    /// An undo session's writer: its map when last settled.
    settled: Option<Arc<Mutex<DataMap>>>,
}

/// The lock file (in the store) one instance holds for its life
/// (`crate::sole`).
pub const LOCK_NAME: &str = "instance.lock";

/// What an instance that holds the store alone does first: replacements
/// left are a dead instance's (`replace.rs`; shared instances make none),
/// versions it recorded but had not committed (`pending.rs`) get their
/// rows, then objects it dropped but had not removed go.
fn take_over(store: &Store, inner: &Passthrough) -> Result<()> {
    store.remove_replacements()?;
    let named = |path: &[u8]| {
        let (dir, name) = inner
            .root()
            .parent(Path::new(std::ffi::OsStr::from_bytes(path)))
            .ok()?;
        let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        #[allow(clippy::unnecessary_cast)]
        Some((st.st_dev as u64, st.st_ino as u64))
    };
    let adopted = store.adopt_pending(&named)?;
    let orphans = store.remove_orphans()?;
    if adopted + orphans > 0 {
        tracing::info!(
            "versions: {adopted} recorded versions committed, {orphans} objects of dropped versions removed"
        );
    }
    Ok(())
}

/// The `versions` file system over one backing directory.
pub struct Versions {
    /// This instance is the only one over the backing directory.
    _sole: crate::sole::Sole,
    inner: Passthrough,
    store: Arc<Store>,
    config: Config,
    sessions: Mutex<HashMap<Key, Session>>,
    writers: Mutex<HashMap<u64, Writer>>,
    /// Opens that are not writers (read-only, and files being created), by
    /// handle, and how many each inode has (see `open_writer`).
    readers: Mutex<HashMap<u64, Key>>,
    opens: Mutex<HashMap<Key, usize>>,
    next_handle: AtomicU64,
}

impl std::fmt::Debug for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Versions")
            .field("config", &self.config)
            .finish()
    }
}

fn erofs() -> Error {
    Error::from_errno(libc::EROFS)
}

fn eperm() -> Error {
    Error::from_errno(libc::EPERM)
}

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

impl Versions {
    /// Opens the backing directory and its store (made if missing).
    pub fn new(backing: &Path, mut config: Config) -> Result<Self> {
        let inner = Passthrough::new(backing)?;
        if config.keep_bytes_auto && config.policy.keep_bytes.is_none() {
            let s = rustix::fs::fstatvfs(inner.root().fd())?;
            config.policy.keep_bytes = Some(s.f_blocks.saturating_mul(s.f_frsize) / 10);
        }
        let store = Arc::new(Store::open(inner.root().fd(), true)?);
        let shown = backing.display().to_string();
        let sole = if !config.shared {
            let sole = crate::sole::take(store.dir(), LOCK_NAME, "versions", &shown)?;
            take_over(&store, &inner)?;
            sole
        } else if store.has_pending()? {
            // A dead daemon's log (shared instances write none): the
            // first process of an embedded job that finds the store free
            // commits it before it shares the store, so its versions are
            // not left unlisted until the next mount.
            match crate::sole::take_first_or_shared(store.dir(), LOCK_NAME, "versions", &shown)? {
                (alone, true) => {
                    take_over(&store, &inner)?;
                    alone.share("versions", &shown)?
                }
                (shared, false) => shared,
            }
        } else {
            crate::sole::take_shared(store.dir(), LOCK_NAME, "versions", &shown)?
        };
        store.save_policy(&config.policy)?;
        store.set_byte_limit(config.policy.keep_bytes);
        if !config.shared {
            store.upkeep_in_background()?;
            store.defer_versions(config.policy)?;
        }
        Ok(Versions {
            _sole: sole,
            inner,
            store,
            config,
            sessions: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        })
    }

    /// The store (for tests and tools in the same process).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Versions being written to (retention leaves them alone).
    fn active(&self) -> Vec<i64> {
        self.sessions
            .lock()
            .values()
            .flat_map(|s| s.versions.iter().copied())
            .collect()
    }

    /// Retention after a version of `path` was made.
    fn retain(&self, path: &Path) {
        if let Err(e) = self
            .store
            .prune_after(bytes(path), &self.config.policy, &self.active())
        {
            warn!("versions: retention failed: {e}");
        }
    }

    /// The daemon's own read-write descriptor of `path`, which must still
    /// be the inode `key` the caller opened.
    fn daemon_open(&self, path: &Path, key: Key) -> Result<File> {
        let fd = self.inner.root().open(
            path,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_dev, st.st_ino) != key {
            return Err(Error::from_errno(libc::EAGAIN).context("file replaced while opening"));
        }
        Ok(File::from(fd))
    }

    /// Takes a version of the file of session `s` as it is now (`meta`):
    /// a reflink, else a copy up to `max-size` (any size unless `undo_ok`),
    /// else an undo version. An empty file gets none.
    fn take_version(
        &self,
        path: &Path,
        s: &mut Session,
        meta: &FileMeta,
        undo_ok: bool,
    ) -> Result<()> {
        s.current = Current::Nothing;
        s.latest = None;
        if meta.size > 0 {
            let copy = !undo_ok || meta.size <= self.config.max_size;
            match self
                .store
                .add_whole(bytes(path), &s.backing, meta, "write", copy)
                .map_err(|e| e.during("a whole version"))?
            {
                // The writer goes ahead without a version.
                Added::Skipped => {}
                Added::Kept(id) => {
                    s.marks.push(self.store.mark_in_use(id)?);
                    s.versions.push(id);
                    s.latest = Some(id);
                    s.current = Current::Whole;
                }
                Added::NotCopied => {
                    let (id, obj) = self
                        .store
                        .add_undo(bytes(path), meta)
                        .map_err(|e| e.during("an undo version"))?;
                    let u = Undo::new(id, bytes(path), meta.size, obj);
                    // Undo writers of the session may write these ranges
                    // in place: what they hold now goes first.
                    u.save(&self.store, &s.backing, s.writable.spans())
                        .map_err(|e| e.during("saving what other writers may change"))?;
                    s.marks.push(self.store.mark_in_use(id)?);
                    s.versions.push(id);
                    s.latest = Some(id);
                    s.undos.push(u.clone());
                    s.current = Current::Undo(u);
                }
            }
        }
        s.stamp = stamp_of(&s.backing)?;
        Ok(())
    }

    /// A writable (or truncating) open of an existing file; `native`: the
    /// executor runs it on the backing file itself (see
    /// [`mapfs::FileSystem::reopen_whole_file`]), so its map must be
    /// whole-file, as when the file has a kernel passthrough reader.
    fn open_writer(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        native: bool,
    ) -> Result<Opened> {
        let trunc = flags.0 & libc::O_TRUNC != 0;
        let mut opened = self
            .inner
            .open(ctx, path, OpenFlags(flags.0 & !libc::O_TRUNC))?;
        let st = rustix::fs::fstat(&*opened.files[0])?;
        if FileKind::from_mode(st.st_mode) != FileKind::File {
            return if trunc {
                self.inner.open(ctx, path, flags)
            } else {
                Ok(opened)
            };
        }
        if trunc && !native && !self.config.shared {
            if let Some((handle, writer)) =
                self.replace_for_truncate(path, &opened.files[0], &st, flags.0)?
            {
                // `opened` holds the old inode, now the version: the writer
                // gets the new, empty one.
                opened.files[0] = Arc::new(writer);
                opened.handle = handle;
                // Retention comes with the version's row (`pending.rs`).
                return Ok(opened);
            }
        }
        let key = (st.st_dev, st.st_ino);
        // Executors hand every open of an inode that has a kernel
        // passthrough open the same backing file: a writer then needs a
        // whole-file map too, so its version cannot be an undo one.
        let readers = native || self.opens.lock().get(&key).is_some_and(|n| *n > 0);
        let (undo, made) = {
            let mut sessions = self.sessions.lock();
            let made = !sessions.contains_key(&key);
            if made {
                let backing = Arc::new(self.daemon_open(path, key)?);
                sessions.insert(key, Session::new(backing)?);
            }
            let s = sessions.get_mut(&key).expect("just made");
            let fresh = made || s.changed()?;
            if fresh {
                let now = FileMeta::of(&*s.backing)?;
                // An O_TRUNC overwrites every byte: an undo version would
                // save them all anyway, so a copy (and a whole-file map,
                // natively written) is cheaper.
                let undo_ok = !readers && s.direct == 0 && !trunc && !self.config.shared;
                self.take_version(path, s, &now, undo_ok)
                    .map_err(|e| e.during("taking a version at a writer's open"))?;
            }
            s.writers += 1;
            let undo = match &s.current {
                Current::Undo(u) if !readers => Some(u.clone()),
                Current::Undo(_) => {
                    // Joins whole-file: every byte is saved first, so its
                    // direct writes cannot lose an old one.
                    s.save_all(&self.store, &[(0, u64::MAX)])
                        .map_err(|e| e.during("saving the file before a whole-file writer"))?;
                    None
                }
                _ => None,
            };
            if undo.is_none() {
                s.direct += 1;
            }
            (undo, fresh)
        };
        if made {
            self.retain(path);
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let mut settled = None;
        if undo.is_some() {
            let backing = self.session_backing(key)?;
            let mut size = backing.metadata()?.len();
            if trunc {
                // O_TRUNC takes effect now, as natively (other opens see an
                // empty file): every byte is overwritten, so all are saved.
                if let Some(s) = self.sessions.lock().get(&key) {
                    s.save_all(&self.store, &[(0, size)])?;
                }
                backing.set_len(0)?;
                size = 0;
            }
            opened.map = delta::writer_map(size, false)?;
            // The same descriptor again: what the map reads as read-only
            // (not saved yet) and what it writes in place (saved).
            opened.files.push(opened.files[0].clone());
            settled = Some(Arc::new(Mutex::new(opened.map.clone())));
        } else if trunc {
            if flags.writable() {
                opened.files[0].set_len(0)?;
            } else {
                opened = self.inner.open(ctx, path, flags)?;
            }
        }
        if trunc {
            // The file changed after its version, whatever its stamp says:
            // a rewrite of the same size within one tick of the clock that
            // stamps files leaves size, mtime and ctime as they were, and a
            // writer joining the session would then take no version of it.
            if let Some(s) = self.sessions.lock().get_mut(&key) {
                s.stamp = session::CHANGED;
            }
        }
        opened.handle = handle;
        self.writers.lock().insert(handle, Writer { key, settled });
        Ok(opened)
    }

    /// Gives a non-writer open a handle and counts it on its inode.
    fn track(&self, opened: &mut Opened) -> Result<()> {
        let st = rustix::fs::fstat(&*opened.files[0])?;
        let key = (st.st_dev, st.st_ino);
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        opened.handle = handle;
        self.readers.lock().insert(handle, key);
        *self.opens.lock().entry(key).or_default() += 1;
        Ok(())
    }

    /// The end of a non-writer open; false if `handle` is not one.
    fn untrack(&self, handle: u64) -> bool {
        let Some(key) = self.readers.lock().remove(&handle) else {
            return false;
        };
        let mut opens = self.opens.lock();
        if let Some(n) = opens.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                opens.remove(&key);
            }
        }
        true
    }

    /// The daemon's descriptor of the file of session `key`.
    fn session_backing(&self, key: Key) -> Result<Arc<File>> {
        self.sessions
            .lock()
            .get(&key)
            .map(|s| s.backing.clone())
            .ok_or_else(|| Error::io().context("write session vanished"))
    }

    /// Settles an undo writer's map into the backing file.
    fn settle(&self, handle: u64, map: &DataMap) -> Result<()> {
        let (key, settled) = match self.writers.lock().get(&handle) {
            Some(Writer {
                key,
                settled: Some(settled),
            }) => (*key, settled.clone()),
            _ => return Ok(()),
        };
        let (undos, backing) = match self.sessions.lock().get(&key) {
            Some(s) => (s.undos.clone(), s.backing.clone()),
            None => return Ok(()),
        };
        let mut settled = settled.lock();
        delta::settle(
            &undos,
            &self.store,
            &settled,
            map,
            &[backing.clone(), backing],
        )?;
        *settled = map.clone();
        Ok(())
    }

    /// Makes room for an undo writer's write at `offset..offset+len`: the
    /// bytes there (a whole [`delta::GRANULE`] around them) are saved into
    /// every undo version of the session, then the writer's map may write
    /// them in place.
    fn remap_writer(&self, handle: u64, map: &DataMap, offset: u64, len: u64) -> Result<Opened> {
        let key = match self.writers.lock().get(&handle) {
            Some(Writer {
                key,
                settled: Some(_),
            }) => *key,
            _ => return Err(Error::from_errno(libc::ENOSPC).context("not an undo writer")),
        };
        let (start, end) = delta::granted(offset, len);
        {
            // Held while saving: a version taken meanwhile by a joining
            // writer must find these bytes saved or not yet writable.
            let mut sessions = self.sessions.lock();
            let s = sessions
                .get_mut(&key)
                .ok_or_else(|| Error::io().context("write session vanished"))?;
            s.save_all(&self.store, &[(start, end)])?;
            s.writable.insert(start, end);
        }
        let mut map = map.clone();
        map.unguard(start, end);
        Ok(Opened {
            map,
            files: Vec::new(),
            handle,
        })
    }

    /// The end of a writable open; the last one ends the session and drops
    /// its version if the file did not change.
    fn end_writer(&self, handle: u64, map: &DataMap) -> Result<()> {
        let res = self.settle(handle, map);
        let Some(w) = self.writers.lock().remove(&handle) else {
            return res;
        };
        let mut sessions = self.sessions.lock();
        let Some(s) = sessions.get_mut(&w.key) else {
            return res;
        };
        s.writers -= 1;
        if w.settled.is_none() {
            s.direct -= 1;
        }
        if s.writers > 0 {
            return res;
        }
        let s = sessions.remove(&w.key).expect("present");
        drop(sessions);
        if let Some(id) = s.latest {
            if res.is_ok() && !s.changed()? {
                self.store.delete_ids(&[id])?;
            }
        }
        res
    }

    /// Keeps the file at `path` (if a non-empty regular file with one name)
    /// as a terminal version by linking its inode into the store. Returns
    /// the version to drop if the operation then fails.
    fn keep_removed(&self, path: &Path, reason: &str) -> Result<Option<i64>> {
        let Ok((dir, name)) = self.inner.root().parent(path) else {
            return Ok(None);
        };
        let Ok(st) = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            return Ok(None);
        };
        if FileKind::from_mode(st.st_mode) != FileKind::File || st.st_size == 0 {
            return Ok(None);
        }
        let meta = FileMeta::from_stat(&st);
        if st.st_nlink == 1 {
            // Kept, its blocks are not freed: the byte limit holds for them
            // as for a copy.
            let held = st.st_blocks as u64 * 512;
            if !self.store.fits(held)? {
                self.store.skip(bytes(path), held, None)?;
                return Ok(None);
            }
            return self
                .store
                .add_linked(
                    bytes(path),
                    dir.as_fd_borrowed(),
                    &name,
                    &meta,
                    reason,
                    true,
                )
                .map(Some);
        }
        // Other names keep the inode changing: keep a copy of the bytes.
        let f = self.daemon_open(path, (st.st_dev, st.st_ino))?;
        Ok(
            match self.store.add_whole(bytes(path), &f, &meta, reason, true)? {
                Added::Kept(id) => Some(id),
                Added::NotCopied | Added::Skipped => None,
            },
        )
    }

    /// Versions a file about to be truncated to `size` (not open here).
    fn before_truncate(&self, ctx: &Ctx, path: &Path, size: u64) -> Result<()> {
        // The caller must be allowed to truncate before anything is kept.
        let check = as_caller(ctx, || {
            self.inner.root().open(
                path,
                OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                Mode::empty(),
            )
        })?;
        let st = rustix::fs::fstat(&check)?;
        let key = (st.st_dev, st.st_ino);
        if FileKind::from_mode(st.st_mode) != FileKind::File
            || st.st_size == 0
            || st.st_size as u64 == size
            || self.sessions.lock().contains_key(&key)
        {
            return Ok(());
        }
        let meta = FileMeta::of(&check)?;
        let f = self.daemon_open(path, key)?;
        let copy = meta.size <= self.config.max_size;
        if self
            .store
            .add_whole(bytes(path), &f, &meta, "truncate", copy)?
            == Added::NotCopied
        {
            // Undo of a truncate: the cut tail, if any.
            let (id, obj) = self.store.add_undo(bytes(path), &meta)?;
            let undo = Undo::new(id, bytes(path), meta.size, obj);
            let prev = delta::writer_map(meta.size, false)?;
            let mut map = prev.clone();
            map.truncate(size);
            let f = Arc::new(f);
            delta::settle(&[undo], &self.store, &prev, &map, &[f.clone(), f])?;
        }
        self.retain(path);
        Ok(())
    }

    fn virtual_open(&self, ctx: &Ctx, rest: &[u8], flags: OpenFlags) -> Result<Opened> {
        if flags.writable() || flags.0 & libc::O_TRUNC != 0 {
            return Err(erofs());
        }
        let v = virtual_dir::version_at(&self.store, rest)?.ok_or_else(Error::not_found)?;
        let sight = virtual_dir::Sight::new(ctx, self.inner.root());
        if !sight.reaches(&v) {
            return Err(Error::not_found());
        }
        if !virtual_dir::may_read(ctx, &v) {
            return Err(Error::from_errno(libc::EACCES));
        }
        let f = self.store.contents(&v)?;
        Ok(Opened {
            map: DataMap::whole_file(),
            files: vec![Arc::new(f)],
            handle: 0,
        })
    }

    fn root_attr(&self, ctx: &Ctx) -> Result<Attr> {
        self.inner.getattr(ctx, Path::new("/"))
    }
}

/// Borrowing an owned directory fd.
trait AsFdBorrowed {
    fn as_fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_>;
}

impl AsFdBorrowed for std::os::fd::OwnedFd {
    fn as_fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}
