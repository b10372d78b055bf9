//! The interposed libc functions, declared once in one table
//! ([`mapfs_interpose::hooks!`]): each entry generates the exported symbol
//! and the pointer to the real function (`dlsym(RTLD_NEXT)`, resolved by
//! the constructor).
//!
//! `lseek`, `ftruncate`, `fsync` and `fdatasync` matter only to lent
//! descriptors (maps run in-process, [`crate::lent`]); on every other
//! descriptor they are the real call after one load of the fd's state.
//!
//! `isatty` of a file opened through a mount (not adopted) is answered
//! here, `ENOTTY`, what the daemon answers the `TCGETS` ioctl it would
//! otherwise get: Python asks it at every `open`.
//!
//! Deliberately *not* intercepted:
//! - read/write-side calls that need no help: `ioctl` (but the clone
//!   ioctls on lent opens, answered `EOPNOTSUPP` as the mount does),
//!   `fstatfs`... On an
//!   adopted descriptor they are native (it *is* the backing file); on a
//!   pending or lent one they go to the mount's open, which is correct for
//!   them.
//! - path calls (`rename`, `unlink`, `readdir`, `chmod`...): the daemon
//!   stays the single authority on the namespace. (`stat` by path is hooked
//!   only to show a writer the size and times of its own native writes.)
//! - `execl*` (variadic with any number of arguments, which stable Rust
//!   cannot define), and the environment of `posix_spawn*` (hooked only to
//!   hand lent opens back first: the parent keeps running, so its
//!   environment cannot be edited safely): descriptors cross them as they
//!   are. A pending (mount) descriptor is re-adopted by the new image at its
//!   first data call when the pid is unchanged; an adopted one keeps working
//!   natively but the new image no longer knows it is a mapfs file (`fstat`
//!   shows the backing identity; the opener reports the close). `execve`,
//!   `execv`, `execvp`, `execvpe` and `fexecve` hand adopted descriptors on
//!   in `MAPFS_PRELOAD_ADOPTED` and the new image re-adopts them.
//! - `closefrom`, `openat2` (no glibc wrapper), `io_uring`, POSIX AIO:
//!   nothing to do for adopted descriptors; others go through the mount.
//!   (`close_range` is hooked: the shim's own sockets are cut out of the
//!   range and the tracked descriptors in it forgotten.) (A writably lent descriptor is a placeholder open with
//!   neither read nor write access, so such a call fails with `EBADF`
//!   rather than miss or overwrite the shim's writes; see [`crate::lent`].)
//!
//! Variadic C functions (`open`, `openat`, `fcntl`) are defined here with
//! their optional argument as a fixed one: on the x86-64 and AArch64 Linux
//! ABIs a variadic integer argument travels exactly like a fixed one, and
//! the value is only passed on to the real function.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use libc::{off64_t, off_t, size_t, ssize_t, FILE};
use mapfs_interpose::hooks;
use mapfs_interpose::hooks::Real;

use crate::table::{self, ADOPTED, MOUNT, OTHER, UNKNOWN};
use crate::{lent_calls, report, sys, Guard};

/// Before a data call moving `len` bytes on `fd`: adopt a pending
/// descriptor when the policy says so ([`table::serve`]), count the call.
/// For a call a still-pending descriptor makes through the mount, returns
/// the timer of that call: held until the real call returns, it adds the
/// call's time to what the descriptor spent on the mount (the policy
/// adopts once that is about what an adoption costs).
#[inline(always)]
fn data(fd: c_int, len: usize) -> Option<MountCall> {
    match table::state(fd) {
        OTHER => None,
        ADOPTED => {
            report::count_native();
            None
        }
        // Counted where it runs (lent_calls).
        table::ENGINE => None,
        MOUNT => {
            report::count_mount();
            None
        }
        _ => data_slow(fd, len),
    }
}

/// A data call of a pending descriptor through the mount, being timed.
struct MountCall {
    fd: c_int,
    len: usize,
    start: std::time::Instant,
}

impl Drop for MountCall {
    fn drop(&mut self) {
        let took = self.start.elapsed();
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| table::mount_time(self.fd, took, self.len));
        }
    }
}

/// A data call that needs the final file: adopt a pending descriptor now.
#[inline(always)]
fn data_now(fd: c_int) {
    let _ = data(fd, usize::MAX);
}

/// A call the shim cannot run on a lent map (`mmap`, `sendfile`...): the
/// descriptor becomes the final kernel object first (see
/// [`table::serve_final`]).
#[inline(always)]
fn data_final(fd: c_int, why: &str) {
    match table::state(fd) {
        OTHER | ADOPTED | MOUNT => {
            let _ = data(fd, usize::MAX);
        }
        _ => {
            if fd >= 0 {
                if let Some(_g) = Guard::enter() {
                    sys::keep_errno(|| table::serve_final(fd, why));
                }
            }
            let _ = data(fd, usize::MAX);
        }
    }
}

/// Both descriptors are files of mounts, one of them adopted (its
/// descriptor the backing file), so that the kernel answered `EXDEV` for
/// a copy the mount serves.
fn both_mapfs(a: c_int, b: c_int) -> bool {
    let st = (table::state(a), table::state(b));
    matches!(st.0, ADOPTED | MOUNT) && matches!(st.1, ADOPTED | MOUNT) && st != (MOUNT, MOUNT)
}

/// `copy_file_range` between an adopted open and another file of a mount
/// by reads and writes on the two kernel descriptors, as the mount serves
/// it (`None`: the thread is inside the shim, the kernel's answer
/// stands).
///
/// # Safety
/// `off_in` and `off_out` are NULL or valid for reading and writing.
unsafe fn copy_by_hand(
    in_fd: c_int,
    off_in: *mut off64_t,
    out_fd: c_int,
    off_out: *mut off64_t,
    n: size_t,
) -> Option<ssize_t> {
    let _g = Guard::enter()?;
    let res = |r: ssize_t| usize::try_from(r).map_err(|_| sys::errno());
    // SAFETY: per the contract; the guard is held, so libc's calls go to
    // the kernel, on buffers valid for their lengths.
    let r = unsafe {
        mapfs_interpose::copy::by_hand(
            off_in,
            off_out,
            n,
            |b, at| match at {
                Some(x) => res(libc::pread64(
                    in_fd,
                    b.as_mut_ptr().cast(),
                    b.len(),
                    x as off64_t,
                )),
                None => res(libc::read(in_fd, b.as_mut_ptr().cast(), b.len())),
            },
            |d, at| match at {
                Some(x) => res(libc::pwrite64(
                    out_fd,
                    d.as_ptr().cast(),
                    d.len(),
                    x as off64_t,
                )),
                None => res(libc::write(out_fd, d.as_ptr().cast(), d.len())),
            },
        )
    };
    Some(match r {
        Ok(k) => k as ssize_t,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    })
}

