//! The thin FUSE adapter: every callback resolves inodes to paths, calls the
//! [`FileSystem`] (namespace, open/create/release) or the data engine (read,
//! write, fsync...), and maps `Ok` to a reply and `Err` to its errno.
//!
//! Data executors:
//! - *daemon*: the engine runs here, on the [`DataFile`] of the open.
//! - *passthrough*: for whole-file 1-to-1 maps the backing file is registered
//!   with the kernel (`FUSE_DEV_IOC_BACKING_OPEN`) and the kernel does read,
//!   write and mmap itself. All opens of an inode share one backing id (an
//!   open that finds another file under the name is answered `ESTALE`, so
//!   the kernel looks the name up again: `register_open`). If the
//!   kernel refuses once, passthrough is switched off for the mount with one
//!   log line and the daemon executor takes over.
//!
//! Kernel caching: attributes and entries are cached for `ttl` (1 s by
//! default, a year with `mapfs mount --exclusive`); changes made in the
//! backing directory behind the mount's back show after that. Changes the
//! kernel is not told of by a reply (a shim client's writes) are
//! invalidated by the daemon ([`OpenRegistry::invalidate`]). In daemon mode the kernel's writeback cache is on, so the
//! kernel owns file size and mtime while pages are dirty.
//!
//! Locks (`flock`, POSIX) are handled by the kernel locally on the mount: they
//! are not negotiated with the daemon.
//!
//! Permissions are checked twice: every callback acts on the backing store
//! as the caller ([`Ctx`]), and the kernel checks mode bits and ACLs first
//! (`FUSE_POSIX_ACL`, which also turns on `default_permissions`; every
//! mount has that option too, see [`mod@crate::mount`]): opens of FIFOs,
//! sockets and device nodes never reach the daemon, so only the kernel can
//! check them. Two kernel habits are undone where they would make the
//! daemon's check stricter than native: the open for `execve` of a file the
//! caller may execute but not read is made by the daemon after an execute
//! check as the caller, and the explicit mtime the writeback cache adds to
//! a `truncate` by path (which needs ownership) is dropped. An open file
//! whose name is removed keeps the attributes the name last had for
//! `fstat` ([`Shared`]'s `unlinked`).
//!
//! Map-cache tokens (shim clients, [`mapfs::mapcache`]): the adapter owns the
//! generation table ([`MapTokens`]) and keeps the rule *a token read after
//! the `open(2)` through the mount returned equals the token a client cached
//! its map under only if the daemon has seen no change of that inode's map,
//! size or name since*. It bumps an inode after the change is applied and
//! before replying to the request that made it: open/create with a map (or
//! backing file) other than the last seen, or writable or truncating;
//! create and mknod (a reused inode number); every daemon write, fallocate,
//! copy_file_range into it and size change; release with another final map;
//! unlink, rmdir and rename (both inodes); forget; and a shim client's close
//! of a writable adoption or its final map. `release` reaches the daemon
//! after `close(2)` returned (the kernel sends it asynchronously), which is
//! why writable *opens* bump, and the release of one does not.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags as FuseOpenFlags,
    RenameFlags as FuseRenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use mapfs::engine::{self, DataFile};
use mapfs::housekeeping::Bell;
use mapfs::{
    Attr, Capabilities, Ctx, DataMap, Error, FileKind, FileSystem, OpenFlags, Opened, RenameFlags,
    Result, SetAttr, TimeSet,
};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

mod names;
mod resume;

use crate::control::proofs::Proofs;
use crate::control::tokens::MapTokens;
use crate::failover::records::OpenKind;
use crate::handles::{Handles, OpenDir, OpenFile, Share, SizeChange};
use crate::inodes::{Inodes, ROOT};
use crate::ratelimit::RateLimited;
use crate::registry::{OpenInfo, OpenRegistry};
use crate::stats::{failed, Counters, Event, Op};

/// How data requests are executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMode {
    /// Kernel passthrough where the map allows it, the daemon elsewhere.
    Auto,
    /// Every read and write runs in the daemon.
    Daemon,
    /// Kernel passthrough for whole-file maps, required: `mapfs mount`
    /// refuses a mount where the kernel does not grant it. An open the
    /// kernel refuses later is still served by the daemon, as with `Auto`.
    Passthrough,
}

impl std::str::FromStr for DataMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(DataMode::Auto),
            "daemon" => Ok(DataMode::Daemon),
            "passthrough" => Ok(DataMode::Passthrough),
            _ => Err(format!(
                "unknown data mode {s:?} (expected auto, daemon or passthrough)"
            )),
        }
    }
}

/// Adapter settings.
#[derive(Debug, Clone)]
pub struct AdapterOptions {
    /// Data executor choice.
    pub data: DataMode,
    /// How long the kernel may cache attributes.
    pub ttl: Duration,
    /// How long the kernel may cache names. Without `default_permissions`
    /// the kernel checks no directory search permission on a cached name, so
    /// a mount shared by several users would need 0 here (mapfs mounts
    /// always have it, see [`mod@crate::mount`]).
    pub entry_ttl: Duration,
    /// In daemon mode, let the kernel buffer writes (much faster small
    /// writes). The kernel then owns file sizes and never takes them from the
    /// daemon while the inode is cached, so writes made outside this mount
    /// (shim clients, the backing dir, other nodes) show their new size late.
    pub writeback_cache: bool,
    /// With the writeback cache, every open of an inode shares one open of
    /// the file system and one map (see [`crate::handles::Share`]): needed
    /// when its maps are not whole-file (plfs), else the cache stays off.
    pub share_opens: bool,
}

impl Default for AdapterOptions {
    fn default() -> Self {
        AdapterOptions {
            data: DataMode::Auto,
            ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            writeback_cache: true,
            share_opens: false,
        }
    }
}

/// State shared by the FUSE callbacks and the control socket.
pub struct Shared {
    fs: Arc<dyn FileSystem>,
    inodes: Inodes,
    handles: Handles,
    opts: AdapterOptions,
    /// Cleared when the kernel refuses passthrough once.
    passthrough_ok: AtomicBool,
    writeback: AtomicBool,
    notifier: OnceLock<Notifier>,
    /// Shim clients' map-cache tokens (see the module docs).
    tokens: MapTokens,
    /// Held by every call that turns an inode into a path and acts on it,
    /// for the directories its path ends with (see [`names`]).
    names: names::NameLocks,
    /// What the file system promises, asked once.
    caps: Capabilities,
    /// Proofs of possession issued to shim clients (see
    /// [`crate::control::proofs`]).
    proofs: Proofs,
    /// File system name and backing directory, for `Status`.
    identity: OnceLock<(String, String)>,
    /// When the adapter was made (the mount's start).
    started: SystemTime,
    /// The last attributes of open files whose name was removed (unlink,
    /// rename over), by FUSE inode, until their last release: `fstat` of
    /// such an open must keep working, and a file whose bytes are spread
    /// over backing files (plfs) has no backing file that is the file, or
    /// none at all (an open of an empty file).
    unlinked: Mutex<std::collections::HashMap<u64, Attr>>,
    /// Request counters and latencies (`mapfs stats`).
    stats: Counters,
    /// The supervisor, which keeps what the kernel is told for the next
    /// daemon (see [`crate::failover`]).
    link: OnceLock<Arc<crate::failover::Link>>,
    /// Bytes of changes handed to the supervisor and not yet in a map the
    /// file system holds, over all opens (see `resume::JOURNAL_TOTAL_LIMIT`).
    journaled_total: std::sync::atomic::AtomicU64,
    /// Handles a dead daemon made and the kernel may ask for again (see
    /// [`Shared::made_before`]).
    resent: Mutex<resume::Resent>,
    /// Files whose pages a read-only open may keep (see
    /// [`crate::pagecache`]).
    pages: crate::pagecache::KeptPages,
    /// Held, the one of an inode's number modulo their count, by an open
    /// from looking for a [`crate::handles::Share`] to join to registering
    /// its own, when opens share (two first opens of an inode at once would
    /// otherwise make two), and by a release leaving a share (see
    /// [`Shared::release_file`]). Opens of one inode on such a mount are
    /// one at a time; opens of others rarely wait.
    joining: [Mutex<()>; JOIN_LOCKS],
    /// The bell of the file system's housekeeping thread, rung to end it.
    housekeeper: Option<Bell>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(bell) = &self.housekeeper {
            bell.stop();
        }
    }
}

/// How many locks [`Shared::joining`] spreads inodes over.
const JOIN_LOCKS: usize = 64;

/// The access mode of a placeholder open (see `Shared::open_placeholder`).
pub const PLACEHOLDER_ACCESS: i32 = 3;

/// Warnings any user of the mount can cause, each at most once per
/// interval (see [`crate::ratelimit`]).
static LENT_IO: RateLimited = RateLimited::new(Duration::from_secs(10));

/// Opens refused with `ESTALE` because the name's file was replaced behind
/// the mount while the kernel ran passthrough opens of the old one.
static STALE_OPENS: RateLimited = RateLimited::new(Duration::from_secs(10));
static RELEASE_FAILED: RateLimited = RateLimited::new(Duration::from_secs(10));

/// The `fuser::Filesystem` implementation.
pub struct Adapter(Arc<Shared>);

