//! The preload shim on maps that are not whole-file 1-to-1: `plfs` (an
//! append log per writable open) under `mapfs run`. The daemon lends such
//! opens to the shim, which runs their data calls in-process on the mount
//! descriptor (the placeholder), and hands them back to the mount before
//! anything it cannot run itself (mmap, stdio, copy_file_range, fork, exec).
//!
//! Every check is against a byte model or against the same program run
//! natively. Needs the shim, `mapfs-fsx` and `mapfs` built together
//! (`cargo build --workspace`); skips loudly without /dev/fuse or python3.

mod common;
mod preload_support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use common::{fuse_or_skip, native_dir, DataMode, MountSession};
use preload_support::*;

/// The shim's code for a lent descriptor (`table::ENGINE`).
const LENT: &str = "6";

const EXERCISER: &str = include_str!("preload_support/pyfsx.py");

fn ops() -> u64 {
    std::env::var("MAPFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// A plfs mount whose opens the shim may borrow: kernel writeback cache off
/// (`auto`: plfs maps are never whole-file, so the daemon runs the mount's
/// own data calls, without the writeback cache).
fn plfs(test: &str) -> Option<MountSession> {
    if !fuse_or_skip(test) {
        return None;
    }
    let s = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount plfs: {e:#}"));
    Some(s)
}

/// The Python exerciser under the shim; `skip` leaves operations out.
/// Returns the shim's totals.
fn pyfsx(s: &MountSession, test: &str, seed: u64, skip: &str) -> (String, Totals) {
    pyfsx_with(s, test, seed, skip, false)
}

/// [`pyfsx`], with `raw`: copy_file_range and some preads by `syscall(2)`
/// and a reopen every 8 operations (`PYFSX_RAW`).
fn pyfsx_with(s: &MountSession, test: &str, seed: u64, skip: &str, raw: bool) -> (String, Totals) {
    let report = report_path(s, &format!("pyfsx-{seed}"));
    let file = s.mountpoint().join(format!("fsx.{seed}"));
    let model = s.scratch().unwrap().join(format!("model.{seed}"));
    let out = ok(attached(s, &report, "python3")
        .env("PYFSX_RAW", if raw { "1" } else { "0" })
        .arg("-c")
        .arg(EXERCISER)
        .arg(&file)
        .arg(seed.to_string())
        .arg(ops().to_string())
        .arg(&model)
        .arg(skip));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("{test}: {line}");
    // Once closed, the mount (no shim) shows exactly the model, and so does
    // a remount-free fresh open through the shim.
    let want = std::fs::read(&model).unwrap();
    let got = std::fs::read(&file).unwrap();
    assert_eq!(got.len(), want.len(), "{test}: size through the mount");
    assert!(
        got == want,
        "{test}: bytes through the mount differ from the model"
    );
    (line, totals(&report, "python"))
}

/// Data calls only (no mmap, copy_file_range): the open stays lent, and the
/// calls run in the application.
#[test]
fn python_fsx_plfs_lent() {
    let test = "preload python fsx plfs (lent)";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let (line, t) = pyfsx(&s, test, 20_261_122, "mapread,mapwrite,copy");
    eprintln!("{test}: shim {t:?}");
    assert!(
        line.contains(&format!(" status={LENT} ")),
        "{test}: the file was not lent: {line}"
    );
    assert_eq!(t.fallbacks, 0, "{test}: {t:?}");
    assert!(t.adopted > 1, "{test}: {t:?}");
    // fstat/stat go through the mount; data calls do not.
    assert!(
        t.native_calls as f64 >= ops() as f64 * 0.5 && t.mount_calls == 0,
        "{test}: {t:?}"
    );
}

/// Every operation: mmap and copy_file_range hand the open back to the
/// mount, reopens borrow it again; the bytes stay right across the moves.
#[test]
fn python_fsx_plfs_hand_back() {
    let test = "preload python fsx plfs (all operations)";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let (_, t) = pyfsx(&s, test, 20_261_123, "");
    eprintln!("{test}: shim {t:?}");
    assert!(t.adopted > 1 && t.native_calls > 0, "{test}: {t:?}");
    assert!(
        t.fallbacks > 0 && t.mount_calls > 0,
        "{test}: nothing was handed back: {t:?}"
    );
}

/// System calls the shim cannot see (made with `syscall(2)`, as Go, static
/// and io_uring programs do) on lent writers: each either fails the
/// documented way on the placeholder (`EBADF`; `ESPIPE` for `pread`) or,
/// on a descriptor that is not lent, returns the model's bytes; never a
/// short or zero copy that contradicts the program's own writes.
/// Several seeds, a reopen every 8 operations.
#[test]
fn python_fsx_plfs_raw_calls() {
    let test = "preload python fsx plfs (raw system calls)";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let mut refused = 0;
    for seed in [20_261_201, 20_261_202, 20_261_203] {
        let (line, t) = pyfsx_with(&s, test, seed, "", true);
        assert!(
            t.adopted > 1,
            "{test}: seed {seed}: nothing was lent: {t:?}"
        );
        refused +=
            line.matches("('copy_file_range', ").count() + line.matches("('pread', ").count();
    }
    assert!(
        refused > 0,
        "{test}: no raw call ever met a lent descriptor, so the placeholder was not exercised"
    );
}

/// Each data call made outside libc on a lent writer, after writes the
/// daemon has not seen: the documented error, the same every time, and the
/// file's bytes are the program's at its close.
#[test]
fn raw_calls_on_a_lent_writer_fail_the_documented_way() {
    let test = "preload plfs raw calls on a lent writer";
    let Some(s) = plfs(test) else { return };
    need("python3");
    const SCRIPT: &str = r#"
import os, sys, ctypes, errno, fcntl
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
path, other = sys.argv[1], sys.argv[2]
import struct, subprocess
# Another process, started before the file is open (a fork hands lent opens
# back to the mount), stats it on a signal.
watcher = subprocess.Popen(['sh', '-c', 'read x; stat -c %s "$1"', 'sh', path],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env={k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'})
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
data = bytes(range(256)) * 400
for i in range(0, len(data), 10000):
    os.write(fd, data[i:i + 10000])
assert libc.mapfs_preload_fd_status(fd) == 6, 'not lent'
fd2 = os.open(other, os.O_RDWR | os.O_CREAT, 0o644)
buf = ctypes.create_string_buffer(4096)
L = ctypes.c_longlong
calls = {
    'read': (0, fd, buf, 4096),
    'pread64': (17, fd, buf, 4096, L(0)),
    'pwrite64': (18, fd, buf, 4096, L(0)),
    'write': (1, fd, buf, 4096),
    'lseek_end': (8, fd, L(0), 2),
    'lseek_data': (8, fd, L(0), 3),
    'fallocate': (285, fd, 0, L(0), L(8192)),
    'ftruncate': (77, fd, L(10)),
    'cfr_from': (326, fd, None, fd2, None, ctypes.c_size_t(4096), 0),
    'cfr_into': (326, fd2, None, fd, None, ctypes.c_size_t(4096), 0),
    'fsync': (74, fd),
}
# stat outside libc, and by another process: the size of the writes the
# daemon has not been handed yet (the shared size page).
st = ctypes.create_string_buffer(256)
assert libc.syscall(5, fd, st) == 0
print('raw_fstat_size', struct.unpack_from('q', st, 48)[0])
out, _ = watcher.communicate(b'go\n')
print('other_stat_size', int(out))
assert libc.mapfs_preload_fd_status(fd) == 6, 'no longer lent'
for name, args in sorted(calls.items()):
    seen = set()
    for _ in range(3):
        ctypes.set_errno(0)
        r = libc.syscall(*args)
        seen.add((r, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())))
    assert len(seen) == 1, (name, seen)
    print(name, *seen.pop())
assert os.fstat(fd).st_size == len(data), os.fstat(fd).st_size
assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
fcntl.lockf(fd, fcntl.LOCK_EX, 100)
os.fsync(fd)
os.close(fd); os.close(fd2)
"#;
    let report = report_path(&s, "raw");
    let file = s.mountpoint().join("raw.bin");
    let other = s.mountpoint().join("other.bin");
    let out = ok(attached(&s, &report, "python3")
        .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
        .arg("-c")
        .arg(SCRIPT)
        .arg(&file)
        .arg(&other));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{test}:\n{text}");
    let answer = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{test}: no answer for {name}"))
            .to_string()
    };
    for (name, want) in [
        ("read", "-1 EBADF"),
        ("write", "-1 EBADF"),
        ("pread64", "-1 ESPIPE"),
        ("pwrite64", "-1 ESPIPE"),
        ("lseek_end", "-1 ESPIPE"),
        ("lseek_data", "-1 ESPIPE"),
        ("fallocate", "-1 EBADF"),
        ("ftruncate", "-1 EINVAL"),
        ("cfr_from", "-1 EBADF"),
        ("cfr_into", "-1 EBADF"),
        ("fsync", "-1 EIO"),
    ] {
        assert_eq!(answer(name), want, "{test}: {name}");
    }
    assert_eq!(answer("raw_fstat_size"), "102400", "{test}: raw fstat");
    assert_eq!(
        answer("other_stat_size"),
        "102400",
        "{test}: stat by another process"
    );
    let want: Vec<u8> = (0..400).flat_map(|_| 0..=255u8).collect();
    assert!(
        std::fs::read(&file).unwrap() == want,
        "{test}: bytes after close differ from what the program wrote"
    );
}

/// io_uring on a lent writer (the shim cannot see it): reads and writes
/// complete with `-EBADF` on the placeholder, and the file holds the
/// program's own writes. A C program with raw io_uring system calls
/// (`preload_support/uring_lent.c`), compiled by the test.
#[test]
fn io_uring_on_a_lent_writer_fails_the_documented_way() {
    let test = "preload plfs io_uring on a lent writer";
    let Some(s) = plfs(test) else { return };
    need("cc");
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload_support/uring_lent.c");
    let bin = s.scratch().unwrap().join("uring_lent");
    ok(Command::new("cc").arg("-O1").arg("-o").arg(&bin).arg(&src));
    let report = report_path(&s, "uring");
    let out = ok(attached(&s, &report, &bin).arg(s.mountpoint().join("u.bin")));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if text.contains("io_uring unavailable") {
        eprintln!("SKIPPED {test}: io_uring_setup is refused on this machine");
        return;
    }
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            format!("status {LENT}").as_str(),
            "read -9",
            "write -9",
            "size 32768 all_x 1"
        ],
        "{test}"
    );
}

/// `mapfs-fsx` itself under the shim on plfs.
#[test]
fn fsx_binary_under_shim_plfs() {
    let test = "preload mapfs-fsx plfs";
    let Some(s) = plfs(test) else { return };
    let report = report_path(&s, "fsx");
    let out = ok(attached(&s, &report, fsx_bin())
        .arg("--dir")
        .arg(s.mountpoint())
        .arg("--ops")
        .arg(ops().to_string())
        .arg("--seed")
        .arg("20261124"));
    eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
    let t = totals(&report, "mapfs-fsx");
    eprintln!("{test}: shim {t:?}");
    assert!(t.adopted > 0 && t.native_calls > 0, "{test}: {t:?}");
}

/// Writes `data` to `path` under the shim and checks the open was lent.
fn shim_write(s: &MountSession, report: &std::path::Path, path: &std::path::Path, data: &[u8]) {
    let mut child = attached(s, report, "python3")
        .arg("-c")
        .arg(format!(
            "import os,sys,ctypes\n\
             d=sys.stdin.buffer.read()\n\
             fd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)\n\
             n=0\n\
             while n<len(d): n+=os.write(fd,d[n:])\n\
             st=ctypes.CDLL(None).mapfs_preload_fd_status(fd)\n\
             assert not d or st=={LENT}, 'not lent: %d' % st\n\
             assert os.fstat(fd).st_size==len(d)\n\
             os.close(fd)\n"
        ))
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

/// Close-to-open between shim writers and plain processes on the mount.
#[test]
fn mixed_access_plfs() {
    let test = "preload mixed access plfs";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let report = report_path(&s, "mixed");
    let f = s.mountpoint().join("shared.bin");
    for (round, len) in [100_000usize, 3_000, 0, 250_000, 17]
        .into_iter()
        .enumerate()
    {
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
        let got = ok(attached(&s, &report, "python3")
            .arg("-c")
            .arg("import sys,os\nfd=os.open(sys.argv[1],os.O_RDONLY)\nb=b''\nwhile True:\n  c=os.read(fd,65536)\n  if not c: break\n  b+=c\nsys.stdout.buffer.write(b)\n")
            .arg(&f))
        .stdout;
        assert!(
            got == data2,
            "{test} round {round}: shim read after mount write"
        );
    }
    let t = totals(&report, "python");
    assert_eq!(t.fallbacks, 0, "{test}: {t:?}");
    assert!(t.adopted >= 9, "{test}: {t:?}");
}

/// While a shim process holds a lent writable open, a reader through the
/// mount sees the last closed state (close-to-open), gets no error, and
/// sees the new bytes once the writer closed. A writer killed with SIGKILL
/// ends its lending: the file works through the mount again.
const HOLDER: &str = r#"
import os, sys, ctypes
st = ctypes.CDLL(None).mapfs_preload_fd_status
fd = os.open(sys.argv[1], os.O_RDWR)
os.lseek(fd, 0, os.SEEK_END)
os.write(fd, b'B' * 5000)
assert st(fd) == 6, st(fd)
os.pwrite(fd, b'C' * 10, 3)
print('written', flush=True)
if sys.stdin.readline().strip() == 'close':
    os.close(fd)
    print('closed', flush=True)
sys.stdin.readline()
"#;

#[test]
fn lent_open_close_to_open_and_killed_writer() {
    let test = "preload plfs lent writer";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let f = s.mountpoint().join("held.bin");
    std::fs::write(&f, b"A".repeat(1000)).unwrap();
    let report = report_path(&s, "held");
    for kill in [false, true] {
        std::fs::write(&f, b"A".repeat(1000)).unwrap();
        let mut child = attached(&s, &report, "python3")
            .arg("-c")
            .arg(HOLDER)
            .arg(&f)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "written", "{test}");
        // Not closed yet: the mount shows the last closed state.
        assert_eq!(std::fs::read(&f).unwrap(), b"A".repeat(1000), "{test}");
        if kill {
            child.kill().unwrap();
            child.wait().unwrap();
            // Unflushed writes of a killed process are not in the file;
            // the file still works through the mount.
            eventually(&format!("{test}: readable after the kill"), || {
                std::fs::read(&f).is_ok_and(|b| b == b"A".repeat(1000))
            });
            let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
            w.write_all(b"Z").unwrap();
            drop(w);
            assert_eq!(std::fs::read(&f).unwrap().len(), 1001, "{test}");
        } else {
            writeln!(stdin, "close").unwrap();
            line.clear();
            std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            assert_eq!(line.trim(), "closed", "{test}");
            let mut want = b"A".repeat(1000);
            want[3..13].copy_from_slice(&[b'C'; 10]);
            want.extend_from_slice(&[b'B'; 5000]);
            assert!(std::fs::read(&f).unwrap() == want, "{test}: after close");
            writeln!(stdin).unwrap();
            assert!(child.wait().unwrap().success());
        }
    }
}

/// fork, dup, fcntl and threads on a lent open, asserting bytes and offsets.
const FORK_SCRIPT: &str = r#"
import os, sys, ctypes, threading, fcntl, struct
st = ctypes.CDLL(None).mapfs_preload_fd_status
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b'a' * 4096)
assert st(fd) == 6, st(fd)
# dup shares the offset
d = os.dup(fd)
assert os.lseek(d, 0, os.SEEK_CUR) == 4096
os.write(d, b'b' * 100)
assert os.lseek(fd, 0, os.SEEK_CUR) == 4196
assert st(d) == 6
# O_APPEND through F_SETFL
fl = fcntl.fcntl(fd, fcntl.F_GETFL)
fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_APPEND)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b'c' * 10)
assert os.fstat(fd).st_size == 4206, os.fstat(fd).st_size
fcntl.fcntl(fd, fcntl.F_SETFL, fl)
# a record lock relative to the offset lands where the shim's offset says
os.lseek(fd, 100, os.SEEK_SET)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0, os.SEEK_CUR)
# threads writing disjoint ranges
def w(i):
    os.pwrite(fd, bytes([65 + i]) * 1000, 10000 + i * 1000)
