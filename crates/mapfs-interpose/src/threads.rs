//! Threads the library starts for itself.
//!
//! A file system running inside the program (embedded mode, or the data
//! engine of a lent open) may start threads: plfs counts a large
//! directory's entries on helper threads, versions keeps a committer. Such
//! a thread calls libc, and so the library's hooks; as an ordinary thread
//! it would enter the fork gate there. Then a `fork` deadlocks: the fork
//! waits for the thread that started the helpers to leave the gate, that
//! thread waits for its helpers, and the helpers wait for the gate.
//!
//! So a thread started while its creator is inside the library (the
//! library's `pthread_create` hook calls [`create`]) is the library's own
//! for its whole life: it is marked inside ([`crate::guard`]), so every
//! hook passes its calls straight on to libc and it never waits for the
//! gate, and it starts with every signal blocked, as the program's
//! handlers are for the program's threads (a signal the library defers on
//! a thread that is always inside would never be delivered).

use std::ffi::{c_int, c_void};

/// The type of `pthread_create`.
pub type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

/// A library thread's start routine and argument.
struct Start {
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

/// `pthread_create` for the library's hook: `real` with the caller's
/// arguments, except that a thread started from inside the library
/// becomes a library thread (see the module docs).
///
/// # Safety
/// `real` is the next definition of `pthread_create`; the other arguments
/// are the caller's, valid as `pthread_create` requires.
pub unsafe fn create(
    real: PthreadCreate,
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    f: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    if !crate::guard::inside() {
        // SAFETY: per the contract.
        return unsafe { real(thread, attr, f, arg) };
    }
    let start = Box::into_raw(Box::new(Start { f, arg }));
    // The new thread inherits the mask in force at its creation.
    // SAFETY: plain signal-mask calls on sets of this frame.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    // SAFETY: per the contract; `library_thread` takes `start` back.
    let r = unsafe { real(thread, attr, library_thread, start.cast()) };
    // SAFETY: restores this thread's own mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if r != 0 {
        // SAFETY: no thread was started, so `start` is still ours.
        drop(unsafe { Box::from_raw(start) });
    }
    r
}

extern "C" fn library_thread(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the `Start` that `create` boxed for this thread alone.
    let Start { f, arg } = *unsafe { Box::from_raw(p.cast::<Start>()) };
    crate::guard::Guard::enter_forced();
    f(arg)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    extern "C" fn report(out: *mut c_void) -> *mut c_void {
        // SAFETY: the test passes a pointer to its `[bool; 2]`.
        let out = unsafe { &mut *out.cast::<[bool; 2]>() };
        out[0] = crate::guard::inside();
        // SAFETY: reads this thread's mask into a local set.
        out[1] = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut set);
            libc::sigismember(&set, libc::SIGALRM) == 1
        };
        std::ptr::null_mut()
    }

    fn start_and_report() -> [bool; 2] {
        let mut out = [false; 2];
        let mut t: libc::pthread_t = 0;
        // SAFETY: libc's pthread_create, a routine that writes `out`, which
        // outlives the thread (joined below).
        unsafe {
            let r = create(
                libc::pthread_create,
                &mut t,
                std::ptr::null(),
                report,
                (&mut out as *mut [bool; 2]).cast(),
            );
            assert_eq!(r, 0);
            assert_eq!(libc::pthread_join(t, std::ptr::null_mut()), 0);
        }
        out
    }

    #[test]
    fn threads_started_inside_are_the_librarys() {
        let [inside, blocked] = start_and_report();
        assert!(!inside, "a program's thread is not the library's");
        assert!(!blocked, "a program's thread keeps the program's mask");
        crate::guard::Guard::enter_forced();
        let [inside, blocked] = start_and_report();
        crate::guard::Guard::leave_forced();
        assert!(inside, "a thread the library started passes calls on");
        assert!(blocked, "a thread the library started takes no signal");
    }
}
