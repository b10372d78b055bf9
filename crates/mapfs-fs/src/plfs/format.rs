//! The on-disk format of a container: entry names, the index dropping
//! encoding, and the sequence numbers that order droppings' records.
//!
//! A dropping is `MAGIC` followed by the postcard encoding of [`Dropping`].
//! Postcard is compact and has no self-description, so the magic carries the
//! format version: a change bumps it, and readers skip droppings they do not
//! understand (with a warning) rather than misread them.
//!
//! Versions: `PLFSIDX1` (logs and records) is read, as closed; `PLFSIDX2`
//! adds [`Dropping::open`] (the writer had not released yet: if its log is
//! no longer held, it died, and its log is recovered, see `recover.rs`) and
//! is what this version writes. Versions before it skip `PLFSIDX2` droppings
//! with a warning, so a container written by this version must not be
//! opened by an older one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use mapfs::{Error, Result};
use serde::{Deserialize, Serialize};

/// The empty regular file that is a file's identity (mode, owner, times).
pub(super) const IDENTITY: &str = ".plfs";
/// The file whose kernel locks stand for the file's in embedded mode
/// (`FileSystem::lock_file`); listings ignore it, removal takes it along.
pub(super) const LOCKS: &str = ".plfs-locks";
/// Prefix of data logs (`data.<id>`).
pub(super) const LOG_PREFIX: &str = "data.";
/// Prefix of index droppings (`index.<id>`).
pub(super) const INDEX_PREFIX: &str = "index.";
/// Prefix of droppings being written (renamed to `index.<id>` when complete).
pub(super) const TMP_PREFIX: &str = "tmp.";
/// Prefix of a container being created, in the parent directory (renamed to
/// the file's name once its identity exists). Hidden from listings.
pub(super) const NEW_PREFIX: &str = ".plfs-new.";
/// Prefix of a container being removed, in the parent directory. Hidden.
pub(super) const GONE_PREFIX: &str = ".plfs-gone.";

/// First bytes of every dropping written: format name and version.
const MAGIC: &[u8; 8] = b"PLFSIDX2";
/// The first version (no `open` flag), still read.
const MAGIC_V1: &[u8; 8] = b"PLFSIDX1";

/// One index dropping: what one open changed, or a compacted base.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Dropping {
    /// Names of the logs (`data.<id>`) that `Op::Data` records index.
    pub logs: Vec<String>,
    /// The changes, each with its own sequence number.
    pub records: Vec<Record>,
    /// Written by a flush of a writer still open: its log `data.<id>` may
    /// hold bytes written after this, which no record names yet. False for
    /// the dropping of a release, truncation, compaction or recovery.
    pub open: bool,
}

/// [`Dropping`] as `PLFSIDX1` encoded it.
#[derive(Deserialize)]
struct DroppingV1 {
    logs: Vec<String>,
    records: Vec<Record>,
}

/// One change of a file, ordered among all droppings by `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// Global order: records apply in increasing `seq` (ties: dropping name,
    /// then position in the dropping).
    pub seq: u64,
    /// What changed.
    pub op: Op,
}

/// A change of a file's bytes or size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Op {
    /// Logical `logical..logical+len` holds the bytes at `offset` of log
    /// `logs[log]`.
    Data {
        /// First logical byte.
        logical: u64,
        /// Length (> 0).
        len: u64,
        /// Index into [`Dropping::logs`].
        log: u32,
        /// Offset in the log.
        offset: u64,
    },
    /// Logical `logical..logical+len` reads as zeros.
    Hole {
        /// First logical byte.
        logical: u64,
        /// Length (> 0).
        len: u64,
    },
    /// The size becomes exactly this (a truncate, shrinking or growing).
    SetSize(u64),
    /// The size becomes at least this (a write or extension past the end).
    GrowTo(u64),
}

