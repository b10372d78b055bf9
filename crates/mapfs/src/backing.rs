//! Safe access to the backing store: every path is resolved beneath the
//! backing root's directory fd, so `..` and symlinks can never escape it.
//! Paths are never concatenated onto the root's host path, so a path close to
//! PATH_MAX inside the file system stays usable.
//!
//! Resolution uses `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`:
//! the kernel refuses (`EXDEV`) any `..` or absolute symlink that would leave
//! the starting directory, and `/proc/*/fd` style magic links (`ELOOP`).
//!
//! Long paths: a single `openat2` call takes at most `PATH_MAX - 1` bytes, so
//! a longer path is walked in chunks of whole components, each intermediate
//! chunk opened `O_PATH|O_DIRECTORY` beneath the directory reached so far.
//! Within a later chunk, `..` and relative symlinks are confined to that
//! chunk's starting directory rather than to the root: stricter than needed,
//! never looser. Executors never send `..` anyway.
//!
//! Kept directories ([`BackingRoot::with_dir_cache`], embedded jobs that
//! declared the backing directory theirs): the parent directories of the
//! last few calls stay open, each resolved beneath the root with no
//! symlink, no magic link and no mount crossed (`RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV`: a directory kept was reached by directory names
//! alone, so only a rename or removal of a directory can make it stale,
//! never an `unlink` or a new symlink), and used while the job's namespace
//! generation ([`crate::nsgen`]) says no such change happened since. A
//! parent reached through a symlink or a mount is resolved each time, as
//! without the cache. The final name is never resolved through the cache:
//! calls act on it with `*at` from the kept directory without following
//! it, or open it with `openat2` beneath that directory.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::Arc;

use rustix::fs::{openat2, AtFlags, Mode, OFlags, ResolveFlags};

use crate::error::{Error, Result};
use crate::nsgen::NsGen;

/// Largest number of path bytes handed to one `openat2` call. Well below
/// PATH_MAX (4096 including the NUL) so a chunk plus one more maximal
/// component (NAME_MAX = 255) never overflows.
const CHUNK_BYTES: usize = 3800;

/// How every lookup beneath the root is constrained.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// How a kept directory is resolved: beneath the root by directory names
/// only (see the module docs).
const RESOLVE_KEPT: ResolveFlags = RESOLVE
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Directories kept open by one process (at most this many).
pub const KEPT_DIRS: usize = 16;

/// The backing root directory, held open.
#[derive(Debug)]
pub struct BackingRoot {
    root: OwnedFd,
    ns: Option<Namespace>,
}

/// The job's namespace generation and, when the job declared the backing
/// directory its own, the directories kept.
#[derive(Debug)]
struct Namespace {
    gen: Arc<NsGen>,
    /// `None` unless exclusive: the generation is then only moved (other
    /// processes of the job may keep directories of the same backing).
    /// Embedded, file-system code runs only inside the library's guard,
    /// which holds the fork gate, so this lock is never held at `fork`.
    kept: Option<parking_lot::Mutex<Kept>>,
}

/// The kept directories, all valid for generation word `word`.
#[derive(Debug, Default)]
struct Kept {
    word: u64,
    tick: u64,
    dirs: Vec<KeptDir>,
}

#[derive(Debug)]
struct KeptDir {
    /// Components below the root, joined by `/`.
    key: Vec<u8>,
    fd: Arc<OwnedFd>,
    used: u64,
}

/// A directory reached beneath the root: opened for one call, or kept
/// (with the generation word it is valid for).
#[derive(Debug)]
pub enum DirFd {
    /// Opened for this call.
    Owned(OwnedFd),
    /// One of the directories kept, valid while the generation word is
    /// the one given.
    Kept(Arc<OwnedFd>, u64),
}

impl AsFd for DirFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Owned(fd) => fd.as_fd(),
            DirFd::Kept(fd, _) => fd.as_fd(),
        }
    }
}

