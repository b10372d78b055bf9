//! Property tests of the pure [`DataMap`]: random writes, truncates and hole
//! punches are applied both to a map over simulated backing byte arrays and
//! to a plain `Vec<u8>`; reading through `locate` must always equal the
//! `Vec`, the map's invariants must hold, and no backing byte the file does
//! not own may change.

use mapfs::{DataMap, Extent, Growth, Placement, Segment};
use proptest::prelude::*;

/// Filler of backing bytes the file does not own (and of stale space it
/// does): non-zero so leaking it into a read is visible.
const SENTINEL: u8 = 0xEE;

#[derive(Debug, Clone)]
enum Op {
    Write { off: u64, len: u64, seed: u8 },
    Truncate(u64),
    Punch { off: u64, len: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..300, 1u64..80, any::<u8>()).prop_map(|(off, len, seed)| Op::Write { off, len, seed }),
        1 => (0u64..300).prop_map(Op::Truncate),
        1 => (0u64..300, 1u64..80).prop_map(|(off, len)| Op::Punch { off, len }),
    ]
}

/// How the starting map is laid out (see [`Sim::build`]).
#[derive(Debug, Clone)]
struct Layout {
    /// 0: whole file, 1: in place, 2: append log, 3: read-only.
    policy: u8,
    /// (hole before, extent length, backing file, backing gap before).
    pieces: Vec<(u64, u64, u32, u64)>,
    /// Size relative to the end of the last extent (negative: the last
    /// extents reach past the size, i.e. reserved slot space).
    size_adj: i64,
    /// InPlace limit past the size; `None`: unlimited.
    limit_extra: Option<u64>,
    log_file: u32,
    log_gap: u64,
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        0u8..4,
        prop::collection::vec((0u64..20, 1u64..30, 0u32..3, 0u64..3), 0..6),
        -30i64..30,
        prop::option::of(0u64..200),
        0u32..3,
        0u64..8,
    )
        .prop_map(
            |(policy, pieces, size_adj, limit_extra, log_file, log_gap)| Layout {
                policy,
                pieces,
                size_adj,
                limit_extra,
                log_file,
                log_gap,
            },
        )
}

/// A map over simulated backing files, and the byte model it must match.
struct Sim {
    map: DataMap,
    backing: Vec<Vec<u8>>,
    /// Per backing file, the ranges the file owns (`u64::MAX`: to the end).
    owned: Vec<Vec<(u64, u64)>>,
    model: Vec<u8>,
    remaps: usize,
}

