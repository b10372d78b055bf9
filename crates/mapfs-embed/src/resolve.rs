//! Which file system a path belongs to, and where in it.
//!
//! A path is embedded when it lexically starts with a prefix (repeated `/`
//! and `.` ignored), or when it is relative to an embedded working directory
//! or directory descriptor. Inside a file system, the path is handed to it
//! as is when it has no `..` (its own resolution, e.g. `openat2` beneath the
//! backing root, follows relative symlinks and refuses escapes); otherwise,
//! or when the file system refuses a symlink, [`walk`] resolves it one
//! component at a time like the kernel: `..` at the file system's root
//! leaves it for the prefix's parent on the host, and a symlink's target is
//! read from the file system and resolved from where the link is (an
//! absolute target starts again at the host's `/`, as through a mount). The
//! backing directory is never named: nothing resolves outside the file
//! system's own root except through the host's namespace, with the
//! process's own rights.
//!
//! Limits: host components before a prefix are taken lexically (a prefix's
//! parent directories should not be symlinks), and a host path that reaches
//! a prefix only through a symlink or `..` of the host is not embedded.

use std::collections::VecDeque;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use mapfs::FileKind;

use crate::state::{self, embs, Place};

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A host path (rewritten: reached through `..` or a symlink).
    Host(CString),
    /// A place in an embedded file system.
    Emb(Place),
}

/// A path found to be under a prefix, not resolved yet.
#[derive(Debug, Clone)]
pub struct Loc {
    /// Index of the file system.
    pub idx: usize,
    /// Components below the file system's root, as given (`..` included).
    pub comps: Vec<Vec<u8>>,
}

impl Loc {
    /// The path inside the file system, if the components hold no `..`.
    pub fn lexical(&self) -> Option<Place> {
        if self.comps.iter().any(|c| c == b"..") {
            return None;
        }
        Some(Place {
            idx: self.idx,
            path: join(&self.comps),
        })
    }
}

/// `/a/b` from `[a, b]`.
pub fn join(comps: &[Vec<u8>]) -> PathBuf {
    let mut v = Vec::with_capacity(comps.iter().map(|c| c.len() + 1).sum::<usize>() + 1);
    for c in comps {
        v.push(b'/');
        v.extend_from_slice(c);
    }
    if v.is_empty() {
        v.push(b'/');
    }
    PathBuf::from(OsStr::from_bytes(&v))
}

/// The file system whose prefix `path` (absolute) starts with, and the
/// components after it.
fn match_prefix(path: &[u8]) -> Option<Loc> {
    let embs = embs();
    if embs.is_empty() {
        return None;
    }
    let comps: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    for (idx, e) in embs.iter().enumerate() {
        let n = e.prefix_comps.len();
        if comps.len() >= n
            && comps[..n]
                .iter()
                .zip(&e.prefix_comps)
                .all(|(a, b)| *a == b.as_slice())
        {
            return Some(Loc {
                idx,
                comps: comps[n..].iter().map(|c| c.to_vec()).collect(),
            });
        }
    }
    None
}

/// Where `path`, relative to `dirfd` (`AT_FDCWD` or a descriptor), leads:
/// `None` for a host path (the call goes on unchanged).
pub fn locate(dirfd: i32, path: &[u8]) -> Option<Loc> {
    if path.is_empty() {
        return None;
    }
    if path[0] == b'/' {
        return match_prefix(path);
    }
    let base = if dirfd == libc::AT_FDCWD {
        match state::cwd() {
            Some(b) => b,
            None => return match_prefix(&state::host_path_from_cwd(path)?),
        }
    } else {
        match state::dir_of(dirfd) {
            Some(b) => b,
            None => return match_prefix(&state::host_path_from_dirfd(dirfd, path)?),
        }
    };
    let mut comps = state::split(base.path.as_os_str().as_bytes());
    comps.extend(
        path.split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .map(<[u8]>::to_vec),
    );
    Some(Loc {
        idx: base.idx,
        comps,
    })
}

/// Most symlinks followed in one resolution, as the kernel's limit.
const MAX_LINKS: u32 = 40;

/// Resolves `loc` one component at a time (see the module docs); a final
/// symlink is followed when `follow`. A missing final component is not an
/// error (the caller may create it).
pub fn walk(loc: Loc, follow: bool) -> Result<Target, i32> {
    let ctx = state::ctx();
    enum Cur {
        Host(Vec<Vec<u8>>),
        Emb(usize, Vec<Vec<u8>>),
    }
    let mut cur = Cur::Emb(loc.idx, Vec::new());
    let mut todo: VecDeque<Vec<u8>> = loc.comps.into();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c.is_empty() || c == b"." {
            continue;
        }
        let last = todo.iter().all(|c| c.is_empty() || c == b".");
        if c == b".." {
            match &mut cur {
                Cur::Host(v) => {
                    v.pop();
                }
                Cur::Emb(i, v) => {
                    if v.pop().is_none() {
                        let mut h = embs()[*i].prefix_comps.clone();
                        h.pop();
                        cur = Cur::Host(h);
                    }
                }
            }
            continue;
        }
        match &mut cur {
            Cur::Host(v) => {
                v.push(c);
                if let Some(l) = match_prefix(&join(v).into_os_string().into_encoded_bytes()) {
                    if l.comps.is_empty() {
                        cur = Cur::Emb(l.idx, Vec::new());
                    }
                }
            }
            Cur::Emb(i, v) => {
                v.push(c);
                if last && !follow {
                    continue;
                }
                let fs = &embs()[*i].fs;
                let p = join(v);
                match fs.getattr(&ctx, &p) {
                    Ok(a) if a.kind == FileKind::Symlink => {
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(libc::ELOOP);
                        }
                        let target = fs.readlink(&ctx, &p).map_err(|e| e.errno())?;
                        let t = target.as_bytes();
                        v.pop();
                        let mut next: VecDeque<Vec<u8>> =
                            t.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
                        next.extend(todo.drain(..));
                        todo = next;
                        if t.starts_with(b"/") {
                            cur = Cur::Host(Vec::new());
                        }
                    }
                    Ok(a) => {
                        if !last && a.kind != FileKind::Dir {
                            return Err(libc::ENOTDIR);
                        }
                    }
                    Err(e) if e.errno() == libc::ENOENT && last => {}
                    Err(e) => return Err(e.errno()),
                }
            }
        }
    }
    Ok(match cur {
        Cur::Host(v) => {
            let p = join(&v).into_os_string().into_encoded_bytes();
            Target::Host(CString::new(p).map_err(|_| libc::EINVAL)?)
        }
        Cur::Emb(idx, v) => Target::Emb(Place {
            idx,
            path: join(&v),
        }),
    })
}
