//! The `mapfs` command line as a library: turn your own [`mapfs::FileSystem`]
//! into a program that mounts, unmounts, lists and runs programs on it
//! exactly as `mapfs` does.
//!
//! A file system's whole `main`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use mapfs_cli::{FsSpec, Registry};
//! use mapfs_fs::passthrough::Passthrough;
//!
//! fn main() {
//!     mapfs_cli::main(Registry::new("mirror", "a mirror of a directory").register(
//!         FsSpec::new("mirror", "a 1-to-1 mirror of BACKING", |backing, _opts| {
//!             Ok(Arc::new(Passthrough::new(backing)?))
//!         })
//!         .whole_file_maps(),
//!     ))
//! }
//! ```
//!
//! The binary then has, like `mapfs`:
//!
//! - `mount FS BACKING MOUNTPOINT [--data ..] [-o ..] [--foreground]`:
//!   checks every argument first (bad input: one line, exit status 1,
//!   nothing mounted), then starts itself as a background daemon and
//!   returns once the mount is ready. The daemon serves the FUSE session
//!   (kernel passthrough for whole-file maps where the kernel allows it),
//!   the control socket the preload shim attaches to, keeps a pid file, an
//!   info file and a log (rotated at each mount) in `/run/mapfs` (root) or
//!   a per-user directory, and unmounts cleanly on SIGTERM, SIGINT, SIGHUP.
//! - `umount [--lazy] MOUNTPOINT`: unmounts and waits for the daemon (found
//!   as a pidfd through its control socket) to exit.
//! - `restart MOUNTPOINT`: replaces the daemon on the same mount (the
//!   background process `mount` leaves is a supervisor that also restarts
//!   a daemon that died; see `docs/failover.md`).
//! - `run [--mount M].. -- CMD`: runs CMD with the preload shim.
//! - `list [--json]` (alias `status`): every mapfs mount, with its file
//!   system, backing directory, executor, daemon pid and uptime.
//! - `BACKING MOUNTPOINT -o fs=NAME,...`: the form `mount.fuse3` uses, so
//!   `mount -t fuse.PROGRAM` and `/etc/fstab` lines work (see docs/cli.md).
//! - hidden `completions SHELL` and `manpages DIR`, for installers.
//!
//! Every mount, whatever the program, has type `fuse.mapfs` and the backing
//! directory as its source, so `mapfs run`, `mapfs list` and the shim see
//! it. [`builtins`] is the `mapfs` binary's own registry.

#![warn(missing_docs)]

mod helper;
pub mod list;
pub mod logline;
mod manpage;
pub mod mount_cmd;
pub mod mounts;
pub mod pack_cmd;
mod pidfd;
pub mod restart;
pub mod run;
pub mod stats;
pub mod trace;

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{ArgMatches, FromArgMatches, Subcommand};

// The registry lives in its own crate, which embedded-mode libraries use
// without the command line; these keep the paths of this crate's API.
pub use mapfs_registry::{
    builtins, embeddable, embeddable_full, Build, FsOptions, FsSpec, Registry,
};
pub use mapfs_registry::{embed_spec, registry};

/// The version of this framework.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (`unknown` outside a checkout).
pub const GIT_COMMIT: &str = env!("MAPFS_GIT_COMMIT");

/// The subcommands every mapfs-based program has.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount a file system (in the background; returns once it is ready).
    Mount(mount_cmd::MountArgs),
    /// Unmount a mapfs file system and wait for its daemon to finish.
    Umount(mount_cmd::UmountArgs),
    /// Replace a mount's daemon without unmounting (e.g. after an upgrade).
    Restart(restart::RestartArgs),
    /// Run a program with its mapfs data path inside the process (preload shim).
    Run(run::RunArgs),
    /// List mapfs mounts: file system, backing dir, executor, daemon pid, uptime.
    #[command(visible_alias = "status")]
    List(list::ListArgs),
    /// Show where a mount's time goes: requests per FUSE opcode, ops/s,
    /// p50/p99 latency, share of time, bytes by executor.
    Stats(stats::StatsArgs),
    /// Log the requests a mount serves as they finish (owner or root).
    Trace(trace::TraceArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages for the program and each subcommand into DIR.
    #[command(hide = true)]
    Manpages {
        /// Output directory (man1).
        dir: PathBuf,
    },
}

