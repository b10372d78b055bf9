//! `mapfs fsck BACKING`: checks a plfs backing directory offline or beside
//! running daemons, recovering or reclaiming the logs of writers that died
//! (see the plfs module's `recover.rs`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use mapfs_fs::plfs::Plfs;

/// Arguments of `mapfs fsck`.
#[derive(clap::Args, Debug)]
pub struct FsckArgs {
    /// The plfs mount (its mountpoint or its backing directory).
    #[arg(value_name = "MOUNT_OR_BACKING")]
    pub backing: PathBuf,
    /// Host id to name droppings this check writes (default: the host name).
    #[arg(long)]
    pub hostid: Option<String>,
}

/// Runs the check and prints what it did, one line per finding, then a
/// summary line.
pub fn run(args: FsckArgs) -> Result<()> {
    let host = args.hostid.unwrap_or_else(mapfs_fs::plfs::default_hostid);
    let backing = mapfs_cli::mounts::backing_of(&args.backing, "plfs")?;
    let fs = Plfs::on_host(&backing, &host).with_context(|| {
        format!(
            "plfs over {} (expected the mountpoint of a plfs mount or its backing directory)",
            args.backing.display()
        )
    })?;
    let found = fs
        .fsck()
        .with_context(|| format!("checking {}", backing.display()))?;
    for f in &found {
        println!("{f}");
    }
    println!(
        "fsck {}: {} finding(s); every log has a live writer or records",
        backing.display(),
        found.len()
    );
    Ok(())
}
