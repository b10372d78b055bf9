//! Opens lent to this process: maps that are not whole-file 1-to-1 (an
//! append log, read-only pieces), executed by the data engine in-process.
//!
//! The application's descriptor stays a descriptor of the mount file (the
//! *placeholder*, libplfs's idea): `fstat`'s identity, `fchmod`, `ioctl`
//! and the final `close` are the mount's. Only the data calls the shim hooks
//! run here, against the map and backing descriptors the daemon lent
//! ([`mapfs::control::Request::Adopt`] with `engine`). The offset lives here
//! too, shared by the descriptors `dup`ed from the one open (as the kernel
//! shares it); the open's own offset is set from it when the open is
//! handed back to the mount.
//!
//! For a *writable* lending the placeholder is a second open of the file
//! with access mode 3 (neither read nor write), and the open itself is kept
//! at a high descriptor number, where locks, `F_GETFL`/`F_SETFL` and the
//! sync after a pushed map go. A call the shim cannot see (a raw system
//! call, io_uring) on the application's number then fails the same way
//! every time: `read`/`write`/`pread`/`pwrite`/`copy_file_range`/
//! `fallocate`/`ftruncate` with `EBADF`, `lseek` with `ESPIPE`, `mmap`
//! with `EACCES`, `fsync` with `EIO`, instead of reaching the daemon, or the
//! kernel's cached size, with a map older than the program's writes; and
//! the map's size is kept in a page shared with the daemon
//! ([`mapfs::lentsize`]), so a `stat` the shim does not see reports it. A
//! read-only lending keeps the open itself under the application's number:
//! its map cannot change here, so the daemon answers such calls exactly as
//! the shim would. Hand-back puts the open back under every number.
//!
//! An open is handed back (its map pushed to the daemon, the kernel offset
//! set, the lending ended) before anything the shim cannot run itself sees
//! the descriptor: `mmap`, a stdio stream, `sendfile`/`splice`/
//! `copy_file_range`, `fork`, `exec`, and a write the map cannot place
//! (it needs the file system's `remap`), except in a guarded map (copy on
//! write in place, `versions`'s writers), where the daemon remaps for the
//! shim ([`mapfs::control::Request::Remap`]) and the open stays lent.
//!
//! A *copy* ([`mapfs::control::Response::Copied`]) is a read-only lending
//! of a copy of the file's bytes in this process's memory, for a file whose
//! backing file holds other users' files too. It is read only while the
//! file's token is the one read before asking and the daemon that made it
//! runs ([`Lent::copy_stale`]); the first call after that hands it back.

use std::sync::atomic::{AtomicBool, Ordering};

use mapfs::control::{Request, Response};
use mapfs::engine::DataFile;
use mapfs::lentsize::LentSize;
use mapfs::{DataMap, Growth};
use mapfs_interpose::sync::{Mutex, RwLock};

/// Why a call cannot be served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The call fails with this errno, as the kernel would fail it.
    Errno(i32),
    /// The map cannot serve it: hand the open back and make the call
    /// through the mount.
    NeedsMount,
}

impl From<mapfs::Error> for Refusal {
    fn from(e: mapfs::Error) -> Self {
        Refusal::Errno(e.errno())
    }
}

/// Result of a lent call.
pub type LentResult<T> = Result<T, Refusal>;

/// A lent open: its data state, offset and access.
pub struct Lent {
    /// The mount it came from (index into [`crate::mounts::all`]).
    mount: usize,
    /// The lending itself; replaced when the daemon that lent it was (see
    /// [`Lent::relend`]), which data calls wait out.
    lending: RwLock<Lending>,
    offset: Mutex<u64>,
    readable: bool,
    writable: bool,
    append: AtomicBool,
    wrote: AtomicBool,
    /// A copy's validity (see the module docs).
    copy: Option<CopyOf>,
}

/// What a copy of a file's bytes stays valid under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOf {
    /// The file's inode on the mount.
    pub ino: u64,
    /// Its token, with its table ([`crate::mounts::Mount::copy_token`]),
    /// read before the daemon was asked.
    pub token: (u64, u64),
}

