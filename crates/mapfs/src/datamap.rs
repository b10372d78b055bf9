//! [`DataMap`]: where the bytes of one file live.
//!
//! A map is an ordered list of non-overlapping [`Extent`]s, `logical offset ->
//! (backing file index, backing offset, length)`, a logical size, and a
//! [`Growth`] policy saying where bytes written outside the extents go.
//! Logical ranges below `size` not covered by an extent are holes (read as
//! zeros). Everything here is pure: no I/O, so it is tested against a byte
//! array model.
//!
//! The whole-file 1-to-1 map ([`DataMap::whole_file`]) is special: logical
//! offset == offset in backing file 0 for every offset, and the size is the
//! backing file's own size. Executors recognise it and hand the backing file to
//! the kernel (passthrough) or to the application (preload shim).
//!
//! # Reserved space (in-place maps)
//!
//! Under [`Growth::InPlace`] backing space can belong to the file without
//! holding any of its bytes: the part of an extent given to
//! [`DataMap::new`] that lies past `size` (an M-to-1 slot is handed out as one
//! extent of the slot's capacity with `size` = the file's length), extents
//! trimmed away by [`DataMap::truncate`] or [`DataMap::punch_hole`], and the
//! gap left behind the last extent by a write past it. The map keeps such space
//! in a private *reserved* list ([`DataMap::reserved`]): it reads as a hole
//! (zeros, whatever the backing bytes hold), and a later write into it lands
//! there in place without a remap. So no backing byte is ever assumed to be
//! zero, and stale bytes of a shrunk file can never reappear.
//!
//! Invariants (checked by [`DataMap::validate`]): extents and reserved pieces
//! are each sorted, non-overlapping and non-empty, never overlap one another,
//! and (except for whole-file maps) every extent ends at or before `size`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod extents;

pub use extents::Extents;

/// One contiguous run of logical bytes stored contiguously in a backing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// First logical byte covered.
    pub logical: u64,
    /// Index of the backing file (into `Opened::files`).
    pub file: u32,
    /// Offset of the first byte in the backing file.
    pub offset: u64,
    /// Number of bytes (> 0).
    pub len: u64,
}

impl Extent {
    /// One past the last logical byte covered.
    pub fn logical_end(&self) -> u64 {
        self.logical + self.len
    }

    /// The part of this extent covering logical `start..end` (which must lie
    /// inside it), with the backing offset shifted to match.
    fn slice(&self, start: u64, end: u64) -> Extent {
        debug_assert!(self.logical <= start && start < end && end <= self.logical_end());
        Extent {
            logical: start,
            file: self.file,
            offset: self.offset + (start - self.logical),
            len: end - start,
        }
    }

    /// True when `next` continues this extent both logically and in the same
    /// backing file, so the two can be one extent.
    fn continues_into(&self, next: &Extent) -> bool {
        self.file == next.file
            && self.logical_end() == next.logical
            && self.offset + self.len == next.offset
    }
}

/// Where bytes written outside the current extents go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Growth {
    /// Extend the last extent when writing past the end, keeping the same
    /// logical->backing shift, as long as the file stays within `limit`
    /// bytes (`None`: no limit; an M-to-1 slot sets its capacity). A write
    /// into a hole below the end of the last extent needs a remap, unless the
    /// hole is reserved space (see the module docs).
    ///
    /// By choosing this policy the file system promises that the backing
    /// bytes after the last extent (at its shift, up to `limit`) belong to
    /// this file alone; [`DataMap::new`] rejects maps whose own extents sit
    /// there.
    InPlace {
        /// Maximum logical size reachable without a remap.
        limit: Option<u64>,
    },
    /// Log-structured (1-to-M): every write appends its bytes at `end` of
    /// backing file `file` and adds an extent that shadows older ones.
    AppendLog {
        /// Backing file of the log.
        file: u32,
        /// Where the next write lands in the log.
        end: u64,
    },
    /// Writes are refused with `EROFS`... or remapped by the file system.
    ReadOnly,
    /// Copy-on-write in place: a write lands in place only where extents or
    /// reserved pieces of backing file `file` cover every byte of it.
    /// Extents of other backing files are read-only (bytes shared with
    /// something that must not change, such as an older version of the
    /// file), and holes and the space past the last piece are not the
    /// file's: a write touching any of them needs a remap, by which the file
    /// system makes the range writable (it saves what it must, then maps
    /// the range to `file`). Space dropped by a truncate or a punched hole
    /// stays reserved when it was `file`'s, as under [`Growth::InPlace`];
    /// the engine zeroes the writable file's punched bytes in place. By
    /// choosing this policy the file system promises that bytes written in
    /// place are the file's own from then on, as in a whole-file map (an
    /// open after a crash of the executor finds them there).
    Guarded {
        /// The backing file written in place.
        file: u32,
    },
}

/// A piece of a located byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// `len` bytes at `offset` of backing file `file`.
    Data {
        /// Backing file index.
        file: u32,
        /// Offset in the backing file.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `len` bytes of zeros.
    Hole {
        /// Length in bytes.
        len: u64,
    },
}

impl Segment {
    /// Number of logical bytes this segment covers.
    pub fn len(&self) -> u64 {
        match *self {
            Segment::Data { len, .. } | Segment::Hole { len } => len,
        }
    }

