//! The daemon's control socket: attached preload-shim clients adopt opens
//! they hold on the mount (protocol in [`mapfs::control`]).
//!
//! # Security
//!
//! A client never names a path, a pid or an inode: it presents a
//! [`mapfs::control::Proof`] that the kernel made on its behalf from a
//! descriptor it holds ([`proofs`]), so it can adopt only an open file
//! description it holds right now. The peer's uid and gid (`SO_PEERCRED`,
//! taken at connect) must also be those of the proof's caller and of the
//! open's opener, unless the peer is root. The access mode of the handed-out
//! descriptor is the open's own. Every later request names a handle this
//! connection was given; others are refused. Pushed maps are checked against
//! what the open could have written (`pushed`).
//!
//! # Resources a client can make the daemon spend
//!
//! - Descriptors and memory: connections are capped in total and per uid
//!   ([`Limits`], well below the descriptor limit, which [`spawn`] raises to
//!   its hard limit), a connection with nothing adopted is closed after
//!   [`Limits::idle`], proofs are bounded per connection.
//! - Threads: one, serving every connection from an epoll loop; a client
//!   that does not read its answers is dropped rather than waited for.
//! - Descriptors sent to the daemon: refused by the kernel
//!   (`SO_PASSRIGHTS` off, Linux 6.16+); on older kernels a connection that
//!   sends some is dropped and they are closed on a thread of their own, so
//!   a lingering socket cannot block the server or its exit.
//! - Log lines: every warning a client can cause is rate-limited
//!   ([`crate::ratelimit`]).
//!
//! # Descriptors
//!
//! Each adoption gets a *private* open file description of the backing file
//! (reopened through `/proc/self/fd`), so its offset and status flags belong
//! to the client alone, exactly like a fresh `open(2)`.
//!
//! # Client state
//!
//! Writable and lent adoptions are remembered per connection; when the
//! client reports the close (or its connection drops because it died), the
//! server drops the kernel's cached attributes and pages of the inode
//! through [`OpenRegistry::invalidate`], so readers through the mount see the
//! new size and bytes (close-to-open).
//!
//! # Map cache
//!
//! A connection's first adoption carries the registry's generation table
//! (see [`tokens`] and [`mapfs::mapcache`]). An adoption is reported to the
//! registry before the answer ([`OpenRegistry::adopting`]), so an open whose
//! map is no longer the inode's latest invalidates the token the client read
//! after its open.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mapfs::control::{self, ConnKey, Proof, Request, Response};
use mapfs::lentsize::LentSize;
use mapfs::Growth;
use rustix::event::epoll;
use rustix::fs::Mode;
use rustix::net::SocketAddrUnix;

use crate::ratelimit::RateLimited;
use crate::registry::{OpenInfo, OpenRegistry};

mod parts;
pub mod proofs;
mod pushed;
pub mod tokens;

/// How many connections the server accepts, and for how long it keeps idle
/// ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all users together.
    pub total: usize,
    /// Connections open at once by one uid.
    pub per_uid: usize,
    /// A connection with nothing adopted is closed after this long without
    /// a request (its client reconnects when it needs the daemon again).
    pub idle: Duration,
}

impl Limits {
    /// The limits for a daemon allowed `nofile` descriptors: at most a
    /// quarter of them for connections (at most 1024), a quarter of those
    /// for one user, so neither one user nor all of them together can take
    /// the descriptors that opens through the mount need.
    pub fn for_descriptor_limit(nofile: u64) -> Limits {
        let total = usize::try_from(nofile / 4)
            .unwrap_or(usize::MAX)
            .clamp(8, 1024);
        Limits {
            total,
            per_uid: (total / 4).max(2),
            idle: Duration::from_secs(60),
        }
    }
}

/// A running control socket server. Dropping it stops the server, closes
/// every client connection and removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    clients: Arc<AtomicU64>,
    wakeups: Arc<AtomicU64>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

/// Starts serving the control socket at `socket` (normally
/// [`mapfs::control::socket_path`] of the mountpoint), after raising the
/// process's soft descriptor limit to its hard limit; the connection limits
/// follow from it ([`Limits::for_descriptor_limit`]). A stale socket file is
/// replaced; the parent directory is created (mode 0755) if missing. The
/// socket is world-connectable (0666): clients are authenticated per request
/// by proofs and credentials, not by file permissions.
pub fn spawn(registry: Arc<dyn OpenRegistry>, socket: &Path) -> io::Result<ControlServer> {
    let nofile = raise_descriptor_limit();
    let mut limits = Limits::for_descriptor_limit(nofile);
    if let Some(secs) = std::env::var(IDLE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
    {
        limits.idle = Duration::from_secs(secs);
    }
    spawn_with(registry, socket, limits)
}

/// Environment variable overriding [`Limits::idle`] in seconds (for
/// operators with many short-lived clients, and for tests).
pub const IDLE_ENV: &str = "MAPFS_CONTROL_IDLE_SECS";

/// [`spawn`] with explicit limits (and the descriptor limit left alone).
pub fn spawn_with(
    registry: Arc<dyn OpenRegistry>,
    socket: &Path,
    limits: Limits,
) -> io::Result<ControlServer> {
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
    let listener = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    // Set before listen: accepted sockets inherit it, so no client can get
    // a descriptor in before the server sets it on its end.
    let passrights_off = refuse_descriptors(listener.as_fd()).is_ok();
    rustix::net::bind(&listener, &SocketAddrUnix::new(socket)?)?;
    rustix::fs::chmod(socket, Mode::from_raw_mode(0o666))?;
    rustix::net::listen(&listener, 64)?;
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let wake = Arc::new(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?);
    watch(&epoll, &listener, LISTENER)?;
    watch(&epoll, &*wake, WAKE)?;
    let stopping = Arc::new(AtomicBool::new(false));
    let clients = Arc::new(AtomicU64::new(0));
    let wakeups = Arc::new(AtomicU64::new(0));
    let mut server = Server {
        registry,
        listener,
        epoll,
        conns: HashMap::new(),
        per_uid: HashMap::new(),
        next_id: FIRST_CONN,
        limits,
        passrights_off,
        stopping: Arc::clone(&stopping),
        clients: Arc::clone(&clients),
        wakeups: Arc::clone(&wakeups),
        accepted: 0,
        accept_paused: None,
        closer: None,
        buf: vec![0; control::MAX_PACKET],
        tool_running: Arc::new(AtomicBool::new(false)),
    };
    let thread = std::thread::Builder::new()
        .name("mapfs-control".into())
        .spawn(move || server.run())?;
    tracing::info!(
        socket = %socket.display(),
        max_clients = limits.total,
        max_clients_per_user = limits.per_uid,
        "control socket listening"
    );
    Ok(ControlServer {
        path: socket.to_path_buf(),
        stopping,
        clients,
        wakeups,
        wake,
        thread: Some(thread),
    })
}

impl ControlServer {
    /// Where the socket lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of connected clients (for tests and stats).
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed) as usize
    }

    /// How many times the server's thread has woken (for tests: an idle
    /// server sleeps).
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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

