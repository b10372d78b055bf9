//! Versions where the backing file system cannot share extents (ext4,
//! tmpfs): a write session whose cost is the bytes it changes.
//!
//! Copy on write in place. The writer's map is a [`Growth::Guarded`] map
//! over the backing file: every byte starts *read-only* (an extent of file
//! 1, a second descriptor of the same file, at its own offset), and a write
//! to one needs a remap. The remap ([`super::Versions`]'s) appends what the
//! backing file holds there, a whole [`GRANULE`] around the write, to the
//! version's undo object, and only then maps that range to file 0, where
//! this and later writes land in place, natively: in the daemon, or in the
//! program under `mapfs run` (the shim asks the daemon for the remap). So
//! the undo object plus the file as it is now always give back the file as
//! it was when the session began.
//!
//! What a write cannot do in place (a truncate, a punched hole) stays in the
//! writer's map until the session *settles*, at each `flush` and at
//! `release`: the bytes about to be cut or zeroed are saved first, then the
//! backing file is changed and its size set.
//!
//! Every writer of one file during a session shares the set of saved ranges:
//! a range is saved once, the first time any of them changes it, so the
//! undo holds the bytes from before the session even with several writers.

use std::fs::File;
use std::sync::Arc;

use mapfs::{DataMap, Extent, Growth, Result, Segment};
use parking_lot::Mutex;

use super::store::{Piece, Store};

/// What a remap saves and makes writable around a write: the write's range
/// rounded out to multiples of this. Larger granules mean fewer remaps
/// (each a request to the daemon under `mapfs run`, and a row update in the
/// store) and more bytes saved for a small change.
pub const GRANULE: u64 = 256 << 10;

/// The range a remap for a write of `offset..offset+len` makes writable
/// (never past the largest offset a file may have).
pub fn granted(offset: u64, len: u64) -> (u64, u64) {
    use mapfs::datamap::MAX_OFFSET;
    let offset = offset.min(MAX_OFFSET);
    let start = offset - offset % GRANULE;
    let end = offset
        .saturating_add(len.max(1))
        .saturating_add(GRANULE - 1);
    (start, (end - end % GRANULE).min(MAX_OFFSET))
}

/// Half-open ranges, sorted and disjoint.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// The ranges, sorted.
    pub fn spans(&self) -> &[(u64, u64)] {
        &self.0
    }

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

/// What a logical byte is in a map: a backing byte at a constant shift
/// (file, offset - logical), a hole, or past the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece_ {
    Data(u32, i128),
    Hole,
    Past,
}

/// The runs of `map` over `0..end`: (start, end, what).
fn runs(map: &DataMap, end: u64) -> Vec<(u64, u64, Piece_)> {
    let mut out = Vec::new();
    let mut at = 0;
    for seg in map.locate(0, end) {
        let what = match seg {
            Segment::Data { file, offset, .. } => Piece_::Data(file, offset as i128 - at as i128),
            Segment::Hole { .. } => Piece_::Hole,
        };
        out.push((at, at + seg.len(), what));
        at += seg.len();
    }
    if at < end {
        out.push((at, end, Piece_::Past));
    }
    out
}

/// The ranges of `0..end` where `prev` and `cur` differ: what a writer
/// changed between two settles.
pub fn changed(prev: &DataMap, cur: &DataMap, end: u64) -> Vec<(u64, u64)> {
    let (a, b) = (runs(prev, end), runs(cur, end));
    let mut out = Ranges::default();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        // A hole where the file ended is only growth: it zeroes nothing
        // that another writer may have put there meanwhile.
        let grown = a[i].2 == Piece_::Past && b[j].2 == Piece_::Hole;
        if lo < hi && a[i].2 != b[j].2 && !grown {
            out.insert(lo, hi);
        }
        if a[i].1 <= b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out.0
}

/// The map a writer of a session starts with: all of the file read-only
/// (file 1), written in place (file 0) once a remap saved it. With
/// `truncate`, the file is empty.
pub fn writer_map(size: u64, truncate: bool) -> Result<DataMap> {
    let (extents, size) = if truncate || size == 0 {
        (Vec::new(), 0)
    } else {
        (
            vec![Extent {
                logical: 0,
                file: 1,
                offset: 0,
                len: size,
            }],
            size,
        )
    };
    DataMap::new(extents, size, Growth::Guarded { file: 0 })
}

struct UndoState {
    saved: Ranges,
    pieces: Vec<Piece>,
    /// Where the next saved bytes go in the object (holes included).
    end: u64,
    /// Bytes the object holds (its holes are free).
    held: u64,
    /// The version did not fit in the store's byte limit and was dropped:
    /// nothing more is saved.
    given_up: bool,
}

/// The undo version of one session, shared by its writers.
pub struct Undo {
    /// The version's id.
    pub id: i64,
    /// The file's size when the session began.
    pub orig_size: u64,
    /// The file's path (for a version given up, [`Store::skip`]).
    path: Vec<u8>,
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
    pub fn new(id: i64, path: &[u8], orig_size: u64, obj: File) -> Arc<Undo> {
        Arc::new(Undo {
            id,
            orig_size,
            path: path.to_vec(),
            obj,
            state: Mutex::new(UndoState {
                saved: Ranges::default(),
                pieces: Vec::new(),
                end: 0,
                held: 0,
                given_up: false,
            }),
        })
    }