    /// True for a zero-length segment (never produced by the map).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a write goes, or that it needs a remap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The write fits: write these `Segment::Data` pieces in order, then call
    /// [`DataMap::commit_write`] with this placement.
    Fits(Vec<Segment>),
    /// The growth policy cannot place the write; ask the file system to
    /// `remap`.
    NeedsRemap,
}

/// The map of one file. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataMap {
    extents: Extents,
    size: u64,
    growth: Growth,
    whole_file: bool,
    /// Backing space owned by the file that holds none of its bytes (module
    /// docs). `default` keeps self-describing encodings of older maps loading.
    #[serde(default)]
    reserved: Extents,
}

fn einval(msg: &str) -> Error {
    Error::invalid().context(format!("invalid DataMap: {msg}"))
}

/// Checks that `v` is sorted, non-overlapping, non-empty and overflow-free.
fn check_sorted<'a>(v: impl IntoIterator<Item = &'a Extent>, what: &str) -> Result<()> {
    let mut prev_end = 0u64;
    for (n, e) in v.into_iter().enumerate() {
        if e.len == 0 {
            return Err(einval(&format!("{what} {n} is empty")));
        }
        if e.logical.checked_add(e.len).is_none() || e.offset.checked_add(e.len).is_none() {
            return Err(einval(&format!("{what} {n} overflows")));
        }
        if n > 0 && e.logical < prev_end {
            return Err(einval(&format!("{what} {n} overlaps or is out of order")));
        }
        prev_end = e.logical_end();
    }
    Ok(())
}

/// Largest byte offset a file may reach (`off_t` is signed).
pub const MAX_OFFSET: u64 = i64::MAX as u64;

/// Merges two sorted, mutually disjoint extent lists into one sorted list.
fn merge_sorted(a: impl Iterator<Item = Extent>, b: impl Iterator<Item = Extent>) -> Vec<Extent> {
    let mut out: Vec<Extent> = a.chain(b).collect();
    out.sort_unstable_by_key(|e| e.logical);
    out
}

/// The extents and reserved pieces of `map` inside logical `start..end`,
/// each cut to it, sorted.
fn taken_in(map: &DataMap, start: u64, end: u64) -> Vec<Extent> {
    merge_sorted(
        map.extents.pieces_in(start, end),
        map.reserved.pieces_in(start, end),
    )
}

/// The parts of logical `start..end` that no piece of `taken` (sorted,
/// within the range) covers.
fn gaps(taken: &[Extent], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = start;
    for t in taken {
        if t.logical > at {
            out.push((at, t.logical));
        }
        at = at.max(t.logical_end());
    }
    if at < end {
        out.push((at, end));
    }
    out
}

impl DataMap {
    /// The whole-file 1-to-1 map onto backing file 0.
    pub fn whole_file() -> Self {
        DataMap {
            extents: Extents::new(),
            size: 0,
            growth: Growth::InPlace { limit: None },
            whole_file: true,
            reserved: Extents::new(),
        }
    }

    /// A map from parts. Fails with `EINVAL` if extents overlap, are unsorted,
    /// empty, or the growth policy names a file no extent could use.
    ///
    /// "Could use" is checked as: an [`Growth::AppendLog`] log must not have
    /// live extents at or past its `end` (the next append would overwrite
    /// them), and under [`Growth::InPlace`] no other extent may sit in the
    /// space the last extent grows into. Backing file indexes are checked
    /// against the open files by the engine, which alone knows how many there
    /// are. Extents reaching past `size` are cut at `size`; under `InPlace`
    /// the part cut off stays reserved to the file (module docs). Adjacent
    /// extents continuing one another in the same backing file are merged.
    pub fn new(extents: Vec<Extent>, size: u64, growth: Growth) -> Result<Self> {
        check_sorted(&extents, "extent")?;
        if let Growth::AppendLog { file, end } = growth {
            if extents
                .iter()
                .any(|e| e.file == file && e.offset + e.len > end)
            {
                return Err(einval("an extent lies past the end of the append log"));
            }
        }
        // Adjacent extents that continue one another become one, as the
        // map's own updates keep them.
        let mut extents = extents;
        extents.dedup_by(|next, prev| {
            let merge = prev.continues_into(next);
            if merge {
                prev.len += next.len;
            }
            merge
        });
        let mut map = DataMap {
            extents: Extents::from_sorted(extents),
            size,
            growth,
            whole_file: false,
            reserved: Extents::new(),
        };
        let past = map.extents.remove_range(size, u64::MAX);
        if let Growth::Guarded { file } = growth {
            map.reserved =
                Extents::from_sorted(past.into_iter().filter(|e| e.file == file).collect());
        } else if let Growth::InPlace { limit } = growth {
            map.reserved = Extents::from_sorted(past);
            if let Some(t) = map.tail() {
                let start = t.offset + t.len;
                let room = match limit {
                    None => u64::MAX,
                    Some(l) => start.saturating_add(l.saturating_sub(t.logical_end())),
                };
                let clash = map.extents.iter().chain(&map.reserved).any(|e| {
                    e.file == t.file && *e != t && e.offset < room && e.offset + e.len > start
                });
                if clash {
                    return Err(einval(
                        "an extent lies where the last extent grows in place",
                    ));
                }
            }
        }
        Ok(map)
    }

