//! The file systems a program can mount, by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mapfs::FileSystem;

/// Builds a file system over its (checked, canonical) backing path.
///
/// `backing` is one directory, or for a [`FsSpec::layered`] file system the
/// directories joined with `:` (split it with [`FsOptions::layers`]).
pub type Build = fn(backing: &Path, options: &FsOptions) -> mapfs::Result<Arc<dyn FileSystem>>;

/// What a file system's constructor is told besides its backing path.
#[derive(Debug, Clone, Default)]
pub struct FsOptions {
    /// The mount is read-only (`-o ro`).
    pub read_only: bool,
    /// The backing directories, in the order given (one unless layered).
    pub layers: Vec<PathBuf>,
    /// The `-o` options the file system declared with [`FsSpec::options`],
    /// as given (`name` or `name=value`), in order.
    pub custom: Vec<String>,
    /// This daemon takes over the mount of one that died (failover, or
    /// `mapfs restart`): programs may still use state the dead one handed
    /// out (what its open handles held, what programs running maps under
    /// `mapfs run` were lent), so a file system must not reclaim it as a
    /// fresh mount would.
    pub resumed: bool,
    /// This instance runs inside a program (embedded mode, `run --embed`):
    /// every process of the job builds one over the same backing directory
    /// at the same time, so what one keeps in memory the others never see.
    pub embedded: bool,
    /// Opens with a whole-file map run without the daemon (a mount's
    /// kernel passthrough, `--data auto` or `passthrough`): a file system
    /// may prefer to hand them out (`pack` starts a new file in a file of
    /// its own and moves it into a slot at its last close).
    pub whole_files_native: bool,
}

impl FsOptions {
    /// The value of custom option `name` (`Some("")` for a bare `name`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.custom
            .iter()
            .rev()
            .find_map(|o| match o.split_once('=') {
                Some((k, v)) if k == name => Some(v),
                None if o == name => Some(""),
                _ => None,
            })
    }
}

/// One mountable file system: its name, a one-line description and its
/// constructor, plus what the mount machinery must know about it.
#[derive(Debug, Clone)]
pub struct FsSpec {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) build: Build,
    pub(crate) whole_file_maps: bool,
    pub(crate) shared_opens: bool,
    pub(crate) layered: bool,
    pub(crate) cacheable: bool,
    pub(crate) embeddable: bool,
    pub(crate) embed_library: Option<&'static str>,
    pub(crate) keeps_writers: bool,
    pub(crate) backing_dirs: bool,
    pub(crate) own_inos: bool,
    pub(crate) options: &'static [&'static str],
}

impl FsSpec {
    /// A file system called `name` (what `mount NAME ...` and `-o fs=NAME`
    /// select), described by `about` in `--help` and `list`.
    pub fn new(name: &'static str, about: &'static str, build: Build) -> Self {
        FsSpec {
            name,
            about,
            build,
            whole_file_maps: false,
            shared_opens: false,
            layered: false,
            cacheable: false,
            embeddable: false,
            embed_library: None,
            keeps_writers: false,
            backing_dirs: false,
            own_inos: false,
            options: &[],
        }
    }

    /// Every map this file system returns is whole-file 1-to-1, so several
    /// opens of a file share one backing file and the kernel's writeback
    /// cache is safe with `--data daemon` (and on by default there).
    /// Without this (or [`FsSpec::shared_opens`]) the writeback cache stays
    /// off: a page written back through one open would carry another
    /// open's bytes into its log.
    pub fn whole_file_maps(mut self) -> Self {
        self.whole_file_maps = true;
        self
    }

    /// Its maps are not whole-file, but its opens may share one open of
    /// the file system (the adapter's `share_opens`): then `--data daemon
    /// --writeback-cache on` is honoured, with every open of an inode
    /// executing one map. The file system must let one open be flushed
    /// by several closes and written after a flush (plfs records what an
    /// open changed since its last flush).
    pub fn shared_opens(mut self) -> Self {
        self.shared_opens = true;
        self
    }

    /// The backing argument is several directories separated by `:`
    /// (`UPPER:LOWER`); each is checked like a single backing directory.
    pub fn layered(mut self) -> Self {
        self.layered = true;
        self
    }

    /// Every name and attribute of this file system changes only by a
    /// request through the mount (or a `mapfs run` client's write, which the
    /// daemon tells the kernel of), never by the file system on its own:
    /// `mount --exclusive` may then let the kernel cache them for long.
    /// Without this, `--exclusive` is refused.
    pub fn cacheable(mut self) -> Self {
        self.cacheable = true;
        self
    }

