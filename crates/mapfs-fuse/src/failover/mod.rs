//! Daemon failover: a supervisor keeps the FUSE connection and what the
//! kernel refers to, so that a daemon that dies (crash, panic, OOM kill,
//! SIGKILL) is replaced on the same connection without any program seeing
//! an error, and `mapfs restart` replaces one on purpose.
//!
//! A FUSE connection lives as long as any process holds a descriptor of it
//! ([`supervisor`] keeps one). The kernel keeps the writeback cache's dirty
//! pages and, asked with `FUSE_NOTIFY_RESEND` (Linux 6.9), sends again every
//! request the dead daemon had read but not answered. A new daemon resumes
//! the connection without INIT (a small addition to fuser, see
//! `crates/mapfs-fuser/README.md`), rebuilds the inode table and the open handles from
//! the records the old one sent before each reply ([`records`], [`link`]),
//! reopens each open file through the file system, and asks for the resend.
//! Data is never in the records: it is in the backing files (plfs recovers
//! the index of a log whose writer died; see its docs).

pub mod eio;
pub mod link;
pub mod records;
pub mod ring;
pub mod supervisor;

pub use link::{Link, Resume, Start};
