//! The daemon's end of the link to its supervisor: a `SOCK_SEQPACKET`
//! socket inherited at start and named in [`SUPERVISOR_FD_ENV`].
//!
//! Sends block: a change the kernel is about to be told of must be in the
//! supervisor's socket buffer first (it survives the daemon). A supervisor
//! that is gone breaks the link once, with a warning; the daemon then serves
//! on, unsupervised.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use mapfs::control;
use tracing::warn;

use super::records::{
    InitState, InodeOp, NodeSnap, OpenRec, PendingWrite, TableSnap, ToDaemon, ToSupervisor,
};
use super::ring::{self, Refused, RingWriter};
use crate::inodes::InodeJournal;

/// Environment variable naming the inherited link descriptor.
pub const SUPERVISOR_FD_ENV: &str = "MAPFS_SUPERVISOR_FD";

/// Socket buffer of the link: room for bursts of changes while the
/// supervisor is descheduled.
pub const LINK_BUFFER: usize = 4 << 20;

/// The daemon's end of the link.
#[derive(Debug)]
pub struct Link {
    sock: OwnedFd,
    /// The journal ring, when the supervisor offered one and this link
    /// took it.
    ring: Option<RingWriter>,
    /// Held from a marker to its message on the socket, so that messages
    /// are on the socket in the order of their markers.
    marked: Mutex<()>,
    broken: AtomicBool,
}

/// How the supervisor asks a daemon to start.
#[derive(Debug)]
pub enum Start {
    /// Mount afresh.
    Fresh,
    /// Take over a live connection.
    Resume(Resume),
}

/// Everything a daemon needs to take over a live connection.
#[derive(Debug)]
pub struct Resume {
    /// What INIT settled.
    pub init: InitState,
    /// The connection's `/dev/fuse` descriptor.
    pub dev: OwnedFd,
    /// The inode table.
    pub table: TableSnap,
    /// Its nodes.
    pub nodes: Vec<NodeSnap>,
    /// Handles the kernel holds.
    pub opens: Vec<OpenRec>,
    /// Acknowledged changes the file system was not handed yet.
    pub writes: Vec<PendingWrite>,
    /// The append logs they name, by open handle and backing file index.
    pub logs: std::collections::HashMap<(u64, u32), OwnedFd>,
}

impl Link {
    /// The link this process was started with, if any (and removes the
    /// variable, so that nothing this process starts sees it).
    pub fn from_env() -> io::Result<Option<Link>> {
        let Some(raw) = std::env::var_os(SUPERVISOR_FD_ENV) else {
            return Ok(None);
        };
        std::env::remove_var(SUPERVISOR_FD_ENV);
        let fd: i32 = raw
            .to_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad {SUPERVISOR_FD_ENV}")))?;
        let sock = crate::sys::inherited_socket(fd)?;
        let mut link = Link::new(sock);
        match RingWriter::from_env() {
            Ok(Some(ring)) => {
                // Said on the socket, before any record goes to the ring.
                link.send(&ToSupervisor::Ring);
                link.ring = Some(ring);
            }
            Ok(None) => {}
            Err(e) => warn!("cannot take the journal ring ({e}); records go through the socket"),
        }
        Ok(Some(link))
    }

    /// A link over a connected socket.
    pub fn new(sock: OwnedFd) -> Link {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, LINK_BUFFER);
        Link {
            sock,
            ring: None,
            marked: Mutex::new(()),
            broken: AtomicBool::new(false),
        }
    }

    /// Sends one record (see the module docs for failures).
    pub fn send(&self, msg: &ToSupervisor) {
        self.send_with(msg, &[]);
    }

    /// Sends one record with descriptors attached.
    pub fn send_with(&self, msg: &ToSupervisor, fds: &[BorrowedFd<'_>]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.deliver(msg, fds) {
            if !self.broken.swap(true, Ordering::Relaxed) {
                warn!("lost the supervisor ({e}); this daemon is no longer restarted if it dies");
            }
        }
    }

    /// Puts one record where the supervisor reads it: in the ring when
    /// there is one (a marker there when descriptors come with it, the
    /// record on the socket), on the socket otherwise.
    fn deliver(&self, msg: &ToSupervisor, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let Some(ring) = &self.ring else {
            return control::send(self.sock.as_fd(), msg, fds);
        };
        let gone = || ring::peer_gone(self.sock.as_fd());
        if fds.is_empty() {
            match ring.push(&control::encode(msg)?, gone) {
                Ok(()) => return Ok(()),
                Err(Refused::SupervisorGone) => return Err(io::Error::other("it stopped reading")),
                // Too long for the ring: on the socket, at a marker.
                Err(Refused::TooLong) => {}
            }
        }
        let _in_order = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        ring.push_marker(gone)
            .map_err(|_| io::Error::other("it stopped reading"))?;
        control::send(self.sock.as_fd(), msg, fds)
    }

    /// Waits for the supervisor's first word: mount afresh or take over.
    pub fn start(&self) -> io::Result<Start> {
        let (first, mut fds) = self.recv()?;
        let (init, table) = match first {
            ToDaemon::Fresh => return Ok(Start::Fresh),
            ToDaemon::Resume(init, table) => (init, table),
            other => return Err(io::Error::other(format!("supervisor sent {other:?} first"))),
        };
        let dev = fds
            .pop()
            .ok_or_else(|| io::Error::other("supervisor sent no /dev/fuse descriptor"))?;
        let mut resume = Resume {
            init,
            dev,
            table,
            nodes: Vec::new(),
            opens: Vec::new(),
            writes: Vec::new(),
            logs: std::collections::HashMap::new(),
        };
        loop {
            let (msg, mut fds) = self.recv()?;
            match msg {
                ToDaemon::Nodes(n) => resume.nodes.extend(n),
                ToDaemon::Opens(o) => resume.opens.extend(o),
                ToDaemon::Log { fh, file } => {
                    if let Some(fd) = fds.pop() {
                        resume.logs.insert((fh, file), fd);
                    }
                }
                ToDaemon::Writes(w) => resume.writes.extend(w),
                ToDaemon::End => return Ok(Start::Resume(resume)),
                other => return Err(io::Error::other(format!("supervisor sent {other:?}"))),
            }
        }
    }

    fn recv(&self) -> io::Result<(ToDaemon, Vec<OwnedFd>)> {
        control::recv(self.sock.as_fd())?
            .ok_or_else(|| io::Error::other("the supervisor closed the link"))
    }
}

impl InodeJournal for Link {
    fn inode(&self, op: InodeOp) {
        self.send(&ToSupervisor::Inode(op));
    }
}