    /// This file system may run inside the application (`run --embed`,
    /// docs/embedded.md): each process of the job then builds its own
    /// instance over the same backing directory, so it must keep no state
    /// that another instance would need to see (everything shared lives in
    /// the backing directory, under locks that work across processes). The
    /// program must also name its embedded library
    /// ([`Registry::embed_library`]).
    pub fn embeddable(mut self) -> Self {
        self.embeddable = true;
        self
    }

    /// [`FsSpec::embeddable`], by the library `file` instead of the
    /// registry's ([`Registry::embed_library`]): for a file system whose
    /// code (SQLite, for `versions`) the registry's library leaves out, so
    /// that jobs which do not embed it do not load it. `file` must serve
    /// every embeddable file system of the registry too (`run --embed`
    /// preloads one library for all of a job's embeddings).
    pub fn embeddable_by(mut self, file: &'static str) -> Self {
        self.embeddable = true;
        self.embed_library = Some(file);
        self
    }

    /// The file system keeps state for an open that may write until that
    /// open's release, even when its map is whole-file (`versions`: the
    /// write session whose version is dropped at release if nothing
    /// changed). Embedded mode then serves such opens by the data engine,
    /// released at their last close, instead of handing the program the
    /// backing file and releasing at once.
    pub fn keeps_writers(mut self) -> Self {
        self.keeps_writers = true;
        self
    }

    /// The file system numbers its inodes itself, and a file's backing file
    /// (a whole-file map) has another number (`pack`: the database's inode
    /// number, against `files/<ino>`'s). Embedded mode then serves even
    /// whole-file opens by the data engine, so that `fstat` of an open
    /// file agrees with `stat` of its path (`cp` and `tar` compare them).
    pub fn own_inode_numbers(mut self) -> Self {
        self.own_inos = true;
        self
    }

    /// Whether [`FsSpec::own_inode_numbers`] was said.
    pub fn has_own_inode_numbers(&self) -> bool {
        self.own_inos
    }

    /// Whether [`FsSpec::keeps_writers`] was said.
    pub fn has_kept_writers(&self) -> bool {
        self.keeps_writers
    }

    /// Every directory of this file system is the backing directory at the
    /// same path, with the same entries and types (a mirror such as
    /// `passthrough`). Embedded mode then lets the program read directories
    /// natively from the backing directory; without it, every directory is
    /// listed through [`mapfs::FileSystem::readdir`], as through a mount.
    pub fn lists_backing_dirs(mut self) -> Self {
        self.backing_dirs = true;
        self
    }

    /// Whether [`FsSpec::lists_backing_dirs`] was said.
    pub fn lists_backing_dirs_natively(&self) -> bool {
        self.backing_dirs
    }

    /// Whether [`FsSpec::shared_opens`] was said.
    pub fn has_shared_opens(&self) -> bool {
        self.shared_opens
    }

    /// Whether [`FsSpec::layered`] was said.
    pub fn is_layered(&self) -> bool {
        self.layered
    }

    /// Whether [`FsSpec::cacheable`] was said.
    pub fn is_cacheable(&self) -> bool {
        self.cacheable
    }

    /// The `-o` option names [`FsSpec::options`] declared.
    pub fn declared_options(&self) -> &'static [&'static str] {
        self.options
    }

    /// The library [`FsSpec::embeddable_by`] named, if any.
    pub fn own_embed_library(&self) -> Option<&'static str> {
        self.embed_library
    }

    /// Whether [`FsSpec::whole_file_maps`] was said.
    pub fn has_whole_file_maps(&self) -> bool {
        self.whole_file_maps
    }

    /// Whether [`FsSpec::embeddable`] was said.
    pub fn is_embeddable(&self) -> bool {
        self.embeddable
    }

    /// `-o` option names this file system understands itself; they reach
    /// its constructor in [`FsOptions::custom`] instead of the kernel.
    pub fn options(mut self, names: &'static [&'static str]) -> Self {
        self.options = names;
        self
    }

    /// The name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The one-line description.
    pub fn about(&self) -> &'static str {
        self.about
    }

    /// Builds the file system over `backing` (checked, canonical), as a
    /// mount does; for executors other than the daemon (embedded mode).
    pub fn build(&self, backing: &Path, options: &FsOptions) -> mapfs::Result<Arc<dyn FileSystem>> {
        (self.build)(backing, options)
    }
}

