//! The `fileserver-*` workloads (after filebench's fileserver personality):
//! threads cycling over a fileset, each cycle deleting a file, creating it
//! again with 16 KiB, appending 4 KiB, reading it whole and stating it.
//! Run in-process with `std::fs`, so metadata and small data calls are
//! what is measured.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Files in the fileset.
pub const FILES: usize = 1000;
/// Size of a file as created.
const CREATE_BYTES: usize = 16 * 1024;
/// Size of an append.
const APPEND_BYTES: usize = 4 * 1024;
/// Operations in one cycle: delete, create+write, append, read, stat.
const OPS_PER_CYCLE: u64 = 5;

/// The result of one run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct FileserverResult {
    /// Operations done by all threads.
    pub ops: u64,
    /// Wall time of the measured part in seconds.
    pub secs: f64,
}

/// Creates the fileset in `dir/fsrv` (not timed), runs `threads` threads for
/// `runtime`, each on its own share of the files (so no two threads race on
/// one name), and removes the fileset.
pub fn fileserver(dir: &Path, threads: usize, runtime: Duration) -> Result<FileserverResult> {
    let d = dir.join("fsrv");
    if d.exists() {
        fs::remove_dir_all(&d).with_context(|| format!("removing stale {}", d.display()))?;
    }
    fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    let name = |i: usize| d.join(format!("f{i:05}"));
    let body = vec![b'f'; CREATE_BYTES];
    let run = || -> Result<FileserverResult> {
        for i in 0..FILES {
            fs::write(name(i), &body).with_context(|| format!("creating file {i}"))?;
        }
        let threads = threads.max(1);
        let start = Instant::now();
        let deadline = start + runtime;
        let ops = std::thread::scope(|s| -> Result<u64> {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let mine: Vec<PathBuf> = (t..FILES).step_by(threads).map(name).collect();
                    s.spawn(move || worker(&mine, t as u64, deadline))
                })
                .collect();
            let mut total = 0;
            for w in workers {
                total += w.join().expect("fileserver thread panicked")?;
            }
            Ok(total)
        })?;
        Ok(FileserverResult {
            ops,
            secs: start.elapsed().as_secs_f64(),
        })
    };
    let r = run();
    let cleanup = fs::remove_dir_all(&d);
    let r = r?;
    cleanup.with_context(|| format!("removing {}", d.display()))?;
    Ok(r)
}

/// One thread's cycles until `deadline`; returns its operations.
fn worker(files: &[PathBuf], seed: u64, deadline: Instant) -> Result<u64> {
    if files.is_empty() {
        return Ok(0);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let body = vec![b'c'; CREATE_BYTES];
    let tail = vec![b'a'; APPEND_BYTES];
    let mut buf = Vec::with_capacity(CREATE_BYTES + APPEND_BYTES);
    let mut ops = 0;
    while Instant::now() < deadline {
        let f = &files[rng.random_range(0..files.len())];
        fs::remove_file(f).with_context(|| format!("deleting {}", f.display()))?;
        fs::write(f, &body).with_context(|| format!("creating {}", f.display()))?;
        OpenOptions::new()
            .append(true)
            .open(f)
            .and_then(|mut h| h.write_all(&tail))
            .with_context(|| format!("appending to {}", f.display()))?;
        buf.clear();
        fs::File::open(f)
            .and_then(|mut h| h.read_to_end(&mut buf))
            .with_context(|| format!("reading {}", f.display()))?;
        anyhow::ensure!(
            buf.len() == CREATE_BYTES + APPEND_BYTES,
            "{} holds {} bytes after a create and an append",
            f.display(),
            buf.len()
        );
        fs::metadata(f).with_context(|| format!("stating {}", f.display()))?;
        ops += OPS_PER_CYCLE;
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let r = fileserver(t.path(), 3, Duration::from_millis(200)).unwrap();
        assert!(r.ops > 0 && r.ops.is_multiple_of(OPS_PER_CYCLE), "{r:?}");
        assert!(r.secs > 0.0);
        assert!(!t.path().join("fsrv").exists());
    }
}
