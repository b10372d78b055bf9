//! `mapfs versions`: the history kept by the `versions` file system, read
//! and managed directly in the backing directory (safe while it is mounted:
//! the index is SQLite, objects are never changed once written).
//!
//! Versions are named `PATH@STAMP` as `list` prints them (`PATH` alone means
//! its newest version); `PATH` is the file's path inside the file system
//! (`/notes/todo.txt`; the leading `/` may be left out).

use std::fmt::Write as _;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use mapfs_fs::versions::store::{Store, Version};
use mapfs_fs::versions::virtual_dir::Sight;
use mapfs_fs::versions::{parse_size, stamp, Policy};

/// Arguments of `mapfs versions`.
#[derive(Args, Debug)]
pub struct VersionsArgs {
    #[command(subcommand)]
    cmd: VersionsCmd,
}

#[derive(Subcommand, Debug)]
enum VersionsCmd {
    /// List versions (all, or of PATH and the paths beneath it), oldest first.
    List {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// Only this path (a file, or a directory: everything beneath it).
        path: Option<String>,
    },
    /// Write the bytes of a version to standard output.
    Show {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// PATH@STAMP, or PATH for its newest version.
        version: String,
    },
    /// `diff -u` of a version against another version or (by default) the
    /// current file; exit status 0 when the same, 1 when different, 2 on trouble.
    Diff {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// PATH@STAMP, or PATH for its newest version.
        version: String,
        /// PATH@STAMP to compare with instead of the current file.
        other: Option<String>,
    },
    /// Make PATH hold a version again (the file it replaces becomes a version).
    Restore {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// PATH@STAMP, or PATH for its newest version (works for removed files).
        version: String,
        /// Restore to this path instead of the version's own.
        #[arg(long)]
        to: Option<String>,
    },
    /// Apply retention now (the mount's limits, or those given).
    Prune {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
        /// Versions kept per path.
        #[arg(long)]
        keep: Option<u64>,
        /// Drop versions older than this many days.
        #[arg(long)]
        keep_days: Option<f64>,
        /// Total bytes kept (K, M, G, T suffixes).
        #[arg(long, value_parser = parse_size)]
        keep_bytes: Option<u64>,
    },
    /// Versions, paths, and the bytes they keep.
    Stats {
        /// The versions mount (its mountpoint or its backing directory).
        #[arg(value_name = "MOUNT_OR_BACKING")]
        backing: PathBuf,
    },
}

/// The store of `given` (a mountpoint or a backing directory), and the
/// backing directory it is in.
fn open_store(given: &Path) -> Result<(Store, PathBuf)> {
    let backing = mapfs_cli::mounts::backing_of(given, "versions")?;
    let root = mapfs::backing::BackingRoot::new(&backing)
        .with_context(|| format!("opening {}", backing.display()))?;
    let store = Store::open(root.fd(), false).with_context(|| {
        format!(
            "{} has no version store: expected the mountpoint of a `mapfs mount \
             versions` mount or its backing directory",
            given.display()
        )
    })?;
    Ok((store, backing))
}

fn fs_path(p: &str) -> Vec<u8> {
    let t = p.trim_end_matches('/');
    if t.starts_with('/') {
        t.as_bytes().to_vec()
    } else {
        format!("/{t}").into_bytes()
    }
}

/// Which versions the user running the command may see: all for root;
/// for anyone else, what `.versions/` in the mount shows them (a version
/// of a file they could reach through the live tree now and could read
/// when it was taken; see [`Sight`]).
struct Seen {
    root: Option<mapfs::backing::BackingRoot>,
    ctx: mapfs::Ctx,
}

impl Seen {
    fn of(backing: &Path) -> Result<Seen> {
        let ctx = mapfs::Ctx::current();
        let root = if ctx.uid == 0 {
            None
        } else {
            Some(mapfs::backing::BackingRoot::new(backing)?)
        };
        Ok(Seen { root, ctx })
    }

    fn sight(&self) -> Option<Sight<'_>> {
        self.root.as_ref().map(|r| Sight::new(&self.ctx, r))
    }

    /// `list` without what this user may not see.
    fn filter(&self, list: Vec<Version>) -> Vec<Version> {
        match self.sight() {
            None => list,
            Some(s) => list.into_iter().filter(|v| s.sees(v)).collect(),
        }
    }
}

/// The version `spec` names: `PATH@STAMP`, or `PATH` for the newest; only
/// one `seen` lets this user see.
fn resolve(store: &Store, seen: &Seen, spec: &str) -> Result<Version> {
    if let Some((path, ts)) = spec
        .rsplit_once('@')
        .and_then(|(p, s)| Some((p, stamp::parse(s)?)))
    {
        return store
            .find(&fs_path(path), ts)?
            .and_then(|v| seen.filter(vec![v]).pop())
            .with_context(|| format!("no version {spec}"));
    }
    seen.filter(store.list(Some(&fs_path(spec)), false)?)
        .pop()
        .with_context(|| format!("no versions of {spec}"))
}

/// Writes a version's bytes to a temporary file (for `diff`).
fn to_temp(store: &Store, v: &Version) -> Result<tempfile::NamedTempFile> {
    let mut t = tempfile::NamedTempFile::new()?;
    t.write_all(&store.read_all(v)?)?;
    Ok(t)
}

