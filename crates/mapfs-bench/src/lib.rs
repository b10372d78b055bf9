//! `mapfs bench`: the data workloads (fio) and `create-stat-unlink` of
//! docs/workloads.md on every configuration, with ratios to native.
//!
//! One backing directory is shared by all configurations (they show the same
//! files), so read files are preallocated once, natively. All configurations
//! are set up before the first run and runs are interleaved (for each cell,
//! run r goes through every configuration in turn) so that slow drift of the
//! machine does not favour one configuration.
//!
//! The `mapfs` binary runs it as `mapfs bench` ([`BenchArgs`], [`run`]); it
//! mounts with that binary (the running executable), so it is no library
//! for other programs.

#![warn(missing_docs)]

mod config;
mod fileserver;
mod fio;
mod hosts;
mod meta;
mod process;
mod procs;
mod report;
mod stats;
mod workloads;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal as _;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use config::{ConfigDef, Prepared, CONFIGS};
use report::{Record, Table};
use workloads::{FileSet, Kind, Workload, OVERWRITE_FILES, OVERWRITE_ROUNDS, QUICK, WORKLOADS};

/// Run the benchmark workloads on native, mapfs (daemon and passthrough data
/// modes) and bindfs, and report throughput, latency and ratios to native.
///
/// Needs root (to drop the page cache and mount) and fio (apt-get install
/// fio). Examples:
///
///   mapfs bench --quick
///
///   mapfs bench --size 256M --runs 3 --out bench-results
///
///   mapfs bench --workloads 'seq-*' --bs 4k,1m --configs native,passthrough
#[derive(clap::Args, Debug, Clone, Default)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Size of each file the data workloads read or write (e.g. 256M, 1G)
    /// [default: 256M; 32M with --quick]
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// N, the thread count of the *-Nth-* workloads [default: 4]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Seconds per run of the random workloads (sequential ones do --size
    /// bytes) [default: 5; 2 with --quick]
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u64>,

    /// I/O sizes, comma-separated [default: 4k,32k,128k,1m; 4k,1m with --quick]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub bs: Option<Vec<String>>,

    /// Workloads to run: names or globs, comma-separated (see --list)
    /// [default: all; a subset with --quick]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub workloads: Option<Vec<String>>,

    /// Configurations to run, comma-separated (see --list) [default: all]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub configs: Option<Vec<String>>,

    /// Runs per figure; tables show the median and the spread
    /// [default: 3; 1 with --quick]
    #[arg(long, value_name = "R")]
    pub runs: Option<usize>,

    /// Number of files of create-stat-unlink [default: 10000; 2000 with --quick]
    #[arg(long, value_name = "N")]
    pub files: Option<usize>,

    /// Files of overwrite [default: 1000; 100 with --quick]
    #[arg(long, value_name = "N")]
    pub overwrite_files: Option<usize>,

    /// Rewrites of every file of overwrite [default: 10; 3 with --quick]
    #[arg(long, value_name = "R")]
    pub rounds: Option<usize>,

    /// Backing directory; the benchmark works in a temporary subdirectory
    /// of it [default: a temporary directory in /var/tmp, or in the current
    /// directory when /var/tmp is tmpfs]
    #[arg(long, value_name = "DIR")]
    pub backing: Option<PathBuf>,

    /// Write results.json, results.md and one SVG chart per workload here
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// A demo-sized run (a few minutes on 2 cores): small files, one run, two I/O sizes,
    /// a subset of the workloads; explicit flags still win
    #[arg(long)]
    pub quick: bool,

    /// List the workloads and configurations and exit
    #[arg(long)]
    pub list: bool,

    /// Instead of the suite: checkpoint writes from two hosts, A and B, two
    /// mounts of one shared store (`scripts/gluster.sh start` prints a
    /// GlusterFS volume's): N-1 strided and N-N with --threads writers
    /// split across the hosts, on the store directly, through a plfs mount
    /// per host, and under `mapfs run` [defaults here: --size 16M, --bs
    /// 4k,64k]
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 1)]
    pub hosts: Option<Vec<PathBuf>>,

    /// The mapfs executable used to mount [default: this executable]
    #[arg(long, value_name = "PATH", hide = true)]
    pub mapfs_exe: Option<PathBuf>,

    /// Internal: run create-stat-unlink in DIR and print its JSON (used to
    /// run the loop under a configuration's command prefix)
    #[arg(long, value_name = "DIR", hide = true)]
    pub meta_worker: Option<PathBuf>,

    /// Internal: run small-files in DIR and print its JSON
    #[arg(long, value_name = "DIR", hide = true)]
    pub small_files_worker: Option<PathBuf>,

    /// Internal: run overwrite in DIR and print its JSON
    #[arg(long, value_name = "DIR", hide = true)]
    pub overwrite_worker: Option<PathBuf>,

    /// Internal: run a fileserver workload of N threads in DIR (with
    /// `--fileserver-dir`) and print its JSON
    #[arg(long, value_name = "N", hide = true)]
    pub fileserver_worker: Option<usize>,

    /// Internal: the directory of `--fileserver-worker`
    #[arg(long, value_name = "DIR", hide = true)]
    pub fileserver_dir: Option<PathBuf>,
}

