//! `stats`: where a mount's time goes, from its daemon's counters
//! ([`mapfs::control::Request::Stats`], [`mapfs::stats`]).
//!
//! The daemon counts since it started (or since the last `--reset`); the
//! table shows those totals, and `--watch SECS` shows each interval's
//! difference, like `iostat`. Latency is the daemon's time per request,
//! from dispatch to the return of its handler (the reply is sent inside);
//! the time a request waits in the kernel's queue is not in it (the
//! kernel's `waiting` count shows that queue).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mapfs::stats::{MountStats, OpStats};
use serde::Serialize;

/// Arguments of `stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The mount.
    pub mountpoint: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the Prometheus text exposition format.
    #[arg(long)]
    pub prometheus: bool,
    /// Print every SECS seconds what happened in the interval (Ctrl-C stops).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub watch: Option<u32>,
    /// Start counting again from zero after printing (the mount's owner or
    /// root only).
    #[arg(long, conflicts_with = "watch")]
    pub reset: bool,
}

/// One request type as `--json` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    /// FUSE opcode name.
    pub op: String,
    /// Requests.
    pub count: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests per second over the period.
    pub ops_per_sec: f64,
    /// Median latency in the daemon (ns, bucket upper edge).
    pub p50_ns: u64,
    /// 99th percentile latency (ns, bucket upper edge).
    pub p99_ns: u64,
    /// Mean latency (ns).
    pub mean_ns: u64,
    /// Total time in the daemon (ns).
    pub total_ns: u64,
    /// Share of the daemon's request time spent on this type (0..1).
    pub time_share: f64,
}

/// The JSON object of `stats --json`.
#[derive(Debug, Clone, Serialize)]
pub struct StatsReport {
    /// The mount.
    pub mountpoint: PathBuf,
    /// Seconds the counters cover.
    pub seconds: f64,
    /// Requests of every type.
    pub requests: u64,
    /// Per request type, most time first.
    pub ops: Vec<OpReport>,
    /// Everything the daemon sent, including the latency buckets.
    pub raw: MountStats,
}

/// The report of `stats` over `s`.
pub fn report(mountpoint: &Path, s: &MountStats) -> StatsReport {
    let secs = s.elapsed_ns as f64 / 1e9;
    let busy: u64 = s.ops.iter().map(|o| o.total_ns).sum();
    let mut ops: Vec<OpReport> = s
        .ops
        .iter()
        .filter(|o| o.count > 0)
        .map(|o| OpReport {
            op: o.op.clone(),
            count: o.count,
            errors: o.errors,
            ops_per_sec: if secs > 0.0 {
                o.count as f64 / secs
            } else {
                0.0
            },
            p50_ns: o.percentile(0.5),
            p99_ns: o.percentile(0.99),
            mean_ns: o.total_ns / o.count.max(1),
            total_ns: o.total_ns,
            time_share: if busy > 0 {
                o.total_ns as f64 / busy as f64
            } else {
                0.0
            },
        })
        .collect();
    ops.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.op.cmp(&b.op)));
    StatsReport {
        mountpoint: mountpoint.to_path_buf(),
        seconds: secs,
        requests: s.requests(),
        ops,
        raw: s.clone(),
    }
}