    /// True when nothing was changed yet.
    pub fn is_empty(&self) -> bool {
        self.state.lock().pieces.is_empty()
    }

    /// Saves the bytes of `backing` in `ranges` (clipped to the size at the
    /// start of the session) not saved before.
    ///
    /// Bytes past the file's end now are gone: whoever cut them saved them
    /// first if they were this version's (a settle saves into every undo
    /// version of its session). They are counted as saved, so that bytes
    /// written there later are never taken for the version's.
    ///
    /// Only the bytes `backing` holds are copied (its holes stay holes in
    /// the object), after [`Store::reserve`] found room for them; when it
    /// did not, the version is given up ([`Store::skip`]) and the writes
    /// go ahead without it.
    pub fn save(&self, store: &Store, backing: &File, ranges: &[(u64, u64)]) -> Result<()> {
        let mut st = self.state.lock();
        if st.given_up {
            return Ok(());
        }
        let before = st.held;
        let now = backing.metadata()?.len();
        let mut need = 0;
        // Without a limit nothing is reserved: no need to look for data.
        for &(a, b) in ranges.iter().filter(|_| store.is_limited()) {
            let (a, b) = (a.min(self.orig_size), b.min(self.orig_size));
            for (x, y) in st.saved.missing(a, b) {
                let there = y.min(now);
                if x < there {
                    need += super::clone::allocated(backing, x, there - x)?;
                }
            }
        }
        if !store.reserve(need)? {
            st.given_up = true;
            return store.skip(self.path.as_slice(), need, Some(self.id));
        }
        let res = self.save_reserved(&mut st, store, backing, ranges, now, before);
        store.unreserve(need);
        res
    }

    fn save_reserved(
        &self,
        st: &mut UndoState,
        store: &Store,
        backing: &File,
        ranges: &[(u64, u64)],
        now: u64,
        before: u64,
    ) -> Result<()> {
        let end_before = st.end;
        for &(a, b) in ranges {
            let (a, b) = (a.min(self.orig_size), b.min(self.orig_size));
            for (x, y) in st.saved.missing(a, b) {
                let there = y.min(now);
                if x < there {
                    let at = st.end;
                    // Read as it is, the range comes in through readahead
                    // (up to `read_ahead_kb` past it, 8 MiB on the VMs here)
                    // as large folios, and the 4 KiB writes that follow
                    // (the reason for the copy) each walked a whole folio's
                    // blocks in ext4: random writes under `mapfs run` ran
                    // 10-25% slower than into pages of their own
                    // (docs/versions.md).
                    let quiet = super::clone::NoReadahead::on(backing);
                    quiet.fetch(x, there - x);
                    st.held +=
                        super::clone::copy_sparse(backing, x, &self.obj, at, there - x, false)?;
                    drop(quiet);
                    let n = there - x;
                    match st.pieces.last_mut() {
                        // A writer going forwards saves one range after the
                        // next: one piece keeps the store's row small.
                        Some(p) if p.logical + p.len == x && p.at + p.len == at => p.len += n,
                        _ => st.pieces.push(Piece {
                            logical: x,
                            len: n,
                            at,
                        }),
                    }
                    st.end += n;
                }
                // Only once copied: a failed copy is tried again next time.
                st.saved.insert(x, y);
            }
        }
        if st.end > end_before {
            // Not synced per close (that would cost more than the copy it
            // replaces): a crash before the backing file system writes the
            // saved bytes out can leave this version incomplete
            // (docs/versions.md, Limits).
            store.set_pieces(self.id, &st.pieces, st.held, st.held - before)?;
        }
        Ok(())
    }
}

/// Makes `backing` (`files[0]`; `files[1]` is the same file, the writer map's
/// read-only ranges) hold what
/// a writer changed from `prev` (its map at its last settle) to `map`,
/// saving first what that overwrites into every undo version being
/// filled (`undos`: a session may have begun several). Only this writer's changes are
/// applied, so writers of one session do not undo each other's bytes; a
/// shrink is applied only when this writer shrank the file.
pub fn settle(
    undos: &[Arc<Undo>],
    store: &Store,
    prev: &DataMap,
    map: &DataMap,
    files: &[Arc<File>],
) -> Result<()> {
    let backing = &files[0];
    let cur = backing.metadata()?.len();
    let end = map.size().max(prev.size());
    let todo = changed(prev, map, end);
    if todo.is_empty() {
        // Growth alone (an ftruncate up) needs only the size.
        if map.size() > cur && map.size() > prev.size() {
            backing.set_len(map.size())?;
        }
        return Ok(());
    }
    let shrink = map.size() < prev.size() && map.size() < cur;
    let mut overwritten = todo.clone();
    if shrink {
        overwritten.push((map.size(), cur));
    }
    for u in undos {
        u.save(store, backing, &overwritten)?;
    }
    if shrink || map.size() > cur {
        backing.set_len(map.size())?;
    }
    let old_end = if shrink { map.size() } else { cur };
    for &(a, b) in &todo {
        let b = b.min(map.size());
        if a >= b {
            continue;
        }
        let mut at = a;
        for seg in map.locate(a, b - a) {
            match seg {
                Segment::Data { file, offset, len } => {
                    let src = &files[file as usize];
                    // The backing file's own bytes at their place (a guarded
                    // map's, read-only or written in place) stay.
                    if !(offset == at && Arc::ptr_eq(src, backing)) {
                        super::clone::copy_range(src, offset, backing, at, len)?;
                    }
                }
                Segment::Hole { len } => zero(backing, at, len, old_end)?,
            }
            at += seg.len();
        }
    }
    Ok(())
}

