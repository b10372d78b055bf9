//! The [`FileSystem`] trait a cFS implements, and the plain types it speaks.
//!
//! Paths are absolute inside the file system (`/`, `/a/b`); they are never
//! joined onto a host path by mapfs. The trait knows nothing of FUSE or of the
//! preload shim: every executor translates into these calls.
//!
//! Consistency contract (docs/architecture.md): close-to-open. `release` receives the
//! final [`DataMap`] of an open; the next `open` of the same path must see it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::capabilities::Capabilities;
use crate::datamap::DataMap;
use crate::error::{Error, Result};

/// Who is asking: the credentials of the calling process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    /// Effective (file-system) uid of the caller.
    pub uid: u32,
    /// Effective (file-system) gid of the caller.
    pub gid: u32,
    /// Caller's pid (0 when unknown, e.g. kernel-internal requests).
    pub pid: u32,
}

impl Ctx {
    /// The context of the current process, for tests and embedded use.
    pub fn current() -> Self {
        Ctx {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            pid: rustix::process::getpid().as_raw_nonzero().get() as u32,
        }
    }
}

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// UNIX socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

impl FileKind {
    /// The kind encoded in the `S_IFMT` bits of a `st_mode`.
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => FileKind::File,
        }
    }
}

/// File attributes, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// A number unique and stable for this file within the file system
    /// (hard links share it). Executors key their inode tables on it.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: SystemTime,
    /// Last data change.
    pub mtime: SystemTime,
    /// Last status change.
    pub ctime: SystemTime,
    /// File type.
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`).
    pub perm: u16,
    /// Hard link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for device files.
    pub rdev: u64,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// One directory entry. `attr` is filled when the file system has it for free
/// (it lets executors answer `readdirplus` without extra lookups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name (never `.` or `..`).
    pub name: OsString,
    /// Same number `getattr` would report in [`Attr::ino`].
    pub ino: u64,
    /// File type.
    pub kind: FileKind,
    /// Full attributes, if known.
    pub attr: Option<Attr>,
}

/// A time to set in `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time (`UTIME_NOW`).
    Now,
    /// A given time.
    At(SystemTime),
}

/// The changes of a `setattr`; `None` leaves a field alone (`UTIME_OMIT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (`chmod`).
    pub mode: Option<u32>,
    /// New owner (`chown`).
    pub uid: Option<u32>,
    /// New group (`chown`).
    pub gid: Option<u32>,
    /// New size (`truncate`).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

impl SetAttr {
    /// True when nothing is to change.
    pub fn is_empty(&self) -> bool {
        *self == SetAttr::default()
    }
}

/// `statfs` result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Maximum name length.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

/// Flags of `rename`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: atomically swap source and target.
    pub exchange: bool,
}

/// Open flags as passed to `open(2)` (`O_RDONLY`, `O_TRUNC`, `O_APPEND`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFlags(pub i32);

impl OpenFlags {
    /// Access mode bits (`O_RDONLY`, `O_WRONLY`, `O_RDWR`).
    pub fn access(self) -> i32 {
        self.0 & libc::O_ACCMODE
    }
    /// Opened for writing.
    pub fn writable(self) -> bool {
        self.access() != libc::O_RDONLY
    }
    /// Opened for reading.
    pub fn readable(self) -> bool {
        self.access() != libc::O_WRONLY
    }
}

/// The result of `open`/`create`: the file's map and the backing files its
/// extents refer to (`Extent::file` indexes `files`).
#[derive(Debug, Clone)]
pub struct Opened {
    /// Where the bytes live.
    pub map: DataMap,
    /// Backing files, opened with the access the caller asked for.
    pub files: Vec<Arc<File>>,
    /// An opaque number the file system may use to recognise this open in
    /// `release`/`remap`.
    pub handle: u64,
}

