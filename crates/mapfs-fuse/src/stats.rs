//! The daemon's request counters: per FUSE request type the count, the
//! errors and a latency histogram, plus byte and event counters, read over
//! the control socket ([`mapfs::control::Request::Stats`], `mapfs stats`).
//!
//! # Cost
//!
//! Always on, so it must cost next to nothing: a request costs two reads of
//! the monotonic clock (vDSO, no system call), a thread-local write when it
//! fails, and two relaxed atomic adds (its latency bucket and its total
//! time; the count is the sum of the buckets), plus one more for the
//! errors of a failed one. No lock and no allocation: the histogram is a
//! fixed array of atomic buckets ([`mapfs::stats::bucket_of`]), which a
//! reader copies without stopping the writers. A snapshot taken while
//! requests finish may see one's bucket and not yet its time; the drift is
//! one request.
//!
//! `MAPFS_STATS=off` in the daemon's environment turns counting off (no
//! clock reads, no atomics; `stats` then shows nothing), only so that a
//! benchmark can measure what counting costs.
//!
//! # Tracing
//!
//! `mapfs trace` subscribes a control connection ([`Tracer`]); while none
//! is subscribed, a request pays one relaxed atomic load for it. While one
//! is, each finished request is copied into every matching subscriber's
//! bounded queue under a lock; a subscriber that does not read in time
//! loses the newest events and is told how many.
//!
//! # Errors
//!
//! A callback replies with an error through [`failed`] (the adapter's
//! `errno` helper calls it), which notes the errno in a thread-local that
//! the request's [`Timer`] reads when it is dropped at the end of the
//! callback: the fuser reply types offer no hook of their own.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

use mapfs::stats::{bucket_of, KernelConnection, MountStats, OpStats, BUCKETS};

macro_rules! ops {
    ($($op:ident = $name:literal),* $(,)?) => {
        /// The FUSE request types the adapter serves.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Op {
            $(
                #[doc = concat!("`FUSE_", $name, "`")]
                $op,
            )*
        }

        /// The kernel's names of [`Op`]s, by index.
        pub const OP_NAMES: &[&str] = &[$($name),*];

        /// Every [`Op`], by index.
        const ALL_OPS: &[Op] = &[$(Op::$op),*];
    };
}

ops! {
    Lookup = "LOOKUP",
    Forget = "FORGET",
    Getattr = "GETATTR",
    Setattr = "SETATTR",
    Readlink = "READLINK",
    Mknod = "MKNOD",
    Mkdir = "MKDIR",
    Unlink = "UNLINK",
    Rmdir = "RMDIR",
    Symlink = "SYMLINK",
    Rename = "RENAME",
    Link = "LINK",
    Open = "OPEN",
    Read = "READ",
    Write = "WRITE",
    Flush = "FLUSH",
    Release = "RELEASE",
    Fsync = "FSYNC",
    Opendir = "OPENDIR",
    Readdir = "READDIR",
    Readdirplus = "READDIRPLUS",
    Releasedir = "RELEASEDIR",
    Fsyncdir = "FSYNCDIR",
    Statfs = "STATFS",
    Setxattr = "SETXATTR",
    Getxattr = "GETXATTR",
    Listxattr = "LISTXATTR",
    Removexattr = "REMOVEXATTR",
    Access = "ACCESS",
    Create = "CREATE",
    Fallocate = "FALLOCATE",
    Lseek = "LSEEK",
    Ioctl = "IOCTL",
    CopyFileRange = "COPY_FILE_RANGE",
}

thread_local! {
    /// The errno the current request was answered with (0: success).
    static REPLY_ERRNO: Cell<i32> = const { Cell::new(0) };
}

/// Notes that the current request is answered with `errno`; returns it.
#[inline]
pub fn failed(errno: i32) -> i32 {
    REPLY_ERRNO.with(|c| c.set(errno));
    errno
}

