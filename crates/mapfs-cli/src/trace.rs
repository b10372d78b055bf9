//! `trace`: a live log of the requests a mount's daemon serves
//! ([`mapfs::control::Request::Trace`]), for the mount's owner or root.
//!
//! The daemon traces only while a `trace` is connected (one relaxed atomic
//! load per request otherwise), into a bounded queue per client; this
//! command asks for what is queued every `POLL`, and says how many events
//! were dropped when it lagged.

use std::io::Write as _;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mapfs::control::{Request, Response};
use mapfs::stats::TraceEvent;

/// How often the queue is read.
const POLL: Duration = Duration::from_millis(100);

/// Arguments of `trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// The mount.
    pub mountpoint: PathBuf,
    /// Only requests of this FUSE opcode (LOOKUP, GETATTR, CREATE, READ...).
    #[arg(long, value_name = "OP")]
    pub op: Option<String>,
    /// Only requests of this process.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit after this many requests.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// One line of text for `e`: local wall-clock time, the caller, the
/// opcode, the node, the path it was about (for name operations the path
/// named, not the parent's), the time in the daemon and the result.
pub fn line(e: &TraceEvent) -> String {
    let result = if e.errno == 0 {
        "ok".to_string()
    } else {
        format!("{:?}", nix::errno::Errno::from_raw(e.errno))
    };
    format!(
        "{} pid={:<7} {:<12} node={:<6} {:<30} {:>9.1}µs {}",
        wall_clock(e.at_unix_ns),
        e.pid,
        e.op,
        e.nodeid,
        subject(e),
        e.latency_ns as f64 / 1e3,
        result
    )
}

/// The path a request was about: the path it named for name operations,
/// else its node's path.
fn subject(e: &TraceEvent) -> &str {
    e.target.as_deref().or(e.path.as_deref()).unwrap_or("?")
}

/// `HH:MM:SS.uuuuuu` in local time: traces are read next to logs and
/// other programs' output, which use the wall clock.
fn wall_clock(unix_ns: u64) -> String {
    let secs = (unix_ns / 1_000_000_000) as libc::time_t;
    let micros = unix_ns % 1_000_000_000 / 1000;
    // SAFETY: localtime_r writes only into `tm`, which outlives the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return format!("{secs}.{micros:06}");
    }
    format!(
        "{:02}:{:02}:{:02}.{micros:06}",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    )
}

/// `trace`.
pub fn trace(args: TraceArgs) -> Result<()> {
    let mountpoint = crate::stats::mapfs_mountpoint(&args.mountpoint)?;
    let sock = mapfs::control::socket_path(&mountpoint);
    let conn = mapfs::control::connect(&sock)
        .with_context(|| format!("connecting to the daemon of {}", mountpoint.display()))?;
    let req = Request::Trace {
        op: args.op.clone(),
        pid: args.pid,
    };
    let mut shown = 0u64;
    let mut first = true;
    let stdout = std::io::stdout();
    loop {
        let (resp, _) = mapfs::control::call(conn.sock.as_fd(), &req)
            .with_context(|| format!("asking the daemon of {}", mountpoint.display()))?;
        let (events, dropped) = match resp {
            Response::Trace { events, dropped } => (events, dropped),
            Response::Refused { errno, reason } => match errno {
                libc::EPERM => bail!(
                    "only the owner of {} or root may trace it",
                    mountpoint.display()
                ),
                libc::EINVAL => bail!(
                    "unknown FUSE opcode {:?} (one of: {})",
                    args.op.as_deref().unwrap_or(""),
                    mapfs_fuse::stats::OP_NAMES.join(", ")
                ),
                _ => bail!("the daemon refused: {reason}"),
            },
            _ => bail!(
                "the daemon of {} answered out of protocol",
                mountpoint.display()
            ),
        };
        if first {
            first = false;
            eprintln!("tracing {} (Ctrl-C stops)", mountpoint.display());
        }
        let mut out = stdout.lock();
        if dropped > 0 {
            writeln!(out, "# {dropped} requests dropped (this reader lagged)")?;
        }
        for e in &events {
            if args.json {
                writeln!(out, "{}", serde_json::to_string(e)?)?;
            } else {
                writeln!(out, "{}", line(e))?;
            }
            shown += 1;
            if args.count.is_some_and(|n| shown >= n) {
                return Ok(());
            }
        }
        out.flush()?;
        drop(out);
        if events.is_empty() {
            std::thread::sleep(POLL);
        }
    }
}
