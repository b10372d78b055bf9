//! The `mapfs` command line as a library.

pub mod mount_cmd;
pub mod mounts;
pub mod run;
