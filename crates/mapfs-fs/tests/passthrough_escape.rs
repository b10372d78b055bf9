//! Nothing outside the backing directory is reachable through the
//! passthrough: `..`, absolute and relative symlinks, final symlinks for
//! every mutating operation; plus paths longer than PATH_MAX and EXDEV
//! across a mount inside the backing directory.

mod common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use common::*;
use mapfs::{FileSystem, OpenFlags, RenameFlags, SetAttr, TimeSet};

struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    fs: mapfs_fs::passthrough::Passthrough,
}

/// What must never change: the outside tree's observable state.
fn outside_state(o: &Path) -> Vec<(PathBuf, u32, u32, u64, i64, Vec<u8>)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(o).unwrap() {
        let p = e.unwrap().path();
        let md = std::fs::symlink_metadata(&p).unwrap();
        let data = if md.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        v.push((p, md.mode(), md.uid(), md.len(), md.mtime(), data));
    }
    v.sort();
    v
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    std::fs::set_permissions(
        outside.join("secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), b"inside").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
    std::os::unix::fs::symlink("../outside", root.join("rel")).unwrap();
    std::os::unix::fs::symlink("../../outside", root.join("d/rel2")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("sec")).unwrap();
    std::os::unix::fs::symlink("../outside/secret", root.join("relsec")).unwrap();
    std::os::unix::fs::symlink("../outside/newfile", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("pw")).unwrap();
    let fs = mapfs_fs::passthrough::Passthrough::new(&root).unwrap();
    Fx {
        _tmp: tmp,
        root,
        outside,
        fs,
    }
}

const THROUGH: &[&str] = &[
    "/abs/secret",
    "/rel/secret",
    "/d/rel2/secret",
    "/../outside/secret",
    "/d/../../outside/secret",
];

#[test]
fn lookups_through_links_and_dotdot_are_refused() {
    let f = fx();
    let before = outside_state(&f.outside);
    let c = &ROOT;
    for path in THROUGH {
        let path = p(path);
        let e = |r: mapfs::Result<()>| fs_res(r).unwrap_err();
        assert_eq!(
            e(f.fs.getattr(c, path).map(|_| ())),
            libc::EXDEV,
            "{path:?}"
        );
        assert_eq!(
            e(f.fs.open(c, path, OpenFlags(libc::O_RDONLY)).map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs
                .open(c, path, OpenFlags(libc::O_RDWR | libc::O_TRUNC))
                .map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(e(f.fs.access(c, path, libc::R_OK)), libc::EXDEV);
        assert_eq!(e(f.fs.readlink(c, path).map(|_| ())), libc::EXDEV);
        assert_eq!(e(f.fs.unlink(c, path)), libc::EXDEV);
        assert_eq!(
            e(f.fs
                .setattr(
                    c,
                    path,
                    &SetAttr {
                        size: Some(0),
                        ..Default::default()
                    }
                )
                .map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs
                .setattr(
                    c,
                    path,
                    &SetAttr {
                        mode: Some(0o777),
                        ..Default::default()
                    }
                )
                .map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs
                .setattr(
                    c,
                    path,
                    &SetAttr {
                        uid: Some(1000),
                        ..Default::default()
                    }
                )
                .map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.setxattr(c, path, OsStr::new("user.x"), b"v", 0)),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.getxattr(c, path, OsStr::new("user.x")).map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.removexattr(c, path, OsStr::new("user.x"))),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.rename(c, path, p("/stolen"), RenameFlags::default())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.rename(c, p("/d/f"), path, RenameFlags::default())),
            libc::EXDEV
        );
        assert_eq!(e(f.fs.link(c, path, p("/stolen")).map(|_| ())), libc::EXDEV);
        assert_eq!(e(f.fs.link(c, p("/d/f"), path).map(|_| ())), libc::EXDEV);
        let newp = path.with_file_name("new");
        assert_eq!(
            e(f.fs
                .create(c, &newp, OpenFlags(libc::O_RDWR), 0o644)
                .map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(e(f.fs.mkdir(c, &newp, 0o755).map(|_| ())), libc::EXDEV);
        assert_eq!(
            e(f.fs.mknod(c, &newp, libc::S_IFIFO | 0o644, 0).map(|_| ())),
            libc::EXDEV
        );
        assert_eq!(
            e(f.fs.symlink(c, OsStr::new("x"), &newp).map(|_| ())),
            libc::EXDEV
        );
    }
    for dir in ["/abs", "/rel", "/..", "/d/../.."] {
        assert!(f.fs.readdir(c, p(dir)).is_err(), "{dir}");
        assert!(f.fs.rmdir(c, p(dir)).is_err(), "{dir}");
        assert!(f.fs.fsyncdir(c, p(dir), false).is_err(), "{dir}");
    }
    assert_eq!(outside_state(&f.outside), before);
    assert!(f.outside.join("secret").exists());
}

#[test]
fn final_symlinks_are_never_followed() {
    let f = fx();
    let before = outside_state(&f.outside);
    let passwd = std::fs::metadata("/etc/passwd").unwrap();
    let c = &ROOT;
    for link in ["/sec", "/relsec", "/pw"] {
        let l = p(link);
        assert_eq!(
            fs_res(f.fs.open(c, l, OpenFlags(libc::O_RDONLY))).unwrap_err(),
            libc::ELOOP
        );
        assert_eq!(
            fs_res(f.fs.open(c, l, OpenFlags(libc::O_WRONLY | libc::O_TRUNC))).unwrap_err(),
            libc::ELOOP
        );
        assert!(f
            .fs
            .create(c, l, OpenFlags(libc::O_WRONLY | libc::O_TRUNC), 0o644)
            .is_err());
        assert_eq!(
            fs_res(f.fs.setattr(
                c,
                l,
                &SetAttr {
                    size: Some(0),
                    ..Default::default()
                }
            ))
            .unwrap_err(),
            libc::ELOOP
        );
        assert_eq!(
            fs_res(f.fs.setattr(
                c,
                l,
                &SetAttr {
                    mode: Some(0o777),
                    ..Default::default()
                }
            ))
            .unwrap_err(),
            libc::EOPNOTSUPP
        );
        // These act on the link itself.
        let a =
            f.fs.setattr(
                c,
                l,
                &SetAttr {
                    uid: Some(1000),
                    gid: Some(1000),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.uid, a.gid), (1000, 1000));
        let at = UNIX_EPOCH + Duration::from_secs(12345);
        let a =
            f.fs.setattr(
                c,
                l,
                &SetAttr {
                    mtime: Some(TimeSet::At(at)),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(a.mtime, at);
        assert_eq!(
            fs_res(f.fs.setxattr(c, l, OsStr::new("user.x"), b"v", 0)).unwrap_err(),
            libc::EPERM
        );
        assert_eq!(
            fs_res(f.fs.getxattr(c, l, OsStr::new("user.x"))).unwrap_err(),
            libc::ENODATA
        );
        f.fs.access(c, l, libc::F_OK).unwrap();
        assert_eq!(f.fs.getattr(c, l).unwrap().kind, mapfs::FileKind::Symlink);
        let hl = format!("{link}.hl");
        assert_eq!(
            f.fs.link(c, l, p(&hl)).unwrap().kind,
            mapfs::FileKind::Symlink
        );
        f.fs.unlink(c, p(&hl)).unwrap();
        assert!(f.fs.readdir(c, l).is_err());
    }
    // Creating through a dangling link creates nothing outside.
    for flags in [libc::O_WRONLY, libc::O_WRONLY | libc::O_EXCL] {
        assert!(f
            .fs
            .create(c, p("/dangling"), OpenFlags(flags), 0o644)
            .is_err());
    }
    assert!(!f.outside.join("newfile").exists());
    // Unlinking a link removes the link only.
    f.fs.unlink(c, p("/sec")).unwrap();
    assert_eq!(outside_state(&f.outside), before);
    let after = std::fs::metadata("/etc/passwd").unwrap();
    assert_eq!(
        (after.mode(), after.uid(), after.len(), after.mtime()),
        (passwd.mode(), passwd.uid(), passwd.len(), passwd.mtime())
    );
}

#[test]
fn unprivileged_caller_is_confined_too() {
    if !is_root("unprivileged_caller_is_confined_too") {
        return;
    }
    let f = fx();
    std::fs::set_permissions(&f.root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = outside_state(&f.outside);
    for path in THROUGH {
        assert_eq!(
            fs_res(f.fs.getattr(&NOBODY, p(path))).unwrap_err(),
            libc::EXDEV
        );
        assert_eq!(
            fs_res(f.fs.create(
                &NOBODY,
                &p(path).with_file_name("n"),
                OpenFlags(libc::O_RDWR),
                0o644
            ))
            .unwrap_err(),
            libc::EXDEV
        );
    }
    assert_eq!(outside_state(&f.outside), before);
}

#[test]
fn paths_longer_than_path_max() {
    let f = fx();
    let name = "n".repeat(200);
    let mut deep = String::new();
    for _ in 0..30 {
        deep.push('/');
        deep.push_str(&name);
        f.fs.mkdir(&ROOT, p(&deep), 0o755).unwrap();
    }
    assert!(deep.len() > 6000);
    let file = format!("{deep}/file");
    let (a, o) =
        f.fs.create(
            &ROOT,
            p(&file),
            OpenFlags(libc::O_RDWR | libc::O_EXCL),
            0o600,
        )
        .unwrap();
    (&*o.files[0]).write_all(b"deep bytes").unwrap();
    assert_eq!(f.fs.getattr(&ROOT, p(&file)).unwrap().ino, a.ino);
    assert_eq!(f.fs.getattr(&ROOT, p(&file)).unwrap().size, 10);
    let names: Vec<_> =
        f.fs.readdir(&ROOT, p(&deep))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    assert_eq!(names, vec![OsStr::new("file").to_os_string()]);
    let moved = format!("{deep}/moved");
    f.fs.rename(&ROOT, p(&file), p(&moved), RenameFlags::default())
        .unwrap();
    let mut s = String::new();
    let o =
        f.fs.open(&ROOT, p(&moved), OpenFlags(libc::O_RDONLY))
            .unwrap();
    (&*o.files[0]).read_to_string(&mut s).unwrap();
    assert_eq!(s, "deep bytes");
    // Natively, through a chain of directory fds (the host path is too long
    // for path-based calls).
    let mut cur = rustix::fs::open(
        &f.root,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    for _ in 0..30 {
        cur = rustix::fs::openat(
            &cur,
            name.as_str(),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
    }
    let st = rustix::fs::statat(&cur, "moved", rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
    assert_eq!(
        (st.st_ino, st.st_size, st.st_mode & 0o7777),
        (a.ino, 10, 0o600)
    );
    // An escape deep down is refused.
    rustix::fs::symlinkat(f.outside.as_os_str(), &cur, "out").unwrap();
    assert_eq!(
        fs_res(f.fs.getattr(&ROOT, p(&format!("{deep}/out/secret")))).unwrap_err(),
        libc::EXDEV
    );
    f.fs.unlink(&ROOT, p(&moved)).unwrap();
    assert!(rustix::fs::statat(&cur, "moved", rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_err());
}

/// A tmpfs mounted inside the backing directory, lazily unmounted on drop.
struct TmpMount(PathBuf);

impl Drop for TmpMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn rename_and_link_across_a_mount_are_exdev() {
    if !is_root("rename_and_link_across_a_mount_are_exdev") {
        return;
    }
    let f = fx();
    let mnt = f.root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "mapfs-test",
            mnt.to_str().unwrap(),
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED rename_and_link_across_a_mount_are_exdev: cannot mount tmpfs");
        return;
    }
    let _guard = TmpMount(mnt.clone());
    let native = io_res(std::fs::rename(f.root.join("d/f"), mnt.join("f")));
    assert_eq!(native, Err(libc::EXDEV));
    let r = same(
        f.fs.rename(&ROOT, p("/d/f"), p("/mnt/f"), RenameFlags::default()),
        native,
    );
    assert_eq!(r.unwrap_err(), libc::EXDEV);
    let native = io_res(std::fs::hard_link(f.root.join("d/f"), mnt.join("f")));
    let r = same(f.fs.link(&ROOT, p("/d/f"), p("/mnt/f")), native);
    assert_eq!(r.unwrap_err(), libc::EXDEV);
    // Inside the mount everything works, and statfs reports the tmpfs.
    f.fs.create(&ROOT, p("/mnt/x"), OpenFlags(libc::O_WRONLY), 0o644)
        .unwrap();
    let s = f.fs.statfs(&ROOT, p("/mnt")).unwrap();
    let n = rustix::fs::statvfs(&mnt).unwrap();
    assert_eq!(s.blocks, n.f_blocks);
    assert!(f.root.join("d/f").exists());
}
