//! The daemon's control socket: attached preload-shim clients adopt opens
//! they made through the mount (protocol in [`mapfs::control`]).
//!
//! # Security
//!
//! A client never names a path: it names an inode it already opened through
//! the mount, so the kernel has already checked its permissions. The server
//! learns the client's pid from `SO_PEERCRED` and hands out only opens the
//! registry recorded for that pid or one of its threads (the kernel reports
//! the opener of a FUSE request by its thread id on some kernels and by its
//! thread-group id on others, so both are tried; a claimed thread id must be
//! a live thread of the peer, checked in `/proc/<pid>/task`). The access mode
//! of the handed-out descriptor is the open's own.
//!
//! # Descriptors
//!
//! Each adoption gets a *private* open file description of the backing file
//! (reopened through `/proc/self/fd`), so its offset and status flags belong
//! to the client alone, exactly like a fresh `open(2)`.
//!
//! # Client state
//!
//! Writable adoptions are remembered per connection; when the client reports
//! the close (or its connection drops because it died), the server drops the
//! kernel's cached attributes and pages of the inode through
//! [`OpenRegistry::invalidate`], so readers through the mount see the new
//! size and bytes (close-to-open).
//!
//! # Map cache
//!
//! Hello is answered with the registry's generation table (see
//! [`tokens`] and [`mapfs::mapcache`]) attached, when there is one. An
//! adoption is reported to the registry before the answer
//! ([`OpenRegistry::adopting`]), so an open whose map is no longer the
//! inode's latest invalidates the token the client read after its open.
//!
//! Threads: one accept thread, one thread per client connection; dropping the
//! [`ControlServer`] shuts every connection down, joins the threads and
//! removes the socket file.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use mapfs::control::{self, Request, Response};
use mapfs::Growth;
use parking_lot::Mutex;
use rustix::fs::Mode;
use rustix::net::SocketAddrUnix;

use crate::registry::{OpenInfo, OpenRegistry};

/// A running control socket server. Dropping it stops the server, closes
/// every client connection and removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    shared: Arc<Shared>,
    listener: Arc<OwnedFd>,
    accept: Option<JoinHandle<()>>,
}

/// Most client connections served at once.
const MAX_CLIENTS: usize = 1024;

/// A connection's socket (to shut it down) and its thread (to join it).
type ConnHandle = (Arc<OwnedFd>, JoinHandle<()>);

struct Shared {
    registry: Arc<dyn OpenRegistry>,
    stopping: AtomicBool,
    next_handle: AtomicU64,
    /// Live client connections, by connection id, for shutdown on drop.
    conns: Mutex<HashMap<u64, ConnHandle>>,
}

/// Starts serving the control socket at `socket` (normally
/// [`mapfs::control::socket_path`] of the mountpoint). A stale socket file is
/// replaced; the parent directory is created (mode 0755) if missing. The
/// socket is world-connectable (0666): clients are authenticated per request
/// by their credentials, not by file permissions.
pub fn spawn(registry: Arc<dyn OpenRegistry>, socket: &Path) -> io::Result<ControlServer> {
    if let Some(dir) = socket.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            let _ = rustix::fs::chmod(dir, Mode::from_raw_mode(0o755));
        }
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = control::socket()?;
    rustix::net::bind(&listener, &SocketAddrUnix::new(socket)?)?;
    rustix::fs::chmod(socket, Mode::from_raw_mode(0o666))?;
    rustix::net::listen(&listener, 64)?;
    let listener = Arc::new(listener);
    let shared = Arc::new(Shared {
        registry,
        stopping: AtomicBool::new(false),
        next_handle: AtomicU64::new(1),
        conns: Mutex::new(HashMap::new()),
    });
    let accept = {
        let shared = Arc::clone(&shared);
        let listener = Arc::clone(&listener);
        std::thread::Builder::new()
            .name("mapfs-control".into())
            .spawn(move || accept_loop(&shared, &listener))?
    };
    tracing::info!(socket = %socket.display(), "control socket listening");
    Ok(ControlServer {
        path: socket.to_path_buf(),
        shared,
        listener,
        accept: Some(accept),
    })
}

