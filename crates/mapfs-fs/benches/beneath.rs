//! The floor of embedded passthrough's metadata calls on names below a
//! prefix's top level: what Linux charges for a call that must not leave
//! the backing root, against the one system call a native program makes.
//!
//! Linux can confine path resolution beneath a directory only in
//! `openat2` (`RESOLVE_BENEATH`); `stat`, `unlink` and `open(O_CREAT)`
//! have no such flag (`AT_RESOLVE_BENEATH` is FreeBSD's). So a confined
//! call on `d/NAME` is `openat2` of `d` beneath the root, the call on
//! `NAME`, and `close`: three system calls where native makes one. The
//! benchmark times, per name one directory down:
//!
//! - `native`: the one call from the root's descriptor (what a program
//!   does; an intermediate symlink would be followed out of the root);
//! - `beneath`: the three calls, as raw system calls (the floor);
//! - `passthrough`: the `passthrough` file system's own call (what
//!   embedded mode runs, the floor plus mapfs's work).
//!
//! The ratio `native / beneath` is the best any confined implementation can
//! reach; docs/embedded.md compares it with the embedded figures.
//!
//! Run: `MAPFS_BENCH_DIR=/dev/shm cargo bench -p mapfs-fs --bench beneath`
//! (the directory's file system is the backing measured; default: the
//! system's temporary directory).

use std::ffi::OsString;
use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use mapfs::backing::openat2_beneath;
use mapfs::{Ctx, FileSystem, OpenFlags};
use mapfs_fs::passthrough::Passthrough;
use rustix::fs::{AtFlags, Mode, OFlags};

/// Files statted in turn (warm: all in the dentry cache).
const FILES: usize = 5_000;

struct Bed {
    _dir: tempfile::TempDir,
    root: OwnedFd,
    fs: Passthrough,
    ctx: Ctx,
}

impl Bed {
    fn new() -> Self {
        let base = std::env::var_os("MAPFS_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::tempdir_in(&base).expect("bench directory");
        std::fs::create_dir(dir.path().join("d")).unwrap();
        for i in 0..FILES {
            std::fs::write(dir.path().join(format!("d/f{i}")), b"").unwrap();
        }
        let root = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let fs = Passthrough::new(dir.path()).unwrap();
        eprintln!("beneath: backing {}", base.display());
        Bed {
            _dir: dir,
            root,
            fs,
            ctx: Ctx::current(),
        }
    }

    fn parent(&self) -> OwnedFd {
        openat2_beneath(
            self.root.as_fd(),
            "d".as_ref(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }
}

fn names(prefix: &str, n: usize) -> Vec<OsString> {
    (0..n).map(|i| format!("{prefix}{i}").into()).collect()
}

fn stat(c: &mut Criterion) {
    let bed = Bed::new();
    let deep = names("d/f", FILES);
    let leaf = names("f", FILES);
    let mut g = c.benchmark_group("stat");
    let mut i = 0;
    g.bench_function("native", |b| {
        b.iter(|| {
            i = (i + 1) % FILES;
            black_box(rustix::fs::statat(&bed.root, &deep[i], AtFlags::SYMLINK_NOFOLLOW).unwrap())
        })
    });
    g.bench_function("beneath", |b| {
        b.iter(|| {
            i = (i + 1) % FILES;
            let d = bed.parent();
            black_box(rustix::fs::statat(&d, &leaf[i], AtFlags::SYMLINK_NOFOLLOW).unwrap())
        })
    });
    g.bench_function("passthrough", |b| {
        b.iter(|| {
            i = (i + 1) % FILES;
            black_box(bed.fs.getattr(&bed.ctx, Path::new(&deep[i])).unwrap())
        })
    });
    g.finish();
}

/// Times `n` creates (then removes the files, untimed) or `n` unlinks (of
/// files made untimed first) with `op`.
fn timed(bed: &Bed, n: u64, create: bool, op: &dyn Fn(usize)) -> Duration {
    let prepare = |i: usize| {
        std::fs::write(bed._dir.path().join(format!("d/n{i}")), b"").unwrap();
    };
    let clean = |i: usize| {
        let _ = std::fs::remove_file(bed._dir.path().join(format!("d/n{i}")));
    };
    if !create {
        (0..n as usize).for_each(prepare);
    }
    let t = Instant::now();
    (0..n as usize).for_each(op);
    let took = t.elapsed();
    if create {
        (0..n as usize).for_each(clean);
    }
    took
}

fn create_unlink(c: &mut Criterion) {
    let bed = Bed::new();
    let excl = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(0o644);
    let mut g = c.benchmark_group("create");
    g.bench_function("native", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, true, &|i| {
                drop(rustix::fs::openat(&bed.root, format!("d/n{i}"), excl, mode).unwrap())
            })
        })
    });
    g.bench_function("beneath", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, true, &|i| {
                let d = bed.parent();
                drop(rustix::fs::openat(&d, format!("n{i}"), excl, mode).unwrap())
            })
        })
    });
    g.bench_function("passthrough", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, true, &|i| {
                let path = PathBuf::from(format!("d/n{i}"));
                let flags = OpenFlags(libc::O_WRONLY | libc::O_EXCL);
                let (_, opened) = bed.fs.create(&bed.ctx, &path, flags, 0o644).unwrap();
                bed.fs
                    .release(&bed.ctx, &path, opened.handle, &opened.map)
                    .unwrap();
            })
        })
    });
    g.finish();
    let mut g = c.benchmark_group("unlink");
    g.bench_function("native", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, false, &|i| {
                rustix::fs::unlinkat(&bed.root, format!("d/n{i}"), AtFlags::empty()).unwrap()
            })
        })
    });
    g.bench_function("beneath", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, false, &|i| {
                let d = bed.parent();
                rustix::fs::unlinkat(&d, format!("n{i}"), AtFlags::empty()).unwrap()
            })
        })
    });
    g.bench_function("passthrough", |b| {
        b.iter_custom(|n| {
            timed(&bed, n, false, &|i| {
                bed.fs
                    .unlink(&bed.ctx, Path::new(&format!("d/n{i}")))
                    .unwrap()
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = stat, create_unlink
}
criterion_main!(benches);
