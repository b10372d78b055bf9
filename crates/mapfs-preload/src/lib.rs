//! `libmapfs_preload.so`: the preload executor of mapfs, attached mode
//! (docs/architecture.md). Loaded with `LD_PRELOAD` (see `mapfs run`), it moves the data
//! path of files on mapfs mounts into the application: their reads and
//! writes run on the backing files, not through the FUSE daemon.
//!
//! How descriptors are served is described in [`table`]; the hooks are in
//! [`hooks`](mod@hooks), declared once in one table. The rules every hook follows:
//!
//! - Every descriptor stays a real kernel descriptor; anything the shim
//!   cannot serve keeps going through the mount, never to an error.
//! - A thread-local guard ([`Guard`]) sends calls the shim makes itself
//!   straight to libc, and errno is saved and restored around the shim's own
//!   work. The shim's system calls go through rustix's raw syscalls.
//! - Nothing runs before the constructor; the constructor opens no file and
//!   talks to no daemon (that happens at the first adoption). A process
//!   that never adopts a file never contacts the daemon; what the shim
//!   costs such a process is measured in `docs/shim-cost.md`.
//! - A `vfork` child runs in its parent's memory: until it `exec`s, every
//!   hook is plain libc there ([`in_vfork_child`]).
//!
//! Environment: `MAPFS_MOUNTS` (mountpoints to attach to, `:`-separated;
//! default all mapfs mounts; `MAPFS_MOUNT_DEVS` names their device
//! numbers, see [`mounts`]), `MAPFS_PRELOAD_CONNS` and
//! `MAPFS_PRELOAD_ADOPTED` (set by the shim for the next image at `exec`:
//! control connections, [`mounts::CONNS_ENV`], and adopted descriptors,
//! [`table::HANDOFF_ENV`]), `MAPFS_PRELOAD_REPORT=<path>` (append a JSON
//! summary line per process at exit, see [`report`]), `MAPFS_PRELOAD_LOG=1`
//! (diagnostics on stderr), `MAPFS_PRELOAD_MAP_CACHE=<n>` (map cache
//! capacity, see [`mcache`]), `MAPFS_PRELOAD_ADOPT_CALLS`,
//! `MAPFS_PRELOAD_ADOPT_BYTES` and `MAPFS_PRELOAD_ADOPT_MOUNT_US` (the
//! adoption policy, [`table::Policy`]), `MAPFS_RUNTIME_DIR` (where control
//! sockets live, as for the daemon).
//!
//! Tests can ask a live process about one descriptor with the exported
//! `mapfs_preload_fd_status(fd)`: 0 unclassified, 1 not a mapfs file, 2 mapfs
//! file not adopted yet, 3 adopted (data calls native), 4 served through the
//! mount, 5 one of the shim's own descriptors, 6 lent (a map that is not
//! whole-file, run by the shim's data engine); and how many adoptions the
//! map cache served with `mapfs_preload_cache_hits()`.
//!
//! # Limits (see also [`hooks`](mod@hooks) for what is not intercepted)
//!
//! - Whole-file 1-to-1 maps are adopted; other maps are lent to the
//!   shim's data engine ([`lent`]) when the daemon allows it: append logs
//!   and read-only maps (plfs, versions' undo writers), and in-place slots
//!   of a shared backing file (pack) only to the mount's owner or root.
//!   The rest are served through the mount.
//! - The open through the mount stays open beside an adoption (a
//!   descriptor numbered 512 or above): the file system's `release` runs at
//!   the application's last close, and `fcntl`/`lockf`/`flock` locks of
//!   adopted descriptors are taken on it, so they are the mount's locks,
//!   seen by every process using the mount. (Without a free descriptor
//!   number above 512 the open is released at adoption and locks stay on
//!   the backing file.) Locks through the mount are the kernel's, local to
//!   the mount: a process working on the backing directory directly does
//!   not see them.
//! - The shim's own descriptors (one socket per mount, kept mount opens,
//!   the map cache's) are numbered from 512 up. An application whose open
//!   fails with `EMFILE` gets them back: the shim empties its map cache,
//!   releases the kept opens that hold no lock, and makes the open again.
//! - Nothing is adopted on a daemon-mode mount with the kernel writeback
//!   cache (`--data daemon`, `--writeback-cache` on or auto; the daemon says
//!   so at Hello, refuses adoptions there, and `mapfs run` warns): the
//!   kernel would keep its own stale sizes of files written natively. Use
//!   `--writeback-cache off` or a passthrough mount for the fast path.
//!
//! # Security
//!
//! The shim asks the daemon only for opens it holds, and proves it with an
//! ioctl on the application's own descriptor of the mount file
//! ([`mapfs::control::prove`]): the kernel, not the shim, tells the daemon
//! which open that is. The daemon hands back a descriptor with that open's
//! access mode, so a process never gets a file its uid could not open.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};

