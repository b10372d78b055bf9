//! The control protocol between a mount's daemon and attached preload-shim
//! clients (DESIGN: "preload shim, attached"; docs/security.md).
//!
//! # Contract
//!
//! The shim never asks the daemon to open anything. It opens through the
//! mount first, so the kernel checks the caller's permissions and the daemon
//! sees that open; only then does it ask, over this socket, to *adopt* that
//! open: the daemon answers with the open's [`DataMap`] and a private
//! descriptor of each backing file (SCM_RIGHTS).
//!
//! # Proof of possession
//!
//! A client proves that it holds the open it wants, right now, by what it
//! holds, never by a process or thread id (the kernel reuses those):
//!
//! 1. At [`Request::Hello`] the daemon gives the connection a random
//!    [`ConnKey`].
//! 2. The client issues the ioctl [`PROVE_IOCTL`] on its own descriptor of
//!    the mount file ([`prove`]), passing the key. The kernel delivers it to
//!    the daemon as `FUSE_IOCTL` carrying the FUSE file handle of exactly
//!    that open file description, so only a holder of the open can make it.
//!    The daemon answers with a [`Proof`]: a random, single-use nonce bound
//!    to that handle, to the key (so to the connection), to the ioctl
//!    caller's uid and gid, and valid for [`PROOF_TTL`].
//! 3. [`Request::Adopt`] (and [`Request::Changed`]) present the proof. The
//!    daemon redeems it only on the connection that owns the key, and only
//!    if the connection's peer (`SO_PEERCRED`) has the uid and gid of the
//!    ioctl's caller and of the open itself (root clients excepted).
//!
//! Everything else a client may send refers to *handles* the daemon gave
//! that same connection ([`Response::Adopted`]); handles of other
//! connections are unknown to it.
//!
//! # Transport
//!
//! One `SOCK_SEQPACKET` UNIX socket per mount, at [`socket_path`]. Every
//! message is one packet: a version byte ([`VERSION`]) followed by a
//! `postcard`-encoded [`Request`] or [`Response`]. Each request gets exactly
//! one response, and a client sends its next request only after reading the
//! answer (a daemon drops a connection whose answers it cannot deliver).
//! Descriptors travel only from the daemon: with [`Response::Adopted`] (the
//! backing files, then the generation table). Clients cannot send
//! descriptors (the daemon disables `SCM_RIGHTS` on its sockets, and drops a
//! connection that sends some anyway). A client holds one connection per
//! mount per process (a forked child reconnects), so the daemon can drop a
//! client's state when its connection closes. The daemon closes connections
//! that have nothing adopted and stay idle for a while, and caps
//! connections per uid and in total; a client reconnects when it finds its
//! connection closed.
//!
//! # Map cache tokens
//!
//! The table sent with a connection's first [`Response::Adopted`]
//! ([`Generations`]) lets a client cache adopted maps and backing
//! descriptors per inode and reuse them at a later open of an unchanged file
//! without asking again. The contract (see [`crate::mapcache`]): the client
//! reads [`Generations::token`] of the inode after its `open(2)` through the
//! mount returned and before it sends [`Request::Adopt`], and caches the
//! answer under that token. *A token read after a later `open(2)` through
//! the mount returned equals the cached one only if the daemon has seen no
//! change of that inode's map, size or name since*: the daemon bumps the
//! inode's token after any such change and before replying to the request
//! that caused it (open or create with a different map or for writing,
//! writes, truncation, fallocate, copy_file_range, release with a changed
//! map, unlink, rmdir, rename, forget, and [`Request::Closed`] /
//! [`Request::Changed`] / [`Request::Release`] of a client's writable
//! adoption). Changes made behind the mount's back (in the backing
//! directory) are not seen. Tokens are only comparable within one table,
//! that is one daemon (a client reconnecting to the same mount gets the same
//! table). What the table reveals to a client that holds it: when any inode
//! number of the mount changes (not what, nor by whom); it is handed only to
//! clients that adopted a file.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use crate::datamap::DataMap;
use crate::lentsize::LentSize;
use crate::mapcache::Generations;
use crate::stats::{MountStats, TraceEvent};

