//! What a client may push as the map of a lent open ([`Request::Release`]):
//! only what its own writes and truncates can make of the map it was lent.
//!
//! A lent writer appends to its own log and may cut or shadow older pieces,
//! so every extent of the map it pushes either lies in that log, within the
//! bytes written to it, or is a piece of an extent of the map the daemon
//! holds for the open (same file, same logical-to-backing shift). Anything
//! else would let a client splice bytes it never wrote, from files it was
//! never lent, into what other readers see.
//!
//! [`Request::Release`]: mapfs::control::Request::Release

use std::fs::File;

use mapfs::datamap::Segment;
use mapfs::{DataMap, Extent, Growth};

/// Checks `pushed` against the open's current map `base` and its backing
/// `files`; `Err` says what is wrong.
pub fn check(
    base: &DataMap,
    files: &[std::sync::Arc<File>],
    pushed: &DataMap,
) -> Result<(), String> {
    pushed
        .validate()
        .map_err(|e| format!("malformed map: {e}"))?;
    if pushed.is_whole_file() {
        return Err("a lent open's map cannot become whole-file".into());
    }
    if let Growth::InPlace { .. } | Growth::Guarded { .. } = base.growth() {
        return check_in_place(base, pushed);
    }
    let Growth::AppendLog { file: own, .. } = base.growth() else {
        return Err("the open was lent read-only".into());
    };
    let Growth::AppendLog {
        file: pushed_own,
        end,
    } = pushed.growth()
    else {
        return Err("the map's growth policy changed".into());
    };
    if pushed_own != own {
        return Err("the map appends to another file than the open's log".into());
    }
    if pushed.reserved() != base.reserved() {
        return Err("the map's reserved space changed".into());
    }
    let log = files.get(own as usize).ok_or("the open's log is missing")?;
    let written = log
        .metadata()
        .map_err(|e| format!("cannot stat the open's log: {e}"))?
        .len();
    if end > written {
        return Err(format!(
            "the map's log end {end} is past the {written} bytes written to it"
        ));
    }
    for e in pushed.extents() {
        let ok = if e.file == own {
            e.offset.checked_add(e.len).is_some_and(|x| x <= written)
        } else {
            piece_of(base, e)
        };
        if !ok {
            return Err(format!(
                "extent {e:?} is neither in the open's log nor a piece of its map"
            ));
        }
    }
    Ok(())
}

/// An in-place writer (an M-to-1 slot) writes where its map already points
/// or where its last piece grows to, up to the limit: every extent and
/// reserved piece it pushes must lie in that space at the same shift, and
/// the growth policy must be the one it was lent. A guarded writer's space
/// is its extents and reserved pieces, each of its own file: a read-only
/// extent stays read-only (only the daemon's remap makes it writable).
fn check_in_place(base: &DataMap, pushed: &DataMap) -> Result<(), String> {
    if pushed.growth() != base.growth() {
        return Err("the map's growth policy changed".into());
    }
    let space = base.own_space();
    for e in pushed.extents().iter().chain(pushed.reserved()) {
        if !within(&space, e) {
            return Err(format!(
                "extent {e:?} lies outside the space the open was lent"
            ));
        }
    }
    Ok(())
}

/// True when every byte of `e` lies in `space` (sorted, disjoint pieces) at
/// the same backing offset.
fn within(space: &[Extent], e: &Extent) -> bool {
    let mut at = e.logical;
    let end = e.logical_end();
    // A guarded writer's space grows a piece per remap and every remap
    // pushes every extent: a scan from the start made an open's checks
    // quadratic (a sixth of the daemon's time in a 4 KiB random-write storm).
    let first = space.partition_point(|s| s.logical_end() <= at);
    for s in &space[first..] {
        if at >= end {
            break;
        }
        if s.logical_end() <= at {
            continue;
        }
        if s.logical > at || s.file != e.file {
            return false;
        }
        if s.offset.checked_add(at - s.logical) != e.offset.checked_add(at - e.logical) {
            return false;
        }
        at = s.logical_end().min(end);
    }
    at >= end
}