/// `1.2µs`, `340µs`, `12.0ms`, `1.50s`.
fn duration(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e4 {
        format!("{:.1}µs", ns / 1e3)
    } else if ns < 1e6 {
        format!("{:.0}µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// The human table.
pub fn table(r: &StatsReport, interval: bool) -> String {
    let s = &r.raw;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} requests in {:.1} s{}",
        r.mountpoint.display(),
        r.requests,
        r.seconds,
        if interval { " (interval)" } else { "" }
    );
    if !r.ops.is_empty() {
        let _ = writeln!(
            out,
            "{:<16}{:>10}{:>11}{:>8}{:>9}{:>9}{:>9}{:>7}",
            "OP", "COUNT", "OPS/S", "ERRORS", "P50", "P99", "MEAN", "TIME%"
        );
        for o in &r.ops {
            let _ = writeln!(
                out,
                "{:<16}{:>10}{:>11.1}{:>8}{:>9}{:>9}{:>9}{:>6.1}%",
                o.op,
                o.count,
                o.ops_per_sec,
                o.errors,
                duration(o.p50_ns),
                duration(o.p99_ns),
                duration(o.mean_ns),
                o.time_share * 100.0
            );
        }
    }
    let _ = writeln!(
        out,
        "daemon engine: read {}, written {}",
        mapfs::size::human(s.daemon_read_bytes),
        mapfs::size::human(s.daemon_write_bytes)
    );
    let _ = writeln!(
        out,
        "opens: {} kernel passthrough, {} daemon; shim adoptions: {} ({} lent, {} copied)",
        s.passthrough_opens, s.daemon_opens, s.adoptions, s.lendings, s.copies
    );
    let _ = writeln!(
        out,
        "kernel cache invalidations sent: {}; map-cache token bumps: {}",
        s.invalidations, s.token_bumps
    );
    if !s.transport.is_empty() {
        let _ = writeln!(
            out,
            "transport: {}; requests taken from io_uring {}, from /dev/fuse {}",
            if s.transport == "uring" {
                "io_uring"
            } else {
                "/dev/fuse"
            },
            s.uring_requests,
            s.dev_requests
        );
    }
    match &s.kernel {
        Some(k) => {
            let _ = writeln!(
                out,
                "kernel connection {}: waiting {}, max_background {}, congestion_threshold {}",
                k.id, k.waiting, k.max_background, k.congestion_threshold
            );
        }
        None => {
            let _ = writeln!(
                out,
                "kernel connection: not readable by the daemon (needs root and fusectl)"
            );
        }
    }
    out
}

/// Escapes a Prometheus label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Latency bucket bounds of the Prometheus histogram, in ns: powers of 4
/// from 1 µs (2^10 ns) to 17 s (2^34 ns). Powers of two are edges of the
/// daemon's buckets, so the cumulative counts are exact.
const PROM_BOUNDS_LOG2: std::ops::RangeInclusive<u32> = 10..=34;

/// Requests of `o` that took less than 2^`log2` ns.
fn below(o: &OpStats, log2: u32) -> u64 {
    o.buckets
        .iter()
        .filter(|&&(b, _)| mapfs::stats::bucket_high(b as usize) < (1u64 << log2))
        .map(|&(_, n)| n)
        .sum()
}

/// The Prometheus text exposition format (version 0.0.4) of `s`.
pub fn prometheus(mountpoint: &Path, s: &MountStats) -> String {
    let mp = label(&mountpoint.display().to_string());
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{{mountpoint=\"{mp}\"{labels}}} {v}");
        }
    };
    let per_op = |f: &dyn Fn(&OpStats) -> u64| -> Vec<(String, u64)> {
        s.ops
            .iter()
            .map(|o| (format!(",op=\"{}\"", label(&o.op)), f(o)))
            .collect()
    };
    counter(
        "mapfs_request_errors_total",
        "FUSE requests the daemon answered with an error.",
        per_op(&|o| o.errors),
    );
    let one = |v: u64| vec![(String::new(), v)];
    counter(
        "mapfs_daemon_read_bytes_total",
        "Bytes the daemon's data engine read for READ requests.",
        one(s.daemon_read_bytes),
    );
    counter(
        "mapfs_daemon_written_bytes_total",
        "Bytes the daemon's data engine wrote.",
        one(s.daemon_write_bytes),
    );
    counter(
        "mapfs_opens_total",
        "Opens and creates, by data executor.",
        vec![
            (",executor=\"passthrough\"".into(), s.passthrough_opens),
            (",executor=\"daemon\"".into(), s.daemon_opens),
        ],
    );
    counter(
        "mapfs_shim_adoptions_total",
        "Opens handed to preload-shim clients.",
        one(s.adoptions),
    );
    counter(
        "mapfs_shim_lendings_total",
        "Opens lent to preload-shim clients' engines.",
        one(s.lendings),
    );
    counter(
        "mapfs_shim_copies_total",
        "Read-only opens answered with a copy of the file's bytes.",
        one(s.copies),
    );
    counter(
        "mapfs_kernel_invalidations_total",
        "Cache invalidations the daemon sent to the kernel.",
        one(s.invalidations),
    );
    counter(
        "mapfs_map_token_bumps_total",
        "Map-cache token bumps.",
        one(s.token_bumps),
    );
    counter(
        "mapfs_requests_by_transport_total",
        "FUSE requests, by the transport they came on.",
        vec![
            (",transport=\"uring\"".into(), s.uring_requests),
            (",transport=\"dev\"".into(), s.dev_requests),
        ],
    );
    let name = "mapfs_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time in the daemon per FUSE request, by opcode."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for o in &s.ops {
        let op = label(&o.op);
        for log2 in PROM_BOUNDS_LOG2.step_by(2) {
            let le = (1u64 << log2) as f64 / 1e9;
            let _ = writeln!(
                out,
                "{name}_bucket{{mountpoint=\"{mp}\",op=\"{op}\",le=\"{le:e}\"}} {}",
                below(o, log2)
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{mountpoint=\"{mp}\",op=\"{op}\",le=\"+Inf\"}} {}",
            o.count
        );
        let _ = writeln!(
            out,
            "{name}_sum{{mountpoint=\"{mp}\",op=\"{op}\"}} {:e}",
            o.total_ns as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "{name}_count{{mountpoint=\"{mp}\",op=\"{op}\"}} {}",
            o.count
        );
    }
    if let Some(k) = &s.kernel {
        for (g, help, v) in [
            (
                "mapfs_kernel_waiting_requests",
                "Requests the kernel has queued or sent to the daemon and not yet had answered.",
                k.waiting,
            ),
            (
                "mapfs_kernel_max_background",
                "Background requests the kernel lets be outstanding.",
                k.max_background,
            ),
            (
                "mapfs_kernel_congestion_threshold",
                "Outstanding background requests at which the connection counts as congested.",
                k.congestion_threshold,
            ),
        ] {
            let _ = writeln!(out, "# HELP {g} {help}");
            let _ = writeln!(out, "# TYPE {g} gauge");
            let _ = writeln!(out, "{g}{{mountpoint=\"{mp}\"}} {v}");
        }
    }
    out
}

/// Asks the daemon of `mountpoint` for its counters.
fn fetch(mountpoint: &Path, reset: bool) -> Result<MountStats> {
    let sock = mapfs::control::socket_path(mountpoint);
    mapfs::control::stats(&sock, reset).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => anyhow::anyhow!(
            "only the owner of {} or root may reset its counters",
            mountpoint.display()
        ),
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => anyhow::anyhow!(
            "{} is not a mapfs mount with a running daemon (no control socket at {})",
            mountpoint.display(),
            sock.display()
        ),
        Some(libc::EPROTO) => anyhow::anyhow!(
            "the daemon of {} speaks another protocol version (remount it with this mapfs)",
            mountpoint.display()
        ),
        _ => {
            anyhow::Error::new(e).context(format!("asking the daemon of {}", mountpoint.display()))
        }
    })
}

