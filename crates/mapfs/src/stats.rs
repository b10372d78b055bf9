//! What a mount's daemon counts about the requests it serves, as sent over
//! the control socket ([`crate::control::Request::Stats`]), and the latency
//! buckets both sides agree on.
//!
//! # Latency buckets
//!
//! Latencies are counted in fixed log-linear buckets of nanoseconds: exact
//! below 8 ns, then 8 buckets per power of two, so every bucket is at most
//! 12.5% wide and a percentile read from it is within that of the truth.
//! Fixed buckets let the daemon count with one relaxed atomic add per
//! request into an array (no lock, no allocation), and let a reader
//! subtract two snapshots to get the latencies of an interval (`mapfs stats
//! --watch`), which an HdrHistogram behind a lock would also allow but at
//! the price of a lock per request.
//!
//! # What a client learns
//!
//! Only counts, byte totals and latency distributions per request type:
//! no path, inode, pid or user. They are the mount's activity as a whole,
//! which `/proc/self/mountstats`-like tools show for other file systems.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two (a power of two itself).
const SUB: u64 = 8;
/// log2 of [`SUB`].
const SUB_BITS: u32 = 3;
/// Largest power of two with buckets of its own: 2^40 ns is about 18
/// minutes; slower requests are counted in the last bucket.
const MAX_EXP: u32 = 40;

/// Number of latency buckets.
pub const BUCKETS: usize = (SUB + (MAX_EXP - SUB_BITS + 1) as u64 * SUB) as usize;

/// The bucket that counts a latency of `ns` nanoseconds.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros();
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (ns >> (exp - SUB_BITS)) - SUB;
    (SUB + (exp - SUB_BITS) as u64 * SUB + sub) as usize
}

/// The smallest latency (ns) counted in bucket `i`.
pub fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let exp = (i - SUB) / SUB + SUB_BITS as u64;
    let sub = (i - SUB) % SUB;
    (SUB + sub) << (exp - SUB_BITS as u64)
}

/// The largest latency (ns) counted in bucket `i` (the last bucket also
/// counts everything slower).
pub fn bucket_high(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        return u64::MAX;
    }
    bucket_low(i + 1) - 1
}

/// Counters of one FUSE request type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    /// The FUSE opcode's name (`LOOKUP`, `GETATTR`, ...).
    pub op: String,
    /// Requests answered.
    pub count: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Nanoseconds spent in the daemon on them, from the dispatch of the
    /// request to the return of its handler (the reply is sent inside).
    pub total_ns: u64,
    /// Latency histogram: `(bucket, count)` for the non-empty buckets
    /// (see [`bucket_of`]).
    pub buckets: Vec<(u16, u64)>,
}

impl OpStats {
    /// The latency (ns, the upper edge of its bucket) under which a share
    /// `q` (0..=1) of the requests finished; 0 without requests.
    pub fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().map(|&(_, n)| n).sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for &(b, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return bucket_high(b as usize).min(1 << (MAX_EXP + 1));
            }
        }
        0
    }

    /// What happened between `earlier` (a snapshot of the same type) and
    /// `self` (a later one); a reset in between gives `self` unchanged.
    pub fn since(&self, earlier: &OpStats) -> OpStats {
        if self.count < earlier.count || self.total_ns < earlier.total_ns {
            return self.clone();
        }
        let mut buckets = Vec::new();
        for &(b, n) in &self.buckets {
            let before = earlier
                .buckets
                .iter()
                .find(|&&(e, _)| e == b)
                .map_or(0, |&(_, m)| m);
            if n > before {
                buckets.push((b, n - before));
            }
        }
        OpStats {
            op: self.op.clone(),
            count: self.count - earlier.count,
            errors: self.errors.saturating_sub(earlier.errors),
            total_ns: self.total_ns - earlier.total_ns,
            buckets,
        }
    }
}

/// The kernel's view of the mount's FUSE connection, from
/// `/sys/fs/fuse/connections/N/` (readable by root only, so present when the
/// daemon runs as root and the `fusectl` file system is mounted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelConnection {
    /// `N`: the minor device number of the mount.
    pub id: u32,
    /// Requests the kernel has queued for the daemon or sent and not yet
    /// had answered.
    pub waiting: u64,
    /// Background requests (readahead, writeback, async reads) the kernel
    /// lets be outstanding at once.
    pub max_background: u64,
    /// Outstanding background requests at which the kernel marks the
    /// connection congested.
    pub congestion_threshold: u64,
}

/// Everything a daemon counts, since it started or since the last reset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountStats {
    /// Nanoseconds covered by the counters (since start or last reset).
    pub elapsed_ns: u64,
    /// Per FUSE request type, those seen at least once.
    pub ops: Vec<OpStats>,
    /// Bytes the daemon's data engine read for READ requests.
    pub daemon_read_bytes: u64,
    /// Bytes the daemon's data engine wrote for WRITE requests (and
    /// `copy_file_range` into the mount).
    pub daemon_write_bytes: u64,
    /// Opens and creates answered with a kernel-passthrough backing file
    /// (their reads and writes never reach the daemon).
    pub passthrough_opens: u64,
    /// Opens and creates whose data the daemon executes.
    pub daemon_opens: u64,
    /// Opens handed to preload-shim clients (whole-file adoptions and
    /// lendings).
    pub adoptions: u64,
    /// Of those, lendings (the client runs the map in its own engine).
    pub lendings: u64,
    /// Of those, copies (the client reads a copy of the file's bytes; see
    /// [`crate::control::Response::Copied`]).
    pub copies: u64,
    /// Cache invalidations the daemon sent to the kernel.
    pub invalidations: u64,
    /// Map-cache token bumps (each makes shim clients re-ask for a map).
    pub token_bumps: u64,
    /// The kernel's view of the connection, when the daemon can read it.
    pub kernel: Option<KernelConnection>,
    /// How requests reach the daemon now: `uring` (FUSE over io_uring) or
    /// `dev` (`/dev/fuse`); empty for a registry that counts nothing.
    pub transport: String,
    /// Requests taken from the io_uring queues.
    pub uring_requests: u64,
    /// Requests read from `/dev/fuse` (with io_uring: those sent before the
    /// ring was ready, `FORGET`s and `INTERRUPT`s).
    pub dev_requests: u64,
}

