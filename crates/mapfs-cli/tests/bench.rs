//! `mapfs bench` end to end on a small scale: the configurations that set
//! themselves up in unusual ways (pack over a store of its own, embedded
//! plfs, embedded versions over a store of its own) run the workloads that make their own files, and every cell has a
//! figure. Speed is not checked here (benchmarks, not tests, hold speed
//! goals); that the workloads run, with their own byte checks, is.

mod common;

use std::process::Command;

use common::{fuse_or_skip, mapfs_bin, need};

/// A finished `mapfs bench ARGS` run over a fresh backing directory in
/// /var/tmp: its results.json, its stderr, and the backing directory (to
/// check nothing is left in it).
struct BenchRun {
    json: serde_json::Value,
    stderr: String,
    backing: tempfile::TempDir,
}

impl BenchRun {
    fn new(args: &[&str]) -> BenchRun {
        let backing = tempfile::Builder::new()
            .prefix("mapfs-bench-test.")
            .tempdir_in("/var/tmp")
            .unwrap();
        let out = tempfile::tempdir().unwrap();
        let run = Command::new(mapfs_bin())
            .arg("bench")
            .args(args)
            .arg("--backing")
            .arg(backing.path())
            .arg("--out")
            .arg(out.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "mapfs bench failed: {stderr}");
        let json = serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap())
            .unwrap();
        BenchRun {
            json,
            stderr,
            backing,
        }
    }

    /// The record of `workload`, `config`, `column` (the first run's).
    fn cell(&self, w: &str, c: &str, col: &str) -> &serde_json::Value {
        (self.json["records"].as_array().expect("records"))
            .iter()
            .find(|r| r["workload"] == w && r["config"] == c && r["column"] == col)
            .unwrap_or_else(|| panic!("no {w} {c} {col} record: {}", self.json))
    }

    /// Asserts the bench left nothing in its backing directory.
    fn assert_backing_empty(&self) {
        let left: Vec<_> = std::fs::read_dir(self.backing.path())
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "left in the backing directory: {left:?}");
    }
}

/// With stderr not a terminal, `mapfs bench` prints a line as each of its
/// `units` starts (`mapfs bench: K/UNITS [M:SS] WORKLOAD ...`), in order.
fn assert_progress_lines(stderr: &str, units: u64, workload: &str) {
    let seen: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("mapfs bench: "))
        .filter_map(|l| {
            let (k, rest) = l.split_once('/')?;
            let (len, rest) = rest.split_once(" [")?;
            assert_eq!(len.parse::<u64>().ok(), Some(units), "{l}");
            assert!(rest.contains(&format!("] {workload} ")), "{l}");
            k.parse().ok()
        })
        .collect();
    assert_eq!(
        seen,
        (1..=units).collect::<Vec<_>>(),
        "progress lines:\n{stderr}"
    );
}

