//! A sequence lock over a few words: one writer at a time, readers that
//! never wait and never write shared memory.
//!
//! For records a data call reads on every `pread` (the preload shim's
//! direct-read record of a lent descriptor): a reader loads the words,
//! does its work, and checks that the sequence number did not move; if
//! it did, it throws its answer away and takes a slower path. A reader
//! never blocks, so it is safe in a signal handler and in a child just
//! forked.
//!
//! Memory ordering, which the `loom` tests below check (run them with
//! `RUSTFLAGS="--cfg loom" cargo test -p mapfs-interpose --release --lib
//! seqlock`):
//! - the writer makes the number odd, then a release fence, then the
//!   words, then the even number with release: no CPU can show a reader
//!   the new words with the old even number;
//! - the reader loads the number with acquire, the words, then an acquire
//!   fence before loading the number again: if both loads see the same
//!   even number, the words are the ones written before it.

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU32, AtomicU64};

/// `N` words behind a sequence number.
pub struct SeqLock<const N: usize> {
    seq: AtomicU32,
    words: [AtomicU64; N],
}

/// What a reader saw: the words, and the sequence number to check them
/// against once the reader has used them ([`SeqLock::still`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen<const N: usize> {
    seq: u32,
    /// The words as written by one [`SeqLock::write`].
    pub words: [u64; N],
}

impl<const N: usize> SeqLock<N> {
    /// A lock holding zeros (usable in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        SeqLock {
            seq: AtomicU32::new(0),
            words: [const { AtomicU64::new(0) }; N],
        }
    }

    /// A lock holding zeros (loom's atomics cannot be made in a `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        SeqLock {
            seq: AtomicU32::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Replaces the words. Writers exclude each other by spinning on the
    /// odd number: a write is a handful of stores, and writers are rare
    /// (an open lent or handed back).
    pub fn write(&self, words: [u64; N]) {
        let mut s = self.seq.load(Ordering::Relaxed);
        loop {
            if s & 1 == 0 {
                match self.seq.compare_exchange_weak(
                    s,
                    s.wrapping_add(1),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => s = now,
                }
            } else {
                spin();
                s = self.seq.load(Ordering::Relaxed);
            }
        }
        // The odd number before the words, on every CPU: the acquiring CAS
        // alone lets weakly ordered ones make the words visible first, so
        // a reader could take new words with the old even number.
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The words, or `None` while a write is under way.
    pub fn read(&self) -> Option<Seen<N>> {
        let seq = self.seq.load(Ordering::Acquire);
        let mut words = [0u64; N];
        for (v, w) in words.iter_mut().zip(&self.words) {
            *v = w.load(Ordering::Relaxed);
        }
        let seen = Seen { seq, words };
        (seq & 1 == 0 && self.still(&seen)).then_some(seen)
    }

    /// True when no write began since `seen` was read: what the reader did
    /// with its words stands.
    pub fn still(&self, seen: &Seen<N>) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seen.seq
    }
}

#[cfg(not(loom))]
impl<const N: usize> Default for SeqLock<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
fn spin() {
    std::hint::spin_loop();
}

#[cfg(loom)]
fn spin() {
    loom::thread::yield_now();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_sees_later_writes() {
        let l = SeqLock::<3>::new();
        let a = l.read().expect("no write under way");
        assert_eq!(a.words, [0, 0, 0]);
        l.write([1, 2, 3]);
        assert!(!l.still(&a), "a write since must void the old reading");
        let b = l.read().expect("no write under way");
        assert_eq!(b.words, [1, 2, 3]);
        assert!(l.still(&b));
    }

    /// Readers on other threads never see words of two different writes,
    /// whatever they race (each write's words are one value repeated).
    #[test]
    fn readers_never_mix_two_writes() {
        let l = std::sync::Arc::new(SeqLock::<4>::new());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut checked = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(s) = l.read() {
                            if l.still(&s) {
                                assert!(s.words.iter().all(|&w| w == s.words[0]), "{s:?}");
                                checked += 1;
                            }
                        }
                    }
                    checked
                })
            })
            .collect();
        for v in 1..200_000u64 {
            l.write([v; 4]);
        }
        stop.store(true, Ordering::Relaxed);
        let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(checked > 0, "no reading was checked");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Every interleaving (and every reordering the C++ memory model
    /// allows) of one writer and one reader: a reading that `still` holds
    /// has the words of exactly one write.
    #[test]
    fn a_kept_reading_is_one_write() {
        loom::model(|| {
            let l = Arc::new(SeqLock::<2>::new());
            let w = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    l.write([1, 1]);
                    l.write([2, 2]);
                })
            };
            if let Some(s) = l.read() {
                if l.still(&s) {
                    assert_eq!(s.words[0], s.words[1], "words of two writes: {s:?}");
                }
            }
            w.join().unwrap();
            let s = l.read().expect("writer done");
            assert_eq!(s.words, [2, 2]);
        });
    }

    /// Two writers exclude each other: the words end as one of the two
    /// writes, never a mix.
    #[test]
    fn writers_exclude_each_other() {
        loom::model(|| {
            let l = Arc::new(SeqLock::<2>::new());
            let other = {
                let l = l.clone();
                loom::thread::spawn(move || l.write([7, 7]))
            };
            l.write([9, 9]);
            other.join().unwrap();
            let s = l.read().expect("writers done");
            assert_eq!(s.words[0], s.words[1], "{s:?}");
        });
    }
}
