//! The interposed libc functions. Each takes the path it is given to
//! [`ops::route`]: a host path goes on to the next definition of the symbol
//! (`dlsym(RTLD_NEXT)`: the attached shim when it is preloaded too, then
//! libc) unchanged; an embedded one is served by its file system.
//!
//! Descriptors of whole-file 1-to-1 maps need no hook: an embedded open
//! returns the backing file itself, so `read`, `write`, `mmap`, `fstat`,
//! locks, `dup`, `fork` and `exec` are native. Other maps (plfs) get a
//! placeholder served by [`crate::data_hooks`]. Directory descriptors opened under a prefix are
//! remembered so that `*at` calls relative to them, and `fchdir`, stay in
//! the file system.
//!
//! Fortified variants (`__open_2`, `__realpath_chk`...) are hooked too, as
//! Debian builds programs with `_FORTIFY_SOURCE`. Not hooked (documented
//! in docs/embedded.md): `execve` of a program under a prefix, and other
//! calls glibc makes internally (`nftw`, `ftw`, `freopen`), raw
//! system calls.
//!
//! Variadic C functions (`open`, `openat`) are defined with their optional
//! mode as a fixed argument: on the x86-64 and AArch64 Linux ABIs a
//! variadic integer argument travels exactly like a fixed one.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::Ordering;

use libc::{mode_t, size_t, ssize_t};
use mapfs::{Attr, RenameFlags, SetAttr, TimeSet};

use crate::ops::{self, Follow, Out};
use crate::resolve::Target;
use crate::state::{self, Emb, Place};
use crate::{statbuf, Guard};

/// Declares hooks ([`mapfs_interpose::hooks!`]): `fn name(args) -> ret =
/// |real| body`, `real` being the next definition, of the hook's own type;
/// each hook reports its call ([`crate::report::enter_call`]) first.
macro_rules! hooks {
    ($($table:tt)*) => {
        mapfs_interpose::hooks! { prelude = $crate::report::enter_call; $($table)* }
    };
}

pub(crate) use hooks;

fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// The bytes of a C string (`None` for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        None
    } else {
        // SAFETY: per the contract.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// Routes `(dirfd, path)` (see [`ops::route`]) inside the guard, errno
/// kept unless the call failed.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn on_path<T>(
    dirfd: c_int,
    path: *const c_char,
    follow: Follow,
    f: impl Fn(&Emb, &Place, Option<&Attr>) -> Result<T, i32>,
) -> Out<T> {
    if state::embs().is_empty() {
        return Out::Host(None);
    }
    // SAFETY: per the contract.
    let Some(p) = (unsafe { bytes(path) }) else {
        return Out::Host(None);
    };
    let Some(_g) = Guard::enter() else {
        return Out::Host(None);
    };
    let served = crate::report::Served::start();
    let saved = errno();
    let out = ops::route(dirfd, p, follow, f);
    if !matches!(out, Out::Done(Err(_))) {
        set_errno(saved);
    }
    if matches!(out, Out::Host(_)) {
        served.not_served();
    }
    out
}

/// The path `exec` should load for `path`: `Ok(None)` to load it as given
/// (a host path, or a bare name searched in `PATH`), the backing file of a
/// program stored under a prefix (see [`ops::exec_path`]), or an errno.
///
/// # Safety
/// `path` as for [`bytes`].
pub(crate) unsafe fn exec_target(path: *const c_char) -> Result<Option<CString>, c_int> {
    // SAFETY: per the contract.
    match unsafe { bytes(path) } {
        Some(p) if p.contains(&b'/') => {}
        _ => return Ok(None),
    }
    // SAFETY: per the contract.
    let host = match unsafe { on_path(libc::AT_FDCWD, path, Follow::Yes, ops::exec_path) } {
        Out::Host(c) => return Ok(c),
        Out::Done(Ok(v)) => v,
        Out::Done(Err(libc::EBADF)) => {
            let lexical = Guard::enter().and_then(|_g| {
                // SAFETY: per the contract.
                let p = unsafe { bytes(path) }?;
                ops::exec_path_lexical(libc::AT_FDCWD, p)
            });
            lexical.ok_or(libc::EBADF)?
        }
        Out::Done(Err(e)) => return Err(e),
    };
    CString::new(host).map(Some).map_err(|_| libc::ENOENT)
}

/// Ends a hooked call: the real function on a host path (as given or
/// rewritten), `done` on a served result, `fail` with errno on an error.
fn finish<T, R>(
    orig: *const c_char,
    out: Out<T>,
    host: impl FnOnce(*const c_char) -> R,
    done: impl FnOnce(T) -> R,
    fail: R,
) -> R {
    match out {
        Out::Host(None) => host(orig),
        Out::Host(Some(c)) => host(c.as_ptr()),
        Out::Done(Ok(v)) => done(v),
        Out::Done(Err(e)) => {
            set_errno(e);
            fail
        }
    }
}

fn err<T>(e: mapfs::Error) -> Result<T, i32> {
    Err(e.errno())
}

/// Attributes of an existing followed file.
fn attr_yes(e: &Emb, _: &Place, a: Option<&Attr>) -> Result<(Attr, u64), i32> {
    a.map(|a| (*a, e.dev)).ok_or(libc::ENOENT)
}

/// Attributes of a file not followed.
fn attr_no(e: &Emb, p: &Place, _: Option<&Attr>) -> Result<(Attr, u64), i32> {
    e.fs.getattr(&state::ctx(), &p.path)
        .map(|a| (a, e.dev))
        .map_err(|e| e.errno())
}

fn follow_if(flags: c_int, nofollow_flag: c_int) -> Follow {
    if flags & nofollow_flag != 0 {
        Follow::No
    } else {
        Follow::Yes
    }
}

fn setattr(e: &Emb, p: &Place, a: Option<&Attr>, follow: Follow, set: SetAttr) -> Result<(), i32> {
    if follow == Follow::Yes && a.is_none() {
        return Err(libc::ENOENT);
    }
    e.fs.setattr(&state::ctx(), &p.path, &set)
        .map(|_| ())
        .or_else(err)
}

/// A `timespec` of `utimensat` as a [`SetAttr`] time.
fn time_of(t: &libc::timespec) -> Option<TimeSet> {
    match t.tv_nsec {
        libc::UTIME_OMIT => None,
        libc::UTIME_NOW => Some(TimeSet::Now),
        _ => {
            let base = std::time::UNIX_EPOCH;
            let ns = std::time::Duration::from_nanos(t.tv_nsec.clamp(0, 999_999_999) as u64);
            let at = if t.tv_sec >= 0 {
                base + std::time::Duration::from_secs(t.tv_sec as u64) + ns
            } else {
                base - std::time::Duration::from_secs(t.tv_sec.unsigned_abs()) + ns
            };
            Some(TimeSet::At(at))
        }
    }
}

