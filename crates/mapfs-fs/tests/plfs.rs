//! `plfs` at the trait level, no FUSE: every open's map is run by
//! `mapfs::engine::DataFile` exactly as an executor runs it (open, writes,
//! reads, truncates, then `flush`/`release` with `DataFile::map()`), and every
//! byte is checked against a `Vec<u8>` model.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Once;

use mapfs::engine::DataFile;
use mapfs::{Ctx, FileKind, FileSystem, OpenFlags, RenameFlags, SetAttr};
use mapfs_fs::plfs::Plfs;

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

struct Fx {
    _tmp: tempfile::TempDir,
    /// Backing directory.
    b: PathBuf,
    /// A directory next to the backing one that nothing may touch.
    outside: PathBuf,
    fs: Plfs,
}

fn fx() -> Fx {
    static O: Once = Once::new();
    // The daemon runs with umask 0 (modes arrive with the caller's umask).
    O.call_once(|| {
        rustix::process::umask(rustix::fs::Mode::empty());
    });
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("b");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&b).unwrap();
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    let fs = Plfs::new(&b).unwrap();
    Fx {
        _tmp: tmp,
        b,
        outside,
        fs,
    }
}

/// One open, as an executor holds it.
struct Open<'a> {
    fs: &'a Plfs,
    path: PathBuf,
    handle: u64,
    data: DataFile,
}

impl Open<'_> {
    fn write(&self, off: u64, bytes: &[u8]) {
        let fs = self.fs;
        let path = self.path.clone();
        let h = self.handle;
        let n = self
            .data
            .write(off, bytes, &mut |m, o, l| {
                fs.remap(&ROOT, &path, h, m, o, l)
            })
            .unwrap();
        assert_eq!(n, bytes.len());
    }

    fn read_all(&self) -> Vec<u8> {
        let size = self.data.size().unwrap() as usize;
        let mut buf = vec![0xAAu8; size];
        let n = self.data.read(0, &mut buf).unwrap();
        assert_eq!(n, size);
        buf
    }

    fn truncate(&self, size: u64) {
        self.data.truncate(size).unwrap();
        self.flush();
    }

    fn flush(&self) {
        self.fs
            .flush(&ROOT, &self.path, self.handle, &self.data.map())
            .unwrap();
    }

    fn close(self) {
        self.flush();
        self.fs
            .release(&ROOT, &self.path, self.handle, &self.data.map())
            .unwrap();
    }
}

impl Fx {
    fn open_as(&self, ctx: &Ctx, path: &str, flags: i32) -> mapfs::Result<Open<'_>> {
        let o = self.fs.open(ctx, p(path), OpenFlags(flags))?;
        Ok(Open {
            fs: &self.fs,
            path: PathBuf::from(path),
            handle: o.handle,
            data: DataFile::new(o),
        })
    }

    fn open(&self, path: &str, flags: i32) -> Open<'_> {
        self.open_as(&ROOT, path, flags).unwrap()
    }

    fn create(&self, path: &str) -> Open<'_> {
        let (attr, o) = self
            .fs
            .create(&ROOT, p(path), OpenFlags(libc::O_RDWR), 0o644)
            .unwrap();
        assert_eq!(attr.kind, FileKind::File);
        assert_eq!(attr.size, 0);
        Open {
            fs: &self.fs,
            path: PathBuf::from(path),
            handle: o.handle,
            data: DataFile::new(o),
        }
    }

    /// The file's bytes through a fresh read-only open.
    fn contents(&self, path: &str) -> Vec<u8> {
        let o = self.open(path, libc::O_RDONLY);
        let v = o.read_all();
        o.close();
        v
    }

    fn names(&self, dir: &str) -> BTreeMap<String, FileKind> {
        self.fs
            .readdir(&ROOT, p(dir))
            .unwrap()
            .into_iter()
            .map(|e| (e.name.to_string_lossy().into_owned(), e.kind))
            .collect()
    }

    /// Names in the container of `path` (backing), by prefix.
    fn backing_entries(&self, path: &str, prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.b.join(path.trim_start_matches('/')))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        v.sort();
        v
    }
}

/// Compares file bytes with the model, reporting the first difference
/// rather than printing megabytes.
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes, model {}; first difference at {first:?}",
            got.len(),
            want.len()
        );
    }
}

/// Writes `bytes` at `off` into the model, zero-filling a gap.
fn model_write(m: &mut Vec<u8>, off: usize, bytes: &[u8]) {
    if m.len() < off + bytes.len() {
        m.resize(off + bytes.len(), 0);
    }
    m[off..off + bytes.len()].copy_from_slice(bytes);
}

/// xorshift64*: a seeded generator, so a failing seed replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn write_release_reopen_read() {
    let f = fx();
    let o = f.create("/f");
    o.write(0, b"hello ");
    o.write(6, b"world");
    assert_eq!(o.read_all(), b"hello world");
    o.close();
    assert_eq!(f.contents("/f"), b"hello world");
    let a = f.fs.getattr(&ROOT, p("/f")).unwrap();
    assert_eq!(
        (a.kind, a.size, a.nlink, a.perm),
        (FileKind::File, 11, 1, 0o644)
    );
    // The container: identity, one log, one dropping; no leftovers.
    assert_eq!(f.backing_entries("/f", ".plfs"), vec![".plfs"]);
    assert_eq!(f.backing_entries("/f", "data.").len(), 1);
    assert_eq!(f.backing_entries("/f", "index.").len(), 1);
    assert!(f.backing_entries("/f", "tmp.").is_empty());
    assert!(a.blocks > 0);
    // A read-only open leaves no log; an open that wrote nothing neither.
    f.contents("/f");
    f.open("/f", libc::O_RDWR).close();
    assert_eq!(f.backing_entries("/f", "data.").len(), 1);
    // The same inode number after a rename.
    f.fs.rename(&ROOT, p("/f"), p("/g"), RenameFlags::default())
        .unwrap();
    assert_eq!(f.fs.getattr(&ROOT, p("/g")).unwrap().ino, a.ino);
}

