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
//! without it checks mode bits only; see docs/cli.md, Safety and consistency).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use mapfs::FileSystem;

use crate::adapter::{Adapter, AdapterOptions, Shared};
use crate::failover::records::ToSupervisor;
use crate::failover::{Link, Resume};

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
    "transport=uring",
    "transport=dev",
];

/// How the daemon takes requests from the kernel (`-o transport=`; see
/// `docs/transport.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it, else `/dev/fuse`.
    Uring,
    /// `/dev/fuse` alone.
    Dev,
}

impl Transport {
    /// Parses `uring` or `dev`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            other => Err(format!("unknown transport {other:?} (known: uring, dev)")),
        }
    }

    /// The transport [`TRANSPORT_ENV`] names for mounts without
    /// `-o transport=` (so that a test suite can run on either); `None`
    /// when unset.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(TRANSPORT_ENV) {
            Ok(v) if !v.is_empty() => Transport::parse(&v)
                .map(Some)
                .map_err(|e| format!("{TRANSPORT_ENV}: {e}")),
            _ => Ok(None),
        }
    }
}

/// The environment variable that gives the default transport (`uring` or
/// `dev`) of mounts without `-o transport=`.
pub const TRANSPORT_ENV: &str = "MAPFS_TRANSPORT";

/// The kernel's switch for FUSE over io_uring (off by default; root may
/// turn it on at any time, and it is read at each mount's `INIT`).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns [`ENABLE_URING`] on when it is off and this process may (root);
/// otherwise says why the kernel will not offer io_uring.
fn enable_uring() -> Result<(), String> {
    let now = std::fs::read_to_string(ENABLE_URING)
        .map_err(|e| format!("this kernel has no FUSE over io_uring ({ENABLE_URING}: {e})"))?;
    if now.trim() == "Y" {
        return Ok(());
    }
    match std::fs::write(ENABLE_URING, "Y") {
        Ok(()) => {
            tracing::info!("FUSE over io_uring turned on for this boot (Y > {ENABLE_URING})");
            Ok(())
        }
        Err(e) => Err(format!(
            "the kernel's FUSE over io_uring is off and this process cannot turn it on ({e}); \
             as root: echo Y > {ENABLE_URING}"
        )),
    }
}

/// Parsed `-o` options.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Options for the kernel.
    pub kernel: Vec<MountOption>,
    /// Who may use the mount.
    pub acl: SessionACL,
    /// How requests reach the daemon, if chosen (`-o transport=` or
    /// [`TRANSPORT_ENV`]); by default `/dev/fuse` (see [`mount`]).
    pub transport: Option<Transport>,
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
    let mut transport = None;
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
            t if t.starts_with("transport=") => {
                transport = Some(Transport::parse(&t["transport=".len()..])?);
                continue;
            }
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
    let transport = match transport {
        Some(t) => Some(t),
        None => Transport::from_env()?,
    };
    Ok(MountOptions {
        kernel,
        acl,
        transport,
    })
}

/// The mount type every mapfs mount shows in `/proc/self/mountinfo`: what
/// `mapfs list`, `mapfs run` and the preload shim recognise mounts by.
pub const FSTYPE: &str = "fuse.mapfs";

/// A mounted, initialised file system that is not yet serving requests.
pub struct Mounted {
    session: Session<Adapter>,
    shared: Arc<Shared>,
    mountpoint: PathBuf,
    /// A duplicate of the session's `/dev/fuse` descriptor (same
    /// connection), for the passthrough probe.
    dev: Option<OwnedFd>,
    /// True when we called mount(2) ourselves (root): fuser then knows of no
    /// mount and we unmount it; otherwise fuser's own unmounter does.
    own_mount: bool,
    /// Took over a live connection: ask for a resend before serving.
    resumed: bool,
}

