//! `concat`: files made of files, on mapfs. `concat mount concat BACKING
//! MNT` mounts it; every other command of `mapfs` (`umount`, `run`, `list`,
//! `stats`, `mount -t fuse.concat`) works too, and `concat run --embed
//! concat:BACKING:/cat -- PROGRAM` serves `/cat` inside the program with
//! no mount (the library `lib.rs` makes).

#![forbid(unsafe_code)]

mod fs;

fn main() {
    mapfs_cli::main(fs::registry())
}
