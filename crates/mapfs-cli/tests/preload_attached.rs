//! The preload shim attached to a real mount: the data path moves
//! into the application, and everything it cannot serve still works through
//! the mount.
//!
//! Needs the shim and `mapfs-fsx` built next to `mapfs`
//! (`cargo build --workspace`); skips loudly without /dev/fuse or python3.

mod common;
mod preload_support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{fuse_or_skip, mount, DataMode};
use mapfs_testkit::mount::MountSession;
use preload_support::*;

fn fsx_ops() -> u64 {
    std::env::var("MAPFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// The exerciser itself runs under `mapfs run`; its byte model checks every
/// read, and the shim's report proves the calls skipped the daemon.
fn fsx_under_shim(mode: DataMode, extra: &[&str]) {
    let test = format!("preload fsx --data {mode} {extra:?}");
    if !fuse_or_skip(&test) {
        return;
    }
    let mut b = mapfs_testkit::MountSession::builder(common::mapfs_bin()).data(mode);
    for a in extra {
        b = b.arg(a);
    }
    let s = b.mount().unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let report = report_path(&s, "fsx");
    // MAPFS_FSX_BIN: another exerciser build to run instead.
    let bin = std::env::var_os("MAPFS_FSX_BIN").map_or_else(fsx_bin, Into::into);
    let out = ok(attached(&s, &report, bin)
        .arg("--dir")
        .arg(s.mountpoint())
        .arg("--ops")
        .arg(fsx_ops().to_string())
        .arg("--seed")
        .arg("20260301"));
    eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
    let t = totals(&report, "mapfs-fsx");
    eprintln!("{test}: shim {t:?}");
    assert!(
        t.tracked > 0,
        "{test}: the shim saw no open at all: mapfs-fsx makes raw system calls \
         (rustix's linux_raw backend), which LD_PRELOAD cannot interpose; it must \
         call libc for the shim to be exercised"
    );
    assert_eq!(
        t.fallbacks, 0,
        "{test}: some opens fell back to the mount: {t:?}"
    );
    assert_eq!(
        t.adopted, t.tracked,
        "{test}: not every open was adopted: {t:?}"
    );
    assert!(t.native_calls > 0 && t.mount_calls == 0, "{test}: {t:?}");
}

#[test]
fn fsx_under_shim_passthrough() {
    fsx_under_shim(DataMode::Passthrough, &[]);
}

#[test]
fn fsx_under_shim_daemon() {
    // The kernel's writeback cache would keep its own (stale) size of files
    // the shim wrote; strict close-to-open needs it off.
    fsx_under_shim(DataMode::Daemon, &["--writeback-cache", "off"]);
}

/// Writes `data` to `path` through the shim (python under `mapfs run`).
fn shim_write(
    s: &mapfs_testkit::MountSession,
    report: &std::path::Path,
    path: &std::path::Path,
    data: &[u8],
) {
    let mut child = attached(s, report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,ctypes\n\
             d=sys.stdin.buffer.read()\n\
             fd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)\n\
             n=0\n\
             while n<len(d): n+=os.write(fd,d[n:])\n\
             assert not d or ctypes.CDLL(None).mapfs_preload_fd_status(fd)==3, 'not adopted'\n\
             os.close(fd)\n",
        )
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python3");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "shim writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads `path` through the shim.
fn shim_read(
    s: &mapfs_testkit::MountSession,
    report: &std::path::Path,
    path: &std::path::Path,
) -> Vec<u8> {
    ok(attached(s, report, "python3")
        .arg("-c")
        .arg("import sys,os\nfd=os.open(sys.argv[1],os.O_RDONLY)\nb=b''\nwhile True:\n  c=os.read(fd,65536)\n  if not c: break\n  b+=c\nsys.stdout.buffer.write(b)\n")
        .arg(path))
    .stdout
}

/// Close-to-open between a shim process and plain processes on the mount,
/// growing and shrinking the file, in both directions.
fn mixed_access(mode: DataMode, extra: &[&str]) {
    let test = format!("preload mixed access --data {mode} {extra:?}");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let mut b = mapfs_testkit::MountSession::builder(mapfs_bin()).data(mode);
    for a in extra {
        b = b.arg(a);
    }
    let s = b.mount().unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let report = report_path(&s, "mixed");
    let f = s.mountpoint().join("shared.bin");
    for (round, len) in [100_000usize, 3_000, 0, 250_000, 17]
        .into_iter()
        .enumerate()
    {
        // Shim writes, the mount reads (this test process, no shim). The
        // mount read first, so the kernel has the old state cached.
        let _ = std::fs::read(&f);
        let data = pattern(len, round as u64 + 1);
        shim_write(&s, &report, &f, &data);
        assert_eq!(
            std::fs::metadata(&f).unwrap().len(),
            len as u64,
            "{test} round {round}: stat through the mount after the shim's close"
        );
        assert!(
            std::fs::read(&f).unwrap() == data,
            "{test} round {round}: bytes through the mount"
        );
        // The mount writes, the shim reads.
        let data2 = pattern(len / 2 + 1, round as u64 + 100);
        std::fs::write(&f, &data2).unwrap();
        assert!(
            shim_read(&s, &report, &f) == data2,
            "{test} round {round}: shim read after mount write"
        );
    }
    // Ten processes; the writer of the empty file never wrote, so it never
    // adopted.
    let t = totals(&report, "python");
    assert_eq!(
        (t.processes, t.adopted, t.fallbacks),
        (10, 9, 0),
        "{test}: {t:?}"
    );
}

#[test]
fn mixed_access_passthrough() {
    mixed_access(DataMode::Passthrough, &[]);
}

/// Daemon mode with the kernel's writeback cache off: strict close-to-open.
/// (With it on, the default, the kernel trusts its own cached size over the
/// daemon's, so sizes changed by shim writers show late; `mapfs mount
/// --help` says so.)
#[test]
fn mixed_access_daemon() {
    mixed_access(DataMode::Daemon, &["--writeback-cache", "off"]);
}

/// As nobody, a root-only file is refused with EACCES through the shim exactly
/// as through the mount, and a readable file is adopted (the control socket
/// serves unprivileged peers).
#[test]
fn nobody_gets_eacces_like_through_the_mount() {
    let test = "preload EACCES as nobody";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(
        DataMode::Passthrough,
        &["allow_other", "default_permissions"],
    );
    let secret = s.mountpoint().join("secret");
    std::fs::write(&secret, b"root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let public = s.mountpoint().join("public");
    std::fs::write(&public, b"for everyone").unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let report = report_path(&s, "nobody");
    std::fs::write(&report, b"").unwrap();
    std::fs::set_permissions(&report, std::fs::Permissions::from_mode(0o666)).unwrap();

    let run = |shimmed: bool| read_as_nobody(&s, &report, &[&secret, &public], shimmed);
    let plain = run(false);
    let shimmed = run(true);
    let sp = secret.display();
    let pp = public.display();
    assert_eq!(
        plain,
        format!("{sp} EACCES\n{pp} ok for everyone -1\n"),
        "{test}: through the mount"
    );
    assert_eq!(
        shimmed,
        format!("{sp} EACCES\n{pp} ok for everyone 3\n"),
        "{test}: through the shim"
    );
}

const FORK_DUP_SCRIPT: &str = r#"
import os, sys, fcntl, threading, subprocess, ctypes, random
status = ctypes.CDLL(None).mapfs_preload_fd_status
PENDING, ADOPTED, MOUNT = 2, 3, 4
p = sys.argv[1]
data = open(p, 'rb').read()
cur = lambda fd: os.lseek(fd, 0, os.SEEK_CUR)

# Lazy adoption: an open alone is not adopted; the first read is.
fd = os.open(p, os.O_RDWR)
assert status(fd) == PENDING, status(fd)
assert os.read(fd, 10) == data[:10]
assert status(fd) == ADOPTED, status(fd)
# fstat reports the mount's identity, not the backing file's.
st, ps = os.fstat(fd), os.stat(p)
assert (st.st_dev, st.st_ino, st.st_size) == (ps.st_dev, ps.st_ino, ps.st_size), (st, ps)

# dup and F_DUPFD share the offset.
d = os.dup(fd)
assert status(d) == ADOPTED and cur(d) == 10
assert os.read(d, 5) == data[10:15] and cur(fd) == 15
f3 = fcntl.fcntl(fd, fcntl.F_DUPFD, 100)
assert f3 >= 100 and status(f3) == ADOPTED
assert os.read(f3, 5) == data[15:20] and cur(fd) == 20
d2 = os.dup2(fd, 90)
assert os.read(90, 1) == data[20:21] and cur(fd) == 21
os.lseek(fd, 20, os.SEEK_SET)

# fork: the child's reads move the parent's offset (one open file description).
pid = os.fork()
if pid == 0:
    os._exit(0 if os.read(fd, 100) == data[20:120] else 1)
_, ws = os.waitpid(pid, 0)
assert ws == 0 and cur(fd) == 120, (ws, cur(fd))

# A pending descriptor, duplicated, then forked: pinned to the mount before
# the fork (no daemon round trip), so the offset is still shared by the dups
# and across the processes.
g = os.open(p, os.O_RDONLY)
g2 = os.dup(g)
assert status(g) == PENDING and status(g2) == PENDING
pid = os.fork()
if pid == 0:
    os._exit(0 if os.read(g, 50) == data[:50] and status(g) == MOUNT else 1)
_, ws = os.waitpid(pid, 0)
assert ws == 0 and status(g2) == MOUNT, (ws, status(g2))
assert cur(g2) == 50 and os.read(g2, 10) == data[50:60]

# exec: the new image continues at the shared offset, and re-adopts the
# descriptor (handed over in MAPFS_PRELOAD_ADOPTED): fstat shows the mount.
r = subprocess.run([sys.executable, '-c',
    'import os,sys,ctypes; s=ctypes.CDLL(None).mapfs_preload_fd_status(%d); st=os.fstat(%d); '
    'sys.stdout.buffer.write(repr((s, st.st_dev, st.st_ino)).encode() + b"|" + os.read(%d, 30))' % (fd, fd, fd)],
    pass_fds=(fd,), capture_output=True)
assert r.returncode == 0, r
head, _, got = r.stdout.partition(b'|')
assert got == data[120:150], r
assert eval(head) == (ADOPTED, ps.st_dev, ps.st_ino), (head, ps)
assert cur(fd) == 150

# A pending descriptor inherited across fork+exec: the bytes are right
# whether the child got it pinned to the mount (fork: handed over, status
# 4) or serves it as its own (vfork: the parent never saw the fork).
h = os.open(p, os.O_RDONLY)
os.lseek(h, 7, os.SEEK_SET)
r = subprocess.run([sys.executable, '-c',
    'import os,sys,ctypes; s=ctypes.CDLL(None).mapfs_preload_fd_status; b=os.read(%d, 5); sys.stdout.write(repr((b, s(%d))))' % (h, h)],
    pass_fds=(h,), capture_output=True)
assert r.returncode == 0, r
b, s = eval(r.stdout)
assert b == data[7:12] and s in (ADOPTED, 4), (b, s)
assert cur(h) == 12

# fcntl: flags and locks on adopted descriptors.
assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
# Record locks on another file: from its first lock on, the process's
# later opens of a file stay on the mount (adopting one would close a
# descriptor of the file under the program, which drops its locks).
q = os.open(p + '.locked', os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(q, b'q' * 100, 0)
assert status(q) == ADOPTED, status(q)
fcntl.lockf(q, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
q2 = os.open(p + '.locked', os.O_RDONLY)
assert os.pread(q2, 5, 0) == b'q' * 5 and status(q2) == MOUNT, status(q2)
fcntl.lockf(q, fcntl.LOCK_UN, 10, 0)
os.close(q2); os.close(q)

# O_APPEND from two processes interleaves whole records.
a = os.open(p, os.O_WRONLY | os.O_APPEND)
before = os.fstat(a).st_size
pid = os.fork()
if pid == 0:
    for _ in range(50): os.write(a, b'C' * 100)
    os._exit(0)
for _ in range(50): os.write(a, b'P' * 100)
os.waitpid(pid, 0)
assert status(a) == MOUNT  # pinned at the fork, shared with the child
assert os.fstat(a).st_size == before + 10000
tail = os.pread(fd, 10000, before)
assert sorted(tail[i:i+100] for i in range(0, 10000, 100)) == [b'C' * 100] * 50 + [b'P' * 100] * 50
data = data + tail

# Threads: a thread opens and reads once (adopted while it lives); four
# threads then read at random offsets concurrently.
box = {}
def opener():
    box['fd'] = os.open(p, os.O_RDONLY)
    assert os.pread(box['fd'], 3, 0) == data[:3]
t = threading.Thread(target=opener)
t.start(); t.join()
errors = []
def reader(seed):
    rnd = random.Random(seed)
    for _ in range(200):
        off = rnd.randrange(0, len(data)); n = rnd.randrange(1, 8192)
        if os.pread(box['fd'], n, off) != data[off:off+n]: errors.append((off, n))
ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
[x.start() for x in ts]; [x.join() for x in ts]
assert not errors, errors[:5]
assert status(box['fd']) == ADOPTED, status(box['fd'])
# Opened by a thread that is gone before any data call: the shim proves it
# holds the open with the descriptor itself, so it is adopted all the same.
t = threading.Thread(target=lambda: box.__setitem__('late', os.open(p, os.O_RDONLY)))
t.start(); t.join()
assert os.pread(box['late'], 100, 5) == data[5:105]
assert status(box['late']) == ADOPTED, status(box['late'])
os.close(box['late'])

for x in (fd, d, f3, 90, g, g2, h, a, box['fd']): os.close(x)
print('done')
"#;

/// fork/exec/dup/fcntl/threads, each asserting bytes and offsets.
#[test]
fn fork_exec_dup_fcntl_threads() {
    let test = "preload fork/exec/dup/fcntl/threads";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let f = s.mountpoint().join("data.bin");
    std::fs::write(&f, pattern(200_000, 42)).unwrap();
    let report = report_path(&s, "fork");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(FORK_DUP_SCRIPT)
        .arg(&f));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    // The pending descriptors pinned to the mount at a fork (`g`, `a`, `h`)
    // and the second open of the record-locked file (`q2`) are the only
    // ones served through it.
    let t = totals(&report, "python");
    assert!(t.fallbacks <= 4 && t.adopted >= 5, "{test}: {t:?}");
}

/// A shell redirection: the shell's child opens the file, makes it stdin and
/// execs `cat`; the new image adopts the inherited descriptor (same pid as
/// the opener), and `cat`'s reads are native.
#[test]
fn redirected_stdin_is_adopted_after_exec() {
    let test = "preload exec re-adoption";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let f = s.mountpoint().join("in.txt");
    let data = pattern(70_000, 5);
    std::fs::write(&f, &data).unwrap();
    let report = report_path(&s, "redirect");
    let out = ok(attached(&s, &report, "sh")
        .arg("-c")
        .arg("exec cat < \"$1\"")
        .arg("sh")
        .arg(&f));
    assert!(out.stdout == data, "{test}: bytes");
    let t = totals(&report, "cat");
    assert_eq!(
        (t.processes, t.adopted, t.fallbacks),
        (1, 1, 0),
        "{test}: {t:?}"
    );
    assert!(t.native_calls > 0 && t.mount_calls == 0, "{test}: {t:?}");
}

/// Metadata-only opens cost no adoption (no daemon round trip beyond the
/// mount's own): create, stat and unlink under the shim adopt nothing.
#[test]
fn metadata_only_opens_are_not_adopted() {
    let test = "preload create-stat-unlink";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let report = report_path(&s, "meta");
    ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys\nd=sys.argv[1]\n\
         for i in range(200): os.close(os.open(f'{d}/f{i}', os.O_CREAT|os.O_WRONLY, 0o644))\n\
         for i in range(200): assert os.stat(f'{d}/f{i}').st_size == 0\n\
         for i in range(200): os.unlink(f'{d}/f{i}')\n",
        )
        .arg(s.mountpoint()));
    let t = totals(&report, "python");
    assert!(t.tracked >= 200, "{test}: {t:?}");
    assert_eq!(t.adopted, 0, "{test}: {t:?}");
    assert_eq!(std::fs::read_dir(s.mountpoint()).unwrap().count(), 0);
}

/// The daemon dies under a shim process: adopted descriptors keep their
/// bytes, new opens fail with an error, nothing hangs.
#[test]
fn daemon_killed_nothing_hangs() {
    let test = "preload daemon killed";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    // No supervisor to replace the daemon (that case: failover.rs).
    let s = mapfs_testkit::MountSession::builder(common::mapfs_bin())
        .data(DataMode::Passthrough)
        .arg("--no-supervisor")
        .mount()
        .expect("mount --no-supervisor");
    let f = s.mountpoint().join("a.bin");
    let data = pattern(50_000, 9);
    std::fs::write(&f, &data).unwrap();
    let report = report_path(&s, "killed");
    let ready = s.scratch().unwrap().join("ready");
    let go = s.scratch().unwrap().join("go");
    let mut child = attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,time,errno,fcntl\n\
             p,ready,go=sys.argv[1:4]\n\
             fd=os.open(p,os.O_RDONLY); first=os.read(fd,100)\n\
             open(ready,'w').close()\n\
             while not os.path.exists(go): time.sleep(0.01)\n\
             rest=os.read(fd,1000)\n\
             try:\n  os.open(p,os.O_RDONLY); new='opened'\n\
             except OSError as e: new=errno.errorcode[e.errno]\n\
             try:\n  fcntl.flock(fd,fcntl.LOCK_SH|fcntl.LOCK_NB); lk='locked'\n\
             except OSError as e: lk=errno.errorcode[e.errno]\n\
             os.close(fd)\n\
             print(len(first)+len(rest), new, lk)\n",
        )
        .arg(&f)
        .arg(&ready)
        .arg(&go)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("shim process opened the file", || ready.exists());
    let pid = daemon_pid(&s);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    std::fs::write(&go, b"").unwrap();
    eventually("shim process finished", || {
        child.try_wait().unwrap().is_some()
    });
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut words = stdout.split_whitespace();
    assert_eq!(
        words.next(),
        Some("1100"),
        "{test}: the adopted fd kept reading: {stdout}"
    );
    let new = words.next().unwrap_or_default();
    assert!(
        ["ENOTCONN", "EIO", "ECONNABORTED"].contains(&new),
        "{test}: a new open after the daemon died: {new}"
    );
    // A lock on the adopted descriptor goes to the kept open of the dead
    // mount: an error or the kernel's local lock, never a hang (and the
    // close after it returned, or the process would not have printed).
    let lk = words.next().unwrap_or_default();
    assert!(
        ["locked", "ENOTCONN", "EIO", "ECONNABORTED"].contains(&lk),
        "{test}: a lock after the daemon died: {lk}"
    );
    // The bytes read were the file's (the adopted fd is the backing file).
    assert_eq!(std::fs::read(s.backing().join("a.bin")).unwrap(), data);
    // A killed daemon cannot remove its socket file.
    let _ = std::fs::remove_file(mapfs::control::socket_path(s.mountpoint()));
}

/// A shim writer killed before it could report its close: the daemon sees
/// its connection drop and invalidates, so the mount shows the new size.
#[test]
fn client_killed_daemon_drops_its_state() {
    let test = "preload client killed";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let f = s.mountpoint().join("w.bin");
    std::fs::write(&f, b"old").unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3);
    let report = report_path(&s, "client");
    let ready = s.scratch().unwrap().join("ready");
    let mut child = attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,time\n\
             fd=os.open(sys.argv[1],os.O_WRONLY)\n\
             os.pwrite(fd,b'x'*12345,0)\n\
             open(sys.argv[2],'w').close()\n\
             time.sleep(600)\n",
        )
        .arg(&f)
        .arg(&ready)
        .spawn()
        .unwrap();
    eventually("writer wrote", || ready.exists());
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("the mount shows the killed writer's size", || {
        std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0) == 12345
    });
    assert_eq!(std::fs::read(&f).unwrap(), vec![b'x'; 12345]);
    // The mount still serves new shim clients afterwards.
    let out = ok(attached(&s, &report, "cat").arg(&f));
    assert_eq!(out.stdout.len(), 12345);
    let t = totals(&report, "cat");
    assert_eq!((t.adopted, t.fallbacks), (1, 0), "{test}: {t:?}");
}

