//! The shim's fd table: which descriptors are mapfs files and how each is
//! served.
//!
//! # How a descriptor is served
//!
//! Every descriptor the application holds stays a real kernel descriptor.
//! An `open` goes through the mount first (the kernel checks permissions,
//! the daemon records the open); a regular file on an
//! attached mount becomes [`PENDING`]. Once it is used for real (the
//! [`Policy`]: a few data calls, one large call, or any mmap, lock,
//! fadvise, fallocate, sendfile/splice/copy_file_range, stdio stream), the
//! shim *adopts* it: it asks the daemon for that open's map and a private
//! descriptor of the backing file, and for a whole-file 1-to-1 map `dup3`s
//! the backing descriptor over the application's number ([`ADOPTED`]), after
//! carrying the offset over. From then on every data call, including
//! glibc-internal ones (stdio), `mmap`, `sendfile` and `io_uring`, is native;
//! the kernel keeps the offset, shared across `dup` and `fork` exactly as for
//! any file. The application's open through the mount is kept beside it
//! ([`Kept`]) until the last close, for `release` and locks. Only
//! `fstat`/`statx` are patched to report the mount's `st_dev`/`st_ino`
//! (and `stat` by path, to show a writer its own writes),
//! and the last close of a writable adoption tells the daemon, so readers
//! through the mount see the new size and bytes.
//!
//! Adoption is lazy so that metadata-only opens (`create`+`close`,
//! `open`+`fstat`) and small ones cost no daemon round trip beyond the
//! mount's own. An adoption proves possession of the open with an ioctl on
//! the descriptor itself, so it works whichever thread or process opened it
//! (inherited across `fork`/`exec`, received over a socket). A file the
//! shim cannot serve (daemon unreachable, refused) becomes [`MOUNT`]: it
//! keeps working through the mount, never an error.
//!
//! A map that is not whole-file 1-to-1 (an append log per open, as `plfs`
//! gives, or read-only pieces) is *lent* instead ([`ENGINE`]): the
//! descriptor stays the mount's open, and its data calls run in-process on
//! the map ([`crate::lent`]) until the last close, or until something the
//! shim cannot run itself needs the descriptor (`mmap`, stdio, `sendfile`,
//! `fork`, `exec`), which first hands it back to the mount.
//!
//! Descriptors duplicated before adoption share one [`Entry`], so adoption
//! replaces all of them with one backing description (shared offset); and
//! before `fork` every pending entry is pinned to the mount
//! ([`pin_all_pending`], also across `exec`), so parent and child keep
//! sharing the mount's description without a daemon round trip.
//!
//! The table itself takes no lock: an entry is found by one atomic load
//! ([`TABLE`]). Lock order: an entry's lock, then the map cache's
//! ([`mcache`]), then a mount's connection lock.
//!
//! In a signal handler (see [`in_handler`]) nothing allocates or talks to
//! the daemon: opens stay unclassified, closes are deferred, a `dup2` onto
//! a tracked descriptor first moves its open aside, and a lent open's
//! writes (whose map update allocates) are the one exception.

use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use mapfs::control::{Request, Response};
use mapfs_interpose::fdslots::FdSlots;
use mapfs_interpose::retire::Retired;
use mapfs_interpose::seqlock::SeqLock;
use mapfs_interpose::sync::Mutex;

use crate::lent::Lent;
use crate::{mcache, mounts, report, sys};
use mapfs::engine::DataFile;

/// Descriptors at or above this number are never tracked (served through
/// the mount).
pub const MAX_FD: usize = 1 << 20;

/// Not classified since it was opened or last closed.
pub const UNKNOWN: u8 = 0;
/// Not a file of an attached mount.
pub const OTHER: u8 = 1;
/// A mapfs file not adopted yet (a descriptor of the mount).
pub const PENDING: u8 = 2;
/// Adopted: the descriptor is the backing file itself; data calls are native.
pub const ADOPTED: u8 = 3;
/// A mapfs file served through the mount (the shim could not adopt it).
pub const MOUNT: u8 = 4;
/// One of the shim's own descriptors (a control socket): the application's
/// `close` of it is a no-op, so it cannot pull the socket from under the
/// shim.
pub const SHIM: u8 = 5;
/// Lent: the descriptor is the mount's open (a placeholder) and its data
/// calls run in-process on the map ([`lent`]).
pub const ENGINE: u8 = 6;

static STATE: [AtomicU8; MAX_FD] = [const { AtomicU8::new(UNKNOWN) }; MAX_FD];

/// The lent open of each [`ENGINE`] descriptor, by number: every data call
/// on a lent descriptor reads it, so it is found without the table's lock,
/// its hash and its entry's lock (9% of a program's time in 4 KiB reads of
/// packed files went there). Set before the state becomes [`ENGINE`],
/// emptied when the state leaves it. 8 MiB of address space, touched only
/// around the numbers that are lent.
static LENT: [ArcSwapOption<Lent>; MAX_FD] = [const { ArcSwapOption::const_empty() }; MAX_FD];

/// `fd` as an index of the per-number tables, if it is tracked at all.
#[inline]
fn index(fd: RawFd) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&i| i < MAX_FD)
}

/// The fast-path state of `fd`.
#[inline]
pub fn state(fd: RawFd) -> u8 {
    index(fd).map_or(OTHER, |i| STATE[i].load(Ordering::Relaxed))
}

fn set_state(fd: RawFd, s: u8) {
    if crate::in_vfork_child() {
        // The parent's table, in the parent's memory.
        return;
    }
    if let Some(i) = index(fd) {
        if STATE[i].swap(s, Ordering::AcqRel) == ENGINE && s != ENGINE {
            // Before the lent open can be dropped (and its backing
            // descriptor closed).
            if let Some(d) = DIRECT.get(i) {
                d.set(None);
            }
            let_go_lent(LENT[i].swap(None));
        }
    }
}

/// Where a lent descriptor's `pread`s go when one range of one backing
/// file answers them all: a read-only lending of one extent (a packed
/// file's slot, whose map cannot change here). Such a read needs only this
/// record and one system call, not the lent open and its locks, which sit
/// in a different cache line per file (the first touch of the open was
/// nine tenths of the shim's time in random reads over 5,000 packed
/// files). A sequence lock (`mapfs_interpose::seqlock`, whose ordering is
/// model-checked): readers check it around the call and take the ordinary
/// path if it moved. Words: backing descriptor + 1 (0: none), offset of
/// byte 0, size.
struct Direct(SeqLock<3>);

/// Descriptor numbers below this can read directly (1.5 MiB of address
/// space; the application's numbers are small).
const DIRECT_FDS: usize = 1 << 16;

static DIRECT: [Direct; DIRECT_FDS] = [const { Direct(SeqLock::new()) }; DIRECT_FDS];

impl Direct {
    /// Sets (`Some((backing descriptor, offset of byte 0, size))`) or
    /// clears the record.
    fn set(&self, to: Option<(RawFd, u64, u64)>) {
        self.0.write(match to {
            Some((fd, base, size)) => [u64::from(fd.unsigned_abs()) + 1, base, size],
            None => [0, 0, 0],
        });
    }
}

/// `pread` of `n` bytes at `off` of lent descriptor `fd` by its `Direct`
/// record (the count, or the errno), or `None` if it has none (or it
/// changed during the call: the caller then takes the ordinary path, whose
/// answer replaces this one).
///
/// # Safety
/// `buf` is valid for `n` bytes of writing.
pub unsafe fn direct_pread(
    fd: RawFd,
    buf: *mut u8,
    n: usize,
    off: i64,
) -> Option<Result<usize, i32>> {
    let i = usize::try_from(fd).ok()?;
    let d = &DIRECT.get(i)?.0;
    let seen = d.read()?;
    let [raw, base, size] = seen.words;
    if raw == 0 || STATE[i].load(Ordering::Relaxed) != ENGINE {
        return None;
    }
    let raw = RawFd::try_from(raw - 1).ok()?;
    let Ok(off) = u64::try_from(off) else {
        return Some(Err(libc::EINVAL));
    };
    let want = n.min(usize::try_from(size.saturating_sub(off)).unwrap_or(usize::MAX));
    // SAFETY: per the contract, and `want <= n`.
    let out = unsafe { std::slice::from_raw_parts_mut(buf, want) };
    let mut done = 0;
    while done < want {
        match rustix::io::pread(sys::fd(raw), &mut out[done..], base + off + done as u64) {
            Ok(0) => break,
            Ok(got) => done += got,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                if !d.still(&seen) {
                    return None;
                }
                return Some(Err(e.raw_os_error()));
            }
        }
    }
    // A backing file shorter than its slot reads as zeros there, as the
    // engine's reads do.
    out[done..].fill(0);
    d.still(&seen).then_some(Ok(want))
}

