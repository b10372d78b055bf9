//! The inode table: FUSE inode numbers (nodeids) <-> paths, with the
//! kernel's lookup counts.
//!
//! A nodeid is normally the file system's own [`mapfs::Attr::ino`] (so hard
//! links are one inode and `st_ino` through the mount is the file system's
//! number), except that the file system's root is always 1, as FUSE requires;
//! a file whose own number is 1 takes the root's number instead.
//!
//! Backing file systems reuse inode numbers, and the kernel keeps an inode
//! (and its nodeid) until it sends FORGET, which may be long after the file
//! was unlinked or renamed over (an open of it, or simply an unused cached
//! inode). An entry reply with a nodeid the kernel still holds makes it reuse
//! its in-core inode, cached size and pages included, for the new file. So a
//! nodeid is never handed to a second file while the kernel holds it: when the
//! node a file system number maps to is held but belongs to another file (it
//! has no name left, or it is a fresh nodeid of another number), the new file
//! gets a fresh nodeid from [`FRESH_BASE`] up (skipping any in the table), and
//! the table maps the file system number to it until the kernel forgets it.
//! A file whose name is gone is only reachable through the kernel's old
//! inode, so an entry for its number is taken to be another file; the one
//! case where it is the same file (a hard link the kernel had not looked up
//! yet, after the name it knew was removed) then gets two kernel inodes, as
//! on NFS, rather than risking the reverse. A name the table holds may also
//! name another file now, replaced without a lookup: before a file's node
//! is given to a new name as a hard link, the adapter checks the node's
//! other names ([`Inodes::other_names`], [`Inodes::unname`]).
//!
//! Each inode remembers the names the kernel knows it by, as `(parent inode,
//! name)`; its path is found by walking the first name up to the root. A
//! rename therefore moves a whole subtree by changing one entry.
//!
//! Under a supervisor (see [`crate::failover`]) every change is also sent to
//! it, while the table is locked so the supervisor replays them in the same
//! order and ends with the same table; a new daemon starts from that copy.
//!
//! Lock order: this table's lock is a leaf; nothing is called while holding
//! it but the journal's send.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use parking_lot::RwLock;

use crate::failover::records::{InodeOp, NodeSnap, TableSnap};

/// Where an inode table reports its changes (the supervisor's link).
pub trait InodeJournal: Send + Sync + std::fmt::Debug {
    /// Records one change; called with the table locked.
    fn inode(&self, op: InodeOp);
}

/// The FUSE root inode.
pub const ROOT: u64 = 1;

/// First nodeid given to a file whose own number is held by the kernel for
/// another file. Far above the numbers local file systems hand out (ext4 and
/// tmpfs: 32 bits; xfs and btrfs: small in practice), so the rare collision
/// with a live number is only handled, never common.
pub const FRESH_BASE: u64 = 1 << 62;

#[derive(Debug)]
struct Node {
    /// The file system's inode number of this file.
    fs_ino: u64,
    /// Names this inode is known by; the first is used to build its path.
    names: Vec<(u64, OsString)>,
    /// How many times the kernel looked it up, minus what it forgot.
    lookups: u64,
}

#[derive(Debug, Default)]
struct Table {
    nodes: HashMap<u64, Node>,
    children: HashMap<(u64, OsString), u64>,
    /// File system numbers whose current file has a fresh nodeid.
    fresh: HashMap<u64, u64>,
    /// Next fresh nodeid to try.
    next_fresh: u64,
    /// How many nodes the kernel holds for each file system number (more
    /// than one while a replaced file's old inode is held beside a fresh
    /// one, or a hard link got a second inode: see the module docs).
    per_fs: HashMap<u64, u32>,
}

impl Table {
    fn counted_in(&mut self, fs_ino: u64) {
        *self.per_fs.entry(fs_ino).or_default() += 1;
    }

