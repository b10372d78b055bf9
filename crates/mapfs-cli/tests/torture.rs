//! The torture suite of the in-process executors: programs that mix
//! threads, `fork`, `vfork`, `posix_spawn`, `exec` and signal handlers,
//! on every built-in file system, under `mapfs run` attached to a mount
//! (descriptors adopted at their first data call, so the shim serves
//! them) and under `mapfs run --embed`. Each run is under a watchdog: a
//! hang fails the test and prints every thread's stack. Every byte the
//! programs write is checked against what they know they wrote.
//!
//! - `torture.c` (tests/torture_support): three threads rewrite, `dup`,
//!   reopen and `fdopen` files while the main thread forks children doing
//!   I/O on inherited and new descriptors, then `exit`, `_exit` or `exec`
//!   (`fork`); vforks and posix_spawns shells writing files (`spawn`); or
//!   takes a `SIGALRM` every 100-500 us whose handler dups, reads, writes
//!   and closes a file's descriptor (`signal`).
//! - Python: threads with `subprocess`, `os.fork`, and
//!   `multiprocessing.Pool` in the fork and spawn contexts.
//! - bash: redirections, here-documents, pipelines, traps, subshells.

mod common;
mod embed_support;
mod preload_support;
mod torture_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::fuse_or_skip;
use torture_support::{attached, embedded, mount, succeeded, torture_bin, watched, Target, LIMIT};

/// Runs of each program per case (each a fresh process tree).
const RUNS: usize = 20;

/// Rounds of the main thread's loop in one run of `torture.c`.
fn rounds(mode: &str) -> &'static str {
    match mode {
        "fork" => "30",
        "spawn" => "20",
        _ => "40",
    }
}

/// What `torture.c`'s signal handler may see the library allocate (see
/// `TORTURE_ALLOC_CHECK` there): nothing under `mapfs run`, but a lent plfs
/// open's writes (their in-process map update); embedded, the file system
/// itself runs in the handler, made safe by the allocator's exports
/// instead (`handlers_never_run_over_the_allocator_*`).
fn alloc_check(executor: &str, fs: &str) -> &'static str {
    match (executor, fs) {
        ("attached", "plfs") => "writes",
        ("attached", _) => "all",
        _ => "off",
    }
}

/// `torture.c` in each mode, [`RUNS`] times each.
fn c_program(executor: &str, fs: &'static str) {
    let test = format!("torture.c {executor} {fs}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    let t = Target::new(executor, fs, &test);
    let bin = torture_bin().display().to_string();
    for mode in ["fork", "spawn", "signal"] {
        for run in 0..RUNS {
            let what = format!("{test} {mode} run {run}");
            let dir = t.dir(&format!("{mode}{run}"));
            t.mkdir(&what, &dir);
            let mut cmd = t.command(&what, &[&bin, mode, &dir, rounds(mode)]);
            cmd.env("TORTURE_ALLOC_CHECK", alloc_check(executor, fs));
            let out = watched(cmd, LIMIT, &what);
            succeeded(&out, &what);
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                said.contains(&format!("ok {mode} ")),
                "{what}: the program did not get to its end: {said}"
            );
        }
    }
}

macro_rules! c_cases {
    ($($name:ident: $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            c_program($executor, $fs);
        }
    )*};
}

c_cases! {
    c_attached_passthrough: "attached", "passthrough";
    c_attached_plfs: "attached", "plfs";
    c_attached_pack: "attached", "pack";
    c_attached_versions: "attached", "versions";
    c_embedded_passthrough: "embedded", "passthrough";
    c_embedded_plfs: "embedded", "plfs";
    c_embedded_pack: "embedded", "pack";
    c_embedded_versions: "embedded", "versions";
}

/// The Python program of the suite: threads rewriting and checking files
/// while the main thread runs `cat` through `subprocess`, forks children
/// that write and `os._exit`, and maps a function over a
/// `multiprocessing.Pool` in the fork and the spawn contexts, each worker
/// writing and reading back a file of its own.
const PYTHON: &str = r#"
import multiprocessing as mp, os, subprocess, sys, threading

d = sys.argv[1]
stop = False
errors = []

def body(i, r):
    return (b"%d-%d " % (i, r)) * 700

def worker(i):
    r = 0
    p = os.path.join(d, "t%d" % i)
    while not stop:
        r += 1
        with open(p, "wb") as f:
            f.write(body(i, r))
        with open(p, "rb") as f:
            if f.read() != body(i, r):
                errors.append("thread %d round %d read other bytes" % (i, r))
                return

