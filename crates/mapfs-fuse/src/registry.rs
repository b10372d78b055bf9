//! What the adapter shares with the control socket: the open files, by FUSE
//! handle, the proofs that a client holds one, and cache invalidation.
//!
//! The preload shim first opens a file through the mount, so the kernel checks
//! the caller's permissions; it then proves it holds that open (an ioctl on
//! its descriptor, answered by the adapter with a proof from [`Proofs`]) and
//! asks over the control socket for that open's map and backing files.
//!
//! The registry also owns the clients' map-cache tokens
//! ([`mapfs::mapcache::Generations`]): the control server sends the table
//! with a connection's first adoption and reports adoptions and client
//! closes, which may bump.

use std::fs::File;
use std::sync::Arc;

use mapfs::control::MountStatus;
use mapfs::engine::DataFile;
use mapfs::lentsize::LentSize;
use mapfs::mapcache::Generations;
use mapfs::DataMap;

use crate::control::proofs::Proofs;

/// One open of a file through the mount, as the control socket sees it.
#[derive(Debug, Clone)]
pub struct OpenInfo {
    /// FUSE inode number (what `fstat` on the mount fd reports as `st_ino`).
    pub ino: u64,
    /// The FUSE file handle of this open.
    pub fh: u64,
    /// `open(2)` flags of this open.
    pub flags: i32,
    /// The opener's fsuid.
    pub uid: u32,
    /// The opener's fsgid.
    pub gid: u32,
    /// The data state shared with the daemon executor.
    pub data: Arc<DataFile>,
    /// Snapshot of the map at the time of the query.
    pub map: DataMap,
    /// Backing files of the map (whole-file maps: exactly one).
    pub files: Vec<Arc<File>>,
}

/// Implemented by the adapter; queried by the control socket server.
pub trait OpenRegistry: Send + Sync + 'static {
    /// The open file with FUSE handle `fh`, if it is still open.
    fn open(&self, fh: u64) -> Option<OpenInfo>;

    /// The proofs of possession this mount issues (see
    /// [`crate::control::proofs`]).
    fn proofs(&self) -> &Proofs;

    /// What the mount serves (the control server fills in `pid` and
    /// `clients`).
    fn status(&self) -> MountStatus;

    /// The kernel writeback cache is on (nothing is adopted then). Asked at
    /// every Hello and adoption, so cheaper than [`OpenRegistry::status`].
    fn writeback_cache(&self) -> bool {
        self.status().writeback_cache
    }

    /// The request counters (see [`crate::stats`]); with `reset`, counting
    /// starts again from zero after this snapshot. The default, for
    /// registries that count nothing, is empty.
    fn stats(&self, reset: bool) -> mapfs::stats::MountStats {
        let _ = reset;
        mapfs::stats::MountStats::default()
    }

    /// Subscribes control connection `conn` to the request trace with a
    /// filter (or changes its filter) and takes the requests it has
    /// queued, with the number dropped (see [`crate::stats::Tracer`]).
    /// `None` for an unknown opcode name, or from registries that trace
    /// nothing (the default).
    fn trace(
        &self,
        conn: u64,
        op: Option<&str>,
        pid: Option<u32>,
    ) -> Option<(Vec<mapfs::stats::TraceEvent>, u64)> {
        let _ = (conn, op, pid);
        None
    }

    /// Runs the file system's online tool `name` for a control client with
    /// credentials `ctx` (see `mapfs::FileSystem::tool`); called on a thread
    /// of its own, one tool at a time. The default, for registries without
    /// a file system, has none (`ENOSYS`).
    fn tool(&self, ctx: &mapfs::Ctx, name: &str, input: &[u8]) -> mapfs::Result<Vec<u8>> {
        let _ = (ctx, name, input);
        Err(mapfs::Error::not_implemented())
    }

    /// Control connection `conn`, subscribed to the trace, closed.
    fn trace_end(&self, conn: u64) {
        let _ = conn;
    }

    /// Drops the kernel's cached attributes and pages of `ino` (after a shim
    /// client wrote to it), so the next `stat`/`read` through the mount sees
    /// the new size and bytes, and bumps its map-cache token.
    fn invalidate(&self, ino: u64);

    /// Installs the map a shim client reports for the lent open `fh`
    /// (non-whole-file maps) and hands it to the file system's `flush`
    /// (`release` sees it too), and bumps the inode's map-cache token.
    fn client_released(&self, fh: u64, map: DataMap);

    /// Marks the open `fh` as lent to a shim client (or not any more): see
    /// [`mapfs::control::Request::Adopt`]'s `engine`. A writable lending
    /// comes with the page where the client keeps its map's size, which
    /// attribute replies then report.
    fn lend(&self, fh: u64, lent: bool, size: Option<Arc<LentSize>>);

    /// The map-cache generation table to send with a connection's first
    /// adoption, if there is one.
    fn generations(&self) -> Option<&Generations>;

    /// Open `fh`, writable and about to be lent to a client that runs its
    /// map, made able to place writes first (see
    /// [`mapfs::engine::DataFile::make_writable`]): a client cannot call
    /// the file system's `remap`, and would hand the open back to the
    /// mount at its first write. Returns the open as it is then (`None`
    /// once released). The default, for registries whose maps need no
    /// room made, is [`OpenRegistry::open`].
    fn ready_to_write(&self, fh: u64) -> mapfs::Result<Option<OpenInfo>> {
        Ok(self.open(fh))
    }

    /// The client running lent open `fh`'s map (`map`, checked already)
    /// met a write at `offset..offset+len` the map cannot place: installs
    /// `map`, has the file system's `remap` make room (see
    /// [`mapfs::engine::DataFile::remap_for_write`]) and returns the open as
    /// it is then (`None` once released). The default refuses (`ENOSYS`).
    fn client_remap(
        &self,
        fh: u64,
        map: DataMap,
        offset: u64,
        len: u64,
    ) -> mapfs::Result<Option<OpenInfo>> {
        let _ = (fh, map, offset, len);
        Err(mapfs::Error::not_implemented())
    }

    /// `open` is about to be handed to a client: bumps the inode's token
    /// if its map is not the last one the daemon saw for the inode (see
    /// `control::tokens::MapTokens::adopting`).
    fn adopting(&self, open: &OpenInfo);

    /// Whether inode `ino` has an open that may write it (through the
    /// mount or lent): such a file's bytes are not copied to a client
    /// ([`mapfs::control::Response::Copied`]), as they may change without
    /// a bump of the inode's token.
    fn has_writer(&self, ino: u64) -> bool;

    /// An open was answered with a copy of its file's bytes (for stats).
    fn copied(&self) {}
}
