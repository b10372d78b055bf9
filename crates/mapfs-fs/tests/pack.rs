//! `pack` at the trait level, no FUSE: every open's map is run by
//! `mapfs::engine::DataFile` as an executor runs it (open, writes, reads,
//! truncates, then `flush`/`release` with `DataFile::map()`), bytes checked
//! against a `Vec<u8>` model; the namespace is checked call by call; crash
//! recovery by dropping the file system without releasing its opens.

use std::ffi::OsStr;
use std::path::Path;

use mapfs::engine::DataFile;
use mapfs::{Ctx, FileKind, FileSystem, OpenFlags, Opened, RenameFlags, SetAttr};
use mapfs_fs::pack::{check, stats, Pack, PackOptions};

const ROOT: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};
const NOBODY: Ctx = Ctx {
    uid: 65534,
    gid: 65534,
    pid: 0,
};

fn p(s: &str) -> &Path {
    Path::new(s)
}

fn pack(dir: &Path, threshold: &str) -> Pack {
    Pack::new(dir, PackOptions::parse(Some(threshold), None).unwrap()).unwrap()
}

/// The store in `dir`, which no instance holds, is consistent.
fn consistent(dir: &Path) {
    let r = check(dir).unwrap();
    assert!(r.ok(), "{:#?}", r.problems);
}

/// The store of `fs` is consistent (checked through the database it holds:
/// the offline check is refused while an instance holds the store).
fn consistent_now(fs: &Pack) {
    let r = fs.check().unwrap();
    assert!(r.ok(), "{:#?}", r.problems);
    let busy = check(fs.backing()).unwrap_err();
    assert_eq!(busy.errno(), libc::EBUSY, "{busy}");
}

/// One open run by the engine, remapping through the file system.
struct Open<'a> {
    fs: &'a Pack,
    path: &'a str,
    handle: u64,
    data: DataFile,
}

impl<'a> Open<'a> {
    fn new(fs: &'a Pack, path: &'a str, o: Opened) -> Self {
        Open {
            fs,
            path,
            handle: o.handle,
            data: DataFile::new(o),
        }
    }

    fn write(&self, off: u64, bytes: &[u8]) {
        let mut remap = |m: &mapfs::DataMap, o: u64, l: u64| {
            self.fs.remap(&ROOT, p(self.path), self.handle, m, o, l)
        };
        assert_eq!(
            self.data.write(off, bytes, &mut remap).unwrap(),
            bytes.len()
        );
    }