impl MountStats {
    /// Requests of every type.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.count).sum()
    }

    /// The counters of request type `op`, if any was seen.
    pub fn op(&self, op: &str) -> Option<&OpStats> {
        self.ops.iter().find(|o| o.op == op)
    }

    /// What happened between `earlier` and `self` (a reset in between gives
    /// `self`); the kernel's view is `self`'s (it is a gauge).
    pub fn since(&self, earlier: &MountStats) -> MountStats {
        if self.elapsed_ns < earlier.elapsed_ns {
            return self.clone();
        }
        let d = |a: u64, b: u64| a.saturating_sub(b);
        MountStats {
            elapsed_ns: self.elapsed_ns - earlier.elapsed_ns,
            ops: self
                .ops
                .iter()
                .map(|o| match earlier.op(&o.op) {
                    Some(e) => o.since(e),
                    None => o.clone(),
                })
                .collect(),
            daemon_read_bytes: d(self.daemon_read_bytes, earlier.daemon_read_bytes),
            daemon_write_bytes: d(self.daemon_write_bytes, earlier.daemon_write_bytes),
            passthrough_opens: d(self.passthrough_opens, earlier.passthrough_opens),
            daemon_opens: d(self.daemon_opens, earlier.daemon_opens),
            adoptions: d(self.adoptions, earlier.adoptions),
            lendings: d(self.lendings, earlier.lendings),
            copies: d(self.copies, earlier.copies),
            invalidations: d(self.invalidations, earlier.invalidations),
            token_bumps: d(self.token_bumps, earlier.token_bumps),
            kernel: self.kernel.clone(),
            transport: self.transport.clone(),
            uring_requests: d(self.uring_requests, earlier.uring_requests),
            dev_requests: d(self.dev_requests, earlier.dev_requests),
        }
    }
}

/// One request as `mapfs trace` shows it ([`crate::control::Request::Trace`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// When it finished, in nanoseconds since the daemon started.
    pub at_ns: u64,
    /// When it finished, in nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// The FUSE opcode's name.
    pub op: String,
    /// The FUSE node it was about (the parent directory for name
    /// operations; 1 is the root).
    pub nodeid: u64,
    /// That node's path in the mount when the daemon sent the event, if it
    /// still has one.
    pub path: Option<String>,
    /// For name operations (LOOKUP, CREATE, MKDIR, UNLINK...), the path
    /// they named, taken when the request ran; `OLD -> NEW` for RENAME
    /// and LINK.
    pub target: Option<String>,
    /// The calling process (0 for requests the kernel makes itself, such
    /// as writeback and release).
    pub pid: u32,
    /// Time in the daemon (ns).
    pub latency_ns: u64,
    /// 0, or the errno it was answered with.
    pub errno: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_every_latency() {
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_high(i) + 1, bucket_low(i + 1), "bucket {i}");
            assert_eq!(bucket_of(bucket_low(i)), i);
            assert_eq!(bucket_of(bucket_high(i)), i);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for ns in [0u64, 7, 8, 9, 15, 16, 1000, 123_456, 1 << 39, (1 << 40) - 1] {
            let b = bucket_of(ns);
            assert!(bucket_low(b) <= ns && ns <= bucket_high(b), "{ns}");
            // At most 12.5% wide.
            assert!(bucket_high(b) - bucket_low(b) <= bucket_low(b) / 8, "{ns}");
        }
    }

    #[test]
    fn percentiles_and_intervals() {
        let mut o = OpStats {
            op: "GETATTR".into(),
            ..Default::default()
        };
        // 99 requests of 1 µs, one of 1 ms.
        o.buckets = vec![
            (bucket_of(1000) as u16, 99),
            (bucket_of(1_000_000) as u16, 1),
        ];
        o.count = 100;
        o.total_ns = 99 * 1000 + 1_000_000;
        let p50 = o.percentile(0.5);
        assert!((1000..=1125).contains(&p50), "{p50}");
        assert!(o.percentile(0.99) < 1200);
        assert!(o.percentile(1.0) >= 1_000_000);
        let later = OpStats {
            count: 101,
            total_ns: o.total_ns + 1000,
            buckets: vec![
                (bucket_of(1000) as u16, 100),
                (bucket_of(1_000_000) as u16, 1),
            ],
            ..o.clone()
        };
        let d = later.since(&o);
        assert_eq!((d.count, d.total_ns), (1, 1000));
        assert_eq!(d.buckets, vec![(bucket_of(1000) as u16, 1)]);
    }
}