    fn counted_out(&mut self, fs_ino: u64) {
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.per_fs.entry(fs_ino) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// Thread-safe inode table. See the module docs.
#[derive(Debug)]
pub struct Inodes {
    root_fs_ino: u64,
    table: RwLock<Table>,
    journal: std::sync::OnceLock<std::sync::Arc<dyn InodeJournal>>,
}

impl Inodes {
    /// A table whose root has the file system's inode number `root_fs_ino`.
    pub fn new(root_fs_ino: u64) -> Self {
        let mut table = Table {
            next_fresh: FRESH_BASE,
            ..Table::default()
        };
        table.counted_in(root_fs_ino);
        table.nodes.insert(
            ROOT,
            Node {
                fs_ino: root_fs_ino,
                names: Vec::new(),
                lookups: 1,
            },
        );
        Inodes {
            root_fs_ino,
            table: RwLock::new(table),
            journal: std::sync::OnceLock::new(),
        }
    }

    /// Reports every later change to `journal`.
    pub fn set_journal(&self, journal: std::sync::Arc<dyn InodeJournal>) {
        let _ = self.journal.set(journal);
    }

    fn record(&self, op: impl FnOnce() -> InodeOp) {
        if let Some(j) = self.journal.get() {
            j.inode(op());
        }
    }

    /// Replays a change recorded by another table (the supervisor's copy).
    pub fn apply(&self, op: InodeOp) {
        match op {
            InodeOp::Enter {
                parent,
                name,
                fs_ino,
            } => {
                self.enter(parent, OsStr::from_bytes(&name), fs_ino);
            }
            InodeOp::Forget { ino, n } => {
                self.forget(ino, n);
            }
            InodeOp::Unlinked { parent, name } => self.unlinked(parent, OsStr::from_bytes(&name)),
            InodeOp::Renamed {
                parent,
                name,
                newparent,
                newname,
                exchange,
            } => self.renamed(
                parent,
                OsStr::from_bytes(&name),
                newparent,
                OsStr::from_bytes(&newname),
                exchange,
            ),
        }
    }

    /// The whole table, for a daemon that takes over.
    pub fn snapshot(&self) -> (TableSnap, Vec<NodeSnap>) {
        let table = self.table.read();
        let nodes = table
            .nodes
            .iter()
            .map(|(&nodeid, n)| NodeSnap {
                nodeid,
                fs_ino: n.fs_ino,
                names: n
                    .names
                    .iter()
                    .map(|(p, name)| (*p, name.as_bytes().to_vec()))
                    .collect(),
                lookups: n.lookups,
            })
            .collect();
        (
            TableSnap {
                next_fresh: table.next_fresh,
                fresh: table.fresh.iter().map(|(&a, &b)| (a, b)).collect(),
            },
            nodes,
        )
    }

    /// Rebuilds the table from a [`Inodes::snapshot`] (replacing what it
    /// holds); not recorded.
    pub fn restore(&self, snap: TableSnap, nodes: Vec<NodeSnap>) {
        let mut table = self.table.write();
        let root = table.nodes.remove(&ROOT);
        table.nodes.clear();
        table.children.clear();
        table.fresh.clear();
        table.next_fresh = snap.next_fresh.max(FRESH_BASE);
        table.fresh = snap.fresh.into_iter().collect();
        if let Some(root) = root {
            table.nodes.insert(ROOT, root);
        }
        for n in nodes {
            let names: Vec<(u64, OsString)> = n
                .names
                .into_iter()
                .map(|(p, name)| (p, OsStr::from_bytes(&name).to_os_string()))
                .collect();
            for key in &names {
                table.children.insert(key.clone(), n.nodeid);
            }
            table.nodes.insert(
                n.nodeid,
                Node {
                    fs_ino: n.fs_ino,
                    names,
                    lookups: n.lookups,
                },
            );
        }
        table.per_fs.clear();
        let held: Vec<u64> = table.nodes.values().map(|n| n.fs_ino).collect();
        for f in held {
            table.counted_in(f);
        }
    }

    /// The nodeid a file system number has when no other file holds it:
    /// itself, with the root and 1 swapped.
    fn natural(&self, fs_ino: u64) -> u64 {
        if fs_ino == self.root_fs_ino {
            ROOT
        } else if fs_ino == ROOT {
            self.root_fs_ino
        } else {
            fs_ino
        }
    }

    /// The nodeid the kernel knows the current file with file system number
    /// `fs_ino` by (for `d_ino` in directory listings; takes no reference).
    pub fn nodeid_of(&self, fs_ino: u64) -> u64 {
        let table = self.table.read();
        table
            .fresh
            .get(&fs_ino)
            .copied()
            .unwrap_or_else(|| self.natural(fs_ino))
    }

    /// The file system's inode number of the file the kernel knows as
    /// `nodeid`.
    pub fn fs_ino(&self, nodeid: u64) -> u64 {
        let table = self.table.read();
        match table.nodes.get(&nodeid) {
            Some(n) => n.fs_ino,
            // A nodeid the kernel no longer holds: only natural ones can
            // be asked about again.
            None => self.natural(nodeid),
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

    /// The nodeid file system number `fs_ino` may be entered under without
    /// a fresh one: that of a node the kernel knows by a name and made for
    /// this number, or the natural one if no node has it. A held node
    /// without a name is an unlinked or replaced file (see the module docs).
    fn known_nodeid(&self, t: &Table, fs_ino: u64) -> Option<u64> {
        if self.natural(fs_ino) == ROOT {
            return Some(ROOT);
        }
        let named = |id: u64| {
            t.nodes
                .get(&id)
                .is_some_and(|n| n.fs_ino == fs_ino && !n.names.is_empty())
        };
        if let Some(&id) = t.fresh.get(&fs_ino) {
            if named(id) {
                return Some(id);
            }
        }
        let natural = self.natural(fs_ino);
        (!t.nodes.contains_key(&natural) || named(natural)).then_some(natural)
    }

    /// Whether file system number `fs_ino` as `name` in `parent` agrees
    /// with the table: the name means that number or nothing yet, and the
    /// number is not one of a file the kernel holds with no name left. A
    /// directory listing made earlier than now re-checks an entry that
    /// does not agree (it may describe a file replaced since).
    pub fn agrees(&self, parent: u64, name: &OsStr, fs_ino: u64) -> bool {
        let table = self.table.read();
        let by_name = table
            .children
            .get(&(parent, name.to_os_string()))
            .and_then(|id| table.nodes.get(id));
        by_name.is_none_or(|n| n.fs_ino == fs_ino) && self.known_nodeid(&table, fs_ino).is_some()
    }

    /// Records that the kernel looked up the file with file system number
    /// `fs_ino` as `name` in `parent` (`lookup`, `create`, `mkdir`,
    /// `readdirplus`...), and returns the nodeid to reply with.
    pub fn enter(&self, parent: u64, name: &OsStr, fs_ino: u64) -> u64 {
        let natural = self.natural(fs_ino);
        if natural == ROOT {
            return ROOT;
        }
        let mut table = self.table.write();
        let table = &mut *table;
        let ino = match self.known_nodeid(table, fs_ino) {
            Some(id) => {
                if id == natural {
                    table.fresh.remove(&fs_ino);
                }
                id
            }
            None => {
                let mut id = table.next_fresh;
                while id == ROOT || table.nodes.contains_key(&id) {
                    id = id.checked_add(1).unwrap_or(FRESH_BASE);
                }
                table.next_fresh = id.checked_add(1).unwrap_or(FRESH_BASE);
                table.fresh.insert(fs_ino, id);
                id
            }
        };
        let key = (parent, name.to_os_string());
        if let Some(old) = table.children.insert(key.clone(), ino) {
            if old != ino {
                // The name now means another file.
                if let Some(n) = table.nodes.get_mut(&old) {
                    n.names.retain(|k| *k != key);
                }
            }
        }
        if !table.nodes.contains_key(&ino) {
            table.counted_in(fs_ino);
        }
        let node = table.nodes.entry(ino).or_insert_with(|| Node {
            fs_ino,
            names: Vec::new(),
            lookups: 0,
        });
        node.lookups += 1;
        if !node.names.contains(&key) {
            node.names.push(key);
        }
        self.record(|| InodeOp::Enter {
            parent,
            name: name.as_bytes().to_vec(),
            fs_ino,
        });
        ino
    }

    /// The kernel dropped `n` references to `ino`. Returns the file
    /// system number of a file whose last node this removed.
    pub fn forget(&self, ino: u64, n: u64) -> Option<u64> {
        if ino == ROOT {
            return None;
        }
        let mut table = self.table.write();
        let node = table.nodes.get_mut(&ino)?;
        self.record(|| InodeOp::Forget { ino, n });
        node.lookups = node.lookups.saturating_sub(n);
        let mut last = None;
        if node.lookups == 0 {
            let node = table.nodes.remove(&ino).expect("node present");
            table.counted_out(node.fs_ino);
            if !table.per_fs.contains_key(&node.fs_ino) {
                last = Some(node.fs_ino);
            }
            if table.fresh.get(&node.fs_ino) == Some(&ino) {
                table.fresh.remove(&node.fs_ino);
            }
            for key in node.names {
                if table.children.get(&key) == Some(&ino) {
                    table.children.remove(&key);
                }
            }
        }
        last
    }

    /// True when `ino` is the only node the kernel holds for its file: its
    /// pages in the kernel's cache are then the only ones of that file,
    /// and every write through the mount goes through them.
    pub fn sole_node(&self, ino: u64) -> bool {
        let table = self.table.read();
        table
            .nodes
            .get(&ino)
            .is_some_and(|n| table.per_fs.get(&n.fs_ino) == Some(&1))
    }

    /// The directory `ino`'s path goes through last (the parent of its
    /// first name), or `None` for the root and a node with no name left.
    pub fn parent(&self, ino: u64) -> Option<u64> {
        let table = self.table.read();
        table.nodes.get(&ino)?.names.first().map(|(p, _)| *p)
    }

    /// The inode known as `name` in `parent`, if the kernel looked it up.
    pub fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let table = self.table.read();
        table.children.get(&(parent, name.to_os_string())).copied()
    }

    /// The other names (and their paths) of the node file system number
    /// `fs_ino` would be entered under as `name` in `parent`: names the
    /// table believes are hard links of that file. The caller checks them
    /// ([`Inodes::unname`] for those that are not): a name whose file was
    /// replaced without a lookup (an open within the entry time that the
    /// file system answered with a new file, as `versions` does for
    /// `O_TRUNC`) still names the old file's node, and once the backing
    /// file system gives the old file's number to a new file, that node
    /// would be handed to the new file, and the new name would read the
    /// old name's file.
    pub fn other_names(
        &self,
        parent: u64,
        name: &OsStr,
        fs_ino: u64,
    ) -> Vec<(u64, OsString, PathBuf)> {
        // Filtered under the lock: a lookup of a file's only name (the
        // common case) copies nothing.
        let others: Vec<(u64, OsString)> = {
            let t = self.table.read();
            let Some(n) = self
                .known_nodeid(&t, fs_ino)
                .and_then(|id| t.nodes.get(&id))
            else {
                return Vec::new();
            };
            n.names
                .iter()
                .filter(|(p, n)| !(*p == parent && n == name))
                .cloned()
                .collect()
        };
        others
            .into_iter()
            .filter_map(|(p, n)| {
                let path = self.child_path(p, &n)?;
                Some((p, n, path))
            })
            .collect()
    }

    /// `name` in `parent` no longer names the file of number `fs_ino`
    /// (see [`Inodes::other_names`]): the table forgets that name of its
    /// node, as for an unlink.
    pub fn unname(&self, parent: u64, name: &OsStr, fs_ino: u64) {
        let holds = {
            let t = self.table.read();
            t.children
                .get(&(parent, name.to_os_string()))
                .and_then(|id| t.nodes.get(id))
                .is_some_and(|n| n.fs_ino == fs_ino)
        };
        if holds {
            self.unlinked(parent, name);
        }
    }

    /// `name` in `parent` was removed (unlink, rmdir).
    pub fn unlinked(&self, parent: u64, name: &OsStr) {
        let mut table = self.table.write();
        let key = (parent, name.to_os_string());
        if let Some(ino) = table.children.remove(&key) {
            self.record(|| InodeOp::Unlinked {
                parent,
                name: name.as_bytes().to_vec(),
            });
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
        self.record(|| InodeOp::Renamed {
            parent,
            name: name.as_bytes().to_vec(),
            newparent,
            newname: newname.as_bytes().to_vec(),
            exchange,
        });
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
        assert_eq!(t.enter(ROOT, OsStr::new("a"), 10), 10);
        assert_eq!(t.enter(10, OsStr::new("b"), 11), 11);
        assert_eq!(t.path(11).unwrap(), PathBuf::from("/a/b"));
        t.renamed(ROOT, OsStr::new("a"), ROOT, OsStr::new("z"), false);
        assert_eq!(t.path(11).unwrap(), PathBuf::from("/z/b"));
        t.forget(11, 1);
        assert!(t.path(11).is_none());
    }

    #[test]
    fn hard_link_keeps_second_name_after_unlink() {
        let t = Inodes::new(100);
        assert_eq!(t.enter(ROOT, OsStr::new("x"), 7), 7);
        assert_eq!(t.enter(ROOT, OsStr::new("y"), 7), 7);
        t.unlinked(ROOT, OsStr::new("x"));
        assert_eq!(t.path(7).unwrap(), PathBuf::from("/y"));
    }

    #[test]
    fn exchange_swaps_names_and_root_maps_to_one() {
        let t = Inodes::new(100);
        assert_eq!(t.nodeid_of(100), ROOT);
        assert_eq!(t.nodeid_of(ROOT), 100);
        assert_eq!(t.fs_ino(ROOT), 100);
        assert_eq!(t.fs_ino(100), ROOT);
        assert_eq!(t.enter(ROOT, OsStr::new("one"), ROOT), 100);
        assert_eq!(t.path(100).unwrap(), PathBuf::from("/one"));
        assert_eq!(t.enter(ROOT, OsStr::new("p"), 5), 5);
        assert_eq!(t.enter(ROOT, OsStr::new("q"), 6), 6);
        t.renamed(ROOT, OsStr::new("p"), ROOT, OsStr::new("q"), true);
        assert_eq!(t.path(5).unwrap(), PathBuf::from("/q"));
        assert_eq!(t.path(6).unwrap(), PathBuf::from("/p"));
        // Overwriting rename: the target loses its name.
        t.renamed(ROOT, OsStr::new("p"), ROOT, OsStr::new("q"), false);
        assert_eq!(t.path(6).unwrap(), PathBuf::from("/q"));
        assert!(t.path(5).is_none());
    }

    #[test]
    fn reused_number_of_a_held_file_gets_a_fresh_nodeid_until_forgotten() {
        let t = Inodes::new(100);
        let (old, tmp) = (OsStr::new("target"), OsStr::new("tmp"));
        assert_eq!(t.enter(ROOT, old, 7), 7);
        // Renamed over while the kernel holds it: the old file has no name.
        assert_eq!(t.enter(ROOT, tmp, 8), 8);
        t.renamed(ROOT, tmp, ROOT, old, false);
        assert!(t.path(7).is_none());
        // A new file reuses 7: not the kernel's inode 7.
        let new = t.enter(ROOT, tmp, 7);
        assert!(new >= FRESH_BASE, "fresh nodeid, got {new}");
        assert_eq!(t.fs_ino(new), 7);
        assert_eq!(t.fs_ino(7), 7);
        assert_eq!(t.nodeid_of(7), new);
        assert_eq!(t.path(new).unwrap(), PathBuf::from("/tmp"));
        // Its next lookups and hard links find the same nodeid.
        assert_eq!(t.enter(ROOT, tmp, 7), new);
        assert_eq!(t.enter(ROOT, OsStr::new("link"), 7), new);
        // A number equal to a live fresh nodeid gets another one.
        let other = t.enter(ROOT, OsStr::new("big"), new);
        assert!(other != new && other >= FRESH_BASE);
        assert_eq!(t.fs_ino(other), new);
        // Forgetting the old inode leaves the mapping of the live one.
        t.forget(7, 1);
        assert_eq!(t.nodeid_of(7), new);
        assert_eq!(t.enter(ROOT, tmp, 7), new);
        // Once the fresh one is forgotten too, 7 is 7 again.
        t.forget(new, 4);
        assert!(t.path(new).is_none());
        assert_eq!(t.nodeid_of(7), 7);
        assert_eq!(t.enter(ROOT, tmp, 7), 7);
        // The same file looked up again while held keeps its nodeid.
        assert_eq!(t.enter(ROOT, tmp, 7), 7);
        assert_eq!(t.path(7).unwrap(), PathBuf::from("/tmp"));
    }

    #[test]
    fn listing_entries_that_disagree_with_the_table() {
        let t = Inodes::new(100);
        assert!(
            t.agrees(ROOT, OsStr::new("a"), 7),
            "unknown name and number"
        );
        t.enter(ROOT, OsStr::new("a"), 7);
        assert!(t.agrees(ROOT, OsStr::new("a"), 7));
        assert!(t.agrees(ROOT, OsStr::new("b"), 7), "another name of 7");
        assert!(!t.agrees(ROOT, OsStr::new("a"), 8), "a means 7 now");
        t.unlinked(ROOT, OsStr::new("a"));
        assert!(!t.agrees(ROOT, OsStr::new("b"), 7), "7 is held, nameless");
        assert!(t.agrees(ROOT, OsStr::new("a"), 8));
    }

    #[test]
    fn held_unnamed_fresh_node_gives_way_to_natural_nodeid() {
        let t = Inodes::new(100);
        assert_eq!(t.enter(ROOT, OsStr::new("a"), 7), 7);
        t.unlinked(ROOT, OsStr::new("a"));
        let f = t.enter(ROOT, OsStr::new("b"), 7);
        assert!(f >= FRESH_BASE);
        t.unlinked(ROOT, OsStr::new("b"));
        // Both held and nameless: a third file gets a third nodeid.
        let g = t.enter(ROOT, OsStr::new("c"), 7);
        assert!(g != f && g >= FRESH_BASE);
        t.unlinked(ROOT, OsStr::new("c"));
        // The natural one is free again: preferred over another fresh one.
        t.forget(7, 1);
        assert_eq!(t.enter(ROOT, OsStr::new("d"), 7), 7);
        assert_eq!(t.nodeid_of(7), 7);
        t.forget(g, 1);
        t.forget(f, 1);
        assert_eq!(t.nodeid_of(7), 7);
    }

    #[test]
    fn a_file_held_by_two_nodes_is_no_sole_node_until_one_is_forgotten() {
        let t = Inodes::new(100);
        let a = t.enter(ROOT, OsStr::new("a"), 7);
        assert!(t.sole_node(a));
        t.unlinked(ROOT, OsStr::new("a"));
        // A hard link found after the first name went: a second node.
        let b = t.enter(ROOT, OsStr::new("b"), 7);
        assert_ne!(a, b);
        assert!(!t.sole_node(a) && !t.sole_node(b));
        assert_eq!(t.forget(a, 1), None, "b still holds file 7");
        assert!(t.sole_node(b));
        assert_eq!(t.forget(b, 1), Some(7), "the last node of file 7");
        assert!(!t.sole_node(b));
    }
}
