//! `pack` in embedded mode (`mapfs run --embed pack:BACKING:PREFIX`,
//! served by `libmapfs_embed_full.so`): every process of the job runs its
//! own instance over the one store. A tree built with cp, tar, renames,
//! links and removals matches the same commands on a native directory; the
//! fsx exerciser's byte model holds with files moving between slots and
//! files of their own; processes that share the store see each other's
//! files, a file removed while another process reads it keeps its bytes
//! for that reader (its slot is not reused until then), a forked child
//! works on its own connection; the store is consistent afterwards
//! (`mapfs pack check`), holds no slot only opens used, and a mount reads
//! what the job wrote; a mount and an embedded job exclude each other.

mod common;
mod embed_support;
mod preload_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fuse_or_skip, mapfs_bin, need, DataMode, MountSession};
use preload_support::{fsx_bin, ok};

/// The library that serves `pack`; panics with how to build it when
/// missing or older than its sources.
fn full_lib() -> PathBuf {
    preload_support::fresh_library(
        "libmapfs_embed_full.so",
        &[
            "mapfs-embed/src",
            "mapfs-embed-full/src",
            "mapfs-registry/src",
            "mapfs-fs/src/pack",
            "mapfs/src",
        ],
    )
}

/// [`embed_support::Area`] over an empty store, with the full library
/// checked.
struct Area(embed_support::Area);

impl std::ops::Deref for Area {
    type Target = embed_support::Area;
    fn deref(&self) -> &embed_support::Area {
        &self.0
    }
}

impl Area {
    fn new() -> Area {
        full_lib();
        Area(embed_support::Area::new("store"))
    }

    /// `prog` under `mapfs run --embed pack:BACKING:PREFIX -o opts`.
    fn run(&self, opts: &str, prog: &str) -> Command {
        self.run_embedded("pack", opts, prog)
    }

    /// A pack mount of the store (unmounted when dropped).
    fn mount(&self) -> MountSession {
        MountSession::builder(mapfs_bin())
            .fs("pack")
            .data(DataMode::Auto)
            .backing(&self.backing)
            .mount()
            .unwrap()
    }

