//! Running fio and reading its JSON report.
//!
//! Only `--output-format=json` output is read: fio's human-readable text
//! changes between versions, its JSON keys have not.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// Which file(s) a fio job works on, relative to the workload directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Files {
    /// All threads share one file of this name.
    Shared(String),
    /// Thread `i` works on `<prefix>.<i>`.
    PerThread(String),
    /// All threads write one new file of this name, N-1 strided (the PLFS
    /// checkpoint pattern): of N threads, thread `i` writes blocks `i`,
    /// `i + N`, `i + 2N`... until the file has its size.
    Strided(String),
    /// One thread works on [`FioJob::nrfiles`] files `<prefix>.0.<i>`, all
    /// open at once, each I/O on one picked at random; a time-based job
    /// first runs as long again unrecorded (a warm-up: caches filled, and
    /// under `mapfs run` each file adopted by the shim).
    Small(String),
}

/// One fio invocation: every parameter that differs between runs.
#[derive(Debug, Clone)]
pub struct FioJob {
    /// fio's `rw`: `read`, `write`, `randread` or `randwrite`.
    pub rw: &'static str,
    /// I/O size in bytes.
    pub bs: u64,
    /// Bytes per file (the file size).
    pub size: u64,
    /// Number of threads (fio `numjobs`).
    pub threads: usize,
    /// Files worked on.
    pub files: Files,
    /// Run for exactly this many seconds, looping over the file (random
    /// workloads); `None` = do `size` bytes once (sequential workloads).
    pub time_based: Option<u64>,
    /// Upper bound in seconds for a sequential job, so that one pathological
    /// configuration cannot stall the whole benchmark.
    pub runtime_cap: u64,
    /// Remove the files when the job ends (sequential writes create them).
    pub unlink: bool,
    /// Number of files of a [`Files::Small`] set (1 otherwise).
    pub nrfiles: u64,
}

impl FioJob {
    /// Whether the job writes (its figures are then in fio's `write` section).
    pub fn is_write(&self) -> bool {
        self.rw.contains("write")
    }

    /// fio's command-line arguments for running this job in `dir`.
    pub fn args(&self, name: &str, dir: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--output-format=json".into(),
            format!("--name={name}").into(),
            {
                let mut d = OsString::from("--directory=");
                d.push(dir.as_os_str());
                d
            },
            "--ioengine=psync".into(),
            format!("--bs={}", self.bs).into(),
            // `size` is each file's; fio's `--size` is the job's total.
            format!("--size={}", self.size * self.nrfiles.max(1)).into(),
            format!("--numjobs={}", self.threads).into(),
            // One summary over all threads, so that the latency percentiles
            // are those of the whole run rather than of one thread.
            "--group_reporting".into(),
            // A "new file" workload must grow the file by writing, and
            // fallocate is not what is measured.
            "--fallocate=none".into(),
            "--thread".into(),
            // We drop the page cache ourselves before every run. fio's own
            // page-cache calls (fadvise DONTNEED at open and again each time
            // a time-based job wraps around; fadvise RANDOM for random I/O)
            // reach the backing file natively but stop at the FUSE inode
            // under kernel passthrough, which made native random writes 3x
            // slower than passthrough and native random reads 20x slower
            // (measured). Off, every configuration gets the same policy.
            "--invalidate=0".into(),
            "--fadvise_hint=0".into(),
        ];
        match &self.files {
            Files::Shared(f) => a.push(format!("--filename={f}").into()),
            Files::PerThread(p) => a.push(format!("--filename_format={p}.$jobnum").into()),
            Files::Small(p) => {
                a.push(format!("--filename_format={p}.$jobnum.$filenum").into());
                a.push(format!("--nrfiles={}", self.nrfiles).into());
                a.push(format!("--openfiles={}", self.nrfiles).into());
                a.push("--file_service_type=random".into());
                if let Some(secs) = self.time_based {
                    a.push(format!("--ramp_time={secs}").into());
                }
            }
            Files::Strided(f) => {
                let n = self.threads.max(1) as u64;
                a.push(format!("--filename={f}").into());
                // Write one block, skip the other threads' blocks; thread
                // `i` starts at block `i` and writes its share of the size.
                a.push(format!("--rw={}:{}", self.rw, (n - 1) * self.bs).into());
                a.push(format!("--offset_increment={}", self.bs).into());
                a.push(format!("--io_size={}", (self.size / n / self.bs).max(1) * self.bs).into());
            }
        }
        if !matches!(self.files, Files::Strided(_)) {
            a.push(format!("--rw={}", self.rw).into());
        }
        match self.time_based {
            Some(secs) => {
                a.push("--time_based".into());
                a.push(format!("--runtime={secs}").into());
            }
            None => a.push(format!("--runtime={}", self.runtime_cap).into()),
        }
        if self.unlink {
            a.push("--unlink=1".into());
        }
        a
    }
}