pub mod hooks;

// The malloc family, seen by the signal layer: a program's handler never
// runs on top of an allocator call (see `mapfs_interpose::alloc`).
mapfs_interpose::allocator_exports!();

pub mod lent;
pub mod lent_calls;
pub mod mcache;
pub mod mounts;
pub mod report;
pub mod sys;
pub mod table;

/// Set by the constructor; hooks do nothing but call libc before it.
static READY: AtomicBool = AtomicBool::new(false);

/// `MAPFS_PRELOAD_LOG` was set.
static LOG: AtomicBool = AtomicBool::new(false);

/// The re-entrancy guard ([`mapfs_interpose::guard`]): held while the shim
/// does its own work on a thread, so libc calls made meanwhile (by std, by
/// the allocator...) go straight to libc instead of back into the shim;
/// holding it holds the fork gate.
pub struct Guard(#[allow(dead_code)] mapfs_interpose::guard::Guard);

impl Guard {
    /// Enters the shim on this thread; `None` if it is already inside (or
    /// holds a lock of the shim), the library is not initialised yet, or
    /// this is a `vfork` child (see [`in_vfork_child`]). A hook that gets
    /// `None` makes the plain call, taking no lock.
    #[inline]
    pub fn enter() -> Option<Guard> {
        if !READY.load(Ordering::Acquire) || in_vfork_child() {
            return None;
        }
        let g = Guard(mapfs_interpose::guard::Guard::enter()?);
        if !mapfs_interpose::signal::in_handler() {
            table::run_deferred_closes();
        }
        Some(g)
    }
}

/// The pid of a process that called `vfork` and whose child has not
/// `exec`ed yet (0: none). A `vfork` child runs in its parent's memory, so
/// it must not touch the shim's tables: every hook is plain libc there (its
/// `close`s and `dup2`s are its own, on its own descriptor table), except
/// that `exec` still hands adopted descriptors on, reading the tables.
static VFORK_PARENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The thread of [`VFORK_PARENT`] that called `vfork`.
static VFORK_THREAD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// True in a `vfork` child before its `exec` (one relaxed load otherwise).
#[inline]
pub fn in_vfork_child() -> bool {
    let parent = VFORK_PARENT.load(Ordering::Relaxed);
    parent != 0 && vfork_check(parent)
}

#[cold]
fn vfork_check(parent: u32) -> bool {
    if sys::getpid() != parent {
        return true;
    }
    // The thread that called vfork runs again in the parent only once its
    // child has exec'ed or exited (one whose exec failed leaves the flag
    // set): the tables are the parent's again.
    if sys::gettid() == VFORK_THREAD.load(Ordering::Relaxed) {
        let _ = VFORK_PARENT.compare_exchange(parent, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
    false
}

/// Called by the `vfork` hook in the parent, before the real `vfork`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn vfork_starting() {
    VFORK_THREAD.store(sys::gettid(), Ordering::Relaxed);
    VFORK_PARENT.store(sys::getpid(), Ordering::Relaxed);
}

/// The `vfork` child is about to `exec` (`done`), or its `exec` failed
/// (`!done`): the parent's tables are the parent's again, or still not the
/// child's. (Two threads of one process in `vfork` at once share this
/// flag: the first child to `exec` ends it for both, a documented limit.)
pub(crate) fn vfork_child_exec(done: bool, parent: u32) {
    VFORK_PARENT.store(if done { 0 } else { parent }, Ordering::Relaxed);
}

/// The parent recorded by [`vfork_starting`] (0: none).
pub(crate) fn vfork_parent() -> u32 {
    VFORK_PARENT.load(Ordering::Relaxed)
}

extern "C" fn init() {
    // SAFETY: getenv with a NUL-terminated name; the constructor runs before
    // the program can change its environment concurrently.
    let log = unsafe { !libc::getenv(c"MAPFS_PRELOAD_LOG".as_ptr()).is_null() };
    LOG.store(log, Ordering::Relaxed);
    hooks::resolve_all();
    hooks::resolve_extra();
    // SAFETY: registering plain extern "C" functions with no arguments.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    // Descriptors adopted by the image this one replaced (exec). Only then
    // does the constructor read a file (the mount table, in /proc).
    if let Some(spec) = env_nonempty(mounts::CONNS_ENV) {
        mounts::import_connections(&spec.to_string_lossy());
    }
    if let Some(spec) = env_nonempty(table::HANDOFF_ENV) {
        table::import_adopted(&spec.to_string_lossy());
    }
    READY.store(true, Ordering::Release);
}

/// A non-empty environment variable, read with libc's `getenv`: the
/// constructor runs in every process of a job, and std's `var_os` takes
/// the environment lock and copies the value even when it is absent.
fn env_nonempty(name: &str) -> Option<&'static std::ffi::CStr> {
    let mut buf = [0u8; 64];
    buf.get_mut(..name.len())?.copy_from_slice(name.as_bytes());
    // SAFETY: getenv with a NUL-terminated name (`buf` is longer than the
    // name and zeroed after it); the constructor runs before the program can
    // change its environment concurrently, and the value is used before it
    // returns.
    let p = unsafe { libc::getenv(buf.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string of the environment.
    let v = unsafe { std::ffi::CStr::from_ptr(p) };
    (!v.is_empty()).then_some(v)
}

extern "C" fn fini() {
    let Some(_g) = Guard::enter() else {
        return;
    };
    // A daemon being replaced is not waited for at exit (the new one would
    // not know this process's handles anyway).
    mounts::exiting();
    if table::is_empty() {
        // No mapfs file open (most processes of a job): nothing to hand
        // back or to tell the daemon, and exit() flushes stdio itself.
        report::write_at_exit();
        return;
    }
    // Buffered stdio output reaches the files before the daemon is told they
    // changed (exit() flushes streams only after destructors run).
    // SAFETY: fflush(NULL) flushes every open output stream.
    unsafe {
        libc::fflush(std::ptr::null_mut());
    }
    table::hand_back_all(table::EXIT);
    for closed in table::all_open_writable() {
        closed.send();
    }
    report::write_at_exit();
}

/// The shim's `fork` (see [`mapfs_interpose::gate`]): closes the gate, so
/// that no thread holds a lock of the shim at the real `fork`, and hands
/// lent opens back to the mount and pins pending ones to it (parent and
/// child must not both run one map), all before the real `fork`, with no
/// other thread inside the shim: never in a `pthread_atfork` handler.
pub(crate) fn fork_with(real: impl FnOnce() -> libc::pid_t) -> libc::pid_t {
    if !READY.load(Ordering::Acquire) || in_vfork_child() {
        return real();
    }
    if mapfs_interpose::gate::close_for_fork() {
        mapfs_interpose::guard::Guard::enter_forced();
        sys::keep_errno(|| {
            // Not from a signal handler: a round trip allocates.
            if !mapfs_interpose::signal::in_handler() && !mounts::loaded().is_empty() {
                table::hand_back_all("fork");
                table::pin_all_pending();
            }
        });
    }
    let pid = real();
    // The handlers below reopened the gate; a fork that failed before
    // running them leaves it to this.
    if mapfs_interpose::gate::closing_thread() {
        sys::keep_errno(fork_parent_gate);
    }
    pid
}

/// A `fork` that did not come through [`fork_with`] (one made inside
/// glibc, or through another library's `fork`) still closes the gate
/// here, so the child's locks are free; its lent opens, not handed back
/// first, are a documented limit (docs/embedded.md).
extern "C" fn fork_prepare() {
    if READY.load(Ordering::Acquire)
        && !in_vfork_child()
        && !mapfs_interpose::gate::closing_thread()
        && mapfs_interpose::gate::close_for_fork()
    {
        mapfs_interpose::guard::Guard::enter_forced();
    }
}

fn fork_parent_gate() {
    if mapfs_interpose::gate::closing_thread() {
        mapfs_interpose::gate::after_fork_parent();
        mapfs_interpose::guard::Guard::leave_forced();
    }
}

extern "C" fn fork_parent() {
    fork_parent_gate();
}

extern "C" fn fork_child() {
    // A forked child is a process of its own, even one forked by a vfork
    // child.
    VFORK_PARENT.store(0, Ordering::Relaxed);
    if !READY.load(Ordering::Acquire) {
        return;
    }
    let closed = mapfs_interpose::gate::closing_thread();
    mapfs_interpose::gate::after_fork_child(closed);
    if closed {
        mapfs_interpose::guard::Guard::leave_forced();
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// For tests: how descriptor `fd` of this process is served (see the crate
/// docs for the codes).
#[no_mangle]
pub extern "C" fn mapfs_preload_fd_status(fd: libc::c_int) -> libc::c_int {
    libc::c_int::from(table::state(fd))
}

/// For tests: adoptions this process served from the map cache.
#[no_mangle]
pub extern "C" fn mapfs_preload_cache_hits() -> u64 {
    report::cache_hits()
}