fn print(mountpoint: &Path, args: &StatsArgs, s: &MountStats, interval: bool) -> Result<()> {
    if args.json {
        println!("{}", serde_json::to_string(&report(mountpoint, s))?);
    } else if args.prometheus {
        print!("{}", prometheus(mountpoint, s));
    } else {
        print!("{}", table(&report(mountpoint, s), interval));
    }
    Ok(())
}

/// The mountpoint of a mapfs mount named by `path`, as the mount table
/// has it. A path that is already the mount table's is taken without
/// touching it: resolving it would send the mount's root a GETATTR, which
/// `stats` would then count.
pub fn mapfs_mountpoint(path: &Path) -> Result<PathBuf> {
    let table = crate::mounts::mount_table();
    let is_mapfs = |p: &Path| table.iter().any(|m| m.mountpoint == p && m.is_mapfs());
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if is_mapfs(&absolute) {
        return Ok(absolute);
    }
    let resolved = std::fs::canonicalize(path)
        .with_context(|| format!("no such mountpoint {}", path.display()))?;
    if !is_mapfs(&resolved) {
        bail!("{} is not a mapfs mount", resolved.display());
    }
    Ok(resolved)
}

/// `stats`.
pub fn stats(args: StatsArgs) -> Result<()> {
    let mountpoint = mapfs_mountpoint(&args.mountpoint)?;
    let mut last = fetch(&mountpoint, args.reset)?;
    print(&mountpoint, &args, &last, false)?;
    let Some(secs) = args.watch else {
        return Ok(());
    };
    loop {
        std::thread::sleep(Duration::from_secs(secs.into()));
        let now = fetch(&mountpoint, false)?;
        if !args.json && !args.prometheus {
            println!();
        }
        print(&mountpoint, &args, &now.since(&last), true)?;
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mapfs::stats::bucket_of;

    fn sample() -> MountStats {
        MountStats {
            elapsed_ns: 2_000_000_000,
            ops: vec![OpStats {
                op: "GETATTR".into(),
                count: 4,
                errors: 1,
                total_ns: 4_000 + 3 * 2_000_000,
                buckets: vec![
                    (bucket_of(4_000) as u16, 1),
                    (bucket_of(2_000_000) as u16, 3),
                ],
            }],
            daemon_read_bytes: 5 << 20,
            ..Default::default()
        }
    }

    #[test]
    fn table_shows_rates_percentiles_and_bytes() {
        let t = table(&report(Path::new("/mnt"), &sample()), false);
        assert!(t.contains("GETATTR"), "{t}");
        assert!(t.contains("2.0"), "ops/s: {t}");
        assert!(t.contains("100.0%"), "{t}");
        assert!(t.contains("read 5.0 MiB"), "{t}");
    }

    #[test]
    fn prometheus_histogram_is_cumulative() {
        let p = prometheus(Path::new("/mnt \"x\""), &sample());
        assert!(p.contains(r#"mountpoint="/mnt \"x\"""#), "{p}");
        assert!(p.contains(
            "mapfs_request_duration_seconds_bucket{mountpoint=\"/mnt \\\"x\\\"\",op=\"GETATTR\",le=\"+Inf\"} 4"
        ));
        // 4 µs is under 2^12 ns; the 2 ms ones are under 2^22 ns.
        assert!(p.contains("le=\"4.096e-6\"} 1"), "{p}");
        assert!(p.contains("le=\"4.194304e-3\"} 4"), "{p}");
        assert!(p.contains("le=\"1.048576e-3\"} 1"), "{p}");
    }
}
