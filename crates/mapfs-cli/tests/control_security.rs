//! Attack regression tests of the control socket, against the
//! real daemon on real FUSE mounts, with the hostile client `mapfs-attack`
//! (crates/mapfs-testkit/src/bin/mapfs-attack.rs) run as user nobody.
//!
//! After every attack each test checks that the attacker received no
//! descriptor of the victim's file (by `fstat` identity and by path), that
//! the mount still serves root and nobody (read, stat, create), and that
//! the attacker got the documented refusals.
//!
//! Pid reuse is forced by writing the wanted pid minus one to
//! `/proc/sys/kernel/ns_last_pid` just before the fork; when another
//! process takes the pid first every few tries in a row, the test says so
//! loudly and does not pass silently. Needs root, `/dev/fuse`, python3,
//! `unshare`, and the binaries built by `cargo build --workspace`.

mod common;
mod preload_support;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{fuse_or_skip, DataMode, MountSession};
use mapfs::control::{self, Request, Response};
use mapfs_testkit::command_as_nobody;
use preload_support::{mapfs_bin, totals};
use serde_json::Value;

/// The only python the tests use: the one every user can run (root's PATH
/// may start with a pyenv shim nobody cannot read).
const PYTHON: &str = "/usr/bin/python3";

/// What the victim's secret file holds.
const SECRET: &[u8] = b"root's secret, 0600\n";

/// What the public file holds.
const PUBLIC: &[u8] = b"for everyone\n";

/// Serialises the tests that steer pid allocation (`ns_last_pid`), so two
/// of them do not take each other's pids.
static PIDS: Mutex<()> = Mutex::new(());

/// Generous bound for anything polled (two noisy cores).
const PATIENCE: Duration = Duration::from_secs(30);

/// The attacker binary, next to `mapfs`; panics with how to build it when
/// missing or older than its source (testing a stale attacker would test
/// nothing).
fn attack_bin() -> PathBuf {
    let p = Path::new(mapfs_bin())
        .parent()
        .unwrap()
        .join("mapfs-attack");
    let built = fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first with `cargo build --workspace` (same profile)",
                p.display()
            )
        });
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mapfs-testkit/src/bin/mapfs-attack.rs");
    let newer = fs::metadata(&src)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t > built);
    assert!(
        !newer,
        "{} is older than {}: rebuild with `cargo build --workspace`",
        p.display(),
        src.display()
    );
    p
}

/// Skips loudly unless FUSE, root and the programs the test needs are here.
fn ready(test: &str, progs: &[&str]) -> bool {
    if !fuse_or_skip(test) {
        return false;
    }
    if !rustix::process::geteuid().is_root() {
        common::skip(
            test,
            "needs root (attacks run as nobody against root's mount)",
        );
        return false;
    }
    for p in progs {
        assert!(
            Path::new(p).exists(),
            "{test}: {p} is not installed (scripts/deps.sh and the build install it)"
        );
    }
    true
}

/// A victim's mount: `-o allow_other` (so nobody can use it), a 0600 root
/// `secret`, a 0644 `public`, a world-writable `drop/` directory.
struct Victim {
    /// The session, when the test mounted through `mapfs mount` (it
    /// unmounts on drop).
    session: Option<MountSession>,
    mnt: PathBuf,
    backing: PathBuf,
    /// Outside the mount, for shim reports.
    scratch: PathBuf,
    /// The file system (`passthrough` keeps a file's bytes in a backing
    /// file of the same name).
    fs: &'static str,
    test: &'static str,
}

impl Victim {
    fn mount(test: &'static str, data: DataMode) -> Victim {
        Victim::mount_fs(test, "passthrough", data)
    }

    fn mount_fs(test: &'static str, fs: &'static str, data: DataMode) -> Victim {
        Victim::mount_with(test, fs, data, &[])
    }

    fn mount_with(
        test: &'static str,
        fs: &'static str,
        data: DataMode,
        envs: &[(&str, &str)],
    ) -> Victim {
        let mut b = MountSession::builder(mapfs_bin())
            .fs(fs)
            .data(data)
            .option("allow_other");
        for (k, v) in envs {
            b = b.env(k, v);
        }
        let s = b
            .mount()
            .unwrap_or_else(|e| panic!("{test}: mounting: {e:#}"));
        let v = Victim {
            mnt: s.mountpoint().to_path_buf(),
            backing: s.backing().to_path_buf(),
            scratch: s.scratch().unwrap().to_path_buf(),
            session: Some(s),
            fs,
            test,
        };
        v.setup();
        v
    }

    fn mountpoint(&self) -> &Path {
        &self.mnt
    }

    fn backing(&self) -> &Path {
        &self.backing
    }