/// Parses a size such as `4k`, `256M`, `1G` or `512` ([`mapfs::size::parse`],
/// the parser of every mapfs size); zero is refused.
pub fn parse_size(s: &str) -> Result<u64> {
    let n = mapfs::size::parse(s).map_err(|e| anyhow::anyhow!("{e} (examples: 4k, 256M, 1G)"))?;
    if n == 0 {
        bail!("size {s:?} must not be zero");
    }
    Ok(n)
}

/// An I/O size as a column label (`4k`, `1m`), which [`parse_size`] reads
/// back (byte counts for people are [`mapfs::size::human`]).
pub fn fmt_size(n: u64) -> String {
    for (shift, u) in [(30, "g"), (20, "m"), (10, "k")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{u}", n >> shift);
        }
    }
    n.to_string()
}

/// Every parameter, defaults resolved.
#[derive(Debug, Clone, Serialize)]
struct Params {
    size: u64,
    threads: usize,
    runtime: u64,
    seq_runtime_cap: u64,
    bs: Vec<u64>,
    runs: usize,
    files: usize,
    overwrite_files: usize,
    rounds: usize,
    quick: bool,
    workloads: Vec<String>,
    configs: Vec<String>,
}

fn resolve(a: &BenchArgs) -> Result<(Params, Vec<Workload>, Vec<ConfigDef>)> {
    let q = a.quick;
    let size = parse_size(a.size.as_deref().unwrap_or(if q { "32M" } else { "256M" }))?;
    let threads = a.threads.unwrap_or(4);
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let runtime = a.runtime.unwrap_or(if q { 2 } else { 5 }).max(1);
    let default_bs: &[&str] = if q {
        &["4k", "1m"]
    } else {
        &["4k", "32k", "128k", "1m"]
    };
    let bs = match &a.bs {
        Some(v) => v
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<Vec<_>>>()?,
        None => default_bs
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<Vec<_>>>()?,
    };
    if let Some(b) = bs.iter().find(|b| **b > size) {
        bail!(
            "I/O size {} is larger than --size {}",
            fmt_size(*b),
            fmt_size(size)
        );
    }
    let runs = a.runs.unwrap_or(if q { 1 } else { 3 });
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let files = a.files.unwrap_or(if q { 2000 } else { 10_000 });
    let overwrite_files = a
        .overwrite_files
        .unwrap_or(if q { 100 } else { OVERWRITE_FILES });
    let rounds = a.rounds.unwrap_or(if q { 3 } else { OVERWRITE_ROUNDS });
    if overwrite_files == 0 || rounds == 0 {
        bail!("--overwrite-files and --rounds must be at least 1");
    }
    let wl = match &a.workloads {
        Some(p) => workloads::select(p)?,
        None if q => workloads::select(&QUICK.iter().map(|s| s.to_string()).collect::<Vec<_>>())?,
        None => WORKLOADS.to_vec(),
    };
    let cf = match &a.configs {
        Some(n) => config::select(n)?,
        None => CONFIGS.to_vec(),
    };
    let params = Params {
        size,
        threads,
        runtime,
        // Sequential jobs do --size bytes; the cap only stops a pathological
        // configuration from stalling everything.
        seq_runtime_cap: (runtime * 12).max(120),
        bs,
        runs,
        files,
        overwrite_files,
        rounds,
        quick: q,
        workloads: wl.iter().map(|w| w.name.to_string()).collect(),
        configs: cf.iter().map(|c| c.name.to_string()).collect(),
    };
    Ok((params, wl, cf))
}

fn print_list() {
    println!("Workloads (N = --threads):");
    for w in WORKLOADS {
        println!("  {:<20} {}", w.name, w.about);
    }
    println!("\nConfigurations:");
    for c in CONFIGS {
        println!("  {:<20} {}", c.name, c.about);
    }
}

/// The configurations of run `run`, in table order on even runs and reversed
/// on odd ones: whatever the previous run leaves behind (writeback still
/// draining, a warmer CPU) does not always fall on the same configuration.
fn round_order<T>(ready: &[T], run: usize) -> Box<dyn Iterator<Item = &T> + '_> {
    if run.is_multiple_of(2) {
        Box::new(ready.iter())
    } else {
        Box::new(ready.iter().rev())
    }
}

/// Flushes dirty data and, when allowed, drops the page cache so that reads
/// come from the device, not from memory left by the previous run. Only
/// the page cache (`1`): dropping every dentry and inode of the machine too
/// (`3`) would also empty the kernel caches of every FUSE mount on it,
/// which other programs (and tests of `--exclusive` caching) rely on.
struct Settler {
    drop_caches: bool,
}

impl Settler {
    fn new() -> Settler {
        rustix::fs::sync();
        let drop_caches = std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok();
        if !drop_caches {
            eprintln!(
                "mapfs bench: WARNING: cannot write /proc/sys/vm/drop_caches (not root?); \
                 read figures will include page-cache hits"
            );
        }
        Settler { drop_caches }
    }