    /// True for [`DataMap::whole_file`] maps.
    pub fn is_whole_file(&self) -> bool {
        self.whole_file
    }

    /// True when the map can place no write at all: [`Growth::ReadOnly`], or
    /// [`Growth::InPlace`] with a limit of 0 and no space (a file system that
    /// gives a writable open its space at its first write).
    pub fn places_nothing(&self) -> bool {
        !self.whole_file
            && match self.growth {
                Growth::ReadOnly => true,
                Growth::InPlace { limit } => {
                    limit == Some(0) && self.extents.is_empty() && self.reserved.is_empty()
                }
                Growth::AppendLog { .. } | Growth::Guarded { .. } => false,
            }
    }

    /// Under [`Growth::InPlace`], makes the parts of `space` that no extent
    /// or reserved piece covers reserved to the file (they read as holes;
    /// writes may fill them without a remap): how a file system that hands
    /// a file a fixed piece of backing space (an M-to-1 slot) says that all
    /// of it is the file's, holes and unwritten tail included. Other maps
    /// are left as they are.
    pub fn reserve_within(&mut self, space: Extent) {
        if self.whole_file || !matches!(self.growth, Growth::InPlace { .. }) || space.len == 0 {
            return;
        }
        let (start, end) = (space.logical, space.logical_end());
        let free = gaps(&taken_in(self, start, end), start, end);
        if free.is_empty() {
            return;
        }
        let new = free.into_iter().map(|(a, b)| space.slice(a, b));
        self.reserved = Extents::from_sorted(merge_sorted(self.reserved.iter().copied(), new));
    }

    /// Under [`Growth::Guarded`], makes logical `start..end` writable in
    /// place: extents of other (read-only) backing files there move to the
    /// writable file at the same backing offsets, and holes and the space
    /// past the size become reserved space of it at backing offsets equal
    /// to their logical ones. For a file system's `remap` that saved what
    /// those backing bytes held first (copy on write). Other maps are left
    /// as they are.
    pub fn unguard(&mut self, start: u64, end: u64) {
        let Growth::Guarded { file } = self.growth else {
            return;
        };
        if self.whole_file || start >= end {
            return;
        }
        let taken = taken_in(self, start, end);
        // Reserved pieces are all `file`'s (an invariant): only extents of
        // other files move.
        for p in taken.iter().filter(|p| p.file != file) {
            self.extents.insert(Extent { file, ..*p });
        }
        for (a, b) in gaps(&taken, start, end) {
            self.reserved.insert(Extent {
                logical: a,
                file,
                offset: a,
                len: b - a,
            });
        }
    }

    /// The space an in-place map may write without a remap, as extents at
    /// their shifts, sorted: its extents, its reserved pieces, and the room
    /// its last piece grows into up to the limit. For a
    /// [`Growth::Guarded`] map, its extents and reserved pieces: what its
    /// writes and truncates can make of it lies there. Empty for other maps.
    pub fn own_space(&self) -> Vec<Extent> {
        // An in-place map's last piece grows (to its limit); a guarded
        // map's does not.
        let grows = match self.growth {
            _ if self.whole_file => return Vec::new(),
            Growth::InPlace { limit } => Some(limit),
            Growth::Guarded { .. } => None,
            _ => return Vec::new(),
        };
        let mut out = merge_sorted(self.extents.iter().copied(), self.reserved.iter().copied());
        if let (Some(limit), Some(t)) = (grows, self.tail()) {
            let end = limit.unwrap_or(MAX_OFFSET).min(MAX_OFFSET);
            if end > t.logical_end() {
                out.push(Extent {
                    logical: t.logical_end(),
                    file: t.file,
                    offset: t.offset.saturating_add(t.len),
                    len: end - t.logical_end(),
                });
            }
        }
        out
    }

    /// The extents, sorted by logical offset.
    pub fn extents(&self) -> &Extents {
        &self.extents
    }

    /// Backing space owned by the file but holding none of its bytes (reads
    /// as holes), sorted by logical offset. Only [`Growth::InPlace`] and
    /// [`Growth::Guarded`] maps have any. A file system persisting a map may
    /// keep it to avoid a remap on the next open, or drop it.
    pub fn reserved(&self) -> &Extents {
        &self.reserved
    }

    /// Extents plus reserved pieces: what sending the map costs (each
    /// encodes in a bounded number of bytes).
    pub fn piece_count(&self) -> usize {
        self.extents.len() + self.reserved.len()
    }

    /// Logical size (for whole-file maps: meaningless, the backing file's size
    /// rules; executors ask the engine).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The growth policy.
    pub fn growth(&self) -> Growth {
        self.growth
    }

    /// For a placement of one segment at the end of the append log (as
    /// [`DataMap::place_write`] gives with [`Growth::AppendLog`]): moves the
    /// log's end past it, so that the next placement goes after it before
    /// this one is committed. False, and nothing changed, for any other.
    pub fn claim_log_end(&mut self, segs: &[Segment]) -> bool {
        match (&mut self.growth, segs) {
            (Growth::AppendLog { file: lf, end }, [Segment::Data { file, offset, len }])
                if *lf == *file && *offset == *end =>
            {
                *end += len;
                true
            }
            _ => false,
        }
    }

