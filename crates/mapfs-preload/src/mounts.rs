//! The mapfs mounts this process is attached to, and its connection to each
//! mount's daemon.
//!
//! Found once, at the first hook that needs them: every mapfs mount in
//! `/proc/self/mountinfo` (type `fuse.mapfs`, or `fuse` with a `mapfs-*`
//! source for root-made mounts), restricted to `MAPFS_MOUNTS` (mountpoints
//! separated by `:`) when that is set. A mount is recognised by its device
//! number, so paths never need to be compared. Mounts made after the first
//! lookup are not seen.
//!
//! `mapfs run` also names each mount's device number in
//! [`MOUNT_DEVS_ENV`] (decimal, `:`-separated, in the order of
//! `MAPFS_MOUNTS`), so that its processes need not read
//! `/proc/self/mountinfo` at all (the kernel formats every mount of the
//! namespace for each read: measured, about a tenth of the shim's cost in
//! a process that reads one small file). The list is a hint only: a file
//! is taken for a mount's file by its device number, and every adoption is
//! then proven to the daemon through the mount itself, so a wrong number
//! costs the speed-up, never access.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mapfs::control::{self, ConnKey, Proof, Request, Response};
use mapfs::mapcache::Generations;
use mapfs_interpose::sync::Mutex;

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
    /// the first adoption; a mapping, so it survives `fork`; replaced when
    /// the daemon is.
    pub generations: Mutex<Option<Table>>,
    /// This process reached the daemon (so a missing socket means it is
    /// being replaced, worth waiting for; see [`Mount::call_proven`]).
    reached: AtomicBool,
    /// Pid of the daemon last connected to (0: none yet).
    daemon: AtomicU32,
    /// See [`Mount::take_cache_stale`].
    cache_stale: AtomicBool,
    /// Counts the generation tables this process attached or dropped, so a
    /// token names its table (see [`Mount::copy_token`]).
    table_epoch: AtomicU64,
    /// When [`Mount::daemon_alive`] last looked (coarse monotonic ms), and
    /// what it found.
    alive_checked: AtomicU64,
    alive: AtomicBool,
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
    /// The daemon's pid (see [`Mount::note_daemon`]).
    daemon: u32,
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
        daemon: peer_pid(sock.as_fd()),
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

/// Device numbers of the mounts of `MAPFS_MOUNTS`, in its order (see the
/// module docs).
pub const MOUNT_DEVS_ENV: &str = "MAPFS_MOUNT_DEVS";

fn discover() -> Vec<Mount> {
    let found = from_env().unwrap_or_else(from_mountinfo);
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

fn mount(point: PathBuf, dev: u64) -> Mount {
    let socket = control::socket_path(&point);
    Mount {
        writeback: AtomicBool::new(false),
        point,
        dev,
        socket,
        conn: Mutex::new(None),
        generations: Mutex::new(None),
        reached: AtomicBool::new(false),
        daemon: AtomicU32::new(0),
        cache_stale: AtomicBool::new(false),
        table_epoch: AtomicU64::new(0),
        alive_checked: AtomicU64::new(0),
        alive: AtomicBool::new(false),
    }
}

/// The mounts as `mapfs run` named them ([`MOUNT_DEVS_ENV`]), if it did.
fn from_env() -> Option<Vec<Mount>> {
    let points = std::env::var_os("MAPFS_MOUNTS").filter(|v| !v.is_empty())?;
    let devs = std::env::var(MOUNT_DEVS_ENV).ok()?;
    let devs: Vec<u64> = devs
        .split(':')
        .map(|d| d.parse().ok())
        .collect::<Option<_>>()?;
    let points: Vec<PathBuf> = std::env::split_paths(&points).map(|p| trim(&p)).collect();
    if points.len() != devs.len() {
        return None;
    }
    Some(
        points
            .into_iter()
            .zip(devs)
            .map(|(point, dev)| mount(point, dev))
            .collect(),
    )
}

fn from_mountinfo() -> Vec<Mount> {
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
        found.push(mount(point, dev));
    }
    found
}

