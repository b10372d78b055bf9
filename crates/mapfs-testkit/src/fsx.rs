//! fsx-style random-operation exerciser.
//!
//! Creates a file in a directory and applies a seeded random sequence of data
//! operations to it (write, read, truncate, mmap read/write, fallocate, punch
//! hole, zero range, copy_file_range, the clone ioctls, fsync, close+reopen),
//! checking every read
//! and the file size against an in-memory byte model. The same seed always
//! produces the same sequence, so a failure is reproduced by re-running with
//! the printed seed.
//!
//! Everything goes through raw syscalls with explicit offsets (pread/pwrite,
//! mmap, fallocate, copy_file_range) so the exerciser behaves the same when run
//! under an LD_PRELOAD shim.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustix::fs::{FallocateFlags, Mode, OFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, MsyncFlags, ProtFlags};

/// Settings of one exerciser run.
#[derive(Debug, Clone)]
pub struct FsxConfig {
    /// Directory in which the test files are created.
    pub dir: PathBuf,
    /// Seed of the operation sequence.
    pub seed: u64,
    /// Number of operations.
    pub ops: u64,
    /// Largest file size the operations produce.
    pub maxlen: u64,
    /// Largest single operation.
    pub max_op_len: u64,
    /// Run mmap read/write operations.
    pub mmap: bool,
    /// Run fallocate, punch-hole and zero-range operations.
    pub fallocate: bool,
    /// Run copy_file_range operations.
    pub copy_range: bool,
    /// Run the clone ioctls (`FICLONERANGE` from the source file into the
    /// data file, `FICLONE` of the data file into a fresh file). Off by
    /// default: most file systems answer `EOPNOTSUPP`, which the report
    /// counts as skipped.
    pub clone: bool,
    /// Close and reopen the data file now and then (checking all of it).
    pub close_open: bool,
    /// How many recent operations a failure report shows.
    pub log_tail: usize,
    /// Keep the test files after a successful run.
    pub keep: bool,
    /// Print every operation to stderr as it runs (to find which one a
    /// failure seen elsewhere came from).
    pub print_ops: bool,
    /// Also run O_DIRECT reads and writes (block-aligned, through a second
    /// descriptor) mixed with the buffered and mapped operations.
    pub direct: bool,
}

impl FsxConfig {
    /// Defaults (256 KiB files, 64 KiB ops, every op kind enabled) for `dir`.
    pub fn new(dir: impl Into<PathBuf>, seed: u64, ops: u64) -> Self {
        FsxConfig {
            dir: dir.into(),
            seed,
            ops,
            maxlen: 256 * 1024,
            max_op_len: 64 * 1024,
            mmap: true,
            fallocate: true,
            copy_range: true,
            clone: false,
            close_open: true,
            log_tail: 32,
            keep: false,
            print_ops: false,
            direct: false,
        }
    }

    /// The operation kinds this configuration runs.
    pub fn enabled_kinds(&self) -> Vec<OpKind> {
        OpKind::ALL
            .into_iter()
            .filter(|k| self.enables(*k))
            .collect()
    }

    fn enables(&self, k: OpKind) -> bool {
        match k {
            OpKind::MapRead | OpKind::MapWrite => self.mmap,
            OpKind::FallocKeepSize
            | OpKind::FallocExtend
            | OpKind::PunchHole
            | OpKind::ZeroRange => self.fallocate,
            OpKind::CopyWithin | OpKind::CopyFrom => self.copy_range,
            OpKind::DirectWrite | OpKind::DirectRead => self.direct,
            OpKind::CloneRange | OpKind::CloneWhole => self.clone,
            OpKind::Reopen => self.close_open,
            _ => true,
        }
    }
}

/// Kinds of operation, each counted separately in the [`FsxReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// pwrite (may extend the file).
    Write,
    /// pread (may reach past EOF).
    Read,
    /// ftruncate to a larger size.
    TruncateGrow,
    /// ftruncate to a smaller (or equal) size.
    TruncateShrink,
    /// Read through a shared read-only mapping.
    MapRead,
    /// Write through a shared mapping followed by msync (extends with ftruncate first).
    MapWrite,
    /// fallocate(FALLOC_FL_KEEP_SIZE).
    FallocKeepSize,
    /// fallocate(0), which may extend the file.
    FallocExtend,
    /// fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).
    PunchHole,
    /// fallocate(FALLOC_FL_ZERO_RANGE [| KEEP_SIZE]).
    ZeroRange,
    /// copy_file_range between two disjoint ranges of the file.
    CopyWithin,
    /// copy_file_range from a second file.
    CopyFrom,
    /// fsync or fdatasync.
    Fsync,
    /// close and reopen, then verify the whole file.
    Reopen,
    /// Block-aligned pwrite through an O_DIRECT descriptor.
    DirectWrite,
    /// Block-aligned pread through an O_DIRECT descriptor.
    DirectRead,
    /// `FICLONERANGE` of block-aligned bytes of the source file.
    CloneRange,
    /// `FICLONE` of the whole data file into a fresh file, which must then
    /// read as the model.
    CloneWhole,
}

