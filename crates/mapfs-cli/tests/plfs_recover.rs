//! plfs writers killed mid-write leave no orphaned log: the
//! daemon under SIGKILL, or a writer under `mapfs run` holding a lent open.
//! The next open of the container, or `mapfs fsck BACKING`, recovers a dead
//! writer's log up to its last flush (the bytes after it cut off) or
//! reclaims a log nothing recorded, and says which. Every file is checked
//! against a byte model. Real mounts, real SIGKILLs; skips loudly without
//! /dev/fuse or python3.

mod common;
mod preload_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use preload_support::{attached, daemon_pid, eventually, need, report_path};

/// Writes `nblocks` blocks of `bs` bytes at block `i * nranks + rank`
/// (`block(rank, i)` below), fsyncs after `sync_after` blocks (0: never)
/// saying `synced`, then says `written` and waits on stdin without closing.
const WRITER: &str = r#"
import os, sys
path, rank, n, bs, nb, sync_after = sys.argv[1], *map(int, sys.argv[2:7])
base = bytes(j % 251 for j in range(bs + 251))
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(nb):
    k = (rank * 7 + i * 13) % 251
    os.pwrite(fd, base[k:k + bs], (i * n + rank) * bs)
    if i + 1 == sync_after:
        os.fsync(fd)
        print('synced', flush=True)
print('written', flush=True)
sys.stdin.readline()
os.close(fd)
"#;

/// The bytes `WRITER` puts in block `i` of rank `rank`.
fn block(rank: u64, i: u64, bs: usize) -> Vec<u8> {
    let k = ((rank * 7 + i * 13) % 251) as usize;
    (k..k + bs).map(|j| (j % 251) as u8).collect()
}

/// The file after blocks `0..n` of one writer (rank 0 of 1).
fn model(n: u64, bs: usize) -> Vec<u8> {
    (0..n).flat_map(|i| block(0, i, bs)).collect()
}

fn mount_plfs(backing: &Path) -> MountSession {
    MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Daemon)
        .backing(backing)
        .arg("--ttl")
        .arg("0")
        // A killed daemon must stay dead here: these tests check what is
        // recovered from its logs afterwards (failover.rs: the supervised
        // case, where a successor takes over and nothing is lost).
        .arg("--no-supervisor")
        .mount()
        .unwrap_or_else(|e| panic!("mount plfs over {}: {e:#}", backing.display()))
}

/// Starts `WRITER` (under `run` when given) and waits for `until`.
fn start_writer(cmd: Option<Command>, file: &Path, bs: usize, nb: u64, sync: u64) -> Child {
    let mut c = cmd.unwrap_or_else(|| Command::new("python3"));
    let mut child = c
        .arg("-c")
        .arg(WRITER)
        .arg(file)
        .args([
            "0",
            "1",
            &bs.to_string(),
            &nb.to_string(),
            &sync.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    if sync > 0 {
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "synced");
        line.clear();
    }
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "written");
    child
}

fn fsck(backing: &Path) -> String {
    let out = Command::new(mapfs_bin())
        .arg("fsck")
        .arg(backing)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mapfs fsck {}: {text}{}",
        backing.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `mapfs fsck` takes the mountpoint as well as the backing directory, and
/// refuses a mountpoint of another file system, saying what it expected.
#[test]
fn fsck_takes_the_mountpoint() {
    let test = "fsck MOUNTPOINT";
    if !fuse_or_skip(test) {
        return;
    }
    let backing = tempfile::tempdir().unwrap();
    let s = mount_plfs(backing.path());
    std::fs::write(s.mountpoint().join("f"), b"x").unwrap();
    let by_mount = fsck(s.mountpoint());
    assert_eq!(by_mount, fsck(backing.path()), "{test}");
    assert!(
        by_mount.contains(&format!("fsck {}: 0 finding(s)", backing.path().display())),
        "{by_mount}"
    );
    let other = MountSession::builder(mapfs_bin())
        .fs("passthrough")
        .mount()
        .unwrap();
    let out = Command::new(mapfs_bin())
        .arg("fsck")
        .arg(other.mountpoint())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a mount of `passthrough`, not `plfs`")
            && err.contains("expected the mountpoint of a `plfs` mount"),
        "{err}"
    );
}

/// `(name, length)` of the container's entries starting with `prefix`.
fn entries(container: &Path, prefix: &str) -> Vec<(String, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(container)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(prefix)
                .then(|| (n, e.metadata().unwrap().len()))
        })
        .collect();
    v.sort();
    v
}

fn kill9(pid: i32) {
    let st = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    assert!(st.is_ok_and(|s| s.success()), "kill -9 {pid}");
}

/// What the next step after the daemon's death checks.
#[derive(Clone, Copy, Debug)]
enum Then {
    Fsck,
    NextOpen,
}