/// A stackable user-space file system, path-based like libfuse's high-level
/// API. Every method but `getattr` has a default, so a read-only or minimal
/// file system implements only what it needs. The namespace calls
/// (`setattr`, `readdir`, `readlink`, `mknod`, `mkdir`, `unlink`, `rmdir`,
/// `symlink`, `rename`, `link`) and `open`/`create` answer `ENOSYS`; the
/// xattr calls `ENOTSUP` (`listxattr` an empty list); `remap` `ENOSPC`.
/// The others succeed doing nothing: `statfs` (zeros), `access`,
/// `fsyncdir`, and `flush` and `release`. So a file system that keeps its
/// maps anywhere but in the backing files themselves must implement
/// `flush` (every `close(2)` and `fsync` of an open that wrote) and
/// `release`, or what a program wrote is silently not persisted.
///
/// Data calls (read, write, fsync, in-map truncate) are not here: they run in
/// the [`engine`](crate::engine) against the [`DataMap`] returned by `open`.
#[allow(unused_variables)]
pub trait FileSystem: Send + Sync + 'static {
    /// Attributes of `path` (not following a final symlink).
    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr>;

    /// Changes attributes; returns the new ones. A size change of a file that
    /// is open is applied by the executor through the engine first, so the
    /// file system only sees `size` for files not open through mapfs.
    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        Err(Error::not_implemented())
    }

    /// Lists a directory, without `.` and `..`.
    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        Err(Error::not_implemented())
    }

    /// Target of a symbolic link.
    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        Err(Error::not_implemented())
    }

    /// Creates a file node (FIFO, socket, device, or empty regular file).
    /// `mode` carries the type bits and the permission bits (umask applied).
    fn mknod(&self, ctx: &Ctx, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        Err(Error::not_implemented())
    }

    /// Creates a directory (`mode`: permission bits, umask applied).
    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        Err(Error::not_implemented())
    }

    /// Removes a non-directory name.
    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        Err(Error::not_implemented())
    }

    /// Removes an empty directory.
    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        Err(Error::not_implemented())
    }

    /// Creates a symbolic link at `path` pointing to `target` (stored as is).
    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        Err(Error::not_implemented())
    }

    /// Renames `from` to `to`.
    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        Err(Error::not_implemented())
    }

    /// Creates a hard link `to` for the existing `from`.
    fn link(&self, ctx: &Ctx, from: &Path, to: &Path) -> Result<Attr> {
        Err(Error::not_implemented())
    }

    /// What this file system promises about itself (see
    /// [`Capabilities`]): asked once, when an instance starts serving. The
    /// default promises nothing, which is always correct and costs round
    /// trips a file system that can promise more would not need.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Work a file system does between requests rather than in one, on a
    /// thread of the daemon's own, as its [`Capabilities::housekeeping`]
    /// asks (`pack` moves the new files
    /// released since the last call into slots, and commits the creates it
    /// answered before their commit). It runs beside requests: it takes
    /// the file system's own locks like any request.
    fn housekeeping(&self) {}

    /// The instance stops serving: the unmount (after a last
    /// [`FileSystem::housekeeping`]), or the end (`exit`, `_exit`) or
    /// `exec` of a process that embeds it. What it holds only to answer
    /// faster later, and that the store would otherwise keep until the
    /// next instance over it starts alone, goes back now (`pack`: slots it
    /// reserved for new files). A failed `exec` goes on serving, so it may
    /// be called more than once. The default: nothing.
    fn finish(&self) {}

    /// Runs the file system's online tool `name` (`mapfs pack compact` is
    /// one) on `input`, both in an encoding of the file system's choosing,
    /// for a client of the mount's control socket. A mount runs at most one
    /// tool at a time, on a thread of its own beside the requests it
    /// serves, and only for the mount's owner (the daemon's uid) or root;
    /// `ctx` is the client's. A tool that reads or changes the store
    /// through the file system's own state is what lets that state be
    /// trusted as the store's only writer. The default has no tools
    /// (`ENOSYS`).
    fn tool(&self, ctx: &Ctx, name: &str, input: &[u8]) -> Result<Vec<u8>> {
        Err(Error::not_implemented().context(format!("this file system has no tool {name:?}")))
    }

    /// File-system statistics.
    fn statfs(&self, ctx: &Ctx, path: &Path) -> Result<StatFs> {
        Ok(StatFs {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..StatFs::default()
        })
    }

    /// Sets an extended attribute (`flags`: `XATTR_CREATE`/`XATTR_REPLACE`).
    fn setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        Err(Error::from_errno(libc::ENOTSUP))
    }

    /// Reads an extended attribute.
    fn getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        Err(Error::from_errno(libc::ENOTSUP))
    }

    /// Lists extended attribute names.
    fn listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        Ok(Vec::new())
    }

    /// Removes an extended attribute.
    fn removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        Err(Error::from_errno(libc::ENOTSUP))
    }

    /// Checks access (`mask`: `R_OK|W_OK|X_OK`, or `F_OK`) for the caller.
    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        self.getattr(ctx, path).map(|_| ())
    }

    /// Opens an existing file: checks the caller may, and returns its map and
    /// backing files. `O_TRUNC` in `flags` must be honoured.
    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        Err(Error::not_implemented())
    }

    /// Opens `path` again for an open that the kernel already runs natively
    /// on its backing file (FUSE passthrough), when a daemon takes over from
    /// one that died: the map must be whole-file 1-to-1 over that file, or
    /// the kernel's reads and writes and the daemon's (`fallocate`,
    /// `copy_file_range`, replayed writes) would go to different places.
    /// `flags` never hold `O_CREAT`, `O_EXCL` or `O_TRUNC` (they acted
    /// already). The default is [`FileSystem::open`], right for a file
    /// system whose choice of map does not depend on what else is open; one
    /// whose does (`versions`) must override it.
    fn reopen_whole_file(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        self.open(ctx, path, flags)
    }

    /// Creates and opens a regular file (`mode`: permission bits, umask
    /// applied; `flags` may hold `O_EXCL`). Called for a name that did not
    /// exist when the executor looked it up (the kernel's lookup before a
    /// FUSE CREATE; embedded mode asks `getattr` first too, except for a
    /// file system that lists its backing directories, whose own `O_EXCL`
    /// decides); another process may have made it since, so with `O_EXCL`
    /// an existing name is `EEXIST`.
    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        Err(Error::not_implemented())
    }

    /// The last close of an open: `map` is its final map, for the file system
    /// to persist. Errors are logged, not seen by the application.
    fn release(&self, ctx: &Ctx, path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        Ok(())
    }

    /// Persists the current map of an open that is not done yet, so that an
    /// `open` after this returns sees its bytes (close-to-open), and, after
    /// `fsync`, so that they survive a crash. Executors call it at every
    /// `close(2)` of a descriptor of an open whose map is not whole-file
    /// 1-to-1 and was written, at `fsync` of such an open, after a size
    /// change of one, and before a shrink of one (so the file system can tell
    /// the shrink from the writes it cuts). `release` still follows with the
    /// final map. A whole-file map needs nothing: its bytes are the backing
    /// file's own.
    fn flush(&self, ctx: &Ctx, path: &Path, handle: u64, map: &DataMap) -> Result<()> {
        Ok(())
    }

    /// A write at `offset..offset+len` does not fit `map`'s growth policy:
    /// return a map (and any extra backing files) where it does.
    fn remap(
        &self,
        ctx: &Ctx,
        path: &Path,
        handle: u64,
        map: &DataMap,
        offset: u64,
        len: u64,
    ) -> Result<Opened> {
        Err(Error::from_errno(libc::ENOSPC))
    }

    /// A backing file whose kernel locks stand for `path`'s, for an
    /// executor that runs the file's data outside any mount (embedded mode
    /// keeps a program's record locks and `flock`s there, so that every
    /// process using the same backing directory sees them). `None` (the
    /// default): the file's own backing file serves, or there is none.
    fn lock_file(&self, ctx: &Ctx, path: &Path) -> Result<Option<std::fs::File>> {
        Ok(None)
    }

    /// Flushes directory metadata to stable storage.
    fn fsyncdir(&self, ctx: &Ctx, path: &Path, datasync: bool) -> Result<()> {
        Ok(())
    }
}
