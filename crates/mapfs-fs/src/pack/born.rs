//! Files made through a daemon start in a file of their own and move into
//! a slot at their last release.
//!
//! A file written through the mount in a slot costs the writer two round
//! trips to the daemon that a file of its own does not: the `WRITE` (the
//! kernel cannot run a piece of a pack file by passthrough) and the
//! `FLUSH` at `close`, where the slot's map is persisted. A file created
//! by a daemon therefore gets `files/<ino>` first, a whole-file map the
//! kernel (or the shim) writes natively; when its last open is released,
//! asynchronously to the writer, the daemon copies its bytes into a slot
//! and removes the file, if it still fits the threshold. Until then (and
//! forever, if the daemon dies first: a file of its own is a state like
//! any other) it is a file of its own.
//!
//! Only a daemon whose whole-file maps run natively does this
//! ([`super::PackOptions::new_files_own`]): with `--data daemon` a slot costs
//! no more, the processes of an embedded job pay no round trip for a slot,
//! and with `sync=full` the copy would have to be synced before its commit.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use mapfs::{Attr, DataMap, OpenFlags, Opened, Result};
use rustix::fs::AtFlags;

use super::db::{self, DbResult};
use super::slots;
use super::Pack;

/// Born files queued at their last release that make a move: the release
/// that queues the last of them moves them all, in one transaction.
pub const PACK_BATCH: usize = 64;

/// A born file's bytes, copied into a slot no file owns yet.
struct BornCopy {
    ino: i64,
    /// Its file of its own, open.
    f: File,
    /// Its state when copied.
    st: rustix::fs::Stat,
    /// The slot (none for an empty file).
    slot: Option<db::Slot>,
}

impl Pack {
    /// Gives `i`, made in transaction `tx`, its file of its own, opened
    /// with `flags`' access mode, and records it. Before the commit that
    /// says the file exists: a crash in between leaves a stray file a
    /// fresh mount removes, never an inode without its bytes.
    pub(super) fn born_file(
        &self,
        tx: &rusqlite::Connection,
        i: &mut db::Inode,
        flags: OpenFlags,
    ) -> Result<File> {
        let f = self.own_file(i.ino, flags.access() | libc::O_CREAT | libc::O_TRUNC)?;
        tx.prepare_cached("UPDATE inodes SET own = 1 WHERE ino = ?1")
            .db()?
            .execute([i.ino])
            .db()?;
        i.own = true;
        Ok(f)
    }

    /// The open of born file `i` (counted by the caller) on `f`, its file
    /// of its own.
    pub(super) fn born_open(&self, i: &db::Inode, f: File) -> Result<(Attr, Opened)> {
        self.born.lock().insert(i.ino);
        let st = rustix::fs::fstat(&f).inspect_err(|_| self.left(i.ino))?;
        let attr = super::names::own_attr(i, &st);
        let handle = self.new_handle(i, None);
        Ok((
            attr,
            Opened {
                map: DataMap::whole_file(),
                files: vec![Arc::new(f)],
                handle,
            },
        ))
    }

    /// At the release of an open of `ino` (still counted): true when the
    /// file was born in a file of its own and this is its last open, to
    /// [`Pack::queue_born`] once the open no longer counts.
    pub(super) fn last_born_open(&self, ino: i64) -> bool {
        // Another open's release will.
        self.born.lock().contains(&ino) && self.opens.lock().get(&ino).copied() == Some(1)
    }

    /// Queues born file `ino`, whose last open was released, to move into
    /// a slot, and rings the housekeeping bell (a full batch: at once).
    /// Only once the open no longer counts: a move that found it still
    /// open would drop it from the queue. True when the queue holds a
    /// batch and there is no bell: the caller moves it
    /// ([`Pack::pack_queued`]).
    pub(super) fn queue_born(&self, ino: i64) -> bool {
        let queued = {
            let mut q = self.to_pack.lock();
            q.push(ino);
            q.len()
        };
        match self.bell.get() {
            // The releases of a batch go on while another thread moves it.
            Some(bell) if queued >= PACK_BATCH => bell.now(),
            Some(bell) => bell.soon(),
            None => return queued >= PACK_BATCH,
        }
        false
    }

    /// Moves the queued born files nobody has open into slots, in one
    /// transaction: the bytes are copied before it, into slots no file
    /// owns yet, so the database's lock is held for the records only (every
    /// request of the mount waits for it). Opens of those files wait
    /// meanwhile ([`Pack::enter`]); a file opened again since its release
    /// leaves the queue and comes back at its next last release.
    pub(super) fn pack_queued(&self) {
        let queued = std::mem::take(&mut *self.to_pack.lock());
        if queued.is_empty() {
            return;
        }
        let claimed: Vec<i64> = {
            let opens = self.opens.lock();
            let born = self.born.lock();
            let mut packing = self.packing.lock();
            queued
                .into_iter()
                .filter(|ino| !opens.contains_key(ino) && born.contains(ino))
                .filter(|ino| packing.insert(*ino))
                .collect()
        };
        let res = self.pack_born(&claimed);
        {
            let _opens = self.opens.lock();
            let mut packing = self.packing.lock();
            for ino in &claimed {
                packing.remove(ino);
            }
            self.packed.notify_all();
        }
        let mut born = self.born.lock();
        for ino in &claimed {
            born.remove(ino);
        }
        if let Err(e) = res {
            tracing::debug!("pack: new files stay in files of their own: {e}");
        }
    }