    fn read_all(&self) -> Vec<u8> {
        let mut buf = vec![0; self.data.size().unwrap() as usize];
        let n = self.data.read(0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn flush(&self) {
        self.fs
            .flush(&ROOT, p(self.path), self.handle, &self.data.map())
            .unwrap();
    }

    fn release(self) {
        self.fs
            .release(&ROOT, p(self.path), self.handle, &self.data.map())
            .unwrap();
    }
}

fn create<'a>(fs: &'a Pack, path: &'a str) -> Open<'a> {
    let (_, o) = fs
        .create(&ROOT, p(path), OpenFlags(libc::O_RDWR), 0o644)
        .unwrap();
    Open::new(fs, path, o)
}

fn open<'a>(fs: &'a Pack, path: &'a str, flags: i32) -> Open<'a> {
    Open::new(fs, path, fs.open(&ROOT, p(path), OpenFlags(flags)).unwrap())
}

fn bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn grows_through_slot_classes_to_a_file_of_its_own() {
    let t = tempfile::tempdir().unwrap();
    let fs = pack(t.path(), "16k");
    let f = create(&fs, "/f");
    let mut model = Vec::new();
    // Small appends: 512, 1k, 2k ... 16k slots, then a file of its own.
    for i in 0..40u8 {
        let b = bytes(i, 700);
        f.write(model.len() as u64, &b);
        model.extend_from_slice(&b);
        assert_eq!(f.read_all(), model, "after append {i}");
        if i == 5 {
            assert!(f.data.whole_file_backing().is_none());
            f.flush();
            let reopened = open(&fs, "/f", libc::O_RDONLY);
            assert_eq!(reopened.read_all(), model);
            reopened.release();
        }
    }
    assert!(
        f.data.whole_file_backing().is_some(),
        "28000 bytes, still slotted"
    );
    f.release();
    assert_eq!(fs.getattr(&ROOT, p("/f")).unwrap().size, model.len() as u64);
    let again = open(&fs, "/f", libc::O_RDONLY);
    assert!(again.data.whole_file_backing().is_some());
    assert_eq!(again.read_all(), model);
    again.release();
    let s = fs.stats().unwrap();
    assert_eq!((s.files, s.own_files), (1, 1), "{s:?}");
    // Every slot the file went through is free again.
    assert_eq!(s.slot_bytes, 0, "{s:?}");
    assert!(s.free_slots >= 5, "{s:?}");
    consistent_now(&fs);
}

#[test]
fn holes_and_truncates_never_show_stale_bytes() {
    let t = tempfile::tempdir().unwrap();
    let fs = pack(t.path(), "64k");
    // Fill a slot with bytes, free it, and give it to a new file.
    let a = create(&fs, "/a");
    a.write(0, &[0xee; 4000]);
    a.release();
    fs.unlink(&ROOT, p("/a")).unwrap();
    let b = create(&fs, "/b");
    b.write(0, b"x");
    b.data.truncate(3000).unwrap();
    b.write(3500, b"y");
    let got = b.read_all();
    assert_eq!(got.len(), 3501);
    assert_eq!(got[0], b'x');
    assert!(got[1..3500].iter().all(|&c| c == 0), "stale bytes shown");
    b.release();
    let b = open(&fs, "/b", libc::O_RDWR);
    assert_eq!(b.read_all(), got);
    // A write into a hole below the last extent remaps, holes as zeros.
    b.write(10, b"z");
    let mut want = got.clone();
    want[10] = b'z';
    assert_eq!(b.read_all(), want);
    b.release();
    assert_eq!(open(&fs, "/b", libc::O_RDONLY).read_all(), want);
    consistent_now(&fs);
}

#[test]
fn namespace_posix() {
    let t = tempfile::tempdir().unwrap();
    let fs = pack(t.path(), "64k");
    fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    fs.mkdir(&ROOT, p("/d/sub"), 0o700).unwrap();
    assert_eq!(fs.getattr(&ROOT, p("/d")).unwrap().nlink, 3);
    let f = create(&fs, "/d/f");
    f.write(0, b"hello");
    f.release();
    // Hard links share the inode and count.
    let a = fs.link(&ROOT, p("/d/f"), p("/g")).unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(
        fs.getattr(&ROOT, p("/g")).unwrap().ino,
        fs.getattr(&ROOT, p("/d/f")).unwrap().ino
    );
    assert_eq!(
        fs.link(&ROOT, p("/d"), p("/dl")).unwrap_err().errno(),
        libc::EPERM
    );
    // Rename over an existing file; the replaced one is gone.
    let h = create(&fs, "/h");
    h.write(0, b"other");
    h.release();
    fs.rename(&ROOT, p("/h"), p("/g"), RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(&ROOT, p("/d/f")).unwrap().nlink, 1);
    assert_eq!(open(&fs, "/g", libc::O_RDONLY).read_all(), b"other");
    // Directories: not into themselves, over empty directories only.
    let e = fs
        .rename(&ROOT, p("/d"), p("/d/sub/x"), RenameFlags::default())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = fs
        .rename(&ROOT, p("/d"), p("/d/x"), RenameFlags::default())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let swap = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    for (a, b) in [("/d", "/d/sub"), ("/d/sub", "/d")] {
        let e = fs.rename(&ROOT, p(a), p(b), swap).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{a} exchanged with {b}");
    }
    // A name that only starts with the same letters is not below it.
    fs.mkdir(&ROOT, p("/dd"), 0o755).unwrap();
    fs.rename(&ROOT, p("/d/sub"), p("/dd/sub"), RenameFlags::default())
        .unwrap();
    fs.rename(&ROOT, p("/dd"), p("/d/dd"), RenameFlags::default())
        .unwrap();
    fs.rename(&ROOT, p("/d/dd/sub"), p("/d/sub"), RenameFlags::default())
        .unwrap();
    fs.rmdir(&ROOT, p("/d/dd")).unwrap();
    assert_eq!(fs.getattr(&ROOT, p("/d")).unwrap().nlink, 3);
    fs.mkdir(&ROOT, p("/p"), 0o755).unwrap();
    fs.mkdir(&ROOT, p("/pq"), 0o755).unwrap();
    fs.rename(&ROOT, p("/p"), p("/pq/p"), RenameFlags::default())
        .unwrap();
    fs.rmdir(&ROOT, p("/pq/p")).unwrap();
    fs.rmdir(&ROOT, p("/pq")).unwrap();
    fs.mkdir(&ROOT, p("/e"), 0o755).unwrap();
    let e = fs
        .rename(&ROOT, p("/e"), p("/d"), RenameFlags::default())
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOTEMPTY);
    fs.rename(&ROOT, p("/d/sub"), p("/e/sub"), RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(&ROOT, p("/d")).unwrap().nlink, 2);
    assert_eq!(fs.getattr(&ROOT, p("/e")).unwrap().nlink, 3);
    let noreplace = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    let e = fs.rename(&ROOT, p("/g"), p("/d/f"), noreplace).unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(&ROOT, p("/g"), p("/d/f"), exchange).unwrap();
    assert_eq!(open(&fs, "/d/f", libc::O_RDONLY).read_all(), b"other");
    assert_eq!(open(&fs, "/g", libc::O_RDONLY).read_all(), b"hello");
    assert_eq!(
        fs.rmdir(&ROOT, p("/e")).unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    assert_eq!(fs.unlink(&ROOT, p("/e")).unwrap_err().errno(), libc::EISDIR);
    assert_eq!(fs.rmdir(&ROOT, p("/g")).unwrap_err().errno(), libc::ENOTDIR);
    // Symlinks and special files.
    fs.symlink(&ROOT, OsStr::new("d/f"), p("/s")).unwrap();
    assert_eq!(fs.readlink(&ROOT, p("/s")).unwrap(), "d/f");
    let fifo = fs
        .mknod(&ROOT, p("/fifo"), libc::S_IFIFO | 0o644, 0)
        .unwrap();
    assert_eq!(fifo.kind, FileKind::Fifo);
    let mut names: Vec<_> = fs
        .readdir(&ROOT, p("/"))
        .unwrap()
        .into_iter()
        .map(|e| e.name.into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "e", "fifo", "g", "s"]);
    // Extended attributes.
    fs.setxattr(&ROOT, p("/g"), OsStr::new("user.k"), b"v", 0)
        .unwrap();
    assert_eq!(
        fs.getxattr(&ROOT, p("/g"), OsStr::new("user.k")).unwrap(),
        b"v"
    );
    let e = fs
        .setxattr(
            &ROOT,
            p("/g"),
            OsStr::new("user.k"),
            b"w",
            libc::XATTR_CREATE,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
    fs.removexattr(&ROOT, p("/g"), OsStr::new("user.k"))
        .unwrap();
    assert_eq!(
        fs.getxattr(&ROOT, p("/g"), OsStr::new("user.k"))
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    // statfs counts the files.
    let sf = fs.statfs(&ROOT, p("/")).unwrap();
    assert!(sf.files >= 7 && sf.blocks > 0, "{sf:?}");
    consistent_now(&fs);
}

#[test]
fn permissions_come_from_the_database() {
    let t = tempfile::tempdir().unwrap();
    let fs = pack(t.path(), "64k");
    let f = create(&fs, "/secret");
    f.write(0, b"s");
    f.release();
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, p("/secret"), &set).unwrap();
    let e = fs
        .open(&NOBODY, p("/secret"), OpenFlags(libc::O_RDONLY))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let e = fs.setattr(&NOBODY, p("/secret"), &set).unwrap_err();
    assert_eq!(e.errno(), libc::EPERM);
    let e = fs
        .create(&NOBODY, p("/mine"), OpenFlags(libc::O_RDWR), 0o644)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let e = fs.unlink(&NOBODY, p("/secret")).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    fs.mkdir(&ROOT, p("/tmp"), 0o1777).unwrap();
    let (a, o) = fs
        .create(&NOBODY, p("/tmp/n"), OpenFlags(libc::O_RDWR), 0o644)
        .unwrap();
    assert_eq!((a.uid, a.gid), (NOBODY.uid, NOBODY.gid));
    Open::new(&fs, "/tmp/n", o).release();
    let other = Ctx {
        uid: 1000,
        gid: 1000,
        pid: 0,
    };
    let e = fs.unlink(&other, p("/tmp/n")).unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "sticky directory");
    fs.unlink(&NOBODY, p("/tmp/n")).unwrap();
}

#[test]
fn unlinked_while_open_lives_until_release_and_crashes_recover() {
    let t = tempfile::tempdir().unwrap();
    {
        let fs = pack(t.path(), "8k");
        let f = create(&fs, "/f");
        f.write(0, &bytes(1, 3000));
        f.flush();
        fs.unlink(&ROOT, p("/f")).unwrap();
        assert_eq!(f.read_all(), bytes(1, 3000));
        f.write(3000, &bytes(2, 100));
        f.release();
        assert_eq!(fs.stats().unwrap().slot_bytes, 0);
        // A crash: opens never released, a remapped slot never flushed, a
        // file unlinked while open.
        let g = create(&fs, "/g");
        g.write(0, &bytes(3, 100));
        g.flush();
        g.write(100, &bytes(4, 1000));
        let h = create(&fs, "/h");
        h.write(0, &bytes(5, 20_000));
        fs.unlink(&ROOT, p("/h")).unwrap();
        std::mem::forget(g);
        std::mem::forget(h);
    }
    let fs = pack(t.path(), "8k");
    // /g as its last flush left it; the slot its unflushed remap took, and
    // everything of /h, are free.
    assert_eq!(open(&fs, "/g", libc::O_RDONLY).read_all(), bytes(3, 100));
    let s = fs.stats().unwrap();
    assert_eq!((s.files, s.own_files, s.slot_bytes), (1, 0, 512), "{s:?}");
    assert_eq!(
        s.free_slots,
        s.slots - 1,
        "slots of the crashed opens not freed: {s:?}"
    );
    assert_eq!(
        std::fs::read_dir(t.path().join("files")).unwrap().count(),
        0
    );
    consistent_now(&fs);
}

/// A daemon taking over from a dead one (`PackOptions::resumed`) keeps what
/// the dead one's opens held: programs it lent slots to may still write
/// there. The next fresh start frees it.
#[test]
fn a_successor_keeps_what_the_dead_daemons_opens_held() {
    let t = tempfile::tempdir().unwrap();
    let before = {
        let fs = pack(t.path(), "8k");
        let f = create(&fs, "/f");
        f.write(0, &bytes(1, 100));
        f.flush();
        // A remap never flushed: the open's new slot is the open's alone.
        f.write(100, &bytes(2, 1000));
        // Removed while open.
        let h = create(&fs, "/h");
        h.write(0, &bytes(3, 300));
        h.flush();
        fs.unlink(&ROOT, p("/h")).unwrap();
        let before = fs.stats().unwrap();
        std::mem::forget(f);
        std::mem::forget(h);
        before
    };
    let resumed = PackOptions {
        resumed: true,
        ..PackOptions::parse(Some("8k"), None).unwrap()
    };
    drop(Pack::new(t.path(), resumed).unwrap());
    let kept = stats(t.path()).unwrap();
    assert_eq!(
        kept.free_slots, before.free_slots,
        "a successor freed slots the dead daemon's opens held: {kept:?}"
    );
    consistent(t.path());
    drop(pack(t.path(), "8k"));
    let fresh = stats(t.path()).unwrap();
    assert!(
        fresh.free_slots > before.free_slots,
        "a fresh start left them held: {fresh:?}"
    );
    assert_eq!(fresh.files, 1, "{fresh:?}");
    consistent(t.path());
}

#[test]
fn a_directory_of_other_files_is_refused_untouched() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("mine"), b"keep").unwrap();
    let e = Pack::new(t.path(), PackOptions::default()).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "the refused directory was changed");
    assert_eq!(std::fs::read(t.path().join("mine")).unwrap(), b"keep");
}

