//! mapfs core: everything a stackable user-space file system needs that is not
//! FUSE.
//!
//! A file system ("cFS") implements [`FileSystem`]: path-based namespace
//! operations plus `open`/`create`/`release`/`remap`, which produce and retire a
//! [`DataMap`] per open file. Reads and writes never reach cFS code: the
//! [`engine`] executes them against the map and the backing files. Executors
//! (the FUSE daemon, kernel passthrough, the preload shim) live in other crates
//! and call into this one; nothing here knows who calls it.
//!
//! The smallest file system, with only the one method that has no default:
//!
//! ```
//! use std::path::Path;
//! use mapfs::{Attr, Ctx, Error, FileSystem, Result};
//!
//! /// A file system in which nothing exists (not even its root).
//! struct Nothing;
//!
//! impl FileSystem for Nothing {
//!     fn getattr(&self, _ctx: &Ctx, _path: &Path) -> Result<Attr> {
//!         Err(Error::not_found())
//!     }
//! }
//! # let _: std::sync::Arc<dyn FileSystem> = std::sync::Arc::new(Nothing);
//! ```
//!
//! To mount one, a program registers it in a `mapfs_cli::Registry` (crate
//! `mapfs-cli`) and calls `mapfs_cli::main`, which gives it the whole
//! `mapfs` command line (`mount`, `umount`, `run`, `list`...). The tutorial
//! is `docs/writing-a-file-system.md` in the repository; the built-in file
//! systems of crate `mapfs-fs` and the programs in `examples/` are complete
//! ones. Modules hidden from these docs (`carry`, `control`, `lentsize`,
//! `mapcache`) are shared by the mapfs crates and are not a stable API.

#![warn(missing_docs)]

pub mod backing;
pub mod capabilities;
#[doc(hidden)] // shared by the mapfs crates, not a stable API
pub mod carry;
#[doc(hidden)] // shared by the mapfs crates, not a stable API
pub mod control;
pub mod creds;
pub mod datamap;
pub mod engine;
pub mod error;
pub mod fdnum;
pub mod fs;
pub mod housekeeping;
#[doc(hidden)] // shared by the mapfs crates, not a stable API
pub mod lentsize;
#[doc(hidden)] // shared by the mapfs crates, not a stable API
pub mod mapcache;
pub mod nsgen;
pub mod preload_report;
pub mod size;
pub mod stats;

pub use capabilities::{Capabilities, Housekeeping};
pub use datamap::{DataMap, Extent, Extents, Growth, Placement, Segment};
pub use error::{Error, Result};
pub use fs::{
    Attr, Ctx, DirEntry, FileKind, FileSystem, OpenFlags, Opened, RenameFlags, SetAttr, StatFs,
    TimeSet,
};