/// What one daemon lent.
struct Lending {
    /// The daemon's name for this lending.
    handle: u64,
    data: DataFile,
    /// Where the daemon reads this open's size (writable lendings); it
    /// holds the map's size.
    size_page: Option<LentSize>,
    /// Handed back ([`Lent::end`]): data calls go through the mount.
    ended: bool,
}

impl Lending {
    /// After a write ending at `end`: the size grew only if `end` passed it.
    fn grew_to(&self, end: u64) {
        if let Some(p) = &self.size_page {
            if end > p.get() {
                p.set(end);
            }
        }
    }

    /// After a change that may set the size anywhere (truncate, allocate).
    fn resized(&self) {
        if let (Some(p), Ok(size)) = (&self.size_page, self.data.size()) {
            p.set(size);
        }
    }
}

impl Lent {
    /// A lent open with map `data`, at `offset`, opened with `flags`;
    /// `size_page` is where the daemon reads its size (writable lendings).
    pub fn new(
        mount: usize,
        handle: u64,
        data: DataFile,
        size_page: Option<LentSize>,
        offset: u64,
        flags: i32,
    ) -> Self {
        let access = flags & libc::O_ACCMODE;
        let lending = Lending {
            handle,
            data,
            size_page,
            ended: false,
        };
        lending.resized();
        Lent {
            mount,
            lending: RwLock::new(lending),
            offset: Mutex::new(offset),
            readable: access != libc::O_WRONLY,
            writable: access != libc::O_RDONLY,
            append: AtomicBool::new(flags & libc::O_APPEND != 0),
            wrote: AtomicBool::new(false),
            copy: None,
        }
    }