ts = [threading.Thread(target=w, args=(i,)) for i in range(4)]
for t in ts: t.start()
for t in ts: t.join()
assert os.fstat(fd).st_size == 14000
# fork: the open goes back to the mount, both processes share it
pid = os.fork()
if pid == 0:
    os.write(fd, b'child')
    os._exit(0)
os.waitpid(pid, 0)
assert st(fd) == 4, st(fd)
assert os.lseek(fd, 0, os.SEEK_CUR) == 105, os.lseek(fd, 0, os.SEEK_CUR)
assert os.pread(fd, 5, 100) == b'child'
assert os.pread(fd, 1000, 12000) == b'C' * 1000
os.close(d)
os.close(fd)
print('done')
"#;

#[test]
fn fork_dup_fcntl_threads_on_lent_open() {
    let test = "preload plfs fork/dup/fcntl/threads";
    let Some(s) = plfs(test) else { return };
    need("python3");
    let f = s.mountpoint().join("forked.bin");
    let report = report_path(&s, "fork");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(FORK_SCRIPT)
        .arg(&f));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    // The mount (no shim) agrees.
    let got = std::fs::read(&f).unwrap();
    assert_eq!(got.len(), 14000, "{test}");
    let mut want = b"a".repeat(4096);
    want.extend_from_slice(&[b'b'; 100]);
    want.extend_from_slice(&[b'c'; 10]);
    want[100..105].copy_from_slice(b"child");
    want.resize(10000, 0);
    for i in 0..4u8 {
        want.extend_from_slice(&[65 + i; 1000]);
    }
    assert!(got == want, "{test}: bytes through the mount");
}

