//! Opens whose map is not whole-file 1-to-1 (plfs: an append log per open
//! plus the other writers' logs), run by the data engine in-process.
//!
//! The application gets a *placeholder*: a kernel descriptor of an empty,
//! sealed memfd reopened write-only. It is a real descriptor, so `select`/
//! `poll` (always ready, as for a regular file), `/proc/self/fd`, `fcntl`,
//! `dup` and closing in any order keep working; every data call the
//! library does not see (a raw system call, io_uring, a descriptor
//! inherited across `exec`) fails on it (`read` `EBADF`, `write` `EPERM`,
//! `mmap` `EACCES`) instead of silently reading or writing something else.
//! The hooked data calls run here on the open's [`DataFile`], with the
//! offset and `O_APPEND` in a page shared by every descriptor `dup`ed from
//! the open and by the processes that inherit it across `fork` and `exec`
//! ([`crate::desc`]), as the kernel shares a description's.
//!
//! Every open of one file (file system and path) in a process shares one
//! [`SharedFile`]: one open of the file system's and one map, as a kernel
//! file system shares the inode, so that writes through one open are read
//! at once through the others (SQLite with a connection per thread). Each
//! [`EngineOpen`] keeps what POSIX keeps per open file description (offset,
//! `O_APPEND`, access mode). A new open of a held file persists the shared
//! state and opens the file again (close-to-open: it sees what other
//! processes persisted before it).
//!
//! Persistence follows the file system's close-to-open rule: a file that
//! was written is flushed (`FileSystem::flush`) at every close of one of
//! its descriptors, at `fsync`, before a shrinking `ftruncate`, before
//! `exec` and at exit; it is released at the last close of its last open
//! in the process (or at exit).
//!
//! `fork`: the child's copy of an open shares the offset, and keeps the
//! parent's map (copied at the fork) but not its handle: at its first data
//! call the child opens the file again, so that its writes go to a log of
//! its own, as plfs's cross-process rule requires, and never to the
//! parent's.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use mapfs::engine::DataFile;
use mapfs::{OpenFlags, Opened};
use mapfs_interpose::sync::{Mutex, RwLock};

use crate::desc::Desc;
use crate::state::{self, embs};

/// What a process holds of one engine-served file (a file system and a
/// path), shared by every open of it in the process, as a kernel file
/// system shares the inode: writes through one open are read at once
/// through the others, and the process's record locks on it are one set.
pub struct SharedFile {
    idx: usize,
    path: PathBuf,
    /// The flags given to the file system at open (without `O_TRUNC`), for
    /// a forked child's reopen: the widest access any open asked.
    fsflags: AtomicI32,
    inner: RwLock<Inner>,
    /// The process's POSIX record locks on the file (see [`crate::locks`]):
    /// a description of the file system's lock file, opened at the first
    /// lock call, with the fork generation that opened it (a forked child
    /// opens its own: POSIX locks are not inherited).
    posix_locks: Mutex<Option<(u64, OwnedFd)>>,
    /// A child was forked while this process held the file (see
    /// [`crate::state::Emb::keeps_writers`]).
    forked: std::sync::atomic::AtomicBool,
}

/// One open of an engine-served file, shared by its `dup`s: what POSIX
/// keeps per open file description (offset, `O_APPEND`, access mode).
pub struct EngineOpen {
    shared: Arc<SharedFile>,
    /// The flags of the application's open (carried across `exec`).
    flags: i32,
    /// The placeholder's inode: recognises its descriptors however they
    /// were duplicated (see [`before_exec`]).
    ph_ino: u64,
    /// The fork generation that made this open (see [`GEN`]).
    gen: u64,
    /// Offset and `O_APPEND`, shared like a description's.
    desc: Desc,
    /// Where this open's `flock`s and open-file-description locks are kept
    /// (see [`EngineOpen::ofd_lock_fd`]), opened at the first such call.
    locks: std::sync::OnceLock<Option<OwnedFd>>,
    readable: bool,
    writable: bool,
}

/// What one process image holds of a file.
struct Inner {
    handle: u64,
    data: DataFile,
    /// The fork generation that opened it (see [`GEN`]).
    gen: u64,
    /// Changed since the last flush.
    dirty: bool,
}

impl Inner {
    /// The state of file-system open `opened`, made in fork generation
    /// `gen`.
    fn new(opened: Opened, gen: u64, dirty: bool) -> Inner {
        Inner {
            handle: opened.handle,
            data: DataFile::new(opened),
            gen,
            dirty,
        }
    }
}

/// Bumped in a forked child: opens of an older generation are the
/// parent's and must be reopened before use.
static GEN: AtomicU64 = AtomicU64::new(0);

static TABLE: RwLock<Option<HashMap<i32, Arc<EngineOpen>>>> = RwLock::new(None);
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The files this process holds open through the engine, by file system
/// and path: every open of one joins its [`SharedFile`].
type Files = HashMap<(usize, PathBuf), Weak<SharedFile>>;
static FILES: Mutex<Option<Files>> = Mutex::new(None);

/// Whether this process holds `path` of file system `idx` open through the
/// engine already: a new open of it joins that state (see [`adopt`]), so
/// the file system's open must not truncate (the caller truncates through
/// the joined state instead).
pub fn held(idx: usize, path: &std::path::Path) -> bool {
    if !any() {
        return false;
    }
    FILES
        .lock()
        .as_ref()
        .and_then(|m| m.get(&(idx, path.to_path_buf())))
        .is_some_and(|w| w.strong_count() != 0)
}

