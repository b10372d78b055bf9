//! The supervisor: the process `mapfs mount` leaves behind. It starts the
//! daemon, keeps a copy of the connection's `/dev/fuse` descriptor and of
//! the state the kernel refers to (see [`super::records`]), and when the
//! daemon dies without the file system having been unmounted, starts another
//! one on the same connection.
//!
//! Restarts: at once after a daemon that was serving died, and after
//! [`RESTART_EXIT`] (`mapfs restart`). A daemon that dies before it serves
//! is a failed start: the next waits 100 ms, doubling to 2 s, and after
//! [`MAX_FAILED_STARTS`] in a row, or [`MAX_CRASHES`] deaths within
//! [`CRASH_WINDOW`], the supervisor gives up and answers every request with
//! `EIO` until the file system is unmounted (see [`super::eio`]).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mapfs::control;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use tracing::{error, info, warn};

use super::eio;
use super::link::{LINK_BUFFER, SUPERVISOR_FD_ENV};
use super::records::{InitState, OpenRec, PendingWrite, ToDaemon, ToSupervisor};
use super::ring::{Item, RingReader, RING_FDS_ENV, RING_OFF_ENV};
use crate::inodes::Inodes;

/// Exit status of a daemon that leaves to be replaced (`mapfs restart`).
pub const RESTART_EXIT: i32 = 75;
/// Failed starts in a row before giving up.
pub const MAX_FAILED_STARTS: u32 = 5;
/// Deaths within [`CRASH_WINDOW`] before giving up (a request that kills
/// every daemon it is sent to again).
pub const MAX_CRASHES: usize = 30;
/// See [`MAX_CRASHES`].
pub const CRASH_WINDOW: Duration = Duration::from_secs(60);

/// Nodes and opens per message of a saved state.
const BATCH: usize = 1000;

/// How long the supervisor sleeps once it has read every record waiting:
/// records sent meanwhile wait in the link's socket buffer (which survives
/// the daemon, so they are as safe there as read) and are read in one go.
/// Without it every record woke the supervisor, a context switch per
/// record, three per file created (on 2 cores: 15,100 creates/s instead of
/// 19,200/s unsupervised, tmpfs backing). A daemon's death is noticed at
/// most this much later.
const COALESCE: Duration = Duration::from_millis(1);

/// The state a live connection carries from one daemon to the next.
struct Connection {
    dev: OwnedFd,
    init: InitState,
    inodes: Inodes,
    opens: BTreeMap<u64, OpenRec>,
    /// Acknowledged changes not yet in a map the file system holds, in the
    /// order they were made (over all opens: two opens of one file may
    /// overwrite each other), bounded by the daemon, which hands maps over
    /// after a few MiB of them.
    writes: Vec<PendingWrite>,
    /// The append logs those changes name (see [`ToSupervisor::Log`]).
    logs: BTreeMap<(u64, u32), OwnedFd>,
}

impl Connection {
    /// Drops what was kept for the changes of open `fh`.
    fn forget_changes(&mut self, fh: u64) {
        self.writes.retain(|w| w.fh != fh);
        self.logs.retain(|&(f, _), _| f != fh);
    }
}

/// How one daemon ended.
struct Ended {
    served: bool,
    restarting: bool,
    status: std::process::ExitStatus,
}

