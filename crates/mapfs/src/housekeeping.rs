//! The bell a file system rings when it leaves work for
//! [`FileSystem::housekeeping`](crate::FileSystem::housekeeping).
//!
//! A daemon that woke its housekeeping thread on a timer woke it twenty
//! times a second for a mount nobody used. A file system that takes the
//! bell ([`Housekeeping::bell`](crate::Housekeeping::bell))
//! rings it as it queues work, and the thread sleeps until then.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the housekeeping thread is to do, in rising order of urgency: a
/// later ring never lowers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// Nothing: sleep until rung.
    Idle,
    /// Run after the file system's round, gathering what more comes.
    Soon,
    /// Run as soon as the thread is free.
    Now,
    /// The instance stops serving: the thread ends.
    Stop,
}

/// Wakes the daemon's housekeeping thread. Clones ring the same bell.
#[derive(Clone, Debug)]
pub struct Bell(Arc<(Mutex<Due>, Condvar)>);

impl Default for Bell {
    fn default() -> Self {
        Bell(Arc::new((Mutex::new(Due::Idle), Condvar::new())))
    }
}

impl Bell {
    /// A bell nobody has rung.
    pub fn new() -> Self {
        Self::default()
    }

    /// Work is waiting: housekeeping runs within the file system's round
    /// ([`Housekeeping::every`](crate::Housekeeping::every)),
    /// and does in one call what else is queued by then. Cheap when already
    /// rung (no wake-up).
    pub fn soon(&self) {
        self.raise(Due::Soon);
    }

    /// Work is waiting that should not wait for the round (a full batch).
    pub fn now(&self) {
        self.raise(Due::Now);
    }

    /// The instance stops serving: the thread ends instead of running again.
    pub fn stop(&self) {
        self.raise(Due::Stop);
    }

    fn raise(&self, to: Due) {
        let mut due = self.due();
        if *due < to {
            *due = to;
            self.0 .1.notify_all();
        }
    }

    fn due(&self) -> MutexGuard<'_, Due> {
        // The state is one enum, whole whatever a panicking holder did.
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For the housekeeping thread: sleeps until work is due, `round`
    /// after a [`Bell::soon`] or at once after a [`Bell::now`]. True: run
    /// housekeeping now; false: [`Bell::stop`] was rung.
    pub fn wait(&self, round: Duration) -> bool {
        let cv = &self.0 .1;
        let mut due = self.due();
        let mut deadline: Option<Instant> = None;
        loop {
            match *due {
                Due::Stop => return false,
                Due::Now => {
                    *due = Due::Idle;
                    return true;
                }
                Due::Soon => {
                    let at = *deadline.get_or_insert_with(|| Instant::now() + round);
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        *due = Due::Idle;
                        return true;
                    }
                    due = cv
                        .wait_timeout(due, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                Due::Idle => due = cv.wait(due).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUND: Duration = Duration::from_millis(40);

    #[test]
    fn soon_waits_a_round_and_now_does_not() {
        let bell = Bell::new();
        bell.soon();
        let t = Instant::now();
        assert!(bell.wait(ROUND));
        assert!(t.elapsed() >= ROUND, "soon ran after {:?}", t.elapsed());
        bell.soon();
        bell.now();
        let t = Instant::now();
        assert!(bell.wait(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_ring_from_another_thread_wakes_the_sleeper_and_stop_ends_it() {
        let bell = Bell::new();
        let ringer = bell.clone();
        let woken = std::thread::spawn(move || {
            let mut runs = 0;
            while bell.wait(Duration::ZERO) {
                runs += 1;
            }
            runs
        });
        std::thread::sleep(ROUND);
        ringer.now();
        // Let the sleeper take that ring before the stop overrides it.
        let t = Instant::now();
        while *ringer.due() != Due::Idle && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        ringer.stop();
        ringer.soon();
        assert_eq!(woken.join().unwrap(), 1);
    }

    #[test]
    fn an_unrung_bell_sleeps() {
        let bell = Bell::new();
        let sleeper = bell.clone();
        let woke = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = woke.clone();
        let t = std::thread::spawn(move || {
            let run = sleeper.wait(Duration::ZERO);
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            run
        });
        std::thread::sleep(4 * ROUND);
        assert!(!woke.load(std::sync::atomic::Ordering::SeqCst));
        bell.stop();
        assert!(!t.join().unwrap());
    }
}
