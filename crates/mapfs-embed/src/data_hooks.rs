//! The descriptor calls on placeholders of engine-served opens (see
//! [`crate::engine_fd`]): the data calls, `fstat`, `dup`/`fcntl`, and the
//! calls that cannot be served in-process (a shared `mmap`, `sendfile`,
//! `splice`), which fail with a clear errno and one warning.
//! `copy_file_range` is served by reading and writing through the engine. Every hook costs one atomic load when no placeholder is open.
//! `exec` and `posix_spawn` flush what this image's opens wrote first and
//! carry the inherited opens to the new image (see
//! [`engine_fd::before_exec`]).

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::sync::Arc;

use libc::{off64_t, off_t, size_t, ssize_t};

use crate::engine_fd::{self, EngineOpen};
use crate::hooks::{hooks, FromBytesRef};
use crate::{statbuf, Guard};

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// A call being served: the guard held, the time counted for the report.
struct Serving {
    _served: crate::report::Served,
    _g: Guard,
}

/// The engine open of `fd` when the call is to be served here, with the
/// guard held.
#[inline]
fn open_of(fd: c_int) -> Option<(Arc<EngineOpen>, Serving)> {
    if !engine_fd::any() {
        return None;
    }
    let g = Guard::enter()?;
    let o = engine_fd::get(fd)?;
    Some((
        o,
        Serving {
            _served: crate::report::Served::start(),
            _g: g,
        },
    ))
}