/// Raises the soft descriptor limit to the hard one; returns the soft limit
/// in force afterwards.
fn raise_descriptor_limit() -> u64 {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit {
        current: lim.maximum,
        maximum: lim.maximum,
    };
    if lim.current != lim.maximum
        && rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).is_ok()
    {
        return lim.maximum.unwrap_or(u64::MAX);
    }
    lim.current.unwrap_or(u64::MAX)
}

/// Turns `SO_PASSRIGHTS` off (Linux 6.16+): a peer's `sendmsg` with
/// `SCM_RIGHTS` then fails with `EPERM` instead of handing the daemon a
/// descriptor whose close it would have to pay for.
fn refuse_descriptors(sock: BorrowedFd<'_>) -> io::Result<()> {
    /// `SO_PASSRIGHTS` from the kernel's uapi (not yet in libc).
    const SO_PASSRIGHTS: libc::c_int = 83;
    let off: libc::c_int = 0;
    // SAFETY: `sock` is a live socket; the option value is a c_int read by
    // the kernel during the call, passed with its exact size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const FIRST_CONN: u64 = 2;

/// How often idle connections are looked for.
const SWEEP: Duration = Duration::from_secs(1);

/// Adds `fd` to `epoll` as `id`, to wake the server when it is readable.
fn watch(epoll: &OwnedFd, fd: impl AsFd, id: u64) -> rustix::io::Result<()> {
    epoll::add(
        epoll,
        fd,
        epoll::EventData::new_u64(id),
        epoll::EventFlags::IN,
    )
}

/// How long the listener rests after an `accept` failed for want of a
/// descriptor or memory.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Warnings a client can cause, each at most once per interval.
static REFUSED_CONNECTION: RateLimited = RateLimited::new(Duration::from_secs(10));
static BAD_CLIENT: RateLimited = RateLimited::new(Duration::from_secs(10));
static BAD_MAP: RateLimited = RateLimited::new(Duration::from_secs(10));

struct Server {
    registry: Arc<dyn OpenRegistry>,
    listener: OwnedFd,
    epoll: OwnedFd,
    conns: HashMap<u64, Conn>,
    per_uid: HashMap<u32, usize>,
    next_id: u64,
    limits: Limits,
    passrights_off: bool,
    stopping: Arc<AtomicBool>,
    clients: Arc<AtomicU64>,
    /// Times `epoll_wait` returned ([`ControlServer::wakeups`]).
    wakeups: Arc<AtomicU64>,
    /// Connections accepted since start.
    accepted: u64,
    /// Since when the listener is out of the epoll set, after an `accept`
    /// failed ([`Server::pause_accept`]).
    accept_paused: Option<Instant>,
    /// Closes descriptors clients sent (kernels without `SO_PASSRIGHTS`),
    /// started at the first.
    closer: Option<SyncSender<Vec<OwnedFd>>>,
    /// Receive buffer, one packet.
    buf: Vec<u8>,
    /// A tool (see [`Request::Tool`]) is running.
    tool_running: Arc<AtomicBool>,
}

/// The peer of a connection, as the kernel reported it at connect.
#[derive(Debug, Clone, Copy)]
struct Peer {
    /// 0 when the peer is in a pid namespace the daemon cannot see into.
    pid: i32,
    uid: u32,
    gid: u32,
}

/// A writable or lent adoption still open in the client.
struct Adoption {
    ino: u64,
    fh: u64,
    writable: bool,
    /// The client executes the open's map itself.
    lent: bool,
}

struct Conn {
    /// The server's name for it (the epoll key).
    id: u64,
    sock: OwnedFd,
    peer: Peer,
    /// Given at Hello.
    key: Option<ConnKey>,
    last_active: Instant,
    /// The generation table went with an adoption already.
    table_sent: bool,
    /// Writable and lent adoptions, by handle (an open is in here at most
    /// once: it is not adopted twice on one connection).
    adopted: HashMap<u64, Adoption>,
    /// Subscribed to the request trace (see [`Request::Trace`]).
    tracing: bool,
    /// A large map being sent in parts ([`Request::MapPart`]).
    parts: parts::MapParts,
}

/// What the server does with a connection after a request.
enum Next {
    Keep,
    Close,
}

/// The answer to a request.
enum Answer {
    /// Send, and keep serving the connection.
    Reply(Response, Vec<OwnedFd>),
    /// Send, then close the connection.
    Last(Response),
    /// Run the file system's tool on a thread of its own, which answers
    /// and closes the connection (see [`Request::Tool`]).
    Tool {
        /// The tool.
        name: String,
        /// Its input.
        input: Vec<u8>,
    },
}

impl From<Response> for Answer {
    fn from(r: Response) -> Self {
        Answer::Reply(r, Vec::new())
    }
}

impl Server {
    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(64);
        let mut last_sweep = Instant::now();
        let tick = rustix::fs::Timespec {
            tv_sec: SWEEP.as_secs() as _,
            tv_nsec: 0,
        };
        let retry = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: ACCEPT_RETRY.as_nanos() as _,
        };
        while !self.stopping.load(Ordering::SeqCst) {
            events.clear();
            // With no client there is nothing to sweep: an idle daemon
            // sleeps until one connects.
            let timeout = if self.accept_paused.is_some() {
                Some(&retry)
            } else {
                (!self.conns.is_empty()).then_some(&tick)
            };
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                timeout,
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {
                    self.wakeups.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!("control socket: epoll_wait failed: {e}; serving stops");
                    break;
                }
            }
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            for ev in events.iter().copied() {
                let (id, flags) = (ev.data.u64(), ev.flags);
                match id {
                    LISTENER => self.accept_all(),
                    WAKE => {}
                    id => self.ready(id, flags),
                }
            }
            if last_sweep.elapsed() >= SWEEP {
                last_sweep = Instant::now();
                self.close_idle();
            }
            if self
                .accept_paused
                .is_some_and(|at| at.elapsed() >= ACCEPT_RETRY)
            {
                self.resume_accept();
            }
        }
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id);
        }
    }

    /// Stops watching the listener for [`ACCEPT_RETRY`].
    fn pause_accept(&mut self) {
        if self.accept_paused.is_none() && epoll::delete(&self.epoll, &self.listener).is_ok() {
            self.accept_paused = Some(Instant::now());
        }
    }

    fn resume_accept(&mut self) {
        match watch(&self.epoll, &self.listener, LISTENER) {
            Ok(()) => self.accept_paused = None,
            // Out of memory for the epoll entry: try again later.
            Err(_) => self.accept_paused = Some(Instant::now()),
        }
    }

    fn accept_all(&mut self) {
        loop {
            let sock = match rustix::net::accept_with(
                &self.listener,
                rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            ) {
                Ok(s) => s,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(e) => {
                    // EMFILE and friends: the pending connection stays
                    // queued. The listener is level-triggered, so waiting
                    // on it again would spin: it leaves the epoll set for a
                    // while, then accepts again.
                    REFUSED_CONNECTION.log(|n| {
                        tracing::warn!(held_back = n, "control socket: accept failed: {e}")
                    });
                    self.pause_accept();
                    return;
                }
            };
            let Some(peer) = peer_of(sock.as_fd()) else {
                REFUSED_CONNECTION.log(|n| {
                    tracing::warn!(held_back = n, "control client without credentials refused")
                });
                continue;
            };
            let of_uid = self.per_uid.get(&peer.uid).copied().unwrap_or(0);
            let why = if self.conns.len() >= self.limits.total {
                Some("too many control connections")
            } else if of_uid >= self.limits.per_uid {
                Some("too many control connections for this user")
            } else {
                None
            };
            if let Some(why) = why {
                REFUSED_CONNECTION.log(|n| {
                    tracing::warn!(
                        uid = peer.uid,
                        pid = peer.pid,
                        held_back = n,
                        "control client refused: {why}; it uses the mount instead"
                    )
                });
                // Nonblocking and fresh: the answer fits or is lost, and the
                // client falls back to the mount either way. What the client
                // sent already is read first: closing a socket with unread
                // data resets the peer, which then reports the reset before
                // the answer.
                let _ = control::send(sock.as_fd(), &refused(libc::EUSERS, why), &[]);
                let _ = rustix::net::shutdown(&sock, rustix::net::Shutdown::Write);
                let mut sink = [0u8; 64];
                while rustix::net::recv(&sock, &mut sink, rustix::net::RecvFlags::DONTWAIT)
                    .is_ok_and(|(n, _)| n > 0)
                {}
                continue;
            }
            if !self.passrights_off {
                // Inherited from the listener on kernels that have it.
                self.passrights_off = refuse_descriptors(sock.as_fd()).is_ok();
            }
            let id = self.next_id;
            self.next_id += 1;
            if let Err(e) = epoll::add(
                &self.epoll,
                &sock,
                epoll::EventData::new_u64(id),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            ) {
                REFUSED_CONNECTION
                    .log(|n| tracing::warn!(held_back = n, "control client refused: epoll: {e}"));
                continue;
            }
            *self.per_uid.entry(peer.uid).or_default() += 1;
            self.accepted += 1;
            self.conns.insert(
                id,
                Conn {
                    id,
                    sock,
                    peer,
                    key: None,
                    last_active: Instant::now(),
                    table_sent: false,
                    adopted: HashMap::new(),
                    tracing: false,
                    parts: parts::MapParts::of(peer.uid, owner_or_root(peer)),
                },
            );
            self.clients
                .store(self.conns.len() as u64, Ordering::Relaxed);
        }
    }

    /// Serves what connection `id` sent (one request at a time; a client
    /// waits for each answer).
    fn ready(&mut self, id: u64, flags: epoll::EventFlags) {
        if !self.conns.contains_key(&id) {
            return;
        }
        if flags.contains(epoll::EventFlags::IN) {
            loop {
                let counts = (self.conns.len() as u32, self.accepted);
                let conn = self.conns.get_mut(&id).expect("checked above");
                let got = control::recv_packet(conn.sock.as_fd(), &mut self.buf);
                let next = match got {
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
                    Ok(None) | Err(_) => Next::Close,
                    Ok(Some((_, fds))) if !fds.is_empty() => {
                        BAD_CLIENT.log(|n| {
                            tracing::warn!(
                                uid = conn.peer.uid,
                                pid = conn.peer.pid,
                                held_back = n,
                                "control client sent descriptors; dropped"
                            )
                        });
                        self.discard(fds);
                        Next::Close
                    }
                    Ok(Some((len, _))) => {
                        conn.last_active = Instant::now();
                        let req = control::decode::<Request>(&self.buf[..len]);
                        let answer = serve(&*self.registry, conn, req, counts);
                        let sock = conn.sock.as_fd();
                        let (sent, next) = match answer {
                            Answer::Reply(resp, fds) => {
                                let fds: Vec<BorrowedFd<'_>> =
                                    fds.iter().map(|f| f.as_fd()).collect();
                                (control::send(sock, &resp, &fds), Next::Keep)
                            }
                            Answer::Last(resp) => (control::send(sock, &resp, &[]), Next::Close),
                            Answer::Tool { name, input } => {
                                let sent = start_tool(
                                    &self.registry,
                                    &self.tool_running,
                                    conn,
                                    name,
                                    input,
                                );
                                (sent, Next::Close)
                            }
                        };
                        // A failed send includes EAGAIN: a client that does
                        // not read its answers.
                        if sent.is_err() {
                            Next::Close
                        } else {
                            next
                        }
                    }
                };
                if let Next::Close = next {
                    self.close(id);
                    return;
                }
            }
        }
        if flags
            .intersects(epoll::EventFlags::HUP | epoll::EventFlags::ERR | epoll::EventFlags::RDHUP)
        {
            self.close(id);
        }
    }

    fn close(&mut self, id: u64) {
        let Some(mut conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = epoll::delete(&self.epoll, &conn.sock);
        conn.gone(&*self.registry);
        if let Some(n) = self.per_uid.get_mut(&conn.peer.uid) {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&conn.peer.uid);
            }
        }
        self.clients
            .store(self.conns.len() as u64, Ordering::Relaxed);
    }

    fn close_idle(&mut self) {
        let idle = self.limits.idle;
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.adopted.is_empty() && c.last_active.elapsed() >= idle)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.close(id);
        }
    }

    /// Closes descriptors a client sent, off this thread: the last close of
    /// a socket with `SO_LINGER` can block.
    fn discard(&mut self, fds: Vec<OwnedFd>) {
        if self.closer.is_none() {
            let (tx, rx) = sync_channel::<Vec<OwnedFd>>(64);
            let started = std::thread::Builder::new()
                .name("mapfs-ctl-close".into())
                .spawn(move || rx.into_iter().for_each(drop));
            if started.is_ok() {
                self.closer = Some(tx);
            }
        }
        let fds = match &self.closer {
            Some(tx) => match tx.try_send(fds) {
                Ok(()) => return,
                Err(TrySendError::Full(f) | TrySendError::Disconnected(f)) => f,
            },
            None => fds,
        };
        drop(fds);
    }
}

