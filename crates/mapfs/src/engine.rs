//! The data engine: read, write, truncate, fsync, fallocate, seek and copy
//! over a [`DataMap`] and its backing files. It knows nothing of its caller:
//! the FUSE daemon and the preload shim run the same code.
//!
//! Whole-file 1-to-1 maps go straight to the backing file (`pread`/`pwrite`
//! with no lock taken on the map); other maps are located segment by segment.
//!
//! For other maps the map is the truth: reads are clipped to the map's size,
//! holes (and reserved space, see [`crate::datamap`]) read as zeros whatever
//! the backing bytes are, and a backing file shorter than an extent reads as
//! zeros past its end. Backing files are never shrunk by `truncate` (other
//! files or other opens may share them); only the map changes.
//!
//! Backing files must not be opened with `O_APPEND`: Linux `pwrite` ignores
//! the offset on such files. Executors implement `O_APPEND` by writing at
//! [`DataFile::size`].
//!
//! Locking: whole-file maps take none. Other maps hold one `RwLock`: shared
//! for reads and for overwrites inside an in-place map's extents, exclusive
//! for other writes, truncate and hole punching. The `remap`
//! callback runs under the exclusive lock, so it must not call back into the
//! same [`DataFile`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

use rustix::fs::{FallocateFlags, SeekFrom};

use crate::datamap::{DataMap, Growth, Placement, Segment, MAX_OFFSET};
use crate::error::{Error, Result};
use crate::fs::Opened;

/// Called when a write does not fit the map: given the current map and the
/// write's range, returns the new map and backing files (the file system's
/// `remap`). Empty `files` keep the open's backing files as they are.
pub type Remap<'a> = &'a mut dyn FnMut(&DataMap, u64, u64) -> Result<Opened>;

/// Chunk size for copies that go through the engine rather than the kernel.
const COPY_CHUNK: usize = 1 << 20;

/// One open file's data state: its map and backing files.
#[derive(Debug)]
pub struct DataFile {
    inner: parking_lot::RwLock<State>,
    /// Set when the map is whole-file (at open, or after a remap to one:
    /// a whole-file map never needs a remap, so it stays whole-file).
    whole: OnceLock<Arc<File>>,
}

#[derive(Debug)]
struct State {
    map: DataMap,
    files: Vec<Arc<File>>,
}

impl State {
    /// Backing file 0 when the map is whole-file. `DataFile::whole` answers
    /// first; this covers the moment between a remap and its setting.
    fn whole(&self) -> Result<Option<&File>> {
        if self.map.is_whole_file() {
            self.file(0).map(Some)
        } else {
            Ok(None)
        }
    }

    fn file(&self, idx: u32) -> Result<&File> {
        self.shared_file(idx).map(|f| &**f)
    }

    /// [`State::file`], to use without the lock.
    fn shared_file(&self, idx: u32) -> Result<&Arc<File>> {
        self.files.get(idx as usize).ok_or_else(|| {
            Error::io().context(format!(
                "map names backing file {idx} but only {} are open",
                self.files.len()
            ))
        })
    }
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
                buf = &mut buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Rejects ranges whose end does not fit in `off_t`.
fn check_range(offset: u64, len: u64) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_OFFSET => Ok(end),
        _ => Err(Error::from_errno(libc::EFBIG)),
    }
}

impl DataFile {
    /// Wraps the result of `open`/`create`.
    pub fn new(opened: Opened) -> Self {
        let whole = OnceLock::new();
        if opened.map.is_whole_file() {
            if let Some(f) = opened.files.first() {
                let _ = whole.set(f.clone());
            }
        }
        DataFile {
            inner: parking_lot::RwLock::new(State {
                map: opened.map,
                files: opened.files,
            }),
            whole,
        }
    }

    /// For whole-file 1-to-1 maps, the backing file (what kernel passthrough
    /// and the preload shim hand out). A file whose remap turned it
    /// whole-file answers `Some` from then on.
    pub fn whole_file_backing(&self) -> Option<&Arc<File>> {
        self.whole.get()
    }