/// `utimensat` on an embedded place (`times` NULL: both now).
///
/// # Safety
/// `times` is NULL or points to two timespecs.
unsafe fn utimens(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the contract.
    let set = unsafe { utime_set(times) };
    let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
    // SAFETY: the caller's path.
    let out = unsafe { on_path(dirfd, path, follow, |e, p, a| setattr(e, p, a, follow, set)) };
    finish(path, out, real, |()| 0, -1)
}

/// The times of `utimensat` and `futimens` (`times` NULL: both now).
///
/// # Safety
/// `times` is NULL or points to two timespecs.
pub(crate) unsafe fn utime_set(times: *const libc::timespec) -> SetAttr {
    let (atime, mtime) = if times.is_null() {
        (Some(TimeSet::Now), Some(TimeSet::Now))
    } else {
        // SAFETY: per the contract.
        let t = unsafe { std::slice::from_raw_parts(times, 2) };
        (time_of(&t[0]), time_of(&t[1]))
    };
    SetAttr {
        atime,
        mtime,
        ..SetAttr::default()
    }
}

/// `timespec`s of two `timeval`s (NULL stays NULL).
///
/// # Safety
/// `tv` is NULL or points to two timevals.
unsafe fn timevals(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    Some([0, 1].map(|i| libc::timespec {
        tv_sec: t[i].tv_sec,
        tv_nsec: t[i].tv_usec * 1000,
    }))
}

/// `open` of an embedded path.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn open_at(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    let follow = if flags & libc::O_NOFOLLOW != 0 {
        Follow::No
    } else {
        Follow::Lazy
    };
    if crate::inside() {
        // The library's own open (a file system's database, index or log):
        // above the program's numbers, where a shell's `exec 3> f` cannot
        // replace it (pack's SQLite connection, opened lazily at number 3,
        // was).
        return crate::engine_fd::above_program_raw(real(path));
    }
    // SAFETY: the caller's path.
    let out = unsafe { on_path(dirfd, path, follow, |e, p, _| ops::open(e, p, flags, mode)) };
    finish(path, out, real, |fd| fd, -1)
}

/// Copies `src` into a C buffer of `size` bytes, truncating (`readlink`).
///
/// # Safety
/// `buf` is valid for `size` bytes.
unsafe fn copy_out(src: &[u8], buf: *mut c_char, size: size_t) -> ssize_t {
    let n = src.len().min(size);
    // SAFETY: per the contract; `src` is our own buffer, never overlapping.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf.cast::<u8>(), n) };
    n as ssize_t
}

/// `getxattr`-style answer: the size with a zero `size`, `ERANGE` when too
/// small, else the bytes.
///
/// # Safety
/// `buf` is valid for `size` bytes (or `size` is 0).
pub(crate) unsafe fn xattr_out(v: &[u8], buf: *mut c_void, size: size_t) -> ssize_t {
    if size == 0 {
        return v.len() as ssize_t;
    }
    if v.len() > size {
        set_errno(libc::ERANGE);
        return -1;
    }
    // SAFETY: per the contract.
    unsafe { copy_out(v, buf.cast(), size) }
}

/// Two-path calls (`rename`, `link`): both on one file system, both on the
/// host (`Ok(None)` or rewritten paths), or `EXDEV`.
enum Pair {
    Host(Option<std::ffi::CString>, Option<std::ffi::CString>),
    Emb(usize, Place, Place),
}

/// # Safety
/// Both paths as for [`bytes`].
unsafe fn pair(
    d1: c_int,
    p1: *const c_char,
    follow1: bool,
    d2: c_int,
    p2: *const c_char,
) -> Result<Pair, i32> {
    if state::embs().is_empty() {
        return Ok(Pair::Host(None, None));
    }
    // SAFETY: per the contract.
    let (Some(a), Some(b)) = (unsafe { bytes(p1) }, unsafe { bytes(p2) }) else {
        return Ok(Pair::Host(None, None));
    };
    let Some(_g) = Guard::enter() else {
        return Ok(Pair::Host(None, None));
    };
    let saved = errno();
    let ta = ops::target(d1, a, follow1)?;
    let tb = ops::target(d2, b, false)?;
    set_errno(saved);
    let split = |t: Option<Target>| match t {
        None => (true, None, None),
        Some(Target::Host(c)) => (true, Some(c), None),
        Some(Target::Emb(p)) => (false, None, Some(p)),
    };
    match (split(ta), split(tb)) {
        ((true, ca, _), (true, cb, _)) => Ok(Pair::Host(ca, cb)),
        ((false, _, Some(pa)), (false, _, Some(pb))) if pa.idx == pb.idx => {
            Ok(Pair::Emb(pa.idx, pa, pb))
        }
        _ => Err(libc::EXDEV),
    }
}

