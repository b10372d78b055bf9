//! The namespace: resolving paths, creating and removing names, rename,
//! links, attributes and extended attributes, all in database transactions.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use mapfs::{Attr, Ctx, DirEntry, Error, FileKind, RenameFlags, Result, SetAttr, TimeSet};
use rusqlite::{params, Connection, OptionalExtension};

use super::db::{self, DbResult, Inode, ROOT};
use super::dircache::DirCache;
use super::perm::{self, W, X};
use super::readcache::ReadCache;
use super::Pack;

/// Longest name of an entry.
pub const NAME_MAX: usize = 255;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
const XATTR_MAX: usize = 65536;

/// The names of `path` below the root.
fn names(path: &Path) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => {
                if n.len() > NAME_MAX {
                    return Err(Error::from_errno(libc::ENAMETOOLONG));
                }
                out.push(n.as_bytes());
            }
            _ => return Err(Error::invalid().context("path with `..` or a prefix")),
        }
    }
    Ok(out)
}

/// Walks `names` from the root, checking search permission on each
/// directory passed (taken from `dirs` where remembered).
fn walk(conn: &Connection, dirs: &DirCache, ctx: &Ctx, names: &[&[u8]]) -> Result<Inode> {
    let Some((last, passed)) = names.split_last() else {
        return db::get_inode(conn, ROOT);
    };
    let parent = walk_dirs(conn, dirs, ctx, passed)?;
    entry(conn, None, &parent, last)
}

/// Entry `last` of `parent`. With `reads` (the cache and the
/// [`db::writes`] count read under the connection's lock), it comes from
/// the cache when it is there (as found or as missing), and goes into it
/// when read.
fn entry(
    conn: &Connection,
    reads: Option<(&ReadCache, u64)>,
    parent: &Inode,
    last: &[u8],
) -> Result<Inode> {
    let found = match reads.and_then(|(c, writes)| c.name(writes, parent.ino, last)) {
        Some(found) => found,
        None => {
            let found = db::lookup(conn, parent.ino, last)?;
            if let Some((c, writes)) = reads {
                c.put_name(writes, parent.ino, last, found.as_ref());
            }
            found
        }
    };
    found.ok_or_else(Error::not_found)
}

/// [`resolve`] outside any write transaction, with the final name read
/// through `reads` (see `readcache.rs`) at the database's `version`
/// (`Pack::version`, read under the connection's lock), which it also
/// returns; but a name `pending` knows (a create answered before its
/// commit, `pending.rs`) is that create's inode.
pub fn resolve_read(
    conn: &Connection,
    dirs: &DirCache,
    reads: &ReadCache,
    version: u64,
    ctx: &Ctx,
    path: &Path,
    pending: impl FnOnce(i64, &[u8]) -> Option<Inode>,
) -> Result<(Inode, u64)> {
    let n = names(path)?;
    let Some((last, passed)) = n.split_last() else {
        return Ok((db::get_inode(conn, ROOT)?, version));
    };
    let parent = walk_dirs(conn, dirs, ctx, passed)?;
    if let Some(i) = pending(parent.ino, last) {
        return Ok((i, version));
    }
    Ok((entry(conn, Some((reads, version)), &parent, last)?, version))
}

