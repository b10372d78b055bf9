//! The per-process report file of the preloaded libraries (the shim and
//! the embedding library): `MAPFS_PRELOAD_REPORT=<path>` makes each process
//! append one JSON line there when it ends.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

/// The variable naming the report file.
pub const REPORT_ENV: &str = "MAPFS_PRELOAD_REPORT";

/// Whether a report is asked for.
pub fn wanted() -> bool {
    std::env::var_os(REPORT_ENV).is_some_and(|p| !p.is_empty())
}

/// Appends `line` and a newline to the report file, if one is asked for.
pub fn append(line: &str) {
    let Some(path) = std::env::var_os(REPORT_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let line = format!("{line}\n");
    // Made readable by its maker alone (it names the files a program
    // used); a file that exists keeps its mode.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
    {
        // One write of one line: concurrent processes do not interleave.
        let _ = f.write_all(line.as_bytes());
    }
}