impl OpKind {
    /// Every kind, in report order.
    pub const ALL: [OpKind; 18] = [
        OpKind::Write,
        OpKind::Read,
        OpKind::TruncateGrow,
        OpKind::TruncateShrink,
        OpKind::MapRead,
        OpKind::MapWrite,
        OpKind::FallocKeepSize,
        OpKind::FallocExtend,
        OpKind::PunchHole,
        OpKind::ZeroRange,
        OpKind::CopyWithin,
        OpKind::CopyFrom,
        OpKind::Fsync,
        OpKind::Reopen,
        OpKind::DirectWrite,
        OpKind::DirectRead,
        OpKind::CloneRange,
        OpKind::CloneWhole,
    ];

    /// Short name used in logs and summaries.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::TruncateGrow => "trunc_grow",
            OpKind::TruncateShrink => "trunc_shrink",
            OpKind::MapRead => "mapread",
            OpKind::MapWrite => "mapwrite",
            OpKind::FallocKeepSize => "falloc_keep",
            OpKind::FallocExtend => "falloc_extend",
            OpKind::PunchHole => "punch_hole",
            OpKind::ZeroRange => "zero_range",
            OpKind::CopyWithin => "copy_within",
            OpKind::CopyFrom => "copy_from",
            OpKind::Fsync => "fsync",
            OpKind::Reopen => "reopen",
            OpKind::DirectWrite => "direct_write",
            OpKind::DirectRead => "direct_read",
            OpKind::CloneRange => "clone_range",
            OpKind::CloneWhole => "clone",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Result of a successful run.
#[derive(Debug, Clone, Default)]
pub struct FsxReport {
    /// Seed used.
    pub seed: u64,
    /// Operations performed.
    pub ops: u64,
    /// Operations that ran, by kind.
    pub done: BTreeMap<OpKind, u64>,
    /// Operations the file system refused with EOPNOTSUPP (or ENOSYS, EXDEV for
    /// copy_file_range, ENODEV for mmap), by kind, with the last errno seen.
    pub skipped: BTreeMap<OpKind, (u64, Errno)>,
    /// File size at the end.
    pub final_size: u64,
}

impl FsxReport {
    /// How many operations of `kind` really ran.
    pub fn count(&self, kind: OpKind) -> u64 {
        self.done.get(&kind).copied().unwrap_or(0)
    }
}

impl fmt::Display for FsxReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fsx ok: seed={} ops={} final_size={} |",
            self.seed, self.ops, self.final_size
        )?;
        for k in OpKind::ALL {
            write!(f, " {}={}", k, self.count(k))?;
        }
        if !self.skipped.is_empty() {
            write!(f, " | skipped:")?;
            for (k, (n, e)) in &self.skipped {
                write!(f, " {k}={n}({})", errno_name(*e))?;
            }
        }
        Ok(())
    }
}

/// A detected divergence (or unexpected error) with everything needed to
/// reproduce it.
#[derive(Debug, Clone)]
pub struct FsxFailure {
    /// Seed of the run.
    pub seed: u64,
    /// 1-based number of the failing operation (0: set-up).
    pub op: u64,
    /// What went wrong.
    pub message: String,
    /// First differing file offset, for content mismatches.
    pub first_diff: Option<u64>,
    /// The most recent operations, oldest first.
    pub log_tail: Vec<String>,
}

impl fmt::Display for FsxFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fsx FAILED: seed={} op={}: {}",
            self.seed, self.op, self.message
        )?;
        if let Some(off) = self.first_diff {
            writeln!(f, "first differing offset: {off} ({off:#x})")?;
        }
        writeln!(f, "last {} operations:", self.log_tail.len())?;
        for l in &self.log_tail {
            writeln!(f, "  {l}")?;
        }
        write!(
            f,
            "reproduce with: mapfs-fsx --dir DIR --seed {} --ops {}",
            self.seed,
            self.op.max(1)
        )
    }
}

impl std::error::Error for FsxFailure {}

/// Short symbolic name of an errno, for logs.
pub fn errno_name(e: Errno) -> String {
    let n = e.raw_os_error();
    let name = match n {
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::ENOSPC => "ENOSPC",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        _ => return format!("errno {n}"),
    };
    name.to_string()
}

/// Kind of failure while executing one op.
enum OpError {
    /// The fs does not support this operation: counted as skipped.
    Unsupported(Errno),
    /// Anything else: the run fails.
    Fail(String, Option<u64>),
}

type OpResult = Result<(), OpError>;

fn sys(what: &str, e: Errno) -> OpError {
    OpError::Fail(format!("{what} failed: {} ({e})", errno_name(e)), None)
}

/// Seeded exerciser state.
struct Fsx {
    cfg: FsxConfig,
    rng: ChaCha8Rng,
    path: PathBuf,
    fd: Option<OwnedFd>,
    /// O_DIRECT descriptor of the same file (`cfg.direct`); `Err` holds why
    /// the file system refused O_DIRECT.
    dfd: Result<OwnedFd, Errno>,
    model: Vec<u8>,
    src_fd: OwnedFd,
    src_model: Vec<u8>,
    page: u64,
    log: VecDeque<String>,
    op_no: u64,
    report: FsxReport,
}