/// The directory at `names` (the root when empty), searchable by `ctx`,
/// as are the directories passed. Only its number, mode and owner are to
/// be trusted: it may come from `dirs`.
fn walk_dirs(conn: &Connection, dirs: &DirCache, ctx: &Ctx, names: &[&[u8]]) -> Result<Inode> {
    let mut cur = dir_entry(conn, dirs, 0, b"")?;
    // Root searches every directory.
    if ctx.uid != 0 {
        perm::check(ctx, &cur, X)?;
    }
    for n in names {
        cur = dir_entry(conn, dirs, cur.ino, n)?;
        if !cur.is_dir() {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        perm::check(ctx, &cur, X)?;
    }
    Ok(cur)
}

/// Entry `name` of directory `parent` (`(0, "")`: the root), from `dirs`
/// when it is a directory met before; only its number, mode and owner are
/// to be trusted.
fn dir_entry(conn: &Connection, dirs: &DirCache, parent: i64, name: &[u8]) -> Result<Inode> {
    if let Some(i) = dirs.get(parent, name) {
        return Ok(i);
    }
    let i = if parent == 0 {
        db::get_inode(conn, ROOT)?
    } else {
        db::lookup(conn, parent, name)?.ok_or_else(Error::not_found)?
    };
    dirs.put(parent, name, &i);
    Ok(i)
}

/// The inode at `path`.
pub fn resolve(conn: &Connection, dirs: &DirCache, ctx: &Ctx, path: &Path) -> Result<Inode> {
    walk(conn, dirs, ctx, &names(path)?)
}

/// The parent directory of `path` (searchable by `ctx`) and the final name.
/// Only the parent's number, mode and owner are to be trusted (it may come
/// from `dirs`).
pub fn resolve_parent(
    conn: &Connection,
    dirs: &DirCache,
    ctx: &Ctx,
    path: &Path,
) -> Result<(Inode, Vec<u8>)> {
    let n = names(path)?;
    let Some((last, dirs_of)) = n.split_last() else {
        return Err(Error::from_errno(libc::EBUSY).context("the root has no parent"));
    };
    let parent = walk_dirs(conn, dirs, ctx, dirs_of)?;
    Ok((parent, last.to_vec()))
}

/// The parent for a new entry `path`: writable by `ctx`, name free (in
/// the database; asked through `reads` as [`entry`] does: outside a write
/// transaction only).
pub(super) fn parent_for_new(
    conn: &Connection,
    dirs: &DirCache,
    reads: Option<(&ReadCache, u64)>,
    ctx: &Ctx,
    path: &Path,
) -> Result<(Inode, Vec<u8>)> {
    let (parent, name) = resolve_parent(conn, dirs, ctx, path)?;
    perm::check(ctx, &parent, W | X)?;
    match entry(conn, reads, &parent, &name) {
        Ok(_) => Err(Error::from_errno(libc::EEXIST)),
        Err(e) if e.errno() == libc::ENOENT => Ok((parent, name)),
        Err(e) => Err(e),
    }
}

/// Owner, group and mode of a new inode in `parent`: the caller's uid, the
/// directory's group if it is setgid (and setgid itself for a directory).
pub(super) fn new_owner(ctx: &Ctx, parent: &Inode, mode: u32) -> (u32, u32, u32) {
    if parent.mode & libc::S_ISGID != 0 {
        let mode = if mode & libc::S_IFMT == libc::S_IFDIR {
            mode | libc::S_ISGID
        } else {
            mode
        };
        (ctx.uid, parent.gid, mode)
    } else {
        (ctx.uid, ctx.gid, mode)
    }
}

/// Creates a node (`mode` with type bits) at `path`; returns its inode.
pub fn make_node(
    conn: &Connection,
    dirs: &DirCache,
    ctx: &Ctx,
    path: &Path,
    mode: u32,
    rdev: u64,
    target: Option<&[u8]>,
) -> Result<Inode> {
    let (parent, name) = parent_for_new(conn, dirs, None, ctx, path)?;
    let (uid, gid, mode) = new_owner(ctx, &parent, mode);
    let dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let nlink = if dir { 2 } else { 1 };
    let size = target.map_or(0, |t| t.len() as u64);
    let ino = db::insert_inode(conn, mode, uid, gid, nlink, size, rdev, target)?;
    db::insert_dentry(conn, parent.ino, &name, ino)?;
    if dir {
        db::add_nlink(conn, parent.ino, 1)?;
    }
    db::touch_dir(conn, parent.ino)?;
    db::get_inode(conn, ino)
}

/// Attributes of `i`, a file of its own whose backing file's state is `st`
/// (its size, blocks and times).
pub(super) fn own_attr(i: &Inode, st: &rustix::fs::Stat) -> Attr {
    let mut a = i.attr();
    a.size = st.st_size as u64;
    a.blocks = st.st_blocks as u64;
    a.mtime = db::from_ns(db::stat_ns(st.st_mtime, st.st_mtime_nsec as i64));
    a.atime = db::from_ns(db::stat_ns(st.st_atime, st.st_atime_nsec as i64));
    let c = db::stat_ns(st.st_ctime, st.st_ctime_nsec as i64);
    a.ctime = db::from_ns(c.max(i.ctime));
    a
}

impl Pack {
    /// Attributes of `i` (a file of its own: size, blocks and times of its
    /// backing file).
    pub(super) fn attr_of(&self, i: &Inode) -> Result<Attr> {
        let a = i.attr();
        if i.own {
            let st = match rustix::fs::statat(
                &self.own_dir,
                i.ino.to_string(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                // Moved into a slot since `i` was read (`born.rs`).
                Err(rustix::io::Errno::NOENT) => {
                    let now = db::get_inode(&*self.db()?, i.ino)?;
                    if now.own {
                        return Err(Error::from_errno(libc::ENOENT));
                    }
                    return Ok(now.attr());
                }
                Err(e) => return Err(e.into()),
            };
            return Ok(own_attr(i, &st));
        }
        Ok(a)
    }

    /// Drops the last name of `ino`: deletes it now, or when its last open
    /// ends. Returns the inode of a file of its own to remove after commit.
    pub(super) fn drop_link(&self, conn: &Connection, i: &Inode) -> Result<Option<i64>> {
        let left = if i.is_dir() {
            0
        } else {
            i.nlink.saturating_sub(1)
        };
        if left > 0 {
            db::add_nlink(conn, i.ino, -1)?;
            return Ok(None);
        }
        conn.prepare_cached("UPDATE inodes SET nlink = 0, ctime = ?2 WHERE ino = ?1")
            .db()?
            .execute(params![i.ino, db::now_ns()])
            .db()?;
        if self.shared {
            // Deleted after the commit, if no process has it open.
            self.reaps.lock().push(super::shared::Reap::Ino(i.ino));
            return Ok(None);
        }
        if self.opens.lock().get(&i.ino).copied().unwrap_or(0) > 0 {
            self.orphans.lock().insert(i.ino);
            return Ok(None);
        }
        self.destroy(conn, i.ino)
    }

    /// Deletes inode `ino` and gives back its slot (marked as in use by
    /// opens if some still read it). Returns `Some(ino)` when its file of
    /// its own is to be removed after the commit.
    pub(super) fn destroy(&self, conn: &Connection, ino: i64) -> Result<Option<i64>> {
        let Some(i) = db::inode(conn, ino)? else {
            return Ok(None);
        };
        if let Some(s) = i.slot {
            self.set_owner_or_zombie(conn, s, ino, false)?;
        }
        self.remove_lock_file(ino);
        for sql in [
            "DELETE FROM extents WHERE ino = ?1",
            "DELETE FROM xattrs WHERE ino = ?1",
            "DELETE FROM inodes WHERE ino = ?1",
        ] {
            conn.prepare_cached(sql).db()?.execute([ino]).db()?;
        }
        Ok(i.own.then_some(ino))
    }

    /// Gives slot `s` to file `ino` (`own`), or, as the file leaves it,
    /// frees it, or marks it used by opens only while an open still uses it.
    pub(super) fn set_owner_or_zombie(
        &self,
        conn: &Connection,
        s: db::Slot,
        ino: i64,
        own: bool,
    ) -> Result<()> {
        let owner = if own {
            self.zombies.lock().remove(&s);
            Some(ino)
        } else if self.shared {
            // Freed after the commit, if no process uses it.
            if !self.packs.in_use(s) {
                self.reaps.lock().push(super::shared::Reap::Slot(s));
            }
            Some(-ino)
        } else if self.packs.in_use(s) {
            self.zombies.lock().insert(s);
            Some(-ino)
        } else {
            None
        };
        db::set_slot_owner(conn, s, owner)
    }

    /// Removes the file of its own of a deleted inode (best effort: a
    /// leftover is only space).
    pub(super) fn remove_own(&self, ino: Option<i64>) {
        if let Some(ino) = ino {
            let _ =
                rustix::fs::unlinkat(&self.own_dir, ino.to_string(), rustix::fs::AtFlags::empty());
        }
    }

    pub(super) fn do_unlink(&self, ctx: &Ctx, path: &Path, dir: bool) -> Result<()> {
        let gone = self.write(|tx| {
            let (parent, name) = resolve_parent(tx, &self.dirs, ctx, path)?;
            let i = db::lookup(tx, parent.ino, &name)?.ok_or_else(Error::not_found)?;
            perm::check(ctx, &parent, W | X)?;
            perm::check_sticky(ctx, &parent, &i)?;
            if dir {
                if !i.is_dir() {
                    return Err(Error::from_errno(libc::ENOTDIR));
                }
                if !db::dir_is_empty(tx, i.ino)? {
                    return Err(Error::from_errno(libc::ENOTEMPTY));
                }
                db::add_nlink(tx, parent.ino, -1)?;
                // Before the lock goes: no walk may pass the removed one.
                self.dirs.clear();
            } else if i.is_dir() {
                return Err(Error::from_errno(libc::EISDIR));
            }
            db::delete_dentry(tx, parent.ino, &name)?;
            db::touch_dir(tx, parent.ino)?;
            self.drop_link(tx, &i)
        })?;
        self.remove_own(gone);
        Ok(())
    }

    pub(super) fn do_link(&self, ctx: &Ctx, from: &Path, to: &Path) -> Result<Attr> {
        let i = self.write(|tx| {
            let i = resolve(tx, &self.dirs, ctx, from)?;
            if i.is_dir() {
                return Err(Error::from_errno(libc::EPERM));
            }
            let (parent, name) = parent_for_new(tx, &self.dirs, None, ctx, to)?;
            db::insert_dentry(tx, parent.ino, &name, i.ino)?;
            db::add_nlink(tx, i.ino, 1)?;
            db::touch_dir(tx, parent.ino)?;
            db::get_inode(tx, i.ino)
        })?;
        self.attr_of(&i)
    }

    pub(super) fn do_rename(
        &self,
        ctx: &Ctx,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.exchange && flags.noreplace {
            return Err(Error::invalid());
        }
        let gone = self.write(|tx| {
            let (fp, fname) = resolve_parent(tx, &self.dirs, ctx, from)?;
            let (tp, tname) = resolve_parent(tx, &self.dirs, ctx, to)?;
            let src = db::lookup(tx, fp.ino, &fname)?.ok_or_else(Error::not_found)?;
            let dst = db::lookup(tx, tp.ino, &tname)?;
            perm::check(ctx, &fp, W | X)?;
            perm::check(ctx, &tp, W | X)?;
            perm::check_sticky(ctx, &fp, &src)?;
            if let Some(d) = &dst {
                perm::check_sticky(ctx, &tp, d)?;
            }
            // A directory's path changes (or it goes): no later walk may
            // pass it under its old name. The lock is held to the commit.
            if src.is_dir() || dst.as_ref().is_some_and(Inode::is_dir) {
                self.dirs.clear();
            }
            // A directory may not move below itself.
            let root = Path::new("/");
            let moves_dir = |d: &Inode, at: &Path, dest: &Path| -> Result<()> {
                if d.is_dir() && is_below(dest.parent().unwrap_or(root), at)? {
                    return Err(Error::invalid());
                }
                Ok(())
            };
            if flags.exchange {
                let Some(dst) = dst else {
                    return Err(Error::not_found());
                };
                moves_dir(&src, from, to)?;
                moves_dir(&dst, to, from)?;
                set_dentry(tx, fp.ino, &fname, dst.ino)?;
                set_dentry(tx, tp.ino, &tname, src.ino)?;
                if fp.ino != tp.ino && src.is_dir() != dst.is_dir() {
                    let d = if src.is_dir() { 1 } else { -1 };
                    db::add_nlink(tx, tp.ino, d)?;
                    db::add_nlink(tx, fp.ino, -d)?;
                }
                for ino in [src.ino, dst.ino] {
                    db::touch_ctime(tx, ino)?;
                }
                db::touch_dir(tx, fp.ino)?;
                db::touch_dir(tx, tp.ino)?;
                return Ok(None);
            }
            let mut gone = None;
            if let Some(d) = &dst {
                if flags.noreplace {
                    return Err(Error::from_errno(libc::EEXIST));
                }
                if d.ino == src.ino {
                    // Two names of one file: rename does nothing.
                    return Ok(None);
                }
                match (src.is_dir(), d.is_dir()) {
                    (true, false) => return Err(Error::from_errno(libc::ENOTDIR)),
                    (false, true) => return Err(Error::from_errno(libc::EISDIR)),
                    (true, true) if !db::dir_is_empty(tx, d.ino)? => {
                        return Err(Error::from_errno(libc::ENOTEMPTY))
                    }
                    _ => {}
                }
            }
            moves_dir(&src, from, to)?;
            if let Some(d) = &dst {
                db::delete_dentry(tx, tp.ino, &tname)?;
                if d.is_dir() {
                    db::add_nlink(tx, tp.ino, -1)?;
                }
                gone = self.drop_link(tx, d)?;
            }
            tx.prepare_cached(
                "UPDATE dentries SET parent = ?3, name = ?4 WHERE parent = ?1 AND name = ?2",
            )
            .db()?
            .execute(params![fp.ino, fname, tp.ino, tname])
            .db()?;
            if src.is_dir() && fp.ino != tp.ino {
                db::add_nlink(tx, fp.ino, -1)?;
                db::add_nlink(tx, tp.ino, 1)?;
            }
            db::touch_ctime(tx, src.ino)?;
            db::touch_dir(tx, fp.ino)?;
            db::touch_dir(tx, tp.ino)?;
            Ok(gone)
        })?;
        self.remove_own(gone);
        Ok(())
    }

    pub(super) fn do_readdir(&self, ctx: &Ctx, path: &Path) -> Result<Vec<DirEntry>> {
        let conn = self.db()?;
        let d = resolve(&conn, &self.dirs, ctx, path)?;
        if !d.is_dir() {
            return Err(Error::from_errno(libc::ENOTDIR));
        }
        let mut st = conn
            .prepare_cached(
                "SELECT d.name, i.ino, i.mode, i.uid, i.gid, i.nlink, i.size, i.atime, \
                 i.mtime, i.ctime, i.rdev, i.own, i.pack, i.off, i.cap \
                 FROM dentries d JOIN inodes i ON i.ino = d.ino WHERE d.parent = ?1",
            )
            .db()?;
        let rows = st
            .query_map([d.ino], |r| {
                let name: Vec<u8> = r.get(0)?;
                let pack: Option<i64> = r.get(12)?;
                let i = Inode {
                    ino: r.get(1)?,
                    mode: r.get(2)?,
                    uid: r.get(3)?,
                    gid: r.get(4)?,
                    nlink: r.get(5)?,
                    size: r.get::<_, i64>(6)? as u64,
                    atime: r.get(7)?,
                    mtime: r.get(8)?,
                    ctime: r.get(9)?,
                    rdev: r.get::<_, i64>(10)? as u64,
                    own: r.get::<_, i64>(11)? != 0,
                    slot: match pack {
                        Some(pack) => Some(db::Slot {
                            pack,
                            off: r.get::<_, i64>(13)? as u64,
                            cap: r.get::<_, i64>(14)? as u64,
                        }),
                        None => None,
                    },
                };
                Ok((name, i))
            })
            .db()?;
        let mut out = Vec::new();
        for row in rows {
            let (name, i) = row.db()?;
            out.push(DirEntry {
                name: OsStr::from_bytes(&name).to_os_string(),
                ino: i.ino as u64,
                kind: i.kind(),
                // A file of its own needs a stat for its size: left to getattr.
                attr: (!i.own).then(|| i.attr()),
            });
        }
        Ok(out)
    }

    pub(super) fn do_setattr(&self, ctx: &Ctx, path: &Path, set: &SetAttr) -> Result<Attr> {
        let i = self.write(|tx| {
            let i = resolve(tx, &self.dirs, ctx, path)?;
            if i.is_dir() && (set.mode.is_some() || set.uid.is_some() || set.gid.is_some()) {
                // Walks check search permission with what they remember.
                self.dirs.clear();
            }
            let mut mode = i.mode;
            let (mut uid, mut gid) = (i.uid, i.gid);
            if let Some(m) = set.mode {
                perm::check_owner(ctx, &i)?;
                mode = (i.mode & libc::S_IFMT) | (m & 0o7777);
                if ctx.uid != 0 && !mapfs::creds::in_group(ctx, i.gid) {
                    mode &= !libc::S_ISGID;
                }
            }
            if set.uid.is_some_and(|u| u != i.uid) && ctx.uid != 0 {
                return Err(Error::from_errno(libc::EPERM));
            }
            if let Some(g) = set.gid.filter(|g| *g != i.gid) {
                if ctx.uid != 0 && (ctx.uid != i.uid || !mapfs::creds::in_group(ctx, g)) {
                    return Err(Error::from_errno(libc::EPERM));
                }
            }
            if set.uid.is_some() || set.gid.is_some() {
                uid = set.uid.unwrap_or(uid);
                gid = set.gid.unwrap_or(gid);
                // As the kernel's chown does on a local file system: for
                // every kind but directories (FIFOs, sockets and device
                // nodes too), even when the owner stays the same, setuid
                // goes, and setgid with it where the group may execute (or
                // the caller is neither root nor in the file's group). A
                // chown with neither id (-1, -1) never reaches here. A mode
                // given with the ids is applied after them, as it stands.
                if i.kind() != FileKind::Dir && set.mode.is_none() {
                    mode &= !libc::S_ISUID;
                    if mode & libc::S_IXGRP != 0
                        || (ctx.uid != 0 && !mapfs::creds::in_group(ctx, i.gid))
                    {
                        mode &= !libc::S_ISGID;
                    }
                }
            }
            let now = db::now_ns();
            let time = |t: Option<TimeSet>, old: i64| -> Result<i64> {
                Ok(match t {
                    None => old,
                    Some(TimeSet::Now) => {
                        if ctx.uid != 0 && ctx.uid != i.uid && !perm::allowed(ctx, &i, W) {
                            return Err(Error::from_errno(libc::EACCES));
                        }
                        now
                    }
                    Some(TimeSet::At(t)) => {
                        perm::check_owner(ctx, &i)?;
                        db::to_ns(t)
                    }
                })
            };
            let atime = time(set.atime, i.atime)?;
            let mut mtime = time(set.mtime, i.mtime)?;
            let mut size = i.size;
            if let Some(s) = set.size {
                match i.kind() {
                    FileKind::Dir => return Err(Error::from_errno(libc::EISDIR)),
                    FileKind::File => {}
                    _ => return Err(Error::invalid()),
                }
                perm::check(ctx, &i, W)?;
                if i.own {
                    self.own_file(i.ino, libc::O_WRONLY)?.set_len(s)?;
                } else if s < size {
                    db::cut_extents(tx, i.ino, s)?;
                }
                size = s;
                if set.mtime.is_none() {
                    mtime = now;
                }
            }
            if i.own && (set.atime.is_some() || set.mtime.is_some()) {
                let f = self.own_file(i.ino, libc::O_WRONLY)?;
                let times = std::fs::FileTimes::new()
                    .set_accessed(db::from_ns(atime))
                    .set_modified(db::from_ns(mtime));
                f.set_times(times)?;
            }
            tx.prepare_cached(
                "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, size = ?5, atime = ?6, \
                 mtime = ?7, ctime = ?8 WHERE ino = ?1",
            )
            .db()?
            .execute(params![
                i.ino,
                mode,
                uid,
                gid,
                size as i64,
                atime,
                mtime,
                now
            ])
            .db()?;
            db::get_inode(tx, i.ino)
        })?;
        self.attr_of(&i)
    }

    pub(super) fn do_setxattr(
        &self,
        ctx: &Ctx,
        path: &Path,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        check_xattr_name(ctx, name)?;
        if value.len() > XATTR_MAX {
            return Err(Error::from_errno(libc::E2BIG));
        }
        self.write(|tx| {
            let i = resolve(tx, &self.dirs, ctx, path)?;
            if !matches!(i.kind(), FileKind::File | FileKind::Dir)
                && name.as_bytes().starts_with(b"user.")
            {
                return Err(Error::from_errno(libc::EPERM));
            }
            let exists = xattr(tx, i.ino, name)?.is_some();
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Error::from_errno(libc::EEXIST));
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Error::from_errno(libc::ENODATA));
            }
            if name.as_bytes().starts_with(b"security.") {
                self.security_xattrs
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?1, ?2, ?3)",
            )
            .db()?
            .execute(params![i.ino, name.as_bytes(), value])
            .db()?;
            db::touch_ctime(tx, i.ino)
        })
    }

    pub(super) fn do_getxattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<Vec<u8>> {
        // No ACLs are stored: the kernel asks for them at every permission
        // check of a non-owner and must hear "none" (ENODATA), not an error.
        let security = name.as_bytes().starts_with(b"security.")
            && !self
                .security_xattrs
                .load(std::sync::atomic::Ordering::Relaxed);
        if security || name.as_bytes().starts_with(b"system.") {
            return Err(Error::from_errno(libc::ENODATA));
        }
        check_xattr_name(ctx, name)?;
        let conn = self.db()?;
        let i = resolve(&conn, &self.dirs, ctx, path)?;
        xattr(&conn, i.ino, name)?.ok_or_else(|| Error::from_errno(libc::ENODATA))
    }

    pub(super) fn do_listxattr(&self, ctx: &Ctx, path: &Path) -> Result<Vec<OsString>> {
        let conn = self.db()?;
        let i = resolve(&conn, &self.dirs, ctx, path)?;
        let mut st = conn
            .prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")
            .db()?;
        let names = st
            .query_map([i.ino], |r| r.get::<_, Vec<u8>>(0))
            .db()?
            .collect::<rusqlite::Result<Vec<_>>>()
            .db()?;
        Ok(names
            .into_iter()
            .filter(|n| ctx.uid == 0 || !n.starts_with(b"trusted."))
            .map(|n| OsStr::from_bytes(&n).to_os_string())
            .collect())
    }

    pub(super) fn do_removexattr(&self, ctx: &Ctx, path: &Path, name: &OsStr) -> Result<()> {
        check_xattr_name(ctx, name)?;
        self.write(|tx| {
            let i = resolve(tx, &self.dirs, ctx, path)?;
            let n = tx
                .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")
                .db()?
                .execute(params![i.ino, name.as_bytes()])
                .db()?;
            if n == 0 {
                return Err(Error::from_errno(libc::ENODATA));
            }
            db::touch_ctime(tx, i.ino)
        })
    }
}

