//! `passthrough`: mirrors a directory, 1-to-1.
//!
//! # Mapping
//!
//! Every path of the file system is the same path beneath the backing
//! directory; every open file is a whole-file 1-to-1 [`DataMap`] onto the
//! backing file itself, so executors can hand it to the kernel (FUSE
//! passthrough) or to the application (preload shim). `Attr::ino` is the
//! backing `st_ino`, so hard links share it. (Mounts nested inside the
//! backing directory are crossed, and their inode numbers may collide with
//! the outer file system's: keep one file system per backing directory.)
//!
//! # Who decides
//!
//! Every operation runs inside [`mapfs::creds::as_caller`]: the backing
//! kernel checks permissions, sticky directories, setgid-directory group
//! inheritance, suid/sgid clearing on chown and write, and sets the owner of
//! new files, exactly as for the calling process. Nothing is emulated here.
//! Modes received by `create`/`mkdir`/`mknod` already carry the caller's
//! umask; the daemon runs with umask 0 so none is applied twice.
//!
//! # Consistency
//!
//! Nothing is cached: every call goes to the backing directory, so changes
//! made behind the mount (by other programs on the backing directory) are
//! seen by the next call. The one exception is asked for: embedded with an
//! exclusive backing directory (`--embed passthrough:B:P:exclusive`), the
//! root keeps parent directories ([`BackingRoot::with_dir_cache`]), and
//! renames and rmdirs move the job's namespace generation around the
//! change so that no process of the job uses a stale one. Executors may still cache attributes and names for
//! their configured timeouts; a file replaced behind the mount keeps serving
//! the old inode to opens that already hold it (as with any local file).
//!
//! # Security
//!
//! All lookups go through [`BackingRoot`] (`openat2` with `RESOLVE_BENEATH`
//! and no magic links), and operations act on `(parent dir fd, name)` without
//! following a final symlink, so neither `..`, nor a symlink planted in the
//! backing directory (absolute or relative), nor a rename race can make the
//! daemon touch a file outside the backing directory.

mod attr;
mod dir;
mod node;
mod open;
pub(crate) mod xattr;

pub(crate) use node::backing_rename_flags;

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path};

use mapfs::backing::{BackingRoot, DirFd};
use mapfs::creds::as_caller;
use mapfs::{
    Attr, Capabilities, Ctx, DataMap, DirEntry, FileSystem, OpenFlags, Opened, RenameFlags, Result,
    SetAttr, StatFs,
};

/// Mirror of a backing directory.
#[derive(Debug)]
pub struct Passthrough {
    root: BackingRoot,
}

impl Passthrough {
    /// Opens the backing directory.
    pub fn new(backing: &Path) -> Result<Self> {
        Ok(Self::with_root(BackingRoot::new(backing)?))
    }

    /// A mirror of an already opened backing root.
    pub fn with_root(root: BackingRoot) -> Self {
        Passthrough { root }
    }

    /// The backing root (for file systems built on top of this one).
    pub fn root(&self) -> &BackingRoot {
        &self.root
    }

    /// Where `path` lives: its parent directory and final name; the root
    /// itself is `(root fd, ".")`.
    fn loc(&self, path: &Path) -> Result<Loc<'_>> {
        if is_root(path) {
            return Ok(Loc {
                dir: Dir::Root(self.root.fd()),
                name: OsString::from("."),
            });
        }
        // A name right under the root needs no parent opened: the root's
        // own descriptor is the `*at` base (two system calls fewer for
        // every request on such a name).
        let mut comps = path
            .components()
            .filter(|c| !matches!(c, Component::RootDir | Component::CurDir));
        if let (Some(Component::Normal(name)), None) = (comps.next(), comps.next()) {
            return Ok(Loc {
                dir: Dir::Root(self.root.fd()),
                name: name.to_os_string(),
            });
        }
        let (dir, name) = self.root.parent_dir(path)?;
        Ok(Loc {
            dir: Dir::Parent(dir),
            name,
        })
    }

    /// [`Passthrough::loc`] resolved again, never from a kept directory
    /// (a read-only call redoes its work so when a namespace change began
    /// while it used one).
    fn loc_fresh(&self, path: &Path) -> Result<Loc<'_>> {
        let (dir, name) = self.root.parent(path)?;
        Ok(Loc {
            dir: Dir::Parent(DirFd::Owned(dir)),
            name,
        })
    }

    /// A read-only call `f` on `path`'s location, made again on a fresh
    /// resolution if a namespace change began while it used a kept
    /// directory (see `mapfs::nsgen`).
    fn read_at<T>(&self, path: &Path, f: impl Fn(&Loc<'_>) -> Result<T>) -> Result<T> {
        let loc = self.loc(path)?;
        let r = f(&loc);
        match &loc.dir {
            Dir::Parent(d) if self.root.changed_since(d) => f(&self.loc_fresh(path)?),
            _ => r,
        }
    }

    /// Runs `f`, a change that can make a directory another process of an
    /// embedded job resolved stale, between the moves of the job's
    /// namespace generation.
    fn changing<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.root.namespace_change(f)
    }
}

