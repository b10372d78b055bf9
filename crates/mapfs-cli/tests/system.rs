//! System integration: `mount -t fuse.mapfs`, an fstab line through
//! `mount -T`, `findmnt -t fuse.mapfs`, `mapfs list --json`, `umount`; and
//! the systemd unit template parses.
//!
//! `mount` runs `mount.fuse3` with a clean environment, which starts
//! `mapfs` from the default PATH; so the mount test runs in a private mount
//! namespace (`unshare -m`) where this build's `mapfs` is bind-mounted over
//! `/usr/local/bin`, leaving the machine's own directories untouched.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use mapfs_testkit::mount::run_captured;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Runs `script` (POSIX sh, `set -e`) in a private mount namespace with
/// `$BIN` bind-mounted on /usr/local/bin; lazily unmounts `$M` at exit, so
/// a failure leaves no mount behind.
fn in_namespace(script: &str, bin: &Path, vars: &[(&str, &Path)]) -> (bool, String, String) {
    let full = format!(
        "set -e\ntrap 'umount -l \"$M\" 2>/dev/null || true' EXIT\n\
         mount --bind \"$BIN\" /usr/local/bin\n{script}"
    );
    let mut env = vars.to_vec();
    env.push(("BIN", bin));
    let out = in_private_mount_ns(&full, &env).expect("unshare(1) (util-linux) is missing");
    (out.success(), out.stdout, out.stderr)
}

#[test]
fn mount_t_fstab_findmnt_list_umount() {
    if !fuse_or_skip("mount -t fuse.mapfs") {
        return;
    }
    if !is_root() {
        common::skip("mount -t fuse.mapfs", "needs root (mount(8), unshare)");
        return;
    }
    for tool in ["unshare", "findmnt", "mount.fuse3"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is missing (util-linux, fuse3: scripts/deps.sh)"
        );
    }
    let tmp = native_dir();
    let (b, m, bin) = (
        tmp.path().join("b"),
        tmp.path().join("m"),
        tmp.path().join("bin"),
    );
    for d in [&b, &m, &bin] {
        fs::create_dir(d).unwrap();
    }
    std::os::unix::fs::symlink(mapfs_bin(), bin.join("mapfs")).unwrap();
    let fstab = tmp.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "# a test fstab\n{} {} fuse.mapfs fs=plfs,data=daemon,noauto,x-test 0 0\n",
            b.display(),
            m.display()
        ),
    )
    .unwrap();
    let script = r#"
mount -t fuse.mapfs "$B" "$M" -o fs=plfs,data=auto,allow_other
echo hello > "$M/f"
echo "== findmnt"; findmnt -n -t fuse.mapfs -o SOURCE,TARGET,FSTYPE "$M"
echo "== list"; mapfs list --json "$M"
pid=$(mapfs list --json "$M" | sed -n 's/.*"daemon_pid": \([0-9][0-9]*\).*/\1/p')
umount "$M"
# umount(8) does not wait for a FUSE daemon: wait here, without a timeout.
tail --pid="$pid" -f /dev/null
echo "== after umount"; findmnt -n "$M" || echo "not mounted"
mount -T "$FSTAB" "$M"
echo "== fstab"; findmnt -n -t fuse.mapfs -o SOURCE,TARGET,FSTYPE "$M"; cat "$M/f"
mapfs list --json "$M" | grep '"data"'
umount "$M"
"#;
    let (ok, out, err) = in_namespace(script, &bin, &[("B", &b), ("M", &m), ("FSTAB", &fstab)]);
    assert!(ok, "script failed:\nstdout:\n{out}\nstderr:\n{err}");
    let section = |name: &str| -> String {
        let start = out
            .find(&format!("== {name}\n"))
            .unwrap_or_else(|| panic!("no {name}: {out}"));
        let rest = &out[start + name.len() + 4..];
        rest[..rest.find("\n==").unwrap_or(rest.len())].to_string()
    };
    let row = format!("{} {} fuse.mapfs", b.display(), m.display());
    let squeeze = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(squeeze(section("findmnt")), row, "mount -t");
    let list: serde_json::Value = serde_json::from_str(&section("list")).unwrap();
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["mountpoint"] == m.display().to_string())
        .unwrap_or_else(|| panic!("{m:?} not in list: {list}"));
    assert_eq!(entry["fs"], "plfs");
    assert_eq!(entry["backing"], b.display().to_string());
    assert_eq!(entry["data"], "auto");
    assert!(
        entry["daemon_pid"].as_u64().is_some_and(|p| p > 0),
        "{entry}"
    );
    assert!(entry["passthrough_active"].is_boolean(), "{entry}");
    assert!(entry["uptime_secs"].is_u64(), "{entry}");
    assert_eq!(section("after umount").trim(), "not mounted");
    let fstab_out = section("fstab");
    assert!(
        fstab_out.starts_with(&format!("{row}\n")),
        "fstab mount: {fstab_out}"
    );
    assert!(
        fstab_out.contains("hello\n"),
        "plfs file through the fstab mount: {fstab_out}"
    );
    assert!(fstab_out.contains("\"data\": \"daemon\""), "{fstab_out}");
    assert!(mapfs_testkit::mount::mounts_under(tmp.path()).is_empty());
}

#[test]
fn systemd_unit_template_parses() {
    need("systemd-analyze");
    let analyze = "systemd-analyze";
    let unit = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/mapfs@.service"),
    )
    .unwrap();
    // An instance of the template, pointing at this build's binary and an
    // existing settings file, as install.sh and an administrator would.
    let tmp = native_dir();
    let conf = tmp.path().join("conf");
    fs::write(
        &conf,
        "FS=passthrough\nBACKING=/tmp\nMAPFS_ARGS=--data auto\n",
    )
    .unwrap();
    let unit = unit
        .replace("/usr/local/bin/mapfs", mapfs_bin())
        .replace("/etc/mapfs/%i.conf", &conf.display().to_string());
    let path = tmp.path().join("mapfs@tmp.service");
    fs::write(&path, unit).unwrap();
    // The man page is installed by install.sh, not here: do not look it up.
    let out = run_captured(
        Command::new(analyze)
            .args(["verify", "--man=no"])
            .arg(&path),
    )
    .unwrap();
    // verify also reports unrelated units of the host; only lines naming
    // ours count.
    let ours: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("mapfs@"))
        .collect();
    assert!(
        ours.is_empty(),
        "systemd-analyze verify: {ours:#?}\n(all: {})",
        out.stderr
    );
}
