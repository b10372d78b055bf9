//! What one process knows: the embedded file systems (built once by the
//! constructor), the embedded working directory, the directory descriptors
//! opened under a prefix, and the umask.
//!
//! No instance caches what another process of the job may change: every
//! call goes to the file system, which goes to the backing directory.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use mapfs::{Ctx, FileSystem};
use mapfs_interpose::sync::Mutex;
use mapfs_registry::embed_spec;

/// One embedded file system.
pub struct Emb {
    /// Registry name (for messages).
    pub name: String,
    /// Where it appears, as bytes without a trailing `/`.
    pub prefix: Vec<u8>,
    /// The prefix's components.
    pub prefix_comps: Vec<Vec<u8>>,
    /// The canonical backing directory.
    pub backing: PathBuf,
    /// The file system.
    pub fs: Arc<dyn FileSystem>,
    /// `st_dev` reported for its files: the backing directory's, so that
    /// `stat` by path and `fstat` of an open backing file agree.
    pub dev: u64,
    /// Every map it returns is whole-file 1-to-1 (`FsSpec::whole_file_maps`):
    /// no open needs the in-process data engine.
    pub whole_file_maps: bool,
    /// Its directories are the backing directories of the same paths
    /// (`FsSpec::lists_backing_dirs`): listed natively; otherwise through
    /// its `readdir` ([`crate::dirs`]).
    pub native_dirs: bool,
    /// It keeps state for an open that may write until its release
    /// (`FsSpec::keeps_writers`, versions' write sessions): such opens are
    /// served by the data engine and released at their last close (and
    /// never by a process that forked while holding them: the child may
    /// write through them still).
    pub keeps_writers: bool,
    /// Its inode numbers are not its backing files'
    /// (`FsSpec::own_inode_numbers`): whole-file opens are served by the
    /// data engine too, whose `fstat` gives the file system's attributes.
    pub own_inos: bool,
}

static EMBS: OnceLock<Vec<Emb>> = OnceLock::new();
static LOG: AtomicBool = AtomicBool::new(false);
static UMASK: AtomicU32 = AtomicU32::new(0o022);

/// The embedded file systems of this process (empty before the constructor).
pub fn embs() -> &'static [Emb] {
    EMBS.get().map_or(&[], |v| v.as_slice())
}

/// [`mapfs::FileSystem::finish`] of every embedded file system, as this
/// process image ends (`exit`, `_exit`, `exec`); not in a `vfork` child,
/// whose memory is its parent's. Called inside the library.
pub fn finish_all() {
    if crate::engine_fd::foreign() {
        return;
    }
    for e in embs() {
        e.fs.finish();
    }
}

/// `MAPFS_PRELOAD_LOG` was set.
pub fn log_enabled() -> bool {
    LOG.load(Ordering::Relaxed)
}

/// The caller's context, as last read: three system calls per file-system
/// call otherwise, against the one the call replaces. It only changes with
/// `fork` and the `set*id` calls, whose hooks [`forget_ctx`]. (The file
/// systems embedded today leave every permission to the backing kernel,
/// which judges the process's real credentials; the context matters to
/// those that check permissions themselves, as pack and versions do.)
static CTX: Mutex<Option<Ctx>> = Mutex::new(None);

/// The caller's context for file-system calls.
pub fn ctx() -> Ctx {
    let mut c = CTX.lock();
    *c.get_or_insert_with(Ctx::current)
}

/// The process's identity may have changed (`fork`, `setuid`...): the next
/// [`ctx`] reads it again.
pub fn forget_ctx() {
    *CTX.lock() = None;
}

/// The process umask as last set (tracked by the `umask` hook).
pub fn umask() -> u32 {
    UMASK.load(Ordering::Relaxed)
}

/// Records a new umask.
pub fn set_umask(m: u32) {
    UMASK.store(m & 0o777, Ordering::Relaxed);
}

