//! Tools on a pack store: the integrity check, stats, and compaction.
//!
//! While a daemon serves the store it holds the database's lock for its
//! life (SQLite's exclusive locking mode: no shared-memory locks taken and
//! let go at every statement), so the tools run inside it, asked through
//! its control socket ([`mapfs::FileSystem::tool`], names [`TOOL_STATS`],
//! [`TOOL_CHECK`], [`TOOL_COMPACT`], outputs encoded with
//! [`mapfs::control::encode`]); the functions here without `_on` run them
//! on a store nothing serves, holding its instance lock meanwhile.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use mapfs::{Error, Result};
use parking_lot::Mutex;
use rusqlite::{params, Connection};

use super::db::{self, DbResult, Slot};
use super::slots::{self, LockKind, PACK_DIR};

/// Name of the stats tool (output: [`PackStats`]).
pub const TOOL_STATS: &str = "stats";
/// Name of the check tool (output: [`CheckReport`]).
pub const TOOL_CHECK: &str = "check";
/// Name of the compaction tool (output: [`CompactReport`]).
pub const TOOL_COMPACT: &str = "compact";

/// Problems a check lists one by one; past them it counts.
const MAX_PROBLEMS: usize = 1000;

/// Takes the instance lock of the store in `backing` for a tool run
/// outside any daemon, and opens its database.
fn offline(backing: &Path) -> Result<(crate::sole::Sole, Connection)> {
    if !backing.join(db::DB_NAME).is_file() {
        return Err(Error::not_found().context(format!(
            "{} has no pack store ({})",
            backing.display(),
            db::DB_NAME
        )));
    }
    let sole = super::take_instance_lock(backing)?;
    Ok((sole, db::open(backing, false, false)?))
}

/// What [`check`] found.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckReport {
    /// Inodes checked.
    pub inodes: u64,
    /// Extents checked.
    pub extents: u64,
    /// Slots checked.
    pub slots: u64,
    /// Every problem found, one line each (empty: consistent); past the
    /// first thousand, one last line counts the rest.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// True when no problem was found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Pack file `id` of store `backing`, opened for reading and writing.
fn open_pack(backing: &Path, id: i64) -> Result<File> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(backing.join(PACK_DIR).join(slots::pack_name(id)))?)
}

fn all_slots(conn: &Connection) -> Result<Vec<(Slot, Option<i64>)>> {
    let mut st = conn
        .prepare("SELECT pack, off, cap, ino FROM slots ORDER BY pack, off")
        .db()?;
    let v = st
        .query_map([], |r| {
            Ok((
                Slot {
                    pack: r.get(0)?,
                    off: r.get::<_, i64>(1)? as u64,
                    cap: r.get::<_, i64>(2)? as u64,
                },
                r.get(3)?,
            ))
        })
        .db()?
        .collect::<rusqlite::Result<Vec<_>>>()
        .db()?;
    Ok(v)
}

/// Checks the store in `backing`: SQLite's `PRAGMA integrity_check`, then
/// that every extent lies inside its file's slot at the slot's shift and
/// inside the pack file, that no two slots overlap, that every file's slot
/// is owned by it, every entry names an inode, and every link count
/// matches the entries.
pub fn check(backing: &Path) -> Result<CheckReport> {
    let (_sole, conn) = offline(backing)?;
    check_on(&conn, backing)
}

/// [`check`] through `conn`, the database of the store in `backing`.
pub(super) fn check_on(conn: &Connection, backing: &Path) -> Result<CheckReport> {
    let mut rep = check_all(conn, backing)?;
    if rep.problems.len() > MAX_PROBLEMS {
        let more = rep.problems.len() - MAX_PROBLEMS;
        rep.problems.truncate(MAX_PROBLEMS);
        rep.problems.push(format!("... and {more} more problems"));
    }
    Ok(rep)
}

