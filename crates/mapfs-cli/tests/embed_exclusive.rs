//! Embedded jobs over an exclusive backing directory (`mapfs run --embed
//! passthrough:BACKING:PREFIX:exclusive`): the processes keep parent
//! directories open, checked against the job's namespace generation.
//! Real programs (python3 processes of one job talking over pipes), checked
//! against the backing directory, against the same sequence run natively,
//! and against a job without `exclusive`.

mod common;
mod embed_support;
mod preload_support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{mapfs_bin, need};
use embed_support::Area;
use preload_support::ok;

/// The embedded library; panics with how to build it when missing or older
/// than its sources.
fn embed_lib() -> PathBuf {
    preload_support::fresh_library(
        "libmapfs_embed_builtins.so",
        &[
            "mapfs-embed/src",
            "mapfs-embed-builtins/src",
            "mapfs-registry/src",
            "mapfs-fs/src/passthrough",
            "mapfs/src",
        ],
    )
}

fn area() -> Area {
    embed_lib();
    need("python3");
    Area::new("backing")
}

/// `prog` under `mapfs run --embed passthrough:BACKING:PREFIX[:exclusive]`.
fn run(a: &Area, exclusive: bool, prog: &str) -> Command {
    let mut spec = a.spec("passthrough");
    if exclusive {
        spec.push_str(":exclusive");
    }
    let mut c = Command::new(mapfs_bin());
    c.arg("run")
        .arg("--embed")
        .arg(spec)
        .arg("--")
        .arg(prog)
        .env_remove("LD_PRELOAD")
        .env_remove("MAPFS_EMBED");
    c
}

