//! The `versions` file system driven as an executor drives it (open, writes
//! and truncates through `mapfs::engine::DataFile`, `flush`, `release`),
//! with every kept version checked byte for byte against a model of the
//! file's history; the cost of a version on ext4/tmpfs (undo: the bytes
//! changed) and on xfs/btrfs images made here (reflink: shared extents).

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use mapfs::engine::DataFile;
use mapfs::{Ctx, FileKind, FileSystem, OpenFlags, RenameFlags, SetAttr};
use mapfs_fs::versions::store::{Kind, Version};
use mapfs_fs::versions::{Config, Policy, Versions};

const ROOT: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};

/// Held while a test spawns a program, and by the retention test
/// throughout: a child forked by another test thread holds every open file
/// description of this process until it execs, flock marks included, so
/// retention would (rightly) spare a version the child seems to be making.
static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn spawning() -> std::sync::MutexGuard<'static, ()> {
    SPAWNING.lock().unwrap_or_else(|e| e.into_inner())
}

fn spawning_output(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    let _g = spawning();
    cmd.output()
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

/// No retention: every version must be there.
fn keep_all(max_size: u64) -> Config {
    Config {
        max_size,
        policy: Policy {
            keep: None,
            keep_days: None,
            keep_bytes: None,
        },
        keep_bytes_auto: false,
        shared: false,
    }
}

/// One writable open, as an executor holds it.
struct Open<'a> {
    fs: &'a Versions,
    path: PathBuf,
    handle: u64,
    data: DataFile,
}

impl Open<'_> {
    fn write(&self, off: u64, bytes: &[u8]) {
        let (fs, path, h) = (self.fs, self.path.clone(), self.handle);
        let n = self
            .data
            .write(off, bytes, &mut |m, o, l| {
                fs.remap(&ROOT, &path, h, m, o, l)
            })
            .unwrap();
        assert_eq!(n, bytes.len());
    }

    fn truncate(&self, size: u64) {
        // Executors flush before a shrink, then apply it through the map.
        self.flush();
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

fn open<'a>(fs: &'a Versions, path: &str, flags: i32) -> Open<'a> {
    let o = fs.open(&ROOT, p(path), OpenFlags(flags)).unwrap();
    Open {
        fs,
        path: PathBuf::from(path),
        handle: o.handle,
        data: DataFile::new(o),
    }
}

fn create(fs: &Versions, path: &str, bytes: &[u8]) {
    let (_, o) = fs
        .create(
            &ROOT,
            p(path),
            OpenFlags(libc::O_RDWR | libc::O_EXCL),
            0o644,
        )
        .unwrap();
    let w = Open {
        fs,
        path: PathBuf::from(path),
        handle: o.handle,
        data: DataFile::new(o),
    };
    w.write(0, bytes);
    w.close();
}

/// The bytes of a file read through the file system (a read-only open).
fn read(fs: &Versions, path: &str) -> Vec<u8> {
    let o = fs.open(&ROOT, p(path), OpenFlags(libc::O_RDONLY)).unwrap();
    assert!(
        o.map.is_whole_file(),
        "{path}: a read-only open is whole-file"
    );
    let d = DataFile::new(o);
    let mut buf = vec![0u8; d.size().unwrap() as usize];
    assert_eq!(d.read(0, &mut buf).unwrap(), buf.len());
    fs.release(&ROOT, p(path), 0, &d.map()).unwrap();
    buf
}

fn versions_of(fs: &Versions, path: &str) -> Vec<Version> {
    fs.store().list(Some(path.as_bytes()), false).unwrap()
}

/// `.versions/DIR/NAME@STAMP` of a version.
fn virtual_path(v: &Version) -> String {
    let (dir, _) = v
        .full_name()
        .rsplit_once('/')
        .map(|(d, n)| (d.to_string(), n.to_string()))
        .unwrap();
    format!(
        "/.versions{dir}/{}",
        String::from_utf8_lossy(&v.entry_name())
    )
}