def pooled(n):
    p = os.path.join(d, "pool%d" % n)
    with open(p, "wb") as f:
        f.write(body(n, 99))
    with open(p, "rb") as f:
        return f.read() == body(n, 99)

if __name__ == "__main__":
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        for n in range(30):
            p = os.path.join(d, "s%d" % (n % 4))
            with open(p, "wb") as f:
                f.write(body(100, n))
            out = subprocess.run(["cat", p], capture_output=True, check=True).stdout
            if out != body(100, n):
                errors.append("cat read other bytes at %d" % n)
            if n % 5 == 0:
                pid = os.fork()
                if pid == 0:
                    q = os.path.join(d, "f%d" % n)
                    with open(q, "wb") as f:
                        f.write(body(200, n))
                    os._exit(0)
                _, st = os.waitpid(pid, 0)
                with open(os.path.join(d, "f%d" % n), "rb") as f:
                    if st != 0 or f.read() != body(200, n):
                        errors.append("forked child %d: status %d or other bytes" % (n, st))
        for ctx in ("fork", "spawn"):
            with mp.get_context(ctx).Pool(2) as pool:
                if not all(pool.map(pooled, range(6))):
                    errors.append("a %s pool worker read other bytes" % ctx)
    finally:
        stop = True
        for t in threads:
            t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    print("ok python")
"#;

/// The Python program, [`PYTHON_RUNS`] times.
fn python(executor: &str, fs: &'static str) {
    let test = format!("python {executor} {fs}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    let t = Target::new(executor, fs, &test);
    let script = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mapfs-torture-{}.py", std::process::id()));
    std::fs::write(&script, PYTHON).unwrap();
    let script = script.display().to_string();
    for run in 0..PYTHON_RUNS {
        let what = format!("{test} run {run}");
        let dir = t.dir(&format!("py{run}"));
        t.mkdir(&what, &dir);
        let out = watched(t.command(&what, &["python3", &script, &dir]), LIMIT, &what);
        succeeded(&out, &what);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ok python"),
            "{what}: the program did not get to its end"
        );
    }
}

/// Runs of the Python program per case (each starts some 40 processes).
const PYTHON_RUNS: usize = 3;

macro_rules! python_cases {
    ($($name:ident: $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            python($executor, $fs);
        }
    )*};
}

python_cases! {
    python_attached_passthrough: "attached", "passthrough";
    python_attached_plfs: "attached", "plfs";
    python_attached_pack: "attached", "pack";
    python_attached_versions: "attached", "versions";
    python_embedded_passthrough: "embedded", "passthrough";
    python_embedded_plfs: "embedded", "plfs";
    python_embedded_pack: "embedded", "pack";
    python_embedded_versions: "embedded", "versions";
}

/// The bash program of the suite, run in directory `$1`: redirections
/// (`>`, `>>`, `exec 3>`, here-documents), pipelines, a trap writing a
/// file, and subshells, each result compared with what was meant.
const BASH: &str = r#"
set -u
cd "$1" || exit 9
fail() { echo "bash torture: $*" >&2; exit 1; }
trap 'echo trapped >> trap.log' USR1
for i in 1 2 3 4 5; do
  echo "line $i" > r$i
  echo "more $i" >> r$i
  printf 'printf %s\n' "$i" >> r$i
  exec 3> e$i
  echo "fd3 $i" >&3
  exec 3>&-
  cat <<EOF > h$i
