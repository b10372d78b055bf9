//! Request translation: each FUSE callback resolves its inodes to paths,
//! calls the [`FileSystem`] or the data engine, and maps `Ok` to a reply
//! and `Err` to its errno.

use super::*;

macro_rules! tri {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                debug!("-> {e}");
                $reply.error(errno(&e));
                return;
            }
        }
    };
}

pub(super) fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(s),
    })
}

/// With the writeback cache the kernel trusts its own mtime, so
/// `utimensat(UTIME_NOW)` reaches the daemon as atime = now plus an explicit
/// mtime of "now". Turning that mtime back into `Now` gives the caller the
/// permission check of `UTIME_NOW` (owner or write access), not that of an
/// explicit time (owner only).
pub(super) fn utime_now_under_writeback(
    atime: Option<TimeSet>,
    mtime: Option<TimeSet>,
) -> Option<TimeSet> {
    match (atime, mtime) {
        (Some(TimeSet::Now), Some(TimeSet::At(t))) => {
            let now = SystemTime::now();
            let skew = now.duration_since(t).unwrap_or_else(|e| e.duration());
            if skew < Duration::from_secs(1) {
                Some(TimeSet::Now)
            } else {
                mtime
            }
        }
        _ => mtime,
    }
}

/// With the writeback cache the kernel also sends its own mtime (explicit,
/// "now") with every `truncate(2)` by path. Setting an explicit time needs
/// ownership, so a user who may write the file but does not own it would
/// get `EPERM`; the backing truncate, done as the caller, sets mtime and
/// ctime itself, as a native truncate does. So that mtime is dropped.
pub(super) fn truncate_mtime_under_writeback(set: &SetAttr) -> Option<TimeSet> {
    match (set.size, set.atime, set.mtime) {
        (Some(_), None, Some(TimeSet::At(t))) => {
            let now = SystemTime::now();
            let skew = now.duration_since(t).unwrap_or_else(|e| e.duration());
            if skew < Duration::from_secs(1) {
                None
            } else {
                set.mtime
            }
        }
        _ => set.mtime,
    }
}

pub(super) fn timespec(t: Option<TimeSet>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeSet::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => rustix::fs::Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as _,
            },
            Err(e) => {
                let d = e.duration();
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                rustix::fs::Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                }
            }
        },
    }
}

/// Sets the times of `set` on an open backing file.
pub(super) fn set_file_times(file: &std::fs::File, set: &SetAttr) -> Result<()> {
    let ts = rustix::fs::Timestamps {
        last_access: timespec(set.atime),
        last_modification: timespec(set.mtime),
    };
    rustix::fs::futimens(file, &ts)?;
    Ok(())
}

/// Attributes of an open file from its backing file, for files whose path is
/// gone (unlinked while open).
pub(super) fn attr_from_metadata(m: &std::fs::Metadata) -> Attr {
    use std::os::unix::fs::MetadataExt;
    let t = |s: i64, ns: i64| {
        if s >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(s as u64, ns as u32)
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
        }
    };
    Attr {
        ino: m.ino(),
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        kind: FileKind::from_mode(m.mode()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev(),
        blksize: m.blksize() as u32,
    }
}

pub(super) fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(fail(Errno::ERANGE));
    } else {
        reply.data(value);
    }
}

thread_local! {
    /// Read buffer of a FUSE worker thread (only the bytes read are sent).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Shared {
    /// Unlink or rmdir of `name` in `parent` by `remove`: the removed
    /// inode's map-cache token is bumped and the name forgotten.
    fn remove_name(
        &self,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        remove: impl FnOnce(&Path) -> Result<()>,
    ) {
        let _names = self.hold_dir(parent.0, true);
        let path = tri!(reply, self.child(parent, name));
        let victim = self.ino_at(parent, name);
        let before = self.attrs_if_open(victim, &path);
        let res = remove(&path);
        self.bump_opt(victim);
        tri!(reply, res);
        self.keep_unlinked(before);
        self.inodes.unlinked(parent.0, name);
        reply.ok();
    }
}