/// The figures of one fio run, summed over its threads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FioResult {
    /// Throughput in bytes per second.
    pub bw_bytes: f64,
    /// Operations per second.
    pub iops: f64,
    /// Bytes transferred.
    pub io_bytes: u64,
    /// Run time in milliseconds (the longest thread).
    pub runtime_ms: u64,
    /// Median completion latency in nanoseconds.
    pub clat_p50_ns: Option<f64>,
    /// 99th percentile completion latency in nanoseconds.
    pub clat_p99_ns: Option<f64>,
}

/// Parses fio's `--output-format=json` report of a read (`write == false`)
/// or write job.
///
/// fio may print warnings before the JSON document, so parsing starts at the
/// first `{`. Several job entries (no `group_reporting`) are combined: rates
/// add up, the median is weighted by operation count, and the p99 is the
/// largest of the jobs' (an upper bound, not the exact combined p99).
pub fn parse(output: &str, write: bool) -> Result<FioResult> {
    let start = output.find('{').context("fio printed no JSON report")?;
    let mut stream = serde_json::Deserializer::from_str(&output[start..]).into_iter::<Value>();
    let doc = stream
        .next()
        .context("fio printed no JSON report")?
        .context("fio's JSON report does not parse")?;
    let jobs = doc
        .get("jobs")
        .and_then(Value::as_array)
        .context("fio's JSON report has no \"jobs\" array")?;
    if jobs.is_empty() {
        bail!("fio's JSON report lists no jobs");
    }
    let section = if write { "write" } else { "read" };
    let mut r = FioResult {
        bw_bytes: 0.0,
        iops: 0.0,
        io_bytes: 0,
        runtime_ms: 0,
        clat_p50_ns: None,
        clat_p99_ns: None,
    };
    let mut p50_weighted = 0.0;
    let mut p50_weight = 0.0;
    for job in jobs {
        let err = job.get("error").and_then(Value::as_i64).unwrap_or(0);
        if err != 0 {
            bail!(
                "fio job {} failed: {} (errno {err})",
                job.get("jobname").and_then(Value::as_str).unwrap_or("?"),
                std::io::Error::from_raw_os_error(err as i32)
            );
        }
        let s = job
            .get(section)
            .with_context(|| format!("fio job has no \"{section}\" section"))?;
        let num = |k: &str| s.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        r.bw_bytes += num("bw_bytes");
        r.iops += num("iops");
        r.io_bytes += num("io_bytes") as u64;
        r.runtime_ms = r.runtime_ms.max(num("runtime") as u64);
        let ios = num("total_ios");
        let pct = s.get("clat_ns").and_then(|c| c.get("percentile"));
        let p = |k: &str| pct.and_then(|p| p.get(k)).and_then(Value::as_f64);
        if let Some(p50) = p("50.000000") {
            p50_weighted += p50 * ios.max(1.0);
            p50_weight += ios.max(1.0);
        }
        if let Some(p99) = p("99.000000") {
            r.clat_p99_ns = Some(r.clat_p99_ns.map_or(p99, |m: f64| m.max(p99)));
        }
    }
    if p50_weight > 0.0 {
        r.clat_p50_ns = Some(p50_weighted / p50_weight);
    }
    if r.io_bytes == 0 {
        bail!("fio transferred no data ({section})");
    }
    Ok(r)
}

