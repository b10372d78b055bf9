//! The `versions` file system against a local attacker: user `nobody`
//! (65534) on a mount made by root with `allow_other`. What a user can make
//! the store spend (a sparse file's holes, versions over the byte limit),
//! and who the store's objects are charged to.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{fuse_or_skip, DataMode, MountSession};
use mapfs_testkit::user::{sh_as_nobody, NOBODY_GID, NOBODY_UID};

fn mount(opts: &str) -> MountSession {
    MountSession::builder(common::mapfs_bin())
        .fs("versions")
        .data(DataMode::Auto)
        .option("allow_other")
        .option(opts)
        .mount()
        .unwrap_or_else(|e| panic!("mounting versions -o allow_other,{opts}: {e:#}"))
}

/// A directory of the mount owned by nobody, where nobody works.
fn nobody_dir(s: &MountSession, name: &str) -> std::path::PathBuf {
    let d = s.mountpoint().join(name);
    fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(NOBODY_UID), Some(NOBODY_GID)).unwrap();
    d
}

/// Runs `script` as nobody; panics with its output if it fails.
fn as_nobody(test: &str, script: &str) {
    let out = sh_as_nobody(script).expect("running sh as nobody");
    assert!(
        out.status.success(),
        "{test}: `{script}` as nobody: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The store's objects: (name, allocated bytes, uid).
fn objects(backing: &Path) -> Vec<(String, u64, u32)> {
    let dir = backing.join(".mapfs-versions/objects");
    fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<i64>().is_ok())
        })
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                e.file_name().into_string().unwrap(),
                m.blocks() * 512,
                m.uid(),
            )
        })
        .collect()
}

/// `mapfs versions stats BACKING`'s value for `key`.
fn stat(backing: &Path, key: &str) -> u64 {
    let out = Command::new(common::mapfs_bin())
        .args(["versions", "stats"])
        .arg(backing)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in `mapfs versions stats`:\n{text}"))
}