/// The one tool a mount runs at a time, claimed for as long as this value
/// lives: dropping it (the tool answered, its thread could not start, or
/// the tool panicked and its thread unwound) lets the next one run.
struct ToolClaim(Arc<AtomicBool>);

impl ToolClaim {
    /// The claim, unless a tool is running.
    fn take(running: &Arc<AtomicBool>) -> Option<ToolClaim> {
        (!running.swap(true, Ordering::SeqCst)).then(|| ToolClaim(Arc::clone(running)))
    }
}

impl Drop for ToolClaim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Hands `conn`'s tool request to a thread that runs it and
/// answers; the server itself is done with the connection. One tool
/// runs at a time: a second is refused (`EBUSY`) rather than queued,
/// so clients cannot pile up threads.
fn start_tool(
    registry: &Arc<dyn OpenRegistry>,
    tool_running: &Arc<AtomicBool>,
    conn: &Conn,
    name: String,
    input: Vec<u8>,
) -> io::Result<()> {
    let peer = conn.peer;
    let Some(claim) = ToolClaim::take(tool_running) else {
        let busy = refused(libc::EBUSY, "another tool is running on this mount");
        return control::send(conn.sock.as_fd(), &busy, &[]);
    };
    // The thread's own descriptor of the connection: the server closes
    // its one as for any finished connection.
    let sock = rustix::io::fcntl_dupfd_cloexec(&conn.sock, 0)?;
    let registry = Arc::clone(registry);
    let started = std::thread::Builder::new()
        .name("mapfs-tool".into())
        .spawn(move || {
            let _claim = claim;
            let ctx = mapfs::Ctx {
                uid: peer.uid,
                gid: peer.gid,
                pid: peer.pid.max(0) as u32,
            };
            let answer = match registry.tool(&ctx, &name, &input) {
                Ok(output) => Response::Tool { output },
                Err(e) => refused(e.errno(), &e.to_string()),
            };
            // The client waits as long as the tool runs; the answer
            // goes out blocking, with a bound for a client gone quiet.
            let _ = rustix::fs::fcntl_setfl(&sock, rustix::fs::OFlags::empty());
            let _ = rustix::net::sockopt::set_socket_timeout(
                &sock,
                rustix::net::sockopt::Timeout::Send,
                Some(Duration::from_secs(10)),
            );
            let _ = control::send(sock.as_fd(), &answer, &[]);
        });
    if started.is_err() {
        let failed = refused(libc::EAGAIN, "no thread for the tool");
        return control::send(conn.sock.as_fd(), &failed, &[]);
    }
    Ok(())
}