    /// Checks the invariants listed in the module docs (`EINVAL` naming the
    /// broken one). Maps built by [`DataMap::new`] and changed only through
    /// its methods always pass; this is for tests and for maps decoded with
    /// serde, which bypasses [`DataMap::new`].
    pub fn validate(&self) -> Result<()> {
        check_sorted(&self.extents, "extent")?;
        check_sorted(&self.reserved, "reserved piece")?;
        if !self.whole_file {
            if let Some(last) = self.extents.last() {
                if last.logical_end() > self.size {
                    return Err(einval("an extent ends past the size"));
                }
            }
        }
        for r in &self.reserved {
            if matches!(self.growth, Growth::Guarded { file } if file != r.file) {
                return Err(einval("reserved space of a read-only backing file"));
            }
            if self
                .extents
                .pieces_in(r.logical, r.logical_end())
                .next()
                .is_some()
            {
                return Err(einval("reserved space overlaps an extent"));
            }
        }
        Ok(())
    }

    /// The piece (extent or reserved) that ends last, whose shift growth in
    /// place continues.
    fn tail(&self) -> Option<Extent> {
        match (self.extents.last(), self.reserved.last()) {
            (Some(e), Some(r)) if r.logical_end() > e.logical_end() => Some(*r),
            (Some(e), _) => Some(*e),
            (None, r) => r.copied(),
        }
    }

    /// Where `offset..offset+len`, clipped to the size, lies when one
    /// extent holds all of it (a packed file's slot, a read inside one
    /// piece): what [`Self::locate`] would answer as its only segment,
    /// without building a list. `None` when the range is empty or touches
    /// a hole or several extents.
    pub fn single(&self, offset: u64, len: u64) -> Option<Segment> {
        let end = offset.saturating_add(len).min(self.size);
        if self.whole_file || offset >= end {
            return None;
        }
        let e = self.extents.ending_after(offset).next()?;
        if e.logical > offset || e.logical_end() < end {
            return None;
        }
        Some(Segment::Data {
            file: e.file,
            offset: e.offset + (offset - e.logical),
            len: end - offset,
        })
    }

    /// The backing segments and holes of `offset..offset+len`, clipped to the
    /// logical size (so the sum of lengths may be less than `len`).
    pub fn locate(&self, offset: u64, len: u64) -> Vec<Segment> {
        if len == 0 {
            return Vec::new();
        }
        if self.whole_file {
            let len = len.min(u64::MAX - offset);
            return vec![Segment::Data {
                file: 0,
                offset,
                len,
            }];
        }
        if offset >= self.size {
            return Vec::new();
        }
        let end = offset.saturating_add(len).min(self.size);
        let mut out = Vec::new();
        let mut cursor = offset;
        for p in self.extents.pieces_in(offset, end) {
            if p.logical > cursor {
                out.push(Segment::Hole {
                    len: p.logical - cursor,
                });
            }
            out.push(Segment::Data {
                file: p.file,
                offset: p.offset,
                len: p.len,
            });
            cursor = p.logical_end();
        }
        if cursor < end {
            out.push(Segment::Hole { len: end - cursor });
        }
        out
    }

    /// Where a write of `len` bytes at `offset` goes under the growth policy.
    pub fn place_write(&self, offset: u64, len: u64) -> Placement {
        if len == 0 {
            return Placement::Fits(Vec::new());
        }
        let Some(end) = offset.checked_add(len) else {
            return Placement::NeedsRemap;
        };
        if self.whole_file {
            return Placement::Fits(vec![Segment::Data {
                file: 0,
                offset,
                len,
            }]);
        }
        match self.growth {
            Growth::ReadOnly => Placement::NeedsRemap,
            Growth::AppendLog { file, end: log_end } => match log_end.checked_add(len) {
                Some(_) => Placement::Fits(vec![Segment::Data {
                    file,
                    offset: log_end,
                    len,
                }]),
                None => Placement::NeedsRemap,
            },
            Growth::InPlace { limit } => self.place_in_place(offset, end, limit),
            Growth::Guarded { file } => self.place_guarded(offset, end, file),
        }
    }

    fn place_guarded(&self, offset: u64, end: u64, file: u32) -> Placement {
        let pieces = merge_sorted(
            self.extents.pieces_in(offset, end),
            self.reserved.pieces_in(offset, end),
        );
        let mut segs: Vec<Segment> = Vec::with_capacity(pieces.len());
        let mut cursor = offset;
        for p in &pieces {
            if p.logical > cursor || p.file != file {
                return Placement::NeedsRemap;
            }
            match segs.last_mut() {
                Some(Segment::Data {
                    offset: o, len: l, ..
                }) if *o + *l == p.offset => {
                    *l += p.len;
                }
                _ => segs.push(Segment::Data {
                    file,
                    offset: p.offset,
                    len: p.len,
                }),
            }
            cursor = p.logical_end();
        }
        if cursor < end {
            return Placement::NeedsRemap;
        }
        Placement::Fits(segs)
    }