/// A small deterministic generator (the exerciser's randomness).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random write sessions (overlapping writers, mid-session flushes, O_TRUNC,
/// truncates inside and outside opens, appends, unlink and re-create, rename
/// away and back), each change checked to make exactly one version whose
/// bytes are the model's before it.
fn exercise(config: Config, seed: u64, rounds: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), config).unwrap();
    let mut rng = Rng(seed);
    let mut model: Vec<u8> = rng.bytes(3000);
    create(&fs, "/f", &model);
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for round in 0..rounds {
        let before = model.clone();
        let op = rng.below(8);
        if std::env::var_os("VERSIONS_DEBUG").is_some() {
            eprintln!("round {round}: op {op}, model {} bytes", model.len());
        }
        match op {
            // Truncate by path, not open.
            0 => {
                let size = rng.below(6000);
                if size as usize == model.len() {
                    continue;
                }
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                fs.setattr(&ROOT, p("/f"), &set).unwrap();
                model.resize(size as usize, 0);
            }
            // Unlink and create again.
            1 => {
                fs.unlink(&ROOT, p("/f")).unwrap();
                let n = 1 + rng.below(5000) as usize;
                model = rng.bytes(n);
                create(&fs, "/f", &model);
            }
            // Rename away and back: history follows.
            2 => {
                fs.rename(&ROOT, p("/f"), p("/g"), RenameFlags::default())
                    .unwrap();
                assert!(
                    versions_of(&fs, "/f").is_empty(),
                    "round {round}: history stayed behind"
                );
                fs.rename(&ROOT, p("/g"), p("/f"), RenameFlags::default())
                    .unwrap();
                continue;
            }
            // One or two writers with writes, truncates and flushes.
            _ => {
                let trunc = rng.below(5) == 0;
                let mut flags = libc::O_RDWR;
                if trunc {
                    flags |= libc::O_TRUNC;
                    model.clear();
                }
                let a = open(&fs, "/f", flags);
                let b = (rng.below(3) == 0).then(|| open(&fs, "/f", libc::O_WRONLY));
                for _ in 0..1 + rng.below(6) {
                    let w = match &b {
                        Some(b) if rng.below(2) == 0 => b,
                        _ => &a,
                    };
                    match rng.below(6) {
                        0 if w.path == a.path && b.is_none() => {
                            let size = rng.below(6000);
                            if std::env::var_os("VERSIONS_DEBUG").is_some() {
                                eprintln!("  truncate to {size}");
                            }
                            w.truncate(size);
                            model.resize(size as usize, 0);
                        }
                        1 => {
                            if std::env::var_os("VERSIONS_DEBUG").is_some() {
                                eprintln!("  flush");
                            }
                            w.flush()
                        }
                        _ => {
                            // Overlapping writers: each writes where the
                            // other has not, so both land (close-to-open).
                            let off = if b.is_some() {
                                let half = if std::ptr::eq(w, &a) { 0 } else { 3000 };
                                half + rng.below(2000)
                            } else {
                                rng.below(model.len() as u64 + 500)
                            };
                            let n = 1 + rng.below(700) as usize;
                            let data = rng.bytes(n);
                            if std::env::var_os("VERSIONS_DEBUG").is_some() {
                                eprintln!(
                                    "  write by {} at {off} len {} (b open: {})",
                                    if std::ptr::eq(w, &a) { "a" } else { "b" },
                                    data.len(),
                                    b.is_some()
                                );
                            }
                            w.write(off, &data);
                            let end = off as usize + data.len();
                            if model.len() < end {
                                model.resize(end, 0);
                            }
                            model[off as usize..end].copy_from_slice(&data);
                        }
                    }
                }
                if let Some(b) = b {
                    b.close();
                }
                a.close();
                if model == before && !trunc {
                    // Unchanged (a truncate to the same size): no version.
                    assert_eq!(
                        versions_of(&fs, "/f").len(),
                        expected.len(),
                        "round {round}"
                    );
                    continue;
                }
            }
        }
        if !before.is_empty() {
            expected.push(before);
        }
        let cur = read(&fs, "/f");
        assert!(cur == model, "round {round}: current bytes differ: {} bytes, model {} bytes, first difference at {:?}", cur.len(), model.len(), cur.iter().zip(&model).position(|(a, b)| a != b));
        let got = versions_of(&fs, "/f");
        assert_eq!(
            got.len(),
            expected.len(),
            "round {round}: number of versions"
        );
    }
    let got = versions_of(&fs, "/f");
    for (i, (v, want)) in got.iter().zip(&expected).enumerate() {
        let got = fs.store().read_all(v).unwrap();
        assert!(
            &got == want,
            "version {i} ({}) via the store: {} bytes, want {}",
            v.full_name(),
            got.len(),
            want.len()
        );
        assert!(
            &read(&fs, &virtual_path(v)) == want,
            "version {i} via .versions"
        );
    }
    let undo = got.iter().filter(|v| v.kind == Kind::Undo).count();
    eprintln!(
        "versions exerciser seed {seed} max-size {}: {} versions, {undo} undo",
        config.max_size,
        got.len()
    );
    if config.max_size == 0 {
        assert!(undo > 0, "max-size 0 on this backing made no undo versions");
    }
}