/// The peer's credentials. The pid is 0 for a peer in a pid namespace the
/// daemon cannot see into; it is only logged.
fn peer_of(sock: BorrowedFd<'_>) -> Option<Peer> {
    // nix, not rustix: rustix's `UCred` holds the pid as a non-zero `Pid`,
    // and the kernel reports 0 for such a peer.
    let c = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    Some(Peer {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
    })
}

/// Answers one request of `conn`.
fn serve(
    registry: &dyn OpenRegistry,
    conn: &mut Conn,
    req: io::Result<Request>,
    (clients, connections): (u32, u64),
) -> Answer {
    match req {
        Err(_) => {
            BAD_CLIENT.log(|n| {
                tracing::warn!(
                    uid = conn.peer.uid,
                    pid = conn.peer.pid,
                    held_back = n,
                    "control client sent a malformed message or another protocol version; dropped"
                )
            });
            Answer::Last(refused(libc::EPROTO, "protocol version mismatch"))
        }
        Ok(Request::Hello { version }) if version == control::VERSION => {
            let key = *conn.key.get_or_insert_with(|| registry.proofs().new_key());
            Response::Hello {
                version,
                key,
                writeback_cache: registry.writeback_cache(),
            }
            .into()
        }
        Ok(Request::Hello { .. }) => {
            Answer::Last(refused(libc::EPROTO, "protocol version mismatch"))
        }
        Ok(Request::Status) => {
            let mut status = registry.status();
            status.pid = std::process::id();
            status.clients = clients;
            status.connections = connections;
            Response::Status(status).into()
        }
        Ok(Request::Stats { reset }) => {
            // Counts only (see `mapfs::stats`), so anyone may read them; a
            // reset takes them from the owner's tools, so only the owner
            // (the daemon's uid) or root may.
            if reset && !owner_or_root(conn.peer) {
                return refused(
                    libc::EPERM,
                    "only the mount's owner or root may reset its counters",
                )
                .into();
            }
            Response::Stats(Box::new(registry.stats(reset))).into()
        }
        Ok(Request::Trace { op, pid }) => {
            // A trace shows which process touches which file when: the
            // owner's or root's business only.
            if !owner_or_root(conn.peer) {
                return refused(libc::EPERM, "only the mount's owner or root may trace it").into();
            }
            match registry.trace(conn.id, op.as_deref(), pid) {
                Some((events, dropped)) => {
                    conn.tracing = true;
                    Response::Trace { events, dropped }.into()
                }
                None => refused(libc::EINVAL, "no such FUSE opcode").into(),
            }
        }
        Ok(Request::Tool { name, input }) => {
            // A tool reads or changes the whole store: the owner's or
            // root's business only.
            if !owner_or_root(conn.peer) {
                return Answer::Last(refused(
                    libc::EPERM,
                    "only the mount's owner or root may run its tools",
                ));
            }
            Answer::Tool { name, input }
        }
        Ok(Request::Adopt {
            proof,
            flags,
            engine,
        }) => match conn.adopt(registry, &proof, flags, engine) {
            Ok((resp, fds)) => Answer::Reply(resp, fds),
            Err(resp) => resp.into(),
        },
        Ok(Request::Closed { handle, .. }) => match conn.adopted.remove(&handle) {
            // Only writable or lent adoptions have handles here, and either
            // may have changed the file: `wrote` adds nothing.
            Some(a) => {
                if a.lent {
                    registry.lend(a.fh, false, None);
                }
                registry.invalidate(a.ino);
                Response::Done.into()
            }
            None => refused(libc::EBADF, "no such handle on this connection").into(),
        },
        Ok(Request::Changed { proof }) => match conn.proven_open(registry, &proof) {
            Ok(open) if open.flags & libc::O_ACCMODE != libc::O_RDONLY => {
                registry.invalidate(open.ino);
                Response::Done.into()
            }
            Ok(_) => refused(libc::EBADF, "the open is read-only").into(),
            Err(r) => r.into(),
        },
        Ok(Request::MapPart { handle, bytes }) => match conn.adopted.get(&handle) {
            Some(a) if a.lent && a.writable => match conn.parts.add(handle, &bytes) {
                Ok(()) => Response::Done.into(),
                Err(errno) => refused(errno, "map parts past the daemon's bound").into(),
            },
            _ => refused(libc::EBADF, "no lent writable open with this handle").into(),
        },
        Ok(Request::Release { handle, map }) => match conn.whole_map(handle, map) {
            Ok(map) => conn.release(registry, handle, map).into(),
            Err(r) => r.into(),
        },
        Ok(Request::Remap {
            handle,
            map,
            offset,
            len,
        }) => match conn.whole_map(handle, map) {
            Ok(map) => conn.remap(registry, handle, map, offset, len),
            Err(r) => r.into(),
        },
    }
}

