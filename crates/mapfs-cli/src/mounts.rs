//! The mount table (`/proc/self/mountinfo`) and per-mount runtime files.

use std::path::{Path, PathBuf};

use mapfs::control::{escape, unescape_mountinfo};

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// File system type (`fuse.mapfs` for ours).
    pub fstype: String,
    /// Mount source (`mapfs-passthrough:/backing` for ours).
    pub source: String,
}

/// The file system type of mapfs mounts made through fusermount3 (a root
/// daemon mounts directly and the kernel then reports plain `fuse`).
pub const MAPFS_FSTYPE: &str = "fuse.mapfs";

/// Prefix of the mount source of every mapfs mount (`mapfs-<fs>:<backing>`).
pub const MAPFS_SOURCE_PREFIX: &str = "mapfs-";

impl MountEntry {
    /// True for mounts served by a mapfs daemon.
    pub fn is_mapfs(&self) -> bool {
        (self.fstype == "fuse" || self.fstype == MAPFS_FSTYPE)
            && self.source.starts_with(MAPFS_SOURCE_PREFIX)
    }
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mountpoint = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let source = post.next().unwrap_or("");
            Some(MountEntry {
                mountpoint: PathBuf::from(unescape_mountinfo(mountpoint)),
                fstype: fstype.to_string(),
                source: unescape_mountinfo(source),
            })
        })
        .collect()
}

/// The current mount table.
pub fn mount_table() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The mount at exactly `path`, if any (the last one wins, as in the kernel).
pub fn mounted_at(path: &Path) -> Option<MountEntry> {
    mount_table()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path)
}

/// Directory for daemon logs and pid files.
pub fn runtime_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        PathBuf::from("/run/mapfs")
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("mapfs")
    } else {
        std::env::temp_dir().join(format!("mapfs-{}", rustix::process::geteuid().as_raw()))
    }
}

/// Log file of the daemon serving `mountpoint`.
pub fn log_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.log", escape(mountpoint)))
}

/// Pid file of the daemon serving `mountpoint`.
pub fn pid_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pid", escape(mountpoint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_escapes() {
        let t = "36 35 0:30 / /mnt/a\\040b rw,relatime shared:1 - fuse.mapfs mapfs-passthrough:/x rw,user_id=0\n\
                 22 1 8:1 / / rw - ext4 /dev/vda rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].fstype, MAPFS_FSTYPE);
        assert_eq!(m[0].source, "mapfs-passthrough:/x");
        assert_eq!(m[1].fstype, "ext4");
    }
}
