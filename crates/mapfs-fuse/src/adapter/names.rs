//! Namespace locks: what keeps a path the adapter resolved meaning the same
//! file until its file-system call is done, without a lock over the whole
//! mount.
//!
//! The danger is a call racing a change of names: a `getattr` that turned
//! its inode into `/d/target` while a rename over `/d/target` ran would stat
//! the new file as the old inode (the kernel then shows one file's size with
//! the other's bytes). So:
//!
//! - every directory the kernel knows has a lock of its own, made when
//!   first asked for and dropped when nobody holds it;
//! - a call on an inode holds its own and its parent directory's locks
//!   shared (a call on a name in a directory: that directory's and its
//!   parent's), so the names its path ends with cannot change under it;
//! - `unlink`, `rmdir` and the rename of a non-directory hold the locks of
//!   the directories whose entries they change exclusively, the parents of
//!   those shared (a rename asks the file system what its two names are,
//!   once it holds their directories);
//! - the path of an inode also runs through its ancestors, which only the
//!   rename of a directory changes: every call holds the rename lock
//!   shared, and such a rename holds it exclusively, alone in the mount.
//!
//! Calls in different directories therefore run side by side (a slow
//! `unlink` in a network store holds up only its own directory), and only
//! a directory rename waits for every call in flight. Locks are taken in
//! one order (the rename lock, then directories by increasing node id),
//! so no two calls can wait for each other.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
use parking_lot::{Mutex, RawRwLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::*;

/// The namespace locks of one mount (see the module docs).
#[derive(Default)]
pub(crate) struct NameLocks {
    /// Shared by every call, exclusive for the rename of a directory.
    renames: RwLock<()>,
    /// Per-directory locks by node id, only while held.
    dirs: Mutex<HashMap<u64, Arc<RwLock<()>>>>,
}

/// A directory lock as held.
enum Held {
    Shared(#[allow(dead_code)] ArcRwLockReadGuard<RawRwLock, ()>),
    Exclusive(#[allow(dead_code)] ArcRwLockWriteGuard<RawRwLock, ()>),
}

/// The rename lock as held.
enum Renames<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Locks held for one call; released when dropped.
pub(crate) struct NamesHeld<'a> {
    locks: &'a NameLocks,
    dirs: Vec<(u64, Held)>,
    _renames: Renames<'a>,
}

impl Drop for NamesHeld<'_> {
    fn drop(&mut self) {
        for (id, held) in self.dirs.drain(..) {
            drop(held);
            self.locks.forget_unused(id);
        }
    }
}

impl NameLocks {
    /// Holds the directories `exclusive` exclusively and `shared` shared
    /// (a directory in both is held exclusively), with the rename lock
    /// shared.
    pub(crate) fn hold(&self, exclusive: &[u64], shared: &[u64]) -> NamesHeld<'_> {
        let renames = Renames::Shared(self.renames.read());
        let mut ids: Vec<(u64, bool)> = exclusive
            .iter()
            .map(|&i| (i, true))
            .chain(shared.iter().map(|&i| (i, false)))
            .collect();
        // By id, exclusive first, then one of each id: the order every
        // caller takes them in, and a lock never taken twice.
        ids.sort_by_key(|&(i, excl)| (i, !excl));
        ids.dedup_by_key(|&mut (i, _)| i);
        let dirs = ids
            .into_iter()
            .map(|(id, excl)| {
                let lock = self.lock_of(id);
                let held = if excl {
                    Held::Exclusive(lock.write_arc())
                } else {
                    Held::Shared(lock.read_arc())
                };
                (id, held)
            })
            .collect();
        NamesHeld {
            locks: self,
            dirs,
            _renames: renames,
        }
    }

    /// Holds the whole namespace: no other call that resolves a path runs.
    pub(crate) fn hold_all(&self) -> NamesHeld<'_> {
        NamesHeld {
            locks: self,
            dirs: Vec::new(),
            _renames: Renames::Exclusive(self.renames.write()),
        }
    }

    fn lock_of(&self, id: u64) -> Arc<RwLock<()>> {
        self.dirs.lock().entry(id).or_default().clone()
    }

    /// Drops `id`'s lock from the table if nobody holds or waits for it.
    fn forget_unused(&self, id: u64) {
        let mut dirs = self.dirs.lock();
        if dirs.get(&id).is_some_and(|l| Arc::strong_count(l) == 1) {
            dirs.remove(&id);
        }
    }

    /// How many directory locks exist (held or waited for).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.dirs.lock().len()
    }
}