/// `mapfs run` refuses a directory that is not a mapfs mount, and reports a
/// missing program.
#[test]
fn run_rejects_bad_mounts() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(mapfs_bin())
        .args(["run", "--mount"])
        .arg(dir.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a mapfs mount"));
}

/// A writer's `stat` by path (through the mount) shows its own native writes
/// before it closes the file, as on a native file system.
#[test]
fn writer_stat_by_path_sees_its_writes() {
    let test = "preload stat of own writes";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let report = report_path(&s, "ownstat");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys\np=sys.argv[1]\nopen(p,'w').close()\nr=[os.stat(p).st_size]\n\
             fd=os.open(p,os.O_WRONLY); os.write(fd,b'x'*5000)\n\
             r+=[os.stat(p).st_size, os.lstat(p).st_size, os.path.getsize(p)]\n\
             os.ftruncate(fd,123); r.append(os.stat(p).st_size)\n\
             f=open(p,'ab'); f.write(b'y'*100); f.flush(); r.append(os.stat(p).st_size)\n\
             print(r)\n",
        )
        .arg(s.mountpoint().join("own.bin")));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[0, 5000, 5000, 5000, 123, 223]",
        "{test}"
    );
}

/// Applications that close "every" descriptor (a close loop, close_range) or
/// dup2 onto the shim's socket number do not break the shim: it keeps (or
/// reconnects) its control connection, and the files closed that way still
/// reach the mount (close-to-open).
#[test]
fn shim_survives_close_all_and_dup2_over_its_socket() {
    let test = "preload close-all";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let x = s.mountpoint().join("x");
    let y = s.mountpoint().join("y");
    std::fs::write(&x, b"hello").unwrap();
    std::fs::write(&y, b"world").unwrap();
    let report = report_path(&s, "closeall");
    // Without the map cache every adoption needs the (re)connected socket.
    let out = ok(attached(&s, &report, "python3")
        .env("MAPFS_PRELOAD_MAP_CACHE", "0")
        .arg("-c")
        .arg(
            "import os,sys\nx,y=sys.argv[1:3]\n\
             def socks():\n\
             \x20 r=[]\n\
             \x20 for f in os.listdir('/proc/self/fd'):\n\
             \x20   try:\n\
             \x20     if os.readlink('/proc/self/fd/'+f).startswith('socket:'): r.append(int(f))\n\
             \x20   except OSError: pass\n\
             \x20 return r\n\
             a=os.open(x,os.O_WRONLY); os.write(a,b'HELLO')\n\
             s=socks(); assert len(s)==1, s\n\
             os.closerange(3,100000)\n\
             assert socks()==s\n\
             print(open(x).read())\n\
             b=os.open(y,os.O_RDONLY); print(os.read(b,5).decode())\n\
             os.dup2(b,s[0])\n\
             c=os.open(x,os.O_RDONLY); print(os.read(c,5).decode())\n\
             for i in range(3,1000):\n\
             \x20 try: os.close(i)\n\
             \x20 except OSError: pass\n\
             assert len(socks())==1\n\
             d=os.open(y,os.O_RDONLY); print(os.read(d,5).decode())\n",
        )
        .arg(&x)
        .arg(&y));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "HELLO\nworld\nHELLO\nworld\n",
        "{test}"
    );
    assert_eq!(std::fs::read(&x).unwrap(), b"HELLO");
    let t = totals(&report, "python");
    assert_eq!((t.adopted, t.fallbacks), (5, 0), "{test}: {t:?}");
}

