//! The exerciser's system calls, made through the C library.
//!
//! rustix's default backend issues raw system calls, which an `LD_PRELOAD`
//! shim never sees; the exerciser must be observable by the preload shim
//! (`mapfs run -- mapfs-fsx ...`), so every file call here goes through libc's
//! exported symbols. The signatures mirror rustix's, so call sites read the
//! same and keep rustix's typed flags and errors.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{FallocateFlags, Mode, OFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, MsyncFlags, ProtFlags};

fn errno() -> Errno {
    Errno::from_raw_os_error(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn check(r: libc::c_int) -> Result<(), Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn check_size(r: libc::ssize_t) -> Result<usize, Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// `open(2)`.
pub fn open(path: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::INVAL)?;
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    let fd = unsafe { libc::open(c.as_ptr(), flags.bits() as libc::c_int, mode.bits()) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pread(2)`.
pub fn pread(fd: impl AsFd, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
    check_size(unsafe {
        libc::pread(
            fd.as_fd().as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    })
}

/// `pwrite(2)`.
pub fn pwrite(fd: impl AsFd, buf: &[u8], off: u64) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
    check_size(unsafe {
        libc::pwrite(
            fd.as_fd().as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    })
}

/// `ftruncate(2)`.
pub fn ftruncate(fd: impl AsFd, len: u64) -> Result<(), Errno> {
    // SAFETY: plain syscall on a borrowed descriptor.
    check(unsafe { libc::ftruncate(fd.as_fd().as_raw_fd(), len as libc::off_t) })
}

/// `fsync(2)`.
pub fn fsync(fd: impl AsFd) -> Result<(), Errno> {
    // SAFETY: plain syscall on a borrowed descriptor.
    check(unsafe { libc::fsync(fd.as_fd().as_raw_fd()) })
}

/// `fdatasync(2)`.
pub fn fdatasync(fd: impl AsFd) -> Result<(), Errno> {
    // SAFETY: plain syscall on a borrowed descriptor.
    check(unsafe { libc::fdatasync(fd.as_fd().as_raw_fd()) })
}

/// `fallocate(2)`.
pub fn fallocate(fd: impl AsFd, mode: FallocateFlags, off: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: plain syscall on a borrowed descriptor.
    check(unsafe {
        libc::fallocate(
            fd.as_fd().as_raw_fd(),
            mode.bits() as libc::c_int,
            off as libc::off_t,
            len as libc::off_t,
        )
    })
}

/// `fstat(2)`.
pub fn fstat(fd: impl AsFd) -> Result<libc::stat, Errno> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is valid for writes of one `struct stat`.
    check(unsafe { libc::fstat(fd.as_fd().as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `copy_file_range(2)`.
pub fn copy_file_range(
    fd_in: impl AsFd,
    off_in: Option<&mut u64>,
    fd_out: impl AsFd,
    off_out: Option<&mut u64>,
    len: usize,
) -> Result<usize, Errno> {
    let mut i = off_in.as_ref().map_or(0, |o| **o as libc::off64_t);
    let mut o = off_out.as_ref().map_or(0, |o| **o as libc::off64_t);
    let pi: *mut libc::off64_t = if off_in.is_some() {
        &mut i
    } else {
        std::ptr::null_mut()
    };
    let po: *mut libc::off64_t = if off_out.is_some() {
        &mut o
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: the offset pointers are null or point at live locals.
    let n = check_size(unsafe {
        libc::copy_file_range(
            fd_in.as_fd().as_raw_fd(),
            pi,
            fd_out.as_fd().as_raw_fd(),
            po,
            len,
            0,
        )
    })?;
    if let Some(r) = off_in {
        *r = i as u64;
    }
    if let Some(r) = off_out {
        *r = o as u64;
    }
    Ok(n)
}

/// `ioctl(fd_out, FICLONE, fd_in)`: all of `fd_in` into `fd_out`.
pub fn ficlone(fd_out: impl AsFd, fd_in: impl AsFd) -> Result<(), Errno> {
    // SAFETY: FICLONE takes the source descriptor by value.
    check(unsafe {
        libc::ioctl(
            fd_out.as_fd().as_raw_fd(),
            libc::FICLONE,
            fd_in.as_fd().as_raw_fd(),
        )
    })
}

/// `ioctl(fd_out, FICLONERANGE, ..)`: `len` bytes of `fd_in` at `off_in`
/// to `off_out`.
pub fn ficlonerange(
    fd_in: impl AsFd,
    off_in: u64,
    fd_out: impl AsFd,
    off_out: u64,
    len: u64,
) -> Result<(), Errno> {
    let range = libc::file_clone_range {
        src_fd: fd_in.as_fd().as_raw_fd() as i64,
        src_offset: off_in,
        src_length: len,
        dest_offset: off_out,
    };
    // SAFETY: `range` is a live `struct file_clone_range` the kernel only
    // reads.
    check(unsafe { libc::ioctl(fd_out.as_fd().as_raw_fd(), libc::FICLONERANGE, &range) })
}

/// `mmap(2)`, of a mapping that children forked meanwhile do not inherit
/// (`MADV_DONTFORK`).
///
/// Tests fork children from other threads of the same process
/// ([`crate::run_as`]), which drop to another uid. A child holding a copy
/// of a shared mapping of a file on a mount it may not use (no
/// `allow_other`) writes the mapping's dirty pages back when it exits,
/// with its own credentials: the kernel refuses them (`EACCES`) and
/// records the error on the file, and the test's next `msync` or `fsync`
/// returned it (a plfs fsx run failed so, about one CI run in three).
///
/// # Safety
/// As for `mmap(2)`: the caller owns the returned mapping and must unmap it.
pub unsafe fn mmap(
    addr: *mut libc::c_void,
    len: usize,
    prot: ProtFlags,
    flags: MapFlags,
    fd: impl AsFd,
    off: u64,
) -> Result<*mut libc::c_void, Errno> {
    // SAFETY: forwarded contract of this function.
    let p = unsafe {
        libc::mmap(
            addr,
            len,
            prot.bits() as libc::c_int,
            flags.bits() as libc::c_int,
            fd.as_fd().as_raw_fd(),
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    // SAFETY: advice on the mapping just made, which is `len` bytes long.
    if unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) } != 0 {
        let e = errno();
        // SAFETY: the mapping just made, unused.
        unsafe { libc::munmap(p, len) };
        return Err(e);
    }
    Ok(p)
}

/// `munmap(2)`.
///
/// # Safety
/// `p..p+len` must be a mapping the caller made and no longer uses.
pub unsafe fn munmap(p: *mut libc::c_void, len: usize) -> Result<(), Errno> {
    // SAFETY: forwarded contract of this function.
    check(unsafe { libc::munmap(p, len) })
}

/// `msync(2)`.
///
/// # Safety
/// `p..p+len` must be a live mapping.
pub unsafe fn msync(p: *mut libc::c_void, len: usize, flags: MsyncFlags) -> Result<(), Errno> {
    // SAFETY: forwarded contract of this function.
    check(unsafe { libc::msync(p, len, flags.bits() as libc::c_int) })
}