/// A small fsx: random writes, truncates (through an open and through
/// setattr), reopens with and without O_TRUNC, reads checked byte for byte
/// through the writer and through fresh opens.
fn fsx(seed: u64, steps: usize) {
    let f = fx();
    let mut rng = Rng(seed | 1);
    let mut model: Vec<u8> = Vec::new();
    f.create("/x").close();
    let mut cur: Option<Open<'_>> = None;
    for step in 0..steps {
        let what = rng.below(100);
        if cur.is_none() || what < 8 {
            if let Some(o) = cur.take() {
                o.close();
                assert_eq!(
                    f.contents("/x"),
                    model,
                    "seed {seed} step {step}: after close"
                );
                let size = f.fs.getattr(&ROOT, p("/x")).unwrap().size;
                assert_eq!(size, model.len() as u64, "seed {seed} step {step}: size");
            }
            match rng.below(10) {
                0 => {
                    let size = rng.below(300_000);
                    let set = SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    };
                    f.fs.setattr(&ROOT, p("/x"), &set).unwrap();
                    model.resize(size as usize, 0);
                }
                1 => {
                    cur = Some(f.open("/x", libc::O_RDWR | libc::O_TRUNC));
                    model.clear();
                }
                _ => cur = Some(f.open("/x", libc::O_RDWR)),
            }
            continue;
        }
        let o = cur.as_ref().unwrap();
        match what {
            8..=69 => {
                let off = rng.below(262_144) as usize;
                let max = if rng.below(4) == 0 { 65_536 } else { 2_000 };
                let len = 1 + rng.below(max) as usize;
                let fill = (step % 251) as u8;
                let bytes: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
                o.write(off as u64, &bytes);
                model_write(&mut model, off, &bytes);
            }
            70..=77 => {
                let size = rng.below(300_000) as usize;
                o.truncate(size as u64);
                model.resize(size, 0);
            }
            78..=85 => o.flush(),
            _ => assert_eq!(
                o.read_all(),
                model,
                "seed {seed} step {step}: through writer"
            ),
        }
    }
    if let Some(o) = cur.take() {
        o.close();
    }
    same_bytes(&f.contents("/x"), &model, &format!("seed {seed}: final"));
    // Compaction keeps the droppings bounded.
    assert!(f.backing_entries("/x", "index.").len() <= plfs_compact_bound());
}

fn plfs_compact_bound() -> usize {
    mapfs_fs::plfs::COMPACT_AFTER + 2
}

#[test]
fn fsx_against_model() {
    for seed in [1, 2, 3, 0xdead_beef, 42, 7777] {
        fsx(seed, 600);
    }
}

#[test]
fn n_to_1_disjoint_blocks_survive_both_orders() {
    const BS: usize = 4096;
    const BLOCKS: usize = 16;
    for a_first in [true, false] {
        let f = fx();
        f.create("/ckpt").close();
        let a = f.open("/ckpt", libc::O_WRONLY);
        let b = f.open("/ckpt", libc::O_WRONLY);
        let mut model = vec![0u8; BS * BLOCKS];
        // Writer a owns even blocks, b odd ones, written interleaved and
        // out of order.
        for i in (0..BLOCKS).rev() {
            let w = if i % 2 == 0 { &a } else { &b };
            let block = vec![i as u8 + 1; BS];
            w.write((i * BS) as u64, &block);
            model[i * BS..(i + 1) * BS].copy_from_slice(&block);
        }
        if a_first {
            a.close();
            b.close();
        } else {
            b.close();
            a.close();
        }
        same_bytes(&f.contents("/ckpt"), &model, &format!("a_first={a_first}"));
        assert_eq!(f.backing_entries("/ckpt", "data.").len(), 2);
    }
}

#[test]
fn overlapping_writes_last_flush_wins() {
    for a_last in [true, false] {
        let f = fx();
        f.create("/o").close();
        let a = f.open("/o", libc::O_RDWR);
        let b = f.open("/o", libc::O_RDWR);
        a.write(0, b"AAAAAAAA");
        b.write(4, b"BBBBBBBB");
        let (first, last) = if a_last { (b, a) } else { (a, b) };
        first.close();
        last.close();
        let want: &[u8] = if a_last {
            b"AAAAAAAABBBB"
        } else {
            b"AAAABBBBBBBB"
        };
        assert_eq!(f.contents("/o"), want);
    }
}

#[test]
fn truncate_by_another_open_shadows_older_writes_only() {
    let f = fx();
    let w = f.create("/t");
    w.write(0, &[1u8; 100]);
    w.flush();
    // Someone truncates the file meanwhile.
    f.open("/t", libc::O_WRONLY | libc::O_TRUNC).close();
    assert_eq!(f.contents("/t"), b"");
    // The writer's later write survives, its older one does not.
    w.write(10, &[2u8; 5]);
    w.close();
    let mut want = vec![0u8; 15];
    want[10..].fill(2);
    assert_eq!(f.contents("/t"), want);
}

#[test]
fn flush_makes_bytes_visible_before_release() {
    let f = fx();
    let w = f.create("/v");
    w.write(0, b"first");
    assert_eq!(f.fs.getattr(&ROOT, p("/v")).unwrap().size, 0);
    w.flush();
    assert_eq!(f.contents("/v"), b"first");
    assert_eq!(f.fs.getattr(&ROOT, p("/v")).unwrap().size, 5);
    w.write(5, b" second");
    w.flush();
    assert_eq!(f.contents("/v"), b"first second");
    w.close();
    assert_eq!(f.contents("/v"), b"first second");
}

