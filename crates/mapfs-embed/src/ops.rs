//! The calls on embedded paths, in safe code: routing a path to its file
//! system ([`route`]) and the calls that need more than one file-system
//! call (`open`, `chdir`, `realpath`).

use std::ffi::CString;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mapfs::{Attr, FileKind, OpenFlags, Opened};

use crate::resolve::{self, Loc, Target};
use crate::state::{self, embs, Emb, Place};

/// How a call treats a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Acts on the link itself (`lstat`, `unlink`, `O_NOFOLLOW`...).
    No,
    /// Follows it; the target's attributes are looked up first.
    Yes,
    /// Follows it, but only once the call failed with `ELOOP` on the link
    /// (`open`: one file-system call in the common case).
    Lazy,
}

/// What became of a call on a path.
#[derive(Debug)]
pub enum Out<T> {
    /// A host path: the real call, with the path unchanged (`None`) or
    /// rewritten (reached through `..` or a symlink of a file system).
    Host(Option<CString>),
    /// Served by a file system.
    Done(Result<T, i32>),
}

/// Runs `f` on the embedded place `(dirfd, path)` leads to. `f` gets the
/// file system, the place and, with [`Follow::Yes`], the final attributes
/// when the file exists.
pub fn route<T>(
    dirfd: i32,
    path: &[u8],
    follow: Follow,
    f: impl Fn(&Emb, &Place, Option<&Attr>) -> Result<T, i32>,
) -> Out<T> {
    let Some(loc) = resolve::locate(dirfd, path) else {
        return Out::Host(None);
    };
    if trailing_slash(path) && follow == Follow::No {
        // `x/` names the directory itself: resolved as if followed.
        return run(loc, Follow::Yes, f);
    }
    run(loc, follow, f)
}

fn trailing_slash(path: &[u8]) -> bool {
    path.len() > 1 && path.ends_with(b"/")
}

/// [`route`] for an already located path.
pub fn run<T>(
    loc: Loc,
    follow: Follow,
    f: impl Fn(&Emb, &Place, Option<&Attr>) -> Result<T, i32>,
) -> Out<T> {
    let ctx = state::ctx();
    if let Some(place) = loc.lexical() {
        let e = &embs()[place.idx];
        let mut attr = None;
        let mut walk = false;
        if follow == Follow::Yes {
            match e.fs.getattr(&ctx, &place.path) {
                Ok(a) if a.kind == FileKind::Symlink => walk = true,
                Ok(a) => attr = Some(a),
                Err(err) => match err.errno() {
                    libc::ENOENT => {}
                    libc::EXDEV | libc::ELOOP => walk = true,
                    n => return Out::Done(Err(n)),
                },
            }
        }
        if !walk {
            match f(e, &place, attr.as_ref()) {
                Err(libc::EXDEV) => {}
                Err(libc::ELOOP) if follow != Follow::No => {}
                r => return Out::Done(r),
            }
        }
    }
    let follow_walk = follow != Follow::No;
    match resolve::walk(loc, follow_walk) {
        Err(n) => Out::Done(Err(n)),
        Ok(Target::Host(c)) => Out::Host(Some(c)),
        Ok(Target::Emb(place)) => {
            let e = &embs()[place.idx];
            let attr = if follow_walk {
                e.fs.getattr(&ctx, &place.path).ok()
            } else {
                None
            };
            Out::Done(f(e, &place, attr.as_ref()))
        }
    }
}

/// Where a path leads without acting on it (two-path calls: `rename`,
/// `link`): `Ok(None)` for an unchanged host path.
pub fn target(dirfd: i32, path: &[u8], follow: bool) -> Result<Option<Target>, i32> {
    let Some(loc) = resolve::locate(dirfd, path) else {
        return Ok(None);
    };
    if !follow {
        if let Some(p) = loc.lexical() {
            return Ok(Some(Target::Emb(p)));
        }
    }
    resolve::walk(loc, follow).map(Some)
}

/// Open flags the file system does not get: the library applies them
/// (`O_CLOEXEC`, `O_DIRECTORY`, `O_NOFOLLOW` by its resolution) or the
/// file system's `create` does (`O_CREAT`, `O_EXCL`).
const LOCAL_FLAGS: i32 = libc::O_CLOEXEC
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_NOCTTY
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_PATH;