#[cold]
#[inline(never)]
fn data_slow(fd: c_int, len: usize) -> Option<MountCall> {
    if fd < 0 {
        return None;
    }
    let _g = Guard::enter()?;
    sys::keep_errno(|| table::serve(fd, len));
    match table::state(fd) {
        ADOPTED => report::count_native(),
        MOUNT => report::count_mount(),
        // Still pending: this call goes through the mount.
        table::PENDING => {
            report::count_mount();
            return Some(MountCall {
                fd,
                len,
                start: std::time::Instant::now(),
            });
        }
        _ => {}
    }
    None
}

/// Total length of an iovec array (for the adoption policy).
///
/// # Safety
/// `iov` points to `cnt` valid iovecs (or `cnt` <= 0).
unsafe fn iov_len(iov: *const libc::iovec, cnt: c_int) -> usize {
    if iov.is_null() || cnt <= 0 {
        return 0;
    }
    // SAFETY: per the contract.
    let v = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    v.iter().fold(0usize, |a, i| a.saturating_add(i.iov_len))
}

/// Before an open of `path`: what this process wrote through a lent open of
/// that file (another descriptor of which keeps it from its last close)
/// must reach the daemon first, or the new open, through the mount, would
/// not see it (the daemon builds the open's map at `open`).
#[inline]
fn before_open(dirfd: c_int, path: *const c_char) {
    if table::lent_open() && !path.is_null() {
        before_open_slow(dirfd, path);
    }
}

#[cold]
#[inline(never)]
fn before_open_slow(dirfd: c_int, path: *const c_char) {
    let Some(_g) = Guard::enter() else {
        return;
    };
    sys::keep_errno(|| {
        // SAFETY: the caller's NUL-terminated path.
        let p = unsafe { std::ffi::CStr::from_ptr(path) };
        if let Ok(st) = rustix::fs::statat(sys::fd(dirfd), p, rustix::fs::AtFlags::empty()) {
            table::push_lent_of(st.st_dev, st.st_ino);
        }
    });
}

/// After an open returned `fd`.
#[inline]
fn opened(fd: c_int, flags: c_int) -> c_int {
    if fd >= 0 && flags & libc::O_PATH == 0 {
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| table::opened(fd));
        }
    }
    fd
}

/// An open that failed for lack of descriptor numbers (`EMFILE`) is made
/// again, once, after the shim gave back the numbers it holds for itself
/// ([`table::reclaim`]): the shim never costs an application a descriptor
/// it could have had without it.
#[inline]
fn retry_emfile<T>(r: T, failed: impl Fn(&T) -> bool, again: impl FnOnce() -> T) -> T {
    if !failed(&r) || sys::errno() != libc::EMFILE {
        return r;
    }
    let freed = match Guard::enter() {
        Some(_g) => sys::keep_errno(table::reclaim),
        None => false,
    };
    if freed {
        again()
    } else {
        r
    }
}

/// [`retry_emfile`] for calls returning a descriptor.
#[inline]
fn fd_retry(r: c_int, again: impl FnOnce() -> c_int) -> c_int {
    retry_emfile(r, |&r| r < 0, again)
}

/// After a stream was opened on `fd` (stdio calls read and write inside
/// glibc, out of the shim's sight, so the stream's descriptor is adopted at
/// once).
fn stream_opened(stream: *mut FILE, fresh: bool) -> *mut FILE {
    if stream.is_null() {
        return stream;
    }
    if let Some(_g) = Guard::enter() {
        sys::keep_errno(|| {
            // SAFETY: a stream libc just returned.
            let fd = unsafe { libc::fileno(stream) };
            if fresh {
                table::opened(fd);
            }
            table::serve_final(fd, "stdio stream");
        });
    }
    stream
}

/// What to do about a descriptor about to be closed.
enum Closing {
    /// Close it, then tell the daemon this (if anything).
    Now(Option<table::Closed>),
    /// Do not close it yet (see [`table::closing_lock_free`]).
    Deferred,
}

/// `fd` is about to be closed: what to tell the daemon afterwards. Where
/// the shim may not lock (a signal handler, or inside the shim already),
/// only lock-free bookkeeping.
#[inline]
fn closing(fd: c_int) -> Closing {
    match table::state(fd) {
        UNKNOWN => Closing::Now(None),
        // No lock taken: just forget the classification.
        OTHER => Closing::Now(table::closing(fd)),
        _ => match Guard::enter().filter(|_| !mapfs_interpose::signal::in_handler()) {
            Some(_g) => Closing::Now(sys::keep_errno(|| table::closing(fd))),
            None if table::closing_lock_free(fd) => Closing::Deferred,
            None => Closing::Now(None),
        },
    }
}

/// [`closing`] for a descriptor that something other than `close` is
/// about to close (`dup2` onto it, `fclose`, `freopen`), which cannot be
/// deferred.
#[inline]
fn closing_note(fd: c_int) -> Option<table::Closed> {
    match closing(fd) {
        Closing::Now(note) => note,
        Closing::Deferred => {
            table::undefer(fd);
            None
        }
    }
}

fn closed(note: Option<table::Closed>) {
    if let Some(note) = note {
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| note.send());
        }
    }
}

/// Before `dup2`/`dup3` replace `new`: a lent descriptor's map goes to the
/// daemon first, as before a `close`, since the replacement closes it.
/// In a signal handler, which cannot talk to the daemon, a tracked `new`
/// moves aside instead and is closed later ([`table::move_aside`]).
fn replacing(old: c_int, new: c_int) {
    if old == new || matches!(table::state(new), UNKNOWN | OTHER) {
        return;
    }
    if mapfs_interpose::signal::in_handler() {
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| table::move_aside(new));
        }
    } else if table::state(new) == table::ENGINE {
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| table::sync_lent(new));
        }
    }
}

