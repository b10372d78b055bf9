//! `nullfs`: names and attributes in memory, every file empty, nothing
//! stored. It does the least work any file system can do per request, so a
//! metadata benchmark through `nullfs mount nullfs NONE MNT` measures what
//! the mount itself costs (the kernel's FUSE round trips and mapfs's
//! request handling) with no backing store behind it: the floor under the
//! figures of every real mapfs file system on the same machine.
//!
//! ```sh
//! cargo build --release --example nullfs
//! mkdir -p /tmp/null-mnt
//! target/release/examples/nullfs mount nullfs /tmp /tmp/null-mnt
//! mapfs bench --workloads create-stat-unlink --configs native --backing /tmp/null-mnt
//! mapfs bench --workloads create-stat-unlink --configs native --backing /dev/shm
//! ```
//!
//! (The backing directory argument is required by `mount` and ignored.)
//! Files stay empty: writes fail (`ENOSPC`), truncation to a size above 0
//! with `EFBIG`.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mapfs::{Attr, Ctx, DataMap, DirEntry, Error, FileKind, FileSystem, Growth, SetAttr, TimeSet};
use mapfs::{OpenFlags, Opened, Result};
use mapfs_cli::{FsOptions, FsSpec, Registry};

/// The namespace: every path's attributes.
struct NullFs {
    nodes: Mutex<HashMap<PathBuf, Attr>>,
    next_ino: AtomicU64,
}

impl NullFs {
    fn new_attr(&self, ctx: &Ctx, kind: FileKind, mode: u32) -> Attr {
        let now = SystemTime::now();
        Attr {
            ino: self.next_ino.fetch_add(1, Ordering::Relaxed),
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            kind,
            perm: (mode & 0o7777) as u16,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            uid: ctx.uid,
            gid: ctx.gid,
            rdev: 0,
            blksize: 4096,
        }
    }

    /// Adds `path` unless it exists; its parent must be a directory.
    fn add(&self, ctx: &Ctx, path: &Path, kind: FileKind, mode: u32) -> Result<Attr> {
        let mut nodes = self.nodes.lock().unwrap();
        let parent = path.parent().ok_or_else(Error::invalid)?;
        match nodes.get(parent) {
            Some(a) if a.kind == FileKind::Dir => {}
            Some(_) => return Err(Error::from_errno(libc::ENOTDIR)),
            None => return Err(Error::not_found()),
        }
        if nodes.contains_key(path) {
            return Err(Error::from_errno(libc::EEXIST));
        }
        let attr = self.new_attr(ctx, kind, mode);
        nodes.insert(path.to_path_buf(), attr);
        Ok(attr)
    }

    /// Removes `path`, which must be of the kind `dir` says.
    fn remove(&self, path: &Path, dir: bool) -> Result<()> {
        let mut nodes = self.nodes.lock().unwrap();
        let attr = nodes.get(path).ok_or_else(Error::not_found)?;
        match (attr.kind == FileKind::Dir, dir) {
            (true, false) => return Err(Error::from_errno(libc::EISDIR)),
            (false, true) => return Err(Error::from_errno(libc::ENOTDIR)),
            (true, true) if nodes.keys().any(|k| k.parent() == Some(path)) => {
                return Err(Error::from_errno(libc::ENOTEMPTY))
            }
            _ => {}
        }
        nodes.remove(path);
        Ok(())
    }
}

/// An open of an empty file: no backing file, nothing to read, no growth.
fn empty_open() -> Result<Opened> {
    Ok(Opened {
        map: DataMap::new(Vec::new(), 0, Growth::ReadOnly)?,
        files: Vec::new(),
        handle: 0,
    })
}

impl FileSystem for NullFs {
    /// Opens get an empty read-only map: a close has nothing to persist.
    fn capabilities(&self) -> mapfs::Capabilities {
        mapfs::Capabilities::default().with_nothing_to_persist_at_close()
    }

    fn getattr(&self, _: &Ctx, path: &Path) -> Result<Attr> {
        let nodes = self.nodes.lock().unwrap();
        nodes.get(path).copied().ok_or_else(Error::not_found)
    }

    /// Files stay empty: a size other than 0 is refused (`EFBIG`).
    fn setattr(&self, _: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        if set.size.is_some_and(|s| s > 0) {
            return Err(Error::from_errno(libc::EFBIG));
        }
        let mut nodes = self.nodes.lock().unwrap();
        let a = nodes.get_mut(path).ok_or_else(Error::not_found)?;
        let at = |t: TimeSet| match t {
            TimeSet::Now => SystemTime::now(),
            TimeSet::At(t) => t,
        };
        a.perm = set.mode.map_or(a.perm, |m| (m & 0o7777) as u16);
        a.uid = set.uid.unwrap_or(a.uid);
        a.gid = set.gid.unwrap_or(a.gid);
        a.atime = set.atime.map_or(a.atime, at);
        a.mtime = set.mtime.map_or(a.mtime, at);
        a.ctime = SystemTime::now();
        Ok(*a)
    }

    fn readdir(&self, _: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        let nodes = self.nodes.lock().unwrap();
        match nodes.get(path) {
            Some(a) if a.kind == FileKind::Dir => {}
            Some(_) => return Err(Error::from_errno(libc::ENOTDIR)),
            None => return Err(Error::not_found()),
        }
        Ok(nodes
            .iter()
            .filter(|(k, _)| k.parent() == Some(path))
            .map(|(k, a)| DirEntry {
                name: k.file_name().map(OsString::from).unwrap_or_default(),
                ino: a.ino,
                kind: a.kind,
                attr: Some(*a),
            })
            .collect())
    }

    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        self.add(ctx, path, FileKind::Dir, mode)
    }

    fn rmdir(&self, _: &Ctx, path: &Path) -> Result<()> {
        self.remove(path, true)
    }

    fn unlink(&self, _: &Ctx, path: &Path) -> Result<()> {
        self.remove(path, false)
    }

    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        _flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        Ok((self.add(ctx, path, FileKind::File, mode)?, empty_open()?))
    }

    fn open(&self, ctx: &Ctx, path: &Path, _flags: OpenFlags) -> Result<Opened> {
        self.getattr(ctx, path)?;
        empty_open()
    }
}

fn build(_backing: &Path, _: &FsOptions) -> Result<Arc<dyn FileSystem>> {
    let fs = NullFs {
        nodes: Mutex::new(HashMap::new()),
        next_ino: AtomicU64::new(2),
    };
    let root = fs.new_attr(&Ctx::current(), FileKind::Dir, 0o1777);
    fs.nodes.lock().unwrap().insert(PathBuf::from("/"), root);
    Ok(Arc::new(fs))
}

/// The program's one file system.
pub fn registry() -> Registry {
    Registry::new("nullfs", "nullfs: the floor of a mapfs mount's metadata").register(FsSpec::new(
        "nullfs",
        "names in memory, every file empty",
        build,
    ))
}

fn main() {
    mapfs_cli::main(registry())
}
