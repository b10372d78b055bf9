//! `mapfs run`: runs a program with the preload shim attached to mapfs
//! mounts, so its reads and writes on them skip the FUSE daemon.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::embed_spec::{self, Embedding};
use crate::mounts;
use crate::registry::Registry;

/// Device numbers of the mounts of `MAPFS_MOUNTS`, for the shim
/// (`mapfs_preload::mounts::MOUNT_DEVS_ENV`).
const MOUNT_DEVS_ENV: &str = "MAPFS_MOUNT_DEVS";

/// File name of the shim, built next to the `mapfs` binary.
const SHIM: &str = "libmapfs_preload.so";

pub use mapfs_registry::{EMBED_FULL_LIB, EMBED_LIB};

/// Arguments of `mapfs run`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
      mapfs run -- cp /mnt/data/big /mnt/data/big.copy\n  \
      mapfs run --mount /mnt/data -- python3 train.py\n  \
      mapfs run --embed passthrough:/srv/data:/data -- python3 train.py   # no mount, no daemon\n  \
      mapfs run --embed versions:/srv/work:/work -o keep=20 -- make   # every overwrite kept\n  \
      MAPFS_PRELOAD_REPORT=/tmp/r.json mapfs run -- fio job.fio   # what was served natively\n\n\
      Environment of the shim:\n  \
      MAPFS_PRELOAD_REPORT=FILE       append a JSON summary line per process at exit\n  \
      MAPFS_PRELOAD_LOG=1             diagnostics on stderr\n  \
      MAPFS_PRELOAD_ADOPT_CALLS=N     adopt a file at its Nth data call (default 16)\n  \
      MAPFS_PRELOAD_ADOPT_BYTES=N     ...or after a slow call moving N bytes (default 1048576)\n\n\
      Programs making raw system calls (static or Go binaries) are not sped up;\n\
      their files still work through the mount.")]
pub struct RunArgs {
    /// Attach to this mapfs mount (repeatable); default: every mapfs mount
    /// (none with --embed).
    #[arg(long = "mount", value_name = "MOUNTPOINT")]
    pub mounts: Vec<PathBuf>,
    /// Serve file system FS over BACKING under PREFIX inside every process
    /// of the command: no mount, no daemon, no privilege (repeatable; see
    /// docs/embedded.md). FS: passthrough, plfs, pack or versions. PREFIX need
    /// not exist. FS:BACKING:PREFIX:exclusive declares that no process
    /// outside the command changes BACKING's directories (as a mount's
    /// --exclusive): passthrough's processes then keep the directories
    /// they resolved, checked against a generation all of them share,
    /// for faster stat, create and unlink below the top level.
    #[arg(long = "embed", value_name = "FS:BACKING:PREFIX[:exclusive]")]
    pub embed: Vec<String>,
    /// Serve an --embed PREFIX even where the host has a non-empty
    /// directory or a file: the program then sees the embedded file system
    /// there, never the host's files (refused without this).
    #[arg(long = "embed-over")]
    pub embed_over: bool,
    /// Options of the embedded file systems (`name` or `name=value`,
    /// comma-separated or repeated); each file system gets those it declares.
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',')]
    pub options: Vec<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Replaces this process with the command, `LD_PRELOAD` and `MAPFS_MOUNTS`