/// After `new` became a duplicate of `old` (replacing whatever `new` was).
fn duped(old: c_int, new: c_int) {
    if new < 0 || old == new {
        return;
    }
    if table::state(new) == table::SHIM {
        // The application put something else on the shim's socket number;
        // the connection is gone (the next call reconnects) and the number
        // is the application's.
        table::release_shim_fd(new);
    }
    let note = closing_note(new);
    if table::state(old) == OTHER {
        // Fast path for pipes and sockets (a shell's redirections).
        table::mark_other(new);
    } else if let Some(_g) = Guard::enter() {
        sys::keep_errno(|| table::duped(old, new));
    }
    closed(note);
}

/// True when `fd` is a regular file opened through a mapfs mount and not
/// adopted: `isatty` on it would be a `TCGETS` ioctl sent to the daemon,
/// a round trip (Python probes every file it opens) for the answer every
/// regular file gives, `ENOTTY` (the daemon has no ioctl but its own
/// proof). Checked on the descriptor itself (the kernel's cached identity,
/// no request), not only on the shim's table, which a descriptor closed
/// and reused behind the shim's back could leave stale.
fn through_mount(fd: c_int) -> bool {
    if crate::in_vfork_child() {
        return false;
    }
    matches!(
        table::state(fd),
        table::PENDING | table::MOUNT | table::ENGINE
    ) && sys::identity(fd).is_ok_and(|id| id.regular && crate::mounts::by_dev(id.dev).is_some())
}

/// Reports the mount's identity for adopted descriptors.
fn patch_stat(fd: c_int, dev: &mut u64, ino: &mut u64) {
    if table::state(fd) != ADOPTED {
        return;
    }
    if let Some(_g) = Guard::enter() {
        if let Some((d, i)) = table::adopted_identity(fd) {
            *dev = d;
            *ino = i;
        }
    }
}

/// A `stat` by path of a file this process is writing natively: the mount's
/// cached size and times are older than the writes, so report the backing
/// file's (what a native `stat` would show the writer).
/// After a successful `*statat` call: a stat of the descriptor itself
/// (`AT_EMPTY_PATH`) reports the mount's identity; a stat by path shows the
/// caller its own unflushed writes.
macro_rules! stat_at_result {
    ($r:expr, $dirfd:expr, $path:expr, $flags:expr, $buf:expr) => {{
        // SAFETY: `path` is the caller's C string (or null with AT_EMPTY_PATH).
        if $r == 0 && unsafe { empty_path($path, $flags) } {
            // SAFETY: the real call succeeded, so it filled `buf`.
            let b = unsafe { &mut *$buf };
            patch_stat($dirfd, &mut b.st_dev, &mut b.st_ino);
            lent_calls::patch_size($dirfd, &mut b.st_size, &mut b.st_blocks);
        } else if $r == 0 {
            // SAFETY: the real call succeeded, so it filled `buf`.
            own_writes!(unsafe { &mut *$buf });
        }
    }};
}

macro_rules! own_writes {
    ($b:expr) => {{
        if table::has_writable() {
            let b = $b;
            if let Some(_g) = Guard::enter() {
                if let Some(st) =
                    sys::keep_errno(|| table::own_written_attrs(b.st_dev as u64, b.st_ino as u64))
                {
                    b.st_size = st.st_size as _;
                    b.st_blocks = st.st_blocks as _;
                    b.st_mtime = st.st_mtime as _;
                    b.st_mtime_nsec = st.st_mtime_nsec as _;
                    b.st_ctime = st.st_ctime as _;
                    b.st_ctime_nsec = st.st_ctime_nsec as _;
                }
            }
        }
    }};
}

/// True for the `(dirfd, "", AT_EMPTY_PATH)` form of the `*at` stat calls.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn empty_path(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: per the contract, a non-null path has at least one byte.
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0)
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type OpenAtFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int;

fn fcntl_hook(real: FcntlFn, fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the real fcntl with the caller's arguments.
            let r = unsafe { real(fd, cmd, arg) };
            if r >= 0 {
                duped(fd, r);
            }
            r
        }
        libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW
        | libc::F_OFD_GETLK => {
            // Locks are taken on what the descriptor finally is: adopt first,
            // or the adoption's dup3 would drop them.
            data_now(fd);
            let posix = matches!(cmd, libc::F_SETLK | libc::F_SETLKW);
            match lock_target(fd, posix) {
                // SAFETY: `arg` is the caller's `struct flock *` for these
                // commands.
                Some(target) if arg != 0 => unsafe {
                    record_lock_on(target, fd, cmd, arg as *mut libc::flock)
                },
                // SAFETY: as above.
                _ => unsafe { real(fd, cmd, arg) },
            }
        }
        libc::F_SETFL => {
            // A writably lent descriptor's own open is kept aside; its
            // number holds a placeholder whose flags do not matter.
            let target = table::engine_target(fd).unwrap_or(fd);
            // SAFETY: as above.
            let r = unsafe { real(target, cmd, arg) };
            if r == 0 {
                lent_calls::flags_set(fd);
            }
            r
        }
        libc::F_GETFL => {
            let target = table::engine_target(fd).unwrap_or(fd);
            // SAFETY: as above.
            unsafe { real(target, cmd, arg) }
        }
        // SAFETY: as above.
        _ => unsafe { real(fd, cmd, arg) },
    }
}

/// The kept mount descriptor an adopted `fd`'s locks go to (see
/// [`table::lock_target`]), or `None` to lock `fd` itself.
fn lock_target(fd: c_int, posix: bool) -> Option<c_int> {
    if posix && !matches!(table::state(fd), OTHER | table::UNKNOWN) {
        if let Some(_g) = Guard::enter() {
            sys::keep_errno(|| table::record_locking(fd));
        }
    }
    if table::state(fd) == table::ENGINE {
        // The mount's open (kept aside under a writable lending's
        // placeholder), but its offset (and the size its writes gave the
        // file) are the shim's: lock it, with offsets made absolute here.
        return Some(table::engine_target(fd).unwrap_or(fd));
    }
    if table::state(fd) != ADOPTED {
        return None;
    }
    let _g = Guard::enter()?;
    let t = sys::keep_errno(|| table::lock_target(fd, posix));
    (t != fd).then_some(t)
}