/// Whether any placeholder is open (the hooks' fast path).
#[inline]
pub fn any() -> bool {
    COUNT.load(Ordering::Acquire) != 0
}

/// The open behind placeholder `fd`.
pub fn get(fd: i32) -> Option<Arc<EngineOpen>> {
    if !any() {
        return None;
    }
    TABLE.read().as_ref()?.get(&fd).cloned()
}

fn insert(fd: i32, o: Arc<EngineOpen>) {
    let mut g = TABLE.write();
    let m = g.get_or_insert_with(HashMap::new);
    m.insert(fd, o);
    COUNT.store(m.len(), Ordering::Release);
}

fn remove(fd: i32) -> Option<Arc<EngineOpen>> {
    if !any() {
        return None;
    }
    let mut g = TABLE.write();
    let m = g.as_mut()?;
    let o = m.remove(&fd);
    COUNT.store(m.len(), Ordering::Release);
    o
}

/// A sealed empty memfd reopened write-only: no data call reaches any
/// bytes through it.
fn placeholder() -> Result<OwnedFd, i32> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let m = rustix::fs::memfd_create(
        "mapfs-embed-placeholder",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| e.raw_os_error())?;
    rustix::fs::fcntl_add_seals(
        &m,
        SealFlags::SEAL | SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK,
    )
    .map_err(|e| e.raw_os_error())?;
    let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&m));
    // Without /proc the sealed memfd itself serves (unhooked reads then
    // see an empty file instead of failing).
    Ok(rustix::fs::open(
        proc_path.as_str(),
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap_or(m))
}

/// Lowest number for the descriptors an engine open holds for its life:
/// programs take small numbers for themselves (see [`mapfs::fdnum`]).
pub const HIGH_FD: i32 = mapfs::fdnum::LASTING_FROM;

/// Raw descriptor `fd` (or an error, -1) moved to a number of [`HIGH_FD`]
/// or more, keeping its close-on-exec flag (kept where it is when that
/// fails).
pub fn above_program_raw(fd: i32) -> i32 {
    if !(0..HIGH_FD).contains(&fd) {
        return fd;
    }
    // SAFETY: the library's own descriptor, just opened, borrowed here.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let cloexec =
        rustix::io::fcntl_getfd(b).is_ok_and(|f| f.contains(rustix::io::FdFlags::CLOEXEC));
    let moved = rustix::io::fcntl_dupfd_cloexec(b, HIGH_FD).and_then(|high| {
        if !cloexec {
            rustix::io::fcntl_setfd(&high, rustix::io::FdFlags::empty())?;
        }
        Ok(high)
    });
    match moved {
        Ok(high) => {
            // SAFETY: the low number is the library's and now unused.
            unsafe { rustix::io::close(fd) };
            std::os::fd::IntoRawFd::into_raw_fd(high)
        }
        Err(_) => fd,
    }
}

/// `f` moved to a descriptor number of [`HIGH_FD`] or more when nothing
/// else holds it (kept as it is when that fails).
fn above_program_fds(f: Arc<std::fs::File>) -> Arc<std::fs::File> {
    use std::os::fd::AsRawFd;
    if f.as_raw_fd() >= HIGH_FD {
        return f;
    }
    match Arc::try_unwrap(f) {
        Ok(file) => Arc::new(std::fs::File::from(mapfs::fdnum::lasting(file.into()))),
        Err(shared) => shared,
    }
}

/// `opened` with its backing descriptors moved [`above_program_fds`].
fn lifted(mut opened: Opened) -> Opened {
    opened.files = opened.files.into_iter().map(above_program_fds).collect();
    opened
}

/// The device of memfds (every placeholder's `st_dev`).
fn placeholder_dev() -> Option<u64> {
    static DEV: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| {
        let m =
            rustix::fs::memfd_create("mapfs-embed-dev", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
        rustix::fs::fstat(&m).ok().map(|st| st.st_dev)
    })
}

/// This process's id as the library knows it (set at start and by the
/// fork handler).
static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn own_pid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// Running in a `vfork` child (or `posix_spawn`'s), which shares the
/// parent's memory: the table is the parent's and must not change.
pub fn foreign() -> bool {
    PID.load(Ordering::Relaxed) != own_pid()
}

/// Whether open flags `f` allow writing.
fn writes(f: i32) -> bool {
    f & libc::O_ACCMODE != libc::O_RDONLY
}

/// Whether open flags `f` allow reading.
fn reads(f: i32) -> bool {
    f & libc::O_ACCMODE != libc::O_WRONLY
}

/// The access mode that serves opens of modes `a` and `b` both.
fn union_access(a: i32, b: i32) -> i32 {
    if (reads(a) || reads(b)) && (writes(a) || writes(b)) {
        libc::O_RDWR
    } else if writes(a) || writes(b) {
        libc::O_WRONLY
    } else {
        libc::O_RDONLY
    }
}