/// True when `map` fits in a response packet (the daemon sends maps whole;
/// only clients send them in parts).
fn fits_one_packet(map: &mapfs::DataMap) -> bool {
    control::map_fits(map, control::ANSWER_MAP_MAX)
}

impl Conn {
    /// The map a `Release` or `Remap` of `handle` carries: its own, or the
    /// one its [`Request::MapPart`]s sent.
    fn whole_map(
        &mut self,
        handle: u64,
        map: Option<mapfs::DataMap>,
    ) -> Result<mapfs::DataMap, Response> {
        if let Some(m) = map {
            // Parts held stay: another thread of the client may be sending
            // a large map of another handle meanwhile.
            return Ok(m);
        }
        let bytes = self
            .parts
            .take(handle)
            .ok_or_else(|| refused(libc::EINVAL, "no map and no map parts for this handle"))?;
        control::decode_map(&bytes)
            .map_err(|_| refused(libc::EPROTO, "the map parts are not a map"))
    }

    /// Installs the map a client pushed for its lent open `handle`, if its
    /// own writes could have made it.
    fn release(&self, registry: &dyn OpenRegistry, handle: u64, map: mapfs::DataMap) -> Response {
        match self.pushed_map(registry, handle, &map) {
            Ok((a, _)) => {
                registry.client_released(a.fh, map);
                Response::Done
            }
            Err(r) => r,
        }
    }

