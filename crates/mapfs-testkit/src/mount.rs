//! Real mounts for integration tests.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a `mapfs mount`/`umount` may take before the test gives up on it;
/// generous because CI machines are slow, and only reached on a hang.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The `--data` mode of a mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataMode {
    /// Kernel passthrough where possible, daemon otherwise.
    Auto,
    /// Every read and write runs in the daemon (with the kernel's writeback
    /// cache, the default).
    Daemon,
    /// Every read and write runs in the daemon, writeback cache off: strict
    /// close-to-open and synchronous write errors.
    DaemonNoWriteback,
    /// Every read and write runs in the daemon, writeback cache asked for
    /// explicitly (`--writeback-cache on`): the only way plfs gets it, its
    /// opens of a file then sharing one map.
    DaemonWriteback,
    /// Kernel FUSE passthrough for whole-file maps.
    Passthrough,
}

impl DataMode {
    /// The value given to `--data`.
    pub fn as_str(self) -> &'static str {
        match self {
            DataMode::Auto => "auto",
            DataMode::Daemon => "daemon",
            DataMode::DaemonNoWriteback => "daemon-nowb",
            DataMode::DaemonWriteback => "daemon-wb",
            DataMode::Passthrough => "passthrough",
        }
    }

    /// The `mapfs mount` arguments selecting this mode.
    pub fn mount_args(self) -> &'static [&'static str] {
        match self {
            DataMode::Auto => &["--data", "auto"],
            DataMode::Daemon => &["--data", "daemon"],
            DataMode::DaemonNoWriteback => &["--data", "daemon", "--writeback-cache", "off"],
            DataMode::DaemonWriteback => &["--data", "daemon", "--writeback-cache", "on"],
            DataMode::Passthrough => &["--data", "passthrough"],
        }
    }
}

impl std::fmt::Display for DataMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `/dev/fuse` exists (the only reason integration tests may skip).
pub fn fuse_available() -> bool {
    Path::new("/dev/fuse").exists()
}

/// Decodes the octal escapes (`\040` for space...) of a /proc/self/mountinfo field.
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push((v & 0xff) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Mount points currently listed in /proc/self/mountinfo with their fs type.
pub fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mnt = fields.get(4)?;
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?;
            Some((unescape_mountinfo(mnt), (*fstype).to_string()))
        })
        .collect()
}

/// Whether something is mounted exactly at `path` (compared after
/// canonicalising the parent, so the check itself never enters a FUSE mount).
pub fn is_mounted(path: &Path) -> bool {
    let path = canonical_no_enter(path);
    mounts().iter().any(|(m, _)| *m == path)
}

/// Canonicalises `path`'s parent and re-appends the last component: resolving
/// the mount point itself would stat the (possibly hung) FUSE root.
fn canonical_no_enter(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// Output of a command run by the test kit.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// Exit status (`None` when it was killed after `COMMAND_TIMEOUT`).
    pub status: Option<ExitStatus>,
    /// Captured standard output.
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
}

impl CmdOutput {
    /// `true` when the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `cmd` with stdout/stderr captured through files, not pipes: a daemon
/// forked by `mapfs mount` could inherit pipe ends and make a pipe reader wait
/// for the daemon's exit instead of the command's.
pub fn run_captured(cmd: &mut Command) -> Result<CmdOutput> {
    let dir = tempfile::tempdir().context("temp dir for command output")?;
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let out = fs::File::create(&out_path)?;
    let err = fs::File::create(&err_path)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("spawning {cmd:?}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > COMMAND_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(CmdOutput {
        status,
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
    })
}