/// The process's state of `idx`:`path`, made from `opened` (the file
/// system's open just done) or joined when the process holds the file
/// already. Returns it and whether `opened` became its state (else it was
/// released, or kept by [`SharedFile::take`]'s reopen).
fn join(
    idx: usize,
    path: &std::path::Path,
    fsflags: i32,
    opened: Opened,
) -> (Arc<SharedFile>, bool) {
    let now = GEN.load(Ordering::Acquire);
    let found = {
        let mut g = FILES.lock();
        let m = g.get_or_insert_with(HashMap::new);
        let key = (idx, path.to_path_buf());
        match m.get(&key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                // A state whose last open is closing now (its entry goes at
                // the end of its release) was persisted before it died, maybe
                // after `opened` was made: the file is opened again.
                let dying = m.contains_key(&key);
                let opened = if dying && fsflags & libc::O_TRUNC == 0 {
                    reopen(idx, path, fsflags, opened)
                } else {
                    opened
                };
                // Made under the registry's lock: two opens racing make one.
                let s = Arc::new(SharedFile {
                    idx,
                    path: path.to_path_buf(),
                    fsflags: AtomicI32::new(fsflags & !libc::O_TRUNC),
                    inner: RwLock::new(Inner::new(opened, now, fsflags & libc::O_TRUNC != 0)),
                    posix_locks: Mutex::new(None),
                    forked: std::sync::atomic::AtomicBool::new(false),
                });
                m.retain(|_, w| w.strong_count() != 0);
                m.insert(key, Arc::downgrade(&s));
                return (s, true);
            }
        }
    };
    let took = found.take(opened, fsflags);
    (found, took)
}

/// `opened` replaced by a new open of the file (released), or kept when
/// the file system refuses.
fn reopen(idx: usize, path: &std::path::Path, fsflags: i32, opened: Opened) -> Opened {
    let fs = &embs()[idx].fs;
    let ctx = state::ctx();
    match fs.open(&ctx, path, OpenFlags(fsflags)) {
        Ok(o) => {
            let _ = fs.release(&ctx, path, opened.handle, &opened.map);
            lifted(o)
        }
        Err(_) => opened,
    }
}

/// Takes `opened` (not whole-file 1-to-1, or a file the process holds
/// through the engine already) as an engine open and returns its
/// placeholder, `FD_CLOEXEC` set (the caller applies the open's flags).
/// `desc`: the description carried from a previous image, or `None` for a
/// new one. An `O_TRUNC` in `flags` that `fsflags` lacks (see [`held`]) is
/// done here, on the joined state.
pub fn adopt(
    idx: usize,
    path: PathBuf,
    flags: i32,
    fsflags: i32,
    opened: Opened,
    desc: Option<Desc>,
) -> Result<OwnedFd, i32> {
    let e = &embs()[idx];
    let opened = lifted(opened);
    let handle = opened.handle;
    let fail = |opened: &Opened, n: i32| {
        let _ = e.fs.release(&state::ctx(), &path, handle, &opened.map);
        n
    };
    let desc = match desc {
        Some(d) => Ok(d),
        None => {
            let name = format!(
                "{CARRY}{idx}:{}:{}:{}",
                fsflags & !libc::O_TRUNC,
                flags & !libc::O_TRUNC,
                path.display()
            );
            let carryable = name.len() <= 249 && !name.contains('\0');
            Desc::new(
                carryable.then_some(name.as_str()),
                flags & libc::O_APPEND != 0,
            )
        }
    };
    let desc = desc.map_err(|n| fail(&opened, n))?;
    let fd = placeholder().map_err(|n| fail(&opened, n))?;
    let ph_ino = rustix::fs::fstat(&fd)
        .map_err(|err| fail(&opened, err.raw_os_error()))?
        .st_ino;
    let readable = reads(flags) && flags & libc::O_PATH == 0;
    let writable = writes(flags) && flags & libc::O_PATH == 0;
    let (shared, took) = join(idx, &path, fsflags, opened);
    let open = Arc::new(EngineOpen {
        shared,
        flags,
        ph_ino,
        gen: GEN.load(Ordering::Acquire),
        desc,
        locks: std::sync::OnceLock::new(),
        readable,
        writable,
    });
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // An open whose descriptor was closed unseen (`close_range`, a raw
    // system call) ends now that its number is reused.
    let _ = closed(raw);
    insert(raw, open.clone());
    let truncated = took && fsflags & libc::O_TRUNC != 0;
    if flags & libc::O_TRUNC != 0 && writable && !truncated {
        if let Err(n) = open.truncate(0) {
            let _ = closed(raw);
            return Err(n);
        }
    }
    Ok(fd)
}

