//! Signal handlers never run inside the library, and the library knows
//! when a thread runs one: its `sigaction` and `signal` hooks install a
//! trampoline in front of the program's handler. A signal that arrives
//! while the thread is inside the library (its guard or one of its locks
//! held) is deferred: the trampoline notes it and returns, and the thread
//! delivers it to itself again, with its `siginfo`, as it leaves
//! ([`replay`]); faults (`SIGSEGV`...) are never deferred. Otherwise the
//! trampoline counts, per thread, the handlers running ([`in_handler`]). Inside one, hooks that change the descriptor table
//! (`close`, `dup2`) do only lock-free bookkeeping and the plain system
//! call: a handler may have interrupted the allocator. (A handler that
//! interrupted the library itself cannot enter it at all, see
//! [`crate::guard`].)
//!
//! A handler that leaves by `longjmp`/`siglongjmp` never returns through
//! the trampoline: the library's `longjmp` hooks call [`jumped`], which
//! ends the count on the thread (a jump leaves every handler it is in,
//! as far as the library can tell).

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Signal numbers the table covers (Linux: 1..=64).
const SIGNALS: usize = 65;

/// The program's handler of each signal, as it gave it.
static HANDLERS: [AtomicUsize; SIGNALS] = [const { AtomicUsize::new(0) }; SIGNALS];
/// The handler takes three arguments (`SA_SIGINFO`).
static SIGINFO: [AtomicBool; SIGNALS] = [const { AtomicBool::new(false) }; SIGNALS];

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Signals that arrived while this thread was inside the library,
    /// one bit each, to be delivered again when it leaves ([`replay`]).
    static DEFERRED: Cell<u128> = const { Cell::new(0) };
    /// The `siginfo` each deferred signal came with.
    static DEFERRED_INFO: std::cell::UnsafeCell<[libc::siginfo_t; SIGNALS]> =
        // SAFETY: an all-zero siginfo_t is a valid value.
        const { std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }) };
}

/// Signals a fault raises on the faulting instruction: never deferred
/// (returning would run the instruction again).
fn synchronous(sig: c_int) -> bool {
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP | libc::SIGSYS
    )
}

/// The thread is inside the library: its guard, or a lock of it.
fn library_busy() -> bool {
    crate::guard::inside() || crate::gate::inside() || crate::alloc::inside()
}

/// Delivers again, to this thread, the signals deferred while it was
/// inside the library: called as it leaves (the guard's and the gate's
/// last drop). Each comes back with its own `siginfo`.
#[inline]
pub fn replay() {
    if DEFERRED.with(|d| d.get()) == 0 || library_busy() {
        return;
    }
    replay_slow();
}

#[cold]
fn replay_slow() {
    let bits = DEFERRED.with(|d| d.replace(0));
    let pid = rustix::process::getpid();
    let tid = rustix::thread::gettid();
    for sig in 1..SIGNALS {
        if bits & (1u128 << sig) == 0 {
            continue;
        }
        // SAFETY: this thread's own array; no handler writes it while the
        // thread is outside the library (the trampoline writes it only
        // while the thread is inside).
        let mut info = DEFERRED_INFO.with(|a| unsafe { (*a.get())[sig] });
        // SAFETY: queueing a signal to this very thread, with the siginfo
        // it first came with (allowed for the caller's own thread group).
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                pid.as_raw_nonzero().get(),
                tid.as_raw_nonzero().get(),
                sig as c_int,
                &mut info as *mut libc::siginfo_t,
            )
        };
        if r != 0 {
            // SAFETY: tgkill of this thread (the siginfo is lost).
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    pid.as_raw_nonzero().get(),
                    tid.as_raw_nonzero().get(),
                    sig as c_int,
                )
            };
        }
    }
}

/// This thread runs a signal handler of the program.
#[inline]
pub fn in_handler() -> bool {
    DEPTH.with(|d| d.get() != 0)
}

/// A `longjmp` leaves the handlers this thread was in.
pub fn jumped() {
    DEPTH.with(|d| d.set(0));
}

extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = usize::try_from(sig).ok().filter(|&i| i < SIGNALS) else {
        return;
    };
    let h = HANDLERS[i].load(Ordering::Acquire);
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if library_busy() && !synchronous(sig) {
        // The handler would run on top of the library's own work (its
        // locks held, its tables mid-change): it runs as the thread
        // leaves the library instead ([`replay`]).
        DEFERRED.with(|d| d.set(d.get() | 1u128 << i));
        if crate::alloc::inside() {
            crate::alloc::note_waiting();
        }
        if !info.is_null() {
            // SAFETY: the kernel's siginfo for this delivery; this thread's
            // own array, not read while the thread is inside the library.
            DEFERRED_INFO.with(|a| unsafe { (*a.get())[i] = *info });
        }
        return;
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    if SIGINFO[i].load(Ordering::Acquire) {
        // SAFETY: the program installed `h` as an SA_SIGINFO handler.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed `h` as a one-argument handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
}

fn wrapped(h: usize) -> bool {
    h != libc::SIG_DFL && h != libc::SIG_IGN && h != libc::SIG_ERR
}

/// The `sigaction` hook: installs the trampoline in front of the program's
/// handler, and reports the program's own handler in `old`.
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are null or valid; `real` is the next
/// definition of `sigaction`.
pub unsafe fn sigaction(
    real: unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int,
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(i) = usize::try_from(sig).ok().filter(|&i| i > 0 && i < SIGNALS) else {
        // SAFETY: the caller's arguments.
        return unsafe { real(sig, act, old) };
    };
    let prev = HANDLERS[i].load(Ordering::Acquire);
    let prev_info = SIGINFO[i].load(Ordering::Acquire);
    let r = if act.is_null() {
        // SAFETY: the caller's arguments.
        unsafe { real(sig, act, old) }
    } else {
        // SAFETY: per the contract `act` is valid.
        let mut mine = unsafe { *act };
        let h = mine.sa_sigaction;
        if wrapped(h) {
            // Recorded before the trampoline can run for it.
            HANDLERS[i].store(h, Ordering::Release);
            SIGINFO[i].store(mine.sa_flags & libc::SA_SIGINFO != 0, Ordering::Release);
            mine.sa_sigaction = trampoline as *const () as usize;
            mine.sa_flags |= libc::SA_SIGINFO;
        }
        // SAFETY: a valid sigaction; `old` per the contract.
        let r = unsafe { real(sig, &mine, old) };
        if r != 0 {
            HANDLERS[i].store(prev, Ordering::Release);
            SIGINFO[i].store(prev_info, Ordering::Release);
        } else if !wrapped(h) {
            HANDLERS[i].store(h, Ordering::Release);
        }
        r
    };
    if r == 0 && !old.is_null() {
        // SAFETY: the real call filled `old`.
        let o = unsafe { &mut *old };
        if o.sa_sigaction == trampoline as *const () as usize {
            o.sa_sigaction = prev;
            if !prev_info {
                o.sa_flags &= !libc::SA_SIGINFO;
            }
        }
    }
    r
}

/// `signal(2)` made through the `sigaction` hook (glibc's own `signal`
/// calls its internal `sigaction`, out of the hooks' sight): BSD semantics,
/// as glibc gives (`SA_RESTART`, handler kept).
///
/// # Safety
/// `real_sigaction` is the next definition of `sigaction`.
pub unsafe fn signal(
    real_sigaction: unsafe extern "C" fn(
        c_int,
        *const libc::sigaction,
        *mut libc::sigaction,
    ) -> c_int,
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    // SAFETY: zeroed is a valid sigaction (empty mask, no flags).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: adding a valid signal number to a valid set.
    if unsafe { libc::sigaddset(&mut act.sa_mask, sig) } != 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: zeroed is a valid sigaction.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers for the call.
    if unsafe { sigaction(real_sigaction, sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

#[cfg(test)]
mod tests {
    use super::*;

    static SEEN_INSIDE: AtomicBool = AtomicBool::new(false);

    extern "C" fn handler(_: c_int) {
        SEEN_INSIDE.store(in_handler(), Ordering::SeqCst);
    }

    extern "C" fn libc_sigaction(
        sig: c_int,
        act: *const libc::sigaction,
        old: *mut libc::sigaction,
    ) -> c_int {
        // SAFETY: forwarding valid arguments to libc.
        unsafe { libc::sigaction(sig, act, old) }
    }

    #[test]
    fn a_handler_runs_marked_and_the_program_sees_its_own_handler() {
        // SAFETY: installing a handler for SIGUSR2 in this test process.
        let prev = unsafe { signal(libc_sigaction, libc::SIGUSR2, handler as *const () as usize) };
        assert_ne!(prev, libc::SIG_ERR);
        assert!(!in_handler());
        // SAFETY: raising a signal whose handler was just installed.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert!(
            SEEN_INSIDE.load(Ordering::SeqCst),
            "the handler ran unmarked"
        );
        assert!(!in_handler(), "the mark outlived the handler");
        // SAFETY: querying the current action.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let r = unsafe { sigaction(libc_sigaction, libc::SIGUSR2, std::ptr::null(), &mut old) };
        assert_eq!(r, 0);
        assert_eq!(
            old.sa_sigaction, handler as *const () as usize,
            "the trampoline leaked out"
        );
        // SAFETY: restoring the default action.
        unsafe { signal(libc_sigaction, libc::SIGUSR2, libc::SIG_DFL) };
    }
}
