//! Versions where the backing file system cannot share extents (ext4,
//! tmpfs): a write session whose cost is the bytes it changes.
//!
//! The writer's map keeps every byte it has not written on the backing file
//! itself (extents of file 0 at their own offsets: *pristine*) and sends
//! every write to an anonymous log (file 1, `Growth::AppendLog`). Nothing
//! the writer does can touch a pristine byte. At each `flush` and at
//! `release` the session *settles*: the bytes about to be overwritten in the
//! backing file (changed ranges not saved yet) are appended, as they were,
//! to the version's undo object (synced), and only then are the new bytes
//! copied from the log into the backing file and its size set. So the undo
//! object plus the file as it is now always give back the file as it was
//! when the session began, and the backing file alone is always the current
//! content after a close (close-to-open).
//!
//! Every writer of one file during a session shares the set of saved ranges:
//! a range is saved once, the first time any of them changes it, so the
//! undo holds the bytes from before the session even with several writers.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use mapfs::{DataMap, Extent, Growth, Result, Segment};
use parking_lot::Mutex;

use super::store::{Piece, Store};

/// Half-open ranges, sorted and disjoint.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Adds `a..b`, merging.
    pub fn insert(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let (mut a, mut b) = (a, b);
        self.0.retain(|&(x, y)| {
            if y < a || x > b {
                true
            } else {
                a = a.min(x);
                b = b.max(y);
                false
            }
        });
        let i = self.0.partition_point(|&(x, _)| x < a);
        self.0.insert(i, (a, b));
    }

    /// The parts of `a..b` not in the set.
    pub fn missing(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = a;
        for &(x, y) in &self.0 {
            if y <= cur || x >= b {
                continue;
            }
            if x > cur {
                out.push((cur, x));
            }
            cur = cur.max(y);
        }
        if cur < b {
            out.push((cur, b));
        }
        out
    }
}

/// The ranges of `0..end` that `map` does not keep pristine (file 0 at the
/// same offset).
pub fn changed(map: &DataMap, end: u64) -> Vec<(u64, u64)> {
    let mut pristine = Ranges::default();
    for e in map.extents() {
        if e.file == 0 && e.offset == e.logical {
            pristine.insert(e.logical, e.logical_end());
        }
    }
    pristine.missing(0, end)
}

/// The map a writer of a session starts with: all of the file pristine,
/// writes to the log (file 1). With `truncate`, the file is empty.
pub fn writer_map(size: u64, truncate: bool) -> Result<DataMap> {
    let (extents, size) = if truncate || size == 0 {
        (Vec::new(), 0)
    } else {
        (
            vec![Extent {
                logical: 0,
                file: 0,
                offset: 0,
                len: size,
            }],
            size,
        )
    };
    DataMap::new(extents, size, Growth::AppendLog { file: 1, end: 0 })
}

struct UndoState {
    saved: Ranges,
    pieces: Vec<Piece>,
    end: u64,
}

/// The undo version of one session, shared by its writers.
pub struct Undo {
    /// The version's id.
    pub id: i64,
    /// The file's size when the session began.
    pub orig_size: u64,
    obj: File,
    state: Mutex<UndoState>,
}

impl std::fmt::Debug for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Undo").field("id", &self.id).finish()
    }
}

impl Undo {
    /// The undo of a session begun on a file of `orig_size` bytes.
    pub fn new(id: i64, orig_size: u64, obj: File) -> Arc<Undo> {
        Arc::new(Undo {
            id,
            orig_size,
            obj,
            state: Mutex::new(UndoState {
                saved: Ranges::default(),
                pieces: Vec::new(),
                end: 0,
            }),
        })
    }

    /// True when nothing was changed yet.
    pub fn is_empty(&self) -> bool {
        self.state.lock().pieces.is_empty()
    }

    /// Saves the bytes of `backing` in `ranges` not saved before.
    fn save(&self, store: &Store, backing: &File, ranges: &[(u64, u64)]) -> Result<()> {
        let mut st = self.state.lock();
        let mut added = false;
        for &(a, b) in ranges {
            let (a, b) = (a.min(self.orig_size), b.min(self.orig_size));
            for (x, y) in st.saved.missing(a, b) {
                let at = st.end;
                super::clone::copy_range(backing, x, &self.obj, at, y - x)?;
                st.pieces.push(Piece {
                    logical: x,
                    len: y - x,
                    at,
                });
                st.end += y - x;
                st.saved.insert(x, y);
                added = true;
            }
        }
        if added {
            // The old bytes are durable before any of them is overwritten.
            rustix::fs::fdatasync(&self.obj)?;
            store.set_pieces(self.id, &st.pieces, st.end)?;
        }
        Ok(())
    }

    /// Makes `backing` hold what `map` says (files: 0 the backing file, 1
    /// the writer's log), saving first what that overwrites.
    pub fn settle(&self, store: &Store, map: &DataMap, files: &[Arc<File>]) -> Result<()> {
        let backing = &files[0];
        let cur = backing.metadata()?.len();
        let end = map.size().max(cur).max(self.orig_size);
        let todo = changed(map, end);
        if todo.is_empty() && cur == map.size() {
            return Ok(());
        }
        self.save(store, backing, &todo)?;
        if cur != map.size() {
            backing.set_len(map.size())?;
        }
        for &(a, b) in &todo {
            let b = b.min(map.size());
            let mut at = a;
            for seg in map.locate(a, b.saturating_sub(a)) {
                match seg {
                    Segment::Data { file, offset, len } => {
                        if !(file == 0 && offset == at) {
                            super::clone::copy_range(
                                &files[file as usize],
                                offset,
                                backing,
                                at,
                                len,
                            )?;
                        }
                    }
                    Segment::Hole { len } => zero(backing, at, len, cur)?,
                }
                at += seg.len();
            }
        }
        Ok(())
    }
}

/// Zeroes `len` bytes at `at` of `f`, whose bytes past `old_end` are zeros
/// already (it was just extended).
fn zero(f: &File, at: u64, len: u64, old_end: u64) -> Result<()> {
    let end = (at + len).min(old_end);
    if at >= end {
        return Ok(());
    }
    let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
    if rustix::fs::fallocate(f, flags, at, end - at).is_ok() {
        return Ok(());
    }
    let buf = vec![0u8; ((end - at).min(1 << 20)) as usize];
    let mut off = at;
    while off < end {
        let n = buf.len().min((end - off) as usize);
        f.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_report_gaps() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 25);
        assert_eq!(r.0, vec![(10, 25), (30, 40)]);
        assert_eq!(r.missing(0, 50), vec![(0, 10), (25, 30), (40, 50)]);
        assert_eq!(r.missing(12, 24), vec![]);
        r.insert(0, 100);
        assert_eq!(r.0, vec![(0, 100)]);
    }

    #[test]
    fn changed_ranges_of_a_writer_map() {
        let mut m = writer_map(100, false).unwrap();
        assert!(changed(&m, 100).is_empty());
        let p = m.place_write(10, 5);
        m.commit_write(10, 5, &p);
        assert_eq!(changed(&m, 100), vec![(10, 15)]);
        m.truncate(50);
        assert_eq!(changed(&m, 100), vec![(10, 15), (50, 100)]);
    }
}