/// Makes `fd` a lent descriptor of `lent`.
fn set_engine(fd: RawFd, lent: &Arc<Lent>) {
    if crate::in_vfork_child() {
        return;
    }
    if let Some(i) = index(fd) {
        // Before the state: a data call that sees ENGINE finds it.
        let_go_lent(LENT[i].swap(Some(lent.clone())));
        if let Some(d) = DIRECT.get(i) {
            d.set(lent.direct());
        }
        STATE[i].store(ENGINE, Ordering::Release);
    }
}

/// One open of a mapfs file, shared by its duplicated descriptors.
pub struct Entry {
    /// Index into [`mounts::all`].
    pub mount: usize,
    /// `st_dev` of the mount.
    pub dev: u64,
    /// FUSE inode number.
    pub ino: u64,
    /// Data calls seen while pending (see [`serve`]).
    pub calls: std::sync::atomic::AtomicU32,
    /// Nanoseconds those calls spent on the mount (see [`mount_time`]).
    pub mount_ns: AtomicU64,
    /// A call of at least the policy's bytes took longer on the mount
    /// than an adoption costs (see [`mount_time`]).
    pub slow_big_call: std::sync::atomic::AtomicBool,
    /// Mutable part.
    pub inner: Mutex<Inner>,
}

/// The mutable part of an [`Entry`].
pub struct Inner {
    /// Descriptors of this process referring to it.
    pub fds: Vec<RawFd>,
    /// How it is served.
    pub status: Status,
    /// The open through the mount, kept beside an adoption (see [`Kept`]).
    pub kept: Option<Kept>,
    /// A lock was taken on the kept open (so it is never given back early,
    /// see [`reclaim`]).
    pub locked: bool,
    /// The in-process data state of a lent open ([`Status::Lent`]).
    pub lent: Option<Arc<Lent>>,
}

/// The application's open through the mount, kept open (at a high number,
/// marked [`SHIM`]) for as long as an adoption of it lives in this process.
/// The kernel's `release` (and the file system's) therefore runs at the
/// application's last close, as without the shim; and the application's
/// locks are taken on it, so processes using the mount see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// The descriptor number.
    pub fd: RawFd,
}

impl Kept {
    /// The number, if it still is the shim's descriptor of file `(dev, ino)`
    /// (the application may have `dup2`ed something else onto it).
    fn live(self, dev: u64, ino: u64) -> Option<RawFd> {
        if state(self.fd) != SHIM {
            return None;
        }
        match sys::identity(self.fd) {
            Ok(id) if id.dev == dev && id.ino == ino => Some(self.fd),
            _ => None,
        }
    }
}

/// How an [`Entry`] is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Not adopted yet.
    Pending,
    /// The descriptors are the backing file.
    Adopted {
        /// The daemon's handle of the adoption.
        handle: u64,
        /// Opened for writing (the daemon is told at the last close).
        writable: bool,
    },
    /// The descriptors are the mount's open, whose map runs in-process
    /// ([`Inner::lent`]).
    Lent,
    /// Served through the mount, with the reason.
    Mount(String),
}

/// The entry of each tracked descriptor, by number. A lookup is one
/// atomic load that never waits for a writer, and filing never allocates
/// (a signal handler's `dup` files one): see `mapfs_interpose::fdslots`.
/// 8 MiB of address space, touched only around the numbers in use.
static TABLE: FdSlots<Entry, MAX_FD> = FdSlots::new();

/// A new entry for descriptor `fd` of file `(dev, ino)` on mount `mount`.
fn new_entry(
    mount: usize,
    dev: u64,
    ino: u64,
    fd: RawFd,
    status: Status,
    kept: Option<Kept>,
) -> Arc<Entry> {
    Arc::new(Entry {
        mount,
        dev,
        ino,
        calls: std::sync::atomic::AtomicU32::new(0),
        mount_ns: AtomicU64::new(0),
        slow_big_call: std::sync::atomic::AtomicBool::new(false),
        inner: Mutex::new(Inner {
            fds: with_room(fd),
            status,
            kept,
            locked: false,
            lent: None,
        }),
    })
}

/// Room an entry's descriptor list keeps free for the `dup`s of a signal
/// handler, which must not allocate (see [`in_handler`]).
const HANDLER_ROOM: usize = 4;

/// A descriptor list of one, with room for more.
fn with_room(fd: RawFd) -> Vec<RawFd> {
    let mut fds = Vec::with_capacity(HANDLER_ROOM);
    fds.push(fd);
    fds
}

/// This thread runs a signal handler of the program. The handler
/// interrupted the program outside the shim (the signal layer delays it
/// otherwise), so the shim's locks may be taken; but it may have
/// interrupted `malloc`, so nothing here allocates or frees memory, and
/// nothing talks to a daemon (which allocates): no classification, no
/// adoption, no hand-back; closes are deferred ([`closing_lock_free`]),
/// and references let go of are parked ([`RETIRED`]).
#[inline]
fn in_handler() -> bool {
    mapfs_interpose::signal::in_handler()
}

/// Entries and lent opens a signal handler let go of, dropped at the next
/// entry into the shim outside a handler ([`run_deferred_closes`]).
static RETIRED: Retired<Entry, 32> = Retired::new();
/// See [`RETIRED`].
static RETIRED_LENT: Retired<Lent, 32> = Retired::new();

/// Drops `e` now, or parks it if this is a signal handler.
fn let_go(e: Option<Arc<Entry>>) {
    match e {
        Some(e) if in_handler() => RETIRED.park(e),
        e => drop(e),
    }
}

/// [`let_go`] for a lent open.
fn let_go_lent(l: Option<Arc<Lent>>) {
    match l {
        Some(l) if in_handler() => RETIRED_LENT.park(l),
        l => drop(l),
    }
}

fn get(fd: RawFd) -> Option<Arc<Entry>> {
    TABLE.get(index(fd)?)
}

/// Files `e` under `fd` (never allocates).
fn insert(fd: RawFd, e: Arc<Entry>) {
    if let Some(i) = index(fd) {
        let_go(TABLE.swap(i, Some(e)));
    }
}

fn remove(fd: RawFd) -> Option<Arc<Entry>> {
    TABLE.swap(index(fd)?, None)
}

/// The distinct entries of the table (several descriptors may share one),
/// each with the first number filed under it.
fn entries() -> Vec<(RawFd, Arc<Entry>)> {
    let mut out: Vec<(RawFd, Arc<Entry>)> = Vec::new();
    TABLE.for_each(|fd, e| {
        if !out.iter().any(|(_, o)| Arc::ptr_eq(o, &e)) {
            out.push((fd as RawFd, e));
        }
    });
    out
}

/// Drops a stale entry filed under `fd` (its descriptor was closed behind
/// the shim's back, e.g. by a raw system call), and takes `fd` off that
/// entry's list, so an adoption never puts a file under the number's new
/// owner.
fn forget_stale(fd: RawFd) {
    if let Some(e) = remove(fd) {
        e.inner.lock().fds.retain(|&f| f != fd);
        let_go(Some(e));
    }
}

/// The mount identity to report for an adopted descriptor.
pub fn adopted_identity(fd: RawFd) -> Option<(u64, u64)> {
    if state(fd) != ADOPTED {
        return None;
    }
    get(fd).map(|e| (e.dev, e.ino))
}

/// Classifies a descriptor the application just got from `open`/`fopen`,
/// made by the calling thread.
pub fn opened(fd: RawFd) {
    if fd < 0 {
        return;
    }
    undefer(fd);
    // A stale entry (descriptor closed behind our back, e.g. close_range).
    forget_stale(fd);
    if in_handler() {
        // Classifying allocates: the descriptor, the kernel's own open,
        // stays unknown until a call outside a handler looks at it.
        set_state(fd, UNKNOWN);
        return;
    }
    classify(fd);
}

/// Classifies `fd`: a regular file of an attached mount becomes
/// [`PENDING`], anything else [`OTHER`]. Returns the new state.
fn classify(fd: RawFd) -> u8 {
    if index(fd).is_none() {
        return OTHER;
    }
    if mounts::all().is_empty() {
        set_state(fd, OTHER);
        return OTHER;
    }
    let id = match sys::identity(fd) {
        Ok(id) => id,
        Err(_) => return UNKNOWN,
    };
    let mount = match mounts::by_dev(id.dev) {
        Some(m) if id.regular => m,
        _ => {
            set_state(fd, OTHER);
            return OTHER;
        }
    };
    let entry = new_entry(mount, id.dev, id.ino, fd, Status::Pending, None);
    insert(fd, entry);
    set_state(fd, PENDING);
    report::count_tracked();
    PENDING
}