/// Protocol version, the first byte of every packet. Bumped on any change of
/// the message types; a peer seeing another version refuses the message.
/// Version 4: proof of possession replaces pid/tid identity; `Status`,
/// `Changed`; the generation table comes with the first adoption.
/// Version 5: `Stats` (request counters, [`crate::stats`]) and `Trace`.
/// Version 6: `Remap`/`Remapped`, and maps with [`crate::Growth::Guarded`].
/// Version 7: `Copied`; [`crate::stats::MountStats::copies`].
/// Version 8: `MapPart`; the map of `Release` and `Remap` is optional
/// (`None`: the parts sent before).
pub const VERSION: u8 = 8;

/// Largest file whose adoption a daemon may answer with a copy of its bytes
/// ([`Response::Copied`]).
pub const COPY_MAX: u64 = 128 * 1024;

/// How often a client reading copies ([`Response::Copied`]) checks that the
/// daemon that made them still runs (its connection did not hang up): a
/// daemon that replaces a dead one bumps a table of its own, which the
/// client does not have yet.
pub const COPY_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// How long a supervisor waits after a daemon's death before it starts the
/// next one: more than twice [`COPY_CHECK`], so every client has noticed the
/// death, and stopped reading its copies, before the successor can serve a
/// write.
pub const COPY_NOTICE: std::time::Duration = std::time::Duration::from_millis(25);

/// Largest packet either side sends or accepts.
pub const MAX_PACKET: usize = 256 * 1024;

/// Largest encoded map a [`Request::Release`] or [`Request::Remap`] carries
/// itself; a larger one goes first in [`Request::MapPart`]s of at most this
/// size. Well below [`MAX_PACKET`]: a packet must also fit the socket's send
/// buffer (`net.core.wmem_default`, 208 KiB by default), or `sendmsg` fails
/// with `EMSGSIZE`.
pub const MAP_INLINE: usize = 128 * 1024;

/// Largest encoded map a daemon's answer ([`Response::Adopted`],
/// [`Response::Remapped`]) carries: the rest of the answer must fit too,
/// below the default socket send buffer (208 KiB). A daemon lends no open
/// whose map is larger (the mount serves it).
pub const ANSWER_MAP_MAX: usize = 192 * 1024;

/// Maps of at most this many pieces ([`DataMap::piece_count`]) fit in
/// [`MAP_INLINE`] whatever their numbers (an extent encodes in at most 35
/// bytes), so senders need not encode them first to know.
pub const SURELY_INLINE_PIECES: usize = MAP_INLINE / 40;

/// True when `map`'s encoding is at most `bound` bytes ([`MAP_INLINE`] for
/// a client's request, [`ANSWER_MAP_MAX`] for a daemon's answer).
pub fn map_fits(map: &DataMap, bound: usize) -> bool {
    map.piece_count() <= SURELY_INLINE_PIECES || encode_map(map).is_ok_and(|b| b.len() <= bound)
}

/// Most extents a lent writable open's map may reach in a client: a write
/// that would pass it hands the open back to the mount (whose daemon keeps
/// the map), so every map a client pushes fits in [`MAX_MAP_BYTES`].
pub const MAX_LENT_EXTENTS: usize = 1 << 20;

/// Most bytes of [`Request::MapPart`]s a daemon holds for one connection
/// (an extent encodes in at most 35 bytes: [`MAX_LENT_EXTENTS`] of them, with
/// room to spare); more is refused with `EFBIG`.
pub const MAX_MAP_BYTES: usize = 40 * MAX_LENT_EXTENTS;

/// Most backing descriptors one [`Response::Adopted`] carries (DeFUSE's limit
/// of 16 parts per map); opens with more backing files are not adopted.
pub const MAX_FDS: usize = 16;

/// Environment variable overriding the directory of control sockets
/// (default [`DEFAULT_RUNTIME_DIR`]); daemon and clients must agree.
pub const RUNTIME_DIR_ENV: &str = "MAPFS_RUNTIME_DIR";

/// Default directory of control sockets.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/mapfs";

/// How long a client waits for the daemon before giving up (and falling back
/// to the mount), so a hung daemon cannot hang the application forever.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection's secret, given at [`Request::Hello`] and passed in the
/// [`PROVE_IOCTL`] so a proof is bound to the connection that asked for it.
pub type ConnKey = [u8; 16];

