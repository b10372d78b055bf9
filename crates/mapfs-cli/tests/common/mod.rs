//! Shared helpers of the `mapfs` integration tests (each test file includes
//! this module; not every file uses every helper).
#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

// Not every test file uses every helper.
#[allow(unused_imports)]
pub use mapfs_testkit::{fuse_or_skip, need, skip, DataMode, MountSession};
use rustix::io::Errno;

/// Path of the `mapfs` binary under test.
pub fn mapfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_mapfs")
}

/// The data modes every mount test runs in.
pub const MODES: [DataMode; 2] = [DataMode::Daemon, DataMode::Passthrough];

/// Mounts `passthrough` in `mode` with `opts`, panicking with mapfs's output
/// on failure.
pub fn mount(mode: DataMode, opts: &[&str]) -> MountSession {
    MountSession::passthrough(mapfs_bin(), mode, opts)
        .unwrap_or_else(|e| panic!("mounting passthrough --data {mode} -o {opts:?}: {e:#}"))
}

/// A backing directory that outlives the sessions mounted on it (for
/// remounts); the returned guard removes it.
pub fn kept_backing() -> (tempfile::TempDir, PathBuf) {
    let t = native_dir();
    let b = t.path().join("backing");
    fs::create_dir(&b).unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
    (t, b)
}

/// A world-traversable temp dir on the same file system as the mounts' backing
/// dirs (the native control side of a comparison).
pub fn native_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("mapfs-native-")
        .tempdir()
        .expect("temp dir");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Symbolic errno name for messages and observation logs.
pub fn ename(e: Errno) -> String {
    let n = e.raw_os_error();
    let s = match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETXTBSY => "ETXTBSY",
        _ => return format!("errno{n}"),
    };
    s.to_string()
}

/// `"ok"` or the errno name of a syscall result.
pub fn outcome<T>(r: &Result<T, Errno>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => ename(*e),
    }
}

/// A C string of a path, built before forking a [`mapfs_testkit::run_as`] child.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("path without NUL")
}

/// Lines of /proc/self/mountinfo mount points under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mapfs_testkit::mount::mounts_under(dir)
}

/// Runs `f` on the mount of `mode` created with `opts`; skips loudly without
/// /dev/fuse.
pub fn with_mount(test: &str, mode: DataMode, opts: &[&str], f: impl FnOnce(&MountSession)) {
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(mode, opts);
    f(&s);
}

/// A `struct flock` for a record lock of `kind` on `[start, start+len)`
/// (`SEEK_SET`; `len` 0 means to the end of the file).
pub fn flock_struct(kind: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: libc::flock is a plain C struct; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// Runs `sh -c script` in a private mount namespace (`unshare -m`), with
/// `env` set: what it mounts there never reaches the machine's own mount
/// table. `None` when unshare(1) is not installed.
pub fn in_private_mount_ns(
    script: &str,
    env: &[(&str, &Path)],
) -> Option<mapfs_testkit::mount::CmdOutput> {
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let mut cmd = std::process::Command::new(unshare);
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Some(mapfs_testkit::mount::run_captured(&mut cmd).expect("running unshare"))
}

/// Per FUSE opcode: (count, errors), from a parsed `mapfs stats --json`.
pub fn op_counts(v: &serde_json::Value) -> std::collections::HashMap<String, (u64, u64)> {
    v["ops"]
        .as_array()
        .expect("ops array")
        .iter()
        .map(|o| {
            (
                o["op"].as_str().unwrap().to_string(),
                (o["count"].as_u64().unwrap(), o["errors"].as_u64().unwrap()),
            )
        })
        .collect()
}

/// How many `op` requests (a FUSE opcode: `READ`, `IOCTL`...) the mount
/// at `mnt` has answered so far, from `mapfs stats --json`.
pub fn op_count_now(mnt: &Path, op: &str) -> u64 {
    let out = mapfs_testkit::mount::run_captured(
        std::process::Command::new(mapfs_bin())
            .args(["stats", "--json"])
            .arg(mnt),
    )
    .expect("running mapfs stats");
    assert!(
        out.success(),
        "mapfs stats {}: {}",
        mnt.display(),
        out.stderr
    );
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("stats JSON");
    op_counts(&v).get(op).map_or(0, |c| c.0)
}

/// What the `versions` overwrite sequence keeps, oldest first (tests
/// `versions.rs` and `embed_versions.rs`).
pub const VERSIONS_EXPECTED: [&str; 7] = [
    "first version\n",
    "second, by O_TRUNC\n",
    "third, saved by an editor\n",
    "thXrd, saved by an editor\n",
    "th",
    "th+appended",
    "another file renamed over\n",
];

/// The `versions` overwrite sequence in Python (through libc, where the
/// shim and the embedded library are): `python3 -c SEQ DIR EXPECTED...`
/// makes `DIR/doc` go through [`VERSIONS_EXPECTED`].
pub const VERSIONS_SEQUENCE_PY: &str = r#"
import os, sys
d = sys.argv[1]
f = os.path.join(d, "doc")
E = sys.argv[2:]
open(f, "w").write(E[0])
open(f, "w").write(E[1])
open(os.path.join(d, ".doc.swp"), "w").write(E[2])
os.rename(os.path.join(d, ".doc.swp"), f)
fd = os.open(f, os.O_WRONLY); os.pwrite(fd, b"X", 2); os.close(fd)
fd = os.open(f, os.O_WRONLY); os.ftruncate(fd, 2); os.close(fd)
fd = os.open(f, os.O_WRONLY | os.O_APPEND); os.write(fd, b"+appended"); os.close(fd)
open(os.path.join(d, "other"), "w").write(E[6])
os.rename(os.path.join(d, "other"), f)
os.unlink(f)
"#;

/// The thread of process `pid` whose name (`comm`, at most 15 bytes)
/// starts with `name`: its thread id. Panics unless there is exactly one.
pub fn thread_named(pid: u32, name: &str) -> String {
    let found: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process's threads")
        .map(|t| t.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|tid| {
            fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with(name))
        })
        .collect();
    assert_eq!(found.len(), 1, "threads of {pid} named {name}: {found:?}");
    found.into_iter().next().unwrap()
}

/// Field `n` (numbered as in proc(5), from 1) of `/proc/PID/task/TID/stat`.
pub fn task_stat_field(pid: u32, tid: &str, n: usize) -> i64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    // The name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    after_name
        .split(' ')
        .nth(n - 3)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("field {n} of /proc/{pid}/task/{tid}/stat: {stat}"))
}
