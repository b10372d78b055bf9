//! `mapfs`: mount stackable user-space file systems whose data path skips the
//! daemon, run programs on them, and measure them.

mod mount_cmd;
mod mounts;

use clap::{Parser, Subcommand};

/// mapfs: user-space file systems as fast as the file system underneath.
#[derive(Parser)]
#[command(
    name = "mapfs",
    version,
    after_help = "Examples:\n  \
      mapfs mount passthrough /srv/data /mnt/data            # mount in the background\n  \
      mapfs mount passthrough /srv/data /mnt/data --data daemon -o allow_other\n  \
      mapfs umount /mnt/data\n  \
      mapfs bench --quick                                   # compare native, FUSE, passthrough"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a file system (in the background; returns once it is ready).
    Mount(mount_cmd::MountArgs),
    /// Unmount a mapfs file system and wait for its daemon to finish.
    Umount(mount_cmd::UmountArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Mount(args) => mount_cmd::mount(args),
        Command::Umount(args) => mount_cmd::umount(args),
    };
    if let Err(e) = res {
        eprintln!("mapfs: error: {e:#}");
        std::process::exit(1);
    }
}