    fn settle(&self) {
        rustix::fs::sync();
        if self.drop_caches {
            let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
        }
    }
}

/// The backing directory: the user's, or a temporary one off tmpfs.
fn backing_dir(arg: &Option<PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(p) = arg {
        if !p.is_dir() {
            bail!("--backing {} is not a directory", p.display());
        }
        return Ok((p.canonicalize()?, None));
    }
    let is_tmpfs = |p: &Path| rustix::fs::statfs(p).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC);
    let parent = if Path::new("/var/tmp").is_dir() && !is_tmpfs(Path::new("/var/tmp")) {
        PathBuf::from("/var/tmp")
    } else {
        std::env::current_dir()?
    };
    if is_tmpfs(&parent) {
        eprintln!(
            "mapfs bench: note: {} is tmpfs; pass --backing DIR for a disk file system",
            parent.display()
        );
    }
    let t = tempfile::Builder::new()
        .prefix("mapfs-bench-backing.")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a backing directory in {}", parent.display()))?;
    Ok((t.path().canonicalize()?, Some(t)))
}

/// Set by SIGINT/SIGTERM/SIGHUP: stop after the current run and unmount,
/// rather than die and leave mounts behind.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

fn catch_interrupts() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe, and no other code of the process installs
        // handlers for these signals.
        let _ = unsafe { sigaction(sig, &act) };
    }
}

/// Writes `size` bytes of non-zero data to `path` and syncs it.
fn preallocate(path: &Path, size: u64) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    // A cheap xorshift fill: not all-zero, so no layer can short-cut it.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Status of one configuration, for the JSON report.
#[derive(Debug, Serialize)]
struct ConfigStatus {
    name: String,
    about: String,
    error: Option<String>,
}

/// The whole JSON report.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    tool: &'static str,
    version: &'static str,
    started_unix: u64,
    kernel: String,
    cpus: usize,
    fio: Option<String>,
    backing: String,
    page_cache_dropped: bool,
    params: &'a Params,
    configs: &'a [ConfigStatus],
    tables: &'a [Table],
    records: &'a [Record],
}

/// Runs one fio job on a configuration and turns its report into a record.
fn run_fio(p: &Prepared, dir: &Path, w: &Workload, job: &fio::FioJob) -> Result<fio::FioResult> {
    let mut cmd = p.command("fio");
    cmd.args(job.args(w.name, dir));
    let limit = job.time_based.unwrap_or(job.runtime_cap) + 120;
    let out = process::run(cmd, Duration::from_secs(limit));
    if let fio::Files::Strided(f) = &job.files {
        // Not fio's --unlink: each thread would remove the shared file when
        // it is done, under threads still to open it. Removed by `rm` under
        // the configuration's prefix (an embedded directory exists only
        // there).
        let mut rm = p.command("rm");
        rm.arg("-f").arg(dir.join(f));
        process::run(rm, Duration::from_secs(120))?;
    }
    let out = out?;
    match fio::parse(&out.stdout, job.is_write()) {
        Ok(r) if out.status.success() => Ok(r),
        Ok(_) => bail!("fio exited with {}: {}", out.status, out.error_line()),
        Err(_) if !out.status.success() => {
            bail!("fio exited with {}: {}", out.status, out.error_line())
        }
        Err(e) => Err(e),
    }
}

/// The I/O sizes a data workload runs: `--bs`, or the one size of its
/// small files.
fn data_sizes(w: &Workload, bs: &[u64]) -> Vec<u64> {
    if w.is_small() {
        vec![workloads::SMALL_FILE]
    } else {
        bs.to_vec()
    }
}

/// The number of small files to open at once for `--files files`: within
/// a quarter of the descriptor limit (raised to its hard limit here, and
/// inherited by fio), since under `mapfs run` each adopted file may hold a
/// second descriptor, and the daemon needs its own.
fn small_count(files: usize) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if let Some(hard) = lim.maximum {
        lim.current = Some(hard);
        let _ = setrlimit(Resource::Nofile, lim);
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let cap = (soft / 4).max(1);
    let n = (files as u64).min(cap);
    if n < files as u64 {
        eprintln!(
            "mapfs bench: rnd-rd-small-files: {n} files, not {files}: the descriptor limit is {soft}"
        );
    }
    n
}

/// A [`Files::Small`](fio::Files::Small) job: writes its files through the
/// configuration (untimed), then runs the timed job, which removes them.
fn run_small_fio(
    p: &Prepared,
    dir: &Path,
    w: &Workload,
    job: &fio::FioJob,
) -> Result<fio::FioResult> {
    let write = fio::FioJob {
        rw: "write",
        time_based: None,
        unlink: false,
        ..job.clone()
    };
    run_fio(p, dir, w, &write).context("writing the small files")?;
    run_fio(
        p,
        dir,
        w,
        &fio::FioJob {
            unlink: true,
            ..job.clone()
        },
    )
}