/// Checks that fio can be run, with an installation hint when it cannot.
pub fn check_installed() -> Result<String> {
    match std::process::Command::new("fio").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => bail!(
            "`fio --version` failed ({}); reinstall fio: apt-get install fio",
            o.status
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("fio is not installed; the data workloads need it: apt-get install fio")
        }
        Err(e) => Err(e).context("cannot run fio (apt-get install fio)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDREAD: &str = include_str!("testdata/fio-randread-2th.json");
    const SEQWRITE: &str = include_str!("testdata/fio-write-1th.json");

    /// The strided job, run by the real fio: 4 threads leave one file of
    /// exactly the size with no hole, so every block was written by some
    /// thread (a wrong stride or start leaves holes or a longer file).
    #[test]
    fn strided_job_fills_one_file_without_holes() {
        if check_installed().is_err() {
            eprintln!("SKIPPED: fio is not installed; the strided fio job was not run");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let job = FioJob {
            rw: "write",
            bs: 4096,
            size: 1 << 20,
            threads: 4,
            files: Files::Strided("n1.0".into()),
            time_based: None,
            runtime_cap: 60,
            unlink: false,
            nrfiles: 1,
        };
        let out = std::process::Command::new("fio")
            .args(job.args("strided", dir.path()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = parse(&String::from_utf8_lossy(&out.stdout), true).unwrap();
        assert_eq!(r.io_bytes, 1 << 20);
        let f = std::fs::File::open(dir.path().join("n1.0")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        let hole = rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(0)).unwrap();
        assert_eq!(hole, 1 << 20, "a block no thread wrote");
    }

    #[test]
    fn parses_fixture_read() {
        let r = parse(RANDREAD, false).unwrap();
        assert!(r.bw_bytes > 0.0 && r.iops > 0.0 && r.io_bytes > 0);
        // bw = io_bytes / runtime, as fio computes it.
        let expect = r.io_bytes as f64 / (r.runtime_ms as f64 / 1000.0);
        assert!((r.bw_bytes - expect).abs() / expect < 0.01, "{r:?}");
        let (p50, p99) = (r.clat_p50_ns.unwrap(), r.clat_p99_ns.unwrap());
        assert!(p50 > 0.0 && p99 >= p50, "{r:?}");
        // The read fixture has no write figures.
        assert!(parse(RANDREAD, true).is_err());
    }

    #[test]
    fn parses_fixture_write_with_leading_noise() {
        let noisy = format!("fio: some warning\n{SEQWRITE}");
        let r = parse(&noisy, true).unwrap();
        assert_eq!(r, parse(SEQWRITE, true).unwrap());
        assert_eq!(r.io_bytes, 4 << 20);
    }

    #[test]
    fn combines_several_jobs() {
        let doc = r#"{"jobs":[
          {"jobname":"a","error":0,"read":{"bw_bytes":100,"iops":10,"io_bytes":1000,"runtime":10,"total_ios":10,
            "clat_ns":{"percentile":{"50.000000":100,"99.000000":500}}}},
          {"jobname":"b","error":0,"read":{"bw_bytes":300,"iops":30,"io_bytes":3000,"runtime":12,"total_ios":30,
            "clat_ns":{"percentile":{"50.000000":200,"99.000000":400}}}}]}"#;
        let r = parse(doc, false).unwrap();
        assert_eq!(r.bw_bytes, 400.0);
        assert_eq!(r.iops, 40.0);
        assert_eq!(r.io_bytes, 4000);
        assert_eq!(r.runtime_ms, 12);
        assert_eq!(r.clat_p50_ns, Some(175.0));
        assert_eq!(r.clat_p99_ns, Some(500.0));
    }

    #[test]
    fn reports_job_errors_and_garbage() {
        let doc = r#"{"jobs":[{"jobname":"a","error":28,"read":{}}]}"#;
        let e = parse(doc, false).unwrap_err().to_string();
        assert!(e.contains("errno 28"), "{e}");
        assert!(parse("no json here", false).is_err());
        assert!(parse("{\"jobs\": []}", false).is_err());
        assert!(parse("{\"jobs\": [", false).is_err());
    }

    #[test]
    fn args_for_a_set_of_small_files() {
        let job = FioJob {
            rw: "randread",
            bs: 4096,
            size: 4096,
            threads: 1,
            files: Files::Small("sm".into()),
            time_based: Some(5),
            runtime_cap: 60,
            unlink: true,
            nrfiles: 2000,
        };
        let a: Vec<String> = job
            .args("w", Path::new("/d"))
            .into_iter()
            .map(|x| x.into_string().unwrap())
            .collect();
        for want in [
            "--filename_format=sm.$jobnum.$filenum",
            "--nrfiles=2000",
            "--openfiles=2000",
            "--file_service_type=random",
            "--size=8192000",
            "--ramp_time=5",
            "--runtime=5",
            "--unlink=1",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
    }

    #[test]
    fn args_for_shared_and_per_thread_files() {
        let mut job = FioJob {
            rw: "randread",
            bs: 4096,
            size: 1 << 20,
            threads: 4,
            files: Files::Shared("rd.0".into()),
            time_based: Some(5),
            runtime_cap: 60,
            unlink: false,
            nrfiles: 1,
        };
        let s = |a: Vec<OsString>| {
            a.into_iter()
                .map(|x| x.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        let a = s(job.args("w", Path::new("/d")));
        for want in [
            "--filename=rd.0",
            "--time_based",
            "--runtime=5",
            "--numjobs=4",
            "--bs=4096",
            "--directory=/d",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing in {a:?}");
        }
        job.files = Files::PerThread("wr".into());
        job.time_based = None;
        job.unlink = true;
        let a = s(job.args("w", Path::new("/d")));
        assert!(a.iter().any(|x| x == "--filename_format=wr.$jobnum"));
        assert!(a.iter().any(|x| x == "--runtime=60"));
        assert!(!a.iter().any(|x| x == "--time_based"));
        assert!(a.iter().any(|x| x == "--unlink=1"));
    }
}
