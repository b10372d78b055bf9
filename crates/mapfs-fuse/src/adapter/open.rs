//! The open lifecycle and the choice of executor: what an `OPEN` or
//! `CREATE` turns into (kernel passthrough or the daemon, a share of
//! another open, a placeholder), the setid rule that keeps writers of
//! setuid files off passthrough, how an open's map is persisted (`flush`)
//! and released.

use super::*;

/// How many locks [`Shared::joining`] spreads inodes over.
pub(super) const JOIN_LOCKS: usize = 64;

/// Warnings any user of the mount can cause, each at most once per
/// interval (see [`crate::ratelimit`]).
pub(super) static LENT_IO: RateLimited = RateLimited::new(Duration::from_secs(10));

/// Opens refused with `ESTALE` because the name's file was replaced behind
/// the mount while the kernel ran passthrough opens of the old one.
pub(super) static STALE_OPENS: RateLimited = RateLimited::new(Duration::from_secs(10));

pub(super) static RELEASE_FAILED: RateLimited = RateLimited::new(Duration::from_secs(10));

/// Flags of an open with a whole-file 1-to-1 map, or of a read-only open
/// (`flags`, its access mode and `O_TRUNC` as the application asked): the
/// daemon buffers nothing for it and locks are kept by the kernel, so
/// `close` need not wait for a FLUSH round trip (the kernel still flushes
/// its writeback cache itself). Other opens get a FLUSH at every `close(2)`,
/// where the file system persists the map (close-to-open: the kernel's
/// `release` may come after `close` returned and after another process's
/// `open`). A read-only open never changes the map (the kernel refuses its
/// writes, and a truncate by path that uses it persists at once), so it
/// has nothing to persist.
pub(super) fn file_open_flags(data: &DataFile, flags: i32) -> FopenFlags {
    let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0;
    if data.whole_file_backing().is_some() || read_only {
        FopenFlags::FOPEN_NOFLUSH
    } else {
        FopenFlags::empty()
    }
}

/// Answers an `OPEN` with handle `fh`, run by the kernel on `backing` if
/// there is one.
pub(super) fn answer_opened(
    reply: ReplyOpen,
    fh: u64,
    fopen: FopenFlags,
    backing: Option<&fuser::BackingId>,
) {
    match backing {
        Some(id) => reply.opened_passthrough(FileHandle(fh), fopen, id),
        None => reply.opened(FileHandle(fh), fopen),
    }
}

/// The kernel's open of a file for `execve` (`__FMODE_EXEC` among the open
/// flags FUSE passes on), read-only.
pub(super) fn is_exec_open(flags: i32) -> bool {
    const FMODE_EXEC: i32 = 0x20;
    flags & FMODE_EXEC != 0 && flags & libc::O_ACCMODE == libc::O_RDONLY
}

impl Shared {
    /// The open file of a FUSE handle (`EBADF` for an unknown one).
    /// Opens a *placeholder* of `ino` (an `open(2)` with access mode 3,
    /// neither read nor write, which needs permission for both): the
    /// descriptor a shim client puts under the application's number while
    /// it runs a writable open's map itself. Metadata calls (`fstat`,
    /// `fchmod`, locks, `ioctl`) work on it; reads, writes,
    /// `copy_file_range`, `fallocate`, `ftruncate` and `mmap` fail in the
    /// kernel (`EBADF`/`EACCES`), `lseek` and `pread` with `ESPIPE`
    /// (non-seekable), and `fsync` here with `EIO`: a call the client
    /// cannot see never gets an answer older than the client's writes. The
    /// file system is not asked anything: the handle reads, writes and
    /// proves nothing (the control socket lends only real opens), the kernel
    /// sends `OPEN` only for an inode it holds as a regular file, and it
    /// checked read and write permission for the open (`default_permissions`,
    /// on every mapfs mount). Asking the file system again cost two path
    /// walks per lent writer, tens of round trips on a network store.
    pub(super) fn open_placeholder(&self) -> u64 {
        self.handles.add_placeholder()
    }

