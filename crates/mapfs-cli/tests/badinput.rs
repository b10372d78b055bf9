//! Bad input to `mapfs mount`/`umount`: exit status != 0, a message naming the
//! problem, and nothing mounted.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use mapfs_testkit::mount::{is_mounted, mounts_under, run_captured, CmdOutput};
use mapfs_testkit::MountSession;

fn mapfs(args: &[&std::ffi::OsStr]) -> CmdOutput {
    run_captured(Command::new(mapfs_bin()).args(args)).expect("running mapfs")
}

/// Asserts failure, a message containing one of `keywords` (case-insensitive),
/// and no mount below `root`.
fn assert_refused(case: &str, out: &CmdOutput, keywords: &[&str], root: &Path) {
    assert!(
        out.status.is_some(),
        "{case}: mapfs hung (killed after timeout)"
    );
    let mounted = mounts_under(root);
    assert!(
        !out.success(),
        "{case}: mapfs exited 0; mounts now under {}: {mounted:?}\nstderr: {}",
        root.display(),
        out.stderr
    );
    let msg = format!("{}\n{}", out.stderr, out.stdout).to_lowercase();
    assert!(
        keywords.iter().any(|k| msg.contains(&k.to_lowercase())),
        "{case}: message does not mention any of {keywords:?}:\nstderr: {}\nstdout: {}",
        out.stderr,
        out.stdout
    );
    assert!(
        !out.stderr.contains("panicked"),
        "{case}: mapfs panicked:\n{}",
        out.stderr
    );
    assert!(
        mounted.is_empty(),
        "{case}: something got mounted: {mounted:?}"
    );
}

struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Self {
        Dirs { tmp: native_dir() }
    }
    fn dir(&self, rel: &str) -> std::path::PathBuf {
        let p = self.tmp.path().join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }
    fn file(&self, rel: &str) -> std::path::PathBuf {
        let p = self.tmp.path().join(rel);
        fs::write(&p, b"not a dir").unwrap();
        p
    }
    fn root(&self) -> &Path {
        self.tmp.path()
    }
}

fn mount_args<'a>(
    fs_name: &'a str,
    b: &'a Path,
    m: &'a Path,
    extra: &'a [&'a str],
) -> Vec<&'a std::ffi::OsStr> {
    let mut v: Vec<&std::ffi::OsStr> = vec![
        "mount".as_ref(),
        fs_name.as_ref(),
        b.as_os_str(),
        m.as_os_str(),
    ];
    v.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    v
}

#[test]
fn missing_backing() {
    let d = Dirs::new();
    let b = d.root().join("no-such-backing");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused(
        "missing backing",
        &out,
        &["no-such-backing", "not exist", "no such"],
        d.root(),
    );
}

#[test]
fn backing_not_a_dir() {
    let d = Dirs::new();
    let b = d.file("backing-file");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused("backing is a file", &out, &["not a directory"], d.root());
}

#[test]
fn missing_mountpoint() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.root().join("no-such-mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused(
        "missing mountpoint",
        &out,
        &["no-such-mnt", "not exist", "no such"],
        d.root(),
    );
}

#[test]
fn mountpoint_not_a_dir() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.file("mnt-file");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused("mountpoint is a file", &out, &["not a directory"], d.root());
}

#[test]
fn mountpoint_inside_backing() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("backing/sub/mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused(
        "mountpoint inside backing",
        &out,
        &["inside", "within", "overlap", "nested", "beneath"],
        d.root(),
    );
}

#[test]
fn backing_inside_mountpoint() {
    let d = Dirs::new();
    let m = d.dir("mnt");
    let b = d.dir("mnt/backing");
    let out = mapfs(&mount_args("passthrough", &b, &m, &[]));
    assert_refused(
        "backing inside mountpoint",
        &out,
        &["inside", "within", "overlap", "nested", "beneath"],
        d.root(),
    );
}

#[test]
fn backing_is_mountpoint() {
    let d = Dirs::new();
    let b = d.dir("same");
    let out = mapfs(&mount_args("passthrough", &b, &b, &[]));
    assert_refused(
        "backing == mountpoint",
        &out,
        &["same", "inside", "within", "overlap", "nested"],
        d.root(),
    );
}

#[test]
fn unknown_fs_name() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args("nosuchfs", &b, &m, &[]));
    assert_refused("unknown fs", &out, &["nosuchfs", "unknown"], d.root());
}

#[test]
fn bad_data_mode() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &["--data", "turbo"]));
    assert_refused(
        "--data turbo",
        &out,
        &["turbo", "invalid value", "possible values"],
        d.root(),
    );
}