    /// A copy of the current map (for `release`).
    pub fn map(&self) -> DataMap {
        self.inner.read().map.clone()
    }

    /// [`DataMap::piece_count`] of the current map.
    pub fn piece_count(&self) -> usize {
        self.inner.read().map.piece_count()
    }

    /// The current map and backing files, read together (what a preload
    /// shim client needs to run its own engine on this open).
    pub fn snapshot(&self) -> (DataMap, Vec<Arc<File>>) {
        let st = self.inner.read();
        (st.map.clone(), st.files.clone())
    }

    /// The backing files, without the map (whose copy costs as much as its
    /// extents: tens of thousands on a plfs N-1 file).
    pub fn files(&self) -> Vec<Arc<File>> {
        self.inner.read().files.clone()
    }

    /// [`DataMap::locate`] on the current map, without copying it.
    pub fn locate(&self, offset: u64, len: u64) -> Vec<Segment> {
        self.inner.read().map.locate(offset, len)
    }

    /// Where logical bytes `offset..offset+len` are now, for an open whose
    /// writes append to a log: the segments of the map, and the log's
    /// backing file index and file. `None` for other growth policies
    /// (whole-file and in-place maps overwrite their backing bytes).
    pub fn locate_in_log(&self, offset: u64, len: u64) -> Option<(Vec<Segment>, u32, Arc<File>)> {
        let st = self.inner.read();
        let Growth::AppendLog { file, .. } = st.map.growth() else {
            return None;
        };
        let log = st.files.get(file as usize)?.clone();
        Some((st.map.locate(offset, len), file, log))
    }

    /// True when `offset..offset+len` of a [`Growth::Guarded`] map lies in
    /// its writable file's extents: bytes written there are the file's own
    /// from then on, as in a whole-file map, and an executor keeps nothing
    /// of them for a successor. False for other maps.
    pub fn written_in_place(&self, offset: u64, len: u64) -> bool {
        if self.whole.get().is_some() {
            return false;
        }
        let st = self.inner.read();
        matches!(st.map.growth(), Growth::Guarded { .. }) && st.map.overwrites_in_place(offset, len)
    }

    /// Replaces the map and backing files, e.g. with the final map a shim
    /// client wrote through (it must have been the only writer meanwhile:
    /// two engines appending to one log would overwrite each other).
    ///
    /// Fails with `EINVAL`, changing nothing, if `map` breaks its invariants,
    /// names a backing file not in `files`, or would turn a whole-file open
    /// into another kind (whole-file opens are served without the lock, so
    /// they stay whole-file over the same backing file).
    pub fn install(&self, map: DataMap, files: Vec<Arc<File>>) -> Result<()> {
        map.validate()?;
        let n = files.len() as u64;
        let bad = |f: u32| u64::from(f) >= n;
        if (map.is_whole_file() && files.is_empty())
            || map
                .extents()
                .iter()
                .chain(map.reserved())
                .any(|e| bad(e.file))
            || matches!(map.growth(), Growth::AppendLog { file, .. } | Growth::Guarded { file } if bad(file))
        {
            return Err(Error::invalid().context("map names a backing file that is not given"));
        }
        let mut st = self.inner.write();
        if let Some(w) = self.whole.get() {
            // `files` is not empty here: checked above for whole-file maps.
            let same =
                map.is_whole_file() && (Arc::ptr_eq(w, &files[0]) || same_inode(w, &files[0])?);
            if !same {
                return Err(Error::invalid().context("a whole-file open stays whole-file"));
            }
        } else if map.is_whole_file() {
            let _ = self.whole.set(files[0].clone());
        }
        st.map = map;
        st.files = files;
        Ok(())
    }

    /// Takes a remap's result (see [`Remap`]) into `st`, this open's state;
    /// a map that became whole-file skips the lock in every op from now on.
    fn take_remap(&self, st: &mut State, opened: Opened) {
        st.map = opened.map;
        if !opened.files.is_empty() {
            st.files = opened.files;
        }
        if st.map.is_whole_file() {
            if let Some(f) = st.files.first() {
                let _ = self.whole.set(f.clone());
            }
        }
    }

