//! `versions` in embedded mode (`mapfs run --embed versions:BACKING:PREFIX`,
//! served by `libmapfs_embed_full.so`): the overwrite sequence keeps the
//! versions a mount keeps, opens that write nothing keep none, sqlite3 in
//! WAL mode works (its shared-memory file is mapped through the backing
//! file), a child forked with an open for writing keeps its parent's
//! version, the fsx exerciser's byte model holds, and a mount and an
//! embedded job of one backing directory exclude each other.

mod common;
mod embed_support;
mod preload_support;

use std::path::PathBuf;
use std::process::Command;

use common::{
    fuse_or_skip, mapfs_bin, need, DataMode, MountSession, VERSIONS_EXPECTED, VERSIONS_SEQUENCE_PY,
};
use preload_support::{fsx_bin, ok};

/// Retention off, so every version must be there.
const KEEP_ALL: &str = "keep=none,keep-days=none";

/// The library that serves `versions`; panics with how to build it when
/// missing or older than its sources.
fn full_lib() -> PathBuf {
    preload_support::fresh_library(
        "libmapfs_embed_full.so",
        &[
            "mapfs-embed/src",
            "mapfs-embed-full/src",
            "mapfs-registry/src",
            "mapfs-fs/src/versions",
            "mapfs-fs/src/passthrough",
            "mapfs/src",
        ],
    )
}

/// [`embed_support::Area`] with the full library checked.
struct Area(embed_support::Area);

impl std::ops::Deref for Area {
    type Target = embed_support::Area;
    fn deref(&self) -> &embed_support::Area {
        &self.0
    }
}

impl Area {
    fn new() -> Area {
        full_lib();
        Area(embed_support::Area::new("backing"))
    }

    /// `prog` under `mapfs run --embed versions:BACKING:PREFIX -o opts`.
    fn run(&self, opts: &str, prog: &str) -> Command {
        self.run_embedded("versions", opts, prog)
    }

    /// `mapfs versions list BACKING PATH`: (name, kind) per version.
    fn listed(&self, path: &str) -> Vec<(String, String)> {
        let out = ok(Command::new(mapfs_bin())
            .args(["versions", "list"])
            .arg(&self.backing)
            .arg(path));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let cols: Vec<&str> = l.split('\t').collect();
                (cols[0].to_string(), cols[3].to_string())
            })
            .collect()
    }

    /// The bytes of every version of `path`, oldest first.
    fn contents(&self, path: &str) -> Vec<String> {
        self.listed(path)
            .iter()
            .map(|(n, _)| {
                let out = ok(Command::new(mapfs_bin())
                    .args(["versions", "show"])
                    .arg(&self.backing)
                    .arg(n));
                String::from_utf8(out.stdout).unwrap()
            })
            .collect()
    }
}

/// After the sequence, the job reads `.versions/`.
const READ_BACK_PY: &str = r#"
vd = os.path.join(d, ".versions")
for n in sorted(x for x in os.listdir(vd) if x.startswith("doc@")):
    sys.stdout.write(repr(open(os.path.join(vd, n)).read()) + "\n")
"#;

