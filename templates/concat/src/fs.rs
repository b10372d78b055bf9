//! The `concat` file system: every directory `D` of BACKING shows as one
//! read-only file `D` whose bytes are the regular files of `D`, in name
//! order, end to end.
//!
//! The point is the map: one extent per part, each in its own backing file,
//! so nothing is copied and no index is kept. Reads run in the daemon (or
//! in the program, under `concat run`); writes are refused (`EROFS`). The
//! parts are listed and sized at `open`: an open sees the parts as they
//! were then (close-to-open), and `stat` sums their sizes now.
//!
//! Both the program (`main.rs`) and its embedded-mode library (`lib.rs`)
//! include this module, so they serve the same file system.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mapfs::{Attr, Ctx, DataMap, DirEntry, Error, Extent, FileKind, FileSystem, Growth};
use mapfs::{OpenFlags, Opened, Result};
use mapfs_cli::{FsOptions, FsSpec, Registry};
use mapfs_fs::passthrough::Passthrough;

struct Concat {
    backing: Passthrough,
}

impl Concat {
    /// The parts of the file `path` (a directory of the backing store).
    fn parts(&self, ctx: &Ctx, path: &Path) -> Result<Vec<PathBuf>> {
        let mut parts: Vec<PathBuf> = (self.backing.readdir(ctx, path)?.into_iter())
            .filter(|e| e.kind == FileKind::File)
            .map(|e| path.join(e.name))
            .collect();
        parts.sort();
        Ok(parts)
    }

    /// The root stays a directory; each directory below it reads as a file.
    fn as_file(&self, ctx: &Ctx, path: &Path, mut attr: Attr) -> Result<Attr> {
        if path != Path::new("/") {
            let parts = self.parts(ctx, path)?;
            let sizes = parts
                .iter()
                .map(|p| self.backing.getattr(ctx, p).map(|a| a.size));
            attr.size = sizes.sum::<Result<u64>>()?;
            attr.blocks = attr.size.div_ceil(512);
            (attr.kind, attr.perm, attr.nlink) = (FileKind::File, attr.perm & 0o444, 1);
        }
        Ok(attr)
    }
}

impl FileSystem for Concat {
    /// Files are read-only: a close has nothing to persist.
    fn capabilities(&self) -> mapfs::Capabilities {
        mapfs::Capabilities::default().with_nothing_to_persist_at_close()
    }

    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        // Only the root and the directories right below it exist here.
        let depth = path.components().count();
        let attr = self.backing.getattr(ctx, path)?;
        if depth > 2 || (depth == 2 && attr.kind != FileKind::Dir) {
            return Err(Error::not_found());
        }
        self.as_file(ctx, path, attr)
    }

    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        if path != Path::new("/") {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        let dirs = self.backing.readdir(ctx, path)?.into_iter();
        let dirs = dirs.filter(|e| e.kind == FileKind::Dir);
        Ok(dirs
            .map(|e| DirEntry {
                kind: FileKind::File,
                attr: None,
                ..e
            })
            .collect())
    }

    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        if flags.writable() || flags.0 & libc::O_TRUNC != 0 {
            return Err(Error::from_errno(libc::EROFS));
        }
        self.getattr(ctx, path)?;
        let (mut extents, mut files, mut size) = (Vec::new(), Vec::new(), 0);
        for part in self.parts(ctx, path)? {
            let opened = self.backing.open(ctx, &part, OpenFlags(libc::O_RDONLY))?;
            let file = opened.files.into_iter().next().ok_or_else(Error::io)?;
            let len = file.metadata()?.len();
            if len > 0 {
                let index = files.len() as u32;
                extents.push(Extent {
                    logical: size,
                    file: index,
                    offset: 0,
                    len,
                });
                files.push(file);
                size += len;
            }
        }
        let map = DataMap::new(extents, size, Growth::ReadOnly)?;
        Ok(Opened {
            map,
            files,
            handle: 0,
        })
    }

    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        self.getattr(ctx, path)?;
        match mask & libc::W_OK {
            0 => Ok(()),
            _ => Err(Error::from_errno(libc::EROFS)),
        }
    }

    fn listxattr(&self, _: &Ctx, _: &Path) -> Result<Vec<std::ffi::OsString>> {
        Ok(Vec::new())
    }

    fn getxattr(&self, _: &Ctx, _: &Path, _: &OsStr) -> Result<Vec<u8>> {
        Err(Error::from_errno(libc::ENODATA))
    }
}

fn build(backing: &Path, _: &FsOptions) -> Result<Arc<dyn FileSystem>> {
    Ok(Arc::new(Concat {
        backing: Passthrough::new(backing)?,
    }))
}

/// The program's file systems: `concat` itself, which keeps no state of its
/// own (every answer comes from the backing directory), so it can also run
/// inside the application, from the library `lib.rs` makes.
pub fn registry() -> Registry {
    let spec = FsSpec::new(
        "concat",
        "each directory of BACKING as one read-only file",
        build,
    );
    Registry::new("concat", "concat: files made of files, on mapfs")
        // `concat --version` prints this first, mapfs's own below it.
        .version(env!("CARGO_PKG_VERSION"))
        .embed_library("libconcat_embed.so")
        .register(spec.embeddable())
}
