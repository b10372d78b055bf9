//! A table indexed by descriptor number whose lookups never wait.
//!
//! Each number has a slot holding an `Arc` (an `arc_swap::ArcSwapOption`):
//! a lookup is an atomic load that no writer blocks, and a store or a swap
//! never allocates, so a signal handler may file a descriptor (see
//! [`crate::retire`] for the reference it lets go of). The slots of a
//! static table are address space until touched: a program's numbers are
//! small, and only their pages become memory.
//!
//! What a scan sees: [`FdSlots::for_each`] visits the numbers below a
//! high-water mark, raised (release) before a slot is filled, so a scan
//! that starts after a store (acquire) reaches its slot. A count of the
//! filled slots answers [`FdSlots::is_empty`] without a scan.
//!
//! Memory ordering, which the `loom` tests below check (with a slot made of
//! loom's mutex, which stands for `ArcSwapOption`: both are linearisable):
//! `RUSTFLAGS="--cfg loom" cargo test -p mapfs-interpose --release --lib
//! fdslots`.

#[cfg(loom)]
use loom::sync::atomic::AtomicUsize;
#[cfg(not(loom))]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One slot: `ArcSwapOption`, or under loom a mutex with the same
/// (linearisable) load and swap.
#[cfg(not(loom))]
struct Slot<T>(arc_swap::ArcSwapOption<T>);

#[cfg(not(loom))]
impl<T> Slot<T> {
    // Only the initialiser of the table's array (each use is a new slot).
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Self = Slot(arc_swap::ArcSwapOption::const_empty());

    fn load(&self) -> Option<Arc<T>> {
        self.0.load_full()
    }

    fn swap(&self, v: Option<Arc<T>>) -> Option<Arc<T>> {
        self.0.swap(v)
    }
}

#[cfg(loom)]
struct Slot<T>(loom::sync::Mutex<Option<Arc<T>>>);

#[cfg(loom)]
impl<T> Slot<T> {
    fn new() -> Self {
        Slot(loom::sync::Mutex::new(None))
    }

    fn load(&self) -> Option<Arc<T>> {
        self.0.lock().unwrap().clone()
    }

    fn swap(&self, v: Option<Arc<T>>) -> Option<Arc<T>> {
        std::mem::replace(&mut *self.0.lock().unwrap(), v)
    }
}

/// `N` slots of `Arc<T>`, by descriptor number.
pub struct FdSlots<T, const N: usize> {
    slots: [Slot<T>; N],
    /// Every filled slot's number is below this.
    high: AtomicUsize,
    /// Filled slots.
    filled: AtomicUsize,
}

impl<T, const N: usize> FdSlots<T, N> {
    /// An empty table (usable in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        FdSlots {
            slots: [const { Slot::EMPTY }; N],
            high: AtomicUsize::new(0),
            filled: AtomicUsize::new(0),
        }
    }

    /// An empty table (loom's atomics cannot be made in a `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        FdSlots {
            slots: std::array::from_fn(|_| Slot::new()),
            high: AtomicUsize::new(0),
            filled: AtomicUsize::new(0),
        }
    }

    /// The value filed under `fd` (never waits).
    #[inline]
    pub fn get(&self, fd: usize) -> Option<Arc<T>> {
        self.slots.get(fd)?.load()
    }

    /// Files `v` under `fd` (or empties the slot), returning what was
    /// there. Never allocates. A number past the table holds nothing.
    pub fn swap(&self, fd: usize, v: Option<Arc<T>>) -> Option<Arc<T>> {
        let slot = self.slots.get(fd)?;
        let filling = v.is_some();
        if filling {
            // Before the store: a scan that sees the value reaches it.
            self.high.fetch_max(fd + 1, Ordering::Release);
        }
        let old = slot.swap(v);
        match (old.is_some(), filling) {
            (false, true) => {
                self.filled.fetch_add(1, Ordering::AcqRel);
            }
            (true, false) => {
                self.filled.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        old
    }

    /// Calls `f` for every filled slot, in number order. Values filed or
    /// removed during the scan may or may not be seen.
    pub fn for_each(&self, mut f: impl FnMut(usize, Arc<T>)) {
        let high = self.high.load(Ordering::Acquire).min(N);
        for (fd, slot) in self.slots[..high].iter().enumerate() {
            if let Some(v) = slot.load() {
                f(fd, v);
            }
        }
    }

    /// No slot is filled.
    pub fn is_empty(&self) -> bool {
        self.filled.load(Ordering::Acquire) == 0
    }
}

#[cfg(not(loom))]
impl<T, const N: usize> Default for FdSlots<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn files_finds_and_scans() {
        static T: FdSlots<u32, 64> = FdSlots::new();
        assert!(T.is_empty());
        assert!(T.swap(7, Some(Arc::new(70))).is_none());
        assert!(T.swap(3, Some(Arc::new(30))).is_none());
        assert_eq!(T.get(7).as_deref(), Some(&70));
        assert_eq!(T.swap(7, Some(Arc::new(71))).as_deref(), Some(&70));
        let mut seen = Vec::new();
        T.for_each(|fd, v| seen.push((fd, *v)));
        assert_eq!(seen, vec![(3, 30), (7, 71)]);
        assert_eq!(T.swap(3, None).as_deref(), Some(&30));
        assert_eq!(T.swap(7, None).as_deref(), Some(&71));
        assert!(T.is_empty());
        assert!(T.swap(64, Some(Arc::new(1))).is_none(), "past the end");
        assert!(T.get(64).is_none());
        assert!(T.is_empty());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;

    fn collect(t: &FdSlots<u32, 4>) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        t.for_each(|fd, v| out.push((fd, *v)));
        out
    }

    /// A value filed before a flag another thread sees is found by that
    /// thread, by lookup and by scan.
    #[test]
    fn a_published_value_is_seen() {
        loom::model(|| {
            let t = Arc::new(FdSlots::<u32, 4>::new());
            let flag = Arc::new(AtomicBool::new(false));
            let (t2, f2) = (t.clone(), flag.clone());
            let w = loom::thread::spawn(move || {
                t2.swap(2, Some(Arc::new(20)));
                f2.store(true, Ordering::Release);
            });
            if flag.load(Ordering::Acquire) {
                assert_eq!(t.get(2).as_deref(), Some(&20));
                assert_eq!(collect(&t), vec![(2, 20)]);
                assert!(!t.is_empty());
            }
            w.join().unwrap();
            assert_eq!(collect(&t), vec![(2, 20)]);
        });
    }

    /// Two threads filing and emptying slots at once leave the count of
    /// filled slots equal to what the slots hold.
    #[test]
    fn the_count_follows_racing_swaps() {
        loom::model(|| {
            let t = Arc::new(FdSlots::<u32, 4>::new());
            t.swap(1, Some(Arc::new(1)));
            let (a, b) = (t.clone(), t.clone());
            let x = loom::thread::spawn(move || {
                a.swap(1, None);
                a.swap(3, Some(Arc::new(3)));
            });
            let y = loom::thread::spawn(move || {
                b.swap(1, Some(Arc::new(11)));
            });
            x.join().unwrap();
            y.join().unwrap();
            let held = collect(&t).len();
            assert_eq!(t.filled.load(Ordering::Acquire), held);
            assert!(t.get(3).is_some());
        });
    }
}
