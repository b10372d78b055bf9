//! The test kit's own guarantees on real mounts: a [`MountSession`] unmounts
//! and removes its directories even when the test panicked or the daemon died.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use mapfs_testkit::is_mounted;

#[test]
fn cleans_up_after_panic() {
    if !fuse_or_skip("cleans_up_after_panic") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel::<(PathBuf, PathBuf)>();
    let r = std::thread::spawn(move || {
        let s = mount(DataMode::Auto, &[]);
        fs::write(s.mountpoint().join("f"), b"x").unwrap();
        tx.send((
            s.mountpoint().to_path_buf(),
            s.scratch().unwrap().to_path_buf(),
        ))
        .unwrap();
        panic!("deliberate panic with a live mount");
    })
    .join();
    assert!(r.is_err(), "the thread should have panicked");
    let (mnt, scratch) = rx.recv().unwrap();
    assert!(
        !is_mounted(&mnt),
        "{} still mounted after a panicking test",
        mnt.display()
    );
    assert!(!scratch.exists(), "{} left behind", scratch.display());
}

/// Pid of the daemon serving `mnt`, found by its command line.
fn daemon_pid(mnt: &Path) -> Option<i32> {
    let want = mnt.as_os_str().as_encoded_bytes();
    for ent in fs::read_dir("/proc").ok()? {
        let ent = ent.ok()?;
        let Ok(pid) = ent.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(ent.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_mapfs = args.first().is_some_and(|a| a.ends_with(b"mapfs"));
        if is_mapfs && args.contains(&want) && pid != std::process::id() as i32 {
            return Some(pid);
        }
    }
    None
}

#[test]
fn cleans_up_after_daemon_death() {
    if !fuse_or_skip("cleans_up_after_daemon_death") {
        return;
    }
    // Without a supervisor, which would replace the daemon (failover.rs).
    let s = MountSession::builder(mapfs_bin())
        .data(DataMode::Daemon)
        .arg("--no-supervisor")
        .mount()
        .expect("mount --no-supervisor");
    let mnt = s.mountpoint().to_path_buf();
    let scratch = s.scratch().unwrap().to_path_buf();
    let pid = daemon_pid(&mnt).expect("daemon process of the mount not found in /proc");
    // Only the daemon this test started.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // The mount is dead: operations fail instead of hanging.
    let r = fs::metadata(mnt.join("x"));
    assert!(
        r.is_err(),
        "stat on a mount whose daemon was killed succeeded"
    );
    drop(s);
    assert!(
        !is_mounted(&mnt),
        "{} still mounted after drop",
        mnt.display()
    );
    assert!(!scratch.exists(), "{} left behind", scratch.display());
}

#[test]
fn umount_returns_after_daemon_exit() {
    if !fuse_or_skip("umount_returns_after_daemon_exit") {
        return;
    }
    let mut s = mount(DataMode::Daemon, &[]);
    let pid = daemon_pid(s.mountpoint()).expect("daemon process not found");
    let out = s.umount_settled().unwrap();
    assert!(out.success(), "umount: {}", out.stderr);
    // `mapfs umount` waits for the daemon, so a remount can follow at once.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists() || {
            let st = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            st.contains(") Z ")
        },
        "daemon {pid} still running after umount returned"
    );
}