/// Runs Python `script` on `f` under the default adoption policy with
/// `MAPFS_PRELOAD_ADOPT_MOUNT_US=us`, checks that it prints the descriptor
/// statuses `want`, and returns its report's path.
fn policy_run(
    s: &MountSession,
    f: &Path,
    script: &str,
    us: &str,
    want: &str,
    test: &str,
) -> PathBuf {
    let report = report_path(s, &format!("policy-{us}-{}", want.len()));
    let out = ok(attached_default(s, &report, "python3")
        .env("MAPFS_PRELOAD_ADOPT_MOUNT_US", us)
        .arg("-c")
        .arg(script)
        .arg(f));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        want,
        "{test}: MAPFS_PRELOAD_ADOPT_MOUNT_US={us}"
    );
    report
}

/// The default adoption policy: a few small calls stay on the mount (an
/// adoption would cost more than they do); the sixteenth call adopts, and
/// so does a large call after a large one that took longer on the mount
/// than an adoption costs, but not one after a large call the kernel ran
/// fast, nor the small call that finds the end of a file read whole (an
/// adoption then gains nothing); either way the bytes are the file's.
#[test]
fn default_policy_adopts_busy_descriptors_only() {
    let test = "preload adoption policy";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let f = s.mountpoint().join("p.bin");
    std::fs::write(&f, pattern(3 << 20, 8)).unwrap();
    let script =
        "import os,sys,ctypes\nst=ctypes.CDLL(None).mapfs_preload_fd_status\np=sys.argv[1]\n\
                  d=open(p,'rb').read(); r=[]\n\
                  a=os.open(p,os.O_RDONLY)\n\
                  for i in range(16):\n\
                  \x20 assert os.read(a,100)==d[i*100:(i+1)*100]; r.append(st(a))\n\
                  b=os.open(p,os.O_RDONLY)\n\
                  for i in range(2):\n\
                  \x20 assert os.pread(b,1<<20,5+i)==d[5+i:5+i+(1<<20)]; r.append(st(b))\n\
                  c=os.open(p,os.O_RDONLY); os.close(c); r.append(st(c))\n\
                  print(r)\n";
    // The time rule's threshold (also what makes a large call slow): out
    // of reach, as a loaded machine may make a passthrough read slow, then
    // at 1 µs, which every large call takes.
    for (us, want, adopted) in [
        (
            "100000000",
            "[2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 2, 0]",
            1,
        ),
        (
            "1",
            "[2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 3, 0]",
            2,
        ),
    ] {
        let report = policy_run(&s, &f, script, us, want, test);
        let t = totals(&report, "python");
        assert_eq!(
            (t.tracked, t.adopted, t.fallbacks),
            (4, adopted, 0),
            "{test}: MAPFS_PRELOAD_ADOPT_MOUNT_US={us}: {t:?}"
        );
    }
}