impl SharedFile {
    /// Joins the file system's open `opened` (flags `fsflags`) to this
    /// state. In a forked child that has not used the state yet (the
    /// parent's), `opened` becomes it. Otherwise, as an open must see what
    /// other processes persisted before it (close-to-open), the state is
    /// persisted and opened again from the file system, with every access
    /// its opens need, and `opened` (made before that) is released.
    /// Returns whether `opened` became the state.
    fn take(&self, opened: Opened, fsflags: i32) -> bool {
        let now = GEN.load(Ordering::Acquire);
        let ctx = state::ctx();
        let mut g = self.inner.write();
        if g.gen != now {
            let old = std::mem::replace(
                &mut *g,
                Inner::new(opened, now, fsflags & libc::O_TRUNC != 0),
            );
            self.fsflags
                .store(fsflags & !libc::O_TRUNC, Ordering::Release);
            // The parent's state is the parent's to release.
            std::mem::forget(old);
            return true;
        }
        let cur = self.fsflags.load(Ordering::Acquire);
        let both = (cur & !(libc::O_ACCMODE | libc::O_TRUNC)) | union_access(cur, fsflags);
        if g.dirty {
            g.dirty = false;
            if let Err(err) = self.fs().flush(&ctx, &self.path, g.handle, &g.data.map()) {
                // Not opened again: that would lose this process's writes.
                g.dirty = true;
                crate::log(format_args!("flush of {}: {err}", self.path.display()));
            }
        }
        // Released first: a file system that persists a map at release
        // (an `O_TRUNC` done by this open) has it in the open below.
        let _ = self
            .fs()
            .release(&ctx, &self.path, opened.handle, &opened.map);
        if g.dirty {
            return false;
        }
        match self.fs().open(&ctx, &self.path, OpenFlags(both)) {
            Ok(o) => {
                let old = std::mem::replace(&mut *g, Inner::new(lifted(o), now, false));
                self.fsflags.store(both, Ordering::Release);
                self.retire(old);
            }
            Err(err) => {
                // The state stays; the new open's calls that need an access
                // it lacks fail (`EBADF`, from the engine).
                crate::log(format_args!("reopen of {}: {err}", self.path.display()));
            }
        }
        false
    }

    /// Releases a state replaced by [`SharedFile::take`] (flushed first),
    /// unless a forked child may still write through it (see
    /// [`SharedFile::release`]).
    fn retire(&self, old: Inner) {
        let ctx = state::ctx();
        if old.dirty {
            let _ = self
                .fs()
                .flush(&ctx, &self.path, old.handle, &old.data.map());
        }
        if self.forked.load(Ordering::Acquire) && embs()[self.idx].keeps_writers {
            return;
        }
        let _ = self
            .fs()
            .release(&ctx, &self.path, old.handle, &old.data.map());
    }

    /// Runs `f` on this image's state of the file, reopening it first in a
    /// forked child.
    fn with<T>(&self, f: impl FnOnce(&Inner) -> Result<T, i32>) -> Result<T, i32> {
        let now = GEN.load(Ordering::Acquire);
        {
            let g = self.inner.read();
            if g.gen == now {
                return f(&g);
            }
        }
        let mut g = self.inner.write();
        if g.gen != now {
            let o = self
                .fs()
                .open(
                    &state::ctx(),
                    &self.path,
                    OpenFlags(self.fsflags.load(Ordering::Acquire)),
                )
                .map_err(|e| e.errno())?;
            let old = std::mem::replace(&mut *g, Inner::new(lifted(o), now, false));
            // The parent's handle is the parent's to release.
            std::mem::forget(old);
        }
        f(&g)
    }

    fn mark(&self) {
        self.inner.write().dirty = true;
    }

    /// The file system of this file.
    fn fs(&self) -> &dyn mapfs::FileSystem {
        &*embs()[self.idx].fs
    }

    /// Persists this image's map if it changed (close, fsync, exec, exit).
    fn flush(&self) -> Result<(), i32> {
        let mut g = self.inner.write();
        if g.gen != GEN.load(Ordering::Acquire) || !g.dirty {
            return Ok(());
        }
        g.dirty = false;
        self.fs()
            .flush(&state::ctx(), &self.path, g.handle, &g.data.map())
            .map_err(|e| e.errno())
    }

    /// Ends the file's state in this image (the last close of its last
    /// open in the process).
    fn release(&self) -> Result<(), i32> {
        let g = self.inner.read();
        if g.gen != GEN.load(Ordering::Acquire) {
            return Ok(());
        }
        if self.forked.load(Ordering::Acquire) && embs()[self.idx].keeps_writers {
            // A forked child may write through the open still: what the
            // file system keeps for it (a version it would drop as
            // unchanged) stays, as a mount keeps it until the last close
            // of every process.
            return Ok(());
        }
        self.fs()
            .release(&state::ctx(), &self.path, g.handle, &g.data.map())
            .map_err(|e| e.errno())
    }

    /// The description of the file system's lock file that holds this
    /// process's POSIX record locks on the file (one for every open of it
    /// in the process, as POSIX locks belong to the process), opened at
    /// the first call. `ENOLCK` when the file system has none.
    pub fn posix_lock_fd(&self) -> Result<i32, i32> {
        use std::os::fd::AsRawFd;
        let now = GEN.load(Ordering::Acquire);
        let mut g = self.posix_locks.lock();
        if let Some((gen, fd)) = g.as_ref() {
            if *gen == now {
                return Ok(fd.as_raw_fd());
            }
        }
        let fd = open_lock_file(self)?;
        let raw = fd.as_raw_fd();
        *g = Some((now, fd));
        Ok(raw)
    }

    /// Drops the process's POSIX record locks on the file (at the close of
    /// any of its descriptors, as POSIX says).
    fn unlock_posix(&self) {
        use std::os::fd::AsRawFd;
        let g = self.posix_locks.lock();
        let Some((gen, fd)) = g.as_ref() else {
            return;
        };
        if *gen != GEN.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: `flock` is plain data; all-zero is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_UNLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        // SAFETY: libc's fcntl on the process's lock description with a
        // valid `struct flock` (whole file: start 0, length 0).
        unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_OFD_SETLK,
                &mut fl as *mut libc::flock,
            )
        };
    }
}

