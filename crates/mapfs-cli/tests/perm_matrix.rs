//! Permission matrix: owner/group/other x r/w/x x regular file,
//! directory, FIFO, socket and character device, checked as two non-root
//! users through real mounts and compared errno by errno with the same
//! operations on a native directory.
//!
//! Every object is made by root with an owner that puts the test user in one
//! class (owner; group through the primary or a supplementary group; other)
//! and a mode that has one of the 8 bit patterns in that class and the
//! complementary pattern in the two other classes, so a check made against
//! the wrong class shows. The user then runs every operation on every object
//! in one helper process (this test binary, re-executed through `setpriv`),
//! which prints one line per operation.
//!
//! Configurations, each for `passthrough` and `plfs`, `--data auto` and
//! `--data daemon`: `-o allow_other` and `-o allow_other,default_permissions`
//! (compared with native); without `allow_other`, where the mount refuses
//! every other user (every operation must be `EACCES`). All mounts have
//! `-o dev`, so device nodes can really be opened (the dangerous case: a
//! mode bit that does not hold opens the device).
//!
//! Opens of FIFOs never block: read-only and write-only opens use
//! `O_NONBLOCK` (a write-only open without a reader is `ENXIO` when
//! permitted), read-write opens never wait on Linux. A socket nobody listens
//! on answers `connect` with `ECONNREFUSED` when permitted.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;
use rustix::fs::{Access, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Environment variable that turns the `helper` test into the helper.
const HELPER_DIR: &str = "MAPFS_PERM_MATRIX_DIR";
/// The user index the helper runs for (which objects it checks).
const HELPER_USER: &str = "MAPFS_PERM_MATRIX_USER";
/// Prefix of the helper's result lines on stdout.
const RESULT: &str = "PERMRESULT ";

/// A user the matrix runs as.
struct User {
    uid: u32,
    gid: u32,
    /// Supplementary groups.
    groups: &'static [u32],
    /// The group that puts it in an object's group class.
    class_gid: u32,
}

/// nobody/nogroup (group class through its primary group), and a second
/// user whose group class comes from a supplementary group.
const USERS: [User; 2] = [
    User {
        uid: 65534,
        gid: 65534,
        groups: &[],
        class_gid: 65534,
    },
    User {
        uid: 1234,
        gid: 1234,
        groups: &[4321],
        class_gid: 4321,
    },
];

const CLASSES: [&str; 3] = ["owner", "group", "other"];
const KINDS: [&str; 5] = ["file", "dir", "fifo", "sock", "chr"];

/// The mode giving `bits` to `class` and `7 - bits` to the two others.
fn mode_of(class: usize, bits: u32) -> u32 {
    let rest = 7 - bits;
    match class {
        0 => (bits << 6) | (rest << 3) | rest,
        1 => (rest << 6) | (bits << 3) | rest,
        _ => (rest << 6) | (rest << 3) | bits,
    }
}

/// Makes every object of the matrix in `dir` (as root).
fn make_fixture(dir: &Path) {
    for (ui, user) in USERS.iter().enumerate() {
        for (ci, class) in CLASSES.iter().enumerate() {
            let (uid, gid) = match ci {
                0 => (user.uid, 0),
                1 => (0, user.class_gid),
                _ => (0, 0),
            };
            for bits in 0..8 {
                for kind in KINDS {
                    let p = dir.join(format!("u{ui}-{class}-{bits}-{kind}"));
                    let what = || format!("fixture {} in {}", p.display(), dir.display());
                    match kind {
                        "file" => fs::write(&p, b"#!/bin/sh\n")
                            .unwrap_or_else(|e| panic!("{}: {e}", what())),
                        "dir" => {
                            fs::create_dir(&p).unwrap_or_else(|e| panic!("{}: {e}", what()));
                            fs::write(p.join("c"), b"c")
                                .unwrap_or_else(|e| panic!("{}: {e}", what()));
                        }
                        "sock" => {
                            // Bound and closed: the socket file stays, nobody listens.
                            drop(
                                std::os::unix::net::UnixListener::bind(&p)
                                    .unwrap_or_else(|e| panic!("{}: {e}", what())),
                            );
                        }
                        _ => {
                            let (ft, dev) = if kind == "fifo" {
                                (FileType::Fifo, 0)
                            } else {
                                // /dev/null's numbers.
                                (FileType::CharacterDevice, rustix::fs::makedev(1, 3))
                            };
                            rustix::fs::mknodat(
                                rustix::fs::CWD,
                                &p,
                                ft,
                                Mode::from_raw_mode(0o600),
                                dev,
                            )
                            .unwrap_or_else(|e| panic!("{}: {e}", what()));
                        }
                    }
                    rustix::fs::chown(
                        &p,
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                    )
                    .unwrap_or_else(|e| panic!("{}: chown: {e}", what()));
                    fs::set_permissions(&p, fs::Permissions::from_mode(mode_of(ci, bits)))
                        .unwrap_or_else(|e| panic!("{}: chmod: {e}", what()));
                }
            }
        }
    }
}

/// Runs the helper as user `ui` on `dir`; returns `object op -> result`.
fn run_helper(dir: &Path, ui: usize) -> BTreeMap<String, String> {
    let u = &USERS[ui];
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={}", u.uid))
        .arg(format!("--regid={}", u.gid));
    if u.groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let g: Vec<String> = u.groups.iter().map(|g| g.to_string()).collect();
        cmd.arg(format!("--groups={}", g.join(",")));
    }
    cmd.arg("--")
        .arg(exe)
        .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
        .env(HELPER_DIR, dir)
        .env(HELPER_USER, ui.to_string())
        .current_dir("/");
    let out = cmd.output().expect("running setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helper as uid {} on {} failed: {}\n{stdout}\n{}",
        u.uid,
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let map: BTreeMap<String, String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix(RESULT))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // 3 classes x 8 patterns x every kind, several operations each.
    assert!(
        map.len() >= CLASSES.len() * 8 * KINDS.len() * 3,
        "helper as uid {} on {} reported only {} results:\n{stdout}",
        u.uid,
        dir.display(),
        map.len()
    );
    map
}