/// The time rule of the adoption policy: from its fourth call on, a pending
/// descriptor is adopted once its calls through the mount took
/// `MAPFS_PRELOAD_ADOPT_MOUNT_US` in all (a daemon's round trip takes more
/// than 1 µs, so with 1 the fourth call adopts; with 100 s, no call of ten
/// does), and the bytes are the file's either way.
#[test]
fn time_spent_on_the_mount_adopts_from_the_fourth_call() {
    let test = "preload adoption policy, time on the mount";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::DaemonNoWriteback, &[]);
    let f = s.mountpoint().join("t.bin");
    let want = pattern(4096, 9);
    std::fs::write(&f, &want).unwrap();
    let script = "import os,sys,ctypes\nst=ctypes.CDLL(None).mapfs_preload_fd_status\n\
                  d=open(sys.argv[1],'rb').read(4096); r=[]\n\
                  a=os.open(sys.argv[1],os.O_RDONLY)\n\
                  for i in range(10):\n\
                  \x20 assert os.pread(a,100,i*100)==d[i*100:(i+1)*100]; r.append(st(a))\n\
                  print(r)\n";
    for (us, want_status) in [
        ("1", "[2, 2, 2, 3, 3, 3, 3, 3, 3, 3]"),
        ("100000000", "[2, 2, 2, 2, 2, 2, 2, 2, 2, 2]"),
    ] {
        policy_run(&s, &f, script, us, want_status, test);
    }
    assert_eq!(std::fs::read(&f).unwrap(), want, "{test}: the file changed");
}

