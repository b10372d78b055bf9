//! Real programs under both in-process executors (`mapfs run --mount`
//! attached to a mount, `mapfs run --embed`) on every built-in file
//! system, each under the torture suite's watchdog, each result compared
//! with the same program run natively:
//! - git: `init`, `add`, two commits, a rename, `gc --aggressive` (threaded
//!   `pack-objects`), `fsck --full --strict`, a checkout of the first
//!   commit;
//! - `tar x` of a tree made natively, then `find | xargs -P4 md5sum` of it;
//! - Python's `sqlite3` from four threads, each with its own connection
//!   to one database, then `PRAGMA integrity_check` and the sums, by
//!   Python and by the `sqlite3` program (which also writes in WAL mode).

mod common;
mod embed_support;
mod preload_support;
mod torture_support;

use std::process::Command;

use common::fuse_or_skip;
use torture_support::{succeeded, watched, Target, LIMIT};

/// Runs `script` (bash, `$1` = a fresh directory, `$2`... = `args`) under
/// `executor` on `fs` and natively, and checks both say the same.
fn compare(executor: &str, fs: &'static str, what: &str, script: &str, args: &[&str]) {
    let test = format!("{what} {executor} {fs}");
    if executor == "attached" && !fuse_or_skip(&test) {
        return;
    }
    let t = Target::new(executor, fs, &test);
    let dir = t.dir("work");
    t.mkdir(&test, &dir);
    let mut argv = vec!["bash", "-c", script, "bash", &dir];
    argv.extend_from_slice(args);
    let got = watched(t.command(&test, &argv), LIMIT, &test);
    succeeded(&got, &test);

    let native = common::native_dir();
    let ndir = native.path().join("work");
    std::fs::create_dir(&ndir).unwrap();
    let ndir = ndir.display().to_string();
    let mut c = Command::new("bash");
    c.args(["-c", script, "bash", &ndir]).args(args);
    let want = watched(c, LIMIT, &format!("{test} (native)"));
    succeeded(&want, &format!("{test} (native)"));

    let got = String::from_utf8_lossy(&got.stdout).replace(&dir, "DIR");
    let want = String::from_utf8_lossy(&want.stdout).replace(&ndir, "DIR");
    assert!(
        want.contains("ok end"),
        "{test}: the native run did not finish: {want}"
    );
    assert_eq!(
        got, want,
        "{test}: the program said otherwise than natively"
    );
}

/// git in directory `$1`: fixed dates and identity, so the commits' hashes
/// are the same everywhere.
const GIT: &str = r#"
set -euo pipefail
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.org GIT_COMMITTER_NAME=t
export GIT_COMMITTER_EMAIL=t@example.org
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
cd "$1"
git init -q -b main repo
cd repo
for d in a b c; do
  mkdir $d
  for i in $(seq 1 40); do seq $i $((i * 60)) > $d/f$i; done
done
git add -A
git commit -q -m one
for i in $(seq 1 40); do echo "change $i" >> a/f$i; done
git mv b c/b
git commit -q -am two
git -c pack.threads=4 -c gc.auto=0 gc -q --aggressive
git fsck --full --strict --no-progress
git rev-parse HEAD HEAD^{tree} HEAD~1
git count-objects -v | grep -E '^(count|in-pack|packs|garbage):'
git checkout -q HEAD~1
find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 md5sum | md5sum
git checkout -q main
git status --porcelain
echo ok end
"#;

/// `tar x` of the tarball `$2` into `$1`, then the sums of every file by
/// four `md5sum`s at once, and the tree's names.
const TAR_FIND: &str = r#"
set -euo pipefail
cd "$1"
tar xf "$2"
find . -type f -print0 | xargs -0 -P4 -n6 md5sum | sort -k2
find . | sort
find . -type l -printf '%p -> %l\n' | sort
echo ok end
"#;

/// The tree of [`TAR_FIND`]'s tarball: files of every size up to 300 KiB
/// (empty, under a page, several blocks), in nested directories, and a
/// symbolic link.
fn tarball(dir: &std::path::Path) -> std::path::PathBuf {
    let tree = dir.join("tree");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for d in 0..6 {
        let sub = tree.join(format!("d{d}")).join(format!("e{}", d % 3));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..12 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = match f % 4 {
                0 => 0,
                1 => (x % 4000) as usize,
                2 => (x % 70_000) as usize,
                _ => (x % 300_000) as usize,
            };
            std::fs::write(sub.join(format!("f{f}")), preload_support::pattern(len, x)).unwrap();
        }
    }
    std::os::unix::fs::symlink("d0/e0/f1", tree.join("link")).unwrap();
    let tar = dir.join("tree.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    tar
}

