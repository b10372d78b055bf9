//! The fsx exerciser under both in-process executors, on every built-in
//! file system: `mapfs run --mount` attached to a mount of the file system
//! (descriptors adopted at their first data call) and `mapfs run --embed`.
//! Every operation kind is on, the clone ioctls, `copy_file_range` and
//! close/reopen included, with five seeds each.
//!
//! The same seed is first run on the mount alone. fsx checks every read
//! against its byte model; on top of that, the executor must answer every
//! operation as the mount does (the same counts of operations run and
//! skipped, with the same errno: `EOPNOTSUPP` for the clone ioctls) and
//! leave the same final file. Every run is under the torture suite's
//! watchdog.
//!
//! `MAPFS_FSX_OPS` sets the operations of a run (default 1,500).

mod common;
mod embed_support;
mod preload_support;
mod torture_support;

use std::path::Path;
use std::time::Duration;

use common::fuse_or_skip;
use mapfs_testkit::fsx::{self, FsxConfig, OpKind};
use torture_support::{mount, succeeded, watched};

/// Seeds of each case.
const SEEDS: [u64; 5] = [4301, 4302, 4303, 4304, 4305];

/// Longest one run may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(180);

fn ops() -> u64 {
    std::env::var("MAPFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500)
}

/// The configuration of every run: all kinds on, the clone ioctls too.
fn config(dir: &Path, seed: u64, mmap: bool) -> FsxConfig {
    let mut cfg = FsxConfig::new(dir, seed, ops());
    cfg.mmap = mmap;
    cfg.clone = true;
    cfg.copy_range = true;
    cfg.close_open = true;
    cfg.keep = true;
    cfg
}

/// `mapfs-fsx` arguments matching [`config`].
fn fsx_args(dir: &str, seed: u64, mmap: bool) -> Vec<String> {
    let mut v: Vec<String> = [
        "--dir",
        dir,
        "--seed",
        &seed.to_string(),
        "--ops",
        &ops().to_string(),
        "--clone",
        "--keep",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !mmap {
        v.push("--no-mmap".into());
    }
    v
}

/// Whether fsx maps the file on `fs` under `executor`: not on embedded
/// plfs, whose files no kernel object holds, so a shared mapping is
/// refused (`ENODEV`, docs/embedded.md); the mount then runs the same
/// operations without maps, to be compared.
fn maps(executor: &str, fs: &str) -> bool {
    !(executor == "embedded" && fs == "plfs")
}

/// fsx on `fs` under `executor` ("attached" or "embedded"), each seed
/// compared with the same seed on the mount alone.
fn case(executor: &str, fs: &str) {
    let test = format!("fsx {executor} {fs}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(fs, &test);
    let base = s.mountpoint().join("mount");
    std::fs::create_dir(&base).unwrap();
    let area = embed_support::Area::new("backing");
    let bin = preload_support::fsx_bin().display().to_string();
    let mmap = maps(executor, fs);
    for seed in SEEDS {
        let what = format!("{test} seed {seed}");
        let want = fsx::run(&config(&base, seed, mmap))
            .unwrap_or_else(|f| panic!("{what}: on the mount alone:\n{f}"));
        // fsx tried the clone ioctls, and the mount refused them.
        for k in [OpKind::CloneRange, OpKind::CloneWhole] {
            match want.skipped.get(&k) {
                Some((n, e)) => assert!(
                    *n > 0 && *e == rustix::io::Errno::OPNOTSUPP,
                    "{what}: the mount answered {k} with {e}: {want}"
                ),
                None => panic!("{what}: {k} never tried or the mount served it: {want}"),
            }
        }
        let want = want.to_string();
        let (dir, cmd) = match executor {
            "attached" => {
                let dir = s.mountpoint().join("attached");
                std::fs::create_dir_all(&dir).unwrap();
                let report = preload_support::report_path(&s, &format!("fsx-{seed}"));
                let mut c = preload_support::attached(&s, &report, &bin);
                let d = dir.display().to_string();
                c.args(fsx_args(&d, seed, mmap));
                (d, c)
            }
            _ => {
                let d = area.prefix.display().to_string();
                let mut c = area.run_embedded(fs, "", &bin);
                c.args(fsx_args(&d, seed, mmap));
                (d, c)
            }
        };
        let out = watched(cmd, LIMIT, &what);
        succeeded(&out, &what);
        let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
        eprintln!("{what}: {got}");
        assert_eq!(
            got, want,
            "{what}: the executor answered otherwise than the mount"
        );
        // The final file, read by a program of the executor, is the mount's.
        let name = format!("fsx-{seed}.data");
        let want_bytes = std::fs::read(base.join(&name)).unwrap();
        let file = format!("{dir}/{name}");
        let cat = match executor {
            "attached" => {
                let report = preload_support::report_path(&s, &format!("cat-{seed}"));
                let mut c = preload_support::attached(&s, &report, "cat");
                c.arg(&file);
                c
            }
            _ => {
                let mut c = area.run_embedded(fs, "", "cat");
                c.arg(&file);
                c
            }
        };
        let out = watched(cat, LIMIT, &what);
        succeeded(&out, &format!("{what}: cat"));
        assert!(
            out.stdout == want_bytes,
            "{what}: the final file ({} bytes) differs from the mount's ({} bytes)",
            out.stdout.len(),
            want_bytes.len()
        );
        if executor == "attached" {
            // And through the mount, with no shim.
            let through = std::fs::read(Path::new(&file)).unwrap();
            assert!(
                through == want_bytes,
                "{what}: the mount shows other bytes than the executor wrote"
            );
        }
    }
}

macro_rules! cases {
    ($($name:ident: $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            case($executor, $fs);
        }
    )*};
}

cases! {
    attached_passthrough: "attached", "passthrough";
    attached_plfs: "attached", "plfs";
    attached_pack: "attached", "pack";
    attached_versions: "attached", "versions";
    embedded_passthrough: "embedded", "passthrough";
    embedded_plfs: "embedded", "plfs";
    embedded_pack: "embedded", "pack";
    embedded_versions: "embedded", "versions";
}