    /// A read-only lending of `bytes`, a copy of the file's bytes the daemon
    /// made after `copy.token` was read, at `offset`: the map is 1-to-1 on a
    /// sealed memfd holding them.
    pub fn copied(
        mount: usize,
        bytes: &[u8],
        copy: CopyOf,
        offset: u64,
        flags: i32,
    ) -> std::io::Result<Self> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            "mapfs-copy",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let file = std::fs::File::from(fd);
        std::os::unix::fs::FileExt::write_all_at(&file, bytes, 0)?;
        rustix::fs::fcntl_add_seals(
            &file,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
        )?;
        let len = bytes.len() as u64;
        let extents = if len == 0 {
            Vec::new()
        } else {
            vec![mapfs::Extent {
                logical: 0,
                file: 0,
                offset: 0,
                len,
            }]
        };
        let map = DataMap::new(extents, len, Growth::ReadOnly)?;
        let data = DataFile::new(mapfs::Opened {
            map,
            files: vec![std::sync::Arc::new(file)],
            handle: 0,
        });
        let mut lent = Lent::new(mount, 0, data, None, offset, flags);
        lent.copy = Some(copy);
        Ok(lent)
    }

    /// A copy whose file may have changed since it was made (its token
    /// moved, or the daemon that would move it died): it must not be read.
    /// False for other lendings.
    pub fn copy_stale(&self) -> bool {
        let Some(c) = &self.copy else {
            return false;
        };
        let Some(m) = crate::mounts::all().get(self.mount) else {
            return true;
        };
        !m.daemon_alive() || m.copy_token(c.ino) != Some(c.token)
    }

    /// For a read-only lending of one extent from byte 0 (a packed file's
    /// slot): the backing descriptor, the offset of the file's byte 0 in
    /// it, and the size. Its reads need nothing else, and nothing here
    /// changes them (a read-only lending is never lent again). The
    /// descriptor stays open as long as this lending.
    pub fn direct(&self) -> Option<(std::os::fd::RawFd, u64, u64)> {
        use std::os::fd::AsRawFd;
        if self.writable || !self.readable || self.copy.is_some() {
            return None;
        }
        let (map, files) = self.lending.read().data.snapshot();
        let e = map.extents().first().filter(|_| map.extents().len() == 1)?;
        (!map.is_whole_file() && e.logical == 0 && e.len >= map.size()).then_some((
            files.get(e.file as usize)?.as_raw_fd(),
            e.offset,
            map.size(),
        ))
    }

    /// A copy of the file's bytes, not a lending of its map.
    pub fn is_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// The daemon's name for this lending.
    pub fn handle(&self) -> u64 {
        self.lending.read().handle
    }

    /// Takes the same open lent again by a daemon that replaced the one
    /// that lent it (failover): carries this process's bytes into the new
    /// lending (see [`mapfs::carry`]) and runs on it from now on. Returns
    /// the bytes copied; on error the old lending stays.
    pub fn relend(
        &self,
        handle: u64,
        data: DataFile,
        size_page: Option<LentSize>,
    ) -> mapfs::Result<u64> {
        let mut lending = self.lending.write();
        if mapfs::carry::same_log(&lending.data, &data) {
            // The same daemon lent it again: this map is still its own.
            lending.handle = handle;
            lending.size_page = size_page;
            lending.resized();
            return Ok(0);
        }
        // A guarded map's new lending may need the daemon's remap for what
        // this process wrote in place past the size the new daemon found.
        let mut remap = |map: &DataMap, offset: u64, len: u64| {
            self.remap_by_daemon(handle, map, offset, len)
                .ok_or_else(|| mapfs::Error::from_errno(libc::EOPNOTSUPP))
        };
        let copied = mapfs::carry::carry_over_remapping(&lending.data, &data, &mut remap)?;
        *lending = Lending {
            handle,
            data,
            size_page,
            ended: lending.ended,
        };
        lending.resized();
        Ok(copied)
    }

    /// Opened for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Something changed the file's bytes or size through this open.
    pub fn wrote(&self) -> bool {
        self.wrote.load(Ordering::Relaxed)
    }

    /// The current map (for the daemon).
    pub fn map(&self) -> DataMap {
        self.lending.read().data.map()
    }

    /// The offset of the open file description.
    pub fn offset(&self) -> u64 {
        *self.offset.lock()
    }

    /// Follows `F_SETFL`.
    pub fn set_flags(&self, flags: i32) {
        self.append
            .store(flags & libc::O_APPEND != 0, Ordering::Relaxed);
    }

    /// File size as this open sees it.
    pub fn size(&self) -> LentResult<u64> {
        Ok(self.live()?.data.size()?)
    }

    fn check_read(&self) -> LentResult<()> {
        if self.readable {
            Ok(())
        } else {
            Err(Refusal::Errno(libc::EBADF))
        }
    }

    fn check_write(&self) -> LentResult<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Refusal::Errno(libc::EBADF))
        }
    }

    /// The lending, for a data call; `NeedsMount` once it was handed back
    /// ([`Lent::end`]) while the call was on its way.
    fn live(&self) -> LentResult<mapfs_interpose::sync::RwLockReadGuard<'_, Lending>> {
        let l = self.lending.read();
        if l.ended {
            return Err(Refusal::NeedsMount);
        }
        Ok(l)
    }

    /// Ends the lending before it is handed back: waits for the data calls
    /// running on it (a write that finished after the map was pushed would
    /// be lost), and sends later ones to the mount. Returns the final map.
    pub fn end(&self) -> DataMap {
        let mut l = self.lending.write();
        l.ended = true;
        l.data.map()
    }

    /// `pread`.
    pub fn pread(&self, buf: &mut [u8], offset: u64) -> LentResult<usize> {
        self.check_read()?;
        Ok(self.live()?.data.read(offset, buf)?)
    }

    /// `read` at the description's offset, which it advances.
    pub fn read(&self, buf: &mut [u8]) -> LentResult<usize> {
        self.check_read()?;
        let mut off = self.offset.lock();
        let n = self.live()?.data.read(*off, buf)?;
        *off += n as u64;
        Ok(n)
    }

    /// Writes at `offset` (or at the end with `O_APPEND`, as Linux does
    /// for `pwrite` too); returns the bytes written and where they ended.
    fn write_at(&self, data: &[u8], offset: u64) -> LentResult<(usize, u64)> {
        let lending = self.live()?;
        let at = if self.append.load(Ordering::Relaxed) {
            lending.data.size()?
        } else {
            offset
        };
        // Past this the map is too large to push: the mount's daemon keeps
        // it instead.
        if lending.data.piece_count() >= mapfs::control::MAX_LENT_EXTENTS {
            return Err(Refusal::NeedsMount);
        }
        let mut needs_mount = false;
        let mut remap = |map: &mapfs::DataMap, offset: u64, len: u64| {
            // The file system's remap runs in the daemon.
            self.remap_by_daemon(lending.handle, map, offset, len)
                .ok_or_else(|| {
                    needs_mount = true;
                    mapfs::Error::from_errno(libc::EOPNOTSUPP)
                })
        };
        match lending.data.write(at, data, &mut remap) {
            Ok(n) => {
                self.wrote.store(true, Ordering::Relaxed);
                let end = at + n as u64;
                lending.grew_to(end);
                Ok((n, end))
            }
            Err(_) if needs_mount => Err(Refusal::NeedsMount),
            Err(e) => Err(e.into()),
        }
    }

    /// Has the daemon remap lending `handle` (map `map`) for a write at
    /// `offset..offset+len`; `None` when it would not. Only guarded maps are
    /// remapped for a client (others are handed back to the mount), so no
    /// other map is asked about.
    fn remap_by_daemon(
        &self,
        handle: u64,
        map: &mapfs::DataMap,
        offset: u64,
        len: u64,
    ) -> Option<mapfs::Opened> {
        if !matches!(map.growth(), Growth::Guarded { .. }) {
            return None;
        }
        let m = crate::mounts::all().get(self.mount)?;
        let req = |map| Request::Remap {
            handle,
            map,
            offset,
            len,
        };
        match m.call_with_map(handle, map.clone(), req) {
            Ok((Response::Remapped { map, files }, fds)) if fds.len() >= files as usize => {
                let files = fds
                    .into_iter()
                    .take(files as usize)
                    .map(|fd| std::sync::Arc::new(std::fs::File::from(fd)))
                    .collect();
                Some(mapfs::Opened {
                    map,
                    files,
                    handle: 0,
                })
            }
            other => {
                crate::sys::log(format_args!(
                    "the daemon did not remap a lent open ({other:?})"
                ));
                None
            }
        }
    }

    /// `pwrite`.
    pub fn pwrite(&self, data: &[u8], offset: u64) -> LentResult<usize> {
        self.check_write()?;
        Ok(self.write_at(data, offset)?.0)
    }

    /// `write` at the description's offset, which it advances.
    pub fn write(&self, data: &[u8]) -> LentResult<usize> {
        self.check_write()?;
        let mut off = self.offset.lock();
        let (n, end) = self.write_at(data, *off)?;
        *off = end;
        Ok(n)
    }

    /// `lseek`.
    pub fn seek(&self, offset: i64, whence: i32) -> LentResult<u64> {
        let mut off = self.offset.lock();
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => *off as i64,
            libc::SEEK_END => self.size()? as i64,
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if offset < 0 {
                    return Err(Refusal::Errno(libc::ENXIO));
                }
                let lending = self.live()?;
                let size = lending.data.size()?;
                if offset as u64 >= size {
                    return Err(Refusal::Errno(libc::ENXIO));
                }
                let pos = lending.data.seek(offset as u64, whence)?.min(size);
                *off = pos;
                return Ok(pos);
            }
            _ => return Err(Refusal::Errno(libc::EINVAL)),
        };
        let pos = base
            .checked_add(offset)
            .filter(|p| *p >= 0)
            .ok_or(Refusal::Errno(libc::EINVAL))?;
        *off = pos as u64;
        Ok(pos as u64)
    }

    /// `ftruncate`.
    pub fn truncate(&self, size: u64) -> LentResult<()> {
        if !self.writable {
            return Err(Refusal::Errno(libc::EINVAL));
        }
        let lending = self.live()?;
        lending.data.truncate(size)?;
        self.wrote.store(true, Ordering::Relaxed);
        lending.resized();
        Ok(())
    }

    /// `fallocate`.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> LentResult<()> {
        self.check_write()?;
        let lending = self.live()?;
        lending.data.fallocate(mode, offset, len)?;
        self.wrote.store(true, Ordering::Relaxed);
        lending.resized();
        Ok(())
    }

    /// `fsync`/`fdatasync` of the backing files.
    pub fn fsync(&self, datasync: bool) -> LentResult<()> {
        Ok(self.live()?.data.fsync(datasync)?)
    }
}