/// The daemon is SIGKILLed while a writer holds an open with `sync` of
/// `nb` blocks flushed (0: none); the log is recovered (or reclaimed) by
/// `then`, and the file equals the model of the flushed blocks.
fn daemon_killed(test: &str, sync: u64, then: Then) {
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let (bs, nb) = (4096usize, 24u64);
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    std::fs::create_dir(&backing).unwrap();
    let mut s = mount_plfs(&backing);
    let file = s.mountpoint().join("ckpt");
    let mut writer = start_writer(None, &file, bs, nb, sync);
    let container = backing.join("ckpt");
    assert_eq!(entries(&container, "data.").len(), 1, "{test}: one log");
    kill9(daemon_pid(&s));
    let _ = writer.kill();
    let _ = writer.wait();
    s.umount_settled()
        .expect("umount of a mount whose daemon died");
    let logs = entries(&container, "data.");
    assert_eq!(logs.len(), 1, "{test}: {logs:?}");
    assert_eq!(
        logs[0].1,
        bs as u64 * nb,
        "{test}: the log holds every write"
    );
    let (log, _) = logs[0].clone();
    let want = model(sync, bs);
    match then {
        Then::Fsck => {
            let out = fsck(&backing);
            let line = out
                .lines()
                .find(|l| l.contains(&log))
                .unwrap_or_else(|| panic!("{test}: fsck says nothing of {log}:\n{out}"));
            if sync > 0 {
                let cut = bs as u64 * (nb - sync);
                assert!(
                    line.contains("recovered") && line.contains(&format!("{cut} unrecorded")),
                    "{test}: {line}"
                );
            } else {
                assert!(line.contains("reclaimed"), "{test}: {line}");
            }
            // Idempotent: nothing left to do.
            let again = fsck(&backing);
            assert!(again.contains(" 0 finding"), "{test}: second fsck: {again}");
        }
        Then::NextOpen => {}
    }
    let s = mount_plfs(&backing);
    let got = std::fs::read(s.mountpoint().join("ckpt")).unwrap();
    assert!(
        got == want,
        "{test}: {} bytes read, model {}",
        got.len(),
        want.len()
    );
    // Recovered or reclaimed by now, whichever path ran: the log holds
    // exactly the recorded bytes, or is gone, and fsck finds nothing more.
    let logs = entries(&container, "data.");
    if sync > 0 {
        assert_eq!(logs, vec![(log, bs as u64 * sync)], "{test}");
    } else {
        assert!(logs.is_empty(), "{test}: {logs:?}");
    }
    let again = fsck(&backing);
    assert!(again.contains(" 0 finding"), "{test}: {again}");
    drop(s);
}

#[test]
fn daemon_killed_after_a_flush_fsck_recovers() {
    daemon_killed("plfs daemon SIGKILL, fsck recovers", 10, Then::Fsck);
}

#[test]
fn daemon_killed_before_any_flush_fsck_reclaims() {
    daemon_killed("plfs daemon SIGKILL, fsck reclaims", 0, Then::Fsck);
}

#[test]
fn daemon_killed_after_a_flush_next_open_recovers() {
    daemon_killed(
        "plfs daemon SIGKILL, next open recovers",
        10,
        Then::NextOpen,
    );
}

#[test]
fn daemon_killed_before_any_flush_next_open_reclaims() {
    daemon_killed("plfs daemon SIGKILL, next open reclaims", 0, Then::NextOpen);
}

/// A writer under `mapfs run` holding a lent open is SIGKILLed after a
/// flush and more writes: the daemon releases the open, and no orphaned log
/// or unrecorded tail is left.
#[test]
fn lent_writer_killed_leaves_no_orphan() {
    let test = "plfs lent writer SIGKILL";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let (bs, nb, sync) = (4096usize, 24u64, 10u64);
    let dir = tempfile::tempdir().unwrap();
    let backing: PathBuf = dir.path().join("backing");
    std::fs::create_dir(&backing).unwrap();
    let s = mount_plfs(&backing);
    let file = s.mountpoint().join("ckpt");
    std::fs::write(&file, b"").unwrap();
    let report = report_path(&s, "lent");
    let mut writer = start_writer(Some(attached(&s, &report, "python3")), &file, bs, nb, sync);
    writer.kill().unwrap();
    writer.wait().unwrap();
    let container = backing.join("ckpt");
    let want = model(sync, bs);
    eventually(
        &format!("{test}: the killed writer's open is released"),
        || {
            entries(&container, "data.")
                .iter()
                .map(|e| e.1)
                .sum::<u64>()
                == want.len() as u64
        },
    );
    assert!(std::fs::read(&file).unwrap() == want, "{test}: bytes");
    let out = fsck(&backing);
    assert!(out.contains(" 0 finding"), "{test}: {out}");
}
