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

/// Returns `true` when tests needing a real FUSE mount can run; otherwise
/// reports `test` as skipped ([`skip`]), so a skipped run is never
/// mistaken for a pass.
pub fn fuse_or_skip(test: &str) -> bool {
    if fuse_available() {
        return true;
    }
    skip(test, "/dev/fuse is missing, no FUSE mount possible");
    false
}

/// Reports that `test` (or a part of it) did not run, and why.
///
/// libtest hides what a passing test prints, so `scripts/test.sh` runs with
/// `--show-output` and fails on any line with the word `SKIPPED` whose test
/// is not listed in `tests/allowed-skips.txt`. Every skip goes through here
/// so that the line has one shape: `SKIPPED <test>: <reason>`.
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
}

/// Panics unless the program `prog` is on `PATH`; returns `true` so that it
/// reads as a condition next to [`fuse_or_skip`].
///
/// `scripts/deps.sh` installs every program the tests run, so a missing one
/// is a broken setup to be fixed, not a reason to pass without testing.
pub fn need(prog: &str) -> bool {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`{prog}` is not installed: run scripts/deps.sh, which installs every program the tests use"
    );
    true
}
