//! Several opens of one file in one process under `mapfs run --embed`, on
//! the file systems whose opens the data engine serves in-process (plfs,
//! pack, versions) and on passthrough as the control, each run under the
//! torture suite's watchdog:
//! - Python's sqlite3 from four threads, each with a connection of its own
//!   to one database: every row there, `PRAGMA integrity_check` ok, and the
//!   same rows and the same file bytes read through a `mapfs mount` of the
//!   backing directory;
//! - two opens of one file: writes through one read at once through the
//!   other, against a byte model; another process's write seen by a new
//!   open and by the opens held (close-to-open), an `O_TRUNC` open seen by
//!   the opens held; POSIX record locks that are the
//!   process's (no conflict between its opens, seen by another process of
//!   the job, all dropped at the close of any descriptor of the file), OFD
//!   locks that stay the open's; the file's bytes through a mount;
//! - threads using the file system while the main thread forks children
//!   that use it too: no child hangs.

mod common;
mod embed_support;
mod preload_support;
mod torture_support;

use std::process::Command;

use common::{fuse_or_skip, mapfs_bin, need, DataMode, MountSession};
use embed_support::Area;
use torture_support::{succeeded, watched, LIMIT};

/// `python3 -c script dir args...` under `mapfs run --embed` of `fs` on
/// `a`, under the watchdog; its standard output.
fn run_python(a: &Area, fs: &str, test: &str, script: &str, args: &[&str]) -> String {
    need("python3");
    let mut c = a.run_embedded(fs, "", "python3");
    c.args(["-c", script]).arg(a.at("work")).args(args);
    let out = watched(c, LIMIT, test);
    succeeded(&out, test);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A mount of `fs` over `a`'s backing directory (unmounted when dropped),
/// or `None` (reported as skipped) without FUSE.
fn mount(a: &Area, fs: &str, test: &str) -> Option<MountSession> {
    if !fuse_or_skip(test) {
        return None;
    }
    Some(
        MountSession::builder(mapfs_bin())
            .fs(fs)
            .data(DataMode::Auto)
            .backing(&a.backing)
            .mount()
            .unwrap_or_else(|e| panic!("{test}: mount: {e:#}")),
    )
}

/// The lines of `out` that start with `tag ` (without the tag).
fn tagged<'a>(out: &'a str, tag: &str) -> Vec<&'a str> {
    out.lines()
        .filter_map(|l| l.strip_prefix(tag).and_then(|r| r.strip_prefix(' ')))
        .collect()
}

/// Four threads, each with its own connection to `$1/t.db`, inserting rows
/// in transactions under a busy timeout; then what the database holds.
const SQLITE_THREADS: &str = r#"
import hashlib, os, sqlite3, sys, threading
os.makedirs(sys.argv[1], exist_ok=True)
db = os.path.join(sys.argv[1], "t.db")
c = sqlite3.connect(db)
c.execute("create table t (k integer primary key, who int, v text)")
c.commit()
c.close()
errors = []
def worker(w):
    try:
        c = sqlite3.connect(db, timeout=60)
        seen = 0
        for b in range(30):
            with c:
                for i in range(10):
                    n = w * 10000 + b * 10 + i
                    c.execute("insert into t values (?, ?, ?)", (n, w, ("%d." % n) * (n % 40 + 1)))
            # The rows the other connections committed are read here.
            now = c.execute("select count(*) from t").fetchone()[0]
            assert now >= seen + 10, (now, seen)
            seen = now
        c.close()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
c = sqlite3.connect(db)
print("check", c.execute("pragma integrity_check").fetchone()[0])
print("sums", *c.execute("select count(*), sum(k), sum(length(v)) from t").fetchone())
h = hashlib.sha256()
for row in c.execute("select k, who, v from t order by k"):
    h.update(repr(row).encode())
print("rows", h.hexdigest())
c.close()
print("file", hashlib.sha256(open(db, "rb").read()).hexdigest())
"#;

/// What [`SQLITE_THREADS`] prints of the database, run on its path.
const SQLITE_READ: &str = r#"
import hashlib, sqlite3, sys
c = sqlite3.connect("file:" + sys.argv[1] + "?mode=ro", uri=True)
print("check", c.execute("pragma integrity_check").fetchone()[0])
print("sums", *c.execute("select count(*), sum(k), sum(length(v)) from t").fetchone())
h = hashlib.sha256()
for row in c.execute("select k, who, v from t order by k"):
    h.update(repr(row).encode())