#[test]
fn embedded_overwrite_sequence_keeps_what_a_mount_keeps() {
    need("python3");
    // max-size=0 makes undo versions on a mount; embedded, every writer's
    // version is whole (other processes' instances cannot see its writes),
    // with the same bytes.
    for opts in [KEEP_ALL.to_string(), format!("{KEEP_ALL},max-size=0")] {
        let a = Area::new();
        let out = ok(a
            .run(&opts, "python3")
            .arg("-c")
            .arg(format!("{VERSIONS_SEQUENCE_PY}{READ_BACK_PY}"))
            .arg(&a.prefix)
            .args(VERSIONS_EXPECTED));
        let seen: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let want: Vec<String> = VERSIONS_EXPECTED.iter().map(|e| format!("{e:?}")).collect();
        // Python's repr quotes with ' where Rust's Debug uses ".
        let want: Vec<String> = want.iter().map(|w| w.replace('"', "'")).collect();
        assert_eq!(seen, want, "-o {opts}: .versions/ read in the job");
        assert_eq!(
            a.contents("/doc"),
            VERSIONS_EXPECTED,
            "-o {opts}: mapfs versions"
        );
        let kinds: Vec<String> = a.listed("/doc").into_iter().map(|(_, k)| k).collect();
        assert!(
            kinds.iter().all(|k| k == "whole"),
            "-o {opts}: embedded versions are whole: {kinds:?}"
        );
        // Nothing of the store is in the namespace, and nothing was left
        // by a replacement.
        let names: Vec<_> = std::fs::read_dir(&a.backing)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [".mapfs-versions"], "-o {opts}");
    }
}