/// True when `e` maps exactly as `base` maps the same logical bytes.
fn piece_of(base: &DataMap, e: &Extent) -> bool {
    let mut at = e.logical;
    for seg in base.locate(e.logical, e.len) {
        match seg {
            Segment::Data { file, offset, len }
                if file == e.file && offset == e.offset + (at - e.logical) =>
            {
                at += len;
            }
            _ => return false,
        }
    }
    at == e.logical_end()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::*;

    fn ext(logical: u64, file: u32, offset: u64, len: u64) -> Extent {
        Extent {
            logical,
            file,
            offset,
            len,
        }
    }

    fn log_of(len: usize) -> Arc<File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![b'x'; len]).unwrap();
        Arc::new(f)
    }

    /// File 0: another open's log (100 bytes mapped at 0); file 1: this
    /// open's log.
    fn base() -> DataMap {
        DataMap::new(
            vec![ext(0, 0, 0, 100)],
            100,
            Growth::AppendLog { file: 1, end: 0 },
        )
        .unwrap()
    }

    #[test]
    fn own_writes_and_cuts_pass() {
        let files = vec![log_of(100), log_of(50)];
        let pushed = DataMap::new(
            vec![ext(0, 0, 0, 10), ext(10, 1, 0, 50), ext(60, 0, 60, 20)],
            80,
            Growth::AppendLog { file: 1, end: 50 },
        )
        .unwrap();
        check(&base(), &files, &pushed).unwrap();
    }

    #[test]
    fn forged_maps_are_refused() {
        let files = vec![log_of(100), log_of(50)];
        let growth = Growth::AppendLog { file: 1, end: 50 };
        // Bytes of the log never written.
        let past = DataMap::new(
            vec![ext(0, 1, 40, 20)],
            60,
            Growth::AppendLog { file: 1, end: 60 },
        )
        .unwrap();
        assert!(check(&base(), &files, &past).is_err());
        // Another file's bytes at another shift.
        let shifted = DataMap::new(vec![ext(0, 0, 10, 50)], 50, growth).unwrap();
        assert!(check(&base(), &files, &shifted).is_err());
        // Another file's bytes beyond what the map had.
        let beyond = DataMap::new(vec![ext(0, 0, 0, 200)], 200, growth).unwrap();
        assert!(check(&base(), &files, &beyond).is_err());
        // A file index that does not exist.
        let missing = DataMap::new(vec![ext(0, 5, 0, 10)], 10, growth).unwrap();
        assert!(check(&base(), &files, &missing).is_err());
        // The log end past what was written.
        let end = DataMap::new(
            vec![],
            0,
            Growth::AppendLog {
                file: 1,
                end: 1 << 40,
            },
        )
        .unwrap();
        assert!(check(&base(), &files, &end).is_err());
        // Writing into another open's log.
        let other = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
        assert!(check(&base(), &files, &other).is_err());
    }

    /// A slot of 64 bytes at offset 100 of file 0, 20 bytes mapped.
    fn slot() -> DataMap {
        DataMap::new(
            vec![ext(0, 0, 100, 20)],
            20,
            Growth::InPlace { limit: Some(64) },
        )
        .unwrap()
    }

    #[test]
    fn in_place_writes_within_the_slot_pass() {
        let files = vec![log_of(200)];
        let grown = DataMap::new(
            vec![ext(0, 0, 100, 64)],
            64,
            Growth::InPlace { limit: Some(64) },
        )
        .unwrap();
        check(&slot(), &files, &grown).unwrap();
        // A write past the end leaves a hole below it.
        let gap = DataMap::new(
            vec![ext(0, 0, 100, 10), ext(40, 0, 140, 10)],
            50,
            Growth::InPlace { limit: Some(64) },
        )
        .unwrap();
        check(&slot(), &files, &gap).unwrap();
        // Truncated to nothing: the space stays reserved.
        let cut = DataMap::new(
            vec![ext(0, 0, 100, 20)],
            0,
            Growth::InPlace { limit: Some(64) },
        )
        .unwrap();
        check(&slot(), &files, &cut).unwrap();
    }

    #[test]
    fn in_place_maps_outside_the_slot_are_refused() {
        let files = vec![log_of(200)];
        let limit = Growth::InPlace { limit: Some(64) };
        // Past the slot's capacity.
        let past = DataMap::new(vec![ext(0, 0, 100, 65)], 65, limit).unwrap();
        assert!(check(&slot(), &files, &past).is_err());
        // Another shift: bytes of the file before the slot.
        let shifted = DataMap::new(vec![ext(0, 0, 90, 20)], 20, limit).unwrap();
        assert!(check(&slot(), &files, &shifted).is_err());
        // Another backing file.
        let other = DataMap::new(vec![ext(0, 1, 100, 20)], 20, limit).unwrap();
        assert!(check(&slot(), &files, &other).is_err());
        // A bigger limit.
        let bigger = DataMap::new(
            vec![ext(0, 0, 100, 20)],
            20,
            Growth::InPlace { limit: Some(4096) },
        )
        .unwrap();
        assert!(check(&slot(), &files, &bigger).is_err());
        // A log instead.
        let log = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
        assert!(check(&slot(), &files, &log).is_err());
    }

    /// A guarded writer (copy on write in place) after `n` remaps: every
    /// other granule of 16 bytes made writable (file 0), the rest read-only
    /// (file 1, the same bytes kept for the version).
    fn guarded(n: u64) -> DataMap {
        let mut map = DataMap::new(
            vec![ext(0, 1, 0, 32 * n)],
            32 * n,
            Growth::Guarded { file: 0 },
        )
        .unwrap();
        for i in 0..n {
            map.unguard(32 * i, 32 * i + 16);
        }
        map
    }

    #[test]
    fn guarded_pieces_are_found_wherever_they_lie() {
        let files = vec![log_of(1 << 16), log_of(1 << 16)];
        let n = 500;
        let base = guarded(n);
        // The map as lent, and the writer's own writes anywhere in it.
        check(&base, &files, &base).unwrap();
        for i in [0, 1, n / 2, n - 1] {
            let one = DataMap::new(
                vec![ext(32 * i, 0, 32 * i, 16)],
                32 * n,
                Growth::Guarded { file: 0 },
            )
            .unwrap();
            check(&base, &files, &one).unwrap();
            // A read-only granule claimed writable, after the writable one.
            let forged = DataMap::new(
                vec![ext(32 * i, 0, 32 * i, 32)],
                32 * n,
                Growth::Guarded { file: 0 },
            )
            .unwrap();
            assert!(
                check(&base, &files, &forged).is_err(),
                "granule {i}: a read-only range passed as writable"
            );
            // The writable granule at another shift.
            let shifted = DataMap::new(
                vec![ext(32 * i, 0, 32 * i + 1, 16)],
                32 * n,
                Growth::Guarded { file: 0 },
            )
            .unwrap();
            assert!(check(&base, &files, &shifted).is_err());
        }
    }

    #[test]
    fn read_only_lendings_take_no_map() {
        let ro = DataMap::new(vec![ext(0, 0, 0, 100)], 100, Growth::ReadOnly).unwrap();
        let files = vec![log_of(100)];
        let forged = DataMap::new(vec![], 1 << 40, Growth::ReadOnly).unwrap();
        assert!(check(&ro, &files, &forged).is_err());
    }
}