/// Builds the file systems named in `MAPFS_EMBED`. A file system that cannot
/// be built is reported once on stderr and left out (its paths then do not
/// exist for this process).
pub fn init(registry: &mapfs_registry::Registry) {
    LOG.store(
        std::env::var_os("MAPFS_PRELOAD_LOG").is_some(),
        Ordering::Relaxed,
    );
    let old = rustix::process::umask(rustix::fs::Mode::empty());
    rustix::process::umask(old);
    set_umask(old.bits());
    let spec = std::env::var(embed_spec::EMBED_ENV).unwrap_or_default();
    let list = match embed_spec::decode(&spec) {
        Ok(l) => l,
        Err(e) => {
            crate::warn(format_args!("{e:#}; nothing is embedded"));
            Vec::new()
        }
    };
    // Descriptors 0-9 are the program's (a shell's `exec 3< f` closes
    // whatever has number 3): the file systems' own (a backing root held
    // for the process's life) are opened above them.
    let fillers = reserve_low_fds();
    let mut embs = Vec::new();
    for e in list {
        let Some(spec) = registry.get(&e.fs).filter(|s| s.is_embeddable()) else {
            crate::warn(format_args!(
                "this library ({}) cannot run file system {:?}; not embedded",
                registry.program(),
                e.fs
            ));
            continue;
        };
        let opts = e.fs_options(spec);
        let built = spec.build(&e.backing, &opts);
        // A layered file system's device is its first layer's.
        let dev =
            std::fs::metadata(&opts.layers[0]).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
        match (built, dev) {
            (Ok(fs), Ok(dev)) => {
                let prefix = e.prefix.as_os_str().as_bytes().to_vec();
                let prefix_comps = split(&prefix);
                crate::log(format_args!(
                    "{} over {} at {}",
                    e.fs,
                    e.backing.display(),
                    e.prefix.display()
                ));
                embs.push(Emb {
                    name: e.fs,
                    prefix,
                    prefix_comps,
                    backing: e.backing,
                    fs,
                    dev,
                    whole_file_maps: spec.has_whole_file_maps(),
                    native_dirs: spec.lists_backing_dirs_natively(),
                    keeps_writers: spec.has_kept_writers(),
                    own_inos: spec.has_own_inode_numbers(),
                });
            }
            (Err(err), _) => crate::warn(format_args!(
                "cannot start {} over {}: {err}; {} is not served",
                e.fs,
                e.backing.display(),
                e.prefix.display()
            )),
            (_, Err(err)) => crate::warn(format_args!(
                "backing {}: {err}; {} is not served",
                e.backing.display(),
                e.prefix.display()
            )),
        }
    }
    drop(fillers);
    let _ = EMBS.set(embs);
    // What a parent carried across `exec` in memfds: opens of the data
    // engine, and a working directory the real one could not follow. Only
    // a job with such file systems looks (one read of /proc/self/fd).
    let carries = self::embs()
        .iter()
        .any(|e| !e.whole_file_maps || !e.native_dirs);
    let memfds = if carries {
        crate::engine_fd::inherited_memfds()
    } else {
        Vec::new()
    };
    if self::embs().iter().any(|e| !e.whole_file_maps) {
        crate::engine_fd::adopt_inherited(&memfds);
        crate::streams::replace_std_streams();
    }
    find_ancestors();
    note_host_cwd();
    adopt_inherited_cwd(&memfds);
}

/// The lowest free descriptors up to 9, held open (on `/dev/null`) while
/// the file systems are built.
fn reserve_low_fds() -> Vec<std::os::fd::OwnedFd> {
    let mut held = Vec::new();
    while let Ok(fd) = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        if std::os::fd::AsRawFd::as_raw_fd(&fd) > 9 {
            break;
        }
        held.push(fd);
    }
    held
}

/// A host directory above (or at) a prefix: relative paths from it can
/// lead into the prefix (`mkdir -p` walks there with `chdir`, `tar -C`
/// and `fts` with directory descriptors).
struct Ancestor {
    dev: u64,
    ino: u64,
    path: Vec<u8>,
}

static ANCESTORS: OnceLock<(Vec<Ancestor>, Vec<Vec<u8>>)> = OnceLock::new();

