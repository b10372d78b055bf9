//! `mount` and `umount`, for every program built on this library.
//!
//! `mount` checks everything it can before touching the kernel, so bad input
//! gets a clear error and nothing is mounted. Without `--foreground` it starts
//! itself again as a detached daemon and returns only when that daemon reports
//! the mount ready (or prints the daemon's error). The daemon keeps its pid
//! and info files (see [`crate::mounts`]) while it serves, and unmounts on
//! SIGTERM, SIGINT and SIGHUP.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use mapfs_fuse::failover::{Link, Start};
use mapfs_fuse::{AdapterOptions, DataMode};

use crate::mounts;
use crate::registry::{FsOptions, FsSpec, Registry};

/// The longest `--ttl` accepted: a year is "forever" for a cache, and far
/// below where the kernel's and the standard library's time types overflow.
const MAX_TTL_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Arguments of `mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// File system to mount (see the list below the options).
    pub fs: String,
    /// Backing directory holding the data (`UPPER:LOWER...` for layered file systems).
    pub backing: PathBuf,
    /// Empty directory to mount on (`-o nonempty` to mount over files).
    pub mountpoint: PathBuf,
    /// Data executor: auto (kernel passthrough where possible, else the daemon), daemon,
    /// or passthrough (as auto, but the mount is refused unless the kernel grants
    /// passthrough and the file system has whole-file maps).
    #[arg(long, default_value = "auto", value_parser = ["auto", "daemon", "passthrough"])]
    pub data: String,
    /// Mount options, comma separated: allow_other, allow_root, default_permissions, ro,
    /// rw, exec, noexec, suid, nosuid, dev, nodev, atime, noatime, sync, async, dirsync,
    /// nonempty, transport=uring|dev (how requests reach the daemon; default uring where
    /// the kernel offers it, or $MAPFS_TRANSPORT), and the file system's own.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    pub foreground: bool,
    /// Attribute and entry cache time in seconds (0 to 31536000)
    /// [default: 1; 0 with `-o hostid=` (a store shared by hosts, whose
    /// changes the next open must see); 31536000 with --exclusive].
    #[arg(long, value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: Option<f64>,
    /// Nothing but this mount (and `mapfs run` clients of it) changes the
    /// backing directory: the kernel keeps names, missing names and
    /// attributes for a long time (see --ttl), so repeated path walks and
    /// stats never reach the daemon. Changes made directly in the backing
    /// directory may then stay unseen until remount.
    #[arg(long)]
    pub exclusive: bool,
    /// With `--data daemon`: let the kernel buffer writes (fast small writes;
    /// sizes changed outside this mount show late). `off` for strict
    /// close-to-open with shim clients and other writers. `auto`: on for
    /// file systems whose maps are whole-file (passthrough), off for the
    /// others; plfs takes `on` (every open of a file then shares one log),
    /// pack and versions do not.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub writeback_cache: String,
    /// Serve without a supervisor: if the daemon dies, the mount is dead
    /// until `umount` (the default restarts it on the same mount, with no
    /// error seen by programs; see `mapfs restart`).
    #[arg(long)]
    pub no_supervisor: bool,
    /// Internal: set by the background starter.
    #[arg(long, hide = true)]
    pub daemonized: bool,
}

/// How long the kernel caches names and attributes when `--exclusive` is
/// given without `--ttl`.
const EXCLUSIVE_TTL_SECS: f64 = MAX_TTL_SECS;

impl MountArgs {
    /// The attribute and entry cache time in seconds: `--ttl`, else 1 s,
    /// 0 when `-o hostid=` names this host of a store other hosts change
    /// (close-to-open across hosts: a kernel keeping a size for 1 s showed
    /// another host's closed rewrite cut to the old size), or
    /// `EXCLUSIVE_TTL_SECS` with `--exclusive`.
    pub fn ttl_secs(&self) -> f64 {
        match (self.ttl, self.exclusive) {
            (Some(t), _) => t,
            (None, true) => EXCLUSIVE_TTL_SECS,
            (None, false) if self.names_a_host() => 0.0,
            (None, false) => 1.0,
        }
    }

    /// `-o hostid=NAME` was given: the backing store is shared by hosts.
    fn names_a_host(&self) -> bool {
        self.options
            .iter()
            .flat_map(|o| o.split(','))
            .any(|o| o.trim().starts_with("hostid="))
    }
}

/// `--ttl`: a finite number of seconds in 0..=one year.
pub(crate) fn parse_ttl(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_TTL_SECS).contains(&v) => Ok(v),
        _ => Err(format!(
            "must be a number of seconds from 0 to {MAX_TTL_SECS} (one year)"
        )),
    }
}

/// Arguments of `mapfs umount`.
#[derive(Args, Debug)]
pub struct UmountArgs {
    /// Where the file system is mounted.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open (the daemon exits once they close).
    #[arg(long, short = 'l')]
    pub lazy: bool,
}

struct Checked {
    spec: FsSpec,
    /// The canonical backing path as the file system gets it (layers joined
    /// with `:`), also the mount's source.
    backing: PathBuf,
    mountpoint: PathBuf,
    data: DataMode,
    opts: mapfs_fuse::MountOptions,
    fs_opts: FsOptions,
}

fn check_dir(path: &Path, what: &str) -> Result<PathBuf> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => path
            .canonicalize()
            .with_context(|| format!("cannot resolve {what} {}", path.display())),
        Ok(_) => bail!("{what} {} is not a directory", path.display()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{what} {} is a dead FUSE mount (its daemon crashed?); run `mapfs umount {}` first",
            path.display(),
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{what} {} does not exist", path.display())
        }
        Err(e) => Err(e).with_context(|| format!("cannot use {what} {}", path.display())),
    }
}

/// Checks the arguments; `live`: the mountpoint is this mount's own live
/// connection (a daemon taking over), used as given and not looked at.
fn check(reg: &Registry, args: &MountArgs, live: bool) -> Result<Checked> {
    let Some(spec) = reg.get(&args.fs) else {
        bail!(
            "unknown file system {:?} (available: {})",
            args.fs,
            reg.names().join(", ")
        );
    };
    let data: DataMode = args.data.parse().map_err(|e: String| anyhow!(e))?;
    // A file system whose opens share one map has no whole-file maps
    // (FsSpec::shared_opens), and only those can be passed to the kernel.
    if data == DataMode::Passthrough && spec.has_shared_opens() && !spec.has_whole_file_maps() {
        bail!(
            "--data passthrough: the kernel can pass through only whole-file maps, and {} \
             has none; use --data auto (the daemon serves its data)",
            spec.name()
        );
    }
    if args.exclusive && !spec.is_cacheable() {
        bail!(
            "--exclusive: {} changes names or attributes by itself, so the kernel must not \
             keep them long; mount it without --exclusive",
            spec.name()
        );
    }
    let mut kernel_opts = Vec::new();
    let mut fs_opts = FsOptions::default();
    let mut nonempty = false;
    for o in args.options.iter().flat_map(|o| o.split(',')) {
        let key = o.split_once('=').map_or(o, |(k, _)| k);
        if o == "nonempty" {
            nonempty = true;
        } else if spec.declared_options().contains(&key) {
            fs_opts.custom.push(o.to_string());
        } else {
            kernel_opts.push(o.to_string());
        }
    }
    let opts = mapfs_fuse::parse_options(&kernel_opts).map_err(|e| anyhow!(e))?;
    fs_opts.read_only = opts.kernel.contains(&fuser::MountOption::RO);
    fs_opts.whole_files_native = data != DataMode::Daemon;
    let layers: Vec<PathBuf> = if spec.is_layered() {
        args.backing
            .as_os_str()
            .as_bytes()
            .split(|&b| b == b':')
            .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
            .collect()
    } else {
        vec![args.backing.clone()]
    };
    let what = if spec.is_layered() {
        "layer"
    } else {
        "backing directory"
    };
    for layer in &layers {
        fs_opts.layers.push(check_dir(layer, what)?);
    }
    let backing = PathBuf::from(
        std::env::join_paths(&fs_opts.layers)
            .map_err(|_| anyhow!("a backing directory contains ':'"))?,
    );
    if live {
        fs_opts.resumed = true;
        return Ok(Checked {
            spec: spec.clone(),
            backing,
            mountpoint: args.mountpoint.clone(),
            data,
            opts,
            fs_opts,
        });
    }
    let mountpoint = check_dir(&args.mountpoint, "mountpoint")?;
    for layer in &fs_opts.layers {
        check_apart(layer, &mountpoint)?;
    }
    if let Some(m) = mounts::mounted_at(&mountpoint) {
        bail!(
            "mountpoint {} is busy: {} ({}) is already mounted there",
            mountpoint.display(),
            m.source,
            m.fstype
        );
    }
    if !nonempty
        && std::fs::read_dir(&mountpoint)
            .with_context(|| format!("cannot list mountpoint {}", mountpoint.display()))?
            .next()
            .is_some()
    {
        bail!(
            "mountpoint {} is not empty: the mount would hide its files (add -o nonempty to mount anyway)",
            mountpoint.display()
        );
    }
    check_dev_fuse()?;
    if !rustix::process::geteuid().is_root() && which("fusermount3").is_none() {
        bail!("fusermount3 not found in PATH: install it (Debian: apt-get install fuse3)");
    }
    Ok(Checked {
        spec: spec.clone(),
        backing,
        mountpoint,
        data,
        opts,
        fs_opts,
    })
}

/// Refuses a mountpoint and backing directory that are the same or nested.
fn check_apart(backing: &Path, mountpoint: &Path) -> Result<()> {
    if mountpoint == backing {
        bail!("mountpoint and backing directory are the same directory");
    }
    if mountpoint.starts_with(backing) {
        bail!(
            "mountpoint {} is inside the backing directory {}: the file system would contain itself",
            mountpoint.display(),
            backing.display()
        );
    }
    if backing.starts_with(mountpoint) {
        bail!(
            "backing directory {} is inside the mountpoint {}: it would be hidden by the mount",
            backing.display(),
            mountpoint.display()
        );
    }
    Ok(())
}

/// `/dev/fuse` must exist and, for a non-root user, be readable and
/// writable: say which and how to fix it rather than a bare EACCES later.
fn check_dev_fuse() -> Result<()> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE is available");
    }
    let access = rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK;
    if rustix::fs::access(dev, access).is_err() {
        bail!(
            "no permission to open /dev/fuse for reading and writing: ask an administrator to \
             `chmod 0666 /dev/fuse` (the Debian default) or run as root"
        );
    }
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|f| f.is_file())
    })
}

/// What `--writeback-cache` (`asked`) means for a file system: `on` or
/// `off`. Opens of one file with maps that are not whole-file (one log per
/// writer) must not share the kernel's dirty pages unless they share one
/// map in the daemon: a page written back through one open would carry
/// another open's bytes.
fn writeback_choice(spec: &FsSpec, asked: &str) -> Result<&'static str> {
    Ok(match asked {
        "off" => "off",
        "on" if spec.has_whole_file_maps() || spec.has_shared_opens() => "on",
        "on" => bail!(
            "--writeback-cache on: {} cannot run under the kernel's writeback cache (its \
             maps are not whole-file and its opens cannot share one); use auto or off",
            spec.name()
        ),
        _ if spec.has_whole_file_maps() => "on",
        _ => "off",
    })
}

/// `mount`: checks everything, then mounts in the background (or serves
/// in the foreground with `--foreground`).
pub fn mount(reg: &Registry, mut args: MountArgs) -> Result<()> {
    // A daemon started by a supervisor: mount afresh, or take over a live
    // connection (then the mountpoint must not be touched: every look at
    // it would wait for this very daemon).
    if let Some(link) = Link::from_env()? {
        let link = Arc::new(link);
        let start = link.start().context("cannot start under the supervisor")?;
        let live = matches!(start, Start::Resume(_));
        let c = check(reg, &args, live)?;
        args.writeback_cache = writeback_choice(&c.spec, &args.writeback_cache)?.into();
        return serve(reg, &args, c, Some((link, start)));
    }
    let c = check(reg, &args, false)?;
    args.writeback_cache = writeback_choice(&c.spec, &args.writeback_cache)?.into();
    if args.daemonized && !args.no_supervisor {
        supervise(reg)
    } else if args.foreground {
        serve(reg, &args, c, None)
    } else {
        start_background(reg, &args, &c)
    }
}

/// The background process of a mount: starts the daemon (this program with
/// the same arguments) and restarts it when it dies (see
/// [`mapfs_fuse::failover`]).
fn supervise(reg: &Registry) -> Result<()> {
    init_logging();
    let _ = rustix::process::setsid();
    // Nothing of ours lives in the mount; a cwd there would keep it busy.
    let _ = std::env::set_current_dir("/");
    // The path, not /proc/self/exe: `mapfs restart` after an upgrade must
    // start the new binary.
    let exe = std::env::current_exe()
        .with_context(|| format!("cannot find the {} executable", reg.program()))?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let current: Arc<Mutex<Option<OwnedFd>>> = Arc::default();
    forward_signals(current.clone())?;
    let mut first = true;
    let daemon = || {
        let mut cmd = Command::new(&exe);
        cmd.args(&args).stdin(Stdio::null());
        if !first {
            // Only the first daemon reports to `mount`, which has gone.
            cmd.stdout(Stdio::null());
        }
        first = false;
        cmd
    };
    let code = mapfs_fuse::failover::supervisor::supervise(daemon, current)?;
    std::process::exit(code)
}

/// SIGINT, SIGTERM and SIGHUP to the supervisor go to its daemon (which
/// unmounts), so the pair stops as one process did.
fn forward_signals(current: Arc<Mutex<Option<OwnedFd>>>) -> Result<()> {
    let set = stop_signals();
    set.thread_block().context("cannot block signals")?;
    std::thread::Builder::new()
        .name("mapfs-signals".into())
        .spawn(move || {
            while let Ok(sig) = set.wait() {
                let Some(rsig) = rustix::process::Signal::from_named_raw(sig as i32) else {
                    continue;
                };
                if let Some(pidfd) = current.lock().expect("pidfd lock").as_ref() {
                    let _ = rustix::process::pidfd_send_signal(pidfd, rsig);
                }
            }
        })?;
    Ok(())
}

fn start_background(reg: &Registry, args: &MountArgs, c: &Checked) -> Result<()> {
    mounts::ensure_runtime_dir()?;
    mounts::remove_stale();
    let (log, log_file) = mounts::new_log(&c.mountpoint)?;
    let exe = std::env::current_exe()
        .with_context(|| format!("cannot find the {} executable", reg.program()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&args.fs)
        .arg(&c.backing)
        .arg(&c.mountpoint)
        .arg("--data")
        .arg(&args.data)
        .arg("--ttl")
        .arg(args.ttl_secs().to_string())
        .arg("--writeback-cache")
        .arg(&args.writeback_cache)
        .arg("--foreground")
        .arg("--daemonized");
    if args.exclusive {
        cmd.arg("--exclusive");
    }
    if args.no_supervisor {
        cmd.arg("--no-supervisor");
    }
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .with_context(|| format!("cannot start the {} daemon", reg.program()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    match lines.next() {
        Some(Ok(line)) if line == "ready" => Ok(()),
        other => {
            let status = child.wait().ok();
            let detail = std::fs::read_to_string(&log).unwrap_or_default();
            let msg = match other {
                Some(Ok(l)) => l,
                _ => format!("daemon exited ({status:?})"),
            };
            bail!(
                "mount failed: {msg}\n{}(daemon log: {})",
                tail(&detail, 20),
                log.display()
            )
        }
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].iter().map(|l| format!("  {l}\n")).collect()
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MAPFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::logline::LogLines)
        .with_ansi(false)
        .try_init();
}

fn serve(
    reg: &Registry,
    args: &MountArgs,
    c: Checked,
    supervised: Option<(Arc<Link>, Start)>,
) -> Result<()> {
    init_logging();
    if args.daemonized && supervised.is_none() {
        // Leave the caller's session so its terminal closing does not kill us.
        let _ = rustix::process::setsid();
    }
    // Modes from the kernel already carry the caller's umask. Files the
    // daemon makes for itself (pid, info) get explicit modes.
    rustix::process::umask(rustix::fs::Mode::empty());
    let report_err = |e: &dyn std::fmt::Display| {
        if args.daemonized {
            println!("{e}");
        }
    };
    let fs = match c.spec.build(&c.backing, &c.fs_opts) {
        Ok(fs) => fs,
        Err(e) => {
            let e = anyhow!(
                "cannot start {} on {}: {e}",
                c.spec.name(),
                c.backing.display()
            );
            report_err(&e);
            return Err(e);
        }
    };
    let adapter = AdapterOptions {
        data: c.data,
        ttl: Duration::from_secs_f64(args.ttl_secs()),
        entry_ttl: if c.opts.needs_uncached_names() {
            tracing::info!(
                "allow_other without default_permissions: names are not cached, so every \
                 path lookup is checked as its caller"
            );
            Duration::ZERO
        } else {
            Duration::from_secs_f64(args.ttl_secs())
        },
        writeback_cache: args.writeback_cache == "on",
        share_opens: args.writeback_cache == "on" && !c.spec.has_whole_file_maps(),
    };
    let resumed = matches!(supervised, Some((_, Start::Resume(_))));
    let supervisor_pid = supervised
        .is_some()
        .then(|| rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32));
    let mounted = match supervised {
        Some((link, Start::Resume(state))) => mapfs_fuse::resume(
            fs,
            c.spec.name(),
            &c.backing,
            &c.mountpoint,
            adapter,
            &c.opts,
            (link, state),
        ),
        Some((link, Start::Fresh)) => mapfs_fuse::mount(
            fs,
            c.spec.name(),
            &c.backing,
            &c.mountpoint,
            adapter,
            &c.opts,
            Some(link),
        ),
        None => mapfs_fuse::mount(
            fs,
            c.spec.name(),
            &c.backing,
            &c.mountpoint,
            adapter,
            &c.opts,
            None,
        ),
    };
    let mut mounted = match mounted {
        Ok(m) => m,
        Err(e) => {
            let e = anyhow!("cannot mount {}: {e}", c.mountpoint.display());
            report_err(&e);
            return Err(e);
        }
    };
    let passthrough_active = c.data != DataMode::Daemon && mounted.passthrough_works();
    if c.data == DataMode::Passthrough && !passthrough_active {
        // What was asked for cannot be had: unmount rather than serve
        // through the daemon under a name that promises otherwise.
        let _ = mounted.unmounter().unmount();
        drop(mounted);
        let e = anyhow!(
            "--data passthrough: the kernel refused kernel passthrough on {} (it needs \
             Linux 6.9 or later with FUSE passthrough, and a daemon with CAP_SYS_ADMIN); \
             use --data auto, which falls back to the daemon",
            c.mountpoint.display()
        );
        report_err(&e);
        return Err(e);
    }
    tracing::info!(
        mountpoint = %c.mountpoint.display(),
        backing = %c.backing.display(),
        data = %args.data,
        "{} {}; {}",
        if resumed { "took over" } else { "mounted" },
        c.spec.name(),
        executor_line(c.data, passthrough_active)
    );
    let files = RuntimeFiles::write(reg, args, &c, passthrough_active, supervisor_pid);
    spawn_signal_unmounter(
        c.mountpoint.clone(),
        mounted.unmounter(),
        supervisor_pid.map(|_| mounted.shared()),
    )?;
    // Shim clients (`mapfs run`) attach here; a mount without it still works.
    let control_path = mapfs::control::socket_path(&c.mountpoint);
    let _control = match mapfs_fuse::control::spawn(mounted.shared(), &control_path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(
                "control socket {} unavailable ({e}); `mapfs run` clients will use the mount",
                control_path.display()
            );
            None
        }
    };
    // Ready once the control socket is there too (a `mapfs run` right
    // after `mount` must find it).
    if args.daemonized {
        if !resumed {
            println!("ready");
            let _ = std::io::stdout().flush();
            // Nobody reads our stdout any more.
            if let Ok(null) = File::options().write(true).open("/dev/null") {
                let _ = rustix::stdio::dup2_stdout(&null);
            }
        }
    } else {
        eprintln!(
            "{}: {} mounted on {}; Ctrl-C or `{} umount` to stop",
            reg.program(),
            c.spec.name(),
            c.mountpoint.display(),
            reg.program()
        );
    }
    let res = mounted.run();
    drop(files);
    tracing::info!("unmounted {}", c.mountpoint.display());
    if res.is_ok() && args.daemonized {
        // A clean exit leaves nothing worth reading; a crash keeps its log.
        let _ = std::fs::remove_file(mounts::log_path(&c.mountpoint));
    }
    res.context("FUSE session failed")
}

/// The one log line saying which executor runs the data.
fn executor_line(data: DataMode, passthrough_active: bool) -> &'static str {
    match (data, passthrough_active) {
        (DataMode::Daemon, _) => "data executor: daemon (--data daemon)",
        (_, true) => "data executor: kernel passthrough is active for whole-file maps; the daemon runs the others",
        (_, false) => "data executor: daemon; kernel passthrough is NOT active (the kernel or this process's privileges refuse backing files)",
    }
}

/// The pid and info files of a serving daemon, removed when it stops.
struct RuntimeFiles {
    pid: PathBuf,
    info: PathBuf,
    /// The pid file, open: its lock says the daemon lives
    /// ([`mounts::write_pid_file`]).
    _pid_lock: Option<File>,
}

impl RuntimeFiles {
    /// Writes them; a failure is logged, not fatal: the mount works
    /// without them, only `umount` and `list` know less.
    fn write(
        reg: &Registry,
        args: &MountArgs,
        c: &Checked,
        passthrough_active: bool,
        supervisor_pid: Option<u32>,
    ) -> Self {
        let mut files = RuntimeFiles {
            pid: mounts::pid_path(&c.mountpoint),
            info: mounts::info_path(&c.mountpoint),
            _pid_lock: None,
        };
        let info = mounts::MountInfo {
            pid: std::process::id(),
            program: reg.program().to_string(),
            fs: c.spec.name().to_string(),
            backing: c.backing.to_string_lossy().into_owned(),
            data: args.data.clone(),
            passthrough_active,
            writeback_cache: c.data == DataMode::Daemon && args.writeback_cache == "on",
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            supervisor_pid,
        };
        let res = mounts::ensure_runtime_dir().and_then(|_| {
            mounts::remove_stale();
            files._pid_lock = Some(mounts::write_pid_file(&files.pid, info.pid)?);
            mounts::write_private(&files.info, &serde_json::to_vec(&info)?)
        });
        if let Err(e) = res {
            tracing::warn!("{e:#}; `umount` and `list` will know less of this mount");
        }
        files
    }
}

impl Drop for RuntimeFiles {
    fn drop(&mut self) {
        // After `umount`, a new daemon may already serve the mountpoint and
        // own these names: remove them only while they are still ours.
        let ours = std::fs::read_to_string(&self.pid)
            .is_ok_and(|p| p.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.info);
            let _ = std::fs::remove_file(&self.pid);
        }
    }
}

/// SIGINT/SIGTERM/SIGHUP unmount cleanly instead of leaving a dead mount.
/// Under a supervisor, [`RESTART_SIGNAL`] (`mapfs restart`) makes the
/// daemon hand every written map to the file system and leave, for the
/// supervisor to start its successor on the same connection.
fn spawn_signal_unmounter(
    mountpoint: PathBuf,
    mut unmounter: mapfs_fuse::Unmounter,
    supervised: Option<Arc<mapfs_fuse::adapter::Shared>>,
) -> Result<()> {
    let mut set = stop_signals();
    set.add(RESTART_SIGNAL);
    set.thread_block().context("cannot block signals")?;
    std::thread::Builder::new()
        .name("mapfs-signals".into())
        .spawn(move || {
            while let Ok(sig) = set.wait() {
                if sig == RESTART_SIGNAL {
                    let Some(shared) = &supervised else {
                        tracing::warn!("{sig:?}: no supervisor to restart this daemon; ignored");
                        continue;
                    };
                    tracing::info!("{sig:?}: leaving for a new daemon (mapfs restart)");
                    shared.persist_all();
                    shared.journal_restarting();
                    std::process::exit(mapfs_fuse::failover::supervisor::RESTART_EXIT);
                }
                tracing::info!("{sig:?}: unmounting {}", mountpoint.display());
                if let Err(e) = unmounter.unmount() {
                    tracing::error!("cannot unmount {}: {e}", mountpoint.display());
                    std::process::exit(1);
                }
                break;
            }
        })?;
    Ok(())
}

/// The signals that stop a mount: SIGINT, SIGTERM, SIGHUP.
fn stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set
}

/// The signal `mapfs restart` sends a daemon.
pub const RESTART_SIGNAL: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGUSR2;

fn unmount_path(mountpoint: &Path, lazy: bool) -> Result<()> {
    if rustix::process::geteuid().is_root() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        match nix::mount::umount2(mountpoint, flags) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EBUSY) => bail!(
                "{} is busy (a process has files open or its cwd there); close them or use --lazy",
                mountpoint.display()
            ),
            Err(e) => Err(anyhow!("cannot unmount {}: {e}", mountpoint.display())),
        }
    } else {
        let mut cmd = Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let out = cmd
            .arg(mountpoint)
            .output()
            .context("cannot run fusermount3 (apt-get install fuse3)")?;
        if !out.status.success() {
            bail!(
                "fusermount3 -u failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// `umount`: unmounts and waits for the daemon to exit, so everything it
/// was writing has reached the backing store when this returns.
pub fn umount(args: UmountArgs) -> Result<()> {
    // A dead mount cannot be canonicalized (stat fails), so fall back to the
    // absolute path as given.
    let mp = args
        .mountpoint
        .canonicalize()
        .or_else(|_| std::path::absolute(&args.mountpoint))
        .with_context(|| format!("bad mountpoint {}", args.mountpoint.display()))?;
    match mounts::mounted_at(&mp) {
        Some(m) if m.is_mapfs() => {}
        Some(m) => bail!(
            "{} is not a mapfs mount ({} is mounted there)",
            mp.display(),
            m.fstype
        ),
        None => bail!("{} is not mounted", mp.display()),
    }
    // Taken before unmounting: the socket and pid file go with the daemon.
    let daemon = crate::pidfd::daemon_of(&mp);
    let supervisor = crate::pidfd::supervisor_of(&mp);
    unmount_path(&mp, args.lazy)?;
    for (pidfd, what) in [(daemon, "daemon"), (supervisor, "supervisor")] {
        if let Some(pidfd) = pidfd {
            if !crate::pidfd::wait_exit(&pidfd, Duration::from_secs(30)) {
                eprintln!(
                    "warning: the {what} of {} is still running after 30 s (still writing?)",
                    mp.display()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert_eq!(parse_ttl("0.5"), Ok(0.5));
        for bad in ["-1", "1e30", "nan", "inf", "x"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
