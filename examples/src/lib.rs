//! Example file systems built on mapfs, each one file and a complete
//! program (`cargo build --release --examples`, then
//! `target/release/examples/NAME --help`):
//!
//! - `union.rs`: a read-write overlay of an upper directory on a read-only
//!   lower one, with whole-file 1-to-1 maps (kernel passthrough and the
//!   preload shim run its data natively);
//! - `concat` (the template crate `templates/concat`, which the tutorial
//!   follows): a read-only file that is the concatenation of the files of
//!   a backing directory, a map of several extents in several files.
//!
//! Their tests (in `tests/`) mount each with its own binary and compare
//! what they show with the same operations on a plain directory.

#![forbid(unsafe_code)]
