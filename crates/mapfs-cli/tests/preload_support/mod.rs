//! Helpers of the preload-shim tests (`preload_*.rs`): running programs
//! under `mapfs run`, reading the shim's exit reports.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mapfs_testkit::MountSession;
use serde_json::Value;

/// The `mapfs` binary under test.
pub fn mapfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_mapfs")
}

/// The target directory holding `mapfs`, the shim and `mapfs-fsx`.
fn bin_dir() -> PathBuf {
    Path::new(mapfs_bin())
        .parent()
        .expect("mapfs has a directory")
        .to_path_buf()
}

/// The shim; panics with how to build it when missing or older than its
/// sources (`cargo test` alone does not build a cdylib nobody depends on,
/// and testing a stale one would test the wrong code).
pub fn shim() -> PathBuf {
    fresh_library("libmapfs_preload.so", &["mapfs-preload/src", "mapfs/src"])
}

/// A library of ours built next to `mapfs` (`file`); panics with how to
/// build it when missing or older than a file of the crate directories
/// `sources` (`cargo test` does not build a cdylib nobody depends on).
pub fn fresh_library(file: &str, sources: &[&str]) -> PathBuf {
    let p = bin_dir().join(file);
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first with `cargo build --workspace` (same profile)",
                p.display()
            )
        });
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for d in sources {
        for e in std::fs::read_dir(crates.join(d))
            .into_iter()
            .flatten()
            .flatten()
        {
            let newer = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built);
            assert!(
                !newer,
                "{} is older than {}: rebuild it with `cargo build --workspace`",
                p.display(),
                e.path().display()
            );
        }
    }
    p
}

/// The `mapfs-fsx` exerciser binary.
pub fn fsx_bin() -> PathBuf {
    let p = bin_dir().join("mapfs-fsx");
    assert!(
        p.exists(),
        "{} is missing: build it first with `cargo build --workspace` (same profile)",
        p.display()
    );
    p
}

/// A command running `prog` under `mapfs run --mount <mount>`, writing the
/// shim's per-process reports to `report`. Descriptors are adopted at their
/// first data call (`MAPFS_PRELOAD_ADOPT_CALLS=1`), so tests can tell
/// exactly what is native; [`attached_default`] keeps the default policy.
pub fn attached(s: &MountSession, report: &Path, prog: impl AsRef<OsStr>) -> Command {
    let mut c = attached_default(s, report, prog);
    c.env("MAPFS_PRELOAD_ADOPT_CALLS", "1");
    c
}

/// Like [`attached`], with the shim's default adoption policy.
pub fn attached_default(s: &MountSession, report: &Path, prog: impl AsRef<OsStr>) -> Command {
    shim();
    let mut c = Command::new(mapfs_bin());
    c.arg("run")
        .arg("--mount")
        .arg(s.mountpoint())
        .arg("--")
        .arg(prog)
        .env("MAPFS_PRELOAD_REPORT", report)
        .env_remove("LD_PRELOAD")
        .env_remove("MAPFS_PRELOAD_ADOPT_CALLS")
        .env_remove("MAPFS_PRELOAD_ADOPT_BYTES");
    c
}

/// Runs `cmd`, panicking with its output unless it succeeds.
pub fn ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({:?})\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The shim's exit reports (one JSON object per process that exited).
pub fn reports(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad report line {l:?}: {e}")))
        .collect()
}

/// Totals of the reports of processes whose executable name ends with `exe`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Processes that reported.
    pub processes: u64,
    /// mapfs files opened.
    pub tracked: u64,
    /// Opens adopted (data path native).
    pub adopted: u64,
    /// Adoptions served by the map cache (no daemon round trip).
    pub cache_hits: u64,
    /// Hooked data calls served natively.
    pub native_calls: u64,
    /// Hooked data calls that went through the mount.
    pub mount_calls: u64,
    /// Opens that fell back to the mount.
    pub fallbacks: u64,
}

/// Sums the reports of `exe` (a file name, e.g. `cat`) in `path`.
pub fn totals(path: &Path, exe: &str) -> Totals {
    let mut t = Totals::default();
    for r in reports(path) {
        let name = r["exe"].as_str().unwrap_or_default();
        if !name.rsplit('/').next().unwrap_or_default().starts_with(exe) {
            continue;
        }
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        t.processes += 1;
        t.tracked += n("tracked");
        t.adopted += n("adopted");
        t.cache_hits += n("cache_hits");
        t.native_calls += n("native_calls");
        t.mount_calls += n("mount_calls");
        t.fallbacks += r["fallbacks"]
            .as_object()
            .map(|o| o.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
    }
    t
}

/// A fresh report file path inside the session's scratch dir.
pub fn report_path(s: &MountSession, name: &str) -> PathBuf {
    let p = s
        .scratch()
        .expect("session has a scratch dir")
        .join(format!("{name}.report"));
    let _ = std::fs::remove_file(&p);
    p
}

/// Deterministic pseudo-random bytes (xorshift), so a failure reproduces.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[allow(unused_imports)]
pub use mapfs_testkit::need;

/// Pid of the daemon serving `s`.
pub fn daemon_pid(s: &mapfs_testkit::MountSession) -> i32 {
    // The daemon serving the mount holds /dev/fuse; its pid file is in the
    // runtime dir, but scanning /proc for the mount's source avoids knowing
    // the layout.
    if let Some(info) = mapfs_cli::mounts::read_info(s.mountpoint()) {
        // The serving daemon, not its supervisor.
        return info.pid as i32;
    }
    let needle = s.mountpoint().to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "mount")
            && args.contains(&needle)
            && !args.iter().any(|a| a == "umount")
        {
            return pid;
        }
    }
    panic!("no daemon found for {needle}");
}

