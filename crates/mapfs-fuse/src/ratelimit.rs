//! Log lines a client can cause, bounded: a flood of refused connections
//! or bad requests must not fill the disk under the daemon's log.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One log site that writes at most one line per interval and says how many
/// it held back since the last.
#[derive(Debug)]
pub struct RateLimited {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Option<Instant>,
    held_back: u64,
}

impl RateLimited {
    /// A site writing at most one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        RateLimited {
            interval,
            state: Mutex::new(State {
                last: None,
                held_back: 0,
            }),
        }
    }

    /// Calls `log` with the number of lines held back since the last one
    /// written, if a line may be written now; otherwise counts this one.
    /// Returns whether `log` ran.
    pub fn log(&self, log: impl FnOnce(u64)) -> bool {
        let held_back = {
            let mut s = self.state.lock();
            let now = Instant::now();
            if s.last
                .is_some_and(|t| now.duration_since(t) < self.interval)
            {
                s.held_back += 1;
                return false;
            }
            s.last = Some(now);
            std::mem::take(&mut s.held_back)
        };
        log(held_back);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_within_the_interval_and_counts() {
        let site = RateLimited::new(Duration::from_millis(200));
        let mut seen = Vec::new();
        for _ in 0..1000 {
            site.log(|n| seen.push(n));
        }
        assert_eq!(seen, vec![0]);
        std::thread::sleep(Duration::from_millis(250));
        site.log(|n| seen.push(n));
        assert_eq!(seen, vec![0, 999]);
    }
}