/// Why an open stays on the mount: the process holds record locks on the
/// file through another open. POSIX drops all of a process's record locks
/// on a file when any descriptor of it is closed, and adopting or lending
/// puts another file under the application's number (`dup3` over it): the
/// other open's locks would go (two SQLite connections of one process
/// would both think they hold the database).
pub const LOCKED: &str = "record locks on the file through another open";

/// Files (mount index, inode) this process took record locks on, for the
/// process's life: whether all its locks on one are gone cannot be known
/// without a race with the threads taking them.
static LOCKED_FILES: Mutex<Option<std::collections::HashSet<(usize, u64)>>> = Mutex::new(None);

fn locked_file(mount: usize, ino: u64) -> bool {
    LOCKED_FILES
        .lock()
        .as_ref()
        .is_some_and(|l| l.contains(&(mount, ino)))
}

/// A record lock is about to be taken through `fd`: the file is noted
/// (no open of it is adopted or lent from now on, see [`LOCKED`]),
/// and its lent opens are handed back first, so that no descriptor of it
/// is swapped out from under the lock.
pub fn record_locking(fd: RawFd) {
    let Some(e) = get(fd) else {
        return;
    };
    LOCKED_FILES
        .lock()
        .get_or_insert_with(Default::default)
        .insert((e.mount, e.ino));
    // Not only when an open is lent now: taking each entry's lock waits
    // for an adoption in progress (whose `dup3` must come before the
    // lock), and one that starts later sees the file noted.
    let mut all = siblings(&e);
    all.push(e);
    for s in all {
        hand_back(&s, LOCKED);
    }
}

/// The other entries of `entry`'s file in this process.
fn siblings(entry: &Arc<Entry>) -> Vec<Arc<Entry>> {
    entries()
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.mount == entry.mount && e.ino == entry.ino && !Arc::ptr_eq(e, entry))
        .collect()
}

/// The first call of a pending descriptor at which the time its calls spent
/// on the mount may adopt it (see [`Policy`]).
pub const TIMED_FROM: u32 = 4;

/// Adoption policy: a pending descriptor is adopted at its
/// `MAPFS_PRELOAD_ADOPT_CALLS`th data call (default 16), or at once for
/// calls that must see the final file (mmap, locks, fallocate,
/// sendfile/splice/copy_file_range, stdio streams: `len` = `usize::MAX`),
/// or at a call moving at least `MAPFS_PRELOAD_ADOPT_BYTES` (default
/// 1 MiB) after such a call that took longer on the mount than an adoption
/// costs (the daemon served it, or will serve the next large ones as
/// slowly; a file read or written whole in one call gains nothing from an
/// adoption after it, and kernel passthrough moves a MiB of a cached file
/// in about 0.1-0.3 ms, with the adoption 0.2 ms more: `small-files`' 1 MiB
/// files read under `mapfs run` at 0.65x the mount when such a call
/// adopted at once, 0.97x when none did),
/// or, from its [`TIMED_FROM`]th call on, once its calls through the mount
/// took `MAPFS_PRELOAD_ADOPT_MOUNT_US` microseconds in all (default 200:
/// what an adoption costs, measured below; so a descriptor whose calls the
/// daemon serves pays at most about twice what adopting at once would have
/// cost, as in renting skis until the rent paid equals the price, while
/// kernel-passthrough calls, a few hundred ns each, stay under it and keep
/// the call count's rule). The first
/// calls are never adopted for their time: a program reading a small file
/// whole (`cat`) makes two or three, and an adoption before the last one,
/// which finds the end, would only cost.
/// `posix_fadvise` is a hint and adopts nothing: a process that reads a
/// small file and exits never contacts the daemon.
///
/// The default is measured (`scripts/adopt-threshold.sh`, 2026-11-23,
/// release build, `dd bs=4k` of a file on the mount, 100 processes, ms per
/// process, adopt at the first call vs never, on a quiet machine): an
/// adoption costs about 0.2 ms (connect, proof, adopt);
/// 4k writes through a `--data daemon` mount cost about 12 µs each, so
/// adoption pays from between 16 (1.2 vs 1.2 ms) and 64 writes (1.3 vs
/// 1.8 ms), and from between 64 and 256 cached reads (1.4 vs 1.7 ms at
/// 256); on a kernel-passthrough mount it paid at none of 4 to 256 reads or
/// writes (passthrough costs a few hundred ns per call), only over long
/// runs (the benchmark's preload rows). Per executor, with plfs, in
/// `docs/shim-cost.md`.
pub struct Policy {
    calls: u32,
    bytes: usize,
    mount_ns: u64,
}

fn policy() -> &'static Policy {
    static P: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let num = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
        };
        Policy {
            calls: num("MAPFS_PRELOAD_ADOPT_CALLS", 16).clamp(1, u64::from(u32::MAX)) as u32,
            bytes: num("MAPFS_PRELOAD_ADOPT_BYTES", 1 << 20) as usize,
            mount_ns: num("MAPFS_PRELOAD_ADOPT_MOUNT_US", 200).saturating_mul(1000),
        }
    })
}

/// Makes `fd` ready for a data call moving `len` bytes: classifies an
/// unknown descriptor and adopts a pending one when the [`Policy`] says so.
/// Called on the slow path only.
pub fn serve(fd: RawFd, len: usize) {
    if in_handler() {
        // Served by the kernel as it is (see `in_handler`).
        return;
    }
    let mut s = state(fd);
    if s == UNKNOWN {
        // Inherited across exec, or made by a call the shim does not hook:
        // the opener is unknown, so the daemon is asked on the process's
        // behalf.
        s = classify(fd);
    }
    if s == PENDING {
        if let Some(e) = get(fd) {
            let calls = e.calls.fetch_add(1, Ordering::Relaxed) + 1;
            let p = policy();
            if calls >= p.calls
                || len == usize::MAX
                || (len >= p.bytes && e.slow_big_call.load(Ordering::Relaxed))
                || (calls >= TIMED_FROM && e.mount_ns.load(Ordering::Relaxed) >= p.mount_ns)
            {
                adopt(&e, true);
            }
        }
    }
}

/// A data call of pending descriptor `fd` moving `len` bytes went through
/// the mount and took `took`: counted toward the [`Policy`]'s time on the
/// mount; a large call that took longer than an adoption costs has the
/// next large call adopt.
pub fn mount_time(fd: RawFd, took: std::time::Duration, len: usize) {
    if state(fd) != PENDING {
        return;
    }
    if let Some(e) = get(fd) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        e.mount_ns.fetch_add(ns, Ordering::Relaxed);
        let p = policy();
        if len >= p.bytes && ns >= p.mount_ns {
            e.slow_big_call.store(true, Ordering::Relaxed);
        }
    }
}

/// Makes `fd` the final kernel object before a call the shim cannot run
/// itself (`mmap`, a stdio stream, `sendfile`...): a pending descriptor is
/// adopted if its map is whole-file (else served through the mount), and a
/// lent one is handed back to the mount.
pub fn serve_final(fd: RawFd, why: &str) {
    if in_handler() {
        return;
    }
    let mut s = state(fd);
    if s == UNKNOWN {
        s = classify(fd);
    }
    if s == PENDING || s == ENGINE {
        if let Some(e) = get(fd) {
            adopt(&e, false);
            hand_back(&e, why);
        }
    }
}

/// The lent state of `fd`, if it is lent.
pub fn lent(fd: RawFd) -> Option<Arc<Lent>> {
    lent_slot(fd)?.clone()
}

/// The slot holding the lent open of `fd`, borrowed for one call (`None`
/// if `fd` is not lent; the slot itself may be empty if it was just
/// handed back).
pub fn lent_slot(fd: RawFd) -> Option<arc_swap::Guard<Option<Arc<Lent>>>> {
    let i = index(fd)?;
    if STATE[i].load(Ordering::Acquire) != ENGINE {
        return None;
    }
    Some(LENT[i].load())
}