/// As nobody, a root-only plfs file is refused with EACCES through the shim
/// exactly as through the mount, and a readable one is lent.
#[test]
fn nobody_gets_eacces_on_plfs() {
    let test = "preload plfs EACCES as nobody";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Auto)
        .options(["allow_other", "default_permissions"])
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount plfs: {e:#}"));
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
    let (sp, pp) = (secret.display(), public.display());
    assert_eq!(
        run(false),
        format!("{sp} EACCES\n{pp} ok for everyone -1\n"),
        "{test}: through the mount"
    );
    assert_eq!(
        run(true),
        format!("{sp} EACCES\n{pp} ok for everyone {LENT}\n"),
        "{test}: through the shim"
    );
}

/// Real programs on plfs under the shim produce what they produce natively.
#[test]
fn programs_on_plfs_match_native() {
    let test = "preload plfs programs";
    let Some(s) = plfs(test) else { return };
    let native = native_dir();
    let report = report_path(&s, "programs");
    let input = pattern(3 * 1024 * 1024 + 123, 77);
    std::fs::write(native.path().join("in.bin"), &input).unwrap();
    std::fs::write(s.mountpoint().join("in.bin"), &input).unwrap();
    let run = |prog: &str, args: &[&str]| {
        let n = ok(Command::new(prog).args(args).current_dir(native.path())).stdout;
        let m = ok(attached(&s, &report, prog)
            .args(args)
            .current_dir(s.mountpoint()))
        .stdout;
        assert!(n == m, "{test}: {prog} {args:?}: output differs");
    };
    let same = |name: &str| {
        let a = std::fs::read(native.path().join(name)).unwrap();
        let b = std::fs::read(s.mountpoint().join(name)).unwrap();
        assert!(a == b, "{test}: {name}: {} vs {} bytes", a.len(), b.len());
    };
    run("cp", &["in.bin", "cp.bin"]);
    same("cp.bin");
    run("cat", &["in.bin"]);
    run(
        "dd",
        &["if=in.bin", "of=dd.bin", "bs=4096", "seek=3", "status=none"],
    );
    run(
        "dd",
        &[
            "if=in.bin",
            "of=dd.bin",
            "bs=1000",
            "count=7",
            "seek=1",
            "conv=notrunc",
            "status=none",
        ],
    );
    same("dd.bin");
    // A deterministic archive: the native and mounted runs need not fall in
    // the same second, and tar records mtimes.
    run("sh", &["-c", "mkdir -p t/s && cp in.bin t/s/x && echo hi > t/y && tar --mtime=@0 --sort=name --owner=0 --group=0 --numeric-owner -cf t.tar t && mkdir -p u && tar xf t.tar -C u && cat u/t/y && cmp u/t/s/x in.bin"]);
    same("t.tar");
    if need("sqlite3") {
        let sql = "PRAGMA journal_mode=WAL;
CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<3000)
  INSERT INTO t(v) SELECT 'row' || x FROM c;
DELETE FROM t WHERE id % 7 = 0;
SELECT count(*), sum(id) FROM t;
PRAGMA wal_checkpoint(TRUNCATE);
PRAGMA integrity_check;";
        run("sqlite3", &["db.sqlite", sql]);
        let q = "SELECT count(*), sum(id) FROM t; PRAGMA integrity_check;";
        run("sqlite3", &["db.sqlite", q]);
        let plain = ok(Command::new("sqlite3")
            .arg(s.mountpoint().join("db.sqlite"))
            .arg(q))
        .stdout;
        assert!(
            String::from_utf8_lossy(&plain).trim_end().ends_with("ok"),
            "{test}: sqlite through the mount"
        );
    }
    let t = totals(&report, "");
    eprintln!("{test}: shim {t:?}");
    assert!(t.adopted > 0 && t.native_calls > 0, "{test}: {t:?}");
}

