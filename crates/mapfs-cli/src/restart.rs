//! `restart MOUNTPOINT`: replaces a mount's daemon without unmounting (to
//! upgrade the binary, or to shed a daemon's state). The daemon hands every
//! written map to its file system and leaves; its supervisor starts the
//! program again (the file on disk now) on the same FUSE connection, and
//! programs using the mount see nothing but a short pause.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use crate::mount_cmd::RESTART_SIGNAL;
use crate::{mounts, pidfd};

/// Arguments of `restart`.
#[derive(Args, Debug)]
pub struct RestartArgs {
    /// The mountpoint whose daemon to replace.
    pub mountpoint: PathBuf,
    /// Seconds to wait for the new daemon.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// `restart`.
pub fn restart(args: RestartArgs) -> Result<()> {
    let mp = args
        .mountpoint
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.mountpoint.display()))?;
    let info = mounts::read_info(&mp)
        .ok_or_else(|| anyhow!("{} is not served by a mapfs daemon", mp.display()))?;
    if info.supervisor_pid.is_none() {
        bail!(
            "{} is served without a supervisor (--foreground or --no-supervisor): \
             nothing would start a new daemon; unmount and mount it again",
            mp.display()
        );
    }
    let daemon = pidfd::daemon_of(&mp).ok_or_else(|| {
        anyhow!(
            "cannot reach the daemon of {} (is it restarting already?)",
            mp.display()
        )
    })?;
    let old = info.pid;
    let sig =
        rustix::process::Signal::from_named_raw(RESTART_SIGNAL as i32).expect("a named signal");
    rustix::process::pidfd_send_signal(&daemon, sig)
        .with_context(|| format!("cannot signal daemon {old}"))?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let socket = mapfs::control::socket_path(&mp);
    loop {
        if let Ok(st) = mapfs::control::status(&socket) {
            if st.pid != old {
                println!("{}: daemon {old} replaced by {}", mp.display(), st.pid);
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "no new daemon serves {} after {} s; see its log ({})",
                mp.display(),
                args.timeout,
                mounts::log_path(&mp).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
