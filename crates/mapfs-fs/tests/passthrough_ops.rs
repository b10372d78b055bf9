//! Every passthrough operation against the same operation done natively on
//! a twin directory, as root: results (values or errno) and final trees.

mod common;

use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use mapfs::{FileKind, FileSystem, OpenFlags, RenameFlags, SetAttr, TimeSet};
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps};

/// a/ (dir), a/f ("hello", 0644), a/sub/ , l -> a/f, e/ (empty dir)
fn basic(d: &Path) {
    std::fs::create_dir(d.join("a")).unwrap();
    std::fs::write(d.join("a/f"), b"hello").unwrap();
    std::fs::set_permissions(d.join("a/f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(d.join("a/sub")).unwrap();
    std::fs::write(d.join("a/sub/g"), b"g").unwrap();
    std::os::unix::fs::symlink("a/f", d.join("l")).unwrap();
    std::fs::create_dir(d.join("e")).unwrap();
}

fn check_attr_matches(attr: &mapfs::Attr, host: &Path) {
    let md = std::fs::symlink_metadata(host).unwrap();
    assert_eq!(attr.ino, md.ino());
    assert_eq!(attr.size, md.len());
    assert_eq!(attr.blocks, md.blocks());
    assert_eq!(u32::from(attr.perm), md.mode() & 0o7777);
    assert_eq!(attr.kind, FileKind::from_mode(md.mode()));
    assert_eq!(u64::from(attr.nlink), md.nlink());
    assert_eq!((attr.uid, attr.gid), (md.uid(), md.gid()));
    assert_eq!(attr.rdev, md.rdev());
    assert_eq!(attr.mtime, md.modified().unwrap());
    assert_eq!(attr.atime, md.accessed().unwrap());
    assert_eq!(u64::from(attr.blksize), md.blksize());
}

#[test]
fn getattr_matches_lstat() {
    let t = Twin::new(basic);
    for path in ["/", "/a", "/a/f", "/l", "/e", "/a/sub/g"] {
        let a = t.fs.getattr(&ROOT, p(path)).unwrap();
        check_attr_matches(&a, &t.m(path));
    }
    assert_eq!(
        t.fs.getattr(&ROOT, p("/l")).unwrap().kind,
        FileKind::Symlink
    );
    assert_eq!(t.fs.getattr(&ROOT, p("/")).unwrap().kind, FileKind::Dir);
    for path in ["/nope", "/a/f/x", "/a/nope/x"] {
        same(
            t.fs.getattr(&ROOT, p(path)),
            io_res(std::fs::symlink_metadata(t.n(path))),
        )
        .unwrap_err();
    }
    assert_eq!(
        fs_res(t.fs.getattr(&ROOT, p("/nope"))).unwrap_err(),
        libc::ENOENT
    );
    assert_eq!(
        fs_res(t.fs.getattr(&ROOT, p("/a/f/x"))).unwrap_err(),
        libc::ENOTDIR
    );
}

#[test]
fn chmod_chown_truncate() {
    let t = Twin::new(basic);
    let set = |s: SetAttr, path: &str| t.fs.setattr(&ROOT, p(path), &s);
    // chmod, including suid/sgid/sticky bits.
    let a = set(
        SetAttr {
            mode: Some(0o4751),
            ..Default::default()
        },
        "/a/f",
    )
    .unwrap();
    std::fs::set_permissions(t.n("/a/f"), std::fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(a.perm, 0o4751);
    // chown uid only, then gid only (-1 for the other).
    let a = set(
        SetAttr {
            uid: Some(1000),
            ..Default::default()
        },
        "/a/f",
    )
    .unwrap();
    rustix::fs::chown(
        t.n("/a/f"),
        Some(rustix::process::Uid::from_raw(1000)),
        None,
    )
    .unwrap();
    assert_eq!((a.uid, a.gid), (1000, 0));
    // The kernel cleared suid on chown, on both sides.
    assert_eq!(a.perm & 0o4000, 0);
    let a = set(
        SetAttr {
            gid: Some(1000),
            ..Default::default()
        },
        "/a/f",
    )
    .unwrap();
    rustix::fs::chown(
        t.n("/a/f"),
        None,
        Some(rustix::process::Gid::from_raw(1000)),
    )
    .unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000));
    // Combined chown + chmod: the asked mode wins, suid included.
    let a = set(
        SetAttr {
            uid: Some(0),
            gid: Some(0),
            mode: Some(0o6755),
            ..Default::default()
        },
        "/a/sub/g",
    )
    .unwrap();
    assert_eq!(a.perm, 0o6755);
    std::fs::set_permissions(t.n("/a/sub/g"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    // truncate: grow, shrink.
    let a = set(
        SetAttr {
            size: Some(100),
            ..Default::default()
        },
        "/a/f",
    )
    .unwrap();
    assert_eq!(a.size, 100);
    let a = set(
        SetAttr {
            size: Some(2),
            ..Default::default()
        },
        "/a/f",
    )
    .unwrap();
    assert_eq!(a.size, 2);
    std::fs::OpenOptions::new()
        .write(true)
        .open(t.n("/a/f"))
        .unwrap()
        .set_len(2)
        .unwrap();
    // Errors as native: truncating a directory, a missing file.
    same(
        set(
            SetAttr {
                size: Some(0),
                ..Default::default()
            },
            "/a",
        ),
        io_res(
            std::fs::OpenOptions::new()
                .write(true)
                .open(t.n("/a"))
                .and_then(|f| f.set_len(0)),
        ),
    )
    .unwrap_err();
    same(
        set(
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
            "/zz",
        ),
        io_res(std::fs::set_permissions(
            t.n("/zz"),
            std::fs::Permissions::from_mode(0o600),
        )),
    )
    .unwrap_err();
    // chmod of a symlink is not possible on Linux (and must not reach the
    // target): EOPNOTSUPP, target unchanged.
    assert_eq!(
        fs_res(set(
            SetAttr {
                mode: Some(0o777),
                ..Default::default()
            },
            "/l"
        ))
        .unwrap_err(),
        libc::EOPNOTSUPP
    );
    // chown of a symlink changes the link (lchown), not the target.
    set(
        SetAttr {
            uid: Some(1000),
            ..Default::default()
        },
        "/l",
    )
    .unwrap();
    rustix::fs::chownat(
        rustix::fs::CWD,
        t.n("/l"),
        Some(rustix::process::Uid::from_raw(1000)),
        None,
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    // chmod of the root.
    set(
        SetAttr {
            mode: Some(0o755),
            ..Default::default()
        },
        "/",
    )
    .unwrap();
    std::fs::set_permissions(&t.native, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(std::fs::metadata(&t.mirror).unwrap().mode() & 0o7777, 0o755);
    t.assert_same_trees();
}

#[test]
fn utimens_at_now_and_omit() {
    let t = Twin::new(basic);
    let at = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let before = t.fs.getattr(&ROOT, p("/a/f")).unwrap();
    // mtime only: atime omitted.
    let a =
        t.fs.setattr(
            &ROOT,
            p("/a/f"),
            &SetAttr {
                mtime: Some(TimeSet::At(at)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mtime, at);
    assert_eq!(a.atime, before.atime);
    // atime only, before the epoch.
    let old = UNIX_EPOCH - Duration::new(86_400, 250_000_000);
    let a =
        t.fs.setattr(
            &ROOT,
            p("/a/f"),
            &SetAttr {
                atime: Some(TimeSet::At(old)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.atime, old);
    assert_eq!(a.mtime, at);
    check_attr_matches(&a, &t.m("/a/f"));
    // Now for both: the kernel's clock, between two readings of ours.
    let t0 = SystemTime::now() - Duration::from_secs(1);
    let a =
        t.fs.setattr(
            &ROOT,
            p("/a/f"),
            &SetAttr {
                atime: Some(TimeSet::Now),
                mtime: Some(TimeSet::Now),
                ..Default::default()
            },
        )
        .unwrap();
    let t1 = SystemTime::now() + Duration::from_secs(1);
    assert!(a.mtime > t0 && a.mtime < t1 && a.atime > t0 && a.atime < t1);
    // Times of a symlink are the link's own (not followed).
    let target_before = std::fs::metadata(t.m("/a/f")).unwrap().modified().unwrap();
    let a =
        t.fs.setattr(
            &ROOT,
            p("/l"),
            &SetAttr {
                mtime: Some(TimeSet::At(at)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mtime, at);
    assert_eq!(
        std::fs::metadata(t.m("/a/f")).unwrap().modified().unwrap(),
        target_before
    );
    // Native utimensat on a missing file: same errno.
    let ts = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        },
    };
    same(
        t.fs.setattr(
            &ROOT,
            p("/zz"),
            &SetAttr {
                mtime: Some(TimeSet::At(at)),
                ..Default::default()
            },
        ),
        io_res(
            rustix::fs::utimensat(rustix::fs::CWD, t.n("/zz"), &ts, AtFlags::empty())
                .map_err(std::io::Error::from),
        ),
    )
    .unwrap_err();
}

#[test]
fn readdir_lists_with_attrs() {
    let t = Twin::new(basic);
    for dir in ["/", "/a", "/e"] {
        let mut got: Vec<_> = t.fs.readdir(&ROOT, p(dir)).unwrap();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        let mut want: Vec<OsString> = std::fs::read_dir(t.n(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        want.sort();
        assert_eq!(got.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), want);
        for e in &got {
            let full = format!("{}/{}", dir.trim_end_matches('/'), e.name.to_str().unwrap());
            let attr = e.attr.expect("readdirplus attr");
            assert_eq!(attr, t.fs.getattr(&ROOT, p(&full)).unwrap());
            assert_eq!((e.ino, e.kind), (attr.ino, attr.kind));
        }
    }
    for path in ["/a/f", "/nope", "/l"] {
        let native = io_res(std::fs::read_dir(t.n(path)));
        let fs = fs_res(t.fs.readdir(&ROOT, p(path)));
        if path == "/l" {
            // A symlink to a file: natively ENOTDIR (followed); the mirror
            // never follows: ELOOP or ENOTDIR, never a listing.
            assert!(fs.is_err());
        } else {
            assert_eq!(fs.map(|_| ()), native.map(|_| ()));
        }
    }
}

#[test]
fn readlink_symlink_mknod_mkdir() {
    let t = Twin::new(basic);
    assert_eq!(t.fs.readlink(&ROOT, p("/l")).unwrap(), "a/f");
    same(
        t.fs.readlink(&ROOT, p("/a/f")),
        io_res(std::fs::read_link(t.n("/a/f"))),
    )
    .unwrap_err();
    // symlink with a target stored verbatim (even an absolute one).
    let a =
        t.fs.symlink(&ROOT, OsStr::new("/etc/passwd"), p("/abs"))
            .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", t.n("/abs")).unwrap();
    assert_eq!(a.kind, FileKind::Symlink);
    assert_eq!(a.size, "/etc/passwd".len() as u64);
    same(
        t.fs.symlink(&ROOT, OsStr::new("x"), p("/a/f")),
        io_res(std::os::unix::fs::symlink("x", t.n("/a/f"))),
    )
    .unwrap_err();
    // mknod: fifo, socket, regular (type 0 and S_IFREG), char device.
    for (name, mode, rdev) in [
        ("/fifo", libc::S_IFIFO | 0o640, 0),
        ("/sock", libc::S_IFSOCK | 0o600, 0),
        ("/reg", 0o604, 0),
        ("/reg2", libc::S_IFREG | 0o600, 0),
        ("/null", libc::S_IFCHR | 0o666, rustix::fs::makedev(1, 3)),
    ] {
        let a = t.fs.mknod(&ROOT, p(name), mode, rdev).unwrap();
        let ft = match mode & libc::S_IFMT {
            0 => rustix::fs::FileType::RegularFile,
            m => rustix::fs::FileType::from_raw_mode(m),
        };
        rustix::fs::mknodat(
            rustix::fs::CWD,
            t.n(name),
            ft,
            Mode::from_raw_mode(mode & 0o7777),
            rdev,
        )
        .unwrap();
        check_attr_matches(&a, &t.m(name));
        assert_eq!(a.perm as u32, mode & 0o7777);
    }
    assert_eq!(
        t.fs.getattr(&ROOT, p("/null")).unwrap().kind,
        FileKind::CharDev
    );
    same(
        t.fs.mknod(&ROOT, p("/fifo"), libc::S_IFIFO | 0o600, 0),
        io_res(
            rustix::fs::mkfifoat(rustix::fs::CWD, t.n("/fifo"), Mode::from_raw_mode(0o600))
                .map_err(Into::into),
        ),
    )
    .unwrap_err();
    // mkdir: mode as given (umask already applied by the caller).
    let a = t.fs.mkdir(&ROOT, p("/d"), 0o750).unwrap();
    std::fs::DirBuilder::new()
        .mode(0o750)
        .create(t.n("/d"))
        .unwrap();
    assert_eq!((a.kind, a.perm), (FileKind::Dir, 0o750));
    for path in ["/d", "/nope/d", "/a/f/d"] {
        same(
            t.fs.mkdir(&ROOT, p(path), 0o755),
            io_res(std::fs::DirBuilder::new().mode(0o755).create(t.n(path))),
        )
        .unwrap_err();
    }
    t.assert_same_trees();
}

#[test]
fn unlink_rmdir_errors_as_native() {
    let t = Twin::new(basic);
    for path in ["/a/sub/g", "/nope", "/a", "/l"] {
        let r = same(
            t.fs.unlink(&ROOT, p(path)),
            io_res(std::fs::remove_file(t.n(path))),
        );
        if path == "/a" {
            assert_eq!(r.unwrap_err(), libc::EISDIR);
        }
    }
    for path in ["/a", "/a/f", "/e", "/nope"] {
        let r = same(
            t.fs.rmdir(&ROOT, p(path)),
            io_res(std::fs::remove_dir(t.n(path))),
        );
        match path {
            "/a" => assert_eq!(r.unwrap_err(), libc::ENOTEMPTY),
            "/a/f" => assert_eq!(r.unwrap_err(), libc::ENOTDIR),
            "/e" => r.unwrap(),
            _ => assert_eq!(r.unwrap_err(), libc::ENOENT),
        }
    }
    t.assert_same_trees();
}

fn rename_native(
    t: &Twin,
    from: &str,
    to: &str,
    flags: rustix::fs::RenameFlags,
) -> Result<(), i32> {
    io_res(
        rustix::fs::renameat_with(rustix::fs::CWD, t.n(from), rustix::fs::CWD, t.n(to), flags)
            .map_err(std::io::Error::from),
    )
}

#[test]
fn rename_plain_noreplace_exchange() {
    use rustix::fs::RenameFlags as R;
    let t = Twin::new(basic);
    let none = RenameFlags::default();
    let noreplace = RenameFlags {
        noreplace: true,
        ..Default::default()
    };
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    let both = RenameFlags {
        noreplace: true,
        exchange: true,
    };
    let cases: &[(&str, &str, RenameFlags, R, Option<i32>)] = &[
        ("/a/f", "/f2", none, R::empty(), None),
        (
            "/f2",
            "/a/sub/g",
            noreplace,
            R::NOREPLACE,
            Some(libc::EEXIST),
        ),
        ("/f2", "/l", exchange, R::EXCHANGE, None),
        (
            "/l",
            "/e",
            both,
            R::NOREPLACE | R::EXCHANGE,
            Some(libc::EINVAL),
        ),
        ("/e", "/a", none, R::empty(), Some(libc::ENOTEMPTY)),
        ("/nope", "/x", none, R::empty(), Some(libc::ENOENT)),
        ("/e", "/a/sub/g", none, R::empty(), Some(libc::ENOTDIR)),
        ("/a", "/a/sub/inside", none, R::empty(), Some(libc::EINVAL)),
        ("/e", "/nope/x", exchange, R::EXCHANGE, Some(libc::ENOENT)),
        ("/a/sub", "/e", none, R::empty(), None),
    ];
    for (from, to, f, nf, want) in cases {
        let r = same(
            t.fs.rename(&ROOT, p(from), p(to), *f),
            rename_native(&t, from, to, *nf),
        );
        assert_eq!(r.err(), *want, "{from} -> {to}");
    }
    t.assert_same_trees();
}

#[test]
fn hard_links_share_ino_and_attrs() {
    let t = Twin::new(basic);
    let a = t.fs.link(&ROOT, p("/a/f"), p("/hl")).unwrap();
    std::fs::hard_link(t.n("/a/f"), t.n("/hl")).unwrap();
    let orig = t.fs.getattr(&ROOT, p("/a/f")).unwrap();
    assert_eq!((a.ino, a.nlink, orig.nlink), (orig.ino, 2, 2));
    // A change through one name shows through the other.
    t.fs.setattr(
        &ROOT,
        p("/hl"),
        &SetAttr {
            mode: Some(0o600),
            uid: Some(1000),
            ..Default::default()
        },
    )
    .unwrap();
    let via_orig = t.fs.getattr(&ROOT, p("/a/f")).unwrap();
    assert_eq!((via_orig.perm, via_orig.uid), (0o600, 1000));
    std::fs::set_permissions(t.n("/a/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    rustix::fs::chown(t.n("/hl"), Some(rustix::process::Uid::from_raw(1000)), None).unwrap();
    // Linking a symlink links the link.
    let a = t.fs.link(&ROOT, p("/l"), p("/l2")).unwrap();
    assert_eq!(a.kind, FileKind::Symlink);
    rustix::fs::linkat(
        rustix::fs::CWD,
        t.n("/l"),
        rustix::fs::CWD,
        t.n("/l2"),
        AtFlags::empty(),
    )
    .unwrap();
    for (from, to) in [("/a/f", "/hl"), ("/nope", "/x"), ("/a", "/dirlink")] {
        same(
            t.fs.link(&ROOT, p(from), p(to)),
            io_res(std::fs::hard_link(t.n(from), t.n(to))),
        )
        .unwrap_err();
    }
    // Removing one name keeps the other.
    t.fs.unlink(&ROOT, p("/a/f")).unwrap();
    std::fs::remove_file(t.n("/a/f")).unwrap();
    assert_eq!(t.fs.getattr(&ROOT, p("/hl")).unwrap().nlink, 1);
    t.assert_same_trees();
}

#[test]
fn statfs_matches_statvfs() {
    let t = Twin::new(basic);
    let s = t.fs.statfs(&ROOT, p("/a")).unwrap();
    let n = rustix::fs::statvfs(&t.mirror).unwrap();
    assert_eq!((s.blocks, s.files), (n.f_blocks, n.f_files));
    assert_eq!(
        (s.bsize as u64, s.frsize as u64, s.namelen as u64),
        (n.f_bsize, n.f_frsize, n.f_namemax)
    );
    same(
        t.fs.statfs(&ROOT, p("/nope")),
        io_res(rustix::fs::statvfs(t.n("/nope")).map_err(std::io::Error::from)),
    )
    .unwrap_err();
}

#[test]
fn xattrs_set_get_list_remove() {
    let t = Twin::new(basic);
    let name = OsStr::new("user.mapfs");
    let x = |r: rustix::io::Result<()>| io_res(r.map_err(std::io::Error::from));
    for path in ["/a/f", "/a", "/"] {
        t.fs.setxattr(&ROOT, p(path), name, b"v1", 0).unwrap();
        rustix::fs::lsetxattr(t.n(path), name, b"v1", rustix::fs::XattrFlags::empty()).unwrap();
        assert_eq!(t.fs.getxattr(&ROOT, p(path), name).unwrap(), b"v1");
        assert!(t
            .fs
            .listxattr(&ROOT, p(path))
            .unwrap()
            .contains(&name.to_os_string()));
        // XATTR_CREATE on an existing one.
        let r = same(
            t.fs.setxattr(&ROOT, p(path), name, b"v2", libc::XATTR_CREATE),
            x(rustix::fs::lsetxattr(
                t.n(path),
                name,
                b"v2",
                rustix::fs::XattrFlags::CREATE,
            )),
        );
        assert_eq!(r.unwrap_err(), libc::EEXIST);
    }
    // XATTR_REPLACE on a missing one; get / remove a missing one.
    let other = OsStr::new("user.other");
    let r = same(
        t.fs.setxattr(&ROOT, p("/a/f"), other, b"v", libc::XATTR_REPLACE),
        x(rustix::fs::lsetxattr(
            t.n("/a/f"),
            other,
            b"v",
            rustix::fs::XattrFlags::REPLACE,
        )),
    );
    assert_eq!(r.unwrap_err(), libc::ENODATA);
    assert_eq!(
        fs_res(t.fs.getxattr(&ROOT, p("/a/f"), other)).unwrap_err(),
        libc::ENODATA
    );
    same(
        t.fs.removexattr(&ROOT, p("/a/f"), other),
        x(rustix::fs::lremovexattr(t.n("/a/f"), other)),
    )
    .unwrap_err();
    // A big value round-trips.
    let big = vec![7u8; 3000];
    t.fs.setxattr(&ROOT, p("/a/sub/g"), name, &big, 0).unwrap();
    rustix::fs::lsetxattr(t.n("/a/sub/g"), name, &big, rustix::fs::XattrFlags::empty()).unwrap();
    assert_eq!(t.fs.getxattr(&ROOT, p("/a/sub/g"), name).unwrap(), big);
    // On a symlink: user.* is refused (EPERM) natively; the target is
    // untouched.
    let r = same(
        t.fs.setxattr(&ROOT, p("/l"), other, b"v", 0),
        x(rustix::fs::lsetxattr(
            t.n("/l"),
            other,
            b"v",
            rustix::fs::XattrFlags::empty(),
        )),
    );
    assert_eq!(r.unwrap_err(), libc::EPERM);
    assert_eq!(
        fs_res(t.fs.getxattr(&ROOT, p("/l"), name)).unwrap_err(),
        libc::ENODATA
    );
    // trusted.* works for root.
    let tr = OsStr::new("trusted.mapfs");
    t.fs.setxattr(&ROOT, p("/a/f"), tr, b"t", 0).unwrap();
    assert_eq!(t.fs.getxattr(&ROOT, p("/a/f"), tr).unwrap(), b"t");
    t.fs.removexattr(&ROOT, p("/a/f"), tr).unwrap();
    // remove.
    t.fs.removexattr(&ROOT, p("/a"), name).unwrap();
    rustix::fs::lremovexattr(t.n("/a"), name).unwrap();
    assert!(!t
        .fs
        .listxattr(&ROOT, p("/a"))
        .unwrap()
        .contains(&name.to_os_string()));
    t.assert_same_trees();
}

#[test]
fn access_as_native() {
    let t = Twin::new(basic);
    std::fs::write(t.m("/x"), b"").unwrap();
    std::fs::set_permissions(t.m("/x"), std::fs::Permissions::from_mode(0o644)).unwrap();
    for (path, mask) in [
        ("/a/f", libc::R_OK | libc::W_OK),
        ("/a/f", libc::X_OK),
        ("/x", libc::X_OK),
        ("/a", libc::X_OK),
        ("/nope", libc::F_OK),
        ("/a/f", libc::F_OK),
    ] {
        let native = io_res(
            rustix::fs::accessat(
                rustix::fs::CWD,
                t.m(path),
                rustix::fs::Access::from_bits_retain(mask as u32),
                AtFlags::EACCESS,
            )
            .map_err(std::io::Error::from),
        );
        same(t.fs.access(&ROOT, p(path), mask), native).ok();
    }
    // Root has no X_OK on a file without any x bit.
    assert_eq!(
        fs_res(t.fs.access(&ROOT, p("/x"), libc::X_OK)).unwrap_err(),
        libc::EACCES
    );
}

fn file_of(o: &mapfs::Opened) -> std::fs::File {
    assert!(o.map.is_whole_file());
    assert_eq!(o.files.len(), 1);
    o.files[0].try_clone().unwrap()
}

#[test]
fn open_modes_and_flags() {
    let t = Twin::new(basic);
    // O_RDONLY: readable, not writable.
    let o =
        t.fs.open(&ROOT, p("/a/f"), OpenFlags(libc::O_RDONLY))
            .unwrap();
    let mut f = file_of(&o);
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello");
    assert_eq!(f.write(b"x").unwrap_err().raw_os_error(), Some(libc::EBADF));
    // The backing file is the file itself.
    assert_eq!(
        f.metadata().unwrap().ino(),
        std::fs::metadata(t.m("/a/f")).unwrap().ino()
    );
    // O_WRONLY: exactly that access mode.
    let o =
        t.fs.open(&ROOT, p("/a/f"), OpenFlags(libc::O_WRONLY))
            .unwrap();
    let fl = rustix::fs::fcntl_getfl(&*o.files[0]).unwrap();
    assert_eq!(fl & rustix::fs::OFlags::RWMODE, rustix::fs::OFlags::WRONLY);
    assert!(
        fl.contains(rustix::fs::OFlags::CLOEXEC)
            || rustix::io::fcntl_getfd(&*o.files[0])
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
    );
    // O_APPEND is kept.
    let o =
        t.fs.open(&ROOT, p("/a/f"), OpenFlags(libc::O_WRONLY | libc::O_APPEND))
            .unwrap();
    let mut f = file_of(&o);
    assert!(rustix::fs::fcntl_getfl(&f)
        .unwrap()
        .contains(rustix::fs::OFlags::APPEND));
    f.write_all(b"!").unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(t.n("/a/f"))
        .unwrap()
        .write_all(b"!")
        .unwrap();
    // O_RDWR | O_TRUNC truncates.
    let o =
        t.fs.open(
            &ROOT,
            p("/a/sub/g"),
            OpenFlags(libc::O_RDWR | libc::O_TRUNC),
        )
        .unwrap();
    let mut f = file_of(&o);
    assert_eq!(f.metadata().unwrap().len(), 0);
    f.write_all(b"new").unwrap();
    f.rewind().unwrap();
    std::fs::write(t.n("/a/sub/g"), b"new").unwrap();
    // O_CREAT / O_EXCL are stripped: open never creates.
    let r = t.fs.open(
        &ROOT,
        p("/created"),
        OpenFlags(libc::O_RDWR | libc::O_CREAT | libc::O_EXCL),
    );
    assert_eq!(fs_res(r).unwrap_err(), libc::ENOENT);
    // A final symlink is not followed.
    assert_eq!(
        fs_res(t.fs.open(&ROOT, p("/l"), OpenFlags(libc::O_RDONLY))).unwrap_err(),
        libc::ELOOP
    );
    // Errors as native.
    for path in ["/nope", "/a/f/x"] {
        same(
            t.fs.open(&ROOT, p(path), OpenFlags(libc::O_RDONLY)),
            io_res(std::fs::File::open(t.n(path))),
        )
        .unwrap_err();
    }
    same(
        t.fs.open(&ROOT, p("/a"), OpenFlags(libc::O_RDWR)),
        io_res(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(t.n("/a")),
        ),
    )
    .unwrap_err();
    t.fs.release(&ROOT, p("/a/f"), o.handle, &o.map).unwrap();
    t.assert_same_trees();
}

#[test]
fn create_modes_excl_and_existing() {
    let t = Twin::new(basic);
    let (a, o) =
        t.fs.create(
            &ROOT,
            p("/new"),
            OpenFlags(libc::O_WRONLY | libc::O_EXCL),
            0o640,
        )
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(t.n("/new"))
        .unwrap();
    assert_eq!(
        (a.kind, a.perm, a.size, a.nlink),
        (FileKind::File, 0o640, 0, 1)
    );
    check_attr_matches(&a, &t.m("/new"));
    let fl = rustix::fs::fcntl_getfl(&*o.files[0]).unwrap();
    assert_eq!(fl & rustix::fs::OFlags::RWMODE, rustix::fs::OFlags::WRONLY);
    file_of(&o).write_all(b"data").unwrap();
    std::fs::write(t.n("/new"), b"data").unwrap();
    // A read-only mode still gives a writable fd at creation, as natively.
    let (a, o) =
        t.fs.create(&ROOT, p("/ro"), OpenFlags(libc::O_RDWR), 0o444)
            .unwrap();
    assert_eq!(a.perm, 0o444);
    file_of(&o).write_all(b"x").unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o444)
        .open(t.n("/ro"))
        .unwrap()
        .write_all(b"x")
        .unwrap();
    // O_EXCL on an existing file.
    let r = same(
        t.fs.create(
            &ROOT,
            p("/a/f"),
            OpenFlags(libc::O_RDWR | libc::O_EXCL),
            0o600,
        ),
        io_res(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(t.n("/a/f")),
        ),
    );
    assert_eq!(r.unwrap_err(), libc::EEXIST);
    // Without O_EXCL: opens (and with O_TRUNC truncates) the existing file,
    // mode untouched.
    let (a, _) =
        t.fs.create(
            &ROOT,
            p("/a/f"),
            OpenFlags(libc::O_RDWR | libc::O_TRUNC),
            0o600,
        )
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(t.n("/a/f"))
        .unwrap();
    assert_eq!((a.size, a.perm), (0, 0o644));
    // Missing parent, parent is a file.
    for path in ["/nope/x", "/a/sub/g/x"] {
        same(
            t.fs.create(&ROOT, p(path), OpenFlags(libc::O_RDWR), 0o600),
            io_res(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(t.n(path)),
            ),
        )
        .unwrap_err();
    }
    t.assert_same_trees();
}

#[test]
fn fsyncdir_and_release() {
    let t = Twin::new(basic);
    t.fs.fsyncdir(&ROOT, p("/a"), false).unwrap();
    t.fs.fsyncdir(&ROOT, p("/"), true).unwrap();
    assert_eq!(
        fs_res(t.fs.fsyncdir(&ROOT, p("/nope"), false)).unwrap_err(),
        libc::ENOENT
    );
    assert_eq!(
        fs_res(t.fs.fsyncdir(&ROOT, p("/a/f"), false)).unwrap_err(),
        libc::ENOTDIR
    );
}

#[test]
fn new_refuses_a_missing_backing_dir() {
    let t = Twin::new(basic);
    let fs = mapfs_fs::passthrough::Passthrough::new(&t.mirror).unwrap();
    assert_eq!(fs.getattr(&ROOT, p("/a/f")).unwrap().size, 5);
    assert_eq!(
        mapfs_fs::passthrough::Passthrough::new(&t.m("/nope"))
            .err()
            .unwrap()
            .errno(),
        libc::ENOENT
    );
}