/// Opens `place` and returns the application's descriptor: the backing
/// file itself for a whole-file 1-to-1 map.
pub fn open(e: &Emb, place: &Place, flags: i32, mode: u32) -> Result<i32, i32> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(libc::EOPNOTSUPP);
    }
    let ctx = state::ctx();
    let mut fsflags = flags & !LOCAL_FLAGS;
    if flags & libc::O_PATH != 0 {
        fsflags = libc::O_RDONLY;
    }
    if !e.native_dirs && flags & libc::O_DIRECTORY != 0 && flags & libc::O_CREAT == 0 {
        // As through a mount, a directory is never the file system's
        // `open`: its entries come from `readdir`.
        return crate::dirs::open(e, place, flags);
    }
    // As the kernel does before a FUSE CREATE, a file system that is not a
    // mirror is asked whether the name exists first: its `create` may
    // assume a name absent (union's looks at its upper layer only), where
    // a mirror's own `O_EXCL` decides in one call.
    let exists =
        flags & libc::O_CREAT != 0 && !e.native_dirs && e.fs.getattr(&ctx, &place.path).is_ok();
    // A file the process holds through the engine already: the new open
    // joins that state (one per file per process, see `engine_fd`), which
    // does the truncation the file system's open would do on its own map.
    let joins = engine_served(e) && crate::engine_fd::held(place.idx, &place.path);
    if joins {
        fsflags &= !libc::O_TRUNC;
    }
    if exists && flags & libc::O_EXCL != 0 {
        return Err(libc::EEXIST);
    }
    let opened = if flags & libc::O_CREAT != 0 && !exists {
        let mode = mode & 0o7777 & !state::umask();
        match e
            .fs
            .create(&ctx, &place.path, OpenFlags(fsflags | libc::O_EXCL), mode)
        {
            Ok((_, o)) => o,
            Err(err) if err.errno() == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                e.fs.open(&ctx, &place.path, OpenFlags(fsflags))
                    .map_err(|e| e.errno())?
            }
            Err(err) => return Err(err.errno()),
        }
    } else {
        match e.fs.open(&ctx, &place.path, OpenFlags(fsflags)) {
            Ok(o) => o,
            // A file system whose directories are not backing directories
            // (pack's live in its database) refuses to open them as files:
            // a read-only open without `O_DIRECTORY` (tar's, fts's) is the
            // directory's, as through a mount.
            Err(err)
                if err.errno() == libc::EISDIR
                    && !e.native_dirs
                    && fsflags & libc::O_ACCMODE == libc::O_RDONLY =>
            {
                return crate::dirs::open(e, place, flags);
            }
            Err(err) => return Err(err.errno()),
        }
    };
    let whole = opened.map.is_whole_file() && opened.files.len() == 1;
    let kept_writer = e.keeps_writers && flags & (libc::O_ACCMODE | libc::O_TRUNC) != 0;
    if (!whole || kept_writer || e.own_inos || joins) && engine_served(e) {
        let fd =
            crate::engine_fd::adopt(place.idx, place.path.clone(), flags, fsflags, opened, None)?;
        if flags & libc::O_DIRECTORY != 0 {
            // Only regular files have such maps.
            let _ = crate::engine_fd::closed(std::os::fd::AsRawFd::as_raw_fd(&fd));
            return Err(libc::ENOTDIR);
        }
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        return finish_fd(fd, flags).inspect_err(|_| {
            let _ = crate::engine_fd::closed(raw);
        });
    }
    let fd = take_fd(e, place, opened)?;
    let check_dir = flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_CREAT == 0;
    if check_dir {
        let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| e.raw_os_error())?;
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if !is_dir && flags & libc::O_DIRECTORY != 0 {
            return Err(libc::ENOTDIR);
        }
        if is_dir && !e.native_dirs {
            drop(fd);
            return crate::dirs::open(e, place, flags);
        }
        if is_dir {
            let raw = finish_fd(fd, flags)?;
            state::track_dir(raw, place.clone(), st.st_dev, st.st_ino, false);
            return Ok(raw);
        }
    } else if flags & libc::O_DIRECTORY != 0 {
        // Directories open read-only only.
        return Err(libc::EISDIR);
    }
    finish_fd(fd, flags)
}

/// Whether the data engine may serve `e`'s opens that are not whole-file
/// 1-to-1 in-process (placeholder descriptors, see [`crate::engine_fd`]):
/// every file system that does not promise whole-file maps.
fn engine_served(e: &Emb) -> bool {
    !e.whole_file_maps
}

/// Sets `FD_CLOEXEC` as asked and hands the number to the application.
fn finish_fd(fd: OwnedFd, flags: i32) -> Result<i32, i32> {
    if flags & libc::O_CLOEXEC == 0 {
        rustix::io::fcntl_setfd(fd.as_fd(), rustix::io::FdFlags::empty())
            .map_err(|e| e.raw_os_error())?;
    }
    Ok(fd.into_raw_fd())
}

static WARNED_MAP: AtomicBool = AtomicBool::new(false);