print("rows", h.hexdigest())
c.close()
print("file", hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
"#;

/// The count, sum of keys and sum of lengths [`SQLITE_THREADS`] must leave.
fn sqlite_model() -> String {
    let (mut count, mut keys, mut lens) = (0u64, 0u64, 0u64);
    for w in 0..4u64 {
        for b in 0..30u64 {
            for i in 0..10u64 {
                let n = w * 10000 + b * 10 + i;
                count += 1;
                keys += n;
                lens += (format!("{n}.").len() as u64) * (n % 40 + 1);
            }
        }
    }
    format!("{count} {keys} {lens}")
}

fn sqlite_connections(fs: &str) {
    need("python3");
    let test = format!("sqlite connections per thread, embedded {fs}");
    let a = Area::new("backing");
    let got = run_python(&a, fs, &test, SQLITE_THREADS, &[]);
    assert_eq!(tagged(&got, "check"), ["ok"], "{test}: {got}");
    assert_eq!(tagged(&got, "sums"), [sqlite_model()], "{test}: {got}");
    let Some(s) = mount(&a, fs, &format!("{test}, read through a mount")) else {
        return;
    };
    let db = s.mountpoint().join("work").join("t.db");
    let mut c = Command::new("python3");
    c.args(["-c", SQLITE_READ]).arg(&db);
    let mounted = watched(c, LIMIT, &format!("{test} (mount)"));
    succeeded(&mounted, &format!("{test} (mount)"));
    let mounted = String::from_utf8_lossy(&mounted.stdout).into_owned();
    assert_eq!(
        mounted, got,
        "{test}: the database through a mount differs from the job's"
    );
}

/// Two opens of `$1/f` in one process, and record locks on it checked
/// from other processes of the job (`$0 probe`). Prints the sha256 of the
/// model the file must hold.
const TWO_OPENS: &str = r#"
import errno, fcntl, hashlib, os, random, struct, subprocess, sys
FL = "hhqqi4x"
if len(sys.argv) > 2 and sys.argv[2] == "probe":
    # Another process: what F_GETLK says of bytes [start, start+len), and
    # whether F_SETLK of a write lock there is refused.
    start, n = int(sys.argv[3]), int(sys.argv[4])
    fd = os.open(os.path.join(sys.argv[1], "f"), os.O_RDWR)
    t, _, s, l, _ = struct.unpack(FL, fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FL, fcntl.F_WRLCK, 0, start, n, 0)))
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack(FL, fcntl.F_WRLCK, 0, start, n, 0))
        got = "free"
    except OSError as e:
        got = errno.errorcode[e.errno]
    print("unlocked" if t == fcntl.F_UNLCK else "locked %d+%d" % (s, l), got)
    sys.exit(0)