/// The file systems of one program, and the program's name (used in
/// messages, `--help`, and as the mount's program in `list`).
#[derive(Debug, Clone)]
pub struct Registry {
    pub(crate) program: &'static str,
    pub(crate) about: &'static str,
    pub(crate) version: Option<&'static str>,
    pub(crate) specs: Vec<FsSpec>,
    pub(crate) embed_library: Option<&'static str>,
}

impl Registry {
    /// An empty registry for the program `program` (its binary's name).
    pub fn new(program: &'static str, about: &'static str) -> Self {
        Registry {
            program,
            about,
            version: None,
            specs: Vec::new(),
            embed_library: None,
        }
    }

    /// The program's own version, which `--version` prints first, with
    /// mapfs's below it: `.version(env!("CARGO_PKG_VERSION"))` in the
    /// program's crate. Without it the program shows mapfs's version.
    pub fn version(mut self, version: &'static str) -> Self {
        self.version = Some(version);
        self
    }

    /// The version [`Registry::version`] set, if any.
    pub fn program_version(&self) -> Option<&'static str> {
        self.version
    }

    /// The embedded-mode library of this program: a `cdylib` made with
    /// `mapfs_embed::library!` over the same registry, which `run --embed`
    /// preloads to serve the [`FsSpec::embeddable`] file systems. `file` is
    /// a file name looked for next to the program's binary, in its parent
    /// directory, and in `../lib/mapfs/` (where `scripts/install.sh` puts
    /// mapfs's own), or an absolute path.
    pub fn embed_library(mut self, file: &'static str) -> Self {
        self.embed_library = Some(file);
        self
    }

    /// The library [`Registry::embed_library`] named, if any.
    pub fn embed_library_file(&self) -> Option<&'static str> {
        self.embed_library
    }

    /// The library that serves embedded file system `fs`: its own
    /// ([`FsSpec::embeddable_by`]) or the registry's.
    pub fn embed_library_for(&self, fs: &str) -> Option<&'static str> {
        self.get(fs)
            .and_then(|s| s.embed_library)
            .or(self.embed_library)
    }

    /// Adds a file system; a later one with the same name replaces it.
    pub fn register(mut self, spec: FsSpec) -> Self {
        self.specs.retain(|s| s.name != spec.name);
        self.specs.push(spec);
        self
    }

    /// The file system called `name`.
    pub fn get(&self, name: &str) -> Option<&FsSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// Names of every registered file system, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.specs.iter().map(|s| s.name).collect()
    }

    /// The program name.
    pub fn program(&self) -> &'static str {
        self.program
    }

    /// The program's one-line description.
    pub fn about(&self) -> &'static str {
        self.about
    }

    /// Every registered file system, in registration order.
    pub fn specs(&self) -> &[FsSpec] {
        &self.specs
    }
}

/// `versions`, embeddable by [`crate::EMBED_FULL_LIB`] (it links
/// SQLite, which the lean library leaves out).
fn versions() -> FsSpec {
    FsSpec::new(
        "versions",
        "keeps the old bytes of every overwrite (see `mapfs versions`)",
        |b, o| {
            let mut c = mapfs_fs::versions::Config::from_options(|k| o.get(k))
                .map_err(|e| mapfs::Error::invalid().context(e))?;
            c.shared = o.embedded;
            Ok(Arc::new(mapfs_fs::versions::Versions::new(b, c)?))
        },
    )
    .options(&["max-size", "keep", "keep-days", "keep-bytes"])
    .keeps_writers()
    .embeddable_by(crate::EMBED_FULL_LIB)
}

/// `pack`, embeddable by [`crate::EMBED_FULL_LIB`] (it links SQLite);
/// embedded, every process of the job runs a shared instance
/// (`PackOptions::shared`).
fn pack() -> FsSpec {
    use mapfs_fs::pack::{Pack, PackOptions};
    FsSpec::new(
        "pack",
        "many small files in slots of a few pack files (SQLite namespace)",
        |b, o| {
            let mut opts = PackOptions::parse(o.get("threshold"), o.get("sync"))?;
            opts.resumed = o.resumed;
            opts.shared = o.embedded;
            opts.new_files_own = o.whole_files_native;
            Ok(Arc::new(Pack::new(b, opts)?))
        },
    )
    .options(&["threshold", "sync"])
    .cacheable()
    .own_inode_numbers()
    .embeddable_by(crate::EMBED_FULL_LIB)
}

/// The registry of `libmapfs_embed_full.so` ([`crate::EMBED_FULL_LIB`]):
/// [`embeddable`], `pack` and `versions`.
pub fn embeddable_full() -> Registry {
    embeddable()
        .embed_library(crate::EMBED_FULL_LIB)
        .register(pack())
        .register(versions())
}