/// Inodes and bytes allocated under `dir` (itself included; nothing if
/// it does not exist), as `du` counts them: hard links once.
fn used_space(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = (0u64, 0u64);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        total.0 += 1;
        total.1 += m.blocks() * 512;
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                todo.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Runs a phased in-process workload (create-stat-unlink, small-files,
/// overwrite) on a configuration: in-process when there is no command
/// prefix, else as `PREFIX mapfs bench --meta-worker DIR`
/// (`--small-files-worker`, `--overwrite-worker`).
fn run_meta(
    p: &Prepared,
    dir: &Path,
    params: &Params,
    mapfs: &Path,
    kind: Kind,
) -> Result<Vec<meta::PhaseResult>> {
    if p.prefix.is_empty() {
        return match kind {
            Kind::SmallFiles => meta::small_files(dir, params.files),
            Kind::Overwrite => meta::overwrite(dir, params.overwrite_files, params.rounds),
            _ => meta::create_stat_unlink(dir, params.files),
        };
    }
    let mut args: Vec<OsString> = match kind {
        Kind::SmallFiles => vec!["--small-files-worker".into()],
        Kind::Overwrite => vec!["--overwrite-worker".into()],
        _ => vec!["--meta-worker".into()],
    };
    args.push(dir.into());
    args.extend(
        [
            "--files".to_string(),
            params.files.to_string(),
            "--overwrite-files".to_string(),
            params.overwrite_files.to_string(),
            "--rounds".to_string(),
            params.rounds.to_string(),
        ]
        .map(OsString::from),
    );
    run_worker(p, mapfs, &args, Duration::from_secs(1800), "in-process")
}

/// Runs `PREFIX mapfs bench ARGS` (an in-process workload's worker under the
/// configuration's command prefix) and parses the JSON it prints.
fn run_worker<T: serde::de::DeserializeOwned>(
    p: &Prepared,
    mapfs: &Path,
    args: &[OsString],
    limit: Duration,
    what: &str,
) -> Result<T> {
    let mut cmd = p.command(mapfs);
    cmd.arg("bench").args(args);
    let out = process::run(cmd, limit)?;
    if !out.status.success() {
        bail!(
            "{} exited with {}: {}",
            mapfs.display(),
            out.status,
            out.error_line()
        );
    }
    serde_json::from_str(out.stdout.trim())
        .with_context(|| format!("parsing the {what} worker's output"))
}

/// Where a run stands: a bar on a terminal; elsewhere (a CI log, `2>file`)
/// one line per unit as it starts, since a bar is drawn only on a terminal
/// and a run of several minutes would otherwise print nothing at all.
struct Progress {
    bar: Option<ProgressBar>,
    len: u64,
    done: AtomicU64,
    start: Instant,
}

impl Progress {
    fn new(len: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} [{elapsed_precise} eta {eta}] {msg}",
                )
                .expect("valid progress template"),
            );
            pb
        });
        Progress {
            bar,
            len,
            done: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// The unit starting now.
    fn set_message(&self, msg: String) {
        match &self.bar {
            Some(pb) => pb.set_message(msg),
            None => {
                let secs = self.start.elapsed().as_secs();
                eprintln!(
                    "mapfs bench: {}/{} [{}:{:02}] {msg}",
                    self.done.load(Ordering::Relaxed) + 1,
                    self.len,
                    secs / 60,
                    secs % 60
                );
            }
        }
    }

    /// A unit finished.
    fn inc(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        if let Some(pb) = &self.bar {
            pb.inc(n);
        }
    }

    /// Runs `f` (which prints) with the bar out of the way.
    fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(pb) => pb.suspend(f),
            None => f(),
        }
    }

    fn finish_and_clear(&self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
    }
}

/// Before one run of a workload on a configuration: says so on the progress
/// bar and lets the machine settle; false once interrupted.
fn begin_unit(
    pb: &Progress,
    settler: &Settler,
    workload: &str,
    run: usize,
    runs: usize,
    config: &str,
) -> bool {
    if interrupted() {
        return false;
    }
    pb.set_message(format!("{workload} run {}/{runs} {config}", run + 1));
    settler.settle();
    true
}

/// Runs a fileserver workload on a configuration: in-process when there is
/// no command prefix, else as `PREFIX mapfs bench --fileserver-worker N`.
fn run_fileserver(
    p: &Prepared,
    dir: &Path,
    threads: usize,
    runtime: u64,
    mapfs: &Path,
) -> Result<fileserver::FileserverResult> {
    if p.prefix.is_empty() {
        return fileserver::fileserver(dir, threads, Duration::from_secs(runtime));
    }
    let args = [
        OsString::from("--fileserver-worker"),
        threads.to_string().into(),
        "--fileserver-dir".into(),
        dir.into(),
        "--runtime".into(),
        runtime.to_string().into(),
    ];
    run_worker(
        p,
        mapfs,
        &args,
        Duration::from_secs(runtime + 600),
        "fileserver",
    )
}

