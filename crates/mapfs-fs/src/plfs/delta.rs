//! What one open changed: the difference between its map at open (`O`) and
//! its current map (`F`), which its dropping records (pure).
//!
//! Rule: for every byte range below `F.size` where `F` differs from `O`, the
//! dropping records `F`'s content there (bytes in the open's own log, or a
//! hole). Past `O.size`, holes of `F` are not differences (the open did not
//! write there; another writer may have). The size: `Set(F.size)` when the
//! open shrank the file (below `O.size`, or below the size its previous
//! dropping recorded: executors flush an open before shrinking it),
//! `GrowTo(F.size)` when it grew it, nothing when equal.
//! So two writers of disjoint ranges both survive whatever the order of their
//! droppings (the N-1 checkpoint case), and where they overlap the record
//! with the higher sequence number wins.
//!
//! Sequence numbers say when bytes were written, as closely as the file
//! system can tell without seeing the writes (they run in the executors):
//! - a range whose content is unchanged since the previous flush of the same
//!   open keeps its previous number;
//! - bytes of the open's own log below an [`Epoch`] watermark were written
//!   before that epoch's event (a truncate by someone else): they get the
//!   number just below the event's, so the truncate shadows them, while the
//!   open's later writes survive it, as on a local file;
//! - everything else (bytes written since, holes) gets the flush's fresh
//!   number;
//! - a size grown by a write dates from that write, so a later truncate by
//!   someone else undoes the growth too; a shrink through this open is itself
//!   a truncate event for the other writers.
//!
//! Precision: two opens writing overlapping bytes, both unflushed, are
//! ordered by their flushes (the later flushed wins), not by their writes:
//! the map holds no write times. Flushes of other opens are not epochs on
//! purpose: the flushing open's own bytes were written at unknown times
//! before its flush too, so either guess would be wrong as often.

use mapfs::{DataMap, Segment};

/// What a byte range holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Content {
    /// Zeros.
    Hole,
    /// Bytes of backing file `file` (an `Opened::files` index) from `offset`.
    Data {
        /// Backing file index.
        file: u32,
        /// Offset of the range's first byte in it.
        offset: u64,
    },
}

impl Content {
    /// The content `d` bytes further into the same run.
    fn skip(self, d: u64) -> Content {
        match self {
            Content::Hole => Content::Hole,
            Content::Data { file, offset } => Content::Data {
                file,
                offset: offset + d,
            },
        }
    }
}

/// One recorded range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// First logical byte.
    pub start: u64,
    /// Length (> 0).
    pub len: u64,
    /// What the open left there.
    pub content: Content,
    /// Sequence number of the record.
    pub seq: u64,
}

/// How the open changed the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SizeRule {
    /// Shrunk to exactly this.
    Set(u64),
    /// Grown to at least this.
    GrowTo(u64),
}

/// Everything a dropping of one open records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Delta {
    /// Changed ranges, sorted, disjoint.
    pub pieces: Vec<Piece>,
    /// Size change and its sequence number.
    pub size: Option<(SizeRule, u64)>,
}

impl Delta {
    /// True when the open changed nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.size.is_none()
    }
}

/// An event seen while this open was writing: its own log was `len` bytes
/// long when a truncate (by another open, `truncate(2)` or `O_TRUNC`) got
/// sequence number `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Epoch {
    /// Own log length at the event.
    pub len: u64,
    /// The event's sequence number.
    pub seq: u64,
}

/// The sequence number of new bytes at `offset` of the own log: just below
/// the first event that found them written, or `new_seq`.
fn seq_of_offset(epochs: &[Epoch], offset: u64, new_seq: u64) -> u64 {
    let i = epochs.partition_point(|e| e.len <= offset);
    epochs.get(i).map_or(new_seq, |e| e.seq.saturating_sub(1))
}

/// `(start, len, content)` runs covering `0..map.size()`.
fn runs(map: &DataMap) -> Vec<(u64, u64, Content)> {
    let mut pos = 0;
    let mut out = Vec::new();
    for seg in map.locate(0, map.size()) {
        let c = match seg {
            Segment::Data { file, offset, .. } => Content::Data { file, offset },
            Segment::Hole { .. } => Content::Hole,
        };
        out.push((pos, seg.len(), c));
        pos += seg.len();
    }
    out
}

