//! The `nullfs` example, mounted by its own binary: the namespace must
//! behave as POSIX says (it is the floor the metadata benchmarks compare
//! against, so it must do the work a real file system's mount does), and
//! files must stay empty.

mod common;

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;

use common::*;
use mapfs_testkit::{fuse_or_skip, DataMode, MountSession};

#[test]
fn names_live_in_memory_and_files_stay_empty() {
    if !fuse_or_skip("nullfs") {
        return;
    }
    let tmp = temp_dir();
    let s = MountSession::builder(example_bin("nullfs"))
        .fs("nullfs")
        .data(DataMode::Auto)
        .backing(tmp.path())
        .mount()
        .unwrap_or_else(|e| panic!("mounting nullfs: {e:#}"));
    let m = s.mountpoint();
    fs::create_dir(m.join("d")).unwrap();
    for i in 0..100 {
        fs::File::create(m.join(format!("d/f{i}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want, "nullfs: listing after 100 creates");
    // Nothing was written to the backing directory.
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);

    let f = m.join("d/f7");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.len(), md.permissions().mode() & 0o7777), (0, 0o600));
    let err = fs::File::create(m.join("missing/f")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotFound,
        "nullfs: create in a missing dir"
    );
    let err = fs::create_dir(m.join("d")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "nullfs: mkdir twice");
    let err = fs::remove_dir(m.join("d")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOTEMPTY),
        "nullfs: rmdir of a full dir"
    );
    let err = fs::remove_file(m.join("d")).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EISDIR),
        "nullfs: unlink of a dir"
    );

    // Files stay empty: a write fails, and the file is still empty after.
    let mut w = fs::OpenOptions::new().write(true).open(&f).unwrap();
    let wrote = w.write_all(b"bytes").and_then(|()| w.sync_all());
    assert!(wrote.is_err(), "nullfs: a write succeeded");
    drop(w);
    assert_eq!(fs::read(&f).unwrap(), b"", "nullfs: a file holds bytes");

    for i in 0..100 {
        fs::remove_file(m.join(format!("d/f{i}"))).unwrap();
    }
    fs::remove_dir(m.join("d")).unwrap();
    assert_eq!(
        fs::read_dir(m).unwrap().count(),
        0,
        "nullfs: left over names"
    );
}
