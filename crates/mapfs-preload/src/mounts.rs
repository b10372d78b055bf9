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
    /// Connection of this process (`pid` guards against using a parent's
    /// connection after `fork`).
    pub conn: Mutex<Option<Conn>>,
}

/// An open connection to a daemon.
pub struct Conn {
    sock: OwnedFd,
    pid: u32,
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
        let point = PathBuf::from(unescape(pre[4]));
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
            point,
            dev,
            socket,
            conn: Mutex::new(None),
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

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
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

impl Mount {
    /// One request/response exchange with the daemon, connecting (again) if
    /// this process has no connection yet. A failed exchange drops the
    /// connection, so the next call reconnects.
    pub fn call(&self, req: &Request) -> std::io::Result<(Response, Vec<OwnedFd>)> {
        let mut conn = self.conn.lock();
        let pid = sys::getpid();
        if conn.as_ref().is_some_and(|c| c.pid != pid) {
            // Inherited from the parent across fork: the parent still owns
            // the conversation on it; our copy is just closed.
            *conn = None;
        }
        if conn.is_none() {
            let sock = control::connect(&self.socket)?;
            *conn = Some(Conn { sock, pid });
        }
        let sock = &conn.as_ref().expect("connected above").sock;
        let res = control::call(sock.as_fd(), req);
        if res.is_err() {
            *conn = None;
        }
        res
    }
}

/// The attached mounts if they were looked up already, else none (for
/// `fork` handlers, which must not start reading files).
pub fn loaded() -> &'static [Mount] {
    MOUNTS.get().map(Vec::as_slice).unwrap_or(&[])
}
