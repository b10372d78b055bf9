//! Maps too large for one packet ([`Request::MapPart`]): the parts a
//! connection sent, held until the `Release` or `Remap` that uses them.
//!
//! Bounded twice: [`MAX_MAP_BYTES`] per connection, and [`MAX_HELD`] over
//! all connections, so clients cannot make the daemon hold more than that
//! however many connect.
//!
//! [`Request::MapPart`]: mapfs::control::Request::MapPart

use std::sync::atomic::{AtomicUsize, Ordering};

use mapfs::control::MAX_MAP_BYTES;

/// Most part bytes held over all connections.
pub const MAX_HELD: usize = 4 * MAX_MAP_BYTES;

/// Part bytes held now, over all connections.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// One connection's parts (at most one map's, for one handle).
#[derive(Debug, Default)]
pub struct MapParts {
    handle: u64,
    bytes: Vec<u8>,
}

impl MapParts {
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
        let held = HELD.fetch_add(more.len(), Ordering::Relaxed) + more.len();
        if held > MAX_HELD {
            HELD.fetch_sub(more.len(), Ordering::Relaxed);
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
        HELD.fetch_sub(self.bytes.len(), Ordering::Relaxed);
        Some(std::mem::take(&mut self.bytes))
    }

    /// Drops the parts held.
    pub fn clear(&mut self) {
        HELD.fetch_sub(self.bytes.len(), Ordering::Relaxed);
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
}