/// Runs daemons made by `daemon` until the file system is unmounted;
/// returns the exit code for this process. `current` holds the serving
/// daemon's pidfd (for forwarding signals).
pub fn supervise(
    mut daemon: impl FnMut() -> Command,
    current: Arc<Mutex<Option<OwnedFd>>>,
) -> io::Result<i32> {
    let mut conn: Option<Connection> = None;
    let mut failed_starts = 0u32;
    let mut deaths: VecDeque<Instant> = VecDeque::new();
    loop {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&ours, LINK_BUFFER);
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&ours, LINK_BUFFER);
        // The daemon's end goes across exec; ours does not.
        rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())?;
        let mut cmd = daemon();
        cmd.env(SUPERVISOR_FD_ENV, theirs.as_raw_fd().to_string());
        let mut ring = match RingReader::create() {
            // Off on request: records through the socket, as to a daemon
            // that does not take the ring.
            _ if std::env::var_os(RING_OFF_ENV).is_some_and(|v| v == "0") => None,
            Ok(r) => Some(r),
            Err(e) => {
                warn!("cannot make a journal ring ({e}); the daemon's records come through the socket");
                None
            }
        };
        let ring_fds = match &ring {
            Some(r) => {
                let (fds, env) = r.for_child()?;
                cmd.env(RING_FDS_ENV, env);
                Some(fds)
            }
            None => None,
        };
        let mut child = cmd.spawn()?;
        drop(theirs);
        drop(ring_fds);
        *current.lock().expect("pidfd lock") = rustix::process::pidfd_open(
            rustix::process::Pid::from_child(&child),
            rustix::process::PidfdFlags::empty(),
        )
        .ok();
        let started = Instant::now();
        let ended = run_one(&ours, &mut child, &mut conn, ring.as_mut());
        *current.lock().expect("pidfd lock") = None;
        let ended = ended?;
        let Some(c) = &conn else {
            // Never mounted: the daemon reported why to `mapfs mount`.
            return Ok(ended.status.code().unwrap_or(1));
        };
        if ended.status.success() || !connection_alive(c) {
            info!("the file system was unmounted");
            return Ok(0);
        }
        if ended.restarting {
            info!(
                "daemon {} left to be replaced; starting the next one",
                child.id()
            );
            failed_starts = 0;
            continue;
        }
        let how = match (ended.status.code(), ended.status.signal()) {
            (_, Some(sig)) => format!("killed by signal {sig}"),
            (Some(code), _) => format!("exited with status {code}"),
            _ => "ended".to_string(),
        };
        let now = Instant::now();
        deaths.push_back(now);
        while deaths.front().is_some_and(|t| now - *t > CRASH_WINDOW) {
            deaths.pop_front();
        }
        if ended.served {
            failed_starts = 0;
        } else {
            failed_starts += 1;
        }
        if failed_starts >= MAX_FAILED_STARTS || deaths.len() >= MAX_CRASHES {
            error!(
                "daemon {} {how} after {:.1} s; {} failed starts in a row, {} deaths in {} s: \
                 giving up. Every call on the mount now fails with EIO; `mapfs umount` it.",
                child.id(),
                started.elapsed().as_secs_f64(),
                failed_starts,
                deaths.len(),
                CRASH_WINDOW.as_secs()
            );
            eio::fail_all(c.dev.as_fd())?;
            return Ok(1);
        }
        // Never at once: shim clients reading copies of files stop once
        // they see the daemon gone, which takes them up to
        // `control::COPY_CHECK`; the successor must not serve a write
        // before that.
        let wait = match failed_starts {
            0 => control::COPY_NOTICE,
            n => (Duration::from_millis(100) * 2u32.pow(n - 1)).min(Duration::from_secs(2)),
        };
        warn!(
            "daemon {} {how} after {:.1} s; restarting it{} (restart {} in the last {} s)",
            child.id(),
            started.elapsed().as_secs_f64(),
            if failed_starts == 0 {
                String::new()
            } else {
                format!(" in {} ms", wait.as_millis())
            },
            deaths.len(),
            CRASH_WINDOW.as_secs()
        );
        std::thread::sleep(wait);
    }
}

/// Whether the kernel still has the connection (a connection that ended,
/// by unmount or abort, polls as an error).
fn connection_alive(c: &Connection) -> bool {
    let mut fds = [PollFd::new(&c.dev, PollFlags::IN)];
    match poll(&mut fds, Some(&rustix::event::Timespec::default())) {
        Ok(_) => !fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP),
        Err(_) => false,
    }
}

/// What one daemon said of itself.
#[derive(Default)]
struct Said {
    served: bool,
    restarting: bool,
}

/// Starts one daemon (fresh or resuming `conn`), keeps `conn` up to date
/// from its records, and waits for it to end.
fn run_one(
    sock: &OwnedFd,
    child: &mut Child,
    conn: &mut Option<Connection>,
    mut ring: Option<&mut RingReader>,
) -> io::Result<Ended> {
    let sent = match conn {
        None => control::send(sock.as_fd(), &ToDaemon::Fresh, &[]),
        Some(c) => send_state(sock, c),
    };
    if let Err(e) = sent {
        // The daemon died before it read: its status says why.
        warn!("cannot start the daemon: {e}");
    }
    let mut said = Said::default();
    // Records come through the socket until the daemon says it took the
    // ring, then from the ring.
    loop {
        let Some(msg) = next_on_socket(sock) else {
            break;
        };
        match (msg, ring.as_deref_mut()) {
            ((ToSupervisor::Ring, _), Some(r)) => {
                read_ring(sock, r, conn, &mut said);
                break;
            }
            ((msg, fds), _) => apply(msg, fds, conn, &mut said),
        }
        if !readable(sock) {
            std::thread::sleep(COALESCE);
        }
    }
    let status = child.wait()?;
    Ok(Ended {
        served: said.served,
        restarting: said.restarting && status.code() == Some(RESTART_EXIT),
        status,
    })
}

/// The next record on the socket; `None` once the daemon's end is closed.
fn next_on_socket(sock: &OwnedFd) -> Option<(ToSupervisor, Vec<OwnedFd>)> {
    loop {
        match control::recv::<ToSupervisor>(sock.as_fd()) {
            Ok(Some(m)) => return Some(m),
            Ok(None) => return None,
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return None,
            Err(e) => warn!("bad record from the daemon: {e}"),
        }
    }
}