    /// The lent writable open `handle` and its state, if `map` is one its
    /// client's own writes and truncates could have made of it.
    fn pushed_map(
        &self,
        registry: &dyn OpenRegistry,
        handle: u64,
        map: &mapfs::DataMap,
    ) -> Result<(&Adoption, OpenInfo), Response> {
        let a = match self.adopted.get(&handle) {
            None => return Err(refused(libc::EBADF, "no such handle on this connection")),
            Some(a) if !a.lent => return Err(refused(libc::EINVAL, "the open is not lent")),
            Some(a) if !a.writable => return Err(refused(libc::EBADF, "the open is read-only")),
            Some(a) => a,
        };
        let Some(open) = registry.open(a.fh) else {
            return Err(refused(libc::EBADF, "the open was released"));
        };
        match pushed::check(&open.map, &open.files, map) {
            Ok(()) => Ok((a, open)),
            Err(why) => {
                BAD_MAP.log(|n| {
                    tracing::warn!(
                        uid = self.peer.uid,
                        pid = self.peer.pid,
                        ino = open.ino,
                        held_back = n,
                        "a shim client's map was refused: {why}"
                    )
                });
                Err(refused(libc::EINVAL, &format!("map refused: {why}")))
            }
        }
    }

    /// Makes room for a write the client's map of its lent open `handle`
    /// cannot place (see [`Request::Remap`]). Only guarded maps (copy on
    /// write in place) are remapped for a client; others are handed back
    /// to the mount, which remaps them itself.
    fn remap(
        &self,
        registry: &dyn OpenRegistry,
        handle: u64,
        map: mapfs::DataMap,
        offset: u64,
        len: u64,
    ) -> Answer {
        let (a, open) = match self.pushed_map(registry, handle, &map) {
            Ok(v) => v,
            Err(r) => return r.into(),
        };
        if !matches!(open.map.growth(), Growth::Guarded { .. }) {
            return refused(
                libc::EOPNOTSUPP,
                "only guarded maps are remapped for a client",
            )
            .into();
        }
        let new = match registry.client_remap(a.fh, map, offset, len) {
            Ok(Some(new)) => new,
            Ok(None) => return refused(libc::EBADF, "the open was released").into(),
            Err(e) => return refused(e.errno(), &format!("remap failed: {e}")).into(),
        };
        if new.map.is_whole_file() {
            return refused(libc::EOPNOTSUPP, "the open became whole-file").into();
        }
        if !fits_one_packet(&new.map) {
            return refused(libc::EFBIG, "the remapped map is too large to send").into();
        }
        let same = new.files.len() == open.files.len()
            && new
                .files
                .iter()
                .zip(&open.files)
                .all(|(x, y)| Arc::ptr_eq(x, y));
        let fds = if same {
            Vec::new()
        } else {
            match lend_files(&new, new.flags, true, self.peer) {
                Ok(fds) => fds,
                Err(r) => return r.into(),
            }
        };
        let files = fds.len() as u32;
        Answer::Reply(
            Response::Remapped {
                map: new.map,
                files,
            },
            fds,
        )
    }

