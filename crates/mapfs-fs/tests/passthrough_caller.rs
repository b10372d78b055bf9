//! Permissions are the backing kernel's, for the calling user: each
//! operation as an unprivileged caller through the file system vs the same
//! operation natively under the same credentials.

mod common;

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use common::*;
use mapfs::{Ctx, FileSystem, OpenFlags, RenameFlags, SetAttr, TimeSet};
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps};
use rustix::process::{Gid, Uid};

fn own(path: &Path, uid: u32, gid: u32) {
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn mode(path: &Path, m: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).unwrap();
}

fn file(path: &Path, m: u32, uid: u32, gid: u32) {
    std::fs::write(path, b"data").unwrap();
    own(path, uid, gid);
    mode(path, m);
}

fn dir(path: &Path, m: u32, uid: u32, gid: u32) {
    std::fs::create_dir(path).unwrap();
    own(path, uid, gid);
    mode(path, m);
}

/// priv/ 0700 root (x inside), secret 0600 root, rootf 0644 root, pubw 0666
/// root, pub/ 0777, tmp/ 1777 with ufile (user 1000, 0666), sg/ 2775
/// root:4242, mine 0644 nobody, suid 6755 nobody, ro/ 0755 root, grp 0640
/// root:4242.
fn perms(d: &Path) {
    dir(&d.join("priv"), 0o700, 0, 0);
    file(&d.join("priv/x"), 0o644, 0, 0);
    file(&d.join("secret"), 0o600, 0, 0);
    file(&d.join("rootf"), 0o644, 0, 0);
    file(&d.join("pubw"), 0o666, 0, 0);
    dir(&d.join("pub"), 0o777, 0, 0);
    dir(&d.join("pub/rootempty"), 0o755, 0, 0);
    dir(&d.join("tmp"), 0o1777, 0, 0);
    file(&d.join("tmp/ufile"), 0o666, 1000, 1000);
    dir(&d.join("sg"), 0o2775, 0, 4242);
    // Group 4242 members may write into sg/ (nobody is not one).
    dir(&d.join("ro"), 0o755, 0, 0);
    file(&d.join("mine"), 0o644, 65534, 65534);
    file(&d.join("suid"), 0o6755, 65534, 65534);
    file(&d.join("grp"), 0o640, 0, 4242);
    rustix::fs::lsetxattr(
        d.join("mine"),
        "trusted.root",
        b"t",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
}

fn io<T>(r: rustix::io::Result<T>) -> std::io::Result<T> {
    r.map_err(Into::into)
}

#[test]
fn lookups_reads_and_opens() {
    if !is_root("lookups_reads_and_opens") {
        return;
    }
    let t = Twin::new(perms);
    let c = &NOBODY;
    let e = same(
        t.fs.getattr(c, p("/priv/x")),
        native_as(c, || std::fs::symlink_metadata(t.n("/priv/x"))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    let e = same(
        t.fs.readdir(c, p("/priv")),
        native_as(c, || std::fs::read_dir(t.n("/priv"))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    let e = same(
        t.fs.open(c, p("/secret"), OpenFlags(libc::O_RDONLY)),
        native_as(c, || std::fs::File::open(t.n("/secret"))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    let e = same(
        t.fs.open(c, p("/rootf"), OpenFlags(libc::O_WRONLY)),
        native_as(c, || {
            std::fs::OpenOptions::new().write(true).open(t.n("/rootf"))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    same(
        t.fs.open(c, p("/rootf"), OpenFlags(libc::O_RDONLY)),
        native_as(c, || std::fs::File::open(t.n("/rootf"))),
    )
    .unwrap();
    // The fd obtained as nobody keeps nobody's access: it is exactly the
    // mode asked.
    let o = t.fs.open(c, p("/pubw"), OpenFlags(libc::O_RDWR)).unwrap();
    (&*o.files[0]).write_all(b"x").unwrap();
    native_as(c, || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.n("/pubw"))?
            .write_all(b"x")
    })
    .unwrap();
    // access(2) as nobody.
    for (path, mask, want) in [
        ("/secret", libc::R_OK, Some(libc::EACCES)),
        ("/rootf", libc::R_OK, None),
        ("/rootf", libc::W_OK, Some(libc::EACCES)),
        ("/pub", libc::W_OK | libc::X_OK, None),
        ("/priv/x", libc::F_OK, Some(libc::EACCES)),
    ] {
        let r = same(
            t.fs.access(c, p(path), mask),
            native_as(c, || {
                io(rustix::fs::accessat(
                    rustix::fs::CWD,
                    t.n(path),
                    rustix::fs::Access::from_bits_retain(mask as u32),
                    AtFlags::EACCESS,
                ))
            }),
        );
        assert_eq!(r.err(), want, "{path} {mask}");
    }
    // The test thread is root again.
    t.fs.open(&ROOT, p("/secret"), OpenFlags(libc::O_RDONLY))
        .unwrap();
    t.assert_same_trees();
}

#[test]
fn new_files_owned_by_caller_and_setgid_inheritance() {
    if !is_root("new_files_owned_by_caller_and_setgid_inheritance") {
        return;
    }
    let t = Twin::new(perms);
    let c = &NOBODY;
    let (a, _) =
        t.fs.create(
            c,
            p("/pub/new"),
            OpenFlags(libc::O_WRONLY | libc::O_EXCL),
            0o640,
        )
        .unwrap();
    native_as(c, || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(t.n("/pub/new"))
    })
    .unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o640));
    let a = t.fs.mkdir(c, p("/pub/d"), 0o755).unwrap();
    native_as(c, || {
        std::fs::DirBuilder::new().mode(0o755).create(t.n("/pub/d"))
    })
    .unwrap();
    assert_eq!((a.uid, a.gid), (65534, 65534));
    let a = t.fs.symlink(c, OsStr::new("target"), p("/pub/sl")).unwrap();
    native_as(c, || std::os::unix::fs::symlink("target", t.n("/pub/sl"))).unwrap();
    assert_eq!(a.uid, 65534);
    let a =
        t.fs.mknod(c, p("/pub/fifo"), libc::S_IFIFO | 0o600, 0)
            .unwrap();
    native_as(c, || {
        io(rustix::fs::mkfifoat(
            rustix::fs::CWD,
            t.n("/pub/fifo"),
            Mode::from_raw_mode(0o600),
        ))
    })
    .unwrap();
    assert_eq!(a.uid, 65534);
    // Devices need CAP_MKNOD, which nobody does not have.
    let e = same(
        t.fs.mknod(
            c,
            p("/pub/null"),
            libc::S_IFCHR | 0o666,
            rustix::fs::makedev(1, 3),
        ),
        native_as(c, || {
            io(rustix::fs::mknodat(
                rustix::fs::CWD,
                t.n("/pub/null"),
                rustix::fs::FileType::CharacterDevice,
                Mode::from_raw_mode(0o666),
                rustix::fs::makedev(1, 3),
            ))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    // No write permission in ro/.
    let e = same(
        t.fs.create(c, p("/ro/x"), OpenFlags(libc::O_WRONLY), 0o644),
        native_as(c, || {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(t.n("/ro/x"))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    let e = same(
        t.fs.mkdir(c, p("/ro/d"), 0o755),
        native_as(c, || std::fs::create_dir(t.n("/ro/d"))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    // setgid directory: new entries take its group, subdirs keep setgid
    // (as a root caller with gid 0: the group still comes from the dir).
    let user_ctx = Ctx {
        uid: 0,
        gid: 1000,
        pid: 0,
    };
    let (a, _) =
        t.fs.create(&user_ctx, p("/sg/f"), OpenFlags(libc::O_WRONLY), 0o644)
            .unwrap();
    native_as(&user_ctx, || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(t.n("/sg/f"))
    })
    .unwrap();
    assert_eq!((a.uid, a.gid), (0, 4242));
    let a = t.fs.mkdir(&user_ctx, p("/sg/d"), 0o755).unwrap();
    native_as(&user_ctx, || {
        std::fs::DirBuilder::new().mode(0o755).create(t.n("/sg/d"))
    })
    .unwrap();
    assert_eq!((a.gid, a.perm & 0o2000), (4242, 0o2000));
    // Outside a setgid dir, a root caller's gid is the new file's group.
    let (a, _) =
        t.fs.create(&user_ctx, p("/pub/g"), OpenFlags(libc::O_WRONLY), 0o644)
            .unwrap();
    native_as(&user_ctx, || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(t.n("/pub/g"))
    })
    .unwrap();
    assert_eq!((a.uid, a.gid), (0, 1000));
    t.assert_same_trees();
}

#[test]
fn sticky_dir_and_rename_unlink_rmdir() {
    if !is_root("sticky_dir_and_rename_unlink_rmdir") {
        return;
    }
    let t = Twin::new(perms);
    let c = &NOBODY;
    let e = same(
        t.fs.unlink(c, p("/tmp/ufile")),
        native_as(c, || std::fs::remove_file(t.n("/tmp/ufile"))),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    let e = same(
        t.fs.rename(c, p("/tmp/ufile"), p("/tmp/moved"), RenameFlags::default()),
        native_as(c, || std::fs::rename(t.n("/tmp/ufile"), t.n("/tmp/moved"))),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    // The owner may.
    same(
        t.fs.rename(
            &USER,
            p("/tmp/ufile"),
            p("/tmp/moved"),
            RenameFlags::default(),
        ),
        native_as(&USER, || {
            std::fs::rename(t.n("/tmp/ufile"), t.n("/tmp/moved"))
        }),
    )
    .unwrap();
    same(
        t.fs.unlink(&USER, p("/tmp/moved")),
        native_as(&USER, || std::fs::remove_file(t.n("/tmp/moved"))),
    )
    .unwrap();
    // Non-sticky world-writable dir: anyone may remove.
    same(
        t.fs.rmdir(c, p("/pub/rootempty")),
        native_as(c, || std::fs::remove_dir(t.n("/pub/rootempty"))),
    )
    .unwrap();
    let e = same(
        t.fs.unlink(c, p("/priv/x")),
        native_as(c, || std::fs::remove_file(t.n("/priv/x"))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    // protected_hardlinks: nobody may not link a file it cannot write.
    same(
        t.fs.link(c, p("/secret"), p("/pub/hl")),
        native_as(c, || std::fs::hard_link(t.n("/secret"), t.n("/pub/hl"))),
    )
    .unwrap_err();
    t.assert_same_trees();
}

#[test]
fn setattr_permissions() {
    if !is_root("setattr_permissions") {
        return;
    }
    let t = Twin::new(perms);
    let c = &NOBODY;
    let set = |path: &str, s: SetAttr| t.fs.setattr(c, p(path), &s);
    let e = same(
        set(
            "/rootf",
            SetAttr {
                mode: Some(0o666),
                ..Default::default()
            },
        ),
        native_as(c, || {
            std::fs::set_permissions(t.n("/rootf"), std::fs::Permissions::from_mode(0o666))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    let e = same(
        set(
            "/mine",
            SetAttr {
                uid: Some(1000),
                ..Default::default()
            },
        ),
        native_as(c, || {
            io(rustix::fs::chown(
                t.n("/mine"),
                Some(Uid::from_raw(1000)),
                None,
            ))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    let e = same(
        set(
            "/mine",
            SetAttr {
                gid: Some(4242),
                ..Default::default()
            },
        ),
        native_as(c, || {
            io(rustix::fs::chown(
                t.n("/mine"),
                None,
                Some(Gid::from_raw(4242)),
            ))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    // chown to one's own group (uid -1) clears suid/sgid of an executable.
    let a = set(
        "/suid",
        SetAttr {
            gid: Some(65534),
            ..Default::default()
        },
    )
    .unwrap();
    native_as(c, || {
        io(rustix::fs::chown(
            t.n("/suid"),
            None,
            Some(Gid::from_raw(65534)),
        ))
    })
    .unwrap();
    assert_eq!(a.perm & 0o6000, 0, "suid/sgid cleared: {:o}", a.perm);
    // The owner may chmod, but not set sgid for a group it is not in.
    set(
        "/mine",
        SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    native_as(c, || {
        std::fs::set_permissions(t.n("/mine"), std::fs::Permissions::from_mode(0o600))
    })
    .unwrap();
    let e = same(
        set(
            "/rootf",
            SetAttr {
                size: Some(0),
                ..Default::default()
            },
        ),
        native_as(c, || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(t.n("/rootf"))?
                .set_len(0)
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    same(
        set(
            "/pubw",
            SetAttr {
                size: Some(1),
                ..Default::default()
            },
        ),
        native_as(c, || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(t.n("/pubw"))?
                .set_len(1)
        }),
    )
    .unwrap();
    // utimens: Now needs write access or ownership; explicit times need
    // ownership.
    let now = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
    };
    let at = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        },
    };
    let both_now = SetAttr {
        atime: Some(TimeSet::Now),
        mtime: Some(TimeSet::Now),
        ..Default::default()
    };
    let mtime_at = SetAttr {
        mtime: Some(TimeSet::At(UNIX_EPOCH + Duration::from_secs(1_000_000))),
        ..Default::default()
    };
    for (path, s, ts, want) in [
        ("/rootf", both_now, &now, Some(libc::EACCES)),
        ("/pubw", both_now, &now, None),
        ("/pubw", mtime_at, &at, Some(libc::EPERM)),
        ("/mine", mtime_at, &at, None),
    ] {
        let r = same(
            set(path, s),
            native_as(c, || {
                io(rustix::fs::utimensat(
                    rustix::fs::CWD,
                    t.n(path),
                    ts,
                    AtFlags::empty(),
                ))
            }),
        );
        assert_eq!(r.err(), want, "{path}");
    }
    t.assert_same_trees();
}

#[test]
fn xattr_permissions() {
    if !is_root("xattr_permissions") {
        return;
    }
    let t = Twin::new(perms);
    let c = &NOBODY;
    let u = OsStr::new("user.k");
    let e = same(
        t.fs.setxattr(c, p("/rootf"), u, b"v", 0),
        native_as(c, || {
            io(rustix::fs::lsetxattr(
                t.n("/rootf"),
                u,
                b"v",
                rustix::fs::XattrFlags::empty(),
            ))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    same(
        t.fs.setxattr(c, p("/mine"), u, b"v", 0),
        native_as(c, || {
            io(rustix::fs::lsetxattr(
                t.n("/mine"),
                u,
                b"v",
                rustix::fs::XattrFlags::empty(),
            ))
        }),
    )
    .unwrap();
    assert_eq!(t.fs.getxattr(c, p("/mine"), u).unwrap(), b"v");
    // trusted.* needs CAP_SYS_ADMIN: invisible and unwritable for nobody,
    // although the daemon itself holds the capability.
    let tr = OsStr::new("trusted.root");
    assert_eq!(
        fs_res(t.fs.getxattr(c, p("/mine"), tr)).unwrap_err(),
        libc::ENODATA
    );
    assert!(!t
        .fs
        .listxattr(c, p("/mine"))
        .unwrap()
        .contains(&tr.to_os_string()));
    assert!(t
        .fs
        .listxattr(&ROOT, p("/mine"))
        .unwrap()
        .contains(&tr.to_os_string()));
    let e = same(
        t.fs.setxattr(c, p("/mine"), OsStr::new("trusted.x"), b"v", 0),
        native_as(c, || {
            io(rustix::fs::lsetxattr(
                t.n("/mine"),
                "trusted.x",
                b"v",
                rustix::fs::XattrFlags::empty(),
            ))
        }),
    );
    assert_eq!(e.unwrap_err(), libc::EPERM);
    let e = same(
        t.fs.getxattr(c, p("/priv/x"), u),
        native_as(c, || io(rustix::fs::lgetxattr_query(t.n("/priv/x"), u))),
    );
    assert_eq!(e.unwrap_err(), libc::EACCES);
    t.assert_same_trees();
}

/// A helper process whose supplementary groups include 4242, so the daemon
/// reads them from /proc/<pid>/status. Killed on drop.
struct GroupedProcess(std::process::Child);

impl Drop for GroupedProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn supplementary_groups_from_proc() {
    if !is_root("supplementary_groups_from_proc") {
        return;
    }
    let child = match std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--groups=4242",
            "sleep",
            "60",
        ])
        .spawn()
    {
        Ok(c) => GroupedProcess(c),
        Err(e) => {
            eprintln!("SKIPPED supplementary_groups_from_proc: setpriv: {e}");
            return;
        }
    };
    // Wait until the child has switched credentials (no timing: poll the
    // state it must reach).
    let pid = child.0.id();
    loop {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        if s.lines()
            .any(|l| l.starts_with("Groups:") && l.contains("4242"))
            && s.contains("Name:\tsleep")
        {
            break;
        }
        std::thread::yield_now();
    }
    let t = Twin::new(perms);
    let with_groups = Ctx {
        uid: 65534,
        gid: 65534,
        pid,
    };
    let o =
        t.fs.open(&with_groups, p("/grp"), OpenFlags(libc::O_RDONLY))
            .unwrap();
    assert_eq!(o.files.len(), 1);
    assert_eq!(
        fs_res(t.fs.open(&NOBODY, p("/grp"), OpenFlags(libc::O_RDONLY))).unwrap_err(),
        libc::EACCES
    );
    // Group 4242 may write into sg/ (mode 2775).
    let (a, _) =
        t.fs.create(&with_groups, p("/sg/byg"), OpenFlags(libc::O_WRONLY), 0o644)
            .unwrap();
    assert_eq!((a.uid, a.gid), (65534, 4242));
    // A pid that belongs to someone else (uid mismatch) does not lend its
    // groups.
    let liar = Ctx {
        uid: 1000,
        gid: 1000,
        pid,
    };
    assert_eq!(
        fs_res(t.fs.open(&liar, p("/grp"), OpenFlags(libc::O_RDONLY))).unwrap_err(),
        libc::EACCES
    );
}