/// A single-use proof that a connection's process holds an open of the
/// mount (see the module docs).
pub type Proof = [u8; 16];

/// How long a [`Proof`] may wait before it is redeemed.
pub const PROOF_TTL: Duration = Duration::from_secs(10);

/// The ioctl a client issues on its descriptor of a mount file to get a
/// [`Proof`] for that open: `_IOWR('M', 0xA0, [u8; 16])`, the [`ConnKey`]
/// in, the proof out (same buffer).
pub const PROVE_IOCTL: u32 = (3 << 30) | (16 << 16) | ((b'M' as u32) << 8) | 0xA0;

/// A message from a shim client to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message on a connection.
    Hello {
        /// The client's [`VERSION`].
        version: u8,
    },
    /// What the daemon serves ([`Response::Status`]); needs no Hello.
    Status,
    /// The daemon's request counters ([`Response::Stats`]); needs no Hello.
    Stats {
        /// Start counting afresh after this answer. Only the mount's owner
        /// (the daemon's uid) or root may; others get `EPERM`.
        reset: bool,
    },
    /// The requests the daemon served since this connection's previous
    /// `Trace` ([`Response::Trace`]); the first one starts tracing for the
    /// connection, which lasts until it closes. Only the mount's owner (the
    /// daemon's uid) or root may (`EPERM`): a trace shows who does what.
    /// Needs no Hello.
    Trace {
        /// Only requests of this FUSE opcode (`GETATTR`...).
        op: Option<String>,
        /// Only requests of this process.
        pid: Option<u32>,
    },
    /// Hand over the open proven by `proof` (see the module docs).
    Adopt {
        /// From [`prove`] on the application's descriptor of the open, with
        /// this connection's key.
        proof: Proof,
        /// Current `F_GETFL` flags of the mount descriptor: the access mode
        /// must match the open's; `O_APPEND`, `O_NONBLOCK`, `O_DIRECT`,
        /// `O_NOATIME`, `O_SYNC`/`O_DSYNC` are applied to the handed-out
        /// descriptors.
        flags: i32,
        /// The client can run a map that is not whole-file 1-to-1 in its own
        /// data engine now (it is not about to hand the descriptor to a
        /// stdio stream, `mmap` or `fork`). Such an open is then *lent*: the
        /// client executes its data calls until it sends [`Request::Closed`],
        /// pushing its map with [`Request::Release`] before any `close(2)`
        /// or `fsync` of the mount descriptor, and the daemon answers `EIO`
        /// to reads and writes of that open through the mount meanwhile.
        engine: bool,
    },
    /// The last descriptor of an adoption was closed. When `wrote`, the
    /// daemon drops the kernel's cached attributes and pages of its inode
    /// before answering (close-to-open consistency for readers through the
    /// mount). Also ends the lending of a lent open (see
    /// [`Request::Adopt`]'s `engine`), whether the client closed it or
    /// handed it back to the mount. Refused for a handle this connection
    /// was not given.
    Closed {
        /// The handle from [`Response::Adopted`].
        handle: u64,
        /// The client wrote through the adoption.
        wrote: bool,
    },
    /// The client wrote to a writable open it holds but has no handle for (a
    /// backing file it reopened from its map cache, or an adoption inherited
    /// across `exec`), and closed it: as [`Request::Closed`] with `wrote`,
    /// for the open proven by `proof`.
    Changed {
        /// From [`prove`] on a descriptor of the open.
        proof: Proof,
    },
    /// The current map of a lent writable open (the client executed its data
    /// calls itself), installed as the open's map so that the file system's
    /// `flush`, `fsync` and `release` persist it. Sent before every
    /// `close(2)` and `fsync` of the open's mount descriptor, and may be sent
    /// at any time; the open stays lent until [`Request::Closed`]. The
    /// daemon refuses a map whose new extents are not in the open's own log
    /// within what was written to it.
    Release {
        /// The handle from [`Response::Adopted`].
        handle: u64,
        /// The open's current map; `None`: the map whose encoding the
        /// [`Request::MapPart`]s for `handle` sent since the previous
        /// `Release` or `Remap` (a map larger than [`MAP_INLINE`]).
        map: Option<DataMap>,
    },
    /// A lent writable open met a write at `offset..offset+len` its map
    /// cannot place: the daemon installs `map` (checked as for
    /// [`Request::Release`]), has the file system's `remap` make room, and
    /// answers [`Response::Remapped`]. A client may instead hand the open
    /// back to the mount.
    Remap {
        /// The handle from [`Response::Adopted`].
        handle: u64,
        /// The open's current map (`None`: as for [`Request::Release`]).
        map: Option<DataMap>,
        /// Where the write starts.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A part of the encoding ([`encode_map`]) of a map too large for one
    /// packet, for the next [`Request::Release`] or [`Request::Remap`] of
    /// `handle` that carries no map itself. Parts are joined in the order
    /// sent; a part for another handle drops the parts held (a client sends
    /// one large map at a time on a connection). Answered with
    /// [`Response::Done`]; refused with `EFBIG` past [`MAX_MAP_BYTES`] (the
    /// parts held are dropped).
    MapPart {
        /// The handle from [`Response::Adopted`].
        handle: u64,
        /// The next bytes of the encoding, at most [`MAP_INLINE`].
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// Run the file system's online tool `name` on `input` (see
    /// `FileSystem::tool`); answered with [`Response::Tool`]. Only the
    /// mount's owner (the daemon's uid) or root may (`EPERM`); one tool
    /// runs at a time (`EBUSY`). The connection ends with the answer.
    /// Needs no Hello.
    Tool {
        /// The tool's name (`compact`, `stats`, `check` for pack).
        name: String,
        /// Its arguments, encoded as the file system documents.
        #[serde(with = "serde_bytes")]
        input: Vec<u8>,
    },
}

/// What a daemon serves, for `mapfs list` and `mapfs run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountStatus {
    /// The daemon's process id (in its own pid namespace).
    pub pid: u32,
    /// File system name.
    pub fs: String,
    /// Backing directory.
    pub backing: String,
    /// Data executor asked for (`auto`, `daemon`, `passthrough`).
    pub data: String,
    /// Kernel passthrough is in use (not refused by the kernel).
    pub passthrough_active: bool,
    /// The kernel writeback cache is on: nothing is adopted, since the
    /// kernel would keep stale sizes of files written natively.
    pub writeback_cache: bool,
    /// When the daemon started serving (seconds since the epoch).
    pub started_unix: u64,
    /// Control connections open now.
    pub clients: u32,
    /// Control connections accepted since the daemon started (a `Status`
    /// request's own included).
    pub connections: u64,
    /// Files open through the mount now (the kernel's RELEASE of an open
    /// arrives after its `close(2)` returned; this shows when it did).
    pub open_files: u64,
}

