//! The locks of the interposition libraries: parking_lot's, taken inside
//! the fork gate ([`crate::gate`]), so that no thread holds or waits for
//! one of them when `fork` runs. Use these, never parking_lot's directly:
//! a lock the gate does not cover is a lock a forked child may inherit
//! held.

use std::ops::{Deref, DerefMut};

use crate::gate::{hold, Held};

/// A mutual-exclusion lock inside the fork gate.
pub struct Mutex<T: ?Sized>(parking_lot::Mutex<T>);

/// A held [`Mutex`]; the gate is left after the lock is released.
pub struct MutexGuard<'a, T: ?Sized> {
    // Field order is drop order: the lock first, then the gate.
    guard: parking_lot::MutexGuard<'a, T>,
    _held: Held,
}

impl<T> Mutex<T> {
    /// A new unlocked mutex.
    pub const fn new(v: T) -> Self {
        Mutex(parking_lot::Mutex::new(v))
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, entering the gate first.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let held = hold();
        MutexGuard {
            guard: self.0.lock(),
            _held: held,
        }
    }

    /// Locks if free, without waiting for the lock (the gate may still be
    /// waited for while a fork runs).
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let held = hold();
        self.0
            .try_lock()
            .map(|guard| MutexGuard { guard, _held: held })
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A reader-writer lock inside the fork gate.
pub struct RwLock<T: ?Sized>(parking_lot::RwLock<T>);

/// A [`RwLock`] held for reading.
pub struct RwLockReadGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockReadGuard<'a, T>,
    _held: Held,
}

/// A [`RwLock`] held for writing.
pub struct RwLockWriteGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> RwLock<T> {
    /// A new unlocked lock.
    pub const fn new(v: T) -> Self {
        RwLock(parking_lot::RwLock::new(v))
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Locks for reading, entering the gate first.
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let held = hold();
        RwLockReadGuard {
            guard: self.0.read(),
            _held: held,
        }
    }

    /// Locks for writing, entering the gate first.
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let held = hold();
        RwLockWriteGuard {
            guard: self.0.write(),
            _held: held,
        }
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_holds_the_gate() {
        let m = Mutex::new(1);
        assert!(!crate::gate::inside());
        {
            let g = m.lock();
            assert_eq!(*g, 1);
            assert!(crate::gate::inside());
            // The rule the fork plumbing relies on: a thread holding a
            // lock cannot close the gate.
            assert!(!crate::gate::close_for_fork());
        }
        assert!(!crate::gate::inside());
        let l = RwLock::new(2);
        assert_eq!(*l.read(), 2);
        *l.write() = 3;
        assert_eq!(*l.read(), 3);
        assert!(!crate::gate::inside());
    }
}
