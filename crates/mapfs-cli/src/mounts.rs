//! The mount table (`/proc/self/mountinfo`) and per-mount runtime files.
//!
//! Runtime files live in a directory only their owner can write
//! ([`runtime_dir`]): `/run/mapfs` (root, 0755) or a per-user directory.
//! Per mount: `<escaped mountpoint>.pid` (the daemon's pid, 0644),
//! `.json` (what `list` shows: [`MountInfo`]) and `.log` (the daemon's
//! log, rotated to `.log.1` at the next mount).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use mapfs::control::{escape, unescape_mountinfo};

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// File system type (`fuse.mapfs` for ours).
    pub fstype: String,
    /// Mount source (the backing directory for ours).
    pub source: String,
}

/// The file system type of every mapfs mount, root-made ones included.
pub const MAPFS_FSTYPE: &str = mapfs_fuse::FSTYPE;

/// Prefix of the source of mounts made by older mapfs versions
/// (`mapfs-<fs>:<backing>`, type plain `fuse` when made by root).
pub const MAPFS_SOURCE_PREFIX: &str = "mapfs-";

impl MountEntry {
    /// True for mounts served by a mapfs daemon. The same rule as the
    /// preload shim's (`mapfs-preload/src/mounts.rs`): type `fuse.mapfs`, or
    /// an older root mount, plain `fuse` with a `mapfs-` source.
    pub fn is_mapfs(&self) -> bool {
        self.fstype == MAPFS_FSTYPE
            || (self.fstype == "fuse" && self.source.starts_with(MAPFS_SOURCE_PREFIX))
    }
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mountpoint = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let source = post.next().unwrap_or("");
            Some(MountEntry {
                mountpoint: PathBuf::from(unescape_mountinfo(mountpoint)),
                fstype: fstype.to_string(),
                source: unescape_mountinfo(source),
            })
        })
        .collect()
}

/// The current mount table.
pub fn mount_table() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The mount at exactly `path`, if any (the last one wins, as in the kernel).
pub fn mounted_at(path: &Path) -> Option<MountEntry> {
    mount_table()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path)
}

/// The backing directory a command about file system `fs` (`versions`,
/// `pack`, `plfs`) works on, given `path` as the user gave it: the
/// mountpoint of a mapfs mount of `fs` (its daemon says what it serves;
/// the info file or the mount table's source when it does not answer), or
/// else `path` itself, taken as a backing directory. A mountpoint of
/// another file system is an error that says what was expected.
pub fn backing_of(path: &Path, fs: &str) -> Result<PathBuf> {
    // A dead mount cannot be canonicalized (stat fails): fall back to the
    // absolute path as given, which is what the mount table holds then.
    let abs = path
        .canonicalize()
        .or_else(|_| std::path::absolute(path))
        .with_context(|| format!("bad path {}", path.display()))?;
    let Some(m) = mounted_at(&abs).filter(MountEntry::is_mapfs) else {
        return Ok(path.to_path_buf());
    };
    let (served, backing) =
        match mapfs::control::status(&mapfs::control::socket_path(&m.mountpoint)) {
            Ok(st) => (Some(st.fs), st.backing),
            Err(_) => match read_info(&m.mountpoint) {
                Some(i) => (Some(i.fs), i.backing),
                None => (None, m.source.clone()),
            },
        };
    if let Some(served) = served.filter(|s| s != fs) {
        bail!(
            "{} is a mount of `{served}`, not `{fs}`: expected the mountpoint of a \
             `{fs}` mount or its backing directory",
            abs.display()
        );
    }
    Ok(PathBuf::from(backing))
}

/// Directory for daemon logs and pid files (see [`ensure_runtime_dir`]).
pub fn runtime_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        PathBuf::from("/run/mapfs")
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("mapfs")
    } else {
        std::env::temp_dir().join(format!("mapfs-{}", rustix::process::geteuid().as_raw()))
    }
}

/// Log file of the daemon serving `mountpoint`.
pub fn log_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.log", escape(mountpoint)))
}

