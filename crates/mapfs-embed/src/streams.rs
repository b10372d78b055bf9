//! stdio streams of placeholders (files served by the data engine, see
//! [`crate::engine_fd`]). glibc's `FILE` reads and writes its descriptor
//! with calls internal to libc, which no hook sees, so a stream of a
//! placeholder would reach the empty memfd. Instead, `fopen`/`fdopen` of a
//! placeholder, and the standard streams of a new process image whose
//! descriptors 0-2 are placeholders (`ls > /ckpt/x`, `sort < /ckpt/x`), are
//! `fopencookie` streams whose functions are the library's own hooks:
//! buffering, `fseek`, `ftell`, `ungetc` and the rest stay glibc's.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{off64_t, size_t, ssize_t};

/// Where glibc keeps a stream's descriptor in its `FILE` (`_fileno`, after
/// the 12 buffer pointers, the marker list and the chain: the layout of
/// every 64-bit glibc). A cookie stream holds -2 there, which makes
/// `fileno` fail; the placeholder's number is written instead so that
/// `fileno`/`fstat`/`fsync` of the stream work (checked before writing).
const FILENO_OFFSET: usize = 14 * std::mem::size_of::<usize>();

/// `_fileno` of a fresh cookie stream in glibc.
const COOKIE_FILENO: c_int = -2;

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio hands a buffer valid for `n` bytes; the hook serves
    // the placeholder (or passes the call on if it was closed unseen).
    unsafe { crate::data_hooks::read(fd_of(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: as in `cookie_read`.
    unsafe { crate::data_hooks::write(fd_of(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid position to read and update.
    unsafe {
        let r = crate::data_hooks::lseek64(fd_of(cookie), *off, whence);
        if r < 0 {
            return -1;
        }
        *off = r;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream owned the descriptor; `fclose` ends both.
    unsafe { crate::hooks::close(fd_of(cookie)) }
}

/// The close of a standard stream put over a placeholder made standard by
/// `dup2` ([`after_dup`]): the descriptor is not the stream's to close.
unsafe extern "C" fn cookie_keep(_cookie: *mut c_void) -> c_int {
    0
}

/// glibc's own standard streams, kept aside while a cookie stream stands
/// in for one ([`after_dup`]).
static ORIGINAL: [AtomicPtr<libc::FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];
/// The cookie stream standing in for each standard stream (null: none).
static STANDING: [AtomicPtr<libc::FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

fn std_stream(fd: c_int) -> *mut libc::FILE {
    // SAFETY: reading glibc's standard stream variables.
    unsafe {
        match fd {
            0 => stdin,
            1 => stdout,
            _ => stderr,
        }
    }
}

fn set_std_stream(fd: c_int, f: *mut libc::FILE) {
    // SAFETY: glibc and the program read the standard streams through
    // these variables; a shell changes its descriptors 0-2 from one thread.
    unsafe {
        match fd {
            0 => stdin = f,
            1 => stdout = f,
            _ => stderr = f,
        }
    }
}

/// Before descriptor `fd` (0-2) is replaced or closed: what a stand-in
/// stream buffered goes to the file it stands for. Called outside the
/// guard (the flush writes through the hooks).
pub fn before_replacing(fd: c_int) {
    if let Some(slot) = usize::try_from(fd).ok().and_then(|i| STANDING.get(i)) {
        let f = slot.load(Ordering::Acquire);
        if !f.is_null() {
            // SAFETY: a live stream of this library's.
            unsafe { libc::fflush(f) };
        }
    }
}

/// After descriptor `fd` (0-2) became a duplicate of another (`dup2`,
/// `dup3`) or was closed: a shell redirecting a builtin (`echo hi > f`,
/// `exec 3>f; echo >&3`) puts a placeholder on 1 and writes through
/// `stdout`, whose writes glibc makes with its internal `write`, out of
/// the hooks' sight. While 0-2 is a placeholder, a cookie stream stands in
/// for the standard stream; when it is not any more, glibc's is back.
pub fn after_dup(fd: c_int) {
    let Some(i) = usize::try_from(fd).ok().filter(|&i| i < 3) else {
        return;
    };
    let standing = STANDING[i].load(Ordering::Acquire);
    let placeholder = crate::engine_fd::get(fd);
    match (placeholder, standing.is_null()) {
        (Some(o), true) => {
            let mode: &[u8] = match o.flags() & libc::O_ACCMODE {
                libc::O_RDONLY => b"r\0",
                libc::O_WRONLY => b"w\0",
                _ => b"r+\0",
            };
            let funcs = CookieIoFunctions {
                read: Some(cookie_read),
                write: Some(cookie_write),
                seek: Some(cookie_seek),
                close: Some(cookie_keep),
            };
            // SAFETY: a NUL-terminated literal mode; the cookie is the
            // descriptor's number, never dereferenced.
            let f = unsafe { fopencookie(fd as usize as *mut c_void, mode.as_ptr().cast(), funcs) };
            if f.is_null() {
                return;
            }
            if fd == 2 {
                // SAFETY: a fresh stream, before any I/O on it.
                unsafe { libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0) };
            }
            ORIGINAL[i].store(std_stream(fd), Ordering::Release);
            STANDING[i].store(f, Ordering::Release);
            set_std_stream(fd, f);
        }
        (None, false) => {
            set_std_stream(fd, ORIGINAL[i].load(Ordering::Acquire));
            STANDING[i].store(std::ptr::null_mut(), Ordering::Release);
            // SAFETY: the stand-in, flushed by `before_replacing`; its
            // close function leaves the descriptor alone.
            unsafe { libc::fclose(standing) };
        }
        _ => {}
    }
}

/// A stream of placeholder `fd` with stdio `mode` (`fopen`, `fdopen`); the
/// stream owns the descriptor from then on. NULL with errno on failure (the
/// descriptor is then still the caller's).
///
/// # Safety
/// `mode` is a NUL-terminated string.
pub unsafe fn open(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let funcs = CookieIoFunctions {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: `mode` per the contract; the cookie is the descriptor's number,
    // never dereferenced.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode, funcs) };
    if !f.is_null() {
        // SAFETY: `f` is a live glibc FILE, at least as large as its public
        // head; the slot is written only if it holds what glibc puts there
        // for a cookie stream.
        unsafe {
            let slot = f.cast::<u8>().add(FILENO_OFFSET).cast::<c_int>();
            if *slot == COOKIE_FILENO {
                *slot = fd;
            }
        }
    }
    f
}

/// glibc's `cookie_io_functions_t` (not in the `libc` crate).
#[repr(C)]
struct CookieIoFunctions {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(
        cookie: *mut c_void,
        mode: *const c_char,
        funcs: CookieIoFunctions,
    ) -> *mut libc::FILE;
    static mut stdin: *mut libc::FILE;
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
}

/// In a new process image (the constructor, after the inherited opens were
/// adopted): the standard streams whose descriptors are placeholders become
/// cookie streams, so that a program doing its I/O with stdio can be
/// redirected to or from a file of the embedded file system.
pub fn replace_std_streams() {
    for fd in 0..3 {
        let Some(o) = crate::engine_fd::get(fd) else {
            continue;
        };
        let mode: &[u8] = match o.flags() & libc::O_ACCMODE {
            libc::O_RDONLY => b"r\0",
            libc::O_WRONLY => b"w\0",
            _ => b"r+\0",
        };
        // SAFETY: a NUL-terminated literal mode.
        let f = unsafe { open(fd, mode.as_ptr().cast()) };
        if f.is_null() {
            continue;
        }
        if fd == 2 {
            // SAFETY: a fresh stream, before any I/O on it.
            unsafe { libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0) };
        }
        // SAFETY: the constructor runs before the program, alone; glibc and
        // the program read the standard streams through these variables.
        unsafe {
            match fd {
                0 => stdin = f,
                1 => stdout = f,
                _ => stderr = f,
            }
        }
    }
}