/// The content at `pos`, `None` past the runs.
fn content_at(runs: &[(u64, u64, Content)], pos: u64) -> Option<Content> {
    let i = runs.partition_point(|r| r.0 + r.1 <= pos);
    runs.get(i)
        .filter(|r| r.0 <= pos)
        .map(|r| r.2.skip(pos - r.0))
}

/// The recorded content and sequence number at `pos`.
fn piece_at(pieces: &[Piece], pos: u64) -> Option<(Content, u64)> {
    let i = pieces.partition_point(|p| p.start + p.len <= pos);
    pieces
        .get(i)
        .filter(|p| p.start <= pos)
        .map(|p| (p.content.skip(pos - p.start), p.seq))
}

/// The delta of `now` against `open`, reusing the sequence numbers of
/// `prev` (the last flushed delta of the same open) where nothing changed,
/// numbering new bytes of the own log (backing file `own`) by `epochs`
/// (sorted by `len`), and `new_seq` elsewhere.
pub(super) fn delta(
    open: &DataMap,
    now: &DataMap,
    prev: &Delta,
    own: u32,
    epochs: &[Epoch],
    new_seq: u64,
) -> Delta {
    let o = runs(open);
    let f = runs(now);
    let end = now.size();
    let mut cuts = vec![0, end];
    for r in o.iter().chain(&f) {
        cuts.extend([r.0, r.0 + r.1]);
    }
    // Own-log runs split where an epoch watermark falls inside them.
    for r in &f {
        if let Content::Data { file, offset } = r.2 {
            if file == own {
                for e in epochs {
                    if e.len > offset && e.len < offset + r.1 {
                        cuts.push(r.0 + (e.len - offset));
                    }
                }
            }
        }
    }
    for p in &prev.pieces {
        cuts.extend([p.start, p.start + p.len]);
    }
    cuts.retain(|c| *c <= end);
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces: Vec<Piece> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let fc = content_at(&f, a).unwrap_or(Content::Hole);
        let differs = match content_at(&o, a) {
            None => fc != Content::Hole,
            Some(oc) => oc != fc,
        };
        if !differs {
            continue;
        }
        let seq = match (piece_at(&prev.pieces, a), fc) {
            (Some((c, s)), _) if c == fc => s,
            (_, Content::Data { file, offset }) if file == own => {
                seq_of_offset(epochs, offset, new_seq)
            }
            _ => new_seq,
        };
        if let Some(last) = pieces.last_mut() {
            if last.start + last.len == a && last.seq == seq && last.content.skip(last.len) == fc {
                last.len += b - a;
                continue;
            }
        }
        pieces.push(Piece {
            start: a,
            len: b - a,
            content: fc,
            seq,
        });
    }
    // The size this open last recorded stands while its map keeps it; below
    // it, the open truncated: a truncate for everyone, even above the size
    // it found at open.
    let recorded = prev.size.map(|(r, _)| match r {
        SizeRule::Set(n) | SizeRule::GrowTo(n) => n,
    });
    let size_now = now.size();
    let rule = if recorded == Some(size_now) {
        prev.size.map(|(r, _)| r)
    } else if size_now < open.size() || recorded.is_some_and(|n| size_now < n) {
        Some(SizeRule::Set(size_now))
    } else if size_now > open.size() {
        Some(SizeRule::GrowTo(size_now))
    } else {
        None
    };
    let size = rule.map(|r| match (prev.size, r) {
        (Some((p, s)), _) if p == r => (r, s),
        // Growth by a write dates from that write (so a truncate by someone
        // else after it also undoes the growth); other growth (an extending
        // truncate) from this flush.
        (_, SizeRule::GrowTo(g)) => {
            let by_write = pieces
                .last()
                .filter(|p| p.start + p.len == g && matches!(p.content, Content::Data { .. }))
                .map(|p| p.seq);
            (r, by_write.unwrap_or(new_seq))
        }
        _ => (r, new_seq),
    });
    Delta { pieces, size }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mapfs::{Extent, Growth};

    fn write(m: &mut DataMap, off: u64, len: u64) {
        let p = m.place_write(off, len);
        m.commit_write(off, len, &p);
    }

    fn base() -> DataMap {
        // 0..100 in backing file 0 (another writer's log), own log is 1.
        DataMap::new(
            vec![Extent {
                logical: 0,
                file: 0,
                offset: 0,
                len: 100,
            }],
            100,
            Growth::AppendLog { file: 1, end: 0 },
        )
        .unwrap()
    }

    #[test]
    fn unchanged_is_empty() {
        let o = base();
        assert!(delta(&o, &o.clone(), &Delta::default(), 1, &[], 7).is_empty());
    }

    #[test]
    fn shrink_above_the_open_size_is_a_truncate_and_stays_one() {
        let o = base();
        let mut f = o.clone();
        write(&mut f, 0, 500);
        let d1 = delta(&o, &f, &Delta::default(), 1, &[], 1);
        assert_eq!(d1.size, Some((SizeRule::GrowTo(500), 1)));
        // Cut to 300, still above the 100 it found: a truncate, which must
        // undo growth by other writers flushed before it.
        f.truncate(300);
        let d2 = delta(&o, &f, &d1, 1, &[], 2);
        assert_eq!(d2.size, Some((SizeRule::Set(300), 2)));
        // Flushed again unchanged (the close after the ftruncate): the
        // truncate keeps its rule and number.
        let d3 = delta(&o, &f, &d2, 1, &[], 3);
        assert_eq!(d3, d2);
        // Growing past it again is growth.
        write(&mut f, 300, 10);
        let d4 = delta(&o, &f, &d3, 1, &[], 4);
        assert_eq!(d4.size, Some((SizeRule::GrowTo(310), 4)));
    }

    #[test]
    fn writes_truncates_and_seq_reuse() {
        let o = base();
        let mut f = o.clone();
        write(&mut f, 10, 5);
        write(&mut f, 120, 5);
        let d1 = delta(&o, &f, &Delta::default(), 1, &[], 1);
        assert_eq!(
            d1.pieces,
            vec![
                Piece {
                    start: 10,
                    len: 5,
                    content: Content::Data { file: 1, offset: 0 },
                    seq: 1
                },
                Piece {
                    start: 120,
                    len: 5,
                    content: Content::Data { file: 1, offset: 5 },
                    seq: 1
                },
            ]
        );
        assert_eq!(d1.size, Some((SizeRule::GrowTo(125), 1)));
        // Second flush: new write at 50, truncate to 60; old piece keeps 1.
        write(&mut f, 50, 2);
        f.truncate(60);
        let d2 = delta(&o, &f, &d1, 1, &[], 2);
        assert_eq!(d2.pieces.len(), 2);
        assert_eq!(d2.pieces[0].seq, 1);
        assert_eq!(d2.pieces[1].start, 50);
        assert_eq!(d2.pieces[1].seq, 2);
        assert_eq!(d2.size, Some((SizeRule::Set(60), 2)));
        // Truncate then extend: the lost range is a recorded hole.
        f.truncate(100);
        let d3 = delta(&o, &f, &d2, 1, &[], 3);
        assert_eq!(
            d3.pieces.last(),
            Some(&Piece {
                start: 60,
                len: 40,
                content: Content::Hole,
                seq: 3
            })
        );
        assert_eq!(d3.size, None);
    }

    #[test]
    fn epochs_number_bytes_by_when_they_were_written() {
        let o = base();
        let mut f = o.clone();
        write(&mut f, 0, 10); // log 0..10
        write(&mut f, 10, 10); // log 10..20 (one coalesced extent)
        write(&mut f, 50, 5); // log 20..25
                              // Another open flushed at seq 100 when our log held 15 bytes, and
                              // at 200 when it held 25.
        let epochs = [Epoch { len: 15, seq: 100 }, Epoch { len: 25, seq: 200 }];
        let d = delta(&o, &f, &Delta::default(), 1, &epochs, 300);
        let got: Vec<_> = d.pieces.iter().map(|p| (p.start, p.len, p.seq)).collect();
        assert_eq!(got, vec![(0, 15, 99), (15, 5, 199), (50, 5, 199)]);
        // A write after the last epoch gets the flush's number.
        write(&mut f, 60, 1);
        let d = delta(&o, &f, &d, 1, &epochs, 400);
        assert_eq!(d.pieces.last().map(|p| (p.start, p.seq)), Some((60, 400)));
        assert_eq!(d.pieces[0].seq, 99);
    }
}
