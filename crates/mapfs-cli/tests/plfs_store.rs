//! What plfs requires of its backing store is checked at mount: a store
//! that lacks it (here a real one: bindfs with `--rename-deny`, which
//! refuses every rename) is refused with a message naming what is missing,
//! and is left as it was; a bad `-o hostid=` is refused too. Skips loudly
//! without /dev/fuse or bindfs.

mod common;

use std::process::Command;

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};

/// Unmounts the bindfs mount at the path on drop.
struct Bindfs(std::path::PathBuf);

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.0).status();
    }
}

#[test]
fn a_store_without_rename_is_refused_at_mount() {
    let test = "plfs refuses a store without rename";
    if !fuse_or_skip(test) || !common::need("bindfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, store) = (dir.path().join("src"), dir.path().join("store"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&store).unwrap();
    std::fs::write(src.join("keep"), b"existing data").unwrap();
    let st = Command::new("bindfs")
        .arg("--rename-deny")
        .arg(&src)
        .arg(&store)
        .status()
        .unwrap();
    assert!(st.success(), "{test}: bindfs");
    let _guard = Bindfs(store.clone());
    let err = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Daemon)
        .backing(&store)
        .mount()
        .expect_err("plfs mounted over a store that cannot rename");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("cannot hold plfs files") && msg.contains("rename"),
        "{test}: {msg}"
    );
    // Nothing lost, nothing left behind.
    let mut names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["keep"], "{test}");
    assert_eq!(std::fs::read(src.join("keep")).unwrap(), b"existing data");
    // The same directory without bindfs's restriction is accepted.
    let s = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Daemon)
        .backing(&src)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: plfs over a plain directory: {e:#}"));
    drop(s);
}

#[test]
fn a_bad_host_id_is_refused() {
    let test = "plfs bad host id";
    if !fuse_or_skip(test) {
        return;
    }
    for bad in ["a.b", "a/b", ""] {
        let err = MountSession::builder(mapfs_bin())
            .fs("plfs")
            .data(DataMode::Daemon)
            .option(&format!("hostid={bad}"))
            .mount()
            .expect_err("a bad host id was accepted");
        assert!(format!("{err:#}").contains("host id"), "{test}: {err:#}");
    }
}
