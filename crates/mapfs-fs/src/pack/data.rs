//! Opens: maps of slotted files and files of their own, persisting a map
//! at flush and release, and remap (a bigger slot, or a file of its own).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mapfs::{
    Attr, Ctx, DataMap, Error, Extent, FileKind, Growth, OpenFlags, Opened, Result, Segment,
};
use rustix::fs::{Mode, OFlags};

use super::db::{self, Inode, Slot};
use super::names;
use super::perm::{self, R, W};
use super::readcache;
use super::shared::Reap;
use super::slots;
use super::{Handle, Pack};

/// An extent row: `(logical, off, len)`.
type Row = (u64, u64, u64);

/// The map of a slotted file: its extents in `slot`, growing in place up
/// to the slot's capacity.
fn slot_map(slot: Slot, size: u64, ext: &[(u64, u64, u64)]) -> Result<DataMap> {
    let extents = ext
        .iter()
        .map(|&(logical, off, len)| Extent {
            logical,
            file: 0,
            offset: off,
            len,
        })
        .collect();
    let mut map = DataMap::new(
        extents,
        size,
        Growth::InPlace {
            limit: Some(slot.cap),
        },
    )?;
    // All of the slot is the file's, holes and the unwritten tail too: a
    // write there needs no remap (and a program lent the slot, no
    // hand-back).
    map.reserve_within(Extent {
        logical: 0,
        file: 0,
        offset: slot.off,
        len: slot.cap,
    });
    Ok(map)
}

/// The extents of `map` as rows, checked to lie in `slot` at its shift.
fn map_rows(map: &DataMap, slot: Slot) -> Option<Vec<(u64, u64, u64)>> {
    let mut out = Vec::with_capacity(map.extents().len());
    for e in map.extents() {
        let inside =
            e.file == 0 && e.offset == slot.off + e.logical && e.logical + e.len <= slot.cap;
        if !inside {
            return None;
        }
        out.push((e.logical, e.offset, e.len));
    }
    Some(out)
}

