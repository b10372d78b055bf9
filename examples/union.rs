//! `union`: UPPER read-write over a read-only LOWER, like overlayfs
//! (`union mount union UPPER:LOWER MNT`, and every other `mapfs` command).
//!
//! A name is served by the upper layer if it is there, else by the lower
//! one unless a whiteout `.wh.NAME` hides it. Changing a lower file copies it
//! up first (parents too); deleting a lower name leaves a whiteout; a
//! directory made where one was deleted is marked opaque (`.wh..wh..opq`);
//! `readdir` merges the layers. Renaming a directory present in the lower
//! layer answers `EXDEV`, as overlayfs does (`mv` then copies). Each layer is
//! a `Passthrough`, so every open is a whole-file 1-to-1 map that kernel
//! passthrough and the shim run natively. Names `.wh.*` are reserved; no
//! xattrs or hard links; keep both layers on one file system (inode numbers
//! are the backing files').

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mapfs::{Attr, Ctx, DirEntry, Error, FileKind, FileSystem, OpenFlags, Opened, Result};
use mapfs::{RenameFlags, SetAttr, TimeSet};
use mapfs_cli::{FsOptions, FsSpec, Registry};
use mapfs_fs::passthrough::Passthrough;

const OPAQUE: &str = ".wh..wh..opq";

struct Union {
    upper: Passthrough,
    lower: Passthrough,
}

fn has(fs: &Passthrough, ctx: &Ctx, path: &Path) -> bool {
    fs.getattr(ctx, path).is_ok()
}

/// The whiteout that hides `path`.
fn wh(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".wh.{name}"))
}

impl Union {
    /// True when the lower layer's `path` is hidden: by its whiteout, or by
    /// an opaque directory above it.
    fn hidden(&self, ctx: &Ctx, path: &Path) -> bool {
        has(&self.upper, ctx, &wh(path))
            || path
                .ancestors()
                .skip(1)
                .any(|d| has(&self.upper, ctx, &d.join(OPAQUE)))
    }

    /// The layer that serves `path`.
    fn layer(&self, ctx: &Ctx, path: &Path) -> Result<&Passthrough> {
        if has(&self.upper, ctx, path) {
            Ok(&self.upper)
        } else if !self.hidden(ctx, path) && has(&self.lower, ctx, path) {
            Ok(&self.lower)
        } else {
            Err(Error::not_found())
        }
    }

    /// Makes sure `path` (and its parents) exist in the upper layer.
    fn copy_up(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        if has(&self.upper, ctx, path) || path == Path::new("/") {
            return Ok(());
        }
        self.copy_up(ctx, path.parent().unwrap_or(Path::new("/")))?;
        let a = self.layer(ctx, path)?.getattr(ctx, path)?;
        match a.kind {
            FileKind::Dir => _ = self.upper.mkdir(ctx, path, a.perm.into())?,
            FileKind::Symlink => {
                let target = self.lower.readlink(ctx, path)?;
                self.upper.symlink(ctx, &target, path)?;
            }
            FileKind::File => {
                let src = self.lower.open(ctx, path, OpenFlags(libc::O_RDONLY))?;
                let flags = OpenFlags(libc::O_WRONLY | libc::O_EXCL);
                let (_, dst) = self.upper.create(ctx, path, flags, a.perm.into())?;
                std::io::copy(&mut &*src.files[0], &mut &*dst.files[0])?;
                let keep = SetAttr {
                    mtime: Some(TimeSet::At(a.mtime)),
                    ..Default::default()
                };
                self.upper.setattr(ctx, path, &keep)?;
            }
            _ => return Err(Error::from_errno(libc::ENOTSUP)),
        }
        Ok(())
    }

    /// Before `path` is made in the upper layer: its parent copied up, any
    /// whiteout of it gone (and then the new directory must be opaque).
    fn prepare(&self, ctx: &Ctx, path: &Path) -> Result<bool> {
        self.copy_up(ctx, path.parent().unwrap_or(Path::new("/")))?;
        Ok(self.upper.unlink(ctx, &wh(path)).is_ok())
    }

    /// After `path` left the upper layer: hide the lower one, if any.
    fn hide(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        if self.hidden(ctx, path) || !has(&self.lower, ctx, path) {
            return Ok(());
        }
        self.prepare(ctx, path)?;
        self.upper
            .mknod(ctx, &wh(path), libc::S_IFREG | 0o600, 0)
            .map(drop)
    }
}

impl FileSystem for Union {
    /// Every open is a layer's passthrough open, whole-file: a close has
    /// nothing to persist.
    fn capabilities(&self) -> mapfs::Capabilities {
        mapfs::Capabilities::default().with_nothing_to_persist_at_close()
    }