    /// Makes the map able to place writes when it can place none
    /// ([`DataMap::places_nothing`], as a file system that gives a writable
    /// open its space at its first write hands out at open): `remap` is asked
    /// for room at the end of the file (a zero-length range there), and its
    /// map and files replace these. For an executor that cannot call the
    /// file system at the first write (a shim client running a lent map).
    /// Other maps are left as they are.
    pub fn make_writable(&self, remap: Remap<'_>) -> Result<()> {
        if self.whole.get().is_some() {
            return Ok(());
        }
        let mut st = self.inner.write();
        if !st.map.places_nothing() {
            return Ok(());
        }
        let size = st.map.size();
        let opened = remap(&st.map, size, 0)?;
        self.take_remap(&mut st, opened);
        Ok(())
    }

    /// Has `remap` make room for a write of `offset..offset+len` that the
    /// map cannot place, and installs its answer; nothing is asked when the
    /// map can place the write already. For a daemon serving a client that
    /// runs this open's map and met such a write (the client cannot call
    /// the file system itself).
    pub fn remap_for_write(&self, offset: u64, len: u64, remap: Remap<'_>) -> Result<()> {
        check_range(offset, len)?;
        if self.whole.get().is_some() {
            return Ok(());
        }
        let mut st = self.inner.write();
        if st.map.place_write(offset, len) != Placement::NeedsRemap {
            return Ok(());
        }
        let opened = remap(&st.map, offset, len)?;
        self.take_remap(&mut st, opened);
        Ok(())
    }

    /// Current logical size.
    pub fn size(&self) -> Result<u64> {
        if let Some(f) = self.whole.get() {
            return Ok(rustix::fs::fstat(f)?.st_size as u64);
        }
        let st = self.inner.read();
        match st.whole()? {
            Some(f) => Ok(rustix::fs::fstat(f)?.st_size as u64),
            None => Ok(st.map.size()),
        }
    }

