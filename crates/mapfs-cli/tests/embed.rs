//! Embedded mode (`mapfs run --embed FS:BACKING:PREFIX`): real programs on
//! a prefix that does not exist on the host, served by the file system in
//! each process, compared with the same commands on a native directory;
//! the fsx exerciser's byte model; permissions as nobody; the refusals.
//!
//! No FUSE mount is involved: these tests need neither /dev/fuse nor root
//! (except the nobody test, which needs root to switch user).

mod common;
mod embed_support;
mod preload_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{mapfs_bin, need};
use preload_support::{fsx_bin, ok};

/// The embedded library; panics with how to build it when missing or older
/// than its sources.
fn embed_lib() -> PathBuf {
    preload_support::fresh_library(
        "libmapfs_embed_builtins.so",
        &[
            "mapfs-embed/src",
            "mapfs-embed-builtins/src",
            "mapfs-registry/src",
            "mapfs-fs/src/passthrough",
            "mapfs-fs/src/plfs",
            "mapfs/src",
        ],
    )
}

/// [`embed_support::Area`] with the library of the built-ins checked.
struct Area(embed_support::Area);

impl std::ops::Deref for Area {
    type Target = embed_support::Area;
    fn deref(&self) -> &embed_support::Area {
        &self.0
    }
}

impl Area {
    fn new() -> Area {
        embed_lib();
        Area(embed_support::Area::new("backing"))
    }

    /// `prog` under `mapfs run --embed passthrough:BACKING:PREFIX`.
    fn run(&self, prog: &str) -> Command {
        self.run_fs("passthrough", prog)
    }

    /// `prog` under `mapfs run --embed FS:BACKING:PREFIX`.
    fn run_fs(&self, fs: &str, prog: &str) -> Command {
        self.run_embedded(fs, "", prog)
    }
}

/// Runs shell `script` with `$D` set to the prefix (embedded) and to the
/// native directory, and returns both outputs with the directory's name
/// replaced by `$D`.
fn both(a: &Area, script: &str) -> (String, String) {
    both_fs(a, "passthrough", script)
}

/// [`both`] with file system `fs` embedded.
fn both_fs(a: &Area, fs: &str, script: &str) -> (String, String) {
    let emb = ok(a
        .run_fs(fs, "sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.prefix)
        .env("LC_ALL", "C")
        .env("TZ", "UTC"));
    let nat = ok(Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.native)
        .env("LC_ALL", "C")
        .env("TZ", "UTC"));
    let clean = |o: &Output, d: &Path| {
        String::from_utf8_lossy(&o.stdout).replace(&*d.to_string_lossy(), "$D")
    };
    (clean(&emb, &a.prefix), clean(&nat, &a.native))
}

/// Asserts both outputs are the same, showing the first differing line.
fn same(emb: &str, nat: &str) {
    if emb == nat {
        return;
    }
    let (e, n): (Vec<&str>, Vec<&str>) = (emb.lines().collect(), nat.lines().collect());
    let i = (0..e.len().max(n.len()))
        .find(|&i| e.get(i) != n.get(i))
        .unwrap_or(0);
    panic!(
        "embedded and native outputs differ at line {}:\n embedded: {:?}\n native:   {:?}\n\nembedded output:\n{emb}",
        i + 1,
        e.get(i),
        n.get(i)
    );
}

/// Builds the same small tree (files, subdirectories, a symlink, a hard
/// link, modes, fixed times) under `$D/src`.
const MAKE_TREE: &str = r#"
set -e
mkdir -p "$D/src/sub/deeper" "$D/src/empty"
printf 'hello\n' > "$D/src/f"
head -c 100000 /dev/zero | tr '\0' 'x' > "$D/src/sub/big"
printf 'inner\n' > "$D/src/sub/deeper/g"
ln -s ../f "$D/src/sub/link"
ln "$D/src/f" "$D/src/hard"
chmod 0640 "$D/src/sub/big"
chmod 0750 "$D/src/sub/deeper"
touch -h -d '2020-01-02 03:04:05' "$D/src/f" "$D/src/sub/big" "$D/src/sub/deeper/g" \
  "$D/src/sub/link" "$D/src/sub/deeper" "$D/src/sub" "$D/src/empty" "$D/src"
"#;

