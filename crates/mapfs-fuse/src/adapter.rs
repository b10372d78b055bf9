//! The thin FUSE adapter: every callback resolves inodes to paths, calls the
//! [`FileSystem`] (namespace, open/create/release) or the data engine (read,
//! write, fsync...), and maps `Ok` to a reply and `Err` to its errno.
//!
//! Here is the state one mount shares ([`Shared`]); its concerns live in
//! the submodules: `translate` (the FUSE callbacks), `open` (the open
//! lifecycle, the executor choice and the setid rule), `cache` (what the
//! kernel may cache), `names` (the namespace locks), `housekeeping` (the
//! file system's thread), `registry` (the control socket's view) and
//! `resume` (failover records and takeover).
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

mod cache;
mod housekeeping;
mod names;
mod open;
mod registry;
mod resume;
mod translate;

use cache::negative_entry;
use housekeeping::{housekeeping_every, spawn_housekeeping};
use open::{answer_opened, file_open_flags, is_exec_open, JOIN_LOCKS};

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

/// The access mode of a placeholder open (see `Shared::open_placeholder`).
pub const PLACEHOLDER_ACCESS: i32 = 3;

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

impl Shared {
    /// Gives the statistics the session's requests per transport.
    pub fn set_transport(&self, t: Arc<fuser::TransportCounters>) {
        self.stats.set_transport(t);
    }

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

/// The daemon acting for itself (kernel-initiated changes).
const ROOT_CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};

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

/// The root inode number, re-exported for executors that need it.
pub const ROOT_INO: u64 = ROOT;
