//! What the shim costs process-heavy work: a process that only
//! reads a small file never contacts the daemon, and an `exec`ed image
//! carries on with the control connection its predecessor made instead of
//! connecting again (falling back to a fresh connect when the descriptor
//! named in the environment is not that connection any more).
//!
//! Connections are counted by the daemon itself (`Status.connections`:
//! accepted since it started, the `Status` request's own included).
//!
//! Needs the shim built next to `mapfs` (`cargo build --workspace`); skips
//! loudly without /dev/fuse or python3.

mod common;
mod preload_support;

use std::os::unix::fs::MetadataExt;

use common::{fuse_or_skip, DataMode};
use mapfs::control;
use mapfs_testkit::MountSession;
use preload_support::*;

/// Control connections the daemon of `s` accepted so far (this question's
/// own included).
/// Tests that count a mount's connections hold this for reading; a test
/// whose `mapfs run` asks every mount on the machine (no `--mount`) holds
/// it for writing, or its questions would be counted in another test's
/// mount (seen: an exec chain counted 2 connections for 1).
static COUNTING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A read guard of [`COUNTING`] (a failed test's poison is not ours).
fn counting() -> std::sync::RwLockReadGuard<'static, ()> {
    COUNTING.read().unwrap_or_else(|e| e.into_inner())
}

fn accepted(s: &MountSession) -> u64 {
    control::status(&control::socket_path(s.mountpoint()))
        .unwrap_or_else(|e| panic!("status of {}: {e}", s.mountpoint().display()))
        .connections
}

/// Connections that `mapfs run -- true` and one [`accepted`] cost without
/// any process of the command touching a file (`mapfs run` asks each
/// daemon about its writeback cache), to subtract from other counts.
fn baseline(s: &MountSession) -> u64 {
    let report = report_path(s, "baseline");
    let before = accepted(s);
    ok(&mut attached_default(s, &report, "true"));
    accepted(s) - before
}

fn mount_fs(test: &str, fs: &str) -> MountSession {
    mapfs_testkit::MountSession::builder(common::mapfs_bin())
        .fs(fs)
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"))
}