/// Records the existing host directories on the way to each prefix, and
/// the names of every prefix component (a quick filter for relative
/// paths that cannot lead into a prefix).
fn find_ancestors() {
    let mut list = Vec::new();
    let mut names = Vec::new();
    for e in embs() {
        let mut p = Vec::new();
        let mut check = |p: &[u8]| {
            let path = if p.is_empty() {
                b"/".to_vec()
            } else {
                p.to_vec()
            };
            if let Ok(st) = rustix::fs::stat(std::ffi::OsStr::from_bytes(&path)) {
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR
                    && !list.iter().any(|a: &Ancestor| a.path == path)
                {
                    list.push(Ancestor {
                        dev: st.st_dev,
                        ino: st.st_ino,
                        path,
                    });
                }
            }
        };
        check(&p);
        for c in &e.prefix_comps {
            p.push(b'/');
            p.extend_from_slice(c);
            check(&p);
            names.push(c.clone());
        }
    }
    let _ = ANCESTORS.set((list, names));
}

/// The host path `rel` (relative) names from directory `fd`, when `fd` is
/// a host directory on the way to a prefix and `rel` starts with a prefix
/// component's name.
pub fn host_path_from_dirfd(fd: i32, rel: &[u8]) -> Option<Vec<u8>> {
    let (list, names) = ANCESTORS.get()?;
    let first = rel
        .split(|&b| b == b'/')
        .find(|c| !c.is_empty() && *c != b".")?;
    if !names.iter().any(|n| n == first) {
        return None;
    }
    // SAFETY: `fd` is the application's descriptor, only borrowed for one
    // fstat; a concurrent close makes the call fail with EBADF.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let st = rustix::fs::fstat(bfd.as_fd()).ok()?;
    let a = list
        .iter()
        .find(|a| a.dev == st.st_dev && a.ino == st.st_ino)?;
    let mut p = a.path.clone();
    if p != b"/" {
        p.push(b'/');
    }
    p.extend_from_slice(rel);
    Some(p)
}

static HOST_CWD: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static HOST_CWD_NEAR: AtomicBool = AtomicBool::new(false);

/// Records the host working directory after a change of it (a successful
/// `chdir`/`fchdir` on the host, and at start), and whether relative paths
/// from it can reach a prefix.
pub fn note_host_cwd() {
    let Ok(real) = rustix::process::getcwd(Vec::new()) else {
        HOST_CWD_NEAR.store(false, Ordering::Release);
        return;
    };
    let real = real.as_bytes().to_vec();
    let near = embs().iter().any(|e| {
        real == b"/"
            || (e.prefix.starts_with(&real) && e.prefix.get(real.len()) == Some(&b'/'))
            || e.prefix == real
    });
    *HOST_CWD.lock() = real;
    HOST_CWD_NEAR.store(near, Ordering::Release);
}

/// The host path of relative `rel` when the host working directory is on
/// the way to a prefix.
pub fn host_path_from_cwd(rel: &[u8]) -> Option<Vec<u8>> {
    if !HOST_CWD_NEAR.load(Ordering::Acquire) {
        return None;
    }
    let mut p = HOST_CWD.lock().clone();
    if p != b"/" {
        p.push(b'/');
    }
    p.extend_from_slice(rel);
    Some(p)
}

/// The non-empty components of `path` other than `.`.
pub fn split(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

/// An embedded location: file system index and absolute path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Index into [`embs`].
    pub idx: usize,
    /// Absolute path inside the file system.
    pub path: PathBuf,
}

impl Place {
    /// The host path this place appears at (prefix + path).
    pub fn host_path(&self) -> Vec<u8> {
        let mut v = embs()[self.idx].prefix.clone();
        let p = self.path.as_os_str().as_bytes();
        if p != b"/" {
            v.extend_from_slice(p);
        }
        v
    }
}

static CWD: Mutex<Option<Place>> = Mutex::new(None);
static CWD_SET: AtomicBool = AtomicBool::new(false);

/// The working directory when it is under a prefix.
pub fn cwd() -> Option<Place> {
    if !CWD_SET.load(Ordering::Acquire) {
        return None;
    }
    CWD.lock().clone()
}