here $i
EOF
  ( echo "sub $i" > s$i )
  { echo "group $i"; } >> s$i
  seq 1 200 | sort -rn | head -n 3 > p$i
  kill -USR1 $$
  [ "$(cat r$i)" = "line $i
more $i
printf $i" ] || fail "r$i: $(cat r$i)"
  [ "$(cat e$i)" = "fd3 $i" ] || fail "e$i"
  [ "$(cat h$i)" = "here $i" ] || fail "h$i"
  [ "$(cat s$i)" = "sub $i
group $i" ] || fail "s$i"
  [ "$(cat p$i)" = "200
199
198" ] || fail "p$i"
done
[ "$(wc -l < trap.log)" -eq 5 ] || fail "trap.log: $(cat trap.log)"
echo "ok bash"
"#;

/// The bash program, [`RUNS`] times.
fn bash(executor: &str, fs: &'static str) {
    let test = format!("bash {executor} {fs}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    let t = Target::new(executor, fs, &test);
    for run in 0..RUNS {
        let what = format!("{test} run {run}");
        let dir = t.dir(&format!("sh{run}"));
        t.mkdir(&what, &dir);
        let out = watched(
            t.command(&what, &["bash", "-c", BASH, "bash", &dir]),
            LIMIT,
            &what,
        );
        succeeded(&out, &what);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ok bash"),
            "{what}: the program did not get to its end"
        );
    }
}

macro_rules! bash_cases {
    ($($name:ident: $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            bash($executor, $fs);
        }
    )*};
}

bash_cases! {
    bash_attached_passthrough: "attached", "passthrough";
    bash_attached_plfs: "attached", "plfs";
    bash_attached_pack: "attached", "pack";
    bash_attached_versions: "attached", "versions";
    bash_embedded_passthrough: "embedded", "passthrough";
    bash_embedded_plfs: "embedded", "plfs";
    bash_embedded_pack: "embedded", "pack";
    bash_embedded_versions: "embedded", "versions";
}

/// The watchdog itself: a program that never ends is reported as a hang,
/// with its stacks, not waited for.
#[test]
fn the_watchdog_reports_a_hang_with_stacks() {
    let r = std::panic::catch_unwind(|| {
        let mut c = Command::new("sleep");
        c.arg("30");
        watched(c, Duration::from_millis(300), "sleep")
    });
    let msg = match r {
        Ok(_) => panic!("a sleeping program was not reported"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(msg.contains("HANG"), "{msg}");
    assert!(msg.contains("== pid"), "no stacks in the report: {msg}");
}

/// `pwritev2`/`preadv2` flags on a file served by the data engine
/// (embedded plfs): `RWF_APPEND` writes at the end, an offset of -1 is
/// the description's, `RWF_DSYNC` is accepted, an unknown flag is refused
/// with `EOPNOTSUPP`, as the kernel answers them for a local file.
/// `alloc_signal.c`: a handler that allocates, every 50 us, while the
/// main thread allocates in a loop. Natively it deadlocks on the
/// allocator's lock; under either executor no handler runs on top of an
/// allocator call (the libraries delay it until the call returns).
fn handler_over_allocator(executor: &str) {
    let test = format!("alloc_signal.c {executor}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torture_support/alloc_signal.c");
    let bin = dir.join(format!(
        "mapfs-alloc-signal-{}-{executor}",
        std::process::id()
    ));
    assert!(Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let t = Target::new(executor, "passthrough", &test);
    for run in 0..5 {
        let what = format!("{test} run {run}");
        let out = watched(
            t.command(&what, &[&bin.display().to_string(), "1000000"]),
            LIMIT,
            &what,
        );
        succeeded(&out, &what);
        let said = String::from_utf8_lossy(&out.stdout);
        let handled: u64 = said
            .trim()
            .strip_prefix("ok ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: {said}"));
        assert!(handled > 0, "{what}: no signal was handled");
    }
}

#[test]
fn handlers_never_run_over_the_allocator_attached() {
    handler_over_allocator("attached");
}

#[test]
fn handlers_never_run_over_the_allocator_embedded() {
    handler_over_allocator("embedded");
}

#[test]
fn rwf_flags_on_an_engine_served_file() {
    const PROG: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    if (write(fd, "abc", 3) != 3) return 2;
    struct iovec v = {(void *)"XY", 2};
    if (pwritev2(fd, &v, 1, 0, RWF_APPEND) != 2) { perror("append"); return 3; }
    struct iovec d = {(void *)"z", 1};
    if (pwritev2(fd, &d, 1, -1, RWF_DSYNC) != 1) { perror("dsync"); return 4; }
    if (pwritev2(fd, &d, 1, 0, 0x40000000) != -1 || errno != EOPNOTSUPP) return 5;
    char b[16] = {0};
    struct iovec r = {b, sizeof b - 1};
    if (preadv2(fd, &r, 1, 0, 0) < 0) { perror("preadv2"); return 6; }
    printf("%s\n", b);
    return 0;
}
"#;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("mapfs-rwf-{}.c", std::process::id()));
    let bin = dir.join(format!("mapfs-rwf-{}", std::process::id()));
    std::fs::write(&src, PROG).unwrap();
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let area = embed_support::Area::new("backing");
    let out = watched(
        embedded(&area, "plfs", &[&bin.display().to_string(), &area.at("f")]),
        LIMIT,
        "rwf",
    );
    succeeded(&out, "rwf flags");
    // abc, XY appended at the end, then z at the description's offset
    // (3: the append left it where the write put it).
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "abczY");
}

/// GNU make `-j4` of a small C project stored in the file system, built
/// twice (the second run must find nothing to do, which needs make's
/// stats of the targets: Debian 12's make calls the legacy `__xstat`
/// family), and the program it built copied out and run.
fn make_project(executor: &str, fs: &'static str) {
    let test = format!("make -j4 {executor} {fs}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    common::need("make");
    let t = Target::new(executor, fs, &test);
    let dir = t.dir("proj");
    t.mkdir(&test, &dir);
    let out_dir = tempfile::tempdir().unwrap();
    let prog = out_dir.path().join("prog");
    let script = r#"
set -e
cd "$1"
for i in 1 2 3 4 5 6; do echo "int f$i(void){return $i;}" > f$i.c; done
printf 'int f1(void);int f2(void);int f3(void);int f4(void);int f5(void);int f6(void);\nint main(void){return f1()+f2()+f3()+f4()+f5()+f6()==21?0:1;}\n' > main.c
printf 'OBJS=main.o f1.o f2.o f3.o f4.o f5.o f6.o\nprog: $(OBJS)\n\tcc -o $@ $(OBJS)\n%%.o: %%.c\n\tcc -c -o $@ $<\n' > Makefile
make -s -j4 -C "$1"
make -C "$1" | grep -q "is up to date" || { echo "make rebuilt an up-to-date target" >&2; exit 1; }
cat prog > "$2"
"#;
    let p = prog.display().to_string();
    let out = watched(
        t.command(&test, &["bash", "-c", script, "bash", &dir, &p]),
        LIMIT,
        &test,
    );
    succeeded(&out, &test);
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let st = Command::new(&prog).status().unwrap();
    assert!(st.success(), "{test}: the program make built does not work");
}

macro_rules! make_cases {
    ($($name:ident: $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            make_project($executor, $fs);
        }
    )*};
}

make_cases! {
    make_attached_passthrough: "attached", "passthrough";
    make_attached_plfs: "attached", "plfs";
    make_embedded_passthrough: "embedded", "passthrough";
    make_embedded_plfs: "embedded", "plfs";
    make_embedded_pack: "embedded", "pack";
    make_embedded_versions: "embedded", "versions";
}

/// The clone ioctls on a file whose data runs in-process (a lent plfs
/// open under `mapfs run`, an embedded plfs file) answer `EOPNOTSUPP`, as
/// the mount answers them, not the placeholder's `EBADF`; and the file
/// still reads what was written.
#[test]
fn clone_ioctls_on_engine_served_files_answer_eopnotsupp() {
    const PROG: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/fs.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int a = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    int b = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (a < 0 || b < 0) { perror("open"); return 1; }
    char buf[4096];
    memset(buf, 'q', sizeof buf);
    if (pwrite(a, buf, sizeof buf, 0) != sizeof buf) return 2;
    if (ioctl(b, FICLONE, a) != -1 || errno != EOPNOTSUPP) { printf("FICLONE errno %d\n", errno); return 3; }
    struct file_clone_range r = {.src_fd = a, .src_offset = 0, .src_length = 4096, .dest_offset = 0};
    if (ioctl(b, FICLONERANGE, &r) != -1 || errno != EOPNOTSUPP) { printf("FICLONERANGE errno %d\n", errno); return 4; }
    char got[4096];
    if (pread(a, got, sizeof got, 0) != sizeof got || memcmp(got, buf, sizeof got)) return 5;
    printf("ok\n");
    return 0;
}
"#;
    let test = "clone ioctls";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("mapfs-clone-{}.c", std::process::id()));
    let bin = dir.join(format!("mapfs-clone-{}", std::process::id()));
    std::fs::write(&src, PROG).unwrap();
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let bin = bin.display().to_string();
    let area = embed_support::Area::new("backing");
    let out = watched(
        embedded(&area, "plfs", &[&bin, &area.at("a"), &area.at("b")]),
        LIMIT,
        test,
    );
    succeeded(&out, "clone ioctls, embedded plfs");
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount("plfs", test);
    let a = s.mountpoint().join("a").display().to_string();
    let b = s.mountpoint().join("b").display().to_string();
    let out = watched(attached(&s, test, &[&bin, &a, &b]), LIMIT, test);
    succeeded(&out, "clone ioctls, mapfs run on plfs");
}
