//! What a new user runs into: every bad input is one line and exit status
//! 1 with nothing mounted; a non-empty mountpoint needs `-o nonempty`; the
//! runtime files are private and tidy; a foreground mount stops cleanly on
//! SIGTERM and says whether kernel passthrough is active; a daemon out of
//! descriptors does not spin on a control client it cannot accept yet.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use mapfs_cli::mounts;
use mapfs_testkit::mount::{is_mounted, mounts_under, run_captured};

/// A temp dir with an empty backing dir `b` and mountpoint `m` in it.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = native_dir();
    let (b, m) = (tmp.path().join("b"), tmp.path().join("m"));
    fs::create_dir(&b).unwrap();
    fs::create_dir(&m).unwrap();
    (tmp, b, m)
}

fn mapfs(args: &[&str]) -> mapfs_testkit::mount::CmdOutput {
    run_captured(Command::new(mapfs_bin()).args(args)).unwrap()
}

#[test]
fn bad_input_is_one_line_and_status_1() {
    let (tmp, b, m) = dirs();
    let (b, m) = (b.to_str().unwrap(), m.to_str().unwrap());
    let cases: &[(&[&str], &str)] = &[
        (&["mount", "passthrough", b, m, "--ttl", "1e30"], "invalid value '1e30' for '--ttl <TTL>': must be a number of seconds from 0 to 31536000 (one year)"),
        (&["mount", "passthrough", b, m, "--ttl", "-1"], "invalid value '-1' for '--ttl <TTL>'"),
        (&["mount", "passthrough", b, m, "--ttl=nan"], "invalid value 'nan'"),
        (&["mount", "passthrough", b, m, "--data", "fast"], "invalid value 'fast' for '--data <DATA>' [possible values: auto, daemon, passthrough]"),
        (&["mount", "nope", b, m], "unknown file system \"nope\" (available: passthrough, plfs, pack, versions)"),
        (&["mount", "passthrough", b], "the following required arguments were not provided"),
        (&["run", "cp", "a", "b"], "unexpected argument 'cp' found; put `--` before the program: mapfs run -- CMD [ARGS...]"),
        (&["mout", "passthrough", b, m], "unrecognized subcommand 'mout' tip: some similar subcommands exist: 'umount', 'mount'"),
        (&[b], "expected a subcommand, or BACKING MOUNTPOINT -o fs=NAME"),
        (&[b, m, "-o", "data=fast"], "invalid data=\"fast\" (auto, daemon or passthrough)"),
    ];
    for (args, want) in cases {
        let out = mapfs(args);
        assert_eq!(
            out.status.and_then(|s| s.code()),
            Some(1),
            "{args:?}: {out:?}"
        );
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: not one line: {:?}", out.stderr);
        assert!(
            lines[0].starts_with("mapfs: error: "),
            "{args:?}: {}",
            lines[0]
        );
        assert!(
            lines[0].contains(want),
            "{args:?}: want {want:?} in {:?}",
            lines[0]
        );
        assert!(
            mounts_under(tmp.path()).is_empty(),
            "{args:?} mounted something"
        );
    }
    // Help is not an error.
    let out = mapfs(&["mount", "--help"]);
    assert!(
        out.success() && out.stdout.contains("File systems:"),
        "{out:?}"
    );
}

#[test]
fn non_empty_mountpoint_needs_nonempty() {
    if !fuse_or_skip("non-empty mountpoint") {
        return;
    }
    let (_tmp, b, m) = dirs();
    fs::write(m.join("hidden-by-a-mount"), b"x").unwrap();
    let out = mapfs(&[
        "mount",
        "passthrough",
        b.to_str().unwrap(),
        m.to_str().unwrap(),
    ]);
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("is not empty: the mount would hide its files (add -o nonempty"),
        "{}",
        out.stderr
    );
    assert!(!is_mounted(&m));
    let s = MountSession::builder(mapfs_bin())
        .backing(&b)
        .mountpoint(&m)
        .option("nonempty")
        .mount()
        .unwrap_or_else(|e| panic!("-o nonempty: {e:#}"));
    assert!(!s.mountpoint().join("hidden-by-a-mount").exists());
}

