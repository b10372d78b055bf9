//! The read-only `.versions/` directory at the root of the mount:
//! `.versions/DIR/NAME@STAMP` is version `STAMP` of `/DIR/NAME`, and
//! `.versions/DIR/` lists the versions of the files of `/DIR` and the
//! directories beneath it with history. It is not listed in `/` and no
//! ordinary path leads into it.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mapfs::backing::BackingRoot;
use mapfs::creds::as_caller;
use mapfs::{Attr, Ctx, DirEntry, Error, FileKind, Result};
use rustix::fs::{Access, AtFlags, Mode, OFlags};

use super::stamp;
use super::store::{Store, Version, STORE_DIR};

/// Name of the virtual directory at the root of the mount.
pub const VIRTUAL_DIR: &str = ".versions";

/// Inode numbers of virtual entries: hashes of their path (and version id),
/// with a high bit set, far above what backing file systems hand out.
/// Executors key inodes on these numbers with a path, so a version renamed
/// with its file gets a new number, as a renamed entry would.
/// Both stay below `1 << 61`: executors hand out nodeids of their own from
/// `1 << 62` up.
const FILE_INO: u64 = 1 << 60;
const DIR_INO: u64 = 1 << 59;
const HASH_BITS: u64 = (1 << 59) - 1;

/// What a path of the file system names.
#[derive(Debug, PartialEq, Eq)]
pub enum Place<'a> {
    /// An ordinary path of the backing directory.
    Normal,
    /// The store (never reachable).
    Hidden,
    /// Inside `.versions`: the rest of the path (`` for `.versions` itself,
    /// else `/DIR/...`).
    Virtual(&'a [u8]),
}

/// Where `path` points.
pub fn place(path: &Path) -> Place<'_> {
    let bytes = path.as_os_str().as_bytes();
    let mut comps = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::CurDir));
    match comps.next() {
        Some(Component::Normal(n)) if n == STORE_DIR => Place::Hidden,
        Some(Component::Normal(n)) if n == VIRTUAL_DIR => {
            let start = bytes
                .windows(VIRTUAL_DIR.len())
                .position(|w| w == VIRTUAL_DIR.as_bytes())
                .map_or(bytes.len(), |i| i + VIRTUAL_DIR.len());
            let rest = &bytes[start..];
            let rest = if rest.iter().all(|&c| c == b'/') {
                &b""[..]
            } else {
                rest
            };
            Place::Virtual(rest)
        }
        _ => Place::Normal,
    }
}

fn time(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// The attributes of a version as a read-only file.
pub fn file_attr(v: &Version) -> Attr {
    let t = time(v.ts);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&v.path, v.id).hash(&mut h);
    Attr {
        ino: FILE_INO | (h.finish() & HASH_BITS),
        size: v.size,
        blocks: v.size.div_ceil(512),
        atime: t,
        mtime: t,
        ctime: t,
        kind: FileKind::File,
        perm: (v.mode & 0o7555 & !0o6000) as u16,
        nlink: 1,
        uid: v.uid,
        gid: v.gid,
        rdev: 0,
        blksize: 4096,
    }
}

fn dir_attr(rest: &[u8], like: &Attr) -> Attr {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rest.hash(&mut h);
    Attr {
        ino: DIR_INO | (h.finish() & HASH_BITS),
        size: 0,
        blocks: 0,
        kind: FileKind::Dir,
        perm: 0o555,
        nlink: 2,
        ..*like
    }
}

/// The version `rest` (`/DIR/NAME@STAMP`) names, if it does.
pub fn version_at(store: &Store, rest: &[u8]) -> Result<Option<Version>> {
    let Some(slash) = rest.iter().rposition(|&c| c == b'/') else {
        return Ok(None);
    };
    let Some((name, ts)) = stamp::split_name(&rest[slash + 1..]) else {
        return Ok(None);
    };
    let mut path = rest[..slash].to_vec();
    path.push(b'/');
    path.extend_from_slice(name);
    store.find(&path, ts)
}

/// What one caller may see of the history: a version, its name and its
/// bytes only if the caller could reach the file's path through the live
/// tree now (search permission on every directory down to its parent, as
/// the backing kernel decides for the caller's uid and groups) and could
/// read the file when the version was taken ([`may_read`]). A version
/// whose directory no longer exists is root's alone: nothing says who
/// could reach it. Answers about directories are kept for the life of
/// one request.
pub struct Sight<'a> {
    ctx: &'a Ctx,
    root: &'a BackingRoot,
    dirs: std::cell::RefCell<std::collections::HashMap<(Vec<u8>, bool), bool>>,
}