impl Shared {
    /// Holds the names `ino`'s path ends with, shared: its own (for a
    /// directory, its entries) and its parent's (see the [module docs](self)).
    pub(super) fn hold_node(&self, ino: u64) -> NamesHeld<'_> {
        self.hold_node_and(ino, &[])
    }

    /// [`Shared::hold_node`], with the directories `also` held shared too.
    pub(super) fn hold_node_and(&self, ino: u64, also: &[u64]) -> NamesHeld<'_> {
        // A file's parent changes when it is renamed, which holds its old
        // directory: once that is held, it is checked again.
        for _ in 0..8 {
            let parent = self.inodes.parent(ino);
            let mut shared = vec![ino, parent.unwrap_or(ino)];
            shared.extend_from_slice(also);
            let held = self.names.hold(&[], &shared);
            if self.inodes.parent(ino) == parent {
                return held;
            }
        }
        // Renamed back and forth all along: nothing moves while all is held.
        self.names.hold_all()
    }

    /// Holds directory `dir` for a call on a name in it: its entries
    /// (`exclusive` for a call that removes one) and its own name, in its
    /// parent. A directory moves only while all is held, so its parent
    /// stays.
    pub(super) fn hold_dir(&self, dir: u64, exclusive: bool) -> NamesHeld<'_> {
        let up = self.inodes.parent(dir).unwrap_or(dir);
        if exclusive {
            self.names.hold(&[dir], &[up])
        } else {
            self.names.hold(&[], &[dir, up])
        }
    }

    /// Holds what a rename of `name` in `parent` to `newname` in
    /// `newparent` changes: the two directories, exclusively, when both
    /// names are of non-directories (or missing); the whole namespace when
    /// either is a directory, whose name is in the path of everything
    /// below it. The kinds are asked once the directories are held, when
    /// nothing through the mount can change them.
    pub(super) fn hold_rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
    ) -> NamesHeld<'_> {
        let up = |d: u64| self.inodes.parent(d).unwrap_or(d);
        let held = self
            .names
            .hold(&[parent, newparent], &[up(parent), up(newparent)]);
        let dir_or_unknown = |dir: u64, name: &OsStr| {
            let Some(path) = self.inodes.child_path(dir, name) else {
                return true;
            };
            match self.fs.getattr(&ROOT_CTX, &path) {
                Ok(a) => a.kind == FileKind::Dir,
                // Nothing there: the rename fails, or makes the name.
                Err(e) => e.errno() != libc::ENOENT,
            }
        };
        if dir_or_unknown(parent, name) || dir_or_unknown(newparent, newname) {
            drop(held);
            self.names.hold_all()
        } else {
            held
        }
    }

    /// Holds what `link` of `ino` as a name in `newparent` uses.
    pub(super) fn hold_link(&self, ino: u64, newparent: u64) -> NamesHeld<'_> {
        let up = self.inodes.parent(newparent).unwrap_or(newparent);
        self.hold_node_and(ino, &[newparent, up])
    }

    pub(super) fn path(&self, ino: INodeNo) -> Result<PathBuf> {
        // ESTALE, not ENOENT: the kernel holds an inode whose name was
        // removed or replaced (a rename over it); for a path-based call
        // the VFS then looks the name up again and finds what is there now.
        self.inodes
            .path(ino.0)
            .ok_or_else(|| Error::from_errno(libc::ESTALE))
    }

    /// The path of `name` in directory `parent`, for a trace event: taken
    /// when the request runs, since by the time the event is read the
    /// directory may be gone (`#INO/NAME` when it has no path).
    pub(super) fn trace_path(&self, parent: INodeNo, name: &OsStr) -> Vec<u8> {
        let mut p = self.inodes.path(parent.0).map_or_else(
            || format!("#{}", parent.0).into_bytes(),
            |p| p.as_os_str().as_bytes().to_vec(),
        );
        if !p.ends_with(b"/") {
            p.push(b'/');
        }
        p.extend_from_slice(name.as_bytes());
        p
    }

    pub(super) fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Err(Error::invalid());
        }
        self.inodes
            .child_path(parent.0, name)
            .ok_or_else(Error::not_found)
    }

    /// The FUSE inode the kernel knows as `name` in `parent`, for bumping
    /// its map-cache token around a namespace change (the kernel looks a
    /// name up before it unlinks or renames it).
    pub(super) fn ino_at(&self, parent: INodeNo, name: &OsStr) -> Option<u64> {
        self.inodes.child(parent.0, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn other_directories_are_not_held_back() {
        let locks = Arc::new(NameLocks::default());
        let held = locks.hold(&[5], &[1]);
        let (tx, rx) = mpsc::channel();
        let l = locks.clone();
        std::thread::spawn(move || {
            // One call at a time, as a request holds them.
            drop(l.hold(&[7], &[1]));
            drop(l.hold(&[], &[8, 1]));
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a call in another directory waited");
        drop(held);
        assert_eq!(locks.live(), 0, "locks nobody holds are dropped");
    }

    #[test]
    fn the_same_directory_waits_for_its_writer() {
        let locks = Arc::new(NameLocks::default());
        let held = locks.hold(&[5], &[]);
        let (tx, rx) = mpsc::channel();
        let l = locks.clone();
        std::thread::spawn(move || {
            let _g = l.hold(&[], &[5, 5, 1]);
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(held);
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the reader never got the directory");
    }

    #[test]
    fn a_directory_rename_waits_for_every_call() {
        let locks = Arc::new(NameLocks::default());
        let held = locks.hold(&[], &[3]);
        let (tx, rx) = mpsc::channel();
        let l = locks.clone();
        std::thread::spawn(move || {
            let _g = l.hold_all();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(held);
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the rename never got the namespace");
    }
}