fn trim(p: &std::path::Path) -> PathBuf {
    let s = p.to_string_lossy();
    let t = s.trim_end_matches('/');
    PathBuf::from(if t.is_empty() { "/" } else { t })
}

/// How long the shim keeps trying to reach a daemon that went away, for a
/// supervisor to start its successor on the same mount (the control socket
/// is missing or refuses for up to about a second then).
pub const RECONNECT_FOR: Duration = Duration::from_secs(10);

/// Set when the process exits: its last messages are not worth a wait.
static EXITING: AtomicBool = AtomicBool::new(false);

/// The process is exiting (see `EXITING`).
pub fn exiting() {
    EXITING.store(true, Ordering::Relaxed);
}

/// Longest pause between two attempts to reach a replaced daemon.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// The connection was lost (`true`), as opposed to refused or answered with
/// an error: the daemon went away, or is being replaced.
fn lost(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        // Not ENOTCONN: that is what a dead mount answers the proof's
        // ioctl with, and no supervisor brings that back.
        Some(libc::ECONNRESET | libc::EPIPE | libc::ENOENT | libc::ECONNREFUSED)
    )
}

/// A request naming a handle the daemon gave one connection: meaningless on
/// any other, so never sent on a new one.
fn names_handle(req: &Request) -> bool {
    matches!(
        req,
        Request::Closed { .. }
            | Request::Release { .. }
            | Request::Remap { .. }
            | Request::MapPart { .. }
    )
}

/// Held while a large map goes in parts: the daemon keeps one map's parts
/// per connection, so two threads must not interleave theirs.
static SENDING_PARTS: Mutex<()> = Mutex::new(());

