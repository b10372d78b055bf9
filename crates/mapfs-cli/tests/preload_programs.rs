//! Real programs under `mapfs run` on a mount produce what they produce on
//! a native directory, and the shim's report shows their data path skipped
//! the daemon: cat, cp, dd, tar, python3 (open/read/write/mmap/seek),
//! sqlite3 in WAL mode, fio with psync.
//!
//! Needs the shim built next to `mapfs` (`cargo build --workspace`); a
//! missing program skips its check loudly.

mod common;
mod preload_support;

use std::path::Path;
use std::process::Command;

use common::{fuse_or_skip, mount, native_dir, DataMode};
use preload_support::*;

/// Runs `prog args` natively (cwd `native`) and under the shim (cwd the
/// mount); returns both outputs (stdout) after checking both succeeded.
fn both(
    s: &mapfs_testkit::MountSession,
    native: &Path,
    report: &Path,
    prog: &str,
    args: &[&str],
) -> (Vec<u8>, Vec<u8>) {
    let n = ok(Command::new(prog).args(args).current_dir(native)).stdout;
    let m = ok(attached(s, report, prog)
        .args(args)
        .current_dir(s.mountpoint()))
    .stdout;
    (n, m)
}

/// The file `name` has the same bytes natively and on the mount (read
/// without the shim, through the mount).
fn same_file(native: &Path, s: &mapfs_testkit::MountSession, name: &str) {
    let a = std::fs::read(native.join(name)).unwrap_or_else(|e| panic!("native {name}: {e}"));
    let b =
        std::fs::read(s.mountpoint().join(name)).unwrap_or_else(|e| panic!("mount {name}: {e}"));
    assert!(
        a == b,
        "{name} differs: native {} bytes, mount {} bytes",
        a.len(),
        b.len()
    );
}

fn setup_inputs(dir: &Path) {
    std::fs::write(dir.join("in.bin"), pattern(3 * 1024 * 1024 + 123, 77)).unwrap();
    std::fs::create_dir_all(dir.join("tree/sub/deeper")).unwrap();
    for (i, p) in ["tree/a", "tree/sub/b", "tree/sub/deeper/c", "tree/empty"]
        .iter()
        .enumerate()
    {
        std::fs::write(dir.join(p), pattern(i * 40_000, i as u64 + 3)).unwrap();
    }
}

#[test]
fn coreutils_match_native() {
    let test = "preload coreutils";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let native = native_dir();
    let n = native.path();
    setup_inputs(n);
    setup_inputs(s.mountpoint());
    let report = report_path(&s, "coreutils");

    let (a, b) = both(&s, n, &report, "cat", &["in.bin"]);
    assert!(
        a == b && a.len() == 3 * 1024 * 1024 + 123,
        "cat output differs"
    );

    both(&s, n, &report, "cp", &["in.bin", "copy.bin"]);
    same_file(n, &s, "copy.bin");

    for args in [
        ["if=in.bin", "of=dd1.bin", "bs=4096", "status=none"].as_slice(),
        &[
            "if=in.bin",
            "of=dd2.bin",
            "bs=1M",
            "skip=1",
            "seek=3",
            "count=1",
            "status=none",
        ],
        &[
            "if=in.bin",
            "of=dd1.bin",
            "bs=512",
            "seek=7",
            "count=9",
            "conv=notrunc,fsync",
            "status=none",
        ],
    ] {
        both(&s, n, &report, "dd", args);
    }
    same_file(n, &s, "dd1.bin");
    same_file(n, &s, "dd2.bin");

    // tar: archive the tree, extract it elsewhere, list it.
    both(
        &s,
        n,
        &report,
        "tar",
        &[
            "-cf",
            "t.tar",
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "tree",
        ],
    );
    same_file(n, &s, "t.tar");
    std::fs::create_dir(n.join("x")).unwrap();
    std::fs::create_dir(s.mountpoint().join("x")).unwrap();
    both(&s, n, &report, "tar", &["-xf", "t.tar", "-C", "x"]);
    for f in [
        "x/tree/a",
        "x/tree/sub/b",
        "x/tree/sub/deeper/c",
        "x/tree/empty",
    ] {
        same_file(n, &s, f);
    }
    let (a, b) = both(&s, n, &report, "tar", &["-tf", "t.tar"]);
    assert_eq!(a, b, "tar listing differs");

    // stdio programs: their streams are adopted when fopen'd (glibc reads
    // and writes them internally, out of the hooks' sight).
    let lines: String = (0..5000)
        .map(|i| format!("{}\n", (i * 7919) % 5000))
        .collect();
    std::fs::write(n.join("lines.txt"), &lines).unwrap();
    std::fs::write(s.mountpoint().join("lines.txt"), &lines).unwrap();
    both(
        &s,
        n,
        &report,
        "sort",
        &["-n", "lines.txt", "-o", "sorted.txt"],
    );
    same_file(n, &s, "sorted.txt");
    let (a, b) = both(&s, n, &report, "sed", &["-n", "5p;$p", "sorted.txt"]);
    assert_eq!(a, b, "sed output differs");
    assert_eq!(String::from_utf8_lossy(&b), "4\n4999\n");

    for (exe, min_adopted) in [
        ("cat", 1),
        ("cp", 2),
        ("dd", 4),
        ("tar", 6),
        ("sort", 1),
        ("sed", 1),
    ] {
        let t = totals(&report, exe);
        assert!(t.adopted >= min_adopted, "{test}: {exe} {t:?}");
        assert_eq!(t.fallbacks, 0, "{test}: {exe} {t:?}");
        assert_eq!(t.mount_calls, 0, "{test}: {exe} {t:?}");
    }
}

