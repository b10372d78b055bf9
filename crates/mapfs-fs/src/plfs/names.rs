//! Names: listing (containers shown as files), unlink, rename.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use mapfs::creds::as_caller;
use mapfs::{Ctx, DirEntry, Error, FileKind, FileSystem as _, RenameFlags, Result};
use rustix::fs::{AtFlags, Mode, OFlags};
use tracing::{debug, warn};

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
                    // A container is not a subdirectory: the count stays.
                    self.counts.change(f.parent.as_fd(), 0, || {
                        container::rename_noreplace(
                            f.parent.as_fd(),
                            &f.name,
                            f.parent.as_fd(),
                            gone.as_ref(),
                        )
                    })?;
                    Ok(Some((f.parent, gone, dir)))
                }
                Node::Dir => Err(Error::from_errno(libc::EISDIR)),
                Node::Other => Ok(None),
            }
        })?;
        match gone {
            None => self.pt.unlink(ctx, path),
            Some((parent, gone, dir)) => self.counts.change(parent.as_fd(), 0, || {
                self.remove_renamed(&parent, OsStr::new(&gone), &dir)
            }),
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
        let (a, b, to_parent) = as_caller(ctx, || {
            let a = self.find(from)?;
            let to_parent = self.parent_for_new(to)?;
            let b = match self.find(to) {
                Ok(b) => Some(b),
                Err(e) if e.errno() == libc::ENOENT => None,
                Err(e) => return Err(e),
            };
            Ok((a, b, to_parent))
        })?;
        let rename = |flags: RenameFlags, b: Option<&Found>| {
            self.rename_as_file(ctx, from, to, flags, &a, b, (&to_parent.0, &to_parent.1))
        };
        if flags.exchange || flags.noreplace {
            return rename(flags, b.as_ref());
        }
        let Some(b) = b else {
            return rename(flags, None);
        };
        if same_entry(&a, &b)? {
            return Ok(());
        }
        let replace_file = match (&a.node, &b.node) {
            (Node::File(_), Node::Dir) => return Err(Error::from_errno(libc::EISDIR)),
            (Node::Dir, Node::File(_)) => return Err(Error::from_errno(libc::ENOTDIR)),
            (Node::File(_), Node::File(_)) | (Node::Other, Node::File(_)) => true,
            (Node::File(_), Node::Other) => false,
            _ => return rename(flags, Some(&b)),
        };
        let swap = RenameFlags {
            exchange: true,
            noreplace: false,
        };
        match rename(swap, Some(&b)) {
            // No RENAME_EXCHANGE in the store (GlusterFS's client).
            Err(e) if e.errno() == libc::EINVAL => {
                let plain = RenameFlags {
                    exchange: false,
                    noreplace: false,
                };
                return self.replace_in_two_steps(ctx, &b, replace_file, || rename(plain, None));
            }
            r => r?,
        }
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
    /// A rename over `b` where the store cannot exchange two names: `b`
    /// moves to a hidden name (as the caller), `rename` moves the source
    /// into the freed name, and `b` is removed; if the second step fails,
    /// `b` is put back. Not atomic: between the two steps the name does not
    /// exist, so a lookup from another host may find nothing for an
    /// instant (documented in `docs/plfs-hosts.md`).
    fn replace_in_two_steps(
        &self,
        ctx: &Ctx,
        b: &Found,
        replace_file: bool,
        rename: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let gone = format!("{GONE_PREFIX}{}", format::new_id());
        as_caller(ctx, || {
            container::rename_noreplace(b.parent.as_fd(), &b.name, b.parent.as_fd(), gone.as_ref())
        })?;
        if let Err(e) = rename() {
            if let Err(back) = rustix::fs::renameat(&b.parent, gone.as_str(), &b.parent, &b.name) {
                warn!("plfs: cannot put back {gone} after a failed rename: {back}");
            }
            return Err(e);
        }
        let res = match &b.node {
            Node::File(d) if replace_file => self.remove_renamed(&b.parent, OsStr::new(&gone), d),
            _ => rustix::fs::unlinkat(&b.parent, gone.as_str(), AtFlags::empty())
                .map_err(Error::from),
        };
        if let Err(e) = &res {
            warn!("plfs: rename replaced a file but cannot remove it: {e}");
        }
        res
    }

    /// Renames `from` (found as `a`) to `to` (in `to_parent`, holding `b`
    /// if it exists) as the caller. A file is a container *directory*, and
    /// the kernel lets a directory change parents only with write
    /// permission on the directory itself (its `..` changes), which a plain
    /// file does not need: a user who may write both directories but does
    /// not own the file would get `EACCES` where native succeeds. When the
    /// caller's rename fails with `EACCES` and a container changes parents,
    /// the rules of `rename(2)` for a file are checked as the caller
    /// ([`Plfs::may_rename_as_file`]) and the daemon renames, on the
    /// directory descriptors that were checked, once it has seen that the
    /// names still hold the nodes that were checked (`ESTALE` otherwise, on
    /// which the kernel looks the names up again and retries): what was
    /// judged is what moves, but for a swap in the instant between that last
    /// look and the rename.
    #[allow(clippy::too_many_arguments)]
    fn rename_as_file(
        &self,
        ctx: &Ctx,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
        a: &Found,
        b: Option<&Found>,
        (to_parent, to_name): (&OwnedFd, &OsStr),
    ) -> Result<()> {
        let err = match self.pt.rename(ctx, from, to, flags) {
            Err(e) if e.errno() == libc::EACCES => e,
            r => return r,
        };
        let is_file = |f: &Found| matches!(f.node, Node::File(_));
        if !(is_file(a) || b.is_some_and(is_file)) || same_dir(&a.parent, to_parent)? {
            return Err(err);
        }
        let checked = as_caller(ctx, || {
            self.may_rename_as_file(ctx, a, b, to_parent, flags.exchange)
        })?;
        let mut now = vec![node_id(&a.parent, &a.name)?];
        if let Some(b) = b {
            now.push(node_id(to_parent, &b.name)?);
        }
        if now != checked {
            return Err(Error::from_errno(libc::ESTALE));
        }
        let f = crate::passthrough::backing_rename_flags(flags);
        Ok(rustix::fs::renameat_with(
            &a.parent, &a.name, to_parent, to_name, f,
        )?)
    }

    /// What the kernel checks when a non-directory `a` moves to another
    /// directory `to_parent` (replacing `b`, or exchanged with it): write
    /// and search permission on both directories (`EACCES`), the sticky bit
    /// of each (`EPERM` unless the caller owns the entry or the directory),
    /// and write permission on a real directory that changes parents (an
    /// exchanged one). Run as the caller; a root caller never gets here
    /// (its rename succeeds or fails for reasons these checks share).
    /// Returns the backing identities of `a` and `b` as checked (`ESTALE`
    /// when a file's name no longer holds its container).
    fn may_rename_as_file(
        &self,
        ctx: &Ctx,
        a: &Found,
        b: Option<&Found>,
        to_parent: &OwnedFd,
        exchange: bool,
    ) -> Result<Vec<(u64, u64)>> {
        // Identities first: the checks below look at what these name.
        let mut ids = Vec::new();
        for (dir, f) in std::iter::once((&a.parent, a)).chain(b.map(|b| (to_parent, b))) {
            let id = node_id(dir, &f.name)?;
            if let Node::File(c) = &f.node {
                let st = rustix::fs::fstat(c)?;
                if id != (st.st_dev, st.st_ino) {
                    return Err(Error::from_errno(libc::ESTALE));
                }
            }
            ids.push(id);
        }
        let wx = rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK;
        for dir in [&a.parent, to_parent] {
            rustix::fs::accessat(dir, ".", wx, AtFlags::EACCESS)?;
        }
        let sticky = |dir: &OwnedFd, name: &OsStr| -> Result<()> {
            let d = rustix::fs::fstat(dir)?;
            if d.st_mode & libc::S_ISVTX == 0 || d.st_uid == ctx.uid {
                return Ok(());
            }
            let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if st.st_uid == ctx.uid {
                return Ok(());
            }
            Err(Error::from_errno(libc::EPERM))
        };
        sticky(&a.parent, &a.name)?;
        if let Some(b) = b {
            sticky(to_parent, &b.name)?;
        }
        let moved_dirs =
            std::iter::once((&a.parent, a)).chain(b.filter(|_| exchange).map(|b| (to_parent, b)));
        for (dir, f) in moved_dirs {
            if matches!(f.node, Node::Dir) {
                rustix::fs::accessat(dir, &f.name, rustix::fs::Access::WRITE_OK, AtFlags::EACCESS)?;
            }
        }
        Ok(ids)
    }

    /// Removes container `name` of `parent`, a file this daemon removed by
    /// renaming it to a hidden name (`unlink`, a rename over it). The name
    /// is gone already: that is the removal. A writer on another host that
    /// had the file open may put its log or index in the container while it
    /// is being emptied, as it may write to an unlinked file: the container
    /// then stays under its hidden name and is tried again later
    /// ([`Plfs::retry_leftovers`]; also removed with its directory).
    /// Before, the caller got ENOTEMPTY for a removal that had taken effect
    /// (fio laying out one file from two hosts over Gluster).
    fn remove_renamed(&self, parent: &OwnedFd, name: &OsStr, dir: &OwnedFd) -> Result<()> {
        self.retry_leftovers();
        match self.remove_container(parent.as_fd(), name, dir) {
            Err(e) if e.errno() == libc::ENOTEMPTY => {
                debug!("a removed file's container kept a new entry: {e}");
                let mut left = self.leftovers.lock();
                if left.len() < super::LEFTOVERS_KEPT {
                    if let Ok(p) = parent.try_clone() {
                        left.push((p, name.to_os_string()));
                    }
                }
                Ok(())
            }
            r => r,
        }
    }

    /// Tries again to remove the containers of removed files that a writer
    /// elsewhere kept an entry in ([`Plfs::leftovers`]); those still in
    /// use stay listed.
    fn retry_leftovers(&self) {
        let left = std::mem::take(&mut *self.leftovers.lock());
        let mut kept = Vec::new();
        for (parent, name) in left {
            match container::remove_container(parent.as_fd(), &name) {
                Err(e) if e.errno() == libc::ENOTEMPTY => kept.push((parent, name)),
                Err(e) => warn!("cannot remove a removed file's container: {e}"),
                Ok(()) => {}
            }
        }
        let mut now = self.leftovers.lock();
        kept.truncate(super::LEFTOVERS_KEPT.saturating_sub(now.len()));
        now.extend(kept);
    }

    /// Removes container `dir`, now named `name` in `parent`, holding its
    /// lock: an open or merge of it that raced the unlink either completed
    /// before (and keeps its logs open) or finds it gone and looks the name
    /// up again (`ESTALE`), never a half-removed container.
    fn remove_container(&self, parent: BorrowedFd<'_>, name: &OsStr, dir: &OwnedFd) -> Result<()> {
        let key = container::key_of(dir.as_fd())?;
        match self.store.lock(dir.as_fd(), key) {
            Ok(locked) => {
                let res = container::remove_container(parent, name);
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

/// The backing device and inode of `name` in `dir`.
fn node_id(dir: &OwnedFd, name: &OsStr) -> Result<(u64, u64)> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok((st.st_dev, st.st_ino))
}

/// True when both fds are the same backing directory.
fn same_dir(a: &OwnedFd, b: &OwnedFd) -> Result<bool> {
    let (sa, sb) = (rustix::fs::fstat(a)?, rustix::fs::fstat(b)?);
    Ok(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
}

/// True when both names are the same backing node (renaming a name onto
/// itself does nothing).
fn same_entry(a: &Found, b: &Found) -> Result<bool> {
    let sa = rustix::fs::statat(&a.parent, &a.name, AtFlags::SYMLINK_NOFOLLOW)?;
    let sb = rustix::fs::statat(&b.parent, &b.name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
}