/// Processes that only read small files (`cat`, `head`, a shell's
/// redirections) never contact the daemon: `posix_fadvise` is a hint, a few
/// small calls are cheaper through the mount than an adoption, and a
/// descriptor open across a `fork` is pinned to the mount rather than
/// adopted. Counted with the daemon's own connection counter.
#[test]
fn small_file_readers_never_contact_the_daemon() {
    let test = "preload small-file readers";
    if !fuse_or_skip(test) {
        return;
    }
    for mode in [DataMode::Passthrough, DataMode::DaemonNoWriteback] {
        let s = mount(mode, &[]);
        let f = s.mountpoint().join("small.txt");
        let want = pattern(8000, 3);
        std::fs::write(&f, &want).unwrap();
        let socket = mapfs::control::socket_path(s.mountpoint());
        let connections = || mapfs::control::status(&socket).unwrap().connections;
        let before = connections();
        let report = report_path(&s, "small");
        let out = ok(attached_default(&s, &report, "sh")
            .arg("-c")
            .arg("for i in 1 2 3 4 5 6 7 8 9 10; do cat \"$1\" >/dev/null; done; head -c 100 \"$1\" >/dev/null; wc -c < \"$1\" >/dev/null; cat \"$1\"")
            .arg("sh")
            .arg(&f));
        let after = connections();
        assert!(out.stdout.ends_with(&want), "{test} ({mode}): bytes");
        // `mapfs run` asks the daemon once whether its writeback cache is
        // on; the second status call above is the other.
        assert_eq!(
            after - before,
            2,
            "{test} ({mode}): a process connected to the control socket"
        );
        let t = totals(&report, "cat");
        assert!(t.tracked >= 10 && t.adopted == 0, "{test} ({mode}): {t:?}");
    }
}

