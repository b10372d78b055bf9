//! Logs of writers that died (a daemon killed, a host lost): found at the
//! next open of their container, or by `mapfs fsck`, and recovered or
//! reclaimed.
//!
//! A log holds raw bytes placed by its executor (the daemon's engine, a
//! shim, the kernel), at offsets only the executor's map knows; it is not
//! self-describing. What describes it is its writer's dropping
//! `index.<id>`, rewritten atomically at every flush (each `close(2)`,
//! `fsync`, size change) with every record so far, and marked
//! [`open`](super::format::Dropping::open) until the release. So a writer
//! that died left either
//!
//! - a dropping marked open: its records up to its last flush are complete
//!   (a dropping is renamed in whole) and stay; the log's bytes past the
//!   last byte any record names were never recorded and are cut off
//!   (**recovered**), and the dropping is marked closed; or
//! - no dropping (it died before its first flush): nothing names its bytes,
//!   and the log is removed (**reclaimed**).
//!
//! A log is its writer's while the writer holds a shared `flock` on it (in
//! every process the log's descriptor was handed to); a log whose lock can
//! be taken exclusively has no writer left. All this runs under the
//! container's exclusive lock, which writers hold while creating their log
//! and taking its `flock`, so a new writer is never mistaken for a dead one.

use std::fmt;
use std::os::fd::BorrowedFd;

use mapfs::Result;
use rustix::fs::{FlockOperation, OFlags};
use tracing::warn;

use super::container;
use super::format::{Dropping, INDEX_PREFIX, LOG_PREFIX};
use super::merge::Merged;

/// What was done with the log of a writer that died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Its records up to its last flush were kept; `dropped` bytes written
    /// after it (named by no record) were cut off the log.
    Recovered {
        /// The log's name in its container.
        log: String,
        /// Records of its dropping that were kept.
        records: usize,
        /// Bytes of the log still named by records.
        kept: u64,
        /// Bytes cut off the log's end.
        dropped: u64,
    },
    /// It had no records (its writer died before its first flush): the log
    /// of `bytes` bytes was removed.
    Reclaimed {
        /// The log's name in its container.
        log: String,
        /// Its length.
        bytes: u64,
    },
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recovery::Recovered {
                log,
                records,
                kept,
                dropped,
            } => write!(
                f,
                "recovered {log}: its writer died; {records} records up to its last flush \
                 kept ({kept} bytes), {dropped} unrecorded bytes after them cut off"
            ),
            Recovery::Reclaimed { log, bytes } => write!(
                f,
                "reclaimed {log}: its writer died before recording anything; \
                 the log ({bytes} bytes, not self-describing) was removed"
            ),
        }
    }
}

/// Recovers or reclaims every log among `suspects` that no writer holds
/// any more, except `live` (this process's writers). `merged` is the
/// container's current merge. The caller holds the container's exclusive
/// lock, and must reload the merge when anything was done.
pub(super) fn recover_locked(
    dir: BorrowedFd<'_>,
    merged: &Merged,
    suspects: &[String],
    live: &[String],
) -> Result<Vec<Recovery>> {
    let mut done = Vec::new();
    for log in suspects.iter().filter(|l| !live.contains(l)) {
        let f = match container::open_file(dir, log, OFlags::RDWR) {
            Ok(f) => f,
            Err(e) if e.errno() == libc::ENOENT => continue,
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            // A live writer, here or on another host.
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => return Err(e.into()),
        }
        let len = f.metadata()?.len();
        let id = &log[LOG_PREFIX.len()..];
        let own = format!("{INDEX_PREFIX}{id}");
        let dropping = container::read_dropping(dir, &own)?;
        // The last byte of the log any record still names.
        let kept = merged
            .logs
            .iter()
            .position(|n| n == log)
            .map(|i| {
                merged
                    .map
                    .extents()
                    .iter()
                    .filter(|e| e.file as usize == i)
                    .map(|e| e.offset + e.len)
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        let r = if kept == 0 {
            container::remove(dir, log)?;
            Recovery::Reclaimed {
                log: log.clone(),
                bytes: len,
            }
        } else {
            if len > kept {
                f.set_len(kept)?;
            }
            Recovery::Recovered {
                log: log.clone(),
                records: dropping.as_ref().map_or(0, |d| d.records.len()),
                kept,
                dropped: len.saturating_sub(kept),
            }
        };
        // Mark the writer closed: its size and hole records stay (a
        // truncate through it is still a truncate), and the log is no
        // longer a suspect.
        let closed = match dropping {
            Some(d) => Dropping { open: false, ..d },
            None if kept > 0 => Dropping::default(),
            None => {
                warn!("plfs: {r}");
                done.push(r);
                continue;
            }
        };
        container::write_dropping(dir, &own, &closed)?;
        warn!("plfs: {r}");
        done.push(r);
    }
    if !done.is_empty() {
        container::fsync_dir(dir)?;
    }
    Ok(done)
}

/// One thing `fsck` found and did, in the container at `path` (relative to
/// the backing root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsckFinding {
    /// The file (its container) beneath the backing root.
    pub path: std::path::PathBuf,
    /// What was done.
    pub what: Finding,
}

/// What `fsck` did in one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A dead writer's log was recovered or reclaimed.
    Log(Recovery),
    /// A dropping never completed (its writer died while writing it) was
    /// removed.
    Tmp(String),
}