impl Adapter {
    /// An adapter for `fs`, whose root has the attributes `root`.
    pub fn new(fs: Arc<dyn FileSystem>, opts: AdapterOptions) -> Result<Self> {
        let root = fs.getattr(&Ctx::current(), Path::new("/"))?;
        let passthrough = opts.data != DataMode::Daemon;
        let caps = fs.capabilities();
        let pages = crate::pagecache::KeptPages::new(caps.only_this_mount_writes);
        let housekeeper = match (&caps.housekeeping, housekeeping_every(&caps)) {
            (Some(h), Some(every)) => Some(spawn_housekeeping(&fs, every, h.bell.as_deref())?),
            _ => None,
        };
        Ok(Adapter(Arc::new(Shared {
            fs,
            inodes: Inodes::new(root.ino),
            handles: Handles::default(),
            opts,
            passthrough_ok: AtomicBool::new(passthrough),
            writeback: AtomicBool::new(false),
            notifier: OnceLock::new(),
            tokens: MapTokens::new(),
            names: names::NameLocks::default(),
            caps,
            proofs: Proofs::default(),
            identity: OnceLock::new(),
            started: SystemTime::now(),
            unlinked: Mutex::new(std::collections::HashMap::new()),
            stats: Counters::from_env(),
            link: OnceLock::new(),
            journaled_total: std::sync::atomic::AtomicU64::new(0),
            resent: Mutex::default(),
            pages,
            joining: std::array::from_fn(|_| Mutex::new(())),
            housekeeper,
        })))
    }

    /// The state shared with the control socket.
    pub fn shared(&self) -> Arc<Shared> {
        self.0.clone()
    }
}

/// How often the file system wants its housekeeping, unless
/// `MAPFS_HOUSEKEEPING_MS` says otherwise (milliseconds; 0: never, for
/// tests of what a crash between two rounds leaves).
fn housekeeping_every(caps: &Capabilities) -> Option<std::time::Duration> {
    let every = caps.housekeeping.as_ref()?.every;
    match std::env::var("MAPFS_HOUSEKEEPING_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(0) => None,
        Some(ms) => Some(std::time::Duration::from_millis(ms)),
        None => Some(every),
    }
}

/// The nice value of the housekeeping thread: work between requests yields
/// the processor to requests. On two cores, a batch of moves at the
/// daemon's own priority (about 1.3 ms for 64 files) kept the thread that
/// was to serve the writer's next request waiting for its turn: `pack`
/// wrote small files 14% faster at 19 (five rounds, tmpfs). Still a share
/// of the processor, never none (not `SCHED_IDLE`): a move holds the
/// database's lock for its transaction, which requests then wait for.
const HOUSEKEEPING_NICE: i32 = 19;

/// Starts the thread that calls `fs`'s [`FileSystem::housekeeping`]: when
/// the file system rings the bell put in its `slot`
/// ([`mapfs::Housekeeping::bell`]), or else every `every`; until the bell
/// is stopped or the file system dropped. Returns the bell.
fn spawn_housekeeping(
    fs: &Arc<dyn FileSystem>,
    every: Duration,
    slot: Option<&OnceLock<Bell>>,
) -> Result<Bell> {
    let bell = Bell::new();
    let rung = slot.is_some_and(|slot| slot.set(bell.clone()).is_ok());
    let fs = Arc::downgrade(fs);
    let waits = bell.clone();
    std::thread::Builder::new()
        .name("mapfs-housekeeping".into())
        .spawn(move || {
            // On Linux a thread id names just that thread here.
            let me = rustix::thread::gettid();
            if let Err(e) = rustix::process::setpriority_process(Some(me), HOUSEKEEPING_NICE) {
                debug!("housekeeping keeps the daemon's priority: {e}");
            }
            housekeeping_loop(&fs, &waits, rung, every);
        })
        .map_err(|e| mapfs::Error::from(e).context("starting the housekeeping thread"))?;
    Ok(bell)
}

/// The housekeeping thread's rounds (see [`spawn_housekeeping`]).
fn housekeeping_loop(
    fs: &std::sync::Weak<dyn FileSystem>,
    bell: &Bell,
    rung: bool,
    every: Duration,
) {
    loop {
        if !rung {
            // A file system that rings nothing gets a round every `every`.
            bell.soon();
        }
        if !bell.wait(every) {
            return;
        }
        match fs.upgrade() {
            Some(fs) => fs.housekeeping(),
            None => return,
        }
    }
}

impl Shared {
    /// Gives the adapter the session's notifier (for cache invalidation).
    pub fn set_notifier(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Names what is mounted (file system, backing directory), for
    /// [`OpenRegistry::status`].
    pub fn describe(&self, fs: &str, backing: &Path) {
        let _ = self
            .identity
            .set((fs.to_string(), backing.display().to_string()));
    }

    /// Names where the mount is, so `Stats` can find the kernel's view of
    /// its connection.
    pub fn set_mountpoint(&self, mountpoint: &Path) {
        self.stats.set_mountpoint(mountpoint);
    }
}

thread_local! {
    /// Read buffer of a FUSE worker thread (only the bytes read are sent).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Flags of an open with a whole-file 1-to-1 map, or of a read-only open
/// (`flags`, its access mode and `O_TRUNC` as the application asked): the
/// daemon buffers nothing for it and locks are kept by the kernel, so
/// `close` need not wait for a FLUSH round trip (the kernel still flushes
/// its writeback cache itself). Other opens get a FLUSH at every `close(2)`,
/// where the file system persists the map (close-to-open: the kernel's
/// `release` may come after `close` returned and after another process's
/// `open`). A read-only open never changes the map (the kernel refuses its
/// writes, and a truncate by path that uses it persists at once), so it
/// has nothing to persist.
fn file_open_flags(data: &DataFile, flags: i32) -> FopenFlags {
    let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0;
    if data.whole_file_backing().is_some() || read_only {
        FopenFlags::FOPEN_NOFLUSH
    } else {
        FopenFlags::empty()
    }
}

/// Answers an `OPEN` with handle `fh`, run by the kernel on `backing` if
/// there is one.
fn answer_opened(reply: ReplyOpen, fh: u64, fopen: FopenFlags, backing: Option<&fuser::BackingId>) {
    match backing {
        Some(id) => reply.opened_passthrough(FileHandle(fh), fopen, id),
        None => reply.opened(FileHandle(fh), fopen),
    }
}

/// The entry of a name that does not exist: node id 0 tells the kernel so,
/// and it keeps a negative dentry for the entry TTL.
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 0,
    }
}

/// The daemon acting for itself (kernel-initiated changes).
const ROOT_CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};

/// The kernel's open of a file for `execve` (`__FMODE_EXEC` among the open
/// flags FUSE passes on), read-only.
fn is_exec_open(flags: i32) -> bool {
    const FMODE_EXEC: i32 = 0x20;
    flags & FMODE_EXEC != 0 && flags & libc::O_ACCMODE == libc::O_RDONLY
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// The errno to reply with for `e`; every error reply goes through here or
/// [`fail`], which is how the request's counters learn it failed.
fn errno(e: &Error) -> Errno {
    Errno::from_i32(failed(e.errno()))
}

/// `e`, noted as the current request's error (see [`errno`]).
fn fail(e: Errno) -> Errno {
    failed(e.code());
    e
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(s),
    })
}

/// With the writeback cache the kernel trusts its own mtime, so
/// `utimensat(UTIME_NOW)` reaches the daemon as atime = now plus an explicit
/// mtime of "now". Turning that mtime back into `Now` gives the caller the
/// permission check of `UTIME_NOW` (owner or write access), not that of an
/// explicit time (owner only).
fn utime_now_under_writeback(atime: Option<TimeSet>, mtime: Option<TimeSet>) -> Option<TimeSet> {
    match (atime, mtime) {
        (Some(TimeSet::Now), Some(TimeSet::At(t))) => {
            let now = SystemTime::now();
            let skew = now.duration_since(t).unwrap_or_else(|e| e.duration());
            if skew < Duration::from_secs(1) {
                Some(TimeSet::Now)
            } else {
                mtime
            }
        }
        _ => mtime,
    }
}

/// With the writeback cache the kernel also sends its own mtime (explicit,
/// "now") with every `truncate(2)` by path. Setting an explicit time needs
/// ownership, so a user who may write the file but does not own it would
/// get `EPERM`; the backing truncate, done as the caller, sets mtime and
/// ctime itself, as a native truncate does. So that mtime is dropped.
fn truncate_mtime_under_writeback(set: &SetAttr) -> Option<TimeSet> {
    match (set.size, set.atime, set.mtime) {
        (Some(_), None, Some(TimeSet::At(t))) => {
            let now = SystemTime::now();
            let skew = now.duration_since(t).unwrap_or_else(|e| e.duration());
            if skew < Duration::from_secs(1) {
                None
            } else {
                set.mtime
            }
        }
        _ => set.mtime,
    }
}

fn timespec(t: Option<TimeSet>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeSet::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => rustix::fs::Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as _,
            },
            Err(e) => {
                let d = e.duration();
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                rustix::fs::Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                }
            }
        },
    }
}

/// Sets the times of `set` on an open backing file.
fn set_file_times(file: &std::fs::File, set: &SetAttr) -> Result<()> {
    let ts = rustix::fs::Timestamps {
        last_access: timespec(set.atime),
        last_modification: timespec(set.mtime),
    };
    rustix::fs::futimens(file, &ts)?;
    Ok(())
}

/// Attributes of an open file from its backing file, for files whose path is
/// gone (unlinked while open).
fn attr_from_metadata(m: &std::fs::Metadata) -> Attr {
    use std::os::unix::fs::MetadataExt;
    let t = |s: i64, ns: i64| {
        if s >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(s as u64, ns as u32)
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
        }
    };
    Attr {
        ino: m.ino(),
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        kind: FileKind::from_mode(m.mode()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev(),
        blksize: m.blksize() as u32,
    }
}

impl Shared {
    /// The attributes to send the kernel for the inode it knows as `ino`
    /// (every reply carrying them goes through here, lookups and directory
    /// listings included; `a.ino` is the file system's number, which may
    /// differ, see [`Inodes`]). A file written through an open whose map is
    /// not whole-file 1-to-1 has the size that open gave it: the file system
    /// learns it only at flush.
    fn fuse_attr(&self, ino: u64, a: &Attr) -> FileAttr {
        let size = match a.kind {
            FileKind::File => self
                .handles
                .lent_size(ino)
                .or_else(|| self.handles.written_size(ino, a.size))
                .unwrap_or(a.size),
            _ => a.size,
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: a.blocks,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.ctime,
            kind: file_type(a.kind),
            perm: a.perm,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            flags: 0,
            blksize: a.blksize,
        }
    }