/// A change made by someone else through the mount (rename over, unlink,
/// truncate, write+close) is seen by a shim process at its next open, even
/// while it still holds the old file adopted.
#[test]
fn changes_by_others_are_seen_at_next_open() {
    let test = "preload changes by others";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let dir = s.mountpoint();
    let f = dir.join("f");
    std::fs::write(&f, b"first version").unwrap();
    let report = report_path(&s, "others");
    let step = s.scratch().unwrap().join("step");
    let done = s.scratch().unwrap().join("done");
    let child = attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,time\np,step,done=sys.argv[1:4]\n\
             def wait(n):\n\
             \x20 while not (os.path.exists(step) and open(step).read()==str(n)): time.sleep(0.01)\n\
             def read_new():\n\
             \x20 fd=os.open(p,os.O_RDONLY); b=os.read(fd,100); os.close(fd); return b\n\
             old=os.open(p,os.O_RDONLY); os.read(old,1)\n\
             out=[read_new()]\n\
             open(done,'w').write('1'); wait(1); out.append(read_new())\n\
             open(done,'w').write('2'); wait(2); out.append(read_new())\n\
             open(done,'w').write('3'); wait(3)\n\
             try: read_new(); out.append(b'still there')\n\
             except FileNotFoundError: out.append(b'ENOENT')\n\
             os.lseek(old,0,0); out.append(os.read(old,100))\n\
             print(out)\n",
        )
        .arg(&f)
        .arg(&step)
        .arg(&done)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let advance = |n: u32, what: &dyn Fn()| {
        eventually(&format!("shim process reached step {n}"), || {
            std::fs::read_to_string(&done).ok().as_deref() == Some(&n.to_string())
        });
        what();
        std::fs::write(&step, n.to_string()).unwrap();
    };
    // 1: replaced by a rename; 2: truncated and rewritten; 3: unlinked.
    advance(1, &|| {
        std::fs::write(dir.join("g"), b"second, renamed over").unwrap();
        std::fs::rename(dir.join("g"), &f).unwrap();
    });
    advance(2, &|| std::fs::write(&f, b"third").unwrap());
    advance(3, &|| std::fs::remove_file(&f).unwrap());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{test}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[b'first version', b'second, renamed over', b'third', b'ENOENT', b'first version']",
        "{test}"
    );
}

