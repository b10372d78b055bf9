//! plfs across hosts: one GlusterFS volume of two bricks on this
//! machine, mounted twice as two "hosts" (`scripts/gluster.sh`, metadata
//! caches off), each with its own plfs daemon and host id. Writers on both
//! hosts, readers on either; every byte checked against a model. Skips
//! loudly where Gluster cannot run (not root, no packages, glusterd fails)
//! or without /dev/fuse or python3. The last test of this process to
//! finish stops the volume and glusterd (`scripts/gluster.sh stop`); each
//! test works in a directory of its own, removed at the end.

mod common;
mod preload_support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use mapfs_testkit::fsx::{self, FsxConfig};
use preload_support::need;

fn gluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gluster.sh")
}

/// Tests of this process using the Gluster bed now.
static BED_USERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

/// A test's use of the Gluster bed: the last one to drop it stops the bed
/// (a later test starts it again).
struct Bed;

impl Drop for Bed {
    fn drop(&mut self) {
        let mut users = BED_USERS.lock().unwrap_or_else(|e| e.into_inner());
        *users -= 1;
        if *users == 0 {
            let out = Command::new("bash")
                .arg(gluster_script())
                .arg("stop")
                .output()
                .expect("bash");
            if !out.status.success() {
                eprintln!(
                    "gluster.sh stop failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// The two Gluster mounts (host A, host B) and this test's hold on them,
/// or `None` after saying loudly why not.
fn gluster_or_skip(test: &str) -> Option<(PathBuf, PathBuf, Bed)> {
    if !fuse_or_skip(test) || !need("python3") {
        return None;
    }
    // Held while starting, so that no other test stops the bed meanwhile.
    let mut users = BED_USERS.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new("bash")
        .arg(gluster_script())
        .arg("start")
        .output()
        .expect("bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) {
        common::skip(test, stderr.trim());
        return None;
    }
    assert!(out.status.success(), "{test}: gluster.sh start: {stderr}");
    *users += 1;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(PathBuf::from);
    Some((lines.next().unwrap(), lines.next().unwrap(), Bed))
}

/// Two plfs mounts (hosts `alpha` and `beta`) of one directory of the
/// Gluster volume; the directory is removed on drop, after the unmounts.
struct Hosts {
    a: MountSession,
    b: MountSession,
    /// The test's directory through host A's Gluster mount.
    dir: PathBuf,
    /// Dropped last, after the unmounts.
    _bed: Bed,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.a.umount_settled();
        let _ = self.b.umount_settled();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn hosts(test: &str) -> Option<Hosts> {
    let (ga, gb, bed) = gluster_or_skip(test)?;
    let name = format!(
        "{}-{}-{:x}",
        test.replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let dir = ga.join(&name);
    std::fs::create_dir(&dir).unwrap();
    let mount = |backing: PathBuf, host: &str| {
        MountSession::builder(mapfs_bin())
            .fs("plfs")
            .data(DataMode::Daemon)
            .backing(backing)
            .option(&format!("hostid={host}"))
            .arg("--ttl")
            .arg("0")
            // A host whose daemon is killed stays down (the killed-writer
            // test checks what the other host sees then; failover.rs: the
            // supervised case, where nothing is lost).
            .arg("--no-supervisor")
            .mount()
            .map_err(|e| format!("{test}: mount plfs on Gluster as {host}: {e:#}"))
    };
    let mounted =
        mount(dir.clone(), "alpha").and_then(|a| mount(gb.join(&name), "beta").map(|b| (a, b)));
    match mounted {
        Ok((a, b)) => Some(Hosts {
            a,
            b,
            dir,
            _bed: bed,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("{e}");
        }
    }
}

/// Writes `nb` blocks of `bs` bytes at block `i * n + rank` (`block`
/// below); with `hold`, says `written` and waits on stdin before closing.
const WRITER: &str = r#"
import os, sys
path, rank, n, bs, nb, hold = sys.argv[1], *map(int, sys.argv[2:7])
base = bytes(j % 251 for j in range(bs + 251))
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(nb):
    k = (rank * 7 + i * 13) % 251
    os.pwrite(fd, base[k:k + bs], (i * n + rank) * bs)
if hold:
    print('written', flush=True)
    sys.stdin.readline()
os.close(fd)
"#;

fn block(rank: u64, i: u64, bs: usize) -> Vec<u8> {
    let k = ((rank * 7 + i * 13) % 251) as usize;
    (k..k + bs).map(|j| (j % 251) as u8).collect()
}

/// The N-1 strided file of `n` ranks of `nb` blocks each.
fn strided_model(n: u64, nb: u64, bs: usize) -> Vec<u8> {
    let mut m = vec![0u8; (n * nb) as usize * bs];
    for r in 0..n {
        for i in 0..nb {
            let at = ((i * n + r) as usize) * bs;
            m[at..at + bs].copy_from_slice(&block(r, i, bs));
        }
    }
    m
}

fn writer(file: &Path, rank: u64, n: u64, bs: usize, nb: u64, hold: bool) -> Child {
    Command::new("python3")
        .arg("-c")
        .arg(WRITER)
        .arg(file)
        .args([
            rank.to_string(),
            n.to_string(),
            bs.to_string(),
            nb.to_string(),
            u8::from(hold).to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3")
}

fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes, model {}; first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn n1_strided_across_hosts_read_back_from_each() {
    let test = "plfs hosts N-1 strided";
    let Some(h) = hosts(test) else { return };
    for (bs, nb) in [(4096usize, 64u64), (65536, 8)] {
        let name = format!("ckpt-{bs}");
        // Ranks 0 and 2 on host A, 1 and 3 on host B, all at once.
        let kids: Vec<Child> = (0..4u64)
            .map(|r| {
                let m = if r % 2 == 0 { &h.a } else { &h.b };
                writer(&m.mountpoint().join(&name), r, 4, bs, nb, false)
            })
            .collect();
        for mut k in kids {
            assert!(k.wait().unwrap().success(), "{test}: a writer failed");
        }
        let want = strided_model(4, nb, bs);
        for m in [&h.a, &h.b] {
            let f = m.mountpoint().join(&name);
            assert_eq!(
                std::fs::metadata(&f).unwrap().len(),
                want.len() as u64,
                "{test} {bs}: size"
            );
            same(&std::fs::read(&f).unwrap(), &want, &format!("{test} {bs}"));
        }
        // Each host's logs are named by its host id.
        let c = h.dir.join(&name);
        let logs: Vec<String> = std::fs::read_dir(&c)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("data."))
            .collect();
        assert_eq!(
            logs.iter().filter(|n| n.starts_with("data.alpha.")).count(),
            2,
            "{test}: {logs:?}"
        );
        assert_eq!(
            logs.iter().filter(|n| n.starts_with("data.beta.")).count(),
            2,
            "{test}: {logs:?}"
        );
    }
}

/// Waits for "go" on stdin (so writers start together), then does what fio
/// does: creates the file with `O_CREAT`, extends it to the end of its
/// region (`fallocate`) and closes, then opens it again with `O_CREAT`,
/// writes one block at `rank * bs` and closes.
const RACER: &str = r#"
import os, sys
path, rank, n, bs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print('ready', flush=True)
sys.stdin.readline()
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
os.posix_fallocate(fd, 0, (n + rank) * bs)
os.close(fd)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.pwrite(fd, bytes([rank + 1]) * bs, rank * bs)
os.close(fd)
"#;

/// Hosts creating one new name at the same moment all end up writing the
/// same file. Gluster's client has no `RENAME_NOREPLACE`, and a plain
/// rename of a new container could replace another host's (three creates
/// of one name "won" within 0.5 s, and the writers of the replaced
/// containers lost their bytes, in 1 of ~8 fio runs of
/// scripts/plfs-gluster-bench.sh); creators now take turns and make the
/// container in place.
///
/// It failed in about 1 CI run in 12 while containers were renamed into
/// place on Gluster (every racing creator of one round got `EISDIR` or
/// `EIO`); since containers are made in place there it passed 44 runs of
/// 44 (9, then 30 alone and 5 beside other test suites, 2026-11-26), and
/// runs in CI again.
#[test]
fn simultaneous_creates_of_one_name_across_hosts_lose_nothing() {
    let test = "plfs hosts simultaneous creates";
    let Some(h) = hosts(test) else { return };
    let (n, bs) = (6u64, 4096usize);
    for round in 0..12 {
        let name = format!("race-{round}");
        let mut kids: Vec<Child> = (0..n)
            .map(|r| {
                let m = if r % 2 == 0 { &h.a } else { &h.b };
                Command::new("python3")
                    .arg("-c")
                    .arg(RACER)
                    .arg(m.mountpoint().join(&name))
                    .args([r.to_string(), n.to_string(), bs.to_string()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("python3")
            })
            .collect();
        for k in &mut kids {
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(k.stdout.as_mut().unwrap()),
                &mut line,
            )
            .unwrap();
            assert_eq!(line, "ready\n", "{test}: a writer did not start");
        }
        for k in &mut kids {
            std::io::Write::write_all(k.stdin.as_mut().unwrap(), b"go\n").unwrap();
        }
        for mut k in kids {
            assert!(
                k.wait().unwrap().success(),
                "{test} round {round}: a writer failed"
            );
        }
        // Every writer's block, then zeros up to the furthest extension.
        let mut want: Vec<u8> = (0..n).flat_map(|r| vec![r as u8 + 1; bs]).collect();
        want.resize((2 * n - 1) as usize * bs, 0);
        for m in [&h.a, &h.b] {
            let got = std::fs::read(m.mountpoint().join(&name)).unwrap();
            same(&got, &want, &format!("{test} round {round}"));
        }
    }
}

#[test]
fn close_to_open_truncate_unlink_rename_across_hosts() {
    let test = "plfs hosts close-to-open";
    let Some(h) = hosts(test) else { return };
    let (a, b) = (h.a.mountpoint(), h.b.mountpoint());
    // A write closed on A is seen by an open on B, and the other way.
    let mut model = b"written on alpha ".repeat(300);
    std::fs::write(a.join("f"), &model).unwrap();
    same(
        &std::fs::read(b.join("f")).unwrap(),
        &model,
        "B reads A's write",
    );
    let mut w = std::fs::OpenOptions::new()
        .append(true)
        .open(b.join("f"))
        .unwrap();
    w.write_all(b"appended on beta").unwrap();
    drop(w);
    model.extend_from_slice(b"appended on beta");
    same(
        &std::fs::read(a.join("f")).unwrap(),
        &model,
        "A reads B's append",
    );
    assert_eq!(
        std::fs::metadata(a.join("f")).unwrap().len(),
        std::fs::metadata(b.join("f")).unwrap().len(),
        "{test}: sizes agree"
    );
    // A descriptor opened on B before A's next write keeps its view
    // (close-to-open); a new open sees the write.
    let old = std::fs::File::open(b.join("f")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(a.join("f"))
        .and_then(|mut f| f.write_all(b"OVERWRITE"))
        .unwrap();
    model[..9].copy_from_slice(b"OVERWRITE");
    same(&std::fs::read(b.join("f")).unwrap(), &model, "B reopens");
    drop(old);
    // Truncate on A: size and bytes on B.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.join("f"))
        .unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    model.truncate(1000);
    assert_eq!(
        std::fs::metadata(b.join("f")).unwrap().len(),
        1000,
        "{test}"
    );
    same(
        &std::fs::read(b.join("f")).unwrap(),
        &model,
        "B after truncate",
    );
    // Truncate by path, growing: zeros.
    Command::new("truncate")
        .args(["-s", "5000"])
        .arg(a.join("f"))
        .status()
        .unwrap();
    model.resize(5000, 0);
    same(
        &std::fs::read(b.join("f")).unwrap(),
        &model,
        "B after growth",
    );
    // Rename on A: B sees the new name, not the old.
    std::fs::rename(a.join("f"), a.join("g")).unwrap();
    assert!(!b.join("f").exists(), "{test}: old name on B");
    same(
        &std::fs::read(b.join("g")).unwrap(),
        &model,
        "B after rename",
    );
    // Rename over an existing file on B: A sees the new content.
    std::fs::write(b.join("h"), b"short").unwrap();
    std::fs::rename(b.join("h"), b.join("g")).unwrap();
    same(
        &std::fs::read(a.join("g")).unwrap(),
        b"short",
        "A after rename over",
    );
    // Unlink on A: gone on B.
    std::fs::remove_file(a.join("g")).unwrap();
    assert_eq!(
        std::fs::metadata(b.join("g")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound,
        "{test}: unlinked on A"
    );
    let names: Vec<_> = std::fs::read_dir(b).unwrap().flatten().collect();
    assert!(names.is_empty(), "{test}: B lists {names:?}");
}

#[test]
fn killed_writer_on_one_host_does_not_stop_the_other() {
    let test = "plfs hosts killed writer";
    let Some(h) = hosts(test) else { return };
    let (bs, nb) = (4096usize, 32u64);
    let file_a = h.a.mountpoint().join("ckpt");
    let file_b = h.b.mountpoint().join("ckpt");
    // Rank 0 on A writes and holds its open; then rank 1 on B too. One
    // after the other: two hosts creating one name at the same instant is
    // the open bug of `simultaneous_creates_of_one_name_across_hosts_lose_
    // nothing` (docs/plfs-hosts.md), which this test hit once in CI; what
    // it checks is a writer's death.
    let mut wa = writer(&file_a, 0, 2, bs, nb, true);
    let started = |w: &mut Child| {
        let mut line = String::new();
        BufReader::new(w.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "written", "{test}");
    };
    started(&mut wa);
    let mut wb = writer(&file_b, 1, 2, bs, nb, true);
    started(&mut wb);
    // Kill A's daemon while A's writer holds its open (nothing recorded),
    // then the writer.
    let pid = preload_support::daemon_pid(&h.a);
    assert!(Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    wa.kill().unwrap();
    wa.wait().unwrap();
    // B's writer finishes; B's readers see its blocks (A's never recorded:
    // zeros), and a new writer on B works.
    writeln!(wb.stdin.as_mut().unwrap()).unwrap();
    assert!(wb.wait().unwrap().success(), "{test}: B's writer");
    let mut want = vec![0u8; (2 * nb) as usize * bs];
    for i in 0..nb {
        let at = ((i * 2 + 1) as usize) * bs;
        want[at..at + bs].copy_from_slice(&block(1, i, bs));
    }
    same(&std::fs::read(&file_b).unwrap(), &want, "B after A died");
    let mut w2 = writer(&file_b, 0, 2, bs, nb, false);
    assert!(w2.wait().unwrap().success(), "{test}: a new writer on B");
    same(
        &std::fs::read(&file_b).unwrap(),
        &strided_model(2, nb, bs),
        "B after rank 0 rewritten on B",
    );
    // A's dead writer left no log: an open on B reclaimed it (once
    // Gluster has released the dead daemon's lock, which a FUSE client does
    // asynchronously).
    let alpha_logs = || -> Vec<String> {
        std::fs::read_dir(h.dir.join("ckpt"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("data.alpha."))
            .collect()
    };
    preload_support::eventually(&format!("{test}: A's orphaned log reclaimed"), || {
        drop(std::fs::File::open(&file_b).unwrap());
        alpha_logs().is_empty()
    });
}

#[test]
fn fsx_through_one_host_then_read_through_the_other() {
    let test = "plfs hosts fsx";
    let Some(h) = hosts(test) else { return };
    let mut cfg = FsxConfig::new(h.a.mountpoint(), 0x1405, 1500);
    cfg.keep = true;
    // Punching holes and mapped writes go through the daemon like every
    // other call; keep the whole mix.
    let report = fsx::run(&cfg).unwrap_or_else(|f| panic!("{test}:\n{f}"));
    let name = format!("fsx-{}.data", cfg.seed);
    let on_a = std::fs::read(h.a.mountpoint().join(&name)).unwrap();
    assert_eq!(on_a.len() as u64, report.final_size, "{test}: size on A");
    let on_b = std::fs::read(h.b.mountpoint().join(&name)).unwrap();
    same(&on_b, &on_a, "fsx file read through B");
}

/// `mapfs bench --hosts A,B` on the two Gluster mounts: every cell of its
/// table has a figure (a run whose writers failed, or whose N-1 file lacks
/// bytes through host B, would show `ERR`), and it says which store it
/// measured.
#[test]
fn bench_hosts_measures_every_configuration_on_gluster() {
    let test = "mapfs bench --hosts on Gluster";
    let Some((ga, gb, _bed)) = gluster_or_skip(test) else {
        return;
    };
    need("fio");
    let mut hosts = ga.into_os_string();
    hosts.push(",");
    hosts.push(gb);
    let out = Command::new(mapfs_bin())
        .args(["bench", "--hosts"])
        .arg(&hosts)
        .args([
            "--size",
            "1M",
            "--bs",
            "64k",
            "--runs",
            "1",
            "--threads",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("store: fuse.glusterfs"), "{test}: {stdout}");
    for cfg in ["direct", "plfs", "plfs-run"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {cfg} |")))
            .unwrap_or_else(|| panic!("{test}: no row {cfg}:\n{stdout}"));
        let cells: Vec<&str> = row
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(cells.len(), 3, "{test}: {row}");
        for c in &cells[1..] {
            assert!(
                c.parse::<f64>().is_ok_and(|v| v > 0.0),
                "{test}: {cfg} has no figure: {row}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(
        stdout.contains("plfs-run N-1 / direct N-N"),
        "{test}: {stdout}"
    );
}