    /// Holds the names `ino`'s path ends with, shared: its own (for a
    /// directory, its entries) and its parent's (see [`names`]).
    fn hold_node(&self, ino: u64) -> names::NamesHeld<'_> {
        self.hold_node_and(ino, &[])
    }

    /// [`Shared::hold_node`], with the directories `also` held shared too.
    fn hold_node_and(&self, ino: u64, also: &[u64]) -> names::NamesHeld<'_> {
        // A file's parent changes when it is renamed, which holds its old
        // directory: once that is held, it is checked again.
        for _ in 0..8 {
            let parent = self.inodes.parent(ino);
            let mut shared = vec![ino, parent.unwrap_or(ino)];
            shared.extend_from_slice(also);
            let held = self.names.hold(&[], &shared);
            if self.inodes.parent(ino) == parent {
                return held;
            }
        }
        // Renamed back and forth all along: nothing moves while all is held.
        self.names.hold_all()
    }

    /// Holds directory `dir` for a call on a name in it: its entries
    /// (`exclusive` for a call that removes one) and its own name, in its
    /// parent. A directory moves only while all is held, so its parent
    /// stays.
    fn hold_dir(&self, dir: u64, exclusive: bool) -> names::NamesHeld<'_> {
        let up = self.inodes.parent(dir).unwrap_or(dir);
        if exclusive {
            self.names.hold(&[dir], &[up])
        } else {
            self.names.hold(&[], &[dir, up])
        }
    }

    /// Holds what `link` of `ino` as a name in `newparent` uses.
    fn hold_link(&self, ino: u64, newparent: u64) -> names::NamesHeld<'_> {
        let up = self.inodes.parent(newparent).unwrap_or(newparent);
        self.hold_node_and(ino, &[newparent, up])
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf> {
        // ESTALE, not ENOENT: the kernel holds an inode whose name was
        // removed or replaced (a rename over it); for a path-based call
        // the VFS then looks the name up again and finds what is there now.
        self.inodes
            .path(ino.0)
            .ok_or_else(|| Error::from_errno(libc::ESTALE))
    }

    /// The path of `name` in directory `parent`, for a trace event: taken
    /// when the request runs, since by the time the event is read the
    /// directory may be gone (`#INO/NAME` when it has no path).
    fn trace_path(&self, parent: INodeNo, name: &OsStr) -> Vec<u8> {
        let mut p = self.inodes.path(parent.0).map_or_else(
            || format!("#{}", parent.0).into_bytes(),
            |p| p.as_os_str().as_bytes().to_vec(),
        );
        if !p.ends_with(b"/") {
            p.push(b'/');
        }
        p.extend_from_slice(name.as_bytes());
        p
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Err(Error::invalid());
        }
        self.inodes
            .child_path(parent.0, name)
            .ok_or_else(Error::not_found)
    }

    /// Records the kernel's reference to `attr`'s file as `name` in
    /// `parent` and gives its attributes under the nodeid it gets.
    fn enter(&self, parent: INodeNo, name: &OsStr, attr: &Attr) -> FileAttr {
        // Names the table holds as this file's hard links are checked
        // first: one may name another file now (`Inodes::other_names`).
        // Asked as the daemon; a name it cannot check is dropped, which
        // costs a real hard link a second kernel inode at worst.
        for (p, n, path) in self.inodes.other_names(parent.0, name, attr.ino) {
            let same = self
                .fs
                .getattr(&Ctx::current(), &path)
                .is_ok_and(|a| a.ino == attr.ino);
            if !same {
                self.inodes.unname(p, &n, attr.ino);
            }
        }
        let ino = self.inodes.enter(parent.0, name, attr.ino);
        if self.pages.enabled() && !self.inodes.sole_node(ino) {
            // Writes through one kernel inode of the file do not reach the
            // other's pages.
            self.pages.written_outside(attr.ino);
        }
        self.fuse_attr(ino, attr)
    }

    /// Answers a `CREATE` with entry `fa` and handle `fh`, run by the
    /// kernel on `backing` if there is one.
    fn answer_created(
        &self,
        reply: ReplyCreate,
        fa: &FileAttr,
        fh: u64,
        fopen: FopenFlags,
        backing: Option<&fuser::BackingId>,
    ) {
        // One TTL serves entry and attributes here: the stricter one.
        let ttl = self.opts.entry_ttl.min(self.opts.ttl);
        match backing {
            Some(id) => {
                reply.created_passthrough(&ttl, fa, Generation(0), FileHandle(fh), fopen, id)
            }
            None => reply.created(&ttl, fa, Generation(0), FileHandle(fh), fopen),
        }
    }

    /// Replies with a new entry and records the kernel's reference.
    fn entry(&self, parent: INodeNo, name: &OsStr, attr: &Attr, reply: ReplyEntry) {
        let fa = self.enter(parent, name, attr);
        let ttl = self.attr_ttl(fa.ino.0);
        // fuser takes the attribute TTL first, then the entry's.
        reply.entry_with_ttls(&ttl, &self.opts.entry_ttl, &fa, Generation(0));
    }

    /// How long the kernel may cache the attributes of `ino`: not at all
    /// while a shim client writes it through its own map (its size changes
    /// where only the shared size page shows it).
    fn attr_ttl(&self, ino: u64) -> Duration {
        if self.handles.lent_size(ino).is_some() {
            Duration::ZERO
        } else {
            self.opts.ttl
        }
    }

    fn getattr_inner(&self, c: &Ctx, ino: INodeNo, fh: Option<FileHandle>) -> Result<Attr> {
        let by_path = self.path(ino).and_then(|p| self.fs.getattr(c, &p));
        match by_path {
            Err(e) if e.errno() == libc::ENOENT || e.errno() == libc::ESTALE => {
                // An open file whose name is gone still has attributes.
                // Another inode the kernel holds lost its file behind the
                // mount (removed by another host sharing the store, or in
                // the backing directory): ESTALE, on which the kernel looks
                // the name up again where it walked a path. ENOENT failed
                // `open(O_CREAT)` of a name another host removed and made
                // again, at the permission check's GETATTR after the lookup
                // (the kernel keeping no attributes: `-o hostid=`).
                let file = fh
                    .and_then(|fh| self.handles.file(fh.0))
                    .or_else(|| self.handles.any_file_of(ino.0))
                    .ok_or_else(|| {
                        if e.errno() == libc::ENOENT {
                            Error::from_errno(libc::ESTALE).context(format!("{e}"))
                        } else {
                            e
                        }
                    })?;
                if let Some(backing) = file.data.whole_file_backing() {
                    let mut attr = attr_from_metadata(&backing.metadata()?);
                    attr.ino = self.inodes.fs_ino(ino.0);
                    return Ok(attr);
                }
                // Its bytes are spread over backing files that are not the
                // file: mode, owner and times as the name last had them
                // (else times from the first backing file, owner from the
                // opener), size from the map.
                let files = file.data.files();
                let size = file.data.size()?;
                let known = self.unlinked.lock().get(&ino.0).copied();
                let mut attr = match (known, files.first()) {
                    (Some(a), _) => a,
                    (None, Some(first)) => {
                        let mut a = attr_from_metadata(&first.metadata()?);
                        a.uid = file.ctx.uid;
                        a.gid = file.ctx.gid;
                        a
                    }
                    (None, None) => return Err(Error::not_found()),
                };
                attr.ino = self.inodes.fs_ino(ino.0);
                attr.kind = mapfs::FileKind::File;
                attr.size = size;
                attr.blocks = size.div_ceil(512);
                attr.nlink = 0;
                Ok(attr)
            }
            other => other,
        }
    }

    /// The FUSE inode the kernel knows as `name` in `parent`, for bumping
    /// its map-cache token around a namespace change (the kernel looks a
    /// name up before it unlinks or renames it).
    fn ino_at(&self, parent: INodeNo, name: &OsStr) -> Option<u64> {
        self.inodes.child(parent.0, name)
    }

    /// The attributes of `path`, the name of FUSE inode `victim`, if that
    /// inode is open: taken before a call removes the name, for
    /// [`Shared::keep_unlinked`].
    fn attrs_if_open(&self, victim: Option<u64>, path: &Path) -> Option<(u64, Attr)> {
        let v = victim?;
        self.handles.any_file_of(v)?;
        Some((v, self.fs.getattr(&ROOT_CTX, path).ok()?))
    }

    /// Keeps the attributes of an open inode whose name is gone (see
    /// [`Shared::unlinked`]).
    fn keep_unlinked(&self, before: Option<(u64, Attr)>) {
        if let Some((v, a)) = before {
            if a.kind == FileKind::File {
                self.unlinked.lock().insert(v, a);
            }
        }
    }

    fn bump_opt(&self, ino: Option<u64>) {
        if let Some(ino) = ino {
            self.tokens.bump(ino);
        }
    }

    /// The open file of a FUSE handle (`EBADF` for an unknown one).
    /// Opens a *placeholder* of `ino` (an `open(2)` with access mode 3,
    /// neither read nor write, which needs permission for both): the
    /// descriptor a shim client puts under the application's number while
    /// it runs a writable open's map itself. Metadata calls (`fstat`,
    /// `fchmod`, locks, `ioctl`) work on it; reads, writes,
    /// `copy_file_range`, `fallocate`, `ftruncate` and `mmap` fail in the
    /// kernel (`EBADF`/`EACCES`), `lseek` and `pread` with `ESPIPE`
    /// (non-seekable), and `fsync` here with `EIO`: a call the client
    /// cannot see never gets an answer older than the client's writes. The
    /// file system is not asked anything: the handle reads, writes and
    /// proves nothing (the control socket lends only real opens), the kernel
    /// sends `OPEN` only for an inode it holds as a regular file, and it
    /// checked read and write permission for the open (`default_permissions`,
    /// on every mapfs mount). Asking the file system again cost two path
    /// walks per lent writer, tens of round trips on a network store.
    fn open_placeholder(&self) -> u64 {
        self.handles.add_placeholder()
    }

    fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>> {
        self.handles
            .file(fh.0)
            .ok_or_else(|| Error::from_errno(libc::EBADF))
    }

    /// The open file of a FUSE handle, for a data call through the mount:
    /// `EIO` while a shim client executes it with writes the daemon has not
    /// seen (see [`OpenFile::lent`]). The client's descriptor is then a
    /// placeholder (see [`Shared::open_placeholder`]) on which such calls
    /// fail in the kernel; only the client's own kept open could get here.
    fn data_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>> {
        let file = self.open_file(fh)?;
        // A read-only lent open's map cannot change in the client, so the
        // daemon's copy answers as the client would; a writable one's may be
        // older than the client's writes.
        if file.lent.load(Ordering::Acquire) && file.flags & libc::O_ACCMODE != libc::O_RDONLY {
            LENT_IO.log(|held_back| {
                warn!(
                    fh = fh.0,
                    held_back,
                    "I/O through the mount on an open a shim client is executing; refused"
                )
            });
            return Err(Error::from_errno(libc::EIO));
        }
        Ok(file)
    }

    /// Whether a new open of `ino` with this data should use passthrough
    /// (`writes`: the open may write).
    fn want_passthrough(&self, ino: u64, path: &Path, data: &DataFile, writes: bool) -> bool {
        let Some(backing) = data.whole_file_backing() else {
            return false;
        };
        // The kernel runs all opens of an inode in passthrough or all
        // through the daemon. An open here through the daemon means the
        // kernel holds no passthrough open of it any more: a backing id
        // still alive here belongs to an open closed in the kernel whose
        // release has not arrived yet, and a passthrough reply would fail
        // the open (`EIO`; seen under load: a reader opened right after an
        // undo writer of versions, while the previous reader's release was
        // on its way).
        if self.handles.has_daemon_open(ino) {
            return false;
        }
        // Passthrough writes run with the daemon's credentials, which would
        // not clear setuid/setgid bits; writers of such files go through the
        // daemon, which clears them as FUSE_WRITE_KILL_SUIDGID asks. Even
        // with a backing id alive: it may be a closed open's whose release
        // is on its way (a file written, made setuid and opened by another
        // user at once kept its bits after that user's write). If the kernel
        // does still run an open of the file by passthrough (opened before
        // the mode change), this writer's open fails (`EIO`) rather than
        // leave the bits on.
        // Asked only where the answer depends on it: a reader of an inode
        // with a backing id alive needs no `fstat`.
        // The file's mode is the file system's: a file system that keeps
        // its own modes (pack's database) backs a setuid file with a
        // backing file of the daemon's, 0600 (a write by another user kept
        // pack's bits), so both are asked.
        let setid_bits = libc::S_ISUID | libc::S_ISGID;
        let setid = || match backing.metadata() {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                m.mode() & setid_bits != 0
                    || self
                        .fs
                        .getattr(&ROOT_CTX, path)
                        .map_or(true, |a| u32::from(a.perm) & setid_bits != 0)
            }
            Err(_) => true,
        };
        let live = || self.handles.has_backing(ino);
        let allowed = || self.passthrough_ok.load(Ordering::Relaxed);
        if writes {
            !setid() && (live() || allowed())
        } else {
            live() || (allowed() && !setid())
        }
    }

    fn open_flags_for_fs(&self, flags: i32) -> i32 {
        // The daemon's own I/O is buffered: kernel page-cache writeback and
        // unaligned FUSE requests may reach any handle of the inode, and
        // would fail with EINVAL on an O_DIRECT backing fd. (Passthrough opens
        // get the application's flags from the kernel itself.)
        let mut flags = flags & !libc::O_DIRECT;
        if self.writeback.load(Ordering::Relaxed) {
            // With the writeback cache the kernel may read pages of a file
            // opened write-only, and it implements O_APPEND itself.
            if flags & libc::O_ACCMODE == libc::O_WRONLY {
                flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            flags &= !libc::O_APPEND;
        }
        if self.shares_opens() && flags & libc::O_ACCMODE == libc::O_RDONLY {
            // A shared open the file system can write lets the writers that
            // come later join it (the caller's own descriptor stays
            // read-only in the kernel).
            flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
        }
        flags
    }

    /// The [`Shared::joining`] lock of inode `ino`.
    fn join_lock(&self, ino: u64) -> &Mutex<()> {
        &self.joining[(ino % JOIN_LOCKS as u64) as usize]
    }

    /// Whether opens of an inode share one open of the file system (see
    /// [`crate::handles::Share`]).
    fn shares_opens(&self) -> bool {
        self.opts.share_opens && self.writeback.load(Ordering::Relaxed)
    }

    /// Opens with `flags`, widened from `asked`, or with `asked` where the
    /// widening is refused; returns the flags that opened.
    fn open_with_fallback(
        &self,
        flags: i32,
        f: impl Fn(OpenFlags) -> Result<Opened>,
        asked: i32,
    ) -> Result<(Opened, i32)> {
        match f(OpenFlags(flags)) {
            // Widening O_WRONLY to O_RDWR may be refused for a write-only
            // file, and O_RDONLY to O_RDWR (shared opens) for a read-only
            // one.
            Err(e)
                if matches!(e.errno(), libc::EACCES | libc::EPERM | libc::EROFS)
                    && flags != asked =>
            {
                f(OpenFlags(asked)).map(|o| (o, asked))
            }
            r => r.map(|o| (o, flags)),
        }
    }

    /// Answers an open of `ino` by joining the open `owner` shares (see
    /// [`crate::handles::Share`]): no open of the file system; `O_TRUNC`
    /// truncates the shared map.
    fn join_open(
        &self,
        req: &Request,
        ino: u64,
        flags: i32,
        owner: &OpenFile,
    ) -> Result<(u64, FopenFlags)> {
        let c = ctx(req);
        if flags & libc::O_TRUNC != 0 {
            // The kernel checked write permission for it.
            self.set_open_size(&c, ino, owner, 0)?;
        }
        let may_change = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        self.tokens.opened(ino, &owner.data, may_change);
        let fopen = file_open_flags(&owner.data, flags);
        let fh = self.handles.add_file(OpenFile::joining(owner, flags, c));
        if let Some(file) = self.handles.file(fh) {
            self.journal_file(&file, req.unique().0);
            self.test_die_before_answer(req, &file.path);
        }
        self.stats.add(Event::DaemonOpen, 1);
        Ok((fh, fopen))
    }

    /// Sets the size of open file `file` of `ino` through the engine, as
    /// `c` (`ftruncate`, `truncate` of an open file, `O_TRUNC`).
    fn set_open_size(&self, c: &Ctx, ino: u64, file: &OpenFile, sz: u64) -> Result<()> {
        // Changes of other opens kept by the supervisor must not be
        // written again after this size change (see `crate::failover`).
        self.persist_journaled_of(ino);
        // A file system that records what each open changed (plfs) can
        // tell a shrink from growth only against what it was last
        // handed: hand it the open's writes before they are cut.
        if sz < file.data.size().unwrap_or(0) {
            self.persist_map(file)?;
        }
        let truncated = mapfs::creds::as_caller(c, || file.data.truncate(sz));
        self.tokens.bump(ino);
        truncated?;
        self.changed(file, SizeChange::Set(sz));
        // Other opens of the file see the new size at their next open.
        self.persist_map(file)
    }

    /// Makes the handle of an open that `req` asked for (its caller's
    /// context and `unique` id, recorded for a successor).
    fn register_open(
        &self,
        req: &Request,
        ino: u64,
        path: PathBuf,
        flags: i32,
        (opened, fs_flags): (Opened, i32),
        open_backing: impl FnOnce(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> Result<(u64, Option<Arc<fuser::BackingId>>, FopenFlags)> {
        let c = &ctx(req);
        let unique = req.unique().0;
        let fs_handle = opened.handle;
        let data = Arc::new(DataFile::new(opened));
        let mut fopen = file_open_flags(&data, flags);
        let may_change = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        self.tokens.opened(ino, &data, may_change);
        let mut backing = None;
        if self.want_passthrough(ino, &path, &data, may_change) {
            let file = data.whole_file_backing().expect("whole-file map").clone();
            match self.handles.backing_for(ino, &file, || open_backing(&file)) {
                Ok(Some(id)) => backing = Some(id),
                Ok(None) => {
                    // The name now holds another file than the one the
                    // kernel runs this inode's opens on (it was replaced in
                    // the backing directory within the entry TTL). The
                    // kernel takes one backing file per inode, so this open
                    // would read and write the old one. ESTALE makes it
                    // look the name up afresh and retry: the lookup gives
                    // the new file its own inode.
                    let _ = self.fs.release(c, &path, fs_handle, &data.map());
                    STALE_OPENS.log(|held_back| {
                        warn!(
                            path = %path.display(),
                            held_back,
                            "a file replaced behind the mount while open in passthrough; \
                             the open is retried on the new file"
                        )
                    });
                    return Err(Error::from_errno(libc::ESTALE));
                }
                Err(e) => {
                    if self.passthrough_ok.swap(false, Ordering::Relaxed) {
                        warn!(
                            "kernel refused FUSE passthrough ({e}); this mount now runs all \
                             reads and writes in the daemon"
                        );
                    }
                }
            }
        }
        if self.pages.enabled() {
            let file_ino = self.inodes.fs_ino(ino);
            if backing.is_some() {
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    self.pages.written_outside(file_ino);
                }
            } else if !may_change
                && self
                    .pages
                    .open_read_only(file_ino, || self.may_be_written(ino))
            {
                fopen |= FopenFlags::FOPEN_KEEP_CACHE;
            }
        }
        let mut file = OpenFile::new(ino, path, flags, *c, fs_handle, data, backing.clone());
        if self.shares_opens() && backing.is_none() {
            file = file.in_share(Share::new(fs_flags & libc::O_ACCMODE != libc::O_RDONLY));
        }
        let fh = self.handles.add_file(file);
        if let Some(file) = self.handles.file(fh) {
            self.journal_file(&file, unique);
            self.test_die_before_answer(req, &file.path);
        }
        let executor = match backing {
            Some(_) => Event::PassthroughOpen,
            None => Event::DaemonOpen,
        };
        self.stats.add(executor, 1);
        Ok((fh, backing, fopen))
    }

    /// Hands the current map of an open that wrote to the file system
    /// ([`mapfs::FileSystem::flush`]); whole-file maps need nothing.
    fn persist_map(&self, file: &OpenFile) -> Result<()> {
        if file.data.whole_file_backing().is_some() {
            return Ok(());
        }
        // An open in a share hands over the share's one map, with what every
        // open in it changed (`file` itself may be out of the table already,
        // at its release); hand-overs of one map go one at a time.
        let _one_map = file.share.as_ref().map(|s| s.persisting.lock());
        let others = self.handles.sharing_with(file);
        let members: Vec<&OpenFile> = std::iter::once(file)
            .chain(others.iter().map(|o| &**o))
            .collect();
        if !members.iter().any(|m| m.wrote.load(Ordering::Relaxed)) {
            return Ok(());
        }
        // One at a time per open, map taken under the lock: a flush from
        // another thread (a forked child closing its inherited descriptor)
        // holding an older map must not land after a newer one.
        let mut held: Vec<_> = members
            .iter()
            .map(|m| (*m, m.persisting.lock(), self.handles.changes(m)))
            .collect();
        self.fs
            .flush(&file.ctx, &file.path, file.fs_handle, &file.data.map())?;
        for (m, logs, changes) in held.iter_mut() {
            self.handles.flushed(m, *changes);
            self.journal_flushed(m, logs);
        }
        Ok(())
    }

    /// Records a change through `file` (see [`Handles::note_change`]).
    fn changed(&self, file: &OpenFile, change: SizeChange) {
        file.wrote.store(true, Ordering::Relaxed);
        if file.data.whole_file_backing().is_none() {
            self.handles.note_change(file, change);
        } else if self.handles.written_size(file.ino, 0).is_some() {
            // A remap made this open whole-file (pack moves a growing file
            // to a backing file of its own): the backing file's size rules
            // now, not the changes it noted before.
            self.handles.forget_changes(file);
        }
    }

    fn remap_for<'a>(
        &'a self,
        file: &'a OpenFile,
    ) -> impl FnMut(&DataMap, u64, u64) -> Result<Opened> + 'a {
        move |map, off, len| {
            self.fs
                .remap(&file.ctx, &file.path, file.fs_handle, map, off, len)
        }
    }

    /// Clears setuid, and setgid where the kernel would (group-executable,
    /// or the writer is not in the file's group), after a change by
    /// `writer`, who lacks `CAP_FSETID`. The kernel's cached attributes of
    /// `ino` go with them: it keeps the mode for the attributes' TTL after
    /// a write, and `stat` showed the bits a file system that keeps its own
    /// modes (pack) had cleared.
    fn kill_suidgid(&self, ino: u64, path: &Path, writer: &Ctx) -> Result<()> {
        let attr = match self.fs.getattr(&ROOT_CTX, path) {
            Ok(a) => a,
            // Unlinked while open: nothing left to protect by name.
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut perm = u32::from(attr.perm);
        let before = perm;
        perm &= !libc::S_ISUID;
        if perm & libc::S_ISGID != 0
            && (perm & libc::S_IXGRP != 0 || !mapfs::creds::in_group(writer, attr.gid))
        {
            perm &= !libc::S_ISGID;
        }
        if perm != before {
            let set = SetAttr {
                mode: Some(perm),
                ..SetAttr::default()
            };
            self.fs.setattr(&ROOT_CTX, path, &set)?;
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
                self.stats.add(Event::Invalidation, 1);
            }
        }
        Ok(())
    }

    /// Whether kernel inode `ino`'s file may change where its pages do not
    /// see it: another kernel inode of the file, or an open that may write
    /// it (what [`KeptPages`](crate::pagecache::KeptPages) is told).
    fn may_be_written(&self, ino: u64) -> bool {
        !self.inodes.sole_node(ino) || self.handles.has_writer(ino)
    }

    /// Before the file system releases `file`, the last writable open of
    /// its inode and run by kernel passthrough: if the file system moves
    /// such a file to a map the daemon runs
    /// ([`Capabilities::leaves_whole_file_at_close`]) and it is small
    /// enough, its bytes go into the kernel's pages (`FUSE_NOTIFY_STORE`),
    /// which passthrough writes never filled, so that the next open keeps
    /// them instead of reading through the daemon. Done before the move:
    /// an open that comes meanwhile still gets the file by passthrough (and,
    /// if it may write, leaves the pages unclean); one that comes after
    /// writes through these pages.
    fn fill_pages_at_close(&self, file: &OpenFile) {
        // A larger threshold would copy megabytes at a close for a read
        // that may never come.
        let limit = self.caps.leaves_whole_file_at_close.min(1 << 20);
        let writable = file.flags & libc::O_ACCMODE != libc::O_RDONLY;
        if limit == 0 || !writable || file.backing.is_none() || !self.pages.enabled() {
            return;
        }
        let Some(backing) = file.data.whole_file_backing() else {
            return;
        };
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        let ino = file.ino;
        if self.may_be_written(ino) {
            return;
        }
        let (bytes, version) = match crate::pagecache::small_file_bytes(backing, limit) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(ino, "no pages filled at close: {e}");
                return;
            }
        };
        self.pages.filled(
            self.inodes.fs_ino(ino),
            || self.may_be_written(ino),
            || {
                if notifier.store(INodeNo(ino), 0, &bytes).is_err() {
                    return false;
                }
                // A truncate by path meanwhile (no open needed) changed the
                // file: the pages stored may hold what it cut.
                if !crate::pagecache::unchanged_since(backing, &version) {
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                    return false;
                }
                true
            },
        );
    }

    /// Ends open `fh` in the daemon and the file system. Returns its inode
    /// and its backing id (kernel passthrough), which the caller drops only
    /// after the journal says the open is released (the `release` request
    /// below): the last drop closes the id with the kernel, and a successor
    /// must never restore an open whose id the kernel no longer has.
    fn release_file(&self, fh: u64) -> Result<(u64, Option<Arc<fuser::BackingId>>)> {
        let Some(file) = self.handles.remove_file(fh) else {
            return Err(Error::from_errno(libc::EBADF));
        };
        // A client that vanished without ending its lending.
        self.handles.lent_with_size(file.ino, fh, None);
        // An open joining this share meanwhile (it found this open in the
        // table) is counted before this one leaves, or the file system's
        // open would be released under it.
        let last = file.share.as_ref().map(|share| {
            let _joins = self.join_lock(file.ino).lock();
            share.leave(fh)
        });
        let res = if last == Some(false) {
            // Others still use the file system's open: it keeps it, with
            // what this one wrote.
            self.persist_map(&file)
        } else {
            self.fill_pages_at_close(&file);
            let _all = file.share.as_ref().map(|s| s.persisting.lock());
            let _one = file.persisting.lock();
            let map = file.data.map();
            self.fs.release(&file.ctx, &file.path, file.fs_handle, &map)
        };
        self.handles.forget_changes(&file);
        self.journal_released_file(&file);
        let ino = file.ino;
        if self.handles.any_file_of(ino).is_none() {
            self.unlinked.lock().remove(&ino);
        }
        // Only a changed final map bumps here: a writable open bumped when
        // it was opened and daemon writes bump as they go, so a client that
        // re-opens after the write+close already misses; another bump now
        // (the kernel sends release after close(2) returned) would only
        // invalidate entries cached after it, for nothing.
        self.tokens.released(ino, &file.data, false);
        let backing = file.backing.clone();
        drop(file);
        if let Err(e) = &res {
            RELEASE_FAILED.log(|held_back| {
                warn!(
                    path = %self.inodes.path(ino).unwrap_or_default().display(),
                    held_back,
                    "release failed: {e}"
                )
            });
        }
        Ok((ino, backing))
    }
}

