//! The torture suite's plumbing: the C program, built once, and a
//! watchdog that turns a hang into a failure showing every thread's stack.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{DataMode, MountSession};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `torture.c`, compiled with the system's C compiler into the target
/// directory's scratch space (once per test binary).
pub fn torture_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torture_support/torture.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("mapfs-torture-{}", std::process::id()));
        let st = Command::new("cc")
            .args(["-O2", "-Wall", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cc (scripts/deps.sh installs gcc): {e}"));
        assert!(st.success(), "compiling {} failed", src.display());
        out
    })
}

/// What one process and its threads are doing: each thread's name, kernel
/// wait channel and kernel stack, and, where gdb is installed, every
/// thread's user-space backtrace.
fn stacks_of(pid: u32) -> String {
    let mut out = String::new();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .replace('\0', " ");
    out.push_str(&format!("== pid {pid}: {comm}\n"));
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let p = t.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
            out.push_str(&format!(
                "-- task {} {} wchan={}\n{}",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                read("wchan").trim(),
                read("stack")
            ));
        }
    }
    let gdb = Command::new("timeout")
        .args(["20", "gdb", "-batch", "-nx", "-p"])
        .arg(pid.to_string())
        .args(["-ex", "thread apply all bt 30"])
        .stdin(Stdio::null())
        .output();
    if let Ok(o) = gdb {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if l.starts_with('#') || l.starts_with("Thread") {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// The processes of process group `pgid`.
fn group(pgid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // After the command's name, which may hold spaces: state, ppid,
        // pgrp.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        if rest.split_whitespace().nth(2) == Some(&pgid.to_string()) {
            pids.push(pid);
        }
    }
    pids
}

/// Runs `cmd` in a process group of its own under a watchdog: past
/// `limit` it is a hang, and the test fails with the stacks of every
/// process of the group (which are then killed). Returns the output.
pub fn watched(mut cmd: Command, limit: Duration, what: &str) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: starting {cmd:?}: {e}"));
    let pid = child.id();
    let start = Instant::now();
    // The output is read on another thread, so a full pipe never stalls
    // the program (which would look like a hang).
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if start.elapsed() > limit {
            let mut dump = String::new();
            for p in group(pid) {
                dump.push_str(&stacks_of(p));
            }
            // SAFETY: signalling the process group this test started.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            let out = waiter.join().expect("waiter").ok();
            let err = out
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!("{what}: HANG: no exit after {limit:?}; stderr:\n{err}\nstacks:\n{dump}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = waiter
        .join()
        .expect("waiter")
        .unwrap_or_else(|e| panic!("{what}: waiting: {e}"));
    // Whatever the program left behind in its group (a daemonized child).
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    out
}

/// Panics with the program's output unless it exited 0.
pub fn succeeded(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Longest a run may take before it counts as a hang (a run takes about
/// a second; the machines are shared).
pub const LIMIT: Duration = Duration::from_secs(60);

/// A mount of `fs` (data mode auto) for the test `test`.
pub fn mount(fs: &str, test: &str) -> MountSession {
    MountSession::builder(crate::common::mapfs_bin())
        .fs(fs)
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"))
}

/// `argv` under `mapfs run --mount` of `s`, adopting at the first call.
pub fn attached(s: &MountSession, test: &str, argv: &[&str]) -> Command {
    let report = crate::preload_support::report_path(s, test);
    let mut c = crate::preload_support::attached(s, &report, argv[0]);
    c.args(&argv[1..]);
    c
}

/// `argv` under `mapfs run --embed` of `area`.
pub fn embedded(area: &crate::embed_support::Area, fs: &str, argv: &[&str]) -> Command {
    let mut c = area.run_embedded(fs, "", argv[0]);
    c.args(&argv[1..]);
    c
}

/// Where a program of the case works, and how to start it there.
pub enum Target {
    /// Programs under `mapfs run --mount`, attached to this mount.
    Attached(MountSession),
    /// Programs under `mapfs run --embed` of this file system on this area.
    Embedded(crate::embed_support::Area, &'static str),
}

impl Target {
    pub fn new(executor: &str, fs: &'static str, test: &str) -> Target {
        match executor {
            "attached" => Target::Attached(mount(fs, test)),
            _ => Target::Embedded(crate::embed_support::Area::new("backing"), fs),
        }
    }

    /// The directory the programs work in (made fresh for each run).
    pub fn dir(&self, name: &str) -> String {
        let d = match self {
            Target::Attached(s) => s.mountpoint().join(name).display().to_string(),
            Target::Embedded(a, _) => a.at(name),
        };
        d
    }

    pub fn command(&self, test: &str, argv: &[&str]) -> Command {
        match self {
            Target::Attached(s) => attached(s, test, argv),
            Target::Embedded(a, fs) => embedded(a, fs, argv),
        }
    }

    /// `mkdir -p dir` done by a program of the target (the embedded
    /// prefix exists only inside the job).
    pub fn mkdir(&self, test: &str, dir: &str) {
        let out = watched(self.command(test, &["mkdir", "-p", dir]), LIMIT, test);
        succeeded(&out, &format!("{test}: mkdir {dir}"));
    }
}