    /// A fresh report file for the shim, writable by nobody too.
    fn report(&self, name: &str) -> PathBuf {
        let p = self.scratch.join(format!("{name}.report"));
        fs::write(&p, b"").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666)).unwrap();
        p
    }

    /// `prog` under `mapfs run --mount <this mount>` (as root), adopting at
    /// the first data call, reporting to `report`.
    fn shimmed(&self, report: &Path, prog: &str) -> Command {
        preload_support::shim();
        let mut c = Command::new(mapfs_bin());
        c.args(["run", "--mount"])
            .arg(&self.mnt)
            .arg("--")
            .arg(prog)
            .env("MAPFS_PRELOAD_REPORT", report)
            .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
            .env_remove("LD_PRELOAD")
            .env_remove("MAPFS_PRELOAD_ADOPT_BYTES");
        c
    }

    fn setup(&self) {
        let m = self.mountpoint();
        fs::write(m.join("secret"), SECRET).unwrap();
        fs::set_permissions(m.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(m.join("public"), PUBLIC).unwrap();
        fs::set_permissions(m.join("public"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::create_dir(m.join("drop")).unwrap();
        fs::set_permissions(m.join("drop"), fs::Permissions::from_mode(0o1777)).unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mountpoint().join(name)
    }

    /// `(dev, ino)` of the secret through the mount and in the backing dir.
    fn secret_ids(&self) -> Vec<(u64, u64)> {
        [self.path("secret"), self.backing().join("secret")]
            .iter()
            .map(|p| {
                let m = fs::metadata(p).unwrap();
                (m.dev(), m.ino())
            })
            .collect()
    }

    /// Runs `mapfs-attack --mount M <args>` as nobody; its JSON lines.
    fn attack(&self, args: &[&str]) -> Vec<Value> {
        let out = command_as_nobody(attack_bin())
            .arg("--mount")
            .arg(self.mountpoint())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: mapfs-attack {args:?} could not set up ({:?}): {stdout}\n{}",
            self.test,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        parse_lines(&stdout)
    }

    /// No line of the attacker's output lists a descriptor of the secret.
    fn assert_no_secret_fd(&self, lines: &[Value]) {
        let ids = self.secret_ids();
        for line in lines {
            for fd in line["fds"].as_array().into_iter().flatten() {
                let id = (
                    fd["dev"].as_u64().unwrap_or(0),
                    fd["ino"].as_u64().unwrap_or(0),
                );
                let path = fd["path"].as_str().unwrap_or("");
                assert!(
                    !ids.contains(&id) && !path.ends_with("/secret"),
                    "{}: THE ATTACKER RECEIVED A DESCRIPTOR OF THE SECRET: {fd}\nfull result: {line}",
                    self.test
                );
            }
        }
    }

    /// The secret is intact, and the mount serves root and nobody: read,
    /// stat, create.
    fn assert_serves(&self) {
        let t = self.test;
        if self.fs == "passthrough" {
            assert_eq!(
                fs::read(self.backing().join("secret")).unwrap(),
                SECRET,
                "{t}: the secret was changed in the backing file"
            );
        }
        assert_eq!(
            fs::read(self.path("secret")).unwrap(),
            SECRET,
            "{t}: root read"
        );
        fs::metadata(self.path("public")).unwrap_or_else(|e| panic!("{t}: root stat: {e}"));
        let mine = self.path("drop/root-made");
        fs::write(&mine, b"root").unwrap_or_else(|e| panic!("{t}: root create: {e}"));
        assert_eq!(fs::read(&mine).unwrap(), b"root");
        let script = format!(
            "set -e; cat {p}; stat -c %s {p} >/dev/null; echo nobody > {d}/nobody-$$; cat {d}/nobody-$$; \
             if cat {s} 2>/dev/null; then echo LEAK; fi",
            p = self.path("public").display(),
            d = self.path("drop").display(),
            s = self.path("secret").display(),
        );
        let out = command_as_nobody("/bin/sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{t}: nobody can no longer use the mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{}nobody\n", String::from_utf8_lossy(PUBLIC)),
            "{t}: what nobody read"
        );
    }

    fn socket(&self) -> PathBuf {
        control::socket_path(self.mountpoint())
    }

    /// The daemon's status, asked over its socket.
    fn status(&self) -> control::MountStatus {
        control::status(&self.socket()).unwrap_or_else(|e| panic!("{}: status: {e}", self.test))
    }
}

fn parse_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad attacker line {l:?}: {e}")))
        .collect()
}

