//! Embedded mode (`mapfs run --embed FS:BACKING:PREFIX`): real programs on
//! a prefix that does not exist on the host, served by the file system in
//! each process, compared with the same commands on a native directory;
//! the fsx exerciser's byte model; permissions as nobody; the refusals.
//!
//! No FUSE mount is involved: these tests need neither /dev/fuse nor root
//! (except the nobody test, which needs root to switch user).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{mapfs_bin, native_dir};

/// The embedded library; panics with how to build it when missing or older
/// than its sources (`cargo test` does not build a cdylib nobody depends
/// on).
fn embed_lib() -> PathBuf {
    let dir = Path::new(mapfs_bin()).parent().unwrap();
    let p = dir.join("libmapfs_embed.so");
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first with `cargo build --workspace` (same profile)",
                p.display()
            )
        });
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for d in ["mapfs-embed/src", "mapfs-fs/src/passthrough", "mapfs/src"] {
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

/// A test area: a backing directory and a prefix (inside the temp dir, so
/// it is unique, but never created on the host), and a native directory
/// for comparisons.
struct Area {
    _tmp: tempfile::TempDir,
    backing: PathBuf,
    prefix: PathBuf,
    native: PathBuf,
}

impl Area {
    fn new() -> Area {
        embed_lib();
        let tmp = native_dir();
        let backing = tmp.path().join("backing");
        let native = tmp.path().join("native");
        for d in [&backing, &native] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Area {
            prefix: tmp.path().join("embedded"),
            _tmp: tmp,
            backing,
            native,
        }
    }

    fn spec(&self, fs: &str) -> String {
        format!("{fs}:{}:{}", self.backing.display(), self.prefix.display())
    }

    /// `prog` under `mapfs run --embed passthrough:BACKING:PREFIX`.
    fn run(&self, prog: &str) -> Command {
        let mut c = Command::new(mapfs_bin());
        c.arg("run")
            .arg("--embed")
            .arg(self.spec("passthrough"))
            .arg("--")
            .arg(prog)
            .env_remove("LD_PRELOAD")
            .env_remove("MAPFS_EMBED");
        c
    }
}

/// Runs `cmd`, panicking with its output unless it succeeds.
fn ok(cmd: &mut Command) -> Output {
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

/// Is `prog` installed? Tests needing it skip loudly when not.
fn have(prog: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: `{prog}` is not installed; this embedded check did not run");
    }
    found
}

/// Runs shell `script` with `$D` set to the prefix (embedded) and to the
/// native directory, and returns both outputs with the directory's name
/// replaced by `$D`.
fn both(a: &Area, script: &str) -> (String, String) {
    let emb = ok(a
        .run("sh")
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
    if !have("python3") {
        return;
    }
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
    if !have("sqlite3") || !have("git") {
        return;
    }
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
    let fsx = Path::new(mapfs_bin()).parent().unwrap().join("mapfs-fsx");
    assert!(
        fsx.exists(),
        "{} is missing: build it first with `cargo build --workspace`",
        fsx.display()
    );
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
    if !have("cc") {
        return;
    }
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
        (
            format!("pack:{}:/x", a.backing.display()),
            "not supported embedded yet",
        ),
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
