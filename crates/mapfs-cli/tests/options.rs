//! Mount options that change behaviour: ro, allow_other (absent), remount.

mod common;

use std::fs;

use common::*;
use mapfs_testkit::run_as_nobody;
use rustix::fs::{Mode, OFlags};

#[test]
fn read_only() {
    for mode in MODES {
        with_mount("read_only", mode, &["ro"], |s| {
            fs::write(s.backing().join("f"), b"data").unwrap();
            assert_eq!(
                fs::read(s.mountpoint().join("f")).unwrap(),
                b"data",
                "ro --data {mode}: read"
            );
            let r = rustix::fs::open(s.mountpoint().join("f"), OFlags::WRONLY, Mode::empty());
            assert_eq!(outcome(&r), "EROFS", "ro --data {mode}: open for write");
            let r = rustix::fs::mkdir(s.mountpoint().join("d"), Mode::from_raw_mode(0o755));
            assert_eq!(outcome(&r), "EROFS", "ro --data {mode}: mkdir");
            let r = rustix::fs::unlink(s.mountpoint().join("f"));
            assert_eq!(outcome(&r), "EROFS", "ro --data {mode}: unlink");
            assert_eq!(fs::read(s.backing().join("f")).unwrap(), b"data");
        });
    }
}

#[test]
fn other_users_need_allow_other() {
    for mode in MODES {
        with_mount("other_users_need_allow_other", mode, &[], |s| {
            fs::write(s.mountpoint().join("f"), b"data").unwrap();
            let c = cpath(&s.mountpoint().join("f"));
            let r = run_as_nobody(|| rustix::fs::stat(c.as_c_str()).map(|_| ()));
            assert_eq!(
                outcome(&r),
                "EACCES",
                "--data {mode} without allow_other: nobody's stat"
            );
        });
        with_mount(
            "other_users_need_allow_other",
            mode,
            &["allow_other"],
            |s| {
                fs::write(s.mountpoint().join("f"), b"data").unwrap();
                let c = cpath(&s.mountpoint().join("f"));
                let r = run_as_nobody(|| {
                    let fd = rustix::fs::open(c.as_c_str(), OFlags::RDONLY, Mode::empty())?;
                    let mut b = [0u8; 4];
                    rustix::io::read(&fd, &mut b).map(|_| ())
                });
                assert_eq!(
                    outcome(&r),
                    "ok",
                    "--data {mode} with allow_other: nobody reads a 644 file"
                );
            },
        );
    }
}

/// Files created through the mount belong to the caller, not the daemon.
#[test]
fn created_files_belong_to_caller() {
    for mode in MODES {
        with_mount(
            "created_files_belong_to_caller",
            mode,
            &["allow_other"],
            |s| {
                let d = s.mountpoint().join("pub");
                fs::create_dir(&d).unwrap();
                rustix::fs::chmod(&d, Mode::from_raw_mode(0o777)).unwrap();
                let (cf, cd, cl, cs) = (
                    cpath(&d.join("f")),
                    cpath(&d.join("d")),
                    cpath(&d.join("fifo")),
                    cpath(&d.join("s")),
                );
                let r = run_as_nobody(|| {
                    rustix::fs::open(
                        cf.as_c_str(),
                        OFlags::CREATE | OFlags::WRONLY,
                        Mode::from_raw_mode(0o644),
                    )?;
                    rustix::fs::mkdir(cd.as_c_str(), Mode::from_raw_mode(0o755))?;
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        cl.as_c_str(),
                        rustix::fs::FileType::Fifo,
                        Mode::from_raw_mode(0o644),
                        0,
                    )?;
                    rustix::fs::symlink(c"f", cs.as_c_str())
                });
                assert_eq!(
                    outcome(&r),
                    "ok",
                    "--data {mode}: nobody creates in a 0777 dir"
                );
                for n in ["f", "d", "fifo", "s"] {
                    let st = rustix::fs::lstat(s.backing().join("pub").join(n)).unwrap();
                    assert_eq!(
                        (st.st_uid, st.st_gid),
                        (mapfs_testkit::NOBODY_UID, mapfs_testkit::NOBODY_GID),
                        "--data {mode}: backing owner of {n} created by nobody"
                    );
                }
            },
        );
    }
}

