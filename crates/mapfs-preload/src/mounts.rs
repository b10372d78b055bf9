//! The mapfs mounts this process is attached to, and its connection to each
//! mount's daemon.
//!
//! Found once, at the first hook that needs them: every mapfs mount in
//! `/proc/self/mountinfo` (type `fuse.mapfs`, or `fuse` with a `mapfs-*`
//! source for root-made mounts), restricted to `MAPFS_MOUNTS` (mountpoints
//! separated by `:`) when that is set. A mount is recognised by its device
//! number, so paths never need to be compared. Mounts made after the first
//! lookup are not seen.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use mapfs::control::{self, ConnKey, Proof, Request, Response};
use mapfs::mapcache::Generations;
use parking_lot::Mutex;

use crate::sys;

/// One attached mount.
pub struct Mount {
    /// Mountpoint.
    pub point: PathBuf,
    /// Its device number (`st_dev` of every file in it).
    pub dev: u64,
    /// Its control socket.
    pub socket: PathBuf,
    /// A daemon-mode mount with the kernel writeback cache, as its daemon
    /// said at Hello: nothing is adopted there, because the kernel would
    /// keep stale sizes of files written natively.
    pub writeback: AtomicBool,
    /// Connection of this process (`pid` guards against using a parent's
    /// connection after `fork`).
    pub conn: Mutex<Option<Conn>>,
    /// The daemon's generation table (see [`crate::mcache`]), attached at
    /// the first adoption; a mapping, so it survives `fork`.
    pub generations: OnceLock<Generations>,
}

/// An open connection to a daemon.
pub struct Conn {
    /// `None` once the application took the descriptor number over (it
    /// `dup2`ed onto it or closed it behind the shim's back): never closed
    /// by the shim then.
    sock: Option<OwnedFd>,
    /// Socket inode, to notice the descriptor became something else.
    ino: u64,
    pid: u32,
    /// The connection's key, for proofs of possession.
    key: ConnKey,
}

impl Conn {
    /// The socket, if the descriptor is still the one the shim connected.
    fn live(&self) -> Option<BorrowedFd<'_>> {
        let sock = self.sock.as_ref()?;
        match rustix::fs::fstat(sock) {
            Ok(st) if st.st_ino == self.ino => Some(sock.as_fd()),
            _ => None,
        }
    }

    /// The daemon closed the connection (it closes idle ones): nothing to
    /// read, but hung up.
    fn hung_up(&self) -> bool {
        let Some(sock) = self.live() else {
            return true;
        };
        let mut fds = [rustix::event::PollFd::new(
            &sock,
            rustix::event::PollFlags::RDHUP | rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())) {
            Ok(0) => false,
            Ok(_) => !fds[0].revents().is_empty(),
            Err(_) => true,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(sock) = self.sock.take() {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
            let ours = rustix::fs::fstat(&sock).is_ok_and(|st| st.st_ino == self.ino);
            if ours {
                drop(sock);
            } else {
                // Closed behind the shim's back, or the number now belongs
                // to the application: not ours to close.
                std::mem::forget(sock);
            }
            crate::table::release_shim_fd(fd);
        }
    }
}

fn connect(path: &std::path::Path) -> std::io::Result<(Conn, bool)> {
    let control::Connection {
        sock,
        key,
        writeback_cache,
    } = control::connect(path)?;
    let sock = match rustix::io::fcntl_dupfd_cloexec(&sock, sys::HIGH_FD) {
        Ok(high) => high,
        // Low descriptor limit: keep the number we have.
        Err(_) => sock,
    };
    let ino = rustix::fs::fstat(&sock)?.st_ino;
    crate::table::claim_shim_fd(std::os::fd::AsRawFd::as_raw_fd(&sock));
    let conn = Conn {
        sock: Some(sock),
        ino,
        pid: sys::getpid(),
        key,
    };
    Ok((conn, writeback_cache))
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();

/// The attached mounts (looked up on first use).
pub fn all() -> &'static [Mount] {
    MOUNTS.get_or_init(discover)
}

/// The index of the mount whose device is `dev`.
pub fn by_dev(dev: u64) -> Option<usize> {
    all().iter().position(|m| m.dev == dev)
}

