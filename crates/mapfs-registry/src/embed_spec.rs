//! Embedded file systems (`mapfs run --embed FS:BACKING:PREFIX`): the
//! command-line spec, its checks, and how it travels to the embedded library
//! in every process of the job (the [`EMBED_ENV`] variable, inherited across
//! `fork` and `exec`). See docs/embedded.md.

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

use std::os::unix::ffi::OsStrExt;

use crate::registry::{FsOptions, FsSpec, Registry};

/// The environment variable that carries the embeddings to the library.
pub const EMBED_ENV: &str = "MAPFS_EMBED";

/// The option `mapfs run --embed` adds to every embedding once it built the
/// file system over its backing directory itself: the store was checked
/// (plfs's requirements) for the whole job, so the job's processes need not
/// check it again. Not a declared option: `-o` cannot pass it.
pub const STORE_CHECKED: &str = "mapfs-store-checked";

/// The option naming the job's namespace generation page
/// (`mapfs-nsgen=PATH`, see `mapfs::nsgen`): added by `mapfs run --embed`
/// to every embedding of a job in which some embedding is exclusive. Not a
/// declared option: `-o` cannot pass it.
pub const NSGEN: &str = "mapfs-nsgen";

/// The option an exclusive embedding (`FS:BACKING:PREFIX:exclusive`)
/// travels with to the job's processes: its file system may keep resolved
/// directories, checked against the job's namespace generation.
pub const EXCLUSIVE: &str = "mapfs-exclusive";

/// The suffix of an `--embed` spec that declares its backing directory
/// changed by no process outside the job.
pub const EXCLUSIVE_SUFFIX: &str = "exclusive";

/// Separates embeddings in [`EMBED_ENV`].
const REC: char = '\n';
/// Separates the fields of one embedding.
const FIELD: char = '\t';
/// Separates the options of one embedding.
const OPT: char = '\x1f';

/// One file system served inside the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Embedding {
    /// Registry name of the file system.
    pub fs: String,
    /// Canonical backing directory.
    pub backing: PathBuf,
    /// Absolute, normalized path under which the file system appears.
    pub prefix: PathBuf,
    /// The `-o` options this file system declares (`name` or `name=value`),
    /// and those `mapfs run` adds ([`STORE_CHECKED`], [`NSGEN`]).
    pub options: Vec<String>,
    /// `FS:BACKING:PREFIX:exclusive`: no process outside the job changes
    /// the backing directory's namespace, so the job's processes may keep
    /// directories they resolved (docs/embedded.md, "Exclusive backing
    /// directories").
    pub exclusive: bool,
}

impl Embedding {
    /// Parses and checks one `--embed FS:BACKING:PREFIX[:exclusive]`
    /// argument against `registry`; `options` are every `-o` given (each
    /// file system gets the ones it declares).
    pub fn parse(arg: &str, registry: &Registry, options: &[String]) -> Result<Embedding> {
        let (fs, rest) = arg
            .split_once(':')
            .with_context(|| format!("--embed {arg:?}: expected FS:BACKING:PREFIX"))?;
        let (rest, exclusive) = split_suffix(arg, rest)?;
        let Some((backing, prefix)) = rest.rsplit_once(':') else {
            bail!("--embed {arg:?}: expected FS:BACKING:PREFIX (no PREFIX)");
        };
        if fs.is_empty() {
            bail!("--embed {arg:?}: the file system name is empty");
        }
        let Some(spec) = registry.get(fs) else {
            bail!(
                "--embed {arg:?}: unknown file system {fs:?} (known: {})",
                registry.names().join(", ")
            );
        };
        if !spec.embeddable || registry.embed_library_for(fs).is_none() {
            let embeddable: Vec<&str> = (registry.specs.iter())
                .filter(|s| s.embeddable)
                .map(|s| s.name)
                .collect();
            bail!(
                "--embed {arg:?}: file system {fs:?} cannot run embedded (embeddable: {}); \
                 mount it and use `{} run --mount` instead",
                if registry.embed_library.is_none() || embeddable.is_empty() {
                    "none in this program".to_string()
                } else {
                    embeddable.join(", ")
                },
                registry.program
            );
        }
        if backing.is_empty() {
            bail!("--embed {arg:?}: the backing directory is empty");
        }
        // A layered file system's BACKING is its directories joined by `:`,
        // each checked on its own.
        let parts: Vec<&str> = if spec.layered {
            backing.split(':').collect()
        } else {
            vec![backing]
        };
        let mut canon = std::ffi::OsString::new();
        for part in parts {
            let p = Path::new(part);
            let one = p
                .canonicalize()
                .with_context(|| format!("--embed {arg:?}: backing {}", p.display()))?;
            if !one.is_dir() {
                bail!(
                    "--embed {arg:?}: backing {} is not a directory",
                    p.display()
                );
            }
            if !canon.is_empty() {
                canon.push(":");
            }
            canon.push(one);
        }
        let canon = PathBuf::from(canon);
        let prefix = normalize_prefix(Path::new(prefix))
            .with_context(|| format!("--embed {arg:?}: bad PREFIX"))?;
        let options: Vec<String> = options
            .iter()
            .filter(|o| {
                let name = o.split_once('=').map_or(o.as_str(), |(k, _)| k);
                spec.options.contains(&name)
            })
            .cloned()
            .collect();
        let e = Embedding {
            fs: fs.to_string(),
            backing: canon,
            prefix,
            options,
            exclusive,
        };
        e.check_encodable()?;
        Ok(e)
    }