impl fmt::Display for FsckFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.what {
            Finding::Log(r) => write!(f, "{}: {r}", self.path.display()),
            Finding::Tmp(n) => write!(
                f,
                "{}: removed {n}: a dropping never completed (its writer died while writing it)",
                self.path.display()
            ),
        }
    }
}

/// Directories `fsck` descends at most (a deeper tree is left unchecked,
/// with a warning).
const FSCK_DEPTH: usize = 256;

impl super::Plfs {
    /// Checks every file beneath the backing root, as `mapfs fsck BACKING`:
    /// recovers or reclaims the logs of writers that died and removes
    /// droppings never completed, each container under its lock (so it can
    /// run while daemons serve the store: their live writers are left
    /// alone). Symlinks are not followed.
    pub fn fsck(&self) -> Result<Vec<FsckFinding>> {
        use std::os::fd::AsFd;
        let mut out = Vec::new();
        let mut stack = vec![(std::path::PathBuf::new(), 0usize)];
        while let Some((rel, depth)) = stack.pop() {
            let dir = if rel.as_os_str().is_empty() {
                container::open_dir(self.root().fd(), ".".as_ref())?
            } else {
                match container::open_dir(self.root().fd(), rel.as_os_str()) {
                    Ok(d) => d,
                    // Removed meanwhile (Gluster answers ESTALE).
                    Err(e) if matches!(e.errno(), libc::ENOENT | libc::ESTALE) => continue,
                    Err(e) => return Err(e),
                }
            };
            if container::is_container(dir.as_fd()) {
                self.fsck_container(dir.as_fd(), &rel, &mut out)?;
                continue;
            }
            if depth >= FSCK_DEPTH {
                warn!("plfs fsck: {} is too deep; not checked", rel.display());
                continue;
            }
            for name in container::subdirs(dir.as_fd())? {
                // Containers being created or removed, probes of starting
                // daemons: not files yet, or not any more.
                if !super::format::reserved_name(name.as_encoded_bytes()) {
                    stack.push((rel.join(name), depth + 1));
                }
            }
        }
        Ok(out)
    }

    fn fsck_container(
        &self,
        dir: BorrowedFd<'_>,
        rel: &std::path::Path,
        out: &mut Vec<FsckFinding>,
    ) -> Result<()> {
        let key = container::key_of(dir)?;
        let _g = match self.store.lock(dir, key) {
            Err(e) if e.errno() == libc::ESTALE => return Ok(()),
            r => r?,
        };
        // Every dropping writer holds the exclusive lock while its `tmp.*`
        // exists: the ones seen under it are leftovers.
        for n in container::list(dir)?.tmps {
            container::remove(dir, &n)?;
            out.push(FsckFinding {
                path: rel.to_owned(),
                what: Finding::Tmp(n),
            });
        }
        let loaded = self.store.load_locked(dir, key)?;
        let live = self.live_logs(key);
        for r in recover_locked(dir, &loaded.merged, &loaded.suspects, &live)? {
            out.push(FsckFinding {
                path: rel.to_owned(),
                what: Finding::Log(r),
            });
        }
        self.store.invalidate(key);
        Ok(())
    }
}