impl OpenRegistry for Shared {
    fn open(&self, fh: u64) -> Option<OpenInfo> {
        let f = self.handles.file(fh)?;
        let (map, files) = f.data.snapshot();
        Some(OpenInfo {
            ino: f.ino,
            fh,
            flags: f.flags,
            uid: f.ctx.uid,
            gid: f.ctx.gid,
            data: f.data.clone(),
            map,
            files,
        })
    }

    fn client_remap(
        &self,
        fh: u64,
        map: DataMap,
        offset: u64,
        len: u64,
    ) -> mapfs::Result<Option<OpenInfo>> {
        let Some(f) = self.handles.file(fh) else {
            return Ok(None);
        };
        let files = f.data.files();
        f.data.install(map, files)?;
        f.data
            .remap_for_write(offset, len, &mut self.remap_for(&f))?;
        Ok(self.open(fh))
    }

    fn ready_to_write(&self, fh: u64) -> mapfs::Result<Option<OpenInfo>> {
        let Some(f) = self.handles.file(fh) else {
            return Ok(None);
        };
        f.data.make_writable(&mut self.remap_for(&f))?;
        Ok(self.open(fh))
    }

    fn proofs(&self) -> &Proofs {
        &self.proofs
    }

    fn writeback_cache(&self) -> bool {
        self.writeback.load(Ordering::Relaxed)
    }