impl ControlServer {
    /// Where the socket lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of connected clients (for tests and stats).
    pub fn clients(&self) -> usize {
        self.shared.conns.lock().len()
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Linux wakes a blocked accept(2) on shutdown(2) of the listener;
        // a connection attempt is the belt to those braces.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        if let (Ok(s), Ok(addr)) = (control::socket(), SocketAddrUnix::new(&self.path)) {
            let _ = rustix::net::connect(&s, &addr);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let conns: Vec<_> = self.shared.conns.lock().drain().collect();
        for (_, (sock, _)) in &conns {
            let _ = rustix::net::shutdown(sock.as_fd(), rustix::net::Shutdown::Both);
        }
        for (_, (_, thread)) in conns {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &OwnedFd) {
    let mut next_conn = 0u64;
    loop {
        let accepted = rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC);
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let sock = match accepted {
            Ok(s) => Arc::new(s),
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let peer = match rustix::net::sockopt::socket_peercred(&*sock) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "no peer credentials; dropping client");
                continue;
            }
        };
        next_conn += 1;
        let id = next_conn;
        // Held across spawn and insert, so a connection that ends at once
        // cannot remove its entry before it exists.
        let mut conns = shared.conns.lock();
        if conns.len() >= MAX_CLIENTS {
            // One thread per client: a flood of connections must not exhaust
            // the daemon. The refused client serves its files through the
            // mount.
            tracing::warn!(
                pid = peer.pid.as_raw_nonzero().get(),
                "too many control clients; refusing one"
            );
            continue;
        }
        let thread = {
            let shared = Arc::clone(shared);
            let sock = Arc::clone(&sock);
            std::thread::Builder::new()
                .name(format!("mapfs-ctl-{}", peer.pid.as_raw_nonzero()))
                .spawn(move || {
                    let pid = peer.pid.as_raw_nonzero().get() as u32;
                    let mut conn = Conn {
                        shared: &shared,
                        pid,
                        adopted: HashMap::new(),
                        claimed: HashSet::new(),
                    };
                    conn.serve(sock.as_fd());
                    conn.client_gone();
                    shared.conns.lock().remove(&id);
                })
        };
        match thread {
            Ok(t) => {
                conns.insert(id, (sock, t));
            }
            Err(e) => tracing::warn!(error = %e, "cannot start a control connection thread"),
        }
    }
}

/// A writable or lent adoption still open in the client.
struct Adoption {
    ino: u64,
    fh: u64,
    /// The client executes the open's map itself.
    lent: bool,
}

struct Conn<'a> {
    shared: &'a Shared,
    /// Thread-group id of the peer (`SO_PEERCRED`).
    pid: u32,
    adopted: HashMap<u64, Adoption>,
    /// FUSE handles already handed to this client, so two adoptions of the
    /// same inode do not get the same open.
    claimed: HashSet<u64>,
}