    /// The open `proof` vouches for, if this connection may have it.
    fn proven_open(
        &self,
        registry: &dyn OpenRegistry,
        proof: &Proof,
    ) -> Result<OpenInfo, Response> {
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| refused(libc::EPROTO, "Hello first"))?;
        let proven = registry
            .proofs()
            .redeem(key, proof)
            .ok_or_else(|| refused(libc::EACCES, "no valid proof of possession"))?;
        if !same_user(self.peer, proven.uid, proven.gid) {
            return Err(refused(
                libc::EACCES,
                "the proof was made by another user than this connection's",
            ));
        }
        let open = registry
            .open(proven.fh)
            .ok_or_else(|| refused(libc::ENOENT, "the open was released"))?;
        if !same_user(self.peer, open.uid, open.gid) {
            return Err(refused(
                libc::EACCES,
                "the file was opened by another user than this connection's",
            ));
        }
        Ok(open)
    }

    /// Reopens the backing file of the proven open for the client, or, for a
    /// map the client may execute itself (`engine`), lends it the open with
    /// its backing files.
    fn adopt(
        &mut self,
        registry: &dyn OpenRegistry,
        proof: &Proof,
        flags: i32,
        engine: bool,
    ) -> Result<(Response, Vec<OwnedFd>), Response> {
        let open = self.proven_open(registry, proof)?;
        if registry.writeback_cache() {
            return Err(refused(
                libc::EOPNOTSUPP,
                "kernel writeback cache on: files are served through the mount",
            ));
        }
        let access = flags & libc::O_ACCMODE;
        if open.flags & libc::O_ACCMODE != access {
            return Err(refused(libc::EACCES, "access mode differs from the open's"));
        }
        if self.adopted.values().any(|a| a.fh == open.fh) {
            return Err(refused(
                libc::EBUSY,
                "open already adopted on this connection",
            ));
        }
        let writable = access != libc::O_RDONLY;
        let open = if writable && engine && open.map.places_nothing() {
            // A writer whose space comes at its first write (plfs's log,
            // pack's slot).
            registry
                .ready_to_write(open.fh)
                .map_err(|e| {
                    refused(
                        e.errno(),
                        &format!("cannot make the open ready for writes: {e}"),
                    )
                })?
                .ok_or_else(|| refused(libc::ENOENT, "the open was released"))?
        } else {
            open
        };
        if !writable && engine && shared_backing(&open) && !owner_or_root(self.peer) {
            return self.copy(registry, &open);
        }
        if !open.map.is_whole_file() && !fits_one_packet(&open.map) {
            return Err(refused(
                libc::EFBIG,
                &format!(
                    "the map ({} pieces) is too large to lend: served through the mount",
                    open.map.piece_count()
                ),
            ));
        }
        let (map, mut fds, lent) = if open.map.is_whole_file() {
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
            (open.map.clone(), vec![fd], false)
        } else {
            let mut fds = lend_files(&open, flags, engine, self.peer)?;
            let size = if writable {
                let page = LentSize::create(open.map.size()).map_err(|e| {
                    refused(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        &format!("cannot share the size: {e}"),
                    )
                })?;
                match page.fd().map(|f| f.try_clone_to_owned()) {
                    Some(Ok(fd)) => fds.push(fd),
                    _ => return Err(refused(libc::EIO, "cannot share the size")),
                }
                Some(Arc::new(page))
            } else {
                None
            };
            registry.adopting(&open);
            registry.lend(open.fh, true, size);
            (open.map.clone(), fds, true)
        };
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        if writable || lent {
            self.adopted.insert(
                handle,
                Adoption {
                    ino: open.ino,
                    fh: open.fh,
                    writable,
                    lent,
                },
            );
        }
        let size_slot = lent && writable;
        let files = fds.len() as u32 - u32::from(size_slot);
        let generations = self.attach_table(registry, &mut fds);
        tracing::debug!(
            uid = self.peer.uid,
            pid = self.peer.pid,
            ino = open.ino,
            fh = open.fh,
            handle,
            lent,
            "open adopted by a shim client"
        );
        Ok((
            Response::Adopted {
                handle,
                map,
                files,
                size_slot,
                generations,
            },
            fds,
        ))
    }

    /// Adds the generation table to `fds` if this connection has not been
    /// sent it yet; true when it was added.
    fn attach_table(&mut self, registry: &dyn OpenRegistry, fds: &mut Vec<OwnedFd>) -> bool {
        if self.table_sent {
            return false;
        }
        let Some(Ok(t)) = registry
            .generations()
            .and_then(|t| t.fd())
            .map(|t| t.try_clone_to_owned())
        else {
            return false;
        };
        fds.push(t);
        self.table_sent = true;
        true
    }

    /// Answers the adoption of read-only `open`, whose backing file the
    /// client may not get, with a copy of the file's bytes (see
    /// [`Response::Copied`]): what the client could read through the mount,
    /// and nothing else. Nothing of it stays in the daemon: the client keeps
    /// the bytes in its own memory, and its reads of the open through the
    /// mount (raw system calls, or after the copy is stale) are served as
    /// before.
    fn copy(
        &mut self,
        registry: &dyn OpenRegistry,
        open: &OpenInfo,
    ) -> Result<(Response, Vec<OwnedFd>), Response> {
        let size = open.map.size();
        if size > control::COPY_MAX {
            return Err(refused(
                libc::EOPNOTSUPP,
                "in a backing file shared with other users' files, and too large to copy: \
                 served by the daemon",
            ));
        }
        // A writer may change the bytes without an open or a truncate, the
        // changes that bump the token.
        if registry.has_writer(open.ino) {
            return Err(refused(
                libc::EBUSY,
                "open for writing elsewhere: served by the daemon",
            ));
        }
        let mut bytes = vec![0u8; size as usize];
        let n = open
            .data
            .read(0, &mut bytes)
            .map_err(|e| refused(e.errno(), &format!("cannot copy the file's bytes: {e}")))?;
        bytes.truncate(n);
        let mut fds = Vec::new();
        let generations = self.attach_table(registry, &mut fds);
        registry.copied();
        tracing::debug!(
            uid = self.peer.uid,
            pid = self.peer.pid,
            ino = open.ino,
            fh = open.fh,
            bytes = n,
            "open answered with a copy for a shim client"
        );
        Ok((Response::Copied { bytes, generations }, fds))
    }

    /// The client's connection is gone (closed, dropped, or the process
    /// died): what it may have written becomes visible through the mount.
    fn gone(&mut self, registry: &dyn OpenRegistry) {
        if self.tracing {
            registry.trace_end(self.id);
        }
        for (_, a) in self.adopted.drain() {
            if a.lent {
                // Writes the client made since its last Release are in the
                // logs but in no map: lost, like a killed process's
                // unflushed buffers.
                registry.lend(a.fh, false, None);
            }
            registry.invalidate(a.ino);
        }
        if let Some(key) = self.key.take() {
            registry.proofs().drop_key(&key);
        }
    }
}

/// True when `peer` is the mount's owner (the daemon's user) or root.
fn owner_or_root(peer: Peer) -> bool {
    peer.uid == 0 || peer.uid == rustix::process::geteuid().as_raw()
}

/// True when the backing file of `open`'s map also holds other files (an
/// in-place map: M-to-1 slots, as `pack`'s), so that only the mount's owner
/// and root may be given it.
fn shared_backing(open: &OpenInfo) -> bool {
    !open.map.is_whole_file() && matches!(open.map.growth(), Growth::InPlace { .. })
}

