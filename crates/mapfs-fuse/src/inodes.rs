//! The inode table: FUSE inode numbers <-> paths, with the kernel's lookup
//! counts.
//!
//! A FUSE inode number is the file system's own [`mapfs::Attr::ino`] (so hard
//! links are one inode and `st_ino` is stable), except that the file system's
//! root is always 1, as FUSE requires; a file whose own number is 1 takes the
//! root's number instead.
//!
//! Each inode remembers the names the kernel knows it by, as `(parent inode,
//! name)`; its path is found by walking the first name up to the root. A
//! rename therefore moves a whole subtree by changing one entry.
//!
//! Lock order: this table's lock is a leaf; nothing is called while holding it.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use parking_lot::RwLock;

/// The FUSE root inode.
pub const ROOT: u64 = 1;

#[derive(Debug)]
struct Node {
    /// Names this inode is known by; the first is used to build its path.
    names: Vec<(u64, OsString)>,
    /// How many times the kernel looked it up, minus what it forgot.
    lookups: u64,
}

#[derive(Debug, Default)]
struct Table {
    nodes: HashMap<u64, Node>,
    children: HashMap<(u64, OsString), u64>,
}

/// Thread-safe inode table. See the module docs.
#[derive(Debug)]
pub struct Inodes {
    root_fs_ino: u64,
    table: RwLock<Table>,
}

impl Inodes {
    /// A table whose root has the file system's inode number `root_fs_ino`.
    pub fn new(root_fs_ino: u64) -> Self {
        let mut table = Table::default();
        table.nodes.insert(
            ROOT,
            Node {
                names: Vec::new(),
                lookups: 1,
            },
        );
        Inodes {
            root_fs_ino,
            table: RwLock::new(table),
        }
    }

    /// The FUSE inode number for a file system inode number.
    pub fn fuse_ino(&self, fs_ino: u64) -> u64 {
        if fs_ino == self.root_fs_ino {
            ROOT
        } else if fs_ino == ROOT {
            self.root_fs_ino
        } else {
            fs_ino
        }
    }

    /// The path of `ino` inside the file system, or `None` when the kernel
    /// asks about an inode it has forgotten or that has no name left.
    pub fn path(&self, ino: u64) -> Option<PathBuf> {
        let table = self.table.read();
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        // Bounded walk: a corrupted table must not spin forever.
        for _ in 0..4096 {
            if cur == ROOT {
                let mut path = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
                for p in parts.iter().rev() {
                    path.push(b'/');
                    path.extend_from_slice(p.as_bytes());
                }
                if path.is_empty() {
                    path.push(b'/');
                }
                return Some(PathBuf::from(OsStr::from_bytes(&path)));
            }
            let node = table.nodes.get(&cur)?;
            let (parent, name) = node.names.first()?;
            parts.push(name);
            cur = *parent;
        }
        None
    }

    /// The path of `name` inside directory `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        let mut p = self.path(parent)?;
        p.push(name);
        Some(p)
    }

    /// Records that the kernel looked up `ino` as `name` in `parent`
    /// (`lookup`, `create`, `mkdir`, `readdirplus`...).
    pub fn remember(&self, parent: u64, name: &OsStr, ino: u64) {
        if ino == ROOT {
            return;
        }
        let mut table = self.table.write();
        let key = (parent, name.to_os_string());
        if let Some(old) = table.children.insert(key.clone(), ino) {
            if old != ino {
                // The name now means another file (changed behind our back).
                if let Some(n) = table.nodes.get_mut(&old) {
                    n.names.retain(|k| *k != key);
                }
            }
        }
        let node = table.nodes.entry(ino).or_insert_with(|| Node {
            names: Vec::new(),
            lookups: 0,
        });
        node.lookups += 1;
        if !node.names.contains(&key) {
            node.names.push(key);
        }
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let mut table = self.table.write();
        let Some(node) = table.nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let node = table.nodes.remove(&ino).expect("node present");
            for key in node.names {
                if table.children.get(&key) == Some(&ino) {
                    table.children.remove(&key);
                }
            }
        }
    }

    /// The inode known as `name` in `parent`, if the kernel looked it up.
    pub fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let table = self.table.read();
        table.children.get(&(parent, name.to_os_string())).copied()
    }

    /// `name` in `parent` was removed (unlink, rmdir).
    pub fn unlinked(&self, parent: u64, name: &OsStr) {
        let mut table = self.table.write();
        let key = (parent, name.to_os_string());
        if let Some(ino) = table.children.remove(&key) {
            if let Some(n) = table.nodes.get_mut(&ino) {
                n.names.retain(|k| *k != key);
            }
        }
    }

    /// `name` in `parent` was renamed to `newname` in `newparent`
    /// (`exchange`: the two names were swapped).
    pub fn renamed(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        exchange: bool,
    ) {
        let mut table = self.table.write();
        let from = (parent, name.to_os_string());
        let to = (newparent, newname.to_os_string());
        let src = table.children.remove(&from);
        let dst = table.children.remove(&to);
        let rename_key =
            |table: &mut Table, ino: u64, old: &(u64, OsString), new: (u64, OsString)| {
                if let Some(n) = table.nodes.get_mut(&ino) {
                    for k in n.names.iter_mut() {
                        if k == old {
                            *k = new.clone();
                        }
                    }
                }
                table.children.insert(new, ino);
            };
        if let Some(ino) = dst {
            if exchange {
                rename_key(&mut table, ino, &to, from.clone());
            } else if let Some(n) = table.nodes.get_mut(&ino) {
                n.names.retain(|k| *k != to);
            }
        }
        if let Some(ino) = src {
            rename_key(&mut table, ino, &from, to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_moves_subtree_and_forget_drops() {
        let t = Inodes::new(100);
        t.remember(ROOT, OsStr::new("a"), 10);
        t.remember(10, OsStr::new("b"), 11);
        assert_eq!(t.path(11).unwrap(), PathBuf::from("/a/b"));
        t.renamed(ROOT, OsStr::new("a"), ROOT, OsStr::new("z"), false);
        assert_eq!(t.path(11).unwrap(), PathBuf::from("/z/b"));
        t.forget(11, 1);
        assert!(t.path(11).is_none());
    }

    #[test]
    fn hard_link_keeps_second_name_after_unlink() {
        let t = Inodes::new(100);
        t.remember(ROOT, OsStr::new("x"), 7);
        t.remember(ROOT, OsStr::new("y"), 7);
        t.unlinked(ROOT, OsStr::new("x"));
        assert_eq!(t.path(7).unwrap(), PathBuf::from("/y"));
    }

    #[test]
    fn exchange_swaps_names_and_root_maps_to_one() {
        let t = Inodes::new(100);
        assert_eq!(t.fuse_ino(100), ROOT);
        assert_eq!(t.fuse_ino(ROOT), 100);
        t.remember(ROOT, OsStr::new("p"), 5);
        t.remember(ROOT, OsStr::new("q"), 6);
        t.renamed(ROOT, OsStr::new("p"), ROOT, OsStr::new("q"), true);
        assert_eq!(t.path(5).unwrap(), PathBuf::from("/q"));
        assert_eq!(t.path(6).unwrap(), PathBuf::from("/p"));
        // Overwriting rename: the target loses its name.
        t.renamed(ROOT, OsStr::new("p"), ROOT, OsStr::new("q"), false);
        assert_eq!(t.path(6).unwrap(), PathBuf::from("/q"));
        assert!(t.path(5).is_none());
    }
}
