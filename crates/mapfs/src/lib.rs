//! mapfs core: everything a stackable user-space file system needs that is not
//! FUSE.
//!
//! A file system ("cFS") implements [`FileSystem`]: path-based namespace
//! operations plus `open`/`create`/`release`/`remap`, which produce and retire a
//! [`DataMap`] per open file. Reads and writes never reach cFS code: the
//! [`engine`] executes them against the map and the backing files. Executors
//! (the FUSE daemon, kernel passthrough, the preload shim) live in other crates
//! and call into this one; nothing here knows who calls it.

#![warn(missing_docs)]

pub mod backing;
pub mod carry;
pub mod control;
pub mod creds;
pub mod datamap;
pub mod engine;
pub mod error;
pub mod fs;
pub mod housekeeping;
pub mod lentsize;
pub mod mapcache;
pub mod preload_report;
pub mod stats;

pub use datamap::{DataMap, Extent, Extents, Growth, Placement, Segment};
pub use error::{Error, Result};
pub use fs::{
    Attr, Ctx, DirEntry, FileKind, FileSystem, OpenFlags, Opened, RenameFlags, SetAttr, StatFs,
    TimeSet,
};