/// The file system's lock file for `s` (`FileSystem::lock_file`), above
/// the program's descriptor numbers.
fn open_lock_file(s: &SharedFile) -> Result<OwnedFd, i32> {
    match s.fs().lock_file(&state::ctx(), &s.path) {
        Ok(Some(f)) => Ok(mapfs::fdnum::lasting(OwnedFd::from(f))),
        Ok(None) => Err(libc::ENOLCK),
        Err(e) => {
            crate::log(format_args!("lock file of {}: {e}", s.path.display()));
            Err(libc::ENOLCK)
        }
    }
}

impl EngineOpen {
    fn with<T>(&self, f: impl FnOnce(&Inner) -> Result<T, i32>) -> Result<T, i32> {
        self.shared.with(f)
    }

    fn mark(&self) {
        self.shared.mark();
    }

    fn fs(&self) -> &dyn mapfs::FileSystem {
        self.shared.fs()
    }

    /// The process's state of this open's file.
    pub fn shared(&self) -> &SharedFile {
        &self.shared
    }

    /// The size as this process sees it.
    pub fn size(&self) -> Result<u64, i32> {
        self.with(|i| i.data.size().map_err(|e| e.errno()))
    }

    /// `pread`.
    pub fn pread(&self, buf: &mut [u8], off: u64) -> Result<usize, i32> {
        if !self.readable {
            return Err(libc::EBADF);
        }
        self.with(|i| i.data.read(off, buf).map_err(|e| e.errno()))
    }

    /// `read` at the description's offset. Another process sharing it
    /// may move it meanwhile: the read is done again from where it is then,
    /// as if it came after.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, i32> {
        let off = self.desc.offset();
        loop {
            let cur = off.load(Ordering::Acquire);
            let n = self.pread(buf, cur)?;
            if off
                .compare_exchange(cur, cur + n as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(n);
            }
        }
    }

    /// Writes at `off` (at the end with `O_APPEND`, as Linux does for
    /// `pwrite` too); returns the count and where the write ended.
    fn write_at(&self, data: &[u8], off: u64) -> Result<(usize, u64), i32> {
        if !self.writable {
            return Err(libc::EBADF);
        }
        let r = self.with(|i| {
            let at = if self.desc.append() {
                // This image's view of the size misses what other
                // processes sharing the description appended since it
                // opened; each left the shared offset at its end.
                let size = i.data.size().map_err(|e| e.errno())?;
                size.max(self.desc.offset().load(Ordering::Acquire))
            } else {
                off
            };
            let fs = self.fs();
            let ctx = state::ctx();
            let mut remap = |map: &mapfs::DataMap, o: u64, l: u64| {
                fs.remap(&ctx, &self.shared.path, i.handle, map, o, l)
            };
            let n = i.data.write(at, data, &mut remap).map_err(|e| e.errno())?;
            Ok((n, at + n as u64))
        })?;
        self.mark();
        Ok(r)
    }

    /// `pwrite`.
    pub fn pwrite(&self, data: &[u8], off: u64) -> Result<usize, i32> {
        Ok(self.write_at(data, off)?.0)
    }

    /// `write` at the description's offset: the range is taken from the
    /// shared offset first, so writers sharing it (a process and its
    /// children) never write over each other, as the kernel's lock on the
    /// offset ensures for a description.
    pub fn write(&self, data: &[u8]) -> Result<usize, i32> {
        let off = self.desc.offset();
        if self.desc.append() {
            let (n, end) = self.write_at(data, 0)?;
            off.store(end, Ordering::Release);
            return Ok(n);
        }
        let len = data.len() as u64;
        let at = off.fetch_add(len, Ordering::AcqRel);
        match self.write_at(data, at) {
            Ok((n, end)) => {
                if end < at + len {
                    // Short: give back what was not written, unless the
                    // offset moved on since.
                    let _ =
                        off.compare_exchange(at + len, end, Ordering::AcqRel, Ordering::Acquire);
                }
                Ok(n)
            }
            Err(e) => {
                let _ = off.compare_exchange(at + len, at, Ordering::AcqRel, Ordering::Acquire);
                Err(e)
            }
        }
    }

    /// `lseek`.
    pub fn seek(&self, offset: i64, whence: i32) -> Result<u64, i32> {
        let off = self.desc.offset();
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => off.load(Ordering::Acquire) as i64,
            libc::SEEK_END => self.size()? as i64,
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let size = self.size()?;
                if offset < 0 || offset as u64 >= size {
                    return Err(libc::ENXIO);
                }
                let pos = self
                    .with(|i| i.data.seek(offset as u64, whence).map_err(|e| e.errno()))?
                    .min(size);
                off.store(pos, Ordering::Release);
                return Ok(pos);
            }
            _ => return Err(libc::EINVAL),
        };
        let pos = base
            .checked_add(offset)
            .filter(|p| *p >= 0)
            .ok_or(libc::EINVAL)?;
        off.store(pos as u64, Ordering::Release);
        Ok(pos as u64)
    }

    /// `ftruncate`. A shrink is preceded by a flush: a file system that
    /// records what each open changed tells the shrink from the writes it
    /// cuts only that way (see `FileSystem::flush`).
    pub fn truncate(&self, size: u64) -> Result<(), i32> {
        if !self.writable {
            return Err(libc::EINVAL);
        }
        if self.size()? > size {
            self.shared.flush()?;
        }
        self.with(|i| i.data.truncate(size).map_err(|e| e.errno()))?;
        // The offset of an appending open stands for the end of its appends
        // (see `write_at`): every open of the file in the process sees the
        // new end.
        let opens: Vec<Arc<EngineOpen>> = match TABLE.read().as_ref() {
            Some(m) => m
                .values()
                .filter(|o| Arc::ptr_eq(&o.shared, &self.shared))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        for o in opens.iter().map(|o| &**o).chain([self]) {
            if o.desc.append() {
                let _ = o.desc.offset().fetch_min(size, Ordering::AcqRel);
            }
        }
        self.mark();
        Ok(())
    }

    /// `fallocate`.
    pub fn fallocate(&self, mode: i32, off: u64, len: u64) -> Result<(), i32> {
        if !self.writable {
            return Err(libc::EBADF);
        }
        self.with(|i| i.data.fallocate(mode, off, len).map_err(|e| e.errno()))?;
        self.mark();
        Ok(())
    }

    /// `fsync`/`fdatasync`: the backing files, then the map.
    pub fn fsync(&self, datasync: bool) -> Result<(), i32> {
        self.with(|i| i.data.fsync(datasync).map_err(|e| e.errno()))?;
        self.shared.flush()
    }

    /// The file system's lock file for this file
    /// (`FileSystem::lock_file`) as this open's own description, opened at
    /// its first `flock` or open-file-description lock: those locks belong
    /// to the open (its `dup`s and forked children share them, two opens
    /// conflict), and every process of the job using the same backing
    /// directory locks the same file. `ENOLCK` when the file system has
    /// none.
    pub fn ofd_lock_fd(&self) -> Result<std::os::fd::BorrowedFd<'_>, i32> {
        use std::os::fd::AsFd;
        let fd = self.locks.get_or_init(|| open_lock_file(&self.shared).ok());
        fd.as_ref().map(|f| f.as_fd()).ok_or(libc::ENOLCK)
    }

    /// The description's offset now (for locks relative to it).
    pub fn offset_now(&self) -> u64 {
        self.desc.offset().load(Ordering::Acquire)
    }

    /// Follows `F_SETFL`.
    pub fn flags(&self) -> i32 {
        self.flags
    }

    /// Changes the application's flags (`F_SETFL`: only `O_APPEND` counts).
    pub fn set_flags(&self, flags: i32) {
        self.desc.set_append(flags & libc::O_APPEND != 0);
    }

    /// A metadata call of the file system on this open's file (`fchmod`,
    /// `fsetxattr`...), by the path it was opened at.
    pub fn meta<T>(
        &self,
        f: impl FnOnce(&dyn mapfs::FileSystem, &mapfs::Ctx, &std::path::Path) -> mapfs::Result<T>,
    ) -> Result<T, i32> {
        f(self.fs(), &state::ctx(), &self.shared.path).map_err(|e| e.errno())
    }

    /// The file's attributes, with the size this open sees.
    pub fn attr(&self) -> Result<(mapfs::Attr, u64), i32> {
        let e = &embs()[self.shared.idx];
        let mut a =
            e.fs.getattr(&state::ctx(), &self.shared.path)
                .map_err(|e| e.errno())?;
        a.size = self.size()?;
        a.blocks = a.size.div_ceil(512);
        Ok((a, e.dev))
    }
}