    /// `mapfs pack check BACKING` passes (`what` names the moment).
    fn assert_checked(&self, what: &str) {
        let out = Command::new(mapfs_bin())
            .args(["pack", "check"])
            .arg(&self.backing)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: mapfs pack check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// [`Area::assert_checked`], and no slot is left that only
    /// opens used, nor a file without a name (the job's processes have
    /// all ended: whatever they held is free again).
    fn assert_consistent(&self, test: &str) {
        self.assert_checked(test);
        let db = rusqlite::Connection::open(self.backing.join("pack.db")).unwrap();
        let held: i64 = db
            .query_row("SELECT count(*) FROM slots WHERE ino < 0", [], |r| r.get(0))
            .unwrap();
        let unnamed: i64 = db
            .query_row(
                "SELECT count(*) FROM inodes WHERE nlink = 0 AND ino != 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(
            (held, unnamed),
            (0, 0),
            "{test}: slots held by opens only, files without a name, after the job"
        );
    }
}

/// Runs shell `script` with `$D` set to the prefix (embedded) and to the
/// native directory; returns both outputs with the directory's name
/// replaced by `$D`.
fn both(a: &Area, script: &str) -> (String, String) {
    let emb = ok(a
        .run("threshold=4k", "sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.prefix)
        .env("LC_ALL", "C")
        .env("TZ", "UTC"));
    let nat = ok(Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.native)
        .env("LC_ALL", "C")
        .env("TZ", "UTC"));
    let clean = |o: &Output, d: &Path| {
        String::from_utf8_lossy(&o.stdout).replace(&*d.to_string_lossy(), "$D")
    };
    (clean(&emb, &a.prefix), clean(&nat, &a.native))
}

/// Names, kinds, modes, link counts, symlink targets, file sizes and bytes
/// of everything under `$D` (directory sizes are the file system's own).
const LIST: &str = r#"
find "$D" -printf '%P %y %m %n %l\n' | sort
find "$D" -type f -printf '%P %s %TY-%Tm-%Td %TH:%TM\n' | sort
find "$D" -type f -exec sha256sum {} + | sort -k2
"#;

#[test]
fn embedded_pack_tree_matches_native() {
    let a = Area::new();
    let script = format!(
        r#"set -e
mkdir -p "$D/src/sub/deeper" "$D/src/empty"
printf 'hello\n' > "$D/src/f"
seq 1 30000 | head -c 100000 > "$D/src/sub/big"
seq 7 2000 | head -c 3000 > "$D/src/sub/small"
printf 'inner\n' > "$D/src/sub/deeper/g"
ln -s ../f "$D/src/sub/link"
ln "$D/src/f" "$D/src/hard"
mkfifo "$D/src/fifo"
chmod 0640 "$D/src/sub/big"
chmod 0750 "$D/src/sub/deeper"
touch -h -d '2020-01-02 03:04:05' "$D/src/f" "$D/src/sub/big" "$D/src/sub/small" \
  "$D/src/sub/deeper/g" "$D/src/sub/link"
cp -a "$D/src" "$D/copy"
mkdir "$D/untar"
tar cf - -C "$D" --sort=name src | tar xf - -C "$D/untar"
tar cf - -C "$D" --sort=name --mtime=2020-01-01 --owner=0 --group=0 --numeric-owner src | sha256sum
mv "$D/copy/sub" "$D/moved"
mkdir "$D/over" && printf 'old\n' > "$D/over/x"
mv -T "$D/moved" "$D/over" 2>/dev/null || echo 'not empty'
rm -r "$D/over" && mv "$D/moved" "$D/over"
mv "$D/untar/src/sub/small" "$D/untar/src/sub/big"
ln "$D/over/small" "$D/small-link"
rm "$D/over/small"
printf 'a longer line\n' > "$D/t" && printf 'short\n' > "$D/t"
cat "$D/t" "$D/small-link" | wc -c
for i in $(seq 1 50); do printf "file $i\n" > "$D/src/empty/n$i"; done
rm "$D/src/empty/n1"* "$D/copy/hard"
head -c 5000 "$D/src/sub/big" >> "$D/src/f"
truncate -s 100 "$D/src/sub/deeper/g"
{LIST}"#
    );
    let (emb, nat) = both(&a, &script);
    if emb != nat {
        let (e, n): (Vec<&str>, Vec<&str>) = (emb.lines().collect(), nat.lines().collect());
        let i = (0..e.len().max(n.len()))
            .find(|&i| e.get(i) != n.get(i))
            .unwrap_or(0);
        panic!(
            "embedded pack and native differ at line {}:\n embedded: {:?}\n native:   {:?}\n\n{emb}",
            i + 1,
            e.get(i),
            n.get(i)
        );
    }
    assert!(emb.contains("over/big"), "{emb}");
    assert!(!a.prefix.exists(), "the prefix was created on the host");
    // A pack store, not a mirror: the names are in its database.
    assert!(!a.backing.join("src").exists());
    a.assert_consistent("tree");
}

/// The exerciser's byte model with a 4 KiB threshold, so files move
/// between slot classes and to files of their own all the time,
/// copy_file_range included (a shared mmap cannot be served on slotted
/// files embedded; see docs/embedded.md).
#[test]
fn embedded_pack_fsx_byte_model() {
    let a = Area::new();
    let fsx = fsx_bin();
    let out = ok(a
        .run("threshold=4k", fsx.to_str().unwrap())
        .arg("--dir")
        .arg(&a.prefix)
        .arg("--ops")
        .arg("10000")
        .arg("--seed")
        .arg("20261128")
        .arg("--no-mmap")
        .arg("--keep"));
    let summary = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", summary.trim());
    assert!(summary.contains("reopen="), "{summary}");
    a.assert_consistent("fsx");
}

/// What another process leaves to a release gets freed by it: a file
/// removed, and a slot a file left for a bigger one, while this process had
/// them open, for writing (after its last `fsync`, so that its release
/// records nothing) or for reading: the release must still see that the
/// database changed since its open last looked.
#[test]
fn embedded_pack_release_frees_what_others_left_it() {
    let test = "embedded pack, left to a release";
    need("python3");
    let a = Area::new();
    let script = r#"
import os, subprocess, sys
d = sys.argv[1]
w, z, r, q = (os.path.join(d, n) for n in "wzrq")
for p in (r, q):
    open(p, "wb").write(b"c" * 3000)
fw = os.open(w, os.O_WRONLY | os.O_CREAT, 0o644)
fz = os.open(z, os.O_WRONLY | os.O_CREAT, 0o644)
for fd in (fw, fz):
    os.write(fd, b"a" * 3000)
    os.fsync(fd)
fr, fq = os.open(r, os.O_RDONLY), os.open(q, os.O_RDONLY)
assert os.read(fr, 10) == os.read(fq, 10) == b"c" * 10
subprocess.run([sys.executable, "-c",
    "import os, sys\nd = sys.argv[1]\nos.unlink(d + '/w')\nos.unlink(d + '/r')\n"
    "open(d + '/z', 'wb').write(b'b' * 20000)\nopen(d + '/q', 'wb').write(b'b' * 20000)\n",
    d], check=True)
for fd in (fw, fz, fr, fq):
    os.close(fd)
assert not os.path.exists(w) and not os.path.exists(r)
assert open(z, "rb").read() == open(q, "rb").read() == b"b" * 20000
print("ok")
"#;
    let out = ok(a.run("", "python3").arg("-c").arg(script).arg(&a.prefix));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{test}");
    a.assert_consistent(test);
}

/// Processes of one job (fork and exec, fork alone) share the store: each
/// writes its own files and reads everyone's; a file one process removes
/// while another reads it keeps its bytes for the reader, and its slot
/// goes to no new file meanwhile; a mount afterwards reads every file.
#[test]
fn embedded_pack_processes_share_the_store() {
    let test = "embedded pack, processes sharing the store";
    need("python3");
    let a = Area::new();
    let script = r#"
import os, subprocess, sys
d = sys.argv[1]
def blob(tag, n):
    return bytes((tag * 31 + i * 7) % 251 for i in range(n))
# A file another process removes while this one reads it; then the other
# writes a file of the same size class, which must not get its slot.
x = os.path.join(d, "x")
with open(x, "wb") as f:
    f.write(blob(1, 3000))
fd = os.open(x, os.O_RDONLY)
assert os.read(fd, 10) == blob(1, 3000)[:10]
subprocess.run([sys.executable, "-c",
    "import os, sys\nos.unlink(sys.argv[1] + '/x')\n"
    "open(sys.argv[1] + '/y', 'wb').write(bytes((2 * 31 + i * 7) % 251 for i in range(3000)))\n",
    d], check=True)
assert not os.path.exists(x)
rest = os.read(fd, 5000)
assert rest == blob(1, 3000)[10:], "the removed file's bytes changed under its reader"
os.close(fd)
assert open(os.path.join(d, "y"), "rb").read() == blob(2, 3000)
# Writers in four processes at once, each then reading all the others'.
w = r'''
import os, sys
d, r, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def blob(tag, n):
    return bytes((tag * 31 + i * 7) % 251 for i in range(n))
os.makedirs(os.path.join(d, "w%d" % r))
for i in range(n):
    with open(os.path.join(d, "w%d" % r, "f%d" % i), "wb") as f:
        f.write(blob(r * 1000 + i, 1 + (i * 397) % 6000))
'''
procs = [subprocess.Popen([sys.executable, "-c", w, d, str(r), "150"]) for r in range(4)]
for p in procs:
    assert p.wait() == 0
for r in range(4):
    for i in range(150):
        got = open(os.path.join(d, "w%d" % r, "f%d" % i), "rb").read()
        assert got == blob(r * 1000 + i, 1 + (i * 397) % 6000), (r, i)
# A child forked without exec writes through a connection of its own;
# the parent keeps writing through its own.
with open(os.path.join(d, "before-fork"), "wb") as f:
    f.write(blob(7, 100))
pid = os.fork()
if pid == 0:
    code = 0
    try:
        with open(os.path.join(d, "child"), "wb") as f:
            f.write(blob(8, 2000))
        os.rename(os.path.join(d, "before-fork"), os.path.join(d, "renamed-by-child"))
    except BaseException as e:
        sys.stderr.write("child: %r\n" % e)
        code = 1
    os._exit(code)
_, st = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(st) == 0
with open(os.path.join(d, "parent"), "wb") as f:
    f.write(blob(9, 2500))
assert open(os.path.join(d, "child"), "rb").read() == blob(8, 2000)
assert open(os.path.join(d, "renamed-by-child"), "rb").read() == blob(7, 100)
assert not os.path.exists(os.path.join(d, "before-fork"))
print("shared-ok")
"#;
    let out = ok(a
        .run("", "python3")
        .arg("-c")
        .arg(script)
        .arg(a.prefix.display().to_string()));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("shared-ok"),
        "{test}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    a.assert_consistent(test);
    if !fuse_or_skip(test) {
        return;
    }
    let s = a.mount();
    let blob = |tag: usize, n: usize| -> Vec<u8> {
        (0..n).map(|i| ((tag * 31 + i * 7) % 251) as u8).collect()
    };
    let m = s.mountpoint();
    assert_eq!(std::fs::read(m.join("y")).unwrap(), blob(2, 3000));
    assert_eq!(std::fs::read(m.join("child")).unwrap(), blob(8, 2000));
    assert_eq!(std::fs::read(m.join("parent")).unwrap(), blob(9, 2500));
    for r in 0..4 {
        for i in 0..150 {
            let got = std::fs::read(m.join(format!("w{r}/f{i}"))).unwrap();
            assert_eq!(
                got,
                blob(r * 1000 + i, 1 + (i * 397) % 6000),
                "{test}: w{r}/f{i} through a mount"
            );
        }
    }
    assert!(!m.join("x").exists());
}

/// A mount's instance is the only one over its store; an embedded job's
/// instances share it with each other only. Either one refuses the other,
/// saying why, and the first keeps its files.
#[test]
fn a_pack_mount_and_an_embedded_pack_job_exclude_each_other() {
    let test = "pack mount vs embedded job";
    if !fuse_or_skip(test) || !need("python3") {
        return;
    }
    let a = Area::new();
    {
        let s = a.mount();
        std::fs::write(s.mountpoint().join("kept"), b"mounted").unwrap();
        let out = a.run("", "true").output().unwrap();
        assert!(
            !out.status.success(),
            "{test}: the job ran beside the mount"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("already served"), "{test}: {err}");
        assert_eq!(
            std::fs::read(s.mountpoint().join("kept")).unwrap(),
            b"mounted"
        );
    }
    // A job holding the store (its process sleeps) refuses a mount.
    let mut job = a
        .run("", "python3")
        .arg("-c")
        .arg("import os,sys,time\nprint(open(sys.argv[1]).read(), flush=True)\ntime.sleep(30)\n")
        .arg(a.at("kept"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(job.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(
        line.trim(),
        "mounted",
        "{test}: the job read the mount's file"
    );
    let mnt = a.dir().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new(mapfs_bin())
        .args(["mount", "pack"])
        .arg(&a.backing)
        .arg(&mnt)
        .output()
        .unwrap();
    let _ = job.kill();
    let _ = job.wait();
    if out.status.success() {
        let _ = Command::new(mapfs_bin()).arg("umount").arg(&mnt).status();
        panic!("{test}: a mount started beside the job");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already served"), "{test}: {err}");
}

/// Programs that need more than reads and writes: `sqlite3` (record
/// locks, kept on the file's lock file), `git` (private `mmap`s of files
/// in slots, served from a copy; `fsck` checks every object), a shell's
/// `cd` into the prefix carried to the programs it starts (pack's
/// directories are not backing directories the real working directory
/// could follow), and a shared `mmap` of a file in a slot refused.
#[test]
fn embedded_pack_sqlite_git_and_working_directory() {
    let test = "embedded pack: sqlite3, git, cd";
    need("sqlite3");
    need("git");
    need("python3");
    let a = Area::new();
    let script = r#"set -e
cd "$D"
mkdir work && cd work
/bin/pwd
sqlite3 t.db "create table t(a, b); insert into t values (1, 2), (3, 4);"
sqlite3 t.db "select sum(a + b) from t; pragma integrity_check;"
git init -q repo && cd repo
printf 'one\n' > f
git add f && git -c user.name=t -c user.email=t@t commit -qm one
printf 'two\n' >> f
git -c user.name=t -c user.email=t@t commit -qam two
git log --format=%s
git fsck --full 2>&1
git status --short
sh -c 'pwd; cat f'
python3 -c '
import errno, mmap, os
fd = os.open("f", os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
print(m[:]. decode().split())
try:
    mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    print("shared mmap served")
except OSError as e:
    print("shared mmap", errno.errorcode[e.errno])
'
"#;
    let out = ok(a
        .run("", "sh")
        .arg("-c")
        .arg(script)
        .env("D", &a.prefix)
        .env("LC_ALL", "C"));
    let stdout = String::from_utf8_lossy(&out.stdout).replace(&*a.prefix.to_string_lossy(), "$D");
    assert_eq!(
        stdout,
        "$D/work\n10\nok\ntwo\none\n$D/work/repo\none\ntwo\n['one', 'two']\nshared mmap ENODEV\n",
        "{test}: stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing landed in the host's working directory of the job.
    assert!(
        !a.prefix.exists(),
        "{test}: the prefix was created on the host"
    );
    a.assert_consistent(test);
}

/// One process of a storm: writes files `r<round>-<i>` of sizes from 1 to
/// 6,000 bytes (bytes a function of name and offset), `fsync`s each and
/// prints how many it synced; every third one it closes without `fsync`.
const STORM_PY: &str = r#"
import os, sys
d, rnd = sys.argv[1], int(sys.argv[2])
def blob(i, n):
    return bytes((rnd * 131 + i * 17 + k * 7) % 251 for k in range(n))
for i in range(100000):
    n = 1 + (i * 1237 + rnd * 71) % 6000
    fd = os.open(os.path.join(d, "r%d-%d" % (rnd, i)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, blob(i, n // 2))
    os.write(fd, blob(i, n)[n // 2:])
    if i % 3:
        os.fsync(fd)
        sys.stdout.write("synced %d\n" % i)
        sys.stdout.flush()
    os.close(fd)
"#;

/// Checks every storm file in `d`: the synced ones whole, none showing a
/// byte that was not written at its offset. Prints `checked N`.
const STORM_CHECK_PY: &str = r#"
import os, sys
d = sys.argv[1]
synced = {int(a): int(b) for a, b in (x.split(":") for x in sys.argv[2:])}
n = 0
for name in os.listdir(d):
    rnd, i = map(int, name[1:].split("-"))
    want_n = 1 + (i * 1237 + rnd * 71) % 6000
    want = bytes((rnd * 131 + i * 17 + k * 7) % 251 for k in range(want_n))
    got = open(os.path.join(d, name), "rb").read()
    assert want.startswith(got), (name, len(got), "bytes never written")
    if i <= synced.get(rnd, -1) and i % 3:
        assert got == want, (name, len(got), want_n, "synced but not whole")
    n += 1
print("checked", n)
"#;

/// Processes of embedded jobs killed (SIGKILL) at seeded moments of a
/// write storm: every `fsync`ed file is whole afterwards, no file shows
/// bytes that were not written to it, `mapfs pack check` passes after
/// every kill, and the next job that starts alone frees what the killed
/// ones held (slots taken for files they never closed).
#[test]
fn embedded_pack_survives_killed_processes() {
    let test = "embedded pack, killed writers";
    need("python3");
    let a = Area::new();
    ok(a.run("", "mkdir").arg(a.at("storm")));
    let dir = a.at("storm");
    let mut synced: Vec<(u32, i64)> = Vec::new();
    let mut seed: u64 = 20261128;
    for round in 0..12u32 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = (seed >> 33) % 300;
        let mut job = a
            .run("", "python3")
            .arg("-c")
            .arg(STORM_PY)
            .arg(&dir)
            .arg(round.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = job.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            // Only whole lines count: the kill can cut the last one short
            // (a Python with unbuffered output writes a print in pieces).
            let mut last = -1i64;
            let mut out = std::io::BufReader::new(out);
            let mut l = String::new();
            while std::io::BufRead::read_line(&mut out, &mut l).unwrap_or(0) > 0 {
                if let Some(n) = l.strip_suffix('\n').and_then(|l| l.strip_prefix("synced ")) {
                    last = n.parse().unwrap();
                    let _ = tx.send(last);
                }
                l.clear();
            }
            last
        });
        // The kill comes a seeded while after the storm started syncing
        // (however long the job took to start on a busy machine).
        let first = rx.recv_timeout(std::time::Duration::from_secs(60));
        assert!(first.is_ok(), "{test}: round {round} never synced a file");
        std::thread::sleep(std::time::Duration::from_millis(after));
        // SIGKILL (std's kill on Unix).
        job.kill().unwrap();
        let st = job.wait().unwrap();
        assert!(!st.success(), "{test}: round {round} ended before its kill");
        let last = reader.join().unwrap();
        synced.push((round, last));
        a.assert_checked(&format!(
            "{test}: after kill {round} ({after} ms, {last} synced)"
        ));
    }
    let out = ok(a
        .run("", "python3")
        .arg("-c")
        .arg(STORM_CHECK_PY)
        .arg(&dir)
        .args(synced.iter().map(|(r, n)| format!("{r}:{n}"))));
    eprintln!("{test}: {}", String::from_utf8_lossy(&out.stdout).trim());
    // The checking job started alone: it freed what the killed ones held.
    a.assert_consistent(test);
}

/// Four exercisers at once, each a process of one job with its own file,
/// files crossing a 16 KiB threshold both ways (slots of every class, files
/// of their own, moves between them while other processes take and free
/// slots beside them); mapped reads and writes where the file is its own
/// (a file in a slot refuses a shared map, which the exerciser skips).
#[test]
fn embedded_pack_exercisers_in_four_processes() {
    let a = Area::new();
    let fsx = fsx_bin();
    let script = r#"
for x in a b c d; do
  mkdir "$D/$x"
  "$FSX" --dir "$D/$x" --ops 10000 --maxlen 20000 --maxoplen 6000 \
    --seed "$(printf '%d' "'$x")" --no-copy-range --keep > "$LOGS/fsx.$x" 2>&1 &
  pids="$pids $!"
done
# `wait PID`, not `wait -n`: bash's `wait -n` can miss a job that ended
# while it collected another, and answers 127.
fails=0
for p in $pids; do
  wait "$p"; st=$?
  [ $st = 0 ] || { echo "an exerciser ended with status $st"; fails=$((fails + 1)); }
done
cat "$LOGS"/fsx.*
exit $fails
"#;
    let logs = tempfile::tempdir().unwrap();
    let out = ok(a
        .run("threshold=16k", "bash")
        .arg("-c")
        .arg(script)
        .env("D", &a.prefix)
        .env("FSX", &fsx)
        .env("LOGS", logs.path()));
    let summary = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", summary.trim());
    assert_eq!(summary.matches("fsx ok").count(), 4, "{summary}");
    a.assert_consistent("four exercisers");
}