    pub(super) fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>> {
        self.handles
            .file(fh.0)
            .ok_or_else(|| Error::from_errno(libc::EBADF))
    }

    /// The open file of a FUSE handle, for a data call through the mount:
    /// `EIO` while a shim client executes it with writes the daemon has not
    /// seen (see [`OpenFile::lent`]). The client's descriptor is then a
    /// placeholder (see [`Shared::open_placeholder`]) on which such calls
    /// fail in the kernel; only the client's own kept open could get here.
    pub(super) fn data_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>> {
        let file = self.open_file(fh)?;
        // A read-only lent open's map cannot change in the client, so the
        // daemon's copy answers as the client would; a writable one's may be
        // older than the client's writes.
        if file.lent.load(Ordering::Acquire) && file.flags & libc::O_ACCMODE != libc::O_RDONLY {
            LENT_IO.log(|held_back| {
                warn!(
                    fh = fh.0,
                    held_back,
                    "I/O through the mount on an open a shim client is executing; refused"
                )
            });
            return Err(Error::from_errno(libc::EIO));
        }
        Ok(file)
    }

    /// Whether a new open of `ino` with this data should use passthrough
    /// (`writes`: the open may write).
    pub(super) fn want_passthrough(
        &self,
        ino: u64,
        path: &Path,
        data: &DataFile,
        writes: bool,
    ) -> bool {
        let Some(backing) = data.whole_file_backing() else {
            return false;
        };
        // The kernel runs all opens of an inode in passthrough or all
        // through the daemon. An open here through the daemon means the
        // kernel holds no passthrough open of it any more: a backing id
        // still alive here belongs to an open closed in the kernel whose
        // release has not arrived yet, and a passthrough reply would fail
        // the open (`EIO`; seen under load: a reader opened right after an
        // undo writer of versions, while the previous reader's release was
        // on its way).
        if self.handles.has_daemon_open(ino) {
            return false;
        }
        // Passthrough writes run with the daemon's credentials, which would
        // not clear setuid/setgid bits; writers of such files go through the
        // daemon, which clears them as FUSE_WRITE_KILL_SUIDGID asks. Even
        // with a backing id alive: it may be a closed open's whose release
        // is on its way (a file written, made setuid and opened by another
        // user at once kept its bits after that user's write). If the kernel
        // does still run an open of the file by passthrough (opened before
        // the mode change), this writer's open fails (`EIO`) rather than
        // leave the bits on.
        // Asked only where the answer depends on it: a reader of an inode
        // with a backing id alive needs no `fstat`.
        // The file's mode is the file system's: a file system that keeps
        // its own modes (pack's database) backs a setuid file with a
        // backing file of the daemon's, 0600 (a write by another user kept
        // pack's bits), so both are asked.
        let setid_bits = libc::S_ISUID | libc::S_ISGID;
        let setid = || match backing.metadata() {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                m.mode() & setid_bits != 0
                    || self
                        .fs
                        .getattr(&ROOT_CTX, path)
                        .map_or(true, |a| u32::from(a.perm) & setid_bits != 0)
            }
            Err(_) => true,
        };
        let live = || self.handles.has_backing(ino);
        let allowed = || self.passthrough_ok.load(Ordering::Relaxed);
        if writes {
            !setid() && (live() || allowed())
        } else {
            live() || (allowed() && !setid())
        }
    }

    pub(super) fn open_flags_for_fs(&self, flags: i32) -> i32 {
        // The daemon's own I/O is buffered: kernel page-cache writeback and
        // unaligned FUSE requests may reach any handle of the inode, and
        // would fail with EINVAL on an O_DIRECT backing fd. (Passthrough opens
        // get the application's flags from the kernel itself.)
        let mut flags = flags & !libc::O_DIRECT;
        if self.writeback.load(Ordering::Relaxed) {
            // With the writeback cache the kernel may read pages of a file
            // opened write-only, and it implements O_APPEND itself.
            if flags & libc::O_ACCMODE == libc::O_WRONLY {
                flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            flags &= !libc::O_APPEND;
        }
        if self.shares_opens() && flags & libc::O_ACCMODE == libc::O_RDONLY {
            // A shared open the file system can write lets the writers that
            // come later join it (the caller's own descriptor stays
            // read-only in the kernel).
            flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
        }
        flags
    }

    /// The [`Shared::joining`] lock of inode `ino`.
    pub(super) fn join_lock(&self, ino: u64) -> &Mutex<()> {
        &self.joining[(ino % JOIN_LOCKS as u64) as usize]
    }

    /// Whether opens of an inode share one open of the file system (see
    /// [`crate::handles::Share`]).
    pub(super) fn shares_opens(&self) -> bool {
        self.opts.share_opens && self.writeback.load(Ordering::Relaxed)
    }

    /// Opens with `flags`, widened from `asked`, or with `asked` where the
    /// widening is refused; returns the flags that opened.
    pub(super) fn open_with_fallback(
        &self,
        flags: i32,
        f: impl Fn(OpenFlags) -> Result<Opened>,
        asked: i32,
    ) -> Result<(Opened, i32)> {
        match f(OpenFlags(flags)) {
            // Widening O_WRONLY to O_RDWR may be refused for a write-only
            // file, and O_RDONLY to O_RDWR (shared opens) for a read-only
            // one.
            Err(e)
                if matches!(e.errno(), libc::EACCES | libc::EPERM | libc::EROFS)
                    && flags != asked =>
            {
                f(OpenFlags(asked)).map(|o| (o, asked))
            }
            r => r.map(|o| (o, flags)),
        }
    }

    /// Answers an open of `ino` by joining the open `owner` shares (see
    /// [`crate::handles::Share`]): no open of the file system; `O_TRUNC`
    /// truncates the shared map.
    pub(super) fn join_open(
        &self,
        req: &Request,
        ino: u64,
        flags: i32,
        owner: &OpenFile,
    ) -> Result<(u64, FopenFlags)> {
        let c = ctx(req);
        if flags & libc::O_TRUNC != 0 {
            // The kernel checked write permission for it.
            self.set_open_size(&c, ino, owner, 0)?;
        }
        let may_change = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        self.tokens.opened(ino, &owner.data, may_change);
        let fopen = file_open_flags(&owner.data, flags);
        let fh = self.handles.add_file(OpenFile::joining(owner, flags, c));
        if let Some(file) = self.handles.file(fh) {
            self.journal_file(&file, req.unique().0);
            self.test_die_before_answer(req, &file.path);
        }
        self.stats.add(Event::DaemonOpen, 1);
        Ok((fh, fopen))
    }

    /// Sets the size of open file `file` of `ino` through the engine, as
    /// `c` (`ftruncate`, `truncate` of an open file, `O_TRUNC`).
    pub(super) fn set_open_size(&self, c: &Ctx, ino: u64, file: &OpenFile, sz: u64) -> Result<()> {
        // Changes of other opens kept by the supervisor must not be
        // written again after this size change (see `crate::failover`).
        self.persist_journaled_of(ino);
        // A file system that records what each open changed (plfs) can
        // tell a shrink from growth only against what it was last
        // handed: hand it the open's writes before they are cut.
        if sz < file.data.size().unwrap_or(0) {
            self.persist_map(file)?;
        }
        let truncated = mapfs::creds::as_caller(c, || file.data.truncate(sz));
        self.tokens.bump(ino);
        truncated?;
        self.changed(file, SizeChange::Set(sz));
        // Other opens of the file see the new size at their next open.
        self.persist_map(file)
    }

    /// Makes the handle of an open that `req` asked for (its caller's
    /// context and `unique` id, recorded for a successor).
    pub(super) fn register_open(
        &self,
        req: &Request,
        ino: u64,
        path: PathBuf,
        flags: i32,
        (opened, fs_flags): (Opened, i32),
        open_backing: impl FnOnce(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> Result<(u64, Option<Arc<fuser::BackingId>>, FopenFlags)> {
        let c = &ctx(req);
        let unique = req.unique().0;
        let fs_handle = opened.handle;
        let data = Arc::new(DataFile::new(opened));
        let mut fopen = file_open_flags(&data, flags);
        let may_change = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        self.tokens.opened(ino, &data, may_change);
        let mut backing = None;
        if self.want_passthrough(ino, &path, &data, may_change) {
            let file = data.whole_file_backing().expect("whole-file map").clone();
            match self.handles.backing_for(ino, &file, || open_backing(&file)) {
                Ok(Some(id)) => backing = Some(id),
                Ok(None) => {
                    // The name now holds another file than the one the
                    // kernel runs this inode's opens on (it was replaced in
                    // the backing directory within the entry TTL). The
                    // kernel takes one backing file per inode, so this open
                    // would read and write the old one. ESTALE makes it
                    // look the name up afresh and retry: the lookup gives
                    // the new file its own inode.
                    let _ = self.fs.release(c, &path, fs_handle, &data.map());
                    STALE_OPENS.log(|held_back| {
                        warn!(
                            path = %path.display(),
                            held_back,
                            "a file replaced behind the mount while open in passthrough; \
                             the open is retried on the new file"
                        )
                    });
                    return Err(Error::from_errno(libc::ESTALE));
                }
                Err(e) => {
                    if self.passthrough_ok.swap(false, Ordering::Relaxed) {
                        warn!(
                            "kernel refused FUSE passthrough ({e}); this mount now runs all \
                             reads and writes in the daemon"
                        );
                    }
                }
            }
        }
        if self.pages.enabled() {
            let file_ino = self.inodes.fs_ino(ino);
            if backing.is_some() {
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    self.pages.written_outside(file_ino);
                }
            } else if !may_change
                && self
                    .pages
                    .open_read_only(file_ino, || self.may_be_written(ino))
            {
                fopen |= FopenFlags::FOPEN_KEEP_CACHE;
            }
        }
        let mut file = OpenFile::new(ino, path, flags, *c, fs_handle, data, backing.clone());
        if self.shares_opens() && backing.is_none() {
            file = file.in_share(Share::new(fs_flags & libc::O_ACCMODE != libc::O_RDONLY));
        }
        let fh = self.handles.add_file(file);
        if let Some(file) = self.handles.file(fh) {
            self.journal_file(&file, unique);
            self.test_die_before_answer(req, &file.path);
        }
        let executor = match backing {
            Some(_) => Event::PassthroughOpen,
            None => Event::DaemonOpen,
        };
        self.stats.add(executor, 1);
        Ok((fh, backing, fopen))
    }

    /// Hands the current map of an open that wrote to the file system
    /// ([`mapfs::FileSystem::flush`]); whole-file maps need nothing.
    pub(super) fn persist_map(&self, file: &OpenFile) -> Result<()> {
        if file.data.whole_file_backing().is_some() {
            return Ok(());
        }
        // An open in a share hands over the share's one map, with what every
        // open in it changed (`file` itself may be out of the table already,
        // at its release); hand-overs of one map go one at a time.
        let _one_map = file.share.as_ref().map(|s| s.persisting.lock());
        let others = self.handles.sharing_with(file);
        let members: Vec<&OpenFile> = std::iter::once(file)
            .chain(others.iter().map(|o| &**o))
            .collect();
        if !members.iter().any(|m| m.wrote.load(Ordering::Relaxed)) {
            return Ok(());
        }
        // One at a time per open, map taken under the lock: a flush from
        // another thread (a forked child closing its inherited descriptor)
        // holding an older map must not land after a newer one.
        let mut held: Vec<_> = members
            .iter()
            .map(|m| (*m, m.persisting.lock(), self.handles.changes(m)))
            .collect();
        self.fs
            .flush(&file.ctx, &file.path, file.fs_handle, &file.data.map())?;
        for (m, logs, changes) in held.iter_mut() {
            self.handles.flushed(m, *changes);
            self.journal_flushed(m, logs);
        }
        Ok(())
    }

    /// Records a change through `file` (see [`Handles::note_change`]).
    pub(super) fn changed(&self, file: &OpenFile, change: SizeChange) {
        file.wrote.store(true, Ordering::Relaxed);
        if file.data.whole_file_backing().is_none() {
            self.handles.note_change(file, change);
        } else if self.handles.written_size(file.ino, 0).is_some() {
            // A remap made this open whole-file (pack moves a growing file
            // to a backing file of its own): the backing file's size rules
            // now, not the changes it noted before.
            self.handles.forget_changes(file);
        }
    }

    pub(super) fn remap_for<'a>(
        &'a self,
        file: &'a OpenFile,
    ) -> impl FnMut(&DataMap, u64, u64) -> Result<Opened> + 'a {
        move |map, off, len| {
            self.fs
                .remap(&file.ctx, &file.path, file.fs_handle, map, off, len)
        }
    }

    /// Clears setuid, and setgid where the kernel would (group-executable,
    /// or the writer is not in the file's group), after a change by
    /// `writer`, who lacks `CAP_FSETID`. The kernel's cached attributes of
    /// `ino` go with them: it keeps the mode for the attributes' TTL after
    /// a write, and `stat` showed the bits a file system that keeps its own
    /// modes (pack) had cleared.
    pub(super) fn kill_suidgid(&self, ino: u64, path: &Path, writer: &Ctx) -> Result<()> {
        let attr = match self.fs.getattr(&ROOT_CTX, path) {
            Ok(a) => a,
            // Unlinked while open: nothing left to protect by name.
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut perm = u32::from(attr.perm);
        let before = perm;
        perm &= !libc::S_ISUID;
        if perm & libc::S_ISGID != 0
            && (perm & libc::S_IXGRP != 0 || !mapfs::creds::in_group(writer, attr.gid))
        {
            perm &= !libc::S_ISGID;
        }
        if perm != before {
            let set = SetAttr {
                mode: Some(perm),
                ..SetAttr::default()
            };
            self.fs.setattr(&ROOT_CTX, path, &set)?;
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
                self.stats.add(Event::Invalidation, 1);
            }
        }
        Ok(())
    }

    /// Ends open `fh` in the daemon and the file system. Returns its inode
    /// and its backing id (kernel passthrough), which the caller drops only
    /// after the journal says the open is released (the `release` request
    /// below): the last drop closes the id with the kernel, and a successor
    /// must never restore an open whose id the kernel no longer has.
    pub(super) fn release_file(&self, fh: u64) -> Result<(u64, Option<Arc<fuser::BackingId>>)> {
        let Some(file) = self.handles.remove_file(fh) else {
            return Err(Error::from_errno(libc::EBADF));
        };
        // A client that vanished without ending its lending.
        self.handles.lent_with_size(file.ino, fh, None);
        // An open joining this share meanwhile (it found this open in the
        // table) is counted before this one leaves, or the file system's
        // open would be released under it.
        let last = file.share.as_ref().map(|share| {
            let _joins = self.join_lock(file.ino).lock();
            share.leave(fh)
        });
        let res = if last == Some(false) {
            // Others still use the file system's open: it keeps it, with
            // what this one wrote.
            self.persist_map(&file)
        } else {
            self.fill_pages_at_close(&file);
            let _all = file.share.as_ref().map(|s| s.persisting.lock());
            let _one = file.persisting.lock();
            let map = file.data.map();
            self.fs.release(&file.ctx, &file.path, file.fs_handle, &map)
        };
        self.handles.forget_changes(&file);
        self.journal_released_file(&file);
        let ino = file.ino;
        if self.handles.any_file_of(ino).is_none() {
            self.unlinked.lock().remove(&ino);
        }
        // Only a changed final map bumps here: a writable open bumped when
        // it was opened and daemon writes bump as they go, so a client that
        // re-opens after the write+close already misses; another bump now
        // (the kernel sends release after close(2) returned) would only
        // invalidate entries cached after it, for nothing.
        self.tokens.released(ino, &file.data, false);
        let backing = file.backing.clone();
        drop(file);
        if let Err(e) = &res {
            RELEASE_FAILED.log(|held_back| {
                warn!(
                    path = %self.inodes.path(ino).unwrap_or_default().display(),
                    held_back,
                    "release failed: {e}"
                )
            });
        }
        Ok((ino, backing))
    }
}