fn discover() -> Vec<Mount> {
    let wanted: Option<Vec<PathBuf>> = std::env::var_os("MAPFS_MOUNTS")
        .filter(|v| !v.is_empty())
        .map(|v| std::env::split_paths(&v).map(|p| trim(&p)).collect());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<Mount> = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let mut post = post.split(' ');
        let (Some(fstype), Some(source)) = (post.next(), post.next()) else {
            continue;
        };
        let mapfs = fstype == "fuse.mapfs" || (fstype == "fuse" && source.starts_with("mapfs-"));
        if !mapfs || pre.len() < 5 {
            continue;
        }
        let Some((major, minor)) = pre[2].split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
            continue;
        };
        let point = PathBuf::from(control::unescape_mountinfo(pre[4]));
        if let Some(w) = &wanted {
            if !w.contains(&point) {
                continue;
            }
        }
        let dev = rustix::fs::makedev(major, minor);
        // A later mount on the same point hides the earlier one.
        found.retain(|m| m.point != point);
        let socket = control::socket_path(&point);
        found.push(Mount {
            writeback: AtomicBool::new(false),
            point,
            dev,
            socket,
            conn: Mutex::new(None),
            generations: OnceLock::new(),
        });
    }
    for m in &found {
        sys::log(format_args!(
            "attached to {} (dev {:#x}, socket {})",
            m.point.display(),
            m.dev,
            m.socket.display()
        ));
    }
    found
}

fn trim(p: &std::path::Path) -> PathBuf {
    let s = p.to_string_lossy();
    let t = s.trim_end_matches('/');
    PathBuf::from(if t.is_empty() { "/" } else { t })
}

impl Mount {
    /// One request/response exchange with the daemon, connecting (again) if
    /// this process has no connection yet. A failed exchange drops the
    /// connection, so the next call reconnects.
    pub fn call(&self, req: &Request) -> std::io::Result<(Response, Vec<OwnedFd>)> {
        self.exchange(None, |_| req.clone())
    }

    /// An exchange whose request carries a proof that this process holds
    /// `mount_file` (its descriptor of a file on this mount), made for this
    /// process's connection.
    pub fn call_proven(
        &self,
        mount_file: BorrowedFd<'_>,
        req: impl FnOnce(Proof) -> Request,
    ) -> std::io::Result<(Response, Vec<OwnedFd>)> {
        self.exchange(Some(mount_file), |proof| req(proof.unwrap_or_default()))
    }

    fn exchange(
        &self,
        prove_on: Option<BorrowedFd<'_>>,
        req: impl FnOnce(Option<Proof>) -> Request,
    ) -> std::io::Result<(Response, Vec<OwnedFd>)> {
        let mut conn = self.conn.lock();
        self.connected(&mut conn)?;
        let c = conn
            .as_ref()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))?;
        let sock = c
            .live()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))?;
        let proof = match prove_on {
            Some(fd) => Some(control::prove(fd, &c.key)?),
            None => None,
        };
        let res = control::call(sock, &req(proof));
        if res.is_err() {
            *conn = None;
        }
        res
    }

    /// Connects this process to the daemon unless it is connected already.
    pub fn connect(&self) -> std::io::Result<()> {
        self.connected(&mut self.conn.lock())
    }

    fn connected(&self, conn: &mut Option<Conn>) -> std::io::Result<()> {
        let pid = sys::getpid();
        if conn.as_ref().is_some_and(|c| c.pid != pid || c.hung_up()) {
            // Inherited from the parent across fork (the parent still owns
            // the conversation on it; our copy is just closed), taken over
            // by the application, or closed by the daemon.
            *conn = None;
        }
        if conn.is_none() {
            let (c, writeback) = connect(&self.socket)?;
            *conn = Some(c);
            self.writeback.store(writeback, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Keeps the generation table that came with an adoption (the first
    /// one on a connection).
    pub fn keep_generations(&self, fds: &mut Vec<OwnedFd>, files: u32, generations: bool) {
        if let Some(g) = control::take_generations(fds, files, generations) {
            // A reconnection to the same daemon sends the same table.
            let _ = self.generations.set(g);
        }
    }
}

/// The attached mounts if they were looked up already, else none (for
/// `fork` handlers, which must not start reading files).
pub fn loaded() -> &'static [Mount] {
    MOUNTS.get().map(Vec::as_slice).unwrap_or(&[])
}