#[test]
fn embedded_ls_cp_tar_find_du_and_cwd_match_native() {
    let a = Area::new();
    let script = format!(
        r#"{MAKE_TREE}
ls -lR --time-style=full-iso "$D/src"
cp -a "$D/src" "$D/copy"
ls -lR --time-style=full-iso "$D/copy"
tar cf - -C "$D" --sort=name src | sha256sum
mkdir "$D/untar"
tar cf - -C "$D" src | tar xf - -C "$D/untar"
ls -lR --time-style=full-iso "$D/untar"
find "$D" -printf '%P %y %s %m %n %l\n' | sort
du -a --apparent-size -b "$D/src" | sort -k2
cd "$D/src/sub" && ls && cat ../f && pwd && cat deeper/../link
sh -c 'pwd; ls deeper; cat ../f'
cd .. && ls -d "$PWD" && realpath sub/link
test -x /bin/sh -a -d "$D/src/empty" -a ! -e "$D/src/none" && echo tests-ok
ls "$D/.." | grep -x -e backing -e native
cat "$D/src/sub/../../src/sub/deeper/../../f"
printf 'a longer line\n' > "$D/src/t" && printf 'short\n' > "$D/src/t" && cat "$D/src/t"
rm "$D/src/t"
rm -r "$D/copy"
ls "$D"
"#
    );
    let (emb, nat) = both(&a, &script);
    same(&emb, &nat);
    assert!(
        emb.contains("tests-ok") && emb.contains("$D/src/sub\n"),
        "{emb}"
    );
    // The bytes are in the backing directory, and nothing appeared at the
    // prefix on the host.
    assert_eq!(
        std::fs::read(a.backing.join("src/sub/deeper/g")).unwrap(),
        b"inner\n"
    );
    assert!(!a.prefix.exists(), "the prefix was created on the host");
}

#[test]
fn embedded_python_walk_io_copytree_match_native() {
    need("python3");
    let a = Area::new();
    let py = r#"
import os, sys, shutil, mmap
d = os.environ["D"]
os.makedirs(d + "/p/a/b")
with open(d + "/p/a/x", "wb") as f:
    f.write(b"0123456789" * 1000)
with open(d + "/p/a/x", "r+b") as f:
    f.seek(5000); f.write(b"MIDDLE"); f.seek(0, 2); f.write(b"END")
    f.seek(4998); print(f.read(10))
with open(d + "/p/a/x", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    m[0:4] = b"MMAP"; print(m[:12], len(m)); m.close()
with open(d + "/p/a/b/y", "w") as f:
    f.write("y\n")
shutil.copytree(d + "/p", d + "/q", symlinks=True)
for root, dirs, files in sorted(os.walk(d)):
    print(os.path.relpath(root, d), sorted(dirs), sorted(files))
print(open(d + "/q/a/x", "rb").read()[:20], os.path.getsize(d + "/q/a/x"))
os.chdir(d + "/q/a")
print(os.getcwd().replace(d, "$D"), sorted(os.listdir(".")), os.path.exists("../a/b/y"))
print(os.path.realpath("b/../x").replace(d, "$D"))
os.rename("x", "z"); os.unlink("z"); print(sorted(os.listdir(".")))
st = os.stat(d + "/q/a/b/y"); print(st.st_size, oct(st.st_mode))
pfd = os.open(os.path.dirname(d), os.O_RDONLY)
print(os.stat(os.path.basename(d) + "/q/a/b/y", dir_fd=pfd).st_size)
"#;
    let (emb, nat) = both(&a, &format!("python3 -c '{}'", py.replace('\'', "'\\''")));
    same(&emb, &nat);
    assert!(emb.contains("MIDDLE") && emb.contains("MMAP"), "{emb}");
}

#[test]
fn embedded_sqlite_wal_and_git_match_native() {
    need("sqlite3");
    need("git");
    let a = Area::new();
    let script = r#"
set -e
mkdir "$D/db" && cd "$D/db"
sqlite3 t.db 'PRAGMA journal_mode=WAL; CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);
  WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<5000)
  INSERT INTO t(b) SELECT hex(randomblob(20)) || x FROM c;
  DELETE FROM t WHERE a % 3 = 0;'
sqlite3 "$D/db/t.db" 'PRAGMA integrity_check; SELECT count(*), sum(a) FROM t;'
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e
export GIT_AUTHOR_DATE='2020-01-02T03:04:05Z' GIT_COMMITTER_DATE='2020-01-02T03:04:05Z'
export HOME="$D" GIT_CONFIG_NOSYSTEM=1
git init -q -b main "$D/repo" && cd "$D/repo"
printf 'one\n' > a && mkdir d && printf 'two\n' > d/b
git add -A && git commit -q -m first
printf 'three\n' >> a && git commit -q -am second
git log --format='%H %s' && git status --short && git fsck --no-progress 2>&1 | head -3
"#;
    let (emb, nat) = both(&a, script);
    same(&emb, &nat);
    assert!(emb.contains("\nok\n3334|8336667\n"), "{emb}");
    assert!(emb.contains(" second\n"), "{emb}");
}

#[test]
fn embedded_fsx_byte_model_passthrough() {
    let a = Area::new();
    let fsx = fsx_bin();
    let out = ok(a
        .run(fsx.to_str().unwrap())
        .arg("--dir")
        .arg(&a.prefix)
        .arg("--ops")
        .arg("10000")
        .arg("--seed")
        .arg("20261123")
        .arg("--keep"));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    // The exerciser's files are in the backing directory.
    let kept = std::fs::read_dir(&a.backing).unwrap().count();
    assert!(kept > 0, "no file reached the backing directory");
}