#[test]
fn runtime_files_are_private_rotated_and_stale_ones_go() {
    if !fuse_or_skip("runtime files") {
        return;
    }
    let (tmp, b, m) = dirs();
    let m = m.canonicalize().unwrap();
    // A stale pid file (of a process that has exited) for another mountpoint
    // and a log of a previous mount of this one.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    fs::create_dir_all(mounts::runtime_dir()).unwrap();
    let stale = mounts::pid_path(&tmp.path().join("gone-mount"));
    fs::write(&stale, format!("{dead_pid}\n")).unwrap();
    fs::write(mounts::log_path(&m), "the previous mount's log\n").unwrap();

    let s = MountSession::builder(mapfs_bin())
        .backing(&b)
        .mountpoint(&m)
        .mount()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let dir = fs::metadata(mounts::runtime_dir()).unwrap();
    assert_eq!(dir.uid(), rustix::process::geteuid().as_raw());
    assert_eq!(
        dir.mode() & 0o022,
        0,
        "runtime dir writable by others: {:o}",
        dir.mode()
    );
    let pid = fs::metadata(mounts::pid_path(&m)).unwrap();
    assert_eq!(pid.permissions().mode() & 0o777, 0o644);
    let info = mounts::read_info(&m).expect("info file");
    let pid_text = fs::read_to_string(mounts::pid_path(&m)).unwrap();
    assert_eq!(pid_text.trim(), info.pid.to_string());
    assert_eq!(info.fs, "passthrough");
    assert!(!stale.exists(), "stale pid file of a dead daemon kept");
    let mut old = mounts::log_path(&m).into_os_string();
    old.push(".1");
    assert_eq!(
        fs::read_to_string(&old).unwrap(),
        "the previous mount's log\n"
    );
    drop(s);
    assert!(!mounts::pid_path(&m).exists(), "pid file left after umount");
    let _ = fs::remove_file(old);
}

/// Waits until `cond`; gives up after 2 minutes, reached only on a hang.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn foreground_mount_stops_cleanly_on_sigterm() {
    if !fuse_or_skip("foreground SIGTERM") {
        return;
    }
    let (tmp, b, m) = dirs();
    let err_path = tmp.path().join("stderr");
    let mut child = Command::new(mapfs_bin())
        .args(["mount", "passthrough"])
        .args([&b, &m])
        .arg("--foreground")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut std::process::Child, &'a Path);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            if is_mounted(self.1) {
                let _ = Command::new("umount").arg("-l").arg(self.1).status();
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Reap(&mut child, &m);
    wait_until("the foreground mount", || {
        fs::read_to_string(&err_path).is_ok_and(|e| e.contains("Ctrl-C"))
    });
    let pid = rustix::process::Pid::from_raw(guard.0.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = guard.0.wait().unwrap();
    let err = fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(!is_mounted(&m));
    assert!(
        !err.contains("Failed to umount"),
        "spurious unmount error: {err}"
    );
    let executor_lines = err.lines().filter(|l| l.contains("data executor:")).count();
    assert_eq!(
        executor_lines, 1,
        "the executor is named once at info level: {err}"
    );
    assert!(err.contains("kernel passthrough is"), "{err}");
    drop(guard);
}

/// A user who may not open /dev/fuse is told which file and the fix. The
/// device is replaced, in a private mount namespace only, by a root-only
/// file.
#[test]
fn dev_fuse_without_permission_names_the_fix() {
    if !rustix::process::geteuid().is_root() {
        common::skip("dev_fuse_without_permission", "needs root to switch users");
        return;
    }
    let tmp = native_dir();
    let (b, m, fake) = (
        tmp.path().join("b"),
        tmp.path().join("m"),
        tmp.path().join("fuse"),
    );
    for d in [&b, &m] {
        fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(
            d,
            Some(mapfs_testkit::NOBODY_UID),
            Some(mapfs_testkit::NOBODY_GID),
        )
        .unwrap();
    }
    fs::write(&fake, b"").unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!(
        "mount --bind {fake} /dev/fuse || exit 98; \
         setpriv --reuid={uid} --regid={gid} --clear-groups {bin} mount passthrough {b} {m}",
        fake = fake.display(),
        uid = mapfs_testkit::NOBODY_UID,
        gid = mapfs_testkit::NOBODY_GID,
        bin = mapfs_bin(),
        b = b.display(),
        m = m.display()
    );
    let out = in_private_mount_ns(&script, &[]).expect("unshare(1) (util-linux) is missing");
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out:?}");
    assert_eq!(
        out.stderr.trim(),
        "mapfs: error: no permission to open /dev/fuse for reading and writing: ask an \
         administrator to `chmod 0666 /dev/fuse` (the Debian default) or run as root"
    );
    assert!(mounts_under(tmp.path()).is_empty());
}

/// CPU time (user + system, in clock ticks) of thread `tid` of `pid`
/// (fields 14 and 15 of its stat).
fn thread_ticks(pid: u32, tid: &str) -> i64 {
    task_stat_field(pid, tid, 14) + task_stat_field(pid, tid, 15)
}

