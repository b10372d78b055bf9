//! Thin system-call helpers for the shim. They go through rustix's raw
//! system calls, never through libc's exported functions, so the shim's own
//! work can never re-enter its hooks.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Borrows a raw descriptor the application owns.
pub fn fd<'a>(raw: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the descriptor belongs to the application and stays open while
    // a hook runs on it; if the application closes it concurrently, the
    // kernel answers EBADF, which every caller handles.
    unsafe { BorrowedFd::borrow_raw(raw) }
}

pub use mapfs::backing::Identity;

/// Device, inode and type of `raw`, from cached attributes only: on a FUSE
/// mount `AT_STATX_DONT_SYNC` keeps this from reaching the daemon (see
/// [`mapfs::backing::identity`]).
pub fn identity(raw: RawFd) -> io::Result<Identity> {
    mapfs::backing::identity(fd(raw))
}

/// Makes `target` refer to `src`'s open file description (`dup3`), keeping
/// the number `target`; `cloexec` sets `FD_CLOEXEC` on it.
pub fn dup_over(src: BorrowedFd<'_>, target: RawFd, cloexec: bool) -> io::Result<()> {
    // SAFETY: `target` is an open descriptor of the application; it is
    // wrapped only to satisfy rustix's signature and never closed here
    // (ManuallyDrop), so ownership stays with the application.
    let mut t = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(target) });
    let flags = if cloexec {
        rustix::io::DupFlags::CLOEXEC
    } else {
        rustix::io::DupFlags::empty()
    };
    rustix::io::dup3(src, &mut t, flags)?;
    Ok(())
}

/// True if `raw` has `FD_CLOEXEC`.
pub fn cloexec(raw: RawFd) -> bool {
    rustix::io::fcntl_getfd(fd(raw))
        .map(|f| f.contains(rustix::io::FdFlags::CLOEXEC))
        .unwrap_or(false)
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Runs `f` with errno saved and restored, so the shim's internal calls never
/// change what the application sees.
pub fn keep_errno<T>(f: impl FnOnce() -> T) -> T {
    let e = errno();
    let r = f();
    set_errno(e);
    r
}

/// Process id of the caller.
pub fn getpid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// Milliseconds of the coarse monotonic clock (a vDSO read, no system
/// call; a few milliseconds of resolution).
pub fn coarse_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// Thread id of the caller.
pub fn gettid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// Writes a diagnostic line to stderr when `MAPFS_PRELOAD_LOG` is set.
pub fn log(msg: std::fmt::Arguments<'_>) {
    if crate::LOG.load(std::sync::atomic::Ordering::Relaxed) {
        let line = format!("mapfs-preload[{}]: {msg}\n", getpid());
        let _ = rustix::io::write(fd(2), line.as_bytes());
    }
}

/// Lowest descriptor number the shim's own descriptors use (control sockets,
/// kept mount descriptors), away from the numbers applications pick for
/// themselves (0-2, and `dup2` targets like 10).
pub const HIGH_FD: RawFd = 512;

/// A close-on-exec duplicate of `raw` numbered at least [`HIGH_FD`].
pub fn dup_high(raw: RawFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd(raw), HIGH_FD)?)
}

/// Sets or clears `FD_CLOEXEC` on `raw`.
pub fn set_cloexec(raw: RawFd, on: bool) -> io::Result<()> {
    let flags = if on {
        rustix::io::FdFlags::CLOEXEC
    } else {
        rustix::io::FdFlags::empty()
    };
    Ok(rustix::io::fcntl_setfd(fd(raw), flags)?)
}

/// A `struct flock` of lock type `ty` over `len` bytes from `start`,
/// relative to `whence`.
pub fn record_lock(ty: i32, whence: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero is valid.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = ty as i16;
    l.l_whence = whence as i16;
    l.l_start = start;
    l.l_len = len;
    l
}

/// `fcntl(raw, cmd, lock)` for the record-lock commands (`F_SETLK`,
/// `F_GETLK`, `F_OFD_*`...), as a raw system call so it never re-enters the
/// shim's own `fcntl`. Returns the kernel's result (`-errno` as an error).
pub fn fcntl_lock(raw: RawFd, cmd: i32, lock: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the fcntl system call with a record-lock command reads and, for
    // the GETLK commands, writes one `struct flock`, which `lock` is for the
    // whole call; on x86-64 and AArch64 `struct flock` is the 64-bit layout
    // the kernel's fcntl expects.
    let r = unsafe { libc::syscall(libc::SYS_fcntl, raw, cmd, lock as *mut libc::flock) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Closes `raw`, one of the shim's own descriptors.
pub fn close_own(raw: RawFd) {
    // SAFETY: callers pass only descriptors the shim opened and still owns
    // (checked by identity just before), so no one else's is closed.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
}
