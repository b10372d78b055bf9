//! The adapter's side of failover (see [`crate::failover`]): reporting what
//! the kernel is told to the supervisor, and taking over from a dead daemon.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mapfs::engine::DataFile;
use mapfs::{Ctx, Segment};
use tracing::{debug, info, warn};

use fuser::{FileHandle, FopenFlags, ReplyCreate, ReplyOpen};

use super::{answer_opened, file_open_flags, Shared, ROOT_CTX};
use crate::failover::records::{Bytes, InitState, OpenKind, OpenRec, PendingWrite, ToSupervisor};
use crate::failover::{Link, Resume};
use crate::handles::{OpenDir, OpenFile, Share, SizeChange};

/// Bytes of changes an open may have handed to the supervisor before the
/// daemon hands its map to the file system (which makes them unneeded):
/// bounds what the supervisor keeps, and what a successor writes again.
pub const JOURNAL_LIMIT: u64 = 8 << 20;

/// Bytes of changes all opens together may have handed to the supervisor
/// before the daemon hands every such map over: bounds the supervisor's
/// memory (16 MiB of copies) and a successor's replay, which runs before it
/// answers anything (256 MiB kept by place, see [`IN_LOG_WEIGHT`]),
/// whatever number of opens clients make.
pub const JOURNAL_TOTAL_LIMIT: u64 = 16 << 20;

/// Largest piece of a change in one record.
const JOURNAL_CHUNK: usize = 128 << 10;

/// A change kept by place ([`Bytes::InLog`]) costs the supervisor no
/// memory, only its successor the time to copy it back: it counts against
/// the limits above at this fraction of its size (so up to 128 MiB per
/// open). Handing a map over is costly for some file systems, so fewer
/// hand-overs matter: 4k random writes to a versions undo writer ran at
/// 0.6x the unsupervised mount when this was 1 (every 8 MiB), when such
/// writers still sent their writes to a log that each hand-over copied
/// into the file.
const IN_LOG_WEIGHT: u64 = 16;

/// A kept change with its bytes, being written again.
struct Replayed {
    fh: u64,
    offset: u64,
    bytes: Vec<u8>,
}

impl Shared {
    /// Reports every change the kernel will be told of to the supervisor
    /// at the other end of `link`, from now on.
    pub fn set_link(&self, link: Arc<Link>) {
        self.inodes.set_journal(link.clone());
        let _ = self.link.set(link);
    }

    /// Sends a record to the supervisor, if there is one.
    pub(super) fn journal(&self, msg: impl FnOnce() -> ToSupervisor) {
        if let Some(link) = self.link.get() {
            link.send(&msg());
        }
    }

    /// Records a file handle about to be given to the kernel in answer to
    /// request `unique`.
    pub(super) fn journal_file(&self, file: &OpenFile, unique: u64) {
        self.journal(|| {
            ToSupervisor::Opened(OpenRec {
                fh: file.fh,
                ino: file.ino,
                unique: unique & !fuser::RESEND_UNIQUE_BIT,
                kind: OpenKind::File {
                    flags: file.flags,
                    path: file.path.as_os_str().as_bytes().to_vec(),
                    backing: file.backing.as_ref().map(|b| b.as_raw()),
                    uid: file.ctx.uid,
                    gid: file.ctx.gid,
                },
            })
        });
    }

    /// Records a placeholder or directory handle about to be given in
    /// answer to request `unique`.
    pub(super) fn journal_handle(&self, fh: u64, ino: u64, kind: OpenKind, unique: u64) {
        let unique = unique & !fuser::RESEND_UNIQUE_BIT;
        self.journal(|| {
            ToSupervisor::Opened(OpenRec {
                fh,
                ino,
                kind,
                unique,
            })
        });
    }

    /// Records that the kernel released `fh` and the release is done.
    pub(super) fn journal_released(&self, fh: u64) {
        self.resent.lock().released(fh);
        self.journal(|| ToSupervisor::Released { fh });
    }