/// Every attempt in an `adopt` result, as (what, answer label).
fn adopt_answers(line: &Value) -> Vec<(String, String, i64)> {
    line["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["what"].as_str().unwrap().to_string(),
                a["answer"].as_str().unwrap().to_string(),
                a["errno"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

/// Checks an `adopt --file public` result: every forged or misused proof
/// refused with EACCES, only the attacker's own first use adopted (and
/// that is the public file).
fn assert_adopt_refused(v: &Victim, line: &Value) {
    v.assert_no_secret_fd(std::slice::from_ref(line));
    for (what, answer, errno) in adopt_answers(line) {
        if what == "own proof, first use" {
            assert_eq!(
                answer, "Adopted",
                "{}: the attacker's own open: {line}",
                v.test
            );
            continue;
        }
        assert_eq!(
            (answer.as_str(), errno),
            ("Refused", i64::from(libc::EACCES)),
            "{}: {what}: {line}",
            v.test
        );
    }
    let public = fs::metadata(v.backing().join("public")).unwrap();
    for fd in line["fds"].as_array().unwrap() {
        let p = fd["path"].as_str().unwrap();
        assert!(
            (fd["ino"] == public.ino() && fd["dev"] == public.dev())
                || p.starts_with("/memfd:mapfs-generations"),
            "{}: unexpected descriptor {fd}",
            v.test
        );
    }
    assert_eq!(
        line["ioctls"]["unknown key"],
        libc::EPERM,
        "{}: {line}",
        v.test
    );
}

/// Starts the child `make` builds with pid `want`, by setting `ns_last_pid`
/// to `want - 1` just before the fork; children that got another pid are
/// killed and reaped, and it tries again. `None` when it never got it.
fn spawn_with_pid(want: i32, mut make: impl FnMut() -> Command) -> Option<Child> {
    for _ in 0..200 {
        if let Err(e) = fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", want - 1)) {
            eprintln!("!!!!! cannot write /proc/sys/kernel/ns_last_pid: {e} !!!!!");
            return None;
        }
        let mut child = make().spawn().unwrap();
        if child.id() as i32 == want {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

/// Says loudly that a pid could not be forced; the caller returns.
fn pid_not_forced(test: &str, what: &str) {
    eprintln!(
        "SKIPPED {test}: could not give the attacker {what} \
         (ns_last_pid not writable, or other processes took the pid 200 times); \
         this attack was not tried"
    );
}

/// A root python program kept stopped between steps: reads its lines.
struct Program {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
}

impl Program {
    fn start(mut cmd: Command) -> Program {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let to = child.stdin.take();
        let from = BufReader::new(child.stdout.take().unwrap());
        Program { child, to, from }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.from.read_line(&mut l).unwrap();
        l.trim().to_string()
    }

    fn say(&mut self, l: &str) {
        let to = self.to.as_mut().unwrap();
        if let Err(e) = writeln!(to, "{l}").and_then(|()| to.flush()) {
            let rest = std::io::read_to_string(&mut self.from).unwrap_or_default();
            panic!(
                "cannot tell the program {l:?}: {e}; it ended: {:?}; its output after: {rest}",
                self.child.try_wait()
            );
        }
    }

    /// Closes its stdin (the programs here end, or let their helpers end,
    /// at end of file) and waits for it.
    fn finish(&mut self) -> std::process::ExitStatus {
        drop(self.to.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        drop(self.to.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `cond` until it holds; fails the test after [`PATIENCE`].
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Root opens the secret O_RDWR, forks a grandchild that keeps it, and
/// exits; the attacker (nobody) gets the dead opener's pid and tries to
/// adopt. Nothing of the secret reaches it.
/// Runs `mapfs-attack adopt` as nobody with process id `pid` (the number
/// `what` names) and checks it got nothing and the mount still serves;
/// false (said loudly) when that pid could not be forced.
fn attack_as_pid(v: &Victim, test: &str, pid: i32, what: &str) -> bool {
    let _guard = PIDS.lock().unwrap_or_else(|e| e.into_inner());
    let child = spawn_with_pid(pid, || {
        let mut c = command_as_nobody(attack_bin());
        c.arg("--mount")
            .arg(v.mountpoint())
            .args(["adopt", "--file"])
            .arg(v.path("public"))
            .stdout(Stdio::piped());
        c
    });
    let Some(child) = child else {
        pid_not_forced(test, &format!("{what} {pid}"));
        return false;
    };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{test}: attacker set-up failed");
    let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(lines[0]["pid"], pid, "{test}: attacker's pid");
    assert_adopt_refused(v, &lines[0]);
    v.assert_serves();
    true
}

#[test]
fn pid_reuse_opener_gone() {
    let test = "pid reuse, opener gone";
    if !ready(test, &[PYTHON]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    // The grandchild keeps the descriptor until its stdin (inherited from
    // the opener) closes.
    let script = "import os,sys\n\
        fd=os.open(sys.argv[1],os.O_RDWR)\n\
        assert os.read(fd,100)\n\
        r,w=os.pipe()\n\
        if os.fork()==0:\n\
        \x20 os.close(r); print('holder', os.getpid(), flush=True); os.close(w)\n\
        \x20 sys.stdin.read(); os._exit(0)\n\
        os.close(w); os.read(r,1)\n\
        print('opener', os.getpid(), flush=True)\n";
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(v.path("secret"));
    let mut p = Program::start(cmd);
    let holder: i32 = p.line().strip_prefix("holder ").unwrap().parse().unwrap();
    let opener: i32 = p.line().strip_prefix("opener ").unwrap().parse().unwrap();
    assert_eq!(opener as u32, p.child.id());
    // The opener exits (reaped here); the holder keeps the open.
    let st = p.child.wait().unwrap();
    assert!(st.success(), "{test}: opener failed");
    assert!(pid_exists(holder), "{test}: the holder is gone");
    if !attack_as_pid(&v, test, opener, "the dead opener's pid") {
        return;
    }
    // The holder still has its open, untouched by the attack.
    assert!(pid_exists(holder));
    drop(p.to.take());
    eventually("the holder to exit", || !pid_exists(holder));
}

/// A root process's worker thread opened the secret and exited; the process
/// keeps the descriptor. The attacker gets the thread's tid as its pid.
#[test]
fn pid_reuse_opener_thread_gone() {
    let test = "pid reuse, opener thread gone";
    if !ready(test, &[PYTHON]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    let script = "import os,sys,threading\n\
        got={}\n\
        def w():\n\
        \x20 got['fd']=os.open(sys.argv[1],os.O_RDWR); os.read(got['fd'],10); got['tid']=threading.get_native_id()\n\
        t=threading.Thread(target=w); t.start(); t.join()\n\
        print(got['tid'], flush=True)\n\
        sys.stdin.read()\n";
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(v.path("secret"));
    let mut p = Program::start(cmd);
    let tid: i32 = p.line().parse().unwrap();
    let pid = p.child.id();
    eventually("the worker thread to be gone", || {
        !Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
    });
    if !attack_as_pid(&v, test, tid, "the dead thread's tid") {
        return;
    }
    assert!(p.finish().success(), "{test}: the holder failed");
}

/// nobody keeps connections made by short-lived children; a root reader
/// under the shim later gets one of those pids and adopts the secret; the
/// attacker's old connections get nothing.
#[test]
fn stale_connection_pid() {
    let test = "stale connection pid";
    if !ready(test, &[PYTHON]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    let mut cmd = command_as_nobody(attack_bin());
    cmd.arg("--mount").arg(v.mountpoint()).args(["stale", "20"]);
    let mut attacker = Program::start(cmd);
    let first: Value = serde_json::from_str(&attacker.line()).unwrap();
    let pids: Vec<i32> = first["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap() as i32)
        .collect();
    assert_eq!(
        pids.len(),
        20,
        "{test}: the attacker's connections: {first}"
    );
    // The root reader: opens, reads (adopted at the first data call),
    // waits, reads again.
    let script = "import os,sys\n\
        fd=os.open(sys.argv[1],os.O_RDWR)\n\
        a=os.read(fd,100)\n\
        print(os.getpid(), flush=True)\n\
        sys.stdin.readline()\n\
        os.lseek(fd,0,0); b=os.read(fd,100)\n\
        assert a==b, (a,b)\n\
        sys.stdout.write(b.decode())\n";
    let report = v.report("stale");
    let reader = {
        let _guard = PIDS.lock().unwrap_or_else(|e| e.into_inner());
        let mut forced = None;
        for &want in pids.iter().rev() {
            forced = spawn_with_pid(want, || {
                let mut c = v.shimmed(&report, PYTHON);
                c.arg("-c")
                    .arg(script)
                    .arg(v.path("secret"))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped());
                c
            });
            if forced.is_some() {
                break;
            }
        }
        forced
    };
    let Some(mut child) = reader else {
        return pid_not_forced(test, "the root reader one of the stale connections' pids");
    };
    let mut reader = Program {
        to: child.stdin.take(),
        from: BufReader::new(child.stdout.take().unwrap()),
        child,
    };
    let rpid: i32 = reader.line().parse().unwrap();
    assert!(
        pids.contains(&rpid),
        "{test}: reader pid {rpid} not among {pids:?}"
    );
    attacker.say("go");
    let second: Value = serde_json::from_str(&attacker.line()).unwrap();
    assert_eq!(attacker.finish().code(), Some(0), "{test}: attacker set-up");
    v.assert_no_secret_fd(std::slice::from_ref(&second));
    assert_eq!(second["fds_received"], 0, "{test}: {second}");
    for (k, n) in second["answers"].as_object().unwrap() {
        assert!(
            k == &format!("Refused:{}", libc::EACCES) || k == &format!("Refused:{}", libc::EBADF),
            "{test}: answer {k} ({n} times): {second}"
        );
    }
    reader.say("go");
    let rest = reader.line();
    assert!(reader.finish().success(), "{test}: the root reader failed");
    assert_eq!(
        rest.as_bytes(),
        SECRET.trim_ascii_end(),
        "{test}: root read"
    );
    let t = totals(&report, "python");
    assert!(
        t.adopted >= 1,
        "{test}: the root reader did not adopt, so the attack was not really tried: {t:?}"
    );
    v.assert_serves();
}

/// Soft descriptor limit of process `pid`.
fn soft_nofile(pid: u32) -> u64 {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

fn threads(pid: u32) -> u64 {
    let st = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// nobody opens 2000 connections and holds them: at most the per-uid cap
/// is accepted, the daemon does not grow threads, and root and nobody keep
/// using the mount (root's shim still adopts).
#[test]
fn descriptor_exhaustion() {
    let test = "descriptor exhaustion";
    if !ready(test, &[PYTHON]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    let daemon = v.status().pid;
    let limits = mapfs_fuse::control::Limits::for_descriptor_limit(soft_nofile(daemon));
    let mut cmd = command_as_nobody(attack_bin());
    cmd.arg("--mount")
        .arg(v.mountpoint())
        .args(["conns", "2000", "--hold", "120"]);
    let mut attacker = Program::start(cmd);
    let got: Value = serde_json::from_str(&attacker.line()).unwrap();
    let accepted = got["accepted"].as_u64().unwrap() as usize;
    assert!(
        accepted <= limits.per_uid,
        "{test}: {accepted} connections accepted, cap {limits:?}: {got}"
    );
    assert!(accepted >= 1, "{test}: nothing accepted at all: {got}");
    // Refused ones are told EUSERS, or find the connection reset or
    // closed when the daemon closed it before reading their Hello.
    let eusers = got["refused_eusers"].as_u64().unwrap();
    assert!(eusers >= 1, "{test}: nobody was told EUSERS: {got}");
    let other = |k: String| got["outcomes"][k].as_u64().unwrap_or(0);
    let refused = eusers + other(format!("error:{}", libc::ECONNRESET)) + other("closed".into());
    assert_eq!(
        accepted as u64 + refused,
        2000,
        "{test}: other outcomes: {got}"
    );
    assert!(
        threads(daemon) < 32,
        "{test}: the daemon runs {} threads",
        threads(daemon)
    );
    assert_eq!(
        v.status().clients as usize,
        accepted + 1,
        "{test}: clients while held"
    );
    // While they are held: root and nobody through the mount, root under
    // the shim (adopts), nobody under the shim (falls back, still reads).
    v.assert_serves();
    let report = v.report("exhaustion");
    let out = v
        .shimmed(&report, "cat")
        .arg(v.path("secret"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{test}: root's cat under the shim");
    assert_eq!(out.stdout, SECRET);
    let t = totals(&report, "cat");
    assert!(t.adopted >= 1, "{test}: root's shim did not adopt: {t:?}");
    let out = command_as_nobody(mapfs_bin())
        .args(["run", "--mount"])
        .arg(v.mountpoint())
        .args(["--", "cat"])
        .arg(v.path("public"))
        .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{test}: nobody's cat under the shim");
    assert_eq!(out.stdout, PUBLIC);
    assert!(threads(daemon) < 32, "{test}: threads after use");
    attacker.say("release");
    let released: Value = serde_json::from_str(&attacker.line()).unwrap();
    assert_eq!(released["alive_at_release"].as_u64(), Some(accepted as u64));
    assert!(attacker.finish().success());
    eventually("the daemon to drop the attacker's connections", || {
        v.status().clients == 1
    });
}

/// Idle connections with nothing adopted are closed (after a minute), so
/// held connections do not keep their slots forever; the mount serves
/// throughout.
#[test]
fn idle_connections_are_closed() {
    let test = "idle connections";
    if !ready(test, &[]) {
        return;
    }
    // A short idle limit (the default is a minute) keeps the test short.
    let v = Victim::mount_with(
        test,
        "passthrough",
        DataMode::Auto,
        &[(mapfs_fuse::control::IDLE_ENV, "3")],
    );
    let mut cmd = command_as_nobody(attack_bin());
    cmd.arg("--mount")
        .arg(v.mountpoint())
        .args(["conns", "10", "--hold", "150"]);
    let mut attacker = Program::start(cmd);
    let got: Value = serde_json::from_str(&attacker.line()).unwrap();
    assert_eq!(got["accepted"], 10, "{test}: {got}");
    let start = Instant::now();
    // The status connection itself is the one client left.
    assert_eq!(v.status().clients, 11, "{test}: clients while held");
    while v.status().clients != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{test}: idle connections still open after {:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // End of input ends its hold.
    drop(attacker.to.take());
    let released: Value = serde_json::from_str(&attacker.line()).unwrap();
    assert_eq!(released["alive_at_release"], 0, "{test}: {released}");
    assert!(attacker.finish().success());
    v.assert_serves();
}

/// A decoy's pid in the pid file, its argv claiming the writeback cache is
/// off: `mapfs run` and the shim ask the daemon, adopt nothing on this
/// writeback-cache mount, and a program reads back what it wrote.
#[test]
fn pid_file_does_not_steer_writeback_decision() {
    let test = "pid file / writeback decision";
    if !ready(test, &[PYTHON, "/bin/bash"]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Daemon);
    let status = v.status();
    assert!(
        status.writeback_cache,
        "{test}: --data daemon should have the writeback cache on"
    );
    let pidfile =
        PathBuf::from("/run/mapfs").join(format!("{}.pid", control::escape(v.mountpoint())));
    assert!(
        pidfile.exists(),
        "{test}: no pid file at {}",
        pidfile.display()
    );
    let mp = v.mountpoint().display().to_string();
    let mut decoy = Command::new("/bin/bash");
    decoy
        .arg0("mapfs")
        .args(["-c", "read x", "mount", "passthrough", "X", &mp])
        .args(["--data", "daemon", "--writeback-cache", "off"]);
    let mut decoy = Program::start(decoy);
    fs::write(&pidfile, format!("{}\n", decoy.child.id())).unwrap();
    let script = "import os,sys\n\
        p=sys.argv[1]; data=bytes(range(256))*4000\n\
        with open(p,'wb') as f: f.write(data[:700000])\n\
        with open(p,'r+b') as f: f.seek(100); f.write(data[:1000])\n\
        want=bytearray(data[:700000]); want[100:1100]=data[:1000]\n\
        with open(p,'rb') as f: got=f.read()\n\
        st=os.stat(p).st_size\n\
        print(len(got), st, got==bytes(want))\n";
    let report = v.report("pidfile");
    let out = v
        .shimmed(&report, PYTHON)
        .arg("-c")
        .arg(script)
        .arg(v.path("drop/written"))
        .output()
        .unwrap();
    // Put the daemon's pid back before anything can fail (umount waits on it).
    fs::write(&pidfile, format!("{}\n", status.pid)).unwrap();
    decoy.finish();
    assert!(
        out.status.success(),
        "{test}: writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "700000 700000 True\n",
        "{test}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writeback cache"),
        "{test}: mapfs run did not say the mount is served through the mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = totals(&report, "python");
    assert_eq!(
        t.adopted, 0,
        "{test}: adopted on a writeback-cache mount: {t:?}"
    );
    assert!(t.processes >= 1, "{test}: no report: {t:?}");
    let backing = fs::read(v.backing().join("drop/written")).unwrap();
    assert_eq!(backing.len(), 700000, "{test}: backing size");
    v.assert_serves();
}

/// A forged pid in the pid file must not steer `mapfs umount`: with `1`
/// (init, always alive) it must not wait 30 s, and with garbage it must
/// still wait until the daemon is gone; the pid file must not be writable
/// by others.
#[test]
fn pid_file_does_not_steer_umount() {
    let test = "pid file / umount";
    if !ready(test, &[]) {
        return;
    }
    for forged in ["1", "garbage"] {
        let mut v = Victim::mount(test, DataMode::Auto);
        let daemon = v.status().pid;
        let pidfile =
            PathBuf::from("/run/mapfs").join(format!("{}.pid", control::escape(v.mountpoint())));
        let mode = fs::metadata(&pidfile).unwrap().permissions().mode() & 0o777;
        fs::write(&pidfile, format!("{forged}\n")).unwrap();
        let start = Instant::now();
        let out = v.session.as_mut().unwrap().umount_settled().unwrap();
        let took = start.elapsed();
        // The daemon leaves a pid file that is not its own, and the files
        // beside it (it may be a new daemon's); nothing else removes one
        // naming a live process (pid 1): the forger tidies up.
        let _ = fs::remove_file(&pidfile);
        let _ = fs::remove_file(pidfile.with_extension("json"));
        let alive = fs::read_to_string(format!("/proc/{daemon}/stat")).is_ok_and(|st| {
            !st.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        assert!(out.success(), "{test}: umount with {forged:?}: {out:?}");
        assert!(
            !alive,
            "{test}: umount returned before the daemon exited (pid file {forged:?})"
        );
        assert!(
            took < Duration::from_secs(15),
            "{test}: umount took {took:?} with pid file {forged:?}"
        );
        assert_eq!(
            mode & 0o022,
            0,
            "{test}: the pid file is writable by others ({mode:o})"
        );
    }
}

/// 20,000 connect + garbage + close cycles (and a burst of refused
/// connections) add only a few rate-limited lines to the daemon's log, and
/// a later line counts what was held back.
#[test]
fn log_flood_is_rate_limited() {
    let test = "log flood";
    if !ready(test, &[]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    let log = PathBuf::from("/run/mapfs").join(format!("{}.log", control::escape(v.mountpoint())));
    let before = fs::metadata(&log).unwrap().len();
    let started = Instant::now();
    let flood = v.attack(&["flood", "20000"]);
    assert_eq!(flood[0]["cycles"], 20000);
    let refused = flood[0]["outcomes"][format!("refused:{}", libc::EPROTO)]
        .as_u64()
        .unwrap_or(0);
    assert!(
        refused > 10000,
        "{test}: the garbage was not refused: {}",
        flood[0]
    );
    v.attack(&["conns", "600", "--hold", "0"]);
    let grown = fs::metadata(&log).unwrap().len() - before;
    assert!(grown < 20_000, "{test}: the log grew by {grown} bytes");
    // The sites log at most once per 10 s; keep provoking until a line
    // reports what it held back.
    let text = || {
        let all = fs::read(&log).unwrap();
        String::from_utf8_lossy(&all[before as usize..]).into_owned()
    };
    let summed = |t: &str| {
        t.lines().any(|l| {
            l.contains("malformed")
                && l.split_whitespace()
                    .any(|w| w.strip_prefix("held_back=").is_some_and(|n| n != "0"))
        })
    };
    let deadline = started + Duration::from_secs(40);
    while !summed(&text()) {
        assert!(
            Instant::now() < deadline,
            "{test}: no held_back count in the log:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(500));
        v.attack(&["flood", "2"]);
    }
    let t = text();
    let warns = t.lines().filter(|l| l.contains("WARN")).count();
    assert!(warns <= 8, "{test}: {warns} warnings:\n{t}");
    assert!(
        t.len() < 20_000,
        "{test}: the log grew by {} bytes",
        t.len()
    );
    v.assert_serves();
}

/// Forged Closed / Release / Changed (handles and proofs the attacker was
/// never given, a 1 TiB map) are refused, and root's adoption and the
/// inode's map-cache token are untouched.
#[test]
fn forged_closed_release_changed() {
    let test = "forged Closed/Release/Changed";
    if !ready(test, &[]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    // Root's own writable adoption of the secret, holding the generation
    // table; its handle is among the small ones the attacker tries.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(v.path("secret"))
        .unwrap();
    let ino = f.metadata().unwrap().ino();
    let conn = control::connect(&v.socket()).unwrap();
    let proof = control::prove(f.as_fd(), &conn.key).unwrap();
    let (resp, mut fds) = control::call(
        conn.sock.as_fd(),
        &Request::Adopt {
            proof,
            flags: libc::O_RDWR,
            engine: false,
        },
    )
    .unwrap();
    let Response::Adopted {
        handle,
        files,
        generations,
        ..
    } = resp
    else {
        panic!("{test}: root's adoption: {resp:?}");
    };
    assert!(
        handle <= 64,
        "{test}: root's handle {handle} is beyond what the attacker tries"
    );
    let table = control::take_generations(&mut fds, files, generations)
        .unwrap_or_else(|| panic!("{test}: no generation table"));
    let token = table.token(ino);
    let lines = v.attack(&[
        "forge-closed",
        "--rounds",
        "3000",
        "--file",
        &v.path("public").display().to_string(),
    ]);
    let r = &lines[0];
    v.assert_no_secret_fd(&lines);
    let eb = format!("Refused:{}", libc::EBADF);
    let ea = format!("Refused:{}", libc::EACCES);
    let answers = r["answers"].as_object().unwrap();
    for (kind, want) in [
        ("closed", &eb),
        ("release 1TiB", &eb),
        ("changed", &ea),
        ("release own read-only 1TiB", &eb),
        ("closed own read-only", &eb),
    ] {
        let got = answers
            .get(kind)
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("{test}: no {kind}: {r}"));
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            vec![want],
            "{test}: {kind}: {r}"
        );
    }
    assert_eq!(answers["closed"][&eb], 6000);
    assert_eq!(
        table.token(ino),
        token,
        "{test}: the attacker's forged messages changed the secret's token"
    );
    // Root's adoption still works: the descriptor reads the secret, and the
    // handle is still this connection's to close.
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut fs::File::from(fds.remove(0)), &mut got).unwrap();
    assert_eq!(got, SECRET);
    let (resp, _) = control::call(
        conn.sock.as_fd(),
        &Request::Closed {
            handle,
            wrote: false,
        },
    )
    .unwrap();
    assert_eq!(resp, Response::Done, "{test}: root's own Closed");
    drop(f);
    v.assert_serves();
}

/// plfs lends a read-only open (its map is not whole-file) to a client that
/// runs its own data engine: a forged 1 TiB map pushed for that read-only
/// lending is refused, and so are forged handles; the file is unchanged.
#[test]
fn forged_release_on_plfs_read_only_lending() {
    let test = "forged Release on a plfs read-only lending";
    if !ready(test, &[]) {
        return;
    }
    let v = Victim::mount_fs(test, "plfs", DataMode::Auto);
    let lines = v.attack(&[
        "forge-closed",
        "--rounds",
        "200",
        "--file",
        &v.path("public").display().to_string(),
    ]);
    let r = &lines[0];
    v.assert_no_secret_fd(&lines);
    let own = &r["notable"][0];
    assert_eq!(own["what"], "own adoption", "{test}: {r}");
    assert_eq!(
        own["answer"], "Adopted",
        "{test}: the attacker's own read-only open: {r}"
    );
    assert!(
        own["files"].as_u64().unwrap() >= 1 && own["size"] == PUBLIC.len(),
        "{test}: not a lending of the public file: {r}"
    );
    let eb = format!("Refused:{}", libc::EBADF);
    let answers = r["answers"].as_object().unwrap();
    let kinds = |kind: &str| {
        answers[kind]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        kinds("release own read-only 1TiB"),
        vec![eb.clone()],
        "{test}: {r}"
    );
    assert_eq!(kinds("release 1TiB"), vec![eb.clone()], "{test}: {r}");
    assert_eq!(kinds("closed"), vec![eb], "{test}: {r}");
    assert_eq!(
        kinds("changed"),
        vec![format!("Refused:{}", libc::EACCES)],
        "{test}: {r}"
    );
    // Ending its own lending is the attacker's right.
    assert_eq!(
        kinds("closed own read-only"),
        vec!["Done".to_string()],
        "{test}: {r}"
    );
    assert_eq!(
        fs::read(v.path("public")).unwrap(),
        PUBLIC,
        "{test}: public changed"
    );
    assert_eq!(
        fs::metadata(v.path("public")).unwrap().len(),
        PUBLIC.len() as u64
    );
    v.assert_serves();
}

/// A file system's online tools (pack's compaction, stats and check read
/// or move every file of the store) are refused to anyone but the mount's
/// owner and root, and the refusal leaves the mount serving.
#[test]
fn tools_refused_to_other_users() {
    let test = "tools refused to other users";
    if !ready(test, &[]) {
        return;
    }
    let v = Victim::mount_fs(test, "pack", DataMode::Auto);
    for name in ["compact", "stats", "check", "no-such-tool"] {
        let lines = v.attack(&["tool", name]);
        let r = &lines[0];
        assert_eq!(r["answer"], "Refused", "{test}: {name}: {r}");
        assert_eq!(r["errno"], libc::EPERM, "{test}: {name}: {r}");
        assert_eq!(r["fds"], serde_json::json!([]), "{test}: {name}: {r}");
    }
    // The owner (root) may: the same request through the CLI.
    let out = mapfs_testkit::mount::run_captured(
        Command::new(mapfs_bin())
            .args(["pack", "stats", "--json"])
            .arg(v.backing()),
    )
    .unwrap();
    assert!(
        out.success(),
        "{test}: root's stats: {}{}",
        out.stdout,
        out.stderr
    );
    let st: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(st["files"].as_u64().unwrap() >= 2, "{test}: {st}");
    v.assert_serves();
}

/// Descriptors sent to the daemon are refused by the kernel (EPERM), and a
/// lingering socket held by the attacker does not delay the daemon's exit.
#[test]
fn descriptor_passing_refused_and_umount_not_blocked() {
    let test = "descriptor passing / lingering socket";
    if !ready(test, &[]) {
        return;
    }
    let mut v = Victim::mount(test, DataMode::Auto);
    let daemon = v.status().pid as i32;
    let mut cmd = command_as_nobody(attack_bin());
    cmd.arg("--mount")
        .arg(v.mountpoint())
        .args(["send-fds", "--hold", "120"]);
    let mut attacker = Program::start(cmd);
    let r: Value = serde_json::from_str(&attacker.line()).unwrap();
    // SO_PASSRIGHTS off (Linux 6.16+): the kernel refuses the message;
    // older kernels deliver it and the daemon drops the connection.
    for (what, errno) in r["sendmsg"].as_object().unwrap() {
        let after = r["status_after"].get(what).and_then(Value::as_str);
        match errno.as_str() {
            Some("sent") => assert!(
                after.is_none_or(|a| a.starts_with("Error")),
                "{test}: the daemon kept serving a connection that sent a {what}: {r}"
            ),
            _ => {
                assert_eq!(errno, libc::EPERM, "{test}: sendmsg of a {what}: {r}");
                assert!(
                    after.is_none_or(|a| a == "Status"),
                    "{test}: connection after the refused {what}: {r}"
                );
            }
        }
    }
    v.assert_serves();
    // Unmount while the attacker still holds everything.
    let start = Instant::now();
    let out = v.session.as_mut().unwrap().umount_settled().unwrap();
    assert!(out.success(), "{test}: umount: {out:?}");
    eventually("the daemon to exit after umount", || !pid_exists(daemon));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{test}: the daemon took {:?} to exit",
        start.elapsed()
    );
    assert!(attacker.finish().success(), "{test}: attacker");
}

/// Peers whose pid the daemon cannot see, or sees in another namespace:
/// (a) the attacker in a pid namespace of its own; (b) the daemon in a pid
/// namespace of its own, so every peer's SO_PEERCRED pid is 0. Ordinary
/// refusals, and the daemon keeps serving (and adopting for root).
#[test]
fn peers_in_other_pid_namespaces() {
    let test = "pid 0 peer";
    if !ready(test, &["/usr/bin/unshare", PYTHON]) {
        return;
    }
    // (a) The attacker in a new pid namespace, as root.
    let v = Victim::mount(test, DataMode::Auto);
    let out = Command::new("/usr/bin/unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(attack_bin())
        .arg("--mount")
        .arg(v.mountpoint())
        .args(["adopt", "--file"])
        .arg(v.path("public"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{test}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        lines[0]["pid"], 1,
        "{test}: the attacker is not in its own namespace"
    );
    assert_adopt_refused(&v, &lines[0]);
    v.assert_serves();
    drop(v);

    // (b) The daemon in its own pid namespace, clients outside.
    let dirs = common::native_dir();
    let backing = dirs.path().join("backing");
    let mnt = dirs.path().join("mnt");
    for d in [&backing, &mnt] {
        fs::create_dir(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let log = fs::File::create(dirs.path().join("daemon.log")).unwrap();
    let daemon = Command::new("/usr/bin/unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(mapfs_bin())
        .args(["mount", "passthrough"])
        .arg(&backing)
        .arg(&mnt)
        .args(["--foreground", "-o", "allow_other"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut ns = NsDaemon {
        child: daemon,
        mnt: mnt.clone(),
    };
    eventually("the namespaced daemon's mount", || {
        mapfs_testkit::is_mounted(&mnt) && control::status(&control::socket_path(&mnt)).is_ok()
    });
    assert_eq!(
        control::status(&control::socket_path(&mnt)).unwrap().pid,
        1,
        "{test}: the daemon is not in its own pid namespace"
    );
    let fake = Victim {
        session: None,
        mnt: mnt.clone(),
        backing: backing.clone(),
        scratch: dirs.path().to_path_buf(),
        fs: "passthrough",
        test,
    };
    fake.setup();
    let lines = fake.attack(&[
        "adopt",
        "--file",
        &fake.path("public").display().to_string(),
    ]);
    assert_adopt_refused(&fake, &lines[0]);
    let report = fake.report("pidns");
    let out = fake
        .shimmed(&report, "cat")
        .arg(fake.path("secret"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{test}: root's cat under the shim");
    assert_eq!(out.stdout, SECRET);
    let t = totals(&report, "cat");
    assert!(
        t.adopted >= 1,
        "{test}: root (peer pid 0) did not adopt: {t:?}"
    );
    fake.assert_serves();
    drop(fake);
    ns.stop();
    let log = fs::read_to_string(dirs.path().join("daemon.log")).unwrap();
    assert!(
        !log.contains("panicked"),
        "{test}: the daemon panicked:\n{log}"
    );
}

/// The daemon started inside `unshare --pid --fork`; unmounted and reaped
/// on drop.
struct NsDaemon {
    child: Child,
    mnt: PathBuf,
}

impl NsDaemon {
    fn stop(&mut self) {
        if mapfs_testkit::is_mounted(&self.mnt) {
            let _ = Command::new(mapfs_bin())
                .arg("umount")
                .arg(&self.mnt)
                .output();
        }
        if mapfs_testkit::is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .output();
        }
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if start.elapsed() > PATIENCE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What already held before these tests stays so: nobody opening root's 0600
/// file under `mapfs run` gets EACCES exactly as without the shim, whether
/// directly, via `..`, via a symlink or by reopening an O_PATH descriptor.
#[test]
fn nobody_gets_eacces_through_every_path() {
    let test = "EACCES through the shim";
    if !ready(test, &[PYTHON]) {
        return;
    }
    let v = Victim::mount(test, DataMode::Auto);
    fs::create_dir(v.path("sub")).unwrap();
    fs::set_permissions(v.path("sub"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(v.path("secret"), v.path("link")).unwrap();
    let script = "import os,sys,errno\n\
        m=sys.argv[1]\n\
        def rd(how, f):\n\
        \x20 try:\n\
        \x20   fd=f(); d=os.read(fd,100); print(how,'ok',d)\n\
        \x20 except OSError as e: print(how, errno.errorcode[e.errno])\n\
        for mode,name in ((os.O_RDONLY,'r'),(os.O_RDWR,'rw')):\n\
        \x20 rd('direct '+name, lambda: os.open(m+'/secret',mode))\n\
        \x20 rd('dotdot '+name, lambda: os.open(m+'/sub/../secret',mode))\n\
        \x20 rd('symlink '+name, lambda: os.open(m+'/link',mode))\n\
        \x20 def opath():\n\
        \x20   p=os.open(m+'/secret',os.O_PATH)\n\
        \x20   return os.open('/proc/self/fd/%d'%p,mode)\n\
        \x20 rd('opath '+name, opath)\n\
        rd('public', lambda: os.open(m+'/public',os.O_RDONLY))\n";
    let report = v.report("eacces");
    fs::write(&report, b"").unwrap();
    fs::set_permissions(&report, fs::Permissions::from_mode(0o666)).unwrap();
    let run = |shimmed: bool| {
        let mut cmd = command_as_nobody(if shimmed { mapfs_bin() } else { PYTHON });
        if shimmed {
            cmd.args(["run", "--mount"])
                .arg(v.mountpoint())
                .args(["--", PYTHON]);
        }
        let out = cmd
            .args(["-c", script])
            .arg(v.mountpoint())
            .env("MAPFS_PRELOAD_REPORT", &report)
            .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
            .env("HOME", "/")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{test}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = run(false);
    let shimmed = run(true);
    let mut want = String::new();
    for mode in ["r", "rw"] {
        for how in ["direct", "dotdot", "symlink", "opath"] {
            want += &format!("{how} {mode} EACCES\n");
        }
    }
    want += "public ok b'for everyone\\n'\n";
    assert_eq!(plain, want, "{test}: without the shim");
    assert_eq!(shimmed, plain, "{test}: the shim differs from the mount");
    let t = totals(&report, "python");
    assert!(
        t.adopted >= 1,
        "{test}: nobody's shim adopted nothing (not attached?): {t:?}"
    );
    v.assert_serves();
}

/// Map parts (`MapPart`, the pieces of a map too large for one message)
/// are a budget per user: nobody's six connections of lent writers take
/// one user's share and are refused past it (`ENOMEM`); while nobody holds
/// all of theirs, root and another user (65533) still send a whole map's
/// parts. Before, the six took the daemon-wide bound and root's next part
/// was refused.
#[test]
fn a_user_spending_their_map_parts_refuses_nobody_else() {
    let test = "map parts per user";
    if !ready(test, &[]) {
        return;
    }
    let v = Victim::mount_fs(test, "plfs", DataMode::Auto);
    let max = control::MAX_MAP_BYTES as u64;
    let file_of = |uid: u32| {
        let f = v.path(&format!("drop/parts-{uid}"));
        fs::write(&f, b"").unwrap();
        std::os::unix::fs::chown(&f, Some(uid), Some(uid)).unwrap();
        f
    };
    let parts_cmd = |mut cmd: Command, file: &Path, n: &str, hold: &str| {
        cmd.arg("--mount")
            .arg(v.mountpoint())
            .args(["parts", "--file"])
            .arg(file)
            .args(["--n", n, "--hold", hold]);
        cmd
    };
    let nobody_file = file_of(65534);
    let mut attacker = Program::start(parts_cmd(
        command_as_nobody(attack_bin()),
        &nobody_file,
        "6",
        "120",
    ));
    let mut taken = 0;
    let mut refused = 0;
    for _ in 0..6 {
        let l: Value = serde_json::from_str(&attacker.line()).unwrap();
        assert!(l["taken"].is_u64(), "{test}: nobody's connection: {l}");
        taken += l["taken"].as_u64().unwrap();
        if l["refused"]["errno"].as_i64() == Some(i64::from(libc::ENOMEM)) {
            refused += 1;
        }
    }
    let holding: Value = serde_json::from_str(&attacker.line()).unwrap();
    assert_eq!(holding["holding"], 6, "{test}: {holding}");
    assert!(
        taken <= max && refused >= 5,
        "{test}: nobody's parts: {taken} bytes taken (one user's share is {max}), {refused} refused"
    );
    // While nobody holds theirs: root, then another user, send a whole map.
    for (who, cmd, file) in [
        ("root", Command::new(attack_bin()), file_of(0)),
        (
            "65533",
            mapfs_testkit::user::command_as(attack_bin(), 65533, 65533),
            file_of(65533),
        ),
    ] {
        let out = parts_cmd(cmd, &file, "1", "0")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let lines = parse_lines(&String::from_utf8_lossy(&out.stdout));
        let l = &lines[0];
        assert_eq!(
            l["taken"].as_u64(),
            Some(max),
            "{test}: {who}'s map parts while nobody holds theirs: {l}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    attacker.say("release");
    v.assert_serves();
}
