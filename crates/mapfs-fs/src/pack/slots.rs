//! Slots: cutting pack files into pieces, handing them out, taking them back,
//! and the byte-range locks that tell a compactor which slots are in use.
//!
//! A slot's capacity is a size class: a power of two from [`MIN_SLOT`] up.
//! A freed slot goes back to the free list of its class (its row stays, with
//! no owner) and is the first choice for the next slot of that class; new
//! slots are cut at the end of the newest pack file, aligned to
//! `min(cap, 4096)`, and a pack file is closed to new slots at
//! [`PACK_LIMIT`] bytes.
//!
//! Locks: the daemon holds an OFD read lock on a slot's byte range of the
//! pack file while any open of it exists; `mapfs pack compact` (another
//! process) moves a slot only after taking a write lock on that range
//! without waiting, so it never moves the bytes of an open file, and an
//! open that raced it waits for the move and then reads the new location.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use mapfs::{Error, Result};
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use rustix::fs::{Mode, OFlags};

use super::db::{DbResult, Slot};

/// Smallest slot.
pub const MIN_SLOT: u64 = 512;

/// Size past which a pack file gets no new slots.
pub const PACK_LIMIT: u64 = 1 << 30;

/// Subdirectory of the backing directory holding the pack files.
pub const PACK_DIR: &str = "packs";

/// The slot capacity for a file of `need` bytes.
pub fn class(need: u64) -> u64 {
    need.max(MIN_SLOT).next_power_of_two()
}

/// Name of pack file `id` inside [`PACK_DIR`].
pub fn pack_name(id: i64) -> String {
    format!("pack.{id:06}")
}

/// Slots taken from the database at once for one class: handing out the
/// next ones needs no transaction.
pub const RESERVE_BATCH: usize = 32;

/// [`RESERVE_BATCH`] for a process of an embedded job: what a killed one
/// held waits for the next instance that starts alone, so it holds fewer.
pub const SHARED_RESERVE_BATCH: usize = 8;

/// Owner recorded for slots a daemon reserved but has not handed to a file
/// yet: negative, so like every slot only opens use, a new mount frees it.
pub const RESERVED: i64 = -1;