/// Sets (or clears, `None`) the embedded working directory.
pub fn set_cwd(p: Option<Place>) {
    let mut g = CWD.lock();
    CWD_SET.store(p.is_some(), Ordering::Release);
    *g = p;
}

/// A process started with its working directory in a backing directory
/// (its parent changed into an embedded directory, which also moves the
/// real working directory to the backing one when the file system can open
/// it, then ran it) works in the embedded directory. Accepted only when the
/// file system reports the same inode for that path as the kernel for the
/// real directory.
fn adopt_inherited_cwd(memfds: &[(i32, String)]) {
    if adopt_carried_cwd(memfds) {
        return;
    }
    let Ok(real) = rustix::process::getcwd(Vec::new()) else {
        return;
    };
    let real = real.as_bytes().to_vec();
    let Ok(st) = rustix::fs::stat(".") else {
        return;
    };
    for (idx, e) in embs().iter().enumerate() {
        let b = e.backing.as_os_str().as_bytes();
        let Some(rest) = real.strip_prefix(b) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(b"/")) || st.st_dev != e.dev {
            continue;
        }
        let path = if rest.is_empty() {
            PathBuf::from("/")
        } else {
            PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(rest)))
        };
        if e.fs
            .getattr(&ctx(), &path)
            .is_ok_and(|a| a.ino == st.st_ino && a.kind == mapfs::FileKind::Dir)
        {
            set_cwd(Some(Place { idx, path }));
            return;
        }
    }
}

/// The name of the memfd that carries an embedded working directory across
/// `exec` ([`cwd_carrier`]).
const CWD_CARRIER: &str = "mapfs-embed-cwd";

/// For an `exec` or spawn: a memfd (inherited, not close-on-exec) saying
/// which embedded directory this process works in, with the kernel's
/// identity of the real working directory then. A file system whose
/// directories are not backing directories (pack's) leaves the real one
/// where it was, so the new image would otherwise work there. `None` when
/// the working directory is the host's, or a mirror's (`native_dirs`),
/// whose backing directory the real one is.
pub fn cwd_carrier() -> Option<std::os::fd::OwnedFd> {
    use std::io::Write;
    let p = cwd()?;
    if embs()[p.idx].native_dirs {
        // The real working directory is the backing directory already.
        return None;
    }
    let st = rustix::fs::stat(".").ok()?;
    let fd = rustix::fs::memfd_create(CWD_CARRIER, rustix::fs::MemfdFlags::empty()).ok()?;
    let mut f = std::fs::File::from(fd);
    let mut v = format!("{} {}\n", st.st_dev, st.st_ino).into_bytes();
    v.extend_from_slice(&embs()[p.idx].prefix);
    v.push(0);
    v.extend_from_slice(p.path.as_os_str().as_bytes());
    f.write_all(&v).ok()?;
    let fd = mapfs::fdnum::lasting(std::os::fd::OwnedFd::from(f));
    // Moved with close-on-exec: the new image must inherit it.
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).ok()?;
    Some(fd)
}

/// In a new process image: the working directory a [`cwd_carrier`] of the
/// process that ran it names, if the real one is still the one it saw
/// (a program that changed directory since works where it went). The
/// carrier is closed either way.
fn adopt_carried_cwd(memfds: &[(i32, String)]) -> bool {
    use std::os::fd::{FromRawFd, OwnedFd};
    let carried = memfds
        .iter()
        .find(|(_, name)| name.starts_with(CWD_CARRIER))
        // SAFETY: an inherited descriptor nothing else in this image owns
        // yet (the constructor runs before the program).
        .map(|(fd, _)| unsafe { OwnedFd::from_raw_fd(*fd) });
    let Some(fd) = carried else {
        return false;
    };
    let mut v = Vec::new();
    // The parent's writes left the shared offset at the end.
    let mut f = std::fs::File::from(fd);
    let read =
        std::io::Seek::rewind(&mut f).and_then(|()| std::io::Read::read_to_end(&mut f, &mut v));
    if read.is_err() {
        return false;
    }
    let Some(nl) = v.iter().position(|b| *b == b'\n') else {
        return false;
    };
    let Ok(st) = rustix::fs::stat(".") else {
        return false;
    };
    if v[..nl] != *format!("{} {}", st.st_dev, st.st_ino).as_bytes() {
        return false;
    }
    let rest = &v[nl + 1..];
    let Some(z) = rest.iter().position(|b| *b == 0) else {
        return false;
    };
    let (prefix, path) = (&rest[..z], &rest[z + 1..]);
    let Some(idx) = embs().iter().position(|e| e.prefix == prefix) else {
        return false;
    };
    let path = PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(path)));
    let is_dir = embs()[idx]
        .fs
        .getattr(&ctx(), &path)
        .is_ok_and(|a| a.kind == mapfs::FileKind::Dir);
    if is_dir {
        set_cwd(Some(Place { idx, path }));
    }
    is_dir
}