#[test]
fn embedded_two_file_systems_at_once() {
    let a = Area::new();
    let b = Area::new();
    std::fs::write(a.backing.join("f"), b"from a\n").unwrap();
    let out = ok(Command::new(mapfs_bin())
        .arg("run")
        .arg("--embed")
        .arg(a.spec("passthrough"))
        .arg("--embed")
        .arg(b.spec("passthrough"))
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(r#"cp "$A/f" "$B/g" && mv "$A/f" "$B/h" && ls "$A" "$B" && cat "$B/h""#)
        .env("A", &a.prefix)
        .env("B", &b.prefix)
        .env_remove("LD_PRELOAD"));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("from a"), "{s}");
    assert_eq!(std::fs::read(b.backing.join("g")).unwrap(), b"from a\n");
    assert_eq!(std::fs::read(b.backing.join("h")).unwrap(), b"from a\n");
    assert!(!a.backing.join("f").exists(), "mv left the source");
}

#[test]
fn embedded_nobody_gets_eacces_on_a_root_0600_file() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: not root, cannot switch to nobody; the permission check did not run");
        return;
    }
    let a = Area::new();
    std::fs::write(a.backing.join("secret"), b"secret\n").unwrap();
    std::fs::set_permissions(
        a.backing.join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(a.backing.join("public"), b"public\n").unwrap();
    std::fs::set_permissions(
        a.backing.join("public"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::create_dir(a.backing.join("private")).unwrap();
    std::fs::set_permissions(
        a.backing.join("private"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let script = r#"cat "$D/public"; cat "$D/secret"; echo "cat=$?";
        (cd "$D/private"); echo "cd=$?"; ls "$D/private"; echo "ls=$?";
        echo x >> "$D/secret"; echo "append=$?"; touch "$D/new"; echo "create=$?";
        python3 -c 'import os,sys
try:
    os.open(sys.argv[1], os.O_RDONLY); print("open=ok")
except OSError as e: print("open=" + str(e.errno))' "$D/secret""#;
    let out = mapfs_testkit::user::command_as_nobody(mapfs_bin())
        .arg("run")
        .arg("--embed")
        .arg(a.spec("passthrough"))
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.prefix)
        .env("LC_ALL", "C")
        .env("HOME", "/")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        so.contains("public"),
        "nobody could not read a 0644 file: {so} {se}"
    );
    assert!(!so.contains("secret\n"), "nobody read the 0600 file: {so}");
    assert!(
        so.contains("cat=1") && !so.contains("append=0"),
        "{so} {se}"
    );
    assert!(!so.contains("cd=0") && !so.contains("ls=0"), "{so} {se}");
    assert!(
        so.contains("create=1"),
        "nobody created a file in root's 0755 dir: {so}"
    );
    assert!(so.contains(&format!("open={}", libc::EACCES)), "{so} {se}");
    assert!(se.contains("Permission denied"), "{se}");
    assert_eq!(
        std::fs::read(a.backing.join("secret")).unwrap(),
        b"secret\n"
    );
}

#[test]
fn embedded_refuses_a_static_binary_before_running_it() {
    need("cc");
    let a = Area::new();
    let src = a.native.join("s.c");
    let exe = a.native.join("static-prog");
    let marker = a.native.join("ran");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\nint main(void) {{ FILE *f = fopen(\"{}\", \"w\"); return f == 0; }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let cc = Command::new("cc")
        .arg("-static")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    if !cc.status.success() {
        eprintln!(
            "SKIPPED: cannot link a static program (libc6-dev's libc.a?): {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        return;
    }
    let out = a.run(exe.to_str().unwrap()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a static program ran embedded");
    assert!(err.contains("statically linked"), "{err}");
    assert!(!marker.exists(), "the static program was started");
    // The same program, dynamically linked, runs.
    let dynexe = a.native.join("dynamic-prog");
    ok(Command::new("cc").arg("-o").arg(&dynexe).arg(&src));
    ok(&mut a.run(dynexe.to_str().unwrap()));
    assert!(marker.exists());
}

#[test]
fn embedded_bad_specs_are_refused_clearly() {
    let a = Area::new();
    let missing = a.native.join("missing");
    // A directory of ordinary files is no pack store.
    let not_store = a.native.join("not-a-store");
    std::fs::create_dir(&not_store).unwrap();
    std::fs::write(not_store.join("file"), b"x").unwrap();
    let cases: Vec<(String, &str)> = vec![
        (format!("passthrough:{}:/x", missing.display()), "backing"),
        (
            format!("nosuchfs:{}:/x", a.backing.display()),
            "unknown file system",
        ),
        (
            format!("passthrough:{}:rel/x", a.backing.display()),
            "not absolute",
        ),
        (
            format!("passthrough:{}:/", a.backing.display()),
            "cannot be `/`",
        ),
        (
            format!("passthrough:{}", a.backing.display()),
            "FS:BACKING:PREFIX",
        ),
        (format!("pack:{}:/x", not_store.display()), "no pack store"),
    ];
    let marker = a.native.join("ran");
    for (spec, want) in cases {
        let out = Command::new(mapfs_bin())
            .arg("run")
            .arg("--embed")
            .arg(&spec)
            .arg("--")
            .arg("touch")
            .arg(&marker)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--embed {spec} was accepted");
        assert!(err.contains(want), "--embed {spec}: {err}");
        assert!(!marker.exists(), "--embed {spec}: the command ran");
    }
    // The option `mapfs run` adds once it checked a store itself is not
    // the user's to give: the checks cannot be skipped from the command line.
    let out = Command::new(mapfs_bin())
        .arg("run")
        .arg("--embed")
        .arg(a.spec("plfs"))
        .arg("-o")
        .arg(mapfs_cli::embed_spec::STORE_CHECKED)
        .arg("--")
        .arg("touch")
        .arg(&marker)
        .output()
        .unwrap();
    assert!(!out.status.success() && !marker.exists());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no embedded file system takes option"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn embedded_combines_with_an_attached_mount() {
    let test = "embedded with an attached mount";
    if !common::fuse_or_skip(test) {
        return;
    }
    let a = Area::new();
    let s = common::MountSession::builder(mapfs_bin())
        .data(common::DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    std::fs::write(s.backing().join("m"), b"mounted\n").unwrap();
    std::fs::write(a.backing.join("e"), b"embedded\n").unwrap();
    let report = a.native.join("report.json");
    let out = ok(Command::new(mapfs_bin())
        .arg("run")
        .arg("--mount")
        .arg(s.mountpoint())
        .arg("--embed")
        .arg(a.spec("passthrough"))
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(r#"cat "$M/m" "$P/e" && cp "$P/e" "$M/copied" && cp "$M/m" "$P/copied""#)
        .env("M", s.mountpoint())
        .env("P", &a.prefix)
        .env("MAPFS_PRELOAD_REPORT", &report)
        .env("MAPFS_PRELOAD_ADOPT_CALLS", "1")
        .env_remove("LD_PRELOAD"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "mounted\nembedded\n");
    assert_eq!(
        std::fs::read(s.backing().join("copied")).unwrap(),
        b"embedded\n"
    );
    assert_eq!(
        std::fs::read(a.backing.join("copied")).unwrap(),
        b"mounted\n"
    );
    // The attached shim still saw the mount's files behind the embedded
    // library: it adopted them (data calls native).
    let r = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        r.lines().any(|l| l.contains("\"adopted\":1")),
        "{test}: the shim adopted nothing: {r}"
    );
}

/// The fsx exerciser on an embedded plfs prefix: every open is served by
/// the data engine in-process on a placeholder descriptor, copy_file_range
/// included. A shared mmap cannot be served there (refused, see
/// docs/embedded.md).
#[test]
fn embedded_fsx_byte_model_plfs() {
    let a = Area::new();
    let fsx = fsx_bin();
    let out = ok(a
        .run_fs("plfs", fsx.to_str().unwrap())
        .arg("--dir")
        .arg(&a.prefix)
        .arg("--ops")
        .arg("10000")
        .arg("--seed")
        .arg("20261124")
        .arg("--no-mmap")
        .arg("--keep"));
    let summary = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", summary.trim());
    assert!(summary.contains("reopen="), "{summary}");
    // The exerciser's files are plfs containers (directories) in the
    // backing directory.
    let containers = std::fs::read_dir(&a.backing)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();
    assert!(containers > 0, "no plfs container in the backing directory");
}

/// One N-1 strided writer: `python3 -c WRITER FILE RANK NPROC NBLOCKS BS`
/// opens the shared file itself and writes its own blocks (block `i` of
/// rank `r` at `(i * NPROC + r) * BS`), checking the count of each write.
const N1_WRITER: &str = r#"
import os, sys
path, rank, nproc, nb, bs = sys.argv[1], *map(int, sys.argv[2:6])
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(nb):
    k = (rank * 7 + i * 13) % 251
    blk = bytes((k + j) % 251 for j in range(bs))
    assert os.pwrite(fd, blk, (i * nproc + rank) * bs) == bs
os.close(fd)
"#;

/// The job's parent: forks and execs NPROC writers, waits for them all.
const N1_PARENT: &str = r#"
import os, sys
writer, path, nproc, nb, bs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
pids = []
for r in range(nproc):
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", writer, path, str(r), str(nproc), str(nb), str(bs)])
    pids.append(pid)
for p in pids:
    _, st = os.waitpid(p, 0)
    assert os.waitstatus_to_exitcode(st) == 0, st
"#;

/// The file the N-1 job writes (the model).
fn n1_model(nproc: usize, nb: usize, bs: usize) -> Vec<u8> {
    let mut v = vec![0u8; nproc * nb * bs];
    for r in 0..nproc {
        for i in 0..nb {
            let k = (r * 7 + i * 13) % 251;
            let at = (i * nproc + r) * bs;
            for j in 0..bs {
                v[at + j] = ((k + j) % 251) as u8;
            }
        }
    }
    v
}

/// The N-1 test: a job of 4 processes (forked and execed by a
/// python3 parent) writes one plfs file N-1 strided; a fifth embedded
/// process reads it back byte-exact, and so does a `mapfs mount plfs` of
/// the same backing directory.
#[test]
fn embedded_plfs_n_to_1_strided_job_reads_back_embedded_and_mounted() {
    let a = Area::new();
    let (nproc, nb, bs) = (4, 64, 4096 + 17);
    let file = a.prefix.join("shared.out");
    ok(a.run_fs("plfs", "python3")
        .arg("-c")
        .arg(N1_PARENT)
        .arg(N1_WRITER)
        .arg(&file)
        .args([nproc, nb, bs].map(|n| n.to_string())));
    let model = n1_model(nproc, nb, bs);
    // The fifth process: an embedded reader copying the file out.
    let copy = a.native.join("read-back");
    ok(a.run_fs("plfs", "python3")
        .arg("-c")
        .arg("import sys, os; d = open(sys.argv[1], 'rb').read(); assert os.stat(sys.argv[1]).st_size == len(d); open(sys.argv[2], 'wb').write(d)")
        .arg(&file)
        .arg(&copy));
    let got = std::fs::read(&copy).unwrap();
    assert_eq!(got.len(), model.len(), "embedded read-back: size");
    assert!(got == model, "embedded read-back differs from the model");
    // The same backing directory through a mount.
    let test = "embedded plfs N-1 read through a mount";
    if !common::fuse_or_skip(test) {
        return;
    }
    let s = common::MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(common::DataMode::Daemon)
        .backing(&a.backing)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let mounted = std::fs::read(s.mountpoint().join("shared.out")).unwrap();
    assert!(
        mounted == model,
        "{test}: the mount's bytes differ from the model"
    );
}

/// cp, cat, the shell and python3 reading and writing plfs files under the
/// prefix (offsets, O_APPEND, shell redirections into programs, a forked
/// child writing through an inherited descriptor, `posix_spawn` and
/// `subprocess` children writing to a plfs stdout): the same output as on a
/// native directory.
#[test]
fn embedded_plfs_cp_cat_python_match_native() {
    let a = Area::new();
    let src = a.native.join("..").join("src.txt");
    let text: String = (1..40000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&src, text).unwrap();
    let script = r#"
set -e
cp "$S" "$D/f"
cat "$D/f" | md5sum
python3 - "$D/f" <<'PY'
import os, sys, hashlib
p = sys.argv[1]
with open(p, "r+b") as f:
    f.seek(1000); f.write(b"X" * 5000)
    f.seek(0, 2); f.write(b"tail\n")
with open(p, "ab") as f:
    f.write(b"appended\n")
d = open(p, "rb").read()
print(len(d), os.stat(p).st_size, hashlib.md5(d).hexdigest())
fd = os.open(p, os.O_RDWR)
print(os.lseek(fd, -9, os.SEEK_END), os.read(fd, 100))
os.ftruncate(fd, 12345)
print(os.fstat(fd).st_size, os.pread(fd, 10, 12340))
fd2 = os.dup(fd)
os.lseek(fd2, 100, os.SEEK_SET)
print(os.lseek(fd, 0, os.SEEK_CUR), os.read(fd, 7))
os.close(fd); os.close(fd2)
g = os.open(p + ".fork", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(g, b"parent1\n")
pid = os.fork()
if pid == 0:
    os.pwrite(g, b"child at 100\n", 100)
    os.close(g)
    os._exit(0)
os.waitpid(pid, 0)
os.pwrite(g, b"parent2\n", 8)
os.close(g)
print(open(p + ".fork", "rb").read())
import subprocess
g = os.open(p + ".spawn", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
pid = os.posix_spawn("/bin/cat", ["cat", p + ".fork"], dict(os.environ),
                     file_actions=[(os.POSIX_SPAWN_DUP2, g, 1)])
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
os.close(g)
with open(p + ".sub", "wb") as out:
    subprocess.run(["cat", p + ".spawn"], stdout=out, check=True)
print(open(p + ".sub", "rb").read() == open(p + ".fork", "rb").read())
PY
cat "$D/f" | md5sum
cp "$D/f" "$D/g"
cmp "$D/f" "$D/g" && echo same
wc -c < "$D/g"
exec 3< "$D/f"
head -c 5 <&3 && echo
exec 3<&-
printf 'from the shell\n' > "$D/h"
printf 'and more\n' >> "$D/h"
cat "$D/h" "$D/f.fork" | od -c | tail -3
ls -l "$D" | tail -n +2 | awk '{print $1, $5, $NF}'
"#;
    let (emb, nat) = both_fs(&a, "plfs", &format!("S='{}'\n{script}", src.display()));
    same(&emb, &nat);
    assert!(emb.contains("same\n12345\n"), "{emb}");
}

/// plfs's directories are listed as plfs shows them, never as its backing
/// directory is: a file is a file (`d_type`, `find -type f`, Python's
/// `scandir`), its container's logs are never listed, and listing by
/// descriptor (`fdopendir`, `openat` + `F_DUPFD` as `fts` does, `scandir`,
/// `seekdir`/`rewinddir`) works.
#[test]
fn embedded_plfs_directories_list_files_not_containers() {
    need("python3");
    let a = Area::new();
    let script = r#"
set -e
mkdir -p "$D/d/sub" "$D/e"
printf 'one
' > "$D/d/f"
printf 'two
' > "$D/d/sub/g"
printf 'three
' > "$D/top"
find "$D" -printf '%P %y %s
' | sort
find "$D" -type f | sort
du -a --apparent-size -b "$D" | sort -k2
ls -R "$D"
tar cf - -C "$D" --sort=name . | tar tvf - | awk '{print $1, $3, $6}'
cp -a "$D/d" "$D/copy" && find "$D/copy" | sort
rm -r "$D/copy" && ls "$D"
python3 - "$D" <<'PY'
import os, sys
d = sys.argv[1]
print(sorted((e.name, e.is_dir(), e.is_file()) for e in os.scandir(d)))
print(sorted((r[len(d):], sorted(ds), sorted(fs)) for r, ds, fs in os.walk(d)))
fd = os.open(d + "/d", os.O_RDONLY | os.O_DIRECTORY)
print(sorted(os.listdir(fd)), os.fstat(fd).st_ino == os.stat(d + "/d").st_ino)
print(os.stat("f", dir_fd=fd).st_size, sorted(os.listdir(d + "/d/sub")))
os.close(fd)
import ctypes, ctypes.util
libc = ctypes.CDLL(None)
libc.opendir.restype = ctypes.c_void_p
libc.readdir.restype = ctypes.c_void_p
libc.readdir.argtypes = [ctypes.c_void_p]
libc.telldir.restype = ctypes.c_long
libc.telldir.argtypes = [ctypes.c_void_p]
libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
libc.rewinddir.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]
def names(dp):
    out = []
    while True:
        ent = libc.readdir(dp)
        if not ent:
            return out
        out.append(ctypes.string_at(ent + 19).decode())
dp = libc.opendir((d + "/d").encode())
first = libc.readdir(dp)
pos = libc.telldir(dp)
rest = names(dp)
libc.seekdir(dp, pos)
again = names(dp)
libc.rewinddir(dp)
print(rest == again, sorted(names(dp)), libc.closedir(dp))
PY
"#;
    let (emb, nat) = both_fs(&a, "plfs", script);
    same(&emb, &nat);
    assert!(
        emb.contains("d/f f 4\n") || emb.contains("d/f f 4"),
        "{emb}"
    );
    assert!(!emb.contains(".plfs") && !emb.contains("index."), "{emb}");
}

/// stdio on plfs files: `fopen`/`fdopen` streams (glibc's buffering over
/// the data engine: seek, tell, read after write, append, `fileno`) and
/// programs whose standard streams are redirected to or from a plfs file
/// and do their I/O with stdio (`seq`, `sort`, `sed`, `ls`, `awk`).
#[test]
fn embedded_plfs_stdio_streams_match_native() {
    let a = Area::new();
    let script = r#"
set -e
seq 1 30000 > "$D/seq"
wc -l < "$D/seq"
sort -r < "$D/seq" | head -3
sort -n -r "$D/seq" > "$D/sorted"
head -2 "$D/sorted"
sed 's/1/one/g' "$D/seq" > "$D/sed"
tail -2 "$D/sed"
awk '{ s += $1 } END { print s }' < "$D/seq"
ls -d / /usr > "$D/ls"
cat "$D/ls"
echo appended >> "$D/sed"
tail -1 "$D/sed"
python3 - "$D/c" <<'PY'
import ctypes, os, sys
# The global namespace: the calls an application makes, hooks first.
libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = ctypes.c_void_p
libc.fdopen.restype = ctypes.c_void_p
for f in ("fwrite", "fread", "fseek", "ftell", "fflush", "fclose", "fileno", "fputs", "fgets"):
    getattr(libc, f).argtypes = None
libc.ftell.restype = ctypes.c_long
p = sys.argv[1].encode()
f = ctypes.c_void_p(libc.fopen(p, b"w+"))
assert f.value, os.strerror(ctypes.get_errno())
for i in range(2000):
    libc.fputs(b"record %d\n" % i, f)
print("tell", libc.ftell(f))
print("seek", libc.fseek(f, ctypes.c_long(7), 0))
buf = ctypes.create_string_buffer(32)
n = libc.fread(buf, 1, 20, f)
print("read", n, buf.raw[:n])
libc.fseek(f, ctypes.c_long(0), 2)
libc.fputs(b"end\n", f)
fd = libc.fileno(f)
libc.fflush(f)
print("fileno ok", fd > 2, os.fstat(fd).st_size)
print("close", libc.fclose(f))
g = ctypes.c_void_p(libc.fopen(p, b"a"))
libc.fputs(b"more\n", g)
libc.fclose(g)
fd = os.open(sys.argv[1], os.O_RDONLY)
h = ctypes.c_void_p(libc.fdopen(fd, b"r"))
line = ctypes.create_string_buffer(64)
libc.fgets(line, 64, h)
print("fdopen", line.value)
libc.fclose(h)
d = open(sys.argv[1], "rb").read()
print(len(d), d[-9:])
PY
"#;
    let (emb, nat) = both_fs(&a, "plfs", script);
    same(&emb, &nat);
    assert!(emb.contains("30000\n"), "{emb}");
    assert!(emb.contains("fileno ok True"), "{emb}");
}

/// `MAPFS_PRELOAD_REPORT` counts the calls the embedded file systems
/// served, per process, with the time spent in them:
/// exactly the application's calls on prefixes, none of the host's.
#[test]
fn embedded_report_counts_served_calls_per_process() {
    let a = Area::new();
    let report = a.native.join("report.json");
    let host = a.native.join("host");
    let script = r#"
import os, sys
pre, host = sys.argv[1], sys.argv[2]
os.mkdir(host)
for i in range(4):
    os.mkdir(os.path.join(pre, "d%d" % i))
    os.mkdir(os.path.join(host, "h%d" % i))
fd = os.open(os.path.join(pre, "d0", "f"), os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"x" * 100)
os.lseek(fd, 0, 0)
for i in range(5):
    os.read(fd, 10)
os.close(fd)
"#;
    let mut cmd = Command::new(mapfs_bin());
    cmd.arg("run")
        .arg("--embed")
        .arg(a.spec("plfs"))
        .arg("--")
        .arg("python3")
        .arg("-c")
        .arg(script)
        .arg(&a.prefix)
        .arg(&host)
        .env("MAPFS_PRELOAD_REPORT", &report)
        .env_remove("LD_PRELOAD")
        .env_remove("MAPFS_EMBED");
    ok(&mut cmd);
    let text = std::fs::read_to_string(&report).expect("the report was written");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let py: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["exe"].as_str().is_some_and(|e| e.contains("python3")))
        .filter(|l| l["calls"].as_object().is_some_and(|c| !c.is_empty()))
        .collect();
    assert_eq!(py.len(), 1, "one python3 line with calls:\n{text}");
    let calls = &py[0]["calls"];
    let count = |name: &str| calls[name]["count"].as_u64().unwrap_or(0);
    assert_eq!(count("mkdir"), 4, "host mkdirs are not counted:\n{text}");
    assert_eq!(count("read"), 5, "{text}");
    assert_eq!(count("write"), 1, "{text}");
    assert!(
        calls["read"]["ns"].as_u64().is_some_and(|n| n > 0),
        "time is reported: {text}"
    );
    assert_eq!(py[0]["library"], "embed");
    assert!(host.join("h3").is_dir() && a.backing.join("d3").is_dir());
}

/// Programs stored under a prefix run (`execve` loads the backing file of
/// a whole-file map): by absolute and relative path, a script through its
/// interpreter, from `subprocess` (whose child closes the library's
/// descriptors before it execs) and `posix_spawn`. A plfs file cannot be
/// run (EACCES, as on a `noexec` mount).
#[test]
fn embedded_programs_stored_under_a_prefix_run() {
    let a = Area::new();
    let script = r#"
set -e
cp /bin/echo "$D/myecho"
"$D/myecho" absolute
cd "$D" && ./myecho relative && cd /
printf '#!/bin/sh\necho "script $1"\n' > "$D/s.sh"
chmod +x "$D/s.sh"
"$D/s.sh" arg
python3 - "$D" <<'PY'
import os, subprocess, sys
d = sys.argv[1]
print(subprocess.run([d + "/myecho", "subprocess"], capture_output=True, check=True).stdout.decode().strip())
print(subprocess.run([d + "/s.sh", "from-python"], capture_output=True, check=True).stdout.decode().strip())
r, w = os.pipe()
pid = os.posix_spawn(d + "/myecho", ["myecho", "spawned"], dict(os.environ),
                     file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
os.close(w)
os.waitpid(pid, 0)
print(os.read(r, 100).decode().strip())
try:
    os.execv(d + "/missing", ["missing"])
except OSError as e:
    print("missing", e.errno)
PY
"#;
    let (emb, nat) = both(&a, script);
    same(&emb, &nat);
    assert!(
        emb.contains("relative\nscript arg\nsubprocess\nscript from-python\nspawned\n"),
        "{emb}"
    );
    // plfs: no single backing file to load.
    let out = a
        .run_fs("plfs", "sh")
        .arg("-c")
        .arg(r#"cp /bin/echo "$D/e" && chmod +x "$D/e" && "$D/e" hi; echo "rc=$?""#)
        .env("D", &a.prefix)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        so.contains("rc=126"),
        "{so} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A plfs open's offset is shared like a description's with the children
/// that inherit the descriptor (fork, exec, a shell's subshells and
/// commands), and what a child wrote survives its `_exit`: sequences of
/// commands writing to one redirection give what they give natively.
#[test]
fn embedded_plfs_children_share_the_offset() {
    let a = Area::new();
    let script = r#"
set -e
(seq 1 3; seq 4 6) > "$D/x"
cat "$D/x"
{ /bin/echo a; /bin/echo b; } > "$D/y"
(echo first; /bin/echo second; echo third) >> "$D/y"
cat "$D/y"
exec 3> "$D/w"
echo one >&3
/bin/echo two >&3
sh -c 'echo three; /bin/echo four' >&3
echo five >&3
exec 3>&-
cat "$D/w"
python3 - "$D/z" <<'PY'
import os, subprocess, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"parent1\n")
pid = os.fork()
if pid == 0:
    os.write(fd, b"child\n")
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"parent2\n")
subprocess.run(["/bin/echo", "spawned"], stdout=fd, close_fds=False, check=True)
os.write(fd, b"parent3\n")
print(os.lseek(fd, 0, os.SEEK_CUR))
os.close(fd)
print(open(sys.argv[1]).read(), end="")
PY
"#;
    let (emb, nat) = both_fs(&a, "plfs", script);
    same(&emb, &nat);
    assert!(
        emb.starts_with("1\n2\n3\n4\n5\n6\na\nb\nfirst\nsecond\nthird\n"),
        "{emb}"
    );
}

/// Record locks and `flock` on a plfs file are seen by the other processes
/// of the job (each has its own placeholder): they are kept on the
/// container's lock file. Same results as natively.
#[test]
fn embedded_plfs_locks_are_seen_by_other_processes() {
    let a = Area::new();
    let script = r#"
python3 - "$D/f" <<'PY'
import fcntl, os, subprocess, sys
p = sys.argv[1]
open(p, "wb").write(b"x" * 100)
CHILD = r"""
import fcntl, sys
f = open(sys.argv[1], "r+b")
def try_(what, call):
    try:
        call()
        print(what, "ok")
    except OSError as e:
        print(what, "busy", e.errno in (11, 13))
try_("lockf 0-10", lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0))
try_("lockf 20-30", lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 20))
try_("lockf shared 5", lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 5))
try_("flock", lambda: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB))
"""
f = open(p, "r+b")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
run = lambda: print(subprocess.run([sys.executable, "-c", CHILD, p], capture_output=True, text=True, check=True).stdout, end="")
run()
fcntl.lockf(f, fcntl.LOCK_UN, 10, 0)
fcntl.flock(f, fcntl.LOCK_UN)
print("released")
run()
f.seek(50)
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0, os.SEEK_CUR)
run()
PY
"#;
    let (emb, nat) = both_fs(&a, "plfs", script);
    same(&emb, &nat);
    assert!(
        emb.starts_with("lockf 0-10 busy True\nlockf 20-30 ok\nlockf shared 5 busy True\nflock busy True\nreleased\n"),
        "{emb}"
    );
}

/// What cannot be served on a plfs placeholder fails with a clear errno and
/// one warning naming the call: mmap, sendfile.
#[test]
fn embedded_plfs_refuses_mmap_and_sendfile_with_one_warning() {
    let a = Area::new();
    let script = r#"
import errno, mmap, os, sys
p = sys.argv[1]
open(p, "wb").write(b"x" * 8192)
fd = os.open(p, os.O_RDONLY)
for _ in range(2):
    try:
        mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
        print("mmap served")
    except OSError as e:
        print("mmap", errno.errorcode[e.errno])
out = os.open(os.devnull, os.O_WRONLY)
try:
    os.sendfile(out, fd, 0, 10)
    print("sendfile served")
except OSError as e:
    print("sendfile", errno.errorcode[e.errno])
print(len(os.read(fd, 100000)))
"#;
    let out = ok(a
        .run_fs("plfs", "python3")
        .arg("-c")
        .arg(script)
        .arg(a.prefix.join("f")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout, "mmap ENODEV\nmmap ENODEV\nsendfile EINVAL\n8192\n",
        "stderr: {stderr}"
    );
    assert_eq!(stderr.matches("mmap on a file").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("sendfile on a file").count(), 1, "{stderr}");
}
