//! The fsx-style exerciser on a real mount, in each data mode.
//!
//! Fixed seeds plus, when set, `MAPFS_FSX_SEED` (to reproduce or widen a run);
//! `MAPFS_FSX_OPS` overrides the op count (default 10,000 per mode).

mod common;

use common::*;
use mapfs_testkit::fsx::{self, FsxConfig};

const SEEDS: [u64; 1] = [20_260_101];

fn ops() -> u64 {
    std::env::var("MAPFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn seeds() -> Vec<u64> {
    let mut v = SEEDS.to_vec();
    if let Some(s) = std::env::var("MAPFS_FSX_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        v.push(s);
    }
    v
}

fn exercise(mode: DataMode) {
    let test = format!("fsx --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    for seed in seeds() {
        let cfg = FsxConfig::new(s.mountpoint(), seed, ops());
        let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
        eprintln!("{test}: {report}");
        // The passthrough fs supports every operation: none may be skipped,
        // and each kind must really have run.
        assert!(
            report.skipped.is_empty(),
            "{test}: operations skipped: {report}"
        );
        for k in cfg.enabled_kinds() {
            assert!(report.count(k) > 0, "{test}: {k} never ran: {report}");
        }
        // The bytes are in the backing file too: nothing stayed daemon-side.
        assert!(
            std::fs::read_dir(s.backing()).unwrap().count() == 0,
            "{test}: fsx files not removed from backing dir"
        );
    }
}

#[test]
fn fsx_daemon() {
    exercise(DataMode::Daemon);
}

#[test]
fn fsx_passthrough() {
    exercise(DataMode::Passthrough);
}

/// Same seed on native and on the mount gives the same final file.
#[test]
fn fsx_final_file_matches_native() {
    if !fuse_or_skip("fsx_final_file_matches_native") {
        return;
    }
    let native = native_dir();
    let s = mount(DataMode::Auto, &[]);
    let mut results = Vec::new();
    for dir in [native.path(), s.mountpoint()] {
        let mut cfg = FsxConfig::new(dir, 99, 2_000);
        cfg.keep = true;
        fsx::run(&cfg).unwrap_or_else(|f| panic!("{}:\n{f}", dir.display()));
        results.push(std::fs::read(dir.join("fsx-99.data")).unwrap());
    }
    assert!(
        results[0] == results[1],
        "final file differs between native and mount (auto mode)"
    );
    let backing = std::fs::read(s.backing().join("fsx-99.data")).unwrap();
    assert!(
        backing == results[0],
        "backing file differs from what the mount shows"
    );
}

/// Several exercisers at once on one mount (different files): the daemon's
/// threads and the kernel's per-inode state must keep them apart.
fn parallel(mode: DataMode) {
    let test = format!("fsx parallel --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    let handles: Vec<_> = (0..3u64)
        .map(|i| {
            let dir = s.mountpoint().to_path_buf();
            std::thread::spawn(move || fsx::run(&FsxConfig::new(dir, 1000 + i, 2_500)))
        })
        .collect();
    for h in handles {
        let r = h.join().expect("fsx thread panicked");
        let report = r.unwrap_or_else(|f| panic!("{test}:\n{f}"));
        assert!(report.skipped.is_empty(), "{test}: {report}");
    }
}

#[test]
fn fsx_parallel_daemon() {
    parallel(DataMode::Daemon);
}

#[test]
fn fsx_parallel_passthrough() {
    parallel(DataMode::Passthrough);
}

/// O_DIRECT reads and writes mixed with buffered, mapped and fallocate ops:
/// the page cache and the direct path must stay coherent.
fn direct(mode: DataMode) {
    let test = format!("fsx O_DIRECT --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    let mut cfg = FsxConfig::new(s.mountpoint(), 4242, 3_000);
    cfg.direct = true;
    let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
    eprintln!("{test}: {report}");
    assert!(
        report.skipped.is_empty(),
        "{test}: operations skipped: {report}"
    );
    for k in cfg.enabled_kinds() {
        assert!(report.count(k) > 0, "{test}: {k} never ran: {report}");
    }
}

#[test]
fn fsx_direct_daemon() {
    direct(DataMode::Daemon);
}

#[test]
fn fsx_direct_passthrough() {
    direct(DataMode::Passthrough);
}