/// Hands a lent open back to the mount: pushes its map to the daemon, sets
/// the mount descriptor's offset, ends the lending. From then on the
/// descriptors are served through the mount.
pub fn hand_back(entry: &Entry, why: &str) {
    let mut inner = entry.inner.lock();
    let Some(lent) = inner.lent.take() else {
        return;
    };
    // No data call of another thread still runs on it (see `Lent::end`).
    lent.end();
    // A writable lending put placeholders under the application's numbers
    // and kept the open itself aside: it comes back now.
    let open = inner.kept.take().and_then(|k| k.live(entry.dev, entry.ino));
    if let Some(fd) = open.or(inner.fds.first().copied()) {
        let _ = rustix::fs::seek(sys::fd(fd), rustix::fs::SeekFrom::Start(lent.offset()));
    }
    if let Some(m) = mounts::all().get(entry.mount) {
        push_map(m, &lent, open);
        // A copy is no lending: the daemon has nothing to end.
        if !lent.is_copy() {
            let _ = m.call(&Request::Closed {
                handle: lent.handle(),
                wrote: lent.wrote(),
            });
        }
    }
    if let Some(k) = open {
        for &fd in &inner.fds {
            if let Err(e) = sys::dup_over(sys::fd(k), fd, sys::cloexec(fd)) {
                sys::log(format_args!(
                    "fd {fd}: cannot put the mount's open back ({e}); it stays a placeholder"
                ));
            }
        }
        close_kept(Kept { fd: k }, entry.dev, entry.ino);
    }
    if let Some(&fd) = inner.fds.first() {
        // The daemon dropped the kernel's cached attributes, but the kernel
        // checks mmap faults and copy_file_range against its cached size
        // without asking again: make it ask now.
        let _ = rustix::fs::fstat(sys::fd(fd));
    }
    end_lending(&lent);
    let reason = format!("handed back to the mount: {why}");
    if why != EXIT {
        report::count_fallback(&reason);
    }
    inner.status = Status::Mount(reason);
    for &fd in &inner.fds {
        set_state(fd, MOUNT);
    }
}

/// The [`hand_back`] reason at exit (not a fallback: nothing more runs).
pub const EXIT: &str = "exit";

