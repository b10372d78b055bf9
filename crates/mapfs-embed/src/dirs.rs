//! Directories of file systems whose directories are not their backing
//! directories (plfs, whose files are container directories underneath,
//! and every outside file system): listed through the file system's
//! `readdir`, as a mount lists them, never by reading the backing
//! directory.
//!
//! Opening such a directory gives a placeholder descriptor (an empty memfd
//! of its own, so the number is a real descriptor and has an identity the
//! library can check), remembered as the directory for `*at` calls,
//! `fchdir` and `fstat`. `opendir`/`fdopendir` of it give a stream that is
//! the library's own object: `readdir`, `readdir_r`, `telldir`, `seekdir`,
//! `rewinddir`, `dirfd` and `closedir` recognise it by address and serve
//! it; every other stream goes on to libc. The entries are read at
//! `opendir` (and again at `rewinddir`), as a mount's `opendir` snapshots
//! them.
//!
//! Limits (docs/embedded.md): `getdents64` on the placeholder, as a raw
//! system call or from inside glibc (`nftw`), fails with `ENOTDIR`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_long};
use std::os::fd::{AsFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use mapfs::{Attr, FileKind};
use mapfs_interpose::sync::Mutex;

use crate::statbuf;
use crate::state::{self, Emb, Place};

/// One entry as `readdir` reports it.
struct Entry {
    ino: u64,
    kind: u8,
    name: Vec<u8>,
}

/// A directory stream of this library (its address is the `DIR *`).
struct Stream {
    fd: c_int,
    place: Place,
    inner: Mutex<Inner>,
}

struct Inner {
    entries: Vec<Entry>,
    pos: usize,
    /// What the last `readdir` returned points here (valid until the next
    /// call on the stream, as libc's).
    ent: Box<libc::dirent64>,
}

static STREAMS: Mutex<Option<HashMap<usize, Box<Stream>>>> = Mutex::new(None);
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Opens the directory `place` of `e` (`O_DIRECTORY`, or a path found to
/// be a directory): a placeholder descriptor, checked as the kernel checks
/// an open of a directory.
pub fn open(e: &Emb, place: &Place, flags: i32) -> Result<i32, i32> {
    let ctx = state::ctx();
    let a = e.fs.getattr(&ctx, &place.path).map_err(|e| e.errno())?;
    if a.kind != FileKind::Dir {
        return Err(libc::ENOTDIR);
    }
    if flags & libc::O_PATH == 0 {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(libc::EISDIR);
        }
        e.fs.access(&ctx, &place.path, libc::R_OK)
            .map_err(|e| e.errno())?;
    }
    let fd = rustix::fs::memfd_create("mapfs-dir", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| e.raw_os_error())?;
    let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| e.raw_os_error())?;
    if flags & libc::O_CLOEXEC == 0 {
        rustix::io::fcntl_setfd(fd.as_fd(), rustix::io::FdFlags::empty())
            .map_err(|e| e.raw_os_error())?;
    }
    let raw = fd.into_raw_fd();
    state::track_dir(raw, place.clone(), st.st_dev, st.st_ino, true);
    Ok(raw)
}

/// The entries of `place`, `.` and `..` first.
fn list(place: &Place) -> Result<Vec<Entry>, i32> {
    let e = &state::embs()[place.idx];
    let ctx = state::ctx();
    let this = e.fs.getattr(&ctx, &place.path).map_err(|e| e.errno())?;
    let parent_ino = match place.path.parent() {
        Some(p) => e.fs.getattr(&ctx, p).map_or(this.ino, |a| a.ino),
        // The root's parent is the prefix's parent on the host.
        None => std::fs::metadata(Path::new(std::ffi::OsStr::from_bytes(&e.prefix)).join(".."))
            .map_or(this.ino, |m| std::os::unix::fs::MetadataExt::ino(&m)),
    };
    let listed = e.fs.readdir(&ctx, &place.path).map_err(|e| e.errno())?;
    let mut out = Vec::with_capacity(listed.len() + 2);
    out.push(Entry {
        ino: this.ino,
        kind: libc::DT_DIR,
        name: b".".to_vec(),
    });
    out.push(Entry {
        ino: parent_ino,
        kind: libc::DT_DIR,
        name: b"..".to_vec(),
    });
    for d in listed {
        let name = d.name.as_bytes();
        // NAME_MAX, as the kernel's: a longer name cannot be reported.
        if name.len() > 255 || name.contains(&0) {
            continue;
        }
        out.push(Entry {
            ino: d.ino,
            kind: (statbuf::type_bits(d.kind) >> 12) as u8,
            name: name.to_vec(),
        });
    }
    Ok(out)
}

