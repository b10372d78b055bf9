//! `mapfs run --embed FS:BACKING:PREFIX` over what the host has at PREFIX:
//! a non-empty directory or a file is refused before the command runs
//! (the program would lose sight of the host's files), unless
//! `--embed-over`; an absent PREFIX or an empty directory is taken.

mod common;
mod preload_support;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{mapfs_bin, native_dir};
use mapfs_testkit::mount::{run_captured, CmdOutput};

/// `cat PREFIX/f` under `mapfs run --embed passthrough:BACKING:PREFIX`,
/// with `extra` arguments before `--`; `echo ran` first, so that a refusal
/// shows the command never started.
fn cat_embedded(backing: &Path, prefix: &Path, extra: &[&str]) -> CmdOutput {
    preload_support::fresh_library(
        "libmapfs_embed_builtins.so",
        &["mapfs-embed/src", "mapfs-registry/src", "mapfs/src"],
    );
    run_captured(
        Command::new(mapfs_bin())
            .arg("run")
            .arg("--embed")
            .arg(format!(
                "passthrough:{}:{}",
                backing.display(),
                prefix.display()
            ))
            .args(extra)
            .args(["--", "sh", "-c", "echo ran; cat \"$0/f\""])
            .arg(prefix)
            .env_remove("LD_PRELOAD"),
    )
    .unwrap()
}

#[test]
fn embedding_over_host_files_needs_embed_over() {
    let tmp = native_dir();
    let backing = tmp.path().join("backing");
    fs::create_dir_all(&backing).unwrap();
    fs::write(backing.join("f"), b"embedded bytes").unwrap();

    // A host directory with a file of its own.
    let full = tmp.path().join("full");
    fs::create_dir_all(&full).unwrap();
    fs::write(full.join("f"), b"host bytes").unwrap();
    let out = cat_embedded(&backing, &full, &[]);
    assert!(out.status.is_some(), "mapfs run hung");
    assert!(!out.success(), "accepted over a non-empty directory");
    assert_eq!(out.stdout, "", "the command ran: {}", out.stderr);
    assert!(
        out.stderr.contains("non-empty directory")
            && out.stderr.contains(&full.display().to_string())
            && out.stderr.contains("--embed-over"),
        "unclear refusal: {}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    // Forced: the program sees the embedded file system there.
    let out = cat_embedded(&backing, &full, &["--embed-over"]);
    assert!(out.success(), "--embed-over: {}", out.stderr);
    assert_eq!(out.stdout, "ran\nembedded bytes");
    assert_eq!(fs::read(full.join("f")).unwrap(), b"host bytes");

    // A file on the host is hidden as well.
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    let out = cat_embedded(&backing, &file, &[]);
    assert!(!out.success(), "accepted over a file");
    assert!(
        out.stderr.contains("an existing file") && out.stderr.contains("--embed-over"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");

    // Nothing to hide: an empty directory, and no path at all.
    let empty = tmp.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    for prefix in [empty, tmp.path().join("absent")] {
        let out = cat_embedded(&backing, &prefix, &[]);
        assert!(out.success(), "{}: {}", prefix.display(), out.stderr);
        assert_eq!(out.stdout, "ran\nembedded bytes", "{}", prefix.display());
    }
}
