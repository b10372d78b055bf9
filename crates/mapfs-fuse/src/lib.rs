//! The FUSE adapter of mapfs: translates kernel requests into
//! [`mapfs::FileSystem`] calls and executes data requests with the daemon or
//! kernel-passthrough executor.

pub mod registry;