/// `close` of `fd`: flushes its open if it wrote, releases it at its last
/// descriptor. `Some(Err)` reports a failed flush (the descriptor is closed
/// all the same, as the kernel does).
pub fn closed(fd: i32) -> Option<Result<(), i32>> {
    if !any() || foreign() {
        return None;
    }
    let o = remove(fd)?;
    let mut r = o.shared.flush();
    // POSIX: closing any descriptor of a file drops the process's record
    // locks on it, whichever descriptor took them.
    o.shared.unlock_posix();
    let Some(last) = Arc::into_inner(o) else {
        return Some(r);
    };
    let EngineOpen {
        shared,
        gen,
        desc,
        locks,
        ..
    } = last;
    if gen != GEN.load(Ordering::Acquire) {
        // An open a forked child inherited: its descriptors (the
        // description's memfd, its lock file) are numbers the child may
        // have closed already (subprocess's close_fds closes every
        // descriptor in turn, through this hook, before `exec`); dropping
        // them would close whatever has those numbers now. They close at
        // `exec` (close-on-exec) or exit.
        std::mem::forget(desc);
        std::mem::forget(locks);
    }
    if let Some(s) = Arc::into_inner(shared) {
        let rel = s.release();
        if r.is_ok() {
            r = rel;
        }
        if let Some(m) = FILES.lock().as_mut() {
            let key = (s.idx, s.path.clone());
            if m.get(&key).is_some_and(|w| w.strong_count() == 0) {
                m.remove(&key);
            }
        }
        if s.inner.read().gen != GEN.load(Ordering::Acquire) {
            // A file a forked child inherited and never used: its backing
            // descriptors are the parent's state (see above).
            std::mem::forget(s);
        }
    }
    Some(r)
}

/// After a successful `dup` of `old` to `new` (the real call done).
pub fn duped(old: i32, new: i32) {
    if old == new || foreign() {
        return;
    }
    // `dup2`/`dup3` closed what `new` was.
    let _ = closed(new);
    if let Some(o) = get(old) {
        insert(new, o);
    }
}

/// Prefix of the name of a memfd that carries an open across `exec`.
const CARRY: &str = "mapfs-embed-fd:";