    /// Copies the bytes of born files `inos` that fit the threshold into
    /// slots, records them in one transaction, and removes their files of
    /// their own. A file that changed meanwhile (a truncate or `utimens` by
    /// path, which need no open) stays where it is.
    fn pack_born(&self, inos: &[i64]) -> Result<()> {
        let mut copies = Vec::new();
        for &ino in inos {
            match self.copy_born(ino) {
                Ok(Some(c)) => copies.push(c),
                Ok(None) => {}
                Err(e) => tracing::debug!(ino, "pack: a new file stays in a file of its own: {e}"),
            }
        }
        if copies.is_empty() {
            return Ok(());
        }
        let moved = self.write(|tx| {
            let mut moved = Vec::new();
            for c in &copies {
                if self.record_born(tx, c)? {
                    moved.push(c.ino);
                }
            }
            Ok(moved)
        });
        let moved = match moved {
            Ok(m) => m,
            Err(e) => {
                self.unreserve(copies.iter().filter_map(|c| c.slot));
                return Err(e);
            }
        };
        self.unreserve(
            copies
                .iter()
                .filter(|c| !moved.contains(&c.ino))
                .filter_map(|c| c.slot),
        );
        for ino in moved {
            self.remove_own(Some(ino));
        }
        Ok(())
    }

    /// Gives slots taken for moves that did not happen back to the reserve.
    fn unreserve(&self, slots: impl Iterator<Item = db::Slot>) {
        for s in slots {
            self.zombies.lock().remove(&s);
            self.reserve.lock().entry(s.cap).or_default().push(s);
        }
    }

    /// The bytes of born file `ino` copied into a new slot (none for an
    /// empty file); `None` when it is larger than the threshold.
    fn copy_born(&self, ino: i64) -> Result<Option<BornCopy>> {
        let f = self.own_file(ino, libc::O_RDONLY)?;
        let st = rustix::fs::fstat(&f)?;
        let size = st.st_size as u64;
        if size > self.threshold {
            return Ok(None);
        }
        let slot = match size {
            0 => None,
            n => {
                // Taken outside any transaction: taking one may commit a batch.
                let s = self.take_slot(slots::class(n))?;
                let mut buf = vec![0u8; size as usize];
                let copied = f.read_exact_at(&mut buf, 0).and_then(|()| {
                    self.packs
                        .file(s.pack)
                        .map_err(std::io::Error::other)?
                        .write_all_at(&buf, s.off)
                });
                if let Err(e) = copied {
                    self.unreserve(std::iter::once(s));
                    return Err(e.into());
                }
                Some(s)
            }
        };
        Ok(Some(BornCopy { ino, f, st, slot }))
    }

    /// Records the move of `c` in `tx`, if the file is still as copied.
    fn record_born(&self, tx: &rusqlite::Connection, c: &BornCopy) -> Result<bool> {
        let Some(i) = db::inode(tx, c.ino)? else {
            return Ok(false);
        };
        // A truncate or `utimens` by path changes the file under this lock only.
        let now = rustix::fs::fstat(&c.f)?;
        let same = now.st_size == c.st.st_size
            && (now.st_mtime, now.st_mtime_nsec) == (c.st.st_mtime, c.st.st_mtime_nsec)
            && (now.st_ctime, now.st_ctime_nsec) == (c.st.st_ctime, c.st.st_ctime_nsec);
        if !i.own || i.nlink == 0 || !same {
            return Ok(false);
        }
        let size = c.st.st_size as u64;
        let mut rows = Vec::new();
        if let Some(s) = c.slot {
            self.set_owner_or_zombie(tx, s, c.ino, true)?;
            rows.push((0, s.off, size));
        }
        db::set_inode_slot(tx, c.ino, c.slot)?;
        db::set_extents(tx, c.ino, &rows)?;
        let st = &c.st;
        let ctime = db::stat_ns(st.st_ctime, st.st_ctime_nsec as i64).max(i.ctime);
        tx.prepare_cached(
            "UPDATE inodes SET own = 0, size = ?2, atime = ?3, mtime = ?4, ctime = ?5 \
             WHERE ino = ?1",
        )
        .db()?
        .execute(rusqlite::params![
            c.ino,
            size as i64,
            db::stat_ns(st.st_atime, st.st_atime_nsec as i64),
            db::stat_ns(st.st_mtime, st.st_mtime_nsec as i64),
            ctime
        ])
        .db()?;
        Ok(true)
    }

    /// Removes what a crash left in `files/`: a file no inode owns (from a
    /// create whose transaction never committed, a move into a slot that
    /// committed but did not remove it, or a move to a file of its own
    /// that never committed), but those in `kept` (creates answered before
    /// a crash that [`Pack::recover_pending`] could not enter). Only an
    /// instance alone with the store does (a fresh mount). Returns how many
    /// went.
    pub(super) fn remove_strays(&self, kept: &HashSet<i64>) -> Result<usize> {
        let own: HashSet<i64> = {
            let conn = self.conn.lock();
            let mut st = conn.prepare("SELECT ino FROM inodes WHERE own = 1").db()?;
            let v = st
                .query_map([], |r| r.get(0))
                .db()?
                .collect::<rusqlite::Result<HashSet<i64>>>()
                .db()?;
            v
        };
        let mut gone = 0;
        for e in std::fs::read_dir(self.backing.join(super::OWN_DIR))? {
            let name = e?.file_name();
            let Some(ino) = name.to_str().and_then(|n| n.parse::<i64>().ok()) else {
                continue;
            };
            if !own.contains(&ino) && !kept.contains(&ino) {
                rustix::fs::unlinkat(&self.own_dir, &name, AtFlags::empty())?;
                gone += 1;
            }
        }
        if gone > 0 {
            tracing::info!("pack: removed {gone} file(s) a crash left in files/");
        }
        Ok(gone)
    }
}