/// Runs a two-path call.
///
/// # Safety
/// Both paths as for [`bytes`].
unsafe fn two_paths(
    d1: c_int,
    p1: *const c_char,
    follow1: bool,
    d2: c_int,
    p2: *const c_char,
    host: impl FnOnce(*const c_char, *const c_char) -> c_int,
    emb: impl FnOnce(&Emb, &Place, &Place) -> mapfs::Result<()>,
) -> c_int {
    // SAFETY: per the contract.
    match unsafe { pair(d1, p1, follow1, d2, p2) } {
        Ok(Pair::Host(a, b)) => host(
            a.as_ref().map_or(p1, |c| c.as_ptr()),
            b.as_ref().map_or(p2, |c| c.as_ptr()),
        ),
        Ok(Pair::Emb(idx, a, b)) => {
            let Some(_g) = Guard::enter() else {
                return host(p1, p2);
            };
            let _served = crate::report::Served::start();
            let saved = errno();
            match emb(&state::embs()[idx], &a, &b) {
                Ok(()) => {
                    set_errno(saved);
                    0
                }
                Err(e) => {
                    set_errno(e.errno());
                    -1
                }
            }
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Writes `src` and a NUL into `buf` (or a fresh `malloc`ed buffer when
/// `buf` is NULL: of `size` bytes, or just enough with `size` 0).
///
/// # Safety
/// `buf` is NULL or valid for `size` bytes.
unsafe fn c_string_out(src: &[u8], buf: *mut c_char, size: size_t) -> *mut c_char {
    let need = src.len() + 1;
    let (out, cap) = if buf.is_null() {
        let cap = if size == 0 { need } else { size };
        // SAFETY: plain allocation, freed by the caller with free().
        let p = unsafe { libc::malloc(cap) }.cast::<c_char>();
        if p.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        (p, cap)
    } else {
        (buf, size)
    };
    if need > cap {
        if buf.is_null() {
            // SAFETY: allocated just above.
            unsafe { libc::free(out.cast()) };
        }
        set_errno(libc::ERANGE);
        return std::ptr::null_mut();
    }
    // SAFETY: `out` has room for `need` bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), out.cast::<u8>(), src.len());
        *out.add(src.len()) = 0;
    }
    out
}

/// The embedded working directory as a host path, if there is one.
fn cwd_bytes() -> Option<Vec<u8>> {
    if state::embs().is_empty() {
        return None;
    }
    let _g = Guard::enter()?;
    state::cwd().map(|p| p.host_path())
}

/// `realpath` of an embedded path into `resolved` (or a `malloc`ed buffer
/// of `PATH_MAX`, as glibc does).
///
/// # Safety
/// `path` as for [`bytes`]; `resolved` NULL or valid for `PATH_MAX` bytes.
unsafe fn realpath_into(
    path: *const c_char,
    resolved: *mut c_char,
    real: impl FnOnce(*const c_char) -> *mut c_char,
) -> *mut c_char {
    if state::embs().is_empty() {
        return real(path);
    }
    // SAFETY: per the contract.
    let Some(p) = (unsafe { bytes(path) }) else {
        return real(path);
    };
    let out = {
        let Some(_g) = Guard::enter() else {
            return real(path);
        };
        let saved = errno();
        let out = ops::realpath(libc::AT_FDCWD, p);
        if !matches!(out, Out::Done(Err(_))) {
            set_errno(saved);
        }
        out
    };
    match out {
        Out::Host(None) => real(path),
        Out::Host(Some(c)) => real(c.as_ptr()),
        Out::Done(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Out::Done(Ok(v)) => {
            // glibc's realpath allocates PATH_MAX bytes, and a caller's
            // buffer must hold as many.
            // SAFETY: per the contract.
            unsafe { c_string_out(&v, resolved, libc::PATH_MAX as size_t) }
        }
    }
}

/// Open flags of an `fopen` mode string.
fn fopen_flags(mode: &[u8]) -> Option<c_int> {
    let mut flags = match mode.first()? {
        b'r' => libc::O_RDONLY,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in &mode[1..] {
        match c {
            b'+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            b'e' => flags |= libc::O_CLOEXEC,
            b'x' => flags |= libc::O_EXCL,
            b',' => break,
            _ => {}
        }
    }
    Some(flags)
}

/// `fopen` of an embedded path: the library opens it, stdio wraps the
/// descriptor.
///
/// # Safety
/// `path` and `mode` as for [`bytes`].
unsafe fn fopen_impl(
    path: *const c_char,
    mode: *const c_char,
    real: impl FnOnce(*const c_char) -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: per the contract.
    let Some(flags) = (unsafe { bytes(mode) }).and_then(fopen_flags) else {
        return real(path);
    };
    // SAFETY: per the contract.
    let out = unsafe {
        on_path(libc::AT_FDCWD, path, Follow::Lazy, |e, p, _| {
            ops::open(e, p, flags, 0o666)
        })
    };
    match out {
        Out::Host(None) => real(path),
        Out::Host(Some(c)) => real(c.as_ptr()),
        Out::Done(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Out::Done(Ok(fd)) => {
            // SAFETY: `fd` was just opened for this stream; `mode` is the
            // caller's valid string.
            let f = if crate::data_hooks::is_placeholder(fd) {
                unsafe { crate::streams::open(fd, mode) }
            } else {
                unsafe { libc::fdopen(fd, mode) }
            };
            if f.is_null() {
                let e = errno();
                // SAFETY: closing the descriptor opened above (through the
                // hook, which releases a placeholder's open).
                unsafe { close(fd) };
                set_errno(e);
            }
            f
        }
    }
}

/// An embedded directory opened for `opendir`/`scandir`.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn open_dir(path: *const c_char) -> Out<c_int> {
    // SAFETY: per the contract.
    unsafe {
        on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, _| {
            ops::open(
                e,
                p,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                0,
            )
        })
    }
}

type Filter = Option<unsafe extern "C" fn(*const libc::dirent) -> c_int>;
type Compar =
    Option<unsafe extern "C" fn(*mut *const libc::dirent, *mut *const libc::dirent) -> c_int>;
type Filter64 = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
type Compar64 =
    Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>;

/// What `qsort` calls: `scandir`'s comparison, taking pointers to the
/// array's elements.
type QsortCompar = Option<unsafe extern "C" fn(*const c_void, *const c_void) -> c_int>;

/// A `scandir` result as libc returns it.
fn scanned(r: Result<c_int, c_int>) -> c_int {
    match r {
        Ok(n) => n,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Runs `f` inside the library (its own libc calls go straight on), with
/// errno as it was before (a caller sets it for a failure `f` reports);
/// `None` when nothing is embedded, when already inside, or when `f` has
/// nothing to do.
pub(crate) fn in_library<R>(f: impl FnOnce() -> Option<R>) -> Option<R> {
    if state::embs().is_empty() {
        return None;
    }
    let _g = Guard::enter()?;
    let saved = errno();
    let r = f();
    set_errno(saved);
    r
}

extern "C" {
    fn scandirat(
        dfd: c_int,
        dir: *const c_char,
        namelist: *mut *mut *mut libc::dirent,
        filter: Filter,
        compar: Compar,
    ) -> c_int;
    fn scandirat64(
        dfd: c_int,
        dir: *const c_char,
        namelist: *mut *mut *mut libc::dirent64,
        filter: Filter64,
        compar: Compar64,
    ) -> c_int;
}

/// Closes a descriptor this library opened for its own use.
fn close_own(fd: c_int) {
    state::untrack(fd);
    // SAFETY: `fd` was opened by this library for the call in progress.
    unsafe { libc::close(fd) };
}

hooks! {
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int = |real| {
        // SAFETY: the application's path; `real` is libc's open.
        unsafe { open_at(libc::AT_FDCWD, path, flags, mode, |p| real(p, flags, mode)) }
    }
    fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(libc::AT_FDCWD, path, flags, mode, |p| real(p, flags, mode)) }
    }
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(dirfd, path, flags, mode, |p| real(dirfd, p, flags, mode)) }
    }
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(dirfd, path, flags, mode, |p| real(dirfd, p, flags, mode)) }
    }
    fn __open_2(path: *const c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(libc::AT_FDCWD, path, flags, 0, |p| real(p, flags)) }
    }
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(libc::AT_FDCWD, path, flags, 0, |p| real(p, flags)) }
    }
    fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(dirfd, path, flags, 0, |p| real(dirfd, p, flags)) }
    }
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: as in `open`.
        unsafe { open_at(dirfd, path, flags, 0, |p| real(dirfd, p, flags)) }
    }
    fn creat(path: *const c_char, mode: mode_t) -> c_int = |real| {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        // SAFETY: as in `open`.
        unsafe { open_at(libc::AT_FDCWD, path, flags, mode, |p| real(p, mode)) }
    }
    fn creat64(path: *const c_char, mode: mode_t) -> c_int = |real| {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        // SAFETY: as in `open`.
        unsafe { open_at(libc::AT_FDCWD, path, flags, mode, |p| real(p, mode)) }
    }
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE = |real| {
        // SAFETY: the application's strings.
        unsafe { fopen_impl(path, mode, |p| real(p, mode)) }
    }
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE = |real| {
        // SAFETY: the application's strings.
        unsafe { fopen_impl(path, mode, |p| real(p, mode)) }
    }
    fn close(fd: c_int) -> c_int = |real| {
        state::untrack(fd);
        let flushed = if crate::engine_fd::any() {
            // Outside the guard: the flush writes through the hooks.
            crate::streams::before_replacing(fd);
            Guard::enter().and_then(|_g| crate::engine_fd::closed(fd))
        } else {
            None
        };
        // SAFETY: libc's close on the application's descriptor.
        let r = unsafe { real(fd) };
        if (0..3).contains(&fd) && crate::engine_fd::any() {
            if let Some(_g) = Guard::enter() {
                crate::streams::after_dup(fd);
            }
        }
        match flushed {
            Some(Err(e)) if r == 0 => {
                // The descriptor is gone, as the kernel does when a close
                // fails, but the program learns its writes were not kept.
                set_errno(e);
                -1
            }
            _ => r,
        }
    }

    fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, attr_yes);
            finish(path, out, |p| real(p, buf), |(a, d)| { *buf = statbuf::stat(&a, d); 0 }, -1)
        }
    }
    fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, attr_yes);
            finish(path, out, |p| real(p, buf), |(a, d)| { *buf = statbuf::stat64(&a, d); 0 }, -1)
        }
    }
    fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, attr_no);
            finish(path, out, |p| real(p, buf), |(a, d)| { *buf = statbuf::stat(&a, d); 0 }, -1)
        }
    }
    fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, attr_no);
            finish(path, out, |p| real(p, buf), |(a, d)| { *buf = statbuf::stat64(&a, d); 0 }, -1)
        }
    }
    // The symbols programs built against glibc before 2.33 call for
    // stat, lstat and fstatat (Debian 12's GNU make among them): `ver` is
    // the structure's version, which on 64-bit Linux is the one layout, so
    // each is its modern call (glibc 2.33 and later export those).
    fn __xstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int = |_real| {
        // SAFETY: the application's path and buffer.
        unsafe { stat(path, buf) }
    }
    fn __xstat64(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = |_real| {
        // SAFETY: as in `__xstat`.
        unsafe { stat64(path, buf) }
    }
    fn __lxstat(_ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int = |_real| {
        // SAFETY: as in `__xstat`.
        unsafe { lstat(path, buf) }
    }
    fn __lxstat64(_ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = |_real| {
        // SAFETY: as in `__xstat`.
        unsafe { lstat64(path, buf) }
    }
    fn __fxstatat(_ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int = |_real| {
        // SAFETY: as in `__xstat`.
        unsafe { fstatat(dirfd, path, buf, flags) }
    }
    fn __fxstatat64(_ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = |_real| {
        // SAFETY: as in `__xstat`.
        unsafe { fstatat64(dirfd, path, buf, flags) }
    }
    fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        if let Some(r) = unsafe { crate::data_hooks::stat_empty_path(dirfd, path, flags, buf, statbuf::stat) } {
            return r;
        }
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        let f = if follow == Follow::Yes { attr_yes } else { attr_no };
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(dirfd, path, follow, f);
            finish(path, out, |p| real(dirfd, p, buf, flags), |(a, d)| { *buf = statbuf::stat(&a, d); 0 }, -1)
        }
    }
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        if let Some(r) = unsafe { crate::data_hooks::stat_empty_path(dirfd, path, flags, buf, statbuf::stat64) } {
            return r;
        }
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        let f = if follow == Follow::Yes { attr_yes } else { attr_no };
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(dirfd, path, follow, f);
            finish(path, out, |p| real(dirfd, p, buf, flags), |(a, d)| { *buf = statbuf::stat64(&a, d); 0 }, -1)
        }
    }
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, buf: *mut libc::statx) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        if let Some(r) = unsafe { crate::data_hooks::stat_empty_path(dirfd, path, flags, buf, statbuf::statx) } {
            return r;
        }
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        let f = if follow == Follow::Yes { attr_yes } else { attr_no };
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(dirfd, path, follow, f);
            finish(path, out, |p| real(dirfd, p, flags, mask, buf), |(a, d)| { *buf = statbuf::statx(&a, d); 0 }, -1)
        }
    }

    fn access(path: *const c_char, mode: c_int) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| {
                a.ok_or(libc::ENOENT)?;
                e.fs.access(&state::ctx(), &p.path, mode).or_else(err)
            });
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn euidaccess(path: *const c_char, mode: c_int) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| {
                a.ok_or(libc::ENOENT)?;
                e.fs.access(&state::ctx(), &p.path, mode).or_else(err)
            });
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn eaccess(path: *const c_char, mode: c_int) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| {
                a.ok_or(libc::ENOENT)?;
                e.fs.access(&state::ctx(), &p.path, mode).or_else(err)
            });
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int = |real| {
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, follow, |e, p, a| {
                if follow == Follow::Yes {
                    a.ok_or(libc::ENOENT)?;
                }
                e.fs.access(&state::ctx(), &p.path, mode).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, mode, flags), |()| 0, -1)
        }
    }

    fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t = |real| {
        // SAFETY: the application's path and buffer of `size` bytes.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                e.fs.readlink(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(p, buf, size), |t| copy_out(t.as_encoded_bytes(), buf, size), -1)
        }
    }
    fn __readlink_chk(path: *const c_char, buf: *mut c_char, size: size_t, buflen: size_t) -> ssize_t = |real| {
        // SAFETY: as in `readlink`.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                e.fs.readlink(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(p, buf, size, buflen), |t| copy_out(t.as_encoded_bytes(), buf, size.min(buflen)), -1)
        }
    }
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t = |real| {
        // SAFETY: as in `readlink`.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                e.fs.readlink(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, buf, size), |t| copy_out(t.as_encoded_bytes(), buf, size), -1)
        }
    }
    fn __readlinkat_chk(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: size_t, buflen: size_t) -> ssize_t = |real| {
        // SAFETY: as in `readlink`.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                e.fs.readlink(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, buf, size, buflen), |t| copy_out(t.as_encoded_bytes(), buf, size.min(buflen)), -1)
        }
    }

    fn mkdir(path: *const c_char, mode: mode_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                e.fs.mkdir(&state::ctx(), &p.path, mode & 0o7777 & !state::umask()).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                e.fs.mkdir(&state::ctx(), &p.path, mode & 0o7777 & !state::umask()).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, mode), |()| 0, -1)
        }
    }
    fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                let m = (mode & libc::S_IFMT) | (mode & 0o7777 & !state::umask());
                e.fs.mknod(&state::ctx(), &p.path, m, dev).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(p, mode, dev), |()| 0, -1)
        }
    }
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                let m = (mode & libc::S_IFMT) | (mode & 0o7777 & !state::umask());
                e.fs.mknod(&state::ctx(), &p.path, m, dev).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, mode, dev), |()| 0, -1)
        }
    }
    // glibc's `mkfifo` makes its node with an internal `mknodat`, which no
    // hook sees.
    fn mkfifo(path: *const c_char, mode: mode_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                let m = libc::S_IFIFO | (mode & 0o7777 & !state::umask());
                e.fs.mknod(&state::ctx(), &p.path, m, 0).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                let m = libc::S_IFIFO | (mode & 0o7777 & !state::umask());
                e.fs.mknod(&state::ctx(), &p.path, m, 0).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(dirfd, p, mode), |()| 0, -1)
        }
    }
    fn rmdir(path: *const c_char) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                e.fs.rmdir(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(p), |()| 0, -1)
        }
    }
    fn unlink(path: *const c_char) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                e.fs.unlink(&state::ctx(), &p.path).or_else(err)
            });
            finish(path, out, |p| real(p), |()| 0, -1)
        }
    }
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                if flags & libc::AT_REMOVEDIR != 0 {
                    e.fs.rmdir(&state::ctx(), &p.path).or_else(err)
                } else {
                    e.fs.unlink(&state::ctx(), &p.path).or_else(err)
                }
            });
            finish(path, out, |p| real(dirfd, p, flags), |()| 0, -1)
        }
    }
    fn symlink(target: *const c_char, path: *const c_char) -> c_int = |real| {
        // SAFETY: the application's strings.
        unsafe {
            let t = bytes(target).unwrap_or_default();
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, _| {
                let t = std::ffi::OsStr::from_bytes_ref(t);
                e.fs.symlink(&state::ctx(), t, &p.path).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(target, p), |()| 0, -1)
        }
    }
    fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int = |real| {
        // SAFETY: the application's strings.
        unsafe {
            let t = bytes(target).unwrap_or_default();
            let out = on_path(dirfd, path, Follow::No, |e, p, _| {
                let t = std::ffi::OsStr::from_bytes_ref(t);
                e.fs.symlink(&state::ctx(), t, &p.path).map(|_| ()).or_else(err)
            });
            finish(path, out, |p| real(target, dirfd, p), |()| 0, -1)
        }
    }
    fn rename(old: *const c_char, new: *const c_char) -> c_int = |real| {
        // SAFETY: the application's paths.
        unsafe {
            two_paths(libc::AT_FDCWD, old, false, libc::AT_FDCWD, new, |a, b| real(a, b), |e, a, b| {
                e.fs.rename(&state::ctx(), &a.path, &b.path, RenameFlags::default())
            })
        }
    }
    fn renameat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char) -> c_int = |real| {
        // SAFETY: the application's paths.
        unsafe {
            two_paths(od, old, false, nd, new, |a, b| real(od, a, nd, b), |e, a, b| {
                e.fs.rename(&state::ctx(), &a.path, &b.path, RenameFlags::default())
            })
        }
    }
    fn renameat2(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: libc::c_uint) -> c_int = |real| {
        let rf = RenameFlags {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        // SAFETY: the application's paths.
        unsafe {
            two_paths(od, old, false, nd, new, |a, b| real(od, a, nd, b, flags), |e, a, b| {
                e.fs.rename(&state::ctx(), &a.path, &b.path, rf)
            })
        }
    }
    fn link(old: *const c_char, new: *const c_char) -> c_int = |real| {
        // SAFETY: the application's paths.
        unsafe {
            two_paths(libc::AT_FDCWD, old, false, libc::AT_FDCWD, new, |a, b| real(a, b), |e, a, b| {
                e.fs.link(&state::ctx(), &a.path, &b.path).map(|_| ())
            })
        }
    }
    fn linkat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_int) -> c_int = |real| {
        let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
        // SAFETY: the application's paths.
        unsafe {
            two_paths(od, old, follow, nd, new, |a, b| real(od, a, nd, b, flags), |e, a, b| {
                e.fs.link(&state::ctx(), &a.path, &b.path).map(|_| ())
            })
        }
    }

    fn chmod(path: *const c_char, mode: mode_t) -> c_int = |real| {
        let set = SetAttr { mode: Some(mode & 0o7777), ..SetAttr::default() };
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| setattr(e, p, a, Follow::Yes, set));
            finish(path, out, |p| real(p, mode), |()| 0, -1)
        }
    }
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int = |real| {
        let set = SetAttr { mode: Some(mode & 0o7777), ..SetAttr::default() };
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, follow, |e, p, a| setattr(e, p, a, follow, set));
            finish(path, out, |p| real(dirfd, p, mode, flags), |()| 0, -1)
        }
    }
    fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int = |real| {
        let set = owner(uid, gid);
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| setattr(e, p, a, Follow::Yes, set));
            finish(path, out, |p| real(p, uid, gid), |()| 0, -1)
        }
    }
    fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int = |real| {
        let set = owner(uid, gid);
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::No, |e, p, a| setattr(e, p, a, Follow::No, set));
            finish(path, out, |p| real(p, uid, gid), |()| 0, -1)
        }
    }
    fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int = |real| {
        let set = owner(uid, gid);
        let follow = follow_if(flags, libc::AT_SYMLINK_NOFOLLOW);
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(dirfd, path, follow, |e, p, a| setattr(e, p, a, follow, set));
            finish(path, out, |p| real(dirfd, p, uid, gid, flags), |()| 0, -1)
        }
    }
    fn truncate(path: *const c_char, len: libc::off_t) -> c_int = |real| {
        if len < 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        let set = SetAttr { size: Some(len as u64), ..SetAttr::default() };
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| setattr(e, p, a, Follow::Yes, set));
            finish(path, out, |p| real(p, len), |()| 0, -1)
        }
    }
    fn truncate64(path: *const c_char, len: libc::off64_t) -> c_int = |real| {
        if len < 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        let set = SetAttr { size: Some(len as u64), ..SetAttr::default() };
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, a| setattr(e, p, a, Follow::Yes, set));
            finish(path, out, |p| real(p, len), |()| 0, -1)
        }
    }
    fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's path and times.
        unsafe { utimens(dirfd, path, times, flags, |p| real(dirfd, p, times, flags)) }
    }
    fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int = |real| {
        // SAFETY: the application's path and times.
        unsafe {
            let ts = timevals(tv);
            let tp = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            utimens(libc::AT_FDCWD, path, tp, 0, |p| real(p, tv))
        }
    }
    fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int = |real| {
        // SAFETY: the application's path and times.
        unsafe {
            let ts = timevals(tv);
            let tp = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            utimens(libc::AT_FDCWD, path, tp, libc::AT_SYMLINK_NOFOLLOW, |p| real(p, tv))
        }
    }
    fn futimesat(dirfd: c_int, path: *const c_char, tv: *const libc::timeval) -> c_int = |real| {
        // SAFETY: the application's path and times.
        unsafe {
            let ts = timevals(tv);
            let tp = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            utimens(dirfd, path, tp, 0, |p| real(dirfd, p, tv))
        }
    }
    fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int = |real| {
        // SAFETY: the application's path and times.
        unsafe {
            let ts = (!times.is_null()).then(|| {
                let t = &*times;
                [t.actime, t.modtime].map(|s| libc::timespec { tv_sec: s, tv_nsec: 0 })
            });
            let tp = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            utimens(libc::AT_FDCWD, path, tp, 0, |p| real(p, times))
        }
    }

    fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, _| e.fs.statfs(&state::ctx(), &p.path).or_else(err));
            finish(path, out, |p| real(p, buf), |s| { *buf = statbuf::statfs(&s); 0 }, -1)
        }
    }
    fn statfs64(path: *const c_char, buf: *mut libc::statfs64) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, _| e.fs.statfs(&state::ctx(), &p.path).or_else(err));
            finish(path, out, |p| real(p, buf), |s| { *buf = statbuf::statfs64(&s); 0 }, -1)
        }
    }
    fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, _| e.fs.statfs(&state::ctx(), &p.path).or_else(err));
            finish(path, out, |p| real(p, buf), |s| { *buf = statbuf::statvfs(&s); 0 }, -1)
        }
    }
    fn statvfs64(path: *const c_char, buf: *mut libc::statvfs64) -> c_int = |real| {
        // SAFETY: the application's path and buffer.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, |e, p, _| e.fs.statfs(&state::ctx(), &p.path).or_else(err));
            finish(path, out, |p| real(p, buf), |s| { *buf = statbuf::statvfs64(&s); 0 }, -1)
        }
    }

    fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = |real| {
        // SAFETY: the application's strings and buffer.
        unsafe { get_xattr(path, name, value, size, Follow::Yes, |p| real(p, name, value, size)) }
    }
    fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = |real| {
        // SAFETY: the application's strings and buffer.
        unsafe { get_xattr(path, name, value, size, Follow::No, |p| real(p, name, value, size)) }
    }
    fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's strings and buffer.
        unsafe { set_xattr(path, name, value, size, flags, Follow::Yes, |p| real(p, name, value, size, flags)) }
    }
    fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's strings and buffer.
        unsafe { set_xattr(path, name, value, size, flags, Follow::No, |p| real(p, name, value, size, flags)) }
    }
    fn listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = |real| {
        // SAFETY: the application's path and buffer.
        unsafe { list_xattr(path, list, size, Follow::Yes, |p| real(p, list, size)) }
    }
    fn llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = |real| {
        // SAFETY: the application's path and buffer.
        unsafe { list_xattr(path, list, size, Follow::No, |p| real(p, list, size)) }
    }
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int = |real| {
        // SAFETY: the application's strings.
        unsafe { remove_xattr(path, name, Follow::Yes, |p| real(p, name)) }
    }
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int = |real| {
        // SAFETY: the application's strings.
        unsafe { remove_xattr(path, name, Follow::No, |p| real(p, name)) }
    }

    fn opendir(path: *const c_char) -> *mut libc::DIR = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = open_dir(path);
            finish(path, out, |p| real(p), |fd| {
                let d = libc::fdopendir(fd);
                if d.is_null() {
                    let e = errno();
                    close_own(fd);
                    set_errno(e);
                }
                d
            }, std::ptr::null_mut())
        }
    }
    fn fdopendir(fd: c_int) -> *mut libc::DIR = |real| {
        match in_library(|| crate::dirs::fdopendir(fd)) {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                set_errno(e);
                std::ptr::null_mut()
            }
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd) },
        }
    }
    fn readdir(dir: *mut libc::DIR) -> *mut libc::dirent = |real| {
        match crate::dirs::readdir(dir) {
            // Same layout as `dirent64` on 64-bit Linux.
            Some(p) => p.cast(),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir) },
        }
    }
    fn readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 = |real| {
        match crate::dirs::readdir(dir) {
            Some(p) => p,
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir) },
        }
    }
    fn readdir_r(dir: *mut libc::DIR, entry: *mut libc::dirent, result: *mut *mut libc::dirent) -> c_int = |real| {
        // SAFETY: the caller's buffers; `dirent` is `dirent64` on 64-bit
        // Linux.
        match unsafe { crate::dirs::readdir_r(dir, entry.cast(), result.cast()) } {
            Some(r) => r,
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir, entry, result) },
        }
    }
    fn readdir64_r(dir: *mut libc::DIR, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int = |real| {
        // SAFETY: the caller's buffers.
        match unsafe { crate::dirs::readdir_r(dir, entry, result) } {
            Some(r) => r,
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir, entry, result) },
        }
    }
    fn telldir(dir: *mut libc::DIR) -> libc::c_long = |real| {
        match crate::dirs::telldir(dir) {
            Some(r) => r,
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir) },
        }
    }
    fn seekdir(dir: *mut libc::DIR, loc: libc::c_long) -> () = |real| {
        if crate::dirs::seekdir(dir, loc).is_none() {
            // SAFETY: libc's call with the caller's arguments.
            unsafe { real(dir, loc) }
        }
    }
    fn rewinddir(dir: *mut libc::DIR) -> () = |real| {
        if in_library(|| crate::dirs::rewinddir(dir)).is_none() {
            // SAFETY: libc's call with the caller's arguments.
            unsafe { real(dir) }
        }
    }
    fn dirfd(dir: *mut libc::DIR) -> c_int = |real| {
        match crate::dirs::dirfd(dir) {
            Some(fd) => fd,
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(dir) },
        }
    }
    fn closedir(dir: *mut libc::DIR) -> c_int = |real| {
        if let Some(r) = in_library(|| crate::dirs::closedir(dir)) {
            return r;
        }
        if !dir.is_null() {
            // SAFETY: the application's open directory stream.
            state::untrack(unsafe { libc::dirfd(dir) });
        }
        // SAFETY: libc's closedir on the application's stream.
        unsafe { real(dir) }
    }
    fn scandir(path: *const c_char, list: *mut *mut *mut libc::dirent, filter: Filter, compar: Compar) -> c_int = |real| {
        // SAFETY: the application's path and callbacks.
        unsafe {
            let out = open_dir(path);
            finish(path, out, |p| real(p, list, filter, compar), |fd| {
                // SAFETY: `dirent` is `dirent64` on 64-bit Linux, and the
                // callbacks take pointers alike.
                if let Some(n) = in_library(|| crate::dirs::scandir(
                    fd,
                    list.cast(),
                    std::mem::transmute::<Filter, Filter64>(filter),
                    std::mem::transmute::<Compar, QsortCompar>(compar),
                )) {
                    return scanned(n);
                }
                let n = scandirat(fd, c".".as_ptr(), list, filter, compar);
                let e = errno();
                close_own(fd);
                set_errno(e);
                n
            }, -1)
        }
    }
    fn scandir64(path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: Filter64, compar: Compar64) -> c_int = |real| {
        // SAFETY: the application's path and callbacks.
        unsafe {
            let out = open_dir(path);
            finish(path, out, |p| real(p, list, filter, compar), |fd| {
                // SAFETY: the callbacks take pointers alike.
                if let Some(n) = in_library(|| crate::dirs::scandir(
                    fd,
                    list,
                    filter,
                    std::mem::transmute::<Compar64, QsortCompar>(compar),
                )) {
                    return scanned(n);
                }
                let n = scandirat64(fd, c".".as_ptr(), list, filter, compar);
                let e = errno();
                close_own(fd);
                set_errno(e);
                n
            }, -1)
        }
    }

    fn chdir(path: *const c_char) -> c_int = |real| {
        // SAFETY: the application's path.
        unsafe {
            let out = on_path(libc::AT_FDCWD, path, Follow::Yes, ops::chdir);
            finish(path, out, |p| {
                let r = real(p);
                if r == 0 {
                    host_cwd_changed();
                }
                r
            }, |()| 0, -1)
        }
    }
    fn fchdir(fd: c_int) -> c_int = |real| {
        let place = if state::embs().is_empty() {
            None
        } else {
            Guard::enter().and_then(|_g| {
                let saved = errno();
                let r = state::dir_of(fd).map(|p| {
                    let e = &state::embs()[p.idx];
                    let a = e.fs.getattr(&state::ctx(), &p.path).ok();
                    ops::chdir(e, &p, a.as_ref())
                });
                set_errno(saved);
                r
            })
        };
        match place {
            Some(Ok(())) => 0,
            Some(Err(e)) => {
                set_errno(e);
                -1
            }
            None => {
                // SAFETY: libc's fchdir on the application's descriptor.
                let r = unsafe { real(fd) };
                if r == 0 {
                    host_cwd_changed();
                }
                r
            }
        }
    }
    fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char = |real| {
        match cwd_bytes() {
            // SAFETY: the application's buffer of `size` bytes (or NULL).
            Some(v) => unsafe { c_string_out(&v, buf, size) },
            // SAFETY: libc's getcwd with the application's arguments.
            None => unsafe { real(buf, size) },
        }
    }
    fn __getcwd_chk(buf: *mut c_char, size: size_t, buflen: size_t) -> *mut c_char = |real| {
        match cwd_bytes() {
            // SAFETY: the application's buffer of `size` bytes (or NULL).
            Some(v) => unsafe { c_string_out(&v, buf, size.min(buflen)) },
            // SAFETY: libc's __getcwd_chk with the application's arguments.
            None => unsafe { real(buf, size, buflen) },
        }
    }
    fn get_current_dir_name() -> *mut c_char = |real| {
        match cwd_bytes() {
            // SAFETY: a fresh allocation of the right size.
            Some(v) => unsafe { c_string_out(&v, std::ptr::null_mut(), 0) },
            // SAFETY: libc's get_current_dir_name.
            None => unsafe { real() },
        }
    }
    fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char = |real| {
        // SAFETY: the application's path and buffer.
        unsafe { realpath_into(path, resolved, |p| real(p, resolved)) }
    }
    fn __realpath_chk(path: *const c_char, resolved: *mut c_char, len: size_t) -> *mut c_char = |real| {
        // SAFETY: the application's path and buffer.
        unsafe { realpath_into(path, resolved, |p| real(p, resolved, len)) }
    }
    fn canonicalize_file_name(path: *const c_char) -> *mut c_char = |real| {
        // SAFETY: the application's path.
        unsafe { realpath_into(path, std::ptr::null_mut(), |p| real(p)) }
    }
    fn mkstemp(tmpl: *mut c_char) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, 0, 0, || real(tmpl)) }
    }
    fn mkstemp64(tmpl: *mut c_char) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, 0, 0, || real(tmpl)) }
    }
    fn mkostemp(tmpl: *mut c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, 0, flags, || real(tmpl, flags)) }
    }
    fn mkostemp64(tmpl: *mut c_char, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, 0, flags, || real(tmpl, flags)) }
    }
    fn mkstemps(tmpl: *mut c_char, suffix: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, suffix, 0, || real(tmpl, suffix)) }
    }
    fn mkstemps64(tmpl: *mut c_char, suffix: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, suffix, 0, || real(tmpl, suffix)) }
    }
    fn mkostemps(tmpl: *mut c_char, suffix: c_int, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, suffix, flags, || real(tmpl, suffix, flags)) }
    }
    fn mkostemps64(tmpl: *mut c_char, suffix: c_int, flags: c_int) -> c_int = |real| {
        // SAFETY: the application's template.
        unsafe { mkstemp_impl(tmpl, suffix, flags, || real(tmpl, suffix, flags)) }
    }
    fn setuid(uid: libc::uid_t) -> c_int = |real| {
        // SAFETY: libc's call with the application's arguments.
        let r = unsafe { real(uid) };
        state::forget_ctx();
        r
    }
    fn seteuid(uid: libc::uid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(uid) };
        state::forget_ctx();
        r
    }
    fn setreuid(ruid: libc::uid_t, euid: libc::uid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(ruid, euid) };
        state::forget_ctx();
        r
    }
    fn setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(ruid, euid, suid) };
        state::forget_ctx();
        r
    }
    fn setgid(gid: libc::gid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(gid) };
        state::forget_ctx();
        r
    }
    fn setegid(gid: libc::gid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(gid) };
        state::forget_ctx();
        r
    }
    fn setregid(rgid: libc::gid_t, egid: libc::gid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(rgid, egid) };
        state::forget_ctx();
        r
    }
    fn setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t) -> c_int = |real| {
        // SAFETY: as for setuid.
        let r = unsafe { real(rgid, egid, sgid) };
        state::forget_ctx();
        r
    }
    fn umask(mask: mode_t) -> mode_t = |real| {
        state::set_umask(mask);
        // SAFETY: libc's umask.
        unsafe { real(mask) }
    }
}

