//! The namespace generation of an embedded job: one word in a page every
//! process of the job maps, which any of them changes around a change of
//! the backing directory's namespace that could make a directory already
//! resolved by another process stale (a rename, an `rmdir`, a new
//! symlink). A process that keeps resolved directories (see
//! [`crate::backing::BackingRoot::with_dir_cache`]) checks it instead of
//! resolving the directory again: one atomic load instead of `openat2` and
//! `close`.
//!
//! # The word
//!
//! The low [`BUSY_BITS`] bits count changes in progress, the rest count
//! changes begun or ended. [`NsGen::begin`] adds one to both, before the
//! change's system call; [`NsGen::end`] adds one to the count and takes
//! one from the busy ones, after it (even when it failed). The word never
//! takes the same value twice (the count only grows; 2^44 changes would
//! wrap it), so "the word is what it was" means "no change began since".
//!
//! # Why a resolution kept is never stale when used
//!
//! A resolution is kept only with the word read *before* the resolution
//! started, and only when that word had no change in progress. It is used
//! only while the word still equals that value. So between the read and the
//! use, no change began, and none was in progress at the read: every
//! change the job made either ended before the read (the resolution came
//! after it, so saw it) or begins after the use is checked.
//!
//! Both ends of a change move the word, and both are needed:
//! - The start: without it, between the kernel's rename and the end's
//!   move, a process could still use a resolution it kept before and reach
//!   a directory by its old name after a third process saw it gone. With
//!   it, every use is refused from the start of a change on.
//! - The end (and the busy count): without them, a process could read the
//!   word just after the start, resolve the old name before the rename's
//!   system call, and keep that resolution with a word that stays current
//!   after the rename. Nothing is kept while a change is in progress, and
//!   the end's move invalidates whatever was kept before it.
//!
//! What is left is a call that checks the word and then makes its own
//! system call while a change begins and completes in between: it is
//! concurrent with that change, and the directory it reached is the same
//! directory under its old name, so the call takes effect as if just
//! before the change. A read-only call (`stat`) checks the word again
//! after its system call and, if a change began meanwhile, is made again
//! the slow way, so it never reports a name as found after a third process
//! could have seen it gone.
//!
//! A process killed between the two moves leaves the busy count above
//! zero: from then on no process of the job keeps a resolution (every call
//! resolves as without the page), which is slower and still right.
//!
//! # The page
//!
//! A file of one page, mode 0600, owned by the user, made by `mapfs run`
//! in its runtime directory and named to the job's processes in the
//! environment; each process maps it at load, and forked children share
//! the mapping. Changes from processes outside the job are not counted:
//! keeping resolutions is sound only where the job declared the backing
//! directory its own (`--embed FS:B:P:exclusive`).

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mm::{MapFlags, ProtFlags};

/// Bytes of the page (only the first 8 are used).
pub const BYTES: usize = 4096;

/// Low bits of the word that count changes in progress.
pub const BUSY_BITS: u32 = 20;

const ONE_CHANGE: u64 = 1 << BUSY_BITS;
const BUSY_MASK: u64 = ONE_CHANGE - 1;

/// The job's generation word, mapped.
pub struct NsGen {
    word: &'static AtomicU64,
}

impl std::fmt::Debug for NsGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsGen")
            .field("word", &self.word.load(Ordering::Relaxed))
            .finish()
    }
}

/// Makes the page file `path` (which must not exist), 0600, zeroed.
pub fn create(path: &Path) -> io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.set_len(BYTES as u64)
}

impl NsGen {
    /// Maps the page file at `path`. Refused unless it is a regular file
    /// of one page, owned by this process's effective user and readable
    /// or writable by nobody else (another user could otherwise make the
    /// job keep stale directories).
    pub fn open(path: &Path) -> io::Result<NsGen> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let m = f.metadata()?;
        let euid = rustix::process::geteuid().as_raw();
        if !m.file_type().is_file()
            || m.len() != BYTES as u64
            || m.uid() != euid
            || m.mode() & 0o077 != 0
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a new shared mapping at an address the kernel chooses
        // aliases no memory of this process; it is page-aligned (so aligned
        // for AtomicU64) and BYTES long, the file is exactly BYTES long,
        // and every process touches it only through the atomic. The
        // mapping is never unmapped (it lives as long as the process
        // image), so the reference is 'static. A file truncated under the
        // job by its owner would make the access fault: only the owner can,
        // as it could kill the job.
        let word = unsafe {
            let p = rustix::mm::mmap(
                std::ptr::null_mut(),
                BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                f.as_fd(),
                0,
            )?;
            &*p.cast::<AtomicU64>()
        };
        Ok(NsGen { word })
    }

    /// The word now, if no change is in progress (`None`: resolve without
    /// keeping anything).
    #[inline]
    pub fn quiet(&self) -> Option<u64> {
        let w = self.word.load(Ordering::SeqCst);
        (w & BUSY_MASK == 0).then_some(w)
    }

    /// The word now, whatever it holds.
    #[inline]
    pub fn now(&self) -> u64 {
        self.word.load(Ordering::SeqCst)
    }

    /// Marks the start of a namespace change (before its system call).
    pub fn begin(&self) {
        self.word.fetch_add(ONE_CHANGE + 1, Ordering::SeqCst);
    }

    /// Marks the end of a namespace change begun with [`NsGen::begin`]
    /// (after its system call, whether it succeeded or not).
    pub fn end(&self) {
        self.word.fetch_add(ONE_CHANGE - 1, Ordering::SeqCst);
    }

    /// Runs `f`, a namespace change, between [`NsGen::begin`] and
    /// [`NsGen::end`].
    pub fn changing<R>(&self, f: impl FnOnce() -> R) -> R {
        struct End<'a>(&'a NsGen);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                self.0.end();
            }
        }
        self.begin();
        let _end = End(self);
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_share_the_word_and_changes_move_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gen");
        create(&p).unwrap();
        assert!(create(&p).is_err(), "an existing page is never reused");
        let a = NsGen::open(&p).unwrap();
        let b = NsGen::open(&p).unwrap();
        let w0 = a.quiet().unwrap();
        a.begin();
        assert_eq!(b.quiet(), None, "a change in progress is seen");
        let during = b.now();
        a.end();
        let w1 = b.quiet().unwrap();
        assert!(w1 != w0 && w1 != during);
        b.changing(|| assert_eq!(a.quiet(), None));
        assert!(a.quiet().unwrap() > w1);
    }

    #[test]
    fn pages_open_to_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gen");
        create(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(NsGen::open(&p).is_err());
        let short = dir.path().join("short");
        std::fs::write(&short, b"x").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(NsGen::open(&short).is_err());
    }
}