/// Two lent opens of one file: `a` writes 100,000 bytes, `b` grows the file
/// past them and closes, then `a` cuts it to 30 bytes. The cut is a truncate
/// for everyone (the later growth by `b` goes too), also as the file system
/// merges it again after a remount, exactly as on a native file.
const SHRINK_SCRIPT: &str = r#"
import os, sys, ctypes
# The shim's status of a descriptor (0 natively, without the shim).
st = getattr(ctypes.CDLL(None), 'mapfs_preload_fd_status', lambda fd: 0)
p = sys.argv[1]
a = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.pwrite(a, bytes(range(256)) * 400, 0)
b = os.open(p, os.O_RDWR)
os.pwrite(b, b'y', 150000)
lent = (st(a), st(b))
os.close(b)
os.ftruncate(a, 30)
assert os.fstat(a).st_size == 30, os.fstat(a).st_size
os.close(a)
print(lent)
"#;

#[test]
fn shrink_through_lent_open_undoes_other_growth() {
    let test = "preload plfs shrink through a lent open";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let native = native_dir();
    let np = native.path().join("s");
    ok(Command::new("python3")
        .arg("-c")
        .arg(SHRINK_SCRIPT)
        .arg(&np));
    let want = std::fs::read(&np).unwrap();
    assert_eq!(want.len(), 30, "{test}: native control");
    let keep = native_dir();
    let backing = keep.path().join("backing");
    std::fs::create_dir(&backing).unwrap();
    std::fs::set_permissions(&backing, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mount = || {
        MountSession::builder(mapfs_bin())
            .fs("plfs")
            .data(DataMode::Auto)
            .backing(&backing)
            .mount()
            .unwrap_or_else(|e| panic!("{test}: mount plfs: {e:#}"))
    };
    let mut s = mount();
    let report = report_path(&s, "shrink");
    let f = s.mountpoint().join("s");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(SHRINK_SCRIPT)
        .arg(&f));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("({LENT}, {LENT})"),
        "{test}: both opens lent"
    );
    assert!(
        std::fs::read(&f).unwrap() == want,
        "{test}: through the mount"
    );
    let u = s.umount_settled().expect("mapfs umount");
    assert!(u.success(), "{test}: umount: {u:?}");
    let s = mount();
    assert!(
        std::fs::read(s.mountpoint().join("s")).unwrap() == want,
        "{test}: after remount"
    );
}

