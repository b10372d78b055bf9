//! Opening and creating files, and persisting what opens wrote (`flush`,
//! `release`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mapfs::backing::openat2_beneath;
use mapfs::creds::as_caller;
use mapfs::{
    Attr, Ctx, DataMap, Error, Extent, FileSystem as _, Growth, OpenFlags, Opened, Result,
};
use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags, Stat};
use tracing::warn;

use super::container::{self, Key};
use super::delta::{delta, Content, Delta, SizeRule};
use super::format::{self, Dropping, Op, Record, IDENTITY, INDEX_PREFIX, LOG_PREFIX};
use super::recover;
use super::store::Loaded;
use super::{Handle, Logs, Node, Plfs, Writer, COMPACT_AFTER};

/// The `.plfs` open that checks the caller's access: the access mode asked
/// and `O_TRUNC` (which needs write permission), nothing that could block or
/// follow a symlink.
fn check_flags(flags: OpenFlags) -> OFlags {
    let f = flags.0 & (libc::O_ACCMODE | libc::O_TRUNC);
    OFlags::from_bits_retain(f as u32) | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC
}

/// The dropping of a delta: `names[i]` is the log of backing file `i`.
fn dropping_of(d: &Delta, names: &[String]) -> Dropping {
    let mut logs: Vec<String> = Vec::new();
    let mut idx: HashMap<u32, u32> = HashMap::new();
    let mut records: Vec<Record> = d
        .pieces
        .iter()
        .map(|p| {
            let op = match p.content {
                Content::Hole => Op::Hole {
                    logical: p.start,
                    len: p.len,
                },
                Content::Data { file, offset } => {
                    let log = *idx.entry(file).or_insert_with(|| {
                        logs.push(names[file as usize].clone());
                        (logs.len() - 1) as u32
                    });
                    Op::Data {
                        logical: p.start,
                        len: p.len,
                        log,
                        offset,
                    }
                }
            };
            Record { seq: p.seq, op }
        })
        .collect();
    if let Some((rule, seq)) = d.size {
        let op = match rule {
            SizeRule::Set(s) => Op::SetSize(s),
            SizeRule::GrowTo(s) => Op::GrowTo(s),
        };
        records.push(Record { seq, op });
    }
    Dropping {
        logs,
        records,
        open: false,
    }
}

/// `.plfs`'s mtime (seconds, nanoseconds); `ENOENT` once unlinked.
#[allow(clippy::unnecessary_cast)]
fn identity_mtime(dir: &OwnedFd) -> Result<(i64, i64)> {
    match rustix::fs::statat(dir, IDENTITY, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok((st.st_mtime as i64, st.st_mtime_nsec as i64)),
        // Unlinked while open: nothing to keep up to date.
        Err(rustix::io::Errno::NOENT) => Ok((0, 0)),
        Err(e) => Err(e.into()),
    }
}

/// How many times a create without `O_EXCL` tries again when the name it
/// found taken is gone when opened (see `do_create`).
const CREATE_TRIES: u64 = 20;

