//! The directories a path walk passes, kept in memory so that resolving
//! `a/b/c` reads only `c` from the database.
//!
//! Only what a walk needs of a directory is trusted from here: its inode
//! number and its mode and owner (search permission, setgid inheritance).
//! Those change only by a rename or removal of a directory, or a `chmod` or
//! `chown` of one, all made by this daemon (the `mapfs pack` tools never
//! touch directories, and a second instance is refused), and each of them
//! empties the cache before the database lock is let go. Times, sizes and
//! link counts of the final name of a path always come from the database.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::db::Inode;

/// Most directories remembered; past it the cache starts afresh, so a tree
/// of any size costs bounded memory.
const MAX_DIRS: usize = 65_536;

/// Directory entries that name directories: `(parent, name) -> inode`.
#[derive(Default, Debug)]
pub struct DirCache {
    dirs: Mutex<HashMap<(i64, Vec<u8>), Inode>>,
}

impl DirCache {
    /// The directory `name` of `parent`, if remembered.
    pub fn get(&self, parent: i64, name: &[u8]) -> Option<Inode> {
        // The key is built only to look up: names are short.
        self.dirs.lock().get(&(parent, name.to_vec())).cloned()
    }

    /// Remembers `i` as entry `name` of `parent`, if it is a directory.
    pub fn put(&self, parent: i64, name: &[u8], i: &Inode) {
        if !i.is_dir() {
            return;
        }
        let mut d = self.dirs.lock();
        if d.len() >= MAX_DIRS {
            d.clear();
        }
        d.insert((parent, name.to_vec()), i.clone());
    }

    /// Forgets every directory (a directory was renamed, removed, or had
    /// its mode or owner changed).
    pub fn clear(&self) {
        self.dirs.lock().clear();
    }

    /// Directories remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.dirs.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(ino: i64, kind: u32) -> Inode {
        crate::pack::db::test_inode(ino, kind | 0o755)
    }

    #[test]
    fn keeps_directories_only_and_stays_bounded() {
        let c = DirCache::default();
        c.put(1, b"file", &inode(2, libc::S_IFREG));
        assert!(c.get(1, b"file").is_none());
        for i in 0..(MAX_DIRS as i64 + 10) {
            c.put(1, format!("d{i}").as_bytes(), &inode(i + 10, libc::S_IFDIR));
            assert!(c.len() <= MAX_DIRS);
        }
        let last = MAX_DIRS as i64 + 9;
        assert_eq!(
            c.get(1, format!("d{last}").as_bytes()).unwrap().ino,
            last + 10
        );
        c.clear();
        assert_eq!(c.len(), 0);
    }
}