impl<'a> Sight<'a> {
    /// The sight of the caller `ctx` on the live tree at `root`.
    pub fn new(ctx: &'a Ctx, root: &'a BackingRoot) -> Sight<'a> {
        Sight {
            ctx,
            root,
            dirs: Default::default(),
        }
    }

    /// Whether the caller may search the live directory `dir` (`/a/b`,
    /// `` or `/` for the root) and every directory above it; with `list`,
    /// also read it.
    pub fn dir(&self, dir: &[u8], list: bool) -> bool {
        if self.ctx.uid == 0 {
            return true;
        }
        let key = (dir.to_vec(), list);
        if let Some(&ok) = self.dirs.borrow().get(&key) {
            return ok;
        }
        let path = if dir.is_empty() { &b"/"[..] } else { dir };
        let want = if list {
            Access::READ_OK | Access::EXEC_OK
        } else {
            Access::EXEC_OK
        };
        // Opened as the caller: the walk down needs search permission on
        // every directory above; `.` then needs it on the directory itself.
        let ok = as_caller(self.ctx, || {
            let fd = self.root.open(
                Path::new(OsStr::from_bytes(path)),
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
            )?;
            Ok(rustix::fs::accessat(&fd, ".", want, AtFlags::EACCESS)?)
        })
        .is_ok();
        self.dirs.borrow_mut().insert(key, ok);
        ok
    }

    /// Whether the caller could reach `v`'s file through the live tree.
    pub fn reaches(&self, v: &Version) -> bool {
        let parent = match v.path.iter().rposition(|&c| c == b'/') {
            Some(i) => &v.path[..i],
            None => &b""[..],
        };
        self.dir(parent, false)
    }

    /// Whether the caller may see `v` at all: reach it, and read it.
    pub fn sees(&self, v: &Version) -> bool {
        may_read(self.ctx, v) && self.reaches(v)
    }
}

/// `getattr` inside `.versions`; `root` is the mount root's attributes
/// (owner and times of the virtual directories). What `sight` does not
/// see is not there.
pub fn getattr(sight: &Sight<'_>, store: &Store, rest: &[u8], root: &Attr) -> Result<Attr> {
    if rest.is_empty() {
        return Ok(dir_attr(rest, root));
    }
    if let Some(v) = version_at(store, rest)? {
        if sight.reaches(&v) {
            return Ok(file_attr(&v));
        }
        return Err(Error::not_found());
    }
    if store
        .list(Some(rest), true)?
        .iter()
        .any(|v| v.path.len() > rest.len() && sight.sees(v))
    {
        return Ok(dir_attr(rest, root));
    }
    Err(Error::not_found())
}

/// `readdir` inside `.versions`: only versions the caller may see
/// ([`Sight`]), and directories holding some (so the names of others'
/// files do not show), and only of a live directory the caller may list.
pub fn readdir(
    sight: &Sight<'_>,
    store: &Store,
    rest: &[u8],
    root: &Attr,
) -> Result<Vec<DirEntry>> {
    if !sight.dir(rest, true) {
        return Err(Error::from_errno(libc::EACCES));
    }
    let all = if rest.is_empty() {
        store.list(None, false)?
    } else {
        store.list(Some(rest), true)?
    };
    let mut out: BTreeMap<Vec<u8>, DirEntry> = BTreeMap::new();
    for v in all.iter().filter(|v| sight.sees(v)) {
        let Some(below) = v.path.strip_prefix(rest).and_then(|b| b.strip_prefix(b"/")) else {
            continue;
        };
        match below.iter().position(|&c| c == b'/') {
            Some(i) => {
                let name = below[..i].to_vec();
                let mut sub = rest.to_vec();
                sub.push(b'/');
                sub.extend_from_slice(&name);
                let a = dir_attr(&sub, root);
                out.entry(name.clone()).or_insert(DirEntry {
                    name: OsString::from(OsStr::from_bytes(&name)),
                    ino: a.ino,
                    kind: FileKind::Dir,
                    attr: Some(a),
                });
            }
            None => {
                let name = v.entry_name();
                let a = file_attr(v);
                out.insert(
                    name.clone(),
                    DirEntry {
                        name: OsString::from(OsStr::from_bytes(&name)),
                        ino: a.ino,
                        kind: FileKind::File,
                        attr: Some(a),
                    },
                );
            }
        }
    }
    Ok(out.into_values().collect())
}

/// May the caller read version `v`? By the owner, group and mode the file
/// had, as the kernel would have decided for the file then.
pub fn may_read(ctx: &Ctx, v: &Version) -> bool {
    if ctx.uid == 0 {
        return true;
    }
    let bits = if ctx.uid == v.uid {
        v.mode >> 6
    } else if mapfs::creds::in_group(ctx, v.gid) {
        v.mode >> 3
    } else {
        v.mode
    };
    bits & 0o4 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places() {
        assert_eq!(place(Path::new("/a/b")), Place::Normal);
        assert_eq!(place(Path::new("/")), Place::Normal);
        assert_eq!(place(Path::new("/.mapfs-versions/x")), Place::Hidden);
        assert_eq!(place(Path::new("/.versions")), Place::Virtual(b""));
        assert_eq!(place(Path::new("/.versions/")), Place::Virtual(b""));
        assert_eq!(
            place(Path::new("/.versions/a/f@x")),
            Place::Virtual(b"/a/f@x")
        );
        assert_eq!(place(Path::new("/a/.versions")), Place::Normal);
        assert_eq!(place(Path::new("/.versionsx")), Place::Normal);
    }
}
