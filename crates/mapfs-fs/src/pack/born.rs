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
        let attr = self.attr_of(i).inspect_err(|_| self.left(i.ino))?;
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

    /// At the release of an open of `ino` (still counted): if the file was
    /// born in a file of its own and this is its last open, moves its bytes
    /// into a slot. Opens of `ino` wait meanwhile ([`Pack::enter`]).
    pub(super) fn pack_born_if_last(&self, ino: i64) {
        if !self.born.lock().contains(&ino) {
            return;
        }
        {
            let opens = self.opens.lock();
            if opens.get(&ino).copied() != Some(1) {
                // Another open's release will.
                return;
            }
            self.packing.lock().insert(ino);
        }
        let res = self.pack_born(ino);
        {
            let _opens = self.opens.lock();
            self.packing.lock().remove(&ino);
            self.packed.notify_all();
        }
        self.born.lock().remove(&ino);
        if let Err(e) = res {
            tracing::debug!(ino, "pack: a new file stays in a file of its own: {e}");
        }
    }

    /// Copies the bytes of born file `ino`, if they fit the threshold, into
    /// a slot, records it, and removes its file of its own.
    fn pack_born(&self, ino: i64) -> Result<()> {
        let name = ino.to_string();
        let st = rustix::fs::statat(&self.own_dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        let size = st.st_size as u64;
        if size > self.threshold {
            return Ok(());
        }
        // Taken before the transaction: taking one may commit a batch.
        let slot = match size {
            0 => None,
            n => Some(self.take_slot(slots::class(n))?),
        };
        let f = self.own_file(ino, libc::O_RDONLY)?;
        let moved = self.write(|tx| {
            let Some(i) = db::inode(tx, ino)? else {
                return Ok(false);
            };
            // A truncate by path changes the file under this lock only.
            let st = rustix::fs::fstat(&f)?;
            if !i.own || i.nlink == 0 || st.st_size as u64 != size {
                return Ok(false);
            }
            let mut rows = Vec::new();
            if let Some(s) = slot {
                let mut buf = vec![0u8; size as usize];
                f.read_exact_at(&mut buf, 0)?;
                self.packs.file(s.pack)?.write_all_at(&buf, s.off)?;
                self.set_owner_or_zombie(tx, s, ino, true)?;
                rows.push((0, s.off, size));
            }
            db::set_inode_slot(tx, ino, slot)?;
            db::set_extents(tx, ino, &rows)?;
            let ctime = db::stat_ns(st.st_ctime, st.st_ctime_nsec as i64).max(i.ctime);
            tx.prepare_cached(
                "UPDATE inodes SET own = 0, size = ?2, atime = ?3, mtime = ?4, ctime = ?5 \
                 WHERE ino = ?1",
            )
            .db()?
            .execute(rusqlite::params![
                ino,
                size as i64,
                db::stat_ns(st.st_atime, st.st_atime_nsec as i64),
                db::stat_ns(st.st_mtime, st.st_mtime_nsec as i64),
                ctime
            ])
            .db()?;
            Ok(true)
        });
        match moved {
            Ok(true) => {
                self.remove_own(Some(ino));
                Ok(())
            }
            other => {
                if let Some(s) = slot {
                    self.zombies.lock().remove(&s);
                    self.reserve.lock().entry(s.cap).or_default().push(s);
                }
                other.map(|_| ())
            }
        }
    }

    /// Removes what a crash left in `files/`: a file no inode owns (from a
    /// create whose transaction never committed, a move into a slot that
    /// committed but did not remove it, or a move to a file of its own
    /// that never committed). Only an instance alone with the store does
    /// (a fresh mount). Returns how many went.
    pub(super) fn remove_strays(&self) -> Result<usize> {
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
            if !own.contains(&ino) {
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