impl Sim {
    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { off, len, seed } => self.write(off, len, seed),
            Op::Truncate(size) => self.truncate(size),
            Op::Punch { off, len } => self.punch(off, len),
        }
    }

    fn build(l: &Layout) -> Sim {
        if l.policy == 0 {
            return Sim {
                map: DataMap::whole_file(),
                backing: vec![Vec::new()],
                owned: vec![vec![(0, u64::MAX)]],
                model: Vec::new(),
                remaps: 0,
            };
        }
        let mut backing: Vec<Vec<u8>> = vec![Vec::new(); 3];
        let mut owned: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 3];
        let mut extents = Vec::new();
        let mut model = Vec::new();
        let mut logical = 0u64;
        for (i, &(hole, len, file, gap)) in l.pieces.iter().enumerate() {
            logical += hole;
            model.resize(logical as usize, 0);
            let f = &mut backing[file as usize];
            f.resize(f.len() + gap as usize, SENTINEL);
            let offset = f.len() as u64;
            for b in 0..len {
                let v = (i as u8 + 1).wrapping_mul(31).wrapping_add(b as u8) | 1;
                f.push(v);
                model.push(v);
            }
            owned[file as usize].push((offset, offset + len));
            extents.push(Extent {
                logical,
                file,
                offset,
                len,
            });
            logical += len;
        }
        let size = (logical as i64 + l.size_adj).max(0) as u64;
        model.resize(size as usize, 0);
        let growth = match l.policy {
            1 => {
                let limit = l.limit_extra.map(|x| size + x);
                if let Some(t) = extents.last() {
                    let start = t.offset + t.len;
                    let room = match limit {
                        None => u64::MAX,
                        Some(lim) => start + lim.saturating_sub(t.logical + t.len),
                    };
                    owned[t.file as usize].push((start, room));
                }
                Growth::InPlace { limit }
            }
            2 => {
                let f = &mut backing[l.log_file as usize];
                f.resize(f.len() + l.log_gap as usize, SENTINEL);
                let end = f.len() as u64;
                owned[l.log_file as usize].push((end, u64::MAX));
                Growth::AppendLog {
                    file: l.log_file,
                    end,
                }
            }
            _ => Growth::ReadOnly,
        };
        let map = DataMap::new(extents, size, growth).expect("generated map is valid");
        for f in &mut backing {
            f.resize(f.len() + 16, SENTINEL);
        }
        Sim {
            map,
            backing,
            owned,
            model,
            remaps: 0,
        }
    }

    fn logical_size(&self) -> u64 {
        if self.map.is_whole_file() {
            self.backing[0].len() as u64
        } else {
            self.map.size()
        }
    }

    /// Reads like the engine: whole-file maps are bounded by the backing
    /// file, others by the map; holes and short backing files give zeros.
    fn read(&self, off: u64, len: u64) -> Vec<u8> {
        let len = len.min(self.logical_size().saturating_sub(off));
        let mut out = Vec::new();
        let segs = self.map.locate(off, len);
        let total: u64 = segs.iter().map(Segment::len).sum();
        if self.map.is_whole_file() {
            assert_eq!(total, len);
        } else {
            assert_eq!(total, len, "locate covers the clipped range");
        }
        for s in segs {
            match s {
                Segment::Hole { len } => out.resize(out.len() + len as usize, 0),
                Segment::Data { file, offset, len } => {
                    let b = &self.backing[file as usize];
                    for i in offset..offset + len {
                        out.push(b.get(i as usize).copied().unwrap_or(0));
                    }
                }
            }
        }
        out
    }

    /// What a file system's `remap` might do: copy the bytes into a fresh
    /// backing file owned entirely by this file, 1-to-1 and unlimited.
    fn remap(&mut self, off: u64, len: u64) {
        self.remaps += 1;
        let size = self.map.size();
        let content = self.read(0, size);
        let file = self.backing.len() as u32;
        let mut f = content.clone();
        f.resize((off + len).max(size) as usize, SENTINEL);
        self.backing.push(f);
        self.owned.push(vec![(0, u64::MAX)]);
        let span = (off + len).max(size);
        self.map = DataMap::new(
            vec![Extent {
                logical: 0,
                file,
                offset: 0,
                len: span,
            }],
            size,
            Growth::InPlace { limit: None },
        )
        .expect("remapped map is valid");
        // Bytes that were holes must stay holes, not the new file's copy of
        // zeros: punch them to exercise reserved space too.
        let holes: Vec<(u64, u64)> = hole_ranges(&content);
        for (s, e) in holes {
            self.map.punch_hole(s, e - s);
        }
    }

    fn write(&mut self, off: u64, len: u64, seed: u8) {
        let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
        let mut placement = self.map.place_write(off, len);
        if placement == Placement::NeedsRemap {
            assert!(
                !matches!(self.map.growth(), Growth::AppendLog { .. }) || self.map.is_whole_file(),
                "append logs always place writes"
            );
            self.remap(off, len);
            placement = self.map.place_write(off, len);
        }
        let Placement::Fits(segs) = &placement else {
            panic!("remapped map must place the write");
        };
        let mut done = 0usize;
        for s in segs {
            let Segment::Data { file, offset, len } = *s else {
                panic!("placement holds a hole: {placement:?}");
            };
            // Real files grow with zeros, which a whole-file map exposes;
            // elsewhere make any exposure of unwritten bytes visible.
            let fill = if self.map.is_whole_file() {
                0
            } else {
                SENTINEL
            };
            let b = &mut self.backing[file as usize];
            let end = (offset + len) as usize;
            if b.len() < end {
                b.resize(end, fill);
            }
            b[offset as usize..end].copy_from_slice(&data[done..done + len as usize]);
            done += len as usize;
        }
        assert_eq!(done as u64, len, "placement covers the write");
        let before = self.map.clone();
        self.map.commit_write(off, len, &placement);
        if before.overwrites_in_place(off, len) {
            // The engine skips the commit (and the exclusive lock) for these.
            assert_eq!(self.map, before, "an in-place overwrite changed the map");
            assert_eq!(placement, Placement::Fits(before.locate(off, len)));
        }
        let end = (off + len) as usize;
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(&data);
    }

    fn truncate(&mut self, size: u64) {
        if self.map.is_whole_file() {
            self.backing[0].resize(size as usize, 0);
        }
        self.map.truncate(size);
        self.model.resize(size as usize, 0);
    }

    fn punch(&mut self, off: u64, len: u64) {
        if self.map.is_whole_file() {
            // The engine punches the backing file itself.
            let b = &mut self.backing[0];
            let end = ((off + len) as usize).min(b.len());
            if (off as usize) < end {
                b[off as usize..end].fill(0);
            }
        } else {
            self.map.punch_hole(off, len);
        }
        let end = ((off + len) as usize).min(self.model.len());
        if (off as usize) < end {
            self.model[off as usize..end].fill(0);
        }
    }

    fn check(&self) {
        self.map.validate().expect("map invariants hold");
        assert_eq!(self.logical_size(), self.model.len() as u64, "size");
        assert_eq!(self.read(0, u64::MAX / 2), self.model, "content");
        for (fi, b) in self.backing.iter().enumerate() {
            for (i, &v) in b.iter().enumerate() {
                let i = i as u64;
                let mine = self.owned[fi].iter().any(|&(s, e)| s <= i && i < e);
                assert!(
                    mine || v == SENTINEL,
                    "byte {i} of backing file {fi}, not the file's own, changed"
                );
            }
        }
        // SEEK_DATA/SEEK_HOLE agree with the extents.
        if !self.map.is_whole_file() {
            for off in 0..self.model.len() as u64 + 2 {
                let mapped = |o: u64| {
                    self.map
                        .extents()
                        .iter()
                        .any(|e| e.logical <= o && o < e.logical + e.len)
                };
                let size = self.map.size();
                let data = (off..size).find(|&o| mapped(o));
                assert_eq!(self.map.next_data(off), data, "next_data({off})");
                let hole = (off < size).then(|| (off..size).find(|&o| !mapped(o)).unwrap_or(size));
                assert_eq!(self.map.next_hole(off), hole, "next_hole({off})");
            }
        }
    }
}