/// A lent writer whose map is larger than one control packet (40,000
/// strided writes: 40,000 extents, about 400 KB encoded, where a packet
/// holds 256 KiB) pushes it in parts: after its `fsync` and `close` every
/// block is in the file, through the mount and under the shim. Before, the
/// push failed (`EMSGSIZE`) with one log line, `fsync` succeeded, and the
/// file kept only what the daemon last had: a 4-writer N-1 checkpoint of
/// 1 GiB per writer read back as 786,432 bytes.
#[test]
fn a_lent_map_larger_than_a_packet_reaches_the_file() {
    let test = "preload plfs large lent map";
    let Some(s) = plfs(test) else { return };
    let report = report_path(&s, "largemap");
    let path = s.mountpoint().join("strided");
    let (n, stride, len) = (40_000u64, 4096u64, 16usize);
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(format!(
            "import os,sys,ctypes\n\
             fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT|os.O_TRUNC,0o644)\n\
             for i in range({n}):\n\
             \x20   b=(i%251+1).to_bytes(1,'little')*{len}\n\
             \x20   assert os.pwrite(fd,b,i*{stride})=={len}\n\
             assert ctypes.CDLL(None).mapfs_preload_fd_status(fd)=={LENT}, 'not lent'\n\
             os.fsync(fd)\n\
             os.close(fd)\n\
             print('written')\n"
        ))
        .arg(&path));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("written"),
        "{test}: {out:?}"
    );
    let mut want = vec![0u8; ((n - 1) * stride) as usize + len];
    for i in 0..n {
        let at = (i * stride) as usize;
        want[at..at + len].fill((i % 251 + 1) as u8);
    }
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), want.len(), "{test}: size through the mount");
    assert!(got == want, "{test}: bytes through the mount differ");
    let t = totals(&report, "python3");
    assert!(t.adopted > 0, "{test}: not adopted: {t:?}");
}

