//! The C faces of the data calls on lent descriptors ([`crate::lent`]):
//! each returns `None` when `fd` is not lent (or was just handed back to
//! the mount), so the hook makes the real call, and otherwise the value the
//! C function returns, with `errno` set on failure.

use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;

use libc::{size_t, ssize_t};

use crate::lent::{Lent, LentResult, Refusal};
use crate::{report, sys, table, Guard};

/// Runs `f` on the lent open of `fd`. A call the map cannot serve hands the
/// open back to the mount and answers `None`.
fn with_lent<T>(fd: RawFd, f: impl FnOnce(&Lent) -> LentResult<T>) -> Option<Result<T, i32>> {
    if table::state(fd) != table::ENGINE {
        return None;
    }
    let _g = Guard::enter()?;
    // The lent open is borrowed from its slot, not cloned: no count of
    // references to move on every call.
    let ran = {
        let slot = table::lent_slot(fd)?;
        let lent = slot.as_ref()?;
        if lent.copy_stale() {
            None
        } else {
            report::count_native();
            Some(f(lent))
        }
    };
    match ran {
        None => {
            sys::keep_errno(|| table::serve_final(fd, STALE));
            None
        }
        Some(Ok(v)) => Some(Ok(v)),
        Some(Err(Refusal::Errno(e))) => Some(Err(e)),
        Some(Err(Refusal::NeedsMount)) => {
            sys::keep_errno(|| table::serve_final(fd, "a write the map cannot place"));
            None
        }
    }
}

/// Why a copy is handed back to the mount.
const STALE: &str = "the file changed since it was copied";

/// The lent open of `fd`, unless it is a copy of a file that changed
/// since ([`Lent::copy_stale`]): that one is handed back to the mount, and
/// `None` answered as for a descriptor that is not lent.
fn fresh_lent(fd: RawFd) -> Option<std::sync::Arc<Lent>> {
    let lent = table::lent(fd)?;
    if !lent.copy_stale() {
        return Some(lent);
    }
    drop(lent);
    sys::keep_errno(|| table::serve_final(fd, STALE));
    None
}

/// `-1` with `errno`, or the count.
fn count(r: Option<Result<usize, i32>>) -> Option<ssize_t> {
    r.map(|r| match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    })
}

/// `-1` with `errno`, or 0.
fn status(r: Option<Result<(), i32>>) -> Option<c_int> {
    r.map(|r| match r {
        Ok(()) => 0,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    })
}

fn offset(off: i64) -> LentResult<u64> {
    u64::try_from(off).map_err(|_| Refusal::Errno(libc::EINVAL))
}

/// `read`/`pread` (`off`: `None` for the description's offset).
///
/// # Safety
/// `buf` is valid for `n` bytes of writing.
pub unsafe fn read(fd: RawFd, buf: *mut c_void, n: size_t, off: Option<i64>) -> Option<ssize_t> {
    // SAFETY: per the contract.
    if let Some(r) = off.and_then(|o| unsafe { table::direct_pread(fd, buf.cast(), n, o) }) {
        report::count_native();
        return count(Some(r));
    }
    count(with_lent(fd, |l| {
        // SAFETY: per the contract.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
        match off {
            None => l.read(b),
            Some(o) => l.pread(b, offset(o)?),
        }
    }))
}

/// `write`/`pwrite` (`off`: `None` for the description's offset).
///
/// # Safety
/// `buf` is valid for `n` bytes of reading.
pub unsafe fn write(fd: RawFd, buf: *const c_void, n: size_t, off: Option<i64>) -> Option<ssize_t> {
    count(with_lent(fd, |l| {
        // SAFETY: per the contract.
        let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
        match off {
            None => l.write(b),
            Some(o) => l.pwrite(b, offset(o)?),
        }
    }))
}

/// The iovecs of a vectored call.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> LentResult<&'a [libc::iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(Refusal::Errno(libc::EINVAL));
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// `readv`/`preadv`/`preadv2` (`off`: `None` or -1 for the description's
/// offset). One read into a bounce buffer, scattered: the call stays one
/// read at one offset, as the kernel's is.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs, each valid for writing.
pub unsafe fn readv(
    fd: RawFd,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> Option<ssize_t> {
    count(with_lent(fd, |l| {
        // SAFETY: per the contract.
        let v = unsafe { iovecs(iov, cnt)? };
        let total = v.iter().map(|i| i.iov_len).sum();
        let mut buf = vec![0u8; total];
        let n = match off {
            None | Some(-1) => l.read(&mut buf)?,
            Some(o) => l.pread(&mut buf, offset(o)?)?,
        };
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
        Ok(n)
    }))
}

/// `writev`/`pwritev`/`pwritev2` (`off`: `None` or -1 for the description's
/// offset), gathered into one write (one extent in a log).
///
/// # Safety
/// `iov` points to `cnt` valid iovecs, each valid for reading.
pub unsafe fn writev(
    fd: RawFd,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<i64>,
) -> Option<ssize_t> {
    count(with_lent(fd, |l| {
        // SAFETY: per the contract.
        let v = unsafe { iovecs(iov, cnt)? };
        let mut buf = Vec::with_capacity(v.iter().map(|i| i.iov_len).sum());
        for i in v {
            if i.iov_len > 0 {
                // SAFETY: the caller's iovec is valid for `iov_len` bytes.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(i.iov_base.cast::<u8>(), i.iov_len)
                });
            }
        }
        match off {
            None | Some(-1) => l.write(&buf),
            Some(o) => l.pwrite(&buf, offset(o)?),
        }
    }))
}

