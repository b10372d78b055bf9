//! The built-in mapfs file systems, one module per mapping pattern, each
//! written only against the public API of the `mapfs` crate. Programs
//! register them by name (the `mapfs` binary: `mapfs_cli::builtins`), as
//! any outside file system registers itself.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod pack;
pub mod passthrough;
pub mod plfs;
pub mod sole;
pub mod versions;