/// A storm of signals (a 0.2 ms interval timer) interrupting opens,
/// adoptions, reads, writes and closes changes no byte and no offset.
#[test]
fn signals_interrupting_calls() {
    let test = "preload signals";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let f = s.mountpoint().join("sig.bin");
    std::fs::write(&f, pattern(300_000, 11)).unwrap();
    let report = report_path(&s, "signals");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,signal\np=sys.argv[1]\nd=open(p,'rb').read()\nhits=[0]\n\
             def h(*a): hits[0]+=1\n\
             signal.signal(signal.SIGALRM,h)\n\
             signal.setitimer(signal.ITIMER_REAL,0.0002,0.0002)\n\
             for i in range(300):\n\
             \x20 fd=os.open(p,os.O_RDWR)\n\
             \x20 off=(i*997)%250000\n\
             \x20 os.lseek(fd,off,0)\n\
             \x20 assert os.read(fd,4096)==d[off:off+4096], i\n\
             \x20 assert os.lseek(fd,0,1)==off+4096\n\
             \x20 os.pwrite(fd,d[off:off+100],off)\n\
             \x20 os.close(fd)\n\
             signal.setitimer(signal.ITIMER_REAL,0)\n\
             print(hits[0]>0)\n",
        )
        .arg(&f));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "True",
        "{test}: no signal arrived"
    );
    assert!(
        std::fs::read(&f).unwrap() == pattern(300_000, 11),
        "{test}: bytes changed"
    );
    let t = totals(&report, "python");
    assert_eq!(t.fallbacks, 0, "{test}: {t:?}");
    assert!(t.adopted >= 300, "{test}: {t:?}");
}

/// On a daemon-mode mount with the kernel writeback cache (its default), the
/// kernel would keep stale sizes of files written natively: `mapfs run` says
/// so and the shim leaves that mount's files on the mount, where they stay
/// correct (close-to-open included).
#[test]
fn writeback_cache_mounts_stay_on_the_mount() {
    let test = "preload on a writeback-cache mount";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Daemon, &[]);
    let f = s.mountpoint().join("wb.bin");
    let report = report_path(&s, "writeback");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os,sys,ctypes\nst=ctypes.CDLL(None).mapfs_preload_fd_status\np=sys.argv[1]\n\
             fd=os.open(p,os.O_RDWR|os.O_CREAT,0o644); os.write(fd,b'z'*7000); s1=st(fd); os.close(fd)\n\
             fd=os.open(p,os.O_RDONLY); b=os.read(fd,10000); s2=st(fd); os.close(fd)\n\
             print(s1,s2,len(b),os.stat(p).st_size)\n",
        )
        .arg(&f));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "4 4 7000 7000",
        "{test}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writeback cache"),
        "{test}: no warning: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 7000, "{test}");
    let t = totals(&report, "python");
    assert_eq!((t.adopted, t.fallbacks), (0, 2), "{test}: {t:?}");
}

/// Opens (and reads, so the shim adopts) files until the descriptor numbers
/// run out under a soft limit of 600; prints how many it got.
const FD_HUNGRY: &str = r#"
import os, sys, resource
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))
fds = []
try:
    for i in range(1000):
        fd = os.open(f'{sys.argv[1]}/f{i}', os.O_RDONLY)
        fds.append(fd)
        assert os.read(fd, 4) == b'data'
except OSError as e:
    assert e.errno == 24, e
print(len(fds))
for fd in fds:
    os.close(fd)
"#;