/// A stream over the placeholder `fd` (`fdopendir`), which it then owns;
/// `None` when `fd` is not a placeholder of this module.
pub fn fdopendir(fd: c_int) -> Option<Result<*mut libc::DIR, i32>> {
    let place = state::synthetic_dir(fd)?;
    Some(list(&place).map(|entries| {
        // SAFETY: all-zero bytes are a valid `dirent64` (integers and a
        // byte array).
        let ent: Box<libc::dirent64> = Box::new(unsafe { std::mem::zeroed() });
        let s = Box::new(Stream {
            fd,
            place,
            inner: Mutex::new(Inner {
                entries,
                pos: 0,
                ent,
            }),
        });
        let key = &*s as *const Stream as usize;
        let mut g = STREAMS.lock();
        let m = g.get_or_insert_with(HashMap::new);
        m.insert(key, s);
        COUNT.store(m.len(), Ordering::Release);
        key as *mut libc::DIR
    }))
}

/// Runs `f` on the stream `dir` if it is one of this module's.
fn with<R>(dir: *mut libc::DIR, f: impl FnOnce(&Stream) -> R) -> Option<R> {
    if COUNT.load(Ordering::Acquire) == 0 || dir.is_null() {
        return None;
    }
    let g = STREAMS.lock();
    let s = g.as_ref()?.get(&(dir as usize))?;
    Some(f(s))
}

/// `readdir`/`readdir64`: the next entry, NULL at the end; `None` for a
/// stream of libc's.
pub fn readdir(dir: *mut libc::DIR) -> Option<*mut libc::dirent64> {
    with(dir, |s| {
        let mut inner = s.inner.lock();
        let Inner { entries, pos, ent } = &mut *inner;
        let Some(e) = entries.get(*pos) else {
            return std::ptr::null_mut();
        };
        *pos += 1;
        fill(ent, e, *pos);
        &mut **ent as *mut libc::dirent64
    })
}

/// Writes `e` into `ent` (`off`: the position after it, for `telldir`).
fn fill(ent: &mut libc::dirent64, e: &Entry, off: usize) {
    ent.d_ino = e.ino;
    ent.d_off = off as i64;
    ent.d_type = e.kind;
    let head = std::mem::offset_of!(libc::dirent64, d_name);
    // The record length the kernel would report: the name, its NUL, and
    // padding to 8 bytes.
    ent.d_reclen = ((head + e.name.len() + 1).div_ceil(8) * 8) as u16;
    for (d, b) in ent.d_name.iter_mut().zip(e.name.iter().chain(&[0u8])) {
        *d = *b as c_char;
    }
}

/// `readdir_r`/`readdir64_r` on a stream of this module.
///
/// # Safety
/// `entry` and `result` are the caller's, valid for one write each.
pub unsafe fn readdir_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> Option<c_int> {
    let next = readdir(dir)?;
    // SAFETY: per the contract; `next` is the stream's own entry, not
    // `entry`.
    unsafe {
        if next.is_null() {
            *result = std::ptr::null_mut();
        } else {
            std::ptr::copy_nonoverlapping(next, entry, 1);
            *result = entry;
        }
    }
    Some(0)
}

/// `telldir`.
pub fn telldir(dir: *mut libc::DIR) -> Option<c_long> {
    with(dir, |s| s.inner.lock().pos as c_long)
}

/// `seekdir` (to a position `telldir` gave).
pub fn seekdir(dir: *mut libc::DIR, loc: c_long) -> Option<()> {
    with(dir, |s| s.inner.lock().pos = loc.max(0) as usize)
}

/// `rewinddir`: back to the start, with the entries as they are now.
pub fn rewinddir(dir: *mut libc::DIR) -> Option<()> {
    with(dir, |s| {
        let mut inner = s.inner.lock();
        if let Ok(entries) = list(&s.place) {
            inner.entries = entries;
        }
        inner.pos = 0;
    })
}