#[test]
fn every_version_matches_the_history_with_undo_versions() {
    // max-size 0: every write session on a backing without reflink keeps an
    // undo of the bytes it changed.
    for seed in [7, 20_261_123] {
        exercise(keep_all(0), seed, 300);
    }
}

#[test]
fn every_version_matches_the_history_with_whole_versions() {
    for seed in [11, 4242] {
        exercise(keep_all(1 << 30), seed, 300);
    }
}

#[test]
fn retention_by_count_age_and_bytes() {
    let _no_forks = spawning();
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = keep_all(1 << 30);
    cfg.policy.keep = Some(3);
    let fs = Versions::new(tmp.path(), cfg).unwrap();
    create(&fs, "/f", b"v0");
    for i in 1..=6 {
        let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
        w.write(0, format!("v{i}").as_bytes());
        w.close();
    }
    let kept: Vec<Vec<u8>> = versions_of(&fs, "/f")
        .iter()
        .map(|v| fs.store().read_all(v).unwrap())
        .collect();
    assert_eq!(kept, [b"v3".to_vec(), b"v4".to_vec(), b"v5".to_vec()]);
    drop(fs);

    // Bytes: 1000-byte versions, at most 2500 bytes kept.
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = keep_all(1 << 30);
    cfg.policy.keep_bytes = Some(2500);
    let fs = Versions::new(tmp.path(), cfg).unwrap();
    create(&fs, "/f", &[0u8; 1000]);
    for i in 1..=5u8 {
        let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
        w.write(0, &[i; 1000]);
        w.close();
    }
    let kept: Vec<u8> = versions_of(&fs, "/f")
        .iter()
        .map(|v| fs.store().read_all(v).unwrap()[0])
        .collect();
    assert_eq!(kept, [3, 4], "the newest versions within 2500 bytes");
    drop(fs);

    // Age: a limit of ~0.1 s drops what is older at the next version.
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = keep_all(1 << 30);
    cfg.policy.keep_days = Some(0.1 / 86_400.0);
    let fs = Versions::new(tmp.path(), cfg).unwrap();
    create(&fs, "/f", b"old");
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"mid");
    w.close();
    assert_eq!(versions_of(&fs, "/f").len(), 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"new");
    w.close();
    let kept: Vec<Vec<u8>> = versions_of(&fs, "/f")
        .iter()
        .map(|v| fs.store().read_all(v).unwrap())
        .collect();
    assert_eq!(
        kept,
        [b"mid".to_vec()],
        "the version older than the limit is gone"
    );
}