def probe(start, n):
    r = subprocess.run([sys.executable, "-c", SCRIPT, sys.argv[1], "probe", str(start), str(n)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()

def setlk(fd, ty, start, n, cmd=fcntl.F_SETLK):
    fcntl.fcntl(fd, cmd, struct.pack(FL, ty, 0, start, n, 0))

def getlk(fd, start, n, cmd=fcntl.F_GETLK):
    t, _, s, l, _ = struct.unpack(FL, fcntl.fcntl(fd, cmd, struct.pack(FL, fcntl.F_WRLCK, 0, start, n, 0)))
    return "unlocked" if t == fcntl.F_UNLCK else "locked %d+%d" % (s, l)

os.makedirs(sys.argv[1], exist_ok=True)
p = os.path.join(sys.argv[1], "f")
fd1 = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
fd2 = os.open(p, os.O_RDWR)
model = bytearray()
rng = random.Random(11)
for i in range(300):
    off = rng.randrange(0, 400000)
    data = rng.randbytes(rng.randrange(1, 30000))
    w, r = (fd1, fd2) if i % 2 == 0 else (fd2, fd1)
    assert os.pwrite(w, data, off) == len(data)
    if off > len(model):
        model.extend(bytes(off - len(model)))
    model[off:off + len(data)] = data
    # Through the other open, at once: what was just written, and a range
    # anywhere in the file.
    assert os.pread(r, len(data), off) == data, ("just written", i)
    at = rng.randrange(0, len(model))
    n = rng.randrange(1, 60000)
    assert os.pread(r, n, at) == bytes(model[at:at + n]), ("model", i, at, n)
    assert os.fstat(r).st_size == len(model), ("size", i)
# Each open keeps its own offset.
os.lseek(fd1, 0, os.SEEK_SET)
os.lseek(fd2, 1000, os.SEEK_SET)
assert os.read(fd1, 100) == model[:100]
assert os.read(fd2, 100) == model[1000:1100]
assert os.read(fd1, 10) == model[100:110]
# An appending open appends after what the others wrote.
fd3 = os.open(p, os.O_WRONLY | os.O_APPEND)
os.write(fd3, b"appended")
model += b"appended"
assert os.pread(fd1, 8, len(model) - 8) == b"appended"
os.close(fd3)
# A read-only open joins, and sees the writes of the others at once.
fd4 = os.open(p, os.O_RDONLY)
os.pwrite(fd1, b"seen", 5)
model[5:9] = b"seen"
assert os.pread(fd4, len(model) + 10, 0) == bytes(model)
os.close(fd4)
print("fsync", os.fsync(fd2) is None)
# Another process writes and closes; a new open here sees its bytes
# (close-to-open), and so do the opens held already, which share its state.
subprocess.run([sys.executable, "-c",
                "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); "
                "os.pwrite(fd, b'other process', 7); os.close(fd)", p], check=True)
model[7:20] = b"other process"
fd6 = os.open(p, os.O_RDONLY)
print("new open sees the other process:", os.pread(fd6, 13, 7) == b"other process")
print("held open sees the other process:", os.pread(fd1, 13, 7) == b"other process")
os.close(fd6)

# POSIX record locks are the process's, whatever descriptor took them.
setlk(fd1, fcntl.F_WRLCK, 0, 100)
print("other while fd1 holds 0+100:", probe(0, 100))
setlk(fd2, fcntl.F_WRLCK, 0, 100)
print("fd2 takes 0+100 too")
print("F_GETLK via fd2:", getlk(fd2, 0, 100))
setlk(fd2, fcntl.F_RDLCK, 200, 50)
print("other at 200+50:", probe(200, 50))
fcntl.lockf(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 300)
print("other at 300+10 (lockf):", probe(300, 10))
# The close of any descriptor of the file drops them all.
os.close(fd2)
print("after closing fd2, other at 0+100:", probe(0, 100))
print("after closing fd2, other at 200+50:", probe(200, 50))
print("after closing fd2, other at 300+10:", probe(300, 10))

# OFD locks stay the open's: two opens of the process conflict.
fd5 = os.open(p, os.O_RDWR)
setlk(fd1, fcntl.F_WRLCK, 0, 10, fcntl.F_OFD_SETLK)
try:
    setlk(fd5, fcntl.F_WRLCK, 0, 10, fcntl.F_OFD_SETLK)
    print("ofd: second open got it")
except OSError as e:
    print("ofd: second open", errno.errorcode[e.errno])
print("ofd: F_OFD_GETLK via fd5:", getlk(fd5, 0, 10, fcntl.F_OFD_GETLK))
os.close(fd5)
# O_TRUNC by a new open empties the file for the opens held too.
fd7 = os.open(p, os.O_WRONLY | os.O_TRUNC)
print("truncated for the held open:", os.fstat(fd1).st_size, os.pread(fd1, 10, 0))
model = bytearray(rng.randbytes(70000))
os.pwrite(fd7, model, 0)
assert os.pread(fd1, 80000, 0) == bytes(model)
os.close(fd7)
os.close(fd1)
print("model", hashlib.sha256(model).hexdigest())
r = subprocess.run(["sha256sum", p], capture_output=True, text=True)
print("file", r.stdout.split()[0])
"#;

fn two_opens(fs: &str) {
    let test = format!("two opens in one process, embedded {fs}");
    let a = Area::new("backing");
    // The probe runs the same script: it is passed as its own text.
    let script = format!("SCRIPT = {TWO_OPENS:?}\n{TWO_OPENS}");
    let got = run_python(&a, fs, &test, &script, &[]);
    let want = "\
fsync True
new open sees the other process: True
held open sees the other process: True
other while fd1 holds 0+100: locked 0+100 EAGAIN
fd2 takes 0+100 too
F_GETLK via fd2: unlocked
other at 200+50: locked 200+50 EAGAIN
other at 300+10 (lockf): locked 300+10 EAGAIN
after closing fd2, other at 0+100: unlocked free
after closing fd2, other at 200+50: unlocked free
after closing fd2, other at 300+10: unlocked free
ofd: second open EAGAIN
ofd: F_OFD_GETLK via fd5: locked 0+10
truncated for the held open: 0 b''
";
    let (head, tail) = got.split_at(got.find("model ").unwrap_or(got.len()));
    assert_eq!(head, want, "{test}: {got}");
    let model = tagged(tail, "model");
    assert_eq!(model.len(), 1, "{test}: {got}");
    assert_eq!(tagged(tail, "file"), model, "{test}: the job's bytes");
    let Some(s) = mount(&a, fs, &format!("{test}, read through a mount")) else {
        return;
    };
    let out = Command::new("sha256sum")
        .arg(s.mountpoint().join("work").join("f"))
        .output()
        .unwrap();
    let mounted = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        mounted.split_whitespace().next(),
        Some(model[0]),
        "{test}: the bytes through a mount differ from the model"
    );
}

/// Threads each with its own sqlite3 connection and a file of their own
/// writing in `$1` while the main thread forks children that write, read
/// and list there too: every child must end (a lock of the library held
/// by a thread at the fork would stop it forever). The children do not
/// use SQLite themselves: its own mutexes, copied mid-use by the `fork`,
/// are the program's to keep.
const FORK_WHILE_THREADS: &str = r#"
import os, sqlite3, sys, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)
os.makedirs(sys.argv[1], exist_ok=True)
db = os.path.join(sys.argv[1], "t.db")
c = sqlite3.connect(db)
c.execute("create table t (k integer primary key, v text)")
c.commit()
c.close()
# Enough entries that plfs counts the directory's links on threads of its
# own (from 32 subdirectories), which the workers' stats below ask for.
for k in range(40):
    with open(os.path.join(sys.argv[1], "pre%d" % k), "wb") as o:
        o.write(b"%d" % k)