/// A file replaced in the backing directory (an editor's write-and-rename
/// there) while a program holds it open through the mount: a new open of
/// the name, within the entry TTL, gets the new file, and its writes land
/// in it. In passthrough mode the old descriptor still reads the old bytes
/// (the kernel takes one backing file per inode: the new open used to run
/// on the old file, and the append below went into the replaced file).
#[test]
fn a_file_replaced_behind_the_mount_is_opened_anew() {
    if !fuse_or_skip("a_file_replaced_behind_the_mount_is_opened_anew") {
        return;
    }
    for mode in MODES {
        // A long TTL: the kernel keeps the name's inode throughout.
        let s = MountSession::builder(mapfs_bin())
            .data(mode)
            .arg("--ttl")
            .arg("60")
            .mount()
            .unwrap();
        {
            {
                let (b, m) = (s.backing(), s.mountpoint());
                std::fs::write(b.join("f"), b"old").unwrap();
                let mut held = std::fs::File::open(m.join("f")).unwrap();
                std::fs::write(b.join("f.tmp"), b"new").unwrap();
                std::fs::rename(b.join("f.tmp"), b.join("f")).unwrap();
                assert_eq!(std::fs::read(m.join("f")).unwrap(), b"new", "{mode}");
                let mut w = std::fs::OpenOptions::new()
                    .append(true)
                    .open(m.join("f"))
                    .unwrap();
                std::io::Write::write_all(&mut w, b"+more").unwrap();
                drop(w);
                assert_eq!(std::fs::read(b.join("f")).unwrap(), b"new+more", "{mode}");
                let mut old = Vec::new();
                std::io::Read::read_to_end(&mut held, &mut old).unwrap();
                // Through the daemon the kernel serves both descriptors
                // from the one inode's page cache until the TTL ends.
                if mode == DataMode::Passthrough {
                    assert_eq!(old, b"old");
                }
            }
        }
    }
}

/// `--data passthrough` requires kernel passthrough: a file system whose
/// maps are never whole-file (plfs) is refused before mounting; where the kernel grants
/// passthrough (root, Linux 6.9+) the mount runs it; where it does not (a
/// user namespace: its root lacks CAP_SYS_ADMIN where the kernel checks)
/// the mount is refused and nothing stays mounted, while `--data auto`
/// there falls back to the daemon.
#[test]
fn data_passthrough_is_kernel_passthrough_or_refused() {
    let test = "data_passthrough_is_kernel_passthrough_or_refused";
    if !fuse_or_skip(test) {
        return;
    }
    let tmp = native_dir();
    let (b, m) = (tmp.path().join("b"), tmp.path().join("m"));
    fs::create_dir(&b).unwrap();
    fs::create_dir(&m).unwrap();
    let mapfs = |args: &[&std::ffi::OsStr]| {
        mapfs_testkit::mount::run_captured(std::process::Command::new(mapfs_bin()).args(args))
            .unwrap()
    };
    let (bs, ms) = (b.as_os_str(), m.as_os_str());
    let out = mapfs(&[
        "mount".as_ref(),
        "plfs".as_ref(),
        bs,
        ms,
        "--data".as_ref(),
        "passthrough".as_ref(),
    ]);
    assert!(!out.success(), "plfs --data passthrough mounted");
    assert!(
        out.stderr
            .contains("only whole-file maps, and plfs has none"),
        "{}",
        out.stderr
    );
    assert!(!mapfs_testkit::is_mounted(&m));

    let s = MountSession::builder(mapfs_bin())
        .fs("passthrough")
        .data(DataMode::Passthrough)
        .mount();
    if rustix::process::geteuid().is_root() {
        let s = s.expect("--data passthrough as root on Linux 6.9+");
        let out = mapfs(&[
            "list".as_ref(),
            "--json".as_ref(),
            s.mountpoint().as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v[0]["executor"], "kernel passthrough", "{}", out.stdout);
    }

    need("unshare");
    let script = format!(
        "{bin} mount passthrough {b} {m} --data passthrough; echo rc=$?; \
         grep -c ' {m} ' /proc/self/mountinfo; \
         {bin} mount passthrough {b} {m} --data auto && {bin} list --json {m} && {bin} umount {m}",
        bin = mapfs_bin(),
        b = b.display(),
        m = m.display()
    );
    let out = mapfs_testkit::mount::run_captured(
        std::process::Command::new("unshare")
            .args(["-Urm", "sh", "-c"])
            .arg(&script),
    )
    .unwrap();
    assert!(
        out.stderr
            .contains("--data passthrough: the kernel refused kernel passthrough"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let mut lines = out.stdout.lines();
    assert_eq!(lines.next(), Some("rc=1"), "{}", out.stdout);
    assert_eq!(lines.next(), Some("0"), "left mounted: {}", out.stdout);
    let listed: serde_json::Value = serde_json::from_str(&lines.collect::<Vec<_>>().join("\n"))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", out.stdout, out.stderr));
    assert_eq!(listed[0]["executor"], "daemon", "{}", out.stdout);
}