/// Configures a [`MountSession`].
#[derive(Debug, Clone)]
pub struct MountBuilder {
    mapfs: PathBuf,
    fs: String,
    data: DataMode,
    options: Vec<String>,
    backing: Option<PathBuf>,
    mountpoint: Option<PathBuf>,
    extra_args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl MountBuilder {
    /// File system name (default `passthrough`).
    pub fn fs(mut self, fs: &str) -> Self {
        self.fs = fs.to_string();
        self
    }
    /// Data mode (default [`DataMode::Auto`]).
    pub fn data(mut self, data: DataMode) -> Self {
        self.data = data;
        self
    }
    /// Adds one `-o` option (e.g. `allow_other`).
    pub fn option(mut self, opt: &str) -> Self {
        self.options.push(opt.to_string());
        self
    }
    /// Adds several `-o` options.
    pub fn options<'a>(mut self, opts: impl IntoIterator<Item = &'a str>) -> Self {
        self.options.extend(opts.into_iter().map(str::to_string));
        self
    }
    /// Uses an existing backing directory (not removed on drop).
    pub fn backing(mut self, dir: impl Into<PathBuf>) -> Self {
        self.backing = Some(dir.into());
        self
    }
    /// Uses an existing mount point (not removed on drop).
    pub fn mountpoint(mut self, dir: impl Into<PathBuf>) -> Self {
        self.mountpoint = Some(dir.into());
        self
    }
    /// Sets an environment variable of `mapfs mount` (and so of the daemon
    /// it starts).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// Extra raw arguments appended to the `mapfs mount` command line.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_string());
        self
    }

    /// Runs `mapfs mount` and returns the live session once the mount is listed
    /// in /proc/self/mountinfo.
    pub fn mount(self) -> Result<MountSession> {
        let tmp = tempfile::Builder::new()
            .prefix("mapfs-test-")
            .tempdir()
            .context("creating temp dir")?;
        // Other users (nobody, in permission tests) must be able to reach the
        // mount; tempfile creates 0700 dirs.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755))?;
        let root = fs::canonicalize(tmp.path())?;
        let backing = match &self.backing {
            Some(b) => b.clone(),
            None => {
                let b = root.join("backing");
                fs::create_dir(&b)?;
                fs::set_permissions(&b, fs::Permissions::from_mode(0o755))?;
                b
            }
        };
        let mountpoint = match &self.mountpoint {
            Some(m) => m.clone(),
            None => {
                let m = root.join("mnt");
                fs::create_dir(&m)?;
                fs::set_permissions(&m, fs::Permissions::from_mode(0o755))?;
                m
            }
        };
        let mut cmd = Command::new(&self.mapfs);
        cmd.arg("mount")
            .arg(&self.fs)
            .arg(&backing)
            .arg(&mountpoint)
            .args(self.data.mount_args());
        if !self.options.is_empty() {
            cmd.arg("-o").arg(self.options.join(","));
        }
        cmd.args(&self.extra_args);
        cmd.envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let out = run_captured(&mut cmd)?;
        let mut session = MountSession {
            mapfs: self.mapfs.clone(),
            backing,
            mountpoint,
            tmp: Some(tmp),
            mounted: true,
            mount_output: out.clone(),
            data: self.data,
        };
        if !out.success() {
            // Drop cleans up in case something got mounted despite the error.
            session.mounted = is_mounted(&session.mountpoint);
            bail!(
                "`{cmd:?}` failed ({:?}):\nstdout: {}\nstderr: {}",
                out.status,
                out.stdout,
                out.stderr
            );
        }
        if !is_mounted(&session.mountpoint) {
            session.mounted = false;
            bail!(
                "`{cmd:?}` exited 0 but {} is not in /proc/self/mountinfo\nstderr: {}",
                session.mountpoint.display(),
                out.stderr
            );
        }
        Ok(session)
    }
}

/// A live `mapfs mount`; unmounted (falling back to `fusermount3 -u -z` and
/// `umount -l`) and its temporary directories removed on drop.
#[derive(Debug)]
pub struct MountSession {
    mapfs: PathBuf,
    backing: PathBuf,
    mountpoint: PathBuf,
    tmp: Option<tempfile::TempDir>,
    mounted: bool,
    mount_output: CmdOutput,
    data: DataMode,
}

