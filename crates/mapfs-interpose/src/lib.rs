//! The interposition layer shared by mapfs's in-process executors: the
//! preload shim (`libmapfs_preload.so`) and the embedded libraries
//! (`mapfs_embed::library!`). Each library links its own copy, so each
//! has its own gate, guard and tables.
//!
//! What it holds: the declaration of hooks ([`hooks!`] and [`hooks::Real`],
//! the exported symbols and the next definitions they call, all resolved
//! by the constructor), the fork [`gate`], the reentrancy [`guard`],
//! signal-context tracking ([`signal`]), the malloc family seen by it
//! ([`alloc`]), gated locks ([`sync`]), the [`seqlock`], the descriptor
//! slots ([`fdslots`]), references parked by handlers ([`retire`]), the
//! library's own threads ([`threads`]), `copy_file_range` by hand
//! ([`copy`]) and the clone ioctls ([`clone`]).
//!
//! What a hook may do (one line each):
//! - **Outside any handler, not inside the library:** enter the
//!   [`guard::Guard`], take locks from [`sync`] (inside the fork
//!   [`gate`]), allocate, talk to a daemon.
//! - **From a signal handler** ([`signal::in_handler`]): a handler never
//!   runs on top of the library or of an allocator call ([`signal`]
//!   delays it until the thread leaves them, [`alloc`]), so the locks a
//!   hook takes are never held by its own thread, and an allocation cannot
//!   meet a half-done one. Still, what the shim does in a handler does not
//!   allocate and needs no daemon: `close`, `dup2` and the like do only
//!   bookkeeping without allocation (a last reference let go is parked in
//!   [`retire`], descriptors are filed in [`fdslots`]) and the plain system
//!   call, and work that needs the daemon waits for the next entry outside
//!   a handler.
//! - **Already inside the library on this thread** (the library's own
//!   call): no lock, no allocation; the plain system call on the program's
//!   descriptor.
//! - **In a `vfork` child before `exec`:** the parent's memory: no lock,
//!   no allocation, nothing written but what `exec` needs.
//! - **In `fork`:** the library's `fork` hook closes the gate
//!   ([`gate::close_for_fork`]) so that no lock is held at the real
//!   `fork`; any daemon round trip happens there, before the real `fork`,
//!   never in a `pthread_atfork` handler.
//! - **On a thread the library started** ([`threads`]): every hook
//!   passes its calls straight on, as inside the library, and never waits
//!   for the fork gate; such threads take no signal.
//! - **In `_exit`:** nothing: what a process hands back, it hands back at
//!   `exit` or at its last close; what a child that `_exit`s held is
//!   reclaimed as after a `SIGKILL`.

#![warn(missing_docs)]

pub mod alloc;
pub mod clone;
pub mod copy;
pub mod fdslots;
pub mod gate;
pub mod guard;
pub mod hooks;
pub mod retire;
pub mod seqlock;
pub mod signal;
pub mod sync;
pub mod threads;