/// The bytes of a dropping file.
pub(super) fn encode(d: &Dropping) -> Result<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    let body = postcard::to_stdvec(d)
        .map_err(|e| Error::io().context(format!("encoding a plfs dropping: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// Parses a dropping file; `EIO` when it is not one of ours.
pub(super) fn decode(bytes: &[u8]) -> Result<Dropping> {
    let corrupt = |e: postcard::Error| Error::io().context(format!("corrupt dropping: {e}"));
    if let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) {
        return postcard::from_bytes(body).map_err(corrupt);
    }
    if let Some(body) = bytes.strip_prefix(MAGIC_V1.as_slice()) {
        let d: DroppingV1 = postcard::from_bytes(body).map_err(corrupt)?;
        return Ok(Dropping {
            logs: d.logs,
            records: d.records,
            open: false,
        });
    }
    Err(Error::io().context("not a plfs dropping (bad magic or unknown version)"))
}

/// A name part unique among every writer of every process on every host:
/// time, pid, a per-process counter and a per-process random number (hex,
/// so names stay short; the random part keeps two hosts whose processes
/// share a pid and a clock tick apart).
pub(super) fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SALT: OnceLock<u32> = OnceLock::new();
    let salt = *SALT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(now_ns());
        h.finish() as u32
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}.{:x}.{:x}.{salt:x}", now_ns(), std::process::id(), n)
}

/// The id of a writer's log and dropping (`data.<id>`, `index.<id>`) or of
/// a dropping written by host `host`: the host id first, so a listing shows
/// whose each is, then [`new_id`].
pub(super) fn host_id(host: &str) -> String {
    format!("{host}.{}", new_id())
}

/// Longest host id (`-o hostid=`).
pub const HOSTID_MAX: usize = 64;

/// Checks a host id given with `-o hostid=NAME`: 1 to `HOSTID_MAX`
/// letters, digits, `-` or `_` (it becomes part of file names).
pub fn check_hostid(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= HOSTID_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::from_errno(libc::EINVAL).context(format!(
            "plfs host id {id:?}: use 1 to {HOSTID_MAX} letters, digits, '-' or '_'"
        )))
    }
}

/// The default host id: this machine's host name, with characters a host
/// id may not hold turned into `-` (so `node1.example` is `node1-example`).
pub fn default_hostid() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut id: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(HOSTID_MAX)
        .collect();
    if id.is_empty() {
        id.push_str("host");
    }
    id
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A sequence number above `floor` and above every number this process
/// handed out before. Based on the clock, so independent processes on one
/// node (the daemon, embedded shims) order their records by real time; the
/// floor (the highest number already seen in the container) keeps a slow
/// clock from ordering a new record before an old one.
pub(super) fn next_seq(floor: u64) -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let mut cur = LAST.load(Ordering::Relaxed);
    loop {
        let next = now_ns().max(cur + 1).max(floor + 1);
        match LAST.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => cur = seen,
        }
    }
}

/// True for names a user file or directory may not have in a directory
/// (they are the hidden names of containers being created or removed).
pub(super) fn reserved_name(name: &[u8]) -> bool {
    name.starts_with(NEW_PREFIX.as_bytes()) || name.starts_with(GONE_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_bad_magic() {
        let d = Dropping {
            logs: vec!["data.1".into()],
            records: vec![
                Record {
                    seq: 5,
                    op: Op::Data {
                        logical: 3,
                        len: 4,
                        log: 0,
                        offset: 9,
                    },
                },
                Record {
                    seq: 6,
                    op: Op::SetSize(2),
                },
            ],
            open: true,
        };
        let b = encode(&d).unwrap();
        assert_eq!(decode(&b).unwrap(), d);
        assert!(decode(&b[1..]).is_err());
        assert!(decode(&b[..b.len() - 1]).is_err());
        // A version-1 dropping (no open flag) reads as closed.
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend(postcard::to_stdvec(&(&d.logs, &d.records)).unwrap());
        let old = decode(&v1).unwrap();
        assert_eq!(
            (old.logs, old.records, old.open),
            (d.logs, d.records, false)
        );
    }

    #[test]
    fn seqs_increase_and_respect_floor() {
        let a = next_seq(0);
        let b = next_seq(0);
        assert!(b > a);
        let c = next_seq(u64::MAX / 2);
        assert!(c > u64::MAX / 2);
        assert!(next_seq(0) > c);
        assert_ne!(new_id(), new_id());
        assert!(host_id("n1").starts_with("n1."));
    }

    #[test]
    fn host_ids_are_checked() {
        assert!(check_hostid("node-1_a").is_ok());
        assert!(check_hostid("").is_err());
        assert!(check_hostid("a/b").is_err());
        assert!(check_hostid("a.b").is_err());
        assert!(check_hostid(&"x".repeat(HOSTID_MAX + 1)).is_err());
        assert!(check_hostid(&default_hostid()).is_ok());
    }
}
