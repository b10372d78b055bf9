//! `mapfs pack`: tools for a `pack` file system's backing directory, safe
//! while it is mounted (they work through its database's transactions and
//! the slots' byte-range locks; see `mapfs_fs::pack`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

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
        /// The backing directory of a pack file system.
        backing: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Files, bytes, slack and pack files of a pack backing directory.
    Stats {
        /// The backing directory of a pack file system.
        backing: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check the database (PRAGMA integrity_check) and the slots and
    /// extents; exit status 1 on any problem.
    Check {
        /// The backing directory of a pack file system.
        backing: PathBuf,
    },
}

/// Runs `mapfs pack ...`.
pub fn run(args: PackArgs) -> Result<()> {
    match args.cmd {
        PackCmd::Compact { backing, json } => {
            let r = mapfs_fs::pack::compact(&backing)
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
            let s = mapfs_fs::pack::stats(&backing)
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
            }
        }
        PackCmd::Check { backing } => {
            let r = mapfs_fs::pack::check(&backing)
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
