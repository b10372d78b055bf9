//! The `concat` example, mounted by its own binary: each file must read as
//! the `cat` of its parts, through the mount and under `concat run`, and
//! writes must be refused.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::process::Command;

use common::*;
use mapfs_testkit::mount::run_captured;
use mapfs_testkit::{fuse_or_skip, DataMode, MountSession};

#[test]
fn files_read_as_the_cat_of_their_parts() {
    if !fuse_or_skip("concat") {
        return;
    }
    let tmp = temp_dir();
    let backing = tmp.path().join("backing");
    let parts: [(&str, Vec<u8>); 4] = [
        ("00-head", pattern(1, 1000)),
        ("01-empty", Vec::new()),
        ("02-body", pattern(2, 200_000)),
        ("03-tail", b"tail".to_vec()),
    ];
    fs::create_dir_all(backing.join("log")).unwrap();
    fs::create_dir_all(backing.join("none")).unwrap();
    fs::create_dir_all(backing.join("log/subdir-ignored")).unwrap();
    for (name, bytes) in &parts {
        fs::write(backing.join("log").join(name), bytes).unwrap();
    }
    fs::write(backing.join("stray-file"), b"not a directory: not shown").unwrap();
    let native = tmp.path().join("native");
    let out = Command::new("sh")
        .arg("-c")
        .arg("cat \"$1\"/log/0* > \"$2\"")
        .args(["sh".as_ref(), backing.as_os_str(), native.as_os_str()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cat: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = fs::read(&native).unwrap();

    let s = MountSession::builder(example_bin("concat"))
        .fs("concat")
        .data(DataMode::Auto)
        .backing(&backing)
        .mount()
        .unwrap_or_else(|e| panic!("mounting concat: {e:#}"));
    let mnt = s.mountpoint();
    let mut names: Vec<_> = fs::read_dir(mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["log", "none"]);
    assert_eq!(
        fs::metadata(mnt.join("log")).unwrap().len(),
        want.len() as u64
    );
    assert!(fs::metadata(mnt.join("log")).unwrap().is_file());
    assert_eq!(fs::read(mnt.join("log")).unwrap(), want, "whole file");
    assert_eq!(fs::read(mnt.join("none")).unwrap(), b"", "no parts");

    // A read across the boundary of two parts.
    let mut f = fs::File::open(mnt.join("log")).unwrap();
    f.seek(SeekFrom::Start(990)).unwrap();
    let mut buf = vec![0; 30];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, want[990..1020]);

    let err = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("log"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "open for writing");

    // Under the shim, from the example's own binary (the map is lent to
    // the program, which reads the parts itself).
    let run = run_captured(
        Command::new(example_bin("concat"))
            .args(["run", "--", "sha256sum"])
            .arg(mnt.join("log")),
    )
    .unwrap();
    assert!(run.success(), "concat run: {}", run.stderr);
    let native_sum = Command::new("sha256sum").arg(&native).output().unwrap();
    let sum = |s: &str| s.split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(
        sum(&run.stdout),
        sum(&String::from_utf8_lossy(&native_sum.stdout)),
        "bytes under the shim"
    );
}

/// The same file system inside the program, with no mount: `concat run
/// --embed` preloads the example's own library (`concat_embed.rs`), which
/// serves the prefix with the same code: directories listed by concat's
/// `readdir`, files read through its multi-extent maps by the in-process
/// engine, writes refused.
#[test]
fn embedded_files_read_as_the_cat_of_their_parts() {
    let lib = example_bin("libconcat_embed.so");
    let tmp = temp_dir();
    let backing = tmp.path().join("backing");
    fs::create_dir_all(backing.join("log")).unwrap();
    fs::create_dir_all(backing.join("none")).unwrap();
    let mut want = Vec::new();
    for (i, len) in [(1u8, 1000usize), (2, 0), (3, 200_000), (4, 5)] {
        let bytes = pattern(i, len);
        fs::write(backing.join("log").join(format!("{i:02}")), &bytes).unwrap();
        want.extend_from_slice(&bytes);
    }
    fs::write(backing.join("stray-file"), b"not a directory: not shown").unwrap();
    let expected = tmp.path().join("expected");
    fs::write(&expected, &want).unwrap();
    let prefix = tmp.path().join("cat");
    let script = r#"
set -e
ls "$P"
find "$P" -mindepth 1 -printf '%P %y %s\n' | sort
cmp "$P/log" "$E" && echo same-bytes
python3 -c '
import os, sys
p = sys.argv[1]
f = open(p + "/log", "rb")
f.seek(990)
part = f.read(30)
print(part == open(sys.argv[2], "rb").read()[990:1020], os.stat(p + "/log").st_size)
try:
    open(p + "/log", "r+b")
except OSError as e:
    print("write refused", e.errno)
' "$P" "$E"
"#;
    let out = run_captured(
        Command::new(example_bin("concat"))
            .arg("run")
            .arg("--embed")
            .arg(format!("concat:{}:{}", backing.display(), prefix.display()))
            .args(["--", "sh", "-c", script])
            .env("P", &prefix)
            .env("E", &expected)
            .env_remove("LD_PRELOAD"),
    )
    .unwrap();
    assert!(out.success(), "concat run --embed: {}", out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "log\nnone\nlog f {}\nnone f 0\nsame-bytes\nTrue {}\nwrite refused {}\n",
            want.len(),
            want.len(),
            libc::EROFS
        ),
        "stderr: {} (library {})",
        out.stderr,
        lib.display()
    );
    assert!(!prefix.exists(), "the prefix was created on the host");
}