/// Reads a daemon's records from the ring (and the socket where a marker
/// says) until the daemon's end of the socket is closed and the ring read.
fn read_ring(
    sock: &OwnedFd,
    ring: &mut RingReader,
    conn: &mut Option<Connection>,
    said: &mut Said,
) {
    loop {
        if ring.is_empty() && ring.arm() {
            // Nothing waiting: sleep until the daemon signals a record or
            // its end of the socket has something (a message or its close).
            let wake = ring.wake_fd();
            let mut fds = [
                PollFd::new(sock, PollFlags::IN),
                PollFd::new(&wake, PollFlags::IN),
            ];
            let _ = poll(&mut fds, None);
            ring.disarm();
        }
        // Looked at before the ring is read: a message seen here had its
        // marker put in the ring before it was sent, so the read below
        // takes it; a closed socket means that the daemon put its last
        // record in the ring.
        let waiting = socket_waiting(sock);
        let mut closed = waiting == Waiting::Closed;
        let mut taken = 0;
        ring.drain(|item| match item {
            Item::Record(bytes) => match control::decode::<ToSupervisor>(bytes) {
                Ok(msg) => apply(msg, Vec::new(), conn, said),
                Err(e) => warn!("bad record in the journal ring: {e}"),
            },
            Item::Marker => match next_on_socket(sock) {
                Some((msg, fds)) => {
                    taken += 1;
                    apply(msg, fds, conn, said);
                }
                // The daemon died between the marker and the message.
                None => closed = true,
            },
        });
        if closed {
            return;
        }
        if waiting == Waiting::Message && taken == 0 {
            // A message no marker pointed to: read it as it comes.
            match next_on_socket(sock) {
                Some((msg, fds)) => apply(msg, fds, conn, said),
                None => return,
            }
        }
        if !ring.is_empty() || waiting != Waiting::Nothing {
            continue;
        }
        std::thread::sleep(COALESCE);
    }
}

/// What the daemon's end of the socket has for us.
#[derive(Debug, PartialEq, Eq)]
enum Waiting {
    Nothing,
    Message,
    Closed,
}

fn socket_waiting(sock: &OwnedFd) -> Waiting {
    let mut b = [0u8; 1];
    match rustix::net::recv(
        sock,
        &mut b[..],
        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
    ) {
        // A packet, or the peer's close (no record is ever empty).
        Ok((_, n)) if n > 0 => Waiting::Message,
        Ok(_) | Err(rustix::io::Errno::CONNRESET) => Waiting::Closed,
        Err(_) => Waiting::Nothing,
    }
}

/// Keeps `conn` up to date with one record.
fn apply(msg: ToSupervisor, mut fds: Vec<OwnedFd>, conn: &mut Option<Connection>, said: &mut Said) {
    match msg {
        ToSupervisor::Mounted(init) => {
            let Some(dev) = fds.pop() else {
                warn!("the daemon mounted without sending its connection");
                return;
            };
            *conn = Some(Connection {
                dev,
                init,
                // The root's number does not matter to a copy that
                // only replays and saves.
                inodes: Inodes::new(0),
                opens: BTreeMap::new(),
                writes: Vec::new(),
                logs: BTreeMap::new(),
            });
        }
        ToSupervisor::Serving => said.served = true,
        ToSupervisor::Restarting => said.restarting = true,
        // Said once, first; handled by the reading loop.
        ToSupervisor::Ring => {}
        ToSupervisor::Inode(op) => {
            if let Some(c) = conn {
                c.inodes.apply(op);
            }
        }
        ToSupervisor::Opened(rec) => {
            if let Some(c) = conn {
                c.opens.insert(rec.fh, rec);
            }
        }
        ToSupervisor::Released { fh } => {
            if let Some(c) = conn {
                c.opens.remove(&fh);
                c.forget_changes(fh);
            }
        }
        ToSupervisor::Wrote(w) => {
            if let Some(c) = conn {
                c.writes.push(w);
            }
        }
        ToSupervisor::Log { fh, file } => match (conn.as_mut(), fds.pop()) {
            (Some(c), Some(fd)) => {
                c.logs.insert((fh, file), fd);
            }
            _ => warn!("the daemon named a log without sending it"),
        },
        ToSupervisor::Flushed { fh } => {
            if let Some(c) = conn {
                c.forget_changes(fh);
            }
        }
    }
}

/// Whether a record (or the daemon's end of the link closing) is waiting.
fn readable(sock: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(sock, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
}

/// Hands a live connection and its state to a new daemon.
fn send_state(sock: &OwnedFd, c: &Connection) -> io::Result<()> {
    let (table, nodes) = c.inodes.snapshot();
    control::send(
        sock.as_fd(),
        &ToDaemon::Resume(c.init, table),
        &[c.dev.as_fd()],
    )?;
    for batch in nodes.chunks(BATCH) {
        control::send(sock.as_fd(), &ToDaemon::Nodes(batch.to_vec()), &[])?;
    }
    let opens: Vec<OpenRec> = c.opens.values().cloned().collect();
    for batch in opens.chunks(BATCH) {
        control::send(sock.as_fd(), &ToDaemon::Opens(batch.to_vec()), &[])?;
    }
    for (&(fh, file), fd) in &c.logs {
        control::send(sock.as_fd(), &ToDaemon::Log { fh, file }, &[fd.as_fd()])?;
    }
    // One change per message (each is at most a journal chunk), in order.
    for w in &c.writes {
        control::send(sock.as_fd(), &ToDaemon::Writes(vec![w.clone()]), &[])?;
    }
    control::send(sock.as_fd(), &ToDaemon::End, &[])
}
