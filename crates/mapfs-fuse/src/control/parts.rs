//! Maps too large for one packet ([`Request::MapPart`]): the parts a
//! connection sent, held until the `Release` or `Remap` that uses them.
//!
//! Bounded three times: [`MAX_MAP_BYTES`] per connection, [`MAX_HELD_PER_UID`]
//! over all connections of one user, and [`MAX_HELD`] over all connections
//! of users other than root and the mount's owner, so clients cannot make
//! the daemon hold more than that however many connect, and one user
//! spending all theirs refuses nobody else (six connections of one user
//! took the whole daemon-wide bound before, and root's next part was
//! refused). Root and the mount's owner have their own share each, outside
//! [`MAX_HELD`]: at most `MAX_HELD + 2 * MAX_HELD_PER_UID` in all.
//!
//! [`Request::MapPart`]: mapfs::control::Request::MapPart

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use mapfs::control::MAX_MAP_BYTES;
use parking_lot::Mutex;

/// Most part bytes held over all connections of users other than root
/// and the mount's owner.
pub const MAX_HELD: usize = 4 * MAX_MAP_BYTES;

/// Most part bytes held over all connections of one user (a quarter of
/// [`MAX_HELD`]: one map's).
pub const MAX_HELD_PER_UID: usize = MAX_HELD / 4;

/// Part bytes held now, over all connections counted in [`MAX_HELD`].
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Part bytes held now, per user.
static HELD_BY: Mutex<Option<HashMap<u32, usize>>> = Mutex::new(None);

/// One connection's parts (at most one map's, for one handle).
#[derive(Debug, Default)]
pub struct MapParts {
    handle: u64,
    bytes: Vec<u8>,
    /// The connection's user.
    uid: u32,
    /// Root or the mount's owner: outside [`MAX_HELD`].
    own_share: bool,
}

impl MapParts {
    /// The parts of a connection of user `uid`; `own_share` for root and
    /// the mount's owner, whose parts others' cannot refuse.
    pub fn of(uid: u32, own_share: bool) -> MapParts {
        MapParts {
            handle: 0,
            bytes: Vec::new(),
            uid,
            own_share,
        }
    }

    /// Counts `n` more bytes held (or fewer, `sub`) for this connection's
    /// user, and in [`MAX_HELD`] unless it has its own share; `false`
    /// (nothing counted) where a bound would be passed.
    fn count(&self, n: usize, sub: bool) -> bool {
        let mut by = HELD_BY.lock();
        let by = by.get_or_insert_with(HashMap::new);
        let mine = by.get(&self.uid).copied().unwrap_or(0);
        if sub {
            let left = mine.saturating_sub(n);
            if left == 0 {
                by.remove(&self.uid);
            } else {
                by.insert(self.uid, left);
            }
            if !self.own_share {
                HELD.fetch_sub(n, Ordering::Relaxed);
            }
            return true;
        }
        if mine + n > MAX_HELD_PER_UID {
            return false;
        }
        if !self.own_share {
            let held = HELD.fetch_add(n, Ordering::Relaxed) + n;
            if held > MAX_HELD {
                HELD.fetch_sub(n, Ordering::Relaxed);
                return false;
            }
        }
        by.insert(self.uid, mine + n);
        true
    }

    /// Adds `more` to the parts for `handle` (dropping parts held for
    /// another handle first); `Err` with an errno when a bound would be
    /// passed, after dropping what was held.
    pub fn add(&mut self, handle: u64, more: &[u8]) -> Result<(), i32> {
        if handle != self.handle {
            self.clear();
            self.handle = handle;
        }
        if self.bytes.len() + more.len() > MAX_MAP_BYTES {
            self.clear();
            return Err(libc::EFBIG);
        }
        if !self.count(more.len(), false) {
            self.clear();
            return Err(libc::ENOMEM);
        }
        self.bytes.extend_from_slice(more);
        Ok(())
    }

    /// The parts sent for `handle`, taken (`None` if there are none).
    pub fn take(&mut self, handle: u64) -> Option<Vec<u8>> {
        if handle != self.handle || self.bytes.is_empty() {
            return None;
        }
        self.count(self.bytes.len(), true);
        Some(std::mem::take(&mut self.bytes))
    }

    /// Drops the parts held.
    pub fn clear(&mut self) {
        self.count(self.bytes.len(), true);
        self.bytes = Vec::new();
    }
}

impl Drop for MapParts {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_join_in_order_and_are_bounded() {
        let mut p = MapParts::default();
        p.add(3, b"ab").unwrap();
        p.add(3, b"cd").unwrap();
        assert_eq!(p.take(3).as_deref(), Some(&b"abcd"[..]));
        assert_eq!(p.take(3), None);
        p.add(3, b"xy").unwrap();
        p.add(4, b"z").unwrap();
        assert_eq!(p.take(3), None, "parts of another handle were dropped");
        assert_eq!(p.take(4).as_deref(), Some(&b"z"[..]));
        let big = vec![0u8; MAX_MAP_BYTES];
        p.add(5, &big).unwrap();
        assert_eq!(p.add(5, b"!"), Err(libc::EFBIG));
        assert_eq!(p.take(5), None, "a refused part drops the parts held");
    }

    /// One user's connections together hold at most their share; another
    /// user, and the mount's owner, are not refused meanwhile.
    #[test]
    fn one_user_spending_their_share_refuses_nobody_else() {
        let map = vec![0u8; MAX_MAP_BYTES];
        let mut greedy: Vec<MapParts> = (0..6).map(|_| MapParts::of(4242, false)).collect();
        assert_eq!(greedy[0].add(1, &map), Ok(()));
        for g in &mut greedy[1..] {
            assert_eq!(g.add(1, b"x"), Err(libc::ENOMEM), "past the user's share");
        }
        let mut other = MapParts::of(4243, false);
        assert_eq!(other.add(1, &map), Ok(()));
        // The mount's owner (or root), with a share of its own; a uid no
        // other test uses (the statics are the process's).
        let mut owner = MapParts::of(4244, true);
        assert_eq!(owner.add(1, &map), Ok(()));
        drop(greedy);
        let mut again = MapParts::of(4242, false);
        assert_eq!(
            again.add(2, &map),
            Ok(()),
            "a share comes back when dropped"
        );
        assert_eq!(other.take(1).map(|b| b.len()), Some(MAX_MAP_BYTES));
    }
}