    fn place_in_place(&self, offset: u64, end: u64, limit: Option<u64>) -> Placement {
        let pieces = merge_sorted(
            self.extents.pieces_in(offset, end),
            self.reserved.pieces_in(offset, end),
        );
        let mut segs: Vec<Segment> = Vec::with_capacity(pieces.len() + 1);
        let mut push = |file: u32, off: u64, len: u64| {
            if let Some(Segment::Data {
                file: f,
                offset: o,
                len: l,
            }) = segs.last_mut()
            {
                if *f == file && *o + *l == off {
                    *l += len;
                    return;
                }
            }
            segs.push(Segment::Data {
                file,
                offset: off,
                len,
            });
        };
        let mut cursor = offset;
        for p in &pieces {
            if p.logical > cursor {
                // A hole below a piece the file owns: no space of ours there.
                return Placement::NeedsRemap;
            }
            push(p.file, p.offset, p.len);
            cursor = p.logical_end();
        }
        if cursor < end {
            let Some(t) = self.tail() else {
                return Placement::NeedsRemap;
            };
            if cursor < t.logical_end() || limit.is_some_and(|l| end > l) {
                return Placement::NeedsRemap;
            }
            // Same shift as the tail: backing = tail backing end + distance.
            let Some(back) = (t.offset + t.len).checked_add(cursor - t.logical_end()) else {
                return Placement::NeedsRemap;
            };
            if back.checked_add(end - cursor).is_none() {
                return Placement::NeedsRemap;
            }
            push(t.file, back, end - cursor);
        }
        Placement::Fits(segs)
    }

    /// Records a write placed by [`DataMap::place_write`]: extents and size
    /// grow to cover it.
    ///
    /// The placement's segments are mapped in order from `offset` on; a
    /// prefix of a placement (the segments that were written before an I/O
    /// error, with `len` their total) may be committed.
    pub fn commit_write(&mut self, offset: u64, len: u64, placement: &Placement) {
        let Placement::Fits(segs) = placement else {
            return;
        };
        if len == 0 {
            return;
        }
        let end = offset.saturating_add(len);
        if self.whole_file {
            self.size = self.size.max(end);
            return;
        }
        if let (Growth::InPlace { .. }, Some(t)) = (self.growth, self.tail()) {
            if offset > t.logical_end() {
                if let Some(Segment::Data {
                    file, offset: b, ..
                }) = segs.first()
                {
                    let gap = offset - t.logical_end();
                    let tail_back = t.offset + t.len;
                    if *file == t.file && tail_back.checked_add(gap) == Some(*b) {
                        // The gap's backing bytes are ours but unwritten:
                        // keep them for later writes, read them as zeros.
                        self.reserved.insert(t.slice_after(gap));
                    }
                }
            }
        }
        let mut cursor = offset;
        for seg in segs {
            if cursor >= end {
                break;
            }
            match *seg {
                Segment::Data {
                    file,
                    offset: b,
                    len: l,
                } => {
                    let l = l.min(end - cursor);
                    self.reserved.remove_range(cursor, cursor + l);
                    self.extents.insert(Extent {
                        logical: cursor,
                        file,
                        offset: b,
                        len: l,
                    });
                    if let Growth::AppendLog { file: lf, end: le } = &mut self.growth {
                        if *lf == file {
                            *le = (*le).max(b + l);
                        }
                    }
                    cursor += l;
                }
                Segment::Hole { len: l } => cursor += l.min(end - cursor),
            }
        }
        self.size = self.size.max(end);
    }

    /// Sets the logical size: shrinking drops or trims extents past it;
    /// growing leaves a hole.
    ///
    /// Under [`Growth::InPlace`] the space of dropped extents stays reserved
    /// to the file (module docs); backing files are never touched.
    pub fn truncate(&mut self, size: u64) {
        if !self.whole_file && size < self.size {
            let removed = self.extents.remove_range(size, u64::MAX);
            self.keep_reserved(removed);
        }
        self.size = size;
    }

    /// Makes `offset..offset+len` a hole without changing the size; returns
    /// the extent pieces that were unmapped. Under [`Growth::InPlace`] their
    /// space stays reserved to the file, so the engine may also punch them in
    /// the backing file. Whole-file maps are unchanged (the engine punches the
    /// backing file itself).
    pub fn punch_hole(&mut self, offset: u64, len: u64) -> Vec<Extent> {
        if self.whole_file {
            return Vec::new();
        }
        let removed = self
            .extents
            .remove_range(offset, offset.saturating_add(len));
        self.keep_reserved(removed.clone());
        removed
    }

    fn keep_reserved(&mut self, pieces: Vec<Extent>) {
        let growth = self.growth;
        let keep = |p: &Extent| match growth {
            Growth::InPlace { .. } => true,
            Growth::Guarded { file } => p.file == file,
            _ => false,
        };
        for p in pieces.into_iter().filter(keep) {
            self.reserved.insert(p);
        }
    }

    /// True when a write of `offset..offset+len` changes nothing in the map:
    /// an [`Growth::InPlace`] map (not whole-file) whose extents already map
    /// every byte of the range, below the size, or a [`Growth::Guarded`]
    /// one whose writable file's extents do. Such writes may run
    /// concurrently with each other and with reads.
    pub fn overwrites_in_place(&self, offset: u64, len: u64) -> bool {
        let only = match self.growth {
            _ if self.whole_file => return false,
            Growth::InPlace { .. } => None,
            Growth::Guarded { file } => Some(file),
            _ => return false,
        };
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if end > self.size {
            return false;
        }
        let mut cursor = offset;
        for p in self.extents.pieces_in(offset, end) {
            if p.logical > cursor || only.is_some_and(|f| f != p.file) {
                return false;
            }
            cursor = p.logical_end();
        }
        cursor >= end
    }

