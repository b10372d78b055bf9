//! A file system of one's own, as a user makes it: `scripts/new-fs.sh`
//! copies the template crate (`templates/concat`, the tutorial's program)
//! to a directory outside the repository, cargo builds it there against
//! this checkout by absolute path (with the repository's Cargo.lock,
//! offline, into this build's target directory so that what the workspace
//! built is reused), and the program it makes is shipped as
//! docs/writing-a-file-system.md says: the binary in `PREFIX/bin`, the
//! preload shim and its embedded library in `PREFIX/lib/mapfs`. Then it
//! mounts on a real FUSE mount, serves the bytes written to its backing
//! directory, runs a program under its shim and embedded, and unmounts.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use mapfs_testkit::mount::{is_mounted, run_captured};

/// The workspace root (two levels above this crate).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The target directory of this build: `mapfs` is in `TARGET/PROFILE/`.
fn target_dir() -> PathBuf {
    let bin = Path::new(mapfs_bin());
    bin.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Copies the template to `dest` with the script users run, with `version`
/// as the crate's own version.
fn new_fs(dest: &Path, version: &str) {
    let out = run_captured(
        Command::new("bash")
            .arg(workspace().join("scripts/new-fs.sh"))
            .arg(dest),
    )
    .unwrap();
    assert!(out.success(), "new-fs.sh: {}{}", out.stdout, out.stderr);
    let manifest = dest.join("Cargo.toml");
    let text = fs::read_to_string(&manifest).unwrap();
    assert!(!text.contains("\"../"), "a relative path is left:\n{text}");
    let repo = workspace();
    assert!(
        text.contains(&format!("path = \"{}/crates/mapfs-cli\"", repo.display())),
        "mapfs-cli is not taken from this checkout:\n{text}"
    );
    let text = text.replacen(
        "version = \"0.1.0\"",
        &format!("version = \"{version}\""),
        1,
    );
    fs::write(&manifest, text).unwrap();
}

/// `cargo build` of the copy, offline, in this build's profile and target
/// directory; a watchdog (`timeout`) bounds it.
fn build(dir: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = target_dir();
    let profile = Path::new(mapfs_bin())
        .parent()
        .and_then(Path::file_name)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", "1800"])
        .arg(&cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target)
        // Only the copy's own manifest decides what is built.
        .env_remove("CARGO_MANIFEST_DIR")
        .env_remove("RUSTFLAGS");
    if profile == "release" {
        cmd.arg("--release");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "cargo build of the copied template failed ({:?}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    target.join(profile)
}

#[test]
fn a_crate_made_from_the_template_outside_the_repository_builds_and_mounts() {
    let tmp = native_dir();
    let src = tmp.path().join("myfs");
    assert!(
        !src.starts_with(workspace()),
        "the copy must be outside the repository"
    );
    new_fs(&src, "2.5.0");
    let built = build(&src);

    // Shipped as the docs say: the binary, and beside it (in
    // ../lib/mapfs/) the preload shim and the program's embedded library.
    let prefix = tmp.path().join("prefix");
    fs::create_dir_all(prefix.join("bin")).unwrap();
    fs::create_dir_all(prefix.join("lib/mapfs")).unwrap();
    let bin = prefix.join("bin/concat");
    fs::copy(built.join("concat"), &bin).unwrap();
    for lib in ["libconcat_embed.so", "libmapfs_preload.so"] {
        let from = built.join(lib);
        assert!(from.is_file(), "{} was not built", from.display());
        fs::copy(&from, prefix.join("lib/mapfs").join(lib)).unwrap();
    }

    // The program's version first, mapfs's below it.
    let v = run_captured(Command::new(&bin).arg("--version")).unwrap();
    assert!(v.success(), "--version: {}", v.stderr);
    let lines: Vec<&str> = v.stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"concat 2.5.0"), "{}", v.stdout);
    assert_eq!(
        lines.get(1).copied(),
        Some(format!("mapfs {}", env!("CARGO_PKG_VERSION")).as_str()),
        "{}",
        v.stdout
    );
    let shim = prefix.join("lib/mapfs/libmapfs_preload.so");
    assert!(
        v.stdout.contains(&format!(
            "preload shim: {}",
            shim.canonicalize().unwrap().display()
        )),
        "the shipped shim is not found:\n{}",
        v.stdout
    );

    if !fuse_or_skip("template_mount") {
        return;
    }
    let backing = tmp.path().join("backing");
    fs::create_dir_all(backing.join("log")).unwrap();
    let mut want = Vec::new();
    for (i, len) in [(1u8, 5000usize), (2, 70_000)] {
        let bytes: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(i)).collect();
        fs::write(backing.join(format!("log/{i:02}")), &bytes).unwrap();
        want.extend_from_slice(&bytes);
    }
    let mut s = MountSession::builder(&bin)
        .fs("concat")
        .backing(&backing)
        .mount()
        .unwrap_or_else(|e| panic!("mounting the template's program: {e:#}"));
    let mnt = s.mountpoint().to_path_buf();
    assert_eq!(
        fs::read(mnt.join("log")).unwrap(),
        want,
        "through the mount"
    );
    // A part written while mounted shows at the next open.
    fs::write(backing.join("log/03"), b"written while mounted").unwrap();
    want.extend_from_slice(b"written while mounted");
    assert_eq!(fs::read(mnt.join("log")).unwrap(), want, "after a new part");
    let err = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("log"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "open for writing");

    // Under the shipped shim, then embedded by the shipped library.
    let expected = tmp.path().join("expected");
    fs::write(&expected, &want).unwrap();
    let run = run_captured(
        Command::new(&bin)
            .args(["run", "--", "cmp"])
            .arg(mnt.join("log"))
            .arg(&expected),
    )
    .unwrap();
    assert!(
        run.success(),
        "concat run -- cmp: {}{}",
        run.stdout,
        run.stderr
    );
    let prefix_dir = tmp.path().join("cat");
    let run = run_captured(
        Command::new(&bin)
            .arg("run")
            .arg("--embed")
            .arg(format!(
                "concat:{}:{}",
                backing.display(),
                prefix_dir.display()
            ))
            .args(["--", "cmp"])
            .arg(prefix_dir.join("log"))
            .arg(&expected)
            .env_remove("LD_PRELOAD"),
    )
    .unwrap();
    assert!(
        run.success(),
        "concat run --embed -- cmp: {}{}",
        run.stdout,
        run.stderr
    );

    let out = s.umount().unwrap();
    assert!(out.success(), "concat umount: {}", out.stderr);
    assert!(!is_mounted(&mnt), "still mounted after umount");
}
