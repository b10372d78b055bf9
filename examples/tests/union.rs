//! The `union` example, mounted by its own binary: the same operations on
//! the mount and on a plain directory built with `cp` (lower, then upper on
//! top) must leave the same tree; the lower layer must not change; the
//! fsx exerciser must find nothing wrong.

mod common;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use common::*;
use mapfs_testkit::fsx::{self, FsxConfig};
use mapfs_testkit::mount::run_captured;
use mapfs_testkit::{fuse_or_skip, DataMode, MountSession};

/// Lower and upper layers with files in each, one name in both.
fn layers(root: &Path) {
    let (lo, up) = (root.join("lower"), root.join("upper"));
    for d in ["d", "keep", "ldir", "deep/er"] {
        fs::create_dir_all(lo.join(d)).unwrap();
    }
    fs::create_dir_all(up.join("d")).unwrap();
    fs::write(lo.join("a"), pattern(1, 300_000)).unwrap();
    fs::write(lo.join("d/b"), pattern(2, 5000)).unwrap();
    fs::write(lo.join("d/c"), pattern(3, 70)).unwrap();
    fs::write(lo.join("gone"), b"to be deleted").unwrap();
    fs::write(lo.join("keep/x"), b"x").unwrap();
    fs::write(lo.join("ldir/inner"), b"inner").unwrap();
    fs::write(lo.join("deep/er/f"), b"deep").unwrap();
    fs::write(lo.join("shadow"), b"lower shadow bytes").unwrap();
    symlink("a", lo.join("sym")).unwrap();
    fs::write(up.join("shadow"), b"upper wins").unwrap();
    fs::write(up.join("d/u"), pattern(4, 4096)).unwrap();
}

