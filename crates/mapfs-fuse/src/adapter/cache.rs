//! Kernel-cache policy: what the kernel is told with every reply that
//! carries entries or attributes (their lifetimes, negative entries, the
//! sizes only the daemon knows), and which cached pages it may keep.

use super::*;

/// The entry of a name that does not exist: node id 0 tells the kernel so,
/// and it keeps a negative dentry for the entry TTL.
pub(super) fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 0,
    }
}

impl Shared {
    /// The attributes to send the kernel for the inode it knows as `ino`
    /// (every reply carrying them goes through here, lookups and directory
    /// listings included; `a.ino` is the file system's number, which may
    /// differ, see [`Inodes`]). A file written through an open whose map is
    /// not whole-file 1-to-1 has the size that open gave it: the file system
    /// learns it only at flush.
    pub(super) fn fuse_attr(&self, ino: u64, a: &Attr) -> FileAttr {
        let size = match a.kind {
            FileKind::File => self
                .handles
                .lent_size(ino)
                .or_else(|| self.handles.written_size(ino, a.size))
                .unwrap_or(a.size),
            _ => a.size,
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: a.blocks,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.ctime,
            kind: file_type(a.kind),
            perm: a.perm,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            flags: 0,
            blksize: a.blksize,
        }
    }

    /// Answers a `CREATE` with entry `fa` and handle `fh`, run by the
    /// kernel on `backing` if there is one.
    pub(super) fn answer_created(
        &self,
        reply: ReplyCreate,
        fa: &FileAttr,
        fh: u64,
        fopen: FopenFlags,
        backing: Option<&fuser::BackingId>,
    ) {
        // One TTL serves entry and attributes here: the stricter one.
        let ttl = self.opts.entry_ttl.min(self.opts.ttl);
        match backing {
            Some(id) => {
                reply.created_passthrough(&ttl, fa, Generation(0), FileHandle(fh), fopen, id)
            }
            None => reply.created(&ttl, fa, Generation(0), FileHandle(fh), fopen),
        }
    }

    /// Replies with a new entry and records the kernel's reference.
    pub(super) fn entry(&self, parent: INodeNo, name: &OsStr, attr: &Attr, reply: ReplyEntry) {
        let fa = self.enter(parent, name, attr);
        let ttl = self.attr_ttl(fa.ino.0);
        // fuser takes the attribute TTL first, then the entry's.
        reply.entry_with_ttls(&ttl, &self.opts.entry_ttl, &fa, Generation(0));
    }

    /// How long the kernel may cache the attributes of `ino`: not at all
    /// while a shim client writes it through its own map (its size changes
    /// where only the shared size page shows it).
    pub(super) fn attr_ttl(&self, ino: u64) -> Duration {
        if self.handles.lent_size(ino).is_some() {
            Duration::ZERO
        } else {
            self.opts.ttl
        }
    }

    /// Whether kernel inode `ino`'s file may change where its pages do not
    /// see it: another kernel inode of the file, or an open that may write
    /// it (what [`KeptPages`](crate::pagecache::KeptPages) is told).
    pub(super) fn may_be_written(&self, ino: u64) -> bool {
        !self.inodes.sole_node(ino) || self.handles.has_writer(ino)
    }

    /// Before the file system releases `file`, the last writable open of
    /// its inode and run by kernel passthrough: if the file system moves
    /// such a file to a map the daemon runs
    /// ([`Capabilities::leaves_whole_file_at_close`]) and it is small
    /// enough, its bytes go into the kernel's pages (`FUSE_NOTIFY_STORE`),
    /// which passthrough writes never filled, so that the next open keeps
    /// them instead of reading through the daemon. Done before the move:
    /// an open that comes meanwhile still gets the file by passthrough (and,
    /// if it may write, leaves the pages unclean); one that comes after
    /// writes through these pages.
    pub(super) fn fill_pages_at_close(&self, file: &OpenFile) {
        // A larger threshold would copy megabytes at a close for a read
        // that may never come.
        let limit = self.caps.leaves_whole_file_at_close.min(1 << 20);
        let writable = file.flags & libc::O_ACCMODE != libc::O_RDONLY;
        if limit == 0 || !writable || file.backing.is_none() || !self.pages.enabled() {
            return;
        }
        let Some(backing) = file.data.whole_file_backing() else {
            return;
        };
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        let ino = file.ino;
        if self.may_be_written(ino) {
            return;
        }
        let (bytes, version) = match crate::pagecache::small_file_bytes(backing, limit) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(ino, "no pages filled at close: {e}");
                return;
            }
        };
        self.pages.filled(
            self.inodes.fs_ino(ino),
            || self.may_be_written(ino),
            || {
                if notifier.store(INodeNo(ino), 0, &bytes).is_err() {
                    return false;
                }
                // A truncate by path meanwhile (no open needed) changed the
                // file: the pages stored may hold what it cut.
                if !crate::pagecache::unchanged_since(backing, &version) {
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                    return false;
                }
                true
            },
        );
    }

    /// Records the kernel's reference to `attr`'s file as `name` in
    /// `parent` and gives its attributes under the nodeid it gets.
    pub(super) fn enter(&self, parent: INodeNo, name: &OsStr, attr: &Attr) -> FileAttr {
        // Names the table holds as this file's hard links are checked
        // first: one may name another file now (`Inodes::other_names`).
        // Asked as the daemon; a name it cannot check is dropped, which
        // costs a real hard link a second kernel inode at worst.
        for (p, n, path) in self.inodes.other_names(parent.0, name, attr.ino) {
            let same = self
                .fs
                .getattr(&Ctx::current(), &path)
                .is_ok_and(|a| a.ino == attr.ino);
            if !same {
                self.inodes.unname(p, &n, attr.ino);
            }
        }
        let ino = self.inodes.enter(parent.0, name, attr.ino);
        if self.pages.enabled() && !self.inodes.sole_node(ino) {
            // Writes through one kernel inode of the file do not reach the
            // other's pages.
            self.pages.written_outside(attr.ino);
        }
        self.fuse_attr(ino, attr)
    }
}
