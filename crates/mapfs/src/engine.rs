//! The data engine: read, write, truncate, fsync, fallocate, seek and copy
//! over a [`DataMap`] and its backing files. It knows nothing of its caller:
//! the FUSE daemon and the preload shim run the same code.
//!
//! Whole-file 1-to-1 maps go straight to the backing file (`pread`/`pwrite`
//! with no lock taken on the map); other maps are located segment by segment.

use std::fs::File;
use std::sync::Arc;

use crate::datamap::DataMap;
use crate::error::Result;
use crate::fs::Opened;

/// Called when a write does not fit the map: given the current map and the
/// write's range, returns the new map and backing files (the file system's
/// `remap`).
pub type Remap<'a> = &'a mut dyn FnMut(&DataMap, u64, u64) -> Result<Opened>;

/// One open file's data state: its map and backing files.
#[derive(Debug)]
pub struct DataFile {
    inner: parking_lot::RwLock<State>,
    whole: Option<Arc<File>>,
}

#[derive(Debug)]
struct State {
    map: DataMap,
    files: Vec<Arc<File>>,
}

impl DataFile {
    /// Wraps the result of `open`/`create`.
    pub fn new(opened: Opened) -> Self {
        todo!()
    }

    /// For whole-file 1-to-1 maps, the backing file (what kernel passthrough
    /// and the preload shim hand out).
    pub fn whole_file_backing(&self) -> Option<&Arc<File>> {
        self.whole.as_ref()
    }

    /// A copy of the current map (for `release`).
    pub fn map(&self) -> DataMap {
        self.inner.read().map.clone()
    }

    /// Current logical size.
    pub fn size(&self) -> Result<u64> {
        todo!()
    }

    /// Reads into `buf` at `offset`; returns bytes read (short only at EOF).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        todo!()
    }

    /// Writes `data` at `offset`, calling `remap` when the map cannot place it.
    pub fn write(&self, offset: u64, data: &[u8], remap: Remap<'_>) -> Result<usize> {
        todo!()
    }

    /// Sets the size.
    pub fn truncate(&self, size: u64) -> Result<()> {
        todo!()
    }

    /// Flushes the backing files (`datasync`: data only).
    pub fn fsync(&self, datasync: bool) -> Result<()> {
        todo!()
    }

    /// `fallocate(2)` with its `mode` (0, `FALLOC_FL_KEEP_SIZE`,
    /// `FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_ZERO_RANGE`).
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        todo!()
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (others are the caller's).
    pub fn seek(&self, offset: u64, whence: i32) -> Result<u64> {
        todo!()
    }
}

/// Copies `len` bytes from `src` at `off_in` to `dst` at `off_out`
/// (`copy_file_range` between backing files when both are whole-file maps).
pub fn copy_range(
    src: &DataFile,
    off_in: u64,
    dst: &DataFile,
    off_out: u64,
    len: u64,
    remap: Remap<'_>,
) -> Result<usize> {
    todo!()
}
