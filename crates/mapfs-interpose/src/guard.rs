//! The reentrancy guard of a library's hooks: held while the library does
//! its own work on a thread, so that libc calls made meanwhile (by std, the
//! allocator, a file system) go straight on instead of back into the
//! hooks. Holding it holds the fork gate ([`crate::gate`]).
//!
//! [`Guard::enter`] answers `None`, and the hook must then make the plain
//! call on the program's descriptor, taking no lock and allocating
//! nothing, when:
//! - the thread is already inside, or holds a lock of the library (a
//!   signal handler interrupted the library, or the library called
//!   itself): entering would wait for the thread itself;
//! - the process is a child forked from inside the library
//!   ([`crate::gate::child_is_unsafe`]).
//!
//! A signal handler that interrupted the program outside the library
//! enters: no lock it needs is held by its own thread, so it waits at
//! most for other threads, which do not wait for it. Hooks that change
//! the descriptor table still do only lock-free bookkeeping there
//! ([`crate::signal::in_handler`]), so that a handler that interrupted
//! the allocator does not allocate.

use std::cell::Cell;
use std::mem::ManuallyDrop;

use crate::gate::{hold, Held};

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// See the module docs.
#[must_use]
pub struct Guard {
    held: ManuallyDrop<Held>,
}

impl Guard {
    /// Enters the library on this thread, or `None` (see the module docs).
    #[inline]
    pub fn enter() -> Option<Guard> {
        if crate::gate::child_is_unsafe() || INSIDE.with(|g| g.replace(true)) {
            return None;
        }
        if crate::gate::inside() && !crate::gate::closing_thread() {
            // A lock of the library is held on this thread (a handler
            // interrupted it, outside a guard).
            INSIDE.with(|g| g.set(false));
            return None;
        }
        Some(Guard {
            held: ManuallyDrop::new(hold()),
        })
    }

    /// Marks this thread inside without entering the gate: for the thread
    /// that closed the gate for a `fork` (it holds it alone already), and
    /// for a constructor, which runs before any other thread. Undone by
    /// [`Guard::leave_forced`].
    pub fn enter_forced() {
        INSIDE.with(|g| g.set(true));
    }

    /// Undoes [`Guard::enter_forced`].
    pub fn leave_forced() {
        INSIDE.with(|g| g.set(false));
        crate::signal::replay();
    }
}

/// This thread is inside the library.
#[inline]
pub fn inside() -> bool {
    INSIDE.with(|g| g.get())
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: dropped once, here; the field is never used again.
        unsafe { ManuallyDrop::drop(&mut self.held) };
        INSIDE.with(|g| g.set(false));
        crate::signal::replay();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_is_not_entered_twice_and_holds_the_gate() {
        let g = Guard::enter().expect("first entry");
        assert!(Guard::enter().is_none(), "entered twice on one thread");
        assert!(crate::gate::inside());
        drop(g);
        assert!(!inside());
        assert!(!crate::gate::inside());
        assert!(Guard::enter().is_some());
    }
}
