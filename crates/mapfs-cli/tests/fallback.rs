//! Kernel passthrough refused for real: the kernel will not stack a
//! passthrough file on a backing file that is itself served by FUSE
//! passthrough (stack depth), so a mapfs mount over another mapfs mount must
//! fall back to the daemon executor, say so once, and keep every byte right.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};

/// The daemon log of the mount at `mountpoint` (root daemons log under
/// /run/mapfs, named after the mountpoint like `mapfs` does).
fn daemon_log(mountpoint: &std::path::Path) -> String {
    let name = mapfs::control::escape(mountpoint);
    fs::read_to_string(format!("/run/mapfs/{name}.log")).unwrap_or_default()
}

#[test]
fn stacked_mount_falls_back_to_daemon_once_and_keeps_bytes() {
    if !fuse_or_skip("stacked passthrough fallback") {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "SKIPPED stacked passthrough fallback: needs root (daemon logs under /run/mapfs)"
        );
        return;
    }
    let inner =
        MountSession::passthrough(mapfs_bin(), DataMode::Passthrough, &[]).expect("inner mount");
    let outer_mnt = tempfile::tempdir().unwrap();
    let outer = MountSession::builder(mapfs_bin())
        .data(DataMode::Passthrough)
        .backing(inner.mountpoint())
        .mountpoint(outer_mnt.path())
        .mount()
        .expect("outer mount over the inner mount");

    // Several opens: the refusal must be logged once, not per open.
    let mut model = Vec::new();
    for round in 0..5u8 {
        let p = outer.mountpoint().join(format!("f{round}"));
        let data: Vec<u8> = (0..70_000u32).map(|i| (i as u8) ^ round).collect();
        fs::write(&p, &data).unwrap();
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.seek(SeekFrom::Start(1234)).unwrap();
        f.write_all(b"patched").unwrap();
        let mut expect = data.clone();
        expect[1234..1241].copy_from_slice(b"patched");
        let mut got = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut got).unwrap();
        assert_eq!(got, expect, "bytes through the outer mount, round {round}");
        model.push((p, expect));
    }
    assert!(
        mapfs_testkit::is_mounted(outer.mountpoint()),
        "outer mount vanished during the test"
    );
    for (p, expect) in &model {
        let name = p.file_name().unwrap();
        let inner_bytes = fs::read(inner.mountpoint().join(name)).unwrap();
        let backing_bytes = fs::read(inner.backing().join(name)).unwrap();
        assert_eq!(&inner_bytes, expect, "bytes seen through the inner mount");
        assert_eq!(&backing_bytes, expect, "bytes in the backing dir");
    }
    let log = daemon_log(outer.mountpoint());
    let refusals = log.matches("kernel refused FUSE passthrough").count();
    assert_eq!(
        refusals, 1,
        "the outer daemon must log the passthrough refusal exactly once; log:\n{log}"
    );
    let inner_log = daemon_log(inner.mountpoint());
    assert!(
        !inner_log.contains("refused"),
        "the inner mount sits on a plain file system and must keep passthrough; log:\n{inner_log}"
    );
    drop(outer);
    drop(inner);
}