    /// The handle a dead daemon made for request `req` on nodeid `ino` and
    /// recorded, if `req` is that request sent again (the kernel marks it
    /// with [`fuser::RESEND_UNIQUE_BIT`]): the kernel never got the handle,
    /// so the request is answered with it (see [`OpenRec::unique`]).
    pub(super) fn made_before(&self, req: &fuser::Request, ino: u64) -> Option<u64> {
        let (fh, made_on) = self.claim_resent(req)?;
        if made_on != ino {
            warn!(
                fh,
                ino, made_on, "a request sent again names another node than its handle's"
            );
            return None;
        }
        debug!(
            fh,
            ino, "a request sent again is answered with the handle made for it"
        );
        Some(fh)
    }

    /// The handle and nodeid a dead daemon recorded for `req`, if `req` is
    /// a request sent again (marked with [`fuser::RESEND_UNIQUE_BIT`]) and
    /// one was recorded; taken out of the table.
    fn claim_resent(&self, req: &fuser::Request) -> Option<(u64, u64)> {
        let unique = req.unique().0;
        if unique & fuser::RESEND_UNIQUE_BIT == 0 {
            return None;
        }
        self.resent.lock().claim(unique & !fuser::RESEND_UNIQUE_BIT)
    }

    /// Answers an `OPEN` sent again with handle `fh`, which a dead daemon
    /// made for it; gives `reply` back if that handle was not restored.
    pub(super) fn open_again(&self, fh: u64, reply: ReplyOpen) -> Option<ReplyOpen> {
        if self.handles.is_placeholder(fh) {
            reply.opened(FileHandle(fh), FopenFlags::FOPEN_NONSEEKABLE);
            return None;
        }
        let Some(file) = self.handles.file(fh) else {
            return Some(reply);
        };
        let fopen = file_open_flags(&file.data, file.flags);
        answer_opened(reply, fh, fopen, file.backing.as_deref());
        None
    }

    /// Answers a `CREATE` of `path` sent again with the entry and handle a
    /// dead daemon made for it (see [`Shared::made_before`]); gives `reply`
    /// back if `req` is not such a request or that handle was not restored.
    pub(super) fn create_again(
        &self,
        req: &fuser::Request,
        path: &std::path::Path,
        reply: ReplyCreate,
    ) -> Option<ReplyCreate> {
        let Some((fh, ino)) = self.claim_resent(req) else {
            return Some(reply);
        };
        let Some(file) = self.handles.file(fh) else {
            return Some(reply);
        };
        if self.inodes.path(ino).as_deref() != Some(path) {
            warn!(fh, path = %path.display(), "a create sent again names another file than its handle's");
            return Some(reply);
        }
        let attr = match self.fs.getattr(&ROOT_CTX, path) {
            Ok(a) => a,
            Err(e) => {
                warn!(path = %path.display(), "a create sent again: {e}");
                return Some(reply);
            }
        };
        // The dead daemon entered the name already (the kernel's reference
        // is in the restored table): no second `enter`.
        let fa = self.fuse_attr(ino, &attr);
        let fopen = file_open_flags(&file.data, file.flags);
        debug!(
            fh,
            ino, "a create sent again is answered with the handle made for it"
        );
        self.answer_created(reply, &fa, fh, fopen, file.backing.as_deref());
        None
    }