impl BackingRoot {
    /// Opens `dir` as a backing root (must be a directory).
    pub fn new(dir: &Path) -> Result<Self> {
        let root = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            let what = match e {
                rustix::io::Errno::NOENT => "does not exist",
                rustix::io::Errno::NOTDIR => "is not a directory",
                _ => "cannot be opened",
            };
            Error::from(e).context(format!("backing root {} {what}", dir.display()))
        })?;
        Ok(BackingRoot { root, ns: None })
    }

    /// This root in an embedded job sharing namespace generation `gen`:
    /// its namespace changes (see [`BackingRoot::namespace_change`]) move
    /// the generation, and, when `keep` (the job declared the backing
    /// directory its own, so no process outside the job changes it), up
    /// to [`KEPT_DIRS`] parent directories stay open between calls.
    pub fn with_dir_cache(mut self, gen: Arc<NsGen>, keep: bool) -> Self {
        self.ns = Some(Namespace {
            gen,
            kept: keep.then(|| parking_lot::Mutex::new(Kept::default())),
        });
        self
    }

    /// Runs `f`, a change that may make a resolved directory stale (a
    /// rename, an `rmdir`, a new symlink), between the two moves of the
    /// job's namespace generation (nothing more without one).
    pub fn namespace_change<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.ns {
            Some(ns) => ns.gen.changing(f),
            None => f(),
        }
    }

    /// Whether a result obtained through `dir` may be stale: `dir` is a
    /// kept directory and a namespace change began since it was checked
    /// (a read-only call then does its work again with
    /// [`BackingRoot::parent`]).
    pub fn changed_since(&self, dir: &DirFd) -> bool {
        match (dir, &self.ns) {
            (DirFd::Kept(_, w), Some(ns)) => ns.gen.now() != *w,
            _ => false,
        }
    }

    /// [`BackingRoot::parent`], from a kept directory when there is one
    /// (or it can be kept now).
    pub fn parent_dir(&self, path: &Path) -> Result<(DirFd, OsString)> {
        if self.keeps_dirs() {
            let mut comps = components(path)?;
            if let Some(n) = comps.pop().filter(|n| *n != "..") {
                if let Some(d) = self.kept_dir(&comps)? {
                    return Ok((d, n.to_os_string()));
                }
            }
        }
        let (d, n) = self.parent(path)?;
        Ok((DirFd::Owned(d), n))
    }

    fn keeps_dirs(&self) -> bool {
        self.ns.as_ref().is_some_and(|n| n.kept.is_some())
    }

    /// The directory `comps` (no `..`, at least one), kept or resolved to
    /// be kept; `Ok(None)` when it cannot be kept (reached through a
    /// symlink or a mount, a change in progress): the caller resolves it
    /// the usual way. An error is the one the usual way would give too
    /// (no such directory, no permission), found with one `openat2`.
    fn kept_dir(&self, comps: &[&OsStr]) -> Result<Option<DirFd>> {
        let Some(ns) = self.ns.as_ref() else {
            return Ok(None);
        };
        let Some(kept) = ns.kept.as_ref() else {
            return Ok(None);
        };
        if comps.is_empty() || comps.iter().any(|c| *c == "..") {
            return Ok(None);
        }
        let len = comps.iter().map(|c| c.len() + 1).sum::<usize>();
        if len > CHUNK_BYTES {
            return Ok(None);
        }
        // Read before resolving: see `nsgen`'s argument.
        let Some(word) = ns.gen.quiet() else {
            return Ok(None);
        };
        let mut key = Vec::with_capacity(len);
        for c in comps {
            if !key.is_empty() {
                key.push(b'/');
            }
            key.extend_from_slice(c.as_bytes());
        }
        {
            let mut k = kept.lock();
            if k.word != word {
                if word < k.word {
                    // Read before another thread's newer read: resolved
                    // the usual way rather than winding the cache back.
                    return Ok(None);
                }
                k.dirs.clear();
                k.word = word;
            }
            k.tick += 1;
            let tick = k.tick;
            if let Some(d) = k.dirs.iter_mut().find(|d| d.key == key) {
                d.used = tick;
                return Ok(Some(DirFd::Kept(d.fd.clone(), word)));
            }
        }
        let fd = match openat2_with(
            self.root.as_fd(),
            OsStr::from_bytes(&key),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE_KEPT,
        ) {
            Ok(fd) => fd,
            // A symlink or a mount on the way (or renames racing a `..`,
            // which a kept path never has): resolved the usual way, which
            // follows what is allowed beneath the root.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::XDEV | rustix::io::Errno::AGAIN) => {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        // Above the program's descriptor numbers, as the file systems'
        // other long-lived descriptors.
        let fd = Arc::new(crate::fdnum::lasting(fd));
        let mut k = kept.lock();
        if k.word == word && ns.gen.now() == word {
            if k.dirs.len() >= KEPT_DIRS {
                if let Some(i) = (0..k.dirs.len()).min_by_key(|&i| k.dirs[i].used) {
                    k.dirs.swap_remove(i);
                }
            }
            let used = k.tick;
            k.dirs.push(KeptDir {
                key,
                fd: fd.clone(),
                used,
            });
        }
        Ok(Some(DirFd::Kept(fd, word)))
    }

    /// The root directory fd (`O_PATH`: usable as a `*at` dirfd, for
    /// `fstat`/`fstatvfs`, not for reading entries).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens `path` (absolute inside the file system, `/` is the root) with
    /// `flags`, resolved beneath the root with no magic links; `..` and
    /// absolute symlinks that would leave the root fail with `EXDEV`.
    ///
    /// `O_CLOEXEC` is always added. `mode` is ignored unless `flags` holds
    /// `O_CREAT` or `O_TMPFILE` (openat2 rejects a mode otherwise).
    ///
    /// With kept directories and `O_NOFOLLOW`, a name below a kept parent
    /// is opened with one `openat2` beneath that parent (the final name,
    /// not followed, is all it resolves).
    pub fn open(&self, path: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        let comps = components(path)?;
        if comps.len() >= 2 && flags.contains(OFlags::NOFOLLOW) && self.keeps_dirs() {
            let (name, parent) = comps.split_last().expect("two or more");
            if *name != ".." {
                if let Some(d) = self.kept_dir(parent)? {
                    let flags = flags | OFlags::CLOEXEC;
                    let mode = if flags.intersects(OFlags::CREATE | OFlags::TMPFILE) {
                        mode
                    } else {
                        Mode::empty()
                    };
                    return Ok(openat2_beneath(d.as_fd(), name, flags, mode)?);
                }
            }
        }
        self.open_components(&comps, flags, mode)
    }

    /// Opens the parent directory of `path` (`O_PATH|O_DIRECTORY`, beneath
    /// the root) and returns it with the final name, for `*at` calls that
    /// must not follow a final symlink.
    ///
    /// `/` has no parent and a final `..` names no entry: both are `EINVAL`.
    /// Callers that need the root itself use [`BackingRoot::fd`] with `"."`.
    pub fn parent(&self, path: &Path) -> Result<(OwnedFd, OsString)> {
        let mut comps = components(path)?;
        let name = match comps.pop() {
            Some(n) if n != ".." => n.to_os_string(),
            _ => {
                return Err(
                    Error::invalid().context(format!("{} has no parent directory", path.display()))
                )
            }
        };
        let dir = self.open_components(&comps, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok((dir, name))
    }

    fn open_components(&self, comps: &[&OsStr], flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        if comps.is_empty() && flags.difference(OFlags::CLOEXEC) == OFlags::PATH | OFlags::DIRECTORY
        {
            // The root itself, as the root is held: a copy of the descriptor
            // instead of an `openat2` of ".", which is a round trip on a
            // network store (0.3 ms on the Gluster test bed) for the parent
            // of every top-level name.
            return Ok(rustix::io::fcntl_dupfd_cloexec(&self.root, 0)?);
        }
        let flags = flags | OFlags::CLOEXEC;
        let mode = if flags.intersects(OFlags::CREATE | OFlags::TMPFILE) {
            mode
        } else {
            Mode::empty()
        };
        let chunks = chunk(comps);
        let (last, intermediate) = chunks.split_last().expect("chunk() never returns empty");
        let mut dir: Option<OwnedFd> = None;
        for c in intermediate {
            let at = dir.as_ref().map_or(self.root.as_fd(), |d| d.as_fd());
            let next = openat2_beneath(
                at,
                c.as_os_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            dir = Some(next);
        }
        let at = dir.as_ref().map_or(self.root.as_fd(), |d| d.as_fd());
        Ok(openat2_beneath(at, last.as_os_str(), flags, mode)?)
    }
}

/// What the executors need to tell an open file apart: its device and
/// inode number as `stat` reports them, and whether it is a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// A regular file.
    pub regular: bool,
}

/// The [`Identity`] of an open file, from the inode the kernel holds: no
/// request reaches the file system (`AT_STATX_DONT_SYNC`; a FUSE mount,
/// such as Gluster with its attribute cache off or a mapfs mount, would
/// otherwise be asked on every call). An inode's device, number and type
/// never change, so they need no fresh attributes.
pub fn identity(fd: impl AsFd) -> std::io::Result<Identity> {
    let st = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        rustix::fs::StatxFlags::TYPE | rustix::fs::StatxFlags::INO,
    )?;
    Ok(Identity {
        dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        regular: u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFREG,
    })
}

