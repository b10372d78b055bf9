//! `mapfs`: mount stackable user-space file systems whose data path skips the
//! daemon, run programs on them, and measure them.

mod bench;

use mapfs_cli::{mount_cmd, run};

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
      mapfs run -- sqlite3 /mnt/data/db.sqlite 'select 1'  # data path inside the process\n  \
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
    /// Run a program with its mapfs data path inside the process (preload shim).
    Run(run::RunArgs),
    /// Benchmark native, FUSE daemon, kernel passthrough (and references) side by side.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Mount(args) => mount_cmd::mount(args),
        Command::Umount(args) => mount_cmd::umount(args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::run(args),
    };
    if let Err(e) = res {
        eprintln!("mapfs: error: {e:#}");
        std::process::exit(1);
    }
}
