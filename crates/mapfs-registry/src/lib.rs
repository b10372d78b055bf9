//! The file systems a mapfs program knows, by name: a [`Registry`] of
//! [`FsSpec`]s, each a constructor and what the executors must know about
//! it, and the spec of embedded mode ([`embed_spec`], `run --embed
//! FS:BACKING:PREFIX`) as it travels to every process of a job.
//!
//! `mapfs-cli` mounts what a registry holds and `mapfs-embed` runs it
//! inside programs; both take the registry from here, so an embedded
//! library links neither the command line nor FUSE. A program builds its
//! registry with the re-exports of `mapfs_cli` (`mapfs_cli::Registry` is
//! this crate's). [`builtins`] is the `mapfs` binary's own registry.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod embed_spec;
pub mod registry;

pub use registry::{builtins, embeddable, embeddable_full, Build, FsOptions, FsSpec, Registry};

/// File name of the embedded-mode library of `mapfs`'s own file systems
/// (`--embed`, crates/mapfs-embed-builtins), built next to the `mapfs`
/// binary.
pub const EMBED_LIB: &str = "libmapfs_embed_builtins.so";

/// File name of the embedded-mode library that serves `versions` as well
/// as every file system of [`EMBED_LIB`] (it links SQLite, which every
/// process of a job that does not embed `versions` is spared).
pub const EMBED_FULL_LIB: &str = "libmapfs_embed_full.so";