stop = threading.Event()
errors = []
def worker(w):
    try:
        c = sqlite3.connect(db, timeout=60)
        f = os.path.join(sys.argv[1], "w%d" % w)
        n = 0
        while not stop.is_set():
            with c:
                c.execute("insert into t values (?, ?)", (w * 1000000 + n, "x" * (n % 300)))
            with open(f, "ab") as o:
                o.write(b"%d\n" % n)
            os.stat(sys.argv[1])
            n += 1
        c.close()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
for t in ts: t.start()
for i in range(100):
    pid = os.fork()
    if pid == 0:
        try:
            f = os.path.join(sys.argv[1], "child%d" % i)
            with open(f, "wb") as o:
                o.write(b"child %d\n" % i * 100)
            with open(f, "rb") as o:
                ok = o.read() == b"child %d\n" % i * 100
            with open(db, "rb") as o:
                ok = ok and o.read(16) == b"SQLite format 3\0"
            ok = ok and "t.db" in os.listdir(sys.argv[1])
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, (i, st)
stop.set()
for t in ts: t.join()
assert not errors, errors
c = sqlite3.connect(db)
print("check", c.execute("pragma integrity_check").fetchone()[0])
print("children", sum(1 for n in os.listdir(sys.argv[1]) if n.startswith("child")))
"#;

/// Threads stat directories of 40 entries that another process made
/// (this process has no count of their links, so plfs counts them on
/// threads of its own) while the main thread forks and a plfs file is
/// held open. The library's threads must never wait for the fork gate:
/// before they were its own, this hung at the first fork that met a count
/// (3 runs of 3).
const FORK_WHILE_LIBRARY_THREADS: &str = r#"
import os, subprocess, sys, threading
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
subprocess.run([sys.executable, "-c", """
import os, sys
d = sys.argv[1]
for i in range(60):
    p = os.path.join(d, "big%d" % i)
    os.makedirs(p, exist_ok=True)
    for k in range(40):
        with open(os.path.join(p, "f%d" % k), "wb") as o:
            o.write(b"x")
""", d], check=True)
keep = open(os.path.join(d, "keep"), "wb")
keep.write(b"x")
links = {}
def worker(w):
    for i in range(w, 60, 3):
        links[i] = os.stat(os.path.join(d, "big%d" % i)).st_nlink
ts = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
for t in ts: t.start()
for i in range(60):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if os.path.isdir(os.path.join(d, "big0")) else 1)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, (i, st)
for t in ts: t.join()
keep.close()
print("links", sorted(set(links.values())), len(links))
"#;

#[test]
fn fork_while_plfs_counts_on_threads_of_its_own() {
    let test = "fork while plfs counts a directory on its threads, embedded";
    let a = Area::new("backing");
    let got = run_python(&a, "plfs", test, FORK_WHILE_LIBRARY_THREADS, &[]);
    // Each directory holds 40 files and no subdirectory: 2 links.
    assert_eq!(got, "links [2] 60\n", "{test}");
}

fn fork_while_threads(fs: &str) {
    let test = format!("fork while threads use the file system, embedded {fs}");
    let a = Area::new("backing");
    let got = run_python(&a, fs, &test, FORK_WHILE_THREADS, &[]);
    assert_eq!(got, "check ok\nchildren 100\n", "{test}");
}

macro_rules! cases {
    ($($name:ident: $f:ident, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            $f($fs);
        }
    )*};
}

cases! {
    sqlite_connections_passthrough: sqlite_connections, "passthrough";
    sqlite_connections_plfs: sqlite_connections, "plfs";
    sqlite_connections_pack: sqlite_connections, "pack";
    sqlite_connections_versions: sqlite_connections, "versions";
    two_opens_passthrough: two_opens, "passthrough";
    two_opens_plfs: two_opens, "plfs";
    two_opens_pack: two_opens, "pack";
    two_opens_versions: two_opens, "versions";
    fork_while_threads_plfs: fork_while_threads, "plfs";
    fork_while_threads_pack: fork_while_threads, "pack";
    fork_while_threads_versions: fork_while_threads, "versions";
}