/// Pid file of the daemon serving `mountpoint`.
pub fn pid_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pid", escape(mountpoint)))
}

/// Creates [`runtime_dir`] if needed and checks that nobody else can write
/// to it, since `umount` and `list` trust what is in it: owned by us, 0755
/// (root) or 0700 (a per-user directory), not writable by group or others.
pub fn ensure_runtime_dir() -> Result<PathBuf> {
    let dir = runtime_dir();
    let root = rustix::process::geteuid().is_root();
    let mode = if root { 0o755 } else { 0o700 };
    match std::fs::DirBuilder::new().mode(mode).create(&dir) {
        Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("cannot stat {}", dir.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        bail!(
            "{} is not a directory owned by uid {me}: remove it and mount again",
            dir.display()
        );
    }
    if meta.mode() & 0o022 != 0 {
        // Ours, but others could plant pid files: tighten it.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    }
    Ok(dir)
}

/// What the daemon of a mount records for `list`, next to its pid file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MountInfo {
    /// The daemon's pid.
    pub pid: u32,
    /// The program serving it (`mapfs`, or a file system's own binary).
    pub program: String,
    /// File system name.
    pub fs: String,
    /// Backing directory (directories, `:`-separated, for layered ones).
    pub backing: String,
    /// `--data` as given: auto, daemon or passthrough.
    pub data: String,
    /// Whether the kernel accepted backing files on the connection at mount
    /// (kernel passthrough really in use for whole-file maps).
    pub passthrough_active: bool,
    /// Kernel writeback cache requested (`--data daemon` only).
    pub writeback_cache: bool,
    /// Mount time, seconds since the epoch.
    pub started_unix: u64,
    /// The supervisor that restarts the daemon if it dies (`None`: served
    /// without one, e.g. `--foreground`).
    #[serde(default)]
    pub supervisor_pid: Option<u32>,
}

/// Info file of the daemon serving `mountpoint`.
pub fn info_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.json", escape(mountpoint)))
}

/// Writes `contents` to a new `path` readable by all and writable by its
/// owner only, whatever the umask (the daemon runs with umask 0).
///
/// The file is written under a temporary name and renamed into place: a
/// mount starting beside this one runs [`remove_stale`], which took a pid
/// file caught between its creation and its first byte for a dead daemon's
/// and removed it (a test saw this pid file missing).
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    write_new(path, contents, false).map(drop)
}

/// Writes the pid file `path` of this daemon as [`write_private`] does,
/// holding a shared `flock` on it from before it has its name: the
/// returned file keeps the lock for as long as the daemon keeps it open.
/// [`remove_stale`] never removes a locked pid file, whatever `kill(pid, 0)`
/// says: a daemon in another pid namespace sees no process under the pid a
/// daemon of this one wrote, and took its live file for a dead one's.
pub fn write_pid_file(path: &Path, pid: u32) -> Result<File> {
    write_new(path, format!("{pid}\n").as_bytes(), true)
}

fn write_new(path: &Path, contents: &[u8], lock: bool) -> Result<File> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    let written = (|| {
        if lock {
            rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)?;
        }
        f.write_all(contents)?;
        std::fs::rename(&tmp, path)
    })()
    .with_context(|| format!("cannot write {}", path.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| f)
}

/// True when some process holds a `flock` on `path` (a live daemon's pid
/// file, see [`write_pid_file`]).
fn locked(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    matches!(
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive),
        Err(rustix::io::Errno::WOULDBLOCK)
    )
}

/// Starts a new log for the daemon of `mountpoint`, keeping the previous one
/// as `.log.1`, so a remount after a crash does not erase what happened.
pub fn new_log(mountpoint: &Path) -> Result<(PathBuf, File)> {
    let log = log_path(mountpoint);
    let mut old = log.clone().into_os_string();
    old.push(".1");
    let _ = std::fs::rename(&log, &old);
    // Readable by the mount's user alone: the daemon logs other users'
    // paths (a root mount's log was 0644 in /run/mapfs). A log kept from
    // before goes the same way.
    let _ = std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o600));
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&log)
        .with_context(|| format!("cannot create log {}", log.display()))?;
    Ok((log, f))
}