/// The answer for a handle of a connection that is gone.
fn stale_handle() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl Mount {
    /// One request/response exchange with the daemon, connecting (again) if
    /// this process has no connection yet; see [`Mount::call_proven`] for
    /// what happens when the daemon goes away. A request naming a handle
    /// (`Closed`, `Release`) goes only on the connection that got the
    /// handle: once that is gone, the answer is `EBADF` at once (the files
    /// adopted through it keep working: the shim holds their backing
    /// descriptors).
    pub fn call(&self, req: &Request) -> io::Result<(Response, Vec<OwnedFd>)> {
        if names_handle(req) {
            return self.call_on_current(req);
        }
        self.exchange(None, |_| req.clone())
    }

    /// An exchange whose request carries a proof that this process holds
    /// `mount_file` (its descriptor of a file on this mount), made for this
    /// process's connection.
    ///
    /// The one place that survives a daemon being replaced (a supervisor
    /// restarting it on the same mount): when the connection ends (EOF,
    /// `ECONNRESET`, `EPIPE`) or the socket is missing or refuses
    /// (`ENOENT`, `ECONNREFUSED`) after this process had reached the daemon,
    /// it reconnects with a fresh Hello (and a fresh proof), retrying with
    /// backoff for up to [`RECONNECT_FOR`]; after that it gives up, and
    /// later calls try once each until a connection succeeds again.
    pub fn call_proven(
        &self,
        mount_file: BorrowedFd<'_>,
        req: impl Fn(Proof) -> Request,
    ) -> io::Result<(Response, Vec<OwnedFd>)> {
        self.exchange(Some(mount_file), |proof| req(proof.unwrap_or_default()))
    }

    fn exchange(
        &self,
        prove_on: Option<BorrowedFd<'_>>,
        req: impl Fn(Option<Proof>) -> Request,
    ) -> io::Result<(Response, Vec<OwnedFd>)> {
        self.retrying(|conn| self.exchange_once(conn, prove_on, &req))
    }

    /// Runs `attempt` on this process's connection, again and again while
    /// the daemon is away (see [`Mount::call_proven`]); a failed attempt
    /// drops the connection.
    fn retrying<T>(
        &self,
        mut attempt: impl FnMut(&mut Option<Conn>) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut deadline: Option<Instant> = None;
        let mut backoff = Duration::from_millis(5);
        loop {
            let err = {
                let mut conn = self.conn.lock();
                match attempt(&mut conn) {
                    Ok(r) => return Ok(r),
                    Err(e) => {
                        *conn = None;
                        e
                    }
                }
            };
            if !lost(&err)
                || !self.reached.load(Ordering::Relaxed)
                || EXITING.load(Ordering::Relaxed)
            {
                return Err(err);
            }
            let now = Instant::now();
            let until = *deadline.get_or_insert(now + RECONNECT_FOR);
            if now >= until {
                // Later calls try once each, until one gets through.
                self.reached.store(false, Ordering::Relaxed);
                sys::log(format_args!(
                    "{}: the daemon stayed unreachable for {:?}: {err}",
                    self.point.display(),
                    RECONNECT_FOR
                ));
                return Err(err);
            }
            std::thread::sleep(backoff.min(until - now));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn exchange_once(
        &self,
        conn: &mut Option<Conn>,
        prove_on: Option<BorrowedFd<'_>>,
        req: &impl Fn(Option<Proof>) -> Request,
    ) -> io::Result<(Response, Vec<OwnedFd>)> {
        self.connected(conn)?;
        let c = conn.as_ref().ok_or_else(stale_handle)?;
        let sock = c.live().ok_or_else(stale_handle)?;
        let proof = match prove_on {
            Some(fd) => Some(control::prove(fd, &c.key)?),
            None => None,
        };
        control::call(sock, &req(proof))
    }

    /// A `Release` or `Remap` (`make`) of lent open `handle` carrying
    /// `map`: in the request itself, or, when its encoding is larger than
    /// [`control::MAP_INLINE`], first in [`Request::MapPart`]s on the same
    /// connection. A refused part is the answer.
    pub fn call_with_map(
        &self,
        handle: u64,
        map: mapfs::DataMap,
        make: impl FnOnce(Option<mapfs::DataMap>) -> Request,
    ) -> io::Result<(Response, Vec<OwnedFd>)> {
        let parts = if map.piece_count() <= control::SURELY_INLINE_PIECES {
            None
        } else {
            Some(control::encode_map(&map)?).filter(|b| b.len() > control::MAP_INLINE)
        };
        let Some(bytes) = parts else {
            return self.call(&make(Some(map)));
        };
        let _one_at_a_time = SENDING_PARTS.lock();
        for part in bytes.chunks(control::MAP_INLINE) {
            let req = Request::MapPart {
                handle,
                bytes: part.to_vec(),
            };
            match self.call(&req)? {
                (Response::Done, _) => {}
                refused => return Ok(refused),
            }
        }
        self.call(&make(None))
    }

    /// [`Mount::call`] of a request naming a handle: on the current
    /// connection only, never a new one.
    fn call_on_current(&self, req: &Request) -> io::Result<(Response, Vec<OwnedFd>)> {
        let mut conn = self.conn.lock();
        let pid = sys::getpid();
        let Some(sock) = conn.as_ref().filter(|c| c.pid == pid).and_then(Conn::live) else {
            return Err(stale_handle());
        };
        let res = control::call(sock, req);
        if let Err(e) = &res {
            *conn = None;
            if lost(e) {
                return Err(stale_handle());
            }
        }
        res
    }

    /// Connects this process to the daemon unless it is connected already
    /// (waiting for a daemon being replaced, as [`Mount::call_proven`]).
    pub fn connect(&self) -> io::Result<()> {
        self.retrying(|conn| self.connected(conn))
    }

    fn connected(&self, conn: &mut Option<Conn>) -> io::Result<()> {
        let pid = sys::getpid();
        if conn.as_ref().is_some_and(|c| c.pid != pid || c.hung_up()) {
            // Inherited from the parent across fork (the parent still owns
            // the conversation on it; our copy is just closed), taken over
            // by the application, or closed by the daemon.
            *conn = None;
        }
        if conn.is_some() {
            return Ok(());
        }
        let inherited = take_inherited(self.dev);
        if inherited.is_some() {
            // The previous image reached the daemon: worth waiting for.
            self.reached.store(true, Ordering::Relaxed);
        }
        let (c, writeback, table) = match inherited.and_then(resume) {
            Some(resumed) => resumed,
            None => {
                let (c, writeback) = connect(&self.socket)?;
                (c, writeback, None)
            }
        };
        self.note_daemon(&c);
        if let Some(t) = table {
            self.keep_table(t);
        }
        *conn = Some(c);
        self.writeback.store(writeback, Ordering::Relaxed);
        self.reached.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Remembers which daemon this process talks to; a different one (the
    /// mount's daemon was replaced) knows nothing of the old one's tokens,
    /// so the generation table and the map cache of this mount are dropped
    /// until the new daemon sends its own table.
    fn note_daemon(&self, c: &Conn) {
        let before = self.daemon.swap(c.daemon, Ordering::Relaxed);
        if before != 0 && before != c.daemon {
            sys::log(format_args!(
                "{}: a new daemon (pid {} was {before}): map cache dropped",
                self.point.display(),
                c.daemon
            ));
            let mut g = self.generations.lock();
            *g = None;
            self.table_epoch.fetch_add(1, Ordering::Relaxed);
            drop(g);
            // Emptied by the map cache at its next use (it is locked before
            // the connection, never under it).
            self.cache_stale.store(true, Ordering::Relaxed);
        }
    }

    /// True once after the daemon was replaced: what the map cache holds
    /// for this mount is keyed by the old daemon's tokens.
    pub fn take_cache_stale(&self) -> bool {
        self.cache_stale.swap(false, Ordering::Relaxed)
    }

    /// The current token of inode `ino` in the daemon's generation table,
    /// if this process has the table.
    pub fn token(&self, ino: u64) -> Option<u64> {
        Some(self.generations.lock().as_ref()?.table.token(ino))
    }

    /// The token of inode `ino` with the table it comes from, if this
    /// process has a table: what a copy of the file's bytes stays valid
    /// under ([`mapfs::control::Response::Copied`]). Tokens of two tables
    /// never compare equal, though their counters may.
    pub fn copy_token(&self, ino: u64) -> Option<(u64, u64)> {
        let g = self.generations.lock();
        let token = g.as_ref()?.table.token(ino);
        Some((self.table_epoch.load(Ordering::Relaxed), token))
    }

    /// Whether the daemon this process talks to still runs, looked up at
    /// most every [`mapfs::control::COPY_CHECK`] (its connection hung up
    /// once it died): a copy of a file's bytes is valid only while the
    /// daemon whose table guards it runs.
    pub fn daemon_alive(&self) -> bool {
        let now = sys::coarse_ms();
        let check = mapfs::control::COPY_CHECK.as_millis() as u64;
        if now.saturating_sub(self.alive_checked.load(Ordering::Relaxed)) < check {
            return self.alive.load(Ordering::Relaxed);
        }
        let pid = sys::getpid();
        let alive = (self.conn.lock().as_ref()).is_some_and(|c| c.pid == pid && !c.hung_up());
        self.alive.store(alive, Ordering::Relaxed);
        self.alive_checked.store(now, Ordering::Relaxed);
        alive
    }

    /// Keeps the generation table that came with an adoption (the first
    /// one on a connection).
    pub fn keep_generations(&self, fds: &mut Vec<OwnedFd>, files: u32, generations: bool) {
        if !generations || fds.len() <= files as usize {
            return;
        }
        if let Some(fd) = fds.pop() {
            self.keep_table(fd);
        }
    }

    /// Attaches the table `fd` (see [`Mount::keep_generations`]), keeping
    /// a descriptor of it to hand on across `exec`.
    fn keep_table(&self, fd: OwnedFd) {
        let kept = sys::dup_high(fd.as_raw_fd()).ok();
        match Generations::attach(fd) {
            Ok(table) => {
                if let Some(k) = &kept {
                    crate::table::claim_shim_fd(k.as_raw_fd());
                }
                let mut g = self.generations.lock();
                *g = Some(Table { table, fd: kept });
                self.table_epoch.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => sys::log(format_args!(
                "the daemon's generation table is unusable: {e}"
            )),
        }
    }
}

/// The daemon's generation table as this process holds it.
pub struct Table {
    table: Generations,
    /// A descriptor of it (the shim's own, close-on-exec until an `exec`
    /// hands it on), `None` if none could be kept.
    fd: Option<OwnedFd>,
}

impl Drop for Table {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            crate::table::release_shim_fd(fd.as_raw_fd());
        }
    }
}

/// Environment variable naming the control connections an image hands to
/// the next across `exec`: `dev,socket_fd,socket_ino,table_fd` per mount
/// (`table_fd` -1 when none), `;`-separated. The new image re-validates a
/// connection with a Hello on it (the daemon answers with the connection's
/// key) and falls back to a fresh connect if the descriptor is not that
/// socket any more or the daemon does not answer. Nothing is trusted from
/// it: every adoption is still proven through the mount, and the daemon
/// checks the proof against the connection's peer credentials.
pub const CONNS_ENV: &str = "MAPFS_PRELOAD_CONNS";

/// A connection handed over by the image this process ran before `exec`.
struct Inherited {
    dev: u64,
    sock: OwnedFd,
    ino: u64,
    table: Option<OwnedFd>,
    /// The process it was handed to (a forked child must not use it).
    pid: u32,
}

static INHERITED: Mutex<Vec<Inherited>> = Mutex::new(Vec::new());

/// Takes over the connections described by `spec` ([`CONNS_ENV`]), from the
/// constructor: each descriptor is checked to still be what the previous
/// image named, then made close-on-exec and marked as the shim's. No
/// message is sent until the first adoption needs the connection.
pub fn import_connections(spec: &str) {
    let pid = sys::getpid();
    let mut out = Vec::new();
    for part in spec.split(';').filter(|p| !p.is_empty()) {
        let v: Vec<i64> = part.split(',').filter_map(|x| x.parse().ok()).collect();
        let [dev, sock, ino, table] = v[..] else {
            continue;
        };
        let Some(sock) = take_fd(sock, |st| {
            st.st_mode & libc::S_IFMT == libc::S_IFSOCK && st.st_ino as i64 == ino
        }) else {
            continue;
        };
        let table = take_fd(table, |st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        out.push(Inherited {
            dev: dev as u64,
            ino: ino as u64,
            sock,
            table,
            pid,
        });
    }
    *INHERITED.lock() = out;
}

/// The inherited descriptor `raw` if `ok` accepts its `fstat`, made
/// close-on-exec and the shim's.
fn take_fd(raw: i64, ok: impl Fn(&rustix::fs::Stat) -> bool) -> Option<OwnedFd> {
    let raw = RawFd::try_from(raw).ok().filter(|&r| r >= 0)?;
    if crate::table::state(raw) != crate::table::UNKNOWN {
        return None;
    }
    let st = rustix::fs::fstat(sys::fd(raw)).ok()?;
    if !ok(&st) {
        return None;
    }
    sys::set_cloexec(raw, true).ok()?;
    crate::table::claim_shim_fd(raw);
    // SAFETY: the previous image of this process handed `raw` over for the
    // shim (named in CONNS_ENV, checked above to be the object it named and
    // not yet claimed by anyone in this image); the shim owns it from here.
    Some(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The connection inherited for mount `dev`, if this process has one.
fn take_inherited(dev: u64) -> Option<Inherited> {
    let mut list = INHERITED.lock();
    let pid = sys::getpid();
    if list.iter().any(|i| i.pid != pid) {
        // A forked child: the parent image's connections are not its own.
        for i in list.drain(..) {
            drop_inherited(i);
        }
        return None;
    }
    let at = list.iter().position(|i| i.dev == dev)?;
    Some(list.swap_remove(at))
}

impl Inherited {
    /// The socket descriptor is still the one handed over (and the table's
    /// still the shim's).
    fn still_ours(&self) -> bool {
        let raw = self.sock.as_raw_fd();
        crate::table::state(raw) == crate::table::SHIM
            && rustix::fs::fstat(&self.sock).is_ok_and(|st| st.st_ino == self.ino)
            && self
                .table
                .as_ref()
                .is_none_or(|t| crate::table::state(t.as_raw_fd()) == crate::table::SHIM)
    }
}

fn drop_inherited(i: Inherited) {
    crate::table::release_shim_fd(i.sock.as_raw_fd());
    if let Some(t) = &i.table {
        crate::table::release_shim_fd(t.as_raw_fd());
    }
}

/// Re-validates an inherited connection with a Hello on it: the daemon
/// answers with the connection's key. `None` (and the descriptors closed)
/// if it does not.
fn resume(i: Inherited) -> Option<(Conn, bool, Option<OwnedFd>)> {
    if !i.still_ours() {
        // The application took the numbers over since (dup2 onto them, or
        // a close behind the shim's back): nothing of ours to close.
        std::mem::forget(i);
        return None;
    }
    let hello = control::call(
        i.sock.as_fd(),
        &Request::Hello {
            version: control::VERSION,
        },
    );
    let (key, writeback) = match hello {
        Ok((
            Response::Hello {
                version: control::VERSION,
                key,
                writeback_cache,
            },
            _,
        )) => (key, writeback_cache),
        other => {
            sys::log(format_args!(
                "the inherited control connection is not usable ({other:?}); connecting afresh"
            ));
            drop_inherited(i);
            return None;
        }
    };
    let daemon = peer_pid(i.sock.as_fd());
    let table = i.table;
    if let Some(t) = &table {
        // Attached (and duplicated) by keep_table, then closed.
        crate::table::release_shim_fd(t.as_raw_fd());
    }
    Some((
        Conn {
            sock: Some(i.sock),
            ino: i.ino,
            pid: sys::getpid(),
            key,
            daemon,
        },
        writeback,
        table,
    ))
}

/// The pid of the daemon at the other end of a control connection (0 if
/// unknown); only compared with itself, to notice a replaced daemon.
fn peer_pid(sock: BorrowedFd<'_>) -> u32 {
    rustix::net::sockopt::socket_peercred(sock)
        .map(|c| c.pid.as_raw_nonzero().get() as u32)
        .unwrap_or(0)
}

/// Describes this process's live control connections (and generation
/// tables) for the next image, clearing their `FD_CLOEXEC` (see
/// [`CONNS_ENV`]); the numbers are returned so that a failed `exec` can set
/// it again.
pub fn export_connections() -> (String, Vec<RawFd>) {
    let pid = sys::getpid();
    let mut parts = Vec::new();
    let mut handed = Vec::new();
    for m in loaded() {
        let conn = m.conn.lock();
        let Some(c) = conn.as_ref().filter(|c| c.pid == pid) else {
            continue;
        };
        let Some(sock) = c.live() else {
            continue;
        };
        if sys::set_cloexec(sock.as_raw_fd(), false).is_err() {
            continue;
        }
        handed.push(sock.as_raw_fd());
        let table = m
            .generations
            .lock()
            .as_ref()
            .and_then(|t| t.fd.as_ref().map(|f| f.as_raw_fd()))
            .filter(|&f| sys::set_cloexec(f, false).is_ok())
            .inspect(|&f| handed.push(f))
            .unwrap_or(-1);
        parts.push(format!("{},{},{},{table}", m.dev, sock.as_raw_fd(), c.ino));
    }
    // Connections this image inherited and never needed go on as they came.
    for i in INHERITED.lock().iter() {
        if i.pid != pid || !i.still_ours() {
            continue;
        }
        let sock = i.sock.as_raw_fd();
        if sys::set_cloexec(sock, false).is_err() {
            continue;
        }
        handed.push(sock);
        let table = i
            .table
            .as_ref()
            .map(|t| t.as_raw_fd())
            .filter(|&f| sys::set_cloexec(f, false).is_ok())
            .inspect(|&f| handed.push(f))
            .unwrap_or(-1);
        parts.push(format!("{},{sock},{},{table}", i.dev, i.ino));
    }
    (parts.join(";"), handed)
}

/// The attached mounts if they were looked up already, else none (for
/// `fork` handlers, which must not start reading files).
pub fn loaded() -> &'static [Mount] {
    MOUNTS.get().map(Vec::as_slice).unwrap_or(&[])
}
