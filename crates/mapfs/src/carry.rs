//! Carrying an open's bytes from one map to another: what a client running
//! a lent map does when the daemon that lent it was replaced.
//!
//! The new daemon lends the same open again with the map the file system
//! persisted (the last map the client pushed), over a new log of its own.
//! The client's map may be newer: writes and truncates made since that
//! push, in the old lending's log, which the new daemon never handed out
//! and would refuse in a pushed map. [`carry_over`] makes the new lending
//! hold the client's changes by copying only the ranges where the two maps
//! differ (backing files compared by identity, since the two lendings
//! number them differently); the copies go through the new lending's engine,
//! into its log, so the map the client then pushes is one the daemon
//! accepts.
//!
//! The client's changes are what lies in its own log, its holes (cut by a
//! truncate) and its size. Pieces of other files in its map are what it was
//! lent, and are taken as the new lending has them: the new daemon's view is
//! as new or newer (other writers' closed writes), and a write-only lending
//! could not read them anyway (it is lent empty stand-ins for them).
//!
//! An in-place map (an M-to-1 slot) has no log: its client wrote into its
//! slot, so every byte it maps is its change. Each is copied where the new
//! lending does not already map the same backing bytes: a new lending of
//! the same slot takes over only the size, one of another slot (a slot the
//! dead daemon gave at the lending and no map recorded) gets every byte.
//!
//! A guarded map (copy on write in place) is like an in-place one, but the
//! new lending's map stops at the file's size when the new daemon opened
//! it: the bytes the client wrote in place beyond it are copied (the same
//! bytes, at the same place), and that needs the file system's remap
//! ([`carry_over_remapping`]).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use crate::datamap::{DataMap, Growth, Segment};
use crate::engine::{DataFile, Remap};
use crate::error::{Error, Result};

/// Largest piece copied at once.
const CHUNK: u64 = 1 << 20;

/// Makes `into` hold what `from`'s lending changed (see the module docs):
/// the bytes of `from`'s own log and its holes where the maps differ, and its
/// size. Returns the bytes copied.
///
/// Writes use `into`'s growth policy; a map that cannot place them without
/// the file system's `remap` fails with `EOPNOTSUPP`.
pub fn carry_over(from: &DataFile, into: &DataFile) -> Result<u64> {
    carry_over_remapping(from, into, &mut |_: &DataMap, _: u64, _: u64| {
        Err(Error::from_errno(libc::EOPNOTSUPP))
    })
}

/// [`carry_over`], asking `remap` (the file system's, through the daemon)
/// for writes `into`'s map cannot place.
pub fn carry_over_remapping(from: &DataFile, into: &DataFile, remap: Remap<'_>) -> Result<u64> {
    let (old, old_files) = from.snapshot();
    let own = match old.growth() {
        Growth::AppendLog { file, .. } => Some(file),
        _ => None,
    };
    let in_place = matches!(
        old.growth(),
        Growth::InPlace { .. } | Growth::Guarded { .. }
    ) && !old.is_whole_file();
    let old_ids = identities(&old_files);
    let size = old.size();
    if into.size()? > size {
        into.truncate(size)?;
    }
    let (new, new_files) = into.snapshot();
    let new_ids = identities(&new_files);
    let mut copied = 0;
    let mut at = 0;
    for seg in old.locate(0, size) {
        let len = seg.len();
        let changed_here = match seg {
            Segment::Data { file, .. } => in_place || Some(file) == own,
            Segment::Hole { .. } => true,
        };
        if changed_here && !maps_alike(&seg, at, &new, &old_ids, &new_ids) {
            if let Segment::Hole { .. } = seg {
                if at + len == size {
                    // The end: cut there and grow again, which reads as
                    // zeros, sets the size, and needs no space (an
                    // in-place map's may end below a size a truncate set).
                    into.truncate(at)?;
                    into.truncate(size)?;
                } else {
                    // Unmapped, not written: a hole costs the log nothing.
                    into.fallocate(libc::FALLOC_FL_ZERO_RANGE, at, len)?;
                }
            } else {
                copy(from, into, at, len, remap)?;
                copied += len;
            }
        }
        at += len;
    }
    if into.size()? < size {
        // The end maps alike but the size grew (a truncate past both).
        into.truncate(size)?;
    }
    Ok(copied)
}

/// True when both opens append to the same log file: the same daemon lent
/// the same open again (the client's connection, not the daemon, was
/// replaced). Nothing must be carried then: `into` would append where
/// `from` already wrote, over the bytes being carried; `from`'s map is
/// one the daemon accepts as it is.
pub fn same_log(from: &DataFile, into: &DataFile) -> bool {
    let log = |df: &DataFile| {
        let (map, files) = df.snapshot();
        match map.growth() {
            Growth::AppendLog { file, .. } => {
                identities(&files).get(file as usize).copied().flatten()
            }
            _ => None,
        }
    };
    log(from).is_some() && log(from) == log(into)
}