/// Before `exec`: flushes every open, and puts under each of its
/// descriptors (keeping its `FD_CLOEXEC`) a memfd whose name says what it is (file system,
/// flags, offset, path), which the new image's constructor reopens
/// ([`adopt_inherited`]). A name too long for a memfd (249 bytes) is not
/// carried: that descriptor fails every data call in the new image.
///
/// The descriptors are found by their inode (each placeholder is a memfd
/// of its own) in `/proc/self/fd`, not by the table: a `vfork` child (or
/// `posix_spawn`'s) `dup2`s them without the table seeing it, as its hooks
/// must leave the parent's table alone ([`foreign`]).
pub fn before_exec() -> Vec<(i32, OwnedFd)> {
    let mut saved = Vec::new();
    if !foreign() && crate::canary::intact() {
        flush_all();
    }
    let opens: HashMap<u64, Arc<EngineOpen>> = match TABLE.read().as_ref() {
        Some(m) => m.values().map(|o| (o.ph_ino, o.clone())).collect(),
        None => return saved,
    };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return saved;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    let memfd_dev = placeholder_dev();
    let entries: Vec<(i32, Arc<EngineOpen>)> = fds
        .into_iter()
        .filter_map(|fd| {
            // SAFETY: borrowed for one fstat; a closed number fails it.
            let st = rustix::fs::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }).ok()?;
            if Some(st.st_dev) != memfd_dev {
                return None;
            }
            Some((fd, opens.get(&st.st_ino)?.clone()))
        })
        .collect();
    for (fd, o) in entries {
        // SAFETY: a descriptor of the table, borrowed for two fcntls.
        let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        // Descriptors with FD_CLOEXEC are carried too: `posix_spawn`'s file
        // actions can `dup2` them into the child.
        let Ok(fdflags) = rustix::io::fcntl_getfd(bfd) else {
            continue;
        };
        if !o.desc.carryable() {
            crate::log(format_args!(
                "exec: descriptor {fd} not carried: path too long"
            ));
            continue;
        }
        crate::log(format_args!(
            "exec: descriptor {fd} carried ({})",
            o.shared.path.display()
        ));
        // SAFETY: `fd` is the table's descriptor, replaced in place (and
        // not closed: the `OwnedFd` is forgotten).
        let mut target = unsafe { OwnedFd::from_raw_fd(fd) };
        // A child that closed every descriptor it does not pass on
        // (`subprocess`'s close_fds) closed the description's memfd too:
        // it carries a copy then, the offset as it is now, no longer shared.
        let copy = match rustix::io::fcntl_getfd(o.desc.memfd()) {
            Ok(_) => None,
            Err(_) => match o.desc.copy() {
                Ok(c) => Some(c),
                Err(n) => {
                    crate::log(format_args!("exec: descriptor {fd} not carried: errno {n}"));
                    std::mem::forget(target);
                    continue;
                }
            },
        };
        let carrier = copy.as_ref().map_or(o.desc.memfd(), |c| c.memfd());
        if let Ok(keep) = rustix::io::fcntl_dupfd_cloexec(&target, HIGH_FD) {
            if rustix::io::dup2(carrier, &mut target).is_ok() {
                let _ = rustix::io::fcntl_setfd(&target, fdflags);
                saved.push((fd, keep));
            }
        }
        std::mem::forget(target);
    }
    saved
}

/// After a `posix_spawn` (the parent goes on): puts the placeholders
/// [`before_exec`] replaced back under their numbers.
pub fn after_spawn(saved: Vec<(i32, OwnedFd)>) {
    for (fd, keep) in saved {
        // SAFETY: `fd` is the table's descriptor, replaced in place and not
        // closed (the `OwnedFd` is forgotten).
        let mut target = unsafe { OwnedFd::from_raw_fd(fd) };
        let flags = rustix::io::fcntl_getfd(&target);
        let _ = rustix::io::dup2(&keep, &mut target);
        if let Ok(f) = flags {
            let _ = rustix::io::fcntl_setfd(&target, f);
        }
        std::mem::forget(target);
    }
}

/// The memfds this image inherited: each one's number and name (what
/// `memfd_create` was given), from one read of `/proc/self/fd`.
pub(crate) fn inherited_memfds() -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ent in dir.flatten() {
        let Some(fd) = ent.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(ent.path()) else {
            continue;
        };
        let link = link.to_string_lossy();
        if let Some(name) = link.strip_prefix("/memfd:") {
            out.push((
                fd,
                name.strip_suffix(" (deleted)").unwrap_or(name).to_owned(),
            ));
        }
    }
    out
}