#[test]
fn store_and_versions_are_outside_the_namespace() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(1 << 20)).unwrap();
    create(&fs, "/f", b"one");
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"two");
    w.close();
    assert!(tmp.path().join(".mapfs-versions").is_dir());
    let names: Vec<_> = fs
        .readdir(&ROOT, p("/"))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["f"]);
    let errno = |r: mapfs::Result<_>| r.map(|_: ()| ()).unwrap_err().errno();
    assert_eq!(
        errno(fs.getattr(&ROOT, p("/.mapfs-versions")).map(|_| ())),
        libc::ENOENT
    );
    assert_eq!(
        errno(
            fs.getattr(&ROOT, p("/.mapfs-versions/index.sqlite"))
                .map(|_| ())
        ),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.mkdir(&ROOT, p("/.mapfs-versions"), 0o755).map(|_| ())),
        libc::EPERM
    );
    assert_eq!(
        errno(fs.mkdir(&ROOT, p("/.versions"), 0o755).map(|_| ())),
        libc::EROFS
    );
    // The virtual directory: there, read-only, listing NAME@STAMP.
    assert_eq!(
        fs.getattr(&ROOT, p("/.versions")).unwrap().kind,
        FileKind::Dir
    );
    let v = &versions_of(&fs, "/f")[0];
    let vp = virtual_path(v);
    let listed: Vec<_> = fs
        .readdir(&ROOT, p("/.versions"))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(listed, [OsStr::new(vp.trim_start_matches("/.versions/"))]);
    let a = fs.getattr(&ROOT, p(&vp)).unwrap();
    assert_eq!((a.kind, a.size, a.perm & 0o222), (FileKind::File, 3, 0));
    assert_eq!(read(&fs, &vp), b"one");
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(
            errno(fs.open(&ROOT, p(&vp), OpenFlags(flags)).map(|_| ())),
            libc::EROFS
        );
    }
    assert_eq!(errno(fs.unlink(&ROOT, p(&vp))), libc::EROFS);
    assert_eq!(
        errno(fs.getattr(&ROOT, p("/.versions/f@nonsense")).map(|_| ())),
        libc::ENOENT
    );
}

#[test]
fn rename_carries_history_and_rename_over_keeps_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(1 << 20)).unwrap();
    fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    create(&fs, "/d/a", b"a1");
    let w = open(&fs, "/d/a", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"a2");
    w.close();
    create(&fs, "/t", b"target");
    // Editor's save: write a temp file, rename it over the target.
    create(&fs, "/t.tmp", b"saved");
    fs.rename(&ROOT, p("/t.tmp"), p("/t"), RenameFlags::default())
        .unwrap();
    let t = versions_of(&fs, "/t");
    assert_eq!(t.len(), 1);
    assert_eq!(fs.store().read_all(&t[0]).unwrap(), b"target");
    assert_eq!(t[0].reason, "replace");
    // A directory rename carries the history of everything beneath it.
    fs.rename(&ROOT, p("/d"), p("/e"), RenameFlags::default())
        .unwrap();
    assert!(versions_of(&fs, "/d/a").is_empty());
    let a = versions_of(&fs, "/e/a");
    assert_eq!(a.len(), 1);
    assert_eq!(fs.store().read_all(&a[0]).unwrap(), b"a1");
    assert_eq!(read(&fs, &virtual_path(&a[0])), b"a1");
}

#[test]
fn restore_is_versioned_and_brings_back_removed_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(1 << 20)).unwrap();
    fs.mkdir(&ROOT, p("/d"), 0o755).unwrap();
    create(&fs, "/d/f", b"first");
    let w = open(&fs, "/d/f", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"second");
    w.close();
    let v1 = versions_of(&fs, "/d/f")[0].clone();
    let kept = fs
        .store()
        .restore(&v1, b"/d/f")
        .unwrap()
        .expect("the replaced file is kept");
    assert_eq!(read(&fs, "/d/f"), b"first");
    let k = fs.store().get(kept).unwrap().unwrap();
    assert_eq!(fs.store().read_all(&k).unwrap(), b"second");
    // Removed file and directory: restore makes them again.
    fs.unlink(&ROOT, p("/d/f")).unwrap();
    fs.rmdir(&ROOT, p("/d")).unwrap();
    let last = versions_of(&fs, "/d/f").pop().unwrap();
    assert_eq!(last.reason, "unlink");
    assert_eq!(fs.store().restore(&last, b"/d/f").unwrap(), None);
    assert_eq!(read(&fs, "/d/f"), b"first");
}

/// Sum of the blocks of everything under `dir`, in bytes (`du`).
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