/// Replaces the target of entry `name` of `parent`.
fn set_dentry(conn: &Connection, parent: i64, name: &[u8], ino: i64) -> Result<()> {
    conn.prepare_cached("UPDATE dentries SET ino = ?3 WHERE parent = ?1 AND name = ?2")
        .db()?
        .execute(params![parent, name, ino])
        .db()?;
    Ok(())
}

/// True when the directory at path `dir` is the one at `ancestor` or lies
/// below it, both paths as walks in the same transaction found them. A
/// directory has one name, so the walk to it passes exactly the
/// directories its path names: one walk passes the other's directory when
/// its names start with the other's. (This spares the database an index of
/// entries by inode, a page written at every create, link and rename.)
fn is_below(dir: &Path, ancestor: &Path) -> Result<bool> {
    Ok(names(dir)?.starts_with(&names(ancestor)?))
}

/// The value of xattr `name` of `ino`.
fn xattr(conn: &Connection, ino: i64, name: &OsStr) -> Result<Option<Vec<u8>>> {
    conn.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")
        .db()?
        .query_row(params![ino, name.as_bytes()], |r| r.get(0))
        .optional()
        .db()
}

/// Namespaces the file system keeps: `user.` for anyone, `trusted.` and
/// `security.` for root; `system.` (ACLs) is not supported.
fn check_xattr_name(ctx: &Ctx, name: &OsStr) -> Result<()> {
    let n = name.as_bytes();
    if n.is_empty() || n.len() > NAME_MAX {
        return Err(Error::from_errno(libc::ERANGE));
    }
    if n.starts_with(b"user.") {
        return Ok(());
    }
    if n.starts_with(b"trusted.") || n.starts_with(b"security.") {
        if ctx.uid == 0 {
            return Ok(());
        }
        return Err(Error::from_errno(libc::EPERM));
    }
    Err(Error::from_errno(libc::EOPNOTSUPP))
}