#[test]
fn bench_runs_small_files_and_n1_strided_on_pack_and_embedded_plfs() {
    if !fuse_or_skip("bench small-files / n1-strided") || !need("fio") {
        return;
    }
    let b = BenchRun::new(&[
        "--workloads",
        "small-files,n1-strided-Nth,rnd-rd-small-files",
        "--configs",
        "native,pack,embedded-plfs,embedded-pack",
        "--files",
        "1500",
        "--size",
        "4M",
        "--bs",
        "4k",
        "--runs",
        "1",
        "--runtime",
        "1",
    ]);
    let (json, stderr) = (&b.json, &b.stderr);
    let cell = |w: &str, c: &str, col: &str| b.cell(w, c, col);
    for c in ["native", "pack", "embedded-plfs", "embedded-pack"] {
        // 1,500 files of 4 KiB, then one of 1 MiB per 100.
        for (col, files) in [
            ("write", 1500),
            ("read", 1500),
            ("write 1M", 15),
            ("read 1M", 15),
        ] {
            let r = cell("small-files", c, col);
            assert!(
                r["error"].is_null() && r["value"].as_f64().is_some_and(|v| v > 0.0),
                "small-files {c} {col}: {r}\n{stderr}"
            );
            assert_eq!(r["amount"], files, "small-files {c} {col}: {r}");
        }
    }
    // What the files took on the backing file system: pack keeps them in a
    // few pack files.
    let inodes = |c: &str| {
        cell("small-files", c, "inodes")["value"]
            .as_f64()
            .unwrap_or(-1.0)
    };
    assert!(inodes("native") >= 1500.0, "native inodes: {json}");
    assert!(
        inodes("pack") >= 0.0 && inodes("pack") * 10.0 < inodes("native"),
        "pack took {} inodes for 1500 files, native {}",
        inodes("pack"),
        inodes("native")
    );
    for c in ["native", "embedded-plfs"] {
        let r = cell("n1-strided-Nth", c, "4k");
        assert!(
            r["error"].is_null() && r["value"].as_f64().is_some_and(|v| v > 0.0),
            "n1-strided {c}: {r}\n{stderr}"
        );
    }
    // The small files, all open at once, read at random for a second
    // after a warm-up of one.
    for c in ["native", "pack", "embedded-plfs"] {
        let r = cell("rnd-rd-small-files", c, "4k");
        assert!(
            r["error"].is_null() && r["value"].as_f64().is_some_and(|v| v > 0.0),
            "rnd-rd-small-files {c}: {r}\n{stderr}"
        );
        let secs = r["secs"].as_f64().unwrap_or(0.0);
        assert!(
            (0.5..30.0).contains(&secs),
            "rnd-rd-small-files {c}: timed {secs} s, not the second after the warm-up: {r}"
        );
    }
    // Nothing left mounted or in the backing directory.
    b.assert_backing_empty();
}

/// `overwrite` on `versions`, through the mount and under `mapfs run`: every
/// cell has a figure, versions reports the bytes its history keeps (every
/// rewrite keeps the old bytes: at least the files' size once per round)
/// where native keeps nothing, and the version store it made in the backing
/// directory is gone after the run.
#[test]
fn bench_overwrite_reports_what_versions_keeps() {
    if !fuse_or_skip("bench overwrite") {
        return;
    }
    let b = BenchRun::new(&[
        "--workloads",
        "overwrite",
        "--configs",
        "native,auto,versions,versions-preload,embedded-versions",
        "--overwrite-files",
        "40",
        "--rounds",
        "2",
        "--runs",
        "1",
    ]);
    // stderr is no terminal here: one progress line per unit (one round
    // of overwrite per configuration), numbered, each naming its cell.
    assert_progress_lines(&b.stderr, 5, "overwrite");
    let json = &b.json;
    let record = |c: &str, col: &str| {
        let r = b.cell("overwrite", c, col);
        assert!(
            r["error"].is_null(),
            "overwrite {c} {col}: {r}\n{}",
            b.stderr
        );
        r.clone()
    };
    let value = |c: &str, col: &str| record(c, col)["value"].as_f64().unwrap_or(-1.0);
    // The bytes rewritten (the same files in every configuration), two
    // rounds over the files: versions keeps at least two old copies.
    let rewritten = record("native", "MB/s")["amount"].as_f64().unwrap();
    let files_mib = rewritten / 2.0 / 1048576.0;
    assert!(files_mib > 0.5, "40 files of 2 KiB-1 MiB: {files_mib} MiB");
    for c in [
        "native",
        "auto",
        "versions",
        "versions-preload",
        "embedded-versions",
    ] {
        assert!(value(c, "MB/s") > 0.0, "overwrite {c}: no throughput");
        assert_eq!(record(c, "MB/s")["amount"].as_f64(), Some(rewritten), "{c}");
    }
    assert!(
        value("native", "kept MiB") < 0.5,
        "native kept bytes: {json}"
    );
    for c in ["versions", "versions-preload", "embedded-versions"] {
        let kept = value(c, "kept MiB");
        assert!(
            kept >= 2.0 * files_mib * 0.9,
            "{c} kept {kept} MiB after 2 rounds over {files_mib} MiB of files: {json}"
        );
    }
    b.assert_backing_empty();
}