/// `openat2` of `path` relative to `at`, beneath `at`, with no magic links
/// (what every backing lookup uses). While it resolves `..` beneath a root the
/// kernel answers `EAGAIN` if any rename or mount happened anywhere on the
/// system meanwhile (it cannot then prove the result stayed beneath);
/// openat2(2) asks callers to retry, which is safe: nothing was opened or
/// created. A walk through many `..` loses every immediate retry while
/// something renames in a loop, so later retries back off (up to about a
/// second in all) before `EAGAIN` reaches the caller.
pub fn openat2_beneath(
    at: BorrowedFd<'_>,
    path: &OsStr,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    openat2_with(at, path, flags, mode, RESOLVE)
}

/// [`openat2_beneath`] with resolve flags `how`.
fn openat2_with(
    at: BorrowedFd<'_>,
    path: &OsStr,
    flags: OFlags,
    mode: Mode,
    how: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    const IMMEDIATE: u32 = 16;
    const ATTEMPTS: u32 = IMMEDIATE + 200;
    let mut tries = 1;
    loop {
        match openat2(at, path, flags, mode, how) {
            Err(rustix::io::Errno::AGAIN) if tries < ATTEMPTS => {
                if tries >= IMMEDIATE {
                    // 1 µs doubling to 4 ms.
                    let us = 1u64 << (tries - IMMEDIATE).min(12);
                    std::thread::sleep(std::time::Duration::from_micros(us));
                }
                tries += 1;
            }
            r => return r,
        }
    }
}

