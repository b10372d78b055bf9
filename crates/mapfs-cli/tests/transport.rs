//! The daemon's transports on real mounts: FUSE over io_uring really serves
//! the requests (`mapfs stats` counts them on the ring) with every byte and
//! attribute right, fsx runs through a ring, `-o transport=dev` keeps the
//! ring unused, and a successor daemon takes over a connection that served
//! io_uring.
//!
//! The tests turn the kernel's switch on themselves (`Y` into
//! `/sys/module/fuse/parameters/enable_uring`). It is left on: it only lets
//! a daemon ask for io_uring at `INIT`, so connections whose daemon does not
//! ask (any other FUSE server, `-o transport=dev`) are served as before.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use mapfs_testkit::fsx::{self, FsxConfig};
use mapfs_testkit::mount::run_captured;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// Longest wait for a successor daemon or a request.
const HANG: Duration = Duration::from_secs(30);

/// Turns the kernel's FUSE-over-io_uring switch on (see the module docs).
fn enable_uring() {
    std::fs::write(ENABLE_URING, "Y").unwrap_or_else(|e| {
        panic!("{ENABLE_URING}: {e} (a kernel with CONFIG_FUSE_IO_URING, as root)")
    });
    assert_eq!(
        std::fs::read_to_string(ENABLE_URING).unwrap().trim(),
        "Y",
        "{ENABLE_URING} did not take"
    );
}

fn mount(mode: DataMode, transport: &str) -> MountSession {
    MountSession::builder(mapfs_bin())
        .data(mode)
        .option(&format!("transport={transport}"))
        .mount()
        .unwrap_or_else(|e| panic!("mounting --data {mode} -o transport={transport}: {e:#}"))
}

