//! `scripts/install.sh` into a temporary prefix, then the installed `mapfs`:
//! `--version` finds its shim, man pages and completions are there, and
//! `mapfs run` on a real mount works from the installed location.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use mapfs_testkit::mount::run_captured;

/// The workspace root (two levels above this crate).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Installs the binaries of this test build into a fresh prefix; returns
/// it and what install.sh said on stderr.
fn install() -> (tempfile::TempDir, String) {
    let prefix = native_dir();
    let build = Path::new(mapfs_bin()).parent().unwrap();
    let out = run_captured(
        Command::new("bash")
            .arg(workspace().join("scripts/install.sh"))
            .arg(prefix.path())
            .env("MAPFS_BUILD_DIR", build),
    )
    .unwrap();
    assert!(
        out.success(),
        "install.sh failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    (prefix, out.stderr)
}

#[test]
fn installed_mapfs_finds_its_shim_and_runs_programs() {
    let (prefix, said) = install();
    let p = prefix.path();
    let mapfs = p.join("bin/mapfs");
    // mount.fuse3 looks for `mapfs` on root's default PATH, which a
    // temporary prefix is not on: install.sh must say so.
    assert!(
        said.contains("is not on root's default PATH") && said.contains("ln -s"),
        "install.sh did not warn about PATH:\n{said}"
    );
    let shim = p.join("lib/mapfs/libmapfs_preload.so");
    assert!(shim.is_file(), "no shim installed");

    let v = run_captured(Command::new(&mapfs).arg("--version")).unwrap();
    assert!(v.success(), "--version: {}", v.stderr);
    assert!(
        v.stdout
            .starts_with(&format!("mapfs {}", env!("CARGO_PKG_VERSION"))),
        "{}",
        v.stdout
    );
    assert!(v.stdout.contains("commit: "), "{}", v.stdout);
    let shim_line = format!("preload shim: {}", shim.canonicalize().unwrap().display());
    assert!(
        v.stdout.contains(&shim_line),
        "want {shim_line:?} in:\n{}",
        v.stdout
    );

    for page in [
        "mapfs.1",
        "mapfs-mount.1",
        "mapfs-umount.1",
        "mapfs-run.1",
        "mapfs-list.1",
    ] {
        let text = fs::read_to_string(p.join("share/man/man1").join(page)).unwrap();
        assert!(text.contains(".TH"), "{page} is not a man page");
    }
    let bash = p.join("share/bash-completion/completions/mapfs");
    let check = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(check.status.success(), "bash completion does not parse");
    assert!(fs::read_to_string(&bash).unwrap().contains("umount"));
    let unit = fs::read_to_string(p.join("lib/systemd/system/mapfs@.service")).unwrap();
    assert!(
        unit.contains(&format!("ExecStart={}", mapfs.display())),
        "{unit}"
    );

    if !fuse_or_skip("mapfs run from the installed prefix") {
        return;
    }
    let s = MountSession::builder(&mapfs)
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("mount from the prefix: {e:#}"));
    fs::write(s.backing().join("f"), b"installed and running\n").unwrap();
    let run = run_captured(
        Command::new(&mapfs)
            .args([
                "run",
                "--",
                "sh",
                "-c",
                "cat \"$1\"; echo \"$LD_PRELOAD\"",
                "sh",
            ])
            .arg(s.mountpoint().join("f")),
    )
    .unwrap();
    assert!(run.success(), "mapfs run: {}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "installed and running\n{}\n",
            shim.canonicalize().unwrap().display()
        )
    );
}
