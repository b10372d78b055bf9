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

use serde::{Deserialize, Serialize};

use crate::error::Result;

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

/// Where bytes written outside the current extents go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Growth {
    /// Extend the extent that ends where the write starts (or the last extent
    /// when writing past the end, keeping the same logical->backing shift),
    /// as long as the file stays within `limit` bytes (`None`: no limit; an
    /// M-to-1 slot sets its capacity). A write into a hole that is not
    /// adjacent to the last extent needs a remap.
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
    extents: Vec<Extent>,
    size: u64,
    growth: Growth,
    whole_file: bool,
}

impl DataMap {
    /// The whole-file 1-to-1 map onto backing file 0.
    pub fn whole_file() -> Self {
        todo!()
    }

    /// A map from parts. Fails with `EINVAL` if extents overlap, are unsorted,
    /// empty, or the growth policy names a file no extent could use.
    pub fn new(extents: Vec<Extent>, size: u64, growth: Growth) -> Result<Self> {
        todo!()
    }

    /// True for [`DataMap::whole_file`] maps.
    pub fn is_whole_file(&self) -> bool {
        self.whole_file
    }

    /// The extents, sorted by logical offset.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
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

    /// The backing segments and holes of `offset..offset+len`, clipped to the
    /// logical size (so the sum of lengths may be less than `len`).
    pub fn locate(&self, offset: u64, len: u64) -> Vec<Segment> {
        todo!()
    }

    /// Where a write of `len` bytes at `offset` goes under the growth policy.
    pub fn place_write(&self, offset: u64, len: u64) -> Placement {
        todo!()
    }

    /// Records a write placed by [`DataMap::place_write`]: extents and size
    /// grow to cover it.
    pub fn commit_write(&mut self, offset: u64, len: u64, placement: &Placement) {
        todo!()
    }

    /// Sets the logical size: shrinking drops or trims extents past it;
    /// growing leaves a hole.
    pub fn truncate(&mut self, size: u64) {
        todo!()
    }
}