    /// What the file system's constructor is told: its backing directories
    /// (several for a layered one) and its options.
    pub fn fs_options(&self, spec: &FsSpec) -> FsOptions {
        let layers = if spec.layered {
            (self
                .backing
                .as_os_str()
                .as_encoded_bytes()
                .split(|b| *b == b':'))
            .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
            .collect()
        } else {
            vec![self.backing.clone()]
        };
        let mut custom = self.options.clone();
        if self.exclusive {
            custom.push(EXCLUSIVE.to_string());
        }
        FsOptions {
            read_only: false,
            layers,
            custom,
            resumed: false,
            embedded: true,
            whole_files_native: false,
        }
    }

    fn check_encodable(&self) -> Result<()> {
        let bad = |s: &str| s.contains([REC, FIELD, OPT]);
        for (what, s) in [
            ("backing", self.backing.to_string_lossy()),
            ("prefix", self.prefix.to_string_lossy()),
        ] {
            if bad(&s) || s.contains('\0') {
                bail!("--embed: the {what} {s:?} contains a tab, newline or \\x1f");
            }
        }
        if self.options.iter().any(|o| bad(o)) {
            bail!("-o: an option contains a tab, newline or \\x1f");
        }
        if self.backing.to_str().is_none() || self.prefix.to_str().is_none() {
            bail!("--embed: paths must be UTF-8");
        }
        Ok(())
    }
}

/// `rest` (after `FS:`) without a final `:SUFFIX`, and whether the suffix
/// was `exclusive`. A PREFIX is absolute, so a last field that does not
/// start with `/` after a field that does is a suffix; anything else is
/// left for the PREFIX checks to judge.
fn split_suffix<'a>(arg: &str, rest: &'a str) -> Result<(&'a str, bool)> {
    let Some((head, last)) = rest.rsplit_once(':') else {
        return Ok((rest, false));
    };
    let prefix_before = head
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.starts_with('/'));
    if last.starts_with('/') || !prefix_before {
        return Ok((rest, false));
    }
    if last != EXCLUSIVE_SUFFIX {
        bail!(
            "--embed {arg:?}: unknown suffix {last:?} after PREFIX (the only one is \
             `:{EXCLUSIVE_SUFFIX}`: FS:BACKING:PREFIX:{EXCLUSIVE_SUFFIX})"
        );
    }
    Ok((head, true))
}

/// An absolute prefix with no `.`, `..`, repeated or trailing `/`; not `/`.
fn normalize_prefix(p: &Path) -> Result<PathBuf> {
    if !p.is_absolute() {
        bail!("{} is not absolute", p.display());
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                bail!("{} contains `..`", p.display())
            }
        }
    }
    if out == Path::new("/") {
        bail!("the prefix cannot be `/`");
    }
    Ok(out)
}

/// Checks that no prefix contains another (each path belongs to one file
/// system).
pub fn check_disjoint(list: &[Embedding]) -> Result<()> {
    for (i, a) in list.iter().enumerate() {
        for b in &list[i + 1..] {
            if a.prefix.starts_with(&b.prefix) || b.prefix.starts_with(&a.prefix) {
                bail!(
                    "--embed prefixes {} and {} overlap",
                    a.prefix.display(),
                    b.prefix.display()
                );
            }
        }
    }
    Ok(())
}

/// The value of [`EMBED_ENV`] for `list`.
pub fn encode(list: &[Embedding]) -> String {
    let mut s = String::new();
    for e in list {
        if !s.is_empty() {
            s.push(REC);
        }
        s.push_str(&e.fs);
        s.push(FIELD);
        s.push_str(&e.backing.to_string_lossy());
        s.push(FIELD);
        s.push_str(&e.prefix.to_string_lossy());
        s.push(FIELD);
        let mut opts = e.options.clone();
        if e.exclusive {
            opts.push(EXCLUSIVE.to_string());
        }
        s.push_str(&opts.join(&OPT.to_string()));
    }
    s
}