/// `mapfs stats --json`'s raw counters of the daemon serving `mp` now.
fn raw_stats(mp: &Path) -> serde_json::Value {
    let out = run_captured(Command::new(mapfs_bin()).args(["stats", "--json"]).arg(mp)).unwrap();
    assert!(out.success(), "mapfs stats: {}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["raw"].clone()
}

/// `(transport, requests from the ring, requests from /dev/fuse)` of the
/// daemon serving `mp` now.
fn transport_stats(mp: &Path) -> (String, u64, u64) {
    let raw = raw_stats(mp);
    (
        raw["transport"].as_str().unwrap().to_string(),
        raw["uring_requests"].as_u64().unwrap(),
        raw["dev_requests"].as_u64().unwrap(),
    )
}

/// Bytes that differ per file and per offset.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Creates, writes, reads, renames, lists, changes attributes of and removes
/// files through `m`, checking each result against a model and the backing
/// directory `b`. Returns the number of system calls made on the mount.
fn workload(test: &str, m: &Path, b: &Path) -> u64 {
    let mut calls = 0;
    std::fs::create_dir(m.join("d")).unwrap();
    // Sizes around the page and the kernel's 1 MiB request limit, so that
    // writes and reads span several requests and fill the payload buffer.
    let sizes = [0usize, 1, 4095, 4096, 65_537, 1 << 20, (3 << 20) + 123];
    let mut model = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let name = format!("f{i}");
        let data = pattern(i as u64 + 1, len);
        std::fs::write(m.join("d").join(&name), &data).unwrap();
        calls += 3;
        model.push((name, data));
    }
    for (name, data) in &model {
        let got = std::fs::read(m.join("d").join(name)).unwrap();
        assert!(
            got == *data,
            "{test}: {name} read back differs through the mount"
        );
        let backing = std::fs::read(b.join("d").join(name)).unwrap();
        assert!(
            backing == *data,
            "{test}: {name} differs in the backing directory"
        );
        let md = std::fs::metadata(m.join("d").join(name)).unwrap();
        assert_eq!(md.len(), data.len() as u64, "{test}: {name} size");
        calls += 4;
    }
    // Attributes.
    let f0 = m.join("d/f0");
    std::fs::set_permissions(&f0, std::fs::Permissions::from_mode(0o640)).unwrap();
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_234_567_890);
    std::fs::File::options()
        .write(true)
        .open(&f0)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let md = std::fs::metadata(&f0).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o640, "{test}: mode through the mount");
    assert_eq!(md.mtime(), 1_234_567_890, "{test}: mtime through the mount");
    let bmd = std::fs::metadata(b.join("d/f0")).unwrap();
    assert_eq!(
        bmd.mode() & 0o7777,
        0o640,
        "{test}: mode in the backing directory"
    );
    assert_eq!(
        bmd.mtime(),
        1_234_567_890,
        "{test}: mtime in the backing directory"
    );
    calls += 6;
    // Truncate, rename, symlink, listing.
    std::fs::File::options()
        .write(true)
        .open(m.join("d/f5"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    model[5].1.truncate(1000);
    assert_eq!(
        std::fs::read(m.join("d/f5")).unwrap(),
        model[5].1,
        "{test}: truncated f5"
    );
    std::fs::rename(m.join("d/f1"), m.join("d/renamed")).unwrap();
    model[1].0 = "renamed".into();
    std::os::unix::fs::symlink("renamed", m.join("d/link")).unwrap();
    assert_eq!(
        std::fs::read_link(m.join("d/link")).unwrap(),
        Path::new("renamed"),
        "{test}: readlink"
    );
    assert_eq!(
        std::fs::read(m.join("d/link")).unwrap(),
        model[1].1,
        "{test}: through the link"
    );
    calls += 8;
    let mut listed: Vec<String> = std::fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    let mut want: Vec<String> = model.iter().map(|(n, _)| n.clone()).collect();
    want.push("link".into());
    want.sort();
    assert_eq!(listed, want, "{test}: listing");
    calls += 2;
    // Many small metadata calls: each goes to the daemon.
    for i in 0..200 {
        let p = m.join(format!("d/s{i}"));
        std::fs::write(&p, i.to_string()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            i.to_string(),
            "{test}: s{i}"
        );
        std::fs::remove_file(&p).unwrap();
        assert!(
            !b.join(format!("d/s{i}")).exists(),
            "{test}: s{i} left in the backing"
        );
        calls += 4;
    }
    std::fs::remove_file(m.join("d/link")).unwrap();
    for (name, _) in &model {
        std::fs::remove_file(m.join("d").join(name)).unwrap();
    }
    std::fs::remove_dir(m.join("d")).unwrap();
    assert!(!b.join("d").exists(), "{test}: d left in the backing");
    calls + model.len() as u64 + 2
}

#[test]
fn io_uring_serves_the_requests_with_bytes_and_attributes_right() {
    let test = "transport: io_uring serves the requests";
    if !fuse_or_skip(test) {
        return;
    }
    enable_uring();
    for mode in [DataMode::Daemon, DataMode::Auto] {
        let s = mount(mode, "uring");
        let (m, b) = (s.mountpoint(), s.backing());
        let (_, ring_before, _) = transport_stats(m);
        let calls = workload(&format!("{test} --data {mode}"), m, b);
        let (transport, ring, dev) = transport_stats(m);
        assert_eq!(transport, "uring", "{test} --data {mode}: transport");
        // Every call above reaches the daemon at least once (the creates,
        // writes, removals and attribute changes cannot be cached), and
        // the ring takes them: /dev/fuse keeps only FORGETs and the
        // requests sent before the ring was ready.
        assert!(
            ring - ring_before >= calls / 2,
            "{test} --data {mode}: {ring} requests on the ring for {calls} calls"
        );
        assert!(
            ring > dev,
            "{test} --data {mode}: {ring} requests on the ring, {dev} on /dev/fuse"
        );
        // Kernel passthrough opens (backing files registered through
        // /dev/fuse, the open answered through the ring) still happen.
        let passthrough = raw_stats(m)["passthrough_opens"].as_u64().unwrap();
        if mode == DataMode::Auto {
            assert!(passthrough >= 7, "{test}: {passthrough} passthrough opens");
        }
    }
}

#[test]
fn transport_dev_leaves_the_ring_unused() {
    let test = "transport: -o transport=dev";
    if !fuse_or_skip(test) {
        return;
    }
    enable_uring();
    let s = mount(DataMode::Auto, "dev");
    let calls = workload(test, s.mountpoint(), s.backing());
    let (transport, ring, dev) = transport_stats(s.mountpoint());
    assert_eq!(transport, "dev", "{test}");
    assert_eq!(ring, 0, "{test}: requests taken from a ring");
    assert!(dev >= calls / 2, "{test}: {dev} requests for {calls} calls");
}

#[test]
fn fsx_through_an_io_uring_mount() {
    if !fuse_or_skip("fsx through io_uring") {
        return;
    }
    enable_uring();
    for mode in [DataMode::Daemon, DataMode::Passthrough] {
        let test = format!("fsx through io_uring --data {mode}");
        let s = mount(mode, "uring");
        let cfg = FsxConfig::new(s.mountpoint(), 20_261_129, 10_000);
        let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
        eprintln!("{test}: {report}");
        assert!(
            report.skipped.is_empty(),
            "{test}: operations skipped: {report}"
        );
        for k in cfg.enabled_kinds() {
            assert!(report.count(k) > 0, "{test}: {k} never ran: {report}");
        }
        let (transport, ring, _) = transport_stats(s.mountpoint());
        assert_eq!(transport, "uring", "{test}: transport");
        assert!(ring > 1000, "{test}: only {ring} requests on the ring");
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// The pid of the daemon serving `mp`, once it is not `old` and alive.
fn daemon(mp: &Path, old: Option<u32>) -> u32 {
    let deadline = Instant::now() + HANG;
    loop {
        if let Some(info) = mapfs_cli::mounts::read_info(mp) {
            if Some(info.pid) != old && alive(info.pid) {
                return info.pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{}: no daemon within {HANG:?}",
            mp.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A daemon that served io_uring is killed; its successor registers ring
/// entries again (the kernel sends every request of the connection to the
/// ring from then on) and serves new requests, with the files' bytes intact.
/// A request made between the death and the successor's registration either
/// waits for the successor or, when the kernel handed it to an entry of the
/// dead daemon's ring before tearing that ring down, fails with `ECANCELED`
/// (Linux 6.18; see docs/transport.md); it never hangs and never does half.
#[test]
fn a_successor_takes_over_an_io_uring_connection() {
    let test = "transport: takeover of an io_uring connection";
    if !fuse_or_skip(test) {
        return;
    }
    enable_uring();
    let s = mount(DataMode::Auto, "uring");
    let (m, b) = (s.mountpoint(), s.backing());
    let data = pattern(7, 300_000);
    std::fs::write(m.join("kept"), &data).unwrap();
    let (transport, ring, _) = transport_stats(m);
    assert_eq!(transport, "uring", "{test}: before the kill");
    assert!(
        ring > 0,
        "{test}: nothing served on the ring before the kill"
    );
    let mut served_in_gap = 0;
    for round in 0..3 {
        let old = daemon(m, None);
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(old as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let deadline = Instant::now() + HANG;
        while alive(old) {
            assert!(
                Instant::now() < deadline,
                "{test}: daemon {old} does not die"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Made between the death and the successor's registration: queued
        // by the kernel on the ring of this CPU, with no entry to take it.
        let name = format!("gap{round}");
        let (path, bytes) = (m.join(&name), pattern(round + 100, 5000));
        let writer = {
            let (path, bytes) = (path.clone(), bytes.clone());
            std::thread::spawn(move || std::fs::write(path, bytes))
        };
        let new = daemon(m, Some(old));
        let deadline = Instant::now() + HANG;
        while !writer.is_finished() {
            assert!(
                Instant::now() < deadline,
                "{test}: a write made while there was no daemon is still waiting"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        match writer.join().unwrap() {
            Ok(()) => {
                assert_eq!(
                    std::fs::read(b.join(&name)).unwrap(),
                    bytes,
                    "{test}: {name} in the backing"
                );
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    bytes,
                    "{test}: {name} through the mount"
                );
                served_in_gap += 1;
            }
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {
                // The write failed at its first request (the open), or
                // later; either way a retry now writes it whole.
                std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{test}: retry: {e}"));
                assert_eq!(
                    std::fs::read(b.join(&name)).unwrap(),
                    bytes,
                    "{test}: {name} retried"
                );
            }
            Err(e) => panic!("{test}: {name}: {e}"),
        }
        assert_eq!(
            std::fs::read(m.join("kept")).unwrap(),
            data,
            "{test}: kept, round {round}"
        );
        for i in 0..50 {
            let p = m.join(format!("after{round}-{i}"));
            std::fs::write(&p, [i as u8; 10]).unwrap();
            assert_eq!(
                std::fs::read(&p).unwrap(),
                [i as u8; 10],
                "{test}: after the takeover"
            );
            std::fs::remove_file(&p).unwrap();
        }
        let (transport, ring, _) = transport_stats(m);
        assert_eq!(
            transport, "uring",
            "{test}: daemon {new} after round {round}"
        );
        assert!(
            ring >= 100,
            "{test}: daemon {new} took only {ring} requests from the ring"
        );
    }
    eprintln!("{test}: {served_in_gap} of 3 writes made without a daemon were served");
}