/// A directory descriptor opened under a prefix, and the kernel identity of
/// its open file, to notice the number being reused for something else
/// (closed by a call this library does not see, e.g. inside `closedir`).
#[derive(Debug, Clone)]
struct DirFd {
    place: Place,
    dev: u64,
    ino: u64,
    /// A placeholder of [`crate::dirs`], not a backing directory.
    synthetic: bool,
}

static DIRS: Mutex<Option<HashMap<i32, DirFd>>> = Mutex::new(None);
static DIRS_LEN: AtomicUsize = AtomicUsize::new(0);

/// Records that descriptor `fd` is the embedded directory `place`: a
/// backing directory, or with `synthetic` a [`crate::dirs`] placeholder
/// (`dev`/`ino`: the descriptor's own, to notice its number reused).
pub fn track_dir(fd: i32, place: Place, dev: u64, ino: u64, synthetic: bool) {
    track(
        fd,
        DirFd {
            place,
            dev,
            ino,
            synthetic,
        },
    );
}

fn track(fd: i32, d: DirFd) {
    let mut g = DIRS.lock();
    let m = g.get_or_insert_with(HashMap::new);
    m.insert(fd, d);
    DIRS_LEN.store(m.len(), Ordering::Release);
}

/// After `new` was made a copy of `old` (`dup`, `F_DUPFD`): a directory
/// stays embedded under its new number too (`fts` copies its directory
/// descriptors).
pub fn dir_duped(old: i32, new: i32) {
    if DIRS_LEN.load(Ordering::Acquire) == 0 || old == new {
        return;
    }
    let entry = DIRS.lock().as_ref().and_then(|m| m.get(&old).cloned());
    match entry {
        Some(d) if dir_of(old).is_some() => track(new, d),
        // A number reused (dup2 over a tracked one) is no longer that
        // directory.
        _ => untrack(new),
    }
}

/// Forgets descriptor `fd` (closed).
#[inline]
pub fn untrack(fd: i32) {
    if DIRS_LEN.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut g = DIRS.lock();
    if let Some(m) = g.as_mut() {
        m.remove(&fd);
        DIRS_LEN.store(m.len(), Ordering::Release);
    }
}

/// The embedded directory `fd` refers to, if it is one this process opened
/// under a prefix and still the same open directory.
pub fn dir_of(fd: i32) -> Option<Place> {
    if fd < 0 || DIRS_LEN.load(Ordering::Acquire) == 0 {
        return None;
    }
    let entry = DIRS.lock().as_ref()?.get(&fd).cloned()?;
    // SAFETY: `fd` is the application's descriptor, only borrowed for one
    // fstat; a concurrent close makes the call fail with EBADF.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    match rustix::fs::fstat(bfd.as_fd()) {
        Ok(st) if st.st_dev == entry.dev && st.st_ino == entry.ino => Some(entry.place),
        _ => {
            untrack(fd);
            None
        }
    }
}

/// The embedded directory of [`crate::dirs`] placeholder `fd`, if it is one
/// (checked as [`dir_of`] does).
pub fn synthetic_dir(fd: i32) -> Option<Place> {
    if fd < 0 || DIRS_LEN.load(Ordering::Acquire) == 0 {
        return None;
    }
    let synthetic = DIRS.lock().as_ref()?.get(&fd)?.synthetic;
    if synthetic {
        dir_of(fd)
    } else {
        None
    }
}