/// Mounts `fs` at `mountpoint`. Returns once the kernel has completed the
/// FUSE handshake, so the mount is usable as soon as [`Mounted::run`] starts.
///
/// The mount's type is [`FSTYPE`] and its source the backing directory (as
/// `findmnt` shows it), for root mounts too: fuser mounts those as plain
/// `fuse` (it keeps the subtype for fusermount3 only), so as root we call
/// mount(2) ourselves and hand the descriptor to fuser. `fs_name` is the
/// file system's name.
///
/// With a supervisor's `link` (see [`crate::failover`]), the connection and
/// every change the kernel is told of go to the supervisor too.
pub fn mount(
    fs: Arc<dyn FileSystem>,
    fs_name: &str,
    backing: &Path,
    mountpoint: &Path,
    adapter: AdapterOptions,
    opts: &MountOptions,
    link: Option<Arc<Link>>,
) -> io::Result<Mounted> {
    let source = backing.to_string_lossy();
    tracing::debug!(fs = fs_name, backing = %source, "mounting on {}", mountpoint.display());
    let adapter = Adapter::new(fs, adapter).map_err(io::Error::from)?;
    let shared = adapter.shared();
    shared.describe(fs_name, backing);
    shared.set_mountpoint(mountpoint);
    let mut cfg = session_config(opts, &source, link.is_some());
    let mut uring_off = None;
    match opts.transport {
        Some(Transport::Dev) => cfg.io_uring = false,
        // A mount keeps /dev/fuse unless io_uring is asked for. A queue
        // serves its CPU's requests one at a time, so one slow call (a
        // pack transaction, a network store's unlink) holds back every
        // request of that CPU, where /dev/fuse's threads serve others
        // meanwhile. And at a daemon's death the kernel fails the requests
        // it was handing to the ring (ECANCELED) and never sends again
        // those the daemon had taken from it, so a failover could not go
        // unseen.
        None => {
            cfg.io_uring = false;
            uring_off = Some(
                "io_uring is chosen with -o transport=uring (its queues serve one request at \
                 a time per CPU, and a successor cannot take over its requests; \
                 docs/transport.md)"
                    .to_string(),
            );
        }
        Some(Transport::Uring) => {
            cfg.io_uring = true;
            if let Err(why) = enable_uring() {
                cfg.io_uring = false;
                uring_off = Some(why);
            }
        }
    }
    let (session, dev, own_mount) = match mount_as_root(&source, mountpoint, opts)? {
        Some(fd) => {
            let dev = fd.try_clone().ok();
            match Session::from_fd(adapter, fd, opts.acl, cfg) {
                Ok(s) => (s, dev, true),
                Err(e) => {
                    let _ = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH);
                    return Err(e);
                }
            }
        }
        None => {
            let s = Session::new(adapter, mountpoint, &cfg)?;
            let dev = s.as_fd().try_clone_to_owned().ok();
            (s, dev, false)
        }
    };
    shared.set_notifier(session.notifier());
    shared.set_transport(session.transport_counters());
    if let Some(why) = uring_off.as_deref().or(session.uring_unavailable()) {
        tracing::info!("transport: /dev/fuse, not io_uring: {why}");
    }
    if let Some(link) = link {
        let Some(dev) = &dev else {
            return Err(io::Error::other(
                "no /dev/fuse descriptor to hand the supervisor",
            ));
        };
        shared.set_link(link.clone());
        let mut init = shared.init_state();
        init.uring = session.uring().map(|u| (u.payload as u64, u.depth));
        link.send_with(&ToSupervisor::Mounted(init), &[dev.as_fd()]);
    }
    Ok(Mounted {
        session,
        shared,
        mountpoint: mountpoint.to_path_buf(),
        dev,
        own_mount,
        resumed: false,
    })
}

/// Takes over the live connection of a daemon that died (see
/// [`crate::failover`]): no mount, no handshake; the state comes from the
/// supervisor, and [`Mounted::run`] asks the kernel to send again the
/// requests the dead daemon had not answered. `link` is the supervisor and
/// `state` what it saved.
pub fn resume(
    fs: Arc<dyn FileSystem>,
    fs_name: &str,
    backing: &Path,
    mountpoint: &Path,
    adapter: AdapterOptions,
    opts: &MountOptions,
    (link, mut state): (Arc<Link>, Resume),
) -> io::Result<Mounted> {
    let source = backing.to_string_lossy();
    let adapter = Adapter::new(fs, adapter).map_err(io::Error::from)?;
    let shared = adapter.shared();
    shared.describe(fs_name, backing);
    shared.set_mountpoint(mountpoint);
    let cfg = session_config(opts, &source, true);
    let dev = state.dev.try_clone()?;
    let fd = state.dev.try_clone()?;
    let mut session = Session::resume_from_fd(adapter, fd, opts.acl, cfg)?;
    // The kernel sends every request of a connection that negotiated
    // io_uring to its ring, whatever the transport asked now.
    session.set_uring(state.init.uring.map(|(payload, depth)| fuser::UringParams {
        payload: payload as usize,
        depth,
    }));
    shared.resume(&mut state, |id| session.backing_id_from_raw(id));
    shared.set_notifier(session.notifier());
    shared.set_transport(session.transport_counters());
    shared.set_link(link);
    Ok(Mounted {
        session,
        shared,
        mountpoint: mountpoint.to_path_buf(),
        dev: Some(dev),
        own_mount: true,
        resumed: true,
    })
}