/// A file's `(st_dev, st_ino)`; `None` when it cannot be told (never alike).
type Identity = Option<(u64, u64)>;

fn identities(files: &[Arc<File>]) -> Vec<Identity> {
    files
        .iter()
        .map(|f| f.metadata().ok().map(|m| (m.dev(), m.ino())))
        .collect()
}

/// True when `new` maps the logical bytes of `seg` (starting at `at`) to
/// the same backing bytes, or to zeros as well.
fn maps_alike(
    seg: &Segment,
    at: u64,
    new: &DataMap,
    old_ids: &[Identity],
    new_ids: &[Identity],
) -> bool {
    let id = |ids: &[Identity], file: u32| ids.get(file as usize).copied().flatten();
    let mut pos = at;
    for s in new.locate(at, seg.len()) {
        let alike = match (*seg, s) {
            (Segment::Hole { .. }, Segment::Hole { .. }) => true,
            (
                Segment::Data { file, offset, .. },
                Segment::Data {
                    file: nfile,
                    offset: noffset,
                    ..
                },
            ) => {
                id(old_ids, file).is_some()
                    && id(old_ids, file) == id(new_ids, nfile)
                    && noffset == offset + (pos - at)
            }
            _ => false,
        };
        if !alike {
            return false;
        }
        pos += s.len();
    }
    pos == at + seg.len()
}