fn check_all(conn: &Connection, backing: &Path) -> Result<CheckReport> {
    let mut rep = CheckReport::default();
    let ic: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .db()?;
    if ic != "ok" {
        rep.problems.push(format!("integrity_check: {ic}"));
    }
    let slots = all_slots(conn)?;
    rep.slots = slots.len() as u64;
    let mut pack_len = HashMap::new();
    for w in slots.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        if a.pack == b.pack && a.off + a.cap > b.off {
            rep.problems.push(format!("slots overlap: {a:?} and {b:?}"));
        }
    }
    let ends: HashMap<i64, i64> = {
        let mut st = conn.prepare("SELECT id, end FROM packs").db()?;
        let v = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .db()?
            .collect::<rusqlite::Result<_>>()
            .db()?;
        v
    };
    for (s, _) in &slots {
        match ends.get(&s.pack) {
            Some(&end) if s.off + s.cap <= end as u64 => {}
            _ => rep
                .problems
                .push(format!("slot {s:?} lies past its pack's end")),
        }
        pack_len.entry(s.pack).or_insert_with(|| {
            std::fs::metadata(backing.join(PACK_DIR).join(slots::pack_name(s.pack)))
                .map(|m| m.len())
                .unwrap_or(0)
        });
    }
    let owner: HashMap<(i64, u64), Option<i64>> =
        slots.iter().map(|(s, o)| ((s.pack, s.off), *o)).collect();
    let mut st = conn
        .prepare("SELECT ino, mode, nlink, size, own, pack, off, cap FROM inodes")
        .db()?;
    let inodes = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, u32>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Option<i64>>(5)?,
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
            ))
        })
        .db()?
        .collect::<rusqlite::Result<Vec<_>>>()
        .db()?;
    rep.inodes = inodes.len() as u64;
    let mut links: HashMap<i64, i64> = HashMap::new();
    let mut subdirs: HashMap<i64, i64> = HashMap::new();
    {
        let mut st = conn
            .prepare("SELECT d.parent, d.ino, i.mode FROM dentries d LEFT JOIN inodes i ON i.ino = d.ino")
            .db()?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<u32>>(2)?,
                ))
            })
            .db()?
            .collect::<rusqlite::Result<Vec<_>>>()
            .db()?;
        for (parent, ino, mode) in rows {
            match mode {
                None => rep
                    .problems
                    .push(format!("entry in {parent} names missing inode {ino}")),
                Some(m) => {
                    *links.entry(ino).or_default() += 1;
                    if m & libc::S_IFMT == libc::S_IFDIR {
                        *subdirs.entry(parent).or_default() += 1;
                    }
                }
            }
        }
    }
    for (ino, mode, nlink, size, own, pack, off, cap) in inodes {
        let dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let want = if dir {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            links.get(&ino).copied().unwrap_or(0)
        };
        if nlink != want && !(ino == db::ROOT && dir) {
            rep.problems
                .push(format!("inode {ino}: nlink {nlink}, entries say {want}"));
        }
        let ext = db::extents(conn, ino)?;
        rep.extents += ext.len() as u64;
        let slot = match (pack, off, cap) {
            (Some(pack), Some(off), Some(cap)) => Some(Slot {
                pack,
                off: off as u64,
                cap: cap as u64,
            }),
            _ => None,
        };
        if own != 0 && slot.is_some() {
            rep.problems
                .push(format!("inode {ino}: both a file of its own and a slot"));
        }
        if let Some(s) = slot {
            if owner.get(&(s.pack, s.off)) != Some(&Some(ino)) {
                rep.problems
                    .push(format!("inode {ino}: its slot {s:?} is not owned by it"));
            }
        } else if !ext.is_empty() {
            rep.problems
                .push(format!("inode {ino}: extents but no slot"));
        }
        let mut prev_end = 0;
        for (l, o, n) in ext {
            let Some(s) = slot else { break };
            let ok = n > 0
                && l >= prev_end
                && o == s.off + l
                && l + n <= s.cap
                && l + n <= size as u64
                && o + n <= pack_len.get(&s.pack).copied().unwrap_or(0);
            if !ok {
                rep.problems.push(format!(
                    "inode {ino}: extent logical {l} off {o} len {n} outside slot {s:?}, \
                     size {size} or pack file"
                ));
            }
            prev_end = l + n;
        }
    }
    Ok(rep)
}

/// Space use of a pack store.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct PackStats {
    /// Regular files with a name (files removed while open are not
    /// counted).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Other nodes (symlinks, special files).
    pub others: u64,
    /// Files with a backing file of their own.
    pub own_files: u64,
    /// Logical bytes of slotted files.
    pub slotted_bytes: u64,
    /// Capacity of the slots of slotted files.
    pub slot_bytes: u64,
    /// Capacity not holding bytes: `slot_bytes - slotted_bytes`.
    pub slack_bytes: u64,
    /// Slots cut from pack files, used or free.
    pub slots: u64,
    /// Free slots.
    pub free_slots: u64,
    /// Capacity of the free slots.
    pub free_bytes: u64,
    /// Pack files.
    pub pack_files: u64,
    /// Sum of the pack files' lengths.
    pub pack_bytes: u64,
    /// Blocks the pack files occupy, in bytes.
    pub pack_disk_bytes: u64,
    /// Files a daemon created and died before committing, which the next
    /// mount (or a failover's successor) enters; not in the counts above.
    #[serde(default)]
    pub awaiting_entry: u64,
}