/// Removes the pid and info files of daemons that are gone (a crash, a
/// kill): `umount` and `list` must not find them.
pub fn remove_stale() {
    remove_stale_in(&runtime_dir());
}

/// Logs of daemons that are gone kept by [`remove_stale`] (the newest):
/// enough to read what happened to the last mounts, while a machine that
/// mounts and unmounts all day (tests, jobs) does not fill its runtime
/// directory.
pub const KEPT_LOGS: usize = 64;

/// [`remove_stale`] in `dir`: pid and info files of daemons that died,
/// control sockets nobody listens on any more, and logs of daemons that
/// are gone but the newest [`KEPT_LOGS`].
fn remove_stale_in(dir: &Path) {
    remove_stale_pids(dir);
    remove_leftovers(dir);
}

/// Sockets, info files and old logs of mountpoints with no pid file (a
/// daemon that died, whose pid file [`remove_stale_pids`] removed, or one
/// that unmounted: a daemon writes its pid file before it binds its
/// socket, and removes it last).
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Mountpoint names may hold dots: split at the known suffixes.
        let Some((base, ext)) = [".sock", ".json", ".log", ".log.1"]
            .iter()
            .find_map(|x| Some((name.strip_suffix(x)?, *x)))
        else {
            continue;
        };
        if base.starts_with("h-") || dir.join(format!("{base}.pid")).exists() {
            // Hashed socket names do not say their mountpoint.
            continue;
        }
        match ext {
            ".sock" => {
                // Whoever still listens keeps it (a daemon that could not
                // write its pid file).
                let refused = std::os::unix::net::UnixStream::connect(&path)
                    .is_err_and(|e| e.raw_os_error() == Some(libc::ECONNREFUSED));
                if refused {
                    let _ = std::fs::remove_file(&path);
                }
            }
            ".json" => {
                let alive = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<MountInfo>(&b).ok())
                    .is_some_and(|i| process_alive(i.pid as i32));
                if !alive {
                    let _ = std::fs::remove_file(&path);
                }
            }
            ".log" | ".log.1" => {
                if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                    logs.push((m, path));
                }
            }
            _ => {}
        }
    }
    if logs.len() > KEPT_LOGS {
        logs.sort_by_key(|l| std::cmp::Reverse(l.0));
        for (_, path) in logs.drain(KEPT_LOGS..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// True when a process numbered `pid` exists (in this pid namespace): for
/// tidying runtime files only, never to prove who a peer is.
fn process_alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Pid files (and their info files) of daemons that died.
fn remove_stale_pids(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "pid") {
            continue;
        }
        let Ok(before) = std::fs::read_to_string(&path) else {
            continue;
        };
        let alive = before.trim().parse::<i32>().is_ok_and(process_alive);
        // Only while it still names the dead process: a daemon that took
        // over the mount (failover) may have just written its own.
        if !alive && !locked(&path) && std::fs::read_to_string(&path).is_ok_and(|now| now == before)
        {
            let _ = std::fs::remove_file(&path);
            let json = path.with_extension("json");
            let names_dead = std::fs::read(&json)
                .ok()
                .and_then(|b| serde_json::from_slice::<MountInfo>(&b).ok())
                .is_none_or(|i| i.pid.to_string() == before.trim());
            if names_dead {
                let _ = std::fs::remove_file(json);
            }
        }
    }
}