/// fuser's configuration for a mount with `opts`. Supervised sessions read
/// one shared descriptor: requests read through a cloned descriptor die
/// with it (the kernel ends them when the clone closes), while those read
/// through the supervisor's descriptor wait for a resend.
fn session_config(opts: &MountOptions, source: &str, supervised: bool) -> Config {
    let mut cfg = Config::default();
    cfg.mount_options = opts.kernel.clone();
    // Also for options not made by `parse_options` (see the module docs).
    if !cfg.mount_options.contains(&MountOption::DefaultPermissions) {
        cfg.mount_options.push(MountOption::DefaultPermissions);
    }
    cfg.mount_options
        .push(MountOption::FSName(source.to_string()));
    cfg.mount_options.push(MountOption::Subtype("mapfs".into()));
    cfg.acl = opts.acl;
    // One event loop per core, each with its own /dev/fuse clone.
    cfg.n_threads = Some(
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2),
    );
    cfg.clone_fd = !supervised;
    cfg
}

/// As root, mounts a `fuse.mapfs` file system on `mountpoint` with mount(2)
/// and returns its `/dev/fuse` descriptor; `None` when not root or when the
/// kernel refuses (EPERM in a user namespace), so fusermount3 is tried.
fn mount_as_root(
    source: &str,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<Option<OwnedFd>> {
    use rustix::fs::{Mode, OFlags};
    use rustix::mount::MountFlags;
    if !rustix::process::geteuid().is_root() {
        return Ok(None);
    }
    let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let root_mode = rustix::fs::stat(mountpoint)?.st_mode & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        root_mode,
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    // Always (see the module docs): the kernel sends no request for the
    // open of a special file, so only its own check can hold the mode bits.
    data.push_str(",default_permissions");
    if opts.acl != SessionACL::Owner {
        // The kernel knows only allow_other; fuser enforces allow_root.
        data.push_str(",allow_other");
    }
    // Like fusermount3: nodev and nosuid unless asked for.
    let mut flags = MountFlags::empty();
    let has = |o: MountOption| opts.kernel.contains(&o);
    if !has(MountOption::Dev) {
        flags |= MountFlags::NODEV;
    }
    if !has(MountOption::Suid) {
        flags |= MountFlags::NOSUID;
    }
    for (o, f) in [
        (MountOption::RO, MountFlags::RDONLY),
        (MountOption::NoExec, MountFlags::NOEXEC),
        (MountOption::NoAtime, MountFlags::NOATIME),
        (MountOption::Sync, MountFlags::SYNCHRONOUS),
        (MountOption::DirSync, MountFlags::DIRSYNC),
        (MountOption::NoDev, MountFlags::NODEV),
        (MountOption::NoSuid, MountFlags::NOSUID),
    ] {
        if has(o) {
            flags |= f;
        }
    }
    let data = std::ffi::CString::new(data).map_err(|_| io::ErrorKind::InvalidInput)?;
    match rustix::mount::mount(source, mountpoint, FSTYPE, flags, data.as_c_str()) {
        Ok(()) => Ok(Some(dev)),
        Err(rustix::io::Errno::PERM) => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("mount(2) of {} failed: {e}", mountpoint.display()),
        )),
    }
}

/// Unmounts a mount served by this process, from another thread (the signal
/// handler) while [`Mounted::run`] serves it.
pub struct Unmounter {
    mountpoint: PathBuf,
    fuser: Option<SessionUnmounter>,
}

