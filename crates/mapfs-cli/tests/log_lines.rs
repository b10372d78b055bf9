//! The daemon's log: one line per event whatever the names in it hold, and
//! readable by the mount's user alone (a root mount's log names other
//! users' files).

mod common;
mod preload_support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{fuse_or_skip, DataMode, MountSession};

/// A backing directory whose name holds a newline and what would read as
/// a line of its own: the line that logs it stays one well-formed line,
/// with the newline escaped; the log is 0600.
#[test]
fn a_name_with_a_newline_leaves_one_well_formed_line() {
    let test = "log lines";
    if !fuse_or_skip(test) {
        return;
    }
    let dir = common::native_dir();
    let backing = dir.path().join("b\nERROR mapfs forged-by-a-name\x1b[2K");
    fs::create_dir(&backing).unwrap();
    fs::set_permissions(&backing, fs::Permissions::from_mode(0o755)).unwrap();
    let s = MountSession::builder(common::mapfs_bin())
        .fs("passthrough")
        .data(DataMode::Auto)
        .backing(&backing)
        .option("allow_other")
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mounting: {e:#}"));
    let log = mapfs_cli::mounts::log_path(s.mountpoint());
    let mode = fs::metadata(&log).unwrap().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "{test}: {} is {mode:o}", log.display());
    let text = fs::read_to_string(&log).unwrap();
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("forged-by-a-name"))
        .collect();
    assert!(
        !named.is_empty(),
        "{test}: the backing is not in the log:\n{text}"
    );
    for l in &named {
        assert!(
            l.contains("b\\nERROR mapfs forged-by-a-name\\u{1b}[2K"),
            "{test}: a line holding the name, not escaped: {l:?}"
        );
    }
    assert!(
        !text.lines().any(|l| l.starts_with("ERROR mapfs forged")),
        "{test}: the name made a line of its own:\n{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "{test}: an escape sequence reached the log"
    );
}

/// A report file of the shim (`MAPFS_PRELOAD_REPORT`) that a program
/// makes is its own alone (it was 0666 less the umask: the files a program
/// used, for everyone to read).
#[test]
fn a_report_file_is_made_0600() {
    let test = "report file mode";
    if !fuse_or_skip(test) {
        return;
    }
    let s = MountSession::builder(common::mapfs_bin())
        .fs("passthrough")
        .data(DataMode::Auto)
        .mount()
        .unwrap_or_else(|e| panic!("{test}: mounting: {e:#}"));
    let report = s.scratch().unwrap().join("made-by-the-program.report");
    let _ = fs::remove_file(&report);
    let f = s.mountpoint().join("f");
    fs::write(&f, b"x").unwrap();
    preload_support::ok(preload_support::attached(&s, &report, "cat").arg(&f));
    let mode = fs::metadata(&report)
        .unwrap_or_else(|e| panic!("{test}: no report made: {e}"))
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{test}: the report is {mode:o}");
}
