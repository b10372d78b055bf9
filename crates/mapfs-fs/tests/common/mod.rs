//! Shared fixture: a passthrough over `mirror/` and a twin `native/`
//! directory where the same operations are done with std/rustix, so each
//! result (value or errno) and the final trees can be compared.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Once;

use mapfs::creds::as_caller;
use mapfs::Ctx;
use mapfs_fs::passthrough::Passthrough;

/// Root caller.
pub const ROOT: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};
/// An unprivileged caller (nobody:nogroup).
pub const NOBODY: Ctx = Ctx {
    uid: 65534,
    gid: 65534,
    pid: 0,
};
/// Another unprivileged user, owner of files nobody does not own.
pub const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 0,
};

/// True when running as root (needed for caller switching); prints loudly
/// when not.
pub fn is_root(test: &str) -> bool {
    let r = rustix::process::geteuid().is_root();
    if !r {
        eprintln!("SKIPPED {test}: must run as root to act as other callers");
    }
    r
}

/// The daemon runs with umask 0 (modes arrive with the caller's umask
/// applied); so do the tests, for both sides.
fn init() {
    static O: Once = Once::new();
    O.call_once(|| {
        rustix::process::umask(rustix::fs::Mode::empty());
    });
}

/// The two trees and the file system over one of them.
pub struct Twin {
    _tmp: tempfile::TempDir,
    /// Backing directory of `fs`.
    pub mirror: PathBuf,
    /// The native twin.
    pub native: PathBuf,
    /// Passthrough over `mirror`.
    pub fs: Passthrough,
}

impl Twin {
    /// Both directories created 0777 (so every test caller can work in
    /// them) and `setup` run natively, as root, on each.
    pub fn new(setup: impl Fn(&Path)) -> Twin {
        init();
        let tmp = tempfile::tempdir().unwrap();
        let mirror = tmp.path().join("mirror");
        let native = tmp.path().join("native");
        for d in [&mirror, &native] {
            std::fs::create_dir(d).unwrap();
            rustix::fs::chmod(d.as_path(), rustix::fs::Mode::from_raw_mode(0o777)).unwrap();
            setup(d);
        }
        let fs = Passthrough::new(&mirror).unwrap();
        Twin {
            _tmp: tmp,
            mirror,
            native,
            fs,
        }
    }

    /// Host path of `p` in the native twin.
    pub fn n(&self, p: &str) -> PathBuf {
        self.native.join(p.trim_start_matches('/'))
    }

    /// Host path of `p` in the mirror's backing directory.
    pub fn m(&self, p: &str) -> PathBuf {
        self.mirror.join(p.trim_start_matches('/'))
    }

    /// Asserts the two trees are identical (names, types, modes, owners,
    /// sizes, link counts, contents, symlink targets, user xattrs).
    pub fn assert_same_trees(&self) {
        let a = snapshot(&self.mirror);
        let b = snapshot(&self.native);
        if a != b {
            for (k, v) in &a {
                if b.get(k) != Some(v) {
                    eprintln!("mirror {k:?}: {v:?}\nnative {k:?}: {:?}", b.get(k));
                }
            }
            for k in b.keys() {
                if !a.contains_key(k) {
                    eprintln!("only native: {k:?}");
                }
            }
            panic!("mirror and native trees differ");
        }
    }
}

/// `p` as an in-file-system path.
pub fn p(s: &str) -> &Path {
    Path::new(s)
}

/// The outcome of an operation through the file system, as `Ok` or errno.
pub fn fs_res<T>(r: mapfs::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.errno())
}

/// The outcome of a native operation, as `Ok` or errno.
pub fn io_res<T>(r: io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().expect("OS error"))
}

/// Runs the native operation `f` as `ctx` (on this thread only).
pub fn native_as<T>(ctx: &Ctx, f: impl FnOnce() -> io::Result<T>) -> Result<T, i32> {
    as_caller(ctx, || Ok(f())).map(io_res).expect("as_caller")
}

/// Both results, compared after discarding the values.
#[track_caller]
pub fn same<A, B>(fs: mapfs::Result<A>, native: Result<B, i32>) -> Result<(), i32> {
    let a = fs_res(fs).map(|_| ());
    let b = native.map(|_| ());
    assert_eq!(a, b, "file system vs native");
    a
}

#[derive(Debug, PartialEq, Eq)]
pub struct Node {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: Option<u64>,
    rdev: u64,
    content: Option<Vec<u8>>,
    target: Option<PathBuf>,
    xattrs: Vec<(OsString, Vec<u8>)>,
}

/// Everything observable below `root` except times and inode numbers.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for path in names {
        let md = std::fs::symlink_metadata(&path).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_char_device() {
            "chr"
        } else if ft.is_block_device() {
            "blk"
        } else {
            "file"
        };
        let mut xattrs = Vec::new();
        if !ft.is_symlink() {
            let mut buf = vec![0u8; 65536];
            let n = rustix::fs::llistxattr(&path, &mut buf[..]).unwrap_or(0);
            for name in buf[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
                let name = std::ffi::OsStr::new(std::str::from_utf8(name).unwrap());
                if !name.to_str().unwrap().starts_with("user.") {
                    continue;
                }
                let mut v = vec![0u8; 65536];
                let m = rustix::fs::lgetxattr(&path, name, &mut v[..]).unwrap();
                v.truncate(m);
                xattrs.push((name.to_os_string(), v));
            }
        }
        let node = Node {
            kind,
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            nlink: md.nlink(),
            size: (!ft.is_dir()).then_some(md.len()),
            rdev: md.rdev(),
            content: ft.is_file().then(|| std::fs::read(&path).unwrap()),
            target: ft.is_symlink().then(|| std::fs::read_link(&path).unwrap()),
            xattrs,
        };
        out.insert(path.strip_prefix(root).unwrap().to_path_buf(), node);
        if ft.is_dir() {
            walk(root, &path, out);
        }
    }
}
