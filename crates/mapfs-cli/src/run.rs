//! `mapfs run`: runs a program with the preload shim attached to mapfs
//! mounts, so its reads and writes on them skip the FUSE daemon.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::mounts;

/// File name of the shim, built next to the `mapfs` binary.
const SHIM: &str = "libmapfs_preload.so";

/// Arguments of `mapfs run`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
      mapfs run -- cp /mnt/data/big /mnt/data/big.copy\n  \
      mapfs run --mount /mnt/data -- python3 train.py\n  \
      MAPFS_PRELOAD_REPORT=/tmp/r.json mapfs run -- fio job.fio   # what was served natively\n\n\
      Environment of the shim:\n  \
      MAPFS_PRELOAD_REPORT=FILE       append a JSON summary line per process at exit\n  \
      MAPFS_PRELOAD_LOG=1             diagnostics on stderr\n  \
      MAPFS_PRELOAD_ADOPT_CALLS=N     adopt a file at its Nth data call (default 4)\n  \
      MAPFS_PRELOAD_ADOPT_BYTES=N     ...or at a call moving N bytes (default 1048576)\n\n\
      Programs making raw system calls (static or Go binaries) are not sped up;\n\
      their files still work through the mount.")]
pub struct RunArgs {
    /// Attach to this mapfs mount (repeatable); default: every mapfs mount.
    #[arg(long = "mount", value_name = "MOUNTPOINT")]
    pub mounts: Vec<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Replaces this process with the command, `LD_PRELOAD` and `MAPFS_MOUNTS`
/// set; returns only if it cannot be started.
pub fn run(args: RunArgs) -> Result<()> {
    let shim = shim_path()?;
    let table = mounts::mount_table();
    let chosen: Vec<PathBuf> = if args.mounts.is_empty() {
        table
            .iter()
            .filter(|m| m.is_mapfs())
            .map(|m| m.mountpoint.clone())
            .collect()
    } else {
        let mut v = Vec::new();
        for m in &args.mounts {
            let canon =
                std::fs::canonicalize(m).with_context(|| format!("--mount {}", m.display()))?;
            if !table.iter().any(|e| e.mountpoint == canon && e.is_mapfs()) {
                bail!("{} is not a mapfs mount", canon.display());
            }
            v.push(canon);
        }
        v
    };
    if chosen.is_empty() {
        eprintln!("mapfs run: no mapfs mount found; running the command without attaching");
    }
    if let Some(bad) = chosen
        .iter()
        .find(|m| m.as_os_str().as_encoded_bytes().contains(&b':'))
    {
        bail!(
            "mountpoint {} contains ':', which MAPFS_MOUNTS cannot carry",
            bad.display()
        );
    }
    let joined = std::env::join_paths(&chosen).context("joining mountpoints")?;
    let writeback: Vec<&PathBuf> = chosen.iter().filter(|m| uses_writeback_cache(m)).collect();
    for m in &writeback {
        eprintln!(
            "mapfs run: {} is a --data daemon mount with the kernel writeback cache on: the \
             kernel would keep stale sizes of files written natively, so its files stay on the \
             mount (remount with --writeback-cache off, or --data passthrough, for the fast path)",
            m.display()
        );
    }
    let writeback = std::env::join_paths(writeback).context("joining mountpoints")?;

    let mut preload = OsString::from(&shim);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let (prog, rest) = args.command.split_first().expect("clap requires CMD");
    // exec, not spawn: the command gets this process's pid, signals and
    // exit status exactly as if it had been started directly.
    let err = Command::new(prog)
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("MAPFS_MOUNTS", joined)
        .env("MAPFS_WRITEBACK_MOUNTS", writeback)
        .exec();
    Err(err).with_context(|| format!("running {}", prog.to_string_lossy()))
}

/// The command line of the daemon serving `mountpoint` (its pid file, else
/// a scan of /proc for `mapfs mount ... <mountpoint>`).
fn daemon_args(mountpoint: &Path) -> Option<Vec<String>> {
    let args_of = |pid: &str| -> Option<Vec<String>> {
        let raw = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).ok()?;
        Some(
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        )
    };
    let want = mountpoint.to_string_lossy();
    let is_daemon = |a: &[String]| a.iter().any(|x| x == "mount") && a.iter().any(|x| *x == want);
    if let Ok(pid) = std::fs::read_to_string(mounts::pid_path(mountpoint)) {
        if let Some(a) = args_of(&pid).filter(|a| is_daemon(a)) {
            return Some(a);
        }
    }
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|pid| args_of(&pid))
        .find(|a| is_daemon(a))
}

/// Whether the daemon of `mountpoint` runs `--data daemon` with the kernel
/// writeback cache (the default there): the kernel then trusts its own
/// cached file sizes over the daemon's, so sizes changed by native writes
/// would show late, even to the writer's next open.
fn uses_writeback_cache(mountpoint: &Path) -> bool {
    let Some(args) = daemon_args(mountpoint) else {
        return false;
    };
    let value = |flag: &str| -> Option<String> {
        let eq = format!("{flag}=");
        args.iter().enumerate().find_map(|(i, a)| {
            if a == flag {
                args.get(i + 1).cloned()
            } else {
                a.strip_prefix(&eq).map(str::to_string)
            }
        })
    };
    value("--data").as_deref() == Some("daemon")
        && value("--writeback-cache").as_deref() != Some("off")
}

/// The shim, found relative to the running binary: installed
/// (`PREFIX/bin/mapfs` with `PREFIX/lib/mapfs/libmapfs_preload.so`) or in
/// the cargo target dir (next to it, or one level up for test binaries in
/// `deps/` and examples in `examples/`).
pub fn shim_path() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let installed = dir.join("../lib/mapfs").join(SHIM);
    for cand in [dir.join(SHIM), dir.join("..").join(SHIM), installed] {
        if cand.exists() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!(
        "{SHIM} not found next to {} nor in ../lib/mapfs/; install with `bash scripts/install.sh` \
         or build it with `cargo build --workspace` (same profile)",
        exe.display()
    )
}