/// True when `path` names the root of the file system.
fn is_root(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, Component::RootDir | Component::CurDir))
}

/// A directory fd that is either the root's (borrowed) or a parent, opened
/// for the call or kept.
enum Dir<'a> {
    Root(BorrowedFd<'a>),
    Parent(DirFd),
}

/// A file named by `(dir, name)`, the form every `*at` call takes.
struct Loc<'a> {
    dir: Dir<'a>,
    name: OsString,
}

impl Loc<'_> {
    fn dir(&self) -> BorrowedFd<'_> {
        match &self.dir {
            Dir::Root(fd) => *fd,
            Dir::Parent(fd) => fd.as_fd(),
        }
    }

    fn name(&self) -> &OsStr {
        &self.name
    }

    /// The root itself (a name right under it also has the root's
    /// descriptor as its directory).
    fn is_root(&self) -> bool {
        matches!(self.dir, Dir::Root(_)) && self.name == "."
    }
}

impl FileSystem for Passthrough {
    /// Every open's map is its backing file, whole: a close has nothing
    /// to persist.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default().with_nothing_to_persist_at_close()
    }

    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        as_caller(ctx, || self.read_at(path, attr::stat_loc))
    }

    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        as_caller(ctx, || self.do_setattr(path, set))
    }

    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        as_caller(ctx, || self.do_readdir(path))
    }

    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        as_caller(ctx, || self.do_readlink(path))
    }

    fn mknod(&self, ctx: &Ctx, path: &Path, mode: u32, rdev: u64) -> Result<Attr> {
        as_caller(ctx, || self.do_mknod(path, mode, rdev))
    }

    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        as_caller(ctx, || self.do_mkdir(path, mode))
    }

    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        as_caller(ctx, || self.do_unlink(path))
    }

    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        as_caller(ctx, || self.do_rmdir(path))
    }

    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        as_caller(ctx, || self.do_symlink(target, path))
    }

    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        as_caller(ctx, || self.do_rename(from, to, flags))
    }

    fn link(&self, ctx: &Ctx, from: &Path, to: &Path) -> Result<Attr> {
        as_caller(ctx, || self.do_link(from, to))
    }

    fn statfs(&self, ctx: &Ctx, path: &Path) -> Result<StatFs> {
        as_caller(ctx, || self.do_statfs(path))
    }

    fn setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        as_caller(ctx, || self.do_setxattr(path, name, value, flags))
    }

    fn getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        as_caller(ctx, || self.do_getxattr(path, name))
    }

    fn listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        as_caller(ctx, || self.do_listxattr(path))
    }

    fn removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        as_caller(ctx, || self.do_removexattr(path, name))
    }

    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        as_caller(ctx, || self.do_access(path, mask))
    }

    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        as_caller(ctx, || self.do_open(path, flags))
    }

    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        as_caller(ctx, || self.do_create(path, flags, mode))
    }

    fn release(&self, _ctx: &Ctx, _path: &Path, _handle: u64, _map: &DataMap) -> Result<()> {
        // The backing file is the file: nothing to persist.
        Ok(())
    }

    fn fsyncdir(&self, ctx: &Ctx, path: &Path, datasync: bool) -> Result<()> {
        as_caller(ctx, || self.do_fsyncdir(path, datasync))
    }
}