fn fs_type(dir: &Path) -> String {
    let _g = spawning();
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A 4 KiB change to a 256 MiB file (ext4 or tmpfs: no reflink) costs
/// about 4 KiB, not a copy, and the version reads back the old bytes.
fn small_change_costs_the_change(dir: &Path) {
    let kind = fs_type(dir);
    let fs = Versions::new(dir, Config::default()).unwrap();
    const SIZE: usize = 256 << 20;
    let mut rng = Rng(99);
    let chunk = rng.bytes(1 << 20);
    let (_, o) = fs
        .create(&ROOT, p("/big"), OpenFlags(libc::O_RDWR), 0o644)
        .unwrap();
    let w = Open {
        fs: &fs,
        path: "/big".into(),
        handle: o.handle,
        data: DataFile::new(o),
    };
    for i in 0..SIZE / chunk.len() {
        w.write((i * chunk.len()) as u64, &chunk);
    }
    w.close();
    let before = du(dir);
    let w = open(&fs, "/big", libc::O_RDWR);
    assert!(
        !w.data.map().is_whole_file() || kind != "ext2/ext3",
        "on ext4 a big file's writer gets an undo map"
    );
    w.write(100 << 20, &[0xEE; 4096]);
    w.close();
    let after = du(dir);
    let grew = after.saturating_sub(before);
    eprintln!("{kind}: a 4 KiB change to a 256 MiB file grew the backing by {grew} bytes");
    assert!(
        grew < 1 << 20,
        "{kind}: version cost {grew} bytes (limit 1 MiB)"
    );
    let v = versions_of(&fs, "/big").pop().unwrap();
    let old = fs.store().contents(&v).unwrap();
    let mut buf = vec![0u8; 8192];
    use std::os::unix::fs::FileExt;
    old.read_exact_at(&mut buf, (100 << 20) - 4096).unwrap();
    assert_eq!(&buf[..4096], &chunk[chunk.len() - 4096..]);
    assert_eq!(
        &buf[4096..],
        &chunk[..4096],
        "{kind}: the version has the old bytes"
    );
    assert_eq!(old.metadata().unwrap().len(), SIZE as u64);
    let cur = read(&fs, "/big");
    assert_eq!(&cur[100 << 20..(100 << 20) + 4096], &[0xEE; 4096]);
}

#[test]
fn small_change_to_a_large_file_on_ext4_costs_about_the_change() {
    let tmp = tempfile::tempdir().unwrap();
    let kind = fs_type(tmp.path());
    if kind == "xfs" || kind == "btrfs" {
        eprintln!(
            "SKIPPED: the temp dir is on {kind} (reflink); this test is for backings without"
        );
        return;
    }
    small_change_costs_the_change(tmp.path());
}

#[test]
fn small_change_to_a_large_file_on_tmpfs_costs_about_the_change() {
    let Some(tmpfs) = Image::tmpfs() else { return };
    small_change_costs_the_change(&tmpfs.dir);
}

/// A file system mounted for one test, unmounted (and its image removed)
/// on drop.
struct Image {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Image {
    fn mount(args: &[&str], dir: &Path) -> bool {
        let _g = spawning();
        Command::new("mount")
            .args(args)
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success())
    }

    fn tmpfs() -> Option<Image> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        if !Self::mount(&["-t", "tmpfs", "-o", "size=600m", "tmpfs"], &dir) {
            eprintln!("SKIPPED: cannot mount a tmpfs (not root?)");
            return None;
        }
        Some(Image { _tmp: tmp, dir })
    }

    /// `mkfs` on a sparse image, mounted through a loop device.
    fn loop_fs(mkfs: &str, size_mib: u64) -> Option<Image> {
        if spawning_output(Command::new(mkfs).arg("-V")).is_err() {
            eprintln!("SKIPPED: {mkfs} is not installed (scripts/deps.sh installs it)");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let made = spawning_output(Command::new(mkfs).arg("-q").arg(&img)).unwrap();
        assert!(
            made.status.success(),
            "{mkfs}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        if !Self::mount(&["-o", "loop", img.to_str().unwrap()], &dir) {
            eprintln!("SKIPPED: cannot mount a {mkfs} image on a loop device (no loop devices, or not root)");
            return None;
        }
        Some(Image { _tmp: tmp, dir })
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _g = spawning();
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// Physical extents of a file, as `filefrag -v` reports them, with their
/// `shared` flag.
fn extents(path: &Path) -> Vec<(u64, bool)> {
    let _g = spawning();
    let out = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .expect("filefrag (e2fsprogs)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split(':').collect();
            (cols.len() >= 4 && cols[0].trim().parse::<u64>().is_ok()).then(|| {
                let phys = cols[2]
                    .split("..")
                    .next()
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap_or(0);
                (phys, l.contains("shared"))
            })
        })
        .collect()
}

fn reflink_versions_share_extents(mkfs: &str, size_mib: u64) {
    let Some(img) = Image::loop_fs(mkfs, size_mib) else {
        return;
    };
    let fs = Versions::new(&img.dir, keep_all(0)).unwrap();
    let mut rng = Rng(5);
    let data = rng.bytes(64 << 20);
    create(&fs, "/f", &data);
    let free = || {
        rustix::fs::statvfs(&img.dir)
            .map(|s| s.f_bfree * s.f_frsize)
            .unwrap()
    };
    let sync = || rustix::fs::sync();
    sync();
    let before = free();
    let w = open(&fs, "/f", libc::O_RDWR);
    assert!(
        w.data.map().is_whole_file(),
        "{mkfs}: with reflink the writer stays whole-file"
    );
    w.write(1 << 20, &[1u8; 4096]);
    w.close();
    sync();
    let used = before.saturating_sub(free());
    eprintln!("{mkfs}: a version of a 64 MiB file with a 4 KiB change used {used} bytes");
    assert!(
        used < 1 << 20,
        "{mkfs}: version used {used} bytes (limit 1 MiB)"
    );
    let v = versions_of(&fs, "/f").pop().unwrap();
    assert_eq!(v.stored, 0, "a reflinked version adds nothing to the store");
    assert_eq!(
        fs.store().read_all(&v).unwrap(),
        data,
        "{mkfs}: the version is the old bytes"
    );
    let obj = img
        .dir
        .join(".mapfs-versions/objects")
        .join(v.id.to_string());
    let (a, b) = (extents(&img.dir.join("f")), extents(&obj));
    assert!(!b.is_empty(), "{mkfs}: filefrag saw no extents");
    // The block the writer changed is the version's alone now; the rest
    // is shared with the file.
    assert!(
        b.iter().filter(|e| e.1).count() >= 1,
        "{mkfs}: no shared extents: {b:?}"
    );
    let shared_phys = b.iter().filter(|e| a.iter().any(|x| x.0 == e.0)).count();
    assert!(
        shared_phys > 0,
        "{mkfs}: no extent of the version is the file's: {a:?} vs {b:?}"
    );
}

#[test]
fn versions_share_extents_on_xfs() {
    reflink_versions_share_extents("mkfs.xfs", 400);
}

#[test]
fn versions_share_extents_on_btrfs() {
    reflink_versions_share_extents("mkfs.btrfs", 300);
}

/// A close reaches the file system late (FUSE `release` is asynchronous):
/// a writer that opens after another changed the file, while that one
/// still looks open, gets a version of what it found all the same.
#[test]
fn a_writer_joining_after_changes_gets_its_own_version() {
    for max_size in [1 << 30, 0] {
        let tmp = tempfile::tempdir().unwrap();
        let fs = Versions::new(tmp.path(), keep_all(max_size)).unwrap();
        create(&fs, "/f", b"original bytes");
        let a = open(&fs, "/f", libc::O_RDWR);
        a.write(0, b"ORIGINAL");
        a.flush(); // the close(2); its release has not come yet
        let b = open(&fs, "/f", libc::O_RDWR);
        b.write(9, b"BYTES");
        b.close();
        a.close();
        let got: Vec<Vec<u8>> = versions_of(&fs, "/f")
            .iter()
            .map(|v| fs.store().read_all(v).unwrap())
            .collect();
        assert_eq!(
            got,
            [b"original bytes".to_vec(), b"ORIGINAL bytes".to_vec()],
            "max-size {max_size}"
        );
        assert_eq!(read(&fs, "/f"), b"ORIGINAL BYTES");
    }
}

/// Listing the history of a directory takes the paths beneath it, and
/// only those: not a sibling whose name starts with the directory's, nor
/// one that sorts right after its `/` (by the index range `[d/, d0)`).
#[test]
fn listing_beneath_a_directory_takes_exactly_its_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(1 << 20)).unwrap();
    for d in ["/a", "/a/b", "/a/b/c", "/a/bc", "/a/b0"] {
        fs.mkdir(&ROOT, p(d), 0o755).unwrap();
    }
    for f in ["/a/b/f", "/a/b/c/g", "/a/bc/h", "/a/b0/i", "/a/b.j"] {
        create(&fs, f, b"one");
        let w = open(&fs, f, libc::O_WRONLY | libc::O_TRUNC);
        w.write(0, b"two");
        w.close();
    }
    let paths = |dir: &str, under: bool| -> Vec<String> {
        let mut v: Vec<String> = fs
            .store()
            .list(Some(dir.as_bytes()), under)
            .unwrap()
            .iter()
            .map(|v| String::from_utf8_lossy(&v.path).into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(paths("/a/b", true), ["/a/b/c/g", "/a/b/f"]);
    assert_eq!(paths("/a/b/", true), ["/a/b/c/g", "/a/b/f"]);
    assert_eq!(paths("/a/b/f", false), ["/a/b/f"]);
    assert_eq!(paths("/a/b", false), Vec::<String>::new());
    assert_eq!(paths("/", true).len(), 5);
}

/// Undo writers write in place once a range was saved: a version taken
/// for a writer that joins later must hold those ranges as they were then,
/// although the first writer goes on writing there without asking again.
#[test]
fn a_later_version_holds_what_earlier_writers_may_still_change() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(0)).unwrap();
    let orig: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    create(&fs, "/f", &orig);
    let a = open(&fs, "/f", libc::O_RDWR);
    a.write(1_000, b"first");
    let b = open(&fs, "/f", libc::O_RDWR);
    // `a` writes where it was made able to already, after `b`'s version.
    a.write(2_000, b"second");
    b.write(1_500_000, b"third");
    b.close();
    a.close();
    let got: Vec<Vec<u8>> = versions_of(&fs, "/f")
        .iter()
        .map(|v| fs.store().read_all(v).unwrap())
        .collect();
    let mut at_b = orig.clone();
    at_b[1_000..1_005].copy_from_slice(b"first");
    let mut now = at_b.clone();
    now[2_000..2_006].copy_from_slice(b"second");
    now[1_500_000..1_500_005].copy_from_slice(b"third");
    assert_eq!(got.len(), 2, "a version at each writer's open");
    assert!(got[0] == orig, "the first version is the original");
    assert!(got[1] == at_b, "the second is what b found");
    assert!(read(&fs, "/f") == now, "current bytes");
}

