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
    /// `live` (its daemon runs and answers on its control socket),
    /// `restarting` (its supervisor runs while no daemon answers: a
    /// failover under way) or `dead` (nothing serves it: every access
    /// fails with `ENOTCONN` until it is unmounted).
    pub state: &'static str,
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
            // Live means both: a process that runs (a pidfd, so a zombie
            // or a reused pid does not count) and a control socket that
            // answers. The info file alone outlives a killed daemon.
            let live = status(&m.mountpoint).filter(|i| crate::pidfd::running(i.pid));
            let recorded = mounts::read_info(&m.mountpoint);
            let state = if live.is_some() {
                "live"
            } else if recorded
                .as_ref()
                .and_then(|i| i.supervisor_pid)
                .is_some_and(crate::pidfd::running)
            {
                "restarting"
            } else {
                "dead"
            };
            let running = live.as_ref();
            let executor = running.map(|i| {
                if i.passthrough_active {
                    "kernel passthrough".to_string()
                } else {
                    "daemon".to_string()
                }
            });
            // What it serves is still worth showing for a dead mount.
            let described = live.as_ref().or(recorded.as_ref());
            ListedMount {
                state,
                backing: described.map_or(m.source.clone(), |i| i.backing.clone()),
                fs: described.map(|i| i.fs.clone()),
                daemon_pid: running.map(|i| i.pid),
                supervisor_pid: running.and_then(|i| i.supervisor_pid),
                program: described.map(|i| i.program.clone()),
                data: described.map(|i| i.data.clone()),
                passthrough_active: running.map(|i| i.passthrough_active),
                writeback_cache: running.map(|i| i.writeback_cache),
                started_unix: running.map(|i| i.started_unix),
                uptime_secs: running.map(|i| now.saturating_sub(i.started_unix)),
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
        // A dead mount cannot be canonicalized (stat fails).
        .map(|m| {
            std::fs::canonicalize(m)
                .or_else(|_| std::path::absolute(m))
                .unwrap_or_else(|_| m.clone())
        })
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
    let none = || "-".to_string();
    println!("MOUNTPOINT\tFS\tBACKING\tEXECUTOR\tPID\tUPTIME");
    let mut dead = Vec::new();
    for m in &all {
        let executor = match (m.state, &m.executor, &m.data) {
            ("live", Some(e), Some(d)) => format!("{e} (--data {d})"),
            ("live", ..) => unknown(),
            (state, ..) => state.to_string(),
        };
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            m.mountpoint.display(),
            m.fs.clone().unwrap_or_else(unknown),
            m.backing,
            executor,
            m.daemon_pid.map_or_else(none, |p| p.to_string()),
            m.uptime_secs.map_or_else(none, uptime),
        );
        if m.state == "dead" {
            dead.push(m.mountpoint.display().to_string());
        }
    }
    for mnt in dead {
        println!(
            "dead: {mnt}: no daemon serves it (every access fails); clean up with \
             `mapfs umount --lazy {mnt}` (or `fusermount3 -uz {mnt}`)"
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