/// Counts files, bytes, slack and pack files of the store in `backing`.
pub fn stats(backing: &Path) -> Result<PackStats> {
    let (_sole, conn) = offline(backing)?;
    stats_on(&conn, backing)
}

/// [`stats`] through `conn`, the database of the store in `backing`.
pub(super) fn stats_on(conn: &Connection, backing: &Path) -> Result<PackStats> {
    let mut s = PackStats::default();
    let q = |sql: &str| -> Result<i64> { conn.query_row(sql, [], |r| r.get(0)).db() };
    s.files = q(&format!(
        "SELECT count(*) FROM inodes WHERE mode & {} = {} AND nlink > 0",
        libc::S_IFMT,
        libc::S_IFREG
    ))? as u64;
    s.dirs = q(&format!(
        "SELECT count(*) FROM inodes WHERE mode & {} = {}",
        libc::S_IFMT,
        libc::S_IFDIR
    ))? as u64;
    s.others = q("SELECT count(*) FROM inodes WHERE nlink > 0")? as u64 - s.files - s.dirs;
    s.own_files = q("SELECT count(*) FROM inodes WHERE own = 1")? as u64;
    s.slotted_bytes = q("SELECT coalesce(sum(size), 0) FROM inodes WHERE pack IS NOT NULL")? as u64;
    s.slot_bytes = q("SELECT coalesce(sum(cap), 0) FROM inodes WHERE pack IS NOT NULL")? as u64;
    s.slack_bytes = s.slot_bytes.saturating_sub(s.slotted_bytes);
    s.slots = q("SELECT count(*) FROM slots")? as u64;
    s.free_slots = q("SELECT count(*) FROM slots WHERE ino IS NULL")? as u64;
    s.free_bytes = q("SELECT coalesce(sum(cap), 0) FROM slots WHERE ino IS NULL")? as u64;
    if let Ok(rd) = std::fs::read_dir(backing.join(PACK_DIR)) {
        use std::os::unix::fs::MetadataExt;
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                s.pack_files += 1;
                s.pack_bytes += m.len();
                s.pack_disk_bytes += m.blocks() * 512;
            }
        }
    }
    s.awaiting_entry = super::pending::awaiting_entry(conn, backing)?;
    Ok(s)
}

/// What [`compact`] did.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct CompactReport {
    /// Slots moved toward the front.
    pub moved: u64,
    /// Slots skipped because their file was open.
    pub busy: u64,
    /// Bytes cut off the ends of pack files.
    pub truncated_bytes: u64,
    /// Bytes of free slots punched out.
    pub punched_bytes: u64,
}

/// Compacts the store in `backing`, which nothing serves: see
/// `compact_on`.
pub fn compact(backing: &Path) -> Result<CompactReport> {
    let (_sole, conn) = offline(backing)?;
    compact_on(&Mutex::new(conn), backing)
}