/// Versions are read, and listed, only by whoever could read the file
/// when it was versioned.
#[test]
fn versions_of_private_files_stay_private() {
    const NOBODY: Ctx = Ctx {
        uid: 65534,
        gid: 65534,
        pid: 0,
    };
    let tmp = tempfile::tempdir().unwrap();
    let fs = Versions::new(tmp.path(), keep_all(1 << 20)).unwrap();
    let (_, o) = fs
        .create(
            &ROOT,
            p("/secret"),
            OpenFlags(libc::O_RDWR | libc::O_EXCL),
            0o600,
        )
        .unwrap();
    fs.release(&ROOT, p("/secret"), o.handle, &o.map).unwrap();
    let w = open(&fs, "/secret", libc::O_WRONLY);
    w.write(0, b"password");
    w.close();
    let w = open(&fs, "/secret", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"changed");
    w.close();
    let v = versions_of(&fs, "/secret").pop().unwrap();
    let vp = virtual_path(&v);
    assert_eq!(fs.readdir(&ROOT, p("/.versions")).unwrap().len(), 1);
    assert!(fs.readdir(&NOBODY, p("/.versions")).unwrap().is_empty());
    let e = fs
        .open(&NOBODY, p(&vp), OpenFlags(libc::O_RDONLY))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    assert_eq!(read(&fs, &vp), b"password");
}