/// The shim's own descriptors (kept mount opens, the map cache) never cost
/// an application a descriptor: when its opens run out of numbers, the shim
/// gives its own back and the open is made again.
#[test]
fn shim_gives_descriptors_back_under_emfile() {
    let test = "preload EMFILE";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    for i in 0..1000 {
        std::fs::write(s.mountpoint().join(format!("f{i}")), b"data").unwrap();
    }
    let count = |out: std::process::Output| -> usize {
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let plain = count(ok(Command::new("python3")
        .arg("-c")
        .arg(FD_HUNGRY)
        .arg(s.mountpoint())));
    let report = report_path(&s, "emfile");
    let shimmed = count(ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(FD_HUNGRY)
        .arg(s.mountpoint())));
    let t = totals(&report, "python");
    eprintln!("{test}: {plain} files open without the shim, {shimmed} with it: {t:?}");
    assert!(
        t.adopted > 100,
        "{test}: the shim adopted too little: {t:?}"
    );
    // The control socket is the one descriptor the shim keeps.
    assert!(
        shimmed + 1 >= plain,
        "{test}: {shimmed} files open under the shim, {plain} without: {t:?}"
    );
}

/// `isatty` of a file opened through the mount (Python asks it at every
/// `open`) is answered by the shim, `ENOTTY` as the daemon would, without
/// a `TCGETS` ioctl round trip to the daemon; a real terminal (a pty) is
/// still one.
#[test]
fn isatty_of_mount_files_is_answered_without_the_daemon() {
    let test = "preload isatty";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let files = 50;
    for i in 0..files {
        std::fs::write(s.mountpoint().join(format!("f{i}")), b"data").unwrap();
    }
    let ioctls = || common::op_count_now(s.mountpoint(), "IOCTL");
    let before = ioctls();
    let report = report_path(&s, "isatty");
    let out = ok(attached_default(&s, &report, "python3")
        .arg("-c")
        .arg(
            "import os, pty, sys, errno, ctypes\n\
             d, n = sys.argv[1], int(sys.argv[2])\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             for i in range(n):\n\
             \x20   with open(f'{d}/f{i}', 'rb') as f:\n\
             \x20       assert libc.isatty(f.fileno()) == 0\n\
             \x20       assert ctypes.get_errno() == errno.ENOTTY, ctypes.get_errno()\n\
             m, sl = pty.openpty()\n\
             assert os.isatty(sl)\n\
             print('ok')\n",
        )
        .arg(s.mountpoint())
        .arg(files.to_string()));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{test}");
    // Without the shim's answer: one per open and one per explicit call.
    assert_eq!(ioctls() - before, 0, "{test}: isatty reached the daemon");
}

/// The sequence that once made a read of a `versions` file under the shim
/// fail with `EOPNOTSUPP`: a writer of a file past `max-size` (its map
/// an undo version's, not whole-file, so lent), a write through a shared
/// mapping (the open is handed back), two reopens, and a mapped write at
/// once on the new open (its adoption without the engine is refused: "map
/// is not whole-file", so it stays on the mount); then plain reads and
/// writes on it, each checked against the bytes meant, and the file read
/// back through the mount.
const VERSIONS_REOPEN: &str = r#"
import mmap, os, sys
p = sys.argv[1]
n = 200_000
want = bytearray((i * 7 + 3) % 251 for i in range(n))
with open(p, 'wb') as f:
    f.write(want)
def mapwrite(fd, off, b):
    m = mmap.mmap(fd, n)
    m[off:off + len(b)] = b
    m.flush()
    m.close()
    want[off:off + len(b)] = b
fd = os.open(p, os.O_RDWR)
os.pwrite(fd, b'w' * 100, 10); want[10:110] = b'w' * 100
mapwrite(fd, 1000, b'x' * 300)
os.close(fd)
for _ in range(2):
    fd = os.open(p, os.O_RDWR)
    assert os.pread(fd, n, 0) == want, 'read after reopen'
    os.close(fd)
fd = os.open(p, os.O_RDWR)
mapwrite(fd, 5000, b'y' * 300)
assert os.read(fd, n) == want, 'read after the mapped write'
for i in range(20):
    os.pwrite(fd, b'%d' % i, 70_000 + i * 10); want[70_000 + i * 10:70_000 + i * 10 + len(b'%d' % i)] = b'%d' % i
    assert os.pread(fd, 4096, 69_000) == want[69_000:73_096]
os.close(fd)
sys.stdout.buffer.write(want)
"#;

#[test]
fn versions_reads_after_a_mapped_write_and_two_reopens() {
    let test = "preload versions: read after mapwrite and reopens";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mapfs_testkit::MountSession::builder(common::mapfs_bin())
        .fs("versions")
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let f = s.mountpoint().join("v");
    for policy in ["1", "16"] {
        let report = report_path(&s, &format!("v{policy}"));
        let out = ok(attached(&s, &report, "python3")
            .env("MAPFS_PRELOAD_ADOPT_CALLS", policy)
            .arg("-c")
            .arg(VERSIONS_REOPEN)
            .arg(&f));
        assert_eq!(out.stdout.len(), 200_000, "{test}: the script's bytes");
        assert!(
            std::fs::read(&f).unwrap() == out.stdout,
            "{test} (adopting at call {policy}): the mount shows other bytes"
        );
        let t = totals(&report, "python");
        assert!(t.tracked > 0, "{test}: the shim saw no open: {t:?}");
    }
}