/// `versions diff`: runs `diff -u` of `version` against `other` or the
/// current file; true when they are the same.
fn diff(given: &Path, version: &str, other: Option<&str>) -> Result<bool> {
    let (store, backing) = open_store(given)?;
    let seen = Seen::of(&backing)?;
    let a = resolve(&store, &seen, version)?;
    let ta = to_temp(&store, &a)?;
    let (tb, label_b) = match other {
        Some(o) => {
            let b = resolve(&store, &seen, o)?;
            (Some(to_temp(&store, &b)?), b.full_name())
        }
        None => (None, String::from_utf8_lossy(&a.path).into_owned()),
    };
    let current = backing.join(Path::new(std::ffi::OsStr::from_bytes(&a.path[1..])));
    let b_path = tb.as_ref().map_or(current.as_path(), |t| t.path());
    let status = Command::new("diff")
        .arg("-u")
        .arg("--label")
        .arg(a.full_name())
        .arg("--label")
        .arg(&label_b)
        .arg(ta.path())
        .arg(b_path)
        .status()
        .context("cannot run diff (Debian: apt-get install diffutils)")?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!("diff failed ({status})"),
    }
}

/// Runs `mapfs versions`.
pub fn run(args: VersionsArgs) -> Result<()> {
    match args.cmd {
        VersionsCmd::List { backing, path } => {
            let (store, real) = open_store(&backing)?;
            let seen = Seen::of(&real)?;
            let list = seen.filter(store.list(path.as_deref().map(fs_path).as_deref(), true)?);
            let mut out = std::io::stdout().lock();
            for v in &list {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}",
                    v.full_name(),
                    v.size,
                    v.reason,
                    if v.kind == mapfs_fs::versions::store::Kind::Undo {
                        "undo"
                    } else {
                        "whole"
                    }
                )?;
            }
            Ok(())
        }
        VersionsCmd::Show { backing, version } => {
            let (store, real) = open_store(&backing)?;
            let v = resolve(&store, &Seen::of(&real)?, &version)?;
            std::io::stdout().lock().write_all(&store.read_all(&v)?)?;
            Ok(())
        }
        VersionsCmd::Diff {
            backing,
            version,
            other,
        } => {
            // diff(1)'s exit status: 0 same, 1 different, 2 trouble (not
            // this program's usual 1 for an error, which would read as
            // "different" to a script).
            match diff(&backing, &version, other.as_deref()) {
                Ok(same) => {
                    if !same {
                        std::io::stdout().flush()?;
                        std::process::exit(1);
                    }
                    Ok(())
                }
                Err(e) => {
                    eprintln!("mapfs: error: {e:#}");
                    std::process::exit(2);
                }
            }
        }
        VersionsCmd::Restore {
            backing,
            version,
            to,
        } => {
            let (store, real) = open_store(&backing)?;
            let v = resolve(&store, &Seen::of(&real)?, &version)?;
            let target = to.as_deref().map_or(v.path.clone(), fs_path);
            let kept = store.restore(&v, &target)?;
            let kept = match kept.and_then(|id| store.get(id).ok().flatten()) {
                Some(k) => format!("; what it replaced is {}", k.full_name()),
                None => String::new(),
            };
            println!(
                "restored {} to {}{kept}",
                v.full_name(),
                String::from_utf8_lossy(&target)
            );
            Ok(())
        }
        VersionsCmd::Prune {
            backing,
            keep,
            keep_days,
            keep_bytes,
        } => {
            let (store, _) = open_store(&backing)?;
            let policy = if keep.is_none() && keep_days.is_none() && keep_bytes.is_none() {
                store.load_policy()?
            } else {
                Policy {
                    keep,
                    keep_days,
                    keep_bytes,
                }
            };
            if keep == Some(0) {
                bail!("--keep must be at least 1");
            }
            let dropped = store.prune(&policy, &[])?;
            println!("dropped {} versions", dropped.len());
            Ok(())
        }
        VersionsCmd::Stats { backing } => {
            let (store, _) = open_store(&backing)?;
            let t = store.totals()?;
            let p = store.load_policy()?;
            let mut out = String::new();
            writeln!(
                out,
                "versions:        {} ({} whole, {} undo)",
                t.versions, t.whole, t.undo
            )?;
            writeln!(out, "paths:           {}", t.paths)?;
            writeln!(
                out,
                "version bytes:   {} (their sizes added up)",
                mapfs::size::human(t.logical_bytes)
            )?;
            writeln!(
                out,
                "bytes kept:      {} (added to the store; reflinks count 0)",
                mapfs::size::human(t.stored_bytes)
            )?;
            writeln!(
                out,
                "allocated:       {} (objects' blocks; shared extents counted in full)",
                mapfs::size::human(t.allocated_bytes)
            )?;
            writeln!(
                out,
                "skipped:         {} (versions over the byte limit, not kept)",
                t.skipped
            )?;
            writeln!(
                out,
                "retention:       keep {} per path, {} days, {} in all",
                p.keep.map_or("all".into(), |k| k.to_string()),
                p.keep_days.map_or("any".into(), |d| d.to_string()),
                p.keep_bytes.map_or("any size".into(), mapfs::size::human)
            )?;
            std::io::stdout().lock().write_all(out.as_bytes())?;
            Ok(())
        }
    }
}