/// The `mapfs` binary's registry: the built-in file systems of `mapfs-fs`,
/// registered exactly as an outside file system registers itself.
pub fn builtins() -> Registry {
    embeddable().register(pack()).register(versions())
}

/// The built-in file systems embedded mode runs with its lean library
/// (`mapfs run --embed`), registered as in [`builtins`]: the registry of
/// `libmapfs_embed_builtins.so`, which so links neither SQLite nor what
/// only `pack` and `versions` use (every process of an embedded job loads
/// it). A job that embeds `versions` loads [`embeddable_full`]'s library.
pub fn embeddable() -> Registry {
    use mapfs_fs::{passthrough::Passthrough, plfs::Plfs};
    Registry::new(
        "mapfs",
        "mapfs: user-space file systems as fast as the file system underneath.",
    )
    .embed_library(crate::EMBED_LIB)
    .register(
        FsSpec::new("passthrough", "a 1-to-1 mirror of BACKING", |b, o| {
            // In an embedded job with a namespace generation (some
            // embedding is `:exclusive`), renames and rmdirs move it, and
            // an exclusive embedding keeps parent directories open.
            if let Some(page) = o.get(crate::embed_spec::NSGEN) {
                let gen = mapfs::nsgen::NsGen::open(std::path::Path::new(page)).map_err(|e| {
                    mapfs::Error::from(e).context(format!("namespace generation page {page}"))
                })?;
                let keep = o.get(crate::embed_spec::EXCLUSIVE).is_some();
                let root = mapfs::backing::BackingRoot::new(b)?.with_dir_cache(Arc::new(gen), keep);
                return Ok(Arc::new(Passthrough::with_root(root)));
            }
            Ok(Arc::new(Passthrough::new(b)?))
        })
        .whole_file_maps()
        .cacheable()
        .lists_backing_dirs()
        .embeddable(),
    )
    .register(
        FsSpec::new(
            "plfs",
            "one append log per writer, for N-1 checkpoints (-o hostid=NAME across hosts)",
            |b, o| {
                let host = match o.get("hostid") {
                    Some(h) => h.to_owned(),
                    None => mapfs_fs::plfs::default_hostid(),
                };
                if o.get(crate::embed_spec::STORE_CHECKED).is_some() {
                    return Ok(Arc::new(Plfs::on_checked_host(b, &host)?));
                }
                Ok(Arc::new(Plfs::on_host(b, &host)?))
            },
        )
        .options(&["hostid"])
        .shared_opens()
        .cacheable()
        .embeddable(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_lookup_takes_the_last_value() {
        let o = FsOptions {
            custom: vec!["x=1".into(), "flag".into(), "x=2".into()],
            ..FsOptions::default()
        };
        assert_eq!(o.get("x"), Some("2"));
        assert_eq!(o.get("flag"), Some(""));
        assert_eq!(o.get("y"), None);
    }

    #[test]
    fn builtins_are_registered_by_name() {
        let r = builtins();
        assert_eq!(r.names(), ["passthrough", "plfs", "pack", "versions"]);
        assert_eq!(embeddable().names(), ["passthrough", "plfs"]);
        let embeddable_builtins: Vec<_> = (r.specs.iter())
            .filter(|s| s.is_embeddable())
            .map(|s| s.name)
            .collect();
        assert_eq!(embeddable_builtins, embeddable_full().names());
        assert_eq!(r.embed_library_file(), Some(crate::EMBED_LIB));
        // versions links SQLite: only the full library serves it, and that
        // one serves every embeddable file system.
        assert_eq!(r.embed_library_for("plfs"), Some(crate::EMBED_LIB));
        assert_eq!(r.embed_library_for("versions"), Some(crate::EMBED_FULL_LIB));
        assert_eq!(
            embeddable_full().names(),
            ["passthrough", "plfs", "pack", "versions"]
        );
        assert_eq!(r.embed_library_for("pack"), Some(crate::EMBED_FULL_LIB));
        assert!(r.get("versions").unwrap().has_kept_writers());
        assert!(r.get("passthrough").unwrap().whole_file_maps);
        assert!(!r.get("plfs").unwrap().whole_file_maps);
        let r = r.register(FsSpec::new("plfs", "replaced", |b, _| {
            Ok(Arc::new(mapfs_fs::passthrough::Passthrough::new(b)?))
        }));
        assert_eq!(r.get("plfs").unwrap().about(), "replaced");
    }
}
