//! `list` (alias `status`): every mapfs mount, what serves it and how.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::mounts::{self, MountInfo};

/// Arguments of `list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only these mountpoints.
    pub mountpoints: Vec<PathBuf>,
}

/// One mount as `list` reports it (the JSON object of `list --json`).
#[derive(Debug, Clone, Serialize)]
pub struct ListedMount {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// File system name (`null` when its daemon left no record).
    pub fs: Option<String>,
    /// Backing directory (the mount's source).
    pub backing: String,
    /// Pid of the daemon serving it.
    pub daemon_pid: Option<u32>,
    /// Pid of the supervisor that restarts the daemon if it dies.
    pub supervisor_pid: Option<u32>,
    /// The program serving it (`mapfs` or a file system's own binary).
    pub program: Option<String>,
    /// `--data` as given: auto, daemon or passthrough.
    pub data: Option<String>,
    /// Who executes reads and writes: `kernel passthrough` or `daemon`.
    pub executor: Option<String>,
    /// Whether kernel passthrough is in use for whole-file maps.
    pub passthrough_active: Option<bool>,
    /// Whether the kernel buffers writes (`--writeback-cache`, `--data
    /// daemon` only).
    pub writeback_cache: Option<bool>,
    /// Mount time, seconds since the epoch.
    pub started_unix: Option<u64>,
    /// Seconds since the mount.
    pub uptime_secs: Option<u64>,
}

/// What the daemon of `mountpoint` says about itself over its control
/// socket (`Request::Status`), with the program name from its info file.
/// `list` prefers it to the info file alone: a pid file or info file can be
/// stale, a connected daemon cannot. Kernel passthrough counts as active
/// only if the check at mount said so and the kernel has not refused it
/// since.
pub fn status(mountpoint: &Path) -> Option<MountInfo> {
    let st = mapfs::control::status(&mapfs::control::socket_path(mountpoint)).ok()?;
    let info = mounts::read_info(mountpoint);
    Some(MountInfo {
        pid: st.pid,
        program: info
            .as_ref()
            .map_or_else(|| "mapfs".to_string(), |i| i.program.clone()),
        fs: st.fs,
        backing: st.backing,
        data: st.data,
        passthrough_active: st.passthrough_active
            && info.as_ref().is_none_or(|i| i.passthrough_active),
        writeback_cache: st.writeback_cache,
        started_unix: st.started_unix,
        supervisor_pid: info.as_ref().and_then(|i| i.supervisor_pid),
    })
}

/// Every mapfs mount of this mount namespace, in mount order.
pub fn listed() -> Vec<ListedMount> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    mounts::mount_table()
        .into_iter()
        .filter(|m| m.is_mapfs())
        .map(|m| {
            let info = status(&m.mountpoint)
                .or_else(|| mounts::read_info(&m.mountpoint))
                // A record left by a dead daemon describes nothing.
                .filter(|i| {
                    rustix::process::Pid::from_raw(i.pid as i32)
                        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
                });
            let executor = info.as_ref().map(|i| {
                if i.passthrough_active {
                    "kernel passthrough".to_string()
                } else {
                    "daemon".to_string()
                }
            });
            ListedMount {
                backing: info
                    .as_ref()
                    .map_or(m.source.clone(), |i| i.backing.clone()),
                fs: info.as_ref().map(|i| i.fs.clone()),
                daemon_pid: info.as_ref().map(|i| i.pid),
                supervisor_pid: info.as_ref().and_then(|i| i.supervisor_pid),
                program: info.as_ref().map(|i| i.program.clone()),
                data: info.as_ref().map(|i| i.data.clone()),
                passthrough_active: info.as_ref().map(|i| i.passthrough_active),
                writeback_cache: info.as_ref().map(|i| i.writeback_cache),
                started_unix: info.as_ref().map(|i| i.started_unix),
                uptime_secs: info.as_ref().map(|i| now.saturating_sub(i.started_unix)),
                executor,
                mountpoint: m.mountpoint,
            }
        })
        .collect()
}

/// `list`.
pub fn list(args: ListArgs) -> Result<()> {
    let wanted: Vec<PathBuf> = args
        .mountpoints
        .iter()
        .map(|m| std::fs::canonicalize(m).unwrap_or_else(|_| m.clone()))
        .collect();
    let mut all = listed();
    if !wanted.is_empty() {
        all.retain(|m| wanted.contains(&m.mountpoint));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no mapfs mounts");
        return Ok(());
    }
    let unknown = || "?".to_string();
    println!("MOUNTPOINT\tFS\tBACKING\tEXECUTOR\tPID\tUPTIME");
    for m in all {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            m.mountpoint.display(),
            m.fs.unwrap_or_else(unknown),
            m.backing,
            match (m.executor, m.data) {
                (Some(e), Some(d)) => format!("{e} (--data {d})"),
                _ => unknown(),
            },
            m.daemon_pid.map_or_else(unknown, |p| p.to_string()),
            m.uptime_secs.map_or_else(unknown, uptime),
        );
    }
    Ok(())
}

/// `1d 2h`, `3h 4m`, `5m 6s`, `7s`.
fn uptime(s: u64) -> String {
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uptime_is_short() {
        assert_eq!(super::uptime(7), "7s");
        assert_eq!(super::uptime(366), "6m 6s");
        assert_eq!(super::uptime(3 * 3600 + 240), "3h 4m");
        assert_eq!(super::uptime(86400 + 7200), "1d 2h");
    }
}
