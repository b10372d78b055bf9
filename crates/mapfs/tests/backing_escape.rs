//! BackingRoot confinement: `..`, absolute and relative symlinks, final
//! symlinks under O_NOFOLLOW, and paths longer than PATH_MAX.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use mapfs::backing::BackingRoot;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

/// `tmp/root` is the backing root, `tmp/outside/secret` a file next to it
/// that must never be reachable.
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    std::fs::write(root.join("a/f"), b"inside").unwrap();
    Fixture {
        _tmp: tmp,
        root,
        outside,
    }
}

fn errno<T: std::fmt::Debug>(r: mapfs::Result<T>) -> i32 {
    r.expect_err("expected an error").errno()
}

fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut v).unwrap();
    v
}

#[test]
fn new_rejects_missing_and_non_directories() {
    let f = fixture();
    assert_eq!(errno(BackingRoot::new(&f.root.join("nope"))), libc::ENOENT);
    let e = BackingRoot::new(&f.root.join("a/f")).unwrap_err();
    assert_eq!(e.errno(), libc::ENOTDIR);
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn plain_paths_open_inside() {
    let f = fixture();
    let r = BackingRoot::new(&f.root).unwrap();
    let fd = r
        .open(Path::new("/a/f"), OFlags::RDONLY, Mode::empty())
        .unwrap();
    assert_eq!(read_all(fd), b"inside");
    // `..` that stays inside is the kernel's call, and it allows it.
    let fd = r
        .open(Path::new("/a/b/../f"), OFlags::RDONLY, Mode::empty())
        .unwrap();
    assert_eq!(read_all(fd), b"inside");
    // "/" is the root itself.
    let fd = r
        .open(
            Path::new("/"),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
    let st = rustix::fs::fstat(&fd).unwrap();
    let native = std::fs::metadata(&f.root).unwrap();
    assert_eq!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&native));
    // The fd is close-on-exec.
    let fl = rustix::io::fcntl_getfd(&fd).unwrap();
    assert!(fl.contains(rustix::io::FdFlags::CLOEXEC));
}

#[test]
fn dotdot_cannot_escape() {
    let f = fixture();
    let r = BackingRoot::new(&f.root).unwrap();
    for p in [
        "/../outside/secret",
        "/a/../../outside/secret",
        "/a/b/../../../outside/secret",
        "/..",
    ] {
        assert_eq!(
            errno(r.open(Path::new(p), OFlags::RDONLY, Mode::empty())),
            libc::EXDEV,
            "{p}"
        );
    }
    assert_eq!(
        errno(r.parent(Path::new("/../outside/secret"))),
        libc::EXDEV
    );
}

#[test]
fn absolute_symlink_is_refused() {
    let f = fixture();
    symlink(&f.outside, f.root.join("abs")).unwrap();
    symlink("/etc", f.root.join("etc")).unwrap();
    let r = BackingRoot::new(&f.root).unwrap();
    for p in ["/abs/secret", "/etc/passwd", "/abs"] {
        assert_eq!(
            errno(r.open(Path::new(p), OFlags::RDONLY, Mode::empty())),
            libc::EXDEV,
            "{p}"
        );
    }
    // Creating through it is refused too, and nothing appears outside.
    assert_eq!(
        errno(r.open(
            Path::new("/abs/new"),
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644)
        )),
        libc::EXDEV
    );
    assert!(!f.outside.join("new").exists());
    // parent() of a path through it fails; parent() of the link itself does
    // not follow it.
    assert_eq!(errno(r.parent(Path::new("/abs/secret"))), libc::EXDEV);
    let (dir, name) = r.parent(Path::new("/abs")).unwrap();
    assert_eq!(name, "abs");
    let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    assert_eq!(FileType::from_raw_mode(st.st_mode), FileType::Symlink);
}

#[test]
fn relative_symlink_climbing_out_is_refused() {
    let f = fixture();
    symlink("../../outside", f.root.join("a/up")).unwrap();
    symlink("../../../../../../../../../..", f.root.join("a/b/top")).unwrap();
    symlink("b/../f", f.root.join("a/in")).unwrap();
    let r = BackingRoot::new(&f.root).unwrap();
    assert_eq!(
        errno(r.open(Path::new("/a/up/secret"), OFlags::RDONLY, Mode::empty())),
        libc::EXDEV
    );
    assert_eq!(
        errno(r.open(
            Path::new("/a/b/top/etc/passwd"),
            OFlags::RDONLY,
            Mode::empty()
        )),
        libc::EXDEV
    );
    // A relative symlink that stays inside still works.
    let fd = r
        .open(Path::new("/a/in"), OFlags::RDONLY, Mode::empty())
        .unwrap();
    assert_eq!(read_all(fd), b"inside");
}

#[test]
fn final_symlink_with_nofollow_is_not_followed() {
    let f = fixture();
    symlink("/etc/passwd", f.root.join("pw")).unwrap();
    symlink(f.outside.join("secret"), f.root.join("sec")).unwrap();
    let r = BackingRoot::new(&f.root).unwrap();
    for p in ["/pw", "/sec"] {
        assert_eq!(
            errno(r.open(
                Path::new(p),
                OFlags::RDONLY | OFlags::NOFOLLOW,
                Mode::empty()
            )),
            libc::ELOOP,
            "{p}"
        );
        // O_TRUNC|O_WRONLY must not reach the target either.
        assert_eq!(
            errno(r.open(
                Path::new(p),
                OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW,
                Mode::empty()
            )),
            libc::ELOOP
        );
        // O_PATH|O_NOFOLLOW gives the link itself.
        let fd = r
            .open(Path::new(p), OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())
            .unwrap();
        let st = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(FileType::from_raw_mode(st.st_mode), FileType::Symlink);
        // Following it is an escape: EXDEV.
        assert_eq!(
            errno(r.open(Path::new(p), OFlags::RDONLY, Mode::empty())),
            libc::EXDEV
        );
    }
    assert_eq!(std::fs::read(f.outside.join("secret")).unwrap(), b"SECRET");
    assert!(std::fs::metadata("/etc/passwd").unwrap().len() > 0);
}

