//! The in-process workloads, run with std::fs: `create-stat-unlink`,
//! `small-files` and `overwrite`.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::workloads::{META_PHASES, OVERWRITE_PHASE, SMALL_PHASES};

/// The figures of one phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseResult {
    /// `create`, `stat` or `unlink`.
    pub phase: String,
    /// Operations done.
    pub ops: u64,
    /// Wall time of the phase in seconds.
    pub secs: f64,
    /// Median latency of one operation in nanoseconds.
    pub lat_p50_ns: f64,
    /// 99th percentile latency of one operation in nanoseconds.
    pub lat_p99_ns: f64,
}

impl PhaseResult {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// The value at quantile `q` (0..=1) of `sorted` (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_nanos() as f64
}

fn phase(
    name: &str,
    files: usize,
    mut op: impl FnMut(usize) -> std::io::Result<()>,
) -> Result<PhaseResult> {
    let mut lat = Vec::with_capacity(files);
    let start = Instant::now();
    for i in 0..files {
        let t = Instant::now();
        op(i).with_context(|| format!("{name} of file {i}"))?;
        lat.push(t.elapsed());
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    Ok(PhaseResult {
        phase: name.to_string(),
        ops: files as u64,
        secs,
        lat_p50_ns: quantile(&lat, 0.5),
        lat_p99_ns: quantile(&lat, 0.99),
    })
}

/// Creates `files` empty files in a fresh directory `dir/csu`, stats them
/// and unlinks them, timing each phase. The directory is removed afterwards,
/// also after a failure.
pub fn create_stat_unlink(dir: &Path, files: usize) -> Result<Vec<PhaseResult>> {
    let d = dir.join("csu");
    if d.exists() {
        fs::remove_dir_all(&d).with_context(|| format!("removing stale {}", d.display()))?;
    }
    fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
    let name = |i: usize| d.join(format!("f{i:06}"));
    let run = || -> Result<Vec<PhaseResult>> {
        let create = phase(META_PHASES[0], files, |i| {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(name(i))
                .map(drop)
        })?;
        let stat = phase(META_PHASES[1], files, |i| fs::metadata(name(i)).map(drop))?;
        let unlink = phase(META_PHASES[2], files, |i| fs::remove_file(name(i)))?;
        Ok(vec![create, stat, unlink])
    };
    let r = run();
    let cleanup = fs::remove_dir_all(&d);
    let r = r?;
    cleanup.with_context(|| format!("removing {}", d.display()))?;
    Ok(r)
}

/// Bytes of each `small-files` file.
pub const SMALL_FILE_BYTES: usize = 4096;

/// Files per directory of `small-files`.
const SMALL_PER_DIR: usize = 1000;

/// The tree small-files makes in its directory.
pub const SMALL_TREE: &str = "sf";

/// Bytes of each of `small-files`' large files.
pub const LARGE_FILE_BYTES: usize = 1 << 20;

/// One large file of `small-files` for every this many small ones (the
/// workload list's 1,000 of 1 MiB beside 100,000 of 4 KiB).
pub const SMALL_PER_LARGE: usize = 100;

/// Where `small-files` puts its large files, inside [`SMALL_TREE`].
const LARGE_DIR: &str = "large";

/// The number of large files of a `small-files` run of `files`.
pub fn large_files(files: usize) -> usize {
    files.div_ceil(SMALL_PER_LARGE)
}

/// Writes `files` files of [`SMALL_FILE_BYTES`] in directories of 1,000
/// under a fresh `dir/sf`, then reads each back whole, checking its bytes;
/// then the same for [`large_files`] files of [`LARGE_FILE_BYTES`], which
/// are removed afterwards (untimed). The small files are left for the
/// caller to measure what they took and remove ([`SMALL_TREE`]); the tree
/// is removed after a failure.
pub fn small_files(dir: &Path, files: usize) -> Result<Vec<PhaseResult>> {
    let d = dir.join(SMALL_TREE);
    if d.exists() {
        fs::remove_dir_all(&d).with_context(|| format!("removing stale {}", d.display()))?;
    }
    for k in 0..files.div_ceil(SMALL_PER_DIR) {
        let sub = d.join(format!("d{k:03}"));
        fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
    }
    let large_dir = d.join(LARGE_DIR);
    fs::create_dir_all(&large_dir).with_context(|| format!("creating {}", large_dir.display()))?;
    let name = |i: usize| d.join(format!("d{:03}/f{i:06}", i / SMALL_PER_DIR));
    // Each file's bytes differ, so that a read of the wrong file is caught.
    let body = |i: usize| -> Vec<u8> {
        (0..SMALL_FILE_BYTES)
            .map(|j| (j as u8).wrapping_mul(31) ^ (i as u8))
            .collect()
    };
    // A large file is one pattern stamped with its number at both ends
    // (made once: generating a MiB per file would be most of the phase).
    let mut large: Vec<u8> = (0..LARGE_FILE_BYTES)
        .map(|j| (j as u8).wrapping_mul(29) ^ (j >> 12) as u8)
        .collect();
    let stamp = |buf: &mut [u8], i: usize| {
        let n = buf.len();
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        buf[n - 8..].copy_from_slice(&(i as u64).to_le_bytes());
    };
    let large_name = |i: usize| large_dir.join(format!("l{i:05}"));
    let n_large = large_files(files);
    let mut run = || -> Result<Vec<PhaseResult>> {
        let write = phase(SMALL_PHASES[0], files, |i| fs::write(name(i), body(i)))?;
        let read = phase(SMALL_PHASES[1], files, |i| {
            let got = fs::read(name(i))?;
            if got != body(i) {
                return Err(std::io::Error::other("read back other bytes than written"));
            }
            Ok(())
        })?;
        let write_large = phase(SMALL_PHASES[2], n_large, |i| {
            stamp(&mut large, i);
            fs::write(large_name(i), &large)
        })?;
        let read_large = phase(SMALL_PHASES[3], n_large, |i| {
            let got = fs::read(large_name(i))?;
            stamp(&mut large, i);
            if got != large {
                return Err(std::io::Error::other("read back other bytes than written"));
            }
            Ok(())
        })?;
        fs::remove_dir_all(&large_dir)
            .with_context(|| format!("removing {}", large_dir.display()))?;
        Ok(vec![write, read, write_large, read_large])
    };
    let r = run();
    if r.is_err() {
        let _ = fs::remove_dir_all(&d);
    }
    r
}

/// The tree `overwrite` makes in its directory (removed at its end).
pub const OVERWRITE_TREE: &str = "ow";

/// Smallest and largest file of `overwrite` (2 KiB and 1 MiB).
const OVERWRITE_SIZES: (f64, f64) = (2048.0, 1_048_576.0);

/// The size of `overwrite`'s file `i`: log-uniform between
/// [`OVERWRITE_SIZES`], the same for every run and configuration.
pub fn overwrite_size(i: usize) -> usize {
    // splitmix64 of the index: a fixed, well-spread sequence.
    let mut z = (i as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
    let (lo, hi) = OVERWRITE_SIZES;
    (lo * (hi / lo).powf(u)) as usize
}

/// The bytes of `overwrite`'s file `i` in round `round` (round 0 is the
/// first content, before the timed rounds): different in every round, so
/// each rewrite changes the whole file.
fn overwrite_body(i: usize, round: usize) -> Vec<u8> {
    let seed = (i as u8).wrapping_mul(7) ^ (round as u8).wrapping_mul(101);
    (0..overwrite_size(i))
        .map(|j| (j as u8).wrapping_mul(13).wrapping_add(seed) ^ (j >> 12) as u8)
        .collect()
}

/// `overwrite` (the workload list's: files of 2 KiB-1 MiB rewritten again
/// and again): writes `files` files in a fresh `dir/ow`, then, timed,
/// rewrites every file `rounds` times (open with `O_TRUNC`, write it whole,
/// close) and syncs the file system, so what a file system writes for a
/// rewrite (versions: the old bytes it keeps) is paid for. Checks the last
/// round's bytes, then removes the tree (also after a failure). One phase,
/// [`OVERWRITE_PHASE`], whose "operations" are the bytes rewritten.
pub fn overwrite(dir: &Path, files: usize, rounds: usize) -> Result<Vec<PhaseResult>> {
    let d = dir.join(OVERWRITE_TREE);
    if d.exists() {
        fs::remove_dir_all(&d).with_context(|| format!("removing stale {}", d.display()))?;
    }
    fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
    let name = |i: usize| d.join(format!("f{i:05}"));
    let run = || -> Result<PhaseResult> {
        for i in 0..files {
            fs::write(name(i), overwrite_body(i, 0))
                .with_context(|| format!("writing file {i}"))?;
        }
        rustix::fs::syncfs(fs::File::open(&d)?)?;
        let bytes: u64 = (0..files).map(|i| overwrite_size(i) as u64).sum();
        let mut lat = Vec::with_capacity(files * rounds);
        let start = Instant::now();
        for round in 1..=rounds {
            for i in 0..files {
                let t = Instant::now();
                fs::write(name(i), overwrite_body(i, round))
                    .with_context(|| format!("round {round}: rewriting file {i}"))?;
                lat.push(t.elapsed());
            }
        }
        rustix::fs::syncfs(fs::File::open(&d)?)?;
        let secs = start.elapsed().as_secs_f64();
        for i in 0..files {
            let got = fs::read(name(i))?;
            if got != overwrite_body(i, rounds) {
                // Which content it holds says where it went wrong.
                let was = (0..rounds)
                    .rev()
                    .find(|r| got == overwrite_body(i, *r))
                    .map_or_else(
                        || "none of its rewrites".to_string(),
                        |r| format!("round {r}'s"),
                    );
                anyhow::bail!(
                    "file {i} reads back other bytes than its last rewrite: {} bytes of {} \
                     ({was} content; the first differs at byte {})",
                    got.len(),
                    overwrite_size(i),
                    got.iter()
                        .zip(overwrite_body(i, rounds))
                        .position(|(a, b)| *a != b)
                        .unwrap_or(got.len().min(overwrite_size(i)))
                );
            }
        }
        lat.sort_unstable();
        Ok(PhaseResult {
            phase: OVERWRITE_PHASE.to_string(),
            ops: bytes * rounds as u64,
            secs,
            lat_p50_ns: quantile(&lat, 0.5),
            lat_p99_ns: quantile(&lat, 0.99),
        })
    };
    let r = run();
    let cleanup = fs::remove_dir_all(&d);
    let r = r?;
    cleanup.with_context(|| format!("removing {}", d.display()))?;
    Ok(vec![r])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_all_phases_and_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let r = create_stat_unlink(t.path(), 50).unwrap();
        let phases: Vec<_> = r.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(phases, META_PHASES);
        for p in &r {
            assert_eq!(p.ops, 50);
            assert!(p.ops_per_sec() > 0.0 && p.lat_p99_ns >= p.lat_p50_ns);
        }
        assert!(!t.path().join("csu").exists());
    }

    #[test]
    fn small_files_runs_every_phase_and_leaves_the_small_files() {
        let t = tempfile::tempdir().unwrap();
        let r = small_files(t.path(), 1201).unwrap();
        let phases: Vec<_> = r.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(phases, SMALL_PHASES);
        let ops: Vec<u64> = r.iter().map(|p| p.ops).collect();
        assert_eq!(ops, [1201, 1201, 13, 13]);
        // Left for the caller to measure: two directories of small files;
        // the large ones are gone.
        let n: usize = std::fs::read_dir(t.path().join(SMALL_TREE))
            .unwrap()
            .map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count())
            .sum();
        assert_eq!(n, 1201);
    }

    #[test]
    fn overwrite_rewrites_every_file_and_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let r = overwrite(t.path(), 20, 2).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].phase, OVERWRITE_PHASE);
        let bytes: u64 = (0..20).map(|i| overwrite_size(i) as u64).sum();
        assert_eq!(r[0].ops, 2 * bytes);
        assert!(!t.path().join(OVERWRITE_TREE).exists());
        let sizes: Vec<usize> = (0..1000).map(overwrite_size).collect();
        assert!(sizes.iter().all(|s| (2048..=1_048_576).contains(s)));
        // Log-uniform: about half the files under 46 KiB (the geometric mean).
        let small = sizes.iter().filter(|s| **s < 46_341).count();
        assert!((400..600).contains(&small), "{small} of 1000 under 46 KiB");
        assert_ne!(overwrite_body(3, 1), overwrite_body(3, 2));
    }

    #[test]
    fn quantiles_nearest_rank() {
        let v: Vec<_> = (1..=100).map(Duration::from_nanos).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v[..1], 0.99), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
