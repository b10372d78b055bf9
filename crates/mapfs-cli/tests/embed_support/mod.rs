//! The set-up of the embedded-mode tests (`embed*.rs`): a backing
//! directory, a prefix and a native directory, and programs run under
//! `mapfs run --embed`. Each test file wraps [`Area`] with its file
//! system's own helpers.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use crate::common::{mapfs_bin, native_dir};

/// A test area: a backing directory and a prefix (inside the temp dir, so
/// it is unique, but never created on the host), and a native directory
/// for comparisons.
pub struct Area {
    _tmp: tempfile::TempDir,
    /// The backing directory (or store).
    pub backing: PathBuf,
    /// Where the embedded file system appears inside the job.
    pub prefix: PathBuf,
    /// A directory of the host's, for the same commands natively.
    pub native: PathBuf,
}

impl Area {
    /// A fresh area whose backing directory is named `backing`.
    pub fn new(backing: &str) -> Area {
        let tmp = native_dir();
        let backing = tmp.path().join(backing);
        let native = tmp.path().join("native");
        for d in [&backing, &native] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Area {
            prefix: tmp.path().join("embedded"),
            _tmp: tmp,
            backing,
            native,
        }
    }

    /// The temporary directory holding the area (for more of the test's
    /// own).
    pub fn dir(&self) -> &std::path::Path {
        self._tmp.path()
    }

    /// `FS:BACKING:PREFIX`, the argument of `--embed`.
    pub fn spec(&self, fs: &str) -> String {
        format!("{fs}:{}:{}", self.backing.display(), self.prefix.display())
    }

    /// `prog` under `mapfs run --embed FS:BACKING:PREFIX -o opts` (no
    /// `-o` when `opts` is empty), with no shim of the test's own.
    pub fn run_embedded(&self, fs: &str, opts: &str, prog: &str) -> Command {
        let mut c = Command::new(mapfs_bin());
        c.arg("run").arg("--embed").arg(self.spec(fs));
        if !opts.is_empty() {
            c.arg("-o").arg(opts);
        }
        c.arg("--")
            .arg(prog)
            .env_remove("LD_PRELOAD")
            .env_remove("MAPFS_EMBED");
        c
    }

    /// `name` under the prefix.
    pub fn at(&self, name: &str) -> String {
        self.prefix.join(name).display().to_string()
    }
}
