//! Test helpers for mapfs.
//!
//! - [`MountSession`]: a real `mapfs mount` over temporary directories that is
//!   unmounted (and its directories removed) on drop, even when the test panicked.
//! - [`user`]: running programs or raw syscalls as another user (`nobody`) for
//!   permission tests.
//! - [`fsx`]: the seeded random-operation exerciser with an in-memory byte
//!   model, also available as the `mapfs-fsx` binary.

#![warn(missing_docs)]

pub mod fsx;
pub mod libc_io;
pub mod mount;
pub mod user;

pub use mount::{fuse_available, is_mounted, DataMode, MountBuilder, MountSession};
pub use user::{
    command_as, command_as_nobody, run_as, run_as_nobody, sh_as_nobody, NOBODY_GID, NOBODY_UID,
};

/// Returns `true` when tests needing a real FUSE mount can run; otherwise prints
/// loudly why `test` is skipped, so a skipped run is never mistaken for a pass.
pub fn fuse_or_skip(test: &str) -> bool {
    if fuse_available() {
        return true;
    }
    eprintln!("!!!!! SKIPPED {test}: /dev/fuse is missing, no FUSE mount possible !!!!!");
    false
}