/// A record-lock command of the application's adopted `fd`, run on the
/// mount's descriptor `target`. Offsets relative to the current position
/// or the end are made absolute first: the two descriptors share neither
/// (and the mount's cached size may predate the application's writes).
///
/// # Safety
/// `lock` is the caller's valid `struct flock`.
unsafe fn record_lock_on(target: c_int, fd: c_int, cmd: c_int, lock: *mut libc::flock) -> c_int {
    // SAFETY: per the contract.
    let mut l = unsafe { *lock };
    let lent = lent_calls::position(fd);
    let base = match c_int::from(l.l_whence) {
        libc::SEEK_SET => Ok(0),
        libc::SEEK_CUR | libc::SEEK_END if lent.is_some() => {
            let (pos, size) = lent.unwrap_or_default();
            Ok(if c_int::from(l.l_whence) == libc::SEEK_CUR {
                pos
            } else {
                size
            } as i64)
        }
        libc::SEEK_CUR => rustix::fs::seek(sys::fd(fd), rustix::fs::SeekFrom::Current(0))
            .map(|o| o as i64)
            .map_err(|e| e.raw_os_error()),
        libc::SEEK_END => rustix::fs::fstat(sys::fd(fd))
            .map(|st| st.st_size)
            .map_err(|e| e.raw_os_error()),
        _ => Err(libc::EINVAL),
    };
    let base = match base {
        Ok(b) => b,
        Err(e) => {
            sys::set_errno(e);
            return -1;
        }
    };
    let Some(start) = l.l_start.checked_add(base) else {
        sys::set_errno(libc::EOVERFLOW);
        return -1;
    };
    l.l_start = start;
    l.l_whence = libc::SEEK_SET as i16;
    match sys::fcntl_lock(target, cmd, &mut l) {
        Ok(()) => {
            if matches!(cmd, libc::F_GETLK | libc::F_OFD_GETLK) {
                // As the kernel does: with no conflict only `l_type`
                // changes; a conflict is described in full (absolute).
                // SAFETY: per the contract.
                unsafe {
                    if c_int::from(l.l_type) == libc::F_UNLCK {
                        (*lock).l_type = l.l_type;
                    } else {
                        *lock = l;
                    }
                }
            }
            0
        }
        Err(e) => {
            sys::set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            -1
        }
    }
}

/// `lockf` on an adopted descriptor, as the record lock on the mount's
/// descriptor `target` that glibc's `lockf` would take on `fd`.
fn lockf_on(target: c_int, fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    let (fcmd, ty) = match cmd {
        libc::F_LOCK => (libc::F_SETLKW, libc::F_WRLCK),
        libc::F_TLOCK => (libc::F_SETLK, libc::F_WRLCK),
        libc::F_ULOCK => (libc::F_SETLK, libc::F_UNLCK),
        libc::F_TEST => (libc::F_GETLK, libc::F_WRLCK),
        _ => {
            sys::set_errno(libc::EINVAL);
            return -1;
        }
    };
    let mut l = sys::record_lock(ty, libc::SEEK_CUR, 0, len);
    // SAFETY: `l` is a valid flock for the whole call.
    let r = unsafe { record_lock_on(target, fd, fcmd, &mut l) };
    if r == 0 && cmd == libc::F_TEST && c_int::from(l.l_type) != libc::F_UNLCK {
        // glibc: someone else holds a conflicting lock.
        sys::set_errno(libc::EACCES);
        return -1;
    }
    r
}

/// Hands every lent open back to the mount before a child process that
/// may inherit its descriptor starts.
fn hand_back_lent(why: &str) {
    if let Some(_g) = Guard::enter() {
        sys::keep_errno(|| table::hand_back_all(why));
    }
}

/// The environment for an `exec`: `envp` with [`table::HANDOFF_ENV`] set to
/// the adopted descriptors and [`crate::mounts::CONNS_ENV`] to the control
/// connections (each removed when there are none). It owns the
/// strings `ptrs` points into; dropped (the `exec` failed and returned), it
/// makes the kept opens readied for the new image close-on-exec again.
struct Handoff {
    _owned: Vec<std::ffi::CString>,
    _ptrs: Vec<*const c_char>,
    /// The environment to pass: the copy, or the caller's own when nothing
    /// changes.
    envp: *const *const c_char,
    kept: Vec<c_int>,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if !self.kept.is_empty() {
            sys::keep_errno(|| table::exec_failed(&self.kept));
        }
    }
}

/// Builds the [`Handoff`] for `envp`.
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings.
unsafe fn handoff_env(envp: *const *const c_char) -> Handoff {
    let export = || {
        let (spec, kept) = table::export_adopted();
        (spec, kept, crate::mounts::export_connections())
    };
    let (spec, mut kept, conns) = if crate::in_vfork_child() {
        // No guard there (the shim is plain libc in a vfork child), and
        // nothing that export calls is hooked.
        sys::keep_errno(export)
    } else {
        match Guard::enter() {
            Some(_g) => sys::keep_errno(export),
            None => (String::new(), Vec::new(), (String::new(), Vec::new())),
        }
    };
    let (conns, handed) = conns;
    kept.extend(handed);
    let ours = |p: *const c_char| {
        // SAFETY: a C string of the environment.
        let e = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        [table::HANDOFF_ENV, crate::mounts::CONNS_ENV]
            .iter()
            .any(|name| {
                e.strip_prefix(name.as_bytes())
                    .is_some_and(|r| r.starts_with(b"="))
            })
    };
    // SAFETY: per the contract, entries up to the null one are valid.
    let entries = || {
        (0..)
            .map(|i| unsafe { *envp.add(i) })
            .take_while(|p| !p.is_null())
    };
    if spec.is_empty() && conns.is_empty() && (envp.is_null() || !entries().any(ours)) {
        // Nothing to hand on and nothing to remove (every `exec` of a shell
        // loop): the caller's environment as it is, without copying it.
        return Handoff {
            _owned: Vec::new(),
            _ptrs: Vec::new(),
            envp,
            kept,
        };
    }
    let mut owned = Vec::new();
    let mut ptrs: Vec<*const c_char> = Vec::new();
    if !envp.is_null() {
        ptrs.extend(entries().filter(|p| !ours(*p)));
    }
    for (name, spec) in [
        (table::HANDOFF_ENV, spec),
        (crate::mounts::CONNS_ENV, conns),
    ] {
        if !spec.is_empty() {
            if let Ok(c) = std::ffi::CString::new(format!("{name}={spec}")) {
                owned.push(c);
            }
        }
    }
    ptrs.extend(owned.iter().map(|c| c.as_ptr()));
    ptrs.push(std::ptr::null());
    Handoff {
        _owned: owned,
        envp: ptrs.as_ptr(),
        _ptrs: ptrs,
        kept,
    }
}