/// Takes a lent open off this process's counts (it was closed or handed
/// back).
fn end_lending(lent: &Lent) {
    LENT_OPEN.fetch_sub(1, Ordering::Relaxed);
    if lent.writable() {
        WRITABLE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends a lent open's current map to the daemon if it wrote (before a
/// `close(2)` or `fsync` of its mount descriptor, so the file system
/// persists it). If the daemon that lent it was replaced since (its handle
/// is unknown now), the open is first lent again through `kept`, the open
/// itself (see [`relend`]). False when the daemon did not take it.
fn push_map(m: &mounts::Mount, lent: &Lent, kept: Option<RawFd>) -> bool {
    if !lent.wrote() {
        return true;
    }
    let push = || {
        m.call_with_map(lent.handle(), lent.map(), |map| Request::Release {
            handle: lent.handle(),
            map,
        })
    };
    let mut res = push();
    let stale = match &res {
        Err(e) => e.raw_os_error() == Some(libc::EBADF),
        Ok((Response::Refused { errno, .. }, _)) => *errno == libc::EBADF,
        Ok(_) => false,
    };
    if let (true, Some(k)) = (stale, kept) {
        match relend(m, k, lent) {
            Ok(copied) => {
                sys::log(format_args!(
                    "a lent open outlived the daemon that lent it: lent again by its \
                     successor, {copied} bytes written since the last push carried over"
                ));
                res = push();
            }
            Err(why) => sys::log(format_args!(
                "a lent open outlived the daemon that lent it and could not be lent again: {why}"
            )),
        }
    }
    match res {
        Ok((Response::Done, _)) => true,
        other => {
            sys::log(format_args!(
                "the daemon did not take a lent open's map ({other:?}); writes since the last \
                 close or fsync are not in the file"
            ));
            false
        }
    }
}

/// Pushes the map of the lent open of `fd` to the daemon (its `fsync`).
/// False when the daemon did not take it.
pub fn sync_lent(fd: RawFd) -> bool {
    let Some(e) = get(fd) else {
        return true;
    };
    let inner = e.inner.lock();
    match (&inner.lent, mounts::all().get(e.mount)) {
        (Some(lent), Some(m)) => push_map(m, lent, inner.kept.and_then(|k| k.live(e.dev, e.ino))),
        _ => true,
    }
}

/// Pushes the maps of this process's lent opens of file `(dev, ino)` that
/// wrote to the daemon, so an open of the file through the mount sees
/// their bytes, as it would see a local file's.
pub fn push_lent_of(dev: u64, ino: u64) {
    if in_handler() {
        // No daemon from a handler: its open sees the file as of the
        // lent opens' last push.
        return;
    }
    for (_, e) in entries() {
        if e.dev != dev || e.ino != ino {
            continue;
        }
        let inner = e.inner.lock();
        if let (Some(l), Some(m)) = (&inner.lent, mounts::all().get(e.mount)) {
            if l.writable() {
                push_map(m, l, inner.kept.and_then(|k| k.live(e.dev, e.ino)));
            }
        }
    }
}

/// Number of lent opens in this process (a fast "none" for
/// [`hand_back_all`]).
static LENT_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// This process has a lent open (one relaxed load).
#[inline]
pub fn lent_open() -> bool {
    LENT_OPEN.load(Ordering::Relaxed) != 0
}

/// Hands every lent open back to the mount (before `fork`, `exec`, exit).
pub fn hand_back_all(why: &str) {
    if LENT_OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    for (_, e) in entries() {
        hand_back(&e, why);
    }
}

/// Adopts `entry`: asks the daemon for the backing descriptor and puts it
/// under every descriptor of the entry. With `engine`, a map that is not
/// whole-file may be lent and run in-process.
pub fn adopt(entry: &Arc<Entry>, engine: bool) {
    let mut inner = entry.inner.lock();
    if inner.status != Status::Pending {
        return;
    }
    // Checked under the entry's lock: a record lock taken meanwhile
    // through another open either is noted by now, or waits for this
    // adoption to end ([`record_locking`]).
    let status = if locked_file(entry.mount, entry.ino) {
        Status::Mount(LOCKED.into())
    } else {
        match try_adopt(entry, &mut inner, engine) {
            Ok(s) => s,
            Err(reason) => Status::Mount(reason),
        }
    };
    let st = match &status {
        Status::Adopted { writable, .. } => {
            if *writable {
                WRITABLE.fetch_add(1, Ordering::Relaxed);
            }
            report::count_adopted();
            ADOPTED
        }
        Status::Lent => {
            LENT_OPEN.fetch_add(1, Ordering::Relaxed);
            if inner.lent.as_ref().is_some_and(|l| l.writable()) {
                WRITABLE.fetch_add(1, Ordering::Relaxed);
            }
            report::count_adopted();
            ENGINE
        }
        Status::Mount(reason) => {
            report::count_fallback(reason);
            sys::log(format_args!(
                "ino {} served through the mount: {reason}",
                entry.ino
            ));
            MOUNT
        }
        Status::Pending => PENDING,
    };
    inner.status = status;
    for &fd in &inner.fds {
        match (&inner.lent, st) {
            (Some(l), ENGINE) => set_engine(fd, l),
            _ => set_state(fd, st),
        }
    }
}

fn try_adopt(entry: &Entry, inner: &mut Inner, engine: bool) -> Result<Status, String> {
    let &first = inner.fds.first().ok_or("no descriptor")?;
    match sys::identity(first) {
        Ok(id) if id.dev == entry.dev && id.ino == entry.ino => {}
        _ => return Err("descriptor changed behind the shim".into()),
    }
    let flags = rustix::fs::fcntl_getfl(sys::fd(first))
        .map_err(|e| format!("F_GETFL: {e}"))?
        .bits() as i32;
    // SEEK_CUR on a FUSE file is answered by the kernel, not the daemon.
    let offset = rustix::fs::seek(sys::fd(first), rustix::fs::SeekFrom::Current(0))
        .map_err(|e| format!("lseek: {e}"))?;
    let mount = &mounts::all()[entry.mount];
    mount
        .connect()
        .map_err(|e| format!("daemon unreachable: {e}"))?;
    if mount.writeback.load(Ordering::Relaxed) {
        return Err("kernel writeback cache on this mount: served through it".into());
    }
    let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if let Some(file) = mcache::reopen(entry.mount, entry.ino, flags) {
        install(entry, inner, file.as_fd(), offset)?;
        return Ok(Status::Adopted {
            handle: 0,
            writable,
        });
    }
    let token = mcache::token_before_asking(entry.mount, entry.ino);
    // A copy is valid under a token read before asking, whatever the map
    // cache's settings.
    let copy_token = mount.copy_token(entry.ino);
    let handed = match ask_adopt(mount, first, flags, engine)? {
        Answer::Handed(h) => h,
        Answer::Copied(bytes) => {
            let (token, bytes) = match copy_token {
                Some(t) => (t, bytes),
                None => {
                    // The table came with this answer (the connection's
                    // first adoption): the copy may predate the token read
                    // now, so it is asked for again.
                    let t = mount
                        .copy_token(entry.ino)
                        .ok_or("no generation table to keep a copy valid")?;
                    match ask_adopt(mount, first, flags, engine)? {
                        Answer::Copied(b) => (t, b),
                        Answer::Handed(h) => {
                            end_unused(mount, h.handle);
                            return Err("the daemon lent the open at the second asking".into());
                        }
                    }
                }
            };
            let copy = crate::lent::CopyOf {
                ino: entry.ino,
                token,
            };
            let lent = Lent::copied(entry.mount, &bytes, copy, offset, flags)
                .map_err(|e| format!("cannot hold the copy: {e}"))?;
            inner.lent = Some(Arc::new(lent));
            return Ok(Status::Lent);
        }
    };
    let Handed {
        handle,
        map,
        backing,
        size_page,
    } = handed;
    if !map.is_whole_file() {
        // Lent: the daemon checked the map can run here.
        let data = lent_data(map, backing);
        if writable {
            if let Err(why) = put_placeholders(entry, inner) {
                // Nothing was written: end the lending, stay on the mount.
                end_unused(mount, handle);
                return Err(why);
            }
        }
        let lent = Lent::new(entry.mount, handle, data, size_page, offset, flags);
        inner.lent = Some(Arc::new(lent));
        return Ok(Status::Lent);
    }
    if backing.len() != 1 {
        return Err("whole-file map without exactly one backing file".into());
    }
    let backing = &backing[0];
    install(entry, inner, backing.as_fd(), offset)?;
    if let Some(token) = token {
        mcache::store(entry.mount, entry.ino, token, backing.as_fd());
    }
    Ok(Status::Adopted { handle, writable })
}

/// A daemon's answer to an adoption.
enum Answer {
    /// The open, or its map, handed over.
    Handed(Handed),
    /// A copy of the file's bytes ([`Response::Copied`]).
    Copied(Vec<u8>),
}

/// Ends the lending `handle` of `mount`, which this process will not use
/// (it wrote nothing through it).
fn end_unused(mount: &mounts::Mount, handle: u64) {
    let _ = mount.call(&Request::Closed {
        handle,
        wrote: false,
    });
}

/// What a daemon handed out for an adoption.
struct Handed {
    handle: u64,
    map: mapfs::DataMap,
    backing: Vec<std::os::fd::OwnedFd>,
    size_page: Option<mapfs::lentsize::LentSize>,
}

/// Asks the daemon of `mount` to hand over the open of `fd` (see
/// [`Request::Adopt`]).
fn ask_adopt(mount: &mounts::Mount, fd: RawFd, flags: i32, engine: bool) -> Result<Answer, String> {
    let (resp, mut backing) = mount
        .call_proven(sys::fd(fd), |proof| Request::Adopt {
            proof,
            flags,
            engine,
        })
        .map_err(|e| format!("daemon unreachable: {e}"))?;
    match resp {
        Response::Adopted {
            handle,
            map,
            files,
            size_slot,
            generations,
        } => {
            mount.keep_generations(&mut backing, files, generations);
            let size_page = if size_slot {
                match mapfs::control::take_size_slot(&mut backing, files, size_slot) {
                    Some(p) => Some(p),
                    None => {
                        end_unused(mount, handle);
                        return Err("the daemon's size page is unusable".into());
                    }
                }
            } else {
                None
            };
            Ok(Answer::Handed(Handed {
                handle,
                map,
                backing,
                size_page,
            }))
        }
        Response::Copied { bytes, generations } => {
            mount.keep_generations(&mut backing, 0, generations);
            Ok(Answer::Copied(bytes))
        }
        Response::Refused { reason, .. } => Err(format!("refused: {reason}")),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// The data state of a lending: `map` over the `backing` descriptors.
fn lent_data(map: mapfs::DataMap, backing: Vec<std::os::fd::OwnedFd>) -> DataFile {
    let files = backing
        .into_iter()
        .map(|fd| Arc::new(std::fs::File::from(fd)))
        .collect();
    DataFile::new(mapfs::Opened {
        map,
        files,
        handle: 0,
    })
}

/// Has the open of `kept` lent again by a daemon that replaced the one that
/// lent `lent` (its handle died with it), carrying this process's writes
/// since its last push into the new lending; returns the bytes copied.
fn relend(m: &mounts::Mount, kept: RawFd, lent: &Lent) -> Result<u64, String> {
    let flags = rustix::fs::fcntl_getfl(sys::fd(kept))
        .map_err(|e| format!("F_GETFL: {e}"))?
        .bits() as i32;
    let h = match ask_adopt(m, kept, flags, true)? {
        Answer::Handed(h) => h,
        Answer::Copied(_) => return Err("the new daemon answered a writer with a copy".into()),
    };
    let end = |why: String| {
        end_unused(m, h.handle);
        Err(why)
    };
    if h.map.is_whole_file() {
        return end("the new daemon lent a whole-file map".into());
    }
    match lent.relend(h.handle, lent_data(h.map, h.backing), h.size_page) {
        Ok(copied) => Ok(copied),
        Err(e) => end(format!("carrying the writes over: {e}")),
    }
}

/// Puts `backing` (positioned at the application's `offset`) under every
/// descriptor of the entry, keeping the mount's open beside it.
fn install(
    entry: &Entry,
    inner: &mut Inner,
    backing: BorrowedFd<'_>,
    offset: u64,
) -> Result<(), String> {
    let &first = inner.fds.first().ok_or("no descriptor")?;
    rustix::fs::seek(backing, rustix::fs::SeekFrom::Start(offset))
        .map_err(|e| format!("lseek backing: {e}"))?;
    // Without a free high descriptor number the mount's open is released
    // now (as the dup3 below closes it) and locks stay on the backing file.
    let kept = keep_mount_open(first);
    for &fd in &inner.fds {
        if let Err(e) = sys::dup_over(backing, fd, sys::cloexec(fd)) {
            if let Some(k) = kept {
                close_kept(k, entry.dev, entry.ino);
            }
            return Err(format!("dup3 over fd {fd}: {e}"));
        }
    }
    inner.kept = kept;
    Ok(())
}

/// Puts a placeholder under every descriptor of a writably lent entry and
/// keeps the open itself at a high number (see [`crate::lent`]): calls the
/// shim cannot see (raw system calls, io_uring) then fail on the
/// placeholder instead of reaching the mount with a map older than the
/// shim's writes.
fn put_placeholders(entry: &Entry, inner: &mut Inner) -> Result<(), String> {
    let &first = inner.fds.first().ok_or("no descriptor")?;
    let kept = keep_mount_open(first).ok_or("no descriptor number to keep the mount's open")?;
    // Access mode 3: neither read nor write (the daemon's placeholder open).
    let access = rustix::fs::OFlags::from_bits_retain(3) | rustix::fs::OFlags::CLOEXEC;
    let placeholder = match rustix::fs::open(
        format!("/proc/self/fd/{first}").as_str(),
        access,
        rustix::fs::Mode::empty(),
    ) {
        Ok(p) => p,
        Err(e) => {
            close_kept(kept, entry.dev, entry.ino);
            return Err(format!("no placeholder for a writable lending: {e}"));
        }
    };
    for (i, &fd) in inner.fds.iter().enumerate() {
        if let Err(e) = sys::dup_over(placeholder.as_fd(), fd, sys::cloexec(fd)) {
            for &done in &inner.fds[..i] {
                let _ = sys::dup_over(sys::fd(kept.fd), done, sys::cloexec(done));
            }
            close_kept(kept, entry.dev, entry.ino);
            return Err(format!("dup3 over fd {fd}: {e}"));
        }
    }
    inner.kept = Some(kept);
    Ok(())
}

/// The open behind a lent descriptor whose number holds a placeholder:
/// where its locks, status flags and syncs go.
pub fn engine_target(fd: RawFd) -> Option<RawFd> {
    if state(fd) != ENGINE {
        return None;
    }
    let e = get(fd)?;
    let inner = e.inner.lock();
    inner.kept.and_then(|k| k.live(e.dev, e.ino))
}

/// A duplicate of the application's mount descriptor `fd`, kept for its
/// adoption (`None` if no high descriptor number is free).
fn keep_mount_open(fd: RawFd) -> Option<Kept> {
    match sys::dup_high(fd) {
        Ok(k) => {
            let k = std::os::fd::IntoRawFd::into_raw_fd(k);
            set_state(k, SHIM);
            Some(Kept { fd: k })
        }
        Err(e) => {
            sys::log(format_args!(
                "fd {fd}: no descriptor to keep the mount's open ({e}); released at adoption"
            ));
            None
        }
    }
}

/// Closes a kept mount descriptor (if it still is the shim's).
fn close_kept(k: Kept, dev: u64, ino: u64) {
    if let Some(fd) = k.live(dev, ino) {
        // `live` checked the number is still the shim's descriptor of this
        // file, so closing it closes nothing of the application's.
        set_state(fd, UNKNOWN);
        sys::close_own(fd);
    }
}

/// What to do after a descriptor is closed: close the mount's open kept for
/// it, tell the daemon the file changed.
pub struct Closed {
    mount: usize,
    dev: u64,
    ino: u64,
    kept: Option<Kept>,
    notice: Option<Notice>,
    /// The daemon did not take the lent open's map before the close: its
    /// writes since the last push are not in the file.
    lost: bool,
}

/// What the daemon is told after a close.
enum Notice {
    /// A message about a handle this process's connection was given.
    Handle(Request),
    /// A writable open adopted without a handle (from the map cache, or
    /// inherited across `exec`) was written: proven on the kept open.
    Changed,
}

impl Closed {
    /// The close lost writes (the daemon did not take the map): `close`
    /// reports `EIO`, as a file system whose flush failed does.
    pub fn lost(&self) -> bool {
        self.lost
    }

    /// Tells the daemon, then closes the kept open (errors are ignored: a
    /// dead daemon has no cache).
    pub fn send(self) {
        let m = mounts::all().get(self.mount);
        match (self.notice, m) {
            (Some(Notice::Handle(req)), Some(m)) => {
                let gone = matches!(m.call(&req), Err(e) if e.raw_os_error() == Some(libc::EBADF));
                // A handle of a daemon that was replaced since (failover):
                // its successor still has to drop the kernel's cached size,
                // so it is told as for an adoption without a handle, proven
                // on the kept open (which it took over).
                if gone && matches!(req, Request::Closed { wrote: true, .. }) {
                    if let Some(fd) = self.kept.and_then(|k| k.live(self.dev, self.ino)) {
                        let _ = m.call_proven(sys::fd(fd), |proof| Request::Changed { proof });
                    }
                }
            }
            (Some(Notice::Changed), Some(m)) => {
                // The proof must come from the kept open, before it closes:
                // holding it is what the daemon believes.
                match self.kept.and_then(|k| k.live(self.dev, self.ino)) {
                    Some(fd) => {
                        let _ = m.call_proven(sys::fd(fd), |proof| Request::Changed { proof });
                    }
                    None => sys::log(format_args!(
                        "ino {}: written without a kept mount open; readers through the \
                         mount may see its old size until the kernel's cache expires",
                        self.ino
                    )),
                }
            }
            _ => {}
        }
        if let Some(k) = self.kept {
            close_kept(k, self.dev, self.ino);
        }
    }
}

/// Bookkeeping for `fd` being closed (or replaced by `dup2`): returns the
/// message for the daemon if this was the last descriptor of a writable
/// adoption. Call before the real close, send after it.
pub fn closing(fd: RawFd) -> Option<Closed> {
    if crate::in_vfork_child() {
        return None;
    }
    let s = state(fd);
    set_state(fd, UNKNOWN);
    if s == UNKNOWN || s == OTHER {
        return None;
    }
    let entry = remove(fd)?;
    let mut inner = entry.inner.lock();
    inner.fds.retain(|&f| f != fd);
    if !inner.fds.is_empty() {
        // POSIX: closing any descriptor of a file drops the process's
        // record locks on it; the kernel does so for the mount's open only
        // when that open is closed, which is later.
        if POSIX_LOCKS.load(Ordering::Relaxed) {
            if let Some(k) = inner.kept.and_then(|k| k.live(entry.dev, entry.ino)) {
                unlock_posix(k);
            }
        }
        return None;
    }
    let mut lost = false;
    let notice = match inner.lent.take() {
        Some(l) => {
            // Before the real close: its FLUSH is where the file system
            // persists the map.
            if let Some(m) = mounts::all().get(entry.mount) {
                lost = !push_map(m, &l, inner.kept.and_then(|k| k.live(entry.dev, entry.ino)));
            }
            end_lending(&l);
            (!l.is_copy()).then(|| {
                Notice::Handle(Request::Closed {
                    handle: l.handle(),
                    wrote: l.wrote(),
                })
            })
        }
        None => {
            let notice = closed_notice(&inner.status);
            if notice.is_some() {
                WRITABLE.fetch_sub(1, Ordering::Relaxed);
            }
            notice
        }
    };
    let kept = inner.kept.take();
    (notice.is_some() || kept.is_some()).then_some(Closed {
        mount: entry.mount,
        dev: entry.dev,
        ino: entry.ino,
        kept,
        notice,
        lost,
    })
}

fn closed_notice(status: &Status) -> Option<Notice> {
    match *status {
        Status::Adopted {
            handle: 0,
            writable: true,
        } => Some(Notice::Changed),
        Status::Adopted {
            handle,
            writable: true,
        } => Some(Notice::Handle(Request::Closed {
            handle,
            wrote: true,
        })),
        _ => None,
    }
}

/// Set once this process took a record lock through the shim (so closes
/// need to drop them, see [`closing`]).
static POSIX_LOCKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Drops every record lock this process holds on the file of `fd`.
fn unlock_posix(fd: RawFd) {
    let mut l = sys::record_lock(libc::F_UNLCK, libc::SEEK_SET, 0, 0);
    let _ = sys::fcntl_lock(fd, libc::F_SETLK, &mut l);
}

/// The descriptor locks of `fd` are taken on: the mount's open kept for an
/// adopted descriptor (so they are the mount's locks, seen by every process
/// using it), else `fd` itself. `posix` notes that a record lock is taken.
pub fn lock_target(fd: RawFd, posix: bool) -> RawFd {
    if state(fd) != ADOPTED {
        return fd;
    }
    let Some(e) = get(fd) else {
        return fd;
    };
    let mut inner = e.inner.lock();
    match inner.kept.and_then(|k| k.live(e.dev, e.ino)) {
        Some(k) => {
            inner.locked = true;
            if posix {
                POSIX_LOCKS.store(true, Ordering::Relaxed);
            }
            k
        }
        None => fd,
    }
}

/// Gives back descriptor numbers the shim holds for itself, for an
/// application that ran out of them (`EMFILE`): first the map cache's, then
/// the kept mount opens of adoptions that took no lock (their `release`
/// runs now instead of at the application's close). True if any was freed.
pub fn reclaim() -> bool {
    if mcache::clear() > 0 {
        return true;
    }
    let mut freed = false;
    for (_, e) in entries() {
        let mut inner = e.inner.lock();
        // A lent open's kept descriptor is the open itself (the
        // application's number holds a placeholder).
        if inner.locked || inner.lent.is_some() {
            continue;
        }
        if let Some(k) = inner.kept.take() {
            close_kept(k, e.dev, e.ino);
            freed = true;
        }
    }
    freed
}

/// `new` now refers to what `old` refers to (`dup`, `dup2`, `fcntl(F_DUPFD)`).
/// In a signal handler, `new` joins `old`'s entry only if the entry's list
/// has room without allocating (it keeps some); otherwise it is served by
/// the kernel as the copy it is (a lent one still by its map).
pub fn duped(old: RawFd, new: RawFd) {
    if new < 0 || old == new {
        return;
    }
    undefer(new);
    forget_stale(new);
    let handler = in_handler();
    let mut s = state(old);
    if s == UNKNOWN && !handler {
        s = classify(old);
    }
    let tracked = matches!(s, PENDING | ADOPTED | MOUNT | ENGINE);
    let Some(e) = get(old).filter(|_| tracked) else {
        set_state(new, if s == OTHER { OTHER } else { UNKNOWN });
        return;
    };
    let mut inner = e.inner.lock();
    let listed = !handler || inner.fds.len() < inner.fds.capacity();
    if listed {
        inner.fds.push(new);
        if !handler {
            inner.fds.reserve(HANDLER_ROOM / 2);
        }
    }
    if (s == ENGINE || s == MOUNT)
        && inner.lent.is_none()
        && matches!(inner.status, Status::Mount(_))
        && placeholder(new)
    {
        // Handed back to the mount (by another thread's fork or
        // spawn) between the application's dup and now: `new` is a
        // copy of the placeholder the hand-back replaced under
        // `old` only. It gets the mount's open too.
        if let Err(err) = sys::dup_over(sys::fd(old), new, sys::cloexec(new)) {
            sys::log(format_args!(
                "fd {new}: cannot put the mount's open back ({err}); it stays a placeholder"
            ));
        }
        s = MOUNT;
    }
    let lent = inner.lent.clone();
    drop(inner);
    if listed {
        insert(new, e);
    }
    match lent {
        Some(l) if s == ENGINE => set_engine(new, &l),
        // Not on the entry's list, a pending copy would miss the entry's
        // adoption: it stays on the mount.
        _ if s == PENDING && !listed => set_state(new, MOUNT),
        _ => set_state(new, s),
    }
}

/// `fd` is a writable lending's placeholder: an open with neither read nor
/// write access (see [`crate::lent`]).
fn placeholder(fd: RawFd) -> bool {
    rustix::fs::fcntl_getfl(sys::fd(fd)).is_ok_and(|f| f.bits() & libc::O_ACCMODE as u32 == 3)
}

/// Why a descriptor shared with another process stays on the mount.
pub const SHARED: &str = "shared with a forked process";

/// Pins every pending entry to the mount (before `fork`): parent and child
/// then share the mount's open file description, offset included, as
/// without the shim, and neither adopts it later (an adoption gives one
/// process a description of its own). Adopting here instead would make
/// every fork of a process holding a mount file (a shell's redirection)
/// pay a daemon round trip. The pin follows the descriptors across `exec`
/// ([`export_adopted`]).
pub fn pin_all_pending() {
    for (_, e) in entries() {
        let mut inner = e.inner.lock();
        if inner.status != Status::Pending {
            continue;
        }
        inner.status = Status::Mount(SHARED.to_string());
        for &fd in &inner.fds {
            set_state(fd, MOUNT);
        }
        report::count_fallback(SHARED);
    }
}

/// Messages for every writable adoption still open (at exit).
pub fn all_open_writable() -> Vec<Closed> {
    let mut out = Vec::new();
    for (_, e) in entries() {
        let inner = e.inner.lock();
        if let Some(notice) = closed_notice(&inner.status) {
            // The kept open proves a handle-less change; the process is
            // exiting, so closing it with the message costs nothing.
            let kept = match notice {
                Notice::Changed => inner.kept,
                Notice::Handle(_) => None,
            };
            out.push(Closed {
                mount: e.mount,
                dev: e.dev,
                ino: e.ino,
                kept,
                notice: Some(notice),
                lost: false,
            });
        }
    }
    out
}

/// Status of `fd` for tests and the report: the state and, for [`MOUNT`],
/// why.
pub fn describe(fd: RawFd) -> (u8, Option<String>) {
    let s = state(fd);
    let reason = get(fd).and_then(|e| match &e.inner.lock().status {
        Status::Mount(r) => Some(r.clone()),
        _ => None,
    });
    (s, reason)
}

/// No descriptor of this process is a mapfs file the shim knows
/// (nothing pending, adopted, lent or pinned).
pub fn is_empty() -> bool {
    TABLE.is_empty()
}

/// Closes of lent descriptors made where the shim may not lock (a signal
/// handler, or a handler that interrupted the shim): the map must reach
/// the daemon before the placeholder is closed, so the descriptor stays
/// open (the program sees the close succeed) and is closed at the next
/// entry into the shim ([`run_deferred_closes`]) or at exit. Slots hold
/// descriptor numbers (-1: free).
static DEFERRED: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
/// How many [`DEFERRED`] slots are taken (a fast "none").
static DEFERRED_N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `fd` is being closed where the shim may not take a lock or allocate:
/// only lock-free bookkeeping. Returns `true` when the real close must not
/// happen now (a lent descriptor, deferred, see [`DEFERRED`]). Another
/// descriptor's entry keeps naming `fd` until the number is opened again
/// ([`opened`] drops it then).
pub fn closing_lock_free(fd: RawFd) -> bool {
    if crate::in_vfork_child() {
        return false;
    }
    match state(fd) {
        PENDING | ADOPTED | MOUNT | ENGINE => {
            if defer_close(fd) {
                return true;
            }
            if state(fd) == ENGINE {
                // No slot left: the close happens now; the map reaches the
                // daemon at the mount's flush only as far as it had before.
                return false;
            }
            if let Some(i) = index(fd) {
                STATE[i].store(UNKNOWN, Ordering::Release);
            }
            false
        }
        UNKNOWN => false,
        _ => {
            if let Some(i) = index(fd) {
                // Not set_state: leaving ENGINE frees memory, which a
                // handler must not do (ENGINE is handled above).
                STATE[i].store(UNKNOWN, Ordering::Release);
            }
            false
        }
    }
}

/// Puts `fd` on the [`DEFERRED`] list; false if it is full.
fn defer_close(fd: RawFd) -> bool {
    for slot in &DEFERRED {
        if slot
            .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            DEFERRED_N.fetch_add(1, Ordering::Release);
            return true;
        }
    }
    false
}

/// In a signal handler, before `dup2`/`dup3` replace tracked descriptor
/// `fd`: its open moves to a number of the shim's, whose close is deferred
/// like a handler's `close` (the bookkeeping of a tracked close needs the
/// daemon), so the replacement closes nothing the shim still has to see.
/// False (nothing moved) if `fd` is not tracked or there is no room.
pub fn move_aside(fd: RawFd) -> bool {
    let s = state(fd);
    if !matches!(s, PENDING | ADOPTED | MOUNT | ENGINE) || crate::in_vfork_child() {
        return false;
    }
    // A slot is claimed first (CLAIMED, which no one else takes) and
    // filled last: another thread running the deferred closes must not
    // close the new number before its bookkeeping is done.
    let Some(slot) = DEFERRED.iter().find(|slot| {
        slot.compare_exchange(-1, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return false;
    };
    let aside = match sys::dup_high(fd) {
        Ok(a) => std::os::fd::IntoRawFd::into_raw_fd(a),
        Err(_) => {
            slot.store(-1, Ordering::Release);
            return false;
        }
    };
    if index(aside).is_none() {
        // SAFETY: the duplicate made above, known to no one else.
        unsafe { rustix::io::close(aside) };
        slot.store(-1, Ordering::Release);
        return false;
    }
    if let Some(e) = remove(fd) {
        insert(aside, e.clone());
        let mut inner = e.inner.lock();
        for f in inner.fds.iter_mut().filter(|f| **f == fd) {
            *f = aside;
        }
        let lent = inner.lent.clone();
        drop(inner);
        match lent {
            Some(l) if s == ENGINE => set_engine(aside, &l),
            _ => set_state(aside, s),
        }
        let_go(Some(e));
    } else {
        set_state(aside, s);
    }
    set_state(fd, UNKNOWN);
    slot.store(aside, Ordering::Release);
    DEFERRED_N.fetch_add(1, Ordering::Release);
    true
}

/// A [`DEFERRED`] slot taken by [`move_aside`] but not filled yet.
const CLAIMED: RawFd = -2;

/// The descriptor numbers closed while deferred are taken out of the list
/// when the program reuses them first (a `dup2` onto one, see
/// [`duped`] and [`opened`]).
pub fn undefer(fd: RawFd) {
    if DEFERRED_N.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in &DEFERRED {
        if slot
            .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            DEFERRED_N.fetch_sub(1, Ordering::Release);
        }
    }
}

/// Runs the closes deferred by [`closing_lock_free`] (with the guard held).
pub fn run_deferred_closes() {
    RETIRED.drain();
    RETIRED_LENT.drain();
    if DEFERRED_N.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in &DEFERRED {
        let fd = slot.load(Ordering::Acquire);
        if fd < 0
            || slot
                .compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        DEFERRED_N.fetch_sub(1, Ordering::Release);
        sys::keep_errno(|| {
            let note = closing(fd);
            // SAFETY: the program closed this descriptor; the shim kept it
            // open only until now (a raw close: libc's would be the hook).
            unsafe { rustix::io::close(fd) };
            if let Some(n) = note {
                n.send();
            }
        });
    }
}

/// Marks `fd` as not a mapfs file without looking (a duplicate of one).
pub fn mark_other(fd: RawFd) {
    set_state(fd, OTHER);
}

/// Number of writable adoptions open in this process (a fast "none" for the
/// path-stat hooks).
static WRITABLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// True if this process holds a writable adoption (cheap).
#[inline]
pub fn has_writable() -> bool {
    WRITABLE.load(Ordering::Relaxed) != 0
}

/// The size and times this process's own writes gave file `(dev, ino)`, if
/// it holds a writable adoption of it. A `stat` by path goes through the
/// mount, whose cached attributes do not see writes made on the backing
/// file until the close; the writer itself must see them at once.
pub fn own_written_attrs(dev: u64, ino: u64) -> Option<rustix::fs::Stat> {
    if WRITABLE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let (fd, lent) = {
        let (_, found) = entries().into_iter().find(|(_, e)| {
            e.dev == dev && e.ino == ino && {
                let inner = e.inner.lock();
                matches!(inner.status, Status::Adopted { writable: true, .. })
                    || inner.lent.as_ref().is_some_and(|l| l.writable())
            }
        })?;
        let inner = found.inner.lock();
        (*inner.fds.first()?, inner.lent.clone())
    };
    let mut st = rustix::fs::fstat(sys::fd(fd)).ok()?;
    if let Some(l) = lent {
        patch_lent_size(&l, &mut st.st_size, &mut st.st_blocks);
    }
    Some(st)
}

/// Reports the size a lent open sees (the mount's is older than its
/// writes); blocks are estimated from it, as the map's backing space is
/// spread over several files.
pub fn patch_lent_size(lent: &Lent, size: &mut i64, blocks: &mut i64) {
    if let Ok(sz) = lent.size() {
        *size = sz as i64;
        *blocks = (*blocks).max((sz as i64 + 511) / 512);
    }
}

/// Environment variable handing adopted descriptors to the next program
/// image across `exec` (see [`export_adopted`]).
pub const HANDOFF_ENV: &str = "MAPFS_PRELOAD_ADOPTED";

/// Describes the adopted descriptors that survive `exec` (no `FD_CLOEXEC`):
/// `fd,mount_dev,ino,backing_dev,backing_ino,writable,kept;...` (`kept` 0
/// when none), and those pinned to the mount as `fd,mount_dev,ino`. After `exec` they are plain backing-file descriptors; the new
/// image re-adopts them from this, so `fstat` keeps the mount's identity and
/// the last close still tells the daemon. The mount's open kept for such a
/// descriptor is handed on too (its `FD_CLOEXEC` is cleared here; the
/// numbers are returned for [`exec_failed`]), so locks and the file
/// system's `release` keep following the application's descriptors.
pub fn export_adopted() -> (String, Vec<RawFd>) {
    // The new image starts with the mount's opens; it may borrow them again.
    // (A vfork child reads the tables only: its parent handed everything
    // back before the vfork.)
    if !crate::in_vfork_child() {
        hand_back_all("exec");
    }
    // Each export: the descriptor, the identity of the object it refers to
    // (the backing file of an adoption, the mount file of a pinned one),
    // and the rest of its description.
    let mut exports: Vec<(RawFd, (u64, u64), String)> = Vec::new();
    let mut handed = Vec::new();
    let vfork_child = crate::in_vfork_child();
    let mut filed = Vec::new();
    TABLE.for_each(|fd, e| filed.push((fd as RawFd, e)));
    for (fd, e) in filed {
        let (writable, kept) = {
            let inner = e.inner.lock();
            match &inner.status {
                Status::Adopted { writable, .. } => (*writable, inner.kept),
                Status::Mount(why) if why == SHARED => {
                    // Pinned to the mount: the new image keeps it there.
                    exports.push((fd, (e.dev, e.ino), format!("{},{}", e.dev, e.ino)));
                    continue;
                }
                _ => continue,
            }
        };
        let Ok(b) = sys::identity(fd) else {
            continue;
        };
        if !vfork_child && sys::cloexec(fd) {
            continue;
        }
        let kept = kept
            .and_then(|k| k.live(e.dev, e.ino))
            .filter(|&k| sys::set_cloexec(k, false).is_ok())
            .inspect(|&k| handed.push(k))
            .unwrap_or(0);
        exports.push((
            fd,
            (b.dev, b.ino),
            format!(
                "{},{},{},{},{},{kept}",
                e.dev,
                e.ino,
                b.dev,
                b.ino,
                u8::from(writable)
            ),
        ));
    }
    if vfork_child && !exports.is_empty() {
        exports = in_vfork_child_numbers(exports);
    }
    let parts: Vec<String> = exports
        .into_iter()
        .filter(|(fd, _, _)| vfork_child || !sys::cloexec(*fd))
        .map(|(fd, _, rest)| format!("{fd},{rest}"))
        .collect();
    (parts.join(";"), handed)
}

/// The exports of a `vfork` child under the numbers it gave them: its
/// `dup2`s and `close`s went untracked (they would have edited its parent's
/// tables), so its descriptors are matched to the parent's by the object
/// they refer to. Descriptors marked close-on-exec are left out.
fn in_vfork_child_numbers(
    exports: Vec<(RawFd, (u64, u64), String)>,
) -> Vec<(RawFd, (u64, u64), String)> {
    let Ok(dir) = rustix::fs::openat(
        rustix::fs::CWD,
        "/proc/self/fd",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return Vec::new();
    };
    let dir_fd = std::os::fd::AsRawFd::as_raw_fd(&dir);
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        if fd == dir_fd || state(fd) == SHIM || sys::cloexec(fd) {
            continue;
        }
        let Ok(id) = sys::identity(fd) else {
            continue;
        };
        if let Some((_, ident, rest)) = exports.iter().find(|(_, i, _)| *i == (id.dev, id.ino)) {
            out.push((fd, *ident, rest.clone()));
        }
    }
    out
}

/// Makes the kept opens [`export_adopted`] readied for an `exec` that then
/// failed close-on-exec again, so later children do not inherit them.
pub fn exec_failed(handed: &[RawFd]) {
    for &k in handed {
        if state(k) == SHIM {
            let _ = sys::set_cloexec(k, true);
        }
    }
}

/// Takes over the descriptors an earlier image of this process adopted
/// ([`export_adopted`]); each is checked to still be the same backing file.
/// Descriptors that shared a kept mount open share one entry again.
pub fn import_adopted(spec: &str) {
    let mut by_kept: std::collections::HashMap<RawFd, Arc<Entry>> =
        std::collections::HashMap::new();
    for part in spec.split(';').filter(|p| !p.is_empty()) {
        let v: Vec<u64> = part.split(',').filter_map(|x| x.parse().ok()).collect();
        if let [fd, dev, ino] = v[..] {
            import_pinned(fd, dev, ino);
            continue;
        }
        let [fd, dev, ino, bdev, bino, w, kept] = v[..] else {
            continue;
        };
        let (Ok(fd), Ok(kept)) = (RawFd::try_from(fd), RawFd::try_from(kept)) else {
            continue;
        };
        match sys::identity(fd) {
            Ok(id) if id.dev == bdev && id.ino == bino && state(fd) == UNKNOWN => {}
            _ => continue,
        }
        let Some(mount) = mounts::by_dev(dev) else {
            continue;
        };
        if let Some(e) = by_kept.get(&kept).filter(|_| kept != 0) {
            e.inner.lock().fds.push(fd);
            insert(fd, e.clone());
            set_state(fd, ADOPTED);
            continue;
        }
        let kept = match sys::identity(kept) {
            Ok(id) if kept != 0 && id.dev == dev && id.ino == ino => {
                let _ = sys::set_cloexec(kept, true);
                set_state(kept, SHIM);
                Some(Kept { fd: kept })
            }
            _ => None,
        };
        let writable = w == 1;
        let status = Status::Adopted {
            handle: 0,
            writable,
        };
        let e = new_entry(mount, dev, ino, fd, status, kept);
        if let Some(k) = kept {
            by_kept.insert(k.fd, e.clone());
        }
        insert(fd, e);
        if writable {
            WRITABLE.fetch_add(1, Ordering::Relaxed);
        }
        set_state(fd, ADOPTED);
    }
}

/// A descriptor the previous image had pinned to the mount (see
/// [`pin_all_pending`]), if it still is that mount file.
fn import_pinned(fd: u64, dev: u64, ino: u64) {
    let Ok(fd) = RawFd::try_from(fd) else {
        return;
    };
    match sys::identity(fd) {
        Ok(id) if id.dev == dev && id.ino == ino && state(fd) == UNKNOWN => {}
        _ => return,
    }
    let Some(mount) = mounts::by_dev(dev) else {
        return;
    };
    let e = new_entry(mount, dev, ino, fd, Status::Mount(SHARED.to_string()), None);
    insert(fd, e);
    set_state(fd, MOUNT);
}

/// Marks `fd` as the shim's own.
pub fn claim_shim_fd(fd: RawFd) {
    set_state(fd, SHIM);
}

/// `fd` is no longer the shim's.
pub fn release_shim_fd(fd: RawFd) {
    if state(fd) == SHIM {
        set_state(fd, UNKNOWN);
    }
}

/// Forgets what `fd` was (closed by a call that needs no other bookkeeping).
pub fn mark_unknown(fd: RawFd) {
    set_state(fd, UNKNOWN);
}