/// A new pseudo-random number for temporary names (not a secret: names
/// are only made unique, `O_EXCL` makes the creation safe).
fn tmp_random() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x =
        t ^ (u64::from(std::process::id()) << 32) ^ N.fetch_add(0x9e37_79b9, Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// `mkstemp` and its variants on an embedded template: glibc creates the
/// file with an internal `open` no hook sees, so the library makes the
/// name and creates it itself (`O_EXCL`, mode 0600).
///
/// # Safety
/// `tmpl` is a writable NUL-terminated template.
unsafe fn mkstemp_impl(
    tmpl: *mut c_char,
    suffix: c_int,
    flags: c_int,
    real: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: per the contract.
    let Some(b) = (unsafe { bytes(tmpl) }) else {
        return real();
    };
    let len = b.len();
    let Ok(suffix) = usize::try_from(suffix) else {
        return real();
    };
    if state::embs().is_empty()
        || len < 6 + suffix
        || &b[len - 6 - suffix..len - suffix] != b"XXXXXX"
    {
        return real();
    }
    let start = len - 6 - suffix;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    for _ in 0..1000 {
        let mut r = tmp_random();
        for i in 0..6 {
            // SAFETY: within the template's `len` bytes (checked above).
            unsafe { *tmpl.add(start + i) = CHARS[(r % 62) as usize] as c_char };
            r /= 62;
        }
        // SAFETY: the template, now a full name.
        let out = unsafe {
            on_path(libc::AT_FDCWD, tmpl, Follow::No, |e, p, _| {
                ops::open(e, p, flags, 0o600)
            })
        };
        match out {
            Out::Host(_) => {
                for i in 0..6 {
                    // SAFETY: as above.
                    unsafe { *tmpl.add(start + i) = b'X' as c_char };
                }
                return real();
            }
            Out::Done(Err(libc::EEXIST)) => continue,
            Out::Done(Ok(fd)) => return fd,
            Out::Done(Err(e)) => {
                set_errno(e);
                return -1;
            }
        }
    }
    set_errno(libc::EEXIST);
    -1
}

/// After a successful `chdir`/`fchdir` on the host.
fn host_cwd_changed() {
    if state::embs().is_empty() {
        return;
    }
    state::set_cwd(None);
    if let Some(_g) = Guard::enter() {
        let saved = errno();
        state::note_host_cwd();
        set_errno(saved);
    }
}

pub(crate) fn owner(uid: libc::uid_t, gid: libc::gid_t) -> SetAttr {
    SetAttr {
        uid: (uid != libc::uid_t::MAX).then_some(uid),
        gid: (gid != libc::gid_t::MAX).then_some(gid),
        ..SetAttr::default()
    }
}

/// # Safety
/// The application's strings, and `value` valid for `size` bytes.
unsafe fn get_xattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
    follow: Follow,
    real: impl FnOnce(*const c_char) -> ssize_t,
) -> ssize_t {
    // SAFETY: per the contract.
    let n = unsafe { bytes(name) }.unwrap_or_default();
    // SAFETY: per the contract.
    let out = unsafe {
        on_path(libc::AT_FDCWD, path, follow, |e, p, a| {
            if follow == Follow::Yes {
                a.ok_or(libc::ENOENT)?;
            }
            // SAFETY: names are bytes; the file system takes them as given.
            let n = std::ffi::OsStr::from_bytes_ref(n);
            e.fs.getxattr(&state::ctx(), &p.path, n).or_else(err)
        })
    };
    // SAFETY: per the contract.
    finish(
        path,
        out,
        real,
        |v| unsafe { xattr_out(&v, value, size) },
        -1,
    )
}