/// `truncate(2)` of a path to 0 bytes (rustix has only `ftruncate`, which
/// would check the open instead).
fn truncate_path(p: &Path) -> Result<(), Errno> {
    let c = cpath(p);
    // SAFETY: truncate(2) with a valid NUL-terminated path.
    if unsafe { libc::truncate(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    }
}

/// The helper itself: only does something when re-executed by
/// [`run_helper`] (the environment names its directory); a plain test run
/// passes through it without checking anything.
#[test]
fn helper() {
    let Some(dir) = std::env::var_os(HELPER_DIR) else {
        return;
    };
    let ui: usize = std::env::var(HELPER_USER).unwrap().parse().unwrap();
    let dir = Path::new(&dir);
    // Named, not listed: without allow_other the user cannot list `dir`.
    let mut names = Vec::new();
    for class in CLASSES {
        for bits in 0..8 {
            for kind in KINDS {
                names.push(format!("u{ui}-{class}-{bits}-{kind}"));
            }
        }
    }
    for name in names {
        let kind = name.rsplit('-').next().unwrap().to_string();
        let p = dir.join(&name);
        let report = |op: &str, r: String| println!("{RESULT}{name} {op} {r}");
        for (op, a) in [
            ("access_r", Access::READ_OK),
            ("access_w", Access::WRITE_OK),
            ("access_x", Access::EXEC_OK),
        ] {
            report(op, outcome(&rustix::fs::access(&p, a)));
        }
        // `touch`: times set to now need ownership or write permission.
        let now = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        let times = rustix::fs::Timestamps {
            last_access: now,
            last_modification: now,
        };
        report(
            "touch",
            outcome(&rustix::fs::utimensat(
                rustix::fs::CWD,
                &p,
                &times,
                AtFlags::empty(),
            )),
        );
        let open = |flags: OFlags| outcome(&rustix::fs::open(&p, flags, Mode::empty()));
        match kind.as_str() {
            "file" | "chr" => {
                report("open_r", open(OFlags::RDONLY));
                report("open_w", open(OFlags::WRONLY));
                report("open_rw", open(OFlags::RDWR));
                if kind == "file" {
                    report("truncate", outcome(&truncate_path(&p)));
                    // The file is an empty `#!/bin/sh` script (truncated
                    // or not): running it needs `x` (and `r` for the shell).
                    let ran = Command::new(&p)
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                    report(
                        "exec",
                        match ran {
                            Ok(st) => format!("ok:{}", st.code().unwrap_or(-1)),
                            Err(e) => ename(Errno::from_io_error(&e).unwrap()),
                        },
                    );
                }
            }
            "fifo" => {
                report("open_r", open(OFlags::RDONLY | OFlags::NONBLOCK));
                report("open_w", open(OFlags::WRONLY | OFlags::NONBLOCK));
                report("open_rw", open(OFlags::RDWR | OFlags::NONBLOCK));
            }
            "sock" => {
                let r = rustix::net::socket(
                    rustix::net::AddressFamily::UNIX,
                    rustix::net::SocketType::STREAM,
                    None,
                )
                .and_then(|s| {
                    let addr = rustix::net::SocketAddrUnix::new(&p)?;
                    rustix::net::connect(&s, &addr)
                });
                report("connect", outcome(&r));
            }
            "dir" => {
                report("open_r", open(OFlags::RDONLY | OFlags::DIRECTORY));
                let list = rustix::fs::open(&p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                    .and_then(|fd| {
                        let mut d = rustix::fs::Dir::new(fd)?;
                        let mut n = Vec::new();
                        while let Some(e) = d.read() {
                            n.push(String::from_utf8_lossy(e?.file_name().to_bytes()).into_owned());
                        }
                        n.sort();
                        Ok(n.join(","))
                    });
                report(
                    "list",
                    match list {
                        Ok(n) => format!("ok:{n}"),
                        Err(e) => ename(e),
                    },
                );
                report(
                    "stat_child",
                    outcome(&rustix::fs::statat(
                        rustix::fs::CWD,
                        p.join("c"),
                        AtFlags::empty(),
                    )),
                );
                report(
                    "read_child",
                    match fs::read(p.join("c")) {
                        Ok(b) => format!("ok:{}", String::from_utf8_lossy(&b)),
                        Err(e) => ename(Errno::from_io_error(&e).unwrap()),
                    },
                );
                let new = p.join("new");
                let created = rustix::fs::open(
                    &new,
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY,
                    Mode::from_raw_mode(0o644),
                );
                report("create", outcome(&created));
                if created.is_ok() {
                    report("unlink", outcome(&rustix::fs::unlink(&new)));
                }
                let cd = rustix::process::chdir(&p);
                report("chdir", outcome(&cd));
                rustix::process::chdir("/").unwrap();
            }
            other => panic!("unknown kind {other}"),
        }
    }
}

/// The configurations of a mount.
const CONFIGS: [&[&str]; 3] = [
    &["dev"],
    &["dev", "allow_other"],
    &["dev", "allow_other", "default_permissions"],
];

fn matrix(fs_name: &str, mode: DataMode) {
    let label = format!("perm matrix {fs_name} --data {mode}");
    if !fuse_or_skip(&label) {
        return;
    }
    let native = native_dir();
    let ndir = native.path().join("m");
    fs::create_dir(&ndir).unwrap();
    fs::set_permissions(&ndir, fs::Permissions::from_mode(0o755)).unwrap();
    make_fixture(&ndir);
    let expected: Vec<_> = (0..USERS.len()).map(|ui| run_helper(&ndir, ui)).collect();
    // The matrix must exercise both outcomes natively, or it proves nothing.
    for (ui, e) in expected.iter().enumerate() {
        let denied = e.values().filter(|v| *v == "EACCES").count();
        assert!(
            denied > 0 && denied < e.len(),
            "native matrix for user {ui} is degenerate ({denied} of {} denied)",
            e.len()
        );
    }
    for opts in CONFIGS {
        let s = MountSession::builder(mapfs_bin())
            .fs(fs_name)
            .data(mode)
            .options(opts.iter().copied())
            .mount()
            .unwrap_or_else(|e| panic!("{label} -o {opts:?}: mount: {e:#}"));
        let dir = s.mountpoint().join("m");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        make_fixture(&dir);
        let others_allowed = opts.contains(&"allow_other");
        for (ui, want) in expected.iter().enumerate() {
            let got = run_helper(&dir, ui);
            let mut diffs = Vec::new();
            if others_allowed {
                for (k, w) in want {
                    let g = got.get(k).map_or("<missing>", |s| s.as_str());
                    if g != w {
                        diffs.push(format!("  {k}: native {w}, mapfs {g}"));
                    }
                }
                for k in got.keys().filter(|k| !want.contains_key(*k)) {
                    diffs.push(format!("  {k}: native <missing>, mapfs {}", got[k]));
                }
            } else {
                // Without allow_other the kernel refuses every other user,
                // whatever native would say (`create` fails, so there is no
                // `unlink`).
                for (k, g) in &got {
                    if g != "EACCES" {
                        diffs.push(format!("  {k}: mapfs {g}, want EACCES"));
                    }
                }
            }
            assert!(
                diffs.is_empty(),
                "{label} -o {}: uid {}: {} of {} results differ{}:\n{}",
                opts.join(","),
                USERS[ui].uid,
                diffs.len(),
                want.len(),
                if others_allowed {
                    " from native"
                } else {
                    " from EACCES (no allow_other)"
                },
                diffs.join("\n")
            );
        }
    }
}

#[test]
fn passthrough_auto() {
    matrix("passthrough", DataMode::Auto);
}

#[test]
fn passthrough_daemon() {
    matrix("passthrough", DataMode::Daemon);
}

#[test]
fn plfs_auto() {
    matrix("plfs", DataMode::Auto);
}

#[test]
fn plfs_daemon() {
    matrix("plfs", DataMode::Daemon);
}

// ---- The plfs cases (each also on passthrough), compared with
// native.

/// Mounts `fs_name` in `mode` with `allow_other`.
fn mount_fs(fs_name: &str, mode: DataMode) -> MountSession {
    MountSession::builder(mapfs_bin())
        .fs(fs_name)
        .data(mode)
        .options(["allow_other"])
        .mount()
        .unwrap_or_else(|e| panic!("mounting {fs_name} --data {mode}: {e:#}"))
}

/// Runs `check` in a fresh `work` dir natively and on `fs_name` in every
/// data mode, and asserts the same observations.
fn compare_native(test: &str, fs_names: &[&str], check: fn(&Path) -> Vec<String>) {
    let native = native_dir();
    let ndir = native.path().join("work");
    fs::create_dir(&ndir).unwrap();
    fs::set_permissions(&ndir, fs::Permissions::from_mode(0o755)).unwrap();
    let want = check(&ndir);
    if !fuse_or_skip(test) {
        return;
    }
    for fs_name in fs_names {
        for mode in [DataMode::Auto, DataMode::Daemon] {
            let s = mount_fs(fs_name, mode);
            let dir = s.mountpoint().join("work");
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
            let got = check(&dir);
            assert_eq!(
                got, want,
                "{test} on {fs_name} --data {mode}: observations differ from native \
                 (left: mapfs, right: native)"
            );
        }
    }
}

/// Renames by nobody, who may write both directories but owns neither the
/// files nor (but one) the directories, sticky directories included.
fn renames_by_non_owner(dir: &Path) -> Vec<String> {
    let mk = |d: &str, mode: u32, uid: u32| {
        let p = dir.join(d);
        fs::create_dir(&p).unwrap();
        rustix::fs::chown(&p, Some(rustix::fs::Uid::from_raw(uid)), None).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    mk("a", 0o777, 0);
    mk("b", 0o777, 0);
    mk("c", 0o755, 0);
    mk("s", 0o1777, mapfs_testkit::NOBODY_UID);
    mk("t", 0o1777, 0);
    for f in [
        "a/f1", "s/f2", "t/f3", "a/f4", "a/f5", "t/f5", "a/f6", "b/f6", "a/f7", "b/f7x", "a/f8",
    ] {
        fs::write(dir.join(f), f.as_bytes()).unwrap();
        fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o666)).unwrap();
    }
    mk("a/d9", 0o755, 0);
    let cases: &[(&str, &str, bool)] = &[
        ("a/f1", "b/f1", false), // plain move to another directory: ok
        ("s/f2", "b/f2", false), // out of a sticky dir nobody owns: ok
        ("t/f3", "b/f3", false), // out of root's sticky dir: EPERM
        ("a/f4", "t/f4", false), // into root's sticky dir: ok
        ("a/f5", "t/f5", false), // over root's file in root's sticky dir: EPERM
        ("a/f6", "b/f6", false), // over a file in another directory: ok
        ("a/f7", "b/f7x", true), // exchange across directories: ok
        ("a/f8", "c/f8", false), // into a directory nobody may not write: EACCES
        ("a/d9", "b/d9", false), // a real directory nobody may not write: EACCES
    ];
    let mut out = Vec::new();
    for (from, to, exchange) in cases {
        let (cf, ct) = (cpath(&dir.join(from)), cpath(&dir.join(to)));
        let flags = if *exchange {
            rustix::fs::RenameFlags::EXCHANGE
        } else {
            rustix::fs::RenameFlags::empty()
        };
        let r = mapfs_testkit::run_as_nobody(|| {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                cf.as_c_str(),
                rustix::fs::CWD,
                ct.as_c_str(),
                flags,
            )
        });
        out.push(format!("rename {from} {to}: {}", outcome(&r)));
    }
    for f in [
        "a/f1", "b/f1", "b/f2", "t/f3", "t/f4", "a/f5", "t/f5", "b/f6", "a/f7", "b/f7x",
    ] {
        let content = fs::read(dir.join(f)).map_or_else(
            |e| ename(Errno::from_io_error(&e).unwrap()),
            |b| String::from_utf8_lossy(&b).into_owned(),
        );
        out.push(format!("{f}: {content}"));
    }
    out
}

