//! One test of each lock-order and signal rule of the crate's doc, on the
//! real gate, guard, locks and trampoline of this process (the tests run
//! one at a time: the gate and the signal table are per process).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

use mapfs_interpose::guard::Guard;
use mapfs_interpose::sync::Mutex;
use mapfs_interpose::{gate, signal};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn libc_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: forwarding the caller's valid arguments to libc.
    unsafe { libc::sigaction(sig, act, old) }
}

/// What the test handler saw.
static RAN: AtomicU32 = AtomicU32::new(0);
static SEEN_PID: AtomicI32 = AtomicI32::new(0);
static SEEN_CODE: AtomicI32 = AtomicI32::new(0);
static COULD_ENTER: AtomicBool = AtomicBool::new(false);
static MARKED: AtomicBool = AtomicBool::new(false);

extern "C" fn handler(_: c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    RAN.fetch_add(1, Ordering::SeqCst);
    MARKED.store(signal::in_handler(), Ordering::SeqCst);
    COULD_ENTER.store(Guard::enter().is_some(), Ordering::SeqCst);
    if !info.is_null() {
        // SAFETY: the kernel's (or the replay's) siginfo of this delivery.
        let i = unsafe { &*info };
        // SAFETY: a signal sent by tgkill carries the sender's pid.
        SEEN_PID.store(unsafe { i.si_pid() }, Ordering::SeqCst);
        SEEN_CODE.store(i.si_code, Ordering::SeqCst);
    }
}

/// Installs [`handler`] for `sig` through the crate's `sigaction` hook,
/// as a program under a library would.
fn install(sig: c_int) {
    RAN.store(0, Ordering::SeqCst);
    SEEN_PID.store(0, Ordering::SeqCst);
    SEEN_CODE.store(0, Ordering::SeqCst);
    // SAFETY: zeroed is a valid sigaction; the handler takes three
    // arguments, as SA_SIGINFO says.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO;
    // SAFETY: valid arguments; the real sigaction is libc's.
    let r = unsafe { signal::sigaction(libc_sigaction, sig, &act, std::ptr::null_mut()) };
    assert_eq!(r, 0);
}

fn uninstall(sig: c_int) {
    // SAFETY: restoring the default action of a signal of this test.
    unsafe { signal::signal(libc_sigaction, sig, libc::SIG_DFL) };
}

fn raise(sig: c_int) {
    // SAFETY: a signal to this thread, whose handler is installed.
    assert_eq!(unsafe { libc::raise(sig) }, 0);
}

/// "Already inside the library on this thread: no lock": a thread that
/// holds a lock of the library (outside a guard, as a handler may
/// interrupt it) cannot enter the guard, so a hook passes the call on.
#[test]
fn a_thread_holding_a_lock_cannot_enter_the_guard() {
    let _s = serial();
    let m = Mutex::new(0u32);
    let held = m.lock();
    assert!(
        Guard::enter().is_none(),
        "entered the guard with a lock held"
    );
    drop(held);
    let g = Guard::enter().expect("no lock held any more");
    // Nor twice on one thread.
    assert!(Guard::enter().is_none());
    drop(g);
    assert!(!gate::inside());
}

/// "A signal that arrives while the thread is inside the library is
/// deferred": the program's handler does not run on top of the library,
/// and runs once, with the siginfo it came with, as the thread leaves.
#[test]
fn a_signal_inside_the_guard_is_deferred_and_replayed_with_its_siginfo() {
    let _s = serial();
    install(libc::SIGUSR1);
    let g = Guard::enter().expect("guard");
    raise(libc::SIGUSR1);
    raise(libc::SIGUSR1);
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        0,
        "the handler ran inside the library"
    );
    drop(g);
    // Standard signals do not queue: two raises, one delivery.
    assert_eq!(RAN.load(Ordering::SeqCst), 1, "not replayed at leaving");
    assert_eq!(SEEN_PID.load(Ordering::SeqCst), std::process::id() as i32);
    assert_eq!(
        SEEN_CODE.load(Ordering::SeqCst),
        libc::SI_TKILL,
        "the replay lost the signal's siginfo"
    );
    assert!(
        MARKED.load(Ordering::SeqCst),
        "the replayed handler ran unmarked"
    );
    assert!(!signal::in_handler());
    uninstall(libc::SIGUSR1);
}