const PY_SCRIPT: &str = r#"
import os, mmap, hashlib, sys
out = []
# write, seek, read back, extend past EOF with a hole
fd = os.open('py.bin', os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, bytes(range(256)) * 64)
os.lseek(fd, 1000, os.SEEK_SET); os.write(fd, b'hello')
os.lseek(fd, 100000, os.SEEK_SET); os.write(fd, b'tail')
out.append(os.lseek(fd, 0, os.SEEK_CUR))
os.lseek(fd, 995, os.SEEK_SET); out.append(os.read(fd, 12).hex())
out.append(os.fstat(fd).st_size)
# mmap: modify through the mapping, read through the descriptor
m = mmap.mmap(fd, 0)
m[10:20] = b'0123456789'; m.flush(); m.close()
out.append(os.pread(fd, 30, 0).hex())
os.ftruncate(fd, 50000)
out.append(os.fstat(fd).st_size)
os.close(fd)
# buffered file objects (open/readline/seek/tell) and an append
with open('lines.txt', 'w') as f:
    for i in range(1000): f.write(f'line {i}\n')
with open('lines.txt', 'a') as f: f.write('last\n')
with open('lines.txt') as f:
    f.seek(50); out.append(f.readline()); out.append(f.tell())
    out.append(sum(1 for _ in f))
with open('py.bin', 'rb') as f: out.append(hashlib.sha256(f.read()).hexdigest())
with open('lines.txt', 'rb') as f: out.append(hashlib.sha256(f.read()).hexdigest())
print(repr(out))
"#;

#[test]
fn python_matches_native() {
    let test = "preload python3";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let native = native_dir();
    let report = report_path(&s, "python");
    let (a, b) = both(&s, native.path(), &report, "python3", &["-c", PY_SCRIPT]);
    assert_eq!(
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b),
        "{test}: output"
    );
    same_file(native.path(), &s, "py.bin");
    same_file(native.path(), &s, "lines.txt");
    let t = totals(&report, "python");
    assert!(t.adopted >= 3 && t.fallbacks == 0, "{test}: {t:?}");
}

const SQL: &str = "PRAGMA journal_mode=WAL;
CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n REAL);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<5000)
  INSERT INTO t(v, n) SELECT hex(randomblob(1)) || x, x * 1.5 FROM c;
CREATE INDEX iv ON t(v);
UPDATE t SET n = n * 2 WHERE id % 7 = 0;
DELETE FROM t WHERE id % 11 = 0;
SELECT count(*), sum(n), min(id), max(id) FROM t;
PRAGMA wal_checkpoint(TRUNCATE);
PRAGMA integrity_check;
";