fn count(r: Result<usize, i32>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `preadv2` on an engine open: `off` -1 is the description's offset, as
/// for `readv`; `RWF_HIPRI` and `RWF_NOWAIT` change nothing here (the
/// engine's read does not wait on anything a flag could skip); any other
/// flag is refused as the kernel refuses flags it does not know.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
unsafe fn readv2_at(
    o: &EngineOpen,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
    flags: c_int,
) -> ssize_t {
    if flags & !(libc::RWF_HIPRI | libc::RWF_NOWAIT) != 0 {
        set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    // SAFETY: per the contract.
    unsafe { readv_at(o, iov, cnt, (off != -1).then_some(off)) }
}

/// `pwritev2` on an engine open: `off` -1 is the description's offset;
/// `RWF_APPEND` writes at the end of the file (leaving the description's
/// offset alone, as Linux does), `RWF_DSYNC`/`RWF_SYNC` persist the write
/// before it returns, `RWF_HIPRI`/`RWF_NOWAIT` change nothing here; any
/// other flag is refused as the kernel refuses flags it does not know.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
unsafe fn writev2_at(
    o: &EngineOpen,
    iov: *const libc::iovec,
    cnt: c_int,
    off: i64,
    flags: c_int,
) -> ssize_t {
    let known =
        libc::RWF_HIPRI | libc::RWF_NOWAIT | libc::RWF_APPEND | libc::RWF_DSYNC | libc::RWF_SYNC;
    if flags & !known != 0 {
        set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    let at = if flags & libc::RWF_APPEND != 0 {
        match o.size() {
            Ok(end) => Some(end as i64),
            Err(e) => {
                set_errno(e);
                return -1;
            }
        }
    } else {
        (off != -1).then_some(off)
    };
    // SAFETY: per the contract.
    let n = unsafe { writev_at(o, iov, cnt, at) };
    if n >= 0 && flags & (libc::RWF_DSYNC | libc::RWF_SYNC) != 0 {
        if let Err(e) = o.fsync(flags & libc::RWF_SYNC == 0) {
            set_errno(e);
            return -1;
        }
    }
    n
}

/// `fchmod`, `fchown`, `futimens` of an engine open: the file system's
/// `setattr` of its file.
fn set_attr(o: &EngineOpen, set: mapfs::SetAttr) -> c_int {
    status(o.meta(|fs, c, p| fs.setattr(c, p, &set).map(|_| ())))
}

fn status(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn position(r: Result<u64, i32>) -> off64_t {
    match r {
        Ok(p) => p as off64_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn offset(off: i64) -> Result<u64, i32> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

/// `read`/`pread` (`off`: `None` for the description's offset).
///
/// # Safety
/// `buf` is valid for `n` bytes of writing.
unsafe fn read_at(o: &EngineOpen, buf: *mut c_void, n: size_t, off: Option<i64>) -> ssize_t {
    if n == 0 {
        return 0;
    }
    // SAFETY: per the contract.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    count(match off {
        None => o.read(b),
        Some(x) => offset(x).and_then(|x| o.pread(b, x)),
    })
}

/// `write`/`pwrite`.
///
/// # Safety
/// `buf` is valid for `n` bytes of reading.
unsafe fn write_at(o: &EngineOpen, buf: *const c_void, n: size_t, off: Option<i64>) -> ssize_t {
    let b: &[u8] = if n == 0 {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
    };
    count(match off {
        None => o.write(b),
        Some(x) => offset(x).and_then(|x| o.pwrite(b, x)),
    })
}

/// One end of a [`copy_range`]: an engine open, or a descriptor of the
/// kernel's.
enum End {
    Engine(Arc<EngineOpen>),
    Kernel(c_int),
}

impl End {
    fn of(fd: c_int) -> End {
        match engine_fd::get(fd) {
            Some(o) => End::Engine(o),
            None => End::Kernel(fd),
        }
    }

    /// Reads at `off` (`None`: at the description's offset, moving it).
    fn read(&self, buf: &mut [u8], off: Option<u64>) -> Result<usize, i32> {
        let sys = |r: libc::ssize_t| usize::try_from(r).map_err(|_| errno());
        match (self, off) {
            (End::Engine(o), Some(x)) => o.pread(buf, x),
            (End::Engine(o), None) => o.read(buf),
            // SAFETY: `buf` is valid for writes of its length; the guard is
            // held, so libc's call goes to the kernel.
            (End::Kernel(fd), Some(x)) => {
                sys(unsafe { libc::pread(*fd, buf.as_mut_ptr().cast(), buf.len(), x as off_t) })
            }
            // SAFETY: as above.
            (End::Kernel(fd), None) => {
                sys(unsafe { libc::read(*fd, buf.as_mut_ptr().cast(), buf.len()) })
            }
        }
    }

    /// Writes at `off` (`None`: at the description's offset, moving it).
    fn write(&self, data: &[u8], off: Option<u64>) -> Result<usize, i32> {
        let sys = |r: libc::ssize_t| usize::try_from(r).map_err(|_| errno());
        match (self, off) {
            (End::Engine(o), Some(x)) => o.pwrite(data, x),
            (End::Engine(o), None) => o.write(data),
            // SAFETY: `data` is valid for reads of its length; the guard is
            // held, so libc's call goes to the kernel.
            (End::Kernel(fd), Some(x)) => {
                sys(unsafe { libc::pwrite(*fd, data.as_ptr().cast(), data.len(), x as off_t) })
            }
            // SAFETY: as above.
            (End::Kernel(fd), None) => {
                sys(unsafe { libc::write(*fd, data.as_ptr().cast(), data.len()) })
            }
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `copy_file_range` with an engine-served end: the engine reads and
/// writes it, as a mount's `copy_file_range` serves it (programs take the
/// `EXDEV` of a cross-device copy for "copy by hand", but a mount of the
/// same file system copies). The kernel's rules hold: flags must be 0, and
/// ranges of one file may not overlap.
///
/// # Safety
/// `ioff` and `ooff` are NULL or valid for reading and writing an offset.
unsafe fn copy_range(
    inp: c_int,
    ioff: *mut off64_t,
    out: c_int,
    ooff: *mut off64_t,
    n: size_t,
    flags: libc::c_uint,
) -> Result<usize, i32> {
    if flags != 0 {
        return Err(libc::EINVAL);
    }
    let (src, dst) = (End::of(inp), End::of(out));
    if let (End::Engine(a), End::Engine(b)) = (&src, &dst) {
        let (fa, fb) = (a.attr()?, b.attr()?);
        if fa.1 == fb.1 && fa.0.ino == fb.0.ino {
            // SAFETY: per the contract.
            let at = |p: *mut off64_t| (!p.is_null()).then(|| unsafe { *p } as u64);
            let start_in = at(ioff).unwrap_or_else(|| a.offset_now());
            let start_out = at(ooff).unwrap_or_else(|| b.offset_now());
            let len = n as u64;
            if start_in < start_out + len && start_out < start_in + len {
                return Err(libc::EINVAL);
            }
        }
    }
    // SAFETY: per the contract.
    unsafe {
        mapfs_interpose::copy::by_hand(
            ioff,
            ooff,
            n,
            |b, at| src.read(b, at),
            |d, at| dst.write(d, at),
        )
    }
}

/// The iovecs of a vectored call.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], i32> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// `readv` family (`off` `None` or -1: the description's offset): one read
/// into a bounce buffer, scattered, so the call stays one read.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs, each valid for writing.
unsafe fn readv_at(
    o: &EngineOpen,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> ssize_t {
    // SAFETY: per the contract.
    let v = match unsafe { iovecs(iov, cnt) } {
        Ok(v) => v,
        Err(e) => return count(Err(e)),
    };
    let mut buf = vec![0u8; v.iter().map(|i| i.iov_len).sum()];
    let r = match off {
        None | Some(-1) => o.read(&mut buf),
        Some(x) => offset(x).and_then(|x| o.pread(&mut buf, x)),
    };
    if let Ok(n) = r {
        let mut done = 0;
        for i in v {
            if done == n {
                break;
            }
            let k = i.iov_len.min(n - done);
            // SAFETY: the caller's iovec is valid for `iov_len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.as_ptr().add(done), i.iov_base.cast::<u8>(), k)
            };
            done += k;
        }
    }
    count(r)
}

/// `writev` family, gathered into one write (one extent in a log).
///
/// # Safety
/// `iov` points to `cnt` valid iovecs, each valid for reading.
unsafe fn writev_at(
    o: &EngineOpen,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> ssize_t {
    // SAFETY: per the contract.
    let v = match unsafe { iovecs(iov, cnt) } {
        Ok(v) => v,
        Err(e) => return count(Err(e)),
    };
    let mut buf = Vec::with_capacity(v.iter().map(|i| i.iov_len).sum());
    for i in v {
        if i.iov_len > 0 {
            // SAFETY: the caller's iovec is valid for `iov_len` bytes.
            buf.extend_from_slice(unsafe {
                std::slice::from_raw_parts(i.iov_base.cast::<u8>(), i.iov_len)
            });
        }
    }
    count(match off {
        None | Some(-1) => o.write(&buf),
        Some(x) => offset(x).and_then(|x| o.pwrite(&buf, x)),
    })
}

fn fallocate_on(o: &EngineOpen, mode: c_int, off: i64, len: i64) -> Result<(), i32> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    o.fallocate(mode, off as u64, len as u64)
}

/// `fstat` of a placeholder into `buf` (through `fill`).
fn fstat_with<T>(o: &EngineOpen, buf: *mut T, fill: fn(&mapfs::Attr, u64) -> T) -> c_int {
    match o.attr() {
        Ok((a, dev)) => {
            // SAFETY: the caller's buffer for one `T`.
            unsafe { *buf = fill(&a, dev) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `fstat` of a directory placeholder of [`crate::dirs`]: the directory's
/// attributes (`None`: not one).
fn fstat_dir<T>(fd: c_int, buf: *mut T, fill: fn(&mapfs::Attr, u64) -> T) -> Option<c_int> {
    match crate::hooks::in_library(|| crate::dirs::fstat(fd, fill))? {
        Ok(v) => {
            // SAFETY: the caller's buffer for one `T`.
            unsafe { *buf = v };
            Some(0)
        }
        Err(e) => {
            set_errno(e);
            Some(-1)
        }
    }
}

/// `fstatat`/`statx` with `AT_EMPTY_PATH` and an empty path on a
/// placeholder: the open's attributes (`None`: not one).
///
/// # Safety
/// `path` is NULL or a valid C string; `buf` valid for one `T`.
pub unsafe fn stat_empty_path<T>(
    fd: c_int,
    path: *const c_char,
    flags: c_int,
    buf: *mut T,
    fill: fn(&mapfs::Attr, u64) -> T,
) -> Option<c_int> {
    if flags & libc::AT_EMPTY_PATH == 0 || path.is_null() || !engine_fd::any() {
        return None;
    }
    // SAFETY: per the contract.
    if !unsafe { CStr::from_ptr(path) }.is_empty() {
        return None;
    }
    let (o, _g) = open_of(fd)?;
    Some(fstat_with(&o, buf, fill))
}

/// Whether `fd` is a placeholder (for hooks elsewhere).
pub fn is_placeholder(fd: c_int) -> bool {
    engine_fd::any() && engine_fd::get(fd).is_some()
}

/// After a successful dup-like call.
fn duped(old: c_int, new: c_int) -> c_int {
    if new >= 0 && engine_fd::any() {
        if let Some(_g) = Guard::enter() {
            engine_fd::duped(old, new);
        }
    }
    if new >= 0 {
        crate::hooks::in_library(|| {
            crate::state::dir_duped(old, new);
            Some(())
        });
    }
    new
}

/// After `dup2`/`dup3` onto `new`: a standard descriptor's stream follows
/// it ([`crate::streams::after_dup`]).
fn standard_duped(new: c_int) -> c_int {
    if (0..3).contains(&new) && engine_fd::any() {
        if let Some(_g) = Guard::enter() {
            crate::streams::after_dup(new);
        }
    }
    new
}

/// The descriptor `mmap` of `fd` runs on, and what holds it open for the
/// call: `fd` itself, unless it is a placeholder; then the backing file of
/// its open if its map is that whole file ([`engine_fd::whole_backing`]),
/// else `None` (refused: no kernel object holds such a file's bytes).
fn mmap_target(fd: c_int, flags: c_int) -> Option<(c_int, Option<std::os::fd::OwnedFd>)> {
    if flags & libc::MAP_ANONYMOUS != 0 || !is_placeholder(fd) {
        return Some((fd, None));
    }
    let backing = {
        let _g = Guard::enter()?;
        engine_fd::whole_backing(fd).or_else(|| private_copy(fd, flags))?
    };
    Some((std::os::fd::AsRawFd::as_raw_fd(&backing), Some(backing)))
}

/// A private mapping (`MAP_PRIVATE`: what `git` and most readers ask) of
/// an engine-served file: a memfd holding a copy of the file's bytes as
/// the open reads them now. Its pages never reach the file, as a private
/// mapping's writes never do; later writes to the file do not show in it
/// (POSIX leaves that unspecified). A shared mapping gets `None`.
fn private_copy(fd: c_int, flags: c_int) -> Option<std::os::fd::OwnedFd> {
    use std::os::unix::fs::FileExt;
    if flags & libc::MAP_TYPE != libc::MAP_PRIVATE {
        return None;
    }
    let o = engine_fd::get(fd)?;
    let size = o.size().ok()?;
    let m = rustix::fs::memfd_create("mapfs-embed-mmap", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
    let f = std::fs::File::from(m);
    f.set_len(size).ok()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let want = (size - at).min(buf.len() as u64) as usize;
        let n = o.pread(&mut buf[..want], at).ok()?;
        if n == 0 {
            break;
        }
        f.write_all_at(&buf[..n], at).ok()?;
        at += n as u64;
    }
    Some(std::os::fd::OwnedFd::from(f))
}

fn refused<T>(call: &'static str, errno: c_int, fail: T) -> T {
    if let Some(_g) = Guard::enter() {
        set_errno(engine_fd::refuse(call, errno));
    } else {
        set_errno(errno);
    }
    fail
}

/// Before `exec`: the new image cannot carry the in-process maps.
fn before_exec() -> Vec<(c_int, std::os::fd::OwnedFd)> {
    if engine_fd::any() {
        if let Some(_g) = Guard::enter() {
            return engine_fd::before_exec();
        }
    }
    Vec::new()
}

/// Runs `call` with the path `exec` should load for `path` (the backing
/// file of a program stored under a prefix, see
/// [`crate::hooks::exec_target`]), or answers `fail(errno)`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string valid for the call.
unsafe fn exec_at<R>(
    path: *const c_char,
    fail: impl FnOnce(c_int) -> R,
    call: impl FnOnce(*const c_char) -> R,
) -> R {
    // SAFETY: per the contract.
    match unsafe { crate::hooks::exec_target(path) } {
        Ok(host) => call(host.as_ref().map_or(path, |c| c.as_ptr())),
        Err(e) => fail(e),
    }
}

/// `exec*`/`posix_spawn*`: the new image gets the carried opens, and this
/// one (a spawning parent, a failed `exec`) its placeholders back. The
/// carriers sit under the placeholders' numbers for the duration, so no
/// other thread may be inside the library meanwhile (it would read a
/// carrier for its file): the fork gate is held closed around it.
fn spawn(call: impl FnOnce() -> c_int) -> c_int {
    if !engine_fd::any() {
        return spawn_now(call);
    }
    mapfs_interpose::gate::exclusive(|| spawn_now(call))
}

fn spawn_now(call: impl FnOnce() -> c_int) -> c_int {
    let saved = before_exec();
    // Closed here again when this image goes on (a spawning parent).
    let _cwd = Guard::enter().and_then(|_g| crate::state::cwd_carrier());
    let r = call();
    if !saved.is_empty() {
        if let Some(_g) = Guard::enter() {
            engine_fd::after_spawn(saved);
        }
    }
    r
}

hooks! {
    fn pthread_create(
        thread: *mut libc::pthread_t,
        attr: *const libc::pthread_attr_t,
        start: extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int = |real| {
        // SAFETY: libc's call with the caller's arguments.
        unsafe { mapfs_interpose::threads::create(real, thread, attr, start, arg) }
    }
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { read_at(&o, buf, n, None) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n) },
        }
    }
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer, `n` checked against its length.
            Some((o, _g)) if n <= buflen => unsafe { read_at(&o, buf, n, None) },
            // SAFETY: libc's call with the caller's arguments.
            _ => unsafe { real(fd, buf, n, buflen) },
        }
    }
    fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { read_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n, off) },
        }
    }
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { read_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n, off) },
        }
    }
    fn __pread_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer, `n` checked against its length.
            Some((o, _g)) if n <= buflen => unsafe { read_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            _ => unsafe { real(fd, buf, n, off, buflen) },
        }
    }
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t, buflen: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer, `n` checked against its length.
            Some((o, _g)) if n <= buflen => unsafe { read_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            _ => unsafe { real(fd, buf, n, off, buflen) },
        }
    }
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { write_at(&o, buf, n, None) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n) },
        }
    }
    fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { write_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n, off) },
        }
    }
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's buffer.
            Some((o, _g)) => unsafe { write_at(&o, buf, n, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf, n, off) },
        }
    }
    fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { readv_at(&o, iov, cnt, None) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt) },
        }
    }
    fn preadv(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { readv_at(&o, iov, cnt, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off) },
        }
    }
    fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { readv_at(&o, iov, cnt, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off) },
        }
    }
    fn preadv2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { readv2_at(&o, iov, cnt, off, flags) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off, flags) },
        }
    }
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { readv2_at(&o, iov, cnt, off, flags) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off, flags) },
        }
    }
    fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { writev_at(&o, iov, cnt, None) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt) },
        }
    }
    fn pwritev(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { writev_at(&o, iov, cnt, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off) },
        }
    }
    fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { writev_at(&o, iov, cnt, Some(off)) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off) },
        }
    }
    fn pwritev2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { writev2_at(&o, iov, cnt, off, flags) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off, flags) },
        }
    }
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t = |real| {
        match open_of(fd) {
            // SAFETY: the caller's iovecs.
            Some((o, _g)) => unsafe { writev2_at(&o, iov, cnt, off, flags) },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, iov, cnt, off, flags) },
        }
    }
    fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t = |real| {
        match open_of(fd) {
            Some((o, _g)) => position(o.seek(off, whence)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, off, whence) },
        }
    }
    fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t = |real| {
        match open_of(fd) {
            Some((o, _g)) => position(o.seek(off, whence)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, off, whence) },
        }
    }
    fn ftruncate(fd: c_int, len: off_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(offset(len).and_then(|l| o.truncate(l))),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, len) },
        }
    }
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(offset(len).and_then(|l| o.truncate(l))),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, len) },
        }
    }
    fn fsync(fd: c_int) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(o.fsync(false)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd) },
        }
    }
    fn fdatasync(fd: c_int) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(o.fsync(true)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd) },
        }
    }
    fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(fallocate_on(&o, mode, off, len)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, mode, off, len) },
        }
    }
    fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => status(fallocate_on(&o, mode, off, len)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, mode, off, len) },
        }
    }
    fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fallocate_on(&o, 0, off, len).err().unwrap_or(0),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, off, len) },
        }
    }
    fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fallocate_on(&o, 0, off, len).err().unwrap_or(0),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, off, len) },
        }
    }
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fstat_with(&o, buf, statbuf::stat),
            // SAFETY: libc's call with the caller's arguments.
            None => fstat_dir(fd, buf, statbuf::stat).unwrap_or_else(|| unsafe { real(fd, buf) }),
        }
    }
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fstat_with(&o, buf, statbuf::stat64),
            // SAFETY: libc's call with the caller's arguments.
            None => fstat_dir(fd, buf, statbuf::stat64).unwrap_or_else(|| unsafe { real(fd, buf) }),
        }
    }
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fstat_with(&o, buf, statbuf::stat),
            // SAFETY: libc's call with the caller's arguments.
            None => fstat_dir(fd, buf, statbuf::stat).unwrap_or_else(|| unsafe { real(ver, fd, buf) }),
        }
    }
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => fstat_with(&o, buf, statbuf::stat64),
            // SAFETY: libc's call with the caller's arguments.
            None => fstat_dir(fd, buf, statbuf::stat64).unwrap_or_else(|| unsafe { real(ver, fd, buf) }),
        }
    }
    // Metadata calls on the open file: the file system's, by the path the
    // file was opened at (the placeholder's own would go nowhere).
    fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => set_attr(&o, mapfs::SetAttr { mode: Some(mode & 0o7777), ..Default::default() }),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, mode) },
        }
    }
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => set_attr(&o, crate::hooks::owner(uid, gid)),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, uid, gid) },
        }
    }
    fn futimens(fd: c_int, times: *const libc::timespec) -> c_int = |real| {
        match open_of(fd) {
            // SAFETY: the caller's two timespecs (or NULL).
            Some((o, _g)) => set_attr(&o, unsafe { crate::hooks::utime_set(times) }),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, times) },
        }
    }
    fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            Some((o, _g)) => {
                // SAFETY: the caller's string.
                let n = OsStr::from_bytes_ref(unsafe { crate::hooks::bytes(name) }.unwrap_or_default());
                match o.meta(|fs, c, p| fs.getxattr(c, p, n)) {
                    // SAFETY: the caller's buffer of `size` bytes.
                    Ok(v) => unsafe { crate::hooks::xattr_out(&v, value, size) },
                    Err(e) => count(Err(e)),
                }
            }
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, name, value, size) },
        }
    }
    fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => {
                // SAFETY: the caller's string.
                let n = OsStr::from_bytes_ref(unsafe { crate::hooks::bytes(name) }.unwrap_or_default());
                // SAFETY: the caller's buffer of `size` bytes.
                let v = unsafe { crate::hooks::xattr_value(value, size) };
                status(o.meta(|fs, c, p| fs.setxattr(c, p, n, v, flags)))
            }
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, name, value, size, flags) },
        }
    }
    fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t = |real| {
        match open_of(fd) {
            Some((o, _g)) => match o.meta(|fs, c, p| fs.listxattr(c, p)) {
                // SAFETY: the caller's buffer of `size` bytes.
                Ok(names) => unsafe { crate::hooks::xattr_out(&crate::hooks::xattr_list(names), list.cast(), size) },
                Err(e) => count(Err(e)),
            },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, list, size) },
        }
    }
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => {
                // SAFETY: the caller's string.
                let n = OsStr::from_bytes_ref(unsafe { crate::hooks::bytes(name) }.unwrap_or_default());
                status(o.meta(|fs, c, p| fs.removexattr(c, p, n)))
            }
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, name) },
        }
    }
    fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => match o.meta(|fs, c, p| fs.statfs(c, p)) {
                // SAFETY: the caller's buffer.
                Ok(s) => { unsafe { *buf = statbuf::statfs(&s) }; 0 }
                Err(e) => status(Err(e)),
            },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf) },
        }
    }
    fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => match o.meta(|fs, c, p| fs.statfs(c, p)) {
                // SAFETY: the caller's buffer.
                Ok(s) => { unsafe { *buf = statbuf::statvfs(&s) }; 0 }
                Err(e) => status(Err(e)),
            },
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, buf) },
        }
    }
    fn dup(fd: c_int) -> c_int = |real| {
        // SAFETY: libc's call with the caller's arguments.
        let new = unsafe { real(fd) };
        duped(fd, new)
    }
    fn dup2(fd: c_int, to: c_int) -> c_int = |real| {
        crate::streams::before_replacing(to);
        // SAFETY: libc's call with the caller's arguments.
        let new = unsafe { real(fd, to) };
        standard_duped(duped(fd, new))
    }
    fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int = |real| {
        crate::streams::before_replacing(to);
        // SAFETY: libc's call with the caller's arguments.
        let new = unsafe { real(fd, to, flags) };
        standard_duped(duped(fd, new))
    }
    fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int = |real| {
        if let Some((o, _g)) = open_of(fd) {
            // SAFETY: the caller's `struct flock` for a lock command;
            // libc's call on the lock file (an integer or a pointer travels
            // alike in the variadic slot).
            if let Some(r) = unsafe { crate::locks::fcntl(&o, cmd, arg, |f, c, a| real(f, c, a)) } {
                return r;
            }
        }
        // SAFETY: libc's call with the caller's arguments.
        let r = unsafe { real(fd, cmd, arg) };
        fcntl_after(fd, cmd, arg, r)
    }
    fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int = |real| {
        if let Some((o, _g)) = open_of(fd) {
            // SAFETY: as for `fcntl`.
            if let Some(r) = unsafe { crate::locks::fcntl(&o, cmd, arg, |f, c, a| real(f, c, a)) } {
                return r;
            }
        }
        // SAFETY: as for `fcntl`.
        let r = unsafe { real(fd, cmd, arg) };
        fcntl_after(fd, cmd, arg, r)
    }
    fn flock(fd: c_int, op: c_int) -> c_int = |real| {
        match open_of(fd) {
            // SAFETY: libc's call on the lock file.
            Some((o, _g)) => crate::locks::flock(&o, op, |f, op| unsafe { real(f, op) }),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, op) },
        }
    }
    fn lockf(fd: c_int, cmd: c_int, len: off_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => crate::locks::lockf(&o, cmd, len),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, cmd, len) },
        }
    }
    fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int = |real| {
        match open_of(fd) {
            Some((o, _g)) => crate::locks::lockf(&o, cmd, len),
            // SAFETY: libc's call with the caller's arguments.
            None => unsafe { real(fd, cmd, len) },
        }
    }
    fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void = |real| {
        let Some((target, _held)) = mmap_target(fd, flags) else {
            return refused("mmap", libc::ENODEV, libc::MAP_FAILED);
        };
        // SAFETY: libc's call with the caller's arguments (on the backing
        // file a placeholder's whole-file map is, held open meanwhile).
        unsafe { real(addr, len, prot, flags, target, off) }
    }
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void = |real| {
        let Some((target, _held)) = mmap_target(fd, flags) else {
            return refused("mmap", libc::ENODEV, libc::MAP_FAILED);
        };
        // SAFETY: libc's call with the caller's arguments (on the backing
        // file a placeholder's whole-file map is, held open meanwhile).
        unsafe { real(addr, len, prot, flags, target, off) }
    }
    fn sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t = |real| {
        if is_placeholder(out) || is_placeholder(inp) {
            return refused("sendfile", libc::EINVAL, -1);
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(out, inp, off, n) }
    }
    fn sendfile64(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t = |real| {
        if is_placeholder(out) || is_placeholder(inp) {
            return refused("sendfile", libc::EINVAL, -1);
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(out, inp, off, n) }
    }
    fn splice(inp: c_int, ioff: *mut off64_t, out: c_int, ooff: *mut off64_t, n: size_t, flags: libc::c_uint) -> ssize_t = |real| {
        if is_placeholder(out) || is_placeholder(inp) {
            return refused("splice", libc::EINVAL, -1);
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(inp, ioff, out, ooff, n, flags) }
    }
    fn copy_file_range(inp: c_int, ioff: *mut off64_t, out: c_int, ooff: *mut off64_t, n: size_t, flags: libc::c_uint) -> ssize_t = |real| {
        if is_placeholder(out) || is_placeholder(inp) {
            if let Some(_g) = Guard::enter() {
                // SAFETY: the caller's offset pointers (NULL or valid).
                return count(unsafe { copy_range(inp, ioff, out, ooff, n, flags) });
            }
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(inp, ioff, out, ooff, n, flags) }
    }
    // The clone ioctls on engine-served files: EOPNOTSUPP, as a mount
    // answers (see `mapfs_interpose::clone`); every other ioctl goes on.
    fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int = |real| {
        // SAFETY: the program's arguments for `req`.
        if unsafe { mapfs_interpose::clone::involves(fd, req, arg, is_placeholder) } {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(fd, req, arg) }
    }
    fn fork() -> libc::pid_t = |real| {
        // SAFETY: the next `fork`, no arguments.
        crate::hooks::fork_with(|| unsafe { real() })
    }
    // A vfork child would run the library in its parent's memory while
    // the parent's other threads go on (and an `exec` there would leave
    // the parent's gate as the child left it): it is a fork, whose
    // contract is a superset of vfork's.
    fn vfork() -> libc::pid_t = |_real| {
        // SAFETY: this library's own `fork` hook.
        unsafe { fork() }
    }
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int = |real| {
        // SAFETY: the caller's arguments, and the next `sigaction`.
        unsafe { mapfs_interpose::signal::sigaction(real, sig, act, old) }
    }
    fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = |real| {
        // SAFETY: the next `sigaction` (`sigaction::REAL`, this table's).
        unsafe { mapfs_interpose::signal::signal(next_sigaction(), sig, handler) }
    }
    fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = |real| {
        // SAFETY: as in `signal`.
        unsafe { mapfs_interpose::signal::signal(next_sigaction(), sig, handler) }
    }
    fn longjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: the caller's jump buffer; does not return.
        unsafe { real(env, val) }
    }
    fn _longjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: as in `longjmp`.
        unsafe { real(env, val) }
    }
    fn siglongjmp(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: as in `longjmp`.
        unsafe { real(env, val) }
    }
    fn __longjmp_chk(env: *mut c_void, val: c_int) -> () = |real| {
        mapfs_interpose::signal::jumped();
        // SAFETY: as in `longjmp`.
        unsafe { real(env, val) }
    }
    fn _exit(status: c_int) -> () = |real| {
        at_quick_exit();
        // SAFETY: libc's call; it does not return.
        unsafe { real(status) }
    }
    fn _Exit(status: c_int) -> () = |real| {
        at_quick_exit();
        // SAFETY: libc's call; it does not return.
        unsafe { real(status) }
    }
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE = |real| {
        if is_placeholder(fd) {
            // SAFETY: the application's mode string.
            return unsafe { crate::streams::open(fd, mode) };
        }
        // SAFETY: libc's call with the caller's arguments.
        unsafe { real(fd, mode) }
    }
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        image_ends();
        // SAFETY: the application's path; libc's call with the caller's
        // arguments (returns only on failure: the placeholders are put back).
        unsafe { exec_at(path, |e| { set_errno(e); -1 }, |path| spawn(|| real(path, argv, envp))) }
    }
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int = |real| {
        image_ends();
        // SAFETY: the application's path; libc's call with the caller's
        // arguments (returns only on failure: the placeholders are put back).
        unsafe { exec_at(path, |e| { set_errno(e); -1 }, |path| spawn(|| real(path, argv))) }
    }
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int = |real| {
        image_ends();
        // SAFETY: the application's path; libc's call with the caller's
        // arguments (returns only on failure: the placeholders are put back).
        unsafe { exec_at(file, |e| { set_errno(e); -1 }, |file| spawn(|| real(file, argv))) }
    }
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        image_ends();
        // SAFETY: the application's path; libc's call with the caller's
        // arguments (returns only on failure: the placeholders are put back).
        unsafe { exec_at(file, |e| { set_errno(e); -1 }, |file| spawn(|| real(file, argv, envp))) }
    }
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = |real| {
        // SAFETY: the application's path; libc's call with the caller's
        // arguments.
        unsafe { exec_at(path, |e| e, |path| spawn(|| real(pid, path, actions, attr, argv, envp))) }
    }
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const c_void, attr: *const c_void, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = |real| {
        // SAFETY: the application's path; libc's call with the caller's
        // arguments.
        unsafe { exec_at(file, |e| e, |file| spawn(|| real(pid, file, actions, attr, argv, envp))) }
    }
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int = |real| {
        image_ends();
        // SAFETY: libc's call with the caller's arguments (returns
        // only on failure: the placeholders are put back).
        spawn(|| unsafe { real(fd, argv, envp) })
    }
}