/// # Safety
/// The application's strings, and `value` valid for `size` bytes.
unsafe fn set_xattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
    follow: Follow,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the contract.
    let n = unsafe { bytes(name) }.unwrap_or_default();
    // SAFETY: per the contract.
    let v = unsafe { xattr_value(value, size) };
    // SAFETY: per the contract.
    let out = unsafe {
        on_path(libc::AT_FDCWD, path, follow, |e, p, a| {
            if follow == Follow::Yes {
                a.ok_or(libc::ENOENT)?;
            }
            let n = std::ffi::OsStr::from_bytes_ref(n);
            e.fs.setxattr(&state::ctx(), &p.path, n, v, flags)
                .or_else(err)
        })
    };
    finish(path, out, real, |()| 0, -1)
}

/// # Safety
/// The application's path, and `list` valid for `size` bytes.
unsafe fn list_xattr(
    path: *const c_char,
    list: *mut c_char,
    size: size_t,
    follow: Follow,
    real: impl FnOnce(*const c_char) -> ssize_t,
) -> ssize_t {
    // SAFETY: per the contract.
    let out = unsafe {
        on_path(libc::AT_FDCWD, path, follow, |e, p, a| {
            if follow == Follow::Yes {
                a.ok_or(libc::ENOENT)?;
            }
            let names = e.fs.listxattr(&state::ctx(), &p.path).or_else(err)?;
            Ok(xattr_list(names))
        })
    };
    // SAFETY: per the contract.
    finish(
        path,
        out,
        real,
        |v| unsafe { xattr_out(&v, list.cast(), size) },
        -1,
    )
}