/// A message from the daemon to a shim client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello {
        /// The daemon's [`VERSION`].
        version: u8,
        /// This connection's key, for [`prove`].
        key: ConnKey,
        /// The kernel writeback cache is on: the daemon adopts nothing.
        writeback_cache: bool,
    },
    /// Answer to [`Request::Status`].
    Status(MountStatus),
    /// Answer to [`Request::Stats`]: the counters before any reset.
    Stats(Box<MountStats>),
    /// Answer to [`Request::Trace`].
    Trace {
        /// The requests served since the previous `Trace`, oldest first.
        events: Vec<TraceEvent>,
        /// Requests that matched but were dropped since then because this
        /// client read too slowly (the daemon keeps a bounded queue).
        dropped: u64,
    },
    /// Answer to [`Request::Adopt`]; `files` descriptors are attached, one
    /// per backing file of `map`, each a private open file description
    /// (own offset and status flags), close-on-exec, then the size page
    /// when `size_slot`, then the generation table when `generations`.
    Adopted {
        /// Names this adoption in later requests on the same connection.
        handle: u64,
        /// The open's map.
        map: DataMap,
        /// Number of backing descriptors attached.
        files: u32,
        /// A writable lending: a [`LentSize`] page follows the backing
        /// files, where the client keeps its map's size.
        size_slot: bool,
        /// A descriptor of the daemon's generation table ([`Generations`])
        /// follows the backing files (the first adoption on a connection).
        generations: bool,
    },
    /// Answer to [`Request::Adopt`] of a read-only open whose map the
    /// client may not run (its backing file holds other users' files, as a
    /// pack file's slots do): the file's bytes, at most [`COPY_MAX`]. The
    /// client reads them in its own memory for as long as the inode's token
    /// stays the one it read before asking (every change to the file bumps
    /// it; the daemon copies only files no writer has open) and the daemon
    /// runs ([`COPY_CHECK`]), then hands the open back to the mount. The
    /// generation table follows when `generations` (no other descriptor).
    Copied {
        /// The file's bytes, from offset 0 to its size.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
        /// A descriptor of the daemon's generation table is attached (the
        /// first adoption on a connection).
        generations: bool,
    },
    /// Answer to [`Request::Remap`]: the open's map from now on; `files`
    /// descriptors are attached (as for [`Response::Adopted`]) when its
    /// backing files changed, none when they stay as they were.
    Remapped {
        /// The new map.
        map: DataMap,
        /// Number of backing descriptors attached (0: the same files).
        files: u32,
    },
    /// The request cannot be served; the client falls back to the mount.
    Refused {
        /// Why, as an errno.
        errno: i32,
        /// Why, for logs and the shim's report.
        reason: String,
    },
    /// Answer to requests that return nothing.
    Done,
    /// Answer to [`Request::Tool`]: what the tool returned.
    Tool {
        /// Its output, encoded as the file system documents.
        #[serde(with = "serde_bytes")]
        output: Vec<u8>,
    },
}

