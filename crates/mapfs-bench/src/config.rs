//! Benchmark configurations (table rows): how to get a directory showing the
//! backing directory, and what to run the workload under.
//!
//! Adding a configuration is one entry in [`CONFIGS`]; e.g. `preload` will be
//! `Setup::Mapfs { data: "auto" }` with `Wrap::MapfsRun(&[])`.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How a configuration makes the backing directory visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The backing directory itself.
    Native,
    /// `mapfs mount passthrough BACKING MNT --data <data>`.
    Mapfs {
        /// The `--data` mode.
        data: &'static str,
    },
    /// `bindfs BACKING MNT`, the reference FUSE passthrough.
    Bindfs,
    /// `mapfs mount passthrough BACKING MNT --data <data> -o
    /// transport=uring`: requests over FUSE over io_uring, checked after
    /// mounting (`mapfs stats --json` must say `uring`: a kernel that does
    /// not offer it would otherwise give a `/dev/fuse` mount silently).
    /// Skipped when the kernel's switch ([`ENABLE_URING`]) is off and this
    /// process cannot turn it on.
    MapfsUring {
        /// The `--data` mode.
        data: &'static str,
    },
    /// libfuse's `passthrough_hp BACKING MNT`, the program named by
    /// [`PASSTHROUGH_HP_ENV`] (`scripts/passthrough-hp.sh` builds it from
    /// libfuse 3.18+); the row is skipped when the variable is unset.
    ///
    /// Started with its defaults, which are its fastest mode and what the
    /// mapfs rows do: reads and writes by kernel passthrough
    /// (`FUSE_CAP_PASSTHROUGH`, as `--data passthrough`; it then turns the
    /// writeback cache off), `splice`, libfuse's worker threads, and
    /// `default_permissions` (which it always adds, as mapfs does, so the
    /// kernel checks permissions with the same parent `GETATTR`s). Its
    /// entry and attribute timeouts are one day (without `--nocache`), as
    /// mapfs's `--exclusive` rows keep names and attributes, where the
    /// other mapfs rows keep them 1 s; sound here for the reason given at
    /// [`Setup::Exclusive`]. `--foreground` keeps the daemon the bench's
    /// own child, so that teardown waits for it and its log (with
    /// `FUSE_INIT_STATUS=1`, libfuse's report of what `INIT` negotiated)
    /// can be read: the `uring` row must report `io_uring=on`, the other
    /// `io_uring=off`.
    PassthroughHp {
        /// `-o io_uring`: FUSE over io_uring. The kernel's switch
        /// ([`ENABLE_URING`]) is turned on first if it is off and this
        /// process may; the row is skipped if it stays off.
        uring: bool,
    },
    /// No mount: the workload runs under `mapfs run --embed
    /// FS:BACKING:DIR`, DIR existing only inside its processes (so only
    /// workloads run by a worker under the command prefix work there).
    Embedded {
        /// The file system.
        fs: &'static str,
        /// Over an empty store of its own, as [`Setup::OwnStore`] (the
        /// configurations' mounts are all up while workloads run, and a
        /// versions mount of the backing directory refuses other
        /// instances there).
        own_store: bool,
        /// `FS:BACKING:DIR:exclusive`: the job keeps resolved directories.
        /// Sound in a benchmark for the same reason as
        /// [`Setup::Exclusive`].
        exclusive: bool,
    },
    /// `mapfs mount <fs> BACKING MNT --data <data>`: another file system
    /// than passthrough.
    MapfsFs {
        /// The file system.
        fs: &'static str,
        /// The `--data` mode; [`DAEMON_WRITEBACK`] for `--data daemon
        /// --writeback-cache on`.
        data: &'static str,
    },
    /// `mapfs mount <fs> STORE MNT --data <data>` over an empty store of
    /// its own (a file system whose backing directory is its private
    /// format, as pack's): STORE is a fresh directory in the benchmark's
    /// work directory, and the work directory is made again inside the
    /// mount. Only the workloads that make their own files run there (the
    /// read workloads' preallocated files are not in it).
    OwnStore {
        /// The file system.
        fs: &'static str,
        /// The `--data` mode.
        data: &'static str,
    },
    /// `mapfs mount <fs> BACKING MNT --data <data> --exclusive`. Sound in
    /// a benchmark whose other configurations change the same backing
    /// directory only because every workload leaves it as it found it
    /// (and the read files are made before any mount looks at them).
    Exclusive {
        /// The file system.
        fs: &'static str,
        /// The `--data` mode.
        data: &'static str,
    },
}