/// True when `peer` may act on what `uid`/`gid` did: the same user and
/// group, or a root peer.
fn same_user(peer: Peer, uid: u32, gid: u32) -> bool {
    peer.uid == 0 || (peer.uid == uid && peer.gid == gid)
}

/// Adoption handles, unique in the daemon (so a handle of one connection
/// never names another's adoption by accident).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// The descriptors to lend an open whose map is not whole-file (see
/// [`Request::Adopt`]'s `engine`). Maps whose new bytes go to space of this
/// open alone are lent: an append log (a file system gives each writable
/// open its own), a read-only map, or an in-place map (an M-to-1 slot, as
/// `pack`'s), whose writes stay in the slot: a write the slot cannot hold
/// is the client's to hand back, and the map it pushes is checked to lie
/// in the slot ([`pushed::check`]).
///
/// An in-place map's backing file also holds other files, so it is lent
/// only to the mount's owner or root, who could open it anyway (root by
/// its privilege; the owner through `/proc/<daemon>/fd`, as the daemon
/// runs as that user); nobody else may get it. A reader gets a read-only
/// reopen of it, never the daemon's read-write descriptor.
fn lend_files(
    open: &OpenInfo,
    flags: i32,
    engine: bool,
    peer: Peer,
) -> Result<Vec<OwnedFd>, Response> {
    if !engine {
        return Err(refused(libc::EOPNOTSUPP, "map is not whole-file"));
    }
    let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
    let in_place = shared_backing(open);
    if in_place && !owner_or_root(peer) {
        return Err(refused(
            libc::EOPNOTSUPP,
            "in-place map in a shared backing file: lent to the mount's owner or root only, \
             served by the daemon",
        ));
    }
    // The file this open's new bytes go to (a log, or a guarded map's
    // writable file).
    let own_file = match open.map.growth() {
        Growth::AppendLog { file, .. } | Growth::Guarded { file } => Some(file as usize),
        Growth::ReadOnly | Growth::InPlace { .. } => None,
    };
    if open.files.len() > control::MAX_FDS {
        return Err(refused(libc::EOPNOTSUPP, "map has too many backing files"));
    }
    // A write-only open must not become a way to read the file: the client
    // gets the log it appends to, and empty stand-ins for the files only
    // reads would touch, unless their descriptors cannot read either (a
    // guarded map's read-only ranges are the writer's own write-only
    // descriptor: a stand-in there would make them another file, and a
    // client carrying its writes to a successor would copy its zeros). An
    // in-place writer writes where its bytes are, so it gets its files as
    // they are (its peer may read them anyway).
    let write_only = flags & libc::O_ACCMODE == libc::O_WRONLY && !in_place;
    let cannot_read = |f: &std::fs::File| {
        rustix::fs::fcntl_getfl(f)
            .is_ok_and(|fl| fl & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::WRONLY)
    };
    let mut fds = Vec::with_capacity(open.files.len());
    for (i, f) in open.files.iter().enumerate() {
        let withheld = write_only && Some(i) != own_file && !cannot_read(f);
        // A descriptor reads the whole backing file, not just the map's
        // extents: a plfs log keeps the bytes a truncate dropped from every
        // map (a private file's secret, before a chmod made it readable),
        // so a file that holds any byte outside this open's map is not
        // lent, and the open is served by the daemon through its map. The
        // mount's owner and root could read the file anyway.
        if !withheld && !cannot_read(f) && !owner_or_root(peer) && !wholly_mapped(&open.map, i, f) {
            return Err(refused(
                libc::EOPNOTSUPP,
                "a backing file holds bytes outside this open's map: served by the daemon",
            ));
        }
        let fd = if withheld {
            rustix::fs::memfd_create("mapfs-withheld", rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(std::io::Error::from)
        } else if in_place && read_only {
            // A reader of a shared backing file must not be able to write
            // it: a read-only open of its own, not the daemon's read-write
            // one.
            control::reopen(f.as_fd(), libc::O_RDONLY)
        } else {
            rustix::io::fcntl_dupfd_cloexec(f, 0).map_err(std::io::Error::from)
        };
        fds.push(fd.map_err(|e| {
            refused(
                e.raw_os_error().unwrap_or(libc::EIO),
                &format!("cannot pass a backing file: {e}"),
            )
        })?);
    }
    Ok(fds)
}

/// True when every byte backing file `i` (`f`) holds, its holes aside,
/// is one that `map` shows: an extent of `map` in file `i` covers it.
/// Errors answer false (not lent).
fn wholly_mapped(map: &mapfs::DataMap, i: usize, f: &std::fs::File) -> bool {
    let mut spans: Vec<(u64, u64)> = map
        .extents()
        .iter()
        .filter(|e| e.file as usize == i)
        .map(|e| (e.offset, e.offset.saturating_add(e.len)))
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let Ok(len) = f.metadata().map(|m| m.len()) else {
        return false;
    };
    if merged.first().is_some_and(|&(a, b)| a == 0 && b >= len) || len == 0 {
        return true;
    }
    // Holes hold nothing: only the data must be mapped. Sought on a
    // description of its own, since `f`'s offset is shared with whoever
    // holds it.
    let Ok(f) = control::reopen(f.as_fd(), libc::O_RDONLY) else {
        return false;
    };
    let mut at = 0;
    while at < len {
        let data = match rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => return true,
            Err(_) => return false,
        };
        let hole = match rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(data)) {
            Ok(h) => h.min(len),
            Err(_) => return false,
        };
        if data >= hole {
            return true;
        }
        if !merged.iter().any(|&(a, b)| a <= data && hole <= b) {
            return false;
        }
        at = hole;
    }
    true
}

fn refused(errno: i32, reason: &str) -> Response {
    Response::Refused {
        errno,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests;
