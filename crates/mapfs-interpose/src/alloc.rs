//! The allocator's entry points, seen by the signal layer.
//!
//! A signal handler may interrupt the program inside `malloc` or `free`,
//! whose locks and lists are then mid-change. Whatever then allocates on
//! that thread before the allocator returns (the handler itself, or the
//! library's hooks it calls: an embedded file system's open, a lent
//! file's write, whose map update allocates) deadlocks on the allocator's
//! lock or corrupts its lists. So each library exports the malloc family
//! ([`allocator_exports!`](crate::allocator_exports)); each entry point counts the thread as inside the
//! allocator for the length of the call, and the library's signal
//! trampoline delays a program's handler while it is ([`crate::signal`]),
//! to run it as the allocator returns. Handlers then never run on top of
//! an allocator call, whatever they or the library do.
//!
//! The calls go on to the next definition of each function (the C
//! library's, or an allocator preloaded after this library), found at the
//! first call; calls made while that lookup runs go to the C library's.
//! A program that defines the malloc family in its own executable (a
//! statically linked allocator) takes precedence over every library, so
//! it is not covered; nor are the rare entry points not exported here
//! (`valloc`, `pvalloc`, `reallocarray`).

use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

thread_local! {
    /// Allocator calls this thread is in (low bits), and [`WAITING`]: a
    /// signal was delayed meanwhile. One word, so an allocator call costs
    /// one thread-local address.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// This thread is looking the next definitions up.
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// The bit of [`DEPTH`] saying a signal waits for the allocator call.
const WAITING: u32 = 1 << 31;

/// This thread is inside an allocator call (the signal layer delays
/// handlers then).
#[inline]
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() & !WAITING != 0)
}

/// The signal layer delayed a handler because this thread is inside an
/// allocator call: it is delivered again as the outermost call returns.
pub fn note_waiting() {
    DEPTH.with(|d| d.set(d.get() | WAITING));
}

/// An allocator call in progress on this thread.
struct InCall;

impl InCall {
    #[inline(always)]
    fn enter() -> InCall {
        DEPTH.with(|d| d.set(d.get() + 1));
        InCall
    }
}

impl Drop for InCall {
    #[inline(always)]
    fn drop(&mut self) {
        let waiting = DEPTH.with(|d| {
            let v = d.get() - 1;
            if v == WAITING {
                d.set(0);
                true
            } else {
                d.set(v);
                false
            }
        });
        if waiting {
            crate::signal::replay();
        }
    }
}

unsafe extern "C" {
    fn __libc_malloc(n: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, m: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, n: usize) -> *mut c_void;
}

/// The next definitions, once looked up.
struct Next {
    malloc: AtomicPtr<c_void>,
    calloc: AtomicPtr<c_void>,
    realloc: AtomicPtr<c_void>,
    free: AtomicPtr<c_void>,
    memalign: AtomicPtr<c_void>,
    /// 0: not looked up, 1: looking, 2: done.
    state: AtomicU8,
}

static NEXT: Next = Next {
    malloc: AtomicPtr::new(std::ptr::null_mut()),
    calloc: AtomicPtr::new(std::ptr::null_mut()),
    realloc: AtomicPtr::new(std::ptr::null_mut()),
    free: AtomicPtr::new(std::ptr::null_mut()),
    memalign: AtomicPtr::new(std::ptr::null_mut()),
    state: AtomicU8::new(0),
};

/// Looks the next definitions up (once; `dlsym` may allocate, which then
/// goes to the C library's functions, see [`next`]).
#[cold]
fn resolve() {
    if NEXT
        .state
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    RESOLVING.with(|r| r.set(true));
    let find = |name: &CStr| {
        // SAFETY: a NUL-terminated name; RTLD_NEXT from this library.
        unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
    };
    NEXT.malloc.store(find(c"malloc"), Ordering::Release);
    NEXT.calloc.store(find(c"calloc"), Ordering::Release);
    NEXT.realloc.store(find(c"realloc"), Ordering::Release);
    NEXT.free.store(find(c"free"), Ordering::Release);
    NEXT.memalign.store(find(c"memalign"), Ordering::Release);
    RESOLVING.with(|r| r.set(false));
    NEXT.state.store(2, Ordering::Release);
}

/// The next definition in `slot`, or null if the C library's must serve
/// this call (not looked up yet on this thread's account, or missing).
#[inline(always)]
fn next(slot: &AtomicPtr<c_void>) -> *mut c_void {
    if NEXT.state.load(Ordering::Acquire) != 2 {
        if RESOLVING.with(|r| r.get()) {
            return std::ptr::null_mut();
        }
        resolve();
        if NEXT.state.load(Ordering::Acquire) != 2 {
            // Another thread is looking them up.
            return std::ptr::null_mut();
        }
    }
    slot.load(Ordering::Relaxed)
}