/// `lseek`.
pub fn lseek(fd: RawFd, off: i64, whence: c_int) -> Option<i64> {
    with_lent(fd, |l| l.seek(off, whence)).map(|r| match r {
        Ok(p) => p as i64,
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    })
}

/// `ftruncate`. Before a shrink the daemon gets the open's map as it is
/// (see `FileSystem::flush`): a file system recording what each open changed
/// tells the shrink from the writes it cuts only that way.
pub fn ftruncate(fd: RawFd, len: i64) -> Option<c_int> {
    if let Some(l) = table::lent(fd) {
        if l.size().is_ok_and(|now| len >= 0 && (len as u64) < now) {
            if let Some(_g) = Guard::enter() {
                sys::keep_errno(|| table::sync_lent(fd));
            }
        }
    }
    status(with_lent(fd, |l| l.truncate(offset(len)?)))
}

/// `fallocate` (`-1` and `errno` on failure).
pub fn fallocate(fd: RawFd, mode: c_int, off: i64, len: i64) -> Option<c_int> {
    status(with_lent(fd, |l| {
        if off < 0 || len <= 0 {
            return Err(Refusal::Errno(libc::EINVAL));
        }
        l.fallocate(mode, off as u64, len as u64)
    }))
}

/// `posix_fallocate` (returns the error number itself).
pub fn posix_fallocate(fd: RawFd, off: i64, len: i64) -> Option<c_int> {
    with_lent(fd, |l| {
        if off < 0 || len <= 0 {
            return Err(Refusal::Errno(libc::EINVAL));
        }
        l.fallocate(0, off as u64, len as u64)
    })
    .map(|r| r.err().unwrap_or(0))
}

/// Before the real `fsync`/`fdatasync` of a lent descriptor: syncs the
/// backing files and pushes the map to the daemon, whose `fsync` (the real
/// call on the mount's open, made next) persists it. `Some(-1)` on failure,
/// `EIO` when the daemon did not take the map (the writes would not be in
/// the file).
pub fn fsync(fd: RawFd, datasync: bool) -> Option<c_int> {
    let r = status(with_lent(fd, |l| l.fsync(datasync)));
    if r == Some(0) {
        if let Some(_g) = Guard::enter() {
            if !sys::keep_errno(|| table::sync_lent(fd)) {
                sys::set_errno(libc::EIO);
                return Some(-1);
            }
        }
        return None;
    }
    r
}

/// `posix_fadvise`: advice about a map's pieces has nowhere to go.
pub fn fadvise(fd: RawFd) -> Option<c_int> {
    with_lent(fd, |_| Ok(())).map(|_| 0)
}

/// `F_SETFL` went through on the mount's open: follow `O_APPEND`.
pub fn flags_set(fd: RawFd) {
    if table::state(fd) != table::ENGINE {
        return;
    }
    if let Some(_g) = Guard::enter() {
        let target = table::engine_target(fd).unwrap_or(fd);
        if let (Some(l), Ok(f)) = (table::lent(fd), rustix::fs::fcntl_getfl(sys::fd(target))) {
            l.set_flags(f.bits() as i32);
        }
    }
}

/// The description's offset and the size, for locks given relative to them.
pub fn position(fd: RawFd) -> Option<(u64, u64)> {
    let _g = Guard::enter()?;
    // Back on the mount, the kernel's offset and size are the open's.
    let l = fresh_lent(fd)?;
    Some((l.offset(), l.size().ok()?))
}

/// `fstat` of a lent descriptor: the size its writes gave the file.
pub fn patch_size(fd: RawFd, size: &mut i64, blocks: &mut i64) {
    if table::state(fd) != table::ENGINE {
        return;
    }
    if let Some(_g) = Guard::enter() {
        // A stale copy's size is not the file's: the mount's answer is.
        if let Some(l) = table::lent(fd).filter(|l| !l.copy_stale()) {
            table::patch_lent_size(&l, size, blocks);
        }
    }
}