/// The same with a lock of the library held outside a guard: deferred
/// until the lock (and with it the gate) is released.
#[test]
fn a_signal_while_a_lock_is_held_waits_for_its_release() {
    let _s = serial();
    install(libc::SIGUSR2);
    let m = Mutex::new(());
    let outer = m.lock();
    raise(libc::SIGUSR2);
    assert_eq!(RAN.load(Ordering::SeqCst), 0, "ran with a lock held");
    drop(outer);
    assert_eq!(RAN.load(Ordering::SeqCst), 1, "not replayed at release");
    uninstall(libc::SIGUSR2);
}

/// "Faults are never deferred": returning from the trampoline would run
/// the faulting instruction again, so the handler runs at once, even
/// inside the library.
#[test]
fn a_fault_signal_is_never_deferred() {
    let _s = serial();
    install(libc::SIGSYS);
    let g = Guard::enter().expect("guard");
    raise(libc::SIGSYS);
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        1,
        "a fault's handler was deferred"
    );
    drop(g);
    assert_eq!(RAN.load(Ordering::SeqCst), 1, "a fault was delivered twice");
    uninstall(libc::SIGSYS);
}

/// "From a signal handler that interrupted the program outside the
/// library": the handler is marked as one ([`signal::in_handler`]) and
/// may enter the library (nothing of it is held by its thread).
#[test]
fn a_handler_that_interrupted_the_program_is_marked_and_may_enter() {
    let _s = serial();
    install(libc::SIGURG);
    COULD_ENTER.store(false, Ordering::SeqCst);
    raise(libc::SIGURG);
    assert_eq!(RAN.load(Ordering::SeqCst), 1);
    assert!(MARKED.load(Ordering::SeqCst), "the handler ran unmarked");
    assert!(
        COULD_ENTER.load(Ordering::SeqCst),
        "the handler could not enter"
    );
    assert!(!signal::in_handler(), "the mark outlived the handler");
    assert!(!gate::inside());
    uninstall(libc::SIGURG);
}

/// Waits for child `pid` and returns its exit status (`None` if killed).
fn exit_status(pid: libc::pid_t) -> Option<i32> {
    let mut st = 0;
    // SAFETY: waiting for this test's own child.
    let r = unsafe { libc::waitpid(pid, &mut st, 0) };
    assert_eq!(r, pid);
    libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st))
}

/// "A fork made from inside the gate cannot close it": the child is
/// marked unsafe and its hooks pass every call straight on (the guard
/// never admits them).
#[test]
fn a_fork_from_inside_the_gate_makes_a_pass_through_child() {
    let _s = serial();
    let held = gate::hold();
    assert!(!gate::close_for_fork(), "closed the gate from inside it");
    // SAFETY: the child only reads atomics and thread-locals and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        gate::after_fork_child(false);
        let ok = gate::child_is_unsafe() && Guard::enter().is_none();
        // SAFETY: leaving the forked child without running the parent's
        // exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0);
    drop(held);
    assert_eq!(exit_status(pid), Some(0), "the child was not pass-through");
    assert!(!gate::child_is_unsafe(), "the parent was marked");
}

/// "`fork` closes the gate": no lock of the library is held or waited for
/// at the real `fork`, however busy the other threads are, so the child
/// takes every lock at once.
#[test]
fn a_fork_with_the_gate_closed_finds_every_lock_free() {
    let _s = serial();
    static LOCK: Mutex<u64> = Mutex::new(0);
    static STOP: AtomicBool = AtomicBool::new(false);
    STOP.store(false, Ordering::SeqCst);
    let busy: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(|| {
                while !STOP.load(Ordering::Relaxed) {
                    *LOCK.lock() += 1;
                }
            })
        })
        .collect();
    while *LOCK.lock() < 1000 {
        std::thread::yield_now();
    }
    for _ in 0..20 {
        assert!(gate::close_for_fork(), "could not close the gate");
        // SAFETY: the child takes the library's lock (free: the gate was
        // closed, so no thread held it), a guard, and _exits; an alarm
        // kills it should it hang.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            gate::after_fork_child(true);
            // SAFETY: a timer of the child's own.
            unsafe { libc::alarm(10) };
            *LOCK.lock() += 1;
            let ok = !gate::child_is_unsafe() && Guard::enter().is_some();
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        gate::after_fork_parent();
        assert_eq!(
            exit_status(pid),
            Some(0),
            "the child hung on a lock or could not enter"
        );
    }
    STOP.store(true, Ordering::SeqCst);
    for t in busy {
        t.join().unwrap();
    }
    assert!(!gate::inside());
}