    /// Reads into `buf` at `offset`; returns bytes read (short only at EOF).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if let Some(f) = self.whole.get() {
            return Ok(read_full_at(f, buf, offset)?);
        }
        let st = self.inner.read();
        if let Some(f) = st.whole()? {
            return Ok(read_full_at(f, buf, offset)?);
        }
        // A range inside one extent (a packed file's slot) needs no list.
        let (one, many);
        let segs: &[Segment] = match st.map.single(offset, buf.len() as u64) {
            Some(seg) => {
                one = [seg];
                &one
            }
            None => {
                many = st.map.locate(offset, buf.len() as u64);
                &many
            }
        };
        let mut done = 0usize;
        for &seg in segs {
            let n = seg.len() as usize;
            let out = &mut buf[done..done + n];
            match seg {
                Segment::Data { file, offset, .. } => {
                    let got = read_full_at(st.file(file)?, out, offset)?;
                    // A backing file shorter than its extent: zeros, like a
                    // sparse tail.
                    out[got..].fill(0);
                }
                Segment::Hole { .. } => out.fill(0),
            }
            done += n;
        }
        Ok(done)
    }

    /// Writes `data` at `offset`, calling `remap` when the map cannot place it.
    ///
    /// A remap is asked for at most once per write; if the new map still
    /// cannot place it the write fails with `ENOSPC`. When an I/O error hits
    /// after some segments were written, those are kept and their length
    /// returned, like a short `write(2)`.
    pub fn write(&self, offset: u64, data: &[u8], remap: Remap<'_>) -> Result<usize> {
        let len = data.len() as u64;
        check_range(offset, len)?;
        if let Some(f) = self.whole.get() {
            f.write_all_at(data, offset)?;
            return Ok(data.len());
        }
        if data.is_empty() {
            return Ok(0);
        }
        {
            // Overwrites inside an in-place map leave the map as it is, so
            // they need only the shared lock and run in parallel.
            let st = self.inner.read();
            if st.map.overwrites_in_place(offset, len) {
                let mut done = 0usize;
                for seg in st.map.locate(offset, len) {
                    let Segment::Data {
                        file,
                        offset: at,
                        len: n,
                    } = seg
                    else {
                        return Err(Error::io().context("hole inside a mapped range"));
                    };
                    let n = n as usize;
                    let res = st
                        .file(file)
                        .and_then(|f| Ok(f.write_all_at(&data[done..done + n], at)?));
                    match res {
                        Ok(()) => done += n,
                        Err(_) if done > 0 => return Ok(done),
                        Err(e) => return Err(e),
                    }
                }
                return Ok(done);
            }
        }
        let mut st = self.inner.write();
        let mut placement = st.map.place_write(offset, len);
        if placement == Placement::NeedsRemap {
            let opened = remap(&st.map, offset, len)?;
            self.take_remap(&mut st, opened);
            placement = st.map.place_write(offset, len);
        }
        let Placement::Fits(segs) = placement else {
            return Err(Error::from_errno(libc::ENOSPC)
                .context("remapped map still cannot place the write"));
        };
        if let [Segment::Data {
            file, offset: at, ..
        }] = segs[..]
        {
            if st.map.claim_log_end(&segs) {
                // At the end of the open's log, claimed: the bytes go there
                // without the lock, so writes through opens sharing this
                // map (the kernel's writeback) run side by side; the
                // extent is added once they are there. A failed write
                // leaves its claim unused.
                let f = st.shared_file(file)?.clone();
                drop(st);
                f.write_all_at(data, at)?;
                let placed = Placement::Fits(segs);
                self.inner.write().map.commit_write(offset, len, &placed);
                return Ok(data.len());
            }
        }
        let mut done = 0usize;
        for (i, seg) in segs.iter().enumerate() {
            let Segment::Data {
                file,
                offset: at,
                len: n,
            } = *seg
            else {
                return Err(Error::io().context("placement holds a hole"));
            };
            let n = n as usize;
            let res = st
                .file(file)
                .and_then(|f| Ok(f.write_all_at(&data[done..done + n], at)?));
            if let Err(e) = res {
                if done == 0 {
                    return Err(e);
                }
                let written = Placement::Fits(segs[..i].to_vec());
                st.map.commit_write(offset, done as u64, &written);
                return Ok(done);
            }
            done += n;
        }
        debug_assert_eq!(done, data.len());
        let placed = Placement::Fits(segs);
        st.map.commit_write(offset, len, &placed);
        Ok(done)
    }

    /// Sets the size.
    pub fn truncate(&self, size: u64) -> Result<()> {
        check_range(size, 0)?;
        if let Some(f) = self.whole.get() {
            f.set_len(size)?;
            return Ok(());
        }
        let mut st = self.inner.write();
        match st.whole()? {
            Some(f) => f.set_len(size)?,
            None => st.map.truncate(size),
        }
        Ok(())
    }

    /// Flushes the backing files (`datasync`: data only).
    pub fn fsync(&self, datasync: bool) -> Result<()> {
        let sync = |f: &File| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
        };
        if let Some(f) = self.whole.get() {
            return Ok(sync(f)?);
        }
        // Sync without holding the lock: writers need not wait for the disk.
        let (files, own) = {
            let st = self.inner.read();
            let own = match st.map.growth() {
                Growth::AppendLog { file, .. } | Growth::Guarded { file } => Some(file as usize),
                _ => None,
            };
            (st.files.clone(), own)
        };
        // The file this open writes first: the other files of a log map are
        // other writers' logs, which their own writers sync at the same
        // moment in a checkpoint. Synced first, they made each writer wait
        // for another's bytes before its own (on a network store each sync
        // ships everything the file has dirty).
        let order = own
            .filter(|&o| o < files.len())
            .into_iter()
            .chain((0..files.len()).filter(|&i| Some(i) != own));
        let mut done: Vec<&Arc<File>> = Vec::with_capacity(files.len());
        for i in order {
            let f = &files[i];
            if done.iter().any(|g| Arc::ptr_eq(f, g)) {
                continue;
            }
            sync(f)?;
            done.push(f);
        }
        Ok(())
    }

    /// `fallocate(2)` with its `mode` (0, `FALLOC_FL_KEEP_SIZE`,
    /// `FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE`, `FALLOC_FL_ZERO_RANGE`).
    ///
    /// Whole-file maps pass every mode to the backing file. For other maps:
    /// mode 0 grows the size to `offset+len` (the new bytes are a hole: no
    /// space is reserved, so a later write may still fail with `ENOSPC`);
    /// `KEEP_SIZE` alone does nothing; `PUNCH_HOLE` and `ZERO_RANGE` unmap the
    /// range (it reads as zeros), and under [`Growth::InPlace`] also punch the
    /// freed backing bytes, best effort, to give the space back; under
    /// [`Growth::Guarded`] the writable file's freed bytes are zeroed for
    /// sure. Other modes answer `EOPNOTSUPP`.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid());
        }
        let end = check_range(offset, len)?;
        let flags = FallocateFlags::from_bits_retain(mode as u32);
        if let Some(f) = self.whole.get() {
            rustix::fs::fallocate(f, flags, offset, len)?;
            return Ok(());
        }
        let mut st = self.inner.write();
        if let Some(f) = st.whole()? {
            rustix::fs::fallocate(f, flags, offset, len)?;
            return Ok(());
        }
        let keep = flags.contains(FallocateFlags::KEEP_SIZE);
        let punch = flags.contains(FallocateFlags::PUNCH_HOLE);
        let zero = flags.contains(FallocateFlags::ZERO_RANGE);
        let known =
            FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE | FallocateFlags::ZERO_RANGE;
        if !known.contains(flags) || (punch && (!keep || zero)) {
            return Err(Error::from_errno(libc::EOPNOTSUPP));
        }
        if punch || zero {
            let removed = st.map.punch_hole(offset, len);
            if let Growth::Guarded { file } = st.map.growth() {
                // The writable file's bytes are the file's own, in place:
                // they must read as zeros there too, for whoever settles
                // the map into the backing file (`versions`) compares maps
                // and cannot see writes a punch hid again.
                for r in removed.iter().filter(|r| r.file == file) {
                    zero_backing(st.file(file)?, r.offset, r.len)?;
                }
            }
            if let Growth::InPlace { .. } = st.map.growth() {
                let hole = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
                for r in removed {
                    if let Ok(f) = st.file(r.file) {
                        // Best effort: the map already reads the range as
                        // zeros; this only frees disk blocks.
                        let _ = rustix::fs::fallocate(f, hole, r.offset, r.len);
                    }
                }
            }
        }
        if !keep && end > st.map.size() {
            st.map.truncate(end);
        }
        Ok(())
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (others are the caller's).
    pub fn seek(&self, offset: u64, whence: i32) -> Result<u64> {
        if offset > MAX_OFFSET {
            return Err(Error::from_errno(libc::ENXIO));
        }
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(Error::invalid()),
        };
        let pos = if data {
            SeekFrom::Data(offset)
        } else {
            SeekFrom::Hole(offset)
        };
        if let Some(f) = self.whole.get() {
            return Ok(rustix::fs::seek(f, pos)?);
        }
        let st = self.inner.read();
        if let Some(f) = st.whole()? {
            return Ok(rustix::fs::seek(f, pos)?);
        }
        let found = if data {
            st.map.next_data(offset)
        } else {
            st.map.next_hole(offset)
        };
        found.ok_or_else(|| Error::from_errno(libc::ENXIO))
    }
}