/// Counters of one request type.
struct OpCounters {
    total_ns: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpCounters {
    fn new() -> Self {
        OpCounters {
            total_ns: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Byte and event counters outside the per-request ones.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// Bytes the daemon engine read for a READ.
    DaemonReadBytes,
    /// Bytes the daemon engine wrote for a WRITE or copy_file_range.
    DaemonWriteBytes,
    /// An open answered with a passthrough backing id.
    PassthroughOpen,
    /// An open whose data the daemon executes.
    DaemonOpen,
    /// An open handed to a shim client.
    Adoption,
    /// An open lent to a shim client's engine.
    Lending,
    /// An open answered with a copy of the file's bytes.
    Copy,
    /// A cache invalidation sent to the kernel.
    Invalidation,
    /// A map-cache token bump.
    TokenBump,
}

const EVENTS: usize = 9;

/// Every counter of one mount.
pub struct Counters {
    ops: Vec<OpCounters>,
    events: [AtomicU64; EVENTS],
    origin: Instant,
    /// Nanoseconds after `origin` of the last reset.
    reset_at: AtomicU64,
    /// Where the mount is, to find its FUSE connection in sysfs.
    mountpoint: OnceLock<PathBuf>,
    /// `mapfs trace` subscribers.
    pub tracer: Tracer,
    /// Counting is on (see the module docs); fixed at start.
    enabled: bool,
    /// The session's requests per transport.
    transport: OnceLock<Arc<fuser::TransportCounters>>,
}

/// The environment variable that turns counting off (`off`).
pub const STATS_ENV: &str = "MAPFS_STATS";

impl Default for Counters {
    fn default() -> Self {
        Counters {
            ops: (0..OP_NAMES.len()).map(|_| OpCounters::new()).collect(),
            events: std::array::from_fn(|_| AtomicU64::new(0)),
            origin: Instant::now(),
            reset_at: AtomicU64::new(0),
            mountpoint: OnceLock::new(),
            tracer: Tracer::default(),
            enabled: true,
            transport: OnceLock::new(),
        }
    }
}

/// Times one request from its dispatch to the end of its callback, and
/// counts it there (see the module docs).
pub struct Timer<'a> {
    counters: &'a Counters,
    op: Op,
    pid: u32,
    nodeid: u64,
    /// `None` when counting is off.
    start: Option<Instant>,
    /// The path a name operation is about, kept only while someone traces.
    target: Option<Box<[u8]>>,
}

impl Drop for Timer<'_> {
    #[inline]
    fn drop(&mut self) {
        let Some(start) = self.start else {
            return;
        };
        let ns = start.elapsed().as_nanos() as u64;
        let errno = REPLY_ERRNO.with(|c| c.replace(0));
        let c = &self.counters.ops[self.op as usize];
        c.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        c.total_ns.fetch_add(ns, Ordering::Relaxed);
        if errno != 0 {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        let tracer = &self.counters.tracer;
        if tracer.on.load(Ordering::Relaxed) {
            tracer.push(Traced {
                at_ns: self.counters.origin.elapsed().as_nanos() as u64,
                at_unix_ns: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
                target: self.target.take(),
                op: self.op,
                nodeid: self.nodeid,
                pid: self.pid,
                latency_ns: ns,
                errno,
            });
        }
    }
}

impl Timer<'_> {
    /// Records the path a name operation (LOOKUP, CREATE, RENAME...) is
    /// about, for `mapfs trace`: `make` runs only while someone traces, and
    /// at request time, while the path is still known.
    #[inline]
    pub fn target_with(mut self, make: impl FnOnce() -> Vec<u8>) -> Self {
        if self.start.is_some() && self.counters.tracer.on.load(Ordering::Relaxed) {
            self.target = Some(make().into());
        }
        self
    }
}

impl Counters {
    /// Starts timing a request of type `op` from process `pid` about FUSE
    /// node `nodeid`; it is counted when the timer is dropped.
    #[inline]
    pub fn timer(&self, op: Op, pid: u32, nodeid: u64) -> Timer<'_> {
        // A callback that replied without a timer (none should) must not
        // make this one count as failed.
        REPLY_ERRNO.with(|c| c.set(0));
        Timer {
            counters: self,
            op,
            pid,
            nodeid,
            start: self.enabled.then(Instant::now),
            target: None,
        }
    }

    /// Counters that count nothing when the daemon's environment has
    /// [`STATS_ENV`]`=off`.
    pub fn from_env() -> Self {
        Counters {
            enabled: std::env::var_os(STATS_ENV).is_none_or(|v| v != "off"),
            ..Counters::default()
        }
    }

    /// Counters that count nothing (what [`STATS_ENV`]`=off` gives).
    pub fn disabled() -> Self {
        Counters {
            enabled: false,
            ..Counters::default()
        }
    }

