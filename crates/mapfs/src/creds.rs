//! Acting as the caller: on this thread only, switch the file-system uid,
//! gid and supplementary groups to the caller's, so the backing kernel checks
//! permissions and sets ownership exactly as it would for the caller.
//!
//! Per-thread only: `setfsuid`/`setfsgid` are per-thread system calls, and the
//! groups are set with the raw `setgroups` syscall
//! ([`rustix::thread::set_thread_groups`]), not glibc's `setgroups()`, which
//! broadcasts to every thread of the process.
//!
//! Capabilities: changing the fsuid away from 0 only drops the file-system
//! capabilities (`CAP_CHOWN`, `CAP_DAC_*`, `CAP_FOWNER`, `CAP_FSETID`...).
//! A root daemon would still hold `CAP_MKNOD`, `CAP_SYS_ADMIN` (`trusted.*`
//! xattrs), `CAP_SETFCAP` and friends, which an unprivileged caller does not
//! have. So for a non-root caller the thread's *effective* capability set is
//! emptied too (the permitted set is kept, so it can be restored).
//!
//! Side effect worth knowing: the first fsuid change makes the process
//! non-dumpable (kernel rule for credential changes), so the daemon does not
//! write core dumps once it has served a non-root caller.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::process::Gid;
use rustix::thread::{CapabilitySet, CapabilitySets};

use crate::error::{Error, Result};
use crate::fs::Ctx;

/// How long the supplementary groups read for a pid are reused.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Cache bound: past it, the cache is simply emptied.
const GROUPS_CACHE_MAX: usize = 1024;

/// What the daemon thread runs as when not impersonating.
struct DaemonCreds {
    /// Supplementary groups of the daemon (restored after each call).
    groups: Vec<Gid>,
    /// The capability sets of the daemon (effective restored after each call).
    caps: Option<CapabilitySets>,
}

/// `Some` when the daemon is root and impersonation applies.
fn daemon() -> Option<&'static DaemonCreds> {
    static D: OnceLock<Option<DaemonCreds>> = OnceLock::new();
    D.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        Some(DaemonCreds {
            groups: rustix::process::getgroups().unwrap_or_default(),
            caps: rustix::thread::capabilities(None).ok(),
        })
    })
    .as_ref()
}

/// Runs `f` with this thread's fsuid/fsgid/groups set to `ctx`'s, restoring
/// them afterwards. When the daemon is not root, or the caller is the daemon's
/// own uid, `f` runs unchanged.
///
/// A root caller (`uid == 0`) keeps the daemon's capabilities; only its gid
/// and groups are adopted when its gid is not 0, so new files get its group.
pub fn as_caller<T>(ctx: &Ctx, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if ctx.uid == 0 && ctx.gid == 0 {
        return f();
    }
    let Some(d) = daemon() else {
        return f();
    };
    let groups = caller_groups(ctx);
    let _guard = Switched::enter(ctx, &groups, d)?;
    f()
}

/// True when the caller belongs to group `gid` (its own gid or one of its
/// supplementary groups), as the kernel's `in_group_p` would say.
pub fn in_group(ctx: &Ctx, gid: u32) -> bool {
    ctx.gid == gid || caller_groups(ctx).iter().any(|g| g.as_raw() == gid)
}

/// Restores the daemon's credentials on drop, so a failing or panicking `f`
/// never leaves the thread impersonating.
struct Switched {
    daemon: &'static DaemonCreds,
    dropped_caps: bool,
}

impl Switched {
    fn enter(ctx: &Ctx, groups: &[Gid], daemon: &'static DaemonCreds) -> Result<Self> {
        // From here on, Drop restores whatever was partially changed.
        let mut guard = Switched {
            daemon,
            dropped_caps: false,
        };
        rustix::thread::set_thread_groups(groups)
            .map_err(|e| Error::from(e).context("setgroups for caller"))?;
        set_fsgid(ctx.gid)?;
        if ctx.uid != 0 {
            set_fsuid(ctx.uid)?;
            if let Some(caps) = daemon.caps {
                rustix::thread::set_capabilities(
                    None,
                    CapabilitySets {
                        effective: CapabilitySet::empty(),
                        ..caps
                    },
                )
                .map_err(|e| Error::from(e).context("dropping capabilities for caller"))?;
                guard.dropped_caps = true;
            }
        }
        Ok(guard)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // Capabilities first: setgroups needs CAP_SETGID back.
        if self.dropped_caps {
            if let Some(caps) = self.daemon.caps {
                if let Err(e) = rustix::thread::set_capabilities(None, caps) {
                    restore_failed("capset", e);
                }
            }
        }
        if set_fsuid(0).is_err() {
            restore_failed("setfsuid", rustix::io::Errno::PERM);
        }
        if set_fsgid(0).is_err() {
            restore_failed("setfsgid", rustix::io::Errno::PERM);
        }
        if let Err(e) = rustix::thread::set_thread_groups(&self.daemon.groups) {
            restore_failed("setgroups", e);
        }
    }
}

/// A daemon thread stuck with a caller's identity would serve the next
/// request with the wrong rights: unrecoverable, so stop the process.
fn restore_failed(what: &str, e: rustix::io::Errno) -> ! {
    tracing::error!("cannot restore daemon credentials ({what}: {e}); aborting");
    std::process::abort()
}

fn set_fsuid(uid: u32) -> Result<()> {
    // SAFETY: setfsuid has no memory effects; glibc's wrapper is a plain
    // per-thread syscall (not broadcast like setuid).
    unsafe { libc::setfsuid(uid) };
    // setfsuid reports no error; an invalid id (-1) always fails and returns
    // the current fsuid, which tells whether the switch took.
    // SAFETY: as above.
    let now = unsafe { libc::setfsuid(u32::MAX) } as u32;
    if now == uid {
        Ok(())
    } else {
        Err(Error::from_errno(libc::EPERM).context(format!("setfsuid({uid}) did not take")))
    }
}

