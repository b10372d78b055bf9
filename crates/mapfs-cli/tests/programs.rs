//! Real programs on a mount, compared with the same commands on a native dir:
//! tar, cp -a, dd, sqlite3, git, python3 mmap.
//!
//! The programs must be installed (the CI script installs them); a missing
//! program fails the test with its name rather than skipping.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use mapfs_testkit::mount::{run_captured, CmdOutput};

fn sh(dir: &Path, script: &str) -> CmdOutput {
    let out = run_captured(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env("LC_ALL", "C")
            .env("TZ", "UTC")
            .env("GIT_CONFIG_NOSYSTEM", "1"),
    )
    .expect("spawn sh");
    assert!(out.status.is_some(), "`{script}` hung in {}", dir.display());
    out
}

fn sh_ok(dir: &Path, script: &str) -> String {
    let out = sh(dir, script);
    assert!(
        out.success(),
        "`{script}` failed in {} ({:?}):\nstdout: {}\nstderr: {}",
        dir.display(),
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// Deterministic pseudo-random bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A tree with assorted sizes, modes, nesting, symlinks and a hard link.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::create_dir_all(root.join("many")).unwrap();
    let sizes = [
        0usize,
        1,
        511,
        4095,
        4096,
        4097,
        65536,
        100_000,
        1 << 20,
        (3 << 20) + 123,
    ];
    for (i, sz) in sizes.iter().enumerate() {
        fs::write(root.join(format!("a/file{i}")), bytes(i as u64, *sz)).unwrap();
    }
    for i in 0..200 {
        fs::write(
            root.join(format!("many/f{i:03}")),
            format!("small file {i}\n"),
        )
        .unwrap();
    }
    fs::write(root.join("a/b/c/deep.txt"), b"deep\n").unwrap();
    fs::write(root.join("a/exec.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("a/exec.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(root.join("a/file2"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("b/c/deep.txt", root.join("a/link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("dangling")).unwrap();
    fs::hard_link(root.join("a/file3"), root.join("a/hardlink")).unwrap();
    let name = "name with spaces & ünïcödé";
    fs::write(root.join(name), b"odd name\n").unwrap();
    sh_ok(
        root,
        "touch -h -d '2001-02-03 04:05:06' a/file1 a/link empty",
    );
}

/// Relative path, type, mode, size, link target, nlink, mtime of every entry.
fn manifest(dir: &Path) -> String {
    sh_ok(
        dir,
        "find . -mindepth 1 -printf '%P %y %m %s %l %n %TY-%Tm-%Td_%TH:%TM:%TS\\n' | sort",
    )
}

struct Pair {
    _native: tempfile::TempDir,
    native: std::path::PathBuf,
    session: MountSession,
}

impl Pair {
    fn new(mode: DataMode) -> Self {
        let native = native_dir();
        let n = native.path().join("work");
        fs::create_dir(&n).unwrap();
        let session = mount(mode, &[]);
        Pair {
            native: n,
            _native: native,
            session,
        }
    }
    fn mnt(&self) -> std::path::PathBuf {
        self.session.mountpoint().to_path_buf()
    }
    /// Runs `script` in both dirs and returns (native stdout, mount stdout).
    fn both(&self, script: &str) -> (String, String) {
        (sh_ok(&self.native, script), sh_ok(&self.mnt(), script))
    }
}

fn tar_roundtrip(mode: DataMode) {
    need("tar");
    need("diff");
    let p = Pair::new(mode);
    let src = native_dir();
    build_tree(&src.path().join("tree"));
    let tarball = src.path().join("tree.tar");
    sh_ok(
        src.path(),
        &format!("tar -cf {} -C tree .", tarball.display()),
    );
    let script = format!("mkdir x && tar -xpf {} -C x", tarball.display());
    p.both(&script);
    let out = sh(
        src.path(),
        &format!(
            "diff -r --no-dereference {} {}",
            p.native.join("x").display(),
            p.mnt().join("x").display()
        ),
    );
    assert!(
        out.success(),
        "tar --data {mode}: diff -r native vs mount:\n{}{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(
        manifest(&p.native.join("x")),
        manifest(&p.mnt().join("x")),
        "tar --data {mode}: metadata differs"
    );
    // Re-archiving from the mount gives the same member list and contents.
    let list_native = sh_ok(&p.native, "tar -cf - -C x . | tar -tvf - | sort");
    let list_mount = sh_ok(&p.mnt(), "tar -cf - -C x . | tar -tvf - | sort");
    assert_eq!(
        list_native, list_mount,
        "tar --data {mode}: re-archived listing differs"
    );
    // The backing dir holds the same tree.
    let out = sh(
        src.path(),
        &format!(
            "diff -r --no-dereference {} {}",
            p.native.join("x").display(),
            p.session.backing().join("x").display()
        ),
    );
    assert!(
        out.success(),
        "tar --data {mode}: backing differs:\n{}{}",
        out.stdout,
        out.stderr
    );
}

fn cp_a(mode: DataMode) {
    need("cp");
    let p = Pair::new(mode);
    let src = native_dir();
    build_tree(&src.path().join("tree"));
    let script = format!("cp -a {} copy", src.path().join("tree").display());
    p.both(&script);
    assert_eq!(
        manifest(&p.native.join("copy")),
        manifest(&p.mnt().join("copy")),
        "cp -a --data {mode}: metadata differs"
    );
    let out = sh(
        src.path(),
        &format!(
            "diff -r --no-dereference {} {}",
            p.native.join("copy").display(),
            p.mnt().join("copy").display()
        ),
    );
    assert!(
        out.success(),
        "cp -a --data {mode}: diff:\n{}{}",
        out.stdout,
        out.stderr
    );
    // And back out of the mount, and within the mount (reflink attempts, xattrs).
    sh_ok(&p.mnt(), "cp -a copy copy2");
    sh_ok(&p.native, "cp -a copy copy2");
    assert_eq!(
        manifest(&p.native.join("copy2")),
        manifest(&p.mnt().join("copy2")),
        "cp -a within mount --data {mode}"
    );
    let back = native_dir();
    sh_ok(
        back.path(),
        &format!("cp -a {} back", p.mnt().join("copy").display()),
    );
    assert_eq!(
        manifest(&p.native.join("copy")),
        manifest(&back.path().join("back")),
        "cp -a out of mount --data {mode}"
    );
}

fn dd(mode: DataMode) {
    need("dd");
    need("cmp");
    let p = Pair::new(mode);
    let src = native_dir();
    let input = src.path().join("in");
    fs::write(&input, bytes(42, (5 << 20) + 777)).unwrap();
    let i = input.display();
    let script = format!(
        "dd if={i} of=out4k bs=4k status=none && \
         dd if={i} of=out1m bs=1M status=none && \
         cp out4k patched && dd if={i} of=patched bs=4k seek=3 skip=7 count=5 conv=notrunc status=none && \
         dd if={i} of=direct bs=1M count=2 oflag=direct status=none 2>/dev/null || dd if={i} of=direct bs=1M count=2 status=none; \
         dd if={i} of=tail bs=4k seek=1000 count=1 status=none && \
         dd if=out1m of=readback bs=64k status=none && \
         cmp {i} out4k && cmp {i} out1m && cmp {i} readback && \
         md5sum out4k out1m patched direct tail readback && stat -c '%n %s' patched tail"
    );
    let (n, m) = p.both(&script);
    assert_eq!(n, m, "dd --data {mode}: results differ");
}

fn sqlite(mode: DataMode, journal: &str) {
    need("sqlite3");
    let p = Pair::new(mode);
    let sql = format!(
        "PRAGMA journal_mode={journal};\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB);\n\
         BEGIN;\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<10000)\n\
           INSERT INTO t SELECT x, printf('row-%08d', x), zeroblob(x % 300) FROM c;\n\
         COMMIT;\n\
         CREATE INDEX iv ON t(v);\n\
         UPDATE t SET v = v || '-u' WHERE id % 7 = 0;\n\
         DELETE FROM t WHERE id % 11 = 0;\n\
         PRAGMA integrity_check;\n\
         SELECT count(*), sum(length(v)), sum(length(b)) FROM t;\n"
    );
    let (n, m) = p.both(&format!("sqlite3 db.sqlite <<'EOF'\n{sql}EOF\nsqlite3 db.sqlite 'PRAGMA integrity_check; SELECT count(*) FROM t;'"));
    assert!(
        m.lines().any(|l| l == "ok"),
        "sqlite3 ({journal}) --data {mode}: integrity_check not ok:\n{m}"
    );
    assert!(
        !m.contains("corrupt") && !m.contains("malformed"),
        "sqlite3 ({journal}) --data {mode}:\n{m}"
    );
    assert_eq!(
        n, m,
        "sqlite3 ({journal}) --data {mode}: output differs from native"
    );
}

fn git(mode: DataMode) {
    need("git");
    let p = Pair::new(mode);
    let src = native_dir();
    build_tree(&src.path().join("tree"));
    let script = format!(
        "cp -a {}/. repo && cd repo && git init -q -b main . && \
         git -c user.name=mapfs -c user.email=mapfs@example.invalid add -A && \
         GIT_AUTHOR_DATE='2020-01-01T00:00:00Z' GIT_COMMITTER_DATE='2020-01-01T00:00:00Z' \
         git -c user.name=mapfs -c user.email=mapfs@example.invalid commit -q -m first && \
         echo change >> a/b/c/deep.txt && git rm -q --cached many/f000 && \
         GIT_AUTHOR_DATE='2020-01-02T00:00:00Z' GIT_COMMITTER_DATE='2020-01-02T00:00:00Z' \
         git -c user.name=mapfs -c user.email=mapfs@example.invalid commit -q -am second && \
         git gc -q && git fsck --strict 2>&1 && git log --format='%H %T %s' && git status --porcelain",
        src.path().join("tree").display()
    );
    let (n, m) = p.both(&script);
    assert_eq!(n, m, "git --data {mode}: output differs from native");
}

const MMAP_PY: &str = r#"
import mmap, os, hashlib
size = 3 * 1024 * 1024 + 1234
with open("m.bin", "wb") as f:
    f.truncate(size)
fd = os.open("m.bin", os.O_RDWR)
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
for i in range(0, size, 4099):
    m[i:i+7] = b"%07d" % (i % 9999999)
m[size-5:size] = b"TAIL!"
m.flush()
m.close()
with open("m.bin", "rb") as f:
    data = f.read()
assert len(data) == size, len(data)
os.pwrite(fd, b"PWRITE", 8192)
m2 = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
assert m2[8192:8198] == b"PWRITE", m2[8192:8198]
h = hashlib.sha256(m2[:]).hexdigest()
m2.close()
os.ftruncate(fd, size + 100000)
m3 = mmap.mmap(fd, 0)
m3[size:size+4] = b"GROW"
m3.close()
os.close(fd)
with open("m.bin", "rb") as f:
    d2 = f.read()
print(h, len(d2), hashlib.sha256(d2).hexdigest())
"#;

fn python_mmap(mode: DataMode) {
    need("python3");
    let p = Pair::new(mode);
    for dir in [p.native.clone(), p.mnt()] {
        fs::write(dir.join("mmap_test.py"), MMAP_PY).unwrap();
    }
    let (n, m) = p.both("python3 mmap_test.py");
    assert_eq!(n, m, "python3 mmap --data {mode}: results differ");
    let backing = fs::read(p.session.backing().join("m.bin")).unwrap();
    assert_eq!(
        backing,
        fs::read(p.native.join("m.bin")).unwrap(),
        "python3 mmap --data {mode}: backing file differs"
    );
}

macro_rules! per_mode {
    ($($name:ident => $body:expr),* $(,)?) => {
        $(
            mod $name {
                use super::*;
                #[test]
                fn daemon() {
                    if fuse_or_skip(concat!(stringify!($name), " daemon")) {
                        ($body)(DataMode::Daemon);
                    }
                }
                #[test]
                fn passthrough() {
                    if fuse_or_skip(concat!(stringify!($name), " passthrough")) {
                        ($body)(DataMode::Passthrough);
                    }
                }
            }
        )*
    };
}

per_mode! {
    tar => tar_roundtrip,
    cp_archive => cp_a,
    dd_copy => dd,
    sqlite_delete_journal => |m| sqlite(m, "DELETE"),
    sqlite_wal => |m| sqlite(m, "WAL"),
    git_repo => git,
    python_mmap_rw => python_mmap,
}