/// The descriptor of an open's single backing file (whole-file 1-to-1
/// map), after the file system was told the open is done: the backing file
/// is the file, so there is nothing to persist at close.
fn take_fd(e: &Emb, place: &Place, mut o: Opened) -> Result<OwnedFd, i32> {
    let ctx = state::ctx();
    let whole = o.map.is_whole_file() && o.files.len() == 1;
    let _ = e.fs.release(&ctx, &place.path, o.handle, &o.map);
    if !whole {
        if !WARNED_MAP.swap(true, Ordering::Relaxed) {
            crate::warn(format_args!(
                "open {}: {} returned a map that is not whole-file 1-to-1, which embedded \
                 mode cannot serve yet (EOPNOTSUPP)",
                String::from_utf8_lossy(&place.host_path()),
                e.name
            ));
        }
        return Err(libc::EOPNOTSUPP);
    }
    let file = o.files.swap_remove(0);
    match Arc::try_unwrap(file) {
        Ok(f) => Ok(OwnedFd::from(f)),
        Err(shared) => {
            rustix::io::fcntl_dupfd_cloexec(shared.as_fd(), 0).map_err(|e| e.raw_os_error())
        }
    }
}

/// `chdir` into an embedded directory: checks it as the kernel would, and
/// moves the real working directory to the backing directory when the
/// file system opens directories as backing ones (so programs this process
/// starts find their way back, see `state::adopt_inherited_cwd`).
pub fn chdir(e: &Emb, place: &Place, attr: Option<&Attr>) -> Result<(), i32> {
    let ctx = state::ctx();
    let Some(a) = attr else {
        return Err(libc::ENOENT);
    };
    if a.kind != FileKind::Dir {
        return Err(libc::ENOTDIR);
    }
    e.fs.access(&ctx, &place.path, libc::X_OK)
        .map_err(|e| e.errno())?;
    if let Ok(o) = e.fs.open(&ctx, &place.path, OpenFlags(libc::O_RDONLY)) {
        if let Ok(fd) = take_fd(e, place, o) {
            let _ = rustix::process::fchdir(fd.as_fd());
        }
    }
    state::set_cwd(Some(place.clone()));
    Ok(())
}

/// The host path of the backing file a program stored at `place` runs from
/// (`execve` of an embedded path): the kernel loads programs by path, and
/// a file whose map is its whole backing file is that file. A file of
/// another map (plfs) cannot be run: `EACCES`, as for a file system
/// mounted `noexec`.
pub fn exec_path(e: &Emb, place: &Place, attr: Option<&Attr>) -> Result<Vec<u8>, i32> {
    use std::os::unix::ffi::OsStrExt;
    let Some(a) = attr else {
        return Err(libc::ENOENT);
    };
    if a.kind == FileKind::Dir {
        return Err(libc::EACCES);
    }
    let ctx = state::ctx();
    let o =
        e.fs.open(&ctx, &place.path, OpenFlags(libc::O_RDONLY))
            .map_err(|e| e.errno())?;
    let whole = o.map.is_whole_file() && o.files.len() == 1;
    let host = if whole {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*o.files[0]);
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|p| p.as_os_str().as_bytes().to_vec())
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    } else {
        Err(libc::EACCES)
    };
    let _ = e.fs.release(&ctx, &place.path, o.handle, &o.map);
    host
}

/// [`exec_path`] for a child about to exec that closed every descriptor it
/// did not mean to pass on (`subprocess`'s close_fds, `closefrom`), the
/// file systems' backing roots with them (their calls then fail with
/// `EBADF`): passthrough's backing file has the file's own path under the
/// backing directory, and the kernel resolves the rest. `None` for other
/// file systems and paths through `..`.
pub fn exec_path_lexical(dirfd: i32, path: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let place = resolve::locate(dirfd, path)?.lexical()?;
    let e = &embs()[place.idx];
    if e.name != "passthrough" {
        return None;
    }
    let rel = place.path.strip_prefix("/").unwrap_or(&place.path);
    Some(e.backing.join(rel).as_os_str().as_bytes().to_vec())
}

/// The host path of an existing embedded place, every symlink resolved.
pub fn realpath(dirfd: i32, path: &[u8]) -> Out<Vec<u8>> {
    let Some(loc) = resolve::locate(dirfd, path) else {
        return Out::Host(None);
    };
    match resolve::walk(loc, true) {
        Err(n) => Out::Done(Err(n)),
        Ok(Target::Host(c)) => Out::Host(Some(c)),
        Ok(Target::Emb(place)) => {
            let e = &embs()[place.idx];
            Out::Done(
                e.fs.getattr(&state::ctx(), &place.path)
                    .map(|_| place.host_path())
                    .map_err(|e| e.errno()),
            )
        }
    }
}

/// `errno` of a file-system error.
pub fn errno(e: mapfs::Error) -> i32 {
    e.errno()
}