/// Runs the exerciser described by `cfg`.
pub fn run(cfg: &FsxConfig) -> Result<FsxReport, FsxFailure> {
    let mut fsx = Fsx::setup(cfg.clone())?;
    let r = fsx.run_all();
    match r {
        Ok(()) => {
            let report = fsx.report.clone();
            if !cfg.keep {
                fsx.fd = None;
                let _ = std::fs::remove_file(&fsx.path);
                let _ = std::fs::remove_file(src_path(cfg));
                let _ = std::fs::remove_file(clone_path(cfg));
            }
            Ok(report)
        }
        Err(e) => Err(e),
    }
}

/// The file a run with `cfg` exercises (created, or truncated, at its start).
pub fn data_path(cfg: &FsxConfig) -> PathBuf {
    cfg.dir.join(format!("fsx-{}.data", cfg.seed))
}

fn src_path(cfg: &FsxConfig) -> PathBuf {
    cfg.dir.join(format!("fsx-{}.src", cfg.seed))
}

/// Where `FICLONE` puts its copy of the data file.
fn clone_path(cfg: &FsxConfig) -> PathBuf {
    cfg.dir.join(format!("fsx-{}.clone", cfg.seed))
}

/// Alignment of O_DIRECT offsets, lengths and buffers (safe for 512-byte and
/// 4 KiB logical blocks).
const DIRECT_BLOCK: u64 = 4096;

/// The O_DIRECT descriptor, or why there is none (EINVAL: the fs refuses it).
fn open_direct(path: &std::path::Path, wanted: bool) -> Result<OwnedFd, Errno> {
    if !wanted {
        return Err(Errno::NOSYS);
    }
    open_rw(path, OFlags::DIRECT)
}

fn open_rw(path: &std::path::Path, extra: OFlags) -> Result<OwnedFd, Errno> {
    crate::libc_io::open(
        path,
        OFlags::RDWR | OFlags::CLOEXEC | extra,
        Mode::from_raw_mode(0o644),
    )
}

