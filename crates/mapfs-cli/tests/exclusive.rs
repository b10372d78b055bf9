//! `mount --exclusive`: the kernel keeps names, missing names and attributes
//! for a long time. What is changed through the mount shows at once; what
//! is changed behind it in the backing directory does not (that is the
//! option's contract), while a mount without the option shows it once its
//! 1 s cache time has passed. File systems that change names by themselves
//! refuse the option.

mod common;
mod preload_support;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use mapfs_testkit::mount::run_captured;
use preload_support::{attached, ok, report_path, totals};

/// Longer than the default 1 s cache time.
const PAST_DEFAULT_TTL: Duration = Duration::from_millis(1500);

fn mount(fs: &str, mode: DataMode, exclusive: bool) -> MountSession {
    let mut b = MountSession::builder(mapfs_bin()).fs(fs).data(mode);
    if exclusive {
        b = b.arg("--exclusive");
    }
    b.mount()
        .unwrap_or_else(|e| panic!("mounting {fs} --data {mode} (exclusive {exclusive}): {e:#}"))
}

/// Per opcode, the requests counted since the last call (`stats --reset`).
fn requests(mnt: &Path) -> HashMap<String, u64> {
    let out = run_captured(
        Command::new(mapfs_bin())
            .args(["stats", "--json", "--reset"])
            .arg(mnt),
    )
    .unwrap();
    assert!(out.success(), "mapfs stats failed: {}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    common::op_counts(&v)
        .into_iter()
        .map(|(op, (count, _))| (op, count))
        .collect()
}

/// Changes made through the mount are seen at once: a create, a write, a
/// rename, an unlink, a mkdir and rmdir, each followed at once by the
/// stat or lookup that must see it (the kernel's long-lived entries and
/// attributes are replaced by the requests that changed them).
fn own_changes_show_at_once(s: &MountSession, what: &str) {
    let m = s.mountpoint();
    // Cached before the change: a negative entry and the root's attributes.
    assert!(fs::metadata(m.join("a")).is_err(), "{what}");
    fs::write(m.join("a"), b"hello").unwrap();
    assert_eq!(
        fs::metadata(m.join("a")).unwrap().len(),
        5,
        "{what}: create"
    );
    fs::write(m.join("a"), b"hello, world").unwrap();
    assert_eq!(
        fs::metadata(m.join("a")).unwrap().len(),
        12,
        "{what}: rewrite"
    );
    assert_eq!(fs::read(m.join("a")).unwrap(), b"hello, world", "{what}");
    fs::rename(m.join("a"), m.join("b")).unwrap();
    assert!(fs::metadata(m.join("a")).is_err(), "{what}: renamed away");
    assert_eq!(
        fs::metadata(m.join("b")).unwrap().len(),
        12,
        "{what}: rename"
    );
    fs::remove_file(m.join("b")).unwrap();
    assert!(fs::metadata(m.join("b")).is_err(), "{what}: unlink");
    fs::create_dir(m.join("d")).unwrap();
    assert!(fs::metadata(m.join("d")).unwrap().is_dir(), "{what}: mkdir");
    fs::write(m.join("d/f"), b"x").unwrap();
    let names: Vec<_> = fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f"], "{what}: listing");
    fs::remove_file(m.join("d/f")).unwrap();
    fs::remove_dir(m.join("d")).unwrap();
    assert!(fs::metadata(m.join("d")).is_err(), "{what}: rmdir");
    fs::write(m.join("a"), b"again").unwrap();
    assert_eq!(fs::read(m.join("a")).unwrap(), b"again", "{what}: recreate");
}

#[test]
fn exclusive_sees_its_own_changes_at_once() {
    if !fuse_or_skip("exclusive_sees_its_own_changes_at_once") {
        return;
    }
    for (fs, mode) in [
        ("passthrough", DataMode::Auto),
        ("passthrough", DataMode::Daemon),
        ("plfs", DataMode::Auto),
        ("pack", DataMode::Auto),
    ] {
        let s = mount(fs, mode, true);
        own_changes_show_at_once(&s, &format!("{fs} --data {mode} --exclusive"));
    }
}

/// What mapfs controls is the time its replies let the kernel keep a name
/// and its attributes; whether the kernel keeps them that long is its own
/// choice. It drops unused dentries, negative ones included, under memory
/// pressure or `echo 2 > /proc/sys/vm/drop_caches`, and then asks again
/// (docs/cli.md, `--exclusive`). So the names checked here are held open,
/// which pins their dentries and inodes: only an expired entry or attribute
/// time can make the kernel ask for them again. A missing name cannot be
/// pinned, and is not checked.
#[test]
fn exclusive_keeps_names_and_attributes_past_the_default_ttl() {
    if !fuse_or_skip("exclusive_keeps_names_and_attributes_past_the_default_ttl") {
        return;
    }
    for mode in [DataMode::Auto, DataMode::Daemon] {
        let s = mount("passthrough", mode, true);
        let (m, b) = (s.mountpoint(), s.backing());
        fs::write(b.join("old"), b"12345").unwrap();
        fs::create_dir(b.join("dir")).unwrap();
        fs::write(b.join("dir/f"), b"x").unwrap();
        // The kernel learns of them once; the open files pin them. O_PATH,
        // because closing a real open (as every fork-and-exec of a child
        // does for its copy) sends FLUSH, after which a writeback-cache
        // mount (`--data daemon`) asks for the attributes again.
        let pin = |p: &str| {
            rustix::fs::open(m.join(p), OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap()
        };
        let _pins = [pin("old"), pin("dir"), pin("dir/f")];
        assert_eq!(fs::metadata(m.join("old")).unwrap().len(), 5);
        assert!(fs::metadata(m.join("dir/f")).unwrap().is_file());
        // Behind the mount's back: the contract says this does not happen.
        fs::write(b.join("old"), b"1234567890").unwrap();
        std::thread::sleep(PAST_DEFAULT_TTL);
        requests(m);
        for _ in 0..3 {
            assert_eq!(fs::metadata(m.join("old")).unwrap().len(), 5, "{mode}");
            assert!(fs::metadata(m.join("dir/f")).unwrap().is_file());
        }
        let r = requests(m);
        assert_eq!(
            r.get("LOOKUP").copied().unwrap_or(0) + r.get("GETATTR").copied().unwrap_or(0),
            0,
            "--data {mode} --exclusive: cached names or attributes were asked for: {r:?}"
        );
    }
}

#[test]
fn without_exclusive_changes_behind_the_mount_show_after_the_ttl() {
    if !fuse_or_skip("without_exclusive_changes_behind_the_mount_show_after_the_ttl") {
        return;
    }
    for mode in [DataMode::Auto, DataMode::Daemon] {
        let s = mount("passthrough", mode, false);
        let (m, b) = (s.mountpoint(), s.backing());
        fs::write(b.join("old"), b"12345").unwrap();
        fs::write(b.join("gone"), b"x").unwrap();
        assert_eq!(fs::metadata(m.join("old")).unwrap().len(), 5);
        assert!(fs::metadata(m.join("gone")).is_ok());
        assert!(fs::metadata(m.join("new")).is_err());
        fs::write(b.join("new"), b"behind").unwrap();
        fs::remove_file(b.join("gone")).unwrap();
        fs::write(b.join("old"), b"1234567890").unwrap();
        std::thread::sleep(PAST_DEFAULT_TTL);
        assert_eq!(fs::read(m.join("new")).unwrap(), b"behind", "--data {mode}");
        assert!(fs::metadata(m.join("gone")).is_err(), "--data {mode}");
        // With the writeback cache (`--data daemon`) the kernel keeps the
        // size of a file it has cached whatever the daemon says (see
        // docs/cli.md); only a mount without it shows the new size.
        if mode != DataMode::Daemon {
            assert_eq!(
                fs::metadata(m.join("old")).unwrap().len(),
                10,
                "--data {mode}"
            );
        }
    }
}

/// A `mapfs run` client writes the backing file itself; the daemon tells
/// the kernel when the client closes it, so the new size shows at once.
#[test]
fn exclusive_shows_a_shim_clients_writes_at_once() {
    if !fuse_or_skip("exclusive_shows_a_shim_clients_writes_at_once") {
        return;
    }
    let s = mount("passthrough", DataMode::Auto, true);
    let m = s.mountpoint();
    fs::write(m.join("f"), b"12345").unwrap();
    assert_eq!(fs::metadata(m.join("f")).unwrap().len(), 5);
    let report = report_path(&s, "exclusive");
    let script = format!(
        "f = open({:?}, 'ab'); f.write(b'67890' * 3); f.close()",
        m.join("f").display().to_string()
    );
    ok(attached(&s, &report, "python3").args(["-c", &script]));
    let t = totals(&report, "python");
    assert!(
        t.adopted >= 1 && t.native_calls >= 1,
        "the write did not run in the shim: {t:?}"
    );
    assert_eq!(
        fs::metadata(m.join("f")).unwrap().len(),
        20,
        "size through the mount"
    );
    assert_eq!(
        fs::read(m.join("f")).unwrap(),
        b"12345678906789067890",
        "bytes through the mount"
    );
}

#[test]
fn exclusive_is_refused_for_a_file_system_that_names_files_itself() {
    if !fuse_or_skip("exclusive_is_refused_for_a_file_system_that_names_files_itself") {
        return;
    }
    let err = MountSession::builder(mapfs_bin())
        .fs("versions")
        .arg("--exclusive")
        .mount()
        .map(|_| ())
        .expect_err("versions --exclusive mounted");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("--exclusive") && msg.contains("versions"),
        "unclear error: {msg}"
    );
}
