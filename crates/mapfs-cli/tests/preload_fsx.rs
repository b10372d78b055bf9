//! fsx-style random operations through the shim, checked against a byte
//! model, by a second exerciser written against Python's `os`, `mmap` and
//! `ctypes` (so through libc, like most applications): it adds `dup`,
//! reopen-heavy and stat-by-path checks to what `mapfs-fsx` (run under the
//! shim in `preload_attached.rs`) covers.
//!
//! `MAPFS_FSX_OPS` sets the number of operations (default 10,000),
//! `MAPFS_FSX_SEED` adds a seed.

mod common;
mod preload_support;

use common::{fuse_or_skip, DataMode, MountSession};
use preload_support::*;

const EXERCISER: &str = include_str!("preload_support/pyfsx.py");

fn ops() -> u64 {
    std::env::var("MAPFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn exercise(mode: DataMode, extra: &[&str]) {
    let test = format!("preload python fsx --data {mode} {extra:?}");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let mut b = MountSession::builder(mapfs_bin()).data(mode);
    for a in extra {
        b = b.arg(a);
    }
    let s = b.mount().unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let mut seeds = vec![20_260_302u64];
    if let Some(seed) = std::env::var("MAPFS_FSX_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        seeds.push(seed);
    }
    for seed in seeds {
        let report = report_path(&s, &format!("pyfsx-{seed}"));
        let file = s.mountpoint().join(format!("fsx.{seed}"));
        let model = s.scratch().unwrap().join(format!("model.{seed}"));
        let out = ok(attached(&s, &report, "python3")
            .arg("-c")
            .arg(EXERCISER)
            .arg(&file)
            .arg(seed.to_string())
            .arg(ops().to_string())
            .arg(&model));
        let line = String::from_utf8_lossy(&out.stdout);
        eprintln!("{test}: {}", line.trim());
        assert!(
            line.contains(" status=3 "),
            "{test}: the file was not adopted: {line}"
        );
        // Once closed, the mount (no shim) shows exactly the model.
        let want = std::fs::read(&model).unwrap();
        let got = std::fs::read(&file).unwrap();
        assert_eq!(got.len(), want.len(), "{test}: size through the mount");
        assert!(
            got == want,
            "{test}: bytes through the mount differ from the model"
        );
        let t = totals(&report, "python");
        assert_eq!(t.fallbacks, 0, "{test}: {t:?}");
        assert_eq!(t.mount_calls, 0, "{test}: {t:?}");
        assert!(
            t.adopted > 1 && t.native_calls as f64 >= ops() as f64 * 0.5,
            "{test}: {t:?}"
        );
    }
}

#[test]
fn python_fsx_passthrough() {
    exercise(DataMode::Passthrough, &[]);
}

#[test]
fn python_fsx_daemon_strict() {
    exercise(DataMode::Daemon, &["--writeback-cache", "off"]);
}
