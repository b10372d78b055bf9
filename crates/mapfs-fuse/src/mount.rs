//! Mounting: option parsing, the multi-threaded session, serving until the
//! file system is unmounted.
//!
//! # Permission checks
//!
//! Every mount has `default_permissions`, given or not.
//!
//! The kernel sends no FUSE request when a FIFO, socket or device node is
//! opened (or a socket connected): the inode's operations are the pipe's,
//! the socket layer's or the driver's, so the daemon never sees the call.
//! Without `default_permissions`, `fuse_permission` checks nothing for such
//! files (only `access`/`chdir` and exec of regular files reach the daemon),
//! so their mode bits would not hold: any user of an `allow_other` mount
//! could open another user's `0600` FIFO, or a `0660 root:disk` block device
//! on a mount with `dev`. There is no per-inode way to ask the kernel for a
//! check, so the kernel checks every inode (`generic_permission` on its
//! cached attributes, refreshed when the attribute TTL expired and once more
//! before it denies), and the daemon still performs every backing operation
//! as the caller: a call must pass both checks, which only adds checks to
//! the configuration without it. The adapter also asks for `FUSE_POSIX_ACL`
//! so that the kernel's check honours POSIX ACLs as the backing file system
//! would (the kernel then turns `default_permissions` on by itself; a kernel
//! without it checks mode bits only; see the README's Safety section).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, Session, SessionACL};
use mapfs::FileSystem;

use crate::adapter::{Adapter, AdapterOptions, Shared};

/// The kernel options `mapfs mount -o` accepts.
pub const KNOWN_OPTIONS: &[&str] = &[
    "allow_other",
    "allow_root",
    "default_permissions",
    "ro",
    "rw",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "sync",
    "async",
    "dirsync",
];

/// Parsed `-o` options.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Options for the kernel.
    pub kernel: Vec<MountOption>,
    /// Who may use the mount.
    pub acl: SessionACL,
}

impl MountOptions {
    /// True when users other than the owner may use the mount while the
    /// kernel does no permission checks of its own (no `default_permissions`):
    /// cached names would then skip directory search checks, so the adapter
    /// must not cache names. Never for options from [`parse_options`], which
    /// always include `default_permissions`.
    pub fn needs_uncached_names(&self) -> bool {
        self.acl != SessionACL::Owner && !self.kernel.contains(&MountOption::DefaultPermissions)
    }
}

/// Parses a comma-separated option list (several `-o` may be given); an
/// unknown option is an error naming it. `default_permissions` is always
/// among the kernel options (see the module docs).
pub fn parse_options(opts: &[String]) -> Result<MountOptions, String> {
    let mut kernel = Vec::new();
    let mut acl = SessionACL::Owner;
    for opt in opts
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let o = match opt {
            "allow_other" => {
                acl = SessionACL::All;
                continue;
            }
            "allow_root" => {
                acl = SessionACL::RootAndOwner;
                continue;
            }
            "default_permissions" => MountOption::DefaultPermissions,
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => {
                return Err(format!(
                    "unknown mount option {other:?} (known: {})",
                    KNOWN_OPTIONS.join(", ")
                ))
            }
        };
        kernel.push(o);
    }
    // Always: see the module docs, Permission checks.
    if !kernel.contains(&MountOption::DefaultPermissions) {
        kernel.push(MountOption::DefaultPermissions);
    }
    Ok(MountOptions { kernel, acl })
}

/// A mounted, initialised file system that is not yet serving requests.
pub struct Mounted {
    session: Session<Adapter>,
    shared: Arc<Shared>,
    mountpoint: PathBuf,
}

/// Mounts `fs` at `mountpoint`. Returns once the kernel has completed the
/// FUSE handshake, so the mount is usable as soon as [`Mounted::run`] starts.
pub fn mount(
    fs: Arc<dyn FileSystem>,
    fs_name: &str,
    backing: &Path,
    mountpoint: &Path,
    adapter: AdapterOptions,
    opts: &MountOptions,
) -> io::Result<Mounted> {
    let adapter = Adapter::new(fs, adapter).map_err(io::Error::from)?;
    let shared = adapter.shared();
    shared.describe(fs_name, backing);
    let mut cfg = Config::default();
    cfg.mount_options = opts.kernel.clone();
    // Also for options not made by `parse_options` (see the module docs).
    if !cfg.mount_options.contains(&MountOption::DefaultPermissions) {
        cfg.mount_options.push(MountOption::DefaultPermissions);
    }
    cfg.mount_options.push(MountOption::FSName(format!(
        "mapfs-{fs_name}:{}",
        backing.display()
    )));
    cfg.mount_options.push(MountOption::Subtype("mapfs".into()));
    cfg.acl = opts.acl;
    // One event loop per core, each with its own /dev/fuse clone.
    cfg.n_threads = Some(
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2),
    );
    cfg.clone_fd = true;
    let session = Session::new(adapter, mountpoint, &cfg)?;
    shared.set_notifier(session.notifier());
    Ok(Mounted {
        session,
        shared,
        mountpoint: mountpoint.to_path_buf(),
    })
}

impl Mounted {
    /// State shared with the control socket.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Serves requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_reject_unknown() {
        let o = parse_options(&["allow_other,ro".into(), "default_permissions".into()]).unwrap();
        assert_eq!(o.acl, SessionACL::All);
        assert!(o.kernel.contains(&MountOption::RO));
        assert!(o.kernel.contains(&MountOption::DefaultPermissions));
        let e = parse_options(&["bogus".into()]).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }
}