/// Compacts the store in `backing` through `conn`, its database, shared
/// with the daemon serving it (if any): every live slot with a free slot
/// of its class before it moves there, then pack files are cut after their
/// last slot and the free slots' blocks are punched out. No file's bytes
/// change.
///
/// A move takes the slot's range write-locked, so an open file is never
/// moved (it is counted as busy) and an open waits for a move to end. The
/// database is held only to choose a move (the target is marked as used by
/// opens of the file, which a fresh mount frees again) and to record it:
/// the copy and its sync run without it, so requests go on meanwhile, and a
/// file changed or removed during its copy is left where it is.
pub fn compact_on(conn: &Mutex<Connection>, backing: &Path) -> Result<CompactReport> {
    let mut rep = CompactReport::default();
    let mut files: HashMap<i64, File> = HashMap::new();
    let pack = |id: i64, files: &mut HashMap<i64, File>| -> Result<()> {
        if let std::collections::hash_map::Entry::Vacant(v) = files.entry(id) {
            v.insert(open_pack(backing, id)?);
        }
        Ok(())
    };
    // Live slots from the back.
    let mut live: Vec<(Slot, i64)> = all_slots(&conn.lock())?
        .into_iter()
        .filter_map(|(s, o)| o.filter(|o| *o > 0).map(|o| (s, o)))
        .collect();
    live.reverse();
    for (s, ino) in live {
        // Choose the target and mark it as the file's opens' own.
        let chosen = db::write(conn, |tx| {
            if db::inode(tx, ino)?.and_then(|i| i.slot) != Some(s) {
                return Ok(None);
            }
            let target: Option<(i64, i64)> = tx
                .query_row(
                    "SELECT pack, off FROM slots WHERE ino IS NULL AND cap = ?1 \
                     AND (pack < ?2 OR (pack = ?2 AND off < ?3)) ORDER BY pack, off LIMIT 1",
                    params![s.cap as i64, s.pack, s.off as i64],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .ok();
            let Some((tp, to)) = target else {
                return Ok(None);
            };
            let t = Slot {
                pack: tp,
                off: to as u64,
                cap: s.cap,
            };
            db::set_slot_owner(tx, t, Some(-ino))?;
            Ok(Some((t, db::extents(tx, ino)?)))
        })?;
        let Some((t, ext)) = chosen else { continue };
        let unmark = || db::write(conn, |tx| db::set_slot_owner(tx, t, None));
        pack(s.pack, &mut files)?;
        pack(t.pack, &mut files)?;
        let src = &files[&s.pack];
        if slots::range_lock(src, s, LockKind::TryWrite).is_err() {
            unmark()?;
            rep.busy += 1;
            continue;
        }
        let res = (|| -> Result<bool> {
            let mut buf = Vec::new();
            for &(l, o, n) in &ext {
                buf.resize(n as usize, 0);
                src.read_exact_at(&mut buf, o)?;
                files[&t.pack].write_all_at(&buf, t.off + l)?;
            }
            files[&t.pack].sync_data()?;
            db::write(conn, |tx| {
                // Removed, truncated or moved meanwhile (without an open: a
                // `truncate` by name, an `unlink`): left where it is.
                let same = db::inode(tx, ino)?.and_then(|i| i.slot) == Some(s)
                    && db::extents(tx, ino)? == ext;
                if !same {
                    db::set_slot_owner(tx, t, None)?;
                    return Ok(false);
                }
                let moved: Vec<_> = ext.iter().map(|&(l, _, n)| (l, t.off + l, n)).collect();
                db::set_extents(tx, ino, &moved)?;
                db::set_slot_owner(tx, t, Some(ino))?;
                db::set_slot_owner(tx, s, None)?;
                db::set_inode_slot(tx, ino, Some(t))?;
                Ok(true)
            })
        })();
        let _ = slots::range_lock(src, s, LockKind::Unlock);
        match res {
            Ok(true) => rep.moved += 1,
            Ok(false) => {}
            Err(e) => {
                let _ = unmark();
                return Err(e);
            }
        }
    }
    // Cut each pack after its last used slot, and punch out free slots.
    let mut c = conn.lock();
    let tx = db::write_tx(&mut c)?;
    let slots_now = all_slots(&tx)?;
    let mut last_used: HashMap<i64, u64> = HashMap::new();
    for (s, o) in &slots_now {
        let e = last_used.entry(s.pack).or_insert(0);
        if o.is_some() {
            *e = (*e).max(s.off + s.cap);
        }
    }
    // Free slots before the last used one are punched out, adjacent ones
    // as one range: a file system frees only whole blocks, and slots are
    // often smaller than a block.
    let mut ranges: Vec<(i64, u64, u64)> = Vec::new();
    for (s, o) in &slots_now {
        if o.is_some() {
            continue;
        }
        if s.off >= last_used.get(&s.pack).copied().unwrap_or(0) {
            tx.execute(
                "DELETE FROM slots WHERE pack = ?1 AND off = ?2",
                params![s.pack, s.off as i64],
            )
            .db()?;
            continue;
        }
        match ranges.last_mut() {
            Some(r) if r.0 == s.pack && r.1 + r.2 == s.off => r.2 += s.cap,
            _ => ranges.push((s.pack, s.off, s.cap)),
        }
    }
    let hole = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
    for (id, off, len) in ranges {
        pack(id, &mut files)?;
        if rustix::fs::fallocate(&files[&id], hole, off, len).is_ok() {
            rep.punched_bytes += len;
        }
    }
    for (&id, &end) in &last_used {
        tx.execute(
            "UPDATE packs SET end = ?2 WHERE id = ?1",
            params![id, end as i64],
        )
        .db()?;
        pack(id, &mut files)?;
        let f = &files[&id];
        let len = f.metadata()?.len();
        if len > end {
            f.set_len(end)?;
            rep.truncated_bytes += len - end;
        }
    }
    tx.commit().db()?;
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .map_err(|e| Error::io().context(format!("checkpoint: {e}")))?;
    Ok(rep)
}