/// Copies `len` logical bytes at `at` from `from` into `into`.
fn copy(from: &DataFile, into: &DataFile, at: u64, len: u64, remap: Remap<'_>) -> Result<()> {
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        let got = from.read(at + done, &mut buf[..n])?;
        // The map says the bytes are there; a short read means a backing
        // file shorter than its extents, which reads as zeros.
        buf[got..n].fill(0);
        let mut written = 0;
        while written < n {
            written += into.write(at + done + written as u64, &buf[written..n], remap)?;
        }
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datamap::Extent;
    use crate::fs::Opened;
    use proptest::prelude::*;

    fn no_remap(_: &DataMap, _: u64, _: u64) -> Result<Opened> {
        Err(Error::from_errno(libc::EOPNOTSUPP))
    }

    /// An append-log lending whose own log is a fresh file, over `shared`
    /// (the files both lendings can see, e.g. the container's other logs).
    fn lending(map_extents: Vec<Extent>, size: u64, shared: &[Arc<File>]) -> DataFile {
        let own = shared.len() as u32;
        let mut files = shared.to_vec();
        files.push(Arc::new(tempfile::tempfile().unwrap()));
        let map = DataMap::new(map_extents, size, Growth::AppendLog { file: own, end: 0 }).unwrap();
        DataFile::new(Opened {
            map,
            files,
            handle: 0,
        })
    }

    fn contents(df: &DataFile) -> Vec<u8> {
        let size = df.size().unwrap() as usize;
        let mut buf = vec![0u8; size];
        let mut done = 0;
        while done < size {
            let n = df.read(done as u64, &mut buf[done..]).unwrap();
            assert!(n > 0, "short read at {done} of {size}");
            done += n;
        }
        buf
    }

    fn write(df: &DataFile, at: u64, data: &[u8]) {
        assert_eq!(df.write(at, data, &mut no_remap).unwrap(), data.len());
    }

    #[test]
    fn only_what_changed_since_the_push_is_copied() {
        // The pushed state: 8 KiB in a shared log (the old lending's log,
        // which the new lending sees as a file of the container).
        let log = tempfile::tempfile().unwrap();
        std::os::unix::fs::FileExt::write_all_at(&log, &[7u8; 8192], 0).unwrap();
        let shared = vec![Arc::new(log)];
        let pushed = vec![Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 8192,
        }];
        // Old lending: the pushed map over the shared log plus a write of
        // its own since (into a log of its own, as the old daemon lent it).
        let old = lending(pushed.clone(), 8192, &shared);
        write(&old, 100, b"since the push");
        let new = lending(pushed, 8192, &shared);
        let copied = carry_over(&old, &new).unwrap();
        assert_eq!(copied, 14, "only the write since the push is copied");
        assert_eq!(contents(&new), contents(&old));
    }

    #[test]
    fn pieces_of_other_files_stay_as_the_new_lending_has_them() {
        // A write-only lending is lent an empty stand-in for every file but
        // its log: what reads as zeros there must not be carried.
        let real = tempfile::tempfile().unwrap();
        std::os::unix::fs::FileExt::write_all_at(&real, &[9u8; 4096], 0).unwrap();
        let piece = vec![Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 4096,
        }];
        let old = lending(
            piece.clone(),
            4096,
            &[Arc::new(tempfile::tempfile().unwrap())],
        );
        write(&old, 4096, &[5u8; 100]);
        let new = lending(piece, 4096, &[Arc::new(real)]);
        assert_eq!(carry_over(&old, &new).unwrap(), 100);
        let got = contents(&new);
        assert_eq!(got.len(), 4196);
        assert!(
            got[..4096].iter().all(|&b| b == 9),
            "the piece was overwritten"
        );
        assert!(got[4096..].iter().all(|&b| b == 5));
    }

    #[test]
    fn a_lending_of_the_same_log_is_told_apart() {
        let a = lending(vec![], 0, &[]);
        let b = lending(vec![], 0, &[]);
        assert!(!same_log(&a, &b), "two logs");
        let (map, files) = a.snapshot();
        let again = DataFile::new(Opened {
            map,
            files,
            handle: 0,
        });
        assert!(same_log(&a, &again), "one log lent twice");
    }

    #[test]
    fn truncates_and_holes_are_carried() {
        let old = lending(vec![], 0, &[]);
        write(&old, 0, &[1u8; 5000]);
        let new = lending(vec![], 0, &[]);
        write(&new, 0, &[2u8; 9000]);
        old.truncate(3000).unwrap();
        old.truncate(7000).unwrap();
        carry_over(&old, &new).unwrap();
        let got = contents(&new);
        assert_eq!(got.len(), 7000);
        assert_eq!(got, contents(&old));
        assert!(got[3000..].iter().all(|&b| b == 0));
    }

    /// An in-place lending: a slot of `cap` bytes at `off` of `pack`.
    fn slot(pack: &Arc<File>, off: u64, cap: u64) -> DataFile {
        let ext = vec![Extent {
            logical: 0,
            file: 0,
            offset: off,
            len: cap,
        }];
        let map = DataMap::new(ext, 0, Growth::InPlace { limit: Some(cap) }).unwrap();
        DataFile::new(Opened {
            map,
            files: vec![pack.clone()],
            handle: 0,
        })
    }

    #[test]
    fn an_in_place_writer_carries_what_grew_and_what_moved() {
        let pack = Arc::new(tempfile::tempfile().unwrap());
        // Pushed: 100 bytes in the slot at 4096. Since: a rewrite inside and
        // growth to 300 bytes.
        let old = slot(&pack, 4096, 512);
        write(&old, 0, &[1u8; 100]);
        let pushed = old.map();
        write(&old, 50, &[2u8; 250]);
        assert_eq!(old.size().unwrap(), 300);
        // Lent again on the same slot, as pushed: the bytes are in place
        // already; only the size comes over.
        let files = old.files();
        let same = DataFile::new(Opened {
            map: pushed,
            files,
            handle: 0,
        });
        carry_over(&old, &same).unwrap();
        assert_eq!(contents(&same), contents(&old));
        // Lent again on another slot (the new daemon never saw the first
        // one): every byte is copied there.
        let other = slot(&pack, 8192, 512);
        assert_eq!(carry_over(&old, &other).unwrap(), 300);
        assert_eq!(contents(&other), contents(&old));
        let mut raw = vec![0u8; 300];
        std::os::unix::fs::FileExt::read_exact_at(&*pack, &mut raw, 8192).unwrap();
        assert_eq!(raw, contents(&old), "the bytes are in the new slot");
        // A truncate past the slot's capacity: the size comes over, as
        // zeros past the bytes.
        old.truncate(2000).unwrap();
        let again = slot(&pack, 8192, 512);
        carry_over(&old, &again).unwrap();
        assert_eq!(contents(&again), contents(&old));
        assert_eq!(again.size().unwrap(), 2000);
    }

    proptest! {
        /// Whatever the two lendings did, `into` ends up reading as `from`.
        #[test]
        fn carried_reads_as_the_source(
            ops in proptest::collection::vec((0u64..20_000, 1usize..3000, any::<u8>(), any::<bool>()), 1..25),
            split in 0usize..25,
        ) {
            let old = lending(vec![], 0, &[]);
            let new = lending(vec![], 0, &[]);
            for (i, &(at, len, byte, trunc)) in ops.iter().enumerate() {
                // Ops before `split` happen in both (the pushed state as
                // the new daemon knows it, though in another log).
                let targets: &[&DataFile] = if i < split { &[&old, &new] } else { &[&old] };
                for df in targets {
                    if trunc {
                        df.truncate(at).unwrap();
                    } else {
                        write(df, at, &vec![byte; len]);
                    }
                }
            }
            carry_over(&old, &new).unwrap();
            prop_assert_eq!(contents(&new), contents(&old));
        }
    }
}
