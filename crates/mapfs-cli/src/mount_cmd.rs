//! `mapfs mount` and `mapfs umount`.
//!
//! `mount` checks everything it can before touching the kernel, so bad input
//! gets a clear error and nothing is mounted. Without `--foreground` it starts
//! itself again as a detached daemon and returns only when that daemon reports
//! the mount ready (or prints the daemon's error).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use mapfs_fuse::{AdapterOptions, DataMode};

use crate::mounts;

/// Arguments of `mapfs mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// File system to mount (built in: passthrough, plfs).
    pub fs: String,
    /// Backing directory holding the data.
    pub backing: PathBuf,
    /// Empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Data executor: auto (kernel passthrough where possible), daemon, or passthrough.
    #[arg(long, default_value = "auto", value_parser = ["auto", "daemon", "passthrough"])]
    pub data: String,
    /// Mount options, comma separated: allow_other, allow_root, default_permissions, ro,
    /// rw, exec, noexec, suid, nosuid, dev, nodev, atime, noatime, sync, async, dirsync.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    pub foreground: bool,
    /// Attribute and entry cache time in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub ttl: f64,
    /// With `--data daemon`: let the kernel buffer writes (fast small writes;
    /// sizes changed outside this mount show late). `off` for strict
    /// close-to-open with shim clients and other writers. Always off for
    /// file systems whose maps are not whole-file (plfs).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub writeback_cache: String,
    /// Internal: set by the background starter.
    #[arg(long, hide = true)]
    pub daemonized: bool,
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
    backing: PathBuf,
    mountpoint: PathBuf,
    data: DataMode,
    opts: mapfs_fuse::MountOptions,
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

fn check(args: &MountArgs) -> Result<Checked> {
    if !mapfs_fs::NAMES.contains(&args.fs.as_str()) {
        bail!(
            "unknown file system {:?} (built in: {})",
            args.fs,
            mapfs_fs::NAMES.join(", ")
        );
    }
    let data: DataMode = args.data.parse().map_err(|e: String| anyhow!(e))?;
    let opts = mapfs_fuse::parse_options(&args.options).map_err(|e| anyhow!(e))?;
    if !(args.ttl.is_finite() && args.ttl >= 0.0) {
        bail!("--ttl must be a number of seconds >= 0");
    }
    let backing = check_dir(&args.backing, "backing directory")?;
    let mountpoint = check_dir(&args.mountpoint, "mountpoint")?;
    if mountpoint == backing {
        bail!("mountpoint and backing directory are the same directory");
    }
    if mountpoint.starts_with(&backing) {
        bail!(
            "mountpoint {} is inside the backing directory {}: the file system would contain itself",
            mountpoint.display(),
            backing.display()
        );
    }
    if backing.starts_with(&mountpoint) {
        bail!(
            "backing directory {} is inside the mountpoint {}: it would be hidden by the mount",
            backing.display(),
            mountpoint.display()
        );
    }
    if let Some(m) = mounts::mounted_at(&mountpoint) {
        bail!(
            "mountpoint {} is busy: {} ({}) is already mounted there",
            mountpoint.display(),
            m.source,
            m.fstype
        );
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE is available");
    }
    if !rustix::process::geteuid().is_root() && which("fusermount3").is_none() {
        bail!("fusermount3 not found in PATH: install it (Debian: apt-get install fuse3)");
    }
    Ok(Checked {
        backing,
        mountpoint,
        data,
        opts,
    })
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|f| f.is_file())
    })
}

/// `mapfs mount`.
pub fn mount(mut args: MountArgs) -> Result<()> {
    if args.fs != "passthrough" {
        // Several opens of one file with maps that are not whole-file (one
        // log per writer) must not share the kernel's dirty pages: a page
        // written back through one open carries another open's bytes.
        args.writeback_cache = "off".to_string();
    }
    let c = check(&args)?;
    if args.foreground {
        serve(&args, c)
    } else {
        start_background(&args, &c)
    }
}

