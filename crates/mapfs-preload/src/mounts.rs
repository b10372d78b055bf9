//! The mapfs mounts this process is attached to, and its connection to each
//! mount's daemon.
//!
//! Found once, at the first hook that needs them: every mapfs mount in
//! `/proc/self/mountinfo` (type `fuse.mapfs`, or `fuse` with a `mapfs-*`
//! source for root-made mounts), restricted to `MAPFS_MOUNTS` (mountpoints
//! separated by `:`) when that is set. A mount is recognised by its device
//! number, so paths never need to be compared. Mounts made after the first
//! lookup are not seen.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::OnceLock;

use mapfs::control::{self, Request, Response};
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
    /// A daemon-mode mount with the kernel writeback cache
    /// (`MAPFS_WRITEBACK_MOUNTS`, set by `mapfs run`): nothing is adopted
    /// there, because the kernel would keep stale sizes of files written
    /// natively.
    pub writeback: bool,
    /// Connection of this process (`pid` guards against using a parent's
    /// connection after `fork`).
    pub conn: Mutex<Option<Conn>>,
    /// The daemon's generation table (see [`crate::mcache`]), attached at
    /// the first connection; a mapping, so it survives `fork`.
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
}

impl Conn {
    /// The socket, if the descriptor is still the one the shim connected.
    fn live(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        let sock = self.sock.as_ref()?;
        match rustix::fs::fstat(sock) {
            Ok(st) if st.st_ino == self.ino => Some(sock.as_fd()),
            _ => None,
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

fn connect(path: &std::path::Path) -> std::io::Result<(Conn, Option<Generations>)> {
    let (sock, generations) = control::connect_with_generations(path)?;
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
    };
    Ok((conn, generations))
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
    let writeback: Vec<PathBuf> = std::env::var_os("MAPFS_WRITEBACK_MOUNTS")
        .map(|v| std::env::split_paths(&v).map(|p| trim(&p)).collect())
        .unwrap_or_default();
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
            writeback: writeback.contains(&point),
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
        let mut conn = self.conn.lock();
        self.connected(&mut conn)?;
        let sock = conn
            .as_ref()
            .and_then(Conn::live)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))?;
        let res = control::call(sock, req);
        if res.is_err() {
            *conn = None;
        }
        res
    }

    /// Connects this process to the daemon unless it is connected already:
    /// afterwards the generation table is attached, if the daemon has one.
    pub fn connect(&self) -> std::io::Result<()> {
        self.connected(&mut self.conn.lock())
    }

    fn connected(&self, conn: &mut Option<Conn>) -> std::io::Result<()> {
        let pid = sys::getpid();
        if conn
            .as_ref()
            .is_some_and(|c| c.pid != pid || c.live().is_none())
        {
            // Inherited from the parent across fork (the parent still owns
            // the conversation on it; our copy is just closed), or the
            // descriptor was taken over by the application.
            *conn = None;
        }
        if conn.is_none() {
            let (c, generations) = connect(&self.socket)?;
            *conn = Some(c);
            if let Some(g) = generations {
                // A reconnection to the same daemon sends the same table.
                let _ = self.generations.set(g);
            }
        }
        Ok(())
    }
}

/// The attached mounts if they were looked up already, else none (for
/// `fork` handlers, which must not start reading files).
pub fn loaded() -> &'static [Mount] {
    MOUNTS.get().map(Vec::as_slice).unwrap_or(&[])
}