/// Makes `len` bytes at `offset` of `f` read as zeros: a punched hole, or
/// zeros written where the file system cannot punch.
pub fn zero_backing(f: &File, offset: u64, len: u64) -> Result<()> {
    let hole = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    if rustix::fs::fallocate(f, hole, offset, len).is_ok() {
        return Ok(());
    }
    let buf = vec![0u8; len.min(COPY_CHUNK as u64) as usize];
    let mut at = offset;
    while at < offset + len {
        let n = buf.len().min((offset + len - at) as usize);
        f.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// True when the two files are the same inode.
fn same_inode(a: &File, b: &File) -> Result<bool> {
    let (sa, sb) = (rustix::fs::fstat(a)?, rustix::fs::fstat(b)?);
    Ok(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
}

/// Copies `len` bytes from `src` at `off_in` to `dst` at `off_out`
/// (`copy_file_range` between backing files when both are whole-file maps).
///
/// Returns the bytes copied, fewer than `len` only when `src` ends first.
/// Like `copy_file_range(2)`, overlapping ranges of one file are `EINVAL`.
pub fn copy_range(
    src: &DataFile,
    off_in: u64,
    dst: &DataFile,
    off_out: u64,
    len: u64,
    remap: Remap<'_>,
) -> Result<usize> {
    check_range(off_in, 0)?;
    check_range(off_out, 0)?;
    // Copy no further than the source's size now: a copy within one file
    // that extends it must not then read back its own new bytes, which one
    // `copy_file_range(2)` call would not either.
    let len = len
        .min(isize::MAX as u64)
        .min(src.size()?.saturating_sub(off_in));
    if len == 0 {
        return Ok(0);
    }
    check_range(off_out, len)?;
    // Checked on the clipped length, as the kernel does.
    let overlap = off_in < off_out + len && off_out < off_in + len;
    if let (Some(fi), Some(fo)) = (src.whole.get(), dst.whole.get()) {
        if overlap && same_inode(fi, fo)? {
            return Err(Error::invalid());
        }
        let (mut pin, mut pout) = (off_in, off_out);
        let mut done: u64 = 0;
        while done < len {
            let want = (len - done).min(1 << 30) as usize;
            match rustix::fs::copy_file_range(fi, Some(&mut pin), fo, Some(&mut pout), want) {
                Ok(0) => return Ok(done as usize),
                Ok(n) => done += n as u64,
                Err(rustix::io::Errno::INTR) => {}
                // The kernel cannot copy between these files (other file
                // systems, special files): copy the rest by hand.
                Err(
                    rustix::io::Errno::XDEV
                    | rustix::io::Errno::INVAL
                    | rustix::io::Errno::NOSYS
                    | rustix::io::Errno::OPNOTSUPP,
                ) => {
                    let rest = copy_by_hand(src, pin, dst, pout, len - done, remap)?;
                    return Ok((done + rest) as usize);
                }
                Err(e) => {
                    return if done > 0 {
                        Ok(done as usize)
                    } else {
                        Err(e.into())
                    }
                }
            }
        }
        return Ok(done as usize);
    }
    if overlap && std::ptr::eq(src, dst) {
        return Err(Error::invalid());
    }
    Ok(copy_by_hand(src, off_in, dst, off_out, len, remap)? as usize)
}

/// Read-then-write copy through the engine, in chunks.
fn copy_by_hand(
    src: &DataFile,
    mut off_in: u64,
    dst: &DataFile,
    mut off_out: u64,
    len: u64,
    remap: Remap<'_>,
) -> Result<u64> {
    let mut buf = vec![0u8; (len as usize).min(COPY_CHUNK)];
    let mut done = 0u64;
    while done < len {
        let want = ((len - done) as usize).min(buf.len());
        let got = src.read(off_in, &mut buf[..want])?;
        if got == 0 {
            break;
        }
        let put = dst.write(off_out, &buf[..got], &mut *remap)?;
        done += put as u64;
        off_in += put as u64;
        off_out += put as u64;
        if put < got {
            break;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datamap::Extent;
    use std::sync::mpsc;
    use std::time::Duration;

    fn opened(map: DataMap) -> Opened {
        Opened {
            map,
            files: vec![Arc::new(tempfile::tempfile().unwrap())],
            handle: 0,
        }
    }

    fn no_remap(_: &DataMap, _: u64, _: u64) -> Result<Opened> {
        Err(Error::io())
    }

    /// Runs `f` on another thread while this one holds `df`'s lock (shared
    /// or exclusive); true when `f` finished, i.e. did not need the lock.
    fn runs_while_locked(df: &Arc<DataFile>, exclusive: bool, f: fn(&DataFile)) -> bool {
        let (tx, rx) = mpsc::channel();
        let mut shared = None;
        let mut excl = None;
        if exclusive {
            excl = Some(df.inner.write());
        } else {
            shared = Some(df.inner.read());
        }
        let df2 = df.clone();
        let t = std::thread::spawn(move || {
            f(&df2);
            let _ = tx.send(());
        });
        // Generous: this detects a blocked call, it measures nothing.
        let done = rx.recv_timeout(Duration::from_secs(20)).is_ok();
        drop(excl);
        drop(shared);
        t.join().unwrap();
        done
    }

    #[test]
    fn whole_file_ops_take_no_lock() {
        let df = Arc::new(DataFile::new(opened(DataMap::whole_file())));
        assert!(runs_while_locked(&df, true, |df| {
            df.write(0, &[1; 4096], &mut no_remap).unwrap();
            let mut buf = [0; 4096];
            assert_eq!(df.read(0, &mut buf).unwrap(), 4096);
            assert_eq!(df.size().unwrap(), 4096);
            df.truncate(100).unwrap();
            df.fsync(true).unwrap();
        }));
    }

    #[test]
    fn install_checks_and_switches() {
        let ext = |file| Extent {
            logical: 0,
            file,
            offset: 0,
            len: 10,
        };
        let map = DataMap::new(vec![ext(0)], 10, Growth::ReadOnly).unwrap();
        let df = DataFile::new(opened(map.clone()));
        let (m, files) = df.snapshot();
        assert_eq!(m, map);
        let bad = DataMap::new(vec![ext(1)], 10, Growth::ReadOnly).unwrap();
        assert_eq!(
            df.install(bad, files.clone()).unwrap_err().errno(),
            libc::EINVAL
        );
        let log = DataMap::new(vec![ext(0)], 10, Growth::AppendLog { file: 1, end: 0 }).unwrap();
        assert!(df.install(log, files.clone()).is_err());
        df.install(DataMap::whole_file(), files.clone()).unwrap();
        assert!(df.whole_file_backing().is_some());
        // Whole-file stays whole-file.
        assert!(df.install(map, files.clone()).is_err());
        let empty = DataMap::new(vec![], 0, Growth::ReadOnly).unwrap();
        assert!(df.install(empty, vec![]).is_err());
        let other = vec![Arc::new(tempfile::tempfile().unwrap())];
        assert!(df.install(DataMap::whole_file(), other).is_err());
        df.install(DataMap::whole_file(), files).unwrap();
    }

    /// Writes at the end of a shared append log, from threads at once (the
    /// kernel writing pages back through opens sharing one map): each gets
    /// its own place in the log, claimed before its bytes go there without
    /// the lock, and every block reads back.
    #[test]
    fn appends_from_threads_each_get_their_place() {
        let map = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
        let df = Arc::new(DataFile::new(opened(map)));
        const THREADS: u64 = 4;
        const BLOCKS: u64 = 300;
        const BS: u64 = 1000;
        let block = |i: u64| vec![(i % 251) as u8 + 1; BS as usize];
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let df = df.clone();
                std::thread::spawn(move || {
                    for k in 0..BLOCKS {
                        let i = k * THREADS + t;
                        let n = df.write(i * BS, &block(i), &mut no_remap).unwrap();
                        assert_eq!(n, BS as usize);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total = THREADS * BLOCKS;
        assert_eq!(df.size().unwrap(), total * BS);
        for i in 0..total {
            let mut buf = vec![0; BS as usize];
            assert_eq!(df.read(i * BS, &mut buf).unwrap(), BS as usize);
            assert!(buf == block(i), "block {i}");
        }
        let (map, files) = df.snapshot();
        assert_eq!(
            map.growth(),
            Growth::AppendLog {
                file: 0,
                end: total * BS
            }
        );
        assert_eq!(files[0].metadata().unwrap().len(), total * BS);
    }

    #[test]
    fn in_place_overwrites_share_the_lock() {
        let ext = Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 8192,
        };
        let map = DataMap::new(vec![ext], 8192, Growth::InPlace { limit: None }).unwrap();
        let df = Arc::new(DataFile::new(opened(map)));
        assert!(runs_while_locked(&df, false, |df| {
            df.write(100, &[1; 4096], &mut no_remap).unwrap();
        }));
        assert_eq!(df.size().unwrap(), 8192);
    }
}