/// Opens that write nothing keep no version (the version taken at the open
/// is dropped at the last close, as through a mount); sqlite3 in WAL mode
/// (its `-shm` file is mapped shared) changes its database and the version
/// before the change is a database with the old rows.
#[test]
fn embedded_unwritten_opens_keep_nothing_and_sqlite_wal_works() {
    need("python3");
    let a = Area::new();
    let f = a.at("f");
    ok(a.run(KEEP_ALL, "python3").arg("-c").arg(
        "import os,sys\nf=sys.argv[1]\nopen(f,'w').write('kept\\n')\n\
         for fl in (os.O_RDWR, os.O_WRONLY, os.O_RDWR | os.O_APPEND):\n    os.close(os.open(f, fl))\n\
         with open(f, 'r+') as h: h.read()\n",
    ).arg(&f));
    assert_eq!(a.listed("/f"), [], "opens that wrote nothing kept versions");
    need("sqlite3");
    let db = a.at("app.db");
    ok(a.run(KEEP_ALL, "sqlite3")
        .arg(&db)
        .arg("pragma journal_mode=wal; create table t(x); insert into t values (1);"));
    ok(a.run(KEEP_ALL, "sqlite3")
        .arg(&db)
        .arg("insert into t values (2);"));
    let out = ok(a
        .run(KEEP_ALL, "sqlite3")
        .arg(&db)
        .arg("select count(*) from t; pragma integrity_check;"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2\nok\n");
    let versions = a.listed("/app.db");
    assert!(!versions.is_empty(), "sqlite3's insert kept no version");
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("old.db");
    let shown = ok(Command::new(mapfs_bin())
        .args(["versions", "show"])
        .arg(&a.backing)
        .arg(&versions.last().unwrap().0));
    std::fs::write(&copy, shown.stdout).unwrap();
    let out = ok(Command::new("sqlite3")
        .arg(&copy)
        .arg("select count(*) from t;"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n",
        "the version before the insert"
    );
}

/// A child forked with an open for writing writes after its parent closed
/// its copy (and rewrites another file): the version taken at the open stays (the parent's close must
/// not drop it as unchanged, which a mount never does while another
/// process holds the open).
#[test]
fn embedded_forked_writer_keeps_its_parents_version() {
    need("python3");
    let a = Area::new();
    let out = ok(a
        .run(KEEP_ALL, "python3")
        .arg("-c")
        .arg(
            "import os,sys,time\nf=sys.argv[1]\nopen(f,'w').write('before\\n')\n\
         g=sys.argv[2]\nopen(g,'w').write('g1')\n\
         fd=os.open(f, os.O_WRONLY)\npid=os.fork()\n\
         if pid==0:\n    time.sleep(0.3)\n    os.pwrite(fd, b'AFTER!\\n', 0)\n    open(g,'w').write('g2')\n    os._exit(0)\n\
         os.close(fd)\nos.waitpid(pid, 0)\nsys.stdout.write(open(f).read())\n",
        )
        .arg(a.at("f"))
        .arg(a.at("g")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "AFTER!\n");
    // The child made a version of its own (through its own connection to
    // the store's index).
    assert_eq!(a.contents("/g"), ["g1"], "the child's version");
    assert_eq!(
        a.contents("/f"),
        ["before\n"],
        "the bytes before the child's write"
    );
}

/// Two processes (two instances) write one file: one holds it open while
/// the other rewrites it with `O_TRUNC`. Both write the one file, as
/// natively (an instance that gave the name a new inode would leave the
/// first writer writing into a version), and the version of the bytes
/// before is kept.
#[test]
fn embedded_writers_in_two_processes_share_one_file() {
    need("python3");
    let a = Area::new();
    let out = ok(a.run(KEEP_ALL, "python3").arg("-c").arg(
        "import os,subprocess,sys\nf=sys.argv[1]\nopen(f,'w').write('original\\n')\n\
         fd=os.open(f, os.O_WRONLY)\n\
         subprocess.run([sys.executable, '-c', 'import sys; open(sys.argv[1], \"w\").write(\"B\")', f], check=True)\n\
         os.pwrite(fd, b'A', 0)\nos.close(fd)\nsys.stdout.write(open(f).read())\n",
    ).arg(a.at("f")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "A", "the file");
    let kept = a.contents("/f");
    assert!(
        !kept.is_empty() && kept.iter().all(|v| v == "original\n"),
        "versions: {kept:?}"
    );
}

/// The exerciser's byte model on an embedded versions prefix, mapped
/// reads and writes and copy_file_range included, then every version it
/// made reads back at its size.
#[test]
fn embedded_fsx_byte_model_versions() {
    let a = Area::new();
    let fsx = fsx_bin();
    let out = ok(a
        .run("keep=5", fsx.to_str().unwrap())
        .arg("--dir")
        .arg(&a.prefix)
        .arg("--ops")
        .arg("3000")
        .arg("--seed")
        .arg("20261126")
        .arg("--keep"));
    let summary = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", summary.trim());
    assert!(
        summary.contains("mapwrite="),
        "no mapped write ran: {summary}"
    );
    let all = a.listed("/");
    assert!(!all.is_empty(), "the exerciser's reopens kept no version");
    for (name, _) in &all {
        ok(Command::new(mapfs_bin())
            .args(["versions", "show"])
            .arg(&a.backing)
            .arg(name));
    }
}

/// A mount's instance is the only one over its backing directory; an
/// embedded job's instances share it with each other only. Either one
/// refuses the other, saying why.
#[test]
fn a_mount_and_an_embedded_job_of_one_backing_exclude_each_other() {
    let test = "versions mount vs embedded job";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let a = Area::new();
    {
        let s = MountSession::builder(mapfs_bin())
            .fs("versions")
            .data(DataMode::Auto)
            .backing(&a.backing)
            .mount()
            .unwrap();
        let out = a.run(KEEP_ALL, "true").output().unwrap();
        assert!(
            !out.status.success(),
            "{test}: the job ran beside the mount"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("already served by another versions instance"),
            "{test}: {err}"
        );
        drop(s);
    }
    // A job holding its instances: a mount waits a moment, then refuses.
    let mut job = a
        .run(KEEP_ALL, "python3")
        .arg("-c")
        .arg("import os,sys,time\nopen(sys.argv[1],'w').write('x')\ntime.sleep(30)\n")
        .arg(a.at("held"))
        .spawn()
        .unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !a.backing.join("held").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = Command::new(mapfs_bin())
        .args(["mount", "versions"])
        .arg(&a.backing)
        .arg(mnt.path())
        .output()
        .unwrap();
    let _ = job.kill();
    let _ = job.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let _ = Command::new("umount").arg(mnt.path()).status();
        panic!("{test}: the mount was made beside a running job");
    }
    assert!(
        err.contains("already served by another versions instance"),
        "{test}: {err}"
    );
}