/// The components of an in-file-system path, without the root, `.`, or empty
/// parts; `..` is kept for the kernel to judge.
fn components(path: &Path) -> Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => out.push(OsStr::new("..")),
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return Err(Error::invalid()),
        }
    }
    Ok(out)
}

/// Groups components into relative paths of at most [`CHUNK_BYTES`] bytes
/// (a single over-long component forms its own chunk and the kernel answers
/// `ENAMETOOLONG`). Never empty: no components gives `"."`.
fn chunk(comps: &[&OsStr]) -> Vec<OsString> {
    let mut chunks = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    for c in comps {
        let b = c.as_bytes();
        if !cur.is_empty() && cur.len() + 1 + b.len() > CHUNK_BYTES {
            chunks.push(OsStr::from_bytes(&cur).to_os_string());
            cur.clear();
        }
        if !cur.is_empty() {
            cur.push(b'/');
        }
        cur.extend_from_slice(b);
    }
    if cur.is_empty() {
        cur.push(b'.');
    }
    chunks.push(OsStr::from_bytes(&cur).to_os_string());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_limit_and_keep_components_whole() {
        let name = "d".repeat(200);
        let comps: Vec<&OsStr> = (0..50).map(|_| OsStr::new(name.as_str())).collect();
        let chunks = chunk(&comps);
        assert!(chunks.len() > 1);
        let mut total = 0;
        for c in &chunks {
            assert!(c.len() <= CHUNK_BYTES);
            for part in c.as_bytes().split(|b| *b == b'/') {
                assert_eq!(part, name.as_bytes());
                total += 1;
            }
        }
        assert_eq!(total, 50);
        assert_eq!(chunk(&[]), vec![OsString::from(".")]);
    }

    fn kept_root(dir: &Path) -> (BackingRoot, Arc<NsGen>) {
        let page = dir.join("gen");
        crate::nsgen::create(&page).unwrap();
        let gen = Arc::new(NsGen::open(&page).unwrap());
        let root = BackingRoot::new(&dir.join("root"))
            .unwrap()
            .with_dir_cache(gen.clone(), true);
        (root, gen)
    }

    fn kept(d: &DirFd) -> &Arc<OwnedFd> {
        match d {
            DirFd::Kept(fd, _) => fd,
            DirFd::Owned(_) => panic!("not kept"),
        }
    }

    #[test]
    fn kept_directories_are_reused_until_a_change_and_bounded() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/f"), b"x").unwrap();
        let (root, gen) = kept_root(t.path());

        let (d1, name) = root.parent_dir(Path::new("/a/b/f")).unwrap();
        assert_eq!(name, "f");
        let (d2, _) = root.parent_dir(Path::new("/a/b/g")).unwrap();
        assert!(Arc::ptr_eq(kept(&d1), kept(&d2)), "one resolution kept");
        assert!(std::os::fd::AsRawFd::as_raw_fd(&**kept(&d1)) >= crate::fdnum::LASTING_FROM);
        assert!(!root.changed_since(&d1));

        // A change of the job's: in progress, nothing kept is trusted;
        // after it, the new name resolves and the old one is gone.
        root.namespace_change(|| {
            assert!(root.changed_since(&d1));
            std::fs::rename(r.join("a/b"), r.join("a/c")).unwrap();
        });
        assert!(root.changed_since(&d1));
        let err = root.parent_dir(Path::new("/a/b/f")).unwrap_err();
        assert_eq!(err.errno(), libc::ENOENT);
        let (d3, _) = root.parent_dir(Path::new("/a/c/f")).unwrap();
        assert!(rustix::fs::statat(&d3, "f", AtFlags::SYMLINK_NOFOLLOW).is_ok());
        // A file opened (not followed) from the kept directory.
        let f = root
            .open(
                Path::new("/a/c/f"),
                OFlags::RDONLY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .unwrap();
        assert_eq!(rustix::fs::fstat(&f).unwrap().st_size, 1);

        // A parent reached through a symlink is never kept.
        std::os::unix::fs::symlink("a/c", r.join("s")).unwrap();
        let (d4, _) = root.parent_dir(Path::new("/s/f")).unwrap();
        assert!(matches!(d4, DirFd::Owned(_)));
        // Nor one with `..`.
        let (d5, _) = root.parent_dir(Path::new("/a/../a/c/f")).unwrap();
        assert!(matches!(d5, DirFd::Owned(_)));

        // At most KEPT_DIRS at once.
        for i in 0..KEPT_DIRS + 8 {
            std::fs::create_dir(r.join(format!("d{i}"))).unwrap();
            let (d, _) = root.parent_dir(Path::new(&format!("/d{i}/x"))).unwrap();
            kept(&d);
        }
        let n = root
            .ns
            .as_ref()
            .unwrap()
            .kept
            .as_ref()
            .unwrap()
            .lock()
            .dirs
            .len();
        assert_eq!(n, KEPT_DIRS);
        assert!(gen.quiet().is_some());
    }

    #[test]
    fn components_drop_root_and_dot() {
        let c = components(Path::new("//a/./b/../c/")).unwrap();
        assert_eq!(c, vec!["a", "b", "..", "c"]);
        assert!(components(Path::new("/")).unwrap().is_empty());
    }
}
