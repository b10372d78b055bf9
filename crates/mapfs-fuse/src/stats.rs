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
//! # Errors
//!
//! A callback replies with an error through [`failed`] (the adapter's
//! `errno` helper calls it), which notes the errno in a thread-local that
//! the request's [`Timer`] reads when it is dropped at the end of the
//! callback: the fuser reply types offer no hook of their own.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

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
    /// A cache invalidation sent to the kernel.
    Invalidation,
    /// A map-cache token bump.
    TokenBump,
}

const EVENTS: usize = 8;

/// Every counter of one mount.
pub struct Counters {
    ops: Vec<OpCounters>,
    events: [AtomicU64; EVENTS],
    origin: Instant,
    /// Nanoseconds after `origin` of the last reset.
    reset_at: AtomicU64,
    /// Where the mount is, to find its FUSE connection in sysfs.
    mountpoint: OnceLock<PathBuf>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            ops: (0..OP_NAMES.len()).map(|_| OpCounters::new()).collect(),
            events: std::array::from_fn(|_| AtomicU64::new(0)),
            origin: Instant::now(),
            reset_at: AtomicU64::new(0),
            mountpoint: OnceLock::new(),
        }
    }
}

/// Times one request from its dispatch to the end of its callback, and
/// counts it there (see the module docs).
pub struct Timer<'a> {
    counters: &'a Counters,
    op: Op,
    start: Instant,
}

impl Drop for Timer<'_> {
    #[inline]
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        let errno = REPLY_ERRNO.with(|c| c.replace(0));
        let c = &self.counters.ops[self.op as usize];
        c.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        c.total_ns.fetch_add(ns, Ordering::Relaxed);
        if errno != 0 {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Counters {
    /// Starts timing a request of type `op`; it is counted when the timer
    /// is dropped.
    #[inline]
    pub fn timer(&self, op: Op) -> Timer<'_> {
        // A callback that replied without a timer (none should) must not
        // make this one count as failed.
        REPLY_ERRNO.with(|c| c.set(0));
        Timer {
            counters: self,
            op,
            start: Instant::now(),
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
            invalidations: e(Event::Invalidation),
            token_bumps: e(Event::TokenBump),
            kernel: self.mountpoint.get().and_then(|m| kernel_connection(m)),
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
            let _t = c.timer(Op::Create);
        }
        {
            let _t = c.timer(Op::Lookup);
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
    fn op_names_match_the_enum() {
        assert_eq!(OP_NAMES[Op::CopyFileRange as usize], "COPY_FILE_RANGE");
        assert_eq!(OP_NAMES[Op::Lookup as usize], "LOOKUP");
    }
}