    /// Counts `n` of `event`.
    #[inline]
    pub fn add(&self, event: Event, n: u64) {
        self.events[event as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Names the mount's mountpoint (for the kernel's view, see
    /// [`KernelConnection`]).
    pub fn set_mountpoint(&self, p: &Path) {
        let _ = self.mountpoint.set(p.to_path_buf());
    }

    /// The session's counters of requests per transport.
    pub fn set_transport(&self, t: Arc<fuser::TransportCounters>) {
        let _ = self.transport.set(t);
    }

    /// The counters now; with `reset`, they start again from zero after
    /// being read.
    pub fn snapshot(&self, reset: bool) -> MountStats {
        let take = |a: &AtomicU64| {
            if reset {
                a.swap(0, Ordering::Relaxed)
            } else {
                a.load(Ordering::Relaxed)
            }
        };
        let now = self.origin.elapsed().as_nanos() as u64;
        let since = if reset {
            self.reset_at.swap(now, Ordering::Relaxed)
        } else {
            self.reset_at.load(Ordering::Relaxed)
        };
        let mut ops = Vec::new();
        for (i, c) in self.ops.iter().enumerate() {
            let mut buckets = Vec::new();
            let mut count = 0;
            for (b, a) in c.buckets.iter().enumerate() {
                let n = take(a);
                if n > 0 {
                    buckets.push((b as u16, n));
                    count += n;
                }
            }
            let errors = take(&c.errors);
            let total_ns = take(&c.total_ns);
            if count > 0 {
                ops.push(OpStats {
                    op: OP_NAMES[i].to_string(),
                    count,
                    errors,
                    total_ns,
                    buckets,
                });
            }
        }
        let e = |ev: Event| take(&self.events[ev as usize]);
        MountStats {
            elapsed_ns: now.saturating_sub(since),
            ops,
            daemon_read_bytes: e(Event::DaemonReadBytes),
            daemon_write_bytes: e(Event::DaemonWriteBytes),
            passthrough_opens: e(Event::PassthroughOpen),
            daemon_opens: e(Event::DaemonOpen),
            adoptions: e(Event::Adoption),
            lendings: e(Event::Lending),
            copies: e(Event::Copy),
            invalidations: e(Event::Invalidation),
            token_bumps: e(Event::TokenBump),
            kernel: self.mountpoint.get().and_then(|m| kernel_connection(m)),
            transport: match self.transport.get() {
                Some(t) if t.uring_active.load(Ordering::Acquire) => "uring".into(),
                Some(_) => "dev".into(),
                None => String::new(),
            },
            uring_requests: self.transport.get().map_or(0, |t| take(&t.uring)),
            dev_requests: self.transport.get().map_or(0, |t| take(&t.dev)),
        }
    }
}

/// A finished request, as queued for `mapfs trace`.
#[derive(Debug, Clone)]
pub struct Traced {
    /// When it finished, ns since the counters were made.
    pub at_ns: u64,
    /// When it finished, ns since the Unix epoch (wall clock).
    pub at_unix_ns: u64,
    /// The path a name operation was about (LOOKUP, CREATE, MKDIR...);
    /// `OLD -> NEW` for RENAME and LINK.
    pub target: Option<Box<[u8]>>,
    /// Its type.
    pub op: Op,
    /// The node it was about.
    pub nodeid: u64,
    /// The calling process.
    pub pid: u32,
    /// Time in the daemon.
    pub latency_ns: u64,
    /// 0 or the errno of the reply.
    pub errno: i32,
}

/// Events a subscriber may have waiting; more are dropped and counted.
pub const TRACE_QUEUE: usize = 16 * 1024;

struct Subscriber {
    op: Option<Op>,
    pid: Option<u32>,
    queue: VecDeque<Traced>,
    dropped: u64,
}

/// The `mapfs trace` subscribers of a mount, by control connection.
#[derive(Default)]
pub struct Tracer {
    /// Some subscriber exists (the only thing a request reads when none).
    on: AtomicBool,
    subs: Mutex<HashMap<u64, Subscriber>>,
}

impl Tracer {
    fn push(&self, ev: Traced) {
        for sub in self.subs.lock().values_mut() {
            if sub.op.is_some_and(|op| op != ev.op) || sub.pid.is_some_and(|p| p != ev.pid) {
                continue;
            }
            if sub.queue.len() >= TRACE_QUEUE {
                sub.dropped += 1;
            } else {
                sub.queue.push_back(ev.clone());
            }
        }
    }

    /// Subscribes connection `id` (or changes its filter), keeping what it
    /// has queued. `op` must be a name of [`OP_NAMES`] (else false is
    /// returned and nothing changes).
    pub fn subscribe(&self, id: u64, op: Option<&str>, pid: Option<u32>) -> bool {
        let op = match op {
            None => None,
            Some(name) => match OP_NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                Some(i) => Some(ALL_OPS[i]),
                None => return false,
            },
        };
        let mut subs = self.subs.lock();
        let sub = subs.entry(id).or_insert_with(|| Subscriber {
            op,
            pid,
            queue: VecDeque::new(),
            dropped: 0,
        });
        sub.op = op;
        sub.pid = pid;
        self.on.store(true, Ordering::Relaxed);
        true
    }

    /// Takes up to `max` queued events of `id`, and the number dropped
    /// since the last take.
    pub fn take(&self, id: u64, max: usize) -> (Vec<Traced>, u64) {
        let mut subs = self.subs.lock();
        match subs.get_mut(&id) {
            Some(sub) => {
                let n = sub.queue.len().min(max);
                (
                    sub.queue.drain(..n).collect(),
                    std::mem::take(&mut sub.dropped),
                )
            }
            None => (Vec::new(), 0),
        }
    }

    /// Ends the subscription of connection `id`, if any.
    pub fn unsubscribe(&self, id: u64) {
        let mut subs = self.subs.lock();
        if subs.remove(&id).is_some() && subs.is_empty() {
            self.on.store(false, Ordering::Relaxed);
        }
    }
}

/// The kernel's view of the FUSE connection mounted at `mountpoint`: the
/// connection is named by the mount's minor device number, found in
/// `/proc/self/mountinfo` (a `stat` of the mountpoint would be a request to
/// this very daemon). `None` without the `fusectl` file system or as a user
/// other than root (its files are 0400 or 0600, root's).
fn kernel_connection(mountpoint: &Path) -> Option<KernelConnection> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_str()?;
    // The last matching line is the mount on top.
    let id = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let _root = f.next()?;
            let at = f.next()?;
            let fstype = l.split(" - ").nth(1)?.split(' ').next()?;
            (fstype.starts_with("fuse") && mapfs::control::unescape_mountinfo(at) == want)
                .then(|| dev.split(':').nth(1)?.parse::<u32>().ok())?
        })
        .next_back()?;
    let dir = Path::new("/sys/fs/fuse/connections").join(id.to_string());
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(KernelConnection {
        id,
        waiting: read("waiting")?,
        max_background: read("max_background")?,
        congestion_threshold: read("congestion_threshold")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_count_requests_errors_and_reset() {
        let c = Counters::default();
        for _ in 0..3 {
            let _t = c.timer(Op::Create, 1, 1);
        }
        {
            let _t = c.timer(Op::Lookup, 1, 1);
            failed(libc::ENOENT);
        }
        c.add(Event::DaemonReadBytes, 4096);
        let s = c.snapshot(true);
        let create = s.op("CREATE").unwrap();
        assert_eq!((create.count, create.errors), (3, 0));
        assert_eq!(s.op("LOOKUP").map(|o| (o.count, o.errors)), Some((1, 1)));
        assert_eq!(s.daemon_read_bytes, 4096);
        assert_eq!(s.requests(), 4);
        let after = c.snapshot(false);
        assert_eq!((after.requests(), after.daemon_read_bytes), (0, 0));
    }

    #[test]
    fn tracing_filters_bounds_and_stops() {
        let c = Counters::default();
        assert!(!c.tracer.subscribe(7, Some("nosuchop"), None));
        assert!(c.tracer.subscribe(7, Some("getattr"), Some(42)));
        drop(c.timer(Op::Getattr, 42, 5));
        drop(c.timer(Op::Getattr, 43, 5));
        drop(c.timer(Op::Lookup, 42, 5));
        let (evs, dropped) = c.tracer.take(7, 100);
        assert_eq!(dropped, 0);
        assert_eq!(evs.len(), 1);
        assert_eq!((evs[0].op, evs[0].pid, evs[0].nodeid), (Op::Getattr, 42, 5));
        for _ in 0..TRACE_QUEUE + 3 {
            drop(c.timer(Op::Getattr, 42, 5));
        }
        let (evs, dropped) = c.tracer.take(7, usize::MAX);
        assert_eq!((evs.len(), dropped), (TRACE_QUEUE, 3));
        c.tracer.unsubscribe(7);
        assert!(!c.tracer.on.load(Ordering::Relaxed));
        drop(c.timer(Op::Getattr, 42, 5));
        assert!(c.tracer.take(7, 10).0.is_empty());
    }

    #[test]
    fn op_names_match_the_enum() {
        assert_eq!(OP_NAMES[Op::CopyFileRange as usize], "COPY_FILE_RANGE");
        assert_eq!(OP_NAMES[Op::Lookup as usize], "LOOKUP");
    }
}