impl Unmounter {
    /// Detaches the mount; [`Mounted::run`] then returns once the kernel has
    /// closed the connection. Going through fuser's own unmounter where fuser
    /// made the mount keeps it from trying again (and failing) on exit.
    pub fn unmount(&mut self) -> io::Result<()> {
        match &mut self.fuser {
            Some(u) => u.unmount(),
            None => rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH)
                .map_err(io::Error::from),
        }
    }
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

    /// A handle that unmounts this mount from another thread.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter {
            mountpoint: self.mountpoint.clone(),
            fuser: (!self.own_mount).then(|| self.session.unmount_callable()),
        }
    }

    /// Whether the kernel accepts backing files on this connection, i.e.
    /// kernel passthrough is really in use (negotiated at the handshake, and
    /// this process has the privilege to register backing files). Asked
    /// once, by registering and dropping a scratch memfd.
    pub fn passthrough_works(&self) -> bool {
        let Some(dev) = &self.dev else {
            return false;
        };
        let Ok(probe) = rustix::fs::memfd_create("mapfs-probe", rustix::fs::MemfdFlags::CLOEXEC)
        else {
            return false;
        };
        match backing_open(dev.as_fd(), probe.as_fd()) {
            Ok(id) => {
                let _ = backing_close(dev.as_fd(), id);
                true
            }
            Err(_) => false,
        }
    }

    /// Serves requests until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        if self.resumed {
            // Queued before the workers start; they read them first.
            if let Err(e) = self.session.notifier().resend() {
                tracing::warn!(
                    "the kernel refused to resend the requests the previous daemon had not \
                     answered ({e}); their callers wait until they are interrupted"
                );
            }
        }
        self.shared.journal_serving();
        if self.resumed && self.session.uring().is_some() {
            kick_queues(self.session.transport_counters(), self.mountpoint.clone());
        }
        self.session.run()
    }
}

/// After a takeover of a connection served over io_uring: the requests the
/// kernel queued while no entry was registered wait for the next request on
/// their queue (a new entry takes only requests that come after it), so
/// once the entries are registered, one `statfs` from each CPU starts every
/// queue. (The requests the dead daemon had taken from its ring and not
/// answered are another matter: see docs/transport.md.)
fn kick_queues(counters: Arc<fuser::TransportCounters>, mountpoint: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("mapfs-kick".into())
        .spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !counters
                .uring_active
                .load(std::sync::atomic::Ordering::Acquire)
            {
                if std::time::Instant::now() > deadline {
                    tracing::warn!("io_uring queues not registered after a takeover");
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            for cpu in 0..cpus {
                let mut set = rustix::thread::CpuSet::new();
                set.set(cpu);
                if rustix::thread::sched_setaffinity(None, &set).is_ok() {
                    let _ = rustix::fs::statfs(&mountpoint);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the queue kick after a takeover: {e}");
    }
}

/// `struct fuse_backing_map` of `<linux/fuse.h>`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)`.
const BACKING_OPEN: libc::c_ulong = ioc_write(1, std::mem::size_of::<BackingMap>());
/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const BACKING_CLOSE: libc::c_ulong = ioc_write(2, std::mem::size_of::<u32>());

/// `_IOW(FUSE_DEV_IOC_MAGIC, nr, size)` on the generic ioctl encoding.
const fn ioc_write(nr: u64, size: usize) -> libc::c_ulong {
    ((1u64 << 30) | ((size as u64) << 16) | (229 << 8) | nr) as libc::c_ulong
}

/// Registers `file` as a backing file of the connection; its id.
fn backing_open(dev: BorrowedFd<'_>, file: BorrowedFd<'_>) -> io::Result<i32> {
    let map = BackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the kernel reads one `struct fuse_backing_map`, which
    // `BackingMap` lays out exactly, through a pointer valid for the call.
    let id = unsafe { libc::ioctl(dev.as_raw_fd(), BACKING_OPEN as _, &map) };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// Drops backing file `id` of the connection.
fn backing_close(dev: BorrowedFd<'_>, id: i32) -> io::Result<()> {
    let id = id as u32;
    // SAFETY: the kernel reads one `u32` through a pointer valid for the call.
    if unsafe { libc::ioctl(dev.as_raw_fd(), BACKING_CLOSE as _, &id) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
        let o = parse_options(&["ro,transport=dev".into()]).unwrap();
        assert_eq!(o.transport, Some(Transport::Dev));
        let o = parse_options(&["transport=uring".into()]).unwrap();
        assert_eq!(o.transport, Some(Transport::Uring));
        let e = parse_options(&["transport=tcp".into()]).unwrap_err();
        assert!(e.contains("tcp") && e.contains("uring"), "{e}");
    }
}
