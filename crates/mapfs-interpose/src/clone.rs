//! The clone and dedupe ioctls (`FICLONE`, `FICLONERANGE`,
//! `FIDEDUPERANGE`): on a file whose data an in-process engine runs (a
//! lent open, an embedded plfs or pack file), the program's descriptor is
//! a placeholder, and the kernel would answer `EBADF`, which programs take
//! for a real error. A mount answers them `EOPNOTSUPP`, the answer of every
//! file system without shared extents, after which `cp --reflink=auto`,
//! fsx and the like copy by hand; the libraries answer the same. So does
//! the preload shim for an adopted open, whose descriptor is the backing
//! file: the kernel would answer for the backing file system (`EXDEV`
//! beside a file of the mount, or a clone where extents are shared).

use std::ffi::{c_int, c_ulong, c_void};

/// `FICLONE` (`_IOW(0x94, 9, int)`): clone all of the file `arg` names.
pub const FICLONE: c_ulong = 0x4004_9409;
/// `FICLONERANGE` (`_IOW(0x94, 13, struct file_clone_range)`).
pub const FICLONERANGE: c_ulong = 0x4020_940d;
/// `FIDEDUPERANGE` (`_IOWR(0x94, 54, struct file_dedupe_range)`).
pub const FIDEDUPERANGE: c_ulong = 0xc018_9436;

/// Whether `ioctl(fd, req, arg)` is a clone or dedupe that involves a
/// descriptor `engine_served` says is run in-process (the destination
/// `fd`, or the source `arg` names).
///
/// # Safety
/// `arg` is what the program passed for `req`: for `FICLONERANGE` a valid
/// `struct file_clone_range`.
pub unsafe fn involves(
    fd: c_int,
    req: c_ulong,
    arg: *mut c_void,
    engine_served: impl Fn(c_int) -> bool,
) -> bool {
    match req {
        FICLONE => engine_served(fd) || engine_served(arg as usize as c_int),
        FICLONERANGE => {
            // SAFETY: per the contract; the source is the struct's first
            // field, an s64.
            let src = if arg.is_null() {
                -1
            } else {
                unsafe { *(arg as *const i64) as c_int }
            };
            engine_served(fd) || engine_served(src)
        }
        FIDEDUPERANGE => engine_served(fd),
        _ => false,
    }
}