/// No subcommands beyond [`Command`]: what [`main`] uses.
#[derive(Debug)]
pub enum NoExtra {}

impl FromArgMatches for NoExtra {
    fn from_arg_matches(_: &ArgMatches) -> Result<Self, clap::Error> {
        Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand))
    }
    fn update_from_arg_matches(&mut self, _: &ArgMatches) -> Result<(), clap::Error> {
        match *self {}
    }
}

impl Subcommand for NoExtra {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        cmd
    }
    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
    fn has_subcommand(_: &str) -> bool {
        false
    }
}

/// Runs the program: parses the command line, runs the subcommand, and
/// exits (status 0, or 1 after one `PROGRAM: error: ...` line).
pub fn main(registry: Registry) -> ! {
    main_with::<NoExtra>(registry, |never| match never {})
}

/// [`main`] with extra subcommands `E`, run by `extra` (the `mapfs` binary
/// adds `bench` this way).
pub fn main_with<E: Subcommand>(registry: Registry, extra: impl FnOnce(E) -> Result<()>) -> ! {
    let args: Vec<OsString> = std::env::args_os().collect();
    let res = run_args(&registry, args, extra);
    if let Err(e) = res {
        eprintln!("{}: error: {e:#}", registry.program());
        std::process::exit(1);
    }
    std::process::exit(0)
}

/// The clap definition of the program, with `E`'s subcommands.
pub fn command<E: Subcommand>(registry: &Registry) -> clap::Command {
    let mut fs_list = String::from("File systems:\n");
    for s in registry.specs() {
        fs_list.push_str(&format!("  {:<12} {}\n", s.name(), s.about()));
    }
    let app = clap::Command::new(registry.program())
        .about(registry.about())
        .version(registry.program_version().unwrap_or(VERSION))
        .subcommand_required(true)
        .arg_required_else_help(true)
        .after_help(format!(
            "{fs_list}\nExamples:\n  \
             {p} mount {fs} /srv/data /mnt/data\n  \
             {p} list\n  \
             {p} run -- sqlite3 /mnt/data/db.sqlite 'select 1'\n  \
             {p} umount /mnt/data\n  \
             mount -t fuse.{p} /srv/data /mnt/data -o fs={fs}",
            p = registry.program(),
            fs = registry.specs().first().map_or("FS", |s| s.name()),
        ));
    let app = Command::augment_subcommands(app);
    // A derived `E` sets its own doc comment as the about: put ours back.
    let app = E::augment_subcommands(app).about(registry.about());
    app.mut_subcommand("mount", |c| c.after_help(fs_list))
}

