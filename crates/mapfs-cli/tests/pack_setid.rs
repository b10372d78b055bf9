//! `pack` clears setuid and setgid bits as a local file system does
//! (pjdfstest `chmod/12.t`, `chown/00.t`), for user `nobody` on a mount
//! made by root with `allow_other`: a write, a truncate and an `O_TRUNC`
//! open by a user who is not the owner and lacks `CAP_FSETID`, and a chown
//! by a non-root owner of every kind of file but directories.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{cpath, fuse_or_skip, DataMode, MountSession};
use mapfs_testkit::user::{run_as_nobody, NOBODY_GID, NOBODY_UID};
use rustix::fs::{Mode, OFlags};

fn mount() -> MountSession {
    MountSession::builder(common::mapfs_bin())
        .fs("pack")
        .data(DataMode::Auto)
        .option("allow_other")
        .mount()
        .unwrap_or_else(|e| panic!("mounting pack -o allow_other: {e:#}"))
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A write, a truncate and an `O_TRUNC` open of root's setid file by
/// nobody clear setuid, and setgid where the group may execute.
#[test]
fn a_change_by_another_user_clears_setid_bits() {
    let test = "pack setid bits on a change by another user";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount();
    let f = s.mountpoint().join("f");
    fs::write(&f, b"0123456789").unwrap();
    let c = cpath(&f);
    type Change = fn(&std::ffi::CStr) -> Result<(), rustix::io::Errno>;
    let changes: [(&str, Change); 4] = [
        ("write", |c| {
            let fd = rustix::fs::open(c, OFlags::WRONLY, Mode::empty())?;
            rustix::io::pwrite(&fd, b"w", 0).map(|_| ())
        }),
        ("truncate", |c| {
            // SAFETY: a valid C string; truncate only reads it.
            match unsafe { libc::truncate(c.as_ptr(), 3) } {
                0 => Ok(()),
                // SAFETY: errno of this thread, just set.
                _ => Err(rustix::io::Errno::from_raw_os_error(unsafe {
                    *libc::__errno_location()
                })),
            }
        }),
        ("ftruncate", |c| {
            let fd = rustix::fs::open(c, OFlags::WRONLY, Mode::empty())?;
            rustix::fs::ftruncate(&fd, 2)
        }),
        ("O_TRUNC open", |c| {
            rustix::fs::open(c, OFlags::WRONLY | OFlags::TRUNC, Mode::empty()).map(|_| ())
        }),
    ];
    for (what, change) in changes {
        for before in [0o4777, 0o2777, 0o6777] {
            chmod(&f, before);
            run_as_nobody(|| change(c.as_c_str()))
                .unwrap_or_else(|e| panic!("{test}: {what} as nobody: {e}"));
            let after = mode_of(&f);
            assert_eq!(
                after, 0o777,
                "{test}: {what} by nobody left mode {after:o} (was {before:o})"
            );
        }
    }
}

/// A chown by nobody of its own FIFO, socket, device node and regular
/// file (to the ids it has: a chown all the same) clears setuid, and
/// setgid where the group may execute; a directory keeps both.
#[test]
fn a_chown_by_the_owner_clears_setid_bits_of_every_kind() {
    let test = "pack setid bits on chown";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount();
    let m = s.mountpoint();
    let kinds: [(&str, u32, u64); 5] = [
        ("fifo", libc::S_IFIFO, 0),
        ("socket", libc::S_IFSOCK, 0),
        ("chr", libc::S_IFCHR, libc::makedev(1, 3)),
        ("blk", libc::S_IFBLK, libc::makedev(7, 0)),
        ("file", libc::S_IFREG, 0),
    ];
    for (name, kind, dev) in kinds {
        let p = m.join(name);
        let cp = cpath(&p);
        // SAFETY: a valid C string; mknod only reads it.
        let r = unsafe { libc::mknod(cp.as_ptr(), kind | 0o644, dev) };
        assert_eq!(
            r,
            0,
            "{test}: mknod {name}: {}",
            std::io::Error::last_os_error()
        );
        std::os::unix::fs::lchown(&p, Some(NOBODY_UID), Some(NOBODY_GID)).unwrap();
        chmod(&p, 0o6555);
        run_as_nobody(|| {
            rustix::fs::chownat(
                rustix::fs::CWD,
                cp.as_c_str(),
                Some(rustix::fs::Uid::from_raw(NOBODY_UID)),
                Some(rustix::fs::Gid::from_raw(NOBODY_GID)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
        })
        .unwrap_or_else(|e| panic!("{test}: chown of {name} by nobody: {e}"));
        let after = mode_of(&p);
        assert_eq!(after, 0o555, "{test}: chown of {name} left mode {after:o}");
    }
    let d = m.join("dir");
    fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(NOBODY_UID), Some(NOBODY_GID)).unwrap();
    chmod(&d, 0o6755);
    let cd = cpath(&d);
    run_as_nobody(|| {
        rustix::fs::chown(
            cd.as_c_str(),
            Some(rustix::fs::Uid::from_raw(NOBODY_UID)),
            Some(rustix::fs::Gid::from_raw(NOBODY_GID)),
        )
    })
    .unwrap();
    assert_eq!(
        mode_of(&d),
        0o6755,
        "{test}: a directory's bits go only by chmod"
    );
}