impl Filesystem for Adapter {
    /// At unmount, what the file system leaves for its housekeeping gets
    /// done, and what it holds goes back ([`FileSystem::finish`]), not left
    /// for the next mount.
    fn destroy(&mut self) {
        if let Some(bell) = &self.0.housekeeper {
            bell.stop();
        }
        if self.0.caps.housekeeping.is_some() {
            self.0.fs.housekeeping();
        }
        self.0.fs.finish();
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let s = &self.0;
        let mut want = InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            // The kernel checks permissions itself on every mount (see
            // `crate::mount`, Permission checks); with this it honours POSIX
            // ACLs there as the backing file system does.
            | InitFlags::FUSE_POSIX_ACL;
        if s.opts.data == DataMode::Daemon {
            if s.opts.writeback_cache {
                want |= InitFlags::FUSE_WRITEBACK_CACHE;
            }
        } else {
            want |= InitFlags::FUSE_PASSTHROUGH;
        }
        for flag in want.iter() {
            if config.add_capabilities(flag).is_err() {
                if flag == InitFlags::FUSE_PASSTHROUGH {
                    warn!("kernel does not offer FUSE passthrough; all reads and writes run in the daemon");
                    s.passthrough_ok.store(false, Ordering::Relaxed);
                } else {
                    info!("kernel does not offer {flag:?}");
                }
            } else if flag == InitFlags::FUSE_WRITEBACK_CACHE {
                s.writeback.store(true, Ordering::Relaxed);
            }
        }
        if s.passthrough_ok.load(Ordering::Relaxed) {
            let _ = config.set_max_stack_depth(1);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Lookup, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = match s.fs.getattr(&ctx(req), &path) {
            // A negative entry: the kernel caches that the name does not
            // exist for the entry TTL, as it caches names that do (an
            // ENOENT reply is not cached, so every stat or open of a
            // missing name, and every PATH or include-path search, would
            // cross into the daemon again). The kernel still checks the
            // caller's search permission on the parent before it uses
            // the cached answer, and a create through the mount replaces it.
            Err(e)
                if e.errno() == libc::ENOENT
                    && !s.opts.entry_ttl.is_zero()
                    && !s.caps.name_may_appear(&path) =>
            {
                reply.entry_with_ttls(
                    &Duration::ZERO,
                    &s.opts.entry_ttl,
                    &negative_entry(),
                    Generation(0),
                );
                return;
            }
            r => tri!(reply, r),
        };
        s.entry(parent, name, &attr, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Forget, _req.pid(), ino.0);
        if let Some(file) = s.inodes.forget(ino.0, nlookup) {
            s.pages.forgotten(file);
        }
        s.tokens.forgotten(ino.0, || s.inodes.path(ino.0).is_none());
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Getattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let attr = tri!(reply, s.getattr_inner(&ctx(req), ino, fh));
        reply.attr(&s.attr_ttl(ino.0), &s.fuse_attr(ino.0, &attr));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Setattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let path = s.path(ino);
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        if fh.is_none() && s.writeback.load(Ordering::Relaxed) {
            set.mtime = utime_now_under_writeback(set.atime, set.mtime);
            set.mtime = truncate_mtime_under_writeback(&set);
        }
        let handle = fh.and_then(|fh| s.handles.file(fh.0));
        // A size change on an open file goes through the engine, so a map
        // that is not 1-to-1 stays right; as the caller, so the backing
        // kernel clears setuid/setgid as it would.
        let open = handle.clone().or_else(|| match size {
            // Where opens share, the one the writers share.
            Some(_) => (s.handles.share_of(ino.0, true))
                .or_else(|| s.handles.any_file_of(ino.0))
                .filter(|f| f.data.whole_file_backing().is_none())
                .filter(|f| !f.lent.load(Ordering::Acquire)),
            None => None,
        });
        if let (Some(sz), Some(file)) = (size, &open) {
            tri!(reply, s.set_open_size(&c, ino.0, file, sz));
            set.size = None;
        }
        // Times that come with a file handle are the kernel's own (with
        // ftruncate, or its writeback cache flushing mtime), never a
        // utimensat: apply them through the open file as the daemon, which
        // also works once the name is gone.
        if let Some(file) = &handle {
            if set.atime.is_some() || set.mtime.is_some() {
                let times = SetAttr {
                    atime: set.atime,
                    mtime: set.mtime,
                    ..SetAttr::default()
                };
                match file.data.whole_file_backing() {
                    Some(b) => tri!(reply, set_file_times(b, &times)),
                    // The file system keeps these times by name; a file
                    // whose name is gone has nobody left to show them to.
                    None => {
                        if let Ok(p) = &path {
                            match s.fs.setattr(&ROOT_CTX, p, &times) {
                                Err(e) if e.errno() == libc::ENOENT => {}
                                r => {
                                    tri!(reply, r);
                                }
                            }
                        }
                    }
                }
                set.atime = None;
                set.mtime = None;
            }
        }
        let attr = if set.is_empty() {
            tri!(reply, s.getattr_inner(&c, ino, fh))
        } else {
            let path = tri!(reply, path);
            let res = s.fs.setattr(&c, &path, &set);
            if set.size.is_some() {
                s.tokens.bump(ino.0);
            }
            tri!(reply, res)
        };
        // A truncate by a user without CAP_FSETID clears setuid/setgid, as
        // on a local file system (the kernel's FATTR_KILL_SUIDGID, which
        // fuser does not pass on: a size change by anyone but root is taken
        // to carry it). A file system that keeps its own modes (pack) needs
        // this; for the others the backing kernel did it already.
        let setid = u16::try_from(libc::S_ISUID | libc::S_ISGID).unwrap_or(0);
        let attr = if size.is_some() && c.uid != 0 && attr.perm & setid != 0 {
            let path = tri!(reply, s.path(ino));
            tri!(reply, s.kill_suidgid(ino.0, &path, &c));
            tri!(reply, s.getattr_inner(&c, ino, fh))
        } else {
            attr
        };
        reply.attr(&s.attr_ttl(ino.0), &s.fuse_attr(ino.0, &attr));
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readlink, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let target = tri!(reply, s.fs.readlink(&ctx(req), &path));
        reply.data(target.as_bytes());
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Mknod, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = tri!(reply, s.fs.mknod(&ctx(req), &path, mode, u64::from(rdev)));
        let fa = s.enter(parent, name, &attr);
        // A new file may reuse the number of one a client still caches.
        s.tokens.bump(fa.ino.0);
        reply.entry_with_ttls(&s.opts.ttl, &s.opts.entry_ttl, &fa, Generation(0));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Mkdir, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = tri!(reply, s.fs.mkdir(&ctx(req), &path, mode));
        s.entry(parent, name, &attr, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Unlink, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        s.remove_name(parent, name, reply, |path| s.fs.unlink(&ctx(req), path));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Rmdir, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        s.remove_name(parent, name, reply, |path| s.fs.rmdir(&ctx(req), path));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Symlink, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, link_name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, link_name));
        let attr = tri!(reply, s.fs.symlink(&ctx(req), target.as_os_str(), &path));
        s.entry(parent, link_name, &attr, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRenameFlags,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Rename, req.pid(), parent.0)
            .target_with(|| {
                let mut n = s.trace_path(parent, name);
                n.extend_from_slice(b" -> ");
                n.extend_from_slice(&s.trace_path(newparent, newname));
                n
            });
        if flags.contains(FuseRenameFlags::RENAME_WHITEOUT) {
            reply.error(fail(Errno::EINVAL));
            return;
        }
        let _names = s.hold_rename(parent.0, name, newparent.0, newname);
        let from = tri!(reply, s.child(parent, name));
        let to = tri!(reply, s.child(newparent, newname));
        let rf = RenameFlags {
            noreplace: flags.contains(FuseRenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(FuseRenameFlags::RENAME_EXCHANGE),
        };
        let (moved, replaced) = (s.ino_at(parent, name), s.ino_at(newparent, newname));
        let before = if rf.exchange {
            None
        } else {
            s.attrs_if_open(replaced, &to)
        };
        let res = s.fs.rename(&ctx(req), &from, &to, rf);
        s.bump_opt(moved);
        s.bump_opt(replaced);
        tri!(reply, res);
        s.keep_unlinked(before);
        s.inodes
            .renamed(parent.0, name, newparent.0, newname, rf.exchange);
        reply.ok();
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Link, req.pid(), ino.0).target_with(|| {
            let mut n = s.inodes.path(ino.0).map_or_else(
                || format!("#{}", ino.0).into_bytes(),
                |p| p.as_os_str().as_bytes().to_vec(),
            );
            n.extend_from_slice(b" -> ");
            n.extend_from_slice(&s.trace_path(newparent, newname));
            n
        });
        let _names = s.hold_link(ino.0, newparent.0);
        let from = tri!(reply, s.path(ino));
        let to = tri!(reply, s.child(newparent, newname));
        let attr = tri!(reply, s.fs.link(&ctx(req), &from, &to));
        s.entry(newparent, newname, &attr, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Open, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let path = tri!(reply, s.path(ino));
        let reply = match s.made_before(req, ino.0) {
            Some(fh) => match s.open_again(fh, reply) {
                Some(reply) => reply,
                None => return,
            },
            None => reply,
        };
        if flags.0 & libc::O_ACCMODE == PLACEHOLDER_ACCESS {
            let fh = s.open_placeholder();
            s.journal_handle(fh, ino.0, OpenKind::Placeholder, req.unique().0);
            s.test_die_before_answer(req, &path);
            reply.opened(FileHandle(fh), FopenFlags::FOPEN_NONSEEKABLE);
            return;
        }
        let _joining = s.shares_opens().then(|| s.join_lock(ino.0).lock());
        if _joining.is_some() {
            let writes =
                flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
            if let Some(owner) = s.handles.share_of(ino.0, writes) {
                let (fh, fopen) = tri!(reply, s.join_open(req, ino.0, flags.0, &owner));
                answer_opened(reply, fh, fopen, None);
                return;
            }
        }
        let fs_flags = s.open_flags_for_fs(flags.0);
        let opened = match s.open_with_fallback(fs_flags, |f| s.fs.open(&c, &path, f), flags.0) {
            Err(e) if e.errno() == libc::EACCES && is_exec_open(flags.0) => {
                // `execve` of a file its caller may execute but not read:
                // the kernel reads it with its own rights, as it does
                // natively (and marks the process undumpable). Checked as
                // the caller: execute permission (the kernel checked it
                // too); then opened read-only by the daemon.
                tri!(reply, s.fs.access(&c, &path, libc::X_OK));
                let read_only = flags.0 & !libc::O_DIRECT;
                s.fs.open(&ROOT_CTX, &path, OpenFlags(read_only))
                    .map(|o| (o, read_only))
            }
            r => r,
        };
        // The kernel found this inode at the name, and the name lost it
        // before the open came (removed by another host sharing the store,
        // or in the backing directory). A local file system would open the
        // file found; here it is gone, so ESTALE makes the kernel walk the
        // path again once, looking every name up afresh: an `open(O_CREAT)`
        // then creates the file (the kernel sends an open of an existing
        // inode without O_CREAT, so only it can), and another open answers
        // ENOENT from that lookup or opens what the name holds by then.
        // ENOENT here failed fio's `open(O_CREAT)` of a file that another
        // host's fio removed to lay it out again. So is a name
        // that holds another file by now (removed and made again: a retry
        // opens the new one; two plfs mounts of one store, one host
        // removing and creating a file while the other opened it with
        // O_CREAT, failed 190 of 11,000 opens with ENOENT). A name still
        // holding the file keeps the file system's ENOENT (something it
        // was missing).
        let opened = opened.map_err(|e| {
            let gone = e.errno() == libc::ENOENT
                && match s.fs.getattr(&c, &path) {
                    Err(e) => e.errno() == libc::ENOENT,
                    Ok(now) => now.ino != s.inodes.fs_ino(ino.0),
                };
            if gone {
                Error::from_errno(libc::ESTALE).context(format!(
                    "{} was removed since the kernel looked it up",
                    path.display()
                ))
            } else {
                e
            }
        });
        let opened = tri!(reply, opened);
        if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY && c.uid != 0
        {
            // As a truncate (FUSE_OPEN_KILL_SUIDGID, which fuser does not
            // pass on): the open succeeded, so the caller may write.
            tri!(reply, s.kill_suidgid(ino.0, &path, &c));
        }
        let (fh, backing, fopen) = tri!(
            reply,
            s.register_open(req, ino.0, path, flags.0, opened, |f| reply.open_backing(f))
        );
        answer_opened(reply, fh, fopen, backing.as_deref());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Read, _req.pid(), _ino.0);
        let file = tri!(reply, s.data_file(fh));
        // One buffer per worker thread: a fresh zeroed buffer per request
        // (up to 1 MiB) costs a memset on every read.
        READ_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match file.data.read(offset, &mut buf[..size]) {
                Ok(n) => {
                    s.stats.add(Event::DaemonReadBytes, n as u64);
                    reply.data(&buf[..n])
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Write, req.pid(), _ino.0);
        let file = tri!(reply, s.data_file(fh));
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            tri!(reply, s.kill_suidgid(file.ino, &file.path, &ctx(req)));
        }
        let mut remap = s.remap_for(&file);
        let res = file.data.write(offset, data, &mut remap);
        s.tokens.bump(file.ino);
        let n = tri!(reply, res);
        s.stats.add(Event::DaemonWriteBytes, n as u64);
        s.changed(&file, SizeChange::Extend(offset + n as u64));
        s.journal_change(&file, offset, n as u64, Some(&data[..n]));
        reply.written(n as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Flush, _req.pid(), _ino.0);
        if !self.0.caps.persists_at_close {
            // No open of this file system ever has anything to persist at
            // close: the kernel takes ENOSYS as "never send FLUSH again"
            // on this connection (`fc->no_flush`; `close(2)` returns 0).
            // Opens ask for no FLUSH already (`FOPEN_NOFLUSH`), but with
            // the writeback cache the kernel sends it anyway, after
            // writing the dirty pages back, which it goes on doing.
            reply.error(fail(Errno::ENOSYS));
            return;
        }
        // Writes reach the backing files synchronously; only a map that is
        // not whole-file has something to persist (whole-file opens ask the
        // kernel for no FLUSH at all).
        if self.0.handles.is_placeholder(fh.0) {
            reply.ok();
            return;
        }
        let file = tri!(reply, self.0.open_file(fh));
        tri!(reply, self.0.persist_map(&file));
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Release, _req.pid(), _ino.0);
        let s = &self.0;
        // The journal says an open is released before its backing id can
        // be closed: a daemon killed between the two would otherwise leave
        // its successor restoring the open with an id the kernel no longer
        // has, and answering the next open of the inode with it (`EIO`).
        if s.handles.remove_placeholder(fh.0) {
            s.journal_released(fh.0);
            reply.ok();
            return;
        }
        if let Some(orphan) = s.handles.take_orphan(fh.0) {
            s.journal_released(fh.0);
            drop(orphan);
            reply.ok();
            return;
        }
        let res = s.release_file(fh.0);
        s.journal_released(fh.0);
        let (ino, backing) = tri!(reply, res);
        drop(backing);
        s.handles.prune_backing(ino);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Fsync, _req.pid(), _ino.0);
        if self.0.handles.is_placeholder(fh.0) {
            // The client's writes are in its map until it pushes it: a sync
            // of the placeholder alone would claim durability it lacks.
            reply.error(fail(Errno::EIO));
            return;
        }
        let file = tri!(reply, self.0.open_file(fh));
        tri!(reply, file.data.fsync(datasync));
        tri!(reply, self.0.persist_map(&file));
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Opendir, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        if let Some(fh) = s.made_before(req, ino.0) {
            if s.handles.dir(fh).is_some() {
                reply.opened(FileHandle(fh), FopenFlags::empty());
                return;
            }
        }
        let entries = tri!(reply, s.fs.readdir(&ctx(req), &path));
        let fh = s.handles.add_dir(OpenDir { entries });
        s.journal_handle(fh, ino.0, OpenKind::Dir, req.unique().0);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readdir, _req.pid(), ino.0);
        let Some(dir) = s.handles.dir(fh.0) else {
            reply.error(fail(Errno::EBADF));
            return;
        };
        // Offsets: 1 = ".", 2 = "..", 3.. = entries.
        let mut off = offset;
        while off < 2 {
            let name = if off == 0 { "." } else { ".." };
            if reply.add(ino, off + 1, FileType::Directory, name) {
                reply.ok();
                return;
            }
            off += 1;
        }
        for (i, e) in dir.entries.iter().enumerate().skip((off - 2) as usize) {
            let eino = INodeNo(s.inodes.nodeid_of(e.ino));
            if reply.add(eino, i as u64 + 3, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readdirplus, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let Some(dir) = s.handles.dir(fh.0) else {
            reply.error(fail(Errno::EBADF));
            return;
        };
        let dir_path = tri!(reply, s.path(ino));
        let mut off = offset;
        if off < 2 {
            // "." and ".." are not linked by the kernel, so they take no
            // lookup reference.
            let self_attr = tri!(reply, s.fs.getattr(&c, &dir_path));
            let fa = s.fuse_attr(ino.0, &self_attr);
            while off < 2 {
                let name = if off == 0 { "." } else { ".." };
                if reply.add(ino, off + 1, name, &Duration::ZERO, &fa, Generation(0)) {
                    reply.ok();
                    return;
                }
                off += 1;
            }
        }
        for (i, e) in dir.entries.iter().enumerate().skip((off - 2) as usize) {
            // The listing was made at opendir: an entry the inode table
            // knows better is looked at again.
            let attr = match e.attr {
                Some(a) if s.inodes.agrees(ino.0, &e.name, a.ino) => a,
                _ => match s.fs.getattr(&c, &dir_path.join(&e.name)) {
                    Ok(a) => a,
                    Err(_) => continue, // vanished since opendir
                },
            };
            let fa = s.enter(ino, &e.name, &attr);
            if reply.add(
                fa.ino,
                i as u64 + 3,
                &e.name,
                &s.opts.ttl,
                &fa,
                Generation(0),
            ) {
                // Not sent: the kernel takes no reference.
                if let Some(file) = s.inodes.forget(fa.ino.0, 1) {
                    s.pages.forgotten(file);
                }
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Releasedir, _req.pid(), _ino.0);
        self.0.handles.remove_dir(fh.0);
        self.0.journal_released(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Fsyncdir, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.fsyncdir(&ctx(req), &path, datasync));
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Statfs, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = s.path(ino).unwrap_or_else(|_| PathBuf::from("/"));
        let st = tri!(reply, s.fs.statfs(&ctx(req), &path));
        reply.statfs(
            st.blocks, st.bfree, st.bavail, st.files, st.ffree, st.bsize, st.namelen, st.frsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Setxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.setxattr(&ctx(req), &path, name, value, flags));
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Getxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let value = tri!(reply, s.fs.getxattr(&ctx(req), &path, name));
        xattr_reply(reply, &value, size);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Listxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let names = tri!(reply, s.fs.listxattr(&ctx(req), &path));
        let mut buf = Vec::new();
        for n in names {
            buf.extend_from_slice(n.as_bytes());
            buf.push(0);
        }
        xattr_reply(reply, &buf, size);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Removexattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.removexattr(&ctx(req), &path, name));
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Access, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.access(&ctx(req), &path, mask.bits()));
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Create, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let c = ctx(req);
        let path = tri!(reply, s.child(parent, name));
        let reply = match s.create_again(req, &path, reply) {
            Some(reply) => reply,
            None => return,
        };
        let fs_flags = s.open_flags_for_fs(flags);
        let (attr, opened) = tri!(reply, s.fs.create(&c, &path, OpenFlags(fs_flags), mode));
        // Clean unless the kernel still holds an inode of a file that had
        // this number (enter then says so).
        s.pages.created(attr.ino);
        let fa = s.enter(parent, name, &attr);
        let (fh, backing, fopen) = tri!(
            reply,
            s.register_open(req, fa.ino.0, path, flags, (opened, fs_flags), |f| reply
                .open_backing(f))
        );
        // A new file may reuse the number of one a client still caches.
        s.tokens.bump(fa.ino.0);
        s.answer_created(reply, &fa, fh, fopen, backing.as_deref());
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Fallocate, req.pid(), _ino.0);
        let file = tri!(reply, self.0.data_file(fh));
        // Like write, fallocate by an unprivileged caller drops setuid/setgid;
        // the kernel sends no flag for it.
        if req.uid() != 0 {
            tri!(reply, self.0.kill_suidgid(file.ino, &file.path, &ctx(req)));
        }
        let res = file.data.fallocate(mode, offset, length);
        self.0.tokens.bump(file.ino);
        tri!(reply, res);
        let change = if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            SizeChange::Keep
        } else {
            SizeChange::Extend(offset + length)
        };
        self.0.changed(&file, change);
        self.0.journal_change(&file, offset, length, None);
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.0.stats.timer(Op::Lseek, _req.pid(), _ino.0);
        let file = tri!(reply, self.0.data_file(fh));
        if offset < 0 {
            reply.error(fail(Errno::ENXIO));
            return;
        }
        let pos = tri!(reply, file.data.seek(offset as u64, whence));
        reply.offset(pos as i64);
    }

    /// Only [`mapfs::control::PROVE_IOCTL`]: a proof that the caller holds
    /// the open `fh`, for the control connection whose key it passes. Any
    /// other ioctl gets `ENOTTY`, unlogged (a client must not be able to
    /// fill the log).
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _t = self.0.stats.timer(Op::Ioctl, req.pid(), _ino.0);
        if cmd != mapfs::control::PROVE_IOCTL {
            reply.error(fail(Errno::ENOTTY));
            return;
        }
        let (Ok(key), 16) = (<mapfs::control::ConnKey>::try_from(in_data), out_size) else {
            reply.error(fail(Errno::EINVAL));
            return;
        };
        let s = &self.0;
        if s.handles.file(fh.0).is_none() {
            reply.error(fail(Errno::EBADF));
            return;
        }
        match s.proofs.issue(&key, fh.0, req.uid(), req.gid()) {
            Some(proof) => reply.ioctl(0, &proof),
            None => reply.error(fail(Errno::EPERM)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::CopyFileRange, _req.pid(), _ino_out.0);
        let src = tri!(reply, s.data_file(fh_in));
        let dst = tri!(reply, s.data_file(fh_out));
        let mut remap = s.remap_for(&dst);
        // The reply carries a 32-bit count; the kernel loops for more.
        let len = len.min(1 << 30);
        let res = engine::copy_range(&src.data, offset_in, &dst.data, offset_out, len, &mut remap);
        s.tokens.bump(dst.ino);
        let n = tri!(reply, res);
        s.changed(&dst, SizeChange::Extend(offset_out + n as u64));
        s.journal_change(&dst, offset_out, n as u64, None);
        s.stats.add(Event::DaemonWriteBytes, n as u64);
        reply.written(n as u32);
    }
}