/// A rewrite with `O_TRUNC` of a file nothing else has open keeps the
/// file's own inode as the version (no copy) and gives the name a new
/// inode with the old owner, mode, extended attributes and access time; a
/// file with two names, or open for reading, is copied instead (both names,
/// and the reader, see the truncation, as natively).
#[test]
fn o_trunc_keeps_the_old_inode_as_the_version() {
    let tmp = tempfile::tempdir().unwrap();
    // A max-size of 1 byte: before, this file's version was a copy.
    let fs = Versions::new(tmp.path(), keep_all(1)).unwrap();
    let old_bytes = vec![7u8; 100_000];
    create(&fs, "/f", &old_bytes);
    let backing = tmp.path().join("f");
    let set = SetAttr {
        mode: Some(0o640),
        uid: Some(1000),
        gid: Some(1001),
        ..SetAttr::default()
    };
    fs.setattr(&ROOT, p("/f"), &set).unwrap();
    fs.setxattr(&ROOT, p("/f"), OsStr::new("user.k"), b"v", 0)
        .unwrap();
    let atime = std::fs::FileTimes::new()
        .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000));
    std::fs::File::options()
        .write(true)
        .open(&backing)
        .unwrap()
        .set_times(atime)
        .unwrap();
    let before = std::fs::metadata(&backing).unwrap();
    // Replacements are made ahead: the new file is modified at the rewrite
    // all the same (a rewrite that writes nothing leaves that time).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let rewritten_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    let modified = std::fs::metadata(&backing).unwrap().mtime();
    assert!(
        modified >= rewritten_at,
        "the new file modified at {modified}, before the rewrite at {rewritten_at}"
    );
    w.write(0, b"new");
    w.close();

    let after = std::fs::metadata(&backing).unwrap();
    assert_ne!(after.ino(), before.ino(), "the name has a new inode");
    assert_eq!(
        (after.mode() & 0o7777, after.uid(), after.gid()),
        (0o640, 1000, 1001)
    );
    assert_eq!(after.atime(), 1_000_000, "access time kept");
    assert_eq!(
        fs.getxattr(&ROOT, p("/f"), OsStr::new("user.k")).unwrap(),
        b"v"
    );
    assert_eq!(read(&fs, "/f"), b"new");
    let vs = versions_of(&fs, "/f");
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(fs.store().read_all(&vs[0]).unwrap(), old_bytes);
    let obj = fs.store().open_object(vs[0].id).unwrap();
    assert_eq!(
        obj.metadata().unwrap().ino(),
        before.ino(),
        "the version is the old inode, not a copy"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path().join(".mapfs-versions/objects"))
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with('.') && !n.starts_with(mapfs_fs::versions::store::SPARE_PREFIX)
        })
        .collect();
    assert!(left.is_empty(), "replacements left: {left:?}");

    // Two names: both must see the truncation, so the bytes are copied.
    fs.link(&ROOT, p("/f"), p("/g")).unwrap();
    let ino = std::fs::metadata(&backing).unwrap().ino();
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    w.write(0, b"two");
    w.close();
    assert_eq!(std::fs::metadata(&backing).unwrap().ino(), ino);
    assert_eq!(read(&fs, "/g"), b"two");
    fs.unlink(&ROOT, p("/g")).unwrap();

    // Open for reading: the reader sees the truncation, as natively.
    let r = fs.open(&ROOT, p("/f"), OpenFlags(libc::O_RDONLY)).unwrap();
    let reader = DataFile::new(r);
    let w = open(&fs, "/f", libc::O_WRONLY | libc::O_TRUNC);
    assert_eq!(reader.size().unwrap(), 0);
    w.write(0, b"three");
    w.close();
    let mut buf = [0u8; 5];
    assert_eq!(reader.read(0, &mut buf).unwrap(), 5);
    assert_eq!(&buf, b"three");
    fs.release(&ROOT, p("/f"), 0, &reader.map()).unwrap();
    let contents: Vec<Vec<u8>> = versions_of(&fs, "/f")
        .iter()
        .map(|v| fs.store().read_all(v).unwrap())
        .collect();
    assert_eq!(contents, vec![old_bytes, b"new".to_vec(), b"two".to_vec()]);
}