    fn status(&self) -> mapfs::control::MountStatus {
        let (fs, backing) = self.identity.get().cloned().unwrap_or_default();
        mapfs::control::MountStatus {
            pid: 0,
            fs,
            backing,
            data: match self.opts.data {
                DataMode::Auto => "auto",
                DataMode::Daemon => "daemon",
                DataMode::Passthrough => "passthrough",
            }
            .to_string(),
            passthrough_active: self.passthrough_ok.load(Ordering::Relaxed),
            writeback_cache: self.writeback.load(Ordering::Relaxed),
            started_unix: self
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            clients: 0,
            connections: 0,
            open_files: self.handles.open_files() as u64,
        }
    }

    fn invalidate(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            // Errors only mean the kernel has nothing cached for it.
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
            self.stats.add(Event::Invalidation, 1);
        }
        self.tokens.bump(ino);
    }

    fn stats(&self, reset: bool) -> mapfs::stats::MountStats {
        let mut stats = self.stats.snapshot(reset);
        stats.token_bumps = self.tokens.bumps(reset);
        stats
    }

    fn trace(
        &self,
        conn: u64,
        op: Option<&str>,
        pid: Option<u32>,
    ) -> Option<(Vec<mapfs::stats::TraceEvent>, u64)> {
        let tracer = &self.stats.tracer;
        if !tracer.subscribe(conn, op, pid) {
            return None;
        }
        // Enough for one packet even with long paths: events are taken a
        // few at a time until about half a packet is filled.
        let budget = mapfs::control::MAX_PACKET / 2;
        let (mut events, mut dropped, mut size) = (Vec::new(), 0, 0);
        while size < budget {
            let (batch, d) = tracer.take(conn, 64);
            dropped += d;
            if batch.is_empty() {
                break;
            }
            for t in batch {
                let path = self
                    .inodes
                    .path(t.nodeid)
                    .map(|p| p.to_string_lossy().into_owned());
                size += 64 + path.as_ref().map_or(0, |p| p.len());
                let target = t
                    .target
                    .as_ref()
                    .map(|n| String::from_utf8_lossy(n).into_owned());
                size += target.as_ref().map_or(0, |n| n.len());
                events.push(mapfs::stats::TraceEvent {
                    at_ns: t.at_ns,
                    at_unix_ns: t.at_unix_ns,
                    target,
                    op: crate::stats::OP_NAMES[t.op as usize].to_string(),
                    nodeid: t.nodeid,
                    path,
                    pid: t.pid,
                    latency_ns: t.latency_ns,
                    errno: t.errno,
                });
            }
        }
        Some((events, dropped))
    }

    fn trace_end(&self, conn: u64) {
        self.stats.tracer.unsubscribe(conn);
    }

    fn tool(&self, ctx: &mapfs::Ctx, name: &str, input: &[u8]) -> mapfs::Result<Vec<u8>> {
        tracing::info!(tool = name, uid = ctx.uid, pid = ctx.pid, "running a tool");
        self.fs.tool(ctx, name, input)
    }

    fn generations(&self) -> Option<&mapfs::mapcache::Generations> {
        self.tokens.generations()
    }

    fn adopting(&self, open: &OpenInfo) {
        if open.flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.pages.written_outside(self.inodes.fs_ino(open.ino));
        }
        self.stats.add(Event::Adoption, 1);
        self.tokens.adopting(open.ino, &open.map, &open.files);
    }

    fn has_writer(&self, ino: u64) -> bool {
        self.handles.has_writer(ino)
    }

    fn copied(&self) {
        self.stats.add(Event::Adoption, 1);
        self.stats.add(Event::Copy, 1);
    }

    fn lend(&self, fh: u64, lent: bool, size: Option<Arc<mapfs::lentsize::LentSize>>) {
        if lent {
            self.stats.add(Event::Lending, 1);
        }
        if let Some(f) = self.handles.file(fh) {
            if lent && f.flags & libc::O_ACCMODE != libc::O_RDONLY {
                self.pages.written_outside(self.inodes.fs_ino(f.ino));
            }
            f.lent.store(lent, Ordering::Release);
            let sized = lent && size.is_some();
            self.handles
                .lent_with_size(f.ino, fh, size.filter(|_| lent));
            if sized {
                // Attributes the kernel cached before the lending would hide
                // the client's size for up to a TTL.
                if let Some(n) = self.notifier.get() {
                    let _ = n.inval_inode(INodeNo(f.ino), -1, 0);
                    self.stats.add(Event::Invalidation, 1);
                }
            }
        }
    }

    fn client_released(&self, fh: u64, map: DataMap) {
        if let Some(f) = self.handles.file(fh) {
            let size = map.size();
            self.persist_journaled_of(f.ino);
            if f.data.whole_file_backing().is_none() {
                // The client wrote through its own engine over the same
                // backing files; adopt its final map so `release` persists it.
                let files = f.data.files();
                if let Err(e) = f.data.install(map, files) {
                    warn!(fh, "shim client's final map rejected: {e}");
                    return;
                }
            }
            self.changed(&f, SizeChange::Set(size));
            // Persisted now, not only at the kernel's FLUSH: the client also
            // pushes before it shrinks the file (see `FileSystem::flush`).
            if let Err(e) = self.persist_map(&f) {
                warn!(fh, "persisting a shim client's map: {e}");
            }
            self.tokens.bump(f.ino);
        }
    }
}