/// A user grows their file to 512 MiB with `ftruncate` (4 KiB of data),
/// then cuts it back: the version of the 512 MiB file costs what it holds,
/// not 512 MiB of zeros, whether it is an undo version (the cut bytes are
/// saved) or a whole copy (`max-size` over the file); and every object is
/// the user's, so their quota counts it.
#[test]
fn a_sparse_grow_and_truncate_costs_what_the_file_holds() {
    let test = "versions sparse grow and truncate";
    if !fuse_or_skip(test) {
        return;
    }
    for opts in ["max-size=64K", "max-size=1G"] {
        let s = mount(opts);
        let d = nobody_dir(&s, "u");
        // coreutils' truncate opens the file for writing and calls
        // ftruncate: each run is a write session of its own.
        as_nobody(
            test,
            &format!(
                "cd {} && head -c 4096 /dev/urandom > f && truncate -s 512M f && truncate -s 4096 f",
                d.display()
            ),
        );
        assert_eq!(fs::metadata(d.join("f")).unwrap().len(), 4096);
        let objs = objects(s.backing());
        let allocated: u64 = objs.iter().map(|o| o.1).sum();
        assert!(
            allocated < 1 << 20,
            "{test} ({opts}): the store's objects allocate {allocated} bytes: {objs:?}"
        );
        assert!(
            stat(s.backing(), "versions") >= 2,
            "{test} ({opts}): the versions were not kept"
        );
        assert_eq!(stat(s.backing(), "skipped"), 0, "{test} ({opts})");
        for (name, _, uid) in &objs {
            assert_eq!(
                *uid, NOBODY_UID,
                "{test} ({opts}): object {name} is not nobody's"
            );
        }
        // The 512 MiB version reads back as it was: data, then zeros.
        let vdir = s.mountpoint().join(".versions/u");
        let mut sizes: Vec<u64> = fs::read_dir(&vdir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        sizes.sort();
        assert_eq!(
            sizes.last(),
            Some(&(512 << 20)),
            "{test} ({opts}): {sizes:?}"
        );
    }
}

/// A version that cannot fit in `keep-bytes` is never written: the user's
/// write succeeds, the version is skipped and counted, the store stays
/// within its limit. Every kind: a whole copy (at the open), an undo
/// version (saving the bytes a write overwrites), and the file's own inode
/// (an `O_TRUNC` rewrite, an unlink), whose blocks the store would keep.
#[test]
fn a_version_over_the_byte_limit_is_skipped_and_the_write_succeeds() {
    let test = "versions over the byte limit";
    if !fuse_or_skip(test) {
        return;
    }
    for opts in ["keep-bytes=64K,max-size=1M", "keep-bytes=64K,max-size=0"] {
        let s = mount(opts);
        let d = nobody_dir(&s, "u");
        as_nobody(
            test,
            &format!(
                "cd {} && head -c 204800 /dev/urandom > f && \
                 printf changed | dd of=f conv=notrunc status=none && printf tail >> f",
                d.display()
            ),
        );
        let now = fs::read(d.join("f")).unwrap();
        assert_eq!(now.len(), 204800 + 4, "{test} ({opts})");
        assert_eq!(&now[..7], b"changed", "{test} ({opts})");
        assert_eq!(&now[204800..], b"tail", "{test} ({opts})");
        assert!(
            stat(s.backing(), "skipped") >= 1,
            "{test} ({opts}): no version counted as skipped"
        );
        let allocated: u64 = objects(s.backing()).iter().map(|o| o.1).sum();
        assert!(
            allocated <= 64 << 10,
            "{test} ({opts}): the store allocates {allocated} bytes over its 64 KiB limit"
        );
        // The file's own inode, kept by an O_TRUNC rewrite or an unlink,
        // would keep its blocks in the store: over the limit too.
        let skipped = stat(s.backing(), "skipped");
        as_nobody(
            test,
            &format!(
                "cd {} && head -c 204800 /dev/urandom > f && rm f",
                d.display()
            ),
        );
        assert!(!d.join("f").exists(), "{test} ({opts})");
        assert!(
            stat(s.backing(), "skipped") >= skipped + 2,
            "{test} ({opts}): a rewrite and an unlink over the limit were not skipped"
        );
        let allocated: u64 = objects(s.backing()).iter().map(|o| o.1).sum();
        assert!(
            allocated <= 64 << 10,
            "{test} ({opts}): the store allocates {allocated} bytes after a rewrite and an unlink"
        );
        // Still readable by the owner: nothing was listed that is not there.
        let vdir = s.mountpoint().join(".versions/u");
        if let Ok(rd) = fs::read_dir(&vdir) {
            for e in rd {
                fs::read(e.unwrap().path()).unwrap();
            }
        }
        let _ = fs::set_permissions(&d, fs::Permissions::from_mode(0o755));
    }
}

/// Runs `mapfs ARGS` as nobody: (success, stdout).
fn mapfs_as_nobody(args: &[&str]) -> (bool, String) {
    let out = mapfs_testkit::user::command_as_nobody(common::mapfs_bin())
        .args(args)
        .env("HOME", "/")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Root keeps `vault/` 0700 and writes `vault/notes.txt` (0644) twice:
/// natively nobody cannot reach the file, so `.versions/vault` shows
/// nobody no name and no bytes (its listing, a lookup of the name root
/// sees, an open of it). Versions of a file nobody may reach (`pub/`,
/// 0755) still show. `mapfs versions`, run by nobody on the same store,
/// applies the same rule.
#[test]
fn versions_under_a_private_directory_are_hidden_from_other_users() {
    let test = "versions under a 0700 directory";
    if !fuse_or_skip(test) {
        return;
    }
    let mut s = mount("keep=none,keep-days=none");
    let m = s.mountpoint().to_path_buf();
    for (dir, mode) in [("vault", 0o700), ("pub", 0o755)] {
        fs::create_dir(m.join(dir)).unwrap();
        fs::set_permissions(m.join(dir), fs::Permissions::from_mode(mode)).unwrap();
        let f = m.join(dir).join("notes.txt");
        fs::write(&f, "secret one\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&f, "secret two\n").unwrap();
    }
    let names = |dir: &str| -> Vec<String> {
        fs::read_dir(m.join(".versions").join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let vault = names("vault");
    assert_eq!(vault.len(), 1, "{test}: root sees the version: {vault:?}");
    assert!(names("").contains(&"vault".to_string()));
    let entry = m.join(".versions/vault").join(&vault[0]);
    let public = m.join(".versions/pub").join(&names("pub")[0]);
    let script = format!(
        "ls -a {root}; echo ---; ls -a {root}/vault; echo ---; cat {entry}; echo ---; \
         stat -c %s {entry}; echo ---; cat {public}",
        root = m.join(".versions").display(),
        entry = entry.display(),
        public = public.display()
    );
    let out = sh_as_nobody(&script).unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    let parts: Vec<&str> = got.split("---\n").collect();
    assert_eq!(parts.len(), 5, "{test}: {got}");
    assert!(
        !parts[0].contains("vault") && parts[0].contains("pub"),
        "{test}: nobody's listing of .versions: {:?}",
        parts[0]
    );
    assert!(
        parts[1].is_empty(),
        "{test}: nobody lists .versions/vault: {:?}",
        parts[1]
    );
    assert!(
        parts[2].is_empty(),
        "{test}: nobody reads {}: {:?}",
        entry.display(),
        parts[2]
    );
    assert!(
        parts[3].is_empty(),
        "{test}: nobody stats {}: {:?}",
        entry.display(),
        parts[3]
    );
    assert_eq!(
        parts[4], "secret one\n",
        "{test}: nobody reads a version it may reach"
    );

    // `mapfs versions` as nobody, on a store it may open (made so here,
    // with the mount gone): the same rule, not the store's mode, hides
    // the vault.
    s.umount().unwrap();
    let backing = s.backing().to_path_buf();
    let st = Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(backing.join(".mapfs-versions"))
        .status()
        .unwrap();
    assert!(st.success());
    let b = backing.to_str().unwrap();
    let (ok, list) = mapfs_as_nobody(&["versions", "list", b]);
    assert!(ok, "{test}: mapfs versions list as nobody failed");
    assert!(
        !list.contains("vault") && list.contains("/pub/notes.txt@"),
        "{test}: mapfs versions list as nobody:\n{list}"
    );
    let (ok, shown) = mapfs_as_nobody(&["versions", "show", b, "/vault/notes.txt"]);
    assert!(
        !ok && shown.is_empty(),
        "{test}: mapfs versions show as nobody: {shown:?}"
    );
    let (ok, shown) = mapfs_as_nobody(&["versions", "show", b, "/pub/notes.txt"]);
    assert!(ok && shown == "secret one\n", "{test}: {shown:?}");
}