#[test]
fn bad_mount_option() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args("passthrough", &b, &m, &["-o", "nosuchoption"]));
    assert_refused(
        "-o nosuchoption",
        &out,
        &["nosuchoption", "option"],
        d.root(),
    );
}

#[test]
fn missing_arguments() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let out = mapfs(&["mount".as_ref(), "passthrough".as_ref(), b.as_os_str()]);
    assert_refused(
        "mount without mountpoint",
        &out,
        &["usage", "required", "mountpoint"],
        d.root(),
    );
}

#[test]
fn mountpoint_busy() {
    if !fuse_or_skip("mountpoint_busy") {
        return;
    }
    let s = mount(DataMode::Auto, &[]);
    let b2 = native_dir();
    let out = mapfs(&mount_args("passthrough", b2.path(), s.mountpoint(), &[]));
    assert!(
        !out.success(),
        "second mount on a busy mountpoint exited 0: {}",
        out.stderr
    );
    let msg = out.stderr.to_lowercase();
    assert!(
        ["busy", "already", "mounted"]
            .iter()
            .any(|k| msg.contains(k)),
        "busy mountpoint: message does not say so:\n{}",
        out.stderr
    );
    let n = mapfs_testkit::mount::mounts()
        .iter()
        .filter(|(m, _)| m == s.mountpoint())
        .count();
    assert_eq!(n, 1, "busy mountpoint: now mounted {n} times");
    // The first mount still works.
    fs::write(s.mountpoint().join("x"), b"x").unwrap();
    assert_eq!(fs::read(s.backing().join("x")).unwrap(), b"x");
}

/// pack and versions keep state one instance must not share with another
/// (pack's reserved slots, which a second instance would reclaim; versions'
/// write sessions): a second mount of the same store is refused with a
/// clear error, and the first keeps working.
#[test]
fn a_second_mount_of_a_pack_or_versions_store_is_refused() {
    for fs_name in ["pack", "versions"] {
        let case = format!("second {fs_name} mount of one store");
        if !fuse_or_skip(&case) {
            return;
        }
        let s = MountSession::builder(mapfs_bin())
            .fs(fs_name)
            .mount()
            .unwrap_or_else(|e| panic!("{case}: first mount: {e:#}"));
        fs::write(s.mountpoint().join("kept"), b"first mount's bytes").unwrap();
        let d = Dirs::new();
        let m2 = d.dir("mnt2");
        let out = mapfs(&mount_args(fs_name, s.backing(), &m2, &[]));
        assert_refused(&case, &out, &["already served"], d.root());
        assert_eq!(
            fs::read(s.mountpoint().join("kept")).unwrap(),
            b"first mount's bytes",
            "{case}: the first mount"
        );
        fs::write(s.mountpoint().join("more"), b"still writable").unwrap();
    }
}

/// `--writeback-cache on` for a file system whose maps are not whole-file
/// and whose opens cannot share one (pack): refused, saying why, rather
/// than quietly mounted without the cache; `auto` mounts it without.
#[test]
fn writeback_cache_on_where_it_cannot_run_is_refused() {
    let case = "pack --data daemon --writeback-cache on";
    if !fuse_or_skip(case) {
        return;
    }
    let d = Dirs::new();
    let b = d.dir("store");
    let m = d.dir("mnt");
    let out = mapfs(&mount_args(
        "pack",
        &b,
        &m,
        &["--data", "daemon", "--writeback-cache", "on"],
    ));
    assert_refused(
        case,
        &out,
        &["cannot run under the kernel's writeback cache"],
        d.root(),
    );
    let out = mapfs(&mount_args("pack", &b, &m, &["--data", "daemon"]));
    assert!(out.success(), "{case}: with auto: {}", out.stderr);
    let listed = mapfs(&["list".as_ref(), "--json".as_ref()]);
    let umounted = mapfs(&["umount".as_ref(), m.as_os_str()]);
    assert!(umounted.success(), "{case}: umount: {}", umounted.stderr);
    let all: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let mine = (all.as_array().unwrap().iter())
        .find(|e| e["mountpoint"] == m.to_str().unwrap())
        .unwrap_or_else(|| panic!("{case}: not in mapfs list: {}", listed.stdout));
    assert_eq!(mine["writeback_cache"], false, "{case}: {mine}");
}