fn start_background(args: &MountArgs, c: &Checked) -> Result<()> {
    let runtime = mounts::runtime_dir();
    std::fs::create_dir_all(&runtime)
        .with_context(|| format!("cannot create {}", runtime.display()))?;
    let log = mounts::log_path(&c.mountpoint);
    let log_file =
        File::create(&log).with_context(|| format!("cannot create log {}", log.display()))?;
    let exe = std::env::current_exe().context("cannot find the mapfs executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&args.fs)
        .arg(&c.backing)
        .arg(&c.mountpoint)
        .arg("--data")
        .arg(&args.data)
        .arg("--ttl")
        .arg(args.ttl.to_string())
        .arg("--writeback-cache")
        .arg(&args.writeback_cache)
        .arg("--foreground")
        .arg("--daemonized");
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .context("cannot start the mapfs daemon")?;
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
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn serve(args: &MountArgs, c: Checked) -> Result<()> {
    init_logging();
    if args.daemonized {
        // Leave the caller's session so its terminal closing does not kill us.
        let _ = rustix::process::setsid();
    }
    // Modes from the kernel already carry the caller's umask.
    rustix::process::umask(rustix::fs::Mode::empty());
    let fs = mapfs_fs::build(&args.fs, &c.backing).map_err(|e| anyhow!("{e}"))?;
    let adapter = AdapterOptions {
        data: c.data,
        ttl: Duration::from_secs_f64(args.ttl),
        entry_ttl: if c.opts.needs_uncached_names() {
            tracing::info!(
                "allow_other without default_permissions: names are not cached, so every \
                 path lookup is checked as its caller"
            );
            Duration::ZERO
        } else {
            Duration::from_secs_f64(args.ttl)
        },
        writeback_cache: args.writeback_cache == "on",
    };
    let report_err = |e: &dyn std::fmt::Display| {
        if args.daemonized {
            println!("{e}");
        }
    };
    let mounted = match mapfs_fuse::mount(fs, &args.fs, &c.backing, &c.mountpoint, adapter, &c.opts)
    {
        Ok(m) => m,
        Err(e) => {
            let e = anyhow!("cannot mount {}: {e}", c.mountpoint.display());
            report_err(&e);
            return Err(e);
        }
    };
    let _ = std::fs::create_dir_all(mounts::runtime_dir());
    let pidfile = mounts::pid_path(&c.mountpoint);
    let _ = std::fs::write(&pidfile, format!("{}\n", std::process::id()));
    tracing::info!(
        mountpoint = %c.mountpoint.display(),
        backing = %c.backing.display(),
        data = %args.data,
        "mounted {}",
        args.fs
    );
    if args.daemonized {
        println!("ready");
        let _ = std::io::stdout().flush();
        // Nobody reads our stdout any more.
        if let Ok(null) = File::options().write(true).open("/dev/null") {
            let _ = rustix::stdio::dup2_stdout(&null);
        }
    } else {
        eprintln!(
            "mapfs: {} mounted on {}; Ctrl-C or `mapfs umount` to stop",
            args.fs,
            c.mountpoint.display()
        );
    }
    spawn_signal_unmounter(c.mountpoint.clone())?;
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
    let res = mounted.run();
    let _ = std::fs::remove_file(&pidfile);
    tracing::info!("unmounted {}", c.mountpoint.display());
    if res.is_ok() && args.daemonized {
        // A clean exit leaves nothing worth reading; a crash keeps its log.
        let _ = std::fs::remove_file(mounts::log_path(&c.mountpoint));
    }
    res.context("FUSE session failed")
}

/// SIGINT/SIGTERM/SIGHUP unmount cleanly instead of leaving a dead mount.
fn spawn_signal_unmounter(mountpoint: PathBuf) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set.thread_block().context("cannot block signals")?;
    std::thread::Builder::new()
        .name("mapfs-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!("{sig:?}: unmounting {}", mountpoint.display());
                if let Err(e) = unmount_path(&mountpoint, true) {
                    tracing::error!("cannot unmount {}: {e:#}", mountpoint.display());
                    std::process::exit(1);
                }
            }
        })?;
    Ok(())
}

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

/// `mapfs umount`.
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
    let pid = std::fs::read_to_string(mounts::pid_path(&mp))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    unmount_path(&mp, args.lazy)?;
    // Wait for the daemon so everything it was writing has reached the
    // backing store when we return.
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && process_alive(pid) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

fn process_alive(pid: i32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    // Zombies count as gone: the daemon has finished.
    rustix::process::test_kill_process(pid).is_ok()
        && std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
}