#[test]
fn exclusive_specs_are_accepted_and_bad_suffixes_refused() {
    let a = area();
    let out = ok(run(&a, true, "sh").arg("-c").arg(
        r#"set -e; mkdir -p "$P/d/e"; echo hi > "$P/d/e/f"; cat "$P/d/e/f"; printf '%s\n' "$MAPFS_EMBED""#,
    )
    .env("P", &a.prefix));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("hi"));
    assert_eq!(
        std::fs::read_to_string(a.backing.join("d/e/f")).unwrap(),
        "hi\n"
    );
    // The job's page: named to every process, the user's alone, one page.
    let env = lines.collect::<Vec<_>>().join("\n");
    assert!(env.contains("mapfs-exclusive"), "{env}");
    let page = env
        .split(['\t', '\x1f', '\n'])
        .find_map(|o| o.strip_prefix("mapfs-nsgen="))
        .unwrap_or_else(|| panic!("no page in {env:?}"));
    let m = std::fs::symlink_metadata(page).unwrap();
    assert!(m.file_type().is_file());
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    assert_eq!(m.uid(), rustix::process::geteuid().as_raw());
    assert_eq!(m.len(), 4096);

    // Without the suffix there is no page.
    let out = ok(run(&a, false, "sh")
        .arg("-c")
        .arg(r#"printf '%s' "$MAPFS_EMBED""#));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("mapfs-nsgen"));

    for bad in ["exclusiv", "Exclusive", "ro"] {
        let out = Command::new(mapfs_bin())
            .arg("run")
            .arg("--embed")
            .arg(format!("{}:{bad}", a.spec("passthrough")))
            .arg("--")
            .arg("true")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(
            err.contains(&format!("unknown suffix {bad:?}"))
                && err.contains("FS:BACKING:PREFIX:exclusive"),
            "{bad}: {err}"
        );
    }
}

/// The python3 side of the rename test: this process keeps `a/sub` (it
/// checks that its own descriptors show the kept directory), asks a child
/// to rename, and looks at once. The child is spawned (an `exec`ed image,
/// its own mapping of the page) or forked (the parent's mapping and kept
/// directories), alternately.
const RENAME_PY: &str = r#"
import os, sys, signal, subprocess
signal.alarm(120)
P, BACKING, EXCL = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if len(sys.argv) > 4:
    # The spawned child: renames what it is told, one line at a time.
    for line in sys.stdin:
        src, dst = line.split()
        os.rename(os.path.join(P, src), os.path.join(P, dst))
        print("done", flush=True)
    sys.exit(0)

def kept(rel):
    want = os.path.join(BACKING, rel)
    fds = os.listdir("/proc/self/fd")
    return any(os.readlink("/proc/self/fd/" + f) == want for f in fds if os.path.exists("/proc/self/fd/" + f))

os.makedirs(os.path.join(P, "a/sub"))
with open(os.path.join(P, "a/sub/f"), "w") as f:
    f.write("payload")
child = subprocess.Popen([sys.executable, sys.argv[0], P, BACKING, sys.argv[3], "child"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
cur, other = "a", "b"
errors = []
for i in range(60):
    for _ in range(3):
        os.stat(os.path.join(P, cur, "sub/f"))
    if EXCL and not kept(cur + "/sub"):
        errors.append(f"round {i}: {cur}/sub is not kept")
    if i % 2 == 0:
        child.stdin.write(f"{cur} {other}\n"); child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
    else:
        pid = os.fork()
        if pid == 0:
            os.rename(os.path.join(P, cur), os.path.join(P, other))
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        assert st == 0
    # At once: the old name is gone, the new one holds the file.
    if os.path.exists(os.path.join(P, cur, "sub/f")):
        errors.append(f"round {i}: {cur}/sub/f still found after the rename")
    try:
        with open(os.path.join(P, other, "sub/f")) as f:
            if f.read() != "payload":
                errors.append(f"round {i}: wrong bytes")
    except OSError as e:
        errors.append(f"round {i}: {other}/sub/f: {e}")
    # A file made under the new name lands in the renamed directory.
    new = os.path.join(P, other, "sub", f"n{i}")
    open(new, "w").close()
    if not os.path.exists(os.path.join(BACKING, other, "sub", f"n{i}")):
        errors.append(f"round {i}: {new} not in the backing directory")
    try:
        open(os.path.join(P, cur, "sub", f"m{i}"), "w").close()
        errors.append(f"round {i}: created under the old name {cur}")
    except FileNotFoundError:
        pass
    cur, other = other, cur
child.stdin.close()
child.wait()
# An rmdir and a mkdir of the same name by another process: the new
# directory, not the removed one, gets what is made next.
os.makedirs(os.path.join(P, "x/y"))
os.stat(os.path.join(P, "x/y"))
open(os.path.join(P, "x/y/z"), "w").close()
os.unlink(os.path.join(P, "x/y/z"))
pid = os.fork()
if pid == 0:
    os.rmdir(os.path.join(P, "x/y"))
    os.mkdir(os.path.join(P, "x/y"))
    os._exit(0)
os.waitpid(pid, 0)
open(os.path.join(P, "x/y/after"), "w").close()
if not os.path.exists(os.path.join(BACKING, "x/y/after")):
    errors.append("a file made after rmdir+mkdir went to the removed directory")
print("\n".join(errors) if errors else "ok")
"#;

fn rename_seen_at_once(exclusive: bool) {
    let a = area();
    let script = a.dir().join("rename.py");
    std::fs::write(&script, RENAME_PY).unwrap();
    let out = ok(run(&a, exclusive, "python3")
        .arg(&script)
        .arg(&a.prefix)
        .arg(&a.backing)
        .arg(if exclusive { "1" } else { "0" }));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(a.backing.join("a/sub/f").exists() || a.backing.join("b/sub/f").exists());
    assert!(a.backing.join("x/y/after").exists());
}

#[test]
fn a_directory_renamed_by_one_process_is_seen_at_once_by_the_others() {
    rename_seen_at_once(true);
}

#[test]
fn a_directory_renamed_without_exclusive_is_seen_at_once_too() {
    rename_seen_at_once(false);
}

/// The job side of the symlink test: keeps `d`, waits while the test swaps
/// `d` for a symlink leading out of the backing root, then reads, writes
/// and lists through the old name, before and after a namespace change of
/// its own, and once more after a process of the job swapped `e` itself.
const SWAP_PY: &str = r#"
import os, sys, signal
signal.alarm(120)
P, BACKING, SECRET = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(P, "d"))
os.makedirs(os.path.join(P, "e"))
os.makedirs(os.path.join(P, "spare"))
for d in ("d", "e"):
    with open(os.path.join(P, d, "f"), "w") as f:
        f.write("inside")
    for _ in range(3):
        os.stat(os.path.join(P, d, "f"))
print("ready", flush=True)
assert sys.stdin.readline().strip() == "swapped"

seen = []
def look(tag, d):
    p = os.path.join(P, d, "f")
    try:
        with open(p) as f:
            seen.append(f"{tag} read {f.read()}")
    except OSError as e:
        seen.append(f"{tag} read errno {e.errno}")
    try:
        seen.append(f"{tag} list {sorted(os.listdir(os.path.join(P, d)))}")
    except OSError as e:
        seen.append(f"{tag} list errno {e.errno}")
    try:
        with open(p, "w") as f:
            f.write("written by the job")
    except OSError as e:
        seen.append(f"{tag} write errno {e.errno}")
    try:
        open(os.path.join(P, d, "new"), "w").close()
    except OSError as e:
        seen.append(f"{tag} create errno {e.errno}")

look("kept", "d")
os.rename(os.path.join(P, "spare"), os.path.join(P, "spare2"))
look("after a change", "d")
# A process of the job swaps `e` through the prefix: the symlink's target
# is resolved from the prefix, as through a mount.
pid = os.fork()
if pid == 0:
    os.rename(os.path.join(P, "e"), os.path.join(P, "e.old"))
    os.symlink(sys.argv[4], os.path.join(P, "e"))
    os._exit(0)
os.waitpid(pid, 0)
look("job swap", "e")
print("\n".join(seen))
"#;

fn symlink_swap_stays_inside(exclusive: bool) {
    let a = area();
    // The backing root sits two levels below the area, so `../../X` from
    // one of its directories is the area's `X` on the host; from the
    // prefix (one level below the area) the same target is above the area,
    // where nothing of that name exists.
    let backing = a.dir().join("deep/back");
    std::fs::create_dir_all(&backing).unwrap();
    // Named after the area (unique), so that nothing of that name exists
    // above it.
    let name = format!("{}-outside", a.dir().file_name().unwrap().to_string_lossy());
    let secret_dir = a.dir().join(&name);
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("f"), "SECRET").unwrap();
    let target = format!("../../{name}");
    // A link in the prefix's root resolves from the prefix's parent (the
    // area): `../..` is then the area's parent.
    let from_prefix = a.dir().parent().unwrap().join(&name);
    assert!(
        !from_prefix.exists(),
        "the test needs {} absent",
        from_prefix.display()
    );

    let script = a.dir().join("swap.py");
    std::fs::write(&script, SWAP_PY).unwrap();
    let mut spec = format!("passthrough:{}:{}", backing.display(), a.prefix.display());
    if exclusive {
        spec.push_str(":exclusive");
    }
    let mut child = Command::new(mapfs_bin())
        .arg("run")
        .arg("--embed")
        .arg(&spec)
        .arg("--")
        .arg("python3")
        .arg(&script)
        .arg(&a.prefix)
        .arg(&backing)
        .arg(&secret_dir)
        .arg(&target)
        .env_remove("LD_PRELOAD")
        .env_remove("MAPFS_EMBED")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the job did not start");
    // Behind the job's back (what `exclusive` promises nobody does): `d`
    // becomes a symlink out of the root, to a directory holding `f`.
    std::fs::rename(backing.join("d"), backing.join("d.old")).unwrap();
    std::os::unix::fs::symlink(&target, backing.join("d")).unwrap();
    assert_eq!(
        std::fs::read_to_string(backing.join("d/f")).unwrap(),
        "SECRET",
        "the raw kernel follows the swapped link out of the root"
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"swapped\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "the job failed: {rest}");

    assert_eq!(
        std::fs::read_to_string(secret_dir.join("f")).unwrap(),
        "SECRET",
        "the job wrote outside the root:\n{rest}"
    );
    let names: Vec<_> = std::fs::read_dir(&secret_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f"], "the job created outside the root:\n{rest}");
    assert!(!rest.contains("SECRET"), "read outside the root:\n{rest}");
    // Every look gave an answer of the root's: the kept (old) directory's
    // file, or nothing.
    for tag in ["kept", "after a change", "job swap"] {
        let read = rest
            .lines()
            .find(|l| l.starts_with(&format!("{tag} read")))
            .unwrap_or_else(|| panic!("no {tag} read in:\n{rest}"));
        assert!(
            read.ends_with("read inside") || read.ends_with("errno 2"),
            "{read}\n{rest}"
        );
    }
    // After the job's own change nothing kept is used: the swapped link is
    // resolved from the prefix, where its target does not exist.
    assert!(
        rest.contains("after a change read errno 2"),
        "after a change: {rest}"
    );
    assert!(rest.contains("job swap read errno 2"), "job swap: {rest}");
}

#[test]
fn a_symlink_swapped_in_the_backing_store_never_leads_outside() {
    symlink_swap_stays_inside(true);
}

#[test]
fn a_symlink_swapped_without_exclusive_never_leads_outside() {
    symlink_swap_stays_inside(false);
}

/// Two processes (a parent and a spawned child, in lock step over pipes)
/// run the same pseudo-random sequence of namespace calls on `ROOT`, each
/// taking every other call, and the parent prints each call's result: the
/// same seed must print the same lines natively, embedded, and embedded
/// exclusive.
const SEQ_PY: &str = r#"
import os, sys, random, signal, subprocess, errno
signal.alarm(300)
ROOT, SEED, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHILD = len(sys.argv) > 4
rng = random.Random(SEED)
names = ["a", "b", "c"]
def path():
    return "/".join(rng.choice(names) for _ in range(rng.randint(1, 3)))
ops = []
for i in range(N):
    k = rng.choice(["create", "stat", "stat", "stat", "rename", "unlink", "mkdir", "mkdir", "rmdir", "read"])
    ops.append((k, path(), path()))

def do(i):
    k, p, q = ops[i]
    fp, fq = os.path.join(ROOT, p), os.path.join(ROOT, q)
    try:
        if k == "create":
            with open(fp, "w") as f:
                f.write(str(i))
            return "ok"
        if k == "stat":
            st = os.lstat(fp)
            kind = "dir" if os.path.isdir(fp) else "file"
            return f"{kind} {st.st_size if kind == 'file' else '-'}"
        if k == "read":
            with open(fp) as f:
                return "has " + f.read()
        if k == "rename":
            os.rename(fp, fq)
            return "ok"
        if k == "unlink":
            os.unlink(fp)
            return "ok"
        if k == "mkdir":
            os.mkdir(fp)
            return "ok"
        if k == "rmdir":
            os.rmdir(fp)
            return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

if CHILD:
    for line in sys.stdin:
        print(do(int(line)), flush=True)
    sys.exit(0)
child = subprocess.Popen([sys.executable, sys.argv[0], ROOT, str(SEED), str(N), "child"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for i in range(N):
    k, p, q = ops[i]
    if i % 2 == 0:
        r = do(i)
    else:
        child.stdin.write(f"{i}\n"); child.stdin.flush()
        r = child.stdout.readline().strip()
    print(f"{i} {'parent' if i % 2 == 0 else 'child'} {k} {p} {q if k == 'rename' else ''} -> {r}")
child.stdin.close()
child.wait()
for dirpath, dirs, files in sorted(os.walk(ROOT)):
    dirs.sort()
    rel = os.path.relpath(dirpath, ROOT)
    for f in sorted(files):
        with open(os.path.join(dirpath, f)) as h:
            print(f"tree {rel}/{f} {h.read()}")
    for d in dirs:
        print(f"tree {rel}/{d}/")
"#;

#[test]
fn namespace_sequences_from_two_processes_match_native_with_and_without_exclusive() {
    let script_dir = tempfile::tempdir().unwrap();
    let script = script_dir.path().join("seq.py");
    std::fs::write(&script, SEQ_PY).unwrap();
    for seed in [1, 2, 3] {
        let n = "400";
        let native = {
            let a = area();
            let out = ok(Command::new("python3")
                .arg(&script)
                .arg(&a.native)
                .arg(seed.to_string())
                .arg(n));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        // The sequence must do something of each kind, or it proves
        // little.
        for want in [
            "rename", "rmdir", "mkdir", "unlink", "create", "-> ok", "ENOENT", "dir -",
        ] {
            assert!(native.contains(want), "seed {seed}: no {want:?}");
        }
        for exclusive in [false, true] {
            let a = area();
            let out = ok(run(&a, exclusive, "python3")
                .arg(&script)
                .arg(&a.prefix)
                .arg(seed.to_string())
                .arg(n));
            let emb = String::from_utf8_lossy(&out.stdout);
            if let Some((i, (e, m))) = emb
                .lines()
                .zip(native.lines())
                .enumerate()
                .find(|(_, (e, m))| e != m)
            {
                panic!(
                    "seed {seed}, exclusive {exclusive}: line {} differs\n embedded: {e}\n native:   {m}",
                    i + 1
                );
            }
            assert_eq!(emb.lines().count(), native.lines().count());
            // And the backing directory holds what the job left.
            let listed = tree(&a.backing);
            let native_tree: Vec<&str> =
                native.lines().filter(|l| l.starts_with("tree ")).collect();
            assert_eq!(listed.len(), native_tree.len(), "seed {seed}: {listed:?}");
        }
    }
}

/// Every entry below `root` (files and directories), for counting.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}
