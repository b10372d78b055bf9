//! The `mapfs-fsx` program on a native directory.

use std::process::Command;

fn fsx(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mapfs-fsx"))
        .args(args)
        .output()
        .expect("run mapfs-fsx")
}

#[test]
fn passes_and_summarises() {
    let d = tempfile::tempdir().unwrap();
    let out = fsx(&[
        "--dir",
        d.path().to_str().unwrap(),
        "--seed",
        "5",
        "--ops",
        "800",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("fsx ok: seed=5 ops=800"), "{stdout}");
    for k in [
        "write=",
        "mapwrite=",
        "punch_hole=",
        "copy_from=",
        "reopen=",
    ] {
        assert!(stdout.contains(k), "summary lacks {k}: {stdout}");
    }
}

#[test]
fn flags_disable_op_kinds() {
    let d = tempfile::tempdir().unwrap();
    let out = fsx(&[
        "--dir",
        d.path().to_str().unwrap(),
        "--ops",
        "500",
        "--no-mmap",
        "--no-fallocate",
        "--no-copy-range",
        "--maxlen",
        "10000",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in [
        "mapread=0",
        "mapwrite=0",
        "falloc_keep=0",
        "punch_hole=0",
        "zero_range=0",
        "copy_within=0",
        "copy_from=0",
    ] {
        assert!(stdout.contains(k), "expected {k}: {stdout}");
    }
    assert!(stdout.contains("final_size="), "{stdout}");
}

#[test]
fn unusable_dir_fails_with_seed() {
    let out = fsx(&["--dir", "/nonexistent/dir", "--seed", "77", "--ops", "10"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("seed=77"), "{stderr}");
}