/// Takes a slot of capacity `cap` for `owner` (a negative owner marks it in
/// use by opens only; see `db.rs`): a free one of the class if any, else a
/// new one at the end of the newest pack file.
pub fn alloc(conn: &Connection, cap: u64, owner: i64) -> Result<Slot> {
    let free: Option<(i64, i64)> = conn
        .prepare_cached(
            "SELECT pack, off FROM slots WHERE ino IS NULL AND cap = ?1 \
             ORDER BY pack, off LIMIT 1",
        )
        .db()?
        .query_row([cap as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .db()?;
    if let Some((pack, off)) = free {
        let s = Slot {
            pack,
            off: off as u64,
            cap,
        };
        super::db::set_slot_owner(conn, s, Some(owner))?;
        return Ok(s);
    }
    let last: Option<(i64, i64)> = conn
        .prepare_cached("SELECT id, end FROM packs ORDER BY id DESC LIMIT 1")
        .db()?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .db()?;
    let align = cap.min(4096);
    let (pack, off) = match last {
        Some((id, end)) => {
            let off = (end as u64).div_ceil(align) * align;
            if off + cap > PACK_LIMIT {
                (id + 1, 0)
            } else {
                (id, off)
            }
        }
        None => (1, 0),
    };
    conn.prepare_cached(
        "INSERT INTO packs(id, end) VALUES (?1, ?2) ON CONFLICT(id) DO UPDATE SET end = ?2",
    )
    .db()?
    .execute(params![pack, (off + cap) as i64])
    .db()?;
    conn.prepare_cached("INSERT INTO slots(pack, off, cap, ino) VALUES (?1, ?2, ?3, ?4)")
        .db()?
        .execute(params![pack, off as i64, cap as i64, owner])
        .db()?;
    Ok(Slot { pack, off, cap })
}

/// Sets (`lock`) or clears an OFD lock on the byte range of `s` in `file`:
/// a read lock, waiting for a writer (a compaction), or a write lock
/// without waiting (`EAGAIN`/`EACCES` when someone holds the range).
pub fn range_lock(file: &File, s: Slot, kind: LockKind) -> Result<()> {
    let (ty, wait) = match kind {
        LockKind::Read => (libc::F_RDLCK, true),
        LockKind::TryWrite => (libc::F_WRLCK, false),
        LockKind::Unlock => (libc::F_UNLCK, false),
    };
    super::shared::lock(file, s.off, s.cap, ty, wait)
}

/// What [`range_lock`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A shared lock, waiting for a compaction of the range to end.
    Read,
    /// An exclusive lock, failing at once if the range is in use.
    TryWrite,
    /// Drops the lock.
    Unlock,
}

/// The pack files of one backing directory, each opened once, and the
/// slots the opens of this process use.
#[derive(Debug)]
pub struct Packs {
    dir: OwnedFd,
    files: Mutex<HashMap<i64, Arc<File>>>,
    /// Opens using each slot; a slot with any holds a read lock.
    refs: Mutex<HashMap<Slot, u32>>,
}

impl Packs {
    /// Opens (creating) [`PACK_DIR`] in `backing`.
    pub fn new(backing: &Path) -> Result<Self> {
        let dir = super::private_dir(&backing.join(PACK_DIR), true)?.expect("made");
        Ok(Packs {
            dir,
            files: Mutex::new(HashMap::new()),
            refs: Mutex::new(HashMap::new()),
        })
    }

    /// Pack file `id`, opened read-write (created if new).
    pub fn file(&self, id: i64) -> Result<Arc<File>> {
        let mut files = self.files.lock();
        if let Some(f) = files.get(&id) {
            return Ok(f.clone());
        }
        let fd = rustix::fs::openat(
            &self.dir,
            pack_name(id),
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(Error::io().context(format!("{} is not a regular file", pack_name(id))));
        }
        // Kept for the store's life (above a program's numbers when
        // embedded, see `mapfs::fdnum`).
        let f = Arc::new(File::from(mapfs::fdnum::lasting(fd)));
        files.insert(id, f.clone());
        Ok(f)
    }

    /// Notes one more open using `s` (read-locking its range on the first).
    pub fn acquire(&self, s: Slot) -> Result<()> {
        let f = self.file(s.pack)?;
        let mut refs = self.refs.lock();
        let n = refs.entry(s).or_insert(0);
        if *n == 0 {
            if let Err(e) = range_lock(&f, s, LockKind::Read) {
                refs.remove(&s);
                return Err(e);
            }
        }
        *refs.get_mut(&s).expect("just inserted") += 1;
        Ok(())
    }

    /// Notes one open less using `s`; true when none is left (the range is
    /// unlocked then).
    pub fn release(&self, s: Slot) -> bool {
        let mut refs = self.refs.lock();
        let Some(n) = refs.get_mut(&s) else {
            return true;
        };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        refs.remove(&s);
        if let Ok(f) = self.file(s.pack) {
            let _ = range_lock(&f, s, LockKind::Unlock);
        }
        true
    }

    /// True when an open of this process uses `s`.
    pub fn in_use(&self, s: Slot) -> bool {
        self.refs.lock().contains_key(&s)
    }

    /// Takes `s` for writing if no process uses it (see `shared.rs`):
    /// `Some(file)` holding the lock, to [`range_lock`] `Unlock` when done.
    /// Only for a slot no open of this process uses.
    pub fn take_unused(&self, s: Slot) -> Result<Option<Arc<File>>> {
        let f = self.file(s.pack)?;
        let _refs = self.refs.lock();
        Ok(super::shared::try_write(&f, s.off, s.cap)?.then_some(f))
    }

    /// Forgets the pack files and slots of the process that forked this
    /// one: their descriptions hold the parent's locks, which a lock or
    /// unlock here would change. The descriptors are left open.
    pub fn reset(&self) {
        for (_, f) in self.files.lock().drain() {
            std::mem::forget(f);
        }
        self.refs.lock().clear();
    }
}
