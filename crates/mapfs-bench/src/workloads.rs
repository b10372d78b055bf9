//! The workload catalogue (docs/workloads.md) and name selection.

use anyhow::{bail, Result};

use super::fio::{Files, FioJob};

/// Preallocated file read by the read workloads (`rd.0` .. `rd.<N-1>`).
pub const READ_PREFIX: &str = "rd";
/// Preallocated file overwritten by the random-write workloads.
pub const RANDWRITE_FILE: &str = "rw.0";
/// Files created (and removed) by the sequential-write workloads.
pub const WRITE_PREFIX: &str = "wr";
/// The shared file written (and removed) by the N-1 strided workload.
pub const STRIDED_FILE: &str = "n1.0";
/// The files of the small-file read workload (`sm.0.0` .. `sm.0.<N-1>`).
pub const SMALL_PREFIX: &str = "sm";
/// Size of each file of the small-file read workload, and of its reads.
pub const SMALL_FILE: u64 = 4096;

/// Which files a data workload's threads work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSet {
    /// All threads share one file.
    Shared,
    /// Each thread has its own file.
    PerThread,
    /// `--files` files of [`SMALL_FILE`] bytes, written first, all open at
    /// once, each I/O on one picked at random ("4 KiB random over
    /// many files": what a packed file system's reads cost per call).
    Small,
}

/// How many threads a data workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One thread.
    One,
    /// `--threads` threads.
    N,
}

/// What a workload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A fio job, run once per I/O size.
    Data {
        /// fio's `rw` mode.
        rw: &'static str,
        /// Thread count.
        threads: Threads,
        /// The files its threads work on.
        files: FileSet,
    },
    /// The in-process create/stat/unlink loop; one column per phase.
    CreateStatUnlink,
    /// Many small files written, then read back, in-process; one column
    /// per phase.
    SmallFiles,
    /// Many short-lived processes (`spawn-read`: 1,000 `cat`s of a small
    /// file; `build`: `make -j2` of a generated C project); one column.
    Procs(Procs),
    /// Files of 2 KiB-1 MiB rewritten whole again and again, in-process;
    /// the rewrite throughput, and what the backing store kept.
    Overwrite,
    /// Threads cycling delete/create/append/read/stat over a fileset, for
    /// `--runtime` seconds; one column.
    Fileserver {
        /// Thread count.
        threads: usize,
    },
}

/// The process-heavy workloads ([`Kind::Procs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Procs {
    /// A shell loop of `cat`s of one small file.
    SpawnRead,
    /// `make -j2` of a generated C project.
    Build,
    /// `tar xf` of an archive of 2,000 small files.
    Untar,
}

/// The column label of the process workloads.
pub const PROCS_COLUMN: &str = "run";

/// One workload: a name for the command line and tables, and what it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Name as accepted by `--workloads` and shown in tables.
    pub name: &'static str,
    /// One-line description (`N` is the `--threads` value).
    pub about: &'static str,
    /// What it does.
    pub kind: Kind,
}

const fn data(
    name: &'static str,
    about: &'static str,
    rw: &'static str,
    threads: Threads,
    files: FileSet,
) -> Workload {
    Workload {
        name,
        about,
        kind: Kind::Data { rw, threads, files },
    }
}