#[test]
fn rename_by_non_owner_matches_native() {
    compare_native(
        "rename_by_non_owner_matches_native",
        &["plfs", "passthrough"],
        renames_by_non_owner,
    );
}

/// What `fstat` and I/O through a descriptor say after its name is gone.
fn fstat_after_unlink(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let st = |fd: &rustix::fd::OwnedFd| match rustix::fs::fstat(fd) {
        Ok(s) => format!(
            "size {} nlink {} mode {:o} uid {}",
            s.st_size,
            s.st_nlink,
            s.st_mode & 0o7777,
            s.st_uid
        ),
        Err(e) => ename(e),
    };
    // A temporary file: created, unlinked, then used.
    let p = dir.join("tmp");
    let fd = rustix::fs::open(
        &p,
        OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    out.push(format!("new, unlinked: {}", {
        rustix::fs::unlink(&p).unwrap();
        st(&fd)
    }));
    rustix::io::write(&fd, b"hello").unwrap();
    out.push(format!("written: {}", st(&fd)));
    rustix::io::pwrite(&fd, b" world", 5).unwrap();
    let mut buf = [0u8; 32];
    let n = rustix::io::pread(&fd, &mut buf, 0).unwrap();
    out.push(format!("read: {}", String::from_utf8_lossy(&buf[..n])));
    rustix::fs::ftruncate(&fd, 3).unwrap();
    out.push(format!("truncated: {}", st(&fd)));
    let n = rustix::io::pread(&fd, &mut buf, 0).unwrap();
    out.push(format!("read: {}", String::from_utf8_lossy(&buf[..n])));
    drop(fd);
    // An empty file opened read-only, then unlinked.
    let p = dir.join("empty");
    fs::write(&p, b"").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    let fd = rustix::fs::open(&p, OFlags::RDONLY, Mode::empty()).unwrap();
    rustix::fs::unlink(&p).unwrap();
    out.push(format!("empty, unlinked: {}", st(&fd)));
    // A file replaced by a rename while open.
    let (p, q) = (dir.join("old"), dir.join("new"));
    fs::write(&p, b"old bytes").unwrap();
    fs::write(&q, b"new").unwrap();
    let fd = rustix::fs::open(&p, OFlags::RDONLY, Mode::empty()).unwrap();
    fs::rename(&q, &p).unwrap();
    out.push(format!("renamed over: {}", st(&fd)));
    let n = rustix::io::pread(&fd, &mut buf, 0).unwrap();
    out.push(format!("read: {}", String::from_utf8_lossy(&buf[..n])));
    out
}

#[test]
fn fstat_after_unlink_matches_native() {
    compare_native(
        "fstat_after_unlink_matches_native",
        &["plfs", "passthrough"],
        fstat_after_unlink,
    );
}

/// plfs has no hard links (a container directory cannot have two names):
/// `link` is `EPERM`, documented in docs/cli.md and plfs's module docs, and
/// changes nothing.
#[test]
fn plfs_link_is_eperm() {
    if !fuse_or_skip("plfs_link_is_eperm") {
        return;
    }
    for mode in [DataMode::Auto, DataMode::Daemon] {
        let s = mount_fs("plfs", mode);
        let (f, l) = (s.mountpoint().join("f"), s.mountpoint().join("l"));
        fs::write(&f, b"x").unwrap();
        let r = rustix::fs::link(&f, &l);
        assert_eq!(outcome(&r), "EPERM", "plfs --data {mode}: link");
        assert!(!l.exists(), "plfs --data {mode}: failed link left a name");
        assert_eq!(rustix::fs::stat(&f).unwrap().st_nlink, 1);
    }
}