/// sqlite in `$1`: four Python threads insert rows in small
/// transactions, each with its own connection (waiting on each other's
/// locks); then the checks, by Python and by the `sqlite3` program, which
/// also adds rows in WAL mode (with the WAL index in its own memory when
/// `$2` = `exclusive`).
const SQLITE: &str = r#"
set -euo pipefail
cd "$1"
python3 - <<'EOF'
import sqlite3, threading
db = "t.db"
c = sqlite3.connect(db)
c.execute("create table t (k integer primary key, who int, v text)")
c.commit()
c.close()
errors = []
def worker(w):
    try:
        c = sqlite3.connect(db, timeout=60)
        for b in range(25):
            with c:
                for i in range(8):
                    n = w * 1000 + b * 8 + i
                    c.execute("insert into t values (?, ?, ?)", (n, w, ("%d." % n) * (n % 50 + 1)))
        c.close()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
c = sqlite3.connect(db)
print(c.execute("pragma integrity_check").fetchone()[0])
print(c.execute("select count(*), sum(k), sum(length(v)) from t").fetchone())
EOF
# A WAL index is a shared mapping of t.db-shm, which an engine-served
# file cannot give: there the program keeps it in its own memory
# (exclusive locking mode), as SQLite does without shared memory.
pre="select 1;"
[ "$2" = exclusive ] && pre="pragma locking_mode=exclusive;"
sqlite3 t.db "$pre" "pragma journal_mode=wal;" "insert into t select k + 100000, who, v from t;" \
  "pragma wal_checkpoint(truncate);" "pragma integrity_check;" \
  "select count(*), sum(k), sum(length(v)) from t;" | sed 's/^0|[0-9]*|[0-9]*$/checkpointed/'
echo ok end
"#;

fn git(executor: &str, fs: &'static str) {
    common::need("git");
    compare(executor, fs, "git", GIT, &[]);
}

fn tar_find(executor: &str, fs: &'static str) {
    common::need("tar");
    let tmp = common::native_dir();
    let tar = tarball(tmp.path());
    compare(
        executor,
        fs,
        "tar x, find | xargs -P4",
        TAR_FIND,
        &[&tar.display().to_string()],
    );
}

/// Python's sqlite3 from four threads, each with its own connection.
/// SQLite's WAL index is a shared mapping of the `-shm` file, which an
/// embedded file served by the data engine cannot give: there the
/// `sqlite3` program keeps it in its own memory (exclusive locking mode).
fn sqlite(executor: &str, fs: &'static str) {
    common::need("python3");
    common::need("sqlite3");
    let engine_served = executor == "embedded" && fs != "passthrough";
    let wal = if engine_served { "exclusive" } else { "shared" };
    compare(
        executor,
        fs,
        &format!("sqlite threads (WAL index {wal})"),
        SQLITE,
        &[wal],
    );
}

macro_rules! cases {
    ($($name:ident: $f:ident, $executor:literal, $fs:literal;)*) => {$(
        #[test]
        fn $name() {
            $f($executor, $fs);
        }
    )*};
}

cases! {
    git_attached_passthrough: git, "attached", "passthrough";
    git_attached_plfs: git, "attached", "plfs";
    git_attached_pack: git, "attached", "pack";
    git_attached_versions: git, "attached", "versions";
    git_embedded_passthrough: git, "embedded", "passthrough";
    git_embedded_plfs: git, "embedded", "plfs";
    git_embedded_pack: git, "embedded", "pack";
    git_embedded_versions: git, "embedded", "versions";
    tar_attached_passthrough: tar_find, "attached", "passthrough";
    tar_attached_plfs: tar_find, "attached", "plfs";
    tar_attached_pack: tar_find, "attached", "pack";
    tar_attached_versions: tar_find, "attached", "versions";
    tar_embedded_passthrough: tar_find, "embedded", "passthrough";
    tar_embedded_plfs: tar_find, "embedded", "plfs";
    tar_embedded_pack: tar_find, "embedded", "pack";
    tar_embedded_versions: tar_find, "embedded", "versions";
    sqlite_attached_passthrough: sqlite, "attached", "passthrough";
    sqlite_attached_plfs: sqlite, "attached", "plfs";
    sqlite_attached_pack: sqlite, "attached", "pack";
    sqlite_attached_versions: sqlite, "attached", "versions";
    sqlite_embedded_passthrough: sqlite, "embedded", "passthrough";
    sqlite_embedded_plfs: sqlite, "embedded", "plfs";
    sqlite_embedded_pack: sqlite, "embedded", "pack";
    sqlite_embedded_versions: sqlite, "embedded", "versions";
}