/// Zeroes `len` bytes at `at` of `f`, whose bytes past `old_end` are zeros
/// already (it was just extended).
fn zero(f: &File, at: u64, len: u64, old_end: u64) -> Result<()> {
    let end = (at + len).min(old_end);
    if at >= end {
        return Ok(());
    }
    mapfs::engine::zero_backing(f, at, end - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_whole_granules_around_the_write() {
        assert_eq!(granted(0, 1), (0, GRANULE));
        assert_eq!(granted(GRANULE - 1, 2), (0, 2 * GRANULE));
        assert_eq!(granted(5 * GRANULE, 0), (5 * GRANULE, 6 * GRANULE));
        assert_eq!(
            granted(3 * GRANULE + 7, GRANULE),
            (3 * GRANULE, 5 * GRANULE)
        );
    }

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
        let start = writer_map(100, false).unwrap();
        let mut m = start.clone();
        assert!(changed(&start, &m, 100).is_empty());
        assert_eq!(m.place_write(10, 5), mapfs::Placement::NeedsRemap);
        m.unguard(10, 15);
        let p = m.place_write(10, 5);
        m.commit_write(10, 5, &p);
        assert_eq!(changed(&start, &m, 100), vec![(10, 15)]);
        let mid = m.clone();
        m.truncate(50);
        assert_eq!(changed(&start, &m, 100), vec![(10, 15), (50, 100)]);
        assert_eq!(changed(&mid, &m, 100), vec![(50, 100)]);
        m.truncate(70);
        assert_eq!(
            changed(&mid, &m, 100),
            vec![(50, 100)],
            "a hole where bytes were, then past the end"
        );
        assert_eq!(
            changed(
                &writer_map(100, true).unwrap(),
                &writer_map(100, true).unwrap(),
                100
            ),
            vec![]
        );
    }

    /// Saving a range reads only that range into the page cache (no
    /// readahead past it, whose large folios slowed the writes that come
    /// next), saves it byte for byte, and leaves the file's advice normal.
    #[test]
    fn a_saved_range_is_read_without_readahead() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        // Resident bytes of a file (util-linux's fincore): what the page
        // cache holds is not observable otherwise without unsafe code.
        fn resident(path: &std::path::Path) -> Option<u64> {
            let out = std::process::Command::new("fincore")
                .args(["--bytes", "--noheadings", "--output", "RES"])
                .arg(path)
                .output()
                .ok()?;
            String::from_utf8(out.stdout).ok()?.trim().parse().ok()
        }
        // /tmp may be tmpfs, whose pages are the file itself.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let store = Store::open(File::open(dir.path()).unwrap().as_fd(), true).unwrap();
        let size = 64 * GRANULE;
        let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let path = dir.path().join("live");
        let backing = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        backing.write_all_at(&bytes, 0).unwrap();
        backing.sync_all().unwrap();
        let _ = rustix::fs::fadvise(&backing, 0, None, rustix::fs::Advice::DontNeed);
        match resident(&path) {
            Some(0) => {}
            other => {
                eprintln!(
                    "SKIPPED a_saved_range_is_read_without_readahead: the page cache of {} \
                     cannot be emptied or read (fincore says {other:?}; tmpfs, or no \
                     util-linux-extra?)",
                    path.display()
                );
                return;
            }
        }
        let obj = tempfile::tempfile_in(dir.path()).unwrap();
        let undo = Undo::new(1, b"/live", size, obj.try_clone().unwrap());
        undo.save(&store, &backing, &[(4 * GRANULE, 5 * GRANULE)])
            .unwrap();
        assert_eq!(resident(&path), Some(GRANULE), "read more than the range");
        let mut saved = vec![0u8; GRANULE as usize];
        obj.read_exact_at(&mut saved, 0).unwrap();
        let g = GRANULE as usize;
        assert_eq!(saved, &bytes[4 * g..5 * g]);
        // Normal again: a read at the start brings readahead with it.
        let mut one = [0u8; 4096];
        backing.read_exact_at(&mut one, 0).unwrap();
        assert!(
            resident(&path).unwrap() > GRANULE + 4096,
            "readahead stayed off after the save"
        );
    }
}