/// set; returns only if it cannot be started.
pub fn run(registry: &Registry, args: RunArgs) -> Result<()> {
    let embedded = embeddings(registry, &args)?;
    let table = mounts::mount_table();
    // With --embed, only the mounts named with --mount are attached.
    let chosen: Vec<PathBuf> = if args.mounts.is_empty() && embedded.is_some() {
        Vec::new()
    } else if args.mounts.is_empty() {
        table
            .iter()
            .filter(|m| m.is_mapfs())
            .map(|m| m.mountpoint.clone())
            .collect()
    } else {
        let mut v = Vec::new();
        for m in &args.mounts {
            let canon =
                std::fs::canonicalize(m).with_context(|| format!("--mount {}", m.display()))?;
            if !table.iter().any(|e| e.mountpoint == canon && e.is_mapfs()) {
                bail!("{} is not a mapfs mount", canon.display());
            }
            v.push(canon);
        }
        v
    };
    // The mounts' device numbers: the shim then needs no look at
    // /proc/self/mountinfo in each process (see mapfs_preload::mounts). A
    // mount that cannot be stat'ed (a daemon gone without an unmount:
    // ENOTCONN, EIO) serves no file, so it is left out rather than cost
    // every process of the job the mount table (measured: one such stale
    // mount on the machine made `spawn-read` under the shim 0.57x the
    // mount without it).
    // Mounts the user did not name are the program's business only if it
    // touches them (the shim connects to a mount at its first open there):
    // nothing is said of them, so a program's stderr carries no line about
    // other users' or other jobs' mounts.
    let named = !args.mounts.is_empty();
    let mut chosen_devs = Vec::new();
    let mut devs = Vec::new();
    for m in chosen {
        match std::fs::metadata(&m) {
            Ok(st) => {
                devs.push(std::os::unix::fs::MetadataExt::dev(&st).to_string());
                chosen_devs.push(m);
            }
            Err(e) if named => eprintln!("mapfs run: not attaching to {} ({e})", m.display()),
            Err(_) => {}
        }
    }
    let chosen = chosen_devs;
    if chosen.is_empty() && embedded.is_none() {
        eprintln!("mapfs run: no mapfs mount found; running the command without attaching");
    }
    if let Some(bad) = chosen
        .iter()
        .find(|m| m.as_os_str().as_encoded_bytes().contains(&b':'))
    {
        bail!(
            "mountpoint {} contains ':', which MAPFS_MOUNTS cannot carry",
            bad.display()
        );
    }
    let joined = std::env::join_paths(&chosen).context("joining mountpoints")?;
    for m in chosen.iter().filter(|m| named && uses_writeback_cache(m)) {
        eprintln!(
            "mapfs run: {} is a --data daemon mount with the kernel writeback cache on: the \
             kernel would keep stale sizes of files written natively, so its files stay on the \
             mount (remount with --writeback-cache off, or --data passthrough, for the fast path)",
            m.display()
        );
    }

    // The embedded library comes first: it serves its prefixes and passes
    // every other call on to the next definition (the attached shim's, then
    // libc's), so both see what they serve.
    let mut libs: Vec<PathBuf> = Vec::new();
    if let Some((_, lib)) = &embedded {
        libs.push(lib_path(lib)?);
    }
    if !chosen.is_empty() || embedded.is_none() {
        libs.push(shim_path()?);
    }
    let mut preload = OsString::new();
    for l in &libs {
        if !preload.is_empty() {
            preload.push(" ");
        }
        preload.push(l);
    }
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let (prog, rest) = args.command.split_first().expect("clap requires CMD");
    if embedded.is_some() {
        if let Some(why) = embed_spec::static_refusal(Path::new(prog)) {
            bail!("cannot run embedded: {why}");
        }
    }
    // exec, not spawn: the command gets this process's pid, signals and
    // exit status exactly as if it had been started directly.
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .env("LD_PRELOAD", preload)
        .env("MAPFS_MOUNTS", joined);
    match &embedded {
        Some((v, _)) => cmd.env(embed_spec::EMBED_ENV, v),
        None => cmd.env_remove(embed_spec::EMBED_ENV),
    };
    if chosen.is_empty() {
        cmd.env_remove(MOUNT_DEVS_ENV);
    } else {
        cmd.env(MOUNT_DEVS_ENV, devs.join(":"));
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("running {}", prog.to_string_lossy()))
}

/// Whether the daemon of `mountpoint` runs with the kernel writeback cache
/// (`--data daemon`, the default there): the kernel then trusts its own
/// cached file sizes over the daemon's, so sizes changed by native writes
/// would show late, even to the writer's next open. Asked of the daemon
/// itself over its control socket (never read from a pid file or another
/// process's command line); the shim asks again and the daemon refuses
/// adoptions there in any case, so this only decides the warning.
fn uses_writeback_cache(mountpoint: &Path) -> bool {
    mapfs::control::status(&mapfs::control::socket_path(mountpoint))
        .is_ok_and(|s| s.writeback_cache)
}

