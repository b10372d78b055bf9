//! What the adapter shares with the control socket: the open files, found by
//! the process that opened them, and cache invalidation.
//!
//! The preload shim first opens a file through the mount, so the kernel checks
//! the caller's permissions and the daemon sees that open with the caller's
//! pid; it then asks over the control socket for that open's map and backing
//! files. The daemon hands out only what that pid has opened.
//!
//! The registry also owns the clients' map-cache tokens
//! ([`mapfs::mapcache::Generations`]): the control server sends the table
//! with Hello and reports adoptions and client closes, which may bump.

use std::fs::File;
use std::sync::Arc;

use mapfs::engine::DataFile;
use mapfs::mapcache::Generations;
use mapfs::DataMap;

/// One open of a file through the mount, as the control socket sees it.
#[derive(Debug, Clone)]
pub struct OpenInfo {
    /// FUSE inode number (what `fstat` on the mount fd reports as `st_ino`).
    pub ino: u64,
    /// The FUSE file handle of this open.
    pub fh: u64,
    /// `open(2)` flags of this open.
    pub flags: i32,
    /// The data state shared with the daemon executor.
    pub data: Arc<DataFile>,
    /// Snapshot of the map at the time of the query.
    pub map: DataMap,
    /// Backing files of the map (whole-file maps: exactly one).
    pub files: Vec<Arc<File>>,
}

/// Implemented by the adapter; queried by the control socket server.
pub trait OpenRegistry: Send + Sync + 'static {
    /// The opens of inode `ino` whose FUSE request carried `pid`, most
    /// recent first. The kernel (6.18) reports the opening *thread's* id, so
    /// the control server asks with the peer's live thread ids as well as its
    /// pid.
    fn opens_by(&self, pid: u32, ino: u64) -> Vec<OpenInfo>;

    /// Drops the kernel's cached attributes and pages of `ino` (after a shim
    /// client wrote to it), so the next `stat`/`read` through the mount sees
    /// the new size and bytes, and bumps its map-cache token.
    fn invalidate(&self, ino: u64);

    /// Installs the map a shim client reports for the lent open `fh`
    /// (non-whole-file maps) and hands it to the file system's `flush`
    /// (`release` sees it too), and bumps the inode's map-cache token.
    fn client_released(&self, fh: u64, map: DataMap);

    /// Marks the open `fh` as lent to a shim client (or not any more): see
    /// [`mapfs::control::Request::Adopt`]'s `engine`.
    fn lend(&self, fh: u64, lent: bool);

    /// The map-cache generation table to send with Hello, if there is one.
    fn generations(&self) -> Option<&Generations>;

    /// `open` is about to be handed to a client: bumps the inode's token
    /// if its map is not the last one the daemon saw for the inode (see
    /// `control::tokens::MapTokens::adopting`).
    fn adopting(&self, open: &OpenInfo);
}