/// Waits for `cond` (bounded: a hang becomes a failure, not a stuck test).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "gave up waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program under the shim, stopped at named stages.
pub struct Stepped {
    /// The program.
    pub child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Stepped {
    /// Starts `script` (python3) under the shim with `file` as its argument.
    pub fn start(
        s: &mapfs_testkit::MountSession,
        name: &str,
        script: &str,
        file: &Path,
    ) -> Stepped {
        let report = report_path(s, name);
        Self::spawn(attached(s, &report, "python3"), script, file)
    }

    /// [`Stepped::start`] as user nobody (adopting at the first call); the
    /// shim's report goes to `report`, which nobody must be able to write.
    pub fn start_as_nobody(
        s: &mapfs_testkit::MountSession,
        report: &Path,
        script: &str,
        file: &Path,
    ) -> Stepped {
        shim();
        let mut cmd = mapfs_testkit::user::command_as_nobody(mapfs_bin());
        cmd.args(["run", "--mount"])
            .arg(s.mountpoint())
            .args(["--", "python3"])
            .env("MAPFS_PRELOAD_REPORT", report)
            .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
            .env("HOME", "/");
        Self::spawn(cmd, script, file)
    }

    fn spawn(mut cmd: Command, script: &str, file: &Path) -> Stepped {
        let mut child = cmd
            .arg("-c")
            .arg(script)
            .arg(file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3 under mapfs run");
        let to = child.stdin.take().unwrap();
        let from = BufReader::new(child.stdout.take().unwrap());
        Stepped { child, to, from }
    }

    /// Waits for the program to reach `stage`.
    pub fn reached(&mut self, stage: &str) {
        assert_eq!(
            self.line(),
            stage,
            "the program under the shim stopped early (see its stderr above)"
        );
    }

    /// Lets the program go on from its stage.
    pub fn go(&mut self) {
        self.say("go");
    }

    /// Sends the program one line.
    pub fn say(&mut self, line: &str) {
        writeln!(self.to, "{line}").unwrap();
        self.to.flush().unwrap();
    }

    /// The program's next line (trimmed; empty if it ended).
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Waits for the program, which must succeed.
    pub fn finish(mut self) {
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the program under the shim failed: {st}");
    }
}

impl Drop for Stepped {
    fn drop(&mut self) {
        // On a failed assertion: never leave the program waiting.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens and reads each of `paths` as user nobody, with the shim
/// (`mapfs run --mount`) or without it, and prints per path `ok <bytes>
/// <shim status>` (status -1 without the shim) or the errno name. The
/// report file must be writable by nobody.
pub fn read_as_nobody(s: &MountSession, report: &Path, paths: &[&Path], shimmed: bool) -> String {
    read_as(true, s, report, paths, shimmed)
}

/// [`read_as_nobody`], as nobody or as this process's user (root).
pub fn read_as(
    nobody: bool,
    s: &MountSession,
    report: &Path,
    paths: &[&Path],
    shimmed: bool,
) -> String {
    let script = "import os,sys,errno,ctypes\n\
        for p in sys.argv[1:]:\n\
        \x20 try:\n\
        \x20   fd=os.open(p,os.O_RDONLY); d=os.read(fd,100)\n\
        \x20   st=ctypes.CDLL(None).mapfs_preload_fd_status(fd) if os.environ.get('LD_PRELOAD') else -1\n\
        \x20   print(p, 'ok', d.decode(), st)\n\
        \x20 except OSError as e: print(p, errno.errorcode[e.errno])\n";
    let prog = if shimmed { mapfs_bin() } else { "python3" };
    let mut cmd = if nobody {
        mapfs_testkit::user::command_as_nobody(prog)
    } else {
        Command::new(prog)
    };
    if shimmed {
        cmd.args(["run", "--mount"])
            .arg(s.mountpoint())
            .args(["--", "python3"]);
    }
    cmd.arg("-c")
        .arg(script)
        .args(paths)
        .env("MAPFS_PRELOAD_REPORT", report)
        .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
        .env("HOME", "/");
    String::from_utf8(ok(&mut cmd).stdout).unwrap()
}
