//! Values a signal handler let go of, dropped later.
//!
//! A hook that runs in a signal handler must not free memory: the handler
//! may have interrupted the program inside `malloc` or `free`, whose locks
//! and lists are then mid-change. When such a hook removes the last
//! reference to a shared value (a table entry of a descriptor it closes),
//! it parks the reference here instead ([`Retired::park`]: atomic stores
//! only), and the next call into the library outside a handler drops it
//! ([`Retired::drain`]).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

/// Up to `N` parked references to values of type `T`.
pub struct Retired<T, const N: usize> {
    slots: [AtomicPtr<T>; N],
    /// How many slots are taken (a fast "none" for [`Retired::drain`]).
    taken: AtomicUsize,
}

impl<T, const N: usize> Default for Retired<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Retired<T, N> {
    /// An empty list.
    pub const fn new() -> Self {
        Retired {
            slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            taken: AtomicUsize::new(0),
        }
    }

    /// Parks `value` without freeing anything. When every slot is taken the
    /// reference is leaked instead (the value is never dropped): a few
    /// bytes lost, never memory freed inside a handler.
    pub fn park(&self, value: Arc<T>) {
        let raw = Arc::into_raw(value).cast_mut();
        for slot in &self.slots {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    raw,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.taken.fetch_add(1, Ordering::Release);
                return;
            }
        }
        // Leaked on purpose: see above.
    }

    /// Drops every parked reference (outside any signal handler).
    pub fn drain(&self) {
        if self.taken.load(Ordering::Acquire) == 0 {
            return;
        }
        for slot in &self.slots {
            let raw = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if raw.is_null() {
                continue;
            }
            self.taken.fetch_sub(1, Ordering::Release);
            // SAFETY: `raw` came from `Arc::into_raw` in `park`, and the
            // swap took it out of the slot, so it is released once.
            drop(unsafe { Arc::from_raw(raw) });
        }
    }

    /// How many references are parked.
    pub fn len(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }

    /// Nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T, const N: usize> Drop for Retired<T, N> {
    fn drop(&mut self) {
        self.drain();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parked_values_live_until_drained() {
        let r: Retired<String, 2> = Retired::new();
        let v = Arc::new("entry".to_string());
        r.park(v.clone());
        assert_eq!(Arc::strong_count(&v), 2, "parking drops nothing");
        assert_eq!(r.len(), 1);
        r.drain();
        assert_eq!(Arc::strong_count(&v), 1, "draining drops the reference");
        assert!(r.is_empty());
    }

    #[test]
    fn a_full_list_leaks_rather_than_frees() {
        let r: Retired<u32, 1> = Retired::new();
        let a = Arc::new(1);
        let b = Arc::new(2);
        r.park(a.clone());
        r.park(b.clone());
        assert_eq!(
            Arc::strong_count(&b),
            2,
            "the overflow is leaked, not dropped"
        );
        r.drain();
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(Arc::strong_count(&b), 2, "a leaked reference stays");
    }
}