/// Without fusermount3 in PATH: root mounts directly (allowed to succeed) or
/// the CLI must say what is missing; never a half-done mount.
#[test]
fn no_fusermount3_in_path() {
    if !fuse_or_skip("no_fusermount3_in_path") {
        return;
    }
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    let empty = d.dir("empty-path");
    let mut cmd = Command::new(mapfs_bin());
    cmd.args(mount_args("passthrough", &b, &m, &[]))
        .env("PATH", &empty);
    let out = run_captured(&mut cmd).unwrap();
    if out.success() {
        assert!(is_mounted(&m), "exit 0 without a mount");
        eprintln!("note: mounting as root works without fusermount3 (direct mount(2))");
        let u = run_captured(
            Command::new(mapfs_bin())
                .arg("umount")
                .arg(&m)
                .env("PATH", &empty),
        )
        .unwrap();
        if !u.success() || is_mounted(&m) {
            let _ = run_captured(Command::new("umount").arg("-l").arg(&m));
            panic!("umount without fusermount3 in PATH failed: {}", u.stderr);
        }
    } else {
        assert_refused("no fusermount3", &out, &["fusermount"], d.root());
    }
}

/// A non-root user without fusermount3 cannot mount: clear error, no mount.
#[test]
fn non_root_without_fusermount3() {
    if !fuse_or_skip("non_root_without_fusermount3") {
        return;
    }
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    let empty = d.dir("empty-path");
    for p in [&b, &m] {
        rustix::fs::chownat(
            rustix::fs::CWD,
            p,
            Some(rustix::process::Uid::from_raw(mapfs_testkit::NOBODY_UID)),
            Some(rustix::process::Gid::from_raw(mapfs_testkit::NOBODY_GID)),
            rustix::fs::AtFlags::empty(),
        )
        .unwrap();
    }
    let mut cmd = mapfs_testkit::command_as_nobody(mapfs_bin());
    cmd.args(mount_args("passthrough", &b, &m, &[]))
        .env("PATH", &empty)
        .env("HOME", "/");
    let out = run_captured(&mut cmd).unwrap();
    assert_refused(
        "nobody, no fusermount3",
        &out,
        &["fusermount", "/dev/fuse", "permission"],
        d.root(),
    );
}

/// No /dev/fuse (hidden in a private mount namespace).
#[test]
fn no_dev_fuse() {
    let d = Dirs::new();
    let b = d.dir("backing");
    let m = d.dir("mnt");
    // Inside the namespace: replace /dev by a tmpfs holding only null/zero/urandom, run mapfs, then report whether
    // anything got mounted at m (exit 99) or mapfs's own status.
    let script = format!(
        "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5 \
         && mknod -m 666 /dev/urandom c 1 9 || exit 98; \
         {bin} mount passthrough {b} {m}; rc=$?; \
         if grep -q ' {m} ' /proc/self/mountinfo; then echo MOUNTED-IN-NS >&2; exit 99; fi; exit $rc",
        bin = mapfs_bin(),
        b = b.display(),
        m = m.display()
    );
    let Some(out) = in_private_mount_ns(&script, &[]) else {
        panic!("no_dev_fuse: unshare(1) is not installed (util-linux; scripts/deps.sh)");
    };
    assert_ne!(
        out.status.and_then(|s| s.code()),
        Some(98),
        "could not hide /dev/fuse:\n{}",
        out.stderr
    );
    assert_ne!(
        out.status.and_then(|s| s.code()),
        Some(99),
        "no /dev/fuse: mapfs left a mount:\n{}",
        out.stderr
    );
    assert_refused("no /dev/fuse", &out, &["/dev/fuse", "fuse"], d.root());
}

#[test]
fn umount_not_mounted() {
    let d = Dirs::new();
    let m = d.dir("mnt");
    let out = mapfs(&["umount".as_ref(), m.as_os_str()]);
    assert_refused(
        "umount of a plain dir",
        &out,
        &["not mounted", "not a mapfs", "not a mount"],
        d.root(),
    );
}

#[test]
fn umount_then_umount_again() {
    if !fuse_or_skip("umount_then_umount_again") {
        return;
    }
    let mut s = mount(DataMode::Auto, &[]);
    let out = s.umount_settled().unwrap();
    assert!(out.success(), "umount failed: {}", out.stderr);
    assert!(
        !is_mounted(s.mountpoint()),
        "still mounted after umount exit 0"
    );
    let again = s.umount().unwrap();
    assert!(!again.success(), "second umount exited 0");
}

#[test]
fn help_has_examples() {
    let out = mapfs(&["--help".as_ref()]);
    assert!(out.success(), "mapfs --help failed: {}", out.stderr);
    for word in ["mount", "umount"] {
        assert!(
            out.stdout.contains(word),
            "--help does not mention {word}:\n{}",
            out.stdout
        );
    }
}