/// Runs of zero bytes in `v`, as `(start, end)`.
fn hole_ranges(v: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        if v[i] == 0 {
            let s = i;
            while i < v.len() && v[i] == 0 {
                i += 1;
            }
            out.push((s as u64, i as u64));
        } else {
            i += 1;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn map_matches_byte_model(l in layout(), ops in prop::collection::vec(op(), 0..40)) {
        let mut sim = Sim::build(&l);
        sim.check();
        for op in &ops {
            sim.apply(op);
            sim.check();
        }
        if matches!(sim.map.growth(), Growth::AppendLog { .. }) {
            prop_assert_eq!(sim.remaps, 0);
        }
    }

    /// A located sub-range is the same bytes as the whole read, cut.
    #[test]
    fn locate_subranges_agree(l in layout(), ops in prop::collection::vec(op(), 0..20),
                              off in 0u64..300, len in 0u64..300) {
        let mut sim = Sim::build(&l);
        for op in &ops {
            sim.apply(op);
        }
        let whole = sim.read(0, u64::MAX / 2);
        let part = sim.read(off, len);
        let s = (off as usize).min(whole.len());
        let e = ((off + len) as usize).min(whole.len());
        prop_assert_eq!(&part[..], &whole[s..e]);
    }

    /// `single` answers exactly when `locate` finds one data segment, and
    /// the same one.
    #[test]
    fn single_is_locate_of_one_extent(l in layout(), ops in prop::collection::vec(op(), 0..20),
                                      off in 0u64..300, len in 0u64..300) {
        let mut sim = Sim::build(&l);
        for op in &ops {
            sim.apply(op);
        }
        let located = sim.map.locate(off, len);
        let expect = match located.as_slice() {
            [s @ Segment::Data { .. }] if !sim.map.is_whole_file() => Some(*s),
            _ => None,
        };
        prop_assert_eq!(sim.map.single(off, len), expect);
    }

    /// In-place maps keep one mapping for sequential writes: the map does
    /// not fragment.
    #[test]
    fn sequential_in_place_writes_stay_one_extent(chunks in prop::collection::vec(1u64..100, 1..50)) {
        let mut map = DataMap::new(
            vec![Extent { logical: 0, file: 0, offset: 4096, len: 1 }],
            1,
            Growth::InPlace { limit: None },
        ).unwrap();
        let mut off = 1;
        for c in chunks {
            let p = map.place_write(off, c);
            prop_assert!(matches!(p, Placement::Fits(ref s) if s.len() == 1));
            map.commit_write(off, c, &p);
            off += c;
        }
        prop_assert_eq!(map.extents().len(), 1);
        prop_assert_eq!(map.size(), off);
    }
}

/// Copy on write in place ([`Growth::Guarded`]), as `versions` uses it:
/// files 0 (writable) and 1 (read-only) are one backing array at shift 0;
/// a remap "saves" a granule around the write and unguards it. Reads must
/// match the model, and no write may land on a byte of the original file
/// that was not saved first.
struct Guarded {
    map: DataMap,
    backing: Vec<u8>,
    /// The file's size and bytes at the start: the version.
    orig: Vec<u8>,
    saved: Vec<(u64, u64)>,
    model: Vec<u8>,
}

const GRANULE: u64 = 16;

impl Guarded {
    fn new(size: u64) -> Guarded {
        let orig: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(7) | 1).collect();
        let extents = if size > 0 {
            vec![Extent {
                logical: 0,
                file: 1,
                offset: 0,
                len: size,
            }]
        } else {
            Vec::new()
        };
        Guarded {
            map: DataMap::new(extents, size, Growth::Guarded { file: 0 }).unwrap(),
            backing: orig.clone(),
            model: orig.clone(),
            orig,
            saved: Vec::new(),
        }
    }

    fn saved_at(&self, i: u64) -> bool {
        i >= self.orig.len() as u64 || self.saved.iter().any(|&(a, b)| a <= i && i < b)
    }

    fn write(&mut self, off: u64, len: u64, seed: u8) {
        let mut p = self.map.place_write(off, len);
        if p == Placement::NeedsRemap {
            let a = off - off % GRANULE;
            let b = (off + len).div_ceil(GRANULE) * GRANULE;
            self.saved.push((a, b));
            self.map.unguard(a, b);
            p = self.map.place_write(off, len);
        }
        let Placement::Fits(segs) = &p else {
            panic!("an unguarded range must place the write");
        };
        let mut at = off;
        for s in segs {
            let Segment::Data {
                file,
                offset,
                len: n,
            } = *s
            else {
                panic!("placement holds a hole");
            };
            assert_eq!(file, 0, "a write placed in the read-only file");
            assert_eq!(offset, at, "shift 0");
            for i in offset..offset + n {
                assert!(self.saved_at(i), "byte {i} written before it was saved");
                let v = seed.wrapping_add((i - off) as u8);
                if self.backing.len() <= i as usize {
                    self.backing.resize(i as usize + 1, SENTINEL);
                }
                self.backing[i as usize] = v;
            }
            at += n;
        }
        self.map.commit_write(off, len, &p);
        let end = (off + len) as usize;
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        for i in off..off + len {
            self.model[i as usize] = seed.wrapping_add((i - off) as u8);
        }
    }

    fn punch(&mut self, off: u64, len: u64) {
        // The engine zeroes the writable file's punched pieces.
        for r in self.map.punch_hole(off, len) {
            if r.file == 0 {
                for i in r.offset..r.offset + r.len {
                    assert!(self.saved_at(i), "byte {i} zeroed before it was saved");
                    if let Some(b) = self.backing.get_mut(i as usize) {
                        *b = 0;
                    }
                }
            }
        }
        let end = ((off + len) as usize).min(self.model.len());
        if (off as usize) < end {
            self.model[off as usize..end].fill(0);
        }
    }

    fn check(&self) {
        self.map.validate().expect("map invariants hold");
        assert_eq!(self.map.size(), self.model.len() as u64, "size");
        let mut got = Vec::new();
        for seg in self.map.locate(0, self.map.size()) {
            match seg {
                Segment::Hole { len } => got.resize(got.len() + len as usize, 0),
                Segment::Data { offset, len, .. } => {
                    for i in offset..offset + len {
                        got.push(self.backing.get(i as usize).copied().unwrap_or(0));
                    }
                }
            }
        }
        assert_eq!(got, self.model, "content");
        for (i, &v) in self.orig.iter().enumerate() {
            assert!(
                self.saved_at(i as u64) || self.backing[i] == v,
                "original byte {i} changed unsaved"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn guarded_maps_write_only_what_was_saved(size in 0u64..200,
                                              ops in prop::collection::vec(op(), 0..40)) {
        let mut g = Guarded::new(size);
        g.check();
        for op in &ops {
            match *op {
                Op::Write { off, len, seed } => g.write(off, len, seed),
                Op::Truncate(n) => {
                    g.map.truncate(n);
                    g.model.resize(n as usize, 0);
                }
                Op::Punch { off, len } => g.punch(off, len),
            }
            g.check();
        }
    }
}

#[test]
fn serde_round_trip_keeps_reserved_space() {
    let mut m = DataMap::new(
        vec![Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 100,
        }],
        100,
        Growth::InPlace { limit: Some(200) },
    )
    .unwrap();
    m.truncate(10);
    let json = serde_json::to_string(&m).unwrap();
    let back: DataMap = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    back.validate().unwrap();
}
