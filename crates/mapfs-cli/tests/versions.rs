//! The `versions` file system on real mounts: overwrite sequences through
//! the mount (each data mode) and under `mapfs run`, real programs (sed -i,
//! cp, git, sqlite3), the fsx exerciser, and `mapfs versions` agreeing with
//! `.versions/` while mounted. Needs `cargo build --workspace` first for
//! the shim and `mapfs-fsx`.

mod common;
mod preload_support;

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::{
    fuse_or_skip, DataMode, MountSession, VERSIONS_EXPECTED as EXPECTED,
    VERSIONS_SEQUENCE_PY as SEQUENCE_PY,
};
use mapfs_testkit::fsx::{self, FsxConfig};
use preload_support::{attached, fsx_bin, need, ok, report_path, totals};

/// Retention off, so every version must be there.
const KEEP_ALL: &str = "keep=none,keep-days=none";

fn mount(mode: DataMode, opts: &str) -> MountSession {
    MountSession::builder(common::mapfs_bin())
        .fs("versions")
        .data(mode)
        .option(opts)
        .mount()
        .unwrap_or_else(|e| panic!("mounting versions --data {mode} -o {opts}: {e:#}"))
}

/// The entries of `.versions/DIR` for `name`, oldest first, with bytes.
fn listed(s: &MountSession, dir: &str, name: &str) -> Vec<(String, Vec<u8>)> {
    let d = s.mountpoint().join(".versions").join(dir);
    let mut v: Vec<(String, Vec<u8>)> = match fs::read_dir(&d) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.rsplit_once('@').is_some_and(|(f, _)| f == name))
            .map(|n| {
                let bytes = fs::read(d.join(&n))
                    .unwrap_or_else(|e| panic!("{}: {e}", d.join(&n).display()));
                (n, bytes)
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn contents(v: &[(String, Vec<u8>)]) -> Vec<String> {
    v.iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect()
}

fn mapfs(args: &[&str]) -> std::process::Output {
    Command::new(common::mapfs_bin())
        .args(args)
        .output()
        .expect("running mapfs")
}

/// `mapfs ARGS` run in `dir`.
fn mapfs_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(common::mapfs_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running mapfs")
}

fn cli_ok(args: &[&str]) -> String {
    let out = mapfs(args);
    assert!(
        out.status.success(),
        "mapfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The sequence, with plain system calls: each step keeps one version.
fn sequence_natively(dir: &Path) {
    let f = dir.join("doc");
    fs::write(&f, EXPECTED[0]).unwrap();
    fs::write(&f, EXPECTED[1]).unwrap(); // O_TRUNC rewrite
    let tmp = dir.join(".doc.swp");
    fs::write(&tmp, EXPECTED[2]).unwrap();
    fs::rename(&tmp, &f).unwrap(); // editor: temp + rename over
    let h = fs::OpenOptions::new().write(true).open(&f).unwrap();
    h.write_all_at(b"X", 2).unwrap(); // in place
    drop(h);
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(2)
        .unwrap(); // truncate
    let mut h = fs::OpenOptions::new().append(true).open(&f).unwrap();
    h.write_all(b"+appended").unwrap(); // append
    drop(h);
    fs::write(dir.join("other"), EXPECTED[6]).unwrap();
    fs::rename(dir.join("other"), &f).unwrap(); // rename over
    fs::remove_file(&f).unwrap(); // unlink
}

fn check_sequence(s: &MountSession, test: &str) {
    let got = listed(s, "", "doc");
    assert_eq!(contents(&got), EXPECTED, "{test}: versions in .versions/");
    // The CLI, reading the backing directory while mounted, agrees.
    let list = cli_ok(&["versions", "list", s.backing().to_str().unwrap(), "/doc"]);
    let names: Vec<&str> = list
        .lines()
        .map(|l| l.split('\t').next().unwrap().trim_start_matches('/'))
        .collect();
    let want: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want, "{test}: `mapfs versions list` vs .versions/");
    for (n, bytes) in &got {
        let shown = mapfs(&[
            "versions",
            "show",
            s.backing().to_str().unwrap(),
            &format!("/{n}"),
        ]);
        assert_eq!(&shown.stdout, bytes, "{test}: `mapfs versions show /{n}`");
    }
    // Versions are never in the namespace.
    let names: Vec<_> = fs::read_dir(s.mountpoint())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "{test}: the mount lists {names:?}");
    assert!(!s.mountpoint().join(".mapfs-versions").exists());
    let v = s.mountpoint().join(".versions").join(&got[0].0);
    let err = fs::OpenOptions::new().write(true).open(&v).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "{test}: writing a version"
    );
}

#[test]
fn overwrite_sequences_make_exactly_the_expected_versions() {
    for mode in [DataMode::Daemon, DataMode::Passthrough] {
        // Default: whole copies on this backing (no reflink); max-size=0:
        // undo versions of the bytes changed.
        for opts in [KEEP_ALL.to_string(), format!("{KEEP_ALL},max-size=0")] {
            let test = format!("versions sequence --data {mode} -o {opts}");
            if !fuse_or_skip(&test) {
                return;
            }
            let s = mount(mode, &opts);
            sequence_natively(s.mountpoint());
            check_sequence(&s, &test);
        }
    }
}

#[test]
fn overwrite_sequences_under_mapfs_run_make_the_same_versions() {
    for opts in [KEEP_ALL.to_string(), format!("{KEEP_ALL},max-size=0")] {
        let test = format!("versions sequence under mapfs run -o {opts}");
        if !fuse_or_skip(&test) || !need("python3") {
            return;
        }
        let s = mount(DataMode::Auto, &opts);
        let report = report_path(&s, "seq");
        ok(attached(&s, &report, "python3")
            .arg("-c")
            .arg(SEQUENCE_PY)
            .arg(s.mountpoint())
            .args(EXPECTED));
        let t = totals(&report, "python3");
        eprintln!("{test}: shim {t:?}");
        assert!(t.adopted > 0, "{test}: the shim adopted nothing: {t:?}");
        check_sequence(&s, &test);
    }
}

#[test]
fn real_programs_make_the_expected_versions() {
    let test = "versions with sed, cp, git, sqlite3";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Auto, KEEP_ALL);
    let m = s.mountpoint();
    let run = |cmd: &mut Command| {
        let out = cmd.current_dir(m).output().unwrap();
        assert!(
            out.status.success(),
            "{test}: {cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    // sed -i writes a temp file and renames it over.
    fs::write(m.join("conf"), "colour = red\n").unwrap();
    run(Command::new("sed").args(["-i", "s/red/blue/", "conf"]));
    assert_eq!(contents(&listed(&s, "", "conf")), ["colour = red\n"]);
    // cp over an existing file opens it O_TRUNC.
    fs::write(m.join("src"), "new bytes\n").unwrap();
    fs::write(m.join("dst"), "old bytes\n").unwrap();
    run(Command::new("cp").args(["src", "dst"]));
    assert_eq!(contents(&listed(&s, "", "dst")), ["old bytes\n"]);
    // git checkout of an older revision replaces the work-tree file.
    need("git");
    {
        fs::create_dir(m.join("repo")).unwrap();
        let git = |args: &[&str]| {
            run(Command::new("git")
                .args(["-C", "repo", "-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args))
        };
        git(&["init", "-q"]);
        fs::write(m.join("repo/file"), "revision 1\n").unwrap();
        git(&["add", "file"]);
        git(&["commit", "-qm", "one"]);
        fs::write(m.join("repo/file"), "revision 2\n").unwrap();
        git(&["commit", "-qam", "two"]);
        git(&["checkout", "-q", "HEAD~1", "--", "file"]);
        assert_eq!(
            fs::read_to_string(m.join("repo/file")).unwrap(),
            "revision 1\n"
        );
        let v = contents(&listed(&s, "repo", "file"));
        assert_eq!(
            v,
            ["revision 1\n", "revision 2\n"],
            "{test}: git's versions of file"
        );
    }
    // sqlite3 changes its database in place: the version before the insert
    // is a database with the old rows.
    need("sqlite3");
    {
        let db = "app.db";
        run(Command::new("sqlite3").args([db, "create table t(x); insert into t values (1);"]));
        run(Command::new("sqlite3").args([db, "insert into t values (2);"]));
        let versions = listed(&s, "", db);
        assert!(
            !versions.is_empty(),
            "{test}: sqlite3's write made no version"
        );
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("old.db");
        fs::write(&copy, &versions.last().unwrap().1).unwrap();
        let out = run(Command::new("sqlite3")
            .arg(&copy)
            .arg("select count(*) from t;"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "1",
            "{test}: the old database"
        );
        let out = run(Command::new("sqlite3").args([db, "select count(*) from t;"]));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    }
}

/// Every version listed in `.versions` reads back whole, at its size.
fn all_versions_readable(s: &MountSession) -> usize {
    let mut n = 0;
    let mut stack = vec![s.mountpoint().join(".versions")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = e.metadata().unwrap();
            if md.is_dir() {
                stack.push(e.path());
            } else {
                assert_eq!(
                    fs::read(e.path()).unwrap().len() as u64,
                    md.len(),
                    "{}",
                    e.path().display()
                );
                n += 1;
            }
        }
    }
    n
}

#[test]
fn fsx_through_the_mount() {
    for mode in [DataMode::Daemon, DataMode::Passthrough] {
        for opts in ["keep=5", "keep=5,max-size=0"] {
            let test = format!("fsx on versions --data {mode} -o {opts}");
            if !fuse_or_skip(&test) {
                return;
            }
            let s = mount(mode, opts);
            let cfg = FsxConfig::new(s.mountpoint(), 20_261_123, 3_000);
            let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
            eprintln!("{test}: {report}");
            let n = all_versions_readable(&s);
            assert!(n > 0, "{test}: fsx made no versions");
        }
    }
}

#[test]
fn fsx_under_mapfs_run() {
    for opts in ["keep=5", "keep=5,max-size=0"] {
        let test = format!("fsx under mapfs run on versions -o {opts}");
        if !fuse_or_skip(&test) {
            return;
        }
        let s = mount(DataMode::Auto, opts);
        let report = report_path(&s, "fsx");
        let out = ok(attached(&s, &report, fsx_bin())
            .arg("--dir")
            .arg(s.mountpoint())
            .arg("--ops")
            .arg("3000")
            .arg("--seed")
            .arg("20261124"));
        eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
        let t = totals(&report, "mapfs-fsx");
        eprintln!("{test}: shim {t:?}");
        assert!(t.adopted > 0, "{test}: the shim adopted nothing: {t:?}");
        assert!(all_versions_readable(&s) > 0, "{test}: no versions");
    }
}

#[test]
fn cli_restores_prunes_and_reports_while_mounted() {
    let test = "mapfs versions restore/prune/stats";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Auto, KEEP_ALL);
    let b = s.backing().to_str().unwrap().to_string();
    let m = s.mountpoint();
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/f"), "one\n").unwrap();
    fs::write(m.join("d/f"), "two\n").unwrap();
    fs::write(m.join("d/f"), "three\n").unwrap();
    let v = listed(&s, "d", "f");
    assert_eq!(contents(&v), ["one\n", "two\n"]);
    // Restore is itself versioned: "three" becomes a version.
    let out = cli_ok(&["versions", "restore", &b, &format!("/d/{}", v[0].0)]);
    assert!(out.contains("restored"), "{out}");
    assert_eq!(fs::read_to_string(m.join("d/f")).unwrap(), "one\n");
    assert_eq!(
        contents(&listed(&s, "d", "f")),
        ["one\n", "two\n", "three\n"]
    );
    // diff against the current file: diff(1)'s exit status, 1 when they
    // differ, 0 when not, 2 on trouble.
    let out = mapfs(&["versions", "diff", &b, &format!("/d/{}", v[1].0)]);
    let diff = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(diff.contains("-two") && diff.contains("+one"), "{diff}");
    let out = mapfs(&["versions", "diff", &b, &format!("/d/{}", v[0].0)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let out = mapfs(&["versions", "diff", &b, "/d/f@2000-01-01T00:00:00.000000Z"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no version"),
        "{out:?}"
    );
    // A removed file (and its directory) comes back.
    fs::remove_file(m.join("d/f")).unwrap();
    fs::remove_dir(m.join("d")).unwrap();
    cli_ok(&["versions", "restore", &b, "/d/f"]);
    assert_eq!(fs::read_to_string(m.join("d/f")).unwrap(), "one\n");
    // Renames carry history.
    fs::rename(m.join("d"), m.join("e")).unwrap();
    assert!(listed(&s, "d", "f").is_empty());
    assert_eq!(listed(&s, "e", "f").len(), 4);
    // Prune by count: the CLI and .versions agree.
    let out = cli_ok(&["versions", "prune", &b, "--keep", "2"]);
    assert_eq!(out.trim(), "dropped 2 versions");
    let left = listed(&s, "e", "f");
    assert_eq!(contents(&left), ["three\n", "one\n"]);
    let listed_cli = cli_ok(&["versions", "list", &b]);
    assert_eq!(listed_cli.lines().count(), 2, "{listed_cli}");
    let stats = cli_ok(&["versions", "stats", &b]);
    assert!(stats.contains("versions:        2"), "{stats}");
    // Bad input: a clear error, nothing changed.
    let out = mapfs(&["versions", "show", &b, "/e/f@2000-01-01T00:00:00.000000Z"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no version"),
        "{out:?}"
    );
    let out = mapfs(&["versions", "list", "/nonexistent-backing"]);
    assert!(!out.status.success());
    assert_eq!(listed(&s, "e", "f").len(), 2);
}

/// Every `mapfs versions` command takes the mountpoint as well as the
/// backing directory; a mountpoint of another file system, or a directory
/// that is neither, is an error that says what was expected.
#[test]
fn cli_takes_the_mountpoint_or_the_backing_directory() {
    let test = "mapfs versions MOUNTPOINT";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Auto, KEEP_ALL);
    let (m, b) = (s.mountpoint(), s.backing());
    fs::write(m.join("f"), "one\n").unwrap();
    fs::write(m.join("f"), "two\n").unwrap();
    let by_mount = cli_ok(&["versions", "list", m.to_str().unwrap()]);
    let by_backing = cli_ok(&["versions", "list", b.to_str().unwrap()]);
    assert_eq!(by_mount, by_backing);
    assert_eq!(by_mount.lines().count(), 1, "{by_mount}");
    let shown = cli_ok(&["versions", "show", m.to_str().unwrap(), "/f"]);
    assert_eq!(shown, "one\n");
    let stats = cli_ok(&["versions", "stats", m.to_str().unwrap()]);
    assert!(stats.contains("versions:        1"), "{stats}");
    // A relative mountpoint too.
    let out = mapfs_in(
        m.parent().unwrap(),
        &["versions", "list", m.file_name().unwrap().to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), by_mount);

    let other = MountSession::builder(common::mapfs_bin())
        .fs("passthrough")
        .mount()
        .unwrap();
    let out = mapfs(&["versions", "list", other.mountpoint().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a mount of `passthrough`, not `versions`")
            && err
                .contains("expected the mountpoint of a `versions` mount or its backing directory"),
        "{err}"
    );
    let plain = tempfile::tempdir().unwrap();
    let out = mapfs(&["versions", "list", plain.path().to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected the mountpoint"), "{err}");
}

/// `mapfs versions prune` runs in a process of its own: it must spare the
/// versions a mount is still making (a writer has the file open), as the
/// mount's own retention does, or the writer's undo history goes.
#[test]
fn cli_prune_spares_versions_being_made_by_the_mount() {
    let test = "mapfs versions prune while a writer is open";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    for opts in [KEEP_ALL.to_string(), format!("{KEEP_ALL},max-size=0")] {
        let s = mount(DataMode::Auto, &opts);
        let b = s.backing().to_str().unwrap().to_string();
        let f = s.mountpoint().join("f");
        fs::write(&f, "older\n").unwrap();
        fs::write(&f, "original\n").unwrap();
        assert_eq!(
            contents(&listed(&s, "", "f")),
            ["older\n"],
            "{test} -o {opts}"
        );
        // A writer changes the file in place and stays open.
        let mut w = Command::new("python3")
            .arg("-c")
            .arg(
                "import os, sys\n\
                 fd = os.open(sys.argv[1], os.O_WRONLY)\n\
                 os.pwrite(fd, b'CHANGED', 0)\n\
                 print('written', flush=True)\n\
                 sys.stdin.readline()\n\
                 os.close(fd)\n",
            )
            .arg(&f)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(w.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "written\n", "{test}: the writer did not write");
        // Everything is older than now: only the version being made stays.
        let out = cli_ok(&["versions", "prune", &b, "--keep-days", "0"]);
        assert_eq!(out.trim(), "dropped 1 versions", "{test} -o {opts}");
        std::io::Write::write_all(w.stdin.as_mut().unwrap(), b"\n").unwrap();
        assert!(w.wait().unwrap().success());
        assert_eq!(fs::read_to_string(&f).unwrap(), "CHANGEDl\n");
        assert_eq!(
            contents(&listed(&s, "", "f")),
            ["original\n"],
            "{test} -o {opts}: the version the writer's open made"
        );
    }
}

#[test]
fn bad_options_are_refused_before_mounting() {
    let test = "versions bad options";
    if !fuse_or_skip(test) {
        return;
    }
    for bad in ["max-size=lots", "keep=0", "keep-days=-1", "keep-bytes=1X"] {
        let r = MountSession::builder(common::mapfs_bin())
            .fs("versions")
            .option(bad)
            .mount();
        let err = format!(
            "{:#}",
            r.err()
                .unwrap_or_else(|| panic!("{test}: -o {bad} mounted"))
        );
        let key = bad.split('=').next().unwrap();
        assert!(err.contains(key), "{test}: -o {bad}: {err}");
    }
}

/// A file held open for reading (kernel passthrough) and then opened for
/// writing, on a backing without reflink and with undo versions: the
/// writer must work (executors give every open of such an inode the same
/// backing file), and the versions still hold the old bytes.
#[test]
fn writers_next_to_passthrough_readers_keep_exact_versions() {
    let test = "versions writer beside a passthrough reader";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Auto, &format!("{KEEP_ALL},max-size=0"));
    let f = s.mountpoint().join("big");
    let orig: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(&f, &orig).unwrap();
    let reader = fs::File::open(&f).unwrap();
    let mut b = [0u8; 4];
    reader.read_exact_at(&mut b, 0).unwrap();
    let w = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(b"hello", 100).unwrap();
    drop(w);
    drop(reader);
    // An undo writer, then a reader, then a second writer joining it.
    let w1 = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w1.write_all_at(b"AAAA", 200).unwrap();
    let reader = fs::File::open(&f).unwrap();
    let w2 = fs::OpenOptions::new().write(true).open(&f).unwrap();
    w2.write_all_at(b"BBBB", 300).unwrap();
    drop(w2);
    drop(w1);
    drop(reader);
    let mut now = orig.clone();
    now[100..105].copy_from_slice(b"hello");
    let v = listed(&s, "", "big");
    // The second writer found the first one's bytes in the file (undo
    // writers write in place): what it found is kept too.
    assert_eq!(
        v.len(),
        3,
        "{test}: one version per writer that found a change"
    );
    assert!(v[0].1 == orig, "{test}: first version is the original");
    assert!(
        v[1].1 == now,
        "{test}: second version has only the first write"
    );
    now[200..204].copy_from_slice(b"AAAA");
    assert!(
        v[2].1 == now,
        "{test}: third version has what the second writer found"
    );
    now[300..304].copy_from_slice(b"BBBB");
    assert!(fs::read(&f).unwrap() == now, "{test}: current bytes");
}

/// `keep-bytes`: once the versions go over it, the oldest are dropped until
/// the store holds nine tenths of it (not just under it: a store at its
/// limit would otherwise scan every version at every new one), and the
/// newest versions are the ones kept, byte-exact.
#[test]
fn the_byte_limit_prunes_the_oldest_down_to_nine_tenths() {
    let test = "versions keep-bytes";
    if !fuse_or_skip(test) {
        return;
    }
    // Whole copies of 8 KiB (block-sized, so a version costs its size):
    // ten fit in 80 KiB, nine in nine tenths of it.
    let s = mount(DataMode::Auto, "keep=none,keep-days=none,keep-bytes=80K");
    let m = s.mountpoint();
    fs::create_dir(m.join("d")).unwrap();
    let body = |i: u8| vec![b'a' + i; 8192];
    // The first write makes the file; each later one keeps the previous.
    for i in 0..=10 {
        fs::write(m.join("d/f"), body(i)).unwrap();
    }
    // Ten versions (80 KiB: at the limit, not over it) stay.
    let v = listed(&s, "d", "f");
    assert_eq!(v.len(), 10, "{test}: versions of eleven writes");
    // The eleventh version goes over: down to nine, the newest.
    fs::write(m.join("d/f"), body(11)).unwrap();
    let v = listed(&s, "d", "f");
    let want: Vec<Vec<u8>> = (2..=10).map(body).collect();
    assert_eq!(
        v.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(),
        want,
        "{test}: versions kept after going over the limit: {:?}",
        v.iter()
            .map(|(n, b)| (n, b.len(), b[0]))
            .collect::<Vec<_>>()
    );
}

/// `.versions` entries show as soon as they exist, even where the mount
/// was just asked for them and they did not exist yet (a mount remembers a
/// missing name for its entry lifetime, 1 s by default, unless the file
/// system says its names appear by themselves).
#[test]
fn a_new_version_shows_at_once_where_none_was_found_before() {
    let test = "versions appear at once";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Auto, KEEP_ALL);
    let m = s.mountpoint();
    fs::create_dir(m.join("d")).unwrap();
    fs::write(m.join("d/f"), "one\n").unwrap();
    assert!(
        listed(&s, "d", "f").is_empty(),
        "{test}: a version of a new file"
    );
    assert!(
        !m.join(".versions/d").exists(),
        "{test}: .versions/d before any version"
    );
    fs::write(m.join("d/f"), "two\n").unwrap();
    assert_eq!(contents(&listed(&s, "d", "f")), ["one\n"], "{test}");
}

/// A large file's undo writer under `mapfs run` writes in place in the
/// program: every write to a range not saved yet has the daemon save it
/// (`Remap`) and the open stays lent (no fallback to the mount), the bytes
/// are exact, the version holds the original, and a small change costs a
/// granule, not the file.
#[test]
fn undo_writers_under_mapfs_run_write_in_place_in_the_program() {
    let test = "versions undo writer under mapfs run";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Auto, &format!("{KEEP_ALL},max-size=0"));
    let f = s.mountpoint().join("big");
    let orig: Vec<u8> = (0..8_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
    fs::write(&f, &orig).unwrap();
    let store = s.backing().join(".mapfs-versions/objects");
    let kept_before = dir_bytes(&store);
    // 300 writes of 1-9000 bytes at offsets spread over the whole file
    // (many granules, some writes straddling two), then a read-back of
    // every written range through the same open, checked by the program.
    let py = r#"
import os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR)
size = os.fstat(fd).st_size
x, done = 20261126, []
for i in range(300):
    x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
    off = (x >> 11) % (size - 9000)
    n = 1 + (x >> 40) % 9000
    b = bytes([(i * 7 + 1) % 256]) * n
    assert os.pwrite(fd, b, off) == n
    done.append((off, b))
for off, b in done[-20:]:
    assert os.pread(fd, len(b), off) == b, off
os.close(fd)
for off, b in done:
    print(off, len(b), b[0])
"#;
    let report = report_path(&s, "undo");
    let out = ok(attached(&s, &report, "python3").arg("-c").arg(py).arg(&f));
    let mut model = orig.clone();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Vec<usize> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        model[v[0]..v[0] + v[1]].fill(v[2] as u8);
    }
    let t = totals(&report, "python3");
    assert!(t.adopted > 0, "{test}: nothing adopted: {t:?}");
    assert_eq!(
        t.fallbacks, 0,
        "{test}: the writer fell back to the mount: {t:?}"
    );
    assert!(
        t.native_calls >= 300,
        "{test}: the writes did not run in the program: {t:?}"
    );
    assert!(fs::read(&f).unwrap() == model, "{test}: current bytes");
    let v = listed(&s, "", "big");
    assert_eq!(v.len(), 1, "{test}: one version");
    assert!(v[0].1 == orig, "{test}: the version is the original");
    // One small change: a granule (256 KiB) is saved, not the 8 MB file.
    let before = dir_bytes(&store);
    assert!(before > kept_before, "{test}: nothing was saved");
    let out = ok(attached(&s, &report, "python3").arg("-c").arg(
        "import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b'z'*4096, 3_000_000); os.close(fd)",
    ).arg(&f));
    drop(out);
    let grew = dir_bytes(&store) - before;
    assert!(
        grew <= 1 << 20,
        "{test}: a 4 KiB change kept {grew} bytes (more than 1 MiB)"
    );
    model[3_000_000..3_004_096].fill(b'z');
    assert!(
        fs::read(&f).unwrap() == model,
        "{test}: bytes after the small change"
    );
    let v = listed(&s, "", "big");
    assert_eq!(v.len(), 2, "{test}: a version per writing session");
}

/// Bytes held by the files of `dir` (allocated blocks).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}