/// A file of `len` bytes that differ from offset to offset.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `cat`, `head` and `wc` of small mount files under the shim with its
/// default policy: right bytes, and not one connection to the daemon; the
/// same processes told to adopt at the first data call do connect (so the
/// count is able to see them).
fn small_reads_never_connect(fs: &str) {
    let test = format!("small reads make no control connection ({fs})");
    if !fuse_or_skip(&test) {
        return;
    }
    let _counting = counting();
    let s = mount_fs(&test, fs);
    let body = pattern(8192, 7);
    std::fs::write(s.mountpoint().join("small"), &body).unwrap();
    let report = report_path(&s, "small");
    let f = s.mountpoint().join("small");
    let script = "cat \"$1\"; head -c 100 \"$1\" >/dev/null; wc -c <\"$1\" >/dev/null; cat \"$1\" \"$1\" >/dev/null";

    let base = baseline(&s);
    let before = accepted(&s);
    let out = ok(attached_default(&s, &report, "sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(&f));
    let after = accepted(&s);
    assert!(
        out.stdout == body,
        "{test}: cat under the shim read other bytes"
    );
    let t = totals(&report, "cat");
    assert!(
        t.tracked >= 3,
        "{test}: the shim did not see cat's opens, so this proves nothing: {t:?}"
    );
    assert_eq!(t.adopted, 0, "{test}: a small read adopted its file: {t:?}");
    assert_eq!(
        after - before,
        base,
        "{test}: processes that only read a small file connected to the daemon"
    );

    // The same processes adopting at once: one connection per process that
    // adopts (cat twice, head, wc), which the count must see.
    let _ = std::fs::remove_file(&report);
    let before = accepted(&s);
    ok(attached(&s, &report, "sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(&f));
    let after = accepted(&s);
    assert!(
        after - before > base,
        "{test}: adopting processes made no connection: the count cannot see one"
    );
}

#[test]
fn small_reads_make_no_control_connection_passthrough() {
    small_reads_never_connect("passthrough");
}

#[test]
fn small_reads_make_no_control_connection_plfs() {
    small_reads_never_connect("plfs");
}

/// The parent image adopts a file (connecting), then `exec`s python again;
/// the new image adopts another file, writes and reads it back. Its bytes
/// are checked against the model here, through the backing store and
/// through the mount. `replace` makes the parent `dup2` /dev/null over the
/// shim's socket first, so the new image must connect afresh.
const EXEC_CHAIN: &str = r#"
import os, sys
mnt, step, replace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if step == "parent":
    with open(os.path.join(mnt, "a"), "rb") as f:
        f.read(4096)
    if replace:
        # The shim's control socket: a socket numbered 512 or above.
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                target = os.readlink("/proc/self/fd/" + name)
            except OSError:
                continue
            if fd >= 512 and target.startswith("socket:"):
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, fd)
    os.execv(sys.executable, [sys.executable, sys.argv[0], mnt, "child", sys.argv[3]])
else:
    # stdin must still be what it was (the shim takes nothing that is not
    # its own).
    os.fstat(0)
    data = bytes((i * 7 + 3) % 256 for i in range(200000))
    with open(os.path.join(mnt, "b"), "wb") as f:
        f.write(data)
    with open(os.path.join(mnt, "b"), "r+b") as f:
        f.seek(1000)
        f.write(b"x" * 5000)
        f.seek(0)
        got = f.read()
    want = data[:1000] + b"x" * 5000 + data[6000:]
    assert got == want, "read back other bytes"
    print("ok")
"#;

fn exec_chain(s: &MountSession, test: &str, replace: bool, env: &[(&str, String)]) -> u64 {
    let script = tempfile::Builder::new()
        .prefix("mapfs-chain.")
        .suffix(".py")
        .tempfile()
        .unwrap();
    std::fs::write(script.path(), EXEC_CHAIN).unwrap();
    let report = report_path(s, &format!("chain-{replace}"));
    let _ = std::fs::remove_file(s.mountpoint().join("b"));
    let before = accepted(s);
    let mut cmd = attached(s, &report, "python3");
    cmd.arg(script.path())
        .arg(s.mountpoint())
        .arg("parent")
        .arg(if replace { "1" } else { "0" });
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = ok(&mut cmd);
    let after = accepted(s);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{test}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data: Vec<u8> = (0..200_000u32).map(|i| ((i * 7 + 3) % 256) as u8).collect();
    let mut want = data.clone();
    want[1000..6000].fill(b'x');
    let through_mount = std::fs::read(s.mountpoint().join("b")).unwrap();
    assert!(through_mount == want, "{test}: the mount shows other bytes");
    let t = totals(&report, "python3");
    assert!(
        t.adopted >= 2 && t.processes == 1,
        "{test}: the images did not adopt their files: {t:?}"
    );
    after - before - baseline(s)
}

fn exec_keeps_connection(fs: &str) {
    let test = format!("an exec'ed image keeps the control connection ({fs})");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let _counting = counting();
    let s = mount_fs(&test, fs);
    std::fs::write(s.mountpoint().join("a"), pattern(10_000, 1)).unwrap();

    let n = exec_chain(&s, &test, false, &[]);
    assert_eq!(
        n, 1,
        "{test}: the exec'ed image connected again instead of using its inherited connection"
    );
    // Replaced behind the shim before exec: a fresh connect, right bytes.
    let n = exec_chain(&s, &test, true, &[]);
    assert_eq!(
        n, 2,
        "{test}: with the socket replaced, the new image must connect afresh"
    );
    // The environment naming a descriptor that is not the connection (fd 0,
    // which the child checks is still open): ignored, a fresh connect.
    let dev = std::fs::metadata(s.mountpoint()).unwrap().dev();
    let bogus = [("MAPFS_PRELOAD_CONNS", format!("{dev},0,12345,-1"))];
    let n = exec_chain(&s, &test, false, &bogus);
    assert_eq!(n, 1, "{test}: a bogus inherited connection was not ignored");
}

#[test]
fn exec_keeps_connection_passthrough() {
    exec_keeps_connection("passthrough");
}

#[test]
fn exec_keeps_connection_plfs() {
    exec_keeps_connection("plfs");
}

/// The process adopts `a` (connecting), lets the daemon close its idle
/// connection, then adopts `b` while the control socket is missing, as
/// while a supervisor replaces the daemon; a thread puts the socket back
/// after `AWAY` seconds.
const SOCKET_AWAY: &str = r#"
import os, sys, threading, time
mnt, sock, away = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(os.path.join(mnt, "a"), "rb") as f:
    f.read()
time.sleep(2.5)  # the daemon closes connections idle for 1 s (it sweeps each second)
os.rename(sock, sock + ".away")
def back():
    time.sleep(away)
    os.rename(sock + ".away", sock)
t = threading.Thread(target=back)
t.start()
with open(os.path.join(mnt, "b"), "rb") as f:
    got = f.read()
t.join()
assert got == bytes((i * 13 + 5) % 256 for i in range(50000)), "other bytes"
print("ok")
"#;

/// A process whose connection ended finds the control socket missing (a
/// daemon being replaced): it keeps trying, and adopts once the socket is
/// back, instead of leaving the file on the mount.
#[test]
fn the_client_waits_for_the_control_socket_to_come_back() {
    let test = "the client reconnects when the control socket comes back";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mapfs_testkit::MountSession::builder(common::mapfs_bin())
        .data(DataMode::Auto)
        .env("MAPFS_CONTROL_IDLE_SECS", "1")
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    std::fs::write(s.mountpoint().join("a"), pattern(10_000, 3)).unwrap();
    let b: Vec<u8> = (0..50_000u32).map(|i| ((i * 13 + 5) % 256) as u8).collect();
    std::fs::write(s.mountpoint().join("b"), &b).unwrap();
    let script = tempfile::Builder::new()
        .prefix("mapfs-away.")
        .suffix(".py")
        .tempfile()
        .unwrap();
    std::fs::write(script.path(), SOCKET_AWAY).unwrap();
    let report = report_path(&s, "away");
    let sock = control::socket_path(s.mountpoint());
    let out = ok(attached(&s, &report, "python3")
        .arg(script.path())
        .arg(s.mountpoint())
        .arg(&sock)
        .arg("0.7"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{test}");
    let t = totals(&report, "python3");
    assert_eq!(
        (t.adopted, t.fallbacks),
        (2, 0),
        "{test}: the file opened while the socket was away was not adopted: {t:?}"
    );
}

/// A `vfork` child (the shim keeps `vfork` a real one, for speed) changes
/// nothing in its parent's tables while it rearranges its descriptors, and
/// its `exec` still hands the adopted ones on
/// (`preload_support/vfork_child.c`, compiled by the test).
#[test]
fn a_vfork_child_leaves_the_parents_tables_alone() {
    let test = "a vfork child leaves the parent's tables alone";
    if !fuse_or_skip(test) {
        return;
    }
    preload_support::need("cc");
    let s = mount_fs(test, "passthrough");
    std::fs::write(s.mountpoint().join("a"), pattern(4096, 9)).unwrap();
    std::fs::write(s.mountpoint().join("b"), pattern(4096, 11)).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/preload_support/vfork_child.c");
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("vfork_child");
    ok(std::process::Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-ldl"));
    let report = report_path(&s, "vfork");
    let out = ok(attached(&s, &report, &exe)
        .arg(s.mountpoint().join("a"))
        .arg(s.mountpoint().join("b")));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{test}");
    let cat = totals(&report, "cat");
    assert!(
        cat.processes == 1 && cat.native_calls > 0 && cat.fallbacks == 0,
        "{test}: cat did not get the adopted descriptor handed over: {cat:?}"
    );
}

/// A mapfs mount whose daemon is gone without an unmount (its mountpoint
/// cannot be stat'ed) is left out by `mapfs run`: the other mounts keep
/// their device numbers in `MAPFS_MOUNT_DEVS`, so no process of the job
/// has to read the mount table (one stale mount on the machine used to
/// drop the hint for all of them).
#[test]
fn a_dead_mount_is_left_out_and_the_others_keep_their_device_hint() {
    let test = "dead mount left out by mapfs run";
    if !fuse_or_skip(test) {
        return;
    }
    let live = mount_fs(test, "passthrough");
    // No supervisor to replace the daemon.
    let dead = MountSession::builder(common::mapfs_bin())
        .data(DataMode::Passthrough)
        .arg("--no-supervisor")
        .mount()
        .expect("mount --no-supervisor");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon_pid(&dead)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually("the killed daemon's mount to fail stat", || {
        std::fs::metadata(dead.mountpoint()).is_err()
    });
    let out = {
        let _every_mount = COUNTING.write().unwrap_or_else(|e| e.into_inner());
        ok(std::process::Command::new(mapfs_bin()).args(["run", "--", "env"]))
    };
    let env = String::from_utf8_lossy(&out.stdout);
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{test}: mapfs run set no {name}: {env}"))
            .to_string()
    };
    let mounts = var("MAPFS_MOUNTS");
    let devs = var("MAPFS_MOUNT_DEVS");
    let points: Vec<&str> = mounts.split(':').collect();
    let live_point = live.mountpoint().to_str().unwrap();
    let dead_point = dead.mountpoint().to_str().unwrap();
    assert!(
        points.contains(&live_point),
        "{test}: the live mount is not attached: {mounts}"
    );
    assert!(
        !points.contains(&dead_point),
        "{test}: the dead mount is attached: {mounts}"
    );
    let live_dev = std::fs::metadata(live.mountpoint())
        .unwrap()
        .dev()
        .to_string();
    assert_eq!(
        devs.split(':').count(),
        points.len(),
        "{test}: one device number per mount: {mounts} / {devs}"
    );
    assert!(
        devs.split(':').any(|d| d == live_dev),
        "{test}: the live mount's device {live_dev} is not in {devs}"
    );
    // Mounts nobody named are left out without a word: the program's
    // stderr is the program's.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains(dead_point) && !err.contains("mapfs run:"),
        "{test}: mapfs run spoke of mounts nobody named: {err}"
    );
}