macro_rules! tri {
    ($reply:ident, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                debug!("-> {e}");
                $reply.error(errno(&e));
                return;
            }
        }
    };
}

impl Shared {
    /// Unlink or rmdir of `name` in `parent` by `remove`: the removed
    /// inode's map-cache token is bumped and the name forgotten.
    fn remove_name(
        &self,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        remove: impl FnOnce(&Path) -> Result<()>,
    ) {
        let _names = self.hold_dir(parent.0, true);
        let path = tri!(reply, self.child(parent, name));
        let victim = self.ino_at(parent, name);
        let before = self.attrs_if_open(victim, &path);
        let res = remove(&path);
        self.bump_opt(victim);
        tri!(reply, res);
        self.keep_unlinked(before);
        self.inodes.unlinked(parent.0, name);
        reply.ok();
    }
}

impl Filesystem for Adapter {
    /// At unmount, what the file system leaves for its housekeeping gets
    /// done, and what it holds goes back ([`FileSystem::finish`]), not left
    /// for the next mount.
    fn destroy(&mut self) {
        if let Some(bell) = &self.0.housekeeper {
            bell.stop();
        }
        if self.0.caps.housekeeping.is_some() {
            self.0.fs.housekeeping();
        }
        self.0.fs.finish();
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let s = &self.0;
        let mut want = InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            // The kernel checks permissions itself on every mount (see
            // `crate::mount`, Permission checks); with this it honours POSIX
            // ACLs there as the backing file system does.
            | InitFlags::FUSE_POSIX_ACL;
        if s.opts.data == DataMode::Daemon {
            if s.opts.writeback_cache {
                want |= InitFlags::FUSE_WRITEBACK_CACHE;
            }
        } else {
            want |= InitFlags::FUSE_PASSTHROUGH;
        }
        for flag in want.iter() {
            if config.add_capabilities(flag).is_err() {
                if flag == InitFlags::FUSE_PASSTHROUGH {
                    warn!("kernel does not offer FUSE passthrough; all reads and writes run in the daemon");
                    s.passthrough_ok.store(false, Ordering::Relaxed);
                } else {
                    info!("kernel does not offer {flag:?}");
                }
            } else if flag == InitFlags::FUSE_WRITEBACK_CACHE {
                s.writeback.store(true, Ordering::Relaxed);
            }
        }
        if s.passthrough_ok.load(Ordering::Relaxed) {
            let _ = config.set_max_stack_depth(1);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Lookup, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = match s.fs.getattr(&ctx(req), &path) {
            // A negative entry: the kernel caches that the name does not
            // exist for the entry TTL, as it caches names that do (an
            // ENOENT reply is not cached, so every stat or open of a
            // missing name, and every PATH or include-path search, would
            // cross into the daemon again). The kernel still checks the
            // caller's search permission on the parent before it uses
            // the cached answer, and a create through the mount replaces it.
            Err(e)
                if e.errno() == libc::ENOENT
                    && !s.opts.entry_ttl.is_zero()
                    && !s.caps.name_may_appear(&path) =>
            {
                reply.entry_with_ttls(
                    &Duration::ZERO,
                    &s.opts.entry_ttl,
                    &negative_entry(),
                    Generation(0),
                );
                return;
            }
            r => tri!(reply, r),
        };
        s.entry(parent, name, &attr, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Forget, _req.pid(), ino.0);
        if let Some(file) = s.inodes.forget(ino.0, nlookup) {
            s.pages.forgotten(file);
        }
        s.tokens.forgotten(ino.0, || s.inodes.path(ino.0).is_none());
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Getattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let attr = tri!(reply, s.getattr_inner(&ctx(req), ino, fh));
        reply.attr(&s.attr_ttl(ino.0), &s.fuse_attr(ino.0, &attr));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Setattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let path = s.path(ino);
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        if fh.is_none() && s.writeback.load(Ordering::Relaxed) {
            set.mtime = utime_now_under_writeback(set.atime, set.mtime);
            set.mtime = truncate_mtime_under_writeback(&set);
        }
        let handle = fh.and_then(|fh| s.handles.file(fh.0));
        // A size change on an open file goes through the engine, so a map
        // that is not 1-to-1 stays right; as the caller, so the backing
        // kernel clears setuid/setgid as it would.
        let open = handle.clone().or_else(|| match size {
            // Where opens share, the one the writers share.
            Some(_) => (s.handles.share_of(ino.0, true))
                .or_else(|| s.handles.any_file_of(ino.0))
                .filter(|f| f.data.whole_file_backing().is_none())
                .filter(|f| !f.lent.load(Ordering::Acquire)),
            None => None,
        });
        if let (Some(sz), Some(file)) = (size, &open) {
            tri!(reply, s.set_open_size(&c, ino.0, file, sz));
            set.size = None;
        }
        // Times that come with a file handle are the kernel's own (with
        // ftruncate, or its writeback cache flushing mtime), never a
        // utimensat: apply them through the open file as the daemon, which
        // also works once the name is gone.
        if let Some(file) = &handle {
            if set.atime.is_some() || set.mtime.is_some() {
                let times = SetAttr {
                    atime: set.atime,
                    mtime: set.mtime,
                    ..SetAttr::default()
                };
                match file.data.whole_file_backing() {
                    Some(b) => tri!(reply, set_file_times(b, &times)),
                    // The file system keeps these times by name; a file
                    // whose name is gone has nobody left to show them to.
                    None => {
                        if let Ok(p) = &path {
                            match s.fs.setattr(&ROOT_CTX, p, &times) {
                                Err(e) if e.errno() == libc::ENOENT => {}
                                r => {
                                    tri!(reply, r);
                                }
                            }
                        }
                    }
                }
                set.atime = None;
                set.mtime = None;
            }
        }
        let attr = if set.is_empty() {
            tri!(reply, s.getattr_inner(&c, ino, fh))
        } else {
            let path = tri!(reply, path);
            let res = s.fs.setattr(&c, &path, &set);
            if set.size.is_some() {
                s.tokens.bump(ino.0);
            }
            tri!(reply, res)
        };
        // A truncate by a user without CAP_FSETID clears setuid/setgid, as
        // on a local file system (the kernel's FATTR_KILL_SUIDGID, which
        // fuser does not pass on: a size change by anyone but root is taken
        // to carry it). A file system that keeps its own modes (pack) needs
        // this; for the others the backing kernel did it already.
        let setid = u16::try_from(libc::S_ISUID | libc::S_ISGID).unwrap_or(0);
        let attr = if size.is_some() && c.uid != 0 && attr.perm & setid != 0 {
            let path = tri!(reply, s.path(ino));
            tri!(reply, s.kill_suidgid(ino.0, &path, &c));
            tri!(reply, s.getattr_inner(&c, ino, fh))
        } else {
            attr
        };
        reply.attr(&s.attr_ttl(ino.0), &s.fuse_attr(ino.0, &attr));
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readlink, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let target = tri!(reply, s.fs.readlink(&ctx(req), &path));
        reply.data(target.as_bytes());
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Mknod, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = tri!(reply, s.fs.mknod(&ctx(req), &path, mode, u64::from(rdev)));
        let fa = s.enter(parent, name, &attr);
        // A new file may reuse the number of one a client still caches.
        s.tokens.bump(fa.ino.0);
        reply.entry_with_ttls(&s.opts.ttl, &s.opts.entry_ttl, &fa, Generation(0));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Mkdir, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, name));
        let attr = tri!(reply, s.fs.mkdir(&ctx(req), &path, mode));
        s.entry(parent, name, &attr, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Unlink, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        s.remove_name(parent, name, reply, |path| s.fs.unlink(&ctx(req), path));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Rmdir, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        s.remove_name(parent, name, reply, |path| s.fs.rmdir(&ctx(req), path));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Symlink, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, link_name));
        let _names = s.hold_dir(parent.0, false);
        let path = tri!(reply, s.child(parent, link_name));
        let attr = tri!(reply, s.fs.symlink(&ctx(req), target.as_os_str(), &path));
        s.entry(parent, link_name, &attr, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRenameFlags,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Rename, req.pid(), parent.0)
            .target_with(|| {
                let mut n = s.trace_path(parent, name);
                n.extend_from_slice(b" -> ");
                n.extend_from_slice(&s.trace_path(newparent, newname));
                n
            });
        if flags.contains(FuseRenameFlags::RENAME_WHITEOUT) {
            reply.error(fail(Errno::EINVAL));
            return;
        }
        let _names = s.names.hold_all();
        let from = tri!(reply, s.child(parent, name));
        let to = tri!(reply, s.child(newparent, newname));
        let rf = RenameFlags {
            noreplace: flags.contains(FuseRenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(FuseRenameFlags::RENAME_EXCHANGE),
        };
        let (moved, replaced) = (s.ino_at(parent, name), s.ino_at(newparent, newname));
        let before = if rf.exchange {
            None
        } else {
            s.attrs_if_open(replaced, &to)
        };
        let res = s.fs.rename(&ctx(req), &from, &to, rf);
        s.bump_opt(moved);
        s.bump_opt(replaced);
        tri!(reply, res);
        s.keep_unlinked(before);
        s.inodes
            .renamed(parent.0, name, newparent.0, newname, rf.exchange);
        reply.ok();
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Link, req.pid(), ino.0).target_with(|| {
            let mut n = s.inodes.path(ino.0).map_or_else(
                || format!("#{}", ino.0).into_bytes(),
                |p| p.as_os_str().as_bytes().to_vec(),
            );
            n.extend_from_slice(b" -> ");
            n.extend_from_slice(&s.trace_path(newparent, newname));
            n
        });
        let _names = s.hold_link(ino.0, newparent.0);
        let from = tri!(reply, s.path(ino));
        let to = tri!(reply, s.child(newparent, newname));
        let attr = tri!(reply, s.fs.link(&ctx(req), &from, &to));
        s.entry(newparent, newname, &attr, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Open, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let path = tri!(reply, s.path(ino));
        let reply = match s.made_before(req, ino.0) {
            Some(fh) => match s.open_again(fh, reply) {
                Some(reply) => reply,
                None => return,
            },
            None => reply,
        };
        if flags.0 & libc::O_ACCMODE == PLACEHOLDER_ACCESS {
            let fh = s.open_placeholder();
            s.journal_handle(fh, ino.0, OpenKind::Placeholder, req.unique().0);
            s.test_die_before_answer(req, &path);
            reply.opened(FileHandle(fh), FopenFlags::FOPEN_NONSEEKABLE);
            return;
        }
        let _joining = s.shares_opens().then(|| s.join_lock(ino.0).lock());
        if _joining.is_some() {
            let writes =
                flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
            if let Some(owner) = s.handles.share_of(ino.0, writes) {
                let (fh, fopen) = tri!(reply, s.join_open(req, ino.0, flags.0, &owner));
                answer_opened(reply, fh, fopen, None);
                return;
            }
        }
        let fs_flags = s.open_flags_for_fs(flags.0);
        let opened = match s.open_with_fallback(fs_flags, |f| s.fs.open(&c, &path, f), flags.0) {
            Err(e) if e.errno() == libc::EACCES && is_exec_open(flags.0) => {
                // `execve` of a file its caller may execute but not read:
                // the kernel reads it with its own rights, as it does
                // natively (and marks the process undumpable). Checked as
                // the caller: execute permission (the kernel checked it
                // too); then opened read-only by the daemon.
                tri!(reply, s.fs.access(&c, &path, libc::X_OK));
                let read_only = flags.0 & !libc::O_DIRECT;
                s.fs.open(&ROOT_CTX, &path, OpenFlags(read_only))
                    .map(|o| (o, read_only))
            }
            r => r,
        };
        // The kernel found this inode at the name, and the name lost it
        // before the open came (removed by another host sharing the store,
        // or in the backing directory). A local file system would open the
        // file found; here it is gone, so ESTALE makes the kernel walk the
        // path again once, looking every name up afresh: an `open(O_CREAT)`
        // then creates the file (the kernel sends an open of an existing
        // inode without O_CREAT, so only it can), and another open answers
        // ENOENT from that lookup or opens what the name holds by then.
        // ENOENT here failed fio's `open(O_CREAT)` of a file that another
        // host's fio removed to lay it out again. So is a name
        // that holds another file by now (removed and made again: a retry
        // opens the new one; two plfs mounts of one store, one host
        // removing and creating a file while the other opened it with
        // O_CREAT, failed 190 of 11,000 opens with ENOENT). A name still
        // holding the file keeps the file system's ENOENT (something it
        // was missing).
        let opened = opened.map_err(|e| {
            let gone = e.errno() == libc::ENOENT
                && match s.fs.getattr(&c, &path) {
                    Err(e) => e.errno() == libc::ENOENT,
                    Ok(now) => now.ino != s.inodes.fs_ino(ino.0),
                };
            if gone {
                Error::from_errno(libc::ESTALE).context(format!(
                    "{} was removed since the kernel looked it up",
                    path.display()
                ))
            } else {
                e
            }
        });
        let opened = tri!(reply, opened);
        if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY && c.uid != 0
        {
            // As a truncate (FUSE_OPEN_KILL_SUIDGID, which fuser does not
            // pass on): the open succeeded, so the caller may write.
            tri!(reply, s.kill_suidgid(ino.0, &path, &c));
        }
        let (fh, backing, fopen) = tri!(
            reply,
            s.register_open(req, ino.0, path, flags.0, opened, |f| reply.open_backing(f))
        );
        answer_opened(reply, fh, fopen, backing.as_deref());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Read, _req.pid(), _ino.0);
        let file = tri!(reply, s.data_file(fh));
        // One buffer per worker thread: a fresh zeroed buffer per request
        // (up to 1 MiB) costs a memset on every read.
        READ_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match file.data.read(offset, &mut buf[..size]) {
                Ok(n) => {
                    s.stats.add(Event::DaemonReadBytes, n as u64);
                    reply.data(&buf[..n])
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Write, req.pid(), _ino.0);
        let file = tri!(reply, s.data_file(fh));
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            tri!(reply, s.kill_suidgid(file.ino, &file.path, &ctx(req)));
        }
        let mut remap = s.remap_for(&file);
        let res = file.data.write(offset, data, &mut remap);
        s.tokens.bump(file.ino);
        let n = tri!(reply, res);
        s.stats.add(Event::DaemonWriteBytes, n as u64);
        s.changed(&file, SizeChange::Extend(offset + n as u64));
        s.journal_change(&file, offset, n as u64, Some(&data[..n]));
        reply.written(n as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Flush, _req.pid(), _ino.0);
        if !self.0.caps.persists_at_close {
            // No open of this file system ever has anything to persist at
            // close: the kernel takes ENOSYS as "never send FLUSH again"
            // on this connection (`fc->no_flush`; `close(2)` returns 0).
            // Opens ask for no FLUSH already (`FOPEN_NOFLUSH`), but with
            // the writeback cache the kernel sends it anyway, after
            // writing the dirty pages back, which it goes on doing.
            reply.error(fail(Errno::ENOSYS));
            return;
        }
        // Writes reach the backing files synchronously; only a map that is
        // not whole-file has something to persist (whole-file opens ask the
        // kernel for no FLUSH at all).
        if self.0.handles.is_placeholder(fh.0) {
            reply.ok();
            return;
        }
        let file = tri!(reply, self.0.open_file(fh));
        tri!(reply, self.0.persist_map(&file));
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Release, _req.pid(), _ino.0);
        let s = &self.0;
        // The journal says an open is released before its backing id can
        // be closed: a daemon killed between the two would otherwise leave
        // its successor restoring the open with an id the kernel no longer
        // has, and answering the next open of the inode with it (`EIO`).
        if s.handles.remove_placeholder(fh.0) {
            s.journal_released(fh.0);
            reply.ok();
            return;
        }
        if let Some(orphan) = s.handles.take_orphan(fh.0) {
            s.journal_released(fh.0);
            drop(orphan);
            reply.ok();
            return;
        }
        let res = s.release_file(fh.0);
        s.journal_released(fh.0);
        let (ino, backing) = tri!(reply, res);
        drop(backing);
        s.handles.prune_backing(ino);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Fsync, _req.pid(), _ino.0);
        if self.0.handles.is_placeholder(fh.0) {
            // The client's writes are in its map until it pushes it: a sync
            // of the placeholder alone would claim durability it lacks.
            reply.error(fail(Errno::EIO));
            return;
        }
        let file = tri!(reply, self.0.open_file(fh));
        tri!(reply, file.data.fsync(datasync));
        tri!(reply, self.0.persist_map(&file));
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Opendir, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        if let Some(fh) = s.made_before(req, ino.0) {
            if s.handles.dir(fh).is_some() {
                reply.opened(FileHandle(fh), FopenFlags::empty());
                return;
            }
        }
        let entries = tri!(reply, s.fs.readdir(&ctx(req), &path));
        let fh = s.handles.add_dir(OpenDir { entries });
        s.journal_handle(fh, ino.0, OpenKind::Dir, req.unique().0);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readdir, _req.pid(), ino.0);
        let Some(dir) = s.handles.dir(fh.0) else {
            reply.error(fail(Errno::EBADF));
            return;
        };
        // Offsets: 1 = ".", 2 = "..", 3.. = entries.
        let mut off = offset;
        while off < 2 {
            let name = if off == 0 { "." } else { ".." };
            if reply.add(ino, off + 1, FileType::Directory, name) {
                reply.ok();
                return;
            }
            off += 1;
        }
        for (i, e) in dir.entries.iter().enumerate().skip((off - 2) as usize) {
            let eino = INodeNo(s.inodes.nodeid_of(e.ino));
            if reply.add(eino, i as u64 + 3, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Readdirplus, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let c = ctx(req);
        let Some(dir) = s.handles.dir(fh.0) else {
            reply.error(fail(Errno::EBADF));
            return;
        };
        let dir_path = tri!(reply, s.path(ino));
        let mut off = offset;
        if off < 2 {
            // "." and ".." are not linked by the kernel, so they take no
            // lookup reference.
            let self_attr = tri!(reply, s.fs.getattr(&c, &dir_path));
            let fa = s.fuse_attr(ino.0, &self_attr);
            while off < 2 {
                let name = if off == 0 { "." } else { ".." };
                if reply.add(ino, off + 1, name, &Duration::ZERO, &fa, Generation(0)) {
                    reply.ok();
                    return;
                }
                off += 1;
            }
        }
        for (i, e) in dir.entries.iter().enumerate().skip((off - 2) as usize) {
            // The listing was made at opendir: an entry the inode table
            // knows better is looked at again.
            let attr = match e.attr {
                Some(a) if s.inodes.agrees(ino.0, &e.name, a.ino) => a,
                _ => match s.fs.getattr(&c, &dir_path.join(&e.name)) {
                    Ok(a) => a,
                    Err(_) => continue, // vanished since opendir
                },
            };
            let fa = s.enter(ino, &e.name, &attr);
            if reply.add(
                fa.ino,
                i as u64 + 3,
                &e.name,
                &s.opts.ttl,
                &fa,
                Generation(0),
            ) {
                // Not sent: the kernel takes no reference.
                if let Some(file) = s.inodes.forget(fa.ino.0, 1) {
                    s.pages.forgotten(file);
                }
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Releasedir, _req.pid(), _ino.0);
        self.0.handles.remove_dir(fh.0);
        self.0.journal_released(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Fsyncdir, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.fsyncdir(&ctx(req), &path, datasync));
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Statfs, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = s.path(ino).unwrap_or_else(|_| PathBuf::from("/"));
        let st = tri!(reply, s.fs.statfs(&ctx(req), &path));
        reply.statfs(
            st.blocks, st.bfree, st.bavail, st.files, st.ffree, st.bsize, st.namelen, st.frsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Setxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.setxattr(&ctx(req), &path, name, value, flags));
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Getxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let value = tri!(reply, s.fs.getxattr(&ctx(req), &path, name));
        xattr_reply(reply, &value, size);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Listxattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        let names = tri!(reply, s.fs.listxattr(&ctx(req), &path));
        let mut buf = Vec::new();
        for n in names {
            buf.extend_from_slice(n.as_bytes());
            buf.push(0);
        }
        xattr_reply(reply, &buf, size);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Removexattr, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.removexattr(&ctx(req), &path, name));
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let s = &self.0;
        let _t = s.stats.timer(Op::Access, req.pid(), ino.0);
        let _names = s.hold_node(ino.0);
        let path = tri!(reply, s.path(ino));
        tri!(reply, s.fs.access(&ctx(req), &path, mask.bits()));
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let s = &self.0;
        let _t = s
            .stats
            .timer(Op::Create, req.pid(), parent.0)
            .target_with(|| s.trace_path(parent, name));
        let _names = s.hold_dir(parent.0, false);
        let c = ctx(req);
        let path = tri!(reply, s.child(parent, name));
        let reply = match s.create_again(req, &path, reply) {
            Some(reply) => reply,
            None => return,
        };
        let fs_flags = s.open_flags_for_fs(flags);
        let (attr, opened) = tri!(reply, s.fs.create(&c, &path, OpenFlags(fs_flags), mode));
        // Clean unless the kernel still holds an inode of a file that had
        // this number (enter then says so).
        s.pages.created(attr.ino);
        let fa = s.enter(parent, name, &attr);
        let (fh, backing, fopen) = tri!(
            reply,
            s.register_open(req, fa.ino.0, path, flags, (opened, fs_flags), |f| reply
                .open_backing(f))
        );
        // A new file may reuse the number of one a client still caches.
        s.tokens.bump(fa.ino.0);
        s.answer_created(reply, &fa, fh, fopen, backing.as_deref());
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.0.stats.timer(Op::Fallocate, req.pid(), _ino.0);
        let file = tri!(reply, self.0.data_file(fh));
        // Like write, fallocate by an unprivileged caller drops setuid/setgid;
        // the kernel sends no flag for it.
        if req.uid() != 0 {
            tri!(reply, self.0.kill_suidgid(file.ino, &file.path, &ctx(req)));
        }
        let res = file.data.fallocate(mode, offset, length);
        self.0.tokens.bump(file.ino);
        tri!(reply, res);
        let change = if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            SizeChange::Keep
        } else {
            SizeChange::Extend(offset + length)
        };
        self.0.changed(&file, change);
        self.0.journal_change(&file, offset, length, None);
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.0.stats.timer(Op::Lseek, _req.pid(), _ino.0);
        let file = tri!(reply, self.0.data_file(fh));
        if offset < 0 {
            reply.error(fail(Errno::ENXIO));
            return;
        }
        let pos = tri!(reply, file.data.seek(offset as u64, whence));
        reply.offset(pos as i64);
    }

    /// Only [`mapfs::control::PROVE_IOCTL`]: a proof that the caller holds
    /// the open `fh`, for the control connection whose key it passes. Any
    /// other ioctl gets `ENOTTY`, unlogged (a client must not be able to
    /// fill the log).
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _t = self.0.stats.timer(Op::Ioctl, req.pid(), _ino.0);
        if cmd != mapfs::control::PROVE_IOCTL {
            reply.error(fail(Errno::ENOTTY));
            return;
        }
        let (Ok(key), 16) = (<mapfs::control::ConnKey>::try_from(in_data), out_size) else {
            reply.error(fail(Errno::EINVAL));
            return;
        };
        let s = &self.0;
        if s.handles.file(fh.0).is_none() {
            reply.error(fail(Errno::EBADF));
            return;
        }
        match s.proofs.issue(&key, fh.0, req.uid(), req.gid()) {
            Some(proof) => reply.ioctl(0, &proof),
            None => reply.error(fail(Errno::EPERM)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let s = &self.0;
        let _t = s.stats.timer(Op::CopyFileRange, _req.pid(), _ino_out.0);
        let src = tri!(reply, s.data_file(fh_in));
        let dst = tri!(reply, s.data_file(fh_out));
        let mut remap = s.remap_for(&dst);
        // The reply carries a 32-bit count; the kernel loops for more.
        let len = len.min(1 << 30);
        let res = engine::copy_range(&src.data, offset_in, &dst.data, offset_out, len, &mut remap);
        s.tokens.bump(dst.ino);
        let n = tri!(reply, res);
        s.changed(&dst, SizeChange::Extend(offset_out + n as u64));
        s.journal_change(&dst, offset_out, n as u64, None);
        s.stats.add(Event::DaemonWriteBytes, n as u64);
        reply.written(n as u32);
    }
}

fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(fail(Errno::ERANGE));
    } else {
        reply.data(value);
    }
}

/// The root inode number, re-exported for executors that need it.
pub const ROOT_INO: u64 = ROOT;