/// # Safety
/// The application's strings.
unsafe fn remove_xattr(
    path: *const c_char,
    name: *const c_char,
    follow: Follow,
    real: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the contract.
    let n = unsafe { bytes(name) }.unwrap_or_default();
    // SAFETY: per the contract.
    let out = unsafe {
        on_path(libc::AT_FDCWD, path, follow, |e, p, a| {
            if follow == Follow::Yes {
                a.ok_or(libc::ENOENT)?;
            }
            let n = std::ffi::OsStr::from_bytes_ref(n);
            e.fs.removexattr(&state::ctx(), &p.path, n).or_else(err)
        })
    };
    finish(path, out, real, |()| 0, -1)
}

/// The value of a `setxattr` call (empty when NULL or of size 0).
///
/// # Safety
/// `value` is NULL or valid for `size` bytes.
pub(crate) unsafe fn xattr_value<'a>(value: *const c_void, size: size_t) -> &'a [u8] {
    if value.is_null() || size == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }
}

/// A `listxattr` answer: each name followed by a NUL.
pub(crate) fn xattr_list(names: Vec<std::ffi::OsString>) -> Vec<u8> {
    let mut v = Vec::new();
    for n in names {
        v.extend_from_slice(n.as_encoded_bytes());
        v.push(0);
    }
    v
}