impl Plfs {
    /// Opens `path`; a file removed or replaced between its lookup and its
    /// open (`ESTALE`) is looked up again, as the kernel would have found
    /// whatever the name held.
    pub(super) fn do_open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        super::retry_stale(|| self.open_once(ctx, path, flags))
    }

    fn open_once(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        let dir = as_caller(ctx, || {
            if super::is_root(path) {
                return Ok(None);
            }
            // The identity's open below proves the file is still there:
            // the name need not be looked at again (see `Plfs::walk`).
            match self.walk(path, false)?.node {
                Node::File(dir) => {
                    match openat2_beneath(
                        dir.as_fd(),
                        IDENTITY.as_ref(),
                        check_flags(flags),
                        Mode::empty(),
                    ) {
                        Ok(_) => Ok(Some(dir)),
                        // Removed since the lookup.
                        Err(rustix::io::Errno::NOENT) => Err(Error::from_errno(libc::ESTALE)),
                        Err(e) => Err(e.into()),
                    }
                }
                _ => Ok(None),
            }
        })?;
        match dir {
            Some(dir) => self.open_file(dir, flags),
            None => self.pt.open(ctx, path, flags),
        }
    }

    /// Creates the container of a new file at `path` (identity created as
    /// the caller with `mode`), atomically: built under a hidden name, then
    /// renamed into place unless the name exists (`EEXIST`). On a store
    /// without `RENAME_NOREPLACE` it is made in place instead
    /// ([`Plfs::make_file_in_place`]). Returns the container and the new
    /// identity's `stat`.
    pub(super) fn make_file(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<(OwnedFd, Stat)> {
        if self.noreplace.load(Ordering::Relaxed) == super::NOREPLACE_NO {
            return self.make_file_in_place(ctx, path, mode);
        }
        let (parent, tmp, res) = as_caller(ctx, || {
            let (parent, name) = self.parent_for_new(path)?;
            let tmp = container::new_name();
            // A container is not a subdirectory: the count stays.
            let res = self.counts.change(parent.as_fd(), 0, || {
                rustix::fs::mkdirat(&parent, tmp.as_str(), Mode::from_raw_mode(0o711))?;
                Ok((|| -> Result<Option<(OwnedFd, Stat)>> {
                    let dir = container::open_dir(parent.as_fd(), tmp.as_ref())?;
                    let id = make_identity(dir.as_fd(), mode)?;
                    // The attributes of the new file, taken before anyone
                    // else can reach it (the rename below publishes it).
                    let st = rustix::fs::fstat(&id)?;
                    if !self.put_in_place(parent.as_fd(), tmp.as_ref(), &name)? {
                        return Ok(None);
                    }
                    Ok(Some((dir, st)))
                })())
            })?;
            Ok((parent, tmp, res))
        })?;
        if !matches!(res, Ok(Some(_))) {
            if let Err(e) = container::remove_tree(parent.as_fd(), tmp.as_ref()) {
                warn!("plfs: cannot remove half-created {tmp}: {e}");
            }
        }
        match res? {
            Some(made) => Ok(made),
            // The store has no RENAME_NOREPLACE (found out just now).
            None => self.make_file_in_place(ctx, path, mode),
        }
    }

    /// Renames the new container `tmp` to `name` with `RENAME_NOREPLACE`,
    /// which refuses a taken name (`EEXIST`); false when the store has no
    /// such rename (then nothing was renamed).
    fn put_in_place(&self, parent: BorrowedFd<'_>, tmp: &OsStr, name: &OsStr) -> Result<bool> {
        match rustix::fs::renameat_with(
            parent,
            tmp,
            parent,
            name,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => {
                self.noreplace
                    .store(super::NOREPLACE_YES, Ordering::Relaxed);
                Ok(true)
            }
            Err(rustix::io::Errno::INVAL) => {
                self.noreplace.store(super::NOREPLACE_NO, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`Plfs::make_file`] on a store without `RENAME_NOREPLACE` (GlusterFS's
    /// client): no directory is renamed there. A plain rename cannot refuse
    /// a taken name, and Gluster's distributed rename of a directory, raced
    /// by another host's lookup of the new name, left a directory without
    /// its identity under the name (every creator of one round failed with
    /// `EISDIR` or `EIO`, in about 1 CI run in 12). Instead the creators of
    /// one name take turns through a claim file ([`container::Claim`]), and
    /// the one whose `mkdir` of the name succeeds makes the identity inside
    /// it before giving the turn up. A lookup that finds a directory
    /// without identity while its claim exists waits for it
    /// ([`Plfs::made_meanwhile`]).
    fn make_file_in_place(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<(OwnedFd, Stat)> {
        as_caller(ctx, || {
            let (parent, name) = self.parent_for_new(path)?;
            self.counts.change(parent.as_fd(), 0, || {
                let _claim = container::Claim::take(parent.as_fd(), &name)?;
                rustix::fs::mkdirat(&parent, name.as_os_str(), Mode::from_raw_mode(0o711))?;
                let res = (|| -> Result<(OwnedFd, Stat)> {
                    let dir = container::open_dir(parent.as_fd(), &name)?;
                    let id = make_identity(dir.as_fd(), mode)?;
                    let st = rustix::fs::fstat(&id)?;
                    Ok((dir, st))
                })();
                if res.is_err() {
                    // The directory is this creator's: made under its claim.
                    if let Err(e) = container::remove_tree(parent.as_fd(), &name) {
                        warn!(
                            "plfs: cannot remove half-created {}: {e}",
                            name.to_string_lossy()
                        );
                    }
                }
                res
            })
        })
    }

    /// True when `dir`, found at `name` in `parent` without an identity, is
    /// a container being made in place (its claim exists), once its identity
    /// shows; waits up to [`IN_FLIGHT`] for that.
    pub(super) fn made_meanwhile(
        &self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        dir: BorrowedFd<'_>,
    ) -> bool {
        // Only stores without RENAME_NOREPLACE make containers in place (a
        // daemon that has made none yet does not know which this is).
        if self.noreplace.load(Ordering::Relaxed) == super::NOREPLACE_YES {
            return false;
        }
        // The caller found no identity: without a claim, a real directory
        // (one `stat` here); with one, the identity may come, or have come
        // just before the claim went.
        let start = std::time::Instant::now();
        let mut waited = false;
        while container::claimed(parent, name) && start.elapsed() < IN_FLIGHT {
            std::thread::sleep(std::time::Duration::from_millis(5));
            waited = true;
            if container::is_container(dir) {
                return true;
            }
        }
        waited && container::is_container(dir)
    }

    pub(super) fn do_create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        // O_CREAT without O_EXCL never fails with ENOENT: a name that exists
        // when the container is put in place but not when it is opened was
        // removed in between (or, on a distributed store such as Gluster,
        // is still being renamed into place by another host), so try again.
        let mut tries = 0;
        loop {
            match self.make_file(ctx, path, mode) {
                Ok((dir, id)) => {
                    // A new file is empty: no truncation, and its creator may
                    // open it whatever its mode says (as open(2) with O_CREAT).
                    let flags = OpenFlags(flags.0 & !libc::O_TRUNC);
                    return self.open_new(dir, &id, flags);
                }
                Err(e) if e.errno() == libc::EEXIST && flags.0 & libc::O_EXCL == 0 => {
                    let gone = match self.do_open(ctx, path, flags) {
                        Ok(opened) => match self.getattr_opened(ctx, path) {
                            Ok(attr) => return Ok((attr, opened)),
                            // Removed since it was opened: this open is of
                            // a file no name leads to; create the name.
                            Err(e) if e.errno() == libc::ENOENT => {
                                let _ = self.do_release(opened.handle, &opened.map);
                                e
                            }
                            Err(e) => {
                                let _ = self.do_release(opened.handle, &opened.map);
                                return Err(e);
                            }
                        },
                        // ENOENT: removed since. EISDIR: a directory where
                        // the kernel found no name before sending the create
                        // is another creator's container without its
                        // identity yet (past the wait of `made_meanwhile`,
                        // or seen late by this host of a distributed store):
                        // look again. Only a race gets here, never a lasting
                        // directory.
                        Err(e) if matches!(e.errno(), libc::ENOENT | libc::EISDIR) => e,
                        Err(e) => return Err(e),
                    };
                    if tries == CREATE_TRIES {
                        return Err(gone);
                    }
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(tries));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens the file this process has just created in container `dir`
    /// (`id`: its identity's `stat` at creation). It is empty, with nothing
    /// to merge, recover or compact: the open is what it was at creation,
    /// with no lock taken and no listing (a writer that raced in after the
    /// rename is ordered after this open, as by close-to-open).
    fn open_new(&self, dir: OwnedFd, id: &Stat, flags: OpenFlags) -> Result<(Attr, Opened)> {
        let key = container::key_of(dir.as_fd())?;
        let attr = self.attr_of(&dir, id, 0, 0)?;
        let map = DataMap::new(Vec::new(), 0, Growth::ReadOnly)?;
        #[allow(clippy::unnecessary_cast)]
        let mtime = (id.st_mtime as i64, id.st_mtime_nsec as i64);
        let w = flags
            .writable()
            .then(|| self.writer(Vec::new(), Vec::new(), &map, 0, mtime));
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .insert(handle, Arc::new(Handle { dir, key, w }));
        let opened = Opened {
            map,
            files: Vec::new(),
            handle,
        };
        Ok((attr, opened))
    }

    /// What a writable open keeps, given the backing files and their log
    /// names, its map and the highest sequence number merged at open.
    fn writer(
        &self,
        files: Vec<Arc<File>>,
        names: Vec<String>,
        map: &DataMap,
        floor: u64,
        mtime: (i64, i64),
    ) -> Writer {
        Writer {
            id: format::host_id(&self.store.host),
            files,
            logs: Mutex::new(Logs { names, own: None }),
            open_map: map.clone(),
            floor,
            recorded: Mutex::new(Delta::default()),
            epochs: Mutex::new(Vec::new()),
            dropping_open: AtomicBool::new(false),
            mtime: Mutex::new(mtime),
        }
    }

    /// Gives writable open `handle` its log at its first write (`map`: its
    /// map now, which cannot place writes): the log is created and held
    /// under the container's lock, so a recovery never takes it for a dead
    /// writer's, and the map appends to it from now on. A file unlinked
    /// since the open has no container to hold a log: its bytes, which no
    /// name leads to, go to an unnamed temporary file.
    pub(super) fn do_remap(&self, handle: u64, map: &DataMap) -> Result<Opened> {
        let h = self.handles.lock().get(&handle).cloned();
        let Some(h) = h else {
            return Err(Error::from_errno(libc::EBADF));
        };
        let Some(w) = &h.w else {
            return Err(Error::from_errno(libc::EBADF).context("plfs open is read-only"));
        };
        if map.growth() != Growth::ReadOnly {
            return Err(Error::from_errno(libc::ENOSPC)
                .context("plfs: a map appending to its log needs no remap"));
        }
        let name = format!("{LOG_PREFIX}{}", w.id);
        // The container's lock before the open's (`mark_epoch` takes them
        // in that order).
        let log = match self.store.lock(h.dir.as_fd(), h.key) {
            Ok(_g) => w.own_log(&name, || {
                let log = container::open_file(
                    h.dir.as_fd(),
                    &name,
                    OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
                )?;
                container::hold_log(&log)?;
                Ok(log)
            })?,
            Err(e) if e.errno() == libc::ESTALE => w.own_log(&name, || self.unnamed_log())?,
            Err(e) => return Err(e),
        };
        let mut files = w.files.clone();
        files.push(log);
        let growth = Growth::AppendLog {
            file: (files.len() - 1) as u32,
            end: 0,
        };
        let map = DataMap::new(map.extents().to_vec(), map.size(), growth)?;
        Ok(Opened { map, files, handle })
    }

    /// A log for an unlinked file: a temporary file of the backing store
    /// that has no name, else a memory file.
    fn unnamed_log(&self) -> Result<File> {
        let tmp = rustix::fs::openat(
            self.root().fd(),
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        );
        let fd = match tmp {
            Ok(fd) => fd,
            Err(_) => rustix::fs::memfd_create("mapfs-plfs-log", rustix::fs::MemfdFlags::CLOEXEC)?,
        };
        Ok(File::from(fd))
    }

    fn getattr_opened(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        mapfs::FileSystem::getattr(self, ctx, path)
    }

    /// The map and files of the file in container `dir`; the open is
    /// registered for `flush`/`release` (and a writable one for the
    /// `remap` that gives it its log).
    fn open_file(&self, dir: OwnedFd, flags: OpenFlags) -> Result<Opened> {
        let key = container::key_of(dir.as_fd())?;
        if flags.0 & libc::O_TRUNC != 0 {
            self.truncate_file(&dir, 0)?;
        }
        // Under the lock until registered: a compaction must neither remove
        // a log between the merge and its open here, nor miss this open's
        // new log.
        // Removed while we waited for the lock: `ESTALE` (see
        // `lock_identity`), and the name is looked up again.
        let guard = self.store.lock(dir.as_fd(), key)?;
        let loaded = self.recover_and_load(dir.as_fd(), key)?;
        let merged = &loaded.merged;
        let mut files = Vec::new();
        let mut names = Vec::new();
        // Merged log index -> Opened::files index (None: log missing).
        let mut slot: HashMap<u32, Option<u32>> = HashMap::new();
        let mut extents = Vec::with_capacity(merged.map.extents().len());
        for e in merged.map.extents() {
            let s = match slot.get(&e.file) {
                Some(s) => *s,
                None => {
                    let name = &merged.logs[e.file as usize];
                    let s = match self.store.log_file(dir.as_fd(), key, name) {
                        Ok(f) => {
                            files.push(f);
                            names.push(name.clone());
                            Some((files.len() - 1) as u32)
                        }
                        Err(err) if err.errno() == libc::ENOENT => {
                            warn!("plfs: log {name} is missing; its bytes read as zeros");
                            None
                        }
                        Err(err) => return Err(err),
                    };
                    slot.insert(e.file, s);
                    s
                }
            };
            if let Some(file) = s {
                extents.push(Extent { file, ..*e });
            }
        }
        let map = DataMap::new(extents, merged.map.size(), Growth::ReadOnly)?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let w = if flags.writable() {
            let mtime = identity_mtime(&dir)?;
            Some(self.writer(files.clone(), names, &map, merged.max_seq, mtime))
        } else {
            None
        };
        self.handles
            .lock()
            .insert(handle, Arc::new(Handle { dir, key, w }));
        drop(guard);
        Ok(Opened { map, files, handle })
    }

    /// The merge of container `dir` for an open, after recovering the logs
    /// of writers that died (see `recover.rs`) and, when the droppings grew
    /// past [`COMPACT_AFTER`] and no writer is left anywhere, compacting them
    /// (so the next open on every host reads one). The caller holds the lock.
    fn recover_and_load(&self, dir: BorrowedFd<'_>, key: Key) -> Result<Arc<Loaded>> {
        let mut loaded = self.store.load_locked(dir, key)?;
        let live = self.live_logs(key);
        if loaded.suspects.iter().any(|l| !live.contains(l)) {
            let done = recover::recover_locked(dir, &loaded.merged, &loaded.suspects, &live)?;
            if !done.is_empty() {
                self.store.invalidate(key);
                loaded = self.store.load_locked(dir, key)?;
            }
        }
        if loaded.droppings > COMPACT_AFTER && loaded.suspects.is_empty() && live.is_empty() {
            self.store.compact_locked(dir, key, &[])?;
            loaded = self.store.load_locked(dir, key)?;
        }
        Ok(loaded)
    }

    /// Rewrites the dropping of open `h` for its current map `map`; at the
    /// release (`closing`) it is marked closed, else open (so the log of a
    /// writer that dies after this is recognised and recovered).
    pub(super) fn persist(&self, h: &Handle, map: &DataMap, closing: bool) -> Result<()> {
        let Some(w) = &h.w else {
            return Ok(());
        };
        if *map == w.open_map
            && !w.dropping_open.load(Ordering::Relaxed)
            && *w.recorded.lock() == Delta::default()
        {
            // Unchanged since open and nothing recorded: the delta is empty,
            // so there is nothing to write, and no need for the lock.
            return Ok(());
        }
        let _g = match self.store.lock(h.dir.as_fd(), h.key) {
            // Unlinked (or replaced by a rename) since open: nothing to keep.
            Err(e) if e.errno() == libc::ESTALE => return Ok(()),
            r => r?,
        };
        let mut rec = w.recorded.lock();
        let seq = format::next_seq(w.floor);
        let logs = w.logs.lock();
        let own = logs.own_index();
        let d = delta(&w.open_map, map, &rec, own, &w.epochs.lock(), seq);
        let changed = d != *rec;
        let mark_closed = closing && w.dropping_open.load(Ordering::Relaxed);
        if !changed && !mark_closed {
            return Ok(());
        }
        // No sync of the log here: at fsync(2) the executor has synced the
        // backing files (the engine's fsync) before calling flush; at a plain
        // close nothing needs to be durable, and after a crash a dropping
        // naming log bytes that never reached the disk reads them as zeros
        // (a log is a new file: its unwritten blocks are unallocated, never
        // stale data).
        let name = format!("{INDEX_PREFIX}{}", w.id);
        let mut dropping = dropping_of(&d, &logs.names);
        drop(logs);
        dropping.open = !closing;
        match container::write_dropping(h.dir.as_fd(), &name, &dropping) {
            // Unlinked (or replaced by a rename) since open: nothing to keep.
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            r => r?,
        }
        // A truncate through this open is an event for the other writers.
        if let Some((SizeRule::Set(_), s)) = d.size {
            if s == seq {
                self.mark_epoch(h.key, seq, Some(&w.id));
            }
        }
        w.dropping_open.store(!closing, Ordering::Relaxed);
        *rec = d;
        drop(rec);
        self.store.invalidate(h.key);
        if !changed {
            // Only marked closed: the data did not change.
            return Ok(());
        }
        // The data changed: mtime is now, unless someone set the times
        // explicitly since this open last looked.
        let mut seen = w.mtime.lock();
        let cur = identity_mtime(&h.dir)?;
        if cur == *seen {
            if let Err(e) = container::touch_mtime(h.dir.as_fd()) {
                warn!("plfs: cannot set mtime: {e}");
            }
            *seen = identity_mtime(&h.dir)?;
        } else {
            *seen = cur;
        }
        Ok(())
    }

    pub(super) fn do_release(&self, handle: u64, map: &DataMap) -> Result<()> {
        let h = self.handles.lock().get(&handle).cloned();
        let Some(h) = h else {
            return Ok(());
        };
        let res = self.persist(&h, map, true);
        self.handles.lock().remove(&handle);
        let Some(w) = &h.w else {
            return Ok(());
        };
        let (own, log) = {
            let logs = w.logs.lock();
            (logs.own_index(), logs.own.clone())
        };
        let Some(log) = log else {
            // Never written: it made no log. A dropping it wrote (a size
            // change) leaves the container to compact; else nothing changed
            // here, and a compaction a writer held back waits for the next
            // open or writing release.
            res?;
            if *w.recorded.lock() == Delta::default() {
                return Ok(());
            }
            return self.maybe_compact(&h.dir, h.key);
        };
        // The end of the last byte of this open's log a record names: bytes
        // past it were written but never recorded (a writer killed between
        // flushes, whose open the executor released with its last map).
        let recorded_end = w
            .recorded
            .lock()
            .pieces
            .iter()
            .filter_map(|p| match p.content {
                Content::Data { file, offset } if file == own => Some(offset + p.len),
                _ => None,
            })
            .max();
        if let Some(end) = recorded_end {
            if log.metadata().is_ok_and(|m| m.len() > end) {
                if let Err(e) = log.set_len(end) {
                    warn!("plfs: cannot cut the unrecorded end of log {}: {e}", w.id);
                }
            }
        } else {
            let name = format!("{LOG_PREFIX}{}", w.id);
            let removed = self
                .store
                .lock(h.dir.as_fd(), h.key)
                .and_then(|_g| container::remove(h.dir.as_fd(), &name));
            match removed {
                Ok(()) => {}
                // Unlinked meanwhile: the log went with the container.
                Err(e) if matches!(e.errno(), libc::ENOENT | libc::ESTALE) => {}
                Err(e) => warn!("plfs: cannot remove unused log {name}: {e}"),
            }
        }
        res?;
        self.maybe_compact(&h.dir, h.key)
    }

    /// Compacts container `dir` when it collected many droppings and no open
    /// of this process writes it any more.
    fn maybe_compact(&self, dir: &OwnedFd, key: Key) -> Result<()> {
        let _g = match self.store.lock(dir.as_fd(), key) {
            Err(e) if e.errno() == libc::ESTALE => return Ok(()),
            r => r?,
        };
        if !self.live_logs(key).is_empty() {
            return Ok(());
        }
        // Counting names is enough to decide; merging (reading every
        // dropping) only when compacting.
        let droppings = match container::list(dir.as_fd()) {
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            r => r?.indexes.len(),
        };
        if droppings <= COMPACT_AFTER {
            return Ok(());
        }
        match self.store.compact_locked(dir.as_fd(), key, &[]) {
            Err(e) if e.errno() == libc::ENOENT => Ok(()),
            r => r.map_err(|e: Error| e.context("plfs compaction")),
        }
    }
}

impl Writer {
    /// The open's own log, made by `make` (and named `name` among its
    /// backing files) if it has none yet.
    fn own_log(&self, name: &str, make: impl FnOnce() -> Result<File>) -> Result<Arc<File>> {
        let mut logs = self.logs.lock();
        if let Some(log) = &logs.own {
            return Ok(log.clone());
        }
        let log = Arc::new(make()?);
        logs.names.push(name.to_string());
        logs.own = Some(log.clone());
        Ok(log)
    }
}

/// Longest wait of a lookup for a container being made in place.
const IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(3);

/// Creates the identity file of a new container `dir` (as whoever runs
/// this: the caller), with the file's permission bits.
fn make_identity(dir: BorrowedFd<'_>, mode: u32) -> Result<OwnedFd> {
    Ok(openat2_beneath(
        dir,
        IDENTITY.as_ref(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode & 0o7777),
    )?)
}
