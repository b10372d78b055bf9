//! `mapfs`: mount stackable user-space file systems whose data path skips the
//! daemon, run programs on them, and measure them. The built-in file systems
//! on the library's command line ([`mapfs_cli::main_with`]), plus `bench`.

mod fsck_cmd;
mod versions_cmd;

/// What `mapfs` has beyond every mapfs-based program.
#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per run
enum Extra {
    /// Benchmark native, FUSE daemon, kernel passthrough (and references) side by side.
    Bench(Box<mapfs_bench::BenchArgs>),
    /// Check a plfs mount or backing directory: recover or reclaim the logs of writers that died.
    Fsck(fsck_cmd::FsckArgs),
    /// Compact, inspect and check a `pack` store (its mountpoint or backing directory).
    Pack(mapfs_cli::pack_cmd::PackArgs),
    /// History of a `versions` file system: list, show, diff, restore, prune, stats.
    Versions(versions_cmd::VersionsArgs),
}

fn main() {
    mapfs_cli::main_with(mapfs_cli::builtins(), |e: Extra| match e {
        Extra::Bench(args) => mapfs_bench::run(*args),
        Extra::Fsck(args) => fsck_cmd::run(args),
        Extra::Pack(args) => mapfs_cli::pack_cmd::run(args),
        Extra::Versions(args) => versions_cmd::run(args),
    })
}