fn empty_record(w: &str, c: &str, col: &str, run: usize) -> Record {
    Record {
        workload: w.into(),
        config: c.into(),
        column: col.into(),
        run,
        value: None,
        iops: None,
        lat_p50_us: None,
        lat_p99_us: None,
        amount: None,
        secs: None,
        requests_per_op: None,
        error: None,
    }
}

/// Requests answered so far by the mapfs daemon serving `p` (`None` when no
/// mapfs daemon serves it: native, bindfs).
fn daemon_requests(p: &Prepared) -> Option<u64> {
    let socket = mapfs::control::socket_path(&p.root);
    mapfs::control::stats(&socket, false)
        .ok()
        .map(|s| s.requests())
}

/// Requests per operation between two readings of [`daemon_requests`].
fn per_op(before: Option<u64>, after: Option<u64>, ops: u64) -> Option<f64> {
    match (before, after) {
        (Some(b), Some(a)) if ops > 0 => Some(a.saturating_sub(b) as f64 / ops as f64),
        _ => None,
    }
}

/// Entry point of `mapfs bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if let (Some(threads), Some(dir)) = (args.fileserver_worker, &args.fileserver_dir) {
        let secs = args.runtime.unwrap_or(5).max(1);
        let r = fileserver::fileserver(dir, threads, Duration::from_secs(secs))?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if let Some(dir) = &args.meta_worker {
        let r = meta::create_stat_unlink(dir, args.files.unwrap_or(10_000))?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if let Some(dir) = &args.small_files_worker {
        let r = meta::small_files(dir, args.files.unwrap_or(10_000))?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if let Some(dir) = &args.overwrite_worker {
        let r = meta::overwrite(
            dir,
            args.overwrite_files.unwrap_or(OVERWRITE_FILES),
            args.rounds.unwrap_or(OVERWRITE_ROUNDS),
        )?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if args.list {
        print_list();
        return Ok(());
    }
    if let Some(h) = &args.hosts {
        let [a, b] = h.as_slice() else {
            bail!("--hosts takes two directories, A,B");
        };
        let bs = match &args.bs {
            Some(l) => l
                .iter()
                .map(|s| parse_size(s))
                .collect::<Result<Vec<_>>>()?,
            None => vec![4096, 65536],
        };
        let p = hosts::Params {
            hosts: [a.clone(), b.clone()],
            writers: args.threads.unwrap_or(4) as u64,
            size: args.size.as_deref().map_or(Ok(16 << 20), parse_size)?,
            bs,
            runs: args.runs.unwrap_or(3).max(1),
            mapfs: match &args.mapfs_exe {
                Some(p) => p.clone(),
                None => std::env::current_exe().context("locating the mapfs executable")?,
            },
        };
        return hosts::run(&p);
    }
    let (params, wls, cfgs) = resolve(&args)?;
    let fio_version = if wls.iter().any(Workload::is_data) {
        Some(fio::check_installed()?)
    } else {
        None
    };
    let mapfs = match &args.mapfs_exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the mapfs executable")?,
    };
    catch_interrupts();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    let (backing, _backing_tmp) = backing_dir(&args.backing)?;
    let data = tempfile::Builder::new()
        .prefix("mapfs-bench.")
        .tempdir_in(&backing)
        .with_context(|| format!("creating a work directory in {}", backing.display()))?;
    let data_name: OsString = data
        .path()
        .file_name()
        .context("work directory name")?
        .into();
    let mnt_parent = tempfile::Builder::new()
        .prefix("mapfs-bench-mnt.")
        .tempdir()
        .context("creating a directory for mount points")?;
    if mnt_parent.path().canonicalize()?.starts_with(&backing) {
        bail!(
            "the mount points ({}) would be inside the backing directory; pass another --backing",
            mnt_parent.path().display()
        );
    }
    eprintln!(
        "mapfs bench: backing {}, files of {}, {} thread(s), {} run(s)",
        backing.display(),
        fmt_size(params.size),
        params.threads,
        params.runs
    );

    // Preallocate the read files natively once: every configuration shows
    // the same backing files.
    let mut prealloc: Vec<String> = vec![];
    for w in &wls {
        let Kind::Data { rw, files, .. } = w.kind else {
            continue;
        };
        let files: Vec<String> = if files == FileSet::Small {
            // Written by each configuration itself (run_small_fio).
            vec![]
        } else if w.is_read() {
            let n = if files == FileSet::PerThread {
                w.thread_count(params.threads)
            } else {
                1
            };
            (0..n)
                .map(|i| format!("{}.{i}", workloads::READ_PREFIX))
                .collect()
        } else if rw == "randwrite" {
            vec![workloads::RANDWRITE_FILE.into()]
        } else {
            vec![]
        };
        for f in files {
            if !prealloc.contains(&f) {
                prealloc.push(f);
            }
        }
    }
    if !prealloc.is_empty() {
        eprintln!(
            "mapfs bench: preallocating {} file(s) of {}",
            prealloc.len(),
            fmt_size(params.size)
        );
        for f in &prealloc {
            if interrupted() {
                bail!("interrupted");
            }
            preallocate(&data.path().join(f), params.size)?;
        }
    }

    let settler = Settler::new();

    // Set up every configuration; one that fails becomes a row with its error.
    let mut prepared: Vec<(ConfigDef, Result<Prepared, String>)> = vec![];
    for c in &cfgs {
        let r = config::prepare(c, &backing, &data_name, mnt_parent.path(), &mapfs)
            .map_err(|e| format!("{e:#}"));
        if let Err(e) = &r {
            eprintln!("mapfs bench: {}: {e}", c.name);
        }
        prepared.push((*c, r));
    }
    let ready: Vec<(&ConfigDef, &Prepared)> = prepared
        .iter()
        .filter_map(|(c, r)| r.as_ref().ok().map(|p| (c, p)))
        .collect();

    let columns_of = |w: &Workload| -> Vec<String> {
        match w.kind {
            Kind::Data { .. } => data_sizes(w, &params.bs)
                .iter()
                .map(|b| fmt_size(*b))
                .collect(),
            Kind::CreateStatUnlink | Kind::SmallFiles | Kind::Overwrite => w
                .kind
                .phases()
                .unwrap_or_default()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Kind::Procs(_) | Kind::Fileserver { .. } => vec![workloads::PROCS_COLUMN.to_string()],
        }
    };
    let units: u64 = wls
        .iter()
        .map(|w| {
            if w.is_data() {
                data_sizes(w, &params.bs).len()
            } else {
                1
            }
        })
        .sum::<usize>() as u64
        * (params.runs * ready.len()) as u64;
    let pb = Progress::new(units);

    let mut records: Vec<Record> = vec![];
    'workloads: for w in &wls {
        match w.kind {
            Kind::Data { .. } => {
                for bs in data_sizes(w, &params.bs) {
                    let col = fmt_size(bs);
                    let mut job = w
                        .fio_job(
                            bs,
                            params.size,
                            params.threads,
                            params.runtime,
                            params.seq_runtime_cap,
                        )
                        .expect("data workload has a fio job");
                    if w.is_small() {
                        job.nrfiles = small_count(params.files);
                    }
                    for run in 0..params.runs {
                        for (c, p) in round_order(&ready, run) {
                            if interrupted() {
                                break 'workloads;
                            }
                            pb.set_message(format!(
                                "{} bs={col} run {}/{} {}",
                                w.name,
                                run + 1,
                                params.runs,
                                c.name
                            ));
                            settler.settle();
                            let dir = p.root.join(&data_name);
                            let mut rec = empty_record(w.name, c.name, &col, run);
                            let before = daemon_requests(p);
                            let res = if w.is_small() {
                                run_small_fio(p, &dir, w, &job)
                            } else {
                                run_fio(p, &dir, w, &job)
                            };
                            let after = daemon_requests(p);
                            match res {
                                // fio stops early on the same SIGINT: not a result.
                                Ok(_) if interrupted() => rec.error = Some("interrupted".into()),
                                Ok(r) => {
                                    rec.value = Some(r.bw_bytes / 1e6);
                                    rec.iops = Some(r.iops);
                                    rec.lat_p50_us = r.clat_p50_ns.map(|v| v / 1e3);
                                    rec.lat_p99_us = r.clat_p99_ns.map(|v| v / 1e3);
                                    rec.amount = Some(r.io_bytes);
                                    rec.secs = Some(r.runtime_ms as f64 / 1e3);
                                    rec.requests_per_op = per_op(before, after, r.io_bytes / bs);
                                }
                                Err(e) => {
                                    let e = format!("{e:#}");
                                    pb.suspend(|| {
                                        eprintln!("mapfs bench: {} {col} {}: {e}", w.name, c.name)
                                    });
                                    rec.error = Some(e);
                                }
                            }
                            records.push(rec);
                            pb.inc(1);
                        }
                    }
                }
            }
            Kind::Procs(_) | Kind::Fileserver { .. } => {
                for run in 0..params.runs {
                    for (c, p) in round_order(&ready, run) {
                        if !begin_unit(&pb, &settler, w.name, run, params.runs, c.name) {
                            break 'workloads;
                        }
                        let dir = p.root.join(&data_name);
                        let mut rec = empty_record(w.name, c.name, workloads::PROCS_COLUMN, run);
                        let before = daemon_requests(p);
                        // (units of work, seconds)
                        let res = match w.kind {
                            Kind::Procs(workloads::Procs::SpawnRead) => procs::spawn_read(p, &dir),
                            Kind::Procs(workloads::Procs::Build) => procs::build(p, &dir),
                            Kind::Procs(workloads::Procs::Untar) => procs::untar(p, &dir),
                            Kind::Fileserver { threads } => {
                                run_fileserver(p, &dir, threads, params.runtime, &mapfs).map(|r| {
                                    procs::ProcsResult {
                                        units: r.ops,
                                        secs: r.secs,
                                    }
                                })
                            }
                            Kind::Data { .. }
                            | Kind::CreateStatUnlink
                            | Kind::SmallFiles
                            | Kind::Overwrite => {
                                unreachable!("matched by the arms above")
                            }
                        };
                        let after = daemon_requests(p);
                        match res {
                            Ok(r) => {
                                rec.requests_per_op = per_op(before, after, r.units);
                                rec.value = Some(r.rate());
                                rec.iops = Some(r.rate());
                                rec.amount = Some(r.units);
                                rec.secs = Some(r.secs);
                            }
                            Err(e) => {
                                let e = format!("{e:#}");
                                pb.suspend(|| eprintln!("mapfs bench: {} {}: {e}", w.name, c.name));
                                rec.error = Some(e);
                            }
                        }
                        records.push(rec);
                        pb.inc(1);
                    }
                }
            }
            Kind::CreateStatUnlink | Kind::SmallFiles | Kind::Overwrite => {
                let phases_of = w.kind.phases().unwrap_or_default();
                // Space in use before a configuration's first run: a file
                // system that keeps what it freed for reuse (pack's slots)
                // shows what its files took in every run, not only the first.
                let mut space_base: std::collections::HashMap<&str, Option<(u64, u64)>> =
                    std::collections::HashMap::new();
                for run in 0..params.runs {
                    for (c, p) in round_order(&ready, run) {
                        if !begin_unit(&pb, &settler, w.name, run, params.runs, c.name) {
                            break 'workloads;
                        }
                        let dir = p.root.join(&data_name);
                        let before = daemon_requests(p);
                        // Where the files' bytes land: a store of its own,
                        // or the tree itself in the backing directory.
                        let store = p.store.clone().unwrap_or_else(|| match w.kind {
                            // A version store may live anywhere in it.
                            Kind::Overwrite => backing.to_path_buf(),
                            _ => backing.join(&data_name).join(meta::SMALL_TREE),
                        });
                        let used_before = if w.kind == Kind::Overwrite {
                            // What this run leaves behind: its tree is gone
                            // at its end, its history may not be.
                            rustix::fs::sync();
                            Some(used_space(&store))
                        } else {
                            *space_base
                                .entry(c.name)
                                .or_insert_with(|| Some(used_space(&store)))
                        };
                        let res = run_meta(p, &dir, &params, &mapfs, w.kind);
                        let after = daemon_requests(p);
                        if w.kind == Kind::Overwrite {
                            rustix::fs::sync();
                            if let (Ok(_), Some(b)) = (&res, used_before) {
                                let a = used_space(&store);
                                let mut rec =
                                    empty_record(w.name, c.name, workloads::KEPT_COLUMN, run);
                                rec.value = Some(a.1.saturating_sub(b.1) as f64 / 1048576.0);
                                records.push(rec);
                            }
                        }
                        if w.kind == Kind::SmallFiles {
                            // What the files took on the backing file system,
                            // written out first (a mount's writeback cache
                            // too), then the tree removed where it was made.
                            rustix::fs::sync();
                            if let (Ok(_), Some(b)) = (&res, used_before) {
                                let a = used_space(&store);
                                for (col, v) in [
                                    ("inodes", a.0.saturating_sub(b.0) as f64),
                                    ("disk MiB", a.1.saturating_sub(b.1) as f64 / 1048576.0),
                                ] {
                                    let mut rec = empty_record(w.name, c.name, col, run);
                                    rec.value = Some(v);
                                    records.push(rec);
                                }
                            }
                            let mut rm = p.command("rm");
                            rm.arg("-rf").arg(dir.join(meta::SMALL_TREE));
                            let _ = process::run(rm, Duration::from_secs(600));
                        }
                        match res {
                            Ok(phases) => {
                                // overwrite's phase counts bytes; its
                                // application operations are the rewrites.
                                let (ops, scale) = match w.kind {
                                    Kind::Overwrite => {
                                        ((params.overwrite_files * params.rounds) as u64, 1e-6)
                                    }
                                    _ => (phases.iter().map(|ph| ph.ops).sum(), 1.0),
                                };
                                let rpo = per_op(before, after, ops);
                                for ph in phases {
                                    let mut rec = empty_record(w.name, c.name, &ph.phase, run);
                                    rec.requests_per_op = rpo;
                                    rec.value = Some(ph.ops_per_sec() * scale);
                                    rec.iops = Some(ph.ops_per_sec() * scale);
                                    rec.lat_p50_us = Some(ph.lat_p50_ns / 1e3);
                                    rec.lat_p99_us = Some(ph.lat_p99_ns / 1e3);
                                    rec.amount = Some(ph.ops);
                                    rec.secs = Some(ph.secs);
                                    records.push(rec);
                                }
                            }
                            Err(e) => {
                                let e = format!("{e:#}");
                                pb.suspend(|| eprintln!("mapfs bench: {} {}: {e}", w.name, c.name));
                                for ph in phases_of {
                                    let mut rec = empty_record(w.name, c.name, ph, run);
                                    rec.error = Some(e.clone());
                                    records.push(rec);
                                }
                            }
                        }
                        pb.inc(1);
                    }
                }
            }
        }
    }
    pb.finish_and_clear();

    // Unmount before removing the work directory, so that no daemon holds it.
    let statuses: Vec<ConfigStatus> = prepared
        .iter()
        .map(|(c, r)| ConfigStatus {
            name: c.name.into(),
            about: c.about.into(),
            error: r.as_ref().err().cloned(),
        })
        .collect();
    drop(ready);
    drop(prepared);
    drop(data);

    let rows: Vec<(String, Option<String>)> = statuses
        .iter()
        .map(|s| (s.name.clone(), s.error.clone()))
        .collect();
    let tables: Vec<Table> = wls
        .iter()
        .map(|w| {
            let n = params.threads.to_string();
            let about: Vec<&str> = w
                .about
                .split(' ')
                .map(|word| if word == "N" { n.as_str() } else { word })
                .collect();
            let about = about.join(" ");
            let unit = match w.kind {
                Kind::Data { .. } => "MB/s",
                Kind::CreateStatUnlink | Kind::Fileserver { .. } => "ops/s",
                Kind::SmallFiles => "files/s",
                Kind::Overwrite => "MB/s",
                Kind::Procs(workloads::Procs::SpawnRead) => "processes/s",
                Kind::Procs(workloads::Procs::Build | workloads::Procs::Untar) => "files/s",
            };
            report::build_table(w.name, &about, unit, &columns_of(w), &rows, &records)
        })
        .collect();

    let mut md = String::new();
    for t in &tables {
        md.push_str(&report::render_markdown(t));
        md.push('\n');
    }
    print!("{md}");

    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let mut full = format!(
            "# mapfs bench results\n\nKernel {kernel}, {cpus} CPU(s), {}, backing {}.\n\
             Files of {}, N = {} threads, random runs of {} s, {} run(s) per figure \
             (cell: median (ratio to native) ±half the min..max spread).\n\
             Page cache dropped before every run: {}.\n\n",
            fio_version.as_deref().unwrap_or("no fio"),
            backing.display(),
            fmt_size(params.size),
            params.threads,
            params.runtime,
            params.runs,
            if settler.drop_caches { "yes" } else { "NO" },
        );
        full.push_str("| config | what |\n|---|---|\n");
        for s in &statuses {
            full.push_str(&format!("| {} | {} |\n", s.name, s.about));
        }
        full.push_str("\n## Throughput\n\n");
        full.push_str(&md);
        full.push_str("## Latency\n\n");
        for t in &tables {
            full.push_str(&report::render_latency_markdown(t));
            full.push('\n');
            full.push_str(&report::render_requests_markdown(t));
            full.push('\n');
        }
        std::fs::write(out.join("results.md"), full)?;
        let json = JsonReport {
            tool: "mapfs bench",
            version: env!("CARGO_PKG_VERSION"),
            started_unix,
            kernel,
            cpus,
            fio: fio_version.clone(),
            backing: backing.display().to_string(),
            page_cache_dropped: settler.drop_caches,
            params: &params,
            configs: &statuses,
            tables: &tables,
            records: &records,
        };
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
        for t in &tables {
            report::write_svg(t, &out.join(format!("{}.svg", t.workload)))?;
        }
        eprintln!("mapfs bench: wrote {}", out.display());
    }
    if interrupted() {
        bail!("interrupted; the tables above are partial");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_alternate_the_configuration_order() {
        let cfgs = ["native", "fuse", "preload"];
        let order = |run| round_order(&cfgs, run).copied().collect::<Vec<_>>();
        assert_eq!(order(0), ["native", "fuse", "preload"]);
        assert_eq!(order(1), ["preload", "fuse", "native"]);
        assert_eq!(order(2), order(0));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("4x").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("0").is_err());
        for s in ["4k", "32k", "128k", "1m", "1g", "1000"] {
            assert_eq!(fmt_size(parse_size(s).unwrap()), s);
        }
    }

    #[test]
    fn quick_defaults_and_explicit_flags() {
        let (p, w, c) = resolve(&BenchArgs {
            quick: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (p.size, p.runs, p.bs.clone()),
            (32 << 20, 1, vec![4096, 1 << 20])
        );
        assert_eq!(w.len(), QUICK.len());
        assert_eq!(c.len(), CONFIGS.len());
        let (p, _, _) = resolve(&BenchArgs {
            quick: true,
            size: Some("64M".into()),
            runs: Some(2),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((p.size, p.runs), (64 << 20, 2));
        let (p, w, _) = resolve(&BenchArgs::default()).unwrap();
        assert_eq!(
            (p.size, p.runs, p.bs.len(), w.len()),
            (256 << 20, 3, 4, WORKLOADS.len())
        );
        assert!(resolve(&BenchArgs {
            bs: Some(vec!["1g".into()]),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn preallocated_file_has_size_and_data() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        preallocate(&p, (1 << 20) + 5).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), (1 << 20) + 5);
        assert!(b.iter().filter(|x| **x == 0).count() < b.len() / 100);
    }
}