impl Shared {
    pub(super) fn getattr_inner(
        &self,
        c: &Ctx,
        ino: INodeNo,
        fh: Option<FileHandle>,
    ) -> Result<Attr> {
        let by_path = self.path(ino).and_then(|p| self.fs.getattr(c, &p));
        match by_path {
            Err(e) if e.errno() == libc::ENOENT || e.errno() == libc::ESTALE => {
                // An open file whose name is gone still has attributes.
                // Another inode the kernel holds lost its file behind the
                // mount (removed by another host sharing the store, or in
                // the backing directory): ESTALE, on which the kernel looks
                // the name up again where it walked a path. ENOENT failed
                // `open(O_CREAT)` of a name another host removed and made
                // again, at the permission check's GETATTR after the lookup
                // (the kernel keeping no attributes: `-o hostid=`).
                let file = fh
                    .and_then(|fh| self.handles.file(fh.0))
                    .or_else(|| self.handles.any_file_of(ino.0))
                    .ok_or_else(|| {
                        if e.errno() == libc::ENOENT {
                            Error::from_errno(libc::ESTALE).context(format!("{e}"))
                        } else {
                            e
                        }
                    })?;
                if let Some(backing) = file.data.whole_file_backing() {
                    let mut attr = attr_from_metadata(&backing.metadata()?);
                    attr.ino = self.inodes.fs_ino(ino.0);
                    return Ok(attr);
                }
                // Its bytes are spread over backing files that are not the
                // file: mode, owner and times as the name last had them
                // (else times from the first backing file, owner from the
                // opener), size from the map.
                let files = file.data.files();
                let size = file.data.size()?;
                let known = self.unlinked.lock().get(&ino.0).copied();
                let mut attr = match (known, files.first()) {
                    (Some(a), _) => a,
                    (None, Some(first)) => {
                        let mut a = attr_from_metadata(&first.metadata()?);
                        a.uid = file.ctx.uid;
                        a.gid = file.ctx.gid;
                        a
                    }
                    (None, None) => return Err(Error::not_found()),
                };
                attr.ino = self.inodes.fs_ino(ino.0);
                attr.kind = mapfs::FileKind::File;
                attr.size = size;
                attr.blocks = size.div_ceil(512);
                attr.nlink = 0;
                Ok(attr)
            }
            other => other,
        }
    }

    /// The attributes of `path`, the name of FUSE inode `victim`, if that
    /// inode is open: taken before a call removes the name, for
    /// [`Shared::keep_unlinked`].
    pub(super) fn attrs_if_open(&self, victim: Option<u64>, path: &Path) -> Option<(u64, Attr)> {
        let v = victim?;
        self.handles.any_file_of(v)?;
        Some((v, self.fs.getattr(&ROOT_CTX, path).ok()?))
    }

    /// Keeps the attributes of an open inode whose name is gone (see
    /// [`Shared::unlinked`]).
    pub(super) fn keep_unlinked(&self, before: Option<(u64, Attr)>) {
        if let Some((v, a)) = before {
            if a.kind == FileKind::File {
                self.unlinked.lock().insert(v, a);
            }
        }
    }

    pub(super) fn bump_opt(&self, ino: Option<u64>) {
        if let Some(ino) = ino {
            self.tokens.bump(ino);
        }
    }
}
