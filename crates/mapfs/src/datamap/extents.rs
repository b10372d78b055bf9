//! [`Extents`]: a sorted set of non-overlapping extents, kept in a B-tree.
//!
//! A plfs map written N-1 strided holds tens of thousands of extents, and
//! the kernel's write-back lands each new one in their middle: kept in a
//! sorted vector, every such write moved half the vector (a fifth of the
//! daemon's time, measured with `perf`, while other writers waited on the
//! map's lock). In a B-tree an insert costs a few node visits whatever the
//! map's size. Encoded, the set is the sorted sequence of its extents, as
//! the vector it replaces was (the control protocol does not change).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Extent;

/// Extents sorted by logical offset, never overlapping, never empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extents(BTreeMap<u64, Extent>);

impl Extents {
    /// An empty set.
    pub fn new() -> Extents {
        Extents(BTreeMap::new())
    }

    /// A set of `v`, which the caller has checked to be sorted and
    /// non-overlapping.
    pub(super) fn from_sorted(v: Vec<Extent>) -> Extents {
        Extents(v.into_iter().map(|e| (e.logical, e)).collect())
    }

    /// Number of extents.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is no extent.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The extents in logical order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Extent> + ExactSizeIterator + Clone {
        self.0.values()
    }

    /// The first extent.
    pub fn first(&self) -> Option<&Extent> {
        self.0.values().next()
    }

    /// The last extent (the one ending last).
    pub fn last(&self) -> Option<&Extent> {
        self.0.values().next_back()
    }

    /// The extents, in logical order, in a vector.
    pub fn to_vec(&self) -> Vec<Extent> {
        self.0.values().copied().collect()
    }

    /// The extents that end after `off`, in logical order (the first may
    /// start before it).
    pub(super) fn ending_after(&self, off: u64) -> impl Iterator<Item = &Extent> + '_ {
        // Only the last extent starting at or before `off` can reach past
        // it; every later one starts after it.
        let from = match self.0.range(..=off).next_back() {
            Some((&k, e)) if e.logical_end() > off => k,
            _ => off.saturating_add(1),
        };
        self.0.range(from..).map(|(_, e)| e)
    }

    /// The pieces inside logical `start..end`, each cut to it.
    pub(super) fn pieces_in(&self, start: u64, end: u64) -> impl Iterator<Item = Extent> + '_ {
        self.ending_after(start)
            .take_while(move |e| e.logical < end)
            .map(move |e| e.slice(e.logical.max(start), e.logical_end().min(end)))
    }

    /// Cuts logical `start..end` out (splitting extents that straddle a
    /// bound) and returns the removed pieces, sorted.
    pub fn remove_range(&mut self, start: u64, end: u64) -> Vec<Extent> {
        let mut removed = Vec::new();
        self.cut(start, end, Some(&mut removed));
        removed
    }

    /// [`Self::remove_range`], handing the removed pieces to `removed` when
    /// asked for.
    fn cut(&mut self, start: u64, end: u64, mut removed: Option<&mut Vec<Extent>>) {
        if start >= end {
            return;
        }
        let hit: Vec<Extent> = self
            .ending_after(start)
            .take_while(|e| e.logical < end)
            .copied()
            .collect();
        for e in hit {
            self.0.remove(&e.logical);
            if e.logical < start {
                self.put(e.slice(e.logical, start));
            }
            if e.logical_end() > end {
                self.put(e.slice(end, e.logical_end()));
            }
            if let Some(out) = removed.as_deref_mut() {
                out.push(e.slice(e.logical.max(start), e.logical_end().min(end)));
            }
        }
    }

    fn put(&mut self, e: Extent) {
        self.0.insert(e.logical, e);
    }

    /// Maps `e` (which must not be empty), shadowing whatever covered its
    /// range before, and merges it with neighbours it continues.
    pub fn insert(&mut self, e: Extent) {
        // An in-place overwrite re-records the mapping it already has.
        if let Some(cur) = self.ending_after(e.logical).next() {
            if cur.logical <= e.logical
                && e.logical_end() <= cur.logical_end()
                && cur.file == e.file
                && cur.offset + (e.logical - cur.logical) == e.offset
            {
                return;
            }
        }
        self.cut(e.logical, e.logical_end(), None);
        let mut e = e;
        if let Some((_, prev)) = self.0.range_mut(..e.logical).next_back() {
            if prev.continues_into(&e) {
                prev.len += e.len;
                e = *prev;
            }
        }
        if let Some(next) = self.0.get(&e.logical_end()).copied() {
            if e.continues_into(&next) {
                self.0.remove(&next.logical);
                e.len += next.len;
            }
        }
        self.put(e);
    }
}

impl<'a> IntoIterator for &'a Extents {
    type Item = &'a Extent;
    type IntoIter = std::collections::btree_map::Values<'a, u64, Extent>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.values()
    }
}

impl PartialEq<[Extent]> for Extents {
    fn eq(&self, other: &[Extent]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<const N: usize> PartialEq<[Extent; N]> for Extents {
    fn eq(&self, other: &[Extent; N]) -> bool {
        *self == other[..]
    }
}

impl Serialize for Extents {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Extents {
    /// Decodes the sorted sequence; one out of order or overlapping the one
    /// before is refused (a B-tree would otherwise sort it silently, or
    /// drop one of two at the same offset, and hide a broken map from
    /// [`super::DataMap::validate`]).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<Extent>::deserialize(d)?;
        if v.windows(2).any(|w| w[1].logical < w[0].logical_end()) {
            return Err(serde::de::Error::custom(
                "extents out of order or overlapping",
            ));
        }
        Ok(Extents::from_sorted(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(logical: u64, offset: u64, len: u64) -> Extent {
        Extent {
            logical,
            file: 0,
            offset,
            len,
        }
    }

    #[test]
    fn encodes_as_the_sorted_sequence() {
        let v = vec![e(0, 100, 10), e(20, 0, 5)];
        let set = Extents::from_sorted(v.clone());
        assert_eq!(
            postcard::to_stdvec(&set).unwrap(),
            postcard::to_stdvec(&v).unwrap()
        );
        let back: Extents = postcard::from_bytes(&postcard::to_stdvec(&v).unwrap()).unwrap();
        assert_eq!(back, set);
        let bad = vec![e(0, 100, 10), e(5, 0, 5)];
        assert!(postcard::from_bytes::<Extents>(&postcard::to_stdvec(&bad).unwrap()).is_err());
    }

    #[test]
    fn inserts_split_shadow_and_merge() {
        let mut set = Extents::new();
        set.insert(e(0, 0, 10));
        set.insert(e(10, 10, 10));
        assert_eq!(set, [e(0, 0, 20)]);
        set.insert(e(5, 100, 5));
        assert_eq!(set, [e(0, 0, 5), e(5, 100, 5), e(10, 10, 10)]);
        set.insert(e(5, 5, 5));
        assert_eq!(set, [e(0, 0, 20)]);
        assert_eq!(set.remove_range(3, 7), vec![e(3, 3, 4)]);
        assert_eq!(set, [e(0, 0, 3), e(7, 7, 13)]);
        assert_eq!(
            set.pieces_in(2, 8).collect::<Vec<_>>(),
            vec![e(2, 2, 1), e(7, 7, 1)]
        );
    }
}