type SigactionFn =
    unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// The next definition of `sigaction`, for the `signal` hooks.
fn next_sigaction() -> SigactionFn {
    // SAFETY: `sigaction::REAL` holds the next definition of `sigaction`,
    // of this prototype.
    unsafe { std::mem::transmute::<*mut c_void, SigactionFn>(sigaction::REAL.addr()) }
}

/// `_exit` runs no destructor, but what a process wrote through a file
/// descriptor natively survives it: the opens are persisted first (a
/// forked shell subshell, `os._exit` in a forked child). stdio buffers are
/// not flushed, as natively.
fn at_quick_exit() {
    if !crate::canary::intact() {
        // Its descriptors were closed behind the library's back: nothing
        // of the file systems' can run safely (see `canary`).
        crate::report::write_at_quick_exit();
        return;
    }
    if let Some(_g) = Guard::enter() {
        engine_fd::close_all();
        crate::state::finish_all();
    }
    crate::report::write_at_quick_exit();
}

/// Before `exec` replaces this image: its report line is written and what
/// its file systems hold goes back (a failed `exec` goes on without it).
fn image_ends() {
    crate::report::before_exec();
    if !crate::canary::intact() {
        return;
    }
    if let Some(_g) = Guard::enter() {
        crate::state::finish_all();
    }
}

/// After `fcntl`: a duplicate shares the open; `F_SETFL` may change
/// `O_APPEND`.
fn fcntl_after(fd: c_int, cmd: c_int, arg: libc::c_ulong, r: c_int) -> c_int {
    if r < 0 {
        return r;
    }
    match cmd {
        // Directories are tracked without the engine too.
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => duped(fd, r),
        _ if !engine_fd::any() => r,
        libc::F_SETFL => {
            if let Some((o, _g)) = open_of(fd) {
                o.set_flags(arg as c_int);
            }
            r
        }
        _ => r,
    }
}