/// Every workload, in table order.
pub const WORKLOADS: &[Workload] = &[
    data(
        "seq-rd-1th-1f",
        "1 thread reads 1 preallocated file sequentially",
        "read",
        Threads::One,
        FileSet::PerThread,
    ),
    data(
        "seq-rd-Nth-Nf",
        "N threads each read their own preallocated file sequentially",
        "read",
        Threads::N,
        FileSet::PerThread,
    ),
    data(
        "seq-wr-1th-1f",
        "1 thread creates and writes 1 new file sequentially",
        "write",
        Threads::One,
        FileSet::PerThread,
    ),
    data(
        "seq-wr-Nth-Nf",
        "N threads each create and write their own new file",
        "write",
        Threads::N,
        FileSet::PerThread,
    ),
    data(
        "rnd-rd-1th-1f",
        "1 thread reads random offsets of 1 preallocated file",
        "randread",
        Threads::One,
        FileSet::Shared,
    ),
    data(
        "rnd-rd-Nth-1f",
        "N threads read random offsets of 1 preallocated file",
        "randread",
        Threads::N,
        FileSet::Shared,
    ),
    data(
        "rnd-wr-1th-1f",
        "1 thread writes random offsets of 1 preallocated file",
        "randwrite",
        Threads::One,
        FileSet::Shared,
    ),
    data(
        "rnd-wr-Nth-1f",
        "N threads write random offsets of 1 preallocated file",
        "randwrite",
        Threads::N,
        FileSet::Shared,
    ),
    data(
        "n1-strided-Nth",
        "N threads write 1 new shared file N-1 strided (thread i: blocks i, i+N, i+2N...; the PLFS checkpoint pattern)",
        "write",
        Threads::N,
        FileSet::Shared,
    ),
    data(
        "rnd-rd-small-files",
        "1 thread reads 4 KiB at random from --files files of 4 KiB, all open at once (written first, then read for --runtime seconds after a warm-up as long)",
        "randread",
        Threads::One,
        FileSet::Small,
    ),
    Workload {
        name: "create-stat-unlink",
        about: "create --files empty files in one directory, stat them, unlink them",
        kind: Kind::CreateStatUnlink,
    },
    Workload {
        name: "small-files",
        about: "write --files files of 4 KiB in directories of 1000, then read them back, then the same for one file of 1 MiB per 100 (files/s per phase; inodes and disk MiB the 4 KiB files took on the backing file system)",
        kind: Kind::SmallFiles,
    },
    Workload {
        name: "overwrite",
        about: "rewrite --overwrite-files files of 2 KiB-1 MiB (log-uniform) --rounds times whole (O_TRUNC), then syncfs (MB/s; and MiB the backing store kept: versions' history)",
        kind: Kind::Overwrite,
    },
    Workload {
        name: "fileserver-1th",
        about: "1 thread cycles delete, create 16 KiB, append 4 KiB, read, stat over 1000 files (ops/s)",
        kind: Kind::Fileserver { threads: 1 },
    },
    Workload {
        name: "fileserver-4th",
        about: "4 threads cycle delete, create 16 KiB, append 4 KiB, read, stat over 1000 files (ops/s)",
        kind: Kind::Fileserver { threads: 4 },
    },
    Workload {
        name: "fileserver-16th",
        about: "16 threads cycle delete, create 16 KiB, append 4 KiB, read, stat over 1000 files (ops/s)",
        kind: Kind::Fileserver { threads: 16 },
    },
    Workload {
        name: "spawn-read",
        about: "a shell loop of 1000 processes, each reading one 8 KiB file (processes/s)",
        kind: Kind::Procs(Procs::SpawnRead),
    },
    Workload {
        name: "untar",
        about: "tar xf of 2000 small files in 40 directories (files/s)",
        kind: Kind::Procs(Procs::Untar),
    },
    Workload {
        name: "build",
        about: "make -j2 of a generated 41-file C project, then run it (files compiled/s)",
        kind: Kind::Procs(Procs::Build),
    },
];

/// The subset `--quick` runs.
pub const QUICK: &[&str] = &[
    "seq-rd-1th-1f",
    "seq-wr-1th-1f",
    "rnd-rd-Nth-1f",
    "rnd-wr-Nth-1f",
    "create-stat-unlink",
];

/// Column labels of the create-stat-unlink table.
pub const META_PHASES: &[&str] = &["create", "stat", "unlink"];

/// The timed phases of small-files: its 4 KiB files, then its 1 MiB files.
pub const SMALL_PHASES: &[&str] = &["write", "read", "write 1M", "read 1M"];

/// Column labels of the small-files table: the phases, then what the 4 KiB
/// files took on the backing file system (inodes, and disk space in MiB).
pub const SMALL_COLUMNS: &[&str] = &["write", "read", "write 1M", "read 1M", "inodes", "disk MiB"];

/// The timed phase of overwrite (its "operations" are bytes).
pub const OVERWRITE_PHASE: &str = "MB/s";

/// The overwrite column of the space the backing store held more after the
/// run than before it.
pub const KEPT_COLUMN: &str = "kept MiB";

/// Column labels of the overwrite table: the rewrite throughput, then
/// [`KEPT_COLUMN`].
pub const OVERWRITE_COLUMNS: &[&str] = &[OVERWRITE_PHASE, KEPT_COLUMN];

/// Files of overwrite (the workload list's), unless `--overwrite-files`.
pub const OVERWRITE_FILES: usize = 1000;

/// Rewrites of each file of overwrite, unless `--rounds`.
pub const OVERWRITE_ROUNDS: usize = 10;

impl Kind {
    /// The table columns of an in-process phased workload.
    pub fn phases(&self) -> Option<&'static [&'static str]> {
        match self {
            Kind::CreateStatUnlink => Some(META_PHASES),
            Kind::SmallFiles => Some(SMALL_COLUMNS),
            Kind::Overwrite => Some(OVERWRITE_COLUMNS),
            _ => None,
        }
    }
}

impl Workload {
    /// Whether the workload needs fio.
    pub fn is_data(&self) -> bool {
        matches!(self.kind, Kind::Data { .. })
    }

    /// Whether the workload reads (so the page cache matters).
    pub fn is_read(&self) -> bool {
        matches!(self.kind, Kind::Data { rw, .. } if rw.contains("read"))
    }

    /// Number of threads with `--threads n`.
    pub fn thread_count(&self, n: usize) -> usize {
        match self.kind {
            Kind::Data {
                threads: Threads::N,
                ..
            } => n,
            _ => 1,
        }
    }