impl Pack {
    /// `files/<ino>` opened with `flags` (`O_RDONLY`, `O_WRONLY`, `O_RDWR`,
    /// maybe `O_TRUNC`/`O_CREAT`).
    pub(super) fn own_file(&self, ino: i64, flags: i32) -> Result<File> {
        let mut of = OFlags::from_bits_retain(
            flags as u32 & (libc::O_ACCMODE | libc::O_TRUNC | libc::O_CREAT) as u32,
        );
        of |= OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd: OwnedFd = rustix::fs::openat(
            &self.own_dir,
            ino.to_string(),
            of,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(File::from(mapfs::fdnum::lasting(fd)))
    }

    /// A new handle for an open of `i` (whose slot, if any, the caller has
    /// acquired).
    pub(super) fn new_handle(&self, i: &Inode, slot: Option<Slot>) -> u64 {
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(
            id,
            Handle {
                ino: i.ino,
                slot,
                mtime_seen: i.mtime,
                recorded: None,
                settled: None,
            },
        );
        id
    }

    /// The map and files of an open of `ino`, its slot acquired (waiting
    /// for a compaction moving it to end, then reading where it went).
    fn open_ino(
        &self,
        found: Inode,
        found_at: u64,
        flags: OpenFlags,
        trunc: bool,
    ) -> Result<Opened> {
        let ino = found.ino;
        self.enter(ino)?;
        let res = self.open_entered(found, found_at, flags, trunc);
        if res.is_err() {
            self.left(ino);
        }
        res
    }

    /// The open of `ino` that failed or ended was its last in this process:
    /// a file whose last name went meanwhile is deleted now (if no other
    /// process has it open).
    pub(super) fn left(&self, ino: i64) {
        if !self.leave(ino) {
            return;
        }
        if self.shared {
            self.reap(vec![Reap::Ino(ino)]);
        } else if self.orphans.lock().remove(&ino) {
            match self.write(|tx| match db::inode(tx, ino)? {
                Some(i) if i.nlink == 0 => self.destroy(tx, ino),
                _ => Ok(None),
            }) {
                Ok(gone) => self.remove_own(gone),
                Err(e) => tracing::warn!(ino, "pack: a file removed while open stays: {e}"),
            }
        }
    }

    /// [`Pack::open_ino`] once the open is counted.
    fn open_entered(
        &self,
        found: Inode,
        found_at: u64,
        flags: OpenFlags,
        trunc: bool,
    ) -> Result<Opened> {
        let ino = found.ino;
        // The inode as the path walk found it serves as the first look;
        // a retry (a compaction moved its slot meanwhile) reads it again.
        let mut seen = Some(found.clone());
        loop {
            let first = match seen.take() {
                Some(i) => i,
                None => db::get_inode(&*self.db()?, ino)?,
            };
            if let Some(s) = first.slot {
                self.packs.acquire(s)?;
            }
            let check = |tx: &rusqlite::Connection| -> Result<Option<(Inode, Vec<Row>)>> {
                let i = db::get_inode(tx, ino)?;
                if i.slot != first.slot || i.own != first.own {
                    return Ok(None);
                }
                if trunc && (i.size > 0 || i.own) {
                    tx.prepare_cached(
                        "UPDATE inodes SET size = 0, mtime = ?2, ctime = ?2 WHERE ino = ?1",
                    )
                    .map_err(db::dberr)?
                    .execute(rusqlite::params![ino, db::now_ns()])
                    .map_err(db::dberr)?;
                    db::set_extents(tx, ino, &[])?;
                    let i = db::get_inode(tx, ino)?;
                    return Ok(Some((i, Vec::new())));
                }
                let ext = db::extents(tx, ino)?;
                Ok(Some((i, ext)))
            };
            // Only a truncating open writes; the others read, and the slot
            // lock held keeps a compaction from moving what they read. If
            // the database did not change since the path walk, the walk's
            // inode is still current, and the extents may be remembered.
            // The version the inode was read at, for the release.
            let mut seen_at = None;
            let res = if trunc {
                self.write(|tx| check(tx))
            } else {
                let conn = self.db()?;
                let writes = self.version();
                seen_at = Some(writes);
                if writes == found_at && first.slot == found.slot {
                    readcache::extents(&conn, &self.reads, writes, ino)
                        .map(|ext| Some((found.clone(), ext)))
                } else {
                    check(&conn)
                }
            };
            let (i, ext) = match res {
                Ok(Some(v)) => v,
                Ok(None) => {
                    if let Some(s) = first.slot {
                        self.packs.release(s);
                    }
                    continue;
                }
                Err(e) => {
                    if let Some(s) = first.slot {
                        self.packs.release(s);
                    }
                    return Err(e);
                }
            };
            if i.own {
                let mut fl = flags.access();
                if trunc {
                    fl |= libc::O_TRUNC;
                }
                let f = self.own_file(ino, fl)?;
                let handle = self.new_handle(&i, None);
                self.settle_handle(handle, &i, seen_at);
                return Ok(Opened {
                    map: DataMap::whole_file(),
                    files: vec![Arc::new(f)],
                    handle,
                });
            }
            let opened = self.slot_open(&i, &ext)?;
            self.settle_handle(opened.handle, &i, seen_at);
            if flags.writable() && i.size > self.threshold && self.opens_of(ino) == 1 {
                // A shared instance moves it only if no other process has
                // it open either (holding its open lock for writing meanwhile).
                if !self.shared {
                    return Ok(self.own_at_open(opened));
                }
                if self.open_locks.take_alone(ino).unwrap_or(false) {
                    let o = self.own_at_open(opened);
                    self.open_locks.hold(ino)?;
                    return Ok(o);
                }
            }
            return Ok(opened);
        }
    }

    /// Notes on `handle` that the database was at version `seen_at` when
    /// its open found file `i` there (named, in the slot it acquired).
    fn settle_handle(&self, handle: u64, i: &Inode, seen_at: Option<u64>) {
        if i.nlink == 0 {
            return;
        }
        if let Some(h) = self.handles.lock().get_mut(&handle) {
            h.settled = seen_at;
        }
    }

    /// Opens of inode `ino` (this one included).
    fn opens_of(&self, ino: i64) -> u32 {
        self.opens.lock().get(&ino).copied().unwrap_or(0)
    }

    /// A writable open of a file past the threshold that has no file of
    /// its own (a truncate or an `fallocate` made it longer than its slot,
    /// the rest holes), and no other open: the file moves to a file of its
    /// own now, so the open gets a whole-file map that kernel passthrough
    /// and the shim run, instead of at its first write, when the open,
    /// already answered, would run through the daemon for its whole life
    /// (fio lays out its file with `fallocate` and then writes it: 4 KiB
    /// random writes ran at 0.06x the passthrough mount). If the move
    /// fails, the open keeps its slot and the move waits for a write.
    fn own_at_open(&self, opened: Opened) -> Opened {
        let Some(h) = self.handles.lock().get(&opened.handle).cloned() else {
            return opened;
        };
        let old = opened.files.first().cloned();
        match self.to_own(opened.handle, &h, &opened.map, old.as_deref()) {
            Ok(own) => own,
            Err(e) => {
                tracing::debug!(ino = h.ino, "pack: no file of its own at open: {e}");
                opened
            }
        }
    }

    /// An open of `i`, a file without a file of its own, whose `ext` are
    /// as read with its slot acquired (or none: no slot yet).
    fn slot_open(&self, i: &Inode, ext: &[Row]) -> Result<Opened> {
        let (map, files) = match i.slot {
            Some(s) => (slot_map(s, i.size, ext)?, vec![self.packs.file(s.pack)?]),
            // No bytes yet: every write asks for a slot.
            None => (
                DataMap::new(Vec::new(), i.size, Growth::InPlace { limit: Some(0) })?,
                Vec::new(),
            ),
        };
        let handle = self.new_handle(i, i.slot);
        if let Some(h) = self.handles.lock().get_mut(&handle) {
            h.recorded = Some(map.clone());
        }
        Ok(Opened { map, files, handle })
    }

    pub(super) fn do_open(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<Opened> {
        let (i, found_at) = self.resolve_read(ctx, path)?;
        match i.kind() {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::from_errno(libc::EISDIR)),
            _ => return Err(Error::from_errno(libc::ENXIO)),
        }
        let trunc = flags.0 & libc::O_TRUNC != 0;
        let mut mask = 0;
        if flags.readable() {
            mask |= R;
        }
        if flags.writable() || trunc {
            mask |= W;
        }
        perm::check(ctx, &i, mask)?;
        self.open_ino(i, found_at, flags, trunc && flags.writable())
    }

    pub(super) fn do_create(
        &self,
        ctx: &Ctx,
        path: &Path,
        flags: OpenFlags,
        mode: u32,
    ) -> Result<(Attr, Opened)> {
        let exists = |e: &Error| e.errno() == libc::EEXIST && flags.0 & libc::O_EXCL == 0;
        match self.create_pending(ctx, path, flags, mode) {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            // No transaction only to learn the name is taken; one removed
            // meanwhile is created below.
            Err(e) if exists(&e) => match self.open_existing(ctx, path, flags) {
                Err(e) if e.errno() == libc::ENOENT => {}
                other => return other,
            },
            Err(e) => return Err(e),
        }
        let born = self.new_files_own;
        let made_ino = std::cell::Cell::new(None);
        let made = self.write(|tx| {
            let mut i = names::make_node(
                tx,
                &self.dirs,
                ctx,
                path,
                libc::S_IFREG | (mode & 0o7777),
                0,
                None,
            )?;
            made_ino.set(Some(i.ino));
            let own = born
                .then(|| self.born_file(tx, &mut i, flags))
                .transpose()?;
            Ok((i, own))
        });
        let (i, own) = match made {
            Ok(v) => v,
            Err(e) if exists(&e) => return self.open_existing(ctx, path, flags),
            Err(e) => {
                if born {
                    self.remove_own(made_ino.get());
                }
                return Err(e);
            }
        };
        self.enter(i.ino)?;
        if let Some(f) = own {
            return self.born_open(&i, f);
        }
        // Made in the transaction that returned `i`: no slot, no bytes,
        // nothing a compaction could have moved; nothing to read again.
        let o = self.slot_open(&i, &[]).inspect_err(|_| self.left(i.ino))?;
        Ok((i.attr(), o))
    }

    /// The create of a name that exists without `O_EXCL`: an open of it.
    fn open_existing(&self, ctx: &Ctx, path: &Path, flags: OpenFlags) -> Result<(Attr, Opened)> {
        let o = self.do_open(ctx, path, flags)?;
        let ino = self.handles.lock()[&o.handle].ino;
        let attr = self.getattr_ino(ino)?;
        Ok((attr, o))
    }

    /// Attributes of inode `ino`.
    pub(super) fn getattr_ino(&self, ino: i64) -> Result<Attr> {
        let waiting = self.pending.lock().inode(ino);
        if let Some(i) = waiting {
            return self.attr_of(&i);
        }
        let i = db::get_inode(&*self.db()?, ino)?;
        self.attr_of(&i)
    }

    /// Records `map` as the bytes of the handle's file (flush and release).
    pub(super) fn persist(&self, handle: u64, map: &DataMap) -> Result<()> {
        let Some(h) = self.handles.lock().get(&handle).cloned() else {
            return Ok(());
        };
        if map.is_whole_file() || h.recorded.as_ref() == Some(map) {
            return Ok(());
        }
        let res = self.persist_new(&h, handle, map);
        if res.is_ok() {
            if let Some(h) = self.handles.lock().get_mut(&handle) {
                h.recorded = Some(map.clone());
            }
        }
        res
    }

    fn persist_new(&self, h: &Handle, handle: u64, map: &DataMap) -> Result<()> {
        let Some(slot) = h.slot else {
            // No slot was ever given: the file has no bytes, only a size.
            return self.write(|tx| {
                let Some(i) = db::inode(tx, h.ino)? else {
                    return Ok(());
                };
                if i.own || i.slot.is_some() || i.size == map.size() {
                    return Ok(());
                }
                tx.execute(
                    "UPDATE inodes SET size = ?2, mtime = ?3, ctime = ?3 WHERE ino = ?1",
                    rusqlite::params![h.ino, map.size() as i64, db::now_ns()],
                )
                .map_err(db::dberr)?;
                Ok(())
            });
        };
        // A map taken before a remap of this handle names the old slot: a
        // later flush or the release brings the new one.
        let Some(rows) = map_rows(map, slot) else {
            return Ok(());
        };
        // The version after this transaction's commit (nothing else
        // commits while it holds the connection), if it leaves the file
        // named and in the open's slot.
        let settled = std::cell::Cell::new(None);
        let mtime = self.write(|tx| {
            let Some(i) = db::inode(tx, h.ino)? else {
                return Ok(None);
            };
            if i.nlink > 0 {
                settled.set(Some(self.version().wrapping_add(1)));
            }
            if i.own {
                settled.set(None);
                tracing::warn!(
                    ino = h.ino,
                    "pack: a write through an open older than the file's move to a file \
                     of its own is dropped"
                );
                return Ok(None);
            }
            if i.slot == Some(slot) && i.size == map.size() && db::extents(tx, h.ino)? == rows {
                // Already recorded (a release after the flush of close).
                return Ok(None);
            }
            if i.slot.is_none() && rows.is_empty() && map.size() == 0 && i.size == 0 {
                // A slot handed out before any write (a writer lent to a
                // shim client gets its space at open) and never written: the
                // file keeps no slot, and the release frees it.
                settled.set(None);
                return Ok(None);
            }
            if i.slot != Some(slot) {
                self.set_owner_or_zombie(tx, slot, h.ino, true)?;
                if let Some(old) = i.slot {
                    self.set_owner_or_zombie(tx, old, h.ino, false)?;
                }
                db::set_inode_slot(tx, h.ino, Some(slot))?;
            }
            db::set_extents(tx, h.ino, &rows)?;
            // Times set explicitly since this open last looked (`futimens`
            // before close, as tar and cp -p do) are kept.
            let now = db::now_ns();
            let mtime = if i.mtime == h.mtime_seen {
                now
            } else {
                i.mtime
            };
            tx.prepare_cached("UPDATE inodes SET size = ?2, mtime = ?3, ctime = ?4 WHERE ino = ?1")
                .map_err(db::dberr)?
                .execute(rusqlite::params![h.ino, map.size() as i64, mtime, now])
                .map_err(db::dberr)?;
            Ok(Some(mtime))
        })?;
        if let Some(h) = self.handles.lock().get_mut(&handle) {
            if let Some(m) = mtime {
                h.mtime_seen = m;
            }
            h.settled = settled.get();
        }
        Ok(())
    }

    pub(super) fn do_release(&self, handle: u64, map: &DataMap) -> Result<()> {
        let res = self.persist(handle, map);
        let Some(h) = self.handles.lock().remove(&handle) else {
            return res;
        };
        if self.shared {
            // Nothing committed since this open's last transaction saw the
            // file named and in its slot: neither is there to free, and
            // asking the database twice would say so.
            let unchanged =
                h.settled.is_some() && self.lock_db().ok().map(|_conn| self.version()) == h.settled;
            if let Some(s) = h.slot.filter(|s| self.packs.release(*s)) {
                if !unchanged {
                    self.reap(vec![Reap::Slot(s)]);
                }
            }
            if unchanged {
                self.leave(h.ino);
            } else {
                self.left(h.ino);
            }
            return res;
        }
        let born = self.last_born_open(h.ino);
        let last = self.leave(h.ino);
        if born && self.queue_born(h.ino) {
            self.pack_queued();
        }
        let freed = h
            .slot
            .filter(|s| self.packs.release(*s) && self.zombies.lock().remove(s));
        let orphan = last && self.orphans.lock().remove(&h.ino);
        // Most releases change nothing and touch no database.
        if freed.is_none() && !orphan {
            return res;
        }
        let gone = self.write(|tx| {
            if let Some(s) = freed {
                if db::slot_owner(tx, s)?.flatten().is_some_and(|o| o < 0) {
                    db::set_slot_owner(tx, s, None)?;
                }
            }
            if orphan {
                if let Some(i) = db::inode(tx, h.ino)? {
                    if i.nlink == 0 {
                        return self.destroy(tx, h.ino);
                    }
                }
            }
            Ok(None)
        })?;
        self.remove_own(gone);
        res
    }

    pub(super) fn do_remap(
        &self,
        handle: u64,
        map: &DataMap,
        offset: u64,
        len: u64,
    ) -> Result<Opened> {
        let Some(h) = self.handles.lock().get(&handle).cloned() else {
            return Err(Error::from_errno(libc::EBADF));
        };
        let need = map.size().max(offset.saturating_add(len));
        let old_file = match h.slot {
            Some(s) => Some(self.packs.file(s.pack)?),
            None => None,
        };
        if need > self.threshold {
            return self.to_own(handle, &h, map, old_file.as_deref());
        }
        let cap = slots::class(need);
        let new = self.take_slot(cap)?;
        self.packs.acquire(new)?;
        let file = self.packs.file(new.pack)?;
        let copied = copy_into(map, old_file.as_deref(), false, |buf, at| {
            Ok(file.write_all_at(buf, new.off + at)?)
        });
        if let Err(e) = copied {
            self.packs.release(new);
            self.zombies.lock().remove(&new);
            let _ = self.write(|tx| db::set_slot_owner(tx, new, None));
            return Err(e);
        }
        self.drop_handle_slot(&h)?;
        if let Some(hh) = self.handles.lock().get_mut(&handle) {
            hh.slot = Some(new);
            hh.settled = None;
        }
        let m = DataMap::new(
            vec![Extent {
                logical: 0,
                file: 0,
                offset: new.off,
                len: new.cap,
            }],
            map.size(),
            Growth::InPlace {
                limit: Some(new.cap),
            },
        )?;
        Ok(Opened {
            map: m,
            files: vec![file],
            handle,
        })
    }

    /// The handle leaves its slot: the slot is freed if it was only held by
    /// opens and none is left.
    fn drop_handle_slot(&self, h: &Handle) -> Result<()> {
        let Some(old) = h.slot else {
            return Ok(());
        };
        if self.shared {
            if self.packs.release(old) {
                self.reap(vec![Reap::Slot(old)]);
            }
            return Ok(());
        }
        if self.packs.release(old) && self.zombies.lock().remove(&old) {
            self.write(|tx| {
                if db::slot_owner(tx, old)?.flatten().is_some_and(|o| o < 0) {
                    db::set_slot_owner(tx, old, None)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Moves the file to a file of its own (a whole-file map from then on).
    fn to_own(&self, handle: u64, h: &Handle, map: &DataMap, old: Option<&File>) -> Result<Opened> {
        let f = self.own_file(h.ino, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)?;
        copy_into(map, old, true, |buf, at| Ok(f.write_all_at(buf, at)?))?;
        f.set_len(map.size())?;
        let mtime = self.write(|tx| {
            let i = db::get_inode(tx, h.ino)?;
            if let Some(s) = i.slot {
                self.set_owner_or_zombie(tx, s, h.ino, false)?;
            }
            db::set_inode_slot(tx, h.ino, None)?;
            db::set_extents(tx, h.ino, &[])?;
            tx.execute(
                "UPDATE inodes SET own = 1, size = 0 WHERE ino = ?1",
                [h.ino],
            )
            .map_err(db::dberr)?;
            Ok(i.mtime)
        })?;
        if mtime != h.mtime_seen {
            // Times set explicitly while open stay.
            let _ = f.set_times(std::fs::FileTimes::new().set_modified(db::from_ns(mtime)));
        }
        self.drop_handle_slot(h)?;
        if let Some(hh) = self.handles.lock().get_mut(&handle) {
            hh.slot = None;
            hh.settled = None;
        }
        Ok(Opened {
            map: DataMap::whole_file(),
            files: vec![Arc::new(f)],
            handle,
        })
    }
}

/// Copies the bytes of `map` from pack file `old` to `put(bytes, logical
/// offset)` in pieces of at most 1 MiB; holes become zeros, or are skipped
/// with `skip_holes` (a new sparse file reads them as zeros already).
fn copy_into(
    map: &DataMap,
    old: Option<&File>,
    skip_holes: bool,
    mut put: impl FnMut(&[u8], u64) -> Result<()>,
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut at = 0u64;
    let mut buf = Vec::new();
    for seg in map.locate(0, map.size()) {
        let (data_at, len) = match seg {
            Segment::Data { offset, len, .. } => (Some(offset), len),
            Segment::Hole { len } => (None, len),
        };
        if data_at.is_none() && skip_holes {
            at += len;
            continue;
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK) as usize;
            buf.clear();
            buf.resize(n, 0);
            if let Some(offset) = data_at {
                let f = old.ok_or_else(|| Error::io().context("map names a pack file not open"))?;
                let mut got = 0;
                while got < n {
                    match f.read_at(&mut buf[got..], offset + done + got as u64)? {
                        0 => break,
                        k => got += k,
                    }
                }
            }
            put(&buf, at + done)?;
            done += n as u64;
        }
        at += len;
    }
    Ok(())
}
