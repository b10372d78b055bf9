//! `mapfs pack`: tools for a `pack` file system's backing directory. While
//! a mount serves the directory, its daemon holds the store's database and
//! runs the tool itself, asked through its control socket (only its owner
//! or root may); otherwise the tool runs here, holding the store's instance
//! lock (see `mapfs_fs::pack`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use mapfs_fs::pack::{CheckReport, CompactReport, PackStats};
use serde::de::DeserializeOwned;

/// Arguments of `mapfs pack`.
#[derive(Args, Debug)]
pub struct PackArgs {
    #[command(subcommand)]
    cmd: PackCmd,
}

#[derive(Subcommand, Debug)]
enum PackCmd {
    /// Move live slots into free ones toward the front, cut pack files after
    /// their last slot and punch out free slots (online: open files stay).
    Compact {
        /// The pack mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Files, bytes, slack and pack files of a pack backing directory.
    Stats {
        /// The pack mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check the database (PRAGMA integrity_check) and the slots and
    /// extents; exit status 1 on any problem.
    Check {
        /// The pack mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
    },
}

/// Runs `mapfs pack ...`.
pub fn run(args: PackArgs) -> Result<()> {
    let backing_of = |given: &Path| crate::mounts::backing_of(given, "pack");
    match args.cmd {
        PackCmd::Compact { backing, json } => {
            let backing = backing_of(&backing)?;
            let r: CompactReport = run_tool(
                &backing,
                mapfs_fs::pack::TOOL_COMPACT,
                mapfs_fs::pack::compact,
            )
            .with_context(|| format!("compacting {}", backing.display()))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "moved {} slots ({} busy: open), cut {} bytes off pack files, \
                     punched out {} bytes of free slots",
                    r.moved, r.busy, r.truncated_bytes, r.punched_bytes
                );
            }
        }
        PackCmd::Stats { backing, json } => {
            let backing = backing_of(&backing)?;
            let s: PackStats =
                run_tool(&backing, mapfs_fs::pack::TOOL_STATS, mapfs_fs::pack::stats)
                    .with_context(|| format!("reading {}", backing.display()))?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "files        {} ({} with a backing file of their own)\n\
                     directories  {}\n\
                     other nodes  {}\n\
                     bytes        {} in slots of {} bytes (slack {})\n\
                     free slots   {} ({} bytes)\n\
                     pack files   {} ({} bytes, {} on disk)",
                    s.files,
                    s.own_files,
                    s.dirs,
                    s.others,
                    s.slotted_bytes,
                    s.slot_bytes,
                    s.slack_bytes,
                    s.free_slots,
                    s.free_bytes,
                    s.pack_files,
                    s.pack_bytes,
                    s.pack_disk_bytes
                );
                if s.awaiting_entry > 0 {
                    println!(
                        "awaiting     {} files created just before a daemon crash \
                         (the next mount enters them)",
                        s.awaiting_entry
                    );
                }
            }
        }
        PackCmd::Check { backing } => {
            let backing = backing_of(&backing)?;
            let r: CheckReport =
                run_tool(&backing, mapfs_fs::pack::TOOL_CHECK, mapfs_fs::pack::check)
                    .with_context(|| format!("checking {}", backing.display()))?;
            for p in &r.problems {
                println!("{p}");
            }
            if !r.ok() {
                bail!("{} problems in {}", r.problems.len(), backing.display());
            }
            println!(
                "ok: {} inodes, {} extents, {} slots",
                r.inodes, r.extents, r.slots
            );
        }
    }
    Ok(())
}

/// Runs pack tool `name` on the store in `backing`: in the daemon of the
/// mount serving it, if one answers here, else with `offline`.
fn run_tool<T: DeserializeOwned>(
    backing: &Path,
    name: &str,
    offline: impl FnOnce(&Path) -> mapfs::Result<T>,
) -> Result<T> {
    let Some(mountpoint) = serving_mount(backing)? else {
        return offline(backing).map_err(|e| {
            let busy = e.errno() == libc::EBUSY;
            let e = anyhow::Error::new(e);
            if busy {
                e.context(
                    "no mount of it answers here (a `mapfs run --embed` job, or a mount in \
                     another mount namespace, may hold it): run the tool when it is done",
                )
            } else {
                e
            }
        });
    };
    let sock = mapfs::control::socket_path(&mountpoint);
    let out = mapfs::control::tool(&sock, name, Vec::new()).with_context(|| {
        format!(
            "asking the daemon of {} to run {name}",
            mountpoint.display()
        )
    })?;
    mapfs::control::decode(&out).with_context(|| {
        format!(
            "the daemon of {} answered {name} with garbage",
            mountpoint.display()
        )
    })
}

/// The mountpoint of the pack mount serving `backing`, if any: every mapfs
/// mount in the mount table is asked what it serves.
fn serving_mount(backing: &Path) -> Result<Option<PathBuf>> {
    let want = std::fs::canonicalize(backing)
        .with_context(|| format!("no such directory {}", backing.display()))?;
    for m in crate::mounts::mount_table() {
        if !m.is_mapfs() {
            continue;
        }
        let Ok(st) = mapfs::control::status(&mapfs::control::socket_path(&m.mountpoint)) else {
            continue;
        };
        if st.fs == "pack" && std::fs::canonicalize(&st.backing).is_ok_and(|b| b == want) {
            return Ok(Some(m.mountpoint));
        }
    }
    Ok(None)
}