/// The daemon's record of `mountpoint`, if it left one.
pub fn read_info(mountpoint: &Path) -> Option<MountInfo> {
    let text = std::fs::read_to_string(info_path(mountpoint)).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid file being (re)written by a live daemon is never taken for a
    /// dead one's by a `remove_stale` running beside it.
    #[test]
    fn a_pid_file_being_written_is_never_removed_as_stale() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("m.pid");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cleaner = {
            let (dir, stop) = (dir.path().to_path_buf(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    remove_stale_in(&dir);
                }
            })
        };
        let me = format!("{}\n", std::process::id());
        let mut lost = 0;
        for _ in 0..20_000 {
            write_private(&pid, me.as_bytes()).unwrap();
            if std::fs::read_to_string(&pid).ok().as_deref() != Some(me.as_str()) {
                lost += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        cleaner.join().unwrap();
        assert_eq!(lost, 0, "pid files removed as stale while being written");
        let mode = std::fs::metadata(&pid).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "temporary files left: {left:?}");
    }

    /// A pid file naming a process this one cannot see (a daemon in another
    /// pid namespace wrote it, or here: a pid that has exited) stays while a
    /// daemon holds its lock, and goes as stale once none does.
    #[test]
    fn a_locked_pid_file_is_never_removed_as_stale() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("m.pid");
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let held = write_pid_file(&pid, gone_pid).unwrap();
        remove_stale_in(dir.path());
        assert_eq!(
            std::fs::read_to_string(&pid).unwrap(),
            format!("{gone_pid}\n"),
            "a locked pid file was removed"
        );
        drop(held);
        // A child another test thread forks holds every descriptor of this
        // process, the lock's too, until it execs: the file is stale once
        // that moment has passed.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            remove_stale_in(dir.path());
            if !pid.exists() || std::time::Instant::now() > until {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!pid.exists(), "a stale pid file stayed");
    }

    /// What dead daemons leave goes: their sockets (nobody listens), info
    /// files and logs beyond the newest [`KEPT_LOGS`]; a live daemon's
    /// socket and log, and a listening socket without a pid file, stay.
    #[test]
    fn leftovers_of_dead_daemons_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A live daemon: locked pid file, listening socket, log.
        let held = write_pid_file(&d.join("live.pid"), std::process::id()).unwrap();
        let _live = std::os::unix::net::UnixListener::bind(d.join("live.sock")).unwrap();
        std::fs::write(d.join("live.log"), "live").unwrap();
        // A listener whose pid file could not be written.
        let _orphan = std::os::unix::net::UnixListener::bind(d.join("nopid.sock")).unwrap();
        // Dead daemons: sockets nobody listens on, info files, logs.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        std::fs::write(d.join("mnt-a.b.log"), "dotted, newest").unwrap();
        for i in 0..KEPT_LOGS + 5 {
            drop(std::os::unix::net::UnixListener::bind(d.join(format!("dead{i}.sock"))).unwrap());
            std::fs::write(d.join(format!("dead{i}.log")), "x").unwrap();
            let info = format!(
                "{{\"pid\":{gone_pid},\"program\":\"mapfs\",\"fs\":\"passthrough\",\"backing\":\"/b\",\"data\":\"auto\",\"passthrough_active\":true,\"writeback_cache\":false,\"started_unix\":0}}"
            );
            std::fs::write(d.join(format!("dead{i}.json")), info).unwrap();
            let t =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(d.join(format!("dead{i}.log")))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        remove_stale_in(d);
        let has = |n: &str| d.join(n).exists();
        assert!(
            has("live.sock") && has("live.log") && has("live.pid"),
            "a live daemon's files went"
        );
        assert!(has("nopid.sock"), "a listening socket went");
        for i in 0..KEPT_LOGS + 5 {
            assert!(!has(&format!("dead{i}.sock")), "dead{i}.sock stayed");
            assert!(!has(&format!("dead{i}.json")), "dead{i}.json stayed");
            // The newest logs stay (the highest numbers here).
            assert_eq!(has(&format!("dead{i}.log")), i >= 6, "dead{i}.log");
        }
        assert!(has("mnt-a.b.log"), "the newest log went");
        drop(held);
    }

    #[test]
    fn parses_mountinfo_with_escapes() {
        let t = "36 35 0:30 / /mnt/a\\040b rw,relatime shared:1 - fuse.mapfs mapfs-passthrough:/x rw,user_id=0\n\
                 22 1 8:1 / / rw - ext4 /dev/vda rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].fstype, MAPFS_FSTYPE);
        assert_eq!(m[0].source, "mapfs-passthrough:/x");
        assert_eq!(m[1].fstype, "ext4");
    }
}
