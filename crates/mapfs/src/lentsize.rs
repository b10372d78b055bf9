//! The size a lent writer's map gives its file, shared between the shim
//! that runs the map and the daemon that answers `stat` for it.
//!
//! A client that runs a writable open's map in-process (see
//! [`crate::control::Request::Adopt`]'s `engine`) changes the file's size
//! without telling the daemon until it pushes its map. So that a `stat` the
//! client cannot intercept (a raw `statx`, another process) is not answered
//! from an older size, the daemon lends such an open with one shared page:
//! the client stores its map's size there whenever it changes (a plain
//! atomic store, no system call), and the daemon reads it when it builds
//! the file's attributes.
//!
//! The page is a memfd sealed against shrinking and growing, so neither side
//! can make the other's mapping fault. A client can only lie about the size
//! of a file it has open for writing, which it could set with `ftruncate`
//! anyway.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Bytes mapped (one page; only the first 8 are used).
const BYTES: usize = 4096;

/// One shared size.
pub struct LentSize {
    slot: &'static AtomicU64,
    /// The descriptor to send (daemon side only).
    fd: Option<OwnedFd>,
}

impl std::fmt::Debug for LentSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentSize")
            .field("size", &self.get())
            .finish_non_exhaustive()
    }
}

/// Maps the page of `fd` read-write, shared.
fn map_slot(fd: BorrowedFd<'_>) -> io::Result<&'static AtomicU64> {
    // SAFETY: a new mapping at an address the kernel chooses aliases no
    // existing memory; it is page-aligned (so aligned for AtomicU64) and
    // BYTES long, every process touches it only through the atomic, and the
    // memfd is sealed against shrinking, so the page cannot vanish. The
    // reference lives in a `LentSize`, which unmaps it on drop and lends it
    // out only for the borrow of `&self`.
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            BYTES,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )?;
        Ok(&*p.cast::<AtomicU64>())
    }
}

impl LentSize {
    /// Creates the page (daemon side), holding `size`.
    pub fn create(size: u64) -> io::Result<Self> {
        let memfd = rustix::fs::memfd_create(
            "mapfs-lent-size",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&memfd, BYTES as u64)?;
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        let slot = map_slot(memfd.as_fd())?;
        let s = LentSize {
            slot,
            fd: Some(memfd),
        };
        s.set(size);
        Ok(s)
    }

    /// Maps a page the daemon sent (client side); the descriptor is closed
    /// once mapped. Refused unless it is a memfd of the right size that can
    /// neither shrink nor grow.
    pub fn attach(fd: OwnedFd) -> io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        let size = rustix::fs::fstat(&fd)?.st_size;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) || size != BYTES as i64 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let slot = map_slot(fd.as_fd())?;
        Ok(LentSize { slot, fd: None })
    }

    /// The descriptor to send with the lending (daemon side).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// The size last stored.
    pub fn get(&self) -> u64 {
        self.slot.load(Ordering::Acquire)
    }

    /// Stores the size.
    pub fn set(&self, size: u64) {
        self.slot.store(size, Ordering::Release);
    }
}

impl Drop for LentSize {
    fn drop(&mut self) {
        let p = (self.slot as *const AtomicU64).cast_mut().cast();
        // SAFETY: `slot` is the start of a BYTES-long mapping made by
        // `map_slot` and owned by this value; nothing refers to it after
        // drop (the reference never outlives `&self`).
        unsafe {
            let _ = rustix::mm::munmap(p, BYTES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_see_one_size_and_forged_pages_are_refused() {
        let daemon = LentSize::create(10).unwrap();
        let fd = daemon.fd().unwrap().try_clone_to_owned().unwrap();
        let client = LentSize::attach(fd).unwrap();
        assert_eq!(client.get(), 10);
        client.set(1 << 40);
        assert_eq!(daemon.get(), 1 << 40);
        // The client cannot shrink the page under the daemon.
        let fd = daemon.fd().unwrap();
        assert!(rustix::fs::ftruncate(fd, 0).is_err());
        // An unsealed file is not a size page.
        let plain = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, BYTES as u64).unwrap();
        assert!(LentSize::attach(plain).is_err());
    }
}