#[test]
fn root_has_no_parent() {
    let f = fixture();
    let r = BackingRoot::new(&f.root).unwrap();
    assert_eq!(errno(r.parent(Path::new("/"))), libc::EINVAL);
    assert_eq!(errno(r.parent(Path::new("/a/.."))), libc::EINVAL);
    let (dir, name) = r.parent(Path::new("/a/b")).unwrap();
    assert_eq!(name, "b");
    let st = rustix::fs::fstat(&dir).unwrap();
    let native = std::fs::metadata(f.root.join("a")).unwrap();
    assert_eq!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&native));
}

/// Builds `depth` nested directories named `name` below `base` with mkdirat
/// chains (the host path is too long for path-based calls) and returns the
/// in-file-system path.
fn deep_chain(base: &OwnedFd, name: &str, depth: usize) -> (String, OwnedFd) {
    let mut cur =
        rustix::fs::openat(base, ".", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut p = String::new();
    for _ in 0..depth {
        rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)).unwrap();
        cur = rustix::fs::openat(&cur, name, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .unwrap();
        p.push('/');
        p.push_str(name);
    }
    (p, cur)
}

#[test]
fn paths_longer_than_path_max_work_and_stay_confined() {
    let f = fixture();
    let base = rustix::fs::open(&f.root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    let name = "d".repeat(200);
    let (deep, deep_fd) = deep_chain(&base, &name, 30);
    assert!(deep.len() >= 6000, "{}", deep.len());
    let r = BackingRoot::new(&f.root).unwrap();

    // Create and write through the long path, check natively via the chain.
    let file = format!("{deep}/file");
    let fd = r
        .open(
            Path::new(&file),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
    std::fs::File::from(fd).write_all(b"deep").unwrap();
    let native = rustix::fs::openat(&deep_fd, "file", OFlags::RDONLY, Mode::empty()).unwrap();
    assert_eq!(read_all(native), b"deep");
    let st = rustix::fs::fstat(
        rustix::fs::openat(&deep_fd, "file", OFlags::PATH, Mode::empty()).unwrap(),
    )
    .unwrap();
    assert_eq!(st.st_mode & 0o7777, 0o600);

    // parent() of the long path.
    let (dir, fname) = r.parent(Path::new(&file)).unwrap();
    assert_eq!(fname, "file");
    assert_eq!(
        rustix::fs::fstat(&dir).unwrap().st_ino,
        rustix::fs::fstat(&deep_fd).unwrap().st_ino
    );
    let st2 = rustix::fs::statat(&dir, "file", AtFlags::SYMLINK_NOFOLLOW).unwrap();
    assert_eq!(st2.st_ino, st.st_ino);

    // Escapes deep down are refused: absolute link, and a relative link
    // climbing above the root.
    rustix::fs::symlinkat("/etc", &deep_fd, "abs").unwrap();
    let up = "../".repeat(40);
    rustix::fs::symlinkat(up.as_str(), &deep_fd, "up").unwrap();
    for tail in ["abs/passwd", "up/etc/passwd", "../../../../../../../../../../../../../../../../../../../../../../../../../../../../../../../../../etc/passwd"] {
        let p = format!("{deep}/{tail}");
        assert_eq!(
            errno(r.open(Path::new(&p), OFlags::RDONLY, Mode::empty())),
            libc::EXDEV,
            "{tail}"
        );
    }
    // A final long-path symlink with O_NOFOLLOW is not followed.
    assert_eq!(
        errno(r.open(
            Path::new(&format!("{deep}/abs")),
            OFlags::RDONLY | OFlags::NOFOLLOW,
            Mode::empty()
        )),
        libc::ELOOP
    );
    // A component longer than NAME_MAX is the kernel's ENAMETOOLONG.
    let huge = format!("/{}", "x".repeat(300));
    assert_eq!(
        errno(r.open(Path::new(&huge), OFlags::RDONLY, Mode::empty())),
        libc::ENAMETOOLONG
    );
}

/// `..` beneath the root stays correct while other threads rename things:
/// the kernel answers `EAGAIN` when a rename anywhere races a scoped `..`
/// walk, and the lookup is retried rather than failing the caller.
#[test]
fn dotdot_inside_survives_concurrent_renames() {
    let f = fixture();
    let root = BackingRoot::new(&f.root).unwrap();
    let spin = f.root.join("spin");
    std::fs::write(&spin, b"").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renamer = {
        let stop = stop.clone();
        let (a, b) = (spin.clone(), f.root.join("spun"));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::rename(&a, &b).unwrap();
                std::fs::rename(&b, &a).unwrap();
            }
        })
    };
    let mut failures = Vec::new();
    for _ in 0..20_000 {
        match root.open(Path::new("/a/b/../f"), OFlags::RDONLY, Mode::empty()) {
            Ok(fd) => assert_eq!(read_all(fd), b"inside"),
            Err(e) => failures.push(e.errno()),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renamer.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} of 20000 lookups of /a/b/../f failed during renames (errnos {:?})",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}