/// An open that never writes changes nothing in its container, while open
/// or after: no log or dropping is made at open (and removed again at
/// release); a writer's first write makes its log.
#[test]
fn opens_that_never_write_change_no_container() {
    let f = fx();
    let c = f.create("/f");
    assert_eq!(f.backing_entries("/f", ""), [".plfs"]);
    c.close();
    assert_eq!(f.backing_entries("/f", ""), [".plfs"]);

    let w = f.create("/g");
    w.write(0, b"data");
    w.close();
    let before = f.backing_entries("/g", "");
    for flags in [libc::O_RDWR, libc::O_WRONLY, libc::O_RDONLY] {
        let o = f.open("/g", flags);
        assert_eq!(f.backing_entries("/g", ""), before, "open {flags:#o}");
        o.close();
        assert_eq!(f.backing_entries("/g", ""), before, "release {flags:#o}");
    }

    let o = f.open("/g", libc::O_WRONLY);
    o.write(4, b"more");
    assert_eq!(f.backing_entries("/g", "data.").len(), 2);
    o.close();
    assert_eq!(f.contents("/g"), b"datamore");
}

/// `unlink` removes a container whatever it holds: only its identity (never
/// written), logs and droppings, an entry planted by hand, a writer's log
/// while that writer is still open.
#[test]
fn unlink_removes_every_kind_of_container() {
    let f = fx();
    f.create("/empty").close();
    let w = f.create("/written");
    w.write(0, b"x");
    w.close();
    std::fs::write(f.b.join("written/stray"), b"s").unwrap();
    let o = f.create("/open");
    o.write(0, b"y");
    o.flush();
    for n in ["/empty", "/written", "/open"] {
        f.fs.unlink(&ROOT, p(n)).unwrap();
        assert!(f.fs.getattr(&ROOT, p(n)).is_err(), "{n}");
    }
    assert_eq!(o.read_all(), b"y");
    o.close();
    let left: Vec<_> = std::fs::read_dir(&f.b).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A removed file's container that cannot be emptied at once (a writer on
/// another host put a new entry in it meanwhile; here, a tree deeper than
/// the daemon removes, which fails the same way): the unlink took effect
/// when the name went, so it succeeds; the container stays under its
/// hidden name, never listed, and goes at a later removal once it can.
/// Before, the caller got ENOTEMPTY for an unlink that had removed the
/// name (fio laying out one file from two hosts over Gluster).
#[test]
fn unlink_succeeds_when_the_container_cannot_be_emptied_yet() {
    let f = fx();
    f.create("/stuck").close();
    let mut deep = f.b.join("stuck");
    for i in 0..10 {
        deep = deep.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    f.fs.unlink(&ROOT, p("/stuck"))
        .unwrap_or_else(|e| panic!("unlink of a file whose container is not emptied: {e}"));
    assert!(f.fs.getattr(&ROOT, p("/stuck")).is_err());
    let listed = f.fs.readdir(&ROOT, p("/")).unwrap();
    assert!(
        listed
            .iter()
            .all(|e| e.name != "stuck" && !e.name.to_string_lossy().starts_with(".plfs")),
        "{:?}",
        listed.iter().map(|e| &e.name).collect::<Vec<_>>()
    );
    let left = |b: &Path| -> Vec<String> {
        std::fs::read_dir(b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let kept = left(&f.b);
    assert!(
        kept.len() == 1 && kept[0].starts_with(".plfs-gone."),
        "the container stays under a hidden name: {kept:?}"
    );
    // Once it can be emptied, the next removal takes it.
    std::fs::remove_dir_all(f.b.join(&kept[0]).join("d0")).unwrap();
    f.create("/next").close();
    f.fs.unlink(&ROOT, p("/next")).unwrap();
    assert!(left(&f.b).is_empty(), "{:?}", left(&f.b));
}

/// A writer whose first write comes after its file was unlinked still
/// writes and reads its bytes, and leaves nothing behind.
#[test]
fn first_write_after_unlink() {
    let f = fx();
    let w = f.create("/u");
    f.fs.unlink(&ROOT, p("/u")).unwrap();
    w.write(0, b"unlinked");
    assert_eq!(w.read_all(), b"unlinked");
    w.close();
    let left: Vec<_> = std::fs::read_dir(&f.b).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn rename_and_unlink_while_open() {
    let f = fx();
    let w = f.create("/r");
    w.write(0, b"moved");
    f.fs.rename(&ROOT, p("/r"), p("/r2"), RenameFlags::default())
        .unwrap();
    w.close();
    assert_eq!(f.contents("/r2"), b"moved");

    let w = f.create("/u");
    w.write(0, b"doomed");
    let reader = f.open("/r2", libc::O_RDONLY);
    f.fs.unlink(&ROOT, p("/u")).unwrap();
    f.fs.unlink(&ROOT, p("/r2")).unwrap();
    // Opens keep their bytes; persisting an unlinked file is a no-op.
    assert_eq!(w.read_all(), b"doomed");
    assert_eq!(reader.read_all(), b"moved");
    w.close();
    reader.close();
    assert_eq!(
        f.fs.getattr(&ROOT, p("/u")).unwrap_err().errno(),
        libc::ENOENT
    );
    let left: Vec<_> = std::fs::read_dir(&f.b).unwrap().collect();
    assert!(left.is_empty(), "backing not empty: {left:?}");
}

#[test]
fn rename_over_open_file_replaces_it() {
    let f = fx();
    let a = f.create("/a");
    a.write(0, b"new");
    a.close();
    let old = f.create("/b");
    old.write(0, b"old contents");
    old.flush();
    f.fs.rename(&ROOT, p("/a"), p("/b"), RenameFlags::default())
        .unwrap();
    old.close();
    assert_eq!(f.contents("/b"), b"new");
    assert_eq!(
        f.fs.getattr(&ROOT, p("/a")).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        f.names("/"),
        BTreeMap::from([("b".to_string(), FileKind::File)])
    );
}

#[test]
fn compaction_keeps_bytes_and_drops_unused_logs() {
    let f = fx();
    f.create("/c").close();
    let mut model = Vec::new();
    // A long-lived reader keeps the first logs' bytes through its fds.
    let mut reader = None;
    for i in 0..80u64 {
        let o = f.open("/c", libc::O_RDWR);
        // Always rewrite block 0 (earlier logs become unreferenced), and
        // every tenth open also a block of its own (its log stays).
        let b0 = vec![i as u8; 1000];
        o.write(0, &b0);
        model_write(&mut model, 0, &b0);
        if i % 10 == 0 {
            let bi = vec![(i + 100) as u8; 500];
            o.write(1000 + i * 500, &bi);
            model_write(&mut model, (1000 + i * 500) as usize, &bi);
        }
        o.close();
        if i == 3 {
            reader = Some((f.open("/c", libc::O_RDONLY), model.clone()));
        }
    }
    same_bytes(&f.contents("/c"), &model, "compacted");
    let idx = f.backing_entries("/c", "index.").len();
    assert!(idx <= mapfs_fs::plfs::COMPACT_AFTER + 1, "{idx} droppings");
    // Compaction removed the logs whose bytes were all rewritten: what
    // stays is at most the 8 logs holding a block of their own plus the
    // ones written since the last compaction.
    let logs = f.backing_entries("/c", "data.").len();
    assert!(logs <= 8 + mapfs_fs::plfs::COMPACT_AFTER + 1, "{logs} logs");
    let (r, snap) = reader.unwrap();
    same_bytes(&r.read_all(), &snap, "old reader");
    r.close();
    // Truncation with no writer compacts to one base dropping.
    let set = SetAttr {
        size: Some(1500),
        ..SetAttr::default()
    };
    f.fs.setattr(&ROOT, p("/c"), &set).unwrap();
    model.truncate(1500);
    same_bytes(&f.contents("/c"), &model, "compacted");
    assert_eq!(f.backing_entries("/c", "index.").len(), 1);
    assert_eq!(f.backing_entries("/c", "data.").len(), 2);
}

#[test]
fn namespace_operations() {
    let f = fx();
    f.fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    f.create("/d/f").close();
    f.fs.symlink(&ROOT, OsStr::new("f"), p("/d/l")).unwrap();
    f.fs.mknod(&ROOT, p("/d/n"), libc::S_IFREG | 0o600, 0)
        .unwrap();
    f.fs.mknod(&ROOT, p("/d/p"), libc::S_IFIFO | 0o600, 0)
        .unwrap();
    f.fs.mkdir(&ROOT, p("/d/sub"), 0o700).unwrap();
    assert_eq!(
        f.names("/d"),
        BTreeMap::from([
            ("f".to_string(), FileKind::File),
            ("l".to_string(), FileKind::Symlink),
            ("n".to_string(), FileKind::File),
            ("p".to_string(), FileKind::Fifo),
            ("sub".to_string(), FileKind::Dir),
        ])
    );
    let n = f.fs.getattr(&ROOT, p("/d/n")).unwrap();
    assert_eq!((n.kind, n.perm, n.size), (FileKind::File, 0o600, 0));
    assert_eq!(f.fs.readlink(&ROOT, p("/d/l")).unwrap(), "f");
    // A file's insides are not names.
    for bad in ["/d/f/.plfs", "/d/f/x", "/d/f/index.0"] {
        assert_eq!(
            f.fs.getattr(&ROOT, p(bad)).unwrap_err().errno(),
            libc::ENOTDIR
        );
    }
    assert_eq!(
        f.fs.mkdir(&ROOT, p("/d/f/x"), 0o755).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert_eq!(
        f.fs.readdir(&ROOT, p("/d/f")).unwrap_err().errno(),
        libc::ENOTDIR
    );
    // rmdir/unlink kinds.
    assert_eq!(
        f.fs.rmdir(&ROOT, p("/d/f")).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert_eq!(
        f.fs.unlink(&ROOT, p("/d/sub")).unwrap_err().errno(),
        libc::EISDIR
    );
    assert_eq!(
        f.fs.rmdir(&ROOT, p("/d")).unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    // Hard links are not supported.
    assert_eq!(
        f.fs.link(&ROOT, p("/d/f"), p("/d/h")).unwrap_err().errno(),
        libc::EPERM
    );
    // chmod/chown/utimens on the file.
    let set = SetAttr {
        mode: Some(0o640),
        uid: Some(65534),
        ..SetAttr::default()
    };
    let a = f.fs.setattr(&ROOT, p("/d/f"), &set).unwrap();
    assert_eq!((a.perm, a.uid, a.kind), (0o640, 65534, FileKind::File));
    let md = std::fs::metadata(f.b.join("d/f/.plfs")).unwrap();
    assert_eq!((md.mode() & 0o7777, md.uid()), (0o640, 65534));
    // Renames: file over dir, dir over file, noreplace, exchange.
    let r = RenameFlags::default();
    assert_eq!(
        f.fs.rename(&ROOT, p("/d/f"), p("/d/sub"), r)
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
    assert_eq!(
        f.fs.rename(&ROOT, p("/d/sub"), p("/d/f"), r)
            .unwrap_err()
            .errno(),
        libc::ENOTDIR
    );
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    assert_eq!(
        f.fs.rename(&ROOT, p("/d/f"), p("/d/n"), noreplace)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    let w = f.open("/d/n", libc::O_WRONLY);
    w.write(0, b"nnn");
    w.close();
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    f.fs.rename(&ROOT, p("/d/f"), p("/d/n"), exchange).unwrap();
    assert_eq!(f.contents("/d/f"), b"nnn");
    assert_eq!(f.contents("/d/n"), b"");
    // File over file, file over symlink, symlink over file.
    f.fs.rename(&ROOT, p("/d/f"), p("/d/n"), r).unwrap();
    assert_eq!(f.contents("/d/n"), b"nnn");
    f.fs.rename(&ROOT, p("/d/n"), p("/d/l"), r).unwrap();
    assert_eq!(f.contents("/d/l"), b"nnn");
    f.fs.symlink(&ROOT, OsStr::new("zzz"), p("/d/s")).unwrap();
    f.fs.rename(&ROOT, p("/d/s"), p("/d/l"), r).unwrap();
    assert_eq!(f.fs.readlink(&ROOT, p("/d/l")).unwrap(), "zzz");
    // Rename onto itself does nothing.
    f.fs.rename(&ROOT, p("/d/p"), p("/d/p"), r).unwrap();
    assert_eq!(
        f.names("/d"),
        BTreeMap::from([
            ("l".to_string(), FileKind::Symlink),
            ("p".to_string(), FileKind::Fifo),
            ("sub".to_string(), FileKind::Dir),
        ])
    );
    // Nothing hidden is left in the backing directory.
    let mut left: Vec<String> = std::fs::read_dir(f.b.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, vec!["l", "p", "sub"]);
    f.fs.unlink(&ROOT, p("/d/l")).unwrap();
    f.fs.unlink(&ROOT, p("/d/p")).unwrap();
    f.fs.rmdir(&ROOT, p("/d/sub")).unwrap();
    f.fs.rmdir(&ROOT, p("/d")).unwrap();
    // Reserved names cannot be created.
    assert_eq!(
        f.fs.mkdir(&ROOT, p("/.plfs-gone.x"), 0o755)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    // xattrs of a file live on its identity.
    let w = f.create("/x");
    w.close();
    f.fs.setxattr(&ROOT, p("/x"), OsStr::new("user.k"), b"v", 0)
        .unwrap();
    assert_eq!(
        f.fs.getxattr(&ROOT, p("/x"), OsStr::new("user.k")).unwrap(),
        b"v"
    );
    assert!(f
        .fs
        .listxattr(&ROOT, p("/x"))
        .unwrap()
        .contains(&"user.k".into()));
    f.fs.removexattr(&ROOT, p("/x"), OsStr::new("user.k"))
        .unwrap();
    assert!(f.fs.statfs(&ROOT, p("/x")).unwrap().bsize > 0);
}

#[test]
fn create_excl_and_existing() {
    let f = fx();
    let w = f.create("/e");
    w.write(0, b"keep");
    w.close();
    let excl = OpenFlags(libc::O_RDWR | libc::O_EXCL);
    assert_eq!(
        f.fs.create(&ROOT, p("/e"), excl, 0o644)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    let (a, o) =
        f.fs.create(&ROOT, p("/e"), OpenFlags(libc::O_RDWR), 0o600)
            .unwrap();
    assert_eq!((a.size, a.perm), (4, 0o644));
    f.fs.release(&ROOT, p("/e"), o.handle, &o.map).unwrap();
    let (a, o) =
        f.fs.create(
            &ROOT,
            p("/e"),
            OpenFlags(libc::O_RDWR | libc::O_TRUNC),
            0o600,
        )
        .unwrap();
    assert_eq!(a.size, 0);
    f.fs.release(&ROOT, p("/e"), o.handle, &o.map).unwrap();
    f.fs.mkdir(&ROOT, p("/dir"), 0o755).unwrap();
    assert_eq!(
        f.fs.create(&ROOT, p("/dir"), OpenFlags(libc::O_RDWR), 0o600)
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
}

#[test]
fn permissions_come_from_the_kernel() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED permissions_come_from_the_kernel: must run as root");
        return;
    }
    let f = fx();
    f.create("/private").close();
    f.fs.setattr(
        &ROOT,
        p("/private"),
        &SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .unwrap();
    for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR | libc::O_TRUNC] {
        assert_eq!(
            f.open_as(&NOBODY, "/private", flags)
                .err()
                .map(|e| e.errno()),
            Some(libc::EACCES)
        );
    }
    let set = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(
        f.fs.setattr(&NOBODY, p("/private"), &set)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    // A file created by nobody is nobody's, and nobody may write it.
    let (a, o) =
        f.fs.create(&NOBODY, p("/mine"), OpenFlags(libc::O_WRONLY), 0o444)
            .unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o444));
    let w = Open {
        fs: &f.fs,
        path: "/mine".into(),
        handle: o.handle,
        data: DataFile::new(o),
    };
    w.write(0, b"created read-only");
    w.close();
    assert_eq!(f.contents("/mine"), b"created read-only");
    assert_eq!(
        f.open_as(&NOBODY, "/mine", libc::O_WRONLY)
            .err()
            .map(|e| e.errno()),
        Some(libc::EACCES)
    );
    // Unlink in a sticky directory: only the owner (the kernel says).
    f.fs.mkdir(&ROOT, p("/tmp"), 0o1777).unwrap();
    f.create("/tmp/roots").close();
    assert_eq!(
        f.fs.unlink(&NOBODY, p("/tmp/roots")).unwrap_err().errno(),
        libc::EPERM
    );
    assert_eq!(f.contents("/tmp/roots"), b"");
    f.fs.access(&NOBODY, p("/mine"), libc::R_OK).unwrap();
    assert_eq!(
        f.fs.access(&NOBODY, p("/mine"), libc::W_OK)
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
}

/// What must never change outside the backing directory.
fn outside_state(o: &Path) -> Vec<(PathBuf, u32, u64, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(o)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let data = if md.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            (p, md.mode(), md.len(), data)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn no_escape_from_the_backing_directory() {
    let f = fx();
    let before = outside_state(&f.outside);
    std::os::unix::fs::symlink(&f.outside, f.b.join("abs")).unwrap();
    std::os::unix::fs::symlink("../outside", f.b.join("rel")).unwrap();
    for path in ["/../outside/secret", "/abs/secret", "/rel/secret"] {
        assert!(
            f.fs.open(&ROOT, p(path), OpenFlags(libc::O_RDWR)).is_err(),
            "{path}"
        );
        assert!(f
            .fs
            .create(
                &ROOT,
                p(&path.replace("secret", "new")),
                OpenFlags(libc::O_RDWR),
                0o644
            )
            .is_err());
        assert!(f.fs.unlink(&ROOT, p(path)).is_err());
    }
    // A symlink planted in place of a log.
    let w = f.create("/f");
    w.write(0, b"data");
    w.close();
    let log = f.backing_entries("/f", "data.").pop().unwrap();
    let logp = f.b.join("f").join(&log);
    std::fs::remove_file(&logp).unwrap();
    std::os::unix::fs::symlink(f.outside.join("secret"), &logp).unwrap();
    let e =
        f.fs.open(&ROOT, p("/f"), OpenFlags(libc::O_RDONLY))
            .unwrap_err();
    assert!(matches!(e.errno(), libc::ELOOP | libc::EIO), "{e}");
    // A symlink planted in place of a dropping.
    std::fs::remove_file(&logp).unwrap();
    let idx = f.backing_entries("/f", "index.").pop().unwrap();
    let idxp = f.b.join("f").join(&idx);
    std::fs::remove_file(&idxp).unwrap();
    std::os::unix::fs::symlink(f.outside.join("secret"), &idxp).unwrap();
    assert_eq!(f.fs.getattr(&ROOT, p("/f")).unwrap().size, 0);
    let w = f.open("/f", libc::O_RDWR | libc::O_TRUNC);
    w.write(0, b"x");
    w.close();
    // A symlink planted in place of `.plfs`: no longer a file, and chmod,
    // chown, utimens, xattrs reach nothing outside.
    let id = f.b.join("f/.plfs");
    std::fs::remove_file(&id).unwrap();
    std::os::unix::fs::symlink(f.outside.join("secret"), &id).unwrap();
    assert_eq!(f.fs.getattr(&ROOT, p("/f")).unwrap().kind, FileKind::Dir);
    assert!(f.fs.open(&ROOT, p("/f"), OpenFlags(libc::O_RDWR)).is_err());
    let set = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    let _ = f.fs.setattr(&ROOT, p("/f"), &set);
    let _ =
        f.fs.setxattr(&ROOT, p("/f/.plfs"), OsStr::new("user.x"), b"1", 0);
    let _ = f.fs.unlink(&ROOT, p("/f"));
    assert_eq!(outside_state(&f.outside), before);
    assert_eq!(std::fs::read(f.outside.join("secret")).unwrap(), b"SECRET");
}

/// Bytes an open wrote before someone else's truncate are cut by it, even
/// when the open flushes only afterwards; its later bytes survive.
#[test]
fn truncate_cuts_unflushed_older_writes() {
    let f = fx();
    f.create("/tr").close();
    let a = f.open("/tr", libc::O_RDWR);
    a.write(0, &[1u8; 100]);
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    f.fs.setattr(&ROOT, p("/tr"), &set).unwrap();
    a.write(200, &[2u8; 10]);
    a.close();
    let mut want = vec![0u8; 210];
    want[200..].fill(2);
    same_bytes(&f.contents("/tr"), &want, "truncate between writes");
}

#[test]
fn explicit_times_survive_close() {
    let f = fx();
    let w = f.create("/t");
    w.write(0, b"data");
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(981_173_106);
    let set = SetAttr {
        mtime: Some(mapfs::TimeSet::At(when)),
        ..SetAttr::default()
    };
    f.fs.setattr(&ROOT, p("/t"), &set).unwrap();
    w.close();
    let a = f.fs.getattr(&ROOT, p("/t")).unwrap();
    assert_eq!((a.mtime, a.size), (when, 4));
    // A write closed later moves mtime again.
    let w = f.open("/t", libc::O_WRONLY);
    w.write(4, b"!");
    w.close();
    assert!(f.fs.getattr(&ROOT, p("/t")).unwrap().mtime > when);
}

#[test]
fn directory_link_counts_ignore_containers() {
    let f = fx();
    f.fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    f.fs.mkdir(&ROOT, p("/d/s1"), 0o755).unwrap();
    for n in ["/d/a", "/d/b", "/d/c"] {
        f.create(n).close();
    }
    assert_eq!(f.fs.getattr(&ROOT, p("/d")).unwrap().nlink, 3);
    assert_eq!(f.fs.getattr(&ROOT, p("/")).unwrap().nlink, 3);
}

#[test]
fn open_file_keeps_its_inode_number() {
    let f = fx();
    let w = f.create("/k");
    w.write(0, b"old");
    w.close();
    let ino = f.fs.getattr(&ROOT, p("/k")).unwrap().ino;
    let r = f.open("/k", libc::O_RDONLY);
    f.fs.unlink(&ROOT, p("/k")).unwrap();
    // New files must not get the number of a file still open.
    for i in 0..20 {
        let n = format!("/n{i}");
        f.create(&n).close();
        assert_ne!(f.fs.getattr(&ROOT, p(&n)).unwrap().ino, ino);
    }
    assert_eq!(r.read_all(), b"old");
    r.close();
}

#[test]
fn rmdir_ignores_leftovers_of_an_interrupted_unlink() {
    let f = fx();
    f.fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    // What a crash between the two halves of an unlink leaves.
    let gone = f.b.join("d/.plfs-gone.123");
    std::fs::create_dir(&gone).unwrap();
    std::fs::write(gone.join(".plfs"), b"").unwrap();
    std::fs::write(gone.join("data.1"), b"x").unwrap();
    assert!(f.names("/d").is_empty());
    f.fs.rmdir(&ROOT, p("/d")).unwrap();
    assert!(!f.b.join("d").exists());
}

/// The mount test's sequence: a writes, b opens with O_TRUNC and writes, c
/// truncates through its open (engine + flush), then a closes last.
#[test]
fn truncates_by_other_opens_undo_older_writes_and_growth() {
    let f = fx();
    let a = f.create("/t");
    a.write(0, &[1u8; 100_000]);
    let b = f.open("/t", libc::O_WRONLY | libc::O_TRUNC);
    b.write(0, b"BBBBBBBBBB");
    b.close();
    let c = f.open("/t", libc::O_WRONLY);
    c.truncate(5);
    c.close();
    a.close();
    assert_eq!(f.contents("/t"), b"BBBBB");
    assert_eq!(f.fs.getattr(&ROOT, p("/t")).unwrap().size, 5);
}

/// Writers on several threads (as the daemon's workers run them), each
/// with its own open of one file writing its own blocks and flushing at
/// random, while a reader keeps reopening: the reader only ever sees zeros
/// or a block's own byte, and at the end every block is there.
#[test]
fn concurrent_writers_and_readers() {
    const BS: usize = 512;
    const WRITERS: usize = 4;
    // Enough opens for compactions to run between them.
    const ROUNDS: usize = 12;
    const PER: usize = 30;
    let f = fx();
    f.create("/n1").close();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|r| {
                let f = &f;
                s.spawn(move || {
                    let mut rng = Rng(r as u64 + 11);
                    for round in 0..ROUNDS {
                        let o = f.open("/n1", libc::O_WRONLY);
                        for i in 0..PER {
                            let block = (round * PER + i) * WRITERS + r;
                            o.write((block * BS) as u64, &[(block % 251) as u8 + 1; BS]);
                            if rng.below(10) == 0 {
                                o.flush();
                            }
                        }
                        o.close();
                    }
                })
            })
            .collect();
        let (f, done) = (&f, &done);
        let reader = s.spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let data = f.contents("/n1");
                for (k, chunk) in data.chunks(BS).enumerate() {
                    let want = (k % 251) as u8 + 1;
                    assert!(
                        chunk.iter().all(|b| *b == 0) || chunk.iter().all(|b| *b == want),
                        "block {k} torn or foreign"
                    );
                }
            }
        });
        for w in writers {
            w.join().expect("writer panicked");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().expect("reader panicked");
    });
    let data = f.contents("/n1");
    assert_eq!(data.len(), WRITERS * ROUNDS * PER * BS);
    for (k, chunk) in data.chunks(BS).enumerate() {
        assert!(chunk.iter().all(|b| *b == (k % 251) as u8 + 1), "block {k}");
    }
}

/// Two instances on one backing directory (two daemons, or embedded shims
/// in two processes): one compacts while the other still writes; nothing
/// of the live writer's log may go.
#[test]
fn compaction_spares_writers_of_another_instance() {
    let f = fx();
    let other = Plfs::new(&f.b).unwrap();
    f.create("/s").close();
    let o = other.open(&ROOT, p("/s"), OpenFlags(libc::O_RDWR)).unwrap();
    let a = Open {
        fs: &other,
        path: "/s".into(),
        handle: o.handle,
        data: DataFile::new(o),
    };
    let mut model = Vec::new();
    a.write(0, &[7u8; 100]);
    model_write(&mut model, 0, &[7u8; 100]);
    for i in 0..(mapfs_fs::plfs::COMPACT_AFTER as u64 + 8) {
        let w = f.open("/s", libc::O_RDWR);
        w.write(1000 + i * 10, &[i as u8 + 1; 10]);
        model_write(&mut model, (1000 + i * 10) as usize, &[i as u8 + 1; 10]);
        w.close();
    }
    assert!(f.backing_entries("/s", "index.").len() <= mapfs_fs::plfs::COMPACT_AFTER + 1);
    a.write(100, &[8u8; 50]);
    model_write(&mut model, 100, &[8u8; 50]);
    a.close();
    same_bytes(&f.contents("/s"), &model, "after both instances");
}

/// Files replaced by rename over and over (the backing file system reuses
/// the freed inode numbers at once) while a reader keeps opening the name:
/// every open sees one whole version, never a mix of a removed file's
/// cached index and a new file's logs.
#[test]
fn rename_over_loop_with_concurrent_reader() {
    let f = fx();
    let version = |v: u64| vec![(v % 251) as u8 + 1; 4096 + (v % 5) as usize * 1000];
    let w = f.create("/target");
    w.write(0, &version(0));
    w.close();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (fr, done) = (&f, &done);
        let reader = s.spawn(move || {
            let mut seen = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let d = fr.contents("/target");
                let ok = !d.is_empty()
                    && d.iter().all(|b| *b == d[0])
                    && d.len() == 4096 + ((d[0] as usize - 1) % 5) * 1000;
                assert!(ok, "torn: {} bytes, first {:?}", d.len(), d.first());
                let a = fr.fs.getattr(&ROOT, p("/target")).unwrap();
                assert!((4096..=8096).contains(&a.size), "size {}", a.size);
                seen += 1;
            }
            seen
        });
        for v in 1..=200u64 {
            let t = format!("/tmp{v}");
            let w = f.create(&t);
            w.write(0, &version(v));
            w.close();
            f.fs.rename(&ROOT, p(&t), p("/target"), RenameFlags::default())
                .unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().expect("reader panicked") > 0);
    });
    assert_eq!(f.contents("/target"), version(200));
    assert_eq!(f.names("/").len(), 1);
}

/// A directory's link count is 2 plus its real subdirectories (containers
/// are not counted) through every mix of file creates and removes, which
/// keep a cached count, and subdirectory changes, which must not be masked
/// by it.
#[test]
fn directory_link_count_follows_subdirectories_not_files() {
    let f = fx();
    f.fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    let nlink = |f: &Fx| f.fs.getattr(&ROOT, p("/d")).unwrap().nlink;
    assert_eq!(nlink(&f), 2);
    for i in 0..20 {
        f.create(&format!("/d/f{i}")).close();
        assert_eq!(nlink(&f), 2, "after creating file {i}");
    }
    f.fs.mkdir(&ROOT, p("/d/sub"), 0o755).unwrap();
    assert_eq!(nlink(&f), 3, "a subdirectory counts");
    for i in 20..30 {
        f.create(&format!("/d/f{i}")).close();
        assert_eq!(nlink(&f), 3, "after creating file {i}");
    }
    for i in 0..15 {
        f.fs.unlink(&ROOT, &PathBuf::from(format!("/d/f{i}")))
            .unwrap();
        assert_eq!(nlink(&f), 3, "after removing file {i}");
    }
    // A subdirectory made between a cached count and a file create, with
    // no look in between, must not be hidden by the create.
    f.fs.mkdir(&ROOT, p("/d/sub2"), 0o755).unwrap();
    f.create("/d/late").close();
    assert_eq!(nlink(&f), 4, "mkdir, then a create");
    f.fs.rmdir(&ROOT, p("/d/sub2")).unwrap();
    f.fs.unlink(&ROOT, p("/d/late")).unwrap();
    assert_eq!(nlink(&f), 3, "rmdir, then an unlink");
    // Same for an unlink, which keeps the count across both of its steps
    // (the container renamed away, then removed).
    assert_eq!(nlink(&f), 3);
    f.fs.mkdir(&ROOT, p("/d/sub3"), 0o755).unwrap();
    f.fs.unlink(&ROOT, p("/d/f20")).unwrap();
    assert_eq!(nlink(&f), 4, "mkdir, then an unlink");
    f.fs.unlink(&ROOT, p("/d/f21")).unwrap();
    f.fs.rmdir(&ROOT, p("/d/sub3")).unwrap();
    assert_eq!(nlink(&f), 3, "an unlink, then rmdir");
    f.fs.rmdir(&ROOT, p("/d/sub")).unwrap();
    assert_eq!(nlink(&f), 2, "the subdirectory is gone");
}

/// O_CREAT without O_EXCL never fails with ENOENT, even while another
/// instance (another host) removes and creates the same name again and
/// again: a name found taken and gone when opened is created again.
#[test]
fn create_without_excl_races_unlink_without_enoent() {
    let f = fx();
    let other = Plfs::new(&f.b).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((_, o)) = other.create(&ROOT, p("/race"), OpenFlags(libc::O_RDWR), 0o644)
                {
                    let _ = other.release(&ROOT, p("/race"), o.handle, &o.map);
                }
                let _ = other.unlink(&ROOT, p("/race"));
            }
        });
        for i in 0..2000 {
            match f
                .fs
                .create(&ROOT, p("/race"), OpenFlags(libc::O_RDWR), 0o644)
            {
                Ok((_, o)) => f.fs.release(&ROOT, p("/race"), o.handle, &o.map).unwrap(),
                Err(e) => {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    panic!("create {i} of a name another instance removes: {e}");
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

/// A directory's link count is 2 plus its real subdirectories, containers
/// not counted, also where its entries are looked at by several threads
/// (more than 32 of them) and after a change made elsewhere.
#[test]
fn directory_link_count_leaves_containers_out() {
    let f = fx();
    for (dir, files, subdirs) in [("/d", 150, 9), ("/s", 5, 2)] {
        f.fs.mkdir(&ROOT, p(dir), 0o755).unwrap();
        for i in 0..files {
            f.create(&format!("{dir}/f{i}")).close();
        }
        for i in 0..subdirs {
            f.fs.mkdir(&ROOT, p(&format!("{dir}/sub{i}")), 0o755)
                .unwrap();
        }
        let nlink = |f: &Fx| f.fs.getattr(&ROOT, p(dir)).unwrap().nlink;
        assert_eq!(
            nlink(&f),
            2 + subdirs,
            "{dir}: {files} files, {subdirs} subdirectories"
        );
        // A container added behind this instance's back (another host's
        // create) changes the directory: the count is taken again (after
        // a tick of the clock that stamps directories).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = f.b.join(&dir[1..]).join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(".plfs"), b"").unwrap();
        std::fs::create_dir(f.b.join(&dir[1..]).join("realdir")).unwrap();
        assert_eq!(nlink(&f), 3 + subdirs, "{dir} after changes elsewhere");
    }
}