/// The checked `--embed` list as [`embed_spec::EMBED_ENV`] carries it, and
/// the library that serves all of the job's embeddings (`None` without
/// `--embed`).
fn embeddings(registry: &Registry, args: &RunArgs) -> Result<Option<(String, &'static str)>> {
    if args.embed.is_empty() {
        if !args.options.is_empty() {
            bail!("-o is for embedded file systems; it needs --embed");
        }
        return Ok(None);
    }
    let mut list = args
        .embed
        .iter()
        .map(|e| Embedding::parse(e, registry, &args.options))
        .collect::<Result<Vec<_>>>()?;
    embed_spec::check_disjoint(&list)?;
    if !args.embed_over {
        for e in &list {
            if let Some(what) = hidden_on_host(&e.prefix) {
                bail!(
                    "--embed {}: {} is {what} on the host, which the program would no longer \
                     see (the embedded file system takes its place); choose a PREFIX that does \
                     not exist or is an empty directory, or pass --embed-over",
                    e.fs,
                    e.prefix.display()
                );
            }
        }
    }
    for o in &args.options {
        let name = o.split_once('=').map_or(o.as_str(), |(k, _)| k);
        if !list.iter().any(|e| {
            registry
                .get(&e.fs)
                .is_some_and(|s| s.declared_options().contains(&name))
        }) {
            bail!("-o {o}: no embedded file system takes option {name:?}");
        }
    }
    // Each file system built once here: a backing store it refuses stops
    // the job before it starts, and its processes skip the checks.
    for e in &mut list {
        let spec = registry.get(&e.fs).expect("checked by Embedding::parse");
        let opts = e.fs_options(spec);
        spec.build(&e.backing, &opts)
            .with_context(|| format!("--embed {}: {}", e.fs, e.backing.display()))?;
        e.options.push(embed_spec::STORE_CHECKED.to_string());
    }
    if list.iter().any(|e| e.exclusive) {
        // Every embedding gets the page, exclusive or not: a rename made
        // through any of them must move the generation, as another
        // embedding may keep directories of the same backing.
        let page = nsgen_page()?;
        let opt = format!("{}={}", embed_spec::NSGEN, page.display());
        for e in &mut list {
            e.options.push(opt.clone());
        }
    }
    // One library serves the whole job: the lean one, unless a file system
    // needs its own (which serves the others too).
    let mut libs: Vec<&'static str> = list
        .iter()
        .filter_map(|e| registry.get(&e.fs).and_then(|s| s.own_embed_library()))
        .collect();
    libs.sort_unstable();
    libs.dedup();
    let lib = match libs[..] {
        [] => registry
            .embed_library_file()
            .expect("checked by Embedding::parse"),
        [one] => one,
        _ => bail!(
            "--embed: these file systems need different embedded libraries ({}); embed them \
             in separate jobs",
            libs.join(", ")
        ),
    };
    Ok(Some((embed_spec::encode(&list), lib)))
}

/// Makes the job's namespace generation page (`mapfs::nsgen`) in the
/// runtime directory, named by this process's id, which the job keeps
/// (`run` execs the program). Pages of jobs whose first process is gone are
/// removed first: nothing else removes them, since no process of a job
/// knows it is the last.
fn nsgen_page() -> Result<PathBuf> {
    let dir = crate::mounts::ensure_runtime_dir()?;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for ent in entries.flatten() {
            let name = ent.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("embed-"))
                .and_then(|n| n.strip_suffix(".gen"))
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let gone = rustix::process::Pid::from_raw(pid).is_none_or(|p| {
                rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH)
            });
            if gone || pid == std::process::id() as i32 {
                let _ = std::fs::remove_file(ent.path());
            }
        }
    }
    let page = dir.join(format!("embed-{}.gen", std::process::id()));
    mapfs::nsgen::create(&page)
        .with_context(|| format!("making the namespace generation page {}", page.display()))?;
    Ok(page)
}

/// What an embedding at `prefix` would hide from the program: `None` when
/// nothing (no such path, or an empty directory).
fn hidden_on_host(prefix: &Path) -> Option<&'static str> {
    let st = std::fs::symlink_metadata(prefix).ok()?;
    if !st.is_dir() {
        return Some("an existing file");
    }
    match std::fs::read_dir(prefix) {
        Ok(mut entries) => entries.next().map(|_| "a non-empty directory"),
        // Unreadable to this user: what is in it cannot be known, and the
        // program would lose access to whatever it is.
        Err(_) => Some("a directory this user cannot list"),
    }
}

/// The shim, found relative to the running binary: installed
/// (`PREFIX/bin/mapfs` with `PREFIX/lib/mapfs/libmapfs_preload.so`) or in
/// the cargo target dir (next to it, or one level up for test binaries in
/// `deps/` and examples in `examples/`).
pub fn shim_path() -> Result<PathBuf> {
    lib_path(SHIM)
}

/// A library of ours (`name`), found as [`shim_path`] describes.
fn lib_path(name: &str) -> Result<PathBuf> {
    if Path::new(name).is_absolute() {
        return if Path::new(name).exists() {
            Ok(PathBuf::from(name))
        } else {
            bail!("{name} not found (the program's embedded library)")
        };
    }
    let exe = std::env::current_exe().context("locating the running binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let installed = dir.join("../lib/mapfs").join(name);
    for cand in [dir.join(name), dir.join("..").join(name), installed] {
        if cand.exists() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!(
        "{name} not found next to {} nor in ../lib/mapfs/; install with `bash scripts/install.sh` \
         or build it with `cargo build --workspace` (same profile)",
        exe.display()
    )
}