fn run_args<E: Subcommand>(
    registry: &Registry,
    args: Vec<OsString>,
    extra: impl FnOnce(E) -> Result<()>,
) -> Result<()> {
    let app = command::<E>(registry);
    if let Some(first) = args.get(1).and_then(|a| a.to_str()) {
        if first == "--version" || first == "-V" {
            println!("{}", version_text(registry));
            return Ok(());
        }
        let is_sub = app
            .get_subcommands()
            .any(|s| s.get_name() == first || s.get_all_aliases().any(|a| a == first))
            || first == "help";
        // mount.fuse3 passes the source as written (a path); anything else
        // is a mistyped subcommand, which clap explains better.
        let is_path = first.contains('/') || std::path::Path::new(first).exists();
        if !is_sub && !first.starts_with('-') && is_path {
            let margs = helper::helper_args(registry, &args[1..])?;
            return mount_cmd::mount(registry, margs);
        }
    }
    let matches = match app.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => return clap_error(registry, &args, e),
    };
    let name = matches.subcommand_name().unwrap_or_default().to_string();
    if E::has_subcommand(&name) {
        return extra(E::from_arg_matches(&matches)?);
    }
    match Command::from_arg_matches(&matches)? {
        Command::Mount(a) => mount_cmd::mount(registry, a),
        Command::Umount(a) => mount_cmd::umount(a),
        Command::Restart(a) => restart::restart(a),
        Command::Run(a) => run::run(registry, a),
        Command::List(a) => list::list(a),
        Command::Stats(a) => stats::stats(a),
        Command::Trace(a) => trace::trace(a),
        Command::Completions { shell } => {
            let mut app = app;
            clap_complete::generate(shell, &mut app, registry.program(), &mut std::io::stdout());
            Ok(())
        }
        Command::Manpages { dir } => write_manpages(app, &dir),
    }
}

/// Help and version go to stdout with status 0; every other clap error
/// becomes one line (its first paragraph) and status 1, like all bad input.
fn clap_error(registry: &Registry, args: &[OsString], e: clap::Error) -> Result<()> {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            std::process::exit(1);
        }
        return Ok(());
    }
    let text = e.render().to_string();
    let mut line: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect();
    if let Some(first) = line.first_mut() {
        *first = first.trim_start_matches("error: ");
    }
    let mut msg = line.join(" ");
    if args.get(1).is_some_and(|a| a == "run") && e.kind() == ErrorKind::UnknownArgument {
        msg.push_str(&format!(
            "; put `--` before the program: {} run -- CMD [ARGS...]",
            registry.program()
        ));
    } else {
        msg.push_str(&format!(" (see `{} --help`)", registry.program()));
    }
    bail!("{msg}")
}

/// `--version`: the program's version, mapfs's and its commit, and where
/// the shim is.
fn version_text(registry: &Registry) -> String {
    let shim = match run::shim_path() {
        Ok(p) => format!("preload shim: {}", p.display()),
        Err(e) => format!("preload shim: NOT FOUND ({e:#}); `run` will not work"),
    };
    let program = match (registry.program(), registry.program_version()) {
        ("mapfs", _) => String::new(),
        (p, Some(v)) => format!("{p} {v}\n"),
        (p, None) => format!("{p} (built on mapfs)\n"),
    };
    format!("{program}mapfs {VERSION}\ncommit: {GIT_COMMIT}\n{shim}")
}

/// One roff page for the program and one per visible subcommand, nested
/// ones included (`PROGRAM-SUB.1`, `PROGRAM-SUB-SUBSUB.1`), as `man` finds
/// them. clap_mangen's synopsis drops option values (`[--data] [-o ]`), so
/// the synopsis is written here; `mapfs(1)` and `PROGRAM-mount(1)` get
/// hand-written EXAMPLES, FILES, ENVIRONMENT and EXIT STATUS sections (see
/// [`manpage`]).
fn write_manpages(app: clap::Command, dir: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let program = app.get_name().to_string();
    let mut pages = Vec::new();
    collect_pages(app, &program, &mut pages);
    for (page, cmd) in pages {
        let text = manpage::render(&program, &page, cmd)?;
        let path = dir.join(format!("{page}.1"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `cmd` as page `name`, and its visible subcommands after it. clap's own
/// `help` subcommand is left out: there is no `PROGRAM-help(1)`.
fn collect_pages(cmd: clap::Command, name: &str, pages: &mut Vec<(String, clap::Command)>) {
    // clap names are `&'static str` without its "string" feature; this
    // runs once per page in a process that exits right after.
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    let cmd = cmd.name(leaked).disable_help_subcommand(true);
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    pages.push((name.to_string(), cmd));
    for sub in subs {
        let full = format!("{name}-{}", sub.get_name());
        collect_pages(sub, &full, pages);
    }
}
