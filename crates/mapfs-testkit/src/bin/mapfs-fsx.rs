//! `mapfs-fsx`: the seeded random-operation exerciser as a program.
//!
//! Exit status 0 with a one-line summary on success; 1 with the seed, failing
//! op, op-log tail and first differing offset on a mismatch.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mapfs_testkit::fsx::{run, FsxConfig};

/// fsx-style random-operation exerciser checking a file against a byte model.
#[derive(Parser, Debug)]
#[command(name = "mapfs-fsx", version)]
struct Args {
    /// Directory in which the test files are created.
    #[arg(long)]
    dir: PathBuf,
    /// Seed of the operation sequence (same seed, same operations).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of operations.
    #[arg(long, default_value_t = 10_000)]
    ops: u64,
    /// Largest file size in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    maxlen: u64,
    /// Largest single operation in bytes (capped at --maxlen).
    #[arg(long, default_value_t = 64 * 1024)]
    maxoplen: u64,
    /// Do not use mmap reads/writes.
    #[arg(long)]
    no_mmap: bool,
    /// Do not use fallocate, punch hole or zero range.
    #[arg(long)]
    no_fallocate: bool,
    /// Do not use copy_file_range.
    #[arg(long)]
    no_copy_range: bool,
    /// Also run the clone ioctls (FICLONE, FICLONERANGE).
    #[arg(long)]
    clone: bool,
    /// Never close and reopen the file.
    #[arg(long)]
    no_close_open: bool,
    /// Also run block-aligned O_DIRECT reads and writes.
    #[arg(long)]
    direct: bool,
    /// Keep the test files after success.
    #[arg(long)]
    keep: bool,
    /// Print every operation to stderr as it runs.
    #[arg(long)]
    print_ops: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut cfg = FsxConfig::new(a.dir, a.seed, a.ops);
    cfg.maxlen = a.maxlen.max(1);
    cfg.max_op_len = a.maxoplen.clamp(1, cfg.maxlen);
    cfg.mmap = !a.no_mmap;
    cfg.fallocate = !a.no_fallocate;
    cfg.copy_range = !a.no_copy_range;
    cfg.clone = a.clone;
    cfg.close_open = !a.no_close_open;
    cfg.keep = a.keep;
    cfg.print_ops = a.print_ops;
    cfg.direct = a.direct;
    match run(&cfg) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("{failure}");
            ExitCode::FAILURE
        }
    }
}