fn set_fsgid(gid: u32) -> Result<()> {
    // SAFETY: see set_fsuid.
    unsafe { libc::setfsgid(gid) };
    // SAFETY: see set_fsuid.
    let now = unsafe { libc::setfsgid(u32::MAX) } as u32;
    if now == gid {
        Ok(())
    } else {
        Err(Error::from_errno(libc::EPERM).context(format!("setfsgid({gid}) did not take")))
    }
}

/// The caller's supplementary groups: from `/proc/<pid>/status` while the pid
/// still belongs to a process with the caller's fsuid, else just its gid.
fn caller_groups(ctx: &Ctx) -> Vec<Gid> {
    type Cache = Mutex<HashMap<(u32, u32, u32), (Instant, Vec<Gid>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let only_gid = || vec![Gid::from_raw(ctx.gid)];
    if ctx.pid == 0 {
        return only_gid();
    }
    let key = (ctx.pid, ctx.uid, ctx.gid);
    let cache = CACHE.get_or_init(Default::default);
    if let Some((t, g)) = cache.lock().get(&key) {
        if t.elapsed() < GROUPS_TTL {
            return g.clone();
        }
    }
    let groups = match std::fs::read_to_string(format!("/proc/{}/status", ctx.pid)) {
        Ok(s) => parse_status_groups(&s, ctx.uid).unwrap_or_else(only_gid),
        Err(_) => only_gid(),
    };
    let mut c = cache.lock();
    if c.len() >= GROUPS_CACHE_MAX {
        c.clear();
    }
    c.insert(key, (Instant::now(), groups.clone()));
    groups
}

/// The `Groups:` of a `/proc/<pid>/status`, if its fsuid (4th `Uid:` field)
/// is `uid` (otherwise the pid was reused by someone else).
fn parse_status_groups(status: &str, uid: u32) -> Option<Vec<Gid>> {
    let mut fsuid = None;
    let mut groups = None;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            fsuid = rest
                .split_whitespace()
                .nth(3)
                .and_then(|s| s.parse::<u32>().ok());
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = Some(
                rest.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok())
                    .map(Gid::from_raw)
                    .collect::<Vec<_>>(),
            );
        }
    }
    if fsuid? != uid {
        return None;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

    fn thread_fs_ids() -> (u32, u32) {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let field = |p: &str| -> u32 {
            let l = s.lines().find(|l| l.starts_with(p)).unwrap();
            l.split_whitespace().nth(4).unwrap().parse().unwrap()
        };
        (field("Uid:"), field("Gid:"))
    }

    #[test]
    fn parses_groups_and_checks_fsuid() {
        let st = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 24 100 \n";
        let g = parse_status_groups(st, 1000).unwrap();
        assert_eq!(
            g,
            vec![Gid::from_raw(4), Gid::from_raw(24), Gid::from_raw(100)]
        );
        assert!(parse_status_groups(st, 1001).is_none());
        let empty = "Uid:\t5\t5\t5\t5\nGroups:\t\n";
        assert_eq!(parse_status_groups(empty, 5).unwrap(), vec![]);
    }

    #[test]
    fn non_root_caller_is_checked_and_owns_new_files() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED non_root_caller_is_checked_and_owns_new_files: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&secret)
            .unwrap();
        let made = dir.path().join("made");
        let d = dir.path().to_path_buf();
        let t = std::thread::spawn(move || {
            let ctx = Ctx {
                uid: 65534,
                gid: 65534,
                pid: 0,
            };
            let denied = as_caller(&ctx, || {
                assert_eq!(thread_fs_ids(), (65534, 65534));
                Ok(std::fs::File::open(&secret).map(|_| ()))
            })
            .unwrap();
            assert_eq!(denied.unwrap_err().raw_os_error(), Some(libc::EACCES));
            as_caller(&ctx, || Ok(std::fs::File::create(&made)?)).unwrap();
            // An error from f still restores.
            let e = as_caller(&ctx, || -> Result<()> { Err(Error::io()) }).unwrap_err();
            assert_eq!(e.errno(), libc::EIO);
            assert_eq!(thread_fs_ids(), (0, 0));
            // Root again: the 0600 file opens.
            std::fs::File::open(&secret).unwrap();
            let caps = rustix::thread::capabilities(None).unwrap();
            assert_eq!(caps, daemon().unwrap().caps.unwrap());
            assert_eq!(
                rustix::process::getgroups().unwrap(),
                daemon().unwrap().groups
            );
        });
        t.join().unwrap();
        let md = std::fs::metadata(d.join("made")).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534));
        // Other threads were never affected.
        assert_eq!(thread_fs_ids(), (0, 0));
    }

    #[test]
    fn supplementary_groups_of_caller_apply() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED supplementary_groups_of_caller_apply: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("grp");
        std::fs::write(&f, b"x").unwrap();
        rustix::fs::chown(&f, None, Some(Gid::from_raw(4242))).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // This process's groups are the daemon's; the thread gets [gid] only
        // (pid 0), then a caller whose status says it is in 4242 would pass.
        let d = f.clone();
        std::thread::spawn(move || {
            let ctx = Ctx {
                uid: 65534,
                gid: 65534,
                pid: 0,
            };
            let r = as_caller(&ctx, || Ok(std::fs::read(&d).map(|_| ()))).unwrap();
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EACCES));
            let ctx_g = Ctx {
                uid: 65534,
                gid: 4242,
                pid: 0,
            };
            as_caller(&ctx_g, || Ok(std::fs::read(&d)?)).unwrap();
        })
        .join()
        .unwrap();
    }
}
