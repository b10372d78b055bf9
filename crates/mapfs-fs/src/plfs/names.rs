//! Names: listing (containers shown as files), unlink, rename.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use mapfs::creds::as_caller;
use mapfs::{Ctx, DirEntry, Error, FileKind, FileSystem as _, RenameFlags, Result};
use rustix::fs::{AtFlags, Mode, OFlags};
use tracing::warn;

use super::container;
use super::format::{self, GONE_PREFIX};
use super::{Found, Node, Plfs};

impl Plfs {
    /// The passthrough's listing with the hidden names dropped and every
    /// container turned into a file entry (without attributes: a file's
    /// size needs its index merged, which a later lookup does).
    pub(super) fn do_readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        if let Some(Node::File(_)) = self.node(ctx, path)? {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        let mut entries = self.pt.readdir(ctx, path)?;
        let dir = self.root().open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        entries.retain(|e| !format::reserved_name(e.name.as_bytes()));
        for e in &mut entries {
            if e.kind != FileKind::Dir {
                continue;
            }
            // A directory's backing link count counts containers: leave
            // its attributes to getattr.
            e.attr = None;
            if let Ok(c) = container::open_dir(dir.as_fd(), &e.name) {
                if container::is_container(c.as_fd()) {
                    e.kind = FileKind::File;
                    if let Ok(ino) = container::file_ino(c.as_fd()) {
                        e.ino = ino;
                    }
                }
            }
        }
        Ok(entries)
    }

    /// A file: its container is renamed to a hidden name in the same
    /// directory as the caller (the kernel's unlink permission rules, sticky
    /// bit included, apply to that rename exactly), then removed by the
    /// daemon. Opens keep their logs through their descriptors.
    pub(super) fn do_unlink(&self, ctx: &Ctx, path: &Path) -> Result<()> {
        let gone = as_caller(ctx, || {
            let f = self.find(path)?;
            match f.node {
                Node::File(dir) => {
                    let gone = format!("{GONE_PREFIX}{}", format::new_id());
                    rustix::fs::renameat_with(
                        &f.parent,
                        &f.name,
                        &f.parent,
                        gone.as_str(),
                        rustix::fs::RenameFlags::NOREPLACE,
                    )?;
                    Ok(Some((f.parent, gone, dir)))
                }
                Node::Dir => Err(Error::from_errno(libc::EISDIR)),
                Node::Other => Ok(None),
            }
        })?;
        match gone {
            None => self.pt.unlink(ctx, path),
            Some((parent, gone, dir)) => {
                self.remove_container(parent.as_fd(), OsStr::new(&gone), &dir)
            }
        }
    }

    /// Plain renames that the kernel cannot do on containers (a file over a
    /// file or over a non-directory, a non-directory over a file) swap the
    /// two names atomically (`RENAME_EXCHANGE`, as the caller), then the
    /// daemon removes the replaced node now at the source name. `noreplace`
    /// and `exchange` renames are the kernel's as they are.
    pub(super) fn do_rename(
        &self,
        ctx: &Ctx,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<()> {
        if super::is_root(from) || super::is_root(to) {
            return self.pt.rename(ctx, from, to, flags);
        }
        let (a, b) = as_caller(ctx, || {
            let a = self.find(from)?;
            self.parent_for_new(to)?;
            let b = match self.find(to) {
                Ok(b) => Some(b),
                Err(e) if e.errno() == libc::ENOENT => None,
                Err(e) => return Err(e),
            };
            Ok((a, b))
        })?;
        if flags.exchange || flags.noreplace {
            return self.pt.rename(ctx, from, to, flags);
        }
        let Some(b) = b else {
            return self.pt.rename(ctx, from, to, flags);
        };
        if same_entry(&a, &b)? {
            return Ok(());
        }
        let replace_file = match (&a.node, &b.node) {
            (Node::File(_), Node::Dir) => return Err(Error::from_errno(libc::EISDIR)),
            (Node::Dir, Node::File(_)) => return Err(Error::from_errno(libc::ENOTDIR)),
            (Node::File(_), Node::File(_)) | (Node::Other, Node::File(_)) => true,
            (Node::File(_), Node::Other) => false,
            _ => return self.pt.rename(ctx, from, to, flags),
        };
        let swap = RenameFlags {
            exchange: true,
            noreplace: false,
        };
        self.pt.rename(ctx, from, to, swap)?;
        // The replaced node now sits at the source name.
        let res = match &b.node {
            Node::File(d) if replace_file => self.remove_container(a.parent.as_fd(), &a.name, d),
            _ => rustix::fs::unlinkat(&a.parent, &a.name, AtFlags::empty()).map_err(Error::from),
        };
        if let Err(e) = &res {
            warn!("plfs: rename replaced a file but cannot remove it: {e}");
        }
        res
    }
}

impl Plfs {
    /// Removes container `dir`, now named `name` in `parent`, holding its
    /// lock: an open or merge of it that raced the unlink either completed
    /// before (and keeps its logs open) or finds it gone and looks the name
    /// up again (`ESTALE`), never a half-removed container.
    fn remove_container(&self, parent: BorrowedFd<'_>, name: &OsStr, dir: &OwnedFd) -> Result<()> {
        let key = container::key_of(dir.as_fd())?;
        match self.store.lock(dir.as_fd(), key) {
            Ok(locked) => {
                let res = container::remove_tree(parent, name);
                self.store.invalidate(key);
                drop(locked);
                res
            }
            Err(_) => {
                let res = container::remove_tree(parent, name);
                self.store.forget(key);
                res
            }
        }
    }
}

/// True when both names are the same backing node (renaming a name onto
/// itself does nothing).
fn same_entry(a: &Found, b: &Found) -> Result<bool> {
    let sa = rustix::fs::statat(&a.parent, &a.name, AtFlags::SYMLINK_NOFOLLOW)?;
    let sb = rustix::fs::statat(&b.parent, &b.name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
}