/// Bytes as an `OsStr` (Unix: any bytes).
pub(crate) trait FromBytesRef {
    fn from_bytes_ref(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytesRef for std::ffi::OsStr {
    fn from_bytes_ref(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

/// The library's `fork`: closes the fork gate ([`mapfs_interpose::gate`])
/// so that no thread of the process holds a lock of the library at the
/// real `fork` (called next: the attached shim's, when it is loaded too,
/// closes its own gate inside this one).
pub(crate) fn fork_with(real: impl FnOnce() -> libc::pid_t) -> libc::pid_t {
    if crate::READY.load(std::sync::atomic::Ordering::Acquire)
        && mapfs_interpose::gate::close_for_fork()
    {
        mapfs_interpose::guard::Guard::enter_forced();
        // Not from a signal handler: persisting allocates.
        if !mapfs_interpose::signal::in_handler() {
            crate::engine_fd::flush_all();
        }
    }
    let pid = real();
    if mapfs_interpose::gate::closing_thread() {
        // A fork that failed before running the handlers.
        fork_parent();
    }
    pid
}

/// A `fork` that did not come through [`fork_with`] still closes the gate.
extern "C" fn fork_prepare() {
    if crate::READY.load(std::sync::atomic::Ordering::Acquire)
        && !mapfs_interpose::gate::closing_thread()
        && mapfs_interpose::gate::close_for_fork()
    {
        mapfs_interpose::guard::Guard::enter_forced();
    }
}

extern "C" fn fork_parent() {
    if mapfs_interpose::gate::closing_thread() {
        crate::engine_fd::forked_parent();
        mapfs_interpose::gate::after_fork_parent();
        mapfs_interpose::guard::Guard::leave_forced();
    }
}

extern "C" fn fork_child() {
    let closed = mapfs_interpose::gate::closing_thread();
    if closed {
        crate::engine_fd::forked_child();
        // The child has a pid of its own.
        state::forget_ctx();
    }
    mapfs_interpose::gate::after_fork_child(closed);
    if closed {
        mapfs_interpose::guard::Guard::leave_forced();
    }
}

/// Keeps the library's tables consistent across `fork`.
pub fn install_fork_handlers() {
    // SAFETY: registering plain extern "C" functions with no arguments.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
}
