//! Mount-level tests of the built-in `pack` file system (the M-to-1
//! pattern: small files in slots of pack files, the namespace in SQLite,
//! larger files remapped to backing files of their own).
//!
//! Everything is checked byte for byte against a model (fsx), or against
//! the same commands run on a native directory. Real programs must be
//! installed (scripts/deps.sh): a missing one fails the test with its name.
//! `MAPFS_FSX_OPS` sets the fsx length (default 10,000 operations),
//! `MAPFS_PACK_FILES` the small-file count (default 100,000),
//! `MAPFS_PACK_KILLS` the number of crash rounds (default 20).

mod common;
mod preload_support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use mapfs_testkit::fsx::{self, FsxConfig};
use mapfs_testkit::mount::run_captured;

/// Small enough that fsx's files (up to 256 KiB) move between slot classes
/// and to files of their own all the time.
const SMALL_THRESHOLD: &str = "threshold=4096";

macro_rules! fuse_test {
    ($(#[$attr:meta])* $name:ident => $call:expr) => {
        #[test]
        $(#[$attr])*
        fn $name() {
            if fuse_or_skip(stringify!($name)) {
                $call;
            }
        }
    };
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pack_on(mode: DataMode, backing: Option<&Path>, opts: &[&str]) -> MountSession {
    let mut b = MountSession::builder(mapfs_bin())
        .fs("pack")
        .data(mode)
        .options(opts.iter().copied());
    if let Some(d) = backing {
        b = b.backing(d);
    }
    b.mount()
        .unwrap_or_else(|e| panic!("mounting pack --data {mode} -o {opts:?}: {e:#}"))
}

/// `mapfs pack` takes the mountpoint as well as the backing directory; a
/// mountpoint of another file system is an error that says what was
/// expected.
#[test]
fn pack_commands_take_the_mountpoint() {
    let test = "pack commands take the mountpoint";
    if !fuse_or_skip(test) {
        return;
    }
    let s = pack_on(DataMode::Auto, None, &[]);
    std::fs::write(s.mountpoint().join("f"), b"hello").unwrap();
    let by_mount = pack_stats(s.mountpoint());
    assert_eq!(by_mount.files, 1, "{by_mount:?}");
    let json = |st: &mapfs_fs::pack::PackStats| serde_json::to_string(st).unwrap();
    assert_eq!(json(&by_mount), json(&pack_stats(s.backing())));
    assert_consistent(s.mountpoint(), test);
    let other = MountSession::builder(mapfs_bin())
        .fs("passthrough")
        .mount()
        .unwrap();
    let out = run_captured(
        Command::new(mapfs_bin())
            .args(["pack", "check"])
            .arg(other.mountpoint()),
    )
    .unwrap();
    assert!(!out.success());
    assert!(
        out.stderr.contains("a mount of `passthrough`, not `pack`")
            && out
                .stderr
                .contains("expected the mountpoint of a `pack` mount"),
        "{}",
        out.stderr
    );
}

/// [`pack_on`] without a supervisor: a killed daemon stays dead (the
/// crash test checks what a remount recovers; failover.rs checks the
/// supervised case).
fn pack_unsupervised(mode: DataMode, backing: &Path, opts: &[&str]) -> MountSession {
    MountSession::builder(mapfs_bin())
        .fs("pack")
        .data(mode)
        .options(opts.iter().copied())
        .backing(backing)
        .arg("--no-supervisor")
        .mount()
        .unwrap_or_else(|e| panic!("mounting pack --data {mode} -o {opts:?}: {e:#}"))
}

fn umount_clean(mut s: MountSession, what: &str) {
    let out = s.umount_settled().expect("running mapfs umount");
    assert!(
        out.success(),
        "{what}: mapfs umount failed ({:?}): {}{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

fn sh_ok(dir: &Path, script: &str) -> String {
    let out = run_captured(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env("LC_ALL", "C")
            .env("TZ", "UTC"),
    )
    .expect("spawn sh");
    assert!(
        out.success(),
        "`{script}` failed in {} ({:?}):\nstdout: {}\nstderr: {}",
        dir.display(),
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// `mapfs pack check BACKING` must say the store is consistent (run by
/// the daemon when mounted, offline otherwise).
fn assert_consistent(backing: &Path, what: &str) {
    let out = run_captured(
        Command::new(mapfs_bin())
            .args(["pack", "check"])
            .arg(backing),
    )
    .unwrap();
    assert!(
        out.success() && out.stdout.starts_with("ok: "),
        "{what}: mapfs pack check: {}{}",
        out.stdout,
        out.stderr
    );
}

/// `mapfs pack stats --json BACKING` (from the daemon when mounted).
fn pack_stats(backing: &Path) -> mapfs_fs::pack::PackStats {
    let out = run_captured(
        Command::new(mapfs_bin())
            .args(["pack", "stats", "--json"])
            .arg(backing),
    )
    .unwrap();
    assert!(
        out.success(),
        "mapfs pack stats: {}{}",
        out.stdout,
        out.stderr
    );
    serde_json::from_str(out.stdout.trim()).unwrap()
}

/// The store's statistics once `own` files have a file of their own (10 s
/// at most): a file created through a mount starts in a file of its own
/// and moves into a slot at its last release, which the kernel sends after
/// `close(2)` returned.
fn wait_packed(backing: &Path, own: u64, what: &str) -> mapfs_fs::pack::PackStats {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st = pack_stats(backing);
        if st.own_files == own {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} files of their own, not {own}, 10 s after their close: {st:?}",
            st.own_files
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic bytes: `len` bytes of stream `key`.
fn stream(key: &str, len: usize) -> Vec<u8> {
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        x = (x ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------
// fsx: byte model, remaps all the time
// ---------------------------------------------------------------------------

fn fsx_mode(mode: DataMode) {
    let test = format!("pack fsx --data {mode}");
    let s = pack_on(mode, None, &[SMALL_THRESHOLD]);
    for seed in [20_261_123u64, 7] {
        let mut cfg = FsxConfig::new(s.mountpoint(), seed, env_num("MAPFS_FSX_OPS", 10_000));
        // Small files too, so slots and their classes are exercised, not
        // only files of their own.
        if seed == 7 {
            cfg.maxlen = 8192;
            cfg.max_op_len = 2048;
            // Made and closed first: fsx's own create would start it in a
            // file of its own, to move into a slot only at its first close
            // (the other seed runs that way).
            fs::write(fsx::data_path(&cfg), b"").unwrap();
            wait_packed(s.backing(), 0, &test);
        }
        let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
        eprintln!("{test}: {report}");
        assert!(
            report.skipped.is_empty(),
            "{test}: skipped operations: {report}"
        );
        for k in cfg.enabled_kinds() {
            assert!(report.count(k) > 0, "{test}: {k} never ran: {report}");
        }
    }
    let st = pack_stats(s.backing());
    assert_consistent(s.backing(), &test);
    // fsx removed its files: their slots are free again.
    assert_eq!(st.files, 0, "{test}: files left: {st:?}");
    assert!(st.free_slots > 0, "{test}: no slot was ever freed: {st:?}");
}

fuse_test!(fsx_daemon => fsx_mode(DataMode::Daemon));
fuse_test!(fsx_passthrough => fsx_mode(DataMode::Passthrough));

/// `mapfs-fsx` under `mapfs run` as root: the shim runs files of their own
/// and slotted files itself (a write the slot cannot hold hands the open
/// back to the daemon, which remaps); bytes must be right either way.
#[test]
fn fsx_under_mapfs_run() {
    use preload_support::*;
    let test = "pack mapfs-fsx under mapfs run";
    if !fuse_or_skip(test) {
        return;
    }
    let s = pack_on(DataMode::Auto, None, &[SMALL_THRESHOLD]);
    let report = report_path(&s, "fsx");
    for (seed, maxlen) in [(20_261_125u64, "262144"), (11, "8192")] {
        let out = ok(attached(&s, &report, fsx_bin())
            .arg("--dir")
            .arg(s.mountpoint())
            .arg("--ops")
            .arg(env_num("MAPFS_FSX_OPS", 10_000).to_string())
            .arg("--maxlen")
            .arg(maxlen)
            .arg("--seed")
            .arg(seed.to_string()));
        eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let t = totals(&report, "mapfs-fsx");
    eprintln!("{test}: shim {t:?}");
    assert!(
        t.native_calls > 0,
        "{test}: the shim ran nothing itself: {t:?}"
    );
    // Files that always fit a slot, with the calls a lent open runs itself
    // (no mmap, no copy_file_range, which hand the open back): the program
    // reads and writes inside slots of the pack file, growing within them,
    // and hands back the writes a slot cannot hold.
    let slots = report_path(&s, "fsx-slots");
    let ops = env_num("MAPFS_FSX_OPS", 10_000);
    let out = ok(attached(&s, &slots, fsx_bin())
        .arg("--dir")
        .arg(s.mountpoint())
        .args([
            "--ops",
            &ops.to_string(),
            "--maxlen",
            "4000",
            "--maxoplen",
            "600",
        ])
        .args(["--seed", "20261126", "--no-mmap", "--no-copy-range"]));
    eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
    let t = totals(&slots, "mapfs-fsx");
    eprintln!("{test}: slotted files, shim {t:?}");
    assert!(
        t.native_calls > ops / 4,
        "{test}: the program ran few calls on slots itself: {t:?}"
    );
    assert_consistent(s.backing(), test);
}

/// Reads of slotted files lent to a root program: every open for reading
/// runs in the program on the pack file (fd status 6), and random `pread`s,
/// sequential `read`s and `lseek(SEEK_END)` give the model's bytes; an
/// in-place rewrite by a second open, lent too, is seen by the lent reader
/// at once, as both use the same slot.
const LENT_READS: &str = r#"
import os, sys, random, ctypes
lib = ctypes.CDLL(None)
mnt, model, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
names = sorted(os.listdir(model))
lent = checked = wlent = 0
for name in names:
    want = bytearray(open(os.path.join(model, name), 'rb').read())
    fd = os.open(os.path.join(mnt, name), os.O_RDONLY)
    for k in range(20):
        off = rng.randrange(0, len(want) + 16)
        n = rng.randrange(1, 5000)
        got = os.pread(fd, n, off)
        assert got == want[off:off + n], (name, off, n, len(got))
        checked += 1
        if k == 0 and lib.mapfs_preload_fd_status(fd) == 6:
            lent += 1
    if rng.random() < 0.3 and len(want) > 8:
        w = os.open(os.path.join(mnt, name), os.O_RDWR)
        at = rng.randrange(0, len(want) - 8)
        os.pwrite(w, b'REWRITE!', at)
        assert lib.mapfs_preload_fd_status(w) == 6, 'a writer was not lent its slot'
        wlent += 1
        want[at:at + 8] = b'REWRITE!'
        got = os.pread(fd, len(want) + 1, 0)
        assert got == want, (name, 'rewrite not seen', at)
        os.close(w)
        open(os.path.join(model, name), 'wb').write(want)
    os.lseek(fd, 0, os.SEEK_SET)
    got = b''
    while True:
        b = os.read(fd, rng.randrange(1, 3000))
        if not b:
            break
        got += b
    assert got == want, (name, 'sequential read')
    assert os.lseek(fd, 0, os.SEEK_END) == len(want), (name, 'size')
    os.close(fd)
print(f"files={len(names)} lent={lent} checked={checked} writers={wlent > 0}")
"#;

/// A pack mount (small threshold) for a Python program under `mapfs run`,
/// and an empty model directory beside it; `None` (skipped, said why) where
/// FUSE or python3 is missing.
fn lent_session(test: &str) -> Option<(MountSession, PathBuf)> {
    if !fuse_or_skip(test) || !need("python3") {
        return None;
    }
    let s = pack_on(DataMode::Auto, None, &[SMALL_THRESHOLD]);
    let model = s.scratch().unwrap().join("model");
    fs::create_dir(&model).unwrap();
    Some((s, model))
}

#[test]
fn lent_reads_of_slotted_files() {
    use preload_support::*;
    let test = "pack reads of slots lent to the program";
    let Some((s, model)) = lent_session(test) else {
        return;
    };
    let m = s.mountpoint();
    let files = 200usize;
    for i in 0..files {
        let name = format!("f{i:03}");
        // 1 byte to 4,000: every one in a slot (threshold 4096).
        let data = stream(&name, 1 + (i * 7_919) % 4_000);
        fs::write(m.join(&name), &data).unwrap();
        fs::write(model.join(&name), &data).unwrap();
    }
    let report = report_path(&s, "lent-reads");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(LENT_READS)
        .arg(m)
        .arg(&model)
        .arg("20261126"));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("{test}: {line}");
    assert_eq!(
        line,
        format!(
            "files={files} lent={files} checked={} writers=True",
            files * 20
        ),
        "{test}"
    );
    // The rewrites went into the slots, their maps to the daemon: the
    // mount agrees with the model.
    for i in 0..files {
        let name = format!("f{i:03}");
        assert_eq!(
            fs::read(m.join(&name)).unwrap(),
            fs::read(model.join(&name)).unwrap(),
            "{test}: {name} through the mount"
        );
    }
    assert_consistent(s.backing(), test);
}

/// A lent read-only slot's `pread`s run on a record kept by descriptor
/// number (`direct_pread` in the shim): that record must follow the number
/// through close and reuse for another file, `dup`, `dup2` over it, and a
/// hand-back to the mount (`mmap`).
const DIRECT_NUMBERS: &str = r#"
import os, sys, mmap, ctypes
lib = ctypes.CDLL(None)
mnt = sys.argv[1]
def want(name):
    return open(os.path.join(sys.argv[2], name), 'rb').read()
def check(fd, name, what):
    w = want(name)
    for off in (0, 1, len(w) // 2, len(w) - 1, len(w), len(w) + 10):
        got = os.pread(fd, 300, off)
        assert got == w[off:off + 300], (what, name, off, len(got))
a = os.open(os.path.join(mnt, 'a'), os.O_RDONLY)
check(a, 'a', 'first open')
assert lib.mapfs_preload_fd_status(a) == 6, 'a read-only slot was not lent'
num = a
os.close(a)
b = os.open(os.path.join(mnt, 'b'), os.O_RDONLY)
assert b == num, ('the number was not reused', b, num)
check(b, 'b', 'same number, another file')
d = os.dup(b)
check(d, 'b', 'dup')
os.close(b)
check(d, 'b', 'dup after the original closed')
c = os.open(os.path.join(mnt, 'c'), os.O_RDONLY)
check(c, 'c', 'third file')
os.dup2(c, d)
check(d, 'c', 'dup2 over a lent number')
m = mmap.mmap(c, 0, prot=mmap.PROT_READ)
assert m[:] == want('c'), 'mmap'
assert lib.mapfs_preload_fd_status(c) != 6, 'mmap did not hand the open back'
check(c, 'c', 'handed back to the mount')
check(d, 'c', 'a dup handed back with it')
m.close()
for f in (c, d):
    os.close(f)
print("ok")
"#;

#[test]
fn direct_reads_follow_the_descriptor_number() {
    use preload_support::*;
    let test = "pack direct reads of lent slots by descriptor number";
    let Some((s, model)) = lent_session(test) else {
        return;
    };
    let m = s.mountpoint();
    // Different sizes, all in slots (threshold 4096).
    for (name, len) in [("a", 3000), ("b", 1234), ("c", 4000)] {
        let data = stream(name, len);
        fs::write(m.join(name), &data).unwrap();
        fs::write(model.join(name), &data).unwrap();
    }
    let report = report_path(&s, "direct-numbers");
    let out = ok(attached(&s, &report, "python3")
        .arg("-c")
        .arg(DIRECT_NUMBERS)
        .arg(m)
        .arg(&model));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{test}");
}

/// A writer under `mapfs run` that a test drives line by line: opens its
/// file read-write, then for each line `HEX OFFSET` on stdin writes those
/// bytes there in place (in its lent slot) and answers `ok STATUS` (the
/// shim's status of its descriptor: 6 is lent); at end of input it closes.
const STEPPED_WRITER: &str = r#"
import os, sys, ctypes
lib = ctypes.CDLL(None)
fd = os.open(sys.argv[1], os.O_RDWR)
for line in sys.stdin:
    data, off = line.split()
    os.pwrite(fd, bytes.fromhex(data), int(off))
    print("ok", lib.mapfs_preload_fd_status(fd), flush=True)
os.close(fd)
"#;

/// Read-only opens through the mount keep the kernel's cached pages of a
/// slotted file (no `READ` reaches the daemon for a file read before), but
/// never while a program under `mapfs run` writes the file in its lent
/// slot, behind those pages: each read through the mount sees what the
/// writer wrote so far, and its close.
#[test]
fn mount_readers_keep_pages_only_while_nothing_writes_outside_them() {
    use preload_support::*;
    use std::io::{BufRead, BufReader, Write};
    let test = "pages kept by read-only opens of pack";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    // Where a read first differs from the model (the files are 4 KiB).
    let differs = |got: &[u8], want: &[u8]| {
        (got != want).then(|| {
            let at = got.iter().zip(want).position(|(a, b)| a != b);
            format!(
                "{} bytes, want {}; first difference at {at:?}",
                got.len(),
                want.len()
            )
        })
    };
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    let f = m.join("f");
    let mut want = stream("kept", 4096);
    fs::write(&f, &want).unwrap();
    // The file moves into a slot at its last release, which the kernel
    // sends after close(2) returned; the move drops the kernel's pages
    // of it. Measured before the move, one read after it reached the
    // daemon (about one run in ten).
    wait_packed(s.backing(), 0, test);
    let reads = || common::op_count_now(m, "READ");
    assert_eq!(
        differs(&fs::read(&f).unwrap(), &want),
        None,
        "{test}: first read"
    );
    let before = reads();
    for _ in 0..3 {
        assert_eq!(
            differs(&fs::read(&f).unwrap(), &want),
            None,
            "{test}: kept pages"
        );
    }
    assert_eq!(
        reads(),
        before,
        "{test}: reads of a clean file reached the daemon"
    );

    let report = report_path(&s, "stepped-writer");
    let mut w = attached(&s, &report, "python3")
        .arg("-c")
        .arg(STEPPED_WRITER)
        .arg(&f)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = w.stdin.take().unwrap();
    let mut from = BufReader::new(w.stdout.take().unwrap());
    for (k, off) in [(1u8, 100usize), (2, 2000), (3, 4000)] {
        let bytes = vec![b'0' + k; 64];
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(to, "{hex} {off}").unwrap();
        let mut line = String::new();
        from.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "ok 6",
            "{test}: step {k}: the writer is not lent"
        );
        want[off..off + bytes.len()].copy_from_slice(&bytes);
        assert_eq!(
            differs(&fs::read(&f).unwrap(), &want),
            None,
            "{test}: step {k}: a read through the mount missed the lent writer's bytes"
        );
    }
    drop(to);
    let status = w.wait().unwrap();
    assert!(status.success(), "{test}: writer failed");
    for _ in 0..2 {
        assert_eq!(
            differs(&fs::read(&f).unwrap(), &want),
            None,
            "{test}: after the writer closed"
        );
    }
    umount_clean(s, test);
}

/// Reads of slotted files by another user (nobody) under `mapfs run`: the
/// pack file holds other users' files, so nobody is never lent it; each
/// read-only open gets a copy of its file's bytes instead (fd status 6, run
/// in the program). Random `pread`s, sequential `read`s, `lseek(SEEK_END)`
/// and `fstat` give the model's bytes; once root rewrites a file in place
/// through the mount, the next call on nobody's open hands it back to the
/// mount (status 4) and reads the new bytes; a file open for writing
/// elsewhere is not copied. Ends with `MODEL` in the script replaced by the
/// model directory.
const COPY_READS: &str = r#"
import os, sys, random, ctypes
lib = ctypes.CDLL(None)
mnt, model = sys.argv[1], "MODEL"
rng = random.Random(20261126)
names = sorted(os.listdir(model))
checked = 0
def check(name, fd):
    global checked
    want = open(os.path.join(model, name), 'rb').read()
    for k in range(10):
        off = rng.randrange(0, len(want) + 16)
        n = rng.randrange(1, 5000)
        got = os.pread(fd, n, off)
        assert got == want[off:off + n], (name, off, n, len(got), len(want))
        checked += 1
    os.lseek(fd, 0, os.SEEK_SET)
    got = b''
    while True:
        b = os.read(fd, rng.randrange(1, 3000))
        if not b:
            break
        got += b
    assert got == want, (name, 'sequential read')
    assert os.lseek(fd, 0, os.SEEK_END) == len(want), (name, 'size')
    assert os.fstat(fd).st_size == len(want), (name, 'fstat size')
fds = {}
copies = 0
for name in names:
    fd = os.open(os.path.join(mnt, name), os.O_RDONLY)
    check(name, fd)
    copies += lib.mapfs_preload_fd_status(fd) == 6
    fds[name] = fd
print(f"copied={copies} checked={checked}", flush=True)
changed = sys.stdin.readline().split()
for name in changed:
    assert lib.mapfs_preload_fd_status(fds[name]) == 6, (name, 'not a copy before the change')
    check(name, fds[name])
    st = lib.mapfs_preload_fd_status(fds[name])
    assert st == 4, (name, 'a changed file was still read from its copy', st)
for name in names:
    check(name, fds[name])
print(f"changed={len(changed)} checked={checked}", flush=True)
w = sys.stdin.readline().strip()
fd = os.open(os.path.join(mnt, w), os.O_RDONLY)
check(w, fd)
print(f"beside a writer: {lib.mapfs_preload_fd_status(fd)}", flush=True)
"#;

#[test]
fn other_users_read_copies_that_follow_every_change() {
    use preload_support::*;
    let test = "pack: nobody reads copies of slotted files under mapfs run";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = pack_on(
        DataMode::Auto,
        None,
        &["allow_other", "default_permissions", SMALL_THRESHOLD],
    );
    let m = s.mountpoint();
    // nobody reads the model: a directory of its own, not the session's.
    let model_dir = tempfile::Builder::new()
        .prefix("mapfs-copy-model")
        .tempdir_in("/tmp")
        .unwrap();
    fs::set_permissions(model_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let model = model_dir.path();
    let files = 60usize;
    for i in 0..files {
        let name = format!("f{i:03}");
        let data = stream(&name, 1 + (i * 7_919) % 4_000);
        fs::write(m.join(&name), &data).unwrap();
        fs::write(model.join(&name), &data).unwrap();
        fs::set_permissions(model.join(&name), fs::Permissions::from_mode(0o644)).unwrap();
    }
    let report = report_path(&s, "copies");
    fs::write(&report, b"").unwrap();
    fs::set_permissions(&report, fs::Permissions::from_mode(0o666)).unwrap();
    let script = COPY_READS.replace("MODEL", &model.display().to_string());
    let mut p = Stepped::start_as_nobody(&s, &report, &script, m);
    assert_eq!(
        p.line(),
        format!("copied={files} checked={}", files * 10),
        "{test}: every read-only open of nobody's should be a copy"
    );
    // Root rewrites ten files in place through the mount (and the model).
    let mut changed = Vec::new();
    for i in (0..files).step_by(6) {
        let name = format!("f{i:03}");
        let mut want = fs::read(model.join(&name)).unwrap();
        if want.len() < 8 {
            continue;
        }
        let at = want.len() / 3;
        want[at..at + 8].copy_from_slice(b"CHANGED!");
        fs::OpenOptions::new()
            .write(true)
            .open(m.join(&name))
            .unwrap()
            .write_all_at(b"CHANGED!", at as u64)
            .unwrap();
        fs::write(model.join(&name), &want).unwrap();
        changed.push(name);
    }
    p.say(&changed.join(" "));
    assert_eq!(
        p.line(),
        format!(
            "changed={} checked={}",
            changed.len(),
            (2 * files + changed.len()) * 10
        ),
        "{test}: after root's rewrites"
    );
    // A file open for writing elsewhere is served by the daemon: its bytes
    // may change with no bump.
    let _writer = fs::OpenOptions::new()
        .write(true)
        .open(m.join("f001"))
        .unwrap();
    p.say("f001");
    assert_eq!(p.line(), "beside a writer: 4", "{test}");
    p.finish();
    let out = ok(Command::new(mapfs_bin()).arg("stats").arg(m));
    let st = String::from_utf8_lossy(&out.stdout);
    let copies: usize = st
        .split(" copied)")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{test}: no count of copies in mapfs stats:\n{st}"));
    assert!(
        copies >= files,
        "{test}: mapfs stats counts {copies} copies, expected at least {files}:\n{st}"
    );
}

// ---------------------------------------------------------------------------
// Real programs, compared with native
// ---------------------------------------------------------------------------

/// Builds a tree of many small files and some large ones, then renames,
/// links and deletes in it (the same script runs on native and on pack).
const TREE_SCRIPT: &str = r#"
set -e
mkdir -p src/a/b/c src/many empty
i=0
while [ $i -lt 600 ]; do
  printf 'small file %d\n' $i > src/many/f$i
  i=$((i+1))
done
head -c 100000 /etc/services > src/a/mid 2>/dev/null || seq 1 20000 > src/a/mid
seq 1 300000 > src/a/big
seq 1 700 > src/a/b/c/deep
printf 'x' > src/a/one
: > src/a/zero
ln src/a/one src/a/one.hard
ln -s b/c/deep src/a/link
ln -s /nowhere src/dangling
mkfifo src/fifo
chmod 600 src/a/one
chmod 750 src/a/b
cp -r src copy
tar cf src.tar src
mkdir untar && tar xf src.tar -C untar
mv copy/many copy/renamed
mv copy/a/one copy/a/b/one
mv -f copy/a/mid copy/a/big
mkdir copy/newdir && mv copy/newdir copy/a/b/c/
mkdir -p copy/over/x && mkdir copy/over2 && mv -T copy/over2 copy/over/x
rm copy/renamed/f1 copy/renamed/f2
rm -r copy/renamed/f3 untar/src/many
ln copy/a/b/one copy/hardlink
rm copy/a/b/one
printf 'grown ' >> copy/a/one.hard
seq 1 5000 >> copy/hardlink
truncate -s 10 src/a/b/c/deep
truncate -s 70000 src/a/one.hard
touch -d '2001-02-03 04:05:06' copy/a/big
rm src.tar
"#;

fn manifest(dir: &Path) -> String {
    sh_ok(
        dir,
        "{ find . -mindepth 1 -type d -printf '%P %y %m %n\\n'; \
           find . -mindepth 1 ! -type d -printf '%P %y %m %s %l %n\\n'; \
           find . -type f -exec sha256sum {} +; \
           find . -path ./copy/a/big -printf '%P %TY-%Tm-%Td_%TH:%TM:%TS\\n'; } | sort",
    )
}

fn programs_tree(mode: DataMode) {
    for p in ["cp", "tar", "find", "sha256sum", "mkfifo", "truncate"] {
        need(p);
    }
    let test = format!("pack tree --data {mode}");
    let (_keep, backing) = kept_backing();
    let native = native_dir();
    sh_ok(native.path(), TREE_SCRIPT);
    let want = manifest(native.path());
    let s = pack_on(mode, Some(&backing), &[]);
    sh_ok(s.mountpoint(), TREE_SCRIPT);
    let got = manifest(s.mountpoint());
    assert_eq!(want, got, "{test}: tree differs from native");
    umount_clean(s, &test);
    assert_consistent(&backing, &test);
    // The unmount gave back the slots the daemon had reserved and not
    // handed out (the next mount would reclaim them, a job's next process
    // would not).
    let db = rusqlite::Connection::open(backing.join("pack.db")).unwrap();
    let held: i64 = db
        .query_row("SELECT count(*) FROM slots WHERE ino < 0", [], |r| r.get(0))
        .unwrap();
    assert_eq!(held, 0, "{test}: slots still reserved after the unmount");
    drop(db);
    let s = pack_on(mode, Some(&backing), &[]);
    assert_eq!(
        want,
        manifest(s.mountpoint()),
        "{test}: differs after remount"
    );
    // The small files live in pack files, not as backing files.
    let own = fs::read_dir(backing.join("files")).unwrap().count();
    assert!(
        own <= 4,
        "{test}: {own} files of their own for a tree of small files"
    );
}

fuse_test!(programs_tree_daemon => programs_tree(DataMode::Daemon));
fuse_test!(programs_tree_auto => programs_tree(DataMode::Auto));

fn sqlite_and_git(mode: DataMode) {
    need("sqlite3");
    need("git");
    let test = format!("pack sqlite3+git --data {mode}");
    let s = pack_on(mode, None, &[]);
    let m = s.mountpoint();
    let out = sh_ok(
        m,
        "sqlite3 t.db 'create table t(k integer primary key, v text);' && \
         i=0; while [ $i -lt 20 ]; do \
           sqlite3 t.db \"insert into t(v) select hex(randomblob(300)) from (select 1 union all select 2 union all select 3 union all select 4 union all select 5);\"; \
           i=$((i+1)); done; \
         sqlite3 t.db 'pragma integrity_check; select count(*) from t; select count(distinct v) from t;'",
    );
    assert_eq!(out, "ok\n100\n100\n", "{test}: sqlite3 said {out:?}");
    let out = sh_ok(
        m,
        "git init -q repo && cd repo && git config user.email t@t && git config user.name t && \
         seq 1 2000 > a && mkdir d && for i in 1 2 3 4 5 6 7 8 9; do echo $i > d/$i; done && \
         git add -A && git commit -qm one && git mv a b && echo more >> b && git rm -q d/1 && \
         git commit -qam two && git gc -q && git fsck --strict 2>&1 && git log --oneline | wc -l && \
         git show HEAD~1:a | sha256sum && seq 1 2000 | sha256sum",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"2"), "{test}: git log: {out}");
    assert_eq!(
        lines[lines.len() - 1],
        lines[lines.len() - 2],
        "{test}: git bytes: {out}"
    );
    assert_consistent(s.backing(), &test);
}

fuse_test!(sqlite_and_git_daemon => sqlite_and_git(DataMode::Daemon));
fuse_test!(sqlite_and_git_auto => sqlite_and_git(DataMode::Auto));

/// Many small files written and read back byte-exact, and the backing
/// store holds a handful of files for them.
fn many_small_files() {
    let n = env_num("MAPFS_PACK_FILES", 100_000) as usize;
    let test = format!("pack {n} small files");
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    for i in 0..n {
        if i % 1000 == 0 {
            fs::create_dir(m.join(format!("d{}", i / 1000))).unwrap();
        }
        let name = format!("d{}/f{i}", i / 1000);
        fs::write(m.join(&name), stream(&name, 1 + (i * 37) % 4096)).unwrap();
    }
    for i in 0..n {
        let name = format!("d{}/f{i}", i / 1000);
        let got = fs::read(m.join(&name)).unwrap();
        assert!(
            got == stream(&name, 1 + (i * 37) % 4096),
            "{test}: {name} differs"
        );
    }
    let backing_files = sh_ok(s.backing(), "find . -type f | wc -l");
    let backing_files: usize = backing_files.trim().parse().unwrap();
    assert!(
        backing_files <= 8,
        "{test}: {backing_files} backing files for {n} small files"
    );
    let st = pack_stats(s.backing());
    eprintln!("{test}: {st:?}");
    assert_eq!(st.files, n as u64);
    assert_eq!(st.own_files, 0);
    assert_consistent(s.backing(), &test);
}

fuse_test!(many_small_files_byte_exact => many_small_files());

// ---------------------------------------------------------------------------
// Space: reuse and online compaction
// ---------------------------------------------------------------------------

fuse_test!(tools_run_offline_and_refuse_a_store_in_use => {
    let test = "tools offline";
    let dir = tempfile::Builder::new()
        .prefix("mapfs-pack-tools")
        .tempdir_in("/var/tmp")
        .unwrap();
    let backing = dir.path();
    let s = pack_on(DataMode::Auto, Some(backing), &[]);
    for i in 0..30 {
        fs::write(s.mountpoint().join(format!("f{i}")), stream(&format!("f{i}"), 1000)).unwrap();
    }
    // Once every close reached the daemon (releases are sent in the
    // background) and the new files moved into their slots.
    let mounted = wait_packed(backing, 0, test);
    umount_clean(s, test);
    // Nothing serves the store: the tools run here, on its database.
    let offline = pack_stats(backing);
    assert_eq!(offline.files, 30, "{test}: {offline:?}");
    assert_eq!(offline.slotted_bytes, mounted.slotted_bytes, "{test}: {mounted:?} {offline:?}");
    assert_consistent(backing, test);
    let out = run_captured(Command::new(mapfs_bin()).args(["pack", "compact", "--json"]).arg(backing)).unwrap();
    assert!(out.success(), "{test}: offline compact: {}{}", out.stdout, out.stderr);
    // Held by an instance no mount answers for (here, a lock taken by
    // hand): a clear refusal, not a wait on the database.
    let holder = fs::File::open(backing.join("pack.lock")).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let out = run_captured(Command::new(mapfs_bin()).args(["pack", "stats"]).arg(backing)).unwrap();
    drop(holder);
    assert!(!out.success(), "{test}: stats of a store in use ran: {}", out.stdout);
    assert!(
        out.stderr.contains("already served") && out.stderr.contains("no mount of it answers"),
        "{test}: unclear refusal: {}",
        out.stderr
    );
    // The store is as it was.
    assert_eq!(pack_stats(backing).files, 30, "{test}");
});

// A file created through a mount whose kernel runs whole-file maps starts
// in a file of its own: its writes, however large the file grows, run by
// kernel passthrough, and at its last close a file that fits the threshold
// moves into a slot, its bytes put in the kernel's pages on the way, so
// that reading it back needs no request either. One past the threshold
// keeps its file; an open beside the writer keeps the move waiting for the
// last close; an empty file takes no slot.
fuse_test!(new_files_are_written_by_passthrough_and_packed_at_their_last_close => {
    let test = "pack: new files";
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    let writes = op_count_now(m, "WRITE");
    let big = stream("big", 1 << 20);
    fs::write(m.join("big"), &big).unwrap();
    let sizes: Vec<usize> = (0..50).map(|i| 1 + i * 1301 % 65536).collect();
    for (i, n) in sizes.iter().enumerate() {
        fs::write(m.join(format!("s{i}")), stream(&format!("s{i}"), *n)).unwrap();
    }
    fs::write(m.join("empty"), b"").unwrap();
    let written = op_count_now(m, "WRITE") - writes;
    assert_eq!(written, 0, "{test}: {written} WRITEs reached the daemon");
    let st = wait_packed(s.backing(), 1, test);
    assert_eq!(st.files, 52, "{test}: {st:?}");
    let want: u64 = sizes.iter().map(|n| *n as u64).sum();
    assert_eq!(st.slotted_bytes, want, "{test}: {st:?}");
    let own: Vec<_> = fs::read_dir(s.backing().join("files"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(own.len(), 1, "{test}: files of their own: {own:?}");
    let reads = op_count_now(m, "READ");
    for (i, n) in sizes.iter().enumerate() {
        let name = format!("s{i}");
        assert!(fs::read(m.join(&name)).unwrap() == stream(&name, *n), "{test}: {name} differs");
    }
    let read = op_count_now(m, "READ") - reads;
    assert_eq!(read, 0, "{test}: reading the packed files sent {read} READs");
    assert!(fs::read(m.join("big")).unwrap() == big, "{test}: big differs");
    assert_eq!(fs::metadata(m.join("empty")).unwrap().len(), 0);

    // Two opens: the first close leaves the file where it is.
    let a = fs::File::create(m.join("two")).unwrap();
    let b = fs::OpenOptions::new().read(true).open(m.join("two")).unwrap();
    a.write_all_at(b"first", 0).unwrap();
    drop(b);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pack_stats(s.backing()).own_files, 2, "{test}: moved while open");
    a.write_all_at(b" and last", 5).unwrap();
    drop(a);
    wait_packed(s.backing(), 1, test);
    assert_eq!(fs::read(m.join("two")).unwrap(), b"first and last");
    assert_consistent(s.backing(), test);
    drop(s);
});

/// Voluntary context switches of thread `tid` of `pid`.
fn wakeups(pid: u32, tid: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/PID/task/TID/status")
}

// An idle daemon sleeps: its housekeeping thread runs when `pack` rings for
// it (new files released), not on a timer (it woke 20 times a second), and
// at the lowest priority. New files still move into slots, with no tool
// asking (`mapfs pack stats` would move them itself). The control socket's thread wakes for other
// tests' clients here; its unit test checks that it sleeps without any
// (`an_idle_server_sleeps_until_a_client_comes`).
fuse_test!(an_idle_daemon_sleeps_and_still_packs_new_files => {
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    for i in 0..100 {
        fs::write(m.join(format!("f{i}")), stream(&format!("idle {i}"), 100 + 40 * i)).unwrap();
    }
    let own = s.backing().join("files");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = fs::read_dir(&own).unwrap().count();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} of 100 new files still in files of their own 10 s after their close"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = mapfs_cli::mounts::read_info(m).expect("the mount's info file").pid;
    let housekeeping = thread_named(pid, "mapfs-housekeep");
    // Work between requests yields the processor to requests (field 19:
    // the nice value).
    assert_eq!(
        task_stat_field(pid, &housekeeping, 19),
        19,
        "the housekeeping thread's nice value"
    );
    let before = wakeups(pid, &housekeeping);
    std::thread::sleep(Duration::from_secs(2));
    let woke = wakeups(pid, &housekeeping) - before;
    assert!(
        woke <= 2,
        "the housekeeping thread of an idle daemon woke {woke} times in 2 s"
    );
    for i in 0..100 {
        assert_eq!(
            fs::read(m.join(format!("f{i}"))).unwrap(),
            stream(&format!("idle {i}"), 100 + 40 * i),
            "f{i}"
        );
    }
    umount_clean(s, "idle daemon");
});

// A create answered before its commit (`pending.rs`) is a file the next
// mount enters under its name, whatever the daemon's death left undone.
fuse_test!(creates_answered_before_their_commit_outlive_the_daemon => {
    let test = "pack: creates before their commit";
    let (_keep, backing) = kept_backing();
    let backing = backing.as_path();
    // No housekeeping round and fewer releases than a batch: nothing
    // commits the creates but a write transaction.
    let mount = || {
        MountSession::builder(mapfs_bin())
            .fs("pack")
            .data(DataMode::Auto)
            .backing(backing)
            .env("MAPFS_HOUSEKEEPING_MS", "0")
            .arg("--no-supervisor")
            .mount()
            .unwrap_or_else(|e| panic!("{test}: mounting: {e:#}"))
    };
    let s = mount();
    let m = s.mountpoint().to_path_buf();
    fs::create_dir(m.join("d")).unwrap();
    fs::set_permissions(m.join("d"), fs::Permissions::from_mode(0o2775)).unwrap();
    let before = fs::metadata(m.join("d")).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut want = BTreeMap::new();
    for i in 0..10 {
        let name = format!("d/closed{i}");
        let body = stream(&name, 100 * i + 1);
        fs::write(m.join(&name), &body).unwrap();
        want.insert(name, (body, 0o644));
    }
    // Open at the kill: never released.
    let mut held = Vec::new();
    for i in 0..5 {
        let name = format!("d/held{i}");
        let body = stream(&name, 70_000 * (i % 2) + 10);
        let mut f = fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(m.join(&name))
            .unwrap();
        std::io::Write::write_all(&mut f, &body).unwrap();
        held.push(f);
        want.insert(name, (body, 0o600));
    }
    // Seen through the mount before any commit (an open would commit
    // them): a name and its size, the directory's new mtime, a second
    // create of a name refused.
    let md = fs::metadata(m.join("d/closed3")).unwrap();
    assert_eq!(md.len(), want["d/closed3"].0.len() as u64, "{test}: size before the kill");
    let after = fs::metadata(m.join("d")).unwrap().modified().unwrap();
    assert!(after > before, "{test}: the directory's mtime did not move: {before:?} {after:?}");
    let again = fs::OpenOptions::new().create_new(true).write(true).open(m.join("d/held1"));
    assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AlreadyExists, "{test}");
    // Each made by the deferred create: its record is on its file.
    let records = fs::read_dir(backing.join("files"))
        .unwrap()
        .filter(|e| {
            let mut buf = [0u8; 512];
            rustix::fs::getxattr(e.as_ref().unwrap().path(), "user.mapfs.create", &mut buf).is_ok()
        })
        .count();
    assert_eq!(records, want.len(), "{test}: files/ entries with a create record");
    let pid = preload_support::daemon_pid(&s);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    drop(held);
    drop(s);
    // The offline tools count them as waiting, not as files, until a mount.
    let st = pack_stats(backing);
    assert_eq!(
        (st.awaiting_entry, st.files),
        (want.len() as u64, 0),
        "{test}: offline stats after the kill: {st:?}"
    );
    let s = pack_on(DataMode::Auto, Some(backing), &[]);
    let st = pack_stats(backing);
    assert_eq!(
        (st.awaiting_entry, st.files),
        (0, want.len() as u64),
        "{test}: stats after the remount: {st:?}"
    );
    let m = s.mountpoint();
    let mut names: Vec<String> = fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| format!("d/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    names.sort();
    assert_eq!(names, want.keys().cloned().collect::<Vec<_>>(), "{test}: names after the kill");
    for (name, (body, mode)) in &want {
        let md = fs::metadata(m.join(name)).unwrap();
        assert_eq!(md.mode() & 0o7777, *mode, "{test}: {name} mode");
        // The setgid directory's group.
        assert_eq!(md.gid(), fs::metadata(m.join("d")).unwrap().gid(), "{test}: {name} group");
        assert!(fs::read(m.join(name)).unwrap() == *body, "{test}: {name} bytes");
    }
    assert_consistent(backing, test);
    umount_clean(s, test);
});

// What a crash leaves in `files/` (a create that never committed, a move
// into a slot that committed but did not remove the file) is removed by
// the next mount; files of their own the database names, and names that
// are no inode number, stay.
fuse_test!(a_mount_removes_files_of_their_own_no_inode_owns => {
    let test = "pack: strays";
    let dir = tempfile::Builder::new()
        .prefix("mapfs-pack-strays")
        .tempdir_in("/var/tmp")
        .unwrap();
    let backing = dir.path();
    let s = pack_on(DataMode::Auto, Some(backing), &[]);
    let m = s.mountpoint().to_path_buf();
    fs::write(m.join("small"), stream("small", 3000)).unwrap();
    fs::write(m.join("big"), stream("big", 200_000)).unwrap();
    wait_packed(backing, 1, test);
    umount_clean(s, test);
    let own = backing.join("files");
    let kept: Vec<_> = fs::read_dir(&own).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(kept.len(), 1, "{test}: {kept:?}");
    for stray in ["2", "999999"] {
        fs::write(own.join(stray), b"left by a crash").unwrap();
    }
    fs::write(own.join("notes"), b"not an inode").unwrap();
    let s = pack_on(DataMode::Auto, Some(backing), &[]);
    let mut left: Vec<_> = fs::read_dir(&own).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    let mut want = kept.clone();
    want.push("notes".into());
    want.sort();
    assert_eq!(left, want, "{test}: what stayed in files/");
    let m = s.mountpoint();
    assert!(fs::read(m.join("small")).unwrap() == stream("small", 3000), "{test}: small");
    assert!(fs::read(m.join("big")).unwrap() == stream("big", 200_000), "{test}: big");
    fs::remove_file(own.join("notes")).unwrap();
    assert_consistent(backing, test);
    umount_clean(s, test);
});

// A file made longer than its slot by a truncate (fio lays out its files
// with `fallocate`), the rest holes, moves to a file of its own when it is
// next opened for writing with no other open: that open runs by kernel
// passthrough. It used to keep its slot until its first write, and the
// open, answered before, ran through the daemon for its whole life.
fuse_test!(a_file_past_the_threshold_gets_its_own_file_at_open => {
    let test = "pack: own file at open";
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    let head = stream("head", 1000);
    // Made, then in a slot, then made longer by a truncate.
    fs::write(m.join("f"), &head).unwrap();
    wait_packed(s.backing(), 0, test);
    fs::OpenOptions::new()
        .write(true)
        .open(m.join("f"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let st = pack_stats(s.backing());
    assert_eq!(st.own_files, 0, "{test}: moved before the reopen: {st:?}");
    let writes_before = op_count_now(m, "WRITE");
    let mid = stream("mid", 4096);
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.join("f"))
            .unwrap();
        for i in 0..16u64 {
            f.write_all_at(&mid, (512 << 10) + i * 4096).unwrap();
        }
    }
    let writes = op_count_now(m, "WRITE") - writes_before;
    assert_eq!(
        writes, 0,
        "{test}: the reopened file's writes went through the daemon ({writes} WRITEs)"
    );
    let st = pack_stats(s.backing());
    assert_eq!(st.own_files, 1, "{test}: {st:?}");
    let mut want = vec![0u8; 1 << 20];
    want[..1000].copy_from_slice(&head);
    for i in 0..16usize {
        let at = (512 << 10) + i * 4096;
        want[at..at + 4096].copy_from_slice(&mid);
    }
    assert!(fs::read(m.join("f")).unwrap() == want, "{test}: bytes differ");
    assert_consistent(s.backing(), test);
});

fuse_test!(freed_slots_are_reused => {
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint();
    for i in 0..200 {
        fs::write(m.join(format!("f{i}")), stream(&format!("f{i}"), 3000)).unwrap();
    }
    // Every new file in its slot first: the kernel sends releases in the
    // background, and a file moved after `before` would take a slot that
    // `after` counts as cut (55 of 200 were still waiting once in CI).
    let before = wait_packed(s.backing(), 0, "slot reuse");
    for i in 0..200 {
        fs::remove_file(m.join(format!("f{i}"))).unwrap();
    }
    for i in 0..200 {
        fs::write(m.join(format!("g{i}")), stream(&format!("g{i}"), 4000)).unwrap();
    }
    let after = wait_packed(s.backing(), 0, "slot reuse");
    // The 200 new files took the 200 freed slots (and ones reserved
    // before): not one slot was cut from the pack files.
    assert_eq!(before.slots, after.slots, "new slots were cut: {before:?} {after:?}");
    assert_eq!(before.slot_bytes, after.slot_bytes, "{before:?} {after:?}");
    for i in 0..200 {
        assert!(fs::read(m.join(format!("g{i}"))).unwrap() == stream(&format!("g{i}"), 4000));
    }
    assert_consistent(s.backing(), "slot reuse");
});

fuse_test!(compact_while_reading_and_writing => {
    let test = "pack compact online";
    let s = pack_on(DataMode::Auto, None, &[]);
    let m = s.mountpoint().to_path_buf();
    let n = 3000;
    for i in 0..n {
        fs::write(m.join(format!("f{i}")), stream(&format!("f{i}"), 2000)).unwrap();
    }
    // In a slot before it is held (a new file starts in a file of its own),
    // after the others' (new files move in the order they were released).
    fs::write(m.join("held"), stream("held", 1500)).unwrap();
    wait_packed(s.backing(), 0, test);
    // Free most of the front so the back has somewhere to go.
    for i in 0..n * 2 / 3 {
        fs::remove_file(m.join(format!("f{i}"))).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (m, stop, errors) = (m.clone(), stop.clone(), errors.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                for i in n * 2 / 3..n {
                    let name = format!("f{i}");
                    match fs::read(m.join(&name)) {
                        Ok(b) if b == stream(&name, 2000) => {}
                        Ok(_) => errors.lock().unwrap().push(format!("{name} differs")),
                        Err(e) => errors.lock().unwrap().push(format!("{name}: {e}")),
                    }
                }
                rounds += 1;
            }
            rounds
        })
    };
    let writer = {
        let (m, stop, errors) = (m.clone(), stop.clone(), errors.clone());
        std::thread::spawn(move || {
            let mut k = 0;
            // One file held open and rewritten the whole time: never moved.
            let held = fs::OpenOptions::new().read(true).write(true).open(m.join("held")).unwrap();
            while !stop.load(Ordering::Relaxed) || k == 0 {
                let name = format!("w{}", k % 500);
                let data = stream(&format!("{name}.{k}"), 1500);
                if let Err(e) = fs::write(m.join(&name), &data) {
                    errors.lock().unwrap().push(format!("write {name}: {e}"));
                }
                held.write_all_at(&data, 0).unwrap();
                let mut b = vec![0u8; data.len()];
                held.read_exact_at(&mut b, 0).unwrap();
                if b != data {
                    errors.lock().unwrap().push("held file differs".into());
                }
                match fs::read(m.join(&name)) {
                    Ok(b) if b == data => {}
                    Ok(_) => errors.lock().unwrap().push(format!("{name} differs after write")),
                    Err(e) => errors.lock().unwrap().push(format!("read {name}: {e}")),
                }
                k += 1;
            }
            k
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let before = pack_stats(s.backing());
    let out = run_captured(Command::new(mapfs_bin()).args(["pack", "compact", "--json"]).arg(s.backing())).unwrap();
    assert!(out.success(), "{test}: {}{}", out.stdout, out.stderr);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let rounds = reader.join().unwrap();
    let writes = writer.join().unwrap();
    let errs = errors.lock().unwrap().clone();
    assert!(errs.is_empty(), "{test}: {errs:?}");
    let rep: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let after = pack_stats(s.backing());
    eprintln!("{test}: {rep} reader rounds {rounds}, writes {writes}\nbefore {before:?}\nafter {after:?}");
    assert!(rep["moved"].as_u64().unwrap() > 500, "{test}: moved too little: {rep}");
    // `held` is open the whole time, with free slots of its class before it.
    assert!(rep["busy"].as_u64().unwrap() >= 1, "{test}: an open file was moved: {rep}");
    assert!(after.pack_disk_bytes < before.pack_disk_bytes, "{test}: no space reclaimed");
    for i in n * 2 / 3..n {
        let name = format!("f{i}");
        assert!(fs::read(m.join(&name)).unwrap() == stream(&name, 2000), "{test}: {name}");
    }
    assert_consistent(s.backing(), test);
});

// ---------------------------------------------------------------------------
// Crash safety: SIGKILL during a write storm
// ---------------------------------------------------------------------------

/// What the storm made durable: append files and their fsync'ed length,
/// replaced files and their renamed-and-synced version.
#[derive(Default)]
struct Durable {
    appended: BTreeMap<String, usize>,
    replaced: BTreeMap<String, (u64, u64)>,
}

/// Appends to one file and replaces another (write, fsync, rename, fsync
/// of the directory) until the mount dies; records what was made durable.
fn storm(m: PathBuf, t: usize, round: u64, seed: u64, dur: Arc<Mutex<Durable>>) {
    let mut x = seed | 1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    // One file that grows past the threshold (a file of its own, then
    // emptied and slotted again), one that stays in slots.
    let mut apps = Vec::new();
    for (name, cap, step) in [
        (format!("app-{t}"), 300_000, 3000),
        (format!("small-{t}"), 8000, 700),
    ] {
        let Ok(f) = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(m.join(&name))
        else {
            return;
        };
        let Ok(md) = f.metadata() else { return };
        apps.push((name.clone(), f, md.len() as usize, stream(&name, cap), step));
    }
    for v in round * 1000.. {
        for (name, f, len, full, step) in apps.iter_mut() {
            let n = 1 + rnd(*step) as usize;
            if *len + n > full.len() {
                // Once the truncate is issued the file may be empty after a
                // crash, whether or not the sync that follows returns.
                dur.lock().unwrap().appended.insert(name.clone(), 0);
                if f.set_len(0).is_err() || f.sync_all().is_err() {
                    return;
                }
                *len = 0;
            }
            if f.write_all_at(&full[*len..*len + n], *len as u64).is_err() {
                return;
            }
            *len += n;
            if rnd(3) == 0 {
                if f.sync_data().is_err() {
                    return;
                }
                dur.lock().unwrap().appended.insert(name.clone(), *len);
            }
        }
        let rep = format!("rep-{t}-{}", rnd(4));
        let tmp = format!("tmp-{t}-{v}");
        let size = rnd(20_000) as usize;
        let body = stream(&format!("{rep}.{v}"), size);
        let ok = fs::write(m.join(&tmp), &body).is_ok()
            && fs::File::open(m.join(&tmp))
                .and_then(|f| f.sync_all())
                .is_ok()
            && fs::rename(m.join(&tmp), m.join(&rep)).is_ok()
            && fs::File::open(&m).and_then(|d| d.sync_all()).is_ok();
        if !ok {
            return;
        }
        dur.lock().unwrap().replaced.insert(rep, (v, size as u64));
    }
}

fuse_test!(crash_sigkill_during_write_storm => {
    let kills = env_num("MAPFS_PACK_KILLS", 20);
    let (_keep, backing) = kept_backing();
    let durable = Arc::new(Mutex::new(Durable::default()));
    // Versions ever started per replaced name, to check a visible version
    // was written (not merely that it is newer).
    for round in 0..kills {
        let seed = 0x5eed_0000 + round;
        let test = format!("pack crash round {round} (seed {seed:#x})");
        let mode = if round % 2 == 0 { DataMode::Auto } else { DataMode::Daemon };
        let s = pack_unsupervised(mode, &backing, &["threshold=8192"]);
        let pid = preload_support::daemon_pid(&s);
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let (m, d) = (s.mountpoint().to_path_buf(), durable.clone());
                std::thread::spawn(move || storm(m, t, round, seed + t as u64, d))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100 + (seed * 7919) % 400));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        for t in threads {
            t.join().unwrap();
            assert!(Instant::now() < deadline, "{test}: writers hung");
        }
        drop(s);
        assert_consistent(&backing, &test);
        let s = pack_on(mode, Some(&backing), &["threshold=8192"]);
        let m = s.mountpoint();
        let d = durable.lock().unwrap();
        for (name, &len) in &d.appended {
            let got = fs::read(m.join(name)).unwrap();
            assert!(got.len() >= len, "{test}: {name} lost fsync'ed bytes: {} < {len}", got.len());
            let cap = if name.starts_with("app-") { 300_000 } else { 8000 };
            assert!(
                got.len() <= cap && got == stream(name, cap)[..got.len()],
                "{test}: {name} holds bytes never written"
            );
        }
        for e in fs::read_dir(m).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let got = fs::read(m.join(&name)).unwrap();
            if let Some(rest) = name.strip_prefix("tmp-") {
                // A file being written: what it shows must be a prefix of
                // what was written to it.
                let (t, v) = rest.split_once('-').unwrap();
                let found = (0..4).any(|r| {
                    let want = stream(&format!("rep-{t}-{r}.{v}"), 20_000);
                    got.len() <= want.len() && got == want[..got.len()]
                });
                assert!(found, "{test}: {name} holds bytes never written");
                fs::remove_file(m.join(&name)).unwrap();
            } else if name.starts_with("rep-") {
                let durable_v = d.replaced.get(&name).map_or(0, |r| r.0);
                let found = (durable_v..(round + 1) * 1000 + 100_000).take(200_000).any(|v| {
                    let want = stream(&format!("{name}.{v}"), got.len());
                    got == want
                });
                assert!(found, "{test}: {name} is no version at or after the fsync'ed {durable_v}");
            }
        }
        eprintln!(
            "{test}: checked {} appended and {} replaced files",
            d.appended.len(),
            d.replaced.len()
        );
        if let Some(name) = d.replaced.keys().next() {
            assert!(m.join(name).exists(), "{test}: {name} lost");
        }
        drop(d);
        umount_clean(s, &test);
    }
    assert_consistent(&backing, "after the crash rounds");
});

// ---------------------------------------------------------------------------
// The shim on pack: files of their own run natively, slotted ones too for
// root (the mount's owner), and nobody gets what nobody may not open
// ---------------------------------------------------------------------------

#[test]
fn shim_adopts_own_files_and_refuses_like_the_mount() {
    use preload_support::*;
    let test = "pack under mapfs run as nobody";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = MountSession::builder(mapfs_bin())
        .fs("pack")
        .data(DataMode::Auto)
        .options(["allow_other", "default_permissions", SMALL_THRESHOLD])
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let m = s.mountpoint();
    let text = |c: u8, n: usize| vec![c; n];
    fs::write(m.join("secret"), text(b's', 100_000)).unwrap();
    fs::set_permissions(m.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.join("big"), text(b'b', 100_000)).unwrap();
    fs::write(m.join("small"), text(b'm', 300)).unwrap();
    // `small` in its slot (a new file moves there after its release).
    wait_packed(s.backing(), 2, test);
    let report = report_path(&s, "nobody");
    fs::write(&report, b"").unwrap();
    fs::set_permissions(&report, fs::Permissions::from_mode(0o666)).unwrap();
    let (secret, big, small) = (m.join("secret"), m.join("big"), m.join("small"));
    let run = |shimmed| read_as_nobody(&s, &report, &[&secret, &big, &small], shimmed);
    let b100 = "b".repeat(100);
    let m100 = "m".repeat(100);
    let (sp, bp, mp) = (secret.display(), big.display(), small.display());
    assert_eq!(
        run(false),
        format!("{sp} EACCES\n{bp} ok {b100} -1\n{mp} ok {m100} -1\n"),
        "{test}: through the mount"
    );
    // 3: adopted (reads run in the program), 6: run in the program's
    // engine. A slot is never lent to nobody (its pack file holds root's
    // secret): nobody reads a copy of the file's bytes.
    assert_eq!(
        run(true),
        format!("{sp} EACCES\n{bp} ok {b100} 3\n{mp} ok {m100} 6\n"),
        "{test}: through the shim"
    );
    // Root could open the pack file itself: its slots run in the program
    // (6: lent to the program's data engine).
    let s100 = "s".repeat(100);
    assert_eq!(
        read_as(false, &s, &report, &[&secret, &small], true),
        format!("{sp} ok {s100} 3\n{mp} ok {m100} 6\n"),
        "{test}: root through the shim"
    );
}