/// Parses a value of [`EMBED_ENV`].
pub fn decode(s: &str) -> Result<Vec<Embedding>> {
    s.split(REC)
        .filter(|r| !r.is_empty())
        .map(|r| {
            let f: Vec<&str> = r.split(FIELD).collect();
            let [fs, backing, prefix, opts] = f[..] else {
                bail!("{EMBED_ENV}: malformed record {r:?}");
            };
            let mut options: Vec<String> = opts
                .split(OPT)
                .filter(|o| !o.is_empty())
                .map(str::to_string)
                .collect();
            let before = options.len();
            options.retain(|o| o != EXCLUSIVE);
            Ok(Embedding {
                fs: fs.to_string(),
                backing: PathBuf::from(backing),
                prefix: PathBuf::from(prefix),
                exclusive: options.len() != before,
                options,
            })
        })
        .collect()
}

/// Why `program` cannot run embedded (`Some`), if it is an executable the
/// loader does not start: a static or static-pie ELF has no `PT_INTERP`, so
/// `LD_PRELOAD` is never read. A `#!` script is judged by its interpreter.
/// `None` when it is dynamic or cannot be judged (the `exec` then says why).
pub fn static_refusal(program: &Path) -> Option<String> {
    let path = find_program(program)?;
    let bytes = read_head(&path)?;
    if let Some(rest) = bytes.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next()?;
        let interp = String::from_utf8_lossy(line);
        let interp = interp.split_whitespace().next()?;
        let ipath = Path::new(interp);
        return static_refusal(ipath)
            .map(|why| format!("{} (interpreter of {})", why, path.display()));
    }
    match elf_has_interp(&path, &bytes) {
        Some(false) => Some(format!(
            "{} is statically linked: it never loads the embedded file systems \
             (LD_PRELOAD is read by the dynamic loader), so its paths under the \
             prefixes would not exist; run a dynamically linked build, or mount \
             the file system instead",
            path.display()
        )),
        _ => None,
    }
}

/// `program` as `exec` finds it: a path with a `/`, or searched in `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|c| c.is_file())
}

/// The first 4 KiB of `path`.
fn read_head(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = vec![0; 4096];
    let n = f.read(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Whether a 64-bit little-endian ELF has a `PT_INTERP` program header
/// (`None`: not such an ELF, or unreadable).
fn elf_has_interp(path: &Path, head: &[u8]) -> Option<bool> {
    use std::io::{Read, Seek, SeekFrom};
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?);
    let phentsize = usize::from(u16_at(head, 54));
    let phnum = usize::from(u16_at(head, 56));
    if phentsize < 4 || phnum > 4096 {
        return None;
    }
    let mut table = vec![0; phentsize * phnum];
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut table).ok()?;
    const PT_INTERP: u32 = 3;
    Some(
        table
            .chunks_exact(phentsize)
            .any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_the_environment() {
        let list = vec![
            Embedding {
                fs: "passthrough".into(),
                backing: "/tmp/a b".into(),
                prefix: "/data".into(),
                options: vec![],
                exclusive: false,
            },
            Embedding {
                fs: "plfs".into(),
                backing: "/x:y".into(),
                prefix: "/ckpt/z".into(),
                options: vec!["hostid=h1".into(), "flag".into()],
                exclusive: false,
            },
            Embedding {
                fs: "passthrough".into(),
                backing: "/b".into(),
                prefix: "/own".into(),
                options: vec![format!("{NSGEN}=/run/g")],
                exclusive: true,
            },
        ];
        assert_eq!(decode(&encode(&list)).unwrap(), list);
    }

    #[test]
    fn the_exclusive_suffix_is_split_off_and_others_are_refused() {
        fn ok(r: &str) -> (&str, bool) {
            split_suffix("arg", r).unwrap()
        }
        assert_eq!(ok("/b:/p:exclusive"), ("/b:/p", true));
        assert_eq!(ok("/b:/p"), ("/b:/p", false));
        // A layered BACKING's colons are not a suffix.
        assert_eq!(ok("/u:/l:/p"), ("/u:/l:/p", false));
        assert_eq!(ok("/u:/l:/p:exclusive"), ("/u:/l:/p", true));
        // A relative PREFIX is left to the PREFIX checks.
        assert_eq!(ok("/b:rel"), ("/b:rel", false));
        let err = split_suffix("arg", "/b:/p:exclusiv")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown suffix \"exclusiv\"") && err.contains(":exclusive"),
            "{err}"
        );
    }

    #[test]
    fn prefixes_are_normalized_and_checked() {
        assert_eq!(
            normalize_prefix(Path::new("//data/./x/")).unwrap(),
            Path::new("/data/x")
        );
        assert!(normalize_prefix(Path::new("data")).is_err());
        assert!(normalize_prefix(Path::new("/")).is_err());
        assert!(normalize_prefix(Path::new("/a/../b")).is_err());
    }

    #[test]
    fn dynamic_and_static_programs_are_told_apart() {
        assert_eq!(static_refusal(Path::new("/bin/sh")), None);
        let exe = std::env::current_exe().unwrap();
        // Test binaries are dynamic PIEs.
        assert_eq!(static_refusal(&exe), None);
    }
}