/// A [`Setup::MapfsFs`] data mode: `--data daemon --writeback-cache on`
/// (plfs's opens then share one map per file).
pub const DAEMON_WRITEBACK: &str = "daemon+writeback";

/// The environment variable naming libfuse's `passthrough_hp` executable
/// for the [`Setup::PassthroughHp`] rows.
pub const PASSTHROUGH_HP_ENV: &str = "MAPFS_PASSTHROUGH_HP";

/// The kernel's switch for FUSE over io_uring (read at each mount's `INIT`).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// What the workload command runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrap {
    /// Nothing: the workload runs as is.
    None,
    /// `mapfs run <args> --` before the workload command.
    MapfsRun(&'static [&'static str]),
}

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDef {
    /// Name as accepted by `--configs` and shown in tables.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// Directory set-up.
    pub setup: Setup,
    /// Command wrapper.
    pub wrap: Wrap,
}

/// Every configuration, in table order; `native` first because every ratio
/// is relative to it.
pub const CONFIGS: &[ConfigDef] = &[
    ConfigDef {
        name: "native",
        about: "the workload runs on the backing directory",
        setup: Setup::Native,
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "fuse",
        about: "mapfs passthrough fs mounted with --data daemon",
        setup: Setup::Mapfs { data: "daemon" },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "passthrough",
        about: "mapfs passthrough fs mounted with --data passthrough (kernel FUSE passthrough)",
        setup: Setup::Mapfs {
            data: "passthrough",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "passthrough-uring",
        about: "mapfs passthrough fs mounted with --data passthrough -o transport=uring (FUSE over io_uring)",
        setup: Setup::MapfsUring {
            data: "passthrough",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "bindfs",
        about: "reference: bindfs BACKING MNT (Debian's bindfs, an existing FUSE passthrough)",
        setup: Setup::Bindfs,
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "passthrough_hp",
        about: "peer: libfuse's passthrough_hp BACKING MNT over /dev/fuse ($MAPFS_PASSTHROUGH_HP, built by scripts/passthrough-hp.sh)",
        setup: Setup::PassthroughHp { uring: false },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "passthrough_hp-uring",
        about: "peer: libfuse's passthrough_hp -o io_uring BACKING MNT (FUSE over io_uring)",
        setup: Setup::PassthroughHp { uring: true },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "preload",
        about:
            "mapfs passthrough fs mounted with --data auto, workload under mapfs run (preload shim)",
        setup: Setup::Mapfs { data: "auto" },
        wrap: Wrap::MapfsRun(&[]),
    },
    ConfigDef {
        name: "auto",
        about: "mapfs passthrough fs mounted with --data auto (the preload row's mount, without the shim)",
        setup: Setup::Mapfs { data: "auto" },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "plfs",
        about: "mapfs plfs fs mounted with --data auto",
        setup: Setup::MapfsFs {
            fs: "plfs",
            data: "auto",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "plfs-writeback",
        about: "mapfs plfs fs mounted with --data daemon --writeback-cache on (the kernel buffers writes; the opens of a file share one log)",
        setup: Setup::MapfsFs {
            fs: "plfs",
            data: DAEMON_WRITEBACK,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "plfs-preload",
        about: "mapfs plfs fs mounted with --data auto, workload under mapfs run (preload shim)",
        setup: Setup::MapfsFs {
            fs: "plfs",
            data: "auto",
        },
        wrap: Wrap::MapfsRun(&[]),
    },
    ConfigDef {
        name: "pack",
        about: "mapfs pack fs (many small files in a few pack files) mounted with --data auto, over a store of its own",
        setup: Setup::OwnStore {
            fs: "pack",
            data: "auto",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "pack-preload",
        about: "the pack configuration, workload under mapfs run (preload shim)",
        setup: Setup::OwnStore {
            fs: "pack",
            data: "auto",
        },
        wrap: Wrap::MapfsRun(&[]),
    },
    ConfigDef {
        name: "versions",
        about: "mapfs versions fs (every overwrite keeps the old bytes) mounted with --data auto",
        setup: Setup::MapfsFs {
            fs: "versions",
            data: "auto",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "versions-preload",
        about: "mapfs versions fs mounted with --data auto over a store of its own (one versions mount per directory), workload under mapfs run (preload shim)",
        setup: Setup::OwnStore {
            fs: "versions",
            data: "auto",
        },
        wrap: Wrap::MapfsRun(&[]),
    },
    ConfigDef {
        name: "embedded",
        about: "no mount: mapfs passthrough run inside the workload's processes (mapfs run --embed)",
        setup: Setup::Embedded {
            fs: "passthrough",
            own_store: false,
            exclusive: false,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "embedded-excl",
        about: "no mount: mapfs passthrough run inside the workload's processes, backing declared the job's own (mapfs run --embed passthrough:B:P:exclusive)",
        setup: Setup::Embedded {
            fs: "passthrough",
            own_store: false,
            exclusive: true,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "embedded-plfs",
        about: "no mount: mapfs plfs run inside the workload's processes (mapfs run --embed)",
        setup: Setup::Embedded {
            fs: "plfs",
            own_store: false,
            exclusive: false,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "embedded-versions",
        about: "no mount: mapfs versions run inside the workload's processes (mapfs run --embed), over a store of its own",
        setup: Setup::Embedded {
            fs: "versions",
            own_store: true,
            exclusive: false,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "embedded-pack",
        about: "no mount: mapfs pack run inside the workload's processes (mapfs run --embed), over a store of its own",
        setup: Setup::Embedded {
            fs: "pack",
            own_store: true,
            exclusive: false,
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "auto-excl",
        about: "mapfs passthrough fs mounted with --data auto --exclusive (long kernel caching)",
        setup: Setup::Exclusive {
            fs: "passthrough",
            data: "auto",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "fuse-excl",
        about: "mapfs passthrough fs mounted with --data daemon --exclusive",
        setup: Setup::Exclusive {
            fs: "passthrough",
            data: "daemon",
        },
        wrap: Wrap::None,
    },
    ConfigDef {
        name: "plfs-excl",
        about: "mapfs plfs fs mounted with --data auto --exclusive",
        setup: Setup::Exclusive {
            fs: "plfs",
            data: "auto",
        },
        wrap: Wrap::None,
    },
];

/// The configurations named in `names`, in table order.
pub fn select(names: &[String]) -> Result<Vec<ConfigDef>> {
    for n in names {
        if !CONFIGS.iter().any(|c| c.name == n) {
            let all: Vec<_> = CONFIGS.iter().map(|c| c.name).collect();
            bail!(
                "unknown configuration {n:?}; configurations: {}",
                all.join(", ")
            );
        }
    }
    Ok(CONFIGS
        .iter()
        .filter(|c| names.iter().any(|n| n == c.name))
        .copied()
        .collect())
}

/// A configuration ready to run workloads.
pub struct Prepared {
    /// The directory that shows the backing directory's content.
    pub root: PathBuf,
    /// Command prefix for the workload (empty = run it directly).
    pub prefix: Vec<OsString>,
    /// The store of a file system mounted over a store of its own
    /// ([`Setup::OwnStore`]), where its files' bytes are kept.
    pub store: Option<PathBuf>,
    /// Unmounts on drop.
    _mount: Option<MountGuard>,
    /// Removes what the mounted file system made in the backing directory
    /// (a version store), after the unmount above.
    _made: Option<RemoveOnDrop>,
}

/// A directory removed when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("mapfs bench: cannot remove {}: {e}", self.0.display());
        }
    }
}

/// What file system `fs` makes in its backing directory the first time it
/// is mounted there, if anything.
fn made_in_backing(fs: &str, backing: &Path) -> Option<PathBuf> {
    (fs == "versions").then(|| backing.join(mapfs_fs::versions::store::STORE_DIR))
}

impl Prepared {
    /// A command running `program` under this configuration's prefix.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match self.prefix.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
        }
    }
}

/// Unmounts a mount point when dropped, so that a failing benchmark leaves
/// nothing mounted. Each command is tried in order until one succeeds.
pub struct MountGuard {
    mnt: PathBuf,
    unmount: Vec<Vec<OsString>>,
    /// A daemon the bench started in the foreground: waited for after the
    /// unmount (which ends it), killed if it does not end.
    daemon: Option<Child>,
}

impl MountGuard {
    /// Unmounts the mapfs mount `mnt` (with `mapfs umount`, then
    /// `fusermount3 -u`, then `umount -l`) when dropped.
    pub fn new(mnt: &Path, mapfs: &Path) -> MountGuard {
        let mnt_os: OsString = mnt.into();
        MountGuard {
            mnt: mnt.to_path_buf(),
            unmount: vec![
                vec![mapfs.into(), "umount".into(), mnt_os.clone()],
                vec!["fusermount3".into(), "-u".into(), mnt_os.clone()],
                vec!["umount".into(), "-l".into(), mnt_os],
            ],
            daemon: None,
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        self.unmount();
        if let Some(mut d) = self.daemon.take() {
            let start = Instant::now();
            while matches!(d.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(10) {
                    eprintln!(
                        "mapfs bench: the daemon of {} did not end after the unmount; killing it",
                        self.mnt.display()
                    );
                    let _ = d.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.wait();
        }
    }
}

impl MountGuard {
    /// Tries the unmount commands in order until the mount is gone.
    fn unmount(&self) {
        // A daemon that failed before mounting left nothing to unmount; a
        // dead mount (ENOTCONN) still needs its unmount.
        if !is_mountpoint(&self.mnt).unwrap_or(true) {
            return;
        }
        for cmd in &self.unmount {
            let ok = Command::new(&cmd[0])
                .args(&cmd[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok && !is_mountpoint(&self.mnt).unwrap_or(false) {
                return;
            }
        }
        eprintln!(
            "mapfs bench: could not unmount {}; run `umount -l {}`",
            self.mnt.display(),
            self.mnt.display()
        );
    }
}

/// Whether `p` is the root of a mount (its device differs from its parent's).
fn is_mountpoint(p: &Path) -> Result<bool> {
    let me = std::fs::metadata(p)?;
    let parent = std::fs::metadata(p.join(".."))?;
    Ok(me.dev() != parent.dev() || me.ino() == parent.ino())
}

/// Runs a mount command, which must return once the mount is ready.
fn run_mount_command(cmd: Command, timeout: Duration) -> Result<()> {
    let r = super::process::run(cmd, timeout)?;
    if !r.status.success() {
        let last = r.error_line();
        bail!(
            "mount failed ({}){}",
            r.status,
            if last.is_empty() {
                String::new()
            } else {
                format!(": {last}")
            }
        );
    }
    Ok(())
}

/// The transport (`uring` or `dev`) that `mapfs stats --json` reports for
/// the mapfs mount `mnt`.
fn mapfs_transport(mapfs: &Path, mnt: &Path) -> Result<String> {
    let mut cmd = Command::new(mapfs);
    cmd.arg("stats").arg("--json").arg(mnt);
    let r = super::process::run(cmd, Duration::from_secs(30))?;
    if !r.status.success() {
        bail!("mapfs stats --json {}: {}", mnt.display(), r.error_line());
    }
    transport_in_stats(&r.stdout)
}

/// `raw.transport` of a `mapfs stats --json` report.
fn transport_in_stats(json: &str) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(json).context("mapfs stats --json")?;
    match v.pointer("/raw/transport").and_then(|t| t.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => bail!("mapfs stats --json has no raw.transport"),
    }
}

/// Makes sure the kernel will offer FUSE over io_uring: turns
/// [`ENABLE_URING`] on if it is off (root), else the row is skipped.
fn uring_switch_on() -> Result<()> {
    let now = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
    if now.trim() == "Y" {
        return Ok(());
    }
    // Failure shows in the read-back below.
    let _ = std::fs::write(ENABLE_URING, "Y");
    let now = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
    if now.trim() != "Y" {
        bail!(
            "skipped: the kernel's FUSE over io_uring is off or absent (Linux 6.14+; as root: \
             echo Y > {ENABLE_URING})"
        );
    }
    Ok(())
}

/// The command line of a [`Setup::PassthroughHp`] row, `exe` being the
/// value of [`PASSTHROUGH_HP_ENV`]: unset or empty skips the row, a path
/// that is not a file is an error (a typo should not pass for a skip).
fn passthrough_hp_command(
    exe: Option<&OsStr>,
    backing: &Path,
    mnt: &Path,
    uring: bool,
) -> Result<Command> {
    let exe = match exe {
        Some(e) if !e.is_empty() => Path::new(e),
        _ => bail!(
            "skipped: {PASSTHROUGH_HP_ENV} is not set (the path of libfuse's passthrough_hp, \
             3.18+; scripts/passthrough-hp.sh builds it)"
        ),
    };
    if !exe.is_file() {
        bail!("{PASSTHROUGH_HP_ENV}={}: no such program", exe.display());
    }
    let mut cmd = Command::new(exe);
    cmd.arg("--foreground");
    if uring {
        cmd.args(["-o", "io_uring"]);
    }
    cmd.arg(backing).arg(mnt).env("FUSE_INIT_STATUS", "1");
    Ok(cmd)
}

/// The value of libfuse's `FUSE_INIT: io_uring=` report line in a daemon's
/// log (`on`, or `off:<why>`), if it has been written.
fn init_io_uring(log: &str) -> Option<&str> {
    log.lines()
        .find_map(|l| l.trim().strip_prefix("FUSE_INIT: io_uring="))
}

/// Starts `passthrough_hp` (in the foreground, its output in a temporary
/// file), waits for its mount on `mnt` and its `INIT` report, and checks
/// that the report's transport is the one asked for.
fn start_passthrough_hp(mut cmd: Command, mnt: &Path, uring: bool) -> Result<MountGuard> {
    let mut log = tempfile::tempfile().context("temporary file for the daemon's log")?;
    let shown = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .spawn()
        .with_context(|| format!("cannot run {shown}"))?;
    let mnt_os: OsString = mnt.into();
    let mut guard = MountGuard {
        mnt: mnt.to_path_buf(),
        unmount: vec![
            vec!["fusermount3".into(), "-u".into(), mnt_os.clone()],
            vec!["umount".into(), "-l".into(), mnt_os],
        ],
        daemon: Some(child),
    };
    let mut read_log = || -> Result<String> {
        let mut s = String::new();
        log.rewind()?;
        log.read_to_string(&mut s)?;
        Ok(s)
    };
    let start = Instant::now();
    let report = loop {
        let text = read_log()?;
        // The report is written once INIT is answered, after the mount.
        if let Some(r) = init_io_uring(&text) {
            break r.to_string();
        }
        if let Some(d) = guard.daemon.as_mut() {
            if let Some(st) = d.try_wait()? {
                let last = text.lines().rev().find(|l| !l.trim().is_empty());
                bail!(
                    "passthrough_hp ended ({st}) before its INIT report: {}",
                    last.unwrap_or("no output")
                );
            }
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("passthrough_hp did not report INIT within 30 s ({shown})");
        }
        if is_mountpoint(mnt).unwrap_or(false) {
            // A stat waits for INIT; the report follows.
            let _ = std::fs::metadata(mnt);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    match (uring, report.as_str()) {
        (true, "on") => {}
        (true, r) => bail!("passthrough_hp -o io_uring got no FUSE over io_uring: io_uring={r}"),
        (false, "on") => bail!("passthrough_hp without -o io_uring reports io_uring=on"),
        (false, _) => {}
    }
    Ok(guard)
}

/// Whether `prog` is on PATH.
fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Sets up configuration `def` over `backing`, mounting (if it mounts) on
/// `mnt_parent/<name>`; `mapfs` is the mapfs executable.
pub fn prepare(
    def: &ConfigDef,
    backing: &Path,
    work: &OsStr,
    mnt_parent: &Path,
    mapfs: &Path,
) -> Result<Prepared> {
    let mut prefix = match def.wrap {
        Wrap::None => vec![],
        Wrap::MapfsRun(args) => {
            let mut p: Vec<OsString> = vec![mapfs.into(), "run".into()];
            p.extend(args.iter().map(OsString::from));
            p.push("--".into());
            p
        }
    };
    let mut own: Option<PathBuf> = None;
    let mut made: Option<RemoveOnDrop> = None;
    let (root, guard) = match def.setup {
        Setup::Native => (backing.to_path_buf(), None),
        Setup::Embedded {
            fs,
            own_store,
            exclusive,
        } => {
            let store = if own_store {
                let s = backing.join(work).join(format!(".{}-store", def.name));
                std::fs::create_dir_all(&s)?;
                own = Some(s.clone());
                s
            } else {
                made = made_in_backing(fs, backing)
                    .filter(|d| !d.exists())
                    .map(RemoveOnDrop);
                backing.to_path_buf()
            };
            let dir = mnt_parent.join(def.name);
            let mut spec = OsString::from(format!("{fs}:"));
            spec.push(&store);
            spec.push(":");
            spec.push(&dir);
            if exclusive {
                spec.push(":exclusive");
            }
            prefix = vec![
                mapfs.into(),
                "run".into(),
                "--embed".into(),
                spec,
                "--".into(),
            ];
            if own_store {
                // Made through the file system: a store in a format of its
                // own (pack's) has no directories of the backing's.
                let st = Command::new(&prefix[0])
                    .args(&prefix[1..])
                    .arg("mkdir")
                    .arg("-p")
                    .arg(dir.join(work))
                    .stdin(Stdio::null())
                    .status()?;
                if !st.success() {
                    bail!("{}: cannot make the work directory in its store", def.name);
                }
            }
            (dir, None)
        }
        Setup::Mapfs { .. }
        | Setup::MapfsUring { .. }
        | Setup::MapfsFs { .. }
        | Setup::OwnStore { .. }
        | Setup::Exclusive { .. } => {
            let (fs, data, exclusive) = match def.setup {
                Setup::MapfsFs { fs, data } | Setup::OwnStore { fs, data } => (fs, data, false),
                Setup::Exclusive { fs, data } => (fs, data, true),
                Setup::Mapfs { data } | Setup::MapfsUring { data } => ("passthrough", data, false),
                _ => unreachable!("matched above"),
            };
            let own_store = matches!(def.setup, Setup::OwnStore { .. });
            let store = if own_store {
                let s = backing.join(work).join(format!(".{}-store", def.name));
                std::fs::create_dir_all(&s)?;
                own = Some(s.clone());
                s
            } else {
                backing.to_path_buf()
            };
            let mnt = mnt_parent.join(def.name);
            std::fs::create_dir_all(&mnt)?;
            let mut cmd = Command::new(mapfs);
            cmd.arg("mount").arg(fs).arg(&store).arg(&mnt);
            if data == DAEMON_WRITEBACK {
                cmd.args(["--data", "daemon", "--writeback-cache", "on"]);
            } else {
                cmd.args(["--data", data]);
            }
            if exclusive {
                cmd.arg("--exclusive");
            }
            let uring = matches!(def.setup, Setup::MapfsUring { .. });
            if uring {
                // The daemon would fall back to /dev/fuse: say so as a skip
                // rather than fail the row below.
                uring_switch_on()?;
                cmd.args(["-o", "transport=uring"]);
            }
            // Set before mounting: a mount that fails after making it
            // leaves nothing behind either.
            made = made_in_backing(fs, &store)
                .filter(|d| !d.exists())
                .map(RemoveOnDrop);
            run_mount_command(cmd, Duration::from_secs(60))?;
            if own_store {
                std::fs::create_dir(mnt.join(work))?;
            }
            let mnt_os: OsString = mnt.clone().into();
            let guard = MountGuard {
                mnt: mnt.clone(),
                unmount: vec![
                    vec![mapfs.into(), "umount".into(), mnt_os.clone()],
                    vec!["fusermount3".into(), "-u".into(), mnt_os.clone()],
                    vec!["umount".into(), "-l".into(), mnt_os],
                ],
                daemon: None,
            };
            if uring {
                // The daemon reports `dev` until its queues have taken
                // their first requests; a stat of the root makes some.
                let start = Instant::now();
                loop {
                    let _ = std::fs::metadata(&mnt);
                    let t = mapfs_transport(mapfs, &mnt)?;
                    if t == "uring" {
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(10) {
                        bail!(
                            "mounted with -o transport=uring but served over {t:?} \
                             (the kernel did not offer FUSE over io_uring; see the daemon's log)"
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            (mnt, Some(guard))
        }
        Setup::PassthroughHp { uring } => {
            let exe = std::env::var_os(PASSTHROUGH_HP_ENV);
            if uring {
                uring_switch_on()?;
            }
            let mnt = mnt_parent.join(def.name);
            std::fs::create_dir_all(&mnt)?;
            let cmd = passthrough_hp_command(exe.as_deref(), backing, &mnt, uring)?;
            let guard = start_passthrough_hp(cmd, &mnt, uring)?;
            (mnt, Some(guard))
        }
        Setup::Bindfs => {
            if !on_path("bindfs") {
                bail!("skipped: bindfs is not installed (apt-get install bindfs)");
            }
            let mnt = mnt_parent.join(def.name);
            std::fs::create_dir_all(&mnt)?;
            let mut cmd = Command::new("bindfs");
            cmd.arg(backing).arg(&mnt);
            run_mount_command(cmd, Duration::from_secs(60))?;
            let mnt_os: OsString = mnt.clone().into();
            let guard = MountGuard {
                mnt: mnt.clone(),
                unmount: vec![
                    vec!["fusermount3".into(), "-u".into(), mnt_os.clone()],
                    vec!["umount".into(), "-l".into(), mnt_os],
                ],
                daemon: None,
            };
            (mnt, Some(guard))
        }
    };
    if guard.is_some() && !is_mountpoint(&root).unwrap_or(false) {
        bail!("{} is not a mount point after mounting", root.display());
    }
    Ok(Prepared {
        root,
        prefix,
        store: own,
        _mount: guard,
        _made: made,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_first_and_names_unique() {
        assert_eq!(CONFIGS[0].name, "native");
        let mut names: Vec<_> = CONFIGS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CONFIGS.len());
    }

    #[test]
    fn selection() {
        let s = select(&["bindfs".into(), "native".into()]).unwrap();
        assert_eq!(
            s.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["native", "bindfs"]
        );
        assert!(select(&["nfs".into()]).is_err());
    }

    #[test]
    fn passthrough_hp_rows_skip_without_the_variable() {
        let (b, m) = (Path::new("/b"), Path::new("/m"));
        for exe in [None, Some(OsStr::new(""))] {
            let e = passthrough_hp_command(exe, b, m, false).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("skipped: "), "{msg}");
            assert!(msg.contains(PASSTHROUGH_HP_ENV), "{msg}");
        }
        // A wrong path is an error, not a skip.
        let e = passthrough_hp_command(Some(OsStr::new("/nonexistent/passthrough_hp")), b, m, true)
            .unwrap_err()
            .to_string();
        assert!(!e.starts_with("skipped"), "{e}");
        assert!(e.contains("/nonexistent/passthrough_hp"), "{e}");
    }

    #[test]
    fn passthrough_hp_command_line() {
        let exe = std::env::current_exe().unwrap();
        let (b, m) = (Path::new("/back"), Path::new("/mnt"));
        let args = |uring| -> Vec<String> {
            let c = passthrough_hp_command(Some(exe.as_os_str()), b, m, uring).unwrap();
            assert_eq!(c.get_program(), exe.as_os_str());
            assert!(c
                .get_envs()
                .any(|(k, v)| k == "FUSE_INIT_STATUS" && v == Some(OsStr::new("1"))));
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(args(false), ["--foreground", "/back", "/mnt"]);
        assert_eq!(
            args(true),
            ["--foreground", "-o", "io_uring", "/back", "/mnt"]
        );
    }

    #[test]
    fn init_report_and_stats_transport() {
        let log = "FUSE_INIT: FUSE_CAP_PASSTHROUGH\nFUSE_INIT: FUSE_CAP_OVER_IO_URING\n\
                   FUSE_INIT: io_uring=on\nFUSE_INIT: proto_minor=45\n";
        assert_eq!(init_io_uring(log), Some("on"));
        assert_eq!(
            init_io_uring("FUSE_INIT: io_uring=off:not_offered\n"),
            Some("off:not_offered")
        );
        assert_eq!(init_io_uring("FUSE_INIT: FUSE_CAP_OVER_IO_URING\n"), None);
        assert_eq!(init_io_uring(""), None);
        let json =
            r#"{"mountpoint":"/m","requests":3,"raw":{"transport":"uring","uring_requests":2}}"#;
        assert_eq!(transport_in_stats(json).unwrap(), "uring");
        assert!(transport_in_stats(r#"{"raw":{}}"#).is_err());
        assert!(transport_in_stats("not json").is_err());
    }

    #[test]
    fn uring_rows_exist() {
        let s = select(&[
            "passthrough_hp-uring".into(),
            "passthrough-uring".into(),
            "passthrough_hp".into(),
        ])
        .unwrap();
        assert_eq!(
            s.iter().map(|c| c.setup).collect::<Vec<_>>(),
            [
                Setup::MapfsUring {
                    data: "passthrough"
                },
                Setup::PassthroughHp { uring: false },
                Setup::PassthroughHp { uring: true },
            ]
        );
    }

    #[test]
    fn wrapped_command_puts_prefix_first() {
        let def = ConfigDef {
            name: "x",
            about: "",
            setup: Setup::Native,
            wrap: Wrap::MapfsRun(&["--attach", "/m"]),
        };
        let t = tempfile::tempdir().unwrap();
        let p = prepare(
            &def,
            t.path(),
            OsStr::new("w"),
            t.path(),
            Path::new("/bin/mapfs"),
        )
        .unwrap();
        let c = p.command("fio");
        assert_eq!(c.get_program(), "/bin/mapfs");
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["run", "--attach", "/m", "--", "fio"]);
        let plain = prepare(
            &CONFIGS[0],
            t.path(),
            OsStr::new("w"),
            t.path(),
            Path::new("/bin/mapfs"),
        )
        .unwrap();
        assert_eq!(plain.command("fio").get_program(), "fio");
        assert_eq!(plain.root, t.path());
    }
}