/// Encodes a message as one packet (version byte + postcard).
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut out = vec![VERSION];
    let body = postcard::to_stdvec(msg).map_err(io::Error::other)?;
    out.extend_from_slice(&body);
    if out.len() > MAX_PACKET {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(out)
}

/// The encoding of a map that [`Request::MapPart`]s carry.
pub fn encode_map(map: &DataMap) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(map).map_err(io::Error::other)
}

/// The map whose encoding `bytes` are (joined [`Request::MapPart`]s); fails
/// with `EPROTO` on garbage.
pub fn decode_map(bytes: &[u8]) -> io::Result<DataMap> {
    postcard::from_bytes(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EPROTO))
}

/// Decodes one packet; fails with `EPROTO` on a version mismatch or garbage.
pub fn decode<T: for<'de> Deserialize<'de>>(packet: &[u8]) -> io::Result<T> {
    match packet.split_first() {
        Some((&VERSION, body)) => {
            postcard::from_bytes(body).map_err(|_| io::Error::from_raw_os_error(libc::EPROTO))
        }
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Sends one message with `fds` attached.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let packet = encode(msg)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS
        || (!fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)))
    {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    let iov = [io::IoSlice::new(&packet)];
    loop {
        match rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) if n == packet.len() => return Ok(()),
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::EMSGSIZE)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

thread_local! {
    /// Receive buffer, allocated (and zeroed) once per thread rather than
    /// once per message: a fresh 256 KiB buffer costs more than the rest of
    /// an exchange.
    static RECV_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Receives one message and its attached descriptors (close-on-exec).
/// Returns `Ok(None)` when the peer closed the connection.
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let fresh = |sock| recv_into(sock, &mut vec![0u8; MAX_PACKET]);
    // The thread-local buffer is gone in exit-time destructors, and busy if
    // re-entered: a buffer of its own then.
    RECV_BUF
        .try_with(|b| match b.try_borrow_mut() {
            Ok(mut buf) => {
                if buf.len() < MAX_PACKET {
                    buf.resize(MAX_PACKET, 0);
                }
                recv_into(sock, &mut buf)
            }
            Err(_) => fresh(sock),
        })
        .unwrap_or_else(|_| fresh(sock))
}

fn recv_into<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    match recv_packet(sock, buf)? {
        None => Ok(None),
        Some((len, fds)) => Ok(Some((decode(&buf[..len])?, fds))),
    }
}

/// Receives one packet into `buf` without decoding it: its length and the
/// descriptors that came with it (close-on-exec). `Ok(None)` when the peer
/// closed the connection; `EMSGSIZE` for a packet or control data that did
/// not fit (its descriptors, if any, are closed).
pub fn recv_packet(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        let mut iov = [io::IoSliceMut::new(buf)];
        match rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => break r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC)
        || got.flags.contains(rustix::net::ReturnFlags::CTRUNC)
    {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(Some((got.bytes, fds)))
}