/// Root writes a secret to a 0600 plfs file, truncates it to nothing and
/// writes `public` through the same open (so one log holds both, the
/// secret outside every map), then makes the file readable (then
/// writable) by all. Nobody, under the shim with adoption at the first
/// data call, reads `public`, and no descriptor the process holds (a lent
/// log included) reads the secret anywhere, by raw `pread64` (the shim
/// does not see it): a reader, then a read-write open.
#[test]
fn a_lent_open_never_reads_bytes_a_truncate_dropped() {
    let test = "preload plfs truncated bytes";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Auto)
        .options(["allow_other", "default_permissions"])
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount plfs: {e:#}"));
    let f = s.mountpoint().join("f");
    {
        let w = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&f)
            .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        use std::os::unix::fs::FileExt;
        w.write_all_at(b"TOP-SECRET-BYTES-OF-ROOT\n", 0).unwrap();
        w.set_len(0).unwrap();
        w.write_all_at(b"public", 0).unwrap();
    }
    let report = report_path(&s, "nobody");
    std::fs::write(&report, b"").unwrap();
    std::fs::set_permissions(&report, std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = "import os,sys,ctypes\n\
        libc=ctypes.CDLL(None)\n\
        p,mode=sys.argv[1],sys.argv[2]\n\
        fd=os.open(p, os.O_RDWR if mode=='rw' else os.O_RDONLY)\n\
        d=os.pread(fd,100,0)\n\
        st=libc.mapfs_preload_fd_status(fd)\n\
        buf=ctypes.create_string_buffer(1<<20)\n\
        leaks=[]\n\
        for n in os.listdir('/proc/self/fd'):\n\
        \x20 r=libc.syscall(17, int(n), buf, 1<<20, ctypes.c_long(0))\n\
        \x20 if r > 0 and b'TOP-SECRET' in buf.raw[:r]: leaks.append((n, os.readlink('/proc/self/fd/'+n)))\n\
        print(d.decode(), st, leaks)\n";
    for (mode, perm) in [("ro", 0o644), ("rw", 0o666)] {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(perm)).unwrap();
        let out = ok(mapfs_testkit::user::command_as_nobody(mapfs_bin())
            .args(["run", "--mount"])
            .arg(s.mountpoint())
            .args(["--", "python3", "-c", script])
            .arg(&f)
            .arg(mode)
            .env("MAPFS_PRELOAD_REPORT", &report)
            .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
            .env("HOME", "/"));
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        eprintln!("{test} ({mode}): {line}");
        assert!(
            line.starts_with("public ") && line.ends_with(" []"),
            "{test} ({mode}): nobody read {line:?}"
        );
    }
}