/// `malloc`.
///
/// # Safety
/// As `malloc(3)`.
#[inline]
pub unsafe fn malloc(n: usize) -> *mut c_void {
    let _c = InCall::enter();
    let f = next(&NEXT.malloc);
    if f.is_null() {
        // SAFETY: the C library's malloc.
        return unsafe { __libc_malloc(n) };
    }
    // SAFETY: `f` is the next `malloc`.
    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(usize) -> *mut c_void>(f)(n) }
}

/// `calloc`.
///
/// # Safety
/// As `calloc(3)`.
#[inline]
pub unsafe fn calloc(n: usize, m: usize) -> *mut c_void {
    let _c = InCall::enter();
    let f = next(&NEXT.calloc);
    if f.is_null() {
        // SAFETY: the C library's calloc.
        return unsafe { __libc_calloc(n, m) };
    }
    // SAFETY: `f` is the next `calloc`.
    unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(usize, usize) -> *mut c_void>(f)(
            n, m,
        )
    }
}

/// `realloc`.
///
/// # Safety
/// As `realloc(3)`.
#[inline]
pub unsafe fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    let _c = InCall::enter();
    let f = next(&NEXT.realloc);
    if f.is_null() {
        // SAFETY: the C library's realloc.
        return unsafe { __libc_realloc(p, n) };
    }
    // SAFETY: `f` is the next `realloc`.
    unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>(
            f,
        )(p, n)
    }
}

/// `free`.
///
/// # Safety
/// As `free(3)`.
#[inline]
pub unsafe fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let _c = InCall::enter();
    let f = next(&NEXT.free);
    if f.is_null() {
        // SAFETY: the C library's free.
        return unsafe { __libc_free(p) };
    }
    // SAFETY: `f` is the next `free`.
    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(f)(p) }
}

/// `memalign`, and the aligned variants built on it.
///
/// # Safety
/// As `memalign(3)`.
#[inline]
pub unsafe fn memalign(align: usize, n: usize) -> *mut c_void {
    let _c = InCall::enter();
    let f = next(&NEXT.memalign);
    if f.is_null() {
        // SAFETY: the C library's memalign.
        return unsafe { __libc_memalign(align, n) };
    }
    // SAFETY: `f` is the next `memalign`.
    unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(usize, usize) -> *mut c_void>(f)(
            align, n,
        )
    }
}

/// `posix_memalign`, on [`memalign`].
///
/// # Safety
/// As `posix_memalign(3)`: `out` is valid for writing.
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> c_int {
    if align < std::mem::size_of::<*mut c_void>() || !align.is_power_of_two() {
        return libc::EINVAL;
    }
    // SAFETY: per the contract.
    let p = unsafe { memalign(align, n) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: per the contract.
    unsafe { *out = p };
    0
}

/// Exports the malloc family from the library that invokes it (a
/// `cdylib`), each entry point calling this module's.
#[macro_export]
macro_rules! allocator_exports {
    () => {
        /// `malloc(3)`, seen by the signal layer (`mapfs_interpose::alloc`).
        #[no_mangle]
        pub unsafe extern "C" fn malloc(n: usize) -> *mut ::std::ffi::c_void {
            // SAFETY: the caller's contract is malloc's.
            unsafe { $crate::alloc::malloc(n) }
        }
        /// `calloc(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn calloc(n: usize, m: usize) -> *mut ::std::ffi::c_void {
            // SAFETY: the caller's contract is calloc's.
            unsafe { $crate::alloc::calloc(n, m) }
        }
        /// `realloc(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn realloc(
            p: *mut ::std::ffi::c_void,
            n: usize,
        ) -> *mut ::std::ffi::c_void {
            // SAFETY: the caller's contract is realloc's.
            unsafe { $crate::alloc::realloc(p, n) }
        }
        /// `free(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn free(p: *mut ::std::ffi::c_void) {
            // SAFETY: the caller's contract is free's.
            unsafe { $crate::alloc::free(p) }
        }
        /// `memalign(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn memalign(align: usize, n: usize) -> *mut ::std::ffi::c_void {
            // SAFETY: the caller's contract is memalign's.
            unsafe { $crate::alloc::memalign(align, n) }
        }
        /// `aligned_alloc(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut ::std::ffi::c_void {
            // SAFETY: the caller's contract is aligned_alloc's (memalign's).
            unsafe { $crate::alloc::memalign(align, n) }
        }
        /// `posix_memalign(3)`, seen by the signal layer.
        #[no_mangle]
        pub unsafe extern "C" fn posix_memalign(
            out: *mut *mut ::std::ffi::c_void,
            align: usize,
            n: usize,
        ) -> ::std::ffi::c_int {
            // SAFETY: the caller's contract is posix_memalign's.
            unsafe { $crate::alloc::posix_memalign(out, align, n) }
        }
    };
}