/// What a user does on the merged view; run on the mount and on native.
fn apply(root: &Path) {
    let mut a = fs::OpenOptions::new()
        .append(true)
        .open(root.join("a"))
        .unwrap();
    a.write_all(b"appended").unwrap();
    let mut b = fs::OpenOptions::new()
        .write(true)
        .open(root.join("d/b"))
        .unwrap();
    b.seek(SeekFrom::Start(100)).unwrap();
    b.write_all(&pattern(9, 1000)).unwrap();
    drop((a, b));
    fs::remove_file(root.join("gone")).unwrap();
    fs::rename(root.join("d/c"), root.join("keep/c2")).unwrap();
    fs::remove_file(root.join("ldir/inner")).unwrap();
    fs::remove_dir(root.join("ldir")).unwrap();
    fs::create_dir(root.join("ldir")).unwrap();
    fs::write(root.join("ldir/new"), b"new in a re-made dir").unwrap();
    fs::create_dir(root.join("top")).unwrap();
    fs::write(root.join("top/new"), pattern(5, 12345)).unwrap();
    fs::write(root.join("deep/er/f"), b"changed deep down").unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(root.join("shadow"))
        .unwrap()
        .set_len(3)
        .unwrap();
    // A directory of the lower layer cannot be renamed in place (EXDEV, as
    // on overlayfs); mv copies it instead.
    let out = Command::new("mv")
        .arg(root.join("keep"))
        .arg(root.join("kept"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mv: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn reference(root: &Path) {
    let native = root.join("native");
    fs::create_dir(&native).unwrap();
    for layer in ["lower", "upper"] {
        let out = Command::new("cp")
            .arg("-a")
            .arg(root.join(layer).join("."))
            .arg(&native)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn mount_union(root: &Path, data: DataMode) -> MountSession {
    let backing = format!(
        "{}:{}",
        root.join("upper").display(),
        root.join("lower").display()
    );
    fs::create_dir_all(root.join("mnt")).unwrap();
    MountSession::builder(example_bin("union"))
        .fs("union")
        .data(data)
        .backing(backing)
        .mountpoint(root.join("mnt"))
        .mount()
        .unwrap_or_else(|e| panic!("mounting union: {e:#}"))
}

fn merged_view_matches_cp_reference(data: DataMode) {
    let test = format!("union --data {data}");
    if !fuse_or_skip(&test) {
        return;
    }
    let tmp = temp_dir();
    let root = tmp.path();
    layers(root);
    reference(root);
    let lower_before = tree(&root.join("lower"));
    let mut s = mount_union(root, data);
    let mnt = s.mountpoint().to_path_buf();
    assert_same_tree(&format!("{test}: before"), &mnt, &root.join("native"));
    assert_eq!(
        fs::rename(mnt.join("keep"), mnt.join("kept"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EXDEV),
        "{test}: renaming a lower directory"
    );
    apply(&root.join("native"));
    apply(&mnt);
    assert_same_tree(&format!("{test}: after"), &mnt, &root.join("native"));
    assert!(
        tree(&root.join("lower")) == lower_before,
        "{test}: the lower layer changed"
    );
    let upper = root.join("upper");
    assert!(
        upper.join(".wh.gone").exists(),
        "{test}: no whiteout for gone"
    );
    assert!(
        upper.join("ldir/.wh..wh..opq").exists(),
        "{test}: ldir not opaque"
    );
    assert_eq!(
        fs::read(upper.join("a")).unwrap().len(),
        300_008,
        "{test}: a not copied up"
    );

    // `run` from the example's own binary: the shim is found beside it.
    let cat = run_captured(
        Command::new(example_bin("union"))
            .args(["run", "--"])
            .arg("sha256sum")
            .arg(mnt.join("a")),
    )
    .unwrap();
    assert!(cat.success(), "{test}: union run: {}", cat.stderr);
    let native_sum = Command::new("sha256sum")
        .arg(root.join("native/a"))
        .output()
        .unwrap();
    let sum = |s: &str| s.split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(
        sum(&cat.stdout),
        sum(&String::from_utf8_lossy(&native_sum.stdout))
    );

    let out = s.umount().unwrap();
    assert!(out.success(), "{test}: umount: {}", out.stderr);
    let s = mount_union(root, data);
    assert_same_tree(
        &format!("{test}: remounted"),
        s.mountpoint(),
        &root.join("native"),
    );
}

#[test]
fn merged_view_matches_cp_reference_passthrough() {
    merged_view_matches_cp_reference(DataMode::Auto);
}

#[test]
fn merged_view_matches_cp_reference_daemon() {
    merged_view_matches_cp_reference(DataMode::Daemon);
}

/// The fsx exerciser on a union mount whose lower layer already holds the
/// file it works on, so its first write copies it up.
#[test]
fn fsx_on_union() {
    if !fuse_or_skip("fsx on union") {
        return;
    }
    let tmp = temp_dir();
    let root = tmp.path();
    fs::create_dir_all(root.join("upper")).unwrap();
    fs::create_dir_all(root.join("lower")).unwrap();
    let mut seed_lower = FsxConfig::new(root.join("lower"), 1, 200);
    seed_lower.keep = true;
    fsx::run(&seed_lower).unwrap_or_else(|f| panic!("fsx on the plain lower dir:\n{f}"));
    assert!(
        fs::read_dir(root.join("lower")).unwrap().count() > 0,
        "fsx left no file in lower"
    );
    let s = mount_union(root, DataMode::Auto);
    let cfg = FsxConfig::new(s.mountpoint(), 20_261_123, 3_000);
    let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("fsx on union:\n{f}"));
    eprintln!("fsx on union: {report}");
    for k in cfg.enabled_kinds() {
        assert!(
            report.count(k) + report.skipped.get(&k).map_or(0, |s| s.0) > 0,
            "{k} never ran"
        );
    }
}

/// The same overlay inside the program, no mount (`union run --embed`, the
/// library `union_embed.rs` makes): a layered backing, directories listed
/// through union's `readdir` (merged, whiteouts hidden), a write to a lower
/// file copied up first, a removal leaving a whiteout, and the lower layer
/// untouched.
#[test]
fn embedded_overlay_merges_copies_up_and_whites_out() {
    let _lib = example_bin("libunion_embed.so");
    let tmp = temp_dir();
    let root = tmp.path();
    layers(root);
    let lower_before = tree(&root.join("lower"));
    let prefix = root.join("u");
    let script = r#"
set -e
ls -A "$U"
cat "$U/shadow"; echo
printf 'appended' >> "$U/a"
rm "$U/gone"
mkdir "$U/top" && printf 'new' > "$U/top/new"
(set -C; printf x > "$U/d/b") 2>/dev/null && echo clobbered || echo noclobber-refused
find "$U" -printf '%P %y\n' | sort
"#;
    let out = run_captured(
        Command::new(example_bin("union"))
            .arg("run")
            .arg("--embed")
            .arg(format!(
                "union:{}:{}:{}",
                root.join("upper").display(),
                root.join("lower").display(),
                prefix.display()
            ))
            .args(["--", "sh", "-c", script])
            .env("U", &prefix)
            .env_remove("LD_PRELOAD"),
    )
    .unwrap();
    assert!(out.success(), "union run --embed: {}", out.stderr);
    let want = "a\nd\ndeep\ngone\nkeep\nldir\nshadow\nsym\nupper wins\nnoclobber-refused\n \
                d\na f\nd d\nd/b f\nd/c f\nd/u f\ndeep d\ndeep/er d\ndeep/er/f f\nkeep d\n\
                keep/x f\nldir d\nldir/inner f\nshadow f\nsym l\ntop d\ntop/new f\n";
    assert_eq!(out.stdout, want, "stderr: {}", out.stderr);
    // Copied up with the lower bytes, then appended to.
    let mut a = pattern(1, 300_000);
    a.extend_from_slice(b"appended");
    assert_eq!(fs::read(root.join("upper/a")).unwrap(), a);
    assert!(root.join("upper/.wh.gone").exists(), "no whiteout for gone");
    assert_eq!(fs::read(root.join("upper/top/new")).unwrap(), b"new");
    assert_eq!(
        tree(&root.join("lower")),
        lower_before,
        "the lower layer changed"
    );
    assert!(!prefix.exists(), "the prefix was created on the host");
}
