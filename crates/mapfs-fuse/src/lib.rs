//! The FUSE adapter of mapfs: translates kernel requests into
//! [`mapfs::FileSystem`] calls and executes data requests with the daemon or
//! kernel-passthrough executor.

#![warn(missing_docs)]

pub mod adapter;
pub mod control;
pub mod failover;
pub mod handles;
pub mod inodes;
pub mod mount;
pub mod pagecache;
pub mod ratelimit;
pub mod registry;
pub mod stats;
pub mod sys;

pub use adapter::{AdapterOptions, DataMode};
pub use mount::{
    mount, parse_options, resume, MountOptions, Mounted, Transport, Unmounter, FSTYPE,
    TRANSPORT_ENV,
};