    /// The fio job for this workload, or `None` for a metadata workload.
    ///
    /// A [`FileSet::Small`] workload's I/O and file size are [`SMALL_FILE`]
    /// whatever `bs` and `size`; its file count is the caller's to set
    /// ([`FioJob::nrfiles`]).
    pub fn fio_job(&self, bs: u64, size: u64, n: usize, runtime: u64, cap: u64) -> Option<FioJob> {
        let Kind::Data { rw, files, .. } = self.kind else {
            return None;
        };
        let random = rw.starts_with("rand");
        let write = rw.contains("write");
        let (bs, size) = match files {
            FileSet::Small => (SMALL_FILE, SMALL_FILE),
            _ => (bs, size),
        };
        let fio_files = match (files, write) {
            (FileSet::Small, _) => Files::Small(SMALL_PREFIX.into()),
            (FileSet::PerThread, true) => Files::PerThread(WRITE_PREFIX.into()),
            (FileSet::PerThread, false) => Files::PerThread(READ_PREFIX.into()),
            (FileSet::Shared, true) if rw == "write" => Files::Strided(STRIDED_FILE.into()),
            (FileSet::Shared, true) => Files::Shared(RANDWRITE_FILE.into()),
            (FileSet::Shared, false) => Files::Shared(format!("{READ_PREFIX}.0")),
        };
        Some(FioJob {
            rw,
            bs,
            size,
            threads: self.thread_count(n),
            files: fio_files,
            time_based: random.then_some(runtime),
            runtime_cap: cap,
            unlink: files == FileSet::PerThread && write,
            nrfiles: 1,
        })
    }

    /// Whether the workload works on [`FileSet::Small`].
    pub fn is_small(&self) -> bool {
        matches!(
            self.kind,
            Kind::Data {
                files: FileSet::Small,
                ..
            }
        )
    }
}

/// Matches `name` against a shell-style pattern with `*` and `?`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((b'?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// The workloads matching any of `patterns` (names or globs), in catalogue
/// order; a pattern matching nothing is an error naming the valid names.
pub fn select(patterns: &[String]) -> Result<Vec<Workload>> {
    for p in patterns {
        if !WORKLOADS.iter().any(|w| glob_match(p, w.name)) {
            let names: Vec<_> = WORKLOADS.iter().map(|w| w.name).collect();
            bail!("no workload matches {p:?}; workloads: {}", names.join(", "));
        }
    }
    Ok(WORKLOADS
        .iter()
        .filter(|w| patterns.iter().any(|p| glob_match(p, w.name)))
        .copied()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("seq-*", "seq-rd-1th-1f"));
        assert!(glob_match("*-1th-*", "rnd-wr-1th-1f"));
        assert!(glob_match("rnd-??-Nth-1f", "rnd-rd-Nth-1f"));
        assert!(!glob_match("seq-*", "rnd-rd-Nth-1f"));
        assert!(glob_match("create-stat-unlink", "create-stat-unlink"));
        assert!(!glob_match("create", "create-stat-unlink"));
    }

    #[test]
    fn selection_keeps_catalogue_order_and_rejects_unknown() {
        let w = select(&["create-stat-unlink".into(), "rnd-rd-*".into()]).unwrap();
        let names: Vec<_> = w.iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                "rnd-rd-1th-1f",
                "rnd-rd-Nth-1f",
                "rnd-rd-small-files",
                "create-stat-unlink"
            ]
        );
        assert!(select(&["nope".into()]).is_err());
        assert_eq!(select(&["*".into()]).unwrap().len(), WORKLOADS.len());
        for q in QUICK {
            assert!(WORKLOADS.iter().any(|w| w.name == *q));
        }
    }

    #[test]
    fn jobs_use_the_right_files() {
        let get = |n: &str| *WORKLOADS.iter().find(|w| w.name == n).unwrap();
        let j = get("seq-wr-Nth-Nf")
            .fio_job(4096, 1 << 20, 4, 5, 60)
            .unwrap();
        assert_eq!((j.threads, j.unlink, j.time_based), (4, true, None));
        assert_eq!(j.files, Files::PerThread("wr".into()));
        let j = get("rnd-rd-1th-1f")
            .fio_job(4096, 1 << 20, 4, 5, 60)
            .unwrap();
        assert_eq!((j.threads, j.unlink, j.time_based), (1, false, Some(5)));
        assert_eq!(j.files, Files::Shared("rd.0".into()));
        let j = get("rnd-wr-Nth-1f")
            .fio_job(4096, 1 << 20, 3, 5, 60)
            .unwrap();
        assert_eq!(j.files, Files::Shared(RANDWRITE_FILE.into()));
        assert_eq!(j.threads, 3);
        let j = get("rnd-rd-small-files")
            .fio_job(1 << 20, 1 << 28, 4, 5, 60)
            .unwrap();
        assert_eq!(j.files, Files::Small(SMALL_PREFIX.into()));
        assert_eq!(
            (j.bs, j.size, j.threads, j.time_based, j.unlink),
            (SMALL_FILE, SMALL_FILE, 1, Some(5), false),
            "small files are 4 KiB, read 4 KiB at a time by one thread"
        );
        assert!(get("create-stat-unlink")
            .fio_job(4096, 1, 1, 1, 1)
            .is_none());
    }
}
