//! Whether this process image's descriptors are still the library's. A
//! program may close every descriptor it does not know with calls the
//! hooks do not see (`subprocess`'s `close_fds` in a child before `exec`,
//! `close_range`, `closefrom`). The file systems' own descriptors
//! (backing files, databases) are then closed, and their numbers may be
//! reused by the program or by the library itself: file-system code run
//! then (persisting at `exec` or `_exit`) would write or close another
//! file, and Rust's owned descriptors abort on a number closed twice.
//!
//! A canary descriptor, opened among the library's own above
//! [`crate::engine_fd::HIGH_FD`], tells: while it is open and still the
//! same file, nothing closed the library's descriptors behind its back.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

static FD: AtomicI32 = AtomicI32::new(-1);
static INO: AtomicU64 = AtomicU64::new(0);

/// Opens the canary (the constructor of each process image).
pub fn arm() {
    let Ok(m) = rustix::fs::memfd_create("mapfs-embed-canary", rustix::fs::MemfdFlags::CLOEXEC)
    else {
        return;
    };
    let m = mapfs::fdnum::lasting(m);
    let Ok(st) = rustix::fs::fstat(&m) else {
        return;
    };
    INO.store(st.st_ino, Ordering::Relaxed);
    FD.store(std::os::fd::IntoRawFd::into_raw_fd(m), Ordering::Release);
}

/// The library's descriptors are as it left them (true when the canary
/// could not be opened: nothing is known then, as before).
pub fn intact() -> bool {
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        return true;
    }
    // SAFETY: borrowed for one fstat; a closed number fails it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(fd).is_ok_and(|st| st.st_ino == INO.load(Ordering::Relaxed))
}