impl MountSession {
    /// Starts configuring a mount made with the `mapfs` binary at `mapfs`.
    pub fn builder(mapfs: impl Into<PathBuf>) -> MountBuilder {
        MountBuilder {
            mapfs: mapfs.into(),
            fs: "passthrough".to_string(),
            data: DataMode::Auto,
            options: Vec::new(),
            backing: None,
            mountpoint: None,
            extra_args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// Mounts `passthrough` in `data` mode with `opts` over fresh temp dirs.
    pub fn passthrough(mapfs: impl Into<PathBuf>, data: DataMode, opts: &[&str]) -> Result<Self> {
        Self::builder(mapfs)
            .data(data)
            .options(opts.iter().copied())
            .mount()
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The data mode the session was mounted with.
    pub fn data_mode(&self) -> DataMode {
        self.data
    }

    /// A scratch directory next to (outside) the mount, on the same file system
    /// as the backing dir; removed on drop.
    pub fn scratch(&self) -> Option<&Path> {
        self.tmp.as_ref().map(|t| t.path())
    }

    /// What `mapfs mount` printed.
    pub fn mount_output(&self) -> &CmdOutput {
        &self.mount_output
    }

    /// Runs `mapfs umount` and returns its output; the session is considered
    /// unmounted afterwards if the mount point left /proc/self/mountinfo.
    pub fn umount(&mut self) -> Result<CmdOutput> {
        let out = run_captured(
            Command::new(&self.mapfs)
                .arg("umount")
                .arg(&self.mountpoint),
        )?;
        self.mounted = is_mounted(&self.mountpoint);
        Ok(out)
    }

    /// `mapfs umount`, tried again for up to 2 s while it answers that the
    /// mount is busy: a child forked by another thread of the test process
    /// holds copies of that process's open files until its `exec` closes
    /// them. The last attempt's output.
    pub fn umount_settled(&mut self) -> Result<CmdOutput> {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let out = self.umount()?;
            if out.success() || !out.stderr.contains("busy") || std::time::Instant::now() > deadline
            {
                return Ok(out);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn force_unmount(&mut self) {
        if !is_mounted(&self.mountpoint) {
            self.mounted = false;
            return;
        }
        // A child forked by another test thread may hold a file of this
        // mount for a moment ("busy"): retry briefly before forcing.
        for attempt in 0..5 {
            match self.umount() {
                Ok(out) if !self.mounted => {
                    if !out.success() {
                        eprintln!(
                            "mapfs umount unmounted but exited {:?}: {}",
                            out.status, out.stderr
                        );
                    }
                    return;
                }
                Ok(out) if attempt == 4 => eprintln!(
                    "WARNING: `mapfs umount {}` left it mounted ({:?}): {}",
                    self.mountpoint.display(),
                    out.status,
                    out.stderr
                ),
                Ok(_) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => {
                    eprintln!("WARNING: mapfs umount failed: {e:#}");
                    break;
                }
            }
        }
        for fallback in [
            ["fusermount3", "-u", "-z"].as_slice(),
            ["umount", "-l"].as_slice(),
        ] {
            let mut cmd = Command::new(fallback[0]);
            cmd.args(&fallback[1..]).arg(&self.mountpoint);
            let _ = run_captured(&mut cmd);
            if !is_mounted(&self.mountpoint) {
                self.mounted = false;
                return;
            }
        }
    }
}

/// Prints the warnings and the last lines of the log of the daemon that
/// served `mountpoint`, so that a test failing on a machine one cannot log
/// into (CI) says what the daemon saw. The log is found by the
/// `mountpoint=` field of its first line: its file name is the CLI's
/// business.
fn print_daemon_log(mountpoint: &Path) {
    const TAIL: usize = 40;
    let dir = if rustix::process::geteuid().is_root() {
        PathBuf::from("/run/mapfs")
    } else {
        return;
    };
    let needle = format!("mountpoint={}", mountpoint.display());
    let Ok(entries) = fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "log") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        if !text.lines().take(5).any(|l| l.contains(&needle)) {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail_from = lines.len().saturating_sub(TAIL);
        let notable = lines[..tail_from]
            .iter()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .take(TAIL);
        eprintln!(
            "--- daemon log of {} ({}):",
            mountpoint.display(),
            path.display()
        );
        for l in notable.chain(&lines[tail_from..]) {
            eprintln!("  {l}");
        }
        eprintln!("---");
    }
}

impl Drop for MountSession {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_daemon_log(&self.mountpoint);
        }
        if self.mounted || is_mounted(&self.mountpoint) {
            self.force_unmount();
        }
        if is_mounted(&self.mountpoint) {
            // Removing the temp dir would walk into the still-mounted fs.
            if let Some(tmp) = self.tmp.take() {
                let kept = tmp.keep();
                eprintln!(
                    "WARNING: {} is still mounted; leaving {} in place",
                    self.mountpoint.display(),
                    kept.display()
                );
            }
        }
    }
}

/// Lists mount points under `dir` (for "nothing was mounted" assertions).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    mounts()
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| m.starts_with(&dir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(
            unescape_mountinfo("/tmp/a\\040b"),
            PathBuf::from("/tmp/a b")
        );
        assert_eq!(unescape_mountinfo("/x\\"), PathBuf::from("/x\\"));
    }

    #[test]
    fn root_is_mounted() {
        assert!(is_mounted(Path::new("/")));
        assert!(mounts().iter().any(|(m, _)| m == Path::new("/")));
    }
}