    /// Test hook of failover (`MAPFS_TEST_DIE_BEFORE_ANSWER=NAME`, read
    /// once): the daemon kills itself once it has recorded the handle of an
    /// open or create of a file named `NAME` and before it answers, the
    /// window [`Shared::made_before`] closes. A request sent again never
    /// triggers it, so the next daemon answers. Only with the `test-hooks`
    /// feature, which the tests of mapfs-cli turn on: an environment
    /// variable must not be able to kill a daemon someone relies on.
    #[cfg(feature = "test-hooks")]
    pub(super) fn test_die_before_answer(&self, req: &fuser::Request, path: &std::path::Path) {
        static NAME: std::sync::OnceLock<Option<OsString>> = std::sync::OnceLock::new();
        let Some(name) = NAME.get_or_init(|| std::env::var_os("MAPFS_TEST_DIE_BEFORE_ANSWER"))
        else {
            return;
        };
        if req.unique().0 & fuser::RESEND_UNIQUE_BIT == 0
            && path.file_name() == Some(name.as_os_str())
            && self.link.get().is_some()
        {
            warn!(path = %path.display(), "MAPFS_TEST_DIE_BEFORE_ANSWER: dying before the answer");
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
    }

    /// Without the `test-hooks` feature the hook is not there.
    #[cfg(not(feature = "test-hooks"))]
    #[inline(always)]
    pub(super) fn test_die_before_answer(&self, _req: &fuser::Request, _path: &std::path::Path) {}

    /// Under a supervisor, hands it the bytes a change (a write, or with
    /// `written` `None` an allocation, a hole, a copy) left in
    /// `offset..offset+len` of an open whose map is not whole-file, before
    /// the change is acknowledged. Where those bytes went is in this
    /// daemon's copy of the map only, until the file system is handed the
    /// map; a successor writes them again instead (whole-file maps need
    /// nothing: their bytes are the backing file's). Bytes in the open's
    /// append log are named by place, the log's descriptor sent once (a
    /// log is never overwritten, and the supervisor holding it keeps it);
    /// others are copied. Under the open's `persisting` lock, so the
    /// records and the "flushed" marks reach the supervisor in the order of
    /// the maps they describe.
    pub(super) fn journal_change(
        &self,
        file: &OpenFile,
        offset: u64,
        len: u64,
        written: Option<&[u8]>,
    ) {
        let Some(link) = self.link.get() else {
            return;
        };
        if file.data.whole_file_backing().is_some() {
            // A remap made this open whole-file (pack moves a growing file
            // to a backing file of its own, recorded at once): every byte is
            // in that file now, and changes kept from before the move,
            // written again after a restart, would put older bytes over
            // newer ones.
            if file.journaled.load(Ordering::Relaxed) > 0 {
                let mut held = file.persisting.lock();
                self.journal_flushed(file, &mut held);
            }
            return;
        }
        if len == 0 {
            return;
        }
        if written.is_some() && file.data.written_in_place(offset, len) {
            // A guarded map's write landed in its backing file: those bytes
            // are the file's own already, as in a whole-file map. Changes
            // kept from before it (a hole, a truncate) would be written
            // again over them after a restart: hand the map over first.
            if file.journaled.load(Ordering::Relaxed) > 0 {
                if let Err(e) = self.persist_map(file) {
                    warn!(path = %file.path.display(), "cannot hand a map to the file system: {e}");
                }
            }
            return;
        }
        let total = {
            let mut logs_sent = file.persisting.lock();
            let mut cost = 0u64;
            let mut send = |at: u64, bytes: Bytes| {
                cost += match &bytes {
                    Bytes::Copied(b) => b.len() as u64,
                    Bytes::InLog { len, .. } => len.div_ceil(IN_LOG_WEIGHT),
                    Bytes::Hole { .. } => 1,
                };
                link.send(&ToSupervisor::Wrote(PendingWrite {
                    fh: file.fh,
                    offset: at,
                    bytes,
                }));
            };
            // Copies `from..to` (within the change).
            let copy = |send: &mut dyn FnMut(u64, Bytes), from: u64, to: u64| match written {
                Some(data) => {
                    let piece = &data[(from - offset) as usize..(to - offset) as usize];
                    for (i, chunk) in piece.chunks(JOURNAL_CHUNK).enumerate() {
                        send(
                            from + (i * JOURNAL_CHUNK) as u64,
                            Bytes::Copied(chunk.to_vec()),
                        );
                    }
                }
                None => {
                    let mut buf = vec![0u8; JOURNAL_CHUNK];
                    let mut at = from;
                    while at < to {
                        let want = ((to - at) as usize).min(JOURNAL_CHUNK);
                        match file.data.read(at, &mut buf[..want]) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                send(at, Bytes::Copied(buf[..n].to_vec()));
                                at += n as u64;
                            }
                        }
                    }
                }
            };
            // Pieces of the open's log are kept by place, holes as holes,
            // anything else (pieces of other files) copied.
            let (segments, log) = match file.data.locate_in_log(offset, len) {
                Some((segments, log, log_file)) => (segments, Some((log, log_file))),
                None => (file.data.locate(offset, len), None),
            };
            let mut at = offset;
            for seg in segments {
                match (seg, &log) {
                    (
                        Segment::Data {
                            file: f,
                            offset: in_log,
                            len: n,
                        },
                        Some((log, log_file)),
                    ) if f == *log => {
                        if !logs_sent.contains(log) {
                            link.send_with(
                                &ToSupervisor::Log {
                                    fh: file.fh,
                                    file: *log,
                                },
                                &[log_file.as_fd()],
                            );
                            logs_sent.push(*log);
                        }
                        let mut done = 0;
                        while done < n {
                            let piece = (n - done).min(JOURNAL_CHUNK as u64);
                            send(
                                at + done,
                                Bytes::InLog {
                                    file: *log,
                                    at: in_log + done,
                                    len: piece,
                                },
                            );
                            done += piece;
                        }
                    }
                    (Segment::Hole { len: n }, _) => send(at, Bytes::Hole { len: n }),
                    (other, _) => copy(&mut send, at, at + other.len()),
                }
                at += seg.len();
            }
            self.journaled_total.fetch_add(cost, Ordering::Relaxed);
            file.journaled.fetch_add(cost, Ordering::Relaxed) + cost
        };
        let hand_over = |f: &OpenFile| {
            if let Err(e) = self.persist_map(f) {
                warn!(path = %f.path.display(), "cannot hand a map to the file system: {e}");
            }
        };
        if total > JOURNAL_LIMIT {
            hand_over(file);
        }
        if self.journaled_total.load(Ordering::Relaxed) > JOURNAL_TOTAL_LIMIT {
            for f in self.handles.all_files() {
                if f.journaled.load(Ordering::Relaxed) > 0 {
                    hand_over(&f);
                }
            }
        }
    }

    /// Hands the file system the map of every open of `ino` that has
    /// changes kept by the supervisor, before a change that sets the
    /// file's size (a truncate, a shim client's final map): a successor
    /// writes kept changes again in their order, and must not write them
    /// over a size change that came after them.
    pub(super) fn persist_journaled_of(&self, ino: u64) {
        if self.link.get().is_none() || self.journaled_total.load(Ordering::Relaxed) == 0 {
            return;
        }
        for f in self.handles.all_files() {
            if f.ino == ino && f.journaled.load(Ordering::Relaxed) > 0 {
                if let Err(e) = self.persist_map(&f) {
                    warn!(path = %f.path.display(), "cannot hand a map to the file system: {e}");
                }
            }
        }
    }

    /// `file` was released: what it handed the supervisor is dropped there
    /// (the release gave the file system its final map).
    pub(super) fn journal_released_file(&self, file: &OpenFile) {
        let n = file.journaled.swap(0, Ordering::Relaxed);
        self.journaled_total.fetch_sub(n, Ordering::Relaxed);
    }

    /// The file system holds `file`'s map now (called under its
    /// `persisting` lock, whose list of logs the supervisor holds is
    /// `logs_sent`: it drops them with the changes).
    pub(super) fn journal_flushed(&self, file: &OpenFile, logs_sent: &mut Vec<u32>) {
        let n = file.journaled.swap(0, Ordering::Relaxed);
        logs_sent.clear();
        if n > 0 {
            self.journaled_total.fetch_sub(n, Ordering::Relaxed);
            self.journal(|| ToSupervisor::Flushed { fh: file.fh });
        }
    }

    /// Writes again, through the restored opens, the changes the dead
    /// daemon acknowledged but had not handed to the file system, then
    /// hands the maps over.
    fn replay(&self, writes: Vec<PendingWrite>, logs: &HashMap<(u64, u32), OwnedFd>) {
        let mut touched = std::collections::BTreeMap::new();
        let mut lost = 0u64;
        for w in writes {
            let Some(file) = self.handles.file(w.fh) else {
                lost += w.bytes.len();
                continue;
            };
            let bytes = match w.bytes {
                Bytes::Copied(b) => b,
                Bytes::Hole { len } => {
                    // The size grows to the hole's end, as the change made
                    // it (an allocation), and the range reads as zeros.
                    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    let res = file
                        .data
                        .fallocate(0, w.offset, len)
                        .and_then(|()| file.data.fallocate(punch, w.offset, len));
                    match res {
                        Ok(()) => {
                            self.changed(&file, SizeChange::Extend(w.offset + len));
                            touched.insert(w.fh, file);
                        }
                        Err(e) => {
                            warn!(path = %file.path.display(), "cannot make a hole again: {e}");
                            lost += len;
                        }
                    }
                    continue;
                }
                Bytes::InLog { file: log, at, len } => {
                    let mut b = vec![0u8; len as usize];
                    let read = logs.get(&(w.fh, log)).map(|fd| {
                        std::os::unix::fs::FileExt::read_exact_at(
                            &std::fs::File::from(fd.try_clone()?),
                            &mut b,
                            at,
                        )
                    });
                    match read {
                        Some(Ok(())) => b,
                        other => {
                            warn!(fh = w.fh, "cannot read a kept change back: {other:?}");
                            lost += len;
                            continue;
                        }
                    }
                }
            };
            let w = Replayed {
                fh: w.fh,
                offset: w.offset,
                bytes,
            };
            let res = {
                let mut remap = self.remap_for(&file);
                file.data.write(w.offset, &w.bytes, &mut remap)
            };
            debug!(
                fh = w.fh,
                offset = w.offset,
                len = w.bytes.len(),
                "write replayed"
            );
            match res {
                Ok(n) => {
                    self.changed(&file, SizeChange::Extend(w.offset + n as u64));
                    touched.insert(w.fh, file);
                }
                Err(e) => {
                    warn!(path = %file.path.display(), "cannot write again a change: {e}");
                    lost += w.bytes.len() as u64;
                }
            }
        }
        let n = touched.len();
        for file in touched.into_values() {
            match self.persist_map(&file) {
                // The replayed changes were not handed to the supervisor
                // again, so it is told here that it may drop what it kept.
                Ok(()) => self.journal(|| ToSupervisor::Flushed { fh: file.fh }),
                Err(e) => {
                    warn!(path = %file.path.display(), "cannot hand a map to the file system: {e}")
                }
            }
        }
        if n > 0 || lost > 0 {
            info!("wrote again the unsaved changes of {n} open files ({lost} bytes lost)");
        }
    }

    /// Tells the supervisor this daemon serves requests now.
    pub fn journal_serving(&self) {
        self.journal(|| ToSupervisor::Serving);
    }

    /// Tells the supervisor this daemon is about to leave on purpose, to
    /// be replaced at once (`mapfs restart`).
    pub fn journal_restarting(&self) {
        self.journal(|| ToSupervisor::Restarting);
    }

    /// Hands every written map that is not whole-file to the file system,
    /// before a daemon leaves on purpose: its successor opens the files
    /// again and sees only what the file system was given.
    pub fn persist_all(&self) {
        for file in self.handles.all_files() {
            if let Err(e) = self.persist_map(&file) {
                warn!(path = %file.path.display(), "cannot save the map of an open file: {e}");
            }
        }
    }

    /// What INIT settled, for the supervisor to hand a successor.
    pub fn init_state(&self) -> InitState {
        InitState {
            passthrough_ok: self.passthrough_ok.load(Ordering::Relaxed),
            writeback: self.writeback.load(Ordering::Relaxed),
            uring: None,
        }
    }

    /// Takes over from a daemon that died: what INIT settled, the inode
    /// table, and every handle the kernel holds. Open files are opened
    /// again through the file system (their data is in the backing
    /// files); passthrough opens keep the backing id the kernel uses,
    /// wrapped by `wrap`. A file that cannot be opened again (removed
    /// meanwhile) answers `EBADF` to the daemon-run calls on its handle.
    pub fn resume(&self, r: &mut Resume, wrap: impl Fn(u32) -> fuser::BackingId) {
        self.handles.number_above(crate::handles::successor_base());
        self.passthrough_ok
            .store(r.init.passthrough_ok, Ordering::Relaxed);
        self.writeback.store(r.init.writeback, Ordering::Relaxed);
        self.inodes
            .restore(std::mem::take(&mut r.table), std::mem::take(&mut r.nodes));
        let (mut files, mut lost) = (0, 0);
        let mut opens = std::mem::take(&mut r.opens);
        // Opens the kernel runs natively first: a file system whose choice
        // of map depends on what else is open (versions) then gives the
        // others of the same inode whole-file maps over the same file, as
        // it did before.
        // Where opens share (see `crate::handles::Share`), writers before
        // readers: a writer's open is the one the others join.
        opens.sort_by_key(|rec| match rec.kind {
            OpenKind::File {
                backing: Some(_), ..
            } => 0,
            OpenKind::File { flags, .. } if flags & libc::O_ACCMODE != libc::O_RDONLY => 1,
            _ => 2,
        });
        for rec in opens {
            if rec.unique != 0 {
                self.resent.lock().record(rec.unique, rec.fh, rec.ino);
            }
            match rec.kind {
                OpenKind::Placeholder => self.handles.restore_placeholder(rec.fh),
                OpenKind::Dir => {
                    let entries = self
                        .inodes
                        .path(rec.ino)
                        .and_then(|p| self.fs.readdir(&ROOT_CTX, &p).ok())
                        .unwrap_or_default();
                    self.handles.restore_dir(rec.fh, OpenDir { entries });
                }
                OpenKind::File {
                    flags,
                    path,
                    backing,
                    uid,
                    gid,
                } => {
                    let restore = |file: Option<&std::fs::File>| {
                        backing.map(|raw| self.handles.restore_backing(rec.ino, file, || wrap(raw)))
                    };
                    let open_path = PathBuf::from(OsString::from_vec(path));
                    let ctx = Ctx { uid, gid, pid: 0 };
                    let native = backing.is_some();
                    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
                    let owner = (self.shares_opens() && !native)
                        .then(|| self.handles.share_of(rec.ino, writes))
                        .flatten();
                    if let Some(owner) = owner {
                        let may_change = writes;
                        self.tokens.opened(rec.ino, &owner.data, may_change);
                        self.handles
                            .restore_file(rec.fh, OpenFile::joining(&owner, flags, ctx));
                        files += 1;
                        continue;
                    }
                    match self.reopen(&ctx, rec.ino, &open_path, flags, native) {
                        Ok((opened, fs_flags)) => {
                            debug!(
                                fh = rec.fh,
                                ino = rec.ino,
                                flags,
                                native,
                                whole = opened.map.is_whole_file(),
                                size = opened.map.size(),
                                "open restored"
                            );
                            if native && !opened.map.is_whole_file() {
                                // Cannot happen with a file system that
                                // keeps reopen_whole_file's promise.
                                warn!(
                                    fh = rec.fh,
                                    path = %open_path.display(),
                                    "the file system reopened a kernel-passthrough open with a \
                                     map that is not whole-file: the daemon's calls on it \
                                     (fallocate, copy_file_range) miss the kernel's writes"
                                );
                            }
                            let fs_handle = opened.handle;
                            let data = Arc::new(DataFile::new(opened));
                            let backing = restore(data.whole_file_backing().map(|f| &**f));
                            let may_change = flags & libc::O_ACCMODE != libc::O_RDONLY;
                            self.tokens.opened(rec.ino, &data, may_change);
                            let shared = self.shares_opens() && backing.is_none();
                            let mut file = OpenFile::new(
                                rec.ino, open_path, flags, ctx, fs_handle, data, backing,
                            );
                            if shared {
                                let writable = fs_flags & libc::O_ACCMODE != libc::O_RDONLY;
                                file = file.in_share(Share::new(writable));
                            }
                            self.handles.restore_file(rec.fh, file);
                            files += 1;
                        }
                        Err(e) => {
                            warn!(
                                fh = rec.fh,
                                path = %open_path.display(),
                                "cannot open again a file the kernel holds open: {e}"
                            );
                            lost += 1;
                            if let Some(b) = restore(None) {
                                self.handles.keep_orphan(rec.fh, b);
                            }
                        }
                    }
                }
            }
        }
        info!("took over the connection: {files} open files restored, {lost} lost");
        self.replay(std::mem::take(&mut r.writes), &r.logs);
    }

    /// Opens an open file again: where its inode is now (or was at open),
    /// without the flags that act only once (`O_CREAT`, `O_EXCL`,
    /// `O_TRUNC`); as its opener, or as root when its permissions changed
    /// since (the kernel granted the open already). `native`: the kernel
    /// runs it by passthrough, so it needs a whole-file map
    /// ([`mapfs::FileSystem::reopen_whole_file`]).
    fn reopen(
        &self,
        ctx: &Ctx,
        ino: u64,
        open_path: &std::path::Path,
        flags: i32,
        native: bool,
    ) -> mapfs::Result<(mapfs::Opened, i32)> {
        let path = self
            .inodes
            .path(ino)
            .unwrap_or_else(|| open_path.to_path_buf());
        let once = libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC;
        let asked = flags & !once;
        let wide = self.open_flags_for_fs(flags) & !once;
        let open = |ctx: &Ctx, f: mapfs::OpenFlags| {
            if native {
                self.fs.reopen_whole_file(ctx, &path, f)
            } else {
                self.fs.open(ctx, &path, f)
            }
        };
        match self.open_with_fallback(wide, |f| open(ctx, f), asked) {
            Err(e) if matches!(e.errno(), libc::EACCES | libc::EPERM) => {
                self.open_with_fallback(wide, |f| open(&ROOT_CTX, f), asked)
            }
            r => r,
        }
    }
}

/// The handles a dead daemon recorded, by the request that made each, for
/// the requests the kernel sends again (see [`Shared::made_before`]). An
/// entry leaves when its request comes again or when its handle is
/// released (the kernel had it), so the table holds at most the handles
/// of the takeover and empties as they go.
#[derive(Default)]
pub struct Resent {
    by_unique: HashMap<u64, (u64, u64)>,
    by_fh: HashMap<u64, u64>,
}

impl Resent {
    fn record(&mut self, unique: u64, fh: u64, ino: u64) {
        self.by_unique.insert(unique, (fh, ino));
        self.by_fh.insert(fh, unique);
    }

    fn claim(&mut self, unique: u64) -> Option<(u64, u64)> {
        let (fh, ino) = self.by_unique.remove(&unique)?;
        self.by_fh.remove(&fh);
        Some((fh, ino))
    }

    fn released(&mut self, fh: u64) {
        if self.by_fh.is_empty() {
            return;
        }
        if let Some(unique) = self.by_fh.remove(&fh) {
            self.by_unique.remove(&unique);
        }
    }
}
