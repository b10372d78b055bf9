//! The fork gate: every lock of an interposition library is taken inside
//! it ([`hold`]), and `fork` closes it ([`close_for_fork`]) and waits until
//! no thread is inside before the real `fork` runs. So no lock of the
//! library is held, or waited for, at the moment of `fork`, and the child
//! starts with every one of them free: nothing to reset lock by lock, and
//! no lock handed over to a parked thread that does not exist in the child
//! (parking_lot's fair unlock does that: it is how a forked child hung in
//! the descriptor table's write lock).
//!
//! The gate is a futex word, not a lock of parking_lot, for the same
//! reason: in the child it is simply stored as open ([`after_fork_child`]).
//!
//! Rules (one line each):
//! - Take every lock of the library through [`crate::sync`], which holds
//!   the gate for as long as the lock is held.
//! - Never block inside the gate on something another thread of the
//!   program decides (a pipe, a record lock, a child): `fork` would wait
//!   for it.
//! - A thread already inside the gate enters again without waiting
//!   (a per-thread depth), so nesting and signal handlers never wait for
//!   their own thread.
//! - A `fork` made from inside the gate (by a signal handler that
//!   interrupted the library) cannot close it: the child is marked
//!   ([`child_is_unsafe`]) and its hooks must pass every call straight on.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use rustix::thread::futex;

/// Set while a `fork` closes the gate; the low bits count the threads
/// inside.
const FORKING: u32 = 1 << 31;

static WORD: AtomicU32 = AtomicU32::new(0);

/// Set in a child forked while its forking thread was inside the gate.
static UNSAFE_CHILD: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// How many [`Held`]s this thread has (the gate is entered at 0 -> 1).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// This thread closed the gate for a `fork` now in progress.
    static CLOSER: Cell<bool> = const { Cell::new(false) };
}

fn wait(seen: u32) {
    // EAGAIN (the word moved) and EINTR both mean: look again.
    let _ = futex::wait(&WORD, futex::Flags::PRIVATE, seen, None);
}

fn wake_all() {
    // The kernel reads the count as an int: i32::MAX is "all".
    let _ = futex::wake(&WORD, futex::Flags::PRIVATE, i32::MAX as u32);
}

/// This thread's presence in the gate; leaves it when the last one drops.
/// Not `Send`: it counts for the thread that made it.
#[must_use]
pub struct Held {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Enters the gate (waiting while a `fork` is in progress, unless this
/// thread is already inside).
#[inline]
pub fn hold() -> Held {
    let depth = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n
    });
    if depth == 0 {
        enter();
    }
    Held {
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for Held {
    #[inline]
    fn drop(&mut self) {
        let left = DEPTH.with(|d| {
            let n = d.get() - 1;
            d.set(n);
            n
        });
        if left == 0 {
            leave();
            crate::signal::replay();
        }
    }
}

#[inline]
fn enter() {
    let mut v = WORD.load(Ordering::Relaxed);
    loop {
        if v & FORKING != 0 {
            wait(v);
            v = WORD.load(Ordering::Relaxed);
            continue;
        }
        match WORD.compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => v = now,
        }
    }
}

#[inline]
fn leave() {
    if WORD.fetch_sub(1, Ordering::Release) == FORKING | 1 {
        // The last one out while a fork waits.
        wake_all();
    }
}

/// This thread is inside the gate.
#[inline]
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() != 0)
}

/// Before the real `fork`: closes the gate and waits until no other thread
/// is inside. Returns `false` (and closes nothing) when this thread itself
/// is inside: the child is then marked unsafe. When it returns `true`, the
/// calling thread holds the gate alone (its own [`hold`]s nest) until
/// [`after_fork_parent`] or [`after_fork_child`].
pub fn close_for_fork() -> bool {
    if inside() {
        return false;
    }
    let mut v = WORD.load(Ordering::Relaxed);
    loop {
        if v & FORKING != 0 {
            // Another thread's fork: wait for it to end.
            wait(v);
            v = WORD.load(Ordering::Relaxed);
            continue;
        }
        match WORD.compare_exchange_weak(v, v | FORKING, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => v = now,
        }
    }
    loop {
        let v = WORD.load(Ordering::Acquire);
        if v == FORKING {
            break;
        }
        wait(v);
    }
    DEPTH.with(|d| d.set(1));
    CLOSER.with(|c| c.set(true));
    true
}

/// Runs `f` with the gate closed by this thread (no other thread inside
/// the library meanwhile), as around an `exec` or a `posix_spawn` that
/// moves descriptors the other threads may be using. Runs `f` with the
/// gate as it is when this thread is inside already.
pub fn exclusive<R>(f: impl FnOnce() -> R) -> R {
    let closed = close_for_fork();
    let r = f();
    if closed {
        after_fork_parent();
    }
    r
}

/// This thread closed the gate for a `fork` in progress.
pub fn closing_thread() -> bool {
    CLOSER.with(|c| c.get())
}

/// In the parent after `fork` (or after a `fork` that failed): opens the
/// gate again.
pub fn after_fork_parent() {
    if !CLOSER.with(|c| c.replace(false)) {
        return;
    }
    DEPTH.with(|d| d.set(0));
    WORD.fetch_and(!FORKING, Ordering::Release);
    wake_all();
    crate::signal::replay();
}

/// In the child after `fork`: the child's only thread is this one, so the
/// gate is simply open (the other threads counted in it do not exist
/// here). `closed` says whether the parent's thread had closed the gate;
/// if not, the child is marked unsafe.
pub fn after_fork_child(closed: bool) {
    CLOSER.with(|c| c.set(false));
    if closed {
        DEPTH.with(|d| d.set(0));
        WORD.store(0, Ordering::Release);
    } else {
        UNSAFE_CHILD.store(true, Ordering::Release);
    }
}

/// This process is a child forked while its forking thread was inside the
/// library: the library's locks may be held by threads that do not exist
/// here, so its hooks pass every call straight on.
#[inline]
pub fn child_is_unsafe() -> bool {
    UNSAFE_CHILD.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The gate is one per process: its tests run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn nested_holds_enter_once() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = hold();
        let b = hold();
        assert_eq!(DEPTH.with(|d| d.get()), 2);
        drop(b);
        assert!(inside());
        drop(a);
        assert!(!inside());
    }

    #[test]
    fn close_waits_for_holders_and_blocks_new_ones() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, rx) = std::sync::mpsc::channel();
        let release = Arc::new(AtomicBool::new(false));
        let r2 = release.clone();
        let holder = std::thread::spawn(move || {
            let _h = hold();
            tx.send(()).unwrap();
            while !r2.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
        });
        rx.recv().unwrap();
        let closed = Arc::new(AtomicBool::new(false));
        let c2 = closed.clone();
        let closer = std::thread::spawn(move || {
            assert!(close_for_fork());
            c2.store(true, Ordering::SeqCst);
            // A newcomer must wait until the gate opens again.
            let entered = Arc::new(AtomicBool::new(false));
            let e2 = entered.clone();
            let newcomer = std::thread::spawn(move || {
                let _h = hold();
                e2.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!entered.load(Ordering::SeqCst), "entered a closed gate");
            after_fork_parent();
            newcomer.join().unwrap();
            assert!(entered.load(Ordering::SeqCst));
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !closed.load(Ordering::SeqCst),
            "closed with a thread inside"
        );
        release.store(true, Ordering::SeqCst);
        holder.join().unwrap();
        closer.join().unwrap();
        assert!(closed.load(Ordering::SeqCst));
    }

    #[test]
    fn a_thread_inside_cannot_close() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let _h = hold();
        assert!(!close_for_fork());
    }
}