/// Sends `req` and waits for the response: the client side of one exchange.
pub fn call(sock: BorrowedFd<'_>, req: &Request) -> io::Result<(Response, Vec<OwnedFd>)> {
    if let Err(e) = send(sock, req, &[]) {
        // A daemon that refuses a connection (too many) answers before the
        // client speaks and closes: its answer may still be queued.
        if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
            if let Ok(Some(answer)) = recv_past_reset(sock) {
                return Ok(answer);
            }
        }
        return Err(e);
    }
    recv_past_reset(sock)?.ok_or_else(|| io::Error::from_raw_os_error(libc::ECONNRESET))
}

/// [`recv`] of a response, looking once past a reported reset: when the
/// daemon refused and closed while a request was in flight, the reset is
/// reported first (once) and the answer is still queued behind it.
fn recv_past_reset(sock: BorrowedFd<'_>) -> io::Result<Option<(Response, Vec<OwnedFd>)>> {
    match recv(sock) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => recv(sock).map_err(|_| e),
        other => other,
    }
}

/// A new, unconnected control socket (`SOCK_SEQPACKET`, close-on-exec).
pub fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A client's connection to a daemon, after Hello.
#[derive(Debug)]
pub struct Connection {
    /// The socket (close-on-exec, with [`CLIENT_TIMEOUT`] on every call).
    pub sock: OwnedFd,
    /// This connection's key, for [`prove`].
    pub key: ConnKey,
    /// The daemon adopts nothing (kernel writeback cache on).
    pub writeback_cache: bool,
}