#[test]
fn sqlite_wal_matches_native() {
    let test = "preload sqlite3 WAL";
    if !fuse_or_skip(test) || !need("sqlite3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let native = native_dir();
    let report = report_path(&s, "sqlite");
    let (a, b) = both(&s, native.path(), &report, "sqlite3", &["db.sqlite", SQL]);
    let out = String::from_utf8_lossy(&b);
    assert_eq!(String::from_utf8_lossy(&a), out, "{test}: output");
    assert!(
        out.trim_end().ends_with("ok"),
        "{test}: integrity_check: {out}"
    );
    assert!(out.starts_with("wal"), "{test}: journal mode: {out}");
    // A second session (reopen, shared memory index, read) agrees too.
    let q = "SELECT count(*), sum(n) FROM t; PRAGMA integrity_check;";
    let (a, b) = both(&s, native.path(), &report, "sqlite3", &["db.sqlite", q]);
    assert_eq!(a, b, "{test}: reopen");
    // And the mount (no shim) reads the same database.
    let plain = ok(Command::new("sqlite3")
        .arg(s.mountpoint().join("db.sqlite"))
        .arg(q))
    .stdout;
    assert_eq!(plain, b, "{test}: through the mount");
    let t = totals(&report, "sqlite3");
    assert!(t.adopted >= 2 && t.fallbacks == 0, "{test}: {t:?}");
}

#[test]
fn fio_psync_verifies() {
    let test = "preload fio psync";
    if !fuse_or_skip(test) || !need("fio") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let report = report_path(&s, "fio");
    // --thread: jobs run in the reporting process (a forked job would _exit
    // without writing a report).
    // fio checks every block it wrote (crc32c over each block, whose header
    // also holds a time stamp, so files of two runs differ): a wrong byte is
    // a verify error.
    let args = [
        "--name=pre",
        "--thread",
        "--filename=fio.dat",
        "--ioengine=psync",
        "--rw=randwrite",
        "--bs=4k",
        "--size=8m",
        "--verify=crc32c",
        "--do_verify=1",
        "--randrepeat=1",
        "--randseed=1234",
        "--output-format=json",
    ];
    let native = native_dir();
    let (n, m) = both(&s, native.path(), &report, "fio", &args);
    for (what, out) in [("native", &n), ("shim", &m)] {
        let v: serde_json::Value =
            serde_json::from_slice(out).unwrap_or_else(|e| panic!("{what} fio json: {e}"));
        let job = &v["jobs"][0];
        assert_eq!(job["error"].as_i64(), Some(0), "{test}: {what}: {job}");
        assert_eq!(
            job["write"]["io_bytes"].as_u64(),
            Some(8 << 20),
            "{test}: {what}"
        );
    }
    assert_eq!(
        std::fs::metadata(s.mountpoint().join("fio.dat"))
            .unwrap()
            .len(),
        8 << 20
    );
    let t = totals(&report, "fio");
    assert!(
        t.adopted >= 1 && t.fallbacks == 0 && t.mount_calls == 0,
        "{test}: {t:?}"
    );
    assert!(t.native_calls >= 2048, "{test}: {t:?}");
}

const STDIO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
int mapfs_preload_fd_status(int fd) __attribute__((weak));
static int st(int fd) { return mapfs_preload_fd_status ? mapfs_preload_fd_status(fd) : -1; }
int main(int argc, char **argv) {
    const char *dir = argv[1];
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/a.txt", dir);
    snprintf(b, sizeof b, "%s/b.txt", dir);
    /* fopen/fprintf/fclose, then read back with fgets/fseek/ftell */
    FILE *f = fopen(a, "w");
    for (int i = 0; i < 5000; i++) fprintf(f, "line %d\n", i);
    printf("w-status %d\n", st(fileno(f)));
    fclose(f);
    f = fopen(a, "r+");
    char line[64];
    fseek(f, 20, SEEK_SET);
    fgets(line, sizeof line, f);
    printf("after seek: %s", line);
    printf("tell %ld\n", ftell(f));
    fseek(f, 0, SEEK_END);
    fputs("tail\n", f);
    printf("size %ld\n", ftell(f));
    /* fdopen on a dup, freopen */
    FILE *g = fdopen(dup(fileno(f)), "r");
    rewind(g);
    fgets(line, sizeof line, g);
    printf("fdopen: %s", line);
    fclose(g);
    fclose(f);
    f = freopen(a, "r", stdin);
    fgets(line, sizeof line, stdin);
    printf("freopen: %s", line);
    /* fwrite and exit without fclose: exit() flushes the stream */
    FILE *h = fopen(b, "w");
    for (int i = 0; i < 20000; i++) fputs("0123456789", h);
    exit(0);
}
"#;

/// stdio (fopen/fprintf/fgets/fseek/fdopen/freopen, and a stream left for
/// exit() to flush) under the shim, against native.
#[test]
fn c_stdio_matches_native() {
    let test = "preload C stdio";
    if !fuse_or_skip(test) || !need("cc") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let scratch = s.scratch().unwrap();
    let src = scratch.join("stdio.c");
    let exe = scratch.join("stdio-test");
    std::fs::write(&src, STDIO_C).unwrap();
    ok(Command::new("cc").arg("-O1").arg("-o").arg(&exe).arg(&src));
    let native = native_dir();
    let report = report_path(&s, "stdio");
    let n = ok(Command::new(&exe).arg(native.path())).stdout;
    let m = ok(attached(&s, &report, &exe).arg(s.mountpoint())).stdout;
    let n = String::from_utf8_lossy(&n).replace("w-status -1", "w-status 3");
    assert_eq!(n, String::from_utf8_lossy(&m), "{test}: output");
    same_file(native.path(), &s, "a.txt");
    // Flushed by exit() after the shim's destructor would have run: the
    // mount must still show every byte.
    assert_eq!(
        std::fs::metadata(s.mountpoint().join("b.txt"))
            .unwrap()
            .len(),
        200_000,
        "{test}"
    );
    same_file(native.path(), &s, "b.txt");
    let t = totals(&report, "stdio-test");
    assert!(t.adopted >= 4 && t.fallbacks == 0, "{test}: {t:?}");
}