/// Reads exactly `buf.len()` bytes at `off` unless EOF comes first; returns
/// the number read.
fn pread_full(fd: impl AsFd, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
    let mut done = 0;
    while done < buf.len() {
        let n = crate::libc_io::pread(fd.as_fd(), &mut buf[done..], off + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

fn pwrite_full(fd: impl AsFd, buf: &[u8], off: u64) -> Result<(), Errno> {
    let mut done = 0;
    while done < buf.len() {
        let n = crate::libc_io::pwrite(fd.as_fd(), &buf[done..], off + done as u64)?;
        if n == 0 {
            return Err(Errno::IO);
        }
        done += n;
    }
    Ok(())
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(if a.len() != b.len() {
            Some(a.len().min(b.len()))
        } else {
            None
        })
}

fn is_unsupported(e: Errno) -> bool {
    e == Errno::OPNOTSUPP || e == Errno::NOSYS
}

impl Fsx {
    fn setup(cfg: FsxConfig) -> Result<Self, FsxFailure> {
        let fail = |message: String| FsxFailure {
            seed: cfg.seed,
            op: 0,
            message,
            first_diff: None,
            log_tail: Vec::new(),
        };
        if cfg.direct && cfg.max_op_len < DIRECT_BLOCK {
            return Err(fail(format!(
                "bad config: O_DIRECT ops need max_op_len >= {DIRECT_BLOCK}"
            )));
        }
        if cfg.max_op_len == 0 || cfg.maxlen < cfg.max_op_len {
            return Err(fail(format!(
                "bad config: maxlen {} must be >= max_op_len {} > 0",
                cfg.maxlen, cfg.max_op_len
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let path = data_path(&cfg);
        let fd = open_rw(&path, OFlags::CREATE | OFlags::TRUNC)
            .map_err(|e| fail(format!("creating {}: {e}", path.display())))?;
        // The copy source holds random bytes of random length; it is never changed.
        let src_len = rng.random_range(1..=cfg.maxlen) as usize;
        let mut src_model = vec![0u8; src_len];
        rng.fill(&mut src_model[..]);
        let sp = src_path(&cfg);
        let src_fd = open_rw(&sp, OFlags::CREATE | OFlags::TRUNC)
            .map_err(|e| fail(format!("creating {}: {e}", sp.display())))?;
        pwrite_full(&src_fd, &src_model, 0)
            .map_err(|e| fail(format!("writing {}: {e}", sp.display())))?;
        let page = rustix::param::page_size() as u64;
        let dfd = open_direct(&path, cfg.direct);
        Ok(Fsx {
            rng,
            dfd,
            path,
            fd: Some(fd),
            model: Vec::new(),
            src_fd,
            src_model,
            page,
            log: VecDeque::new(),
            op_no: 0,
            report: FsxReport {
                seed: cfg.seed,
                ..Default::default()
            },
            cfg,
        })
    }

    fn fd(&self) -> &OwnedFd {
        self.fd.as_ref().expect("file is open between operations")
    }

    fn failure(&self, message: String, first_diff: Option<u64>) -> FsxFailure {
        FsxFailure {
            seed: self.cfg.seed,
            op: self.op_no,
            message,
            first_diff,
            log_tail: self.log.iter().cloned().collect(),
        }
    }

    fn log(&mut self, entry: String) {
        if self.log.len() == self.cfg.log_tail.max(1) {
            self.log.pop_front();
        }
        let line = format!(
            "{:6} {entry} (size before {:#x})",
            self.op_no,
            self.model.len()
        );
        if self.cfg.print_ops {
            // Wall-clock seconds, to line up with a daemon's log.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!("{}.{:06} {line}", t.as_secs(), t.subsec_micros());
        }
        self.log.push_back(line);
    }

    fn run_all(&mut self) -> Result<(), FsxFailure> {
        for _ in 0..self.cfg.ops {
            self.op_no += 1;
            let kind = self.pick_kind();
            let kind = self.substitute(kind);
            match self.do_op(kind) {
                Ok(()) => *self.report.done.entry(kind).or_default() += 1,
                Err(OpError::Unsupported(e)) => {
                    if let Some(last) = self.log.back_mut() {
                        last.push_str(&format!(" -> skipped {}", errno_name(e)));
                    }
                    let ent = self.report.skipped.entry(kind).or_insert((0, e));
                    ent.0 += 1;
                    ent.1 = e;
                }
                Err(OpError::Fail(msg, off)) => return Err(self.failure(msg, off)),
            }
            self.check_size().map_err(|(m, o)| self.failure(m, o))?;
            // Every 1000 ops (kept as `%` for the crate's MSRV 1.85).
            let since_full_check = self.op_no % 1000;
            if since_full_check == 0 {
                self.check_all("periodic full check")
                    .map_err(|(m, o)| self.failure(m, o))?;
            }
        }
        self.report.ops = self.op_no;
        self.check_all("final full check")
            .map_err(|(m, o)| self.failure(m, o))?;
        let mut buf = vec![0u8; self.src_model.len() + 1];
        let n = pread_full(&self.src_fd, &mut buf, 0)
            .map_err(|e| self.failure(format!("reading source file: {e}"), None))?;
        if let Some(d) = first_diff(&self.src_model, &buf[..n]) {
            return Err(self.failure("copy source file changed".into(), Some(d as u64)));
        }
        self.report.final_size = self.model.len() as u64;
        Ok(())
    }

    fn pick_kind(&mut self) -> OpKind {
        // Weights: plenty of data traffic, every other kind often enough that a
        // 10k-op run exercises each of them many times.
        let table: &[(OpKind, u32)] = &[
            (OpKind::Write, 20),
            (OpKind::Read, 20),
            (OpKind::TruncateGrow, 3),
            (OpKind::TruncateShrink, 3),
            (OpKind::MapRead, 7),
            (OpKind::MapWrite, 7),
            (OpKind::FallocKeepSize, 4),
            (OpKind::FallocExtend, 4),
            (OpKind::PunchHole, 5),
            (OpKind::ZeroRange, 5),
            (OpKind::CopyWithin, 5),
            (OpKind::CopyFrom, 5),
            (OpKind::Fsync, 3),
            (OpKind::Reopen, 2),
            (OpKind::DirectWrite, 8),
            (OpKind::DirectRead, 8),
            (OpKind::CloneRange, 3),
            (OpKind::CloneWhole, 2),
        ];
        let enabled = |k: OpKind| self.cfg.enables(k);
        let total: u32 = table
            .iter()
            .filter(|(k, _)| enabled(*k))
            .map(|(_, w)| w)
            .sum();
        let mut x = self.rng.random_range(0..total);
        for (k, w) in table.iter().filter(|(k, _)| enabled(*k)) {
            if x < *w {
                return *k;
            }
            x -= w;
        }
        OpKind::Write
    }

    /// Ops that need file content fall back to a write on an empty file.
    fn substitute(&self, kind: OpKind) -> OpKind {
        match kind {
            OpKind::MapRead | OpKind::CopyWithin if self.model.is_empty() => OpKind::Write,
            OpKind::TruncateShrink if self.model.is_empty() => OpKind::TruncateGrow,
            OpKind::TruncateGrow if self.model.len() as u64 >= self.cfg.maxlen => {
                OpKind::TruncateShrink
            }
            k => k,
        }
    }

    /// Random (offset, len) with `off + len <= maxlen`, `len >= 1`.
    fn range(&mut self) -> (u64, u64) {
        let len = self.rng.random_range(1..=self.cfg.max_op_len);
        let off = self.rng.random_range(0..=self.cfg.maxlen - len);
        (off, len)
    }

    /// Like [`Self::range`] but biased to start inside the current file.
    fn range_in_file(&mut self) -> (u64, u64) {
        let size = self.model.len() as u64;
        if size == 0 || self.rng.random_range(0..10) == 0 {
            return self.range();
        }
        let off = self.rng.random_range(0..size);
        let len = self
            .rng
            .random_range(1..=self.cfg.max_op_len.min(self.cfg.maxlen - off));
        (off, len)
    }

    fn set_model_len(&mut self, len: u64) {
        self.model.resize(len as usize, 0);
    }

    fn model_write(&mut self, off: u64, data: &[u8]) {
        let end = off as usize + data.len();
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(data);
    }

    fn model_zero(&mut self, off: u64, len: u64) {
        let size = self.model.len() as u64;
        if off >= size {
            return;
        }
        let end = (off + len).min(size);
        self.model[off as usize..end as usize].fill(0);
    }

    /// Data for one write: a xorshift stream keyed by one draw of the seeded
    /// rng, cheap even in unoptimised test builds and never periodic within a
    /// file, so misplaced bytes are always detected.
    fn random_bytes(&mut self, len: u64) -> Vec<u8> {
        let mut x: u64 = self.rng.random::<u64>() | 1;
        let mut v = Vec::with_capacity(len as usize + 8);
        while v.len() < len as usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(len as usize);
        v
    }

    fn do_op(&mut self, kind: OpKind) -> OpResult {
        match kind {
            OpKind::Write => {
                let (off, len) = self.range();
                self.log(format!("write {off:#x} len {len:#x}"));
                let data = self.random_bytes(len);
                pwrite_full(self.fd(), &data, off).map_err(|e| sys("pwrite", e))?;
                self.model_write(off, &data);
                Ok(())
            }
            OpKind::Read => {
                let (off, len) = self.range_in_file();
                self.log(format!("read {off:#x} len {len:#x}"));
                self.check_read(off, len)
            }
            OpKind::TruncateGrow | OpKind::TruncateShrink => {
                let size = self.model.len() as u64;
                let new = if kind == OpKind::TruncateGrow {
                    self.rng.random_range(size + 1..=self.cfg.maxlen)
                } else {
                    self.rng.random_range(0..=size)
                };
                self.log(format!("{kind} to {new:#x}"));
                crate::libc_io::ftruncate(self.fd(), new).map_err(|e| sys("ftruncate", e))?;
                self.set_model_len(new);
                Ok(())
            }
            OpKind::MapRead => {
                let size = self.model.len() as u64;
                let off = self.rng.random_range(0..size);
                let len = self
                    .rng
                    .random_range(1..=self.cfg.max_op_len.min(size - off));
                self.log(format!("mapread {off:#x} len {len:#x}"));
                let pg = off & !(self.page - 1);
                let map_len = (off + len - pg) as usize;
                // SAFETY: mmap wrapper; a fresh mapping of our own fd, unmapped below.
                let p = unsafe {
                    crate::libc_io::mmap(
                        std::ptr::null_mut(),
                        map_len,
                        ProtFlags::READ,
                        MapFlags::SHARED,
                        self.fd(),
                        pg,
                    )
                };
                let p = match p {
                    Ok(p) => p,
                    Err(e) if is_unsupported(e) || e == Errno::NODEV => {
                        return Err(OpError::Unsupported(e))
                    }
                    Err(e) => return Err(sys("mmap(read)", e)),
                };
                let mut got = vec![0u8; len as usize];
                // SAFETY: [pg, pg+map_len) is mapped and lies within the file
                // size (off + len <= size), so no SIGBUS; copy out then unmap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (p as *const u8).add((off - pg) as usize),
                        got.as_mut_ptr(),
                        len as usize,
                    );
                    crate::libc_io::munmap(p, map_len).map_err(|e| sys("munmap", e))?;
                }
                let want = &self.model[off as usize..(off + len) as usize];
                if let Some(d) = first_diff(want, &got) {
                    return Err(OpError::Fail(
                        format!(
                            "mapread mismatch at {:#x}: expected {:#04x} got {:#04x}",
                            off + d as u64,
                            want[d],
                            got[d]
                        ),
                        Some(off + d as u64),
                    ));
                }
                Ok(())
            }
            OpKind::MapWrite => {
                let (off, len) = self.range();
                let size = self.model.len() as u64;
                let grow = off + len > size;
                self.log(format!(
                    "mapwrite {off:#x} len {len:#x}{}",
                    if grow { " (ftruncate up first)" } else { "" }
                ));
                let pg = off & !(self.page - 1);
                let map_len = (off + len - pg) as usize;
                // A mapping cannot extend the file: grow it first, as fsx does.
                if grow {
                    crate::libc_io::ftruncate(self.fd(), off + len)
                        .map_err(|e| sys("ftruncate before mapwrite", e))?;
                    self.set_model_len(off + len);
                }
                let data = self.random_bytes(len);
                // SAFETY: mmap wrapper; a fresh mapping of our own fd, unmapped below.
                let p = unsafe {
                    crate::libc_io::mmap(
                        std::ptr::null_mut(),
                        map_len,
                        ProtFlags::READ | ProtFlags::WRITE,
                        MapFlags::SHARED,
                        self.fd(),
                        pg,
                    )
                };
                let p = match p {
                    Ok(p) => p,
                    Err(e) if is_unsupported(e) || e == Errno::NODEV => {
                        return Err(OpError::Unsupported(e))
                    }
                    Err(e) => return Err(sys("mmap(write)", e)),
                };
                // SAFETY: the mapping covers [pg, off+len) and the file is at
                // least off+len long; copy in, flush, unmap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        (p as *mut u8).add((off - pg) as usize),
                        len as usize,
                    );
                    let r = crate::libc_io::msync(p, map_len, MsyncFlags::SYNC);
                    crate::libc_io::munmap(p, map_len).map_err(|e| sys("munmap", e))?;
                    r.map_err(|e| sys("msync", e))?;
                }
                self.model_write(off, &data);
                Ok(())
            }
            OpKind::FallocKeepSize
            | OpKind::FallocExtend
            | OpKind::PunchHole
            | OpKind::ZeroRange => {
                let (off, len) = self.range_in_file();
                let keep = match kind {
                    OpKind::FallocKeepSize | OpKind::PunchHole => true,
                    OpKind::FallocExtend => false,
                    _ => self.rng.random_bool(0.5),
                };
                let mut flags = if keep {
                    FallocateFlags::KEEP_SIZE
                } else {
                    FallocateFlags::empty()
                };
                match kind {
                    OpKind::PunchHole => flags |= FallocateFlags::PUNCH_HOLE,
                    OpKind::ZeroRange => flags |= FallocateFlags::ZERO_RANGE,
                    _ => {}
                }
                self.log(format!(
                    "{kind} {off:#x} len {len:#x}{}",
                    if keep { " keep_size" } else { "" }
                ));
                match crate::libc_io::fallocate(self.fd(), flags, off, len) {
                    Ok(()) => {}
                    Err(e) if is_unsupported(e) => return Err(OpError::Unsupported(e)),
                    Err(e) => return Err(sys(&format!("fallocate({flags:?})"), e)),
                }
                if matches!(kind, OpKind::PunchHole | OpKind::ZeroRange) {
                    self.model_zero(off, len);
                }
                if !keep && off + len > self.model.len() as u64 {
                    self.set_model_len(off + len);
                }
                Ok(())
            }
            OpKind::CopyWithin => {
                let size = self.model.len() as u64;
                let src = self.rng.random_range(0..size);
                let len = self
                    .rng
                    .random_range(1..=self.cfg.max_op_len.min(size - src));
                // Overlapping ranges within one file are EINVAL by contract;
                // pick a disjoint destination, or fall back to a read.
                let mut dst = None;
                for _ in 0..8 {
                    let d = self.rng.random_range(0..=self.cfg.maxlen - len);
                    if d + len <= src || d >= src + len {
                        dst = Some(d);
                        break;
                    }
                }
                let Some(dst) = dst else {
                    self.log(format!("copy_within: no disjoint range for src {src:#x} len {len:#x}; read instead"));
                    return self.check_read(src, len);
                };
                self.log(format!("copy_within {src:#x} -> {dst:#x} len {len:#x}"));
                let data = self.model[src as usize..(src + len) as usize].to_vec();
                self.copy_range(None, src, dst, len)?;
                self.model_write(dst, &data);
                Ok(())
            }
            OpKind::CopyFrom => {
                let ssize = self.src_model.len() as u64;
                let src = self.rng.random_range(0..ssize);
                let want = self.rng.random_range(1..=self.cfg.max_op_len);
                let dst = self.rng.random_range(0..=self.cfg.maxlen - want);
                // The kernel shortens the copy at the source's EOF.
                let len = want.min(ssize - src);
                self.log(format!(
                    "copy_from src {src:#x} -> {dst:#x} len {want:#x} (copies {len:#x})"
                ));
                let data = self.src_model[src as usize..(src + len) as usize].to_vec();
                self.copy_range(Some(want), src, dst, len)?;
                self.model_write(dst, &data);
                Ok(())
            }
            OpKind::Fsync => {
                let data_only = self.rng.random_bool(0.5);
                self.log(if data_only {
                    "fdatasync".into()
                } else {
                    "fsync".into()
                });
                let r = if data_only {
                    crate::libc_io::fdatasync(self.fd())
                } else {
                    crate::libc_io::fsync(self.fd())
                };
                r.map_err(|e| sys("fsync", e))
            }
            OpKind::CloneRange => self.clone_range(),
            OpKind::CloneWhole => self.clone_whole(),
            OpKind::DirectWrite => self.direct_op(true),
            OpKind::DirectRead => self.direct_op(false),
            OpKind::Reopen => {
                self.log("close + reopen".into());
                self.fd = None;
                self.dfd = Err(Errno::BADF);
                let fd = open_rw(&self.path, OFlags::empty()).map_err(|e| sys("reopen", e))?;
                self.fd = Some(fd);
                self.dfd = open_direct(&self.path, self.cfg.direct);
                self.check_all("full check after reopen")
                    .map_err(|(m, o)| OpError::Fail(m, o))
            }
        }
    }

    /// `FICLONERANGE` of whole blocks of the source file to a
    /// block-aligned offset of the data file (aligned, so a file system
    /// that shares extents accepts it; a source shorter than a block is
    /// read instead).
    fn clone_range(&mut self) -> OpResult {
        let blocks = self.src_model.len() as u64 / DIRECT_BLOCK;
        let room = self.cfg.maxlen / DIRECT_BLOCK;
        let most = blocks
            .min(room)
            .min((self.cfg.max_op_len / DIRECT_BLOCK).max(1));
        if most == 0 {
            let (off, len) = self.range_in_file();
            self.log(format!(
                "clone_range: source under a block; read {off:#x} len {len:#x} instead"
            ));
            return self.check_read(off, len);
        }
        let len = self.rng.random_range(1..=most) * DIRECT_BLOCK;
        let src = self.rng.random_range(0..=blocks - len / DIRECT_BLOCK) * DIRECT_BLOCK;
        let dst = self.rng.random_range(0..=room - len / DIRECT_BLOCK) * DIRECT_BLOCK;
        self.log(format!("clone_range src {src:#x} -> {dst:#x} len {len:#x}"));
        match crate::libc_io::ficlonerange(&self.src_fd, src, self.fd(), dst, len) {
            Ok(()) => {}
            Err(e) if is_unsupported(e) => return Err(OpError::Unsupported(e)),
            Err(e) => return Err(sys("ioctl(FICLONERANGE)", e)),
        }
        let data = self.src_model[src as usize..(src + len) as usize].to_vec();
        self.model_write(dst, &data);
        Ok(())
    }

    /// `FICLONE` of the data file into a fresh, empty file, which must then
    /// hold exactly the model.
    fn clone_whole(&mut self) -> OpResult {
        let path = clone_path(&self.cfg);
        self.log("clone (whole file into a fresh file)".into());
        let out = open_rw(&path, OFlags::CREATE | OFlags::TRUNC)
            .map_err(|e| sys("creating the clone's file", e))?;
        match crate::libc_io::ficlone(&out, self.fd()) {
            Ok(()) => {}
            Err(e) if is_unsupported(e) => return Err(OpError::Unsupported(e)),
            Err(e) => return Err(sys("ioctl(FICLONE)", e)),
        }
        let mut got = vec![0u8; self.model.len() + 1];
        let n = pread_full(&out, &mut got, 0).map_err(|e| sys("pread of the clone", e))?;
        if let Some(d) = first_diff(&self.model, &got[..n]) {
            return Err(OpError::Fail(
                format!("the clone differs from the model at {d:#x} (read {n:#x} bytes)"),
                Some(d as u64),
            ));
        }
        Ok(())
    }

    /// Block-aligned O_DIRECT write or read.
    fn direct_op(&mut self, write: bool) -> OpResult {
        let blocks_max = (self.cfg.max_op_len / DIRECT_BLOCK).max(1);
        let nblocks = self.rng.random_range(1..=blocks_max);
        let len = nblocks * DIRECT_BLOCK;
        let size = self.model.len() as u64;
        let last = if write {
            self.cfg.maxlen.saturating_sub(len) / DIRECT_BLOCK
        } else {
            size / DIRECT_BLOCK
        };
        let off = self.rng.random_range(0..=last) * DIRECT_BLOCK;
        let what = if write { "direct_write" } else { "direct_read" };
        self.log(format!("{what} {off:#x} len {len:#x}"));
        let fd = match &self.dfd {
            Ok(fd) => fd.as_fd(),
            Err(e) => return Err(OpError::Unsupported(*e)),
        };
        // O_DIRECT needs a block-aligned buffer.
        let mut backing = vec![0u8; (len + DIRECT_BLOCK) as usize];
        let start = backing.as_ptr().align_offset(DIRECT_BLOCK as usize);
        let buf = &mut backing[start..start + len as usize];
        if write {
            let mut x: u64 = self.rng.random::<u64>() | 1;
            for chunk in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            let mut done = 0;
            while done < buf.len() {
                let n = crate::libc_io::pwrite(fd, &buf[done..], off + done as u64)
                    .map_err(|e| sys("O_DIRECT pwrite", e))?;
                if n == 0 {
                    return Err(OpError::Fail("O_DIRECT pwrite wrote 0 bytes".into(), None));
                }
                done += n;
            }
            let data = buf.to_vec();
            self.model_write(off, &data);
            return Ok(());
        }
        let mut done = 0;
        while done < buf.len() {
            let n = crate::libc_io::pread(fd, &mut buf[done..], off + done as u64)
                .map_err(|e| sys("O_DIRECT pread", e))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        let want: &[u8] = if off >= size {
            &[]
        } else {
            &self.model[off as usize..(off + len).min(size) as usize]
        };
        if let Some(d) = first_diff(want, &buf[..done]) {
            let msg = if d < want.len().min(done) {
                format!(
                    "O_DIRECT read mismatch at {:#x}: expected {:#04x} got {:#04x}",
                    off + d as u64,
                    want[d],
                    buf[d]
                )
            } else {
                format!(
                    "O_DIRECT short/long read at {off:#x}: expected {:#x} bytes got {done:#x}",
                    want.len()
                )
            };
            return Err(OpError::Fail(msg, Some(off + d as u64)));
        }
        Ok(())
    }

    /// copy_file_range from the source file (`from_src = Some(requested len)`)
    /// or within the data file, expecting exactly `expect` bytes.
    fn copy_range(&mut self, from_src: Option<u64>, src: u64, dst: u64, expect: u64) -> OpResult {
        let request = from_src.unwrap_or(expect);
        let mut done = 0u64;
        while done < expect {
            let mut off_in = src + done;
            let mut off_out = dst + done;
            let fd_in = match from_src {
                Some(_) => self.src_fd.as_fd(),
                None => self.fd().as_fd(),
            };
            let r = crate::libc_io::copy_file_range(
                fd_in,
                Some(&mut off_in),
                self.fd(),
                Some(&mut off_out),
                (request - done) as usize,
            );
            match r {
                Ok(0) => break,
                Ok(n) => done += n as u64,
                Err(e) if done == 0 && (is_unsupported(e) || e == Errno::XDEV) => {
                    return Err(OpError::Unsupported(e))
                }
                Err(e) => return Err(sys("copy_file_range", e)),
            }
        }
        if done != expect {
            return Err(OpError::Fail(
                format!("copy_file_range copied {done:#x} bytes, expected {expect:#x}"),
                None,
            ));
        }
        Ok(())
    }

    fn check_read(&mut self, off: u64, len: u64) -> OpResult {
        let mut got = vec![0u8; len as usize];
        let n = pread_full(self.fd(), &mut got, off).map_err(|e| sys("pread", e))?;
        got.truncate(n);
        let size = self.model.len() as u64;
        let want: &[u8] = if off >= size {
            &[]
        } else {
            &self.model[off as usize..(off + len).min(size) as usize]
        };
        if let Some(d) = first_diff(want, &got) {
            let msg = if d < want.len().min(got.len()) {
                format!(
                    "read mismatch at {:#x}: expected {:#04x} got {:#04x}",
                    off + d as u64,
                    want[d],
                    got[d]
                )
            } else {
                format!(
                    "short/long read at {off:#x}: expected {:#x} bytes got {:#x}",
                    want.len(),
                    got.len()
                )
            };
            return Err(OpError::Fail(msg, Some(off + d as u64)));
        }
        Ok(())
    }

    fn check_size(&self) -> Result<(), (String, Option<u64>)> {
        let st =
            crate::libc_io::fstat(self.fd()).map_err(|e| (format!("fstat failed: {e}"), None))?;
        if st.st_size as u64 != self.model.len() as u64 {
            return Err((
                format!(
                    "size mismatch: fstat says {:#x}, model says {:#x}",
                    st.st_size,
                    self.model.len()
                ),
                Some(st.st_size.min(self.model.len() as i64) as u64),
            ));
        }
        Ok(())
    }

    fn check_all(&self, what: &str) -> Result<(), (String, Option<u64>)> {
        self.check_size()?;
        let mut got = vec![0u8; self.model.len() + 1];
        let n = pread_full(self.fd(), &mut got, 0)
            .map_err(|e| (format!("{what}: pread: {e}"), None))?;
        got.truncate(n);
        if let Some(d) = first_diff(&self.model, &got) {
            let detail = if d < self.model.len().min(got.len()) {
                format!("expected {:#04x} got {:#04x}", self.model[d], got[d])
            } else {
                format!(
                    "read {:#x} bytes, model has {:#x}",
                    got.len(),
                    self.model.len()
                )
            };
            return Err((
                format!("{what}: mismatch at {d:#x}: {detail}"),
                Some(d as u64),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_on_native_dir() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FsxConfig::new(dir.path(), 1, 3000);
        cfg.direct = true;
        let report = run(&cfg).unwrap_or_else(|e| panic!("{e}"));
        for k in cfg.enabled_kinds() {
            assert!(report.count(k) > 0, "{k} never ran: {report}");
        }
        assert!(report.skipped.is_empty(), "{report}");
        // Files are removed on success.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn same_seed_same_sequence() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ra = run(&FsxConfig::new(a.path(), 7, 500)).unwrap();
        let rb = run(&FsxConfig::new(b.path(), 7, 500)).unwrap();
        assert_eq!(ra.done, rb.done);
        assert_eq!(ra.final_size, rb.final_size);
    }

    #[test]
    fn detects_corruption() {
        // A file changed behind the exerciser's back must be reported with the
        // seed and the differing offset: proves the checks can fail.
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FsxConfig::new(dir.path(), 3, 50);
        cfg.keep = true;
        let mut fsx = Fsx::setup(cfg).unwrap();
        fsx.run_all().unwrap();
        let size = fsx.model.len();
        assert!(size > 0);
        let at = size / 2;
        let flipped = [fsx.model[at] ^ 0xff];
        pwrite_full(fsx.fd(), &flipped, at as u64).unwrap();
        let (msg, off) = fsx.check_all("test").unwrap_err();
        assert_eq!(off, Some(at as u64), "{msg}");
        let failure = fsx.failure(msg, off);
        let text = failure.to_string();
        assert!(text.contains("seed=3"), "{text}");
        assert!(text.contains("first differing offset"), "{text}");
    }
}