/// Connects to the control socket at `path` and exchanges [`Request::Hello`].
pub fn connect(path: &Path) -> io::Result<Connection> {
    let sock = open_socket(path)?;
    match call(sock.as_fd(), &Request::Hello { version: VERSION })? {
        (
            Response::Hello {
                version: VERSION,
                key,
                writeback_cache,
            },
            _,
        ) => Ok(Connection {
            sock,
            key,
            writeback_cache,
        }),
        (Response::Refused { errno, .. }, _) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Asks the daemon behind the control socket at `path` what it serves.
pub fn status(path: &Path) -> io::Result<MountStatus> {
    let sock = open_socket(path)?;
    match call(sock.as_fd(), &Request::Status)? {
        (Response::Status(s), _) => Ok(s),
        (Response::Refused { errno, .. }, _) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Asks the daemon behind the control socket at `path` for its request
/// counters, and to reset them after answering when `reset`.
pub fn stats(path: &Path, reset: bool) -> io::Result<MountStats> {
    let sock = open_socket(path)?;
    match call(sock.as_fd(), &Request::Stats { reset })? {
        (Response::Stats(s), _) => Ok(*s),
        (Response::Refused { errno, .. }, _) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Runs the online tool `name` of the file system behind the control
/// socket at `path` (see [`Request::Tool`]). A tool may run for long: the
/// answer is awaited without [`CLIENT_TIMEOUT`]. A refusal comes back as
/// an error with the daemon's reason and errno.
pub fn tool(path: &Path, name: &str, input: Vec<u8>) -> io::Result<Vec<u8>> {
    let sock = open_socket(path)?;
    rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Recv, None)?;
    let req = Request::Tool {
        name: name.to_string(),
        input,
    };
    match call(sock.as_fd(), &req)? {
        (Response::Tool { output }, _) => Ok(output),
        (Response::Refused { errno, reason }, _) => Err(io::Error::new(
            io::Error::from_raw_os_error(errno).kind(),
            ToolRefused { errno, reason },
        )),
        _ => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Why a daemon refused a [`Request::Tool`] (inside the `io::Error` that
/// [`tool`] returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRefused {
    /// The errno the daemon gave.
    pub errno: i32,
    /// The daemon's reason.
    pub reason: String,
}

impl std::fmt::Display for ToolRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({})",
            self.reason,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for ToolRefused {}

/// A connected control socket with the client timeouts set.
fn open_socket(path: &Path) -> io::Result<OwnedFd> {
    let sock = socket()?;
    let addr = SocketAddrUnix::new(path)?;
    loop {
        match rustix::net::connect(&sock, &addr) {
            Ok(()) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    for which in [
        rustix::net::sockopt::Timeout::Recv,
        rustix::net::sockopt::Timeout::Send,
    ] {
        rustix::net::sockopt::set_socket_timeout(&sock, which, Some(CLIENT_TIMEOUT))?;
    }
    Ok(sock)
}

/// Asks the daemon, through the kernel, for a [`Proof`] that this process
/// holds the open `mount_file` (a descriptor of a file on the mount) for the
/// connection with `key`. Fails with `ENOTTY` on a file that is not on a
/// mapfs mount.
pub fn prove(mount_file: BorrowedFd<'_>, key: &ConnKey) -> io::Result<Proof> {
    let mut buf: [u8; 16] = *key;
    loop {
        // SAFETY: PROVE_IOCTL encodes a 16-byte in/out argument (_IOWR), and
        // `buf` is a live, writable 16-byte buffer for the whole call. The
        // raw system call bypasses any `ioctl` symbol an LD_PRELOAD library
        // (the shim itself) may interpose.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioctl,
                mount_file.as_raw_fd(),
                libc::c_ulong::from(PROVE_IOCTL),
                buf.as_mut_ptr(),
            )
        };
        if r == 0 {
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Splits the generation table off the descriptors of a
/// [`Response::Adopted`] that said `generations` (it is the last one).
/// `None` when there is none, or it is not a valid table: the client then
/// caches nothing across opens. Call before [`take_size_slot`].
pub fn take_generations(
    fds: &mut Vec<OwnedFd>,
    files: u32,
    generations: bool,
) -> Option<Generations> {
    if !generations || fds.len() <= files as usize {
        return None;
    }
    let fd = fds.pop()?;
    match Generations::attach(fd) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::debug!(error = %e, "daemon's generation table unusable");
            None
        }
    }
}

/// Splits the size page off the descriptors of a [`Response::Adopted`]
/// that said `size_slot` (it follows the backing files; take the
/// generation table first). `None` when there is none or it is not a valid
/// page: the client must then not run the open (the daemon would answer
/// `stat` from an old size).
pub fn take_size_slot(fds: &mut Vec<OwnedFd>, files: u32, size_slot: bool) -> Option<LentSize> {
    if !size_slot || fds.len() != files as usize + 1 {
        return None;
    }
    LentSize::attach(fds.pop()?).ok()
}

/// The control socket of the mount at `mountpoint` (an absolute path, as in
/// `/proc/self/mountinfo`): `<runtime dir>/<escaped mountpoint>.sock`, where
/// the runtime dir is `$MAPFS_RUNTIME_DIR` or `/run/mapfs`, and the mountpoint
/// is escaped like `systemd-escape --path` (`/mnt/a-b` -> `mnt-a\x2db`). A
/// name that would not fit in `sun_path` becomes `h-<64-bit FNV-1a hash>`.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let dir = std::env::var_os(RUNTIME_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME_DIR));
    let name = escape(mountpoint);
    let candidate = dir.join(format!("{name}.sock"));
    // sun_path holds 108 bytes including the terminating NUL.
    if candidate.as_os_str().len() < 108 {
        return candidate;
    }
    dir.join(format!(
        "h-{:016x}.sock",
        fnv1a(mountpoint.as_os_str().as_encoded_bytes())
    ))
}

/// A file name standing for a mountpoint (`/mnt/a-b` -> `mnt-a\x2db`, like
/// `systemd-escape --path`): the daemon's socket, log and pid files use it.
pub fn escape(mountpoint: &Path) -> String {
    let bytes = mountpoint.as_os_str().as_encoded_bytes();
    let trimmed: &[u8] = {
        let mut b = bytes;
        while let [b'/', rest @ ..] = b {
            b = rest;
        }
        while let [rest @ .., b'/'] = b {
            b = rest;
        }
        b
    };
    if trimmed.is_empty() {
        return "-".to_string();
    }
    let mut out = String::with_capacity(trimmed.len());
    for (i, &c) in trimmed.iter().enumerate() {
        match c {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' => out.push(c as char),
            c => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out
}

/// Undoes `/proc/self/mountinfo`'s octal escapes (`\040` for a space).
pub fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The flags of an application's open (`flags`) that a new open file
/// description of the same file keeps: the access mode and status flags,
/// close-on-exec; not the creation flags.
fn reopen_flags(flags: i32) -> OFlags {
    let keep = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_LARGEFILE;
    OFlags::from_bits_retain((flags & keep) as u32) | OFlags::CLOEXEC
}

/// A new open file description of the file `fd` refers to, with the access
/// mode and status flags of an application's open (`flags`, as `F_GETFL`
/// reports them; the creation flags were applied by the open through the
/// mount already), close-on-exec. What the daemon hands a client, and what a
/// client makes of a cached backing file: the kernel checks the opener's
/// permissions on the file again.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    open_like(flags, |oflags| {
        rustix::fs::open(proc_path.as_str(), oflags, Mode::empty())
    })
}

/// Opens a file by `open`, given the open flags, as an application's open
/// with `flags` was made (see [`reopen`], which opens through `/proc`; a
/// caller holding a directory and the name opens by those).
pub fn open_like(
    flags: i32,
    open: impl Fn(OFlags) -> rustix::io::Result<OwnedFd>,
) -> io::Result<OwnedFd> {
    let oflags = reopen_flags(flags);
    match open(oflags) {
        Ok(f) => Ok(f),
        // O_NOATIME needs ownership; drop it rather than the open.
        Err(rustix::io::Errno::PERM) if oflags.contains(OFlags::NOATIME) => {
            Ok(open(oflags - OFlags::NOATIME)?)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/x\\0"), "/x\\0");
    }

    #[test]
    fn escape_matches_systemd_style() {
        assert_eq!(escape(Path::new("/mnt/a-b")), "mnt-a\\x2db");
        assert_eq!(escape(Path::new("/")), "-");
        assert_eq!(escape(Path::new("/tmp/x y/")), "tmp-x\\x20y");
        assert_eq!(escape(Path::new("/.hidden")), "\\x2ehidden");
    }

    #[test]
    fn long_mountpoints_are_hashed_into_sun_path() {
        let long = format!("/{}", "d/".repeat(100));
        let p = socket_path(Path::new(&long));
        assert!(p.as_os_str().len() < 108, "{p:?}");
        assert!(p.file_name().unwrap().to_str().unwrap().starts_with("h-"));
        assert_ne!(p, socket_path(Path::new(&format!("{long}x"))));
    }

    #[test]
    fn codec_round_trips_and_checks_version() {
        let msgs = [
            Request::Hello { version: VERSION },
            Request::Adopt {
                proof: [7; 16],
                flags: libc::O_RDWR | libc::O_APPEND,
                engine: true,
            },
            Request::Closed {
                handle: 3,
                wrote: true,
            },
            Request::Changed { proof: [1; 16] },
            Request::Status,
        ];
        for m in msgs {
            let bytes = encode(&m).unwrap();
            assert_eq!(decode::<Request>(&bytes).unwrap(), m);
            let mut wrong = bytes.clone();
            wrong[0] = VERSION + 1;
            assert!(decode::<Request>(&wrong).is_err());
        }
        let hello = Response::Hello {
            version: VERSION,
            key: [9; 16],
            writeback_cache: false,
        };
        assert_eq!(decode::<Response>(&encode(&hello).unwrap()).unwrap(), hello);
        assert!(decode::<Request>(&[]).is_err());
        assert!(decode::<Request>(&[VERSION, 0xff, 0xff]).is_err());
    }

    #[test]
    fn prove_ioctl_is_iowr_m_a0_16_bytes() {
        assert_eq!(PROVE_IOCTL, 0xC010_4DA0);
    }

    #[test]
    fn descriptors_travel_with_the_message() {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"hello").unwrap();
        let resp = Response::Refused {
            errno: libc::EPERM,
            reason: "test".into(),
        };
        send(a.as_fd(), &resp, &[file.as_fd()]).unwrap();
        let (got, fds) = recv::<Response>(b.as_fd()).unwrap().unwrap();
        assert_eq!(got, resp);
        assert_eq!(fds.len(), 1);
        let mut received = std::fs::File::from(fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut s = String::new();
        received.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        drop(a);
        assert!(recv::<Response>(b.as_fd()).unwrap().is_none());
    }
}