/// In a new process image: reopens the opens carried across `exec` (see
/// [`before_exec`]) under the same descriptor numbers, among `memfds`
/// (`inherited_memfds`).
pub fn adopt_inherited(memfds: &[(i32, String)]) {
    for (fd, name) in memfds {
        let fd = *fd;
        let Some(rest) = name.strip_prefix(CARRY) else {
            continue;
        };
        let mut it = rest.splitn(4, ':');
        let (Some(idx), Some(fsflags), Some(flags), Some(path)) = (
            it.next().and_then(|v| v.parse::<usize>().ok()),
            it.next().and_then(|v| v.parse::<i32>().ok()),
            it.next().and_then(|v| v.parse::<i32>().ok()),
            it.next(),
        ) else {
            continue;
        };
        if idx >= embs().len() {
            continue;
        }
        let path = PathBuf::from(path);
        let e = &embs()[idx];
        let opened = match e.fs.open(&state::ctx(), &path, OpenFlags(fsflags)) {
            Ok(o) => o,
            Err(err) => {
                crate::warn(format_args!(
                    "descriptor {fd} (inherited {}): {err}; it cannot be served",
                    path.display()
                ));
                continue;
            }
        };
        // SAFETY: the inherited descriptor, borrowed while it is mapped.
        let desc = match Desc::inherited(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }, name) {
            Ok(d) => d,
            Err(n) => {
                crate::warn(format_args!(
                    "descriptor {fd} (inherited {}): errno {n}; it cannot be served",
                    path.display()
                ));
                let _ =
                    e.fs.release(&state::ctx(), &path, opened.handle, &opened.map);
                continue;
            }
        };
        let Ok(ph) = adopt(
            idx,
            path,
            flags & !libc::O_TRUNC,
            fsflags,
            opened,
            Some(desc),
        ) else {
            continue;
        };
        let new = std::os::fd::AsRawFd::as_raw_fd(&ph);
        if let Some(o) = remove(new) {
            // SAFETY: `fd` is the inherited descriptor, replaced in place.
            let mut target = unsafe { OwnedFd::from_raw_fd(fd) };
            if rustix::io::dup2(&ph, &mut target).is_ok() {
                insert(fd, o);
            }
            std::mem::forget(target);
        }
    }
}

/// Flushes every open this image changed (before `fork`, before `exec`,
/// at exit): a forked child that uses an open opens it again from the file
/// system ([`EngineOpen::with`]) and must find the parent's writes there,
/// as it would read a local file's.
pub fn flush_all() {
    if !any() {
        return;
    }
    let opens: Vec<Arc<EngineOpen>> = match TABLE.read().as_ref() {
        Some(m) => m.values().cloned().collect(),
        None => return,
    };
    for o in opens {
        if let Err(n) = o.shared.flush() {
            crate::warn(format_args!(
                "flush of {}: errno {n}",
                String::from_utf8_lossy(
                    &state::Place {
                        idx: o.shared.idx,
                        path: o.shared.path.clone()
                    }
                    .host_path()
                )
            ));
        }
    }
}

/// At exit: flushes and releases every open still held.
pub fn close_all() {
    if !any() {
        return;
    }
    let all: Vec<i32> = match TABLE.read().as_ref() {
        Some(m) => m.keys().copied().collect(),
        None => return,
    };
    for fd in all {
        let _ = closed(fd);
    }
}

static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Refuses `call` on a placeholder: one warning per call name, `errno`.
pub fn refuse(call: &'static str, errno: i32) -> i32 {
    let mut w = WARNED.lock();
    if !w.contains(&call) {
        w.push(call);
        drop(w);
        crate::warn(format_args!(
            "{call} on a file of an embedded file system served by the data engine \
             (a plfs file, a pack file in a slot) cannot be served in-process; it fails \
             with errno {errno}"
        ));
    }
    errno
}

/// In the parent after `fork` (the gate still closed by this thread):
/// the opens are shared with the child from now on.
pub fn forked_parent() {
    if let Some(t) = TABLE.read().as_ref() {
        for o in t.values() {
            o.shared.forked.store(true, Ordering::Release);
        }
    }
}

/// A descriptor of the backing file of the open of placeholder `fd`, when
/// its map in this image is that whole file: `mmap` runs on it natively (a
/// duplicate, so that a close of the open meanwhile cannot hand the call
/// another file).
pub fn whole_backing(fd: i32) -> Option<OwnedFd> {
    if !any() {
        return None;
    }
    let o = get(fd)?;
    o.with(|i| {
        Ok(i.data
            .whole_file_backing()
            .and_then(|f| rustix::io::fcntl_dupfd_cloexec(f, HIGH_FD).ok()))
    })
    .ok()
    .flatten()
}

/// In the child after `fork`: a process of its own.
pub fn forked_child() {
    GEN.fetch_add(1, Ordering::AcqRel);
    PID.store(own_pid(), Ordering::Relaxed);
    // POSIX locks are not inherited: the parent's lock descriptions close
    // here (no thread of the parent was inside the library at the fork, so
    // the numbers are still theirs), and the child opens its own at its
    // first lock call.
    let files: Vec<Arc<SharedFile>> = match FILES.lock().as_ref() {
        Some(m) => m.values().filter_map(Weak::upgrade).collect(),
        None => return,
    };
    for s in files {
        let _ = s.posix_locks.lock().take();
        if Arc::strong_count(&s) == 1 {
            // Held by no open of the child: its backing descriptors are the
            // parent's state.
            std::mem::forget(s);
        }
    }
}

extern "C" fn at_exit() {
    if any() {
        // Streams of placeholders (see `streams`) write through the hooks,
        // which must not be inside the guard: stdio flushes them only
        // after the destructors ran.
        // SAFETY: fflush(NULL) flushes every open output stream.
        unsafe { libc::fflush(std::ptr::null_mut()) };
    }
    if let Some(_g) = crate::Guard::enter() {
        // Not when the library's descriptors were closed behind its back
        // (see `canary`).
        if crate::canary::intact() {
            close_all();
            crate::state::finish_all();
        }
        crate::report::write_at_exit();
    }
}

/// Notes this process's pid (see [`forked_child`]).
pub fn install() {
    PID.store(own_pid(), Ordering::Relaxed);
}

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = at_exit;