    /// `SEEK_DATA`: the first offset at or after `offset` that an extent maps,
    /// or `None` (`ENXIO`) when there is none below the size. Not meaningful
    /// for whole-file maps.
    pub fn next_data(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let e = self.extents.ending_after(offset).next()?;
        let at = e.logical.max(offset);
        (at < self.size).then_some(at)
    }

    /// `SEEK_HOLE`: the first offset at or after `offset` that no extent maps
    /// (the size counts as a hole), or `None` (`ENXIO`) when `offset` is at or
    /// past the size. Not meaningful for whole-file maps.
    pub fn next_hole(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let mut cursor = offset;
        for e in self.extents.ending_after(offset) {
            if e.logical > cursor {
                break;
            }
            cursor = e.logical_end();
        }
        Some(cursor.min(self.size))
    }
}

impl Extent {
    /// The `len` logical bytes right after this extent at the same shift.
    fn slice_after(&self, len: u64) -> Extent {
        Extent {
            logical: self.logical_end(),
            file: self.file,
            offset: self.offset + self.len,
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, file: u32, offset: u64, len: u64) -> Extent {
        Extent {
            logical,
            file,
            offset,
            len,
        }
    }

    fn data(file: u32, offset: u64, len: u64) -> Segment {
        Segment::Data { file, offset, len }
    }

    #[test]
    fn reserve_within_covers_the_gaps_only() {
        let e = |logical, offset, len| ext(logical, 0, offset, len);
        // A slot of 64 bytes at 1000, data at 0..10 and 20..30.
        let mut m = DataMap::new(
            vec![e(0, 1000, 10), e(20, 1020, 10)],
            30,
            Growth::InPlace { limit: Some(64) },
        )
        .unwrap();
        m.reserve_within(e(0, 1000, 64));
        assert_eq!(m.reserved(), &[e(10, 1010, 10), e(30, 1030, 34)]);
        m.validate().unwrap();
        // The hole reads as zeros, and a write into it needs no remap.
        assert!(matches!(m.place_write(12, 4), Placement::Fits(_)));
        assert!(matches!(m.place_write(60, 4), Placement::Fits(_)));
        assert_eq!(m.place_write(62, 4), Placement::NeedsRemap);
        // Again: nothing new.
        let before = m.clone();
        m.reserve_within(e(0, 1000, 64));
        assert_eq!(m, before);
        // An empty file in its slot: all of it reserved.
        let mut empty = DataMap::new(vec![], 0, Growth::InPlace { limit: Some(64) }).unwrap();
        empty.reserve_within(e(0, 1000, 64));
        assert!(matches!(empty.place_write(0, 64), Placement::Fits(_)));
    }

    fn hole(len: u64) -> Segment {
        Segment::Hole { len }
    }

    #[test]
    fn whole_file_is_identity() {
        let mut m = DataMap::whole_file();
        assert!(m.is_whole_file());
        assert_eq!(m.locate(10, 5), vec![data(0, 10, 5)]);
        assert_eq!(m.locate(10, 0), vec![]);
        let p = m.place_write(7, 3);
        assert_eq!(p, Placement::Fits(vec![data(0, 7, 3)]));
        m.commit_write(7, 3, &p);
        assert!(m.extents().is_empty());
        m.truncate(0);
        assert_eq!(m.locate(0, 4), vec![data(0, 0, 4)]);
    }

    #[test]
    fn new_rejects_bad_extents() {
        let g = Growth::InPlace { limit: None };
        let bad = [
            vec![ext(0, 0, 0, 0)],
            vec![ext(10, 0, 0, 5), ext(0, 0, 100, 5)],
            vec![ext(0, 0, 0, 10), ext(5, 0, 100, 10)],
            vec![ext(u64::MAX - 1, 0, 0, 10)],
        ];
        for b in bad {
            assert_eq!(DataMap::new(b, 100, g).unwrap_err().errno(), libc::EINVAL);
        }
        // The log would overwrite a live extent.
        let log = Growth::AppendLog { file: 1, end: 5 };
        assert!(DataMap::new(vec![ext(0, 1, 0, 10)], 10, log).is_err());
        // The tail would grow over another extent of the same file.
        let two = vec![ext(0, 0, 100, 10), ext(10, 0, 0, 10)];
        assert!(DataMap::new(two.clone(), 20, g).is_err());
        // ... unless the limit stops it first.
        assert!(DataMap::new(two, 20, Growth::InPlace { limit: Some(20) }).is_ok());
    }

    #[test]
    fn new_merges_continuing_extents() {
        let m = DataMap::new(
            vec![ext(0, 0, 0, 10), ext(10, 0, 10, 10), ext(20, 1, 20, 10)],
            30,
            Growth::ReadOnly,
        )
        .unwrap();
        assert_eq!(m.extents(), &[ext(0, 0, 0, 20), ext(20, 1, 20, 10)]);
    }

    #[test]
    fn locate_clips_and_fills_holes() {
        let m = DataMap::new(
            vec![ext(10, 0, 0, 10), ext(30, 1, 50, 10)],
            50,
            Growth::ReadOnly,
        )
        .unwrap();
        assert_eq!(
            m.locate(0, 100),
            vec![
                hole(10),
                data(0, 0, 10),
                hole(10),
                data(1, 50, 10),
                hole(10)
            ]
        );
        assert_eq!(
            m.locate(15, 20),
            vec![data(0, 5, 5), hole(10), data(1, 50, 5)]
        );
        assert_eq!(m.locate(50, 10), vec![]);
        assert_eq!(m.place_write(0, 1), Placement::NeedsRemap);
    }

    #[test]
    fn in_place_overwrites_and_extends() {
        let g = Growth::InPlace { limit: Some(100) };
        let mut m = DataMap::new(vec![ext(0, 0, 1000, 10)], 10, g).unwrap();
        let p = m.place_write(5, 10);
        assert_eq!(p, Placement::Fits(vec![data(0, 1005, 10)]));
        m.commit_write(5, 10, &p);
        assert_eq!(m.extents(), &[ext(0, 0, 1000, 15)]);
        assert_eq!(m.size(), 15);
        assert_eq!(m.place_write(95, 10), Placement::NeedsRemap);
        // A gap past the end stays a hole but its space stays ours.
        let p = m.place_write(50, 10);
        assert_eq!(p, Placement::Fits(vec![data(0, 1050, 10)]));
        m.commit_write(50, 10, &p);
        assert_eq!(m.locate(10, 10), vec![data(0, 1010, 5), hole(5)]);
        assert_eq!(m.reserved(), &[ext(15, 0, 1015, 35)]);
        let p = m.place_write(20, 40);
        assert_eq!(p, Placement::Fits(vec![data(0, 1020, 40)]));
        m.commit_write(20, 40, &p);
        assert_eq!(m.extents(), &[ext(0, 0, 1000, 15), ext(20, 0, 1020, 40)]);
        m.validate().unwrap();
    }

    #[test]
    fn in_place_interior_hole_needs_remap() {
        let g = Growth::InPlace { limit: None };
        let m = DataMap::new(vec![ext(0, 0, 0, 10), ext(20, 1, 0, 10)], 30, g).unwrap();
        assert_eq!(m.place_write(12, 2), Placement::NeedsRemap);
        assert_eq!(m.place_write(5, 10), Placement::NeedsRemap);
        assert_eq!(m.place_write(25, 10), Placement::Fits(vec![data(1, 5, 10)]));
    }

    #[test]
    fn slot_past_size_is_reserved() {
        let g = Growth::InPlace { limit: Some(64) };
        let mut m = DataMap::new(vec![ext(0, 3, 4096, 64)], 0, g).unwrap();
        assert!(m.extents().is_empty());
        assert_eq!(m.reserved(), &[ext(0, 3, 4096, 64)]);
        assert_eq!(m.locate(0, 64), vec![]);
        let p = m.place_write(8, 8);
        assert_eq!(p, Placement::Fits(vec![data(3, 4104, 8)]));
        m.commit_write(8, 8, &p);
        assert_eq!(m.locate(0, 64), vec![hole(8), data(3, 4104, 8)]);
        m.truncate(4);
        assert_eq!(m.locate(0, 64), vec![hole(4)]);
        m.truncate(64);
        assert_eq!(m.locate(0, 64), vec![hole(64)]);
        assert_eq!(
            m.place_write(0, 64),
            Placement::Fits(vec![data(3, 4096, 64)])
        );
        m.validate().unwrap();
    }

    #[test]
    fn append_log_shadows() {
        let g = Growth::AppendLog { file: 2, end: 0 };
        let mut m = DataMap::new(vec![], 0, g).unwrap();
        for (off, len) in [(0, 100), (100, 50), (20, 10), (90, 20)] {
            let p = m.place_write(off, len);
            m.commit_write(off, len, &p);
        }
        assert_eq!(
            m.extents(),
            &[
                ext(0, 2, 0, 20),
                ext(20, 2, 150, 10),
                ext(30, 2, 30, 60),
                ext(90, 2, 160, 20),
                ext(110, 2, 110, 40),
            ]
        );
        assert_eq!(m.growth(), Growth::AppendLog { file: 2, end: 180 });
        assert_eq!(m.size(), 150);
        m.truncate(95);
        assert_eq!(m.extents().last(), Some(&ext(90, 2, 160, 5)));
        assert!(m.reserved().is_empty());
        m.validate().unwrap();
    }

    #[test]
    fn sequential_appends_coalesce() {
        let mut m = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
        for i in 0..100 {
            let p = m.place_write(i * 10, 10);
            m.commit_write(i * 10, 10, &p);
        }
        assert_eq!(m.extents(), &[ext(0, 0, 0, 1000)]);
    }

    #[test]
    fn seek_data_and_hole() {
        let m = DataMap::new(
            vec![ext(10, 0, 0, 10), ext(20, 1, 0, 5), ext(40, 0, 10, 10)],
            60,
            Growth::ReadOnly,
        )
        .unwrap();
        assert_eq!(m.next_data(0), Some(10));
        assert_eq!(m.next_data(12), Some(12));
        assert_eq!(m.next_data(25), Some(40));
        assert_eq!(m.next_data(50), None);
        assert_eq!(m.next_data(60), None);
        assert_eq!(m.next_hole(0), Some(0));
        assert_eq!(m.next_hole(10), Some(25));
        assert_eq!(m.next_hole(45), Some(50));
        assert_eq!(m.next_hole(59), Some(59));
        assert_eq!(m.next_hole(60), None);
    }

    #[test]
    fn overwrites_in_place_only_inside_extents() {
        let g = Growth::InPlace { limit: None };
        let m = DataMap::new(
            vec![ext(0, 0, 0, 10), ext(10, 1, 0, 10), ext(30, 0, 10, 5)],
            40,
            g,
        )
        .unwrap();
        assert!(m.overwrites_in_place(0, 20));
        assert!(m.overwrites_in_place(31, 4));
        assert!(!m.overwrites_in_place(15, 10));
        assert!(!m.overwrites_in_place(34, 2));
        let log = DataMap::new(
            vec![ext(0, 0, 0, 10)],
            10,
            Growth::AppendLog { file: 0, end: 10 },
        )
        .unwrap();
        assert!(!log.overwrites_in_place(0, 5));
        assert!(!DataMap::whole_file().overwrites_in_place(0, 5));
    }

    #[test]
    fn punch_hole_keeps_in_place_space() {
        let g = Growth::InPlace { limit: None };
        let mut m = DataMap::new(vec![ext(0, 0, 0, 100)], 100, g).unwrap();
        let removed = m.punch_hole(10, 20);
        assert_eq!(removed, vec![ext(10, 0, 10, 20)]);
        assert_eq!(m.size(), 100);
        assert_eq!(
            m.locate(0, 100),
            vec![data(0, 0, 10), hole(20), data(0, 30, 70)]
        );
        let p = m.place_write(15, 5);
        assert_eq!(p, Placement::Fits(vec![data(0, 15, 5)]));
        m.validate().unwrap();
    }

    /// A guarded map writes in place only into its writable file's pieces;
    /// read-only extents, holes and the end ask for a remap; truncates keep
    /// only the writable file's space.
    #[test]
    fn guarded_maps_write_only_where_made_writable() {
        let g = Growth::Guarded { file: 0 };
        // 0..30 read-only (file 1), 30..60 writable (file 0), 60..100 read-only.
        let mut m = DataMap::new(
            vec![ext(0, 1, 0, 30), ext(30, 0, 30, 30), ext(60, 1, 60, 40)],
            100,
            g,
        )
        .unwrap();
        assert_eq!(
            m.place_write(35, 10),
            Placement::Fits(vec![data(0, 35, 10)])
        );
        assert!(m.overwrites_in_place(35, 10));
        assert!(!m.overwrites_in_place(25, 10), "touches a read-only extent");
        assert_eq!(m.place_write(25, 10), Placement::NeedsRemap);
        assert_eq!(m.place_write(55, 10), Placement::NeedsRemap);
        assert_eq!(m.place_write(100, 1), Placement::NeedsRemap, "past the end");
        assert!(!m.places_nothing());
        // The space a truncate drops stays the file's only where writable.
        m.truncate(40);
        assert_eq!(m.reserved(), &[ext(40, 0, 40, 20)]);
        m.truncate(100);
        assert_eq!(m.locate(30, 70), vec![data(0, 30, 10), hole(60)]);
        assert_eq!(
            m.place_write(45, 10),
            Placement::Fits(vec![data(0, 45, 10)])
        );
        assert_eq!(
            m.place_write(55, 10),
            Placement::NeedsRemap,
            "no longer any file's"
        );
        let p = m.place_write(40, 20);
        m.commit_write(40, 20, &p);
        assert_eq!(m.locate(30, 30), vec![data(0, 30, 30)]);
        assert!(m.reserved().is_empty());
        m.validate().unwrap();
        assert_eq!(m.own_space(), vec![ext(0, 1, 0, 30), ext(30, 0, 30, 30)]);
        // Reserved space of a read-only file is refused.
        let mut bad = m.clone();
        bad.reserved = Extents::from_sorted(vec![ext(70, 1, 70, 10)]);
        assert!(bad.validate().is_err());
        // Space past the size handed in stays reserved only where writable.
        let n = DataMap::new(vec![ext(0, 1, 0, 10), ext(10, 0, 10, 90)], 50, g).unwrap();
        assert_eq!(n.reserved(), &[ext(50, 0, 50, 50)]);
        assert_eq!(
            n.place_write(60, 40),
            Placement::Fits(vec![data(0, 60, 40)])
        );
        // Unguarding moves read-only extents to the writable file and makes
        // holes and the end reserved, at their own offsets.
        let mut u = DataMap::new(vec![ext(0, 1, 0, 30), ext(50, 1, 50, 10)], 60, g).unwrap();
        u.unguard(20, 80);
        u.validate().unwrap();
        assert_eq!(
            u.extents(),
            &[ext(0, 1, 0, 20), ext(20, 0, 20, 10), ext(50, 0, 50, 10)]
        );
        assert_eq!(u.reserved(), &[ext(30, 0, 30, 20), ext(60, 0, 60, 20)]);
        assert_eq!(
            u.locate(20, 40),
            vec![data(0, 20, 10), hole(20), data(0, 50, 10)]
        );
        assert_eq!(
            u.place_write(20, 60),
            Placement::Fits(vec![data(0, 20, 60)])
        );
        assert_eq!(u.place_write(15, 10), Placement::NeedsRemap);
        let before = u.clone();
        u.unguard(25, 70);
        assert_eq!(u, before, "nothing left to unguard there");
    }
}