/// Runs the real `exec`; in a `vfork` child, the parent gets its tables
/// back for the duration (an `exec` that succeeds never returns).
fn vfork_exec(exec: impl FnOnce() -> c_int) -> c_int {
    if !crate::in_vfork_child() {
        return exec();
    }
    let parent = crate::vfork_parent();
    crate::vfork_child_exec(true, parent);
    let r = exec();
    sys::keep_errno(|| crate::vfork_child_exec(false, parent));
    r
}

/// The real `vfork`, found by the constructor.
#[cfg(target_arch = "x86_64")]
static REAL_VFORK: Real = Real::new(c"vfork");

/// Called by the `vfork` entry point in the parent before the real `vfork`:
/// what a `fork` would do first (lent opens handed back to the mount,
/// pending ones pinned to it, see [`table::pin_all_pending`]), then the
/// children's hooks are made plain libc ([`crate::in_vfork_child`]).
/// Returns the real `vfork`'s address.
#[cfg(target_arch = "x86_64")]
extern "C" fn vfork_prepare() -> *mut c_void {
    if let Some(_g) = Guard::enter() {
        sys::keep_errno(|| {
            if !crate::mounts::loaded().is_empty() {
                table::hand_back_all("fork");
                table::pin_all_pending();
            }
        });
    }
    crate::vfork_starting();
    REAL_VFORK.addr()
}

/// `vfork` stays the real `vfork`: shells (dash) and make start every
/// command with it, and turning it into a `fork` made each command copy and
/// tear down the caller's page tables (measured: about 0.2 ms of kernel
/// time per command under `mapfs run`, most of what the shim cost a shell
/// loop). The entry point calls `vfork_prepare` and then *jumps* to the
/// real `vfork`, so that the child returns straight to the caller and never
/// into a frame of the shim (which the parent, sharing the stack, would
/// then find clobbered).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // At entry the stack holds the caller's return address (rsp is 8 mod
    // 16): 8 more bytes align it for the call, and are given back before
    // the jump, so the real vfork sees exactly the caller's stack.
    // endbr64 first: a valid target of indirect branches (the PLT) where
    // the CPU enforces it, a no-op elsewhere.
    std::arch::naked_asm!(
        "endbr64",
        "sub rsp, 8",
        "call {prepare}",
        "add rsp, 8",
        "jmp rax",
        prepare = sym vfork_prepare,
    )
}

extern "C" {
    static environ: *const *const c_char;
}

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// Resolves the real functions the hook table does not declare.
pub(crate) fn resolve_extra() {
    #[cfg(target_arch = "x86_64")]
    let _ = REAL_VFORK.addr();
    let _ = real_sigaction();
}

/// The next definition of `sigaction` (libc's), for the `signal` hooks.
fn real_sigaction() -> SigactionFn {
    static REAL: Real = Real::new(c"sigaction");
    // SAFETY: `REAL` holds the address of libc's `sigaction`.
    unsafe { std::mem::transmute::<*mut c_void, SigactionFn>(REAL.addr()) }
}

/// The current environment, for the `exec` variants that use it.
fn current_environ() -> *const *const c_char {
    // SAFETY: reading the libc-maintained environment pointer.
    unsafe { environ }
}