/// `dirfd`.
pub fn dirfd(dir: *mut libc::DIR) -> Option<c_int> {
    with(dir, |s| s.fd)
}

/// `closedir`: frees the stream and closes its descriptor.
pub fn closedir(dir: *mut libc::DIR) -> Option<c_int> {
    if COUNT.load(Ordering::Acquire) == 0 || dir.is_null() {
        return None;
    }
    let s = {
        let mut g = STREAMS.lock();
        let m = g.as_mut()?;
        let s = m.remove(&(dir as usize))?;
        COUNT.store(m.len(), Ordering::Release);
        s
    };
    state::untrack(s.fd);
    // SAFETY: the stream owned this descriptor since `fdopendir`.
    drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(s.fd) });
    Some(0)
}

/// `fstat` of a placeholder: the directory's attributes.
pub fn fstat<T>(fd: c_int, fill: fn(&Attr, u64) -> T) -> Option<Result<T, i32>> {
    let place = state::synthetic_dir(fd)?;
    let e = &state::embs()[place.idx];
    Some(
        e.fs.getattr(&state::ctx(), &place.path)
            .map(|a| fill(&a, e.dev))
            .map_err(|e| e.errno()),
    )
}

/// `scandir` over the placeholder `fd` (closed here): entries `filter`
/// keeps, sorted by `compar`, in arrays `malloc`ed as libc's are (the
/// caller frees them).
///
/// # Safety
/// `list` is valid for one write; `filter`/`compar` are the caller's C
/// callbacks taking `dirent64` pointers (the same layout as `dirent` on
/// 64-bit Linux).
pub unsafe fn scandir(
    fd: c_int,
    list_out: *mut *mut *mut libc::dirent64,
    filter: Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>,
    compar: Option<unsafe extern "C" fn(*const std::ffi::c_void, *const std::ffi::c_void) -> c_int>,
) -> Option<Result<c_int, i32>> {
    let place = state::synthetic_dir(fd)?;
    let entries = list(&place);
    state::untrack(fd);
    // SAFETY: the caller handed `fd` to scandir, which closes it.
    drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let entries = match entries {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    let mut kept: Vec<*mut libc::dirent64> = Vec::with_capacity(entries.len());
    let free_all = |v: &[*mut libc::dirent64]| {
        for p in v {
            // SAFETY: each was malloc'ed below.
            unsafe { libc::free(p.cast()) };
        }
    };
    for (i, e) in entries.iter().enumerate() {
        let size = std::mem::size_of::<libc::dirent64>();
        // SAFETY: malloc of a whole `dirent64`, as the caller frees it.
        let p = unsafe { libc::malloc(size) }.cast::<libc::dirent64>();
        if p.is_null() {
            free_all(&kept);
            return Some(Err(libc::ENOMEM));
        }
        // SAFETY: `p` is a fresh allocation of one `dirent64`.
        unsafe {
            std::ptr::write_bytes(p, 0, 1);
            fill(&mut *p, e, i + 1);
        }
        // SAFETY: the caller's filter on a valid entry.
        if filter.is_none_or(|f| unsafe { f(p) } != 0) {
            kept.push(p);
        } else {
            // SAFETY: allocated above, not kept.
            unsafe { libc::free(p.cast()) };
        }
    }
    let n = kept.len();
    // SAFETY: malloc of the array of pointers the caller frees.
    let arr = unsafe { libc::malloc(n.max(1) * std::mem::size_of::<*mut libc::dirent64>()) }
        .cast::<*mut libc::dirent64>();
    if arr.is_null() {
        free_all(&kept);
        return Some(Err(libc::ENOMEM));
    }
    // SAFETY: `arr` holds `n` pointers; qsort gets the caller's compar
    // over pointers to its elements, as libc's scandir calls it.
    unsafe {
        std::ptr::copy_nonoverlapping(kept.as_ptr(), arr, n);
        if let Some(c) = compar {
            libc::qsort(
                arr.cast(),
                n,
                std::mem::size_of::<*mut libc::dirent64>(),
                Some(c),
            );
        }
        *list_out = arr;
    }
    Some(Ok(n as c_int))
}
