//! A full backing disk: writers get `ENOSPC` (at `write`, or at the latest
//! at `fsync`/`close` under the kernel's writeback cache), files already
//! written keep their bytes, acknowledged bytes are on the file, and once
//! space is freed writing works again. The backing store is a small tmpfs
//! mounted by the test, in every data mode and under the shim.

mod common;
mod preload_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use preload_support::{attached, need, ok, pattern, report_path, totals};

/// A tmpfs of a few MiB, unmounted (lazily, so a failed test cannot leave
/// it behind) and removed on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(test: &str) -> Option<SmallDisk> {
        let dir = tempfile::Builder::new()
            .prefix("mapfs-small-")
            .tempdir()
            .unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=12m,mode=0755", "tmpfs"])
            .arg(dir.path())
            .status();
        if !st.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED {test}: cannot mount a small tmpfs (needs root)");
            return None;
        }
        Some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes 256 KiB chunks of a pattern to `argv[1]` until an error; prints
/// what was acknowledged and where the error came.
const FILLER: &str = r#"
import os, sys, json
def pat(n, seed):
    out = bytearray(n); x = seed
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out[i] = x >> 56
    return bytes(out)
chunk = pat(262144, 7)
res = {'acked': 0, 'write': 0, 'fsync': 0, 'close': 0}
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    while res['acked'] < (64 << 20):
        n = os.write(fd, chunk)
        res['acked'] += n
        if n < len(chunk):
            os.write(fd, chunk[n:])
except OSError as e:
    res['write'] = e.errno
try:
    os.fsync(fd)
except OSError as e:
    res['fsync'] = e.errno
try:
    os.close(fd)
except OSError as e:
    res['close'] = e.errno
print(json.dumps(res))
"#;

/// The chunk the filler repeats (same generator as in [`FILLER`]).
fn chunk() -> Vec<u8> {
    let mut x: u64 = 7;
    (0..262_144)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

fn full_disk(mode: DataMode, shim: bool) {
    let test = format!("full disk ({mode}{})", if shim { ", shim" } else { "" });
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let Some(disk) = SmallDisk::new(&test) else {
        return;
    };
    let s = MountSession::builder(mapfs_bin())
        .data(mode)
        .backing(disk.path())
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mount: {e:#}"));
    let keep = s.mountpoint().join("keep.bin");
    let kept = pattern(1 << 20, 11);
    std::fs::write(&keep, &kept).unwrap();

    let fill: PathBuf = s.mountpoint().join("fill.bin");
    let report = report_path(&s, "filler");
    let mut cmd = if shim {
        attached(&s, &report, "python3")
    } else {
        Command::new("python3")
    };
    let out = ok(cmd.arg("-c").arg(FILLER).arg(&fill));
    let res: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errno = |k: &str| res[k].as_i64().unwrap() as i32;
    let acked = res["acked"].as_u64().unwrap();
    eprintln!("{test}: {res}");
    let writeback = mode == DataMode::Daemon;
    if writeback {
        // The kernel's writeback cache accepts writes into memory; the
        // error must come back no later than fsync or close.
        assert!(
            [errno("write"), errno("fsync"), errno("close")].contains(&libc::ENOSPC),
            "{test}: ENOSPC must reach the writer: {res}"
        );
    } else {
        assert_eq!(
            errno("write"),
            libc::ENOSPC,
            "{test}: write must fail: {res}"
        );
        // Every acknowledged byte is on the file.
        let got = std::fs::read(&fill).unwrap();
        assert_eq!(got.len() as u64, acked, "{test}: size of the filled file");
        let c = chunk();
        for (i, piece) in got.chunks(c.len()).enumerate() {
            assert!(
                piece == &c[..piece.len()],
                "{test}: acknowledged bytes of chunk {i} differ"
            );
        }
    }
    if shim {
        let t = totals(&report, "python");
        assert!(t.adopted >= 1, "{test}: the filler was not adopted: {t:?}");
    }
    assert!(
        std::fs::read(&keep).unwrap() == kept,
        "{test}: a file written before the disk filled lost bytes"
    );
    std::fs::remove_file(&fill).unwrap();
    let again = pattern(2 << 20, 12);
    std::fs::write(s.mountpoint().join("again.bin"), &again)
        .unwrap_or_else(|e| panic!("{test}: writing after space was freed: {e}"));
    assert!(std::fs::read(s.mountpoint().join("again.bin")).unwrap() == again);
    drop(s);
}

#[test]
fn full_disk_daemon_writeback() {
    full_disk(DataMode::Daemon, false);
}

#[test]
fn full_disk_daemon_no_writeback() {
    full_disk(DataMode::DaemonNoWriteback, false);
}

#[test]
fn full_disk_passthrough() {
    full_disk(DataMode::Passthrough, false);
}

#[test]
fn full_disk_under_the_shim() {
    full_disk(DataMode::Passthrough, true);
}
