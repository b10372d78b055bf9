//! Embedded mode (`mapfs run --embed FS:BACKING:PREFIX`): the file system's
//! own code runs inside the application, behind the libc calls it already
//! makes: no mount, no daemon, no privilege. Paths under each prefix are
//! served by the file system (the same `FileSystem` implementations and
//! registry as `mapfs mount`); every other call goes on to the next
//! definition of the symbol (the attached shim when it is preloaded too,
//! then libc).
//!
//! This crate is the engine; a preload library is a `cdylib` crate whose
//! whole source is one [`library!`] line naming its registry:
//! `libmapfs_embed_builtins.so` serves `mapfs`'s built-in file systems, and
//! a program built on `mapfs_cli` makes its own for its file systems (see
//! docs/embedded.md, "Your own file system, embedded").
//!
//! Rules every hook follows (see [`hooks`](mod@hooks)):
//! - Every descriptor is a real kernel descriptor: an open of a whole-file
//!   1-to-1 map *is* the backing file, so data calls need no hook at all;
//!   an open of another map (plfs) is a placeholder whose data calls the
//!   data engine runs in-process ([`engine_fd`], [`data_hooks`]).
//! - A thread-local guard ([`Guard`]) sends calls made while the library
//!   works (by the file system, std, the allocator) straight on, and errno
//!   is kept across the library's own work.
//! - Nothing is served before the constructor ran; the constructor builds
//!   the file systems once per process image (a forked child keeps its
//!   parent's, an `exec`ed image builds its own from `MAPFS_EMBED`).
//! - The process acts with its own credentials: the file system opens the
//!   backing files in the caller's process, so the backing kernel decides
//!   every permission exactly as for the caller.
//!
//! Environment: `MAPFS_EMBED` (written by `mapfs run`, see
//! `mapfs_registry::embed_spec`), `MAPFS_PRELOAD_LOG=1` (diagnostics on stderr).

#![warn(missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};

pub mod canary;

// The malloc family, seen by the signal layer: a program's handler never
// runs on top of an allocator call (see `mapfs_interpose::alloc`).
mapfs_interpose::allocator_exports!();

pub mod data_hooks;
pub mod desc;
pub mod dirs;
pub mod engine_fd;
pub mod hooks;
pub mod locks;
pub mod ops;
pub mod report;
pub mod resolve;
pub mod statbuf;
pub mod state;
pub mod streams;

/// Set by the constructor; hooks do nothing but pass calls on before it.
static READY: AtomicBool = AtomicBool::new(false);

/// The re-entrancy guard ([`mapfs_interpose::guard`]): held while the
/// library does its own work on a thread, so libc calls made meanwhile go
/// straight on; holding it holds the fork gate.
pub struct Guard(#[allow(dead_code)] mapfs_interpose::guard::Guard);

impl Guard {
    /// Enters the library on this thread; `None` if it is already inside
    /// (or holds a lock of the library), or the library is not initialised
    /// yet.
    #[inline]
    pub fn enter() -> Option<Guard> {
        if !READY.load(Ordering::Acquire) {
            return None;
        }
        mapfs_interpose::guard::Guard::enter().map(Guard)
    }
}

/// This thread is inside the library (its own libc calls pass through the
/// hooks).
#[inline]
pub fn inside() -> bool {
    mapfs_interpose::guard::inside()
}

/// Writes one diagnostic line to stderr when `MAPFS_PRELOAD_LOG` is set.
pub fn log(msg: std::fmt::Arguments<'_>) {
    if state::log_enabled() {
        warn(msg);
    }
}

/// Writes one line to stderr (raw write, no stdio buffer involved).
pub fn warn(msg: std::fmt::Arguments<'_>) {
    let line = format!(
        "mapfs-embed[{}]: {msg}\n",
        rustix::process::getpid().as_raw_nonzero()
    );
    let _ = rustix::io::write(rustix::stdio::stderr(), line.as_bytes());
}

/// Starts embedded mode in this process image with the file systems of
/// `registry`: what [`library!`]'s constructor calls before `main`. Serves
/// nothing until it returns; calling it twice is a no-op.
pub fn start(registry: impl FnOnce() -> mapfs_registry::Registry) {
    if READY.load(Ordering::Acquire) {
        return;
    }
    mapfs_interpose::guard::Guard::enter_forced();
    hooks::resolve_all();
    data_hooks::resolve_all();
    report::init();
    state::init(&registry());
    hooks::install_fork_handlers();
    engine_fd::install();
    canary::arm();
    mapfs_interpose::guard::Guard::leave_forced();
    READY.store(true, Ordering::Release);
}

/// Makes the `cdylib` it is written in an embedded-mode library serving the
/// embeddable file systems of a registry (an expression of type
/// `mapfs_registry::Registry`, which `mapfs_cli::Registry` is, evaluated once per process image, before
/// `main`). The program that registers the same file systems names the
/// library with `Registry::embed_library`, and its `run --embed` preloads
/// it:
///
/// ```ignore
/// // src/lib.rs of a crate with `crate-type = ["cdylib"]`
/// mapfs_embed::library!(my_fs::registry());
/// ```
///
/// Only file systems marked `FsSpec::embeddable` are run; the rest of the
/// registry is ignored. Write it once per library: it defines the
/// library's constructor.
#[macro_export]
macro_rules! library {
    ($registry:expr) => {
        // An ELF constructor: the dynamic loader runs it when it maps the
        // library, before the program's `main` (and before any other
        // library's code could call a hook).
        #[used]
        #[link_section = ".init_array"]
        static __MAPFS_EMBED_INIT: extern "C" fn() = {
            extern "C" fn mapfs_embed_init() {
                $crate::start(|| $registry);
            }
            mapfs_embed_init
        };
    };
}
