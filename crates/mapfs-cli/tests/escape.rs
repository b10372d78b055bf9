//! Escape attempts: nothing outside the backing directory may be read or
//! changed through the daemon.
//!
//! Symlinks met while the *kernel* walks a path are followed client-side, as
//! on any file system; what must never happen is the daemon following a
//! symlink (or `..`) that appeared inside the backing dir when it resolves a
//! request for an inode it already handed out. The tests pin inodes with fds
//! opened before swapping a backing component for a symlink to the outside
//! (absolute and `../` relative), then operate through those fds.

// stat field types differ between architectures; the casts are needed elsewhere.
#![allow(clippy::unnecessary_cast)]

mod common;

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use rustix::fs::{AtFlags, Mode, OFlags, Timestamps, XattrFlags, CWD};

/// Snapshot of everything observable about the outside directory.
fn snapshot(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for ent in walk(dir) {
        let m = fs::symlink_metadata(&ent).unwrap();
        let content = if m.is_file() {
            fs::read(&ent).unwrap()
        } else {
            Vec::new()
        };
        let mut xattrs = vec![0u8; 1024];
        let n = rustix::fs::llistxattr(&ent, &mut xattrs[..]).unwrap_or(0);
        v.push(format!(
            "{} mode={:o} uid={} size={} mtime={}.{} content={:?} xattrs={:?}",
            ent.strip_prefix(dir).unwrap().display(),
            m.mode(),
            m.uid(),
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            String::from_utf8_lossy(&content),
            String::from_utf8_lossy(&xattrs[..n])
        ));
    }
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn proc_fd(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Pins `sub/` and `f` through the mount, swaps both for symlinks to the
/// outside (`target_for(outside)`), then attacks through the pinned inodes.
fn swap_attack(mode: DataMode, relative: bool) {
    let test = format!(
        "escape swap ({}) --data {mode}",
        if relative { "relative ../" } else { "absolute" }
    );
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &["allow_other"]);
    let scratch = s.scratch().unwrap().to_path_buf();
    let outside = scratch.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"OUTSIDE").unwrap();
    fs::set_permissions(outside.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
    let b = s.backing();
    fs::create_dir(b.join("sub")).unwrap();
    fs::write(b.join("sub/secret"), b"INSIDE").unwrap();
    fs::write(b.join("f"), b"INSIDE-F").unwrap();
    let m = s.mountpoint();
    // Pin inodes (LOOKUPs happen now, while they are plain dir/file).
    let dirfd = rustix::fs::open(
        m.join("sub"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let ffd = rustix::fs::open(m.join("f"), OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
    assert_eq!(fs::read(proc_fd(&ffd)).unwrap(), b"INSIDE-F");
    let before = snapshot(&outside);
    // Swap in the backing dir, behind the daemon's back.
    fs::rename(b.join("sub"), b.join("sub.old")).unwrap();
    fs::rename(b.join("f"), b.join("f.old")).unwrap();
    let (dir_target, file_target) = if relative {
        (
            PathBuf::from("../outside"),
            PathBuf::from("../outside/secret"),
        )
    } else {
        (outside.clone(), outside.join("secret"))
    };
    std::os::unix::fs::symlink(&dir_target, b.join("sub")).unwrap();
    std::os::unix::fs::symlink(&file_target, b.join("f")).unwrap();

    let mut log = Vec::new();
    // Reads through the pinned directory.
    let r = rustix::fs::openat(
        &dirfd,
        "secret",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    if let Ok(fd) = &r {
        let mut buf = [0u8; 64];
        let n = rustix::io::read(fd, &mut buf).unwrap_or(0);
        assert_ne!(
            &buf[..n],
            b"OUTSIDE",
            "{test}: read the outside file through a pinned dir inode"
        );
    }
    log.push(format!("openat(sub, secret): {}", outcome(&r)));
    let st = rustix::fs::statat(&dirfd, "secret", AtFlags::empty());
    if let Ok(st) = &st {
        assert_ne!(
            st.st_size, 7,
            "{test}: stat returned the outside file's size"
        );
    }
    log.push(format!("statat(sub, secret): {}", outcome(&st)));
    let mut names = Vec::new();
    if let Ok(fd) = rustix::fs::openat(
        &dirfd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        if let Ok(mut d) = rustix::fs::Dir::read_from(&fd) {
            while let Some(Ok(e)) = d.read() {
                names.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    log.push(format!("readdir(sub): {names:?}"));
    // Writes through the pinned directory.
    let ops: Vec<(&str, rustix::io::Result<()>)> = vec![
        (
            "create",
            rustix::fs::openat(
                &dirfd,
                "created",
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map(|_| ()),
        ),
        (
            "mkdir",
            rustix::fs::mkdirat(&dirfd, "newdir", Mode::from_raw_mode(0o755)),
        ),
        ("symlink", rustix::fs::symlinkat("x", &dirfd, "newlink")),
        (
            "unlink",
            rustix::fs::unlinkat(&dirfd, "secret", AtFlags::empty()),
        ),
        (
            "rename",
            rustix::fs::renameat(&dirfd, "secret", &dirfd, "moved"),
        ),
        (
            "setxattr",
            rustix::fs::setxattr(
                proc_fd(&dirfd).join("secret"),
                "user.pwn",
                b"1",
                XattrFlags::empty(),
            ),
        ),
    ];
    for (what, r) in &ops {
        log.push(format!("{what} in pinned sub: {}", outcome(r)));
    }
    // Attribute changes through the pinned file inode (by /proc magic link,
    // so the kernel sends SETATTR for the pinned inode without a new lookup).
    let pf = proc_fd(&ffd);
    let attr_ops: Vec<(&str, rustix::io::Result<()>)> = vec![
        ("chmod", rustix::fs::chmod(&pf, Mode::from_raw_mode(0o600))),
        (
            "chown",
            rustix::fs::chownat(
                CWD,
                &pf,
                Some(rustix::process::Uid::from_raw(1)),
                None,
                AtFlags::empty(),
            ),
        ),
        (
            "truncate",
            nix::unistd::truncate(&pf, 0)
                .map_err(|e| rustix::io::Errno::from_raw_os_error(e as i32)),
        ),
        (
            "utimens",
            rustix::fs::utimensat(
                CWD,
                &pf,
                &Timestamps {
                    last_access: rustix::fs::Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    },
                    last_modification: rustix::fs::Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    },
                },
                AtFlags::empty(),
            ),
        ),
        (
            "setxattr",
            rustix::fs::setxattr(&pf, "user.pwn", b"1", XattrFlags::empty()),
        ),
        (
            "open for write",
            rustix::fs::open(
                &pf,
                OFlags::WRONLY | OFlags::APPEND | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .and_then(|fd| rustix::io::write(&fd, b"PWNED").map(|_| ())),
        ),
    ];
    for (what, r) in &attr_ops {
        log.push(format!("{what} via pinned f: {}", outcome(r)));
    }
    let r = fs::read(&pf);
    if let Ok(c) = &r {
        assert_ne!(
            c.as_slice(),
            b"OUTSIDE",
            "{test}: read the outside file through a pinned file inode"
        );
    }
    eprintln!(
        "{test}: outcomes (errors are fine, escapes are not):\n  {}",
        log.join("\n  ")
    );
    let after = snapshot(&outside);
    assert_eq!(
        before, after,
        "{test}: the outside directory was changed through the mount"
    );
}

#[test]
fn swap_absolute_symlink_daemon() {
    swap_attack(DataMode::Daemon, false);
}
#[test]
fn swap_absolute_symlink_passthrough() {
    swap_attack(DataMode::Passthrough, false);
}
#[test]
fn swap_relative_symlink_daemon() {
    swap_attack(DataMode::Daemon, true);
}
#[test]
fn swap_relative_symlink_passthrough() {
    swap_attack(DataMode::Passthrough, true);
}

/// Symlinks in the backing dir are shown verbatim (not resolved by the
/// daemon), and `..` from the mount root leaves the mount, never reaching the
/// backing dir's parent through the daemon.
fn symlinks_and_dotdot(mode: DataMode) {
    let test = format!("escape symlinks/dotdot --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    let b = s.backing();
    let m = s.mountpoint();
    std::os::unix::fs::symlink("/etc/passwd", b.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../../../../../etc/passwd", b.join("rel")).unwrap();
    for (name, target) in [
        ("abs", "/etc/passwd"),
        ("rel", "../../../../../../etc/passwd"),
    ] {
        let meta = fs::symlink_metadata(m.join(name)).unwrap();
        assert!(
            meta.file_type().is_symlink(),
            "{test}: {name} is not shown as a symlink"
        );
        assert_eq!(
            fs::read_link(m.join(name)).unwrap(),
            PathBuf::from(target),
            "{test}: readlink {name}"
        );
    }
    fs::create_dir(b.join("sub")).unwrap();
    fs::write(b.join("top"), b"top").unwrap();
    // `..` is resolved by the kernel against the mount's dentries.
    assert_eq!(fs::read(m.join("sub/../top")).unwrap(), b"top");
    let parent = fs::metadata(m.join("..")).unwrap();
    let scratch = fs::metadata(s.scratch().unwrap()).unwrap();
    assert_eq!(
        (parent.dev(), parent.ino()),
        (scratch.dev(), scratch.ino()),
        "{test}: mnt/.. is not the mountpoint's parent"
    );
    let root = rustix::fs::open(m, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let up = rustix::fs::openat(
        &root,
        "..",
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    let st = rustix::fs::fstat(&up).unwrap();
    assert_eq!(
        (st.st_dev as u64, st.st_ino as u64),
        (scratch.dev(), scratch.ino())
    );
    // The mount root's `..` entry in readdir must not expose the backing's parent either.
    let entries: Vec<String> = fs::read_dir(m)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !entries.iter().any(|e| e == "backing" || e == "mnt"),
        "{test}: mount root lists its parent's entries: {entries:?}"
    );
}

#[test]
fn symlinks_and_dotdot_daemon() {
    symlinks_and_dotdot(DataMode::Daemon);
}
#[test]
fn symlinks_and_dotdot_passthrough() {
    symlinks_and_dotdot(DataMode::Passthrough);
}

fn rename_out(mode: DataMode) {
    let test = format!("escape rename out --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    let outside = s.scratch().unwrap().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(s.mountpoint().join("f"), b"inside").unwrap();
    fs::create_dir(s.mountpoint().join("d")).unwrap();
    let r = rustix::fs::rename(s.mountpoint().join("f"), outside.join("f"));
    assert_eq!(outcome(&r), "EXDEV", "{test}: rename file out of the mount");
    let r = rustix::fs::rename(s.mountpoint().join("d"), outside.join("d"));
    assert_eq!(outcome(&r), "EXDEV", "{test}: rename dir out of the mount");
    let r = rustix::fs::link(s.mountpoint().join("f"), outside.join("l"));
    assert_eq!(outcome(&r), "EXDEV", "{test}: link out of the mount");
    fs::write(outside.join("in"), b"x").unwrap();
    let r = rustix::fs::rename(outside.join("in"), s.mountpoint().join("in"));
    assert_eq!(outcome(&r), "EXDEV", "{test}: rename into the mount");
    assert_eq!(fs::read(s.backing().join("f")).unwrap(), b"inside");
    assert!(s.backing().join("d").is_dir());
    let mut left: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("in")],
        "{test}: outside dir changed"
    );
}

#[test]
fn rename_out_daemon() {
    rename_out(DataMode::Daemon);
}
#[test]
fn rename_out_passthrough() {
    rename_out(DataMode::Passthrough);
}