impl Conn<'_> {
    fn serve(&mut self, sock: BorrowedFd<'_>) {
        loop {
            let req = match control::recv::<Request>(sock) {
                Ok(Some((req, _fds))) => req,
                Ok(None) => return,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::EPROTO) {
                        let _ = control::send(
                            sock,
                            &refused(libc::EPROTO, "protocol version mismatch"),
                            &[],
                        );
                    } else if !self.shared.stopping.load(Ordering::SeqCst) {
                        tracing::debug!(pid = self.pid, error = %e, "control client read failed");
                    }
                    return;
                }
            };
            let sent = match req {
                Request::Hello { version } if version == control::VERSION => {
                    let table = self.shared.registry.generations().and_then(|t| t.fd());
                    let resp = Response::Hello {
                        version,
                        generations: table.is_some(),
                    };
                    match table {
                        Some(fd) => control::send(sock, &resp, &[fd]),
                        None => control::send(sock, &resp, &[]),
                    }
                }
                Request::Hello { .. } => control::send(
                    sock,
                    &refused(libc::EPROTO, "protocol version mismatch"),
                    &[],
                ),
                Request::Adopt {
                    ino,
                    tid,
                    flags,
                    engine,
                } => match self.adopt(ino, tid, flags, engine) {
                    Ok((resp, fds)) => {
                        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
                        control::send(sock, &resp, &fds)
                    }
                    Err(resp) => control::send(sock, &resp, &[]),
                },
                Request::Closed { handle, ino, wrote } => {
                    let known = self.adopted.remove(&handle);
                    if let Some(a) = &known {
                        self.claimed.remove(&a.fh);
                        if a.lent {
                            self.shared.registry.lend(a.fh, false);
                        }
                    }
                    if wrote || known.is_some() {
                        self.shared.registry.invalidate(ino);
                    }
                    control::send(sock, &Response::Done, &[])
                }
                Request::Release { handle, map } => match self.adopted.get(&handle) {
                    Some(a) => {
                        self.shared.registry.client_released(a.fh, map);
                        control::send(sock, &Response::Done, &[])
                    }
                    None => control::send(sock, &refused(libc::EBADF, "unknown handle"), &[]),
                },
            };
            if let Err(e) = sent {
                tracing::debug!(pid = self.pid, error = %e, "control client write failed");
                return;
            }
        }
    }

    /// Finds the open `tid` of this peer made of `ino` and reopens its backing
    /// file for the client, or, for a map the client may execute itself
    /// (`engine`), lends it the open with its backing files.
    fn adopt(
        &mut self,
        ino: u64,
        tid: u32,
        flags: i32,
        engine: bool,
    ) -> Result<(Response, Vec<OwnedFd>), Response> {
        // A claimed thread that is not (or no longer) one of the peer's is
        // ignored: only the peer's own opens are ever looked at.
        let registry = &self.shared.registry;
        let mut opens = Vec::new();
        if tid != self.pid && is_thread_of(tid, self.pid) {
            opens = registry.opens_by(tid, ino);
        }
        opens.extend(registry.opens_by(self.pid, ino));
        let access = flags & libc::O_ACCMODE;
        let open: OpenInfo = opens
            .into_iter()
            .filter(|o| o.flags & libc::O_ACCMODE == access)
            .find(|o| !self.claimed.contains(&o.fh))
            .ok_or_else(|| refused(libc::ENOENT, "no such open by this process"))?;
        if !open.map.is_whole_file() {
            return self.lend(open, flags, engine);
        }
        let backing = open
            .files
            .first()
            .ok_or_else(|| refused(libc::EIO, "whole-file map without a backing file"))?;
        let fd = control::reopen(backing.as_fd(), flags).map_err(|e| {
            refused(
                e.raw_os_error().unwrap_or(libc::EIO),
                &format!("cannot reopen the backing file: {e}"),
            )
        })?;
        registry.adopting(&open);
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        if access != libc::O_RDONLY {
            self.adopted.insert(
                handle,
                Adoption {
                    ino,
                    fh: open.fh,
                    lent: false,
                },
            );
            self.claimed.insert(open.fh);
        }
        tracing::debug!(
            pid = self.pid,
            tid,
            ino,
            fh = open.fh,
            handle,
            "open adopted by a shim client"
        );
        Ok((
            Response::Adopted {
                handle,
                map: open.map,
                files: 1,
            },
            vec![fd],
        ))
    }

    /// Lends an open whose map is not whole-file to the client (see
    /// [`Request::Adopt`]'s `engine`). Only maps whose new bytes go to space
    /// of this open alone are lent: an append log (a file system gives each
    /// writable open its own) or a read-only map. In-place maps that are not
    /// whole-file may share free space with other opens, and a remap would
    /// need the file system, so they stay with the daemon.
    fn lend(
        &mut self,
        open: OpenInfo,
        flags: i32,
        engine: bool,
    ) -> Result<(Response, Vec<OwnedFd>), Response> {
        if !engine {
            return Err(refused(libc::EOPNOTSUPP, "map is not whole-file"));
        }
        let own_log = match open.map.growth() {
            Growth::AppendLog { file, .. } => Some(file as usize),
            Growth::ReadOnly => None,
            Growth::InPlace { .. } => {
                return Err(refused(
                    libc::EOPNOTSUPP,
                    "in-place map that is not whole-file: served by the daemon",
                ))
            }
        };
        if open.files.len() > control::MAX_FDS {
            return Err(refused(libc::EOPNOTSUPP, "map has too many backing files"));
        }
        // A write-only open must not become a way to read the file: the
        // client gets the log it appends to, and empty stand-ins for the
        // files only reads would touch.
        let write_only = flags & libc::O_ACCMODE == libc::O_WRONLY;
        let mut fds = Vec::with_capacity(open.files.len());
        for (i, f) in open.files.iter().enumerate() {
            let fd = if write_only && Some(i) != own_log {
                rustix::fs::memfd_create("mapfs-withheld", rustix::fs::MemfdFlags::CLOEXEC)
            } else {
                rustix::io::fcntl_dupfd_cloexec(f, 0)
            };
            fds.push(fd.map_err(|e| {
                refused(
                    e.raw_os_error(),
                    &format!("cannot pass a backing file: {e}"),
                )
            })?);
        }
        let registry = &self.shared.registry;
        registry.adopting(&open);
        registry.lend(open.fh, true);
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        self.adopted.insert(
            handle,
            Adoption {
                ino: open.ino,
                fh: open.fh,
                lent: true,
            },
        );
        self.claimed.insert(open.fh);
        tracing::debug!(
            pid = self.pid,
            ino = open.ino,
            fh = open.fh,
            handle,
            "open lent to a shim client"
        );
        Ok((
            Response::Adopted {
                handle,
                files: fds.len() as u32,
                map: open.map,
            },
            fds,
        ))
    }

    /// The client's connection is gone (closed or the process died): what it
    /// may have written becomes visible through the mount.
    fn client_gone(&mut self) {
        for (_, a) in self.adopted.drain() {
            if a.lent {
                // Writes the client made since its last Release are in the
                // logs but in no map: lost, like a killed process's
                // unflushed buffers.
                self.shared.registry.lend(a.fh, false);
            }
            self.shared.registry.invalidate(a.ino);
        }
    }
}

fn refused(errno: i32, reason: &str) -> Response {
    Response::Refused {
        errno,
        reason: reason.to_string(),
    }
}

/// True if `tid` is currently a thread of process `pid`.
fn is_thread_of(tid: u32, pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

pub mod tokens;

#[cfg(test)]
mod tests;
