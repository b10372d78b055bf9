//! The shared part of an engine-served open (see [`crate::engine_fd`]): the
//! offset and `O_APPEND`, which the kernel keeps in the open file
//! description and so shares between a process and the children it forks
//! or starts with the descriptor (`(cmd1; cmd2) > f` writes `cmd2`'s
//! output after `cmd1`'s). They live in a page of a memfd, mapped shared:
//! a forked child keeps the mapping, and `exec` hands the memfd itself to
//! the new image under the application's descriptor number, its name
//! saying which open it is, for the new image's constructor to map again.
//!
//! The page sits 1 GiB into the (sparse) memfd: a program started without
//! the library that writes to the descriptor it inherited writes at the
//! memfd's start, far from it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Where the shared page is in the memfd.
const PAGE_AT: u64 = 1 << 30;
const PAGE_LEN: usize = 4096;

/// What the page holds.
#[repr(C)]
struct Page {
    offset: AtomicU64,
    append: AtomicU32,
}

/// One open's shared description.
pub struct Desc {
    fd: OwnedFd,
    page: NonNull<Page>,
    /// The memfd's name, when it says which open it is (see [`Desc::new`]).
    name: Option<String>,
}

// SAFETY: the page is only reached through atomics, from any thread (and
// any process sharing it).
unsafe impl Send for Desc {}
// SAFETY: as above.
unsafe impl Sync for Desc {}

impl Desc {
    /// A new description at offset 0. `name` (at most 249 bytes, no NUL)
    /// names the memfd so that [`crate::engine_fd::adopt_inherited`] can
    /// reopen the file after `exec`; `None` for an open that cannot be
    /// carried.
    pub fn new(name: Option<&str>, append: bool) -> Result<Desc, i32> {
        let m = rustix::fs::memfd_create(
            name.unwrap_or("mapfs-embed-desc"),
            rustix::fs::MemfdFlags::CLOEXEC,
        )
        .map_err(|e| e.raw_os_error())?;
        rustix::fs::ftruncate(&m, PAGE_AT + PAGE_LEN as u64).map_err(|e| e.raw_os_error())?;
        let d = Self::map(mapfs::fdnum::lasting(m), name.map(str::to_string))?;
        d.set_append(append);
        Ok(d)
    }

    /// A new description with this one's name, offset and `O_APPEND`, not
    /// shared with it (for a child that closed this one's memfd).
    pub fn copy(&self) -> Result<Desc, i32> {
        let d = Desc::new(self.name.as_deref(), self.append())?;
        d.offset()
            .store(self.offset().load(Ordering::Acquire), Ordering::Release);
        Ok(d)
    }

    /// The description a previous image carried under descriptor `fd`
    /// across `exec` (its memfd named `name`): kept open (above the
    /// program's numbers) and mapped, so the new image shares it with the
    /// processes that share it still.
    pub fn inherited(fd: BorrowedFd<'_>, name: &str) -> Result<Desc, i32> {
        let own = rustix::io::fcntl_dupfd_cloexec(fd, crate::engine_fd::HIGH_FD)
            .map_err(|e| e.raw_os_error())?;
        Self::map(own, Some(name.to_string()))
    }

    fn map(fd: OwnedFd, name: Option<String>) -> Result<Desc, i32> {
        // SAFETY: a fresh shared mapping of one page of our own memfd,
        // which is that long; nothing else is mapped at the address the
        // kernel picks.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_LEN,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                PAGE_AT,
            )
        }
        .map_err(|e| e.raw_os_error())?;
        let page = NonNull::new(p.cast::<Page>()).ok_or(libc::ENOMEM)?;
        Ok(Desc { fd, page, name })
    }

    fn page(&self) -> &Page {
        // SAFETY: mapped for as long as `self` lives; a page of zeros is a
        // valid `Page` and every access is atomic.
        unsafe { self.page.as_ref() }
    }

    /// The offset, shared.
    pub fn offset(&self) -> &AtomicU64 {
        &self.page().offset
    }

    /// Whether writes go to the end (`O_APPEND`, also set by `F_SETFL`).
    pub fn append(&self) -> bool {
        self.page().append.load(Ordering::Relaxed) != 0
    }

    /// Follows `F_SETFL`.
    pub fn set_append(&self, on: bool) {
        self.page().append.store(u32::from(on), Ordering::Relaxed);
    }

    /// Whether `exec` can carry it (its memfd names the open).
    pub fn carryable(&self) -> bool {
        self.name.is_some()
    }

    /// The memfd, to put under the application's number before `exec`.
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unused from now on.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), PAGE_LEN) };
    }
}