hooks! {
    // ---- vfork (other architectures than x86-64): a vfork child shares
    // the parent's memory, so a real fork keeps the shim's tables apart
    // (vfork's contract is a subset of fork's) ----
    #[cfg(not(target_arch = "x86_64"))]
    fn vfork() -> libc::pid_t = |_real| {
        // SAFETY: fork has no preconditions; the atfork handlers run.
        unsafe { libc::fork() }
    }

    // ---- clone ioctls on lent or adopted opens: EOPNOTSUPP, as the
    // mount answers (see [`mapfs_interpose::clone`]); an adopted
    // descriptor is the backing file, on which the kernel would answer
    // for another file system (EXDEV beside a file of the mount, or a
    // real clone on a file system that shares extents); every other ioctl
    // goes on ----
    fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int as IoctlFn = |real| {
        let served = |f| matches!(table::state(f), table::ENGINE | table::ADOPTED);
        // SAFETY: the program's arguments for `req`.
        if unsafe { mapfs_interpose::clone::involves(fd, req, arg, served) } {
            sys::set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: the real ioctl with the caller's arguments.
        unsafe { real(fd, req, arg) }
    }

    // ---- fork: the gate closed and lent opens handed back first, see
    // [`crate::fork_with`] ----
    fn fork() -> libc::pid_t = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        crate::fork_with(|| unsafe { real() })
    }

    // ---- signal handlers run marked, so hooks entered from one take no
    // lock (see [`mapfs_interpose::signal`]) ----
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int = |real| {
        // SAFETY: the caller's arguments, and the next `sigaction`.
        unsafe { mapfs_interpose::signal::sigaction(real, sig, act, old) }
    }
    fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = |_real| {
        // SAFETY: the next `sigaction`, resolved like every hook's.
        unsafe { mapfs_interpose::signal::signal(real_sigaction(), sig, handler) }
    }
    fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = |_real| {
        // SAFETY: as in `signal`.
        unsafe { mapfs_interpose::signal::signal(real_sigaction(), sig, handler) }
    }
    fn longjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(env, val) }
    }
    fn _longjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(env, val) }
    }
    fn siglongjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(env, val) }
    }
    fn __longjmp_chk(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(env, val) }
    }

    // ---- children started without fork's handlers (glibc runs
    // posix_spawn, and system/popen through it, in a CLONE_VM child): an
    // inherited lent descriptor must be the mount's open by then ----
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = |real| {
        hand_back_lent("posix_spawn");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(pid, path, actions, attr, argv, envp) }
    }
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = |real| {
        hand_back_lent("posix_spawn");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(pid, file, actions, attr, argv, envp) }
    }
    fn system(command: *const c_char) -> c_int = |real| {
        hand_back_lent("system");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(command) }
    }
    fn popen(command: *const c_char, mode: *const c_char) -> *mut FILE = |real| {
        hand_back_lent("popen");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(command, mode) }
    }

    // ---- exec: hand adopted descriptors to the new image ----
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        // SAFETY: the caller's environment array.
        let env = unsafe { handoff_env(envp) };
        // SAFETY: libc's own function, with the caller's arguments and an
        // environment array `env` owns, null-terminated, alive for the call.
        vfork_exec(|| unsafe { real(path, argv, env.envp) })
    }
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        // SAFETY: the caller's environment array.
        let env = unsafe { handoff_env(envp) };
        // SAFETY: as in execve.
        vfork_exec(|| unsafe { real(file, argv, env.envp) })
    }
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        // SAFETY: the caller's environment array.
        let env = unsafe { handoff_env(envp) };
        // SAFETY: as in execve.
        vfork_exec(|| unsafe { real(fd, argv, env.envp) })
    }
    // The variants using the process environment become the explicit-
    // environment ones above (glibc's own call execve internally, out of
    // the shim's sight).
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int = |_real| {
        // SAFETY: the caller's path and arguments, the process environment.
        unsafe { execve(path, argv, current_environ()) }
    }
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int = |_real| {
        // SAFETY: as in execv.
        unsafe { execvpe(file, argv, current_environ()) }
    }

    // ---- opens: classify the new descriptor ----
    fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int as OpenFn = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, flags, mode) }, || unsafe { real(path, flags, mode) }), flags)
    }
    fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int as OpenFn = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, flags, mode) }, || unsafe { real(path, flags, mode) }), flags)
    }
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int as OpenAtFn = |real| {
        before_open(dirfd, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(dirfd, path, flags, mode) }, || unsafe { real(dirfd, path, flags, mode) }), flags)
    }
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int as OpenAtFn = |real| {
        before_open(dirfd, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(dirfd, path, flags, mode) }, || unsafe { real(dirfd, path, flags, mode) }), flags)
    }
    fn __open_2(path: *const c_char, flags: c_int) -> c_int = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, flags) }, || unsafe { real(path, flags) }), flags)
    }
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, flags) }, || unsafe { real(path, flags) }), flags)
    }
    fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = |real| {
        before_open(dirfd, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(dirfd, path, flags) }, || unsafe { real(dirfd, path, flags) }), flags)
    }
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = |real| {
        before_open(dirfd, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(dirfd, path, flags) }, || unsafe { real(dirfd, path, flags) }), flags)
    }
    fn creat(path: *const c_char, mode: libc::mode_t) -> c_int = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, mode) }, || unsafe { real(path, mode) }), libc::O_WRONLY)
    }
    fn creat64(path: *const c_char, mode: libc::mode_t) -> c_int = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        opened(fd_retry(unsafe { real(path, mode) }, || unsafe { real(path, mode) }), libc::O_WRONLY)
    }

    // ---- close and duplication ----
    fn close(fd: c_int) -> c_int = |real| {
        if table::state(fd) == table::SHIM && Guard::enter().is_some() {
            // The application closing "all" its descriptors must not cut the
            // shim off its daemon: report success, keep the socket.
            return 0;
        }
        let note = match closing(fd) {
            Closing::Now(note) => note,
            // Closed for the program; for the kernel at the next entry.
            Closing::Deferred => return 0,
        };
        let lost = note.as_ref().is_some_and(|n| n.lost());
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(fd) };
        closed(note);
        if lost && r == 0 {
            sys::set_errno(libc::EIO);
            return -1;
        }
        r
    }
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int = |real| {
        if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
            // SAFETY: libc's own function, with the caller's arguments.
            return unsafe { real(first, last, flags) };
        }
        let Some(_g) = Guard::enter() else {
            // SAFETY: libc's own function, with the caller's arguments.
            return unsafe { real(first, last, flags) };
        };
        // Bookkeeping for the tracked descriptors in the range, and the
        // shim's own sockets cut out of it.
        let top = last.min(table::MAX_FD as c_uint - 1);
        let mut notes = Vec::new();
        let mut start = first;
        let mut r = 0;
        let mut fd = first;
        while fd <= top {
            let s = table::state(fd as c_int);
            if s == table::SHIM {
                if fd > start {
                    // SAFETY: libc's own function; a sub-range of the
                    // caller's, with its flags (no pointer involved).
                    r |= unsafe { real(start, fd - 1, flags) };
                }
                start = fd + 1;
            } else if s != UNKNOWN && s != OTHER {
                notes.push(sys::keep_errno(|| table::closing(fd as c_int)));
            } else if s == OTHER {
                table::mark_unknown(fd as c_int);
            }
            fd += 1;
        }
        if start <= last {
            // SAFETY: as above.
            r |= unsafe { real(start, last, flags) };
        }
        let e = sys::errno();
        for n in notes.into_iter().flatten() {
            n.send();
        }
        sys::set_errno(e);
        r
    }
    fn dup(old: c_int) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(old) };
        duped(old, r);
        r
    }
    fn dup2(old: c_int, new: c_int) -> c_int = |real| {
        replacing(old, new);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(old, new) };
        duped(old, r);
        r
    }
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int = |real| {
        replacing(old, new);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(old, new, flags) };
        duped(old, r);
        r
    }
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int as FcntlFn = |real| {
        fcntl_hook(real, fd, cmd, arg)
    }
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int as FcntlFn = |real| {
        fcntl_hook(real, fd, cmd, arg)
    }

    // ---- position, size and sync: only lent descriptors need the shim ----
    fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t = |real| {
        match lent_calls::lseek(fd, off, whence) {
            Some(r) => r,
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, off, whence) },
        }
    }
    fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t = |real| {
        match lent_calls::lseek(fd, off, whence) {
            Some(r) => r,
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, off, whence) },
        }
    }
    fn ftruncate(fd: c_int, len: off_t) -> c_int = |real| {
        match lent_calls::ftruncate(fd, len) {
            Some(r) => r,
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, len) },
        }
    }
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int = |real| {
        match lent_calls::ftruncate(fd, len) {
            Some(r) => r,
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, len) },
        }
    }
    fn fsync(fd: c_int) -> c_int = |real| {
        match lent_calls::fsync(fd, false) {
            Some(r) => r,
            // SAFETY: libc's own function, on the caller's descriptor or the
            // open it stands for (no pointer involved).
            None => unsafe { real(table::engine_target(fd).unwrap_or(fd)) },
        }
    }
    fn fdatasync(fd: c_int) -> c_int = |real| {
        match lent_calls::fsync(fd, true) {
            Some(r) => r,
            // SAFETY: libc's own function, on the caller's descriptor or the
            // open it stands for (no pointer involved).
            None => unsafe { real(table::engine_target(fd).unwrap_or(fd)) },
        }
    }

    // ---- terminal probe: answered here for files opened through a mount ----
    fn isatty(fd: c_int) -> c_int = |real| {
        if through_mount(fd) {
            sys::set_errno(libc::ENOTTY);
            return 0;
        }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd) }
    }

    // ---- data calls: adopt first, then the real call ----
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n, None) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n) }
    }
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n.min(buflen), None) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, buflen) }
    }
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::write(fd, buf, n, None) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n) }
    }
    fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off) }
    }
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off) }
    }
    fn __pread_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n.min(buflen), Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off, buflen) }
    }
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t, buflen: size_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::read(fd, buf, n.min(buflen), Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off, buflen) }
    }
    fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::write(fd, buf, n, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off) }
    }
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t = |real| {
        let _mount = data(fd, n);
        // SAFETY: the caller's buffer, as for the real call.
        if let Some(r) = unsafe { lent_calls::write(fd, buf, n, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, buf, n, off) }
    }
    fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::readv(fd, iov, cnt, None) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt) }
    }
    fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::writev(fd, iov, cnt, None) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt) }
    }
    fn preadv(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::readv(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off) }
    }
    fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::readv(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off) }
    }
    fn pwritev(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::writev(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off) }
    }
    fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::writev(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off) }
    }
    fn preadv2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        if flags != 0 {
            data_final(fd, "preadv2/pwritev2 flags");
        }
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::readv(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off, flags) }
    }
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        if flags != 0 {
            data_final(fd, "preadv2/pwritev2 flags");
        }
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::readv(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off, flags) }
    }
    fn pwritev2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        if flags != 0 {
            data_final(fd, "preadv2/pwritev2 flags");
        }
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::writev(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off, flags) }
    }
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t = |real| {
        // SAFETY: the caller's iovec array.
        let _mount = data(fd, unsafe { iov_len(iov, cnt) });
        if flags != 0 {
            data_final(fd, "preadv2/pwritev2 flags");
        }
        // SAFETY: the caller's iovec array, as for the real call.
        if let Some(r) = unsafe { lent_calls::writev(fd, iov, cnt, Some(off as i64)) } { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, iov, cnt, off, flags) }
    }
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void = |real| {
        if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 {
            data_final(fd, "mmap");
        }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(addr, len, prot, flags, fd, off) }
    }
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void = |real| {
        if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 {
            data_final(fd, "mmap");
        }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(addr, len, prot, flags, fd, off) }
    }
    fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int = |real| {
        data_now(fd);
        if let Some(r) = lent_calls::fallocate(fd, mode, off as i64, len as i64) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, mode, off, len) }
    }
    fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int = |real| {
        data_now(fd);
        if let Some(r) = lent_calls::fallocate(fd, mode, off as i64, len as i64) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, mode, off, len) }
    }
    fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int = |real| {
        data_now(fd);
        if let Some(r) = lent_calls::posix_fallocate(fd, off as i64, len as i64) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, off, len) }
    }
    fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int = |real| {
        data_now(fd);
        if let Some(r) = lent_calls::posix_fallocate(fd, off as i64, len as i64) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, off, len) }
    }
    fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int = |real| {
        // Advice is a hint: it never makes a descriptor worth adopting
        // (`cat` advises sequential reads of every file, however small).
        if let Some(r) = lent_calls::fadvise(fd) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, off, len, advice) }
    }
    fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int = |real| {
        // Advice is a hint: it never makes a descriptor worth adopting
        // (`cat` advises sequential reads of every file, however small).
        if let Some(r) = lent_calls::fadvise(fd) { return r; }
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(fd, off, len, advice) }
    }
    fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t = |real| {
        data_final(in_fd, "sendfile");
        data_final(out_fd, "sendfile");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(out_fd, in_fd, off, n) }
    }
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t = |real| {
        data_final(in_fd, "sendfile");
        data_final(out_fd, "sendfile");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(out_fd, in_fd, off, n) }
    }
    fn copy_file_range(in_fd: c_int, off_in: *mut off64_t, out_fd: c_int, off_out: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t = |real| {
        data_final(in_fd, "copy_file_range");
        data_final(out_fd, "copy_file_range");
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(in_fd, off_in, out_fd, off_out, n, flags) };
        if r < 0 && sys::errno() == libc::EXDEV && flags == 0 && both_mapfs(in_fd, out_fd) {
            // SAFETY: the caller's offset pointers (NULL or valid).
            if let Some(r) = unsafe { copy_by_hand(in_fd, off_in, out_fd, off_out, n) } {
                return r;
            }
        }
        r
    }
    fn splice(in_fd: c_int, off_in: *mut off64_t, out_fd: c_int, off_out: *mut off64_t, n: size_t, flags: c_uint) -> ssize_t = |real| {
        data_final(in_fd, "splice");
        data_final(out_fd, "splice");
        // SAFETY: libc's own function, with the caller's arguments.
        unsafe { real(in_fd, off_in, out_fd, off_out, n, flags) }
    }
    fn flock(fd: c_int, op: c_int) -> c_int = |real| {
        data_now(fd);
        // SAFETY: libc's own function, with the caller's operation on its
        // descriptor or the mount's open it locks for (no pointer involved).
        unsafe { real(lock_target(fd, false).unwrap_or(fd), op) }
    }
    fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int = |real| {
        data_now(fd);
        match lock_target(fd, true) {
            Some(target) => lockf_on(target, fd, cmd, len),
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, cmd, len) },
        }
    }
    fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int = |real| {
        data_now(fd);
        match lock_target(fd, true) {
            Some(target) => lockf_on(target, fd, cmd, len),
            // SAFETY: libc's own function, with the caller's arguments.
            None => unsafe { real(fd, cmd, len) },
        }
    }

    // ---- fstat family: adopted descriptors report the mount's identity ----
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(fd, buf) };
        if r == 0 {
            // SAFETY: the real fstat filled `buf`.
            let b = unsafe { &mut *buf };
            patch_stat(fd, &mut b.st_dev, &mut b.st_ino);
            lent_calls::patch_size(fd, &mut b.st_size, &mut b.st_blocks);
        }
        r
    }
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(fd, buf) };
        if r == 0 {
            // SAFETY: the real fstat64 filled `buf`.
            let b = unsafe { &mut *buf };
            patch_stat(fd, &mut b.st_dev, &mut b.st_ino);
            lent_calls::patch_size(fd, &mut b.st_size, &mut b.st_blocks);
        }
        r
    }
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, fd, buf) };
        if r == 0 {
            // SAFETY: the real __fxstat filled `buf`.
            let b = unsafe { &mut *buf };
            patch_stat(fd, &mut b.st_dev, &mut b.st_ino);
            lent_calls::patch_size(fd, &mut b.st_size, &mut b.st_blocks);
        }
        r
    }
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, fd, buf) };
        if r == 0 {
            // SAFETY: the real __fxstat64 filled `buf`.
            let b = unsafe { &mut *buf };
            patch_stat(fd, &mut b.st_dev, &mut b.st_ino);
            lent_calls::patch_size(fd, &mut b.st_size, &mut b.st_blocks);
        }
        r
    }
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(dirfd, path, buf, flags) };
        stat_at_result!(r, dirfd, path, flags, buf);
        r
    }
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(dirfd, path, buf, flags) };
        stat_at_result!(r, dirfd, path, flags, buf);
        r
    }
    fn __fxstatat(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, dirfd, path, buf, flags) };
        stat_at_result!(r, dirfd, path, flags, buf);
        r
    }
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, dirfd, path, buf, flags) };
        stat_at_result!(r, dirfd, path, flags, buf);
        r
    }
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(dirfd, path, flags, mask, buf) };
        // SAFETY: as in fstatat.
        if r == 0 && unsafe { empty_path(path, flags) } && table::state(dirfd) == ADOPTED {
            // SAFETY: the real statx filled `buf`.
            let b = unsafe { &mut *buf };
            let mut dev = rustix::fs::makedev(b.stx_dev_major, b.stx_dev_minor);
            let mut ino = b.stx_ino;
            patch_stat(dirfd, &mut dev, &mut ino);
            b.stx_dev_major = rustix::fs::major(dev);
            b.stx_dev_minor = rustix::fs::minor(dev);
            b.stx_ino = ino;
        } else if r == 0 && unsafe { empty_path(path, flags) } && table::state(dirfd) == table::ENGINE {
            // SAFETY: the real statx filled `buf`.
            let b = unsafe { &mut *buf };
            let (mut size, mut blocks) = (b.stx_size as i64, b.stx_blocks as i64);
            lent_calls::patch_size(dirfd, &mut size, &mut blocks);
            b.stx_size = size as u64;
            b.stx_blocks = blocks as u64;
        } else if r == 0 && table::has_writable() {
            // SAFETY: the real statx filled `buf`.
            let b = unsafe { &mut *buf };
            let dev = rustix::fs::makedev(b.stx_dev_major, b.stx_dev_minor);
            if let Some(_g) = Guard::enter() {
                if let Some(st) = sys::keep_errno(|| table::own_written_attrs(dev, b.stx_ino)) {
                    b.stx_size = st.st_size as u64;
                    b.stx_blocks = st.st_blocks as u64;
                    b.stx_mtime.tv_sec = st.st_mtime;
                    b.stx_mtime.tv_nsec = st.st_mtime_nsec as u32;
                    b.stx_ctime.tv_sec = st.st_ctime;
                    b.stx_ctime.tv_nsec = st.st_ctime_nsec as u32;
                }
            }
        }
        r
    }

    // ---- stat by path: a writer sees its own native writes at once ----
    fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn __xstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn __xstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn __lxstat(ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }
    fn __lxstat64(ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(ver, path, buf) };
        if r == 0 {
            // SAFETY: the real call filled `buf`.
            own_writes!(unsafe { &mut *buf });
        }
        r
    }

    // ---- stdio: glibc reads and writes streams internally, so a stream's
    // descriptor is adopted when the stream is made ----
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = retry_emfile(unsafe { real(path, mode) }, |r| r.is_null(), || unsafe { real(path, mode) });
        stream_opened(r, true)
    }
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE = |real| {
        before_open(libc::AT_FDCWD, path);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = retry_emfile(unsafe { real(path, mode) }, |r| r.is_null(), || unsafe { real(path, mode) });
        stream_opened(r, true)
    }
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE = |real| {
        // SAFETY: libc's own function, with the caller's arguments.
        stream_opened(unsafe { real(fd, mode) }, false)
    }
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE = |real| {
        // SAFETY: the caller's stream (null is allowed by glibc).
        let old = if stream.is_null() { -1 } else { unsafe { libc::fileno(stream) } };
        let note = closing_note(old);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, mode, stream) };
        closed(note);
        stream_opened(r, true)
    }
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE = |real| {
        // SAFETY: as in freopen.
        let old = if stream.is_null() { -1 } else { unsafe { libc::fileno(stream) } };
        let note = closing_note(old);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(path, mode, stream) };
        closed(note);
        stream_opened(r, true)
    }
    fn fclose(stream: *mut FILE) -> c_int = |real| {
        // SAFETY: the caller's stream.
        let fd = unsafe { libc::fileno(stream) };
        let note = closing_note(fd);
        // SAFETY: libc's own function, with the caller's arguments.
        let r = unsafe { real(stream) };
        closed(note);
        r
    }
}