#[test]
fn bad_options_are_refused() {
    for (t, s) in [
        (Some("12"), None),
        (Some("1g"), None),
        (Some("x"), None),
        (None, Some("fast")),
    ] {
        assert!(PackOptions::parse(t, s).is_err(), "{t:?} {s:?}");
    }
    let o = PackOptions::parse(Some("128k"), Some("full")).unwrap();
    assert_eq!((o.threshold, o.full_sync), (128 * 1024, true));
}

/// Path walks remember directories; every change of a directory's place,
/// existence, mode or owner must be seen by the very next walk.
#[test]
fn walks_see_every_change_of_a_directory_at_once() {
    let t = tempfile::tempdir().unwrap();
    let fs = pack(t.path(), "64k");
    let errno = |path: &str, ctx: &Ctx| fs.getattr(ctx, p(path)).unwrap_err().errno();
    for d in ["/a", "/a/b", "/x", "/x/y"] {
        fs.mkdir(&ROOT, p(d), 0o755).unwrap();
    }
    create(&fs, "/a/b/f").release();
    // Every walk below starts with the directories remembered.
    let f = fs.getattr(&NOBODY, p("/a/b/f")).unwrap();

    // Renamed: the old path is gone, the new one leads to the same file.
    fs.rename(&ROOT, p("/a"), p("/c"), RenameFlags::default())
        .unwrap();
    assert_eq!(errno("/a/b/f", &ROOT), libc::ENOENT);
    assert_eq!(fs.getattr(&NOBODY, p("/c/b/f")).unwrap().ino, f.ino);

    // Removed and made again: a new directory, empty.
    fs.unlink(&ROOT, p("/c/b/f")).unwrap();
    fs.rmdir(&ROOT, p("/c/b")).unwrap();
    assert_eq!(errno("/c/b/f", &ROOT), libc::ENOENT);
    fs.mkdir(&ROOT, p("/c/b"), 0o755).unwrap();
    assert_eq!(errno("/c/b/f", &ROOT), libc::ENOENT);
    create(&fs, "/c/b/g").release();
    fs.getattr(&NOBODY, p("/c/b/g")).unwrap();

    // Search permission taken away and given back by mode and by owner.
    let mode = |m| SetAttr {
        mode: Some(m),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, p("/c"), &mode(0o700)).unwrap();
    assert_eq!(errno("/c/b/g", &NOBODY), libc::EACCES);
    let e = fs
        .create(&NOBODY, p("/c/b/h"), OpenFlags(libc::O_RDWR), 0o644)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    let chown = SetAttr {
        uid: Some(NOBODY.uid),
        gid: Some(NOBODY.gid),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, p("/c"), &chown).unwrap();
    fs.getattr(&NOBODY, p("/c/b/g")).unwrap();
    fs.setattr(&ROOT, p("/"), &mode(0o700)).unwrap();
    assert_eq!(errno("/c/b/g", &NOBODY), libc::EACCES);
    fs.setattr(&ROOT, p("/"), &mode(0o755)).unwrap();
    fs.getattr(&NOBODY, p("/c/b/g")).unwrap();

    // A directory renamed over an empty one, and two exchanged.
    fs.rmdir(&ROOT, p("/x/y")).unwrap();
    fs.rename(&ROOT, p("/c/b"), p("/x"), RenameFlags::default())
        .unwrap();
    assert_eq!(errno("/c/b/g", &ROOT), libc::ENOENT);
    fs.getattr(&ROOT, p("/x/g")).unwrap();
    fs.mkdir(&ROOT, p("/c/e"), 0o755).unwrap();
    create(&fs, "/c/e/k").release();
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(&ROOT, p("/x"), p("/c/e"), exchange).unwrap();
    fs.getattr(&ROOT, p("/x/k")).unwrap();
    fs.getattr(&ROOT, p("/c/e/g")).unwrap();
    assert_eq!(errno("/x/g", &ROOT), libc::ENOENT);
    consistent_now(&fs);
}