/// A daemon out of descriptors neither spins nor loses a control client:
/// its control socket's `accept` fails (`EMFILE`) while the connection
/// waits in the listener's queue, which a level-triggered wait reported
/// again at once (the control thread took a whole core: 198 of 200 ticks
/// in 2 s); the client is served once descriptors are free.
#[test]
fn a_daemon_out_of_descriptors_does_not_spin_on_a_waiting_client() {
    if !fuse_or_skip("a_daemon_out_of_descriptors_does_not_spin_on_a_waiting_client") {
        return;
    }
    let (_tmp, b, m) = dirs();
    for i in 0..200 {
        fs::write(b.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let s = MountSession::builder(mapfs_bin())
        .backing(&b)
        .mountpoint(&m)
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mnt = m.to_str().unwrap();
    let pid = mounts::read_info(&m).expect("the mount's info file").pid;
    let held = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    let limit = rustix::process::Rlimit {
        current: Some(held + 24),
        maximum: Some(held + 24),
    };
    rustix::process::prlimit(
        rustix::process::Pid::from_raw(pid as i32),
        rustix::process::Resource::Nofile,
        limit,
    )
    .expect("lowering the daemon's descriptor limit");
    // Every open through the mount holds a backing descriptor in the daemon.
    let mut files = Vec::new();
    let refused = (0..200).find_map(|i| match fs::File::open(m.join(format!("f{i}"))) {
        Ok(f) => {
            files.push(f);
            None
        }
        Err(e) => Some(e),
    });
    let refused = refused.expect("the daemon never ran out of descriptors");
    assert_eq!(refused.raw_os_error(), Some(libc::EMFILE), "{refused}");
    let control = thread_named(pid, "mapfs-control");
    let before = thread_ticks(pid, &control);
    let stats = Command::new(mapfs_bin())
        .args(["stats", mnt])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let spent = thread_ticks(pid, &control) - before;
    drop(files);
    let out = stats.wait_with_output().unwrap();
    // A tick is 10 ms: the spin took about 200 in these 2 s.
    assert!(spent <= 20, "the control thread took {spent} ticks in 2 s");
    assert!(
        out.status.success(),
        "mapfs stats, once descriptors were free: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("OPEN"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    drop(s);
}

/// `mapfs list` tells a live daemon from a dead one: after a `kill -9` of
/// an unsupervised daemon, the mount is listed `dead` (not with the pid and
/// uptime of its leftover info file), with how to clean it up, and that
/// clean-up works.
#[test]
fn list_shows_a_dead_daemon_as_dead() {
    let test = "list_shows_a_dead_daemon_as_dead";
    if !fuse_or_skip(test) {
        return;
    }
    let s = MountSession::builder(mapfs_bin())
        .fs("passthrough")
        .arg("--no-supervisor")
        .mount()
        .unwrap();
    let m = s.mountpoint().to_path_buf();
    let mnt = m.to_str().unwrap();
    let live = mapfs(&["list", "--json", mnt]);
    assert!(live.success(), "{}", live.stderr);
    let v: serde_json::Value = serde_json::from_str(&live.stdout).unwrap();
    assert_eq!(v[0]["state"], "live", "{}", live.stdout);
    let pid = v[0]["daemon_pid"].as_u64().expect("a live daemon's pid") as i32;

    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::PidfdFlags::empty(),
    )
    .unwrap();
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rustix::process::test_kill_process(rustix::process::Pid::from_raw(pid).unwrap()).is_ok()
        && fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z "))
    {
        assert!(Instant::now() < deadline, "daemon {pid} survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(is_mounted(&m), "the dead mount is still in the mount table");

    let dead = mapfs(&["list", "--json", mnt]);
    assert!(dead.success(), "{}", dead.stderr);
    let v: serde_json::Value = serde_json::from_str(&dead.stdout).unwrap();
    assert_eq!(v[0]["state"], "dead", "{}", dead.stdout);
    assert!(v[0]["daemon_pid"].is_null(), "{}", dead.stdout);
    assert!(v[0]["uptime_secs"].is_null(), "{}", dead.stdout);
    assert_eq!(v[0]["fs"], "passthrough", "{}", dead.stdout);

    let text = mapfs(&["list", mnt]);
    assert!(text.success(), "{}", text.stderr);
    let row = text
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{mnt}\t")))
        .unwrap_or_else(|| panic!("no row for {mnt}:\n{}", text.stdout));
    let cols: Vec<&str> = row.split('\t').collect();
    assert_eq!(cols[3..], ["dead", "-", "-"], "{row}");
    let hint = format!("mapfs umount --lazy {mnt}");
    assert!(
        text.stdout.contains(&hint),
        "no clean-up hint:\n{}",
        text.stdout
    );

    let out = mapfs(&["umount", "--lazy", mnt]);
    assert!(
        out.success(),
        "the suggested clean-up failed: {}",
        out.stderr
    );
    assert!(!is_mounted(&m), "still mounted after mapfs umount --lazy");
}