    fn getattr(&self, ctx: &Ctx, path: &Path) -> Result<Attr> {
        self.layer(ctx, path)?.getattr(ctx, path)
    }
    fn readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        self.layer(ctx, path)?;
        let upper = self.upper.readdir(ctx, path).unwrap_or_default();
        let (wh, upper): (Vec<_>, Vec<_>) = upper
            .into_iter()
            .partition(|e| e.name.as_encoded_bytes().starts_with(b".wh."));
        let wh: Vec<&[u8]> = wh.iter().map(|e| &e.name.as_encoded_bytes()[4..]).collect();
        let lower = match wh.contains(&&b".wh..opq"[..]) || self.hidden(ctx, path) {
            true => vec![],
            false => self.lower.readdir(ctx, path).unwrap_or_default(),
        };
        let mut all = BTreeMap::new();
        for e in upper.into_iter().chain(lower) {
            if !wh.contains(&e.name.as_encoded_bytes()) {
                all.entry(e.name.clone()).or_insert(e);
            }
        }
        Ok(all.into_values().collect())
    }
    fn readlink(&self, ctx: &Ctx, path: &Path) -> Result<OsString> {
        self.layer(ctx, path)?.readlink(ctx, path)
    }
    fn access(&self, ctx: &Ctx, path: &Path, mask: i32) -> Result<()> {
        self.layer(ctx, path)?.access(ctx, path, mask)
    }
    fn open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        if flags.writable() || flags.0 & libc::O_TRUNC != 0 {
            self.copy_up(ctx, path)?;
        }
        self.layer(ctx, path)?.open(ctx, path, flags)
    }
    fn create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        self.prepare(ctx, path)?;
        self.upper.create(ctx, path, flags, mode)
    }
    fn mkdir(&self, ctx: &Ctx, path: &Path, mode: u32) -> Result<Attr> {
        let replaced = self.prepare(ctx, path)?;
        let attr = self.upper.mkdir(ctx, path, mode)?;
        if replaced {
            self.upper
                .mknod(ctx, &path.join(OPAQUE), libc::S_IFREG | 0o600, 0)?;
        }
        Ok(attr)
    }
    fn symlink(&self, ctx: &Ctx, target: &OsStr, path: &Path) -> Result<Attr> {
        self.prepare(ctx, path)?;
        self.upper.symlink(ctx, target, path)
    }
    fn unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        if self.getattr(ctx, path)?.kind == FileKind::Dir {
            return Err(Error::from_errno(libc::EISDIR));
        }
        if has(&self.upper, ctx, path) {
            self.upper.unlink(ctx, path)?;
        }
        self.hide(ctx, path)
    }
    fn rmdir(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        if !self.readdir(ctx, path)?.is_empty() {
            return Err(Error::from_errno(libc::ENOTEMPTY));
        }
        if has(&self.upper, ctx, path) {
            for e in self.upper.readdir(ctx, path)? {
                self.upper.unlink(ctx, &path.join(e.name))?; // whiteouts only
            }
            self.upper.rmdir(ctx, path)?;
        }
        self.hide(ctx, path)
    }
    fn rename(&self, ctx: &Ctx, from: &Path, to: &Path, flags: RenameFlags) -> Result<()> {
        let kind = self.getattr(ctx, from)?.kind;
        if flags.exchange || (kind == FileKind::Dir && has(&self.lower, ctx, from)) {
            return Err(Error::from_errno(libc::EXDEV));
        }
        if flags.noreplace && self.layer(ctx, to).is_ok() {
            return Err(Error::from_errno(libc::EEXIST));
        }
        self.copy_up(ctx, from)?;
        self.prepare(ctx, to)?;
        self.upper.rename(ctx, from, to, flags)?;
        self.hide(ctx, from)
    }
    fn setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        self.copy_up(ctx, path)?;
        self.upper.setattr(ctx, path, set)
    }
}

fn build(_backing: &Path, opts: &FsOptions) -> Result<Arc<dyn FileSystem>> {
    let [upper, lower] = &opts.layers[..] else {
        return Err(Error::invalid().context("union needs UPPER:LOWER, two directories"));
    };
    let (upper, lower) = (Passthrough::new(upper)?, Passthrough::new(lower)?);
    Ok(Arc::new(Union { upper, lower }))
}

/// The program's file system, which keeps no state of its own (every answer
/// comes from the two layers), so it also runs inside the application
/// (`union run --embed union:UPPER:LOWER:/u -- PROGRAM`), from the library
/// `union_embed.rs` makes.
pub fn registry() -> Registry {
    let spec = FsSpec::new("union", "UPPER:LOWER overlay", build).layered();
    Registry::new("union", "union on mapfs")
        .embed_library("libunion_embed.so")
        .register(spec.whole_file_maps().embeddable())
}

fn main() {
    mapfs_cli::main(registry())
}