/// Creates answered before their commit (`new_files_own`): seen by walks
/// and `getattr` before any commit, committed by the first other read
/// (here `readdir`), and, when the instance is dropped before that (a
/// crash: nothing commits at drop), entered again by a successor or a fresh
/// instance from the record each file carries.
#[test]
fn creates_before_their_commit_are_entered_by_the_next_instance() {
    let t = tempfile::tempdir().unwrap();
    let own = PackOptions {
        new_files_own: true,
        ..PackOptions::parse(Some("8k"), None).unwrap()
    };
    let make = |fs: &Pack, name: &str, len: usize| {
        let (attr, o) = fs
            .create(&ROOT, p(name), OpenFlags(libc::O_WRONLY), 0o640)
            .unwrap();
        assert_eq!(attr.size, 0, "{name}");
        assert!(
            o.map.is_whole_file(),
            "{name}: a new file starts in a file of its own"
        );
        use std::os::unix::fs::FileExt;
        o.files[0].write_all_at(&bytes(len as u8, len), 0).unwrap();
        fs.release(&ROOT, p(name), o.handle, &o.map).unwrap();
    };
    {
        let fs = Pack::new(t.path(), own).unwrap();
        fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
        make(&fs, "/d/a", 100);
        make(&fs, "/d/b", 20_000);
        // No commit yet, but every walk sees them.
        assert_eq!(fs.getattr(&ROOT, p("/d/a")).unwrap().size, 100);
        assert_eq!(fs.getattr(&ROOT, p("/d/b")).unwrap().size, 20_000);
        let again = fs.create(
            &ROOT,
            p("/d/a"),
            OpenFlags(libc::O_WRONLY | libc::O_EXCL),
            0o640,
        );
        assert_eq!(again.unwrap_err().errno(), libc::EEXIST);
        let names: Vec<_> = fs
            .readdir(&ROOT, p("/d"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(
            names.iter().any(|n| n == "a") && names.iter().any(|n| n == "b"),
            "{names:?}"
        );
        make(&fs, "/d/c", 300);
        // Dropped with `c` uncommitted and `a` queued for its slot.
    }
    let before = stats(t.path()).unwrap();
    assert_eq!(
        before.files, 2,
        "the dropped instance's database holds a and b, not c: {before:?}"
    );
    let resumed = PackOptions {
        resumed: true,
        ..own
    };
    {
        let fs = Pack::new(t.path(), resumed).unwrap();
        for (name, len) in [("/d/a", 100), ("/d/b", 20_000), ("/d/c", 300)] {
            let a = fs.getattr(&ROOT, p(name)).unwrap();
            assert_eq!(
                (a.size, a.perm),
                (len as u64, 0o640),
                "{name} after the crash"
            );
            let o = fs.open(&ROOT, p(name), OpenFlags(libc::O_RDONLY)).unwrap();
            let mut got = vec![0u8; len];
            use std::os::unix::fs::FileExt;
            o.files[0].read_exact_at(&mut got, 0).unwrap();
            assert!(
                got == bytes(len as u8, len),
                "{name}: bytes after the crash"
            );
            fs.release(&ROOT, p(name), o.handle, &o.map).unwrap();
        }
        consistent_now(&fs);
    }
    consistent(t.path());
    // A fresh instance finds nothing more to enter, and nothing to remove.
    drop(Pack::new(t.path(), own).unwrap());
    let after = stats(t.path()).unwrap();
    assert_eq!((after.files, after.own_files), (3, 3), "{after:?}");
    consistent(t.path());
}
