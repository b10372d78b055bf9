//! The shim's map cache (DeFUSE's M-Cache): re-opening an
//! unchanged file is adopted without a daemon round trip; any change made
//! by another process through the mount (rename, truncate, write+close,
//! unlink and re-create) is seen at the next open, which asks the daemon
//! again. Bytes are checked at every step. The generation table comes with
//! a connection's first adoption (only clients that adopt see it), so the
//! first open of a process is never cached.

mod common;
mod preload_support;

use common::{fuse_or_skip, mount, DataMode};
use preload_support::*;

/// Reads the file on command (`r`: read-only, `w`: read-write open) and
/// answers `<cache hits so far> <bytes read as hex>`.
const READER: &str = r#"
import os, sys, ctypes
libc = ctypes.CDLL(None)
hits = libc.mapfs_preload_cache_hits
hits.restype = ctypes.c_uint64
for cmd in sys.stdin:
    cmd = cmd.strip()
    if cmd == 'q':
        break
    fd = os.open(sys.argv[1], os.O_RDONLY if cmd == 'r' else os.O_RDWR)
    data = os.pread(fd, 1 << 20, 0)
    st = libc.mapfs_preload_fd_status(fd)
    assert st == 3, f'not adopted: {st}'
    assert os.fstat(fd).st_ino == os.stat(sys.argv[1]).st_ino
    os.close(fd)
    print(hits(), data.hex(), flush=True)
"#;

/// Opens, reads and closes the file: (cache hits so far, bytes).
fn read(r: &mut Stepped, cmd: &str) -> (u64, Vec<u8>) {
    r.say(cmd);
    let line = r.line();
    let (hits, hex) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("reader under the shim failed (stderr above): {line:?}"));
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    (hits.parse().unwrap(), bytes)
}

fn map_cache(mode: DataMode) {
    let test = format!("preload map cache ({mode})");
    if !fuse_or_skip(&test) || !need("python3") {
        return;
    }
    let s = mount(mode, &[]);
    let path = s.mountpoint().join("cached.bin");
    let other = s.mountpoint().join("moved.bin");
    let mut want = pattern(5000, 1);
    std::fs::write(&path, &want).unwrap();
    let mut r = Stepped::start(&s, "mcache", READER, &path);

    // (what another process did, the expected bytes after it)
    let mut hits = 0;
    let step = |r: &mut Stepped, what: &str, want: &[u8], hits: &mut u64| {
        let (h, got) = read(r, "r");
        assert!(got == want, "{test}: bytes after {what}");
        assert_eq!(
            h, *hits,
            "{test}: the first open after {what} must ask the daemon"
        );
        let (h, got) = read(r, "r");
        assert!(got == want, "{test}: bytes re-read after {what}");
        *hits += 1;
        assert_eq!(
            h, *hits,
            "{test}: re-opening unchanged after {what} must hit the cache"
        );
    };
    // The first adoption brings the table; nothing could be cached with it.
    let (h, got) = read(&mut r, "r");
    assert!(got == want, "{test}: bytes of the first open");
    assert_eq!(
        h, 0,
        "{test}: the first open cannot be cached (no table yet)"
    );
    step(&mut r, "the first open", &want, &mut hits);
    // A writable open may change the file: it asks the daemon, and its
    // close invalidates what anyone cached (the size may have changed).
    let (h, got) = read(&mut r, "w");
    assert!(got == want, "{test}: read-write open bytes");
    assert_eq!(h, hits, "{test}: a writable open asks the daemon");
    step(&mut r, "its own read-write open", &want, &mut hits);

    std::fs::rename(&path, &other).unwrap();
    std::fs::rename(&other, &path).unwrap();
    step(&mut r, "a rename", &want, &mut hits);

    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1234)
        .unwrap();
    want.truncate(1234);
    step(&mut r, "a truncate", &want, &mut hits);

    want = pattern(7000, 2);
    std::fs::write(&path, &want).unwrap();
    step(&mut r, "a write and close", &want, &mut hits);

    std::fs::remove_file(&path).unwrap();
    want = pattern(3000, 3);
    std::fs::write(&path, &want).unwrap();
    step(&mut r, "an unlink and re-create", &want, &mut hits);
}

#[test]
fn map_cache_passthrough() {
    map_cache(DataMode::Passthrough);
}

#[test]
fn map_cache_daemon() {
    map_cache(DataMode::DaemonNoWriteback);
}

/// With the cache off, every adoption asks the daemon.
#[test]
fn map_cache_off() {
    let test = "preload map cache off";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let s = mount(DataMode::Passthrough, &[]);
    let path = s.mountpoint().join("f.bin");
    std::fs::write(&path, pattern(100, 9)).unwrap();
    let report = report_path(&s, "off");
    ok(attached(&s, &report, "python3")
        .env("MAPFS_PRELOAD_MAP_CACHE", "0")
        .arg("-c")
        .arg("import sys\nfor i in range(5): open(sys.argv[1], 'rb').read()")
        .arg(&path));
    let t = totals(&report, "python");
    assert_eq!((t.adopted, t.cache_hits), (5, 0), "{test}: {t:?}");
}
